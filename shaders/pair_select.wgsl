// The pair miners on the device (PML's get_all_pairs_indices, PairMarginMiner,
// MultiSimilarityMiner, BatchEasyHardMiner): per anchor, which references it keeps as
// positives (same label, not its own slot) and as negatives (another label). Entry `main`
// either counts them (emit = 0: starts[anchor] = (positives, negatives)) or writes them
// (emit = 1) as (anchor, reference) rows at the offsets the host computed from the counts
// (starts[anchor] .. starts[anchor + 1], per side), in the order of the host miners. One
// workgroup per anchor; any number of references.
//
// v is the anchor's value of a reference (its distance row; a similarity when similarity = 1,
// where "closer" means larger). Rules:
//   0 all pairs: every positive and negative (labels only: `distances` is not read).
//   1 pair margin: positives with v > pos_margin, negatives with v < neg_margin (for
//     similarities v < pos_margin, v > neg_margin).
//   2 multi-similarity, epsilon = pos_margin: only an anchor with a positive and a negative
//     keeps anything; distances keep positives with v + eps > min_neg and negatives with
//     v - eps < max_pos, similarities positives with v - eps < max_neg and negatives with
//     v + eps > min_pos. Each side's rows are then sorted by (value in total order,
//     reference), as the host's stable sort by f32::total_cmp orders them.
//   3 batch easy/hard, strategies 0 hard, 1 semihard, 2 easy, 3 all, per side: a side with
//     "all" keeps every candidate; otherwise one pick per side among the candidates in its
//     range (ranged bit 0: positives in pos_range, bit 1: negatives in neg_range), hard =
//     farthest positive / closest negative, easy the opposite, ties to the lower reference;
//     a semihard side picks the hardest strictly easier than the other side's pick. Without
//     "all", an anchor keeps its two picks only when both exist.
//
// Per anchor: (rules 2, 3) a workgroup reduction finds the min and max (value, reference) of
// each side, ties to the lower reference; a semihard side is reduced again with the other
// side's pick as a strict bound. Then the workgroup walks the row in tiles of WORKGROUP_SIZE
// references: an inclusive scan of packed flags (positives in the low 16 bits, negatives in
// the high; a tile has at most WORKGROUP_SIZE of each) ranks every kept reference, so the
// rows land in ascending reference order, and every write is bounded by the anchor's own
// slice and by the binding. Loop bounds come from the uniform block or through
// workgroupUniformLoad, so every invocation reaches every barrier.

