// Counts (entry point `count`), then writes (entry point `emit`), the triplets (a, p, n) of
// each (anchor, positive) pair of a chunk.
//
// Pair (a, i) is anchor a = row0 + y and its i-th positive p, i = x folded with z past 65 535;
// the negatives n of a are walked in ascending order, keeping those that pass the rule:
//   mode 0: every negative (all valid triplets, from labels alone)
//   with tm = d(a,n) - d(a,p) for distances, d(a,p) - d(a,n) for similarities (PML):
//   mode 1 "all":      tm <= margin
//   mode 2 "hard":     tm <= margin and tm <= 0
//   mode 3 "semihard": tm <= margin and tm > 0
//   mode 4 "easy":     tm > margin
// `count`: one workgroup per pair; its 256 invocations stride over the negatives and reduce
// their kept flags to pair_counts (mode 0 needs no count pass: the host knows n_neg).
// `emit`: one invocation per pair writes the pair's kept triplets, in ascending n, at its
// 64-bit output offset (the exclusive prefix sum of the counts over pairs in (a, i) order,
// computed on the host) if that offset lies in the window [start, end): the host cuts the
// output into windows that fit the output buffer, always at pair boundaries. Ascending n at
// prefix-sum offsets is PML's lexicographic (a, p, n) order. Emitting serially per pair needs
// no workgroup scan; measured on lavapipe it is 2-6x faster than a workgroup-per-pair scan,
// and a GPU is busy once there are a few thousand pairs.

struct Params {
    anchors: u32,
    refs: u32,
    // Global index of the chunk's first anchor.
    anchor0: u32,
    mode: u32,
    inverted: u32,
    // First chunk-local anchor of this dispatch (workgroup y counts from here), so that an
    // output window launches only the anchors it covers.
    row0: u32,
    margin: f32,
    _pad1: u32,
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

const WORKGROUP_SIZE: u32 = 256u;
const EMIT_WORKGROUP_SIZE: u32 = 64u;

var<workgroup> scan: array<u32, 256>;

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

// Whether negative j of anchor row `row` is kept against anchor-positive value `ap`.
fn kept(row: u32, j: u32, ap: f32) -> bool {
    return params.mode == 0u || keep(ap, distances[row + negatives[row + j]]);
}

@compute @workgroup_size(256, 1, 1)
fn count(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let a = params.row0 + wid.y;
    let i = wid.x + wid.z * groups.x;
    // Both tests are uniform per workgroup, so a workgroup leaves whole.
    if (a >= params.anchors || i >= list_counts[2u * a]) {
        return;
    }
    let t = lid.x;
    let n_neg = list_counts[2u * a + 1u];
    let row = a * params.refs;
    var ap = 0.0;
    if (params.mode != 0u) {
        ap = distances[row + positives[row + i]];
    }
    var c = 0u;
    if (params.mode == 0u) {
        c = select(0u, n_neg, t == 0u);
    } else {
        for (var j = t; j < n_neg; j += WORKGROUP_SIZE) {
            if (kept(row, j, ap)) {
                c += 1u;
            }
        }
    }
    scan[t] = c;
    workgroupBarrier();
    for (var s = WORKGROUP_SIZE / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            scan[t] += scan[t + s];
        }
        workgroupBarrier();
    }
    if (t == 0u) {
        pair_counts[row + i] = scan[0];
    }
}

@compute @workgroup_size(64, 1, 1)
fn emit(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let a = params.row0 + gid.y;
    let i = gid.x + gid.z * groups.x * EMIT_WORKGROUP_SIZE;
    if (a >= params.anchors || i >= list_counts[2u * a]) {
        return;
    }
    let row = a * params.refs;
    let offset = offsets[row + i];
    if (pair_counts[row + i] == 0u || less64(offset, params.start) || !less64(offset, params.end)) {
        return;
    }
    let n_neg = list_counts[2u * a + 1u];
    let p = positives[row + i];
    var ap = 0.0;
    if (params.mode != 0u) {
        ap = distances[row + p];
    }
    let anchor = params.anchor0 + a;
    // Inside the window the distance to `start` fits in 32 bits (the window fits a buffer).
    var k = 3u * (offset.x - params.start.x);
    for (var j = 0u; j < n_neg; j++) {
        if (kept(row, j, ap)) {
            out[k] = anchor;
            out[k + 1u] = p;
            out[k + 2u] = negatives[row + j];
            k += 3u;
        }
    }
}
