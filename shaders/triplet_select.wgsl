// Counts, then writes, the triplets (a, p, n) of each (anchor, positive) pair of a chunk.
//
// Invocation (i, a) owns the pair (anchor a, its i-th positive p = positives[a * refs + i]) and
// walks the anchor's negatives n in ascending order, keeping those that pass the rule:
//   mode 0: every negative (all valid triplets, from labels alone)
//   with tm = d(a,n) - d(a,p) for distances, d(a,p) - d(a,n) for similarities (PML):
//   mode 1 "all":      tm <= margin
//   mode 2 "hard":     tm <= margin and tm <= 0
//   mode 3 "semihard": tm <= margin and tm > 0
//   mode 4 "easy":     tm > margin
// With emit = 0 it stores the pair's count in pair_counts. With emit = 1 it writes the pair's
// triplets at its 64-bit output offset (an exclusive prefix sum of the counts over pairs in
// (a, i) order, computed on the host), if that offset lies in [start, end): the host cuts the
// output into windows that fit the output buffer, always at pair boundaries. Writing each
// pair's negatives in ascending order at prefix-sum offsets gives PML's lexicographic order.

struct Params {
    anchors: u32,
    refs: u32,
    // Global index of the chunk's first anchor.
    anchor0: u32,
    mode: u32,
    inverted: u32,
    emit: u32,
    margin: f32,
    _pad0: u32,
    // Output window [start, end) as 64-bit (low, high) words.
    start: vec2<u32>,
    end: vec2<u32>,
}

@group(0) @binding(0) var<uniform> params: Params;
// (anchors, refs) distances of the chunk; unused (may be a dummy) in mode 0.
@group(0) @binding(1) var<storage, read> distances: array<f32>;
@group(0) @binding(2) var<storage, read> positives: array<u32>;
@group(0) @binding(3) var<storage, read> negatives: array<u32>;
@group(0) @binding(4) var<storage, read> list_counts: array<u32>;
@group(0) @binding(5) var<storage, read_write> pair_counts: array<u32>;
@group(0) @binding(6) var<storage, read> offsets: array<vec2<u32>>;
@group(0) @binding(7) var<storage, read_write> out: array<u32>;

const WORKGROUP_SIZE: u32 = 64u;

fn keep(ap: f32, an: f32) -> bool {
    let tm = select(an - ap, ap - an, params.inverted != 0u);
    switch params.mode {
        case 1u: {
            return tm <= params.margin;
        }
        case 2u: {
            return tm <= params.margin && tm <= 0.0;
        }
        case 3u: {
            return tm <= params.margin && tm > 0.0;
        }
        case 4u: {
            return tm > params.margin;
        }
        default: {
            return true;
        }
    }
}

fn less64(x: vec2<u32>, y: vec2<u32>) -> bool {
    return x.y < y.y || (x.y == y.y && x.x < y.x);
}

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let a = gid.y;
    if (a >= params.anchors) {
        return;
    }
    let n_pos = list_counts[2u * a];
    if (i >= n_pos) {
        return;
    }
    let n_neg = list_counts[2u * a + 1u];
    let row = a * params.refs;
    let p = positives[row + i];
    var ap = 0.0;
    if (params.mode != 0u) {
        ap = distances[row + p];
    }
    if (params.emit == 0u) {
        var count = n_neg;
        if (params.mode != 0u) {
            count = 0u;
            for (var j = 0u; j < n_neg; j++) {
                if (keep(ap, distances[row + negatives[row + j]])) {
                    count += 1u;
                }
            }
        }
        pair_counts[row + i] = count;
        return;
    }
    let offset = offsets[row + i];
    if (pair_counts[row + i] == 0u || less64(offset, params.start) || !less64(offset, params.end)) {
        return;
    }
    // Inside the window the distance to `start` fits in 32 bits (the window fits a buffer).
    var k = 3u * (offset.x - params.start.x);
    let anchor = params.anchor0 + a;
    for (var j = 0u; j < n_neg; j++) {
        let n = negatives[row + j];
        if (params.mode == 0u || keep(ap, distances[row + n])) {
            out[k] = anchor;
            out[k + 1u] = p;
            out[k + 2u] = n;
            k += 3u;
        }
    }
}
