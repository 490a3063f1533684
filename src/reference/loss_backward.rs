//! Reference of `shaders/loss_backward.wgsl`: a loss's gradient with respect to the
//! embeddings from its weights `W = ∂L/∂D`, pair by pair in f64 through the distance and the
//! normalisation (the kernel computes the products with the normalised rows; the
//! normalisation's backward then runs on the host).

use ndarray::{Array2, ArrayView2};

use super::pair_gradient::pair_gradient;
use crate::DistanceConfig;

/// `∂L/∂queries` `(b, d)` and `∂L/∂refs` `(m, d)` for weights `(b, m)` on the pairs of
/// `queries` `(b, d)` and `refs` `(m, d)` under `distance`: `Σ_j W[a, j] ∂D(q_a, r_j)/∂q_a`
/// and `Σ_a W[a, j] ∂D(q_a, r_j)/∂r_j`.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::reference::loss_backward::loss_backward;
/// use wgpu_metric_learning::{Distance, DistanceConfig};
/// let (q, r) = (array![[3.0f32, 0.0]], array![[0.0f32, 0.0]]);
/// let raw = DistanceConfig { distance: Distance::Euclidean, normalize: false };
/// let (g_q, g_r) = loss_backward(q.view(), r.view(), array![[2.0]].view(), raw);
/// assert_eq!((g_q, g_r), (array![[2.0, 0.0]], array![[-2.0, 0.0]]));
/// ```
pub fn loss_backward(
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
    weights: ArrayView2<'_, f64>,
    distance: DistanceConfig,
) -> (Array2<f64>, Array2<f64>) {
    let mut g_q = Array2::zeros(queries.dim());
    let mut g_r = Array2::zeros(refs.dim());
    for ((a, j), &w) in weights.indexed_iter() {
        if w == 0.0 {
            continue;
        }
        let (dq, dr) = pair_gradient(distance, queries.row(a), refs.row(j), w);
        let mut qa = g_q.row_mut(a);
        qa += &dq;
        let mut rj = g_r.row_mut(j);
        rj += &dr;
    }
    (g_q, g_r)
}
