//! Reference of `shaders/distance_tile.wgsl`.

use ndarray::{Array2, ArrayView2};

use crate::metric::{Distance, DistanceConfig};
use crate::reference::row_norms::row_norms;

/// The distance matrix `(q, n)` between `queries` `(q, d)` and `refs` `(n, d)`.
///
/// Computed as the kernel does and as `torch.cdist` does for large inputs: the dot product
/// (accumulated in dimension order with fused multiply-adds), then, from the squared norms,
/// `|q|² + |r|² − 2 q·r` clamped at 0 (and its square root for [`Distance::Euclidean`]). With
/// `normalize` (always, for cosine) each side is scaled by `1 / max(|x|, 1e-12)` first, as
/// PML's `F.normalize` does. Inputs are assumed valid (same `d`, finite).
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{reference::distance_tile::distance_tile, Distance, DistanceConfig};
/// let cfg = DistanceConfig { distance: Distance::SquaredEuclidean, normalize: false };
/// let d = distance_tile(array![[0.0f32, 0.0]].view(), array![[3.0f32, 4.0]].view(), &cfg);
/// assert_eq!(d[[0, 0]], 25.0);
/// ```
pub fn distance_tile(
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
    cfg: &DistanceConfig,
) -> Array2<f32> {
    let q_norms = row_norms(queries);
    let r_norms = row_norms(refs);
    let normalize = cfg.normalize || cfg.distance == Distance::Cosine; // as DistanceConfig documents
    let mut out = Array2::zeros((queries.nrows(), refs.nrows()));
    for (i, q) in queries.rows().into_iter().enumerate() {
        for (j, r) in refs.rows().into_iter().enumerate() {
            let mut dot = 0.0f32;
            for k in 0..q.len() {
                dot = q[k].mul_add(r[k], dot);
            }
            let (mut q2, mut r2) = (q_norms[i], r_norms[j]);
            if normalize {
                let iq = 1.0 / q2.sqrt().max(1e-12);
                let ir = 1.0 / r2.sqrt().max(1e-12);
                dot = dot * iq * ir;
                q2 = q2 * iq * iq;
                r2 = r2 * ir * ir;
            }
            out[[i, j]] = match cfg.distance {
                Distance::Euclidean => (q2 + r2 - 2.0 * dot).max(0.0).sqrt(),
                Distance::SquaredEuclidean => (q2 + r2 - 2.0 * dot).max(0.0),
                Distance::Cosine | Distance::DotProduct => dot,
            };
        }
    }
    out
}
