//! The native distances: ndarray's GEMM, one single-threaded GEMM per thread on its own
//! block, then the metric from the norm expansion, as `shaders/distance_tile.wgsl` computes
//! it; except that normalised rows are divided by their norms first (below), where the WGSL
//! kernel scales each product by reciprocal norms.
//!
//! Normalised distances read rows normalised first, as torch's `F.normalize` makes them
//! (each element divided by `max(‖x‖, 1e-12)`, block by block: [`Norms::dividing`]), then
//! the dot products of those:
//! PML's arithmetic, so that ties by construction (symmetric angles, duplicated rows) stay
//! ties. Scaling the raw dot product by both reciprocal norms instead rounds differently and
//! splits such ties by an ulp. Rows of up to 8 columns have their norm summed as torch's
//! vectorised CPU kernels (AVX2, AVX-512 builds) sum them, one fused multiply-add after
//! another; longer rows in the library's order (torch's depends on its kernel and the CPU),
//! so their normalised rows are torch's only where that sum is exact in any order.
//!
//! Calls whose two sides both have at most [`DIRECT_ROWS`] rows follow `torch.cdist`'s rule:
//! every distance is computed directly ([`direct_into`]: Euclidean as the root of the squared
//! differences summed by fused multiply-adds in order, as `cdist`'s kernel sums short rows,
//! squared Euclidean as that sum; dot products, which PML takes from `torch.matmul` at every
//! size, summed the same way, as its BLAS sums short rows), not from the norm expansion,
//! which cancels. (PML's `LpDistance(power=2)` squares `cdist`'s root instead, which can differ from
//! the sum by an ulp.) Larger calls use the GEMM and the expansion, whose rounding no two
//! libraries share.

use ndarray::{s, Array2, ArrayView2, ArrayViewMut2, Axis};

use crate::error::Result;
use crate::hooks::Reporter;
use crate::metric::{Distance, DistanceConfig};
use crate::runtime::simd::widest;

/// Query rows per GEMM block of [`pairwise_distances`]: between two blocks a thread checks for
/// cancellation and reports its progress.
const BLOCK_ROWS: usize = 256;

/// `x` `(n, d)` normalised as torch's `F.normalize(x, dim=1)`: each element divided by its
/// row's `max(‖x‖, 1e-12)`.
pub(crate) fn normalized(x: ArrayView2<'_, f32>) -> Array2<f32> {
    // Row-major whatever `x`'s layout: its rows' sums then run as every other row's.
    let mut out = x.as_standard_layout().into_owned();
    for mut row in out.rows_mut() {
        let norm = divisor(row.view());
        row.mapv_inplace(|v| v / norm);
    }
    out
}

/// `max(‖x‖, 1e-12)`, the divisor of `F.normalize`, for one row.
fn divisor(row: ndarray::ArrayView1<'_, f32>) -> f32 {
    let sum = match row.len() <= FMA_NORM_DIM {
        true => fma_sum(row.iter().map(|&v| (v, v))),
        // Contiguous, so that the sum's order does not depend on the input's layout.
        false => {
            let row = row.as_standard_layout();
            row.dot(&row)
        }
    };
    sum.sqrt().max(1e-12)
}

/// Up to this many columns, a row's squared norm is summed as torch's CPU kernels sum a short
/// row: one fused multiply-add after another ([`fma_sum`]).
const FMA_NORM_DIM: usize = 8;

/// `Σ a·b` over `pairs` in order, each term fused into the sum (`acc = fma(a, b, acc)`), as
/// torch's CPU kernels (AVX2 and AVX-512 builds) sum short rows, norms and `cdist` alike.
fn fma_sum(pairs: impl Iterator<Item = (f32, f32)>) -> f32 {
    pairs.fold(0.0f32, |acc, (a, b)| a.mul_add(b, acc))
}

/// The configuration that reads normalised rows as `cfg` reads the given ones: the same
/// distance without normalising again (cosine as the dot product it then is).
pub(crate) fn read_config(cfg: &DistanceConfig) -> DistanceConfig {
    if !cfg.normalizes() {
        return *cfg;
    }
    let distance = match cfg.distance {
        Distance::Cosine => Distance::DotProduct,
        other => other,
    };
    DistanceConfig {
        distance,
        normalize: false,
    }
}

/// References per slice that [`distances_into`] normalises at once.
const DIVIDE_CHUNK: usize = 256;

/// Host bytes [`distances_into`] allocates for a block of `rows` queries against `m`
/// references of `d` floats: the block and one slice of references normalised, when `cfg`
/// normalises.
pub(crate) fn scratch_bytes((rows, m, d): (usize, usize, usize), cfg: &DistanceConfig) -> u64 {
    match cfg.normalizes() {
        true => 4 * ((rows + DIVIDE_CHUNK.min(m)) * d) as u64,
        false => 0,
    }
}

