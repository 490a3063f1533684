//! Matryoshka truncations of the InfoNCE losses in one pass: every truncation's cosine
//! similarities, loss and gradient from one full-width pair of matrix products.
//!
//! sentence-transformers' `MatryoshkaLoss` scores the embeddings cut to each width `e_t` (and
//! normalised) with the wrapped loss, and sums the losses with weights `ω_t`. The dot product
//! at width `e_t` is a prefix of the full one, and so is each row's squared norm. So with the
//! distinct widths sorted, `e_0 < … < e_{T−1}`, the products of the column slices
//! `[e_{t−1}, e_t)` add up to every truncation's `P_t = Q_{:e_t} R_{:e_t}ᵀ`, block by block,
//! and `s_t = P_t / (|q|_t |r|_t)` (norms clamped at `1e-12`, as torch's `normalize`).
//!
//! Each truncation's rule gives `W_t = ω_t ∂L_t/∂s_t` (the InfoNCE rule of the losses' `info_nce`,
//! vectorised in f32 with its sums in f64: [`super::matryoshka_row`]). With `V_t = W_t / (|q|_t |r|_t)` and `α_t(i) = Σ_j W_t s_t / |q_i|_t²`, the
//! gradient of the slice `k` of query `i` is `Σ_{t ≥ k} (V_t R_{:,k} − α_t(i) q_{i,k})`: the
//! truncations that reach slice `k`. Summed from the widest down (`C_k = Σ_{t ≥ k} V_t`,
//! written over the row's `P_k` by the rule's second pass), the backward is again one
//! full-width product per side, and the columns past the
//! widest truncation get no gradient. The references' side is the same with `Cᵀ`, and
//! `β_t(j) = Σ_i W_t s_t / |r_j|_t²` summed over every block.
//!
//! Per block row this holds `T` rows of similarities (`T` distinct widths), blocks capped
//! at the driver's `BLOCK_BYTES`; everything else is `O((b + m) (d + T))`.
//!
//! Rounding: the radial terms `α q` and `β r` are subtracted after the products, so the
//! gradient's error is f32 rounding of terms of size `|W| / |q|_t`, as after torch's
//! normalisation backward, whose projection cancels the same terms. One exception is made
//! exact: a one-wide prefix normalises to ±1, so its pairs move nothing (unless clamped), and
//! they are given no weight rather than two cancelling terms. A zero prefix is clamped as
//! torch clamps it (its gradient `g / 1e-12` is then rounding noise times 10¹², in torch too).

use ndarray::{s, Array2, Array3, ArrayView2, ArrayViewMut2, ArrayViewMut3, Axis};

use super::backward::add_ref_side;
use super::driver::{Job, Sizing, BLOCK_BYTES};
use super::matryoshka_row::{anchor_row, find_positives, RowInputs, RowScratch};
use crate::context::plan::Plan;
use crate::context::Context;
use crate::data::inputs::{Embeddings, Rows};
use crate::error::{Error, Result};
use crate::hooks::Reporter;
use crate::metric::Distance;
use crate::runtime::gemm::{gemm, gemm_packed, gemm_slices, gemm_slices_packed, PackedB};
use crate::runtime::memory::HostReservation;

/// torch's `normalize` clamp.
const EPS: f64 = 1e-12;

/// sentence-transformers' `MatryoshkaLoss` around an InfoNCE loss: the loss is also taken on
/// the embeddings cut to each of `dims` (and normalised), and the weighted sum returned, all
/// in one pass over the full-width products (module docs of `matryoshka`).
///
/// Dimensions in any order, repeated or equal to the width; each in `1..=d`. A repeated one
/// counts once per entry, as sentence-transformers counts it.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{Matryoshka, MnrlConfig};
/// let cfg = MnrlConfig { matryoshka: Some(Matryoshka::new([768, 512, 256, 128, 64])), ..Default::default() };
/// assert_eq!(cfg.matryoshka.map(|m| m.weights), Some(vec![1.0; 5]));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Matryoshka {
    /// The widths, each in `1..=d`.
    pub dims: Vec<usize>,
    /// One weight per width (finite); sentence-transformers' default is 1 each.
    pub weights: Vec<f32>,
}

