// Groups each anchor's negatives into buckets by the positives that keep them, so that every
// (anchor, positive) pair finds its kept negatives as one contiguous run, by two binary
// searches: counting a pair costs O(log N) and emitting it O(N / 32 + c) for c kept
// triplets, instead of testing all N negatives each time.
//
// Why it works. A margin rule keeps the triplets whose tm lies in an interval (low, high]:
//   mode 1 "all":      (-inf, margin]
//   mode 2 "hard":     (-inf, min(margin, 0)]
//   mode 3 "semihard": (0, margin]
//   mode 4 "easy":     (margin, +inf)
// with tm = an - ap for distances and ap - an for similarities (PML). For a fixed negative
// value an, tm is monotone in ap (f32 subtraction rounds monotonically), so with the anchor's
// positive values sorted, "tm <= x" holds for a suffix (distances) or a prefix
// (similarities) of them, of length c_x(an). The negative's bucket is c_low + c_high (the
// bounds the rule has), flipped for distances so that buckets rise with an. Two negatives in
// one bucket have equal c_low and c_high (both move the same way with an), so every positive
// keeps both or neither; across buckets the order is that of an. Listing the negatives bucket
// by bucket (`order`) therefore puts the kept negatives of any positive in one run, found by
// binary search on the same f32 expression the rule uses: exact, ties included.
//
// Entry points, run in this order per chunk of anchors (buckets cleared to zero first):
// `gather` (per (anchor, slot < width)): the anchor's positive values, +inf-padded to `width`.
// `sort_local` (a workgroup per anchor, width <= LOCAL_WIDTH): the whole bitonic sort of the
//           row in workgroup memory, one dispatch instead of one per pass.
// `step`   (per (anchor, compare-exchange)): one pass (k, j) of a bitonic sort of every row,
//           for wider rows.
// `bucket` (per (anchor, negative)): the negative's bucket into `scratch`, and the bucket's
//           count.
// `starts` (per anchor): turns the counts into each bucket's first slot (exclusive scan).
// `scatter`(per (anchor, negative)): writes each negative's reference index into its bucket;
//           the order inside a bucket is arbitrary, which no later step depends on.
// `count`  (per pair): the length of the pair's run.
// `emit`   (per pair of a window): the pair's kept negatives, ascending, at its offset: the run
//           is marked in a bitmap over the references (the pair's slice of `scratch`), which
//           is then read word by word, so the triplets come out in PML's (a, p, n) order at
//           O(m / 32 + c) cost for c kept triplets, whatever their values.

