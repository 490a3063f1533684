//! The native CPU path's shared pieces: the distance epilogue of the kernels on top of
//! ndarray's GEMM, one single-threaded GEMM per thread.

use std::sync::atomic::{AtomicUsize, Ordering};

use ndarray::{s, Array2, ArrayView2, ArrayViewMut2, Axis};

use crate::distance::{Distance, DistanceConfig};

/// Worker threads for the native path: one per available core.
pub(crate) fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |t| t.get())
}

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

/// The distance matrix `(q, n)`; same formula and clamping as `shaders/distance_tile.wgsl`,
/// query rows split over the threads.
pub(crate) fn pairwise_distances(
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
    cfg: &DistanceConfig,
) -> Array2<f32> {
    let ref_norms = Norms::new(refs, cfg);
    let mut out = Array2::<f32>::zeros((queries.nrows(), refs.nrows()));
    let per = queries.nrows().div_ceil(threads()).max(1);
    std::thread::scope(|scope| {
        for (t, rows) in out.axis_chunks_iter_mut(Axis(0), per).enumerate() {
            let q = queries.slice(s![t * per..t * per + rows.nrows(), ..]);
            let ref_norms = &ref_norms;
            scope.spawn(move || distances_into(q, refs, ref_norms, cfg, rows));
        }
    });
    out
}

/// Runs `work(item, state)` for every item in `0..items` on up to [`threads`] threads, items
/// dealt out in turn (so uneven items balance), each thread with its own `state` from `init`;
/// returns the results in item order.
pub(crate) fn par_items<S, T: Send>(
    items: usize,
    init: impl Fn() -> S + Sync,
    work: impl Fn(usize, &mut S) -> T + Sync,
) -> Vec<T> {
    let next = AtomicUsize::new(0);
    let worker = || {
        let mut state = init();
        let mut done = Vec::new();
        loop {
            let item = next.fetch_add(1, Ordering::Relaxed);
            if item >= items {
                return done;
            }
            done.push((item, work(item, &mut state)));
        }
    };
    let helpers = threads().min(items).saturating_sub(1);
    let mut done = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..helpers).map(|_| scope.spawn(worker)).collect();
        let mut done = worker();
        for h in handles {
            // A worker only panics on a bug; its items would be missing, so the panic is
            // passed on rather than a partial result returned.
            match h.join() {
                Ok(d) => done.extend(d),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        done
    });
    done.sort_unstable_by_key(|d| d.0);
    done.into_iter().map(|d| d.1).collect()
}