impl Matryoshka {
    /// `dims`, each with weight 1 (sentence-transformers' default).
    pub fn new(dims: impl Into<Vec<usize>>) -> Self {
        let dims = dims.into();
        let weights = vec![1.0; dims.len()];
        Self { dims, weights }
    }
}

/// A call's checked truncations: the distinct widths ascending, their summed weights, and
/// each given entry's place among them.
pub(super) struct Truncations {
    ends: Vec<usize>,
    weights: Vec<f64>,
    entries: Vec<usize>,
}

impl Truncations {
    /// Checks `m` against embeddings of width `d`.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for no widths, a width outside `1..=d`, a weight count that
    /// differs or a weight that is not finite.
    pub(super) fn new(op: &'static str, m: &Matryoshka, d: usize) -> Result<Self> {
        let bad = |what, value: String, rule| Error::InvalidParameter {
            op,
            what,
            value,
            rule,
        };
        if m.dims.is_empty() {
            return Err(bad("matryoshka dims", "[]".into(), "must not be empty"));
        }
        if let Some(&e) = m.dims.iter().find(|&&e| e == 0 || e > d) {
            let rule = "each must be in 1..=the embeddings' width";
            return Err(bad("matryoshka dims", format!("{e} (width {d})"), rule));
        }
        if m.weights.len() != m.dims.len() {
            let value = format!("{} weights for {} dims", m.weights.len(), m.dims.len());
            return Err(bad("matryoshka weights", value, "one weight per dim"));
        }
        if let Some(w) = m.weights.iter().find(|w| !w.is_finite()) {
            return Err(bad("matryoshka weights", w.to_string(), "must be finite"));
        }
        let mut ends = m.dims.clone();
        ends.sort_unstable();
        ends.dedup();
        let mut weights = vec![0.0; ends.len()];
        let mut entries = Vec::with_capacity(m.dims.len());
        for (e, &w) in m.dims.iter().zip(&m.weights) {
            let t = ends.partition_point(|&x| x < *e);
            weights[t] += f64::from(w);
            entries.push(t);
        }
        Ok(Self {
            ends,
            weights,
            entries,
        })
    }

