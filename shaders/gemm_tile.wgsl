// The register-blocked distance GEMM: one (rows, cols) tile of a distance matrix,
//
//   out[r * out_stride + out_col0 + c] = metric(queries[r], refs[ref_row0 + c])
//
// with the bindings, uniform block and metric epilogue of distance_tile.wgsl. This file is the
// family's shared part; the entry point `main` is generated in Rust for each variant (block
// tile BM x BN, depth step BK, thread tile TM x TN, single or double-buffered staging:
// src/kernels/gemm_tile.rs), appended below with its constants, and the whole naga-validated.
//
// Every variant sums each output in one fixed order: one multiply-add chain (fma) over the
// dimension, ascending, from +0. So on one device every variant (and distance_tile.wgsl, which
// does the same) gives the same bits for the same inputs. Across devices they may differ in
// the last bits: Vulkan lets fma round twice, and the epilogue's square root is not exact.
//
// Rows are padded by the host to a multiple of 4 floats with zeros, so vec4 loads need no tail
// handling and the zeros change no dot product.

struct Params {
    rows: u32,
    cols: u32,
    dim4: u32,
    // 0: Euclidean, 1: squared Euclidean, 2: cosine similarity, 3: dot product.
    metric: u32,
    normalize: u32,
    out_stride: u32,
    out_col0: u32,
    ref_row0: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> queries: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> refs: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> query_sq_norms: array<f32>;
@group(0) @binding(4) var<storage, read> ref_sq_norms: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

// Row `item` of `side` (0: queries, 1: references) at vec4 `k` of the dimension, zero past
// the tile's edge or the dimension. Every index read is below rows * dim4 (queries) or
// (ref_row0 + cols) * dim4 (refs), which the host checks against the buffers' sizes.
fn load(side: u32, item: u32, k: u32) -> vec4<f32> {
    if (k >= params.dim4) {
        return vec4<f32>(0.0);
    }
    if (side == 0u) {
        if (item < params.rows) {
            return queries[item * params.dim4 + k];
        }
        return vec4<f32>(0.0);
    }
    if (item < params.cols) {
        return refs[(params.ref_row0 + item) * params.dim4 + k];
    }
    return vec4<f32>(0.0);
}

// A row's (or column's) epilogue terms: its squared norm and 1 / max(|x|, 1e-12) (used only
// when normalising). Zero past the edge (the value is never stored there).
fn query_terms(row: u32) -> vec2<f32> {
    if (row >= params.rows) {
        return vec2<f32>(0.0, 1.0);
    }
    let x2 = query_sq_norms[row];
    return vec2<f32>(x2, 1.0 / max(sqrt(x2), 1e-12));
}

fn ref_terms(col: u32) -> vec2<f32> {
    if (col >= params.cols) {
        return vec2<f32>(0.0, 1.0);
    }
    let x2 = ref_sq_norms[params.ref_row0 + col];
    return vec2<f32>(x2, 1.0 / max(sqrt(x2), 1e-12));
}

// The metric from the dot product and both sides' terms, in distance_tile.wgsl's operations
// and order (so the same bits): torch.cdist's |q|^2 + |r|^2 - 2 q.r, clamped at 0.
fn metric(dot_raw: f32, q: vec2<f32>, r: vec2<f32>) -> f32 {
    var q2 = q.x;
    var r2 = r.x;
    var d = dot_raw;
    if (params.normalize != 0u) {
        d = d * q.y * r.y;
        q2 = q2 * q.y * q.y;
        r2 = r2 * r.y * r.y;
    }
    switch params.metric {
        case 0u: {
            return sqrt(max(q2 + r2 - 2.0 * d, 0.0));
        }
        case 1u: {
            return max(q2 + r2 - 2.0 * d, 0.0);
        }
        default: {
            return d;
        }
    }
}

// Stores one output; `row` and `col` are checked by the caller.
fn store(row: u32, col: u32, value: f32) {
    out[row * params.out_stride + params.out_col0 + col] = value;
}
