//! The native CPU path: the same answers as the kernels, computed with multi-threaded GEMM.

use ndarray::{Array1, Array2, ArrayView2, Axis, Zip};

use crate::distance::{Distance, DistanceConfig};

/// Squared norm of every row.
fn sq_norms(x: ArrayView2<'_, f32>) -> Array1<f32> {
    x.map_axis(Axis(1), |row| row.dot(&row))
}

/// The distance matrix `(q, n)`; same formula and clamping as `shaders/distance_tile.wgsl`,
/// with the dot products from ndarray's (matrixmultiply, threaded) GEMM.
pub(crate) fn pairwise_distances(
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
    cfg: &DistanceConfig,
) -> Array2<f32> {
    let normalize = cfg.normalize || cfg.distance == Distance::Cosine;
    let (mut q2, mut r2) = (sq_norms(queries), sq_norms(refs));
    let mut dots = queries.dot(&refs.t());
    if normalize {
        let inv = |n2: &mut Array1<f32>| {
            let inv = n2.mapv(|v| 1.0 / v.sqrt().max(1e-12));
            Zip::from(&mut *n2)
                .and(&inv)
                .for_each(|n, &i| *n = *n * i * i);
            inv
        };
        let (iq, ir) = (inv(&mut q2), inv(&mut r2));
        Zip::from(dots.rows_mut())
            .and(&iq)
            .for_each(|mut row, &iq| {
                Zip::from(&mut row)
                    .and(&ir)
                    .for_each(|d, &ir| *d = *d * iq * ir);
            });
    }
    let finish = |q2: f32, r2: f32, d: f32| match cfg.distance {
        Distance::Euclidean => (q2 + r2 - 2.0 * d).max(0.0).sqrt(),
        Distance::SquaredEuclidean => (q2 + r2 - 2.0 * d).max(0.0),
        Distance::Cosine | Distance::DotProduct => d,
    };
    Zip::from(dots.rows_mut())
        .and(&q2)
        .for_each(|mut row, &q2| {
            Zip::from(&mut row)
                .and(&r2)
                .for_each(|d, &r2| *d = finish(q2, r2, *d));
        });
    dots
}