struct Params {
    // Anchors of this dispatch, references per row.
    rows: u32,
    cols: u32,
    // The dispatch's first anchor (index into the labels, self slots and starts) and its row
    // in `distances`.
    anchor0: u32,
    row0: u32,
    emit: u32,
    rule: u32,
    similarity: u32,
    pos_strategy: u32,
    pos_margin: f32,
    neg_margin: f32,
    neg_strategy: u32,
    ranged: u32,
    pos_range: vec2<f32>,
    neg_range: vec2<f32>,
    // The output row at element 0 of each output binding (windows of larger arrays).
    pos_base: u32,
    neg_base: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
// (rows of the chunk, cols) values; unused (any buffer) with rule 0.
@group(0) @binding(1) var<storage, read> distances: array<f32>;
// Per anchor of the call: its label and its own reference slot (NONE: none).
@group(0) @binding(2) var<storage, read> anchor_labels: array<u32>;
@group(0) @binding(3) var<storage, read> self_slots: array<u32>;
@group(0) @binding(4) var<storage, read> ref_labels: array<u32>;
// Per anchor of the call, (positives, negatives): counts written (emit = 0), or the offsets
// of its first rows read, one entry past the last anchor included (emit = 1).
@group(0) @binding(5) var<storage, read_write> starts: array<vec2<u32>>;
@group(0) @binding(6) var<storage, read_write> pos_out: array<vec2<u32>>;
@group(0) @binding(7) var<storage, read_write> neg_out: array<vec2<u32>>;

// Invocations per workgroup: set from Rust (pair_select::WORKGROUP_SIZE).
override WORKGROUP_SIZE: u32;

const NONE: u32 = 0xFFFFFFFFu;
// `params.rule` (src/kernels/pair_select.rs's `rule`, checked by reflection).
const ALL_PAIRS: u32 = 0u;
const PAIR_MARGIN: u32 = 1u;
const MULTI_SIMILARITY: u32 = 2u;
const EASY_HARD: u32 = 3u;
// A side's strategy (src/kernels/pair_select.rs's `strategy`, checked by reflection).
const HARD: u32 = 0u;
const SEMIHARD: u32 = 1u;
const EASY: u32 = 2u;
const ALL: u32 = 3u;

// Per invocation during a reduction: (value bits, reference) of the min and max positive,
// then of the min and max negative.
var<workgroup> reduced: array<array<vec2<u32>, 4>, WORKGROUP_SIZE>;
var<workgroup> scan: array<u32, WORKGROUP_SIZE>;
// A segment's length, shared through workgroupUniformLoad.
var<workgroup> segment: u32;

// The better of two (value bits, reference) candidates: the smaller value (the larger with
// `want_max`), on a tie the lower reference; an empty one (reference NONE) never wins.
fn better(a: vec2<u32>, b: vec2<u32>, want_max: bool) -> vec2<u32> {
    if (b.y == NONE) {
        return a;
    }
    if (a.y == NONE) {
        return b;
    }
    let va = bitcast<f32>(a.x);
    let vb = bitcast<f32>(b.x);
    var wins = vb < va;
    if (want_max) {
        wins = vb > va;
    }
    if (wins || (vb == va && b.y < a.y)) {
        return b;
    }
    return a;
}

// 0: reference r is a positive of the anchor, 1: a negative, 2: neither (its own slot).
fn side_of(label: u32, me: u32, r: u32) -> u32 {
    if (ref_labels[r] != label) {
        return 1u;
    }
    if (r != me) {
        return 0u;
    }
    return 2u;
}

fn closer(x: f32, y: f32) -> bool {
    if (params.similarity != 0u) {
        return x > y;
    }
    return x < y;
}

fn in_range(side: u32, v: f32) -> bool {
    if ((params.ranged & (1u << side)) == 0u) {
        return true;
    }
    var range = params.pos_range;
    if (side == 1u) {
        range = params.neg_range;
    }
    return v >= range.x && v <= range.y;
}

// Whether a strategy's pick of `side` is its largest value.
fn wants_max(side: u32, strategy: u32) -> bool {
    let easy = strategy == EASY;
    let sim = params.similarity != 0u;
    if (side == 0u) {
        return easy == sim;
    }
    return easy != sim;
}

// Min and max (value bits, reference) of each side's candidates in the row, left in
// reduced[0]; rule 3 admits only values in the side's range and, for side `bounded` (2: none),
// only values strictly closer (a positive) or farther (a negative) than `bound`.
fn reduce(lid: u32, drow: u32, label: u32, me: u32, bounded: u32, bound: f32) {
    // Earlier results in reduced[0] are read by everyone before anyone overwrites them.
    workgroupBarrier();
    var acc = array<vec2<u32>, 4>(vec2(0u, NONE), vec2(0u, NONE), vec2(0u, NONE), vec2(0u, NONE));
    for (var r = lid; r < params.cols; r += WORKGROUP_SIZE) {
        let side = side_of(label, me, r);
        if (side == 2u) {
            continue;
        }
        let v = distances[drow * params.cols + r];
        var admit = params.rule != EASY_HARD || in_range(side, v);
        if (side == bounded) {
            if (side == 0u) {
                admit = admit && closer(v, bound);
            } else {
                admit = admit && closer(bound, v);
            }
        }
        if (admit) {
            let c = vec2(bitcast<u32>(v), r);
            acc[2u * side] = better(acc[2u * side], c, false);
            acc[2u * side + 1u] = better(acc[2u * side + 1u], c, true);
        }
    }
    reduced[lid] = acc;
    workgroupBarrier();
    for (var stride = WORKGROUP_SIZE / 2u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            for (var j = 0u; j < 4u; j++) {
                reduced[lid][j] = better(reduced[lid][j], reduced[lid + stride][j], (j & 1u) == 1u);
            }
        }
        workgroupBarrier();
    }
}

