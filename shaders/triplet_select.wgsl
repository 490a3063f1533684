// Counts (entry point `count`), then writes (entry point `emit`), the triplets (a, p, n) of
// each (anchor, positive) pair of a chunk.
//
// Pairs are numbered densely in (anchor, positive) order: anchor a owns pairs
// pair_base[a] .. pair_base[a + 1] (an exclusive prefix sum of the positive counts, from the
// host), so dispatches launch exactly one invocation per pair and find their anchor by binary
// search. Pair (a, i) takes the i-th positive p of a; its triplets are the negatives n of a
// that pass the rule:
//   mode 0: every negative (all valid triplets, from labels alone)
//   with tm = d(a,n) - d(a,p) for distances, d(a,p) - d(a,n) for similarities (PML):
//   mode 1 "all":      tm <= margin
//   mode 2 "hard":     tm <= margin and tm <= 0
//   mode 3 "semihard": tm <= margin and tm > 0
//   mode 4 "easy":     tm > margin
// Counts (margin rules; mode 0 needs no count, the host knows n_neg): `count_scan`, a
// workgroup per pair; its WORKGROUP_SIZE (64) invocations stride over the negatives and reduce
// the kept flags to pair_counts[pair]: O(n_neg) per pair. (negative_buckets.wgsl counts in O(log n_neg) per
// pair after grouping the negatives; the host picks one of the two per call.)
// `emit`: one invocation per pair of the window [pair_lo, pair_hi) walks the negatives in
// ascending order and writes the kept n from offsets[pair] - start, where offsets is the
// exclusive prefix sum of the counts (64-bit, from the host, one past the last pair included)
// and start the window's first offset, never past offsets[pair + 1] - start; the host, which knows each pair's (a, p), expands them to (a, p, n) rows, so only a
// third of the triplet bytes are written and read back. Ascending n at prefix-sum offsets is
// PML's lexicographic (a, p, n) order. Emitting serially per pair needs no workgroup scan:
// measured on lavapipe it is 2-6x faster than a workgroup-per-pair scan, and a GPU is busy
// once there are a few thousand pairs.

struct Params {
    anchors: u32,
    refs: u32,
    mode: u32,
    inverted: u32,
    margin: f32,
    // Pairs of this dispatch: [pair_lo, pair_hi).
    pair_lo: u32,
    pair_hi: u32,
    _pad0: u32,
    // Offset of the window's first triplet, 64-bit (low, high) words.
    start: vec2<u32>,
    _pad: vec2<u32>,
}

@group(0) @binding(0) var<uniform> params: Params;
// (anchors, refs) distances of the chunk; unused (may be a dummy) in mode 0.
@group(0) @binding(1) var<storage, read> distances: array<f32>;
@group(0) @binding(2) var<storage, read> positives: array<u32>;
// (anchors, refs) ascending negative indices.
@group(0) @binding(3) var<storage, read> negatives: array<u32>;
@group(0) @binding(4) var<storage, read> list_counts: array<u32>;
@group(0) @binding(5) var<storage, read> pair_base: array<u32>;
@group(0) @binding(6) var<storage, read_write> pair_counts: array<u32>;
@group(0) @binding(7) var<storage, read> offsets: array<vec2<u32>>;
@group(0) @binding(8) var<storage, read_write> out: array<u32>;

// Invocations per workgroup: set from Rust (triplet_select::WORKGROUP_SIZE).
override WORKGROUP_SIZE: u32;

var<workgroup> partial: array<u32, WORKGROUP_SIZE>;

// Whether negative j of the anchor row starting at `row` is kept against value `ap`.
fn kept(row: u32, j: u32, ap: f32) -> bool {
    return params.mode == RULE_ALL_VALID
        || keeps(params.mode, params.margin, ap, distances[row + negatives[row + j]], params.inverted != 0u);
}

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn count_scan(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let pair = params.pair_lo + wid.x + wid.y * groups.x;
    // Uniform per workgroup, so a workgroup leaves whole and the barriers below stay valid.
    if (pair >= params.pair_hi) {
        return;
    }
    let t = lid.x;
    let a = anchor_of(pair);
    let row = a * params.refs;
    let n_neg = list_counts[2u * a + 1u];
    let ap = distances[row + positives[row + pair - pair_base[a]]];
    var c = 0u;
    for (var j = t; j < n_neg; j += WORKGROUP_SIZE) {
        if (kept(row, j, ap)) {
            c += 1u;
        }
    }
    partial[t] = c;
    workgroupBarrier();
    for (var s = WORKGROUP_SIZE / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            partial[t] += partial[t + s];
        }
        workgroupBarrier();
    }
    if (t == 0u) {
        pair_counts[pair] = partial[0];
    }
}

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn emit(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let pair = params.pair_lo + gid.x + gid.y * groups.x * WORKGROUP_SIZE;
    if (pair >= params.pair_hi) {
        return;
    }
    // Inside the window offsets differ by less than 2^32 (the window fits a buffer), so the
    // low words suffice. The pair's slice of `out` is [k, end): its count, from the count
    // pass. Writes stop at its end even if this pass keeps more negatives than that one
    // counted (a compiler may contract the rule's arithmetic differently in two pipelines),
    // so a pair can never write into the next pair's slots.
    var k = offsets[pair].x - params.start.x;
    let end = offsets[pair + 1u].x - params.start.x;
    if (k == end) {
        return;
    }
    let a = anchor_of(pair);
    let row = a * params.refs;
    let n_neg = list_counts[2u * a + 1u];
    let p = positives[row + pair - pair_base[a]];
    var ap = 0.0;
    if (params.mode != RULE_ALL_VALID) {
        ap = distances[row + p];
    }
    for (var j = 0u; j < n_neg && k < end; j++) {
        if (kept(row, j, ap)) {
            out[k] = negatives[row + j];
            k += 1u;
        }
    }
}
