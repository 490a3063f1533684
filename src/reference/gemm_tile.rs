//! Reference of the generated GEMM family (`shaders/gemm_tile.wgsl` and its variants).

use ndarray::{Array2, ArrayView2};

use crate::metric::DistanceConfig;

/// The distance matrix `(q, n)` between `queries` `(q, d)` and `refs` `(n, d)`, as every
/// variant of the GEMM family computes it: each dot product one fused multiply-add chain over
/// the dimension, ascending from +0, then the metric from the squared norms. That is exactly
/// [`super::distance_tile::distance_tile`]'s arithmetic (the hand-written kernel's), so the
/// two references are one function. On one device every GEMM variant gives the hand-written
/// kernel's bits; against this reference they agree within round-off, because Vulkan lets a
/// device round `fma` twice (lavapipe does).
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{reference::gemm_tile::gemm_tile, Distance, DistanceConfig};
/// let cfg = DistanceConfig { distance: Distance::DotProduct, normalize: false };
/// let d = gemm_tile(array![[1.0f32, 2.0]].view(), array![[3.0f32, 4.0]].view(), &cfg);
/// assert_eq!(d[[0, 0]], 11.0);
/// ```
pub fn gemm_tile(
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
    cfg: &DistanceConfig,
) -> Array2<f32> {
    super::distance_tile::distance_tile(queries, refs, cfg)
}
