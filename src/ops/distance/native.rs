//! The native twin of `shaders/distance_tile.wgsl`: ndarray's GEMM, one single-threaded GEMM
//! per thread on its own block, then the kernel's epilogue in the kernel's order of
//! operations.

use ndarray::{s, Array2, ArrayView2, ArrayViewMut2, Axis};

use crate::error::Result;
use crate::hooks::Reporter;
use crate::metric::{Distance, DistanceConfig};
use crate::runtime::pool::threads;

/// Query rows per GEMM block of [`pairwise_distances`]: between two blocks a thread checks for
/// cancellation and reports its progress.
const BLOCK_ROWS: usize = 256;

/// Per row of a matrix, the two factors of the metric's epilogue.
pub(crate) struct Norms {
    /// `1 / max(|x|, 1e-12)` when normalising, else exactly 1.
    pub(crate) scale: Vec<f32>,
    /// The squared norm after scaling, `(|x|² · s) · s` in the kernel's order.
    pub(crate) sq: Vec<f32>,
}

impl Norms {
    pub(crate) fn new(x: ArrayView2<'_, f32>, cfg: &DistanceConfig) -> Self {
        let n2: Vec<f32> = x.rows().into_iter().map(|r| r.dot(&r)).collect();
        let scale: Vec<f32> = if cfg.normalizes() {
            n2.iter().map(|v| 1.0 / v.sqrt().max(1e-12)).collect()
        } else {
            vec![1.0; n2.len()]
        };
        let sq = n2.iter().zip(&scale).map(|(n, s)| n * s * s).collect();
        Self { scale, sq }
    }
}

/// The metric from a (scaled) dot product and the two (scaled) squared norms: the epilogue of
/// `shaders/distance_tile.wgsl`, clamping included.
#[inline]
pub(crate) fn finish(distance: Distance, q2: f32, r2: f32, dot: f32) -> f32 {
    match distance {
        Distance::Euclidean => (q2 + r2 - 2.0 * dot).max(0.0).sqrt(),
        Distance::SquaredEuclidean => (q2 + r2 - 2.0 * dot).max(0.0),
        Distance::Cosine | Distance::DotProduct => dot,
    }
}

/// Distances of `queries` `(q, d)` against `refs` `(n, d)` (whose norms are `ref_norms`) into
/// `out` `(q, n)`, on the calling thread: the GEMM, then one pass applying the scales and the
/// metric in the kernel's order of operations.
pub(crate) fn distances_into(
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
    ref_norms: &Norms,
    cfg: &DistanceConfig,
    mut out: ArrayViewMut2<'_, f32>,
) {
    ndarray::linalg::general_mat_mul(1.0, &queries, &refs.t(), 0.0, &mut out);
    let q_norms = Norms::new(queries, cfg);
    for ((mut row, &iq), &q2) in out
        .rows_mut()
        .into_iter()
        .zip(&q_norms.scale)
        .zip(&q_norms.sq)
    {
        let refs = ref_norms.scale.iter().zip(&ref_norms.sq);
        for (d, (&ir, &r2)) in row.iter_mut().zip(refs) {
            *d = finish(cfg.distance, q2, r2, *d * iq * ir);
        }
    }
}

/// The distance matrix `(q, n)`: query rows split over the threads, each thread's rows in
/// blocks of [`BLOCK_ROWS`], between which it reports progress and stops if cancelled.
pub(crate) fn pairwise_distances(
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
    cfg: &DistanceConfig,
    report: &Reporter<'_>,
) -> Result<Array2<f32>> {
    let ref_norms = Norms::new(refs, cfg);
    let (q, n) = (queries.nrows(), refs.nrows());
    let mut out = Array2::<f32>::zeros((q, n));
    let per = q.div_ceil(threads()).max(1);
    std::thread::scope(|scope| {
        let mut workers = Vec::new();
        for (t, mut rows) in out.axis_chunks_iter_mut(Axis(0), per).enumerate() {
            let ref_norms = &ref_norms;
            workers.push(scope.spawn(move || {
                let r0 = t * per;
                for b0 in (0..rows.nrows()).step_by(BLOCK_ROWS) {
                    if report.cancelled() {
                        return;
                    }
                    let b1 = (b0 + BLOCK_ROWS).min(rows.nrows());
                    let block = queries.slice(s![r0 + b0..r0 + b1, ..]);
                    distances_into(block, refs, ref_norms, cfg, rows.slice_mut(s![b0..b1, ..]));
                    report.add(((b1 - b0) * n) as u64);
                }
            }));
        }
        // A worker only panics on a bug: its panic is passed on, with its message.
        for w in workers {
            if let Err(panic) = w.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
    report.check()?;
    Ok(out)
}