/// `rows` divided element by element by their `div` into `out` `(rows, d)`.
fn divide_into(rows: ArrayView2<'_, f32>, div: &[f32], mut out: ArrayViewMut2<'_, f32>) {
    for ((mut o, x), &div) in out.rows_mut().into_iter().zip(rows.rows()).zip(div) {
        o.zip_mut_with(&x, |o, &x| *o = x / div);
    }
}

/// Up to this many rows on both sides, `torch.cdist` computes each Euclidean distance from the
/// differences directly, and so does [`direct_into`].
pub(crate) const DIRECT_ROWS: usize = 25;

/// Whether a call of `q` queries against `n` references computes its distances directly.
pub(crate) fn is_direct(q: usize, n: usize) -> bool {
    q <= DIRECT_ROWS && n <= DIRECT_ROWS
}

/// The distances of `queries` `(q, d)` against `refs` `(n, d)` into `out` `(q, n)`, each from
/// its own two rows ([`fma_sum`]): dot products, Euclidean distances as `sqrt(Σ (x − y)²)`
/// (squared: the sum). For rows read as they are (normalised first where the distance
/// normalises).
pub(crate) fn direct_into(
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
    distance: Distance,
    mut out: ArrayViewMut2<'_, f32>,
) {
    for (x, mut row) in queries.rows().into_iter().zip(out.rows_mut()) {
        for (y, o) in refs.rows().into_iter().zip(row.iter_mut()) {
            *o = match distance {
                Distance::Cosine | Distance::DotProduct => {
                    fma_sum(x.iter().zip(y).map(|(&a, &b)| (a, b)))
                }
                Distance::Euclidean | Distance::SquaredEuclidean => {
                    let sum = fma_sum(x.iter().zip(y).map(|(&a, &b)| (a - b, a - b)));
                    match distance {
                        Distance::Euclidean => sum.sqrt(),
                        _ => sum,
                    }
                }
            };
        }
    }
}

