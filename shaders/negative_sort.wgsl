// Sorts, per anchor of a chunk, the values (distances or similarities) of its negatives,
// ascending, so that triplet_select can count each (anchor, positive) pair's kept triplets by
// binary search instead of a scan: every margin rule keeps the negatives whose tm lies in an
// interval, and tm = an - ap (or ap - an) is monotone in an, also after f32 rounding.
//
// `gather` (one invocation per (anchor, slot)): sorted[a * width + j] = value of the j-th
//   negative of anchor a for j < n_neg(a), +inf beyond (padding to the power of two `width`
//   sorts last and is never searched).
// `step` (one invocation per (anchor, compare-exchange)): one pass (k, j) of a bitonic sort of
//   every row; the host runs the passes k = 2, 4, .., width and j = k/2, .., 1 in order.

struct Params {
    anchors: u32,
    refs: u32,
    width: u32,
    // Bitonic pass: sequence length k and compare distance j (powers of two).
    k: u32,
    j: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
// (anchors, refs) values of the chunk.
@group(0) @binding(1) var<storage, read> distances: array<f32>;
// (anchors, refs) ascending negative indices per anchor; the first n_neg of each row are set.
@group(0) @binding(2) var<storage, read> negatives: array<u32>;
// Per anchor [n_pos, n_neg].
@group(0) @binding(3) var<storage, read> list_counts: array<u32>;
// (anchors, width) sorted values.
@group(0) @binding(4) var<storage, read_write> sorted: array<f32>;

const WORKGROUP_SIZE: u32 = 64u;

fn flat_id(gid: vec3<u32>, groups: vec3<u32>) -> u32 {
    return gid.x + gid.y * groups.x * WORKGROUP_SIZE;
}

@compute @workgroup_size(64, 1, 1)
fn gather(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let id = flat_id(gid, groups);
    if (id >= params.anchors * params.width) {
        return;
    }
    let a = id / params.width;
    let j = id % params.width;
    var v = bitcast<f32>(0x7f800000u);
    if (j < list_counts[2u * a + 1u]) {
        let row = a * params.refs;
        v = distances[row + negatives[row + j]];
    }
    sorted[id] = v;
}

@compute @workgroup_size(64, 1, 1)
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