struct Params {
    anchors: u32,
    refs: u32,
    // Row length of the sorted positive values: a power of two, at least every n_pos.
    width: u32,
    // Row length of the bucket counters: at least 2 * n_pos + 1 for every anchor.
    stride: u32,
    // Negatives per anchor the per-negative entry points cover (the chunk's most).
    span: u32,
    // Bitonic pass: sequence length k and compare distance j (powers of two).
    k: u32,
    j: u32,
    mode: u32,
    inverted: u32,
    margin: f32,
    // Pairs of this dispatch: [pair_lo, pair_hi).
    pair_lo: u32,
    pair_hi: u32,
    // Offset of the window's first triplet, 64-bit (low, high) words.
    start: vec2<u32>,
    // Emit: words of one pair's bitmap.
    bitmap_words: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
// (anchors, refs) values (distances or similarities) of the chunk.
@group(0) @binding(1) var<storage, read> distances: array<f32>;
// (anchors, refs) ascending positive and negative reference indices; per anchor
// list_counts = [n_pos, n_neg] (triplet_lists.wgsl).
@group(0) @binding(2) var<storage, read> positives: array<u32>;
@group(0) @binding(3) var<storage, read> negatives: array<u32>;
@group(0) @binding(4) var<storage, read> list_counts: array<u32>;
// Anchor a owns pairs pair_base[a] .. pair_base[a + 1] of the chunk.
@group(0) @binding(5) var<storage, read> pair_base: array<u32>;
// (anchors, width) sorted positive values.
@group(0) @binding(6) var<storage, read_write> sorted: array<f32>;
// (anchors, stride) bucket counters, then bucket cursors; `starts` sees the same buffer as
// plain words (binding 12), since it alone touches it then.
@group(0) @binding(7) var<storage, read_write> buckets: array<atomic<u32>>;
@group(0) @binding(12) var<storage, read_write> bucket_words: array<u32>;
// (anchors, refs): per anchor its negatives' reference indices, bucket by bucket.
@group(0) @binding(8) var<storage, read_write> order: array<u32>;
@group(0) @binding(9) var<storage, read_write> pair_counts: array<u32>;
// Exclusive prefix sums of the pair counts, one past the last pair included.
@group(0) @binding(10) var<storage, read> offsets: array<vec2<u32>>;
@group(0) @binding(11) var<storage, read_write> out: array<u32>;
// (anchors, refs) words: each negative's bucket (bucket to scatter), then the emit's bitmaps
// (bitmap_words per pair of the dispatch).
@group(0) @binding(13) var<storage, read_write> scratch: array<u32>;

// Invocations per workgroup, and the widest row that sorts in workgroup memory (2048 f32,
// 8 KiB): set from Rust (negative_buckets::WORKGROUP_SIZE, negative_buckets::LOCAL_WIDTH).
override WORKGROUP_SIZE: u32;
override LOCAL_WIDTH: u32;

var<workgroup> local_row: array<f32, LOCAL_WIDTH>;

fn flat_id(gid: vec3<u32>, groups: vec3<u32>) -> u32 {
    return gid.x + gid.y * groups.x * WORKGROUP_SIZE;
}

fn has_low() -> bool {
    return params.mode == RULE_SEMIHARD || params.mode == RULE_EASY;
}

fn has_high() -> bool {
    return params.mode != RULE_EASY;
}

fn low() -> f32 {
    return select(0.0, params.margin, params.mode == RULE_EASY);
}

fn high() -> f32 {
    return select(params.margin, min(params.margin, 0.0), params.mode == RULE_HARD);
}

// How many of the anchor's n sorted positive values (row `row`) have tm(ap, an) <= x.
fn positives_le(row: u32, n: u32, an: f32, x: f32) -> u32 {
    // A suffix for distances: find its first slot; a prefix for similarities: its end.
    let inverted = params.inverted != 0u;
    var lo = 0u;
    var hi = n;
    while (lo < hi) {
        let mid = (lo + hi) / 2u;
        if ((triplet_margin(sorted[row + mid], an, inverted) <= x) == inverted) {
            lo = mid + 1u;
        } else {
            hi = mid;
        }
    }
    return select(n - lo, lo, inverted);
}

// The bucket of a negative with value `an`: in 0 ..= 2 * n_pos, rising with an.
fn bucket_of(a: u32, an: f32) -> u32 {
    let n_pos = list_counts[2u * a];
    let row = a * params.width;
    var c = 0u;
    if (has_low()) {
        c += positives_le(row, n_pos, an, low());
    }
    if (has_high()) {
        c += positives_le(row, n_pos, an, high());
    }
    return select(2u * n_pos - c, c, params.inverted != 0u);
}

// How many of the first n entries of `order` (row `row`) have tm(ap, an) <= x: a prefix for
// distances, a suffix for similarities (an rises along the row).
fn order_le(row: u32, n: u32, ap: f32, x: f32) -> u32 {
    let inverted = params.inverted != 0u;
    var lo = 0u;
    var hi = n;
    while (lo < hi) {
        let mid = (lo + hi) / 2u;
        if ((triplet_margin(ap, distances[row + order[row + mid]], inverted) <= x) != inverted) {
            lo = mid + 1u;
        } else {
            hi = mid;
        }
    }
    return select(lo, n - lo, inverted);
}

// The run [x, y) of `order` that `ap` keeps, among the anchor's n negatives.
fn kept_run(row: u32, n: u32, ap: f32) -> vec2<u32> {
    var below_low = 0u;
    if (has_low()) {
        below_low = order_le(row, n, ap, low());
    }
    var below_high = n;
    if (has_high()) {
        below_high = order_le(row, n, ap, high());
    }
    // Distances keep (below_low, below_high]; similarities the mirror image.
    var run = vec2<u32>(below_low, below_high);
    if (params.inverted != 0u) {
        run = vec2<u32>(n - below_high, n - below_low);
    }
    return vec2<u32>(run.x, max(run.x, run.y));
}

// The value of pair `pair` of anchor a: d(a, p).
fn pair_value(a: u32, pair: u32) -> f32 {
    let row = a * params.refs;
    return distances[row + positives[row + pair - pair_base[a]]];
}

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn gather(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let id = flat_id(gid, groups);
    if (id >= params.anchors * params.width) {
        return;
    }
    let a = id / params.width;
    let slot = id % params.width;
    var v = bitcast<f32>(0x7f800000u);
    if (slot < list_counts[2u * a]) {
        let row = a * params.refs;
        v = distances[row + positives[row + slot]];
    }
    sorted[id] = v;
}

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn step(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let id = flat_id(gid, groups);
    let half = params.width / 2u;
    if (id >= params.anchors * half) {
        return;
    }
    let a = id / half;
    let t = id % half;
    // The t-th compare-exchange pairs i (bit j clear) with i + j.
    let i = (t / params.j) * 2u * params.j + t % params.j;
    let lo = a * params.width + i;
    let hi = lo + params.j;
    let x = sorted[lo];
    let y = sorted[hi];
    // Blocks of length k alternate direction; the last pass (k = width) is ascending.
    let ascending = (i & params.k) == 0u;
    if ((x > y) == ascending) {
        sorted[lo] = y;
        sorted[hi] = x;
    }
}

// Compare-exchange of slots i and i + j of a bitonic pass with sequence length k.
fn exchange_local(i: u32, j: u32, k: u32) {
    let x = local_row[i];
    let y = local_row[i + j];
    if ((x > y) == ((i & k) == 0u)) {
        local_row[i] = y;
        local_row[i + j] = x;
    }
}

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn sort_local(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let a = wid.x + wid.y * groups.x;
    // Uniform per workgroup, so the barriers below stay valid.
    if (a >= params.anchors) {
        return;
    }
    let t = lid.x;
    let width = params.width;
    let row = a * width;
    for (var i = t; i < width; i += WORKGROUP_SIZE) {
        local_row[i] = sorted[row + i];
    }
    workgroupBarrier();
    for (var k = 2u; k <= width; k <<= 1u) {
        for (var j = k >> 1u; j > 0u; j >>= 1u) {
            for (var c = t; c < width / 2u; c += WORKGROUP_SIZE) {
                exchange_local((c / j) * 2u * j + c % j, j, k);
            }
            workgroupBarrier();
        }
    }
    for (var i = t; i < width; i += WORKGROUP_SIZE) {
        sorted[row + i] = local_row[i];
    }
}

const NONE: u32 = 0xFFFFFFFFu;

// The (anchor, negative) that invocation `id` of a per-negative pass handles, or x = NONE
// past the chunk or the anchor's negatives (`||` short-circuits, so no list_counts read
// past the chunk).
fn negative_at(id: u32) -> vec2<u32> {
    let a = id / params.span;
    let j = id % params.span;
    if (id >= params.anchors * params.span || j >= list_counts[2u * a + 1u]) {
        return vec2<u32>(NONE, 0u);
    }
    return vec2<u32>(a, j);
}

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn bucket(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let at = negative_at(flat_id(gid, groups));
    if (at.x == NONE) {
        return;
    }
    let a = at.x;
    let j = at.y;
    let row = a * params.refs;
    let b = bucket_of(a, distances[row + negatives[row + j]]);
    scratch[row + j] = b;
    atomicAdd(&buckets[a * params.stride + b], 1u);
}

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn starts(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let a = flat_id(gid, groups);
    if (a >= params.anchors) {
        return;
    }
    let base = a * params.stride;
    var sum = 0u;
    for (var b = 0u; b <= 2u * list_counts[2u * a]; b++) {
        let c = bucket_words[base + b];
        bucket_words[base + b] = sum;
        sum += c;
    }
}

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn scatter(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let at = negative_at(flat_id(gid, groups));
    if (at.x == NONE) {
        return;
    }
    let a = at.x;
    let j = at.y;
    let row = a * params.refs;
    let slot = atomicAdd(&buckets[a * params.stride + scratch[row + j]], 1u);
    order[row + slot] = negatives[row + j];
}

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn count(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let pair = params.pair_lo + flat_id(gid, groups);
    if (pair >= params.pair_hi) {
        return;
    }
    let a = anchor_of(pair);
    let run = kept_run(a * params.refs, list_counts[2u * a + 1u], pair_value(a, pair));
    pair_counts[pair] = run.y - run.x;
}

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn emit(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let i = flat_id(gid, groups);
    let pair = params.pair_lo + i;
    if (pair >= params.pair_hi) {
        return;
    }
    // Inside the window offsets differ by less than 2^32 (the window fits a buffer), so the
    // low words suffice. The pair's slice of `out` is [at, end): its count, from the count
    // pass. Writes stop at its end even if this pass finds more kept negatives than that one
    // counted (a compiler may contract the rule's arithmetic differently in two pipelines),
    // so a pair can never write into the next pair's slots.
    var at = offsets[pair].x - params.start.x;
    let c = offsets[pair + 1u].x - offsets[pair].x;
    let end = at + c;
    if (c == 0u) {
        return;
    }
    let a = anchor_of(pair);
    let row = a * params.refs;
    let run = kept_run(row, list_counts[2u * a + 1u], pair_value(a, pair));
    let words = params.bitmap_words;
    let bitmap = i * words;
    for (var w = 0u; w < words; w++) {
        scratch[bitmap + w] = 0u;
    }
    for (var r = run.x; r < run.y; r++) {
        let n = order[row + r];
        let w = bitmap + n / 32u;
        scratch[w] = scratch[w] | (1u << (n % 32u));
    }
    for (var w = 0u; w < words; w++) {
        var bits = scratch[bitmap + w];
        while (bits != 0u && at < end) {
            out[at] = 32u * w + countTrailingZeros(bits);
            at += 1u;
            bits &= bits - 1u;
        }
    }
}