/// Per row of a matrix, the two factors of the metric's epilogue.
pub(crate) struct Norms {
    /// From [`Norms::new`], `1 / max(|x|, 1e-12)` when normalising, else exactly 1; from
    /// [`Norms::dividing`], 1 (the rows are divided instead).
    pub(crate) scale: Vec<f32>,
    /// The squared norm after scaling, `(|x|² · s) · s` in the kernel's order; from
    /// [`Norms::dividing`], the normalised row's.
    pub(crate) sq: Vec<f32>,
    /// Set on the references' norms of a call whose distances are computed directly
    /// ([`is_direct`]): [`distances_into`] then reads the rows, not the GEMM.
    pub(crate) direct: bool,
    /// From [`Norms::dividing`] with a normalising distance: each row's divisor
    /// (`max(‖x‖, 1e-12)`), for a kernel that normalises rows as it reads them; `scale` is
    /// then 1 and `sq` the normalised row's squared norm. Empty otherwise (nothing to divide).
    pub(crate) div: Vec<f32>,
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
        Self {
            scale,
            sq,
            direct: false,
            div: Vec::new(),
        }
    }

    /// The factors of rows that a kernel normalises as it reads them, dividing each element
    /// by its row's `div` (PML's arithmetic, as [`normalized`] without the copy).
    pub(crate) fn dividing(x: ArrayView2<'_, f32>, cfg: &DistanceConfig) -> Self {
        if !cfg.normalizes() {
            return Self::new(x, cfg);
        }
        let (div, sq): (Vec<f32>, Vec<f32>) = x
            .rows()
            .into_iter()
            .map(|row| {
                // The normalised row's squared norm as [`Norms::new`] sums a normalised copy.
                let div = divisor(row);
                let hat = row.mapv(|v| v / div);
                (div, hat.dot(&hat))
            })
            .unzip();
        Self {
            scale: vec![1.0; sq.len()],
            sq,
            direct: false,
            div,
        }
    }

    /// These norms, marked for a direct call when `direct`.
    pub(crate) fn direct(self, direct: bool) -> Self {
        Self { direct, ..self }
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
/// `out` `(q, n)`, on the calling thread: the GEMM (or, for a direct call, [`direct_into`]),
/// then the metric in the kernel's order of operations. For a normalising `cfg` the block is
/// divided by its norms first, and so are slices of [`DIVIDE_CHUNK`] references when
/// `ref_norms` come from [`Norms::dividing`] (otherwise `refs` are [`normalized`] already,
/// with the norms of [`read_config`]): [`scratch_bytes`] of scratch.
pub(crate) fn distances_into(
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
    ref_norms: &Norms,
    cfg: &DistanceConfig,
    mut out: ArrayViewMut2<'_, f32>,
) {
    let direct = ref_norms.direct;
    let r = (&ref_norms.scale[..], &ref_norms.sq[..]);
    if !cfg.normalizes() {
        let q_norms = Norms::new(queries, cfg);
        let q = (&q_norms.scale[..], &q_norms.sq[..]);
        return epilogue((queries, refs), (q, r), (cfg.distance, direct), out);
    }
    let q_norms = Norms::dividing(queries, cfg);
    let q = (&q_norms.scale[..], &q_norms.sq[..]);
    let mut q_hat = Array2::zeros(queries.dim());
    divide_into(queries, &q_norms.div, q_hat.view_mut());
    let distance = read_config(cfg).distance;
    if ref_norms.div.is_empty() {
        // References normalised already ([`normalized`], norms of [`read_config`]).
        return epilogue((q_hat.view(), refs), (q, r), (distance, direct), out);
    }
    let mut r_hat = Array2::zeros((DIVIDE_CHUNK.min(refs.nrows()), refs.ncols()));
    for j0 in (0..refs.nrows()).step_by(DIVIDE_CHUNK) {
        let j1 = (j0 + DIVIDE_CHUNK).min(refs.nrows());
        let mut slice = r_hat.slice_mut(s![..j1 - j0, ..]);
        divide_into(
            refs.slice(s![j0..j1, ..]),
            &ref_norms.div[j0..j1],
            slice.view_mut(),
        );
        let r = (&r.0[j0..j1], &r.1[j0..j1]);
        let rows = (q_hat.view(), slice.view());
        epilogue(
            rows,
            (q, r),
            (distance, direct),
            out.slice_mut(s![.., j0..j1]),
        );
    }
}

/// Per row, its scale and squared norm ([`Norms`]).
type Factors<'a> = (&'a [f32], &'a [f32]);

/// The GEMM (or, `direct`, [`direct_into`]) of rows read as they are, and the metric.
fn epilogue(
    (queries, refs): (ArrayView2<'_, f32>, ArrayView2<'_, f32>),
    (q, r): (Factors<'_>, Factors<'_>),
    (distance, direct): (Distance, bool),
    mut out: ArrayViewMut2<'_, f32>,
) {
    if direct {
        return direct_into(queries, refs, distance, out);
    }
    crate::runtime::gemm::gemm(1.0, queries, refs.t(), 0.0, out.view_mut());
    for ((mut row, &iq), &q2) in out.rows_mut().into_iter().zip(q.0).zip(q.1) {
        match row.as_slice_mut() {
            Some(row) => finish_row(row, (iq, q2), r.0, r.1, distance),
            None => {
                let refs = r.0.iter().zip(r.1);
                for (d, (&ir, &r2)) in row.iter_mut().zip(refs) {
                    *d = finish(distance, q2, r2, *d * iq * ir);
                }
            }
        }
    }
}

widest! {
    /// [`finish`] over one contiguous row of dot products, query factors `(iq, q2)`, the
    /// references' `scale` and `sq`: one loop per distance, so that each vectorises (the
    /// square root above all).
    fn finish_row(row: &mut [f32], q: (f32, f32), scale: &[f32], sq: &[f32], distance: Distance) {
        let (iq, q2) = q;
        let pairs = row.iter_mut().zip(scale.iter().zip(sq));
        match distance {
            Distance::Euclidean => pairs.for_each(|(d, (&ir, &r2))| {
                *d = finish(Distance::Euclidean, q2, r2, *d * iq * ir);
            }),
            Distance::SquaredEuclidean => pairs.for_each(|(d, (&ir, &r2))| {
                *d = finish(Distance::SquaredEuclidean, q2, r2, *d * iq * ir);
            }),
            Distance::Cosine | Distance::DotProduct => {
                pairs.for_each(|(d, (&ir, _))| *d = *d * iq * ir);
            }
        }
    }
}

/// Host bytes one thread of [`pairwise_distances`] allocates for `q` query rows against `n`
/// references of `d` floats (its [`scratch_bytes`], at most): a call holds this per thread.
pub(crate) fn pairwise_scratch((q, n, d): (usize, usize, usize), cfg: &DistanceConfig) -> u64 {
    scratch_bytes((BLOCK_ROWS.min(q), n, d), cfg)
}

/// The distance matrix `(q, n)`: query rows split over `workers` threads (each holding
/// [`pairwise_scratch`]), each thread's rows in blocks of [`BLOCK_ROWS`], between which it
/// reports progress and stops if cancelled.
pub(crate) fn pairwise_distances(
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
    (cfg, direct, workers): (&DistanceConfig, bool, usize),
    report: &Reporter<'_>,
) -> Result<Array2<f32>> {
    let ref_norms = Norms::dividing(refs, cfg).direct(direct);
    let (q, n) = (queries.nrows(), refs.nrows());
    let mut out = Array2::<f32>::zeros((q, n));
    let per = q.div_ceil(workers.max(1)).max(1);
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
