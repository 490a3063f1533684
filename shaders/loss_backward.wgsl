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
// Each workgroup owns (TILE * RM) output rows (anchors or references) by (TILE * CN) vec4s of
// the dimension; each of its TILE x TILE invocations keeps RM x CN of them in registers (rows
// lid.y + TILE m, vec4s lid.x + TILE k: neighbours read neighbouring vec4s). The summed-over
// index is walked TILE at a time, its weights and rows staged in workgroup memory, so every
// staged weight feeds CN and every staged vec4 RM accumulators. Every output is one chain of
// additions over the summed index in ascending order.
//
// Split: with few output tiles (a block of 256 anchors is 4 tiles of the query side, a few
// percent of a large GPU), the summed index is cut into `splits` chunks of `chunk` steps
// (a multiple of TILE); each workgroup sums one chunk of its tile into `partial` (one (out
// rows, dim4) slab per chunk), and `query_gather` / `ref_gather` add the slabs in chunk order
// and write (query side) or add (ref side) the output. Every output is then a sum of chunk
// sums, in a fixed order: the same bits on every run, within rounding of one chain. Tiles of
// rows fold y into x past 65 535; z walks the dimension's tiles, then the chunks.

struct Params {
    // Anchor rows of the block.
    rows: u32,
    refs: u32,
    dim4: u32,
    // A METRIC_* code (common/metric.wgsl).
    metric: u32,
    normalize: u32,
    // query_side: the block's first row in `out`.
    out_row0: u32,
    // Steps of the summed index per chunk (a multiple of TILE), and chunks (1: no split, the
    // products write `out` themselves).
    chunk: u32,
    splits: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
// (rows, refs) weights, row-major.
@group(0) @binding(1) var<storage, read> u: array<f32>;
@group(0) @binding(2) var<storage, read> queries: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> query_sq_norms: array<f32>;
@group(0) @binding(4) var<storage, read> refs: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> ref_sq_norms: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<vec4<f32>>;
// (splits, out rows, dim4) chunk sums, when split.
@group(0) @binding(7) var<storage, read_write> partial: array<vec4<f32>>;

// Invocations per side and the summed index's step: set from Rust (loss_backward::TILE).
override TILE: u32;
// Output rows and vec4 columns per invocation (loss_backward::ROWS_PER and COLS_PER).
const RM: u32 = 4u;
const CN: u32 = 2u;
override W_ITEMS: u32 = TILE * RM * TILE;
override S_ITEMS: u32 = TILE * TILE * CN;

// (TILE * RM rows) x (TILE steps) weights, row-major.
var<workgroup> weights: array<f32, W_ITEMS>;
// (TILE steps) x (TILE * CN vec4s) staged rows, row-major.
var<workgroup> staged: array<vec4<f32>, S_ITEMS>;

// Row i (< count) of `side` (0: the block's anchors, 1: references) at vec4 c, normalised; 0
// past either edge.
fn row_hat(side: u32, i: u32, c: u32, count: u32) -> vec4<f32> {
    if (i >= count || c >= params.dim4) {
        return vec4<f32>(0.0);
    }
    if (side == 0u) {
        return queries[i * params.dim4 + c] * scale_of(query_sq_norms[i], params.normalize);
    }
    return refs[i * params.dim4 + c] * scale_of(ref_sq_norms[i], params.normalize);
}

fn weight(a: u32, j: u32) -> f32 {
    if (a >= params.rows || j >= params.refs) {
        return 0.0;
    }
    return u[a * params.refs + j];
}

// Stages the TILE steps from `k0` of the summed index: the weights of the workgroup's rows
// (from `row0`) and the rows of `side` at its vec4s (from `col0`). Query side: weight (row,
// step) = U[row0 + row, k0 + step]; ref side: U[k0 + step, row0 + row], read along the row so
// that neighbouring invocations read neighbouring words.
fn stage(t: u32, query: bool, row0: u32, col0: u32, k0: u32) {
    for (var s = 0u; s < RM; s++) {
        let e = t + s * TILE * TILE;
        if (query) {
            let row = e / TILE;
            let step = e % TILE;
            weights[row * TILE + step] = weight(row0 + row, k0 + step);
        } else {
            let row = e % (TILE * RM);
            let step = e / (TILE * RM);
            weights[row * TILE + step] = weight(k0 + step, row0 + row);
        }
    }
    for (var s = 0u; s < CN; s++) {
        let e = t + s * TILE * TILE;
        let step = e / (TILE * CN);
        let c = e % (TILE * CN);
        if (query) {
            staged[e] = row_hat(1u, k0 + step, col0 + c, params.refs);
        } else {
            staged[e] = row_hat(0u, k0 + step, col0 + c, params.rows);
        }
    }
}

// One term of an output's sum: weight `w` times the other side's row `x` (similarities), or
// times the difference of this output's row `mine` and `x` (Euclidean forms).
fn term(w: f32, x: vec4<f32>, mine: vec4<f32>, euclidean: bool) -> vec4<f32> {
    return w * select(x, mine - x, euclidean);
}

// Writes (query) or adds (ref side) output row `row` at vec4 `c`, inside the output; when
// split, writes chunk `split`'s sum to its slab instead.
fn emit(query: bool, split: u32, row: u32, c: u32, out_rows: u32, value: vec4<f32>) {
    if (row >= out_rows || c >= params.dim4) {
        return;
    }
    if (params.splits > 1u) {
        partial[(split * out_rows + row) * params.dim4 + c] = value;
    } else if (query) {
        out[(params.out_row0 + row) * params.dim4 + c] = value;
    } else {
        let at = row * params.dim4 + c;
        out[at] = out[at] + value;
    }
}

// Both products: `query` sums over references into anchor rows, else over anchors into
// reference rows (added to `out`). The RM x CN outputs of an invocation are named registers
// (a<m><k>, with their own rows m<m><k>), not an array: no dynamic index to bound-check, so
// every compiler keeps them in registers. RM = 4 and CN = 2 are spelled out below.
fn product(lid: vec3<u32>, wid: vec3<u32>, groups: vec3<u32>, query: bool) {
    let row0 = (wid.x + wid.y * groups.x) * TILE * RM;
    let col_tiles = (params.dim4 + TILE * CN - 1u) / (TILE * CN);
    let col0 = (wid.z % col_tiles) * TILE * CN;
    let split = wid.z / col_tiles;
    let t = lid.y * TILE + lid.x;
    let e = !is_similarity(params.metric);
    var out_rows = params.refs;
    var summed = params.rows;
    var own = 1u;
    if (query) {
        out_rows = params.rows;
        summed = params.refs;
        own = 0u;
    }
    // This workgroup's chunk of the summed index (uniform: from the workgroup id). Steps past
    // `summed` weigh 0 (`weight`), so the last chunk's stage may run past it.
    var k_begin = 0u;
    var k_end = summed;
    if (params.splits > 1u) {
        k_begin = min(split * params.chunk, summed);
        k_end = min(k_begin + params.chunk, summed);
    }
    let r0 = row0 + lid.y;
    let r1 = r0 + TILE;
    let r2 = r1 + TILE;
    let r3 = r2 + TILE;
    let c0 = col0 + lid.x;
    let c1 = c0 + TILE;
    let m00 = row_hat(own, r0, c0, out_rows);
    let m01 = row_hat(own, r0, c1, out_rows);
    let m10 = row_hat(own, r1, c0, out_rows);
    let m11 = row_hat(own, r1, c1, out_rows);
    let m20 = row_hat(own, r2, c0, out_rows);
    let m21 = row_hat(own, r2, c1, out_rows);
    let m30 = row_hat(own, r3, c0, out_rows);
    let m31 = row_hat(own, r3, c1, out_rows);
    var a00 = vec4<f32>(0.0);
    var a01 = vec4<f32>(0.0);
    var a10 = vec4<f32>(0.0);
    var a11 = vec4<f32>(0.0);
    var a20 = vec4<f32>(0.0);
    var a21 = vec4<f32>(0.0);
    var a30 = vec4<f32>(0.0);
    var a31 = vec4<f32>(0.0);
    for (var k0 = k_begin; k0 < k_end; k0 += TILE) {
        stage(t, query, row0, col0, k0);
        workgroupBarrier();
        for (var i = 0u; i < TILE; i++) {
            let x0 = staged[i * TILE * CN + lid.x];
            let x1 = staged[i * TILE * CN + lid.x + TILE];
            let w0 = weights[lid.y * TILE + i];
            let w1 = weights[(lid.y + TILE) * TILE + i];
            let w2 = weights[(lid.y + 2u * TILE) * TILE + i];
            let w3 = weights[(lid.y + 3u * TILE) * TILE + i];
            a00 += term(w0, x0, m00, e);
            a01 += term(w0, x1, m01, e);
            a10 += term(w1, x0, m10, e);
            a11 += term(w1, x1, m11, e);
            a20 += term(w2, x0, m20, e);
            a21 += term(w2, x1, m21, e);
            a30 += term(w3, x0, m30, e);
            a31 += term(w3, x1, m31, e);
        }
        workgroupBarrier();
    }
    emit(query, split, r0, c0, out_rows, a00);
    emit(query, split, r0, c1, out_rows, a01);
    emit(query, split, r1, c0, out_rows, a10);
    emit(query, split, r1, c1, out_rows, a11);
    emit(query, split, r2, c0, out_rows, a20);
    emit(query, split, r2, c1, out_rows, a21);
    emit(query, split, r3, c0, out_rows, a30);
    emit(query, split, r3, c1, out_rows, a31);
}

// Invocations per workgroup of the gathers: set from Rust (loss_backward::GATHER_GROUP).
override GATHER: u32;

// The chunk sums of output vec4 `i` (row-major over (out rows, dim4)) added in chunk order,
// then written (query side, at the block's rows) or added (ref side) to `out`.
fn gather(lid: vec3<u32>, wid: vec3<u32>, groups: vec3<u32>, query: bool) {
    let i = (wid.x + wid.y * groups.x) * GATHER + lid.x;
    var out_rows = params.refs;
    if (query) {
        out_rows = params.rows;
    }
    let n = out_rows * params.dim4;
    if (i >= n) {
        return;
    }
    var sum = partial[i];
    for (var s = 1u; s < params.splits; s++) {
        sum += partial[s * n + i];
    }
    if (query) {
        out[params.out_row0 * params.dim4 + i] = sum;
    } else {
        out[i] = out[i] + sum;
    }
}

@compute @workgroup_size(TILE, TILE, 1)
fn query_side(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    product(lid, wid, groups, true);
}

@compute @workgroup_size(TILE, TILE, 1)
fn ref_side(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    product(lid, wid, groups, false);
}

@compute @workgroup_size(GATHER, 1, 1)
fn query_gather(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    gather(lid, wid, groups, true);
}

@compute @workgroup_size(GATHER, 1, 1)
fn ref_gather(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    gather(lid, wid, groups, false);
}