// Orders positions i < j of a side's output: the smaller (key, reference) ends at i.
fn exchange(side: u32, i: u32, j: u32) {
    if (side == 0u) {
        let a = pos_out[i];
        let b = pos_out[j];
        if (b.x < a.x || (b.x == a.x && b.y < a.y)) {
            pos_out[i] = b;
            pos_out[j] = a;
        }
    } else {
        let a = neg_out[i];
        let b = neg_out[j];
        if (b.x < a.x || (b.x == a.x && b.y < a.y)) {
            neg_out[i] = b;
            neg_out[j] = a;
        }
    }
}

// Sorts a side's n rows from position `base` by (key, reference) in place, then sets their
// first word to the anchor: knn_sort's bitonic network ("flip, then disperse", the smaller
// slot always to the lower position, so any n sorts as if padded with larger slots).
fn sort_segment(lid: u32, side: u32, base: u32, n: u32, anchor: u32) {
    for (var size = 2u; (size >> 1u) < n; size <<= 1u) {
        let half = size >> 1u;
        let flips = ((n + size - 1u) / size) * half;
        for (var t = lid; t < flips; t += WORKGROUP_SIZE) {
            let start = (t / half) * size;
            let off = t % half;
            let j = start + size - 1u - off;
            if (j < n) {
                exchange(side, base + start + off, base + j);
            }
        }
        storageBarrier();
        for (var d = half >> 1u; d > 0u; d >>= 1u) {
            let pairs = ((n + 2u * d - 1u) / (2u * d)) * d;
            for (var t = lid; t < pairs; t += WORKGROUP_SIZE) {
                let i = (t / d) * 2u * d + t % d;
                if (i + d < n) {
                    exchange(side, base + i, base + i + d);
                }
            }
            storageBarrier();
        }
    }
    for (var s = lid; s < n; s += WORKGROUP_SIZE) {
        if (side == 0u) {
            pos_out[base + s].x = anchor;
        } else {
            neg_out[base + s].x = anchor;
        }
    }
}

