// A loss's gradient with respect to the normalised embeddings, from the weights U of one
// block of anchor rows (triplet_weights.wgsl): the two products of the weight matrix with the
// embeddings.
//
//   query_side: out[(out_row0 + a) * dim4 + c] = sum_j U[a, j] (q^_a - r^_j)   (Euclidean forms)
//                                              = sum_j U[a, j] r^_j            (similarities)
//   ref_side:   out[j * dim4 + c] += sum_a U[a, j] (r^_j - q^_a)              (Euclidean forms)
//                                 += sum_a U[a, j] q^_a                       (similarities)
//
// where x^ = x / max(|x|, 1e-12) when normalising (distance_tile.wgsl's scale), else x. The
// Euclidean forms are summed as differences, not as q^ rowsum(U) - U r^: a near-duplicate
// pair (whose U is large) then keeps its digits. query_side writes each anchor row of the
// block once; ref_side adds the block's share to every reference row, which the host zeroes
// before the first block.
//
// Each workgroup owns TILE x TILE outputs (TILE = 16, set from Rust): TILE rows (anchors or
// references) by TILE vec4s of the dimension, one per invocation. The summed-over index is
// walked TILE at a time, its weights and rows staged in workgroup memory, so every staged row
// feeds TILE invocations. Tiles of rows fold y into x past 65 535; z walks the dimension.

struct Params {
    // Anchor rows of the block.
    rows: u32,
    refs: u32,
    dim4: u32,
    // 0: Euclidean, 1: squared Euclidean, 2: cosine similarity, 3: dot product.
    metric: u32,
    normalize: u32,
    // query_side: the block's first row in `out`.
    out_row0: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
// (rows, refs) weights, row-major.
@group(0) @binding(1) var<storage, read> u: array<f32>;
@group(0) @binding(2) var<storage, read> queries: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> query_sq_norms: array<f32>;
@group(0) @binding(4) var<storage, read> refs: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> ref_sq_norms: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<vec4<f32>>;

// Rows and vec4 columns per workgroup: set from Rust (loss_backward::TILE).
override TILE: u32;
override TILE_ITEMS: u32 = TILE * TILE;

var<workgroup> weights: array<f32, TILE_ITEMS>;
var<workgroup> staged: array<vec4<f32>, TILE_ITEMS>;

fn scale_of(sq: f32) -> f32 {
    if (params.normalize != 0u) {
        return 1.0 / max(sqrt(sq), 1e-12);
    }
    return 1.0;
}

// Row i (< count) of `side` (0: the block's anchors, 1: references) at vec4 c, normalised; 0
// past either edge.
fn row_hat(side: u32, i: u32, c: u32, count: u32) -> vec4<f32> {
    if (i >= count || c >= params.dim4) {
        return vec4<f32>(0.0);
    }
    if (side == 0u) {
        return queries[i * params.dim4 + c] * scale_of(query_sq_norms[i]);
    }
    return refs[i * params.dim4 + c] * scale_of(ref_sq_norms[i]);
}

fn weight(a: u32, j: u32) -> f32 {
    if (a >= params.rows || j >= params.refs) {
        return 0.0;
    }
    return u[a * params.refs + j];
}

@compute @workgroup_size(TILE, TILE, 1)
fn query_side(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let a = (wid.x + wid.y * groups.x) * TILE + lid.y;
    let c = wid.z * TILE + lid.x;
    let mine = row_hat(0u, a, c, params.rows);
    let euclidean = params.metric < 2u;
    var acc = vec4<f32>(0.0);
    for (var j0 = 0u; j0 < params.refs; j0 += TILE) {
        // Invocation (x, y) stages the weight of (row y, reference j0 + x) and reference
        // j0 + y at vec4 c.
        weights[lid.y * TILE + lid.x] = weight(a, j0 + lid.x);
        staged[lid.y * TILE + lid.x] = row_hat(1u, j0 + lid.y, c, params.refs);
        workgroupBarrier();
        for (var i = 0u; i < TILE; i++) {
            let w = weights[lid.y * TILE + i];
            let r = staged[i * TILE + lid.x];
            acc += w * select(r, mine - r, euclidean);
        }
        workgroupBarrier();
    }
    if (a < params.rows && c < params.dim4) {
        out[(params.out_row0 + a) * params.dim4 + c] = acc;
    }
}

@compute @workgroup_size(TILE, TILE, 1)
fn ref_side(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let j0 = (wid.x + wid.y * groups.x) * TILE;
    let j = j0 + lid.y;
    let c = wid.z * TILE + lid.x;
    let mine = row_hat(1u, j, c, params.refs);
    let euclidean = params.metric < 2u;
    var acc = vec4<f32>(0.0);
    for (var a0 = 0u; a0 < params.rows; a0 += TILE) {
        // Invocation (x, y) stages the weight of (anchor a0 + y, reference j0 + x) and anchor
        // a0 + y at vec4 c.
        weights[lid.y * TILE + lid.x] = weight(a0 + lid.y, j0 + lid.x);
        staged[lid.y * TILE + lid.x] = row_hat(0u, a0 + lid.y, c, params.rows);
        workgroupBarrier();
        for (var i = 0u; i < TILE; i++) {
            let w = weights[i * TILE + lid.y];
            let q = staged[i * TILE + lid.x];
            acc += w * select(q, mine - q, euclidean);
        }
        workgroupBarrier();
    }
    if (j < params.refs && c < params.dim4) {
        let at = j * params.dim4 + c;
        out[at] = out[at] + acc;
    }
}
