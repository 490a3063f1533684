// common/tile.wgsl: the interface of a distance tile, shared by the hand-written kernel
// (distance_tile.wgsl) and the generated GEMM family (gemm_tile.wgsl): its uniform block, its
// bindings (in the order of src/kernels/distance_tile.rs's BINDINGS) and its bounded loads.
// Composed after metric.wgsl.
//
//   out[r * out_stride + out_col0 + c] = metric(queries[r], refs[ref_row0 + c])
//
// The tile may be one column block of a wider row-major matrix (references split into pages):
// out_stride is that matrix's row length and out_col0 the block's first column. Reference c is
// row ref_row0 + c of the refs buffer, so a tile can start inside a page. Rows are padded by
// the host to a multiple of 4 floats with zeros, so vec4 loads need no tail handling and the
// zeros change no dot product.

struct Params {
    rows: u32,
    cols: u32,
    dim4: u32,
    // A METRIC_* code (common/metric.wgsl).
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
