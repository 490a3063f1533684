// The register-blocked distance GEMM: one (rows, cols) tile of a distance matrix,
//
//   out[r * out_stride + out_col0 + c] = metric(queries[r], refs[ref_row0 + c])
//
// with the uniform block, bindings and loads of common/tile.wgsl and the epilogue of
// common/metric.wgsl, as distance_tile.wgsl. This file (after those two) is the
// family's shared part; the entry point `main` is generated in Rust for each variant (block
// tile BM x BN, depth step BK, thread tile TM x TN, single or double-buffered staging:
// src/kernels/gemm_tile.rs), appended below with its constants, and the whole naga-validated.
//
// Every variant sums each output in one fixed order: one multiply-add chain (fma) over the
// dimension, ascending, from +0. So on one device every variant (and distance_tile.wgsl, which
// does the same) gives the same bits for the same inputs. Across devices they may differ in
// the last bits: Vulkan lets fma round twice, and the epilogue's square root is not exact.

// A row's (or column's) epilogue terms: its squared norm and 1 / max(|x|, 1e-12) (used only
// when normalising). Zero past the edge (the value is never stored there).
fn query_terms(row: u32) -> vec2<f32> {
    if (row >= params.rows) {
        return vec2<f32>(0.0, 1.0);
    }
    let x2 = query_sq_norms[row];
    return vec2<f32>(x2, inv_norm(x2));
}

fn ref_terms(col: u32) -> vec2<f32> {
    if (col >= params.cols) {
        return vec2<f32>(0.0, 1.0);
    }
    let x2 = ref_sq_norms[params.ref_row0 + col];
    return vec2<f32>(x2, inv_norm(x2));
}

// The metric from the dot product and both sides' terms: common/metric.wgsl's epilogue, as
// distance_tile.wgsl applies it (so the same bits).
fn metric(dot_raw: f32, q: vec2<f32>, r: vec2<f32>) -> f32 {
    return metric_of(params.metric, params.normalize, dot_raw, q, r);
}

// Stores one output; `row` and `col` are checked by the caller.
fn store(row: u32, col: u32, value: f32) {
    out[row * params.out_stride + params.out_col0 + col] = value;
}