// The total-order key of a value (unsigned order = f32::total_cmp order).
fn total_key(v: f32) -> u32 {
    let bits = bitcast<u32>(v);
    if ((bits & 0x80000000u) != 0u) {
        return ~bits;
    }
    return bits | 0x80000000u;
}

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let row = wid.y * groups.x + wid.x;
    // Whole workgroups leave together, so every barrier below is reached by all or none.
    if (row >= params.rows) {
        return;
    }
    let anchor = params.anchor0 + row;
    let drow = params.row0 + row;
    let label = anchor_labels[anchor];
    let me = self_slots[anchor];
    let sim = params.similarity != 0u;

    // What each side keeps: every candidate (`all`), one reference (`pick`, NONE: nothing), or
    // (rules 1, 2) the candidates whose value passes a threshold.
    var all_pos = params.rule == ALL_PAIRS;
    var all_neg = params.rule == ALL_PAIRS;
    var pick_pos = NONE;
    var pick_neg = NONE;
    var first = array<vec2<u32>, 4>();
    if (params.rule >= MULTI_SIMILARITY) {
        reduce(lid, drow, label, me, 2u, 0.0);
        first = reduced[0];
    }
    if (params.rule == EASY_HARD) {
        let ps = params.pos_strategy;
        let ns = params.neg_strategy;
        var p = first[0];
        if (wants_max(0u, ps)) {
            p = first[1];
        }
        var n = first[2];
        if (wants_max(1u, ns)) {
            n = first[3];
        }
        // A semihard side: the hardest strictly easier than the other side's pick.
        if (ps == SEMIHARD || ns == SEMIHARD) {
            var side = 1u;
            var bound = bitcast<f32>(p.x);
            if (ps == SEMIHARD) {
                side = 0u;
                bound = bitcast<f32>(n.x);
            }
            reduce(lid, drow, label, me, side, bound);
            let second = reduced[0];
            if (ps == SEMIHARD) {
                p = second[0];
                if (wants_max(0u, ps)) {
                    p = second[1];
                }
                if (n.y == NONE) {
                    p.y = NONE;
                }
            } else {
                n = second[2];
                if (wants_max(1u, ns)) {
                    n = second[3];
                }
                if (p.y == NONE) {
                    n.y = NONE;
                }
            }
        }
        all_pos = ps == ALL;
        all_neg = ns == ALL;
        pick_pos = p.y;
        pick_neg = n.y;
        if (!all_pos && !all_neg && (p.y == NONE || n.y == NONE)) {
            pick_pos = NONE;
            pick_neg = NONE;
        }
    }
    let multi = params.rule == MULTI_SIMILARITY;
    let both = first[0].y != NONE && first[2].y != NONE;
    let eps = params.pos_margin;
    let min_pos = bitcast<f32>(first[0].x);
    let max_pos = bitcast<f32>(first[1].x);
    let min_neg = bitcast<f32>(first[2].x);
    let max_neg = bitcast<f32>(first[3].x);

    let emit = params.emit != 0u;
    var begin = vec2(0u, 0u);
    var end = vec2(0u, 0u);
    if (emit) {
        begin = starts[anchor];
        end = starts[anchor + 1u];
    }
    var run = vec2(0u, 0u);
    for (var t0 = 0u; t0 < params.cols; t0 += WORKGROUP_SIZE) {
        let r = t0 + lid;
        var flags = 0u;
        var v = 0.0;
        if (r < params.cols) {
            let side = side_of(label, me, r);
            if (params.rule != ALL_PAIRS) {
                v = distances[drow * params.cols + r];
            }
            var keep = false;
            if (side == 0u) {
                switch params.rule {
                    case PAIR_MARGIN: {
                        keep = (sim && v < params.pos_margin) || (!sim && v > params.pos_margin);
                    }
                    case MULTI_SIMILARITY: {
                        keep = both && ((sim && v - eps < max_neg) || (!sim && v + eps > min_neg));
                    }
                    default: {
                        keep = all_pos || r == pick_pos;
                    }
                }
                flags = select(0u, 1u, keep);
            } else if (side == 1u) {
                switch params.rule {
                    case PAIR_MARGIN: {
                        keep = (sim && v > params.neg_margin) || (!sim && v < params.neg_margin);
                    }
                    case MULTI_SIMILARITY: {
                        keep = both && ((sim && v + eps > min_pos) || (!sim && v - eps < max_pos));
                    }
                    default: {
                        keep = all_neg || r == pick_neg;
                    }
                }
                flags = select(0u, 0x10000u, keep);
            }
        }
        scan[lid] = flags;
        workgroupBarrier();
        for (var d = 1u; d < WORKGROUP_SIZE; d <<= 1u) {
            var add = 0u;
            if (lid >= d) {
                add = scan[lid - d];
            }
            workgroupBarrier();
            scan[lid] += add;
            workgroupBarrier();
        }
        let rank = scan[lid] - flags;
        let tile = scan[WORKGROUP_SIZE - 1u];
        if (emit && flags != 0u) {
            // Rule 2 writes (key, reference) to sort by; the anchor replaces the key after.
            var first_word = anchor;
            if (multi) {
                first_word = total_key(v);
            }
            if ((flags & 0xFFFFu) != 0u) {
                let at = begin.x + run.x + (rank & 0xFFFFu);
                if (at < end.x && at >= params.pos_base && at - params.pos_base < arrayLength(&pos_out)) {
                    pos_out[at - params.pos_base] = vec2(first_word, r);
                }
            } else {
                let at = begin.y + run.y + (rank >> 16u);
                if (at < end.y && at >= params.neg_base && at - params.neg_base < arrayLength(&neg_out)) {
                    neg_out[at - params.neg_base] = vec2(first_word, r);
                }
            }
        }
        run += vec2(tile & 0xFFFFu, tile >> 16u);
        // Everyone has read the scan before the next tile overwrites it.
        workgroupBarrier();
    }
    if (!emit) {
        if (lid == 0u) {
            starts[anchor] = run;
        }
        return;
    }
    if (multi) {
        storageBarrier();
        for (var side = 0u; side < 2u; side++) {
            // The rows written, never past the anchor's slice or the binding.
            if (lid == 0u) {
                var n = min(run[side], end[side] - begin[side]);
                var base = begin.x - params.pos_base;
                var room = arrayLength(&pos_out);
                if (side == 1u) {
                    base = begin.y - params.neg_base;
                    room = arrayLength(&neg_out);
                }
                segment = min(n, room - min(base, room));
            }
            let n = workgroupUniformLoad(&segment);
            var base = begin.x - params.pos_base;
            if (side == 1u) {
                base = begin.y - params.neg_base;
            }
            sort_segment(lid, side, base, n, anchor);
            storageBarrier();
        }
    }
}
