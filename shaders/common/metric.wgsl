// common/metric.wgsl: the metric codes of every kernel's `params.metric` and the arithmetic of
// a distance from a dot product. Composed in front of a kernel's own source (src/kernels/
// common.rs); the codes are checked against Rust's `Distance::code` by reflection.

const METRIC_EUCLIDEAN: u32 = 0u;
const METRIC_SQUARED_EUCLIDEAN: u32 = 1u;
const METRIC_COSINE: u32 = 2u;
const METRIC_DOT: u32 = 3u;

// Whether larger values mean closer (cosine, dot product): PML's `is_inverted`.
fn is_similarity(metric: u32) -> bool {
    return metric >= METRIC_COSINE;
}

// 1 / max(|x|, 1e-12) from |x|^2: torch F.normalize's rule (the factor that normalises a row).
fn inv_norm(sq: f32) -> f32 {
    return 1.0 / max(sqrt(sq), 1e-12);
}

// A row's factor: inv_norm when normalising (`normalize` != 0), else 1.
fn scale_of(sq: f32, normalize: u32) -> f32 {
    if (normalize != 0u) {
        return inv_norm(sq);
    }
    return 1.0;
}

// The metric from a raw dot product and both rows' (squared norm, inv_norm) terms, as
// torch.cdist computes it for large inputs: |q|^2 + |r|^2 - 2 q.r, clamped at 0 against
// round-off. Every distance kernel's epilogue, so every one gives the same bits.
fn metric_of(metric: u32, normalize: u32, dot_raw: f32, q: vec2<f32>, r: vec2<f32>) -> f32 {
    var q2 = q.x;
    var r2 = r.x;
    var d = dot_raw;
    if (normalize != 0u) {
        d = d * q.y * r.y;
        q2 = q2 * q.y * q.y;
        r2 = r2 * r.y * r.y;
    }
    switch metric {
        case METRIC_EUCLIDEAN: {
            return sqrt(max(q2 + r2 - 2.0 * d, 0.0));
        }
        case METRIC_SQUARED_EUCLIDEAN: {
            return max(q2 + r2 - 2.0 * d, 0.0);
        }
        default: {
            return d;
        }
    }
}