    /// A zero loss per given entry.
    pub(super) fn zeros(&self) -> Vec<f32> {
        vec![0.0; self.entries.len()]
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    /// Columns `[e_{t−1}, e_t)` of truncation `t`'s own slice.
    fn slice(&self, t: usize) -> std::ops::Range<usize> {
        let start = if t == 0 { 0 } else { self.ends[t - 1] };
        start..self.ends[t]
    }
}

/// The losses and gradients of a Matryoshka pass.
pub(super) struct Pass {
    /// `Σ_t ω_t L_t` over the given entries.
    pub(super) loss: f64,
    /// `L_t` per given entry, in the given order.
    pub(super) losses: Vec<f32>,
    pub(super) query_grad: Array2<f32>,
    pub(super) ref_grad: Option<Array2<f32>>,
}

/// The sizes of a pass of `t` distinct widths under the budget, and the bytes of the
/// references packed once for every block and thread ([`Packed`]; `None` where that does not
/// fit, and each block's products pack them again).
///
/// # Errors
/// [`Error::OverBudget`] when one thread with a one-anchor block does not fit.
fn sizing(ctx: &Context, job: &Job<'_>, t: usize) -> Result<(Sizing, Option<u64>)> {
    let (queries, refs) = job.sides()?;
    let ((b, d), m) = (queries.dim(), refs.dim().0);
    let (b64, m64, d64, t64) = (b as u64, m as u64, d as u64, t as u64);
    let resident_q = matches!(queries, Rows::Resident(_));
    let resident_r = !job.refs_are_queries && !matches!(refs, Embeddings::Host(_));
    // Read-back copies, the queries' gradient, inverse norms (the references' in three forms),
    // and where the references' side is wanted their gradient and `β`.
    let read_back = 4 * d64 * (u64::from(resident_q) * b64 + u64::from(resident_r) * m64);
    let ref_side = u64::from(ref_role(job)) * m64 * (4 * d64 + 8 * t64);
    let base = read_back + 4 * d64 * b64 + 8 * t64 * (b64 + 3 * m64) + ref_side;
    // Per thread: the row's exponentials at every width, its positives, their weights and
    // products at every width, its `β`.
    let scratch = m64 * (4 * t64 + 4 + 12 * t64 + 8 * t64) + 64;
    // Per block row: `T` rows of similarities, its `α` and losses.
    let per_row = 4 * t64 * m64 + 16 * t64;
    let packed = packed_bytes(d, m, t);
    match Sizing::within(
        ctx,
        job.op,
        (base + packed, scratch, per_row),
        b,
        BLOCK_BYTES,
    ) {
        Ok(sizing) => Ok((sizing, Some(packed))),
        Err(_) => {
            let sizing = Sizing::within(ctx, job.op, (base, scratch, per_row), b, BLOCK_BYTES)?;
            Ok((sizing, None))
        }
    }
}

/// The bytes of [`Packed`] for `m` references of width `d` in `t` slices (an upper bound).
fn packed_bytes(d: usize, m: usize, t: usize) -> u64 {
    // For the forward products, and for each slice's backward one (each rounded to panels).
    PackedB::bytes(d, m) + PackedB::bytes(m, d + 32 * t)
}

/// The references `r` `(m, d)` packed once per call: `Rᵀ` for the forward products of every
/// slice, and each slice's `R_k` for its backward product.
struct Packed {
    forward: PackedB,
    backward: Vec<PackedB>,
}

impl Packed {
    fn new(r: ArrayView2<'_, f32>, trunc: &Truncations) -> Self {
        let m = r.nrows();
        // The two on two threads: together they are a pass over `r` each.
        std::thread::scope(|scope| {
            let backward = scope.spawn(|| {
                (0..trunc.len())
                    .map(|t| PackedB::new(r.slice(s![.., trunc.slice(t)]), &[m]))
                    .collect()
            });
            let forward = PackedB::new(r.t(), &trunc.ends);
            let backward = match backward.join() {
                Ok(b) => b,
                Err(panic) => std::panic::resume_unwind(panic),
            };
            Self { forward, backward }
        })
    }
}

/// Whether the references' side of the gradient is wanted: for the caller, or for the
/// queries' own when they are the references.
fn ref_role(job: &Job<'_>) -> bool {
    job.refs_are_queries || job.ref_grad
}

/// The plan of [`run`].
///
/// # Errors
/// [`Error::OverBudget`] when one anchor does not fit.
pub(super) fn plan(ctx: &Context, job: &Job<'_>, trunc: &Truncations) -> Result<Plan> {
    let (b, m) = (job.set.labels.len(), job.set.ref_labels.len());
    let (sizing, packed) = sizing(ctx, job, trunc.len())?;
    let mut plan = sizing.plan(b, m);
    // The least budget is the pass's without the packing, which it drops where short.
    plan.min_bytes -= packed.unwrap_or(0);
    Ok(plan)
}

/// Per truncation, the inverse clamped norms of the prefixes of `x`'s rows `(T, n)`, and
/// whether each was clamped (its gradient then has no radial term).
fn inverse_norms(x: ArrayView2<'_, f32>, trunc: &Truncations) -> Array2<f64> {
    let mut out = Array2::zeros((trunc.len(), x.nrows()));
    for (i, row) in x.rows().into_iter().enumerate() {
        let mut sum = 0.0f64;
        for t in 0..trunc.len() {
            sum += row
                .slice(s![trunc.slice(t)])
                .iter()
                .map(|&v| f64::from(v) * f64::from(v))
                .sum::<f64>();
            let norm = sum.sqrt();
            // Negative marks a clamped norm: `1 / EPS`, without the radial term.
            out[[t, i]] = if norm > EPS { 1.0 / norm } else { -1.0 / EPS };
        }
    }
    out
}

/// What every thread of a pass reads.
struct Shared<'a, 's> {
    rows: RowInputs<'a, 's>,
    trunc: &'a Truncations,
    q: ArrayView2<'a, f32>,
    r: ArrayView2<'a, f32>,
    packed: Option<&'a Packed>,
}

/// Runs the InfoNCE rule with logit slope `dz` over every truncation of `job`'s cosine
/// similarities; `count` is the mean's divisor (the positive pairs).
///
/// # Errors
/// [`Error::OverBudget`], a cancellation, or a failed read-back of resident rows.
pub(super) fn run(
    ctx: &Context,
    job: &Job<'_>,
    trunc: &Truncations,
    dz: f64,
    count: u64,
) -> Result<Pass> {
    debug_assert_eq!(job.distance.distance, Distance::Cosine);
    let (queries, refs) = job.sides()?;
    let ((b, d), m) = (queries.dim(), refs.dim().0);
    let report = Reporter::new(job.hooks, job.op, b as u64 * m as u64);
    report.check()?;
    let tn = trunc.len();
    let (sizing, pack_once) = sizing(ctx, job, tn)?;
    let _held = HostReservation::new(job.label, sizing.bytes(), ctx.tracker())?;
    let (q, r_own) = job.host_sides(ctx)?;
    let q = q.view();
    let r = r_own.as_ref().map_or(q, |r| r.view());
    let inv_q = inverse_norms(q, trunc);
    let inv_r = inverse_norms(r, trunc);
    let ir_abs = inv_r.mapv(|v| v.abs() as f32);
    let ir_sq = inv_r.mapv(|v| if v > 0.0 { v * v } else { 0.0 });
    // Each truncation's weight with the mean's division.
    let scale: Vec<f64> = trunc.weights.iter().map(|w| w / count as f64).collect();
    let packed = pack_once.is_some().then(|| Packed::new(r, trunc));
    let shared = Shared {
        rows: RowInputs {
            set: job.set,
            ends: &trunc.ends,
            inv_q: inv_q.view(),
            ir_abs: ir_abs.view(),
            ir_sq: ir_sq.view(),
            dz,
            scale: &scale,
        },
        trunc,
        q,
        r,
        packed: packed.as_ref(),
    };
    let mut g_q = Array2::<f32>::zeros((b, d));
    // The references' side only where a gradient goes to them (a memory bank's rows are
    // detached): its products are a third of the work.
    let ref_side = ref_role(job);
    let mut g_r = Array2::<f32>::zeros((if ref_side { m } else { 0 }, d));
    let mut beta = Array2::<f64>::zeros((tn, if ref_side { m } else { 0 }));
    let mut sums = vec![0.0f64; tn];
    let (threads, rows) = (sizing.threads, sizing.rows);
    let mut block = Array3::<f32>::zeros((tn, rows, m));
    let mut scratches: Vec<RowScratch> = (0..threads).map(|_| RowScratch::new(m, tn)).collect();
    for c0 in (0..b).step_by(rows) {
        report.check()?;
        let c1 = (c0 + rows).min(b);
        let n = c1 - c0;
        let per = n.div_ceil(threads).max(1);
        let mut slab = block.slice_mut(s![.., ..n, ..]);
        let mut g_block = g_q.slice_mut(s![c0..c1, ..]);
        std::thread::scope(|scope| {
            let workers: Vec<_> = slab
                .axis_chunks_iter_mut(Axis(1), per)
                .zip(g_block.axis_chunks_iter_mut(Axis(0), per))
                .zip(scratches.iter_mut())
                .enumerate()
                .map(|(i, ((slab, g), scratch))| {
                    let (shared, report) = (&shared, &report);
                    let a0 = c0 + i * per;
                    scope.spawn(move || rows_pass(shared, a0, slab, g, scratch, report))
                })
                .collect();
            for w in workers {
                if let Err(panic) = w.join() {
                    std::panic::resume_unwind(panic);
                }
            }
        });
        report.check()?;
        // The references' side: `C_kᵀ q_{:,k}` per slice, threads over the references.
        for t in (0..tn).filter(|_| ref_side) {
            let cols = trunc.slice(t);
            add_ref_side(
                Distance::Cosine,
                block.slice(s![t, ..n, ..]),
                q.slice(s![c0..c1, cols.clone()]),
                r.slice(s![.., cols.clone()]),
                g_r.slice_mut(s![.., cols]),
            );
        }
    }
    for s in &scratches {
        if ref_side {
            beta += &s.beta;
        }
        for (sum, x) in sums.iter_mut().zip(&s.losses) {
            *sum += x;
        }
    }
    // The references' radial terms, the truncations reaching each slice summed.
    for (j, mut g) in g_r.rows_mut().into_iter().enumerate() {
        let mut reach = 0.0;
        for t in (0..tn).rev() {
            reach += beta[[t, j]];
            for (g, &x) in g
                .slice_mut(s![trunc.slice(t)])
                .iter_mut()
                .zip(r.row(j).slice(s![trunc.slice(t)]))
            {
                *g -= (reach * f64::from(x)) as f32;
            }
        }
    }
    let ref_grad = if job.refs_are_queries {
        g_q += &g_r;
        None
    } else {
        ref_side.then_some(g_r)
    };
    let per_width: Vec<f64> = sums.iter().map(|s| s / count as f64).collect();
    let loss = trunc
        .weights
        .iter()
        .zip(&per_width)
        .map(|(w, l)| w * l)
        .sum();
    Ok(Pass {
        loss,
        losses: trunc.entries.iter().map(|&t| per_width[t] as f32).collect(),
        query_grad: g_q,
        ref_grad,
    })
}

/// One thread's anchors `a0 ..`: `slab` `(T, n, m)` takes each slice's product, then their
/// suffix sums `C_k` row by row (while the row is in cache); `g` `(n, d)` their gradient.
fn rows_pass(
    sh: &Shared<'_, '_>,
    a0: usize,
    mut slab: ArrayViewMut3<'_, f32>,
    mut g: ArrayViewMut2<'_, f32>,
    scratch: &mut RowScratch,
    report: &Reporter<'_>,
) {
    let (tn, n, m) = slab.dim();
    scratch.alpha.clear();
    scratch.alpha.resize(n * tn, 0.0);
    let q = sh.q.slice(s![a0..a0 + n, ..]);
    // Each slice's own product `Q_k R_kᵀ`; a row's running sum of them is its `P_t`.
    // Each operand packed once for every slice.
    match sh.packed {
        Some(packed) => gemm_slices_packed(q, &packed.forward, slab.view_mut()),
        None => gemm_slices(q, sh.r.t(), &sh.trunc.ends, slab.view_mut()),
    }
    let mut alpha = std::mem::take(&mut scratch.alpha);
    for (i, alpha) in alpha.chunks_exact_mut(tn).enumerate() {
        if report.cancelled() {
            break;
        }
        find_positives(&sh.rows, a0 + i, scratch);
        // Row `t` leaves with `C_t = Σ_{t' ≥ t} V_{t'}`, and `α` is then summed the same way.
        anchor_row(
            &sh.rows,
            a0 + i,
            slab.slice_mut(s![.., i, ..]),
            scratch,
            alpha,
        );
        for t in (0..tn.saturating_sub(1)).rev() {
            alpha[t] += alpha[t + 1];
        }
    }
    scratch.alpha = alpha;
    if report.cancelled() {
        return;
    }
    // Each slice's gradient: `C_k R_k − α q_k`.
    for t in 0..tn {
        let cols = sh.trunc.slice(t);
        let mut g = g.slice_mut(s![.., cols.clone()]);
        let c = slab.slice(s![t, .., ..]);
        match sh.packed {
            Some(packed) => gemm_packed(1.0, c, &packed.backward[t], 0.0, g.view_mut()),
            None => gemm(1.0, c, sh.r.slice(s![.., cols.clone()]), 0.0, g.view_mut()),
        }
        for (i, (mut g, x)) in g
            .rows_mut()
            .into_iter()
            .zip(q.slice(s![.., cols]).rows())
            .enumerate()
        {
            let alpha = scratch.alpha[i * tn + t];
            // Element by element: the caller's rows may have any layout.
            ndarray::Zip::from(&mut g)
                .and(&x)
                .for_each(|g, &x| *g -= (alpha * f64::from(x)) as f32);
        }
    }
    report.add((n * m) as u64);
}
