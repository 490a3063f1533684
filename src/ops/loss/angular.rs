//! PML's `AngularLoss` with its gradient, in blocks of one class's anchors and positives,
//! without PML's `(positive pairs, m)` matrix.
//!
//! For a positive pair `(a, p)` and a negative `n` of the anchor, PML's exponent is
//! `f = c₁ (x̂_a + x̂_p)·r_n − c₂ x̂_a·x̂_p` with `c₁ = 4 tan²α`, `c₂ = 2 (1 + tan²α)`, `x̂` the
//! normalised rows and `r_n` the raw reference (PML does not normalise the negatives). PML
//! multiplies every pair's sum `x̂_a + x̂_p` by every reference: `(pairs, m, d)` work. Here
//! the product is split: `(x̂_a + x̂_p)·r_n = Q[a, n] + R[p, n]` with `Q = X̂_A rᵀ` the anchors'
//! row and `R = X̂_P rᵀ` the positive's, so a class's anchors `A` and positives `P` (the
//! references of its label) cost `(|A| + |P|, m, d)`: in all `(b + m, m, d)` however many
//! pairs there are, while every class fits a chunk (512 rows, or fewer under a tight
//! budget); a larger class repeats its anchors' products once per chunk of its positives and
//! the other way round. The negatives are the same for every anchor of a class (the references of
//! another label).
//!
//! Each pair's row then gives `loss = log(1 + Σ_n e^{f_n})` (f32 exponentials against the
//! row's largest exponent, sums in f64) and its softmax weights `w_n`, added to the anchor's
//! and the positive's gradient rows `G_Q[a]` and `G_R[p]`; `Σ_n w_n` gives `∂/∂(x̂_a·x̂_p)`.
//! Four products take them back: `∂x̂_A = c₁ G_Q r`, `∂x̂_P = c₁ G_R r`, `∂r = c₁ (G_Qᵀ X̂_A +
//! G_Rᵀ X̂_P)`, and the normalisation's backward for `x̂`. A class's anchors and positives
//! come in chunks of at most the block's rows, under the budget; classes without negatives
//! add their pairs to the mean's count and nothing else (their losses are 0, as PML's masked
//! `logsumexp` gives).

use ndarray::{Array2, ArrayView2, ArrayViewMut2, Axis};

use super::backward::through_normalization;
use super::driver::{Job, Sizing, BLOCK_BYTES};
use super::info_nce::pair_counts;
use super::matryoshka_row::{exp_bounded, lanes};
use super::pair_call::{no_loss, PairLoss};
use super::pair_params::Angular;
use crate::context::plan::Plan;
use crate::context::{ComputePath, Context};
use crate::error::Result;
use crate::hooks::Reporter;
use crate::ops::distance::native::normalized;
use crate::runtime::memory::HostReservation;
use crate::runtime::pool::{par_mul, threads};
use crate::runtime::simd::widest;
use crate::runtime::transfer;

/// The label of a call's working memory.
const SCRATCH: &str = "angular loss working memory";
/// The most anchors (and positives) of a chunk: its `(anchors, positives)` dot products and
/// pair list stay small next to its `(rows, m)` rows.
const ROWS_CAP: usize = 512;
/// Bytes of a chunk's pair products and each pair's `∂/∂(x̂_a·x̂_p)`.
const PAIR_BYTES: u64 = (ROWS_CAP * ROWS_CAP) as u64 * (4 + 4);

/// How the call is sized: threads and chunk rows within the budget.
///
/// # Errors
/// [`crate::Error::OverBudget`] when one thread with a one-row chunk does not fit.
fn sizing(ctx: &Context, job: &Job<'_>) -> Result<Sizing> {
    let (queries, refs) = job.sides()?;
    let ((b, d), m) = (queries.dim(), refs.dim().0);
    let floats = |rows: usize| 4 * (rows * d) as u64;
    let read_back = job.read_back_bytes()?;
    // The normalised queries and their gradient; the references' raw gradient and their
    // normalised rows' (the normalised rows themselves when given); a class per label id
    // with its rows; the negatives' mask; a chunk's pair products.
    let refs_hat = if job.refs_are_queries { 0 } else { floats(m) };
    let base = read_back
        + 2 * floats(b)
        + 2 * floats(m)
        + refs_hat
        + 56 * (b + m) as u64
        + 4 * m as u64
        + PAIR_BYTES;
    // Per thread its exponentials' row; per chunk row the anchors' and positives' products and
    // gradients, one partial gradient row per thread, the gathered rows and their gradients.
    let scratch = 4 * m as u64;
    let per_row = 4 * m as u64 * (4 + threads() as u64) + 4 * floats(1);
    let mut sizing = Sizing::within(ctx, job.op, (base, scratch, per_row), b.max(m), BLOCK_BYTES)?;
    sizing.rows = sizing.rows.min(ROWS_CAP);
    Ok(sizing)
}

/// The plan of the angular loss of `job`, allocating nothing.
///
/// # Errors
/// As [`run`]'s sizing.
pub(super) fn plan(ctx: &Context, job: &Job<'_>) -> Result<Plan> {
    let (b, m) = (job.set.labels.len(), job.set.ref_labels.len());
    Ok(sizing(ctx, job)?.plan(b, m))
}

/// One class: its anchors and its references (the anchors' positives, but for each anchor's
/// own slot).
struct Class {
    anchors: Vec<usize>,
    positives: Vec<usize>,
}

/// PML's AngularLoss over `job` (module docs).
///
/// # Errors
/// As the driver's: the budget, cancellation, a failed read-back.
pub(super) fn run(ctx: &Context, job: &Job<'_>, rule: Angular) -> Result<PairLoss> {
    let (positive_pairs, negative_pairs) = pair_counts(job.set);
    let (queries, refs) = job.sides()?;
    let ((b, d), m) = (queries.dim(), refs.dim().0);
    let ref_role = job.refs_are_queries || job.ref_grad;
    if positive_pairs == 0 || negative_pairs == 0 {
        // PML: no loss without a positive or a negative pair.
        return no_loss(ctx, job, (positive_pairs, negative_pairs), None);
    }
    let (out, mut transfers) = transfer::measure(|| -> Result<_> {
        let sizing = sizing(ctx, job)?;
        let _held = HostReservation::new(SCRATCH, sizing.bytes(), ctx.tracker())?;
        let (q, r_own) = job.host_sides(ctx)?;
        let q = q.view();
        let r = r_own.as_ref().map_or(q, |r| r.view());
        let q_hat = normalized(q);
        let r_hat_own = (!job.refs_are_queries).then(|| normalized(r));
        let r_hat = r_hat_own.as_ref().map_or(q_hat.view(), |x| x.view());
        let report = Reporter::new(job.hooks, job.op, positive_pairs * m as u64);
        let mut grads = Grads {
            q_hat: Array2::zeros((b, d)),
            r_hat: Array2::zeros((if ref_role { m } else { 0 }, d)),
            raw: Array2::zeros((if ref_role { m } else { 0 }, d)),
        };
        let inputs = Inputs {
            q_hat: q_hat.view(),
            r_hat,
            r,
            coefficients: rule.coefficients(),
            scale: 1.0 / positive_pairs as f64,
            ref_role,
            threads: sizing.threads,
        };
        let mut loss = 0.0;
        let mut mask = vec![0.0f32; m];
        for class in classes(job) {
            let label = job.set.labels[class.anchors[0]];
            for (k, &l) in mask.iter_mut().zip(&job.set.ref_labels) {
                *k = if l != label { 1.0 } else { 0.0 };
            }
            if !mask.iter().any(|&k| k > 0.0) {
                continue;
            }
            for anchors in class.anchors.chunks(sizing.rows) {
                for positives in class.positives.chunks(sizing.rows) {
                    report.check()?;
                    let chunk = Chunk {
                        anchors,
                        positives,
                        slots: &job.set.self_slots,
                        mask: &mask,
                    };
                    let (l, pairs) = chunk_pass(&inputs, &chunk, &mut grads);
                    loss += l;
                    report.add(pairs * m as u64);
                }
            }
        }
        report.check()?;
        let scale = inputs.scale;
        let mut query_grad = grads.q_hat;
        let ref_grad = if job.refs_are_queries {
            query_grad += &grads.r_hat;
            through_normalization(&mut query_grad, q, true, 1.0);
            query_grad += &grads.raw;
            None
        } else {
            through_normalization(&mut query_grad, q, true, 1.0);
            job.ref_grad.then(|| {
                let mut g = grads.r_hat;
                through_normalization(&mut g, r, true, 1.0);
                g + &grads.raw
            })
        };
        Ok(((loss * scale) as f32, query_grad, ref_grad))
    });
    transfers.add(job.set.imported);
    let (loss, query_grad, ref_grad) = out?;
    Ok(PairLoss {
        loss,
        nonzero: positive_pairs,
        positive_pairs,
        negative_pairs,
        query_grad,
        ref_grad,
        beta_grad: None,
        path: ComputePath::NativeCpu,
        transfers,
    })
}

/// The classes with an anchor and a reference, in order of their labels' ids.
fn classes(job: &Job<'_>) -> Vec<Class> {
    let set = job.set;
    let ids = 1
        + (set.labels.iter().chain(&set.ref_labels))
            .copied()
            .max()
            .unwrap_or(0) as usize;
    let mut classes: Vec<Class> = (0..ids)
        .map(|_| Class {
            anchors: Vec::new(),
            positives: Vec::new(),
        })
        .collect();
    for (a, &l) in set.labels.iter().enumerate() {
        classes[l as usize].anchors.push(a);
    }
    for (j, &l) in set.ref_labels.iter().enumerate() {
        classes[l as usize].positives.push(j);
    }
    classes.retain(|c| !c.anchors.is_empty() && !c.positives.is_empty());
    classes
}

/// What every chunk reads.
struct Inputs<'a> {
    q_hat: ArrayView2<'a, f32>,
    r_hat: ArrayView2<'a, f32>,
    /// The raw references: PML's negatives.
    r: ArrayView2<'a, f32>,
    coefficients: (f32, f32),
    /// `1 / positive pairs`: the mean.
    scale: f64,
    ref_role: bool,
    threads: usize,
}

/// The gradients with respect to the normalised queries and references and the raw
/// references (the last two empty without a reference role).
struct Grads {
    q_hat: Array2<f32>,
    r_hat: Array2<f32>,
    raw: Array2<f32>,
}

/// One chunk of a class: some of its anchors, some of its positives, every anchor's own slot
/// (never its positive), and the class's negatives' mask.
struct Chunk<'a> {
    anchors: &'a [usize],
    positives: &'a [usize],
    slots: &'a [u32],
    mask: &'a [f32],
}

/// One chunk's pairs: their losses' sum (before the mean) and count; their gradient added to
/// `grads`.
fn chunk_pass(inp: &Inputs<'_>, chunk: &Chunk<'_>, grads: &mut Grads) -> (f64, u64) {
    let (ca, cp, m) = (chunk.anchors.len(), chunk.positives.len(), inp.r.nrows());
    let xa = inp.q_hat.select(Axis(0), chunk.anchors);
    let xp = inp.r_hat.select(Axis(0), chunk.positives);
    let mut q_rows = Array2::<f32>::zeros((ca, m));
    let mut p_rows = Array2::<f32>::zeros((cp, m));
    par_mul(1.0, xa.view(), inp.r.t(), 0.0, q_rows.view_mut());
    par_mul(1.0, xp.view(), inp.r.t(), 0.0, p_rows.view_mut());
    let dots = xa.dot(&xp.t());
    let mut g_q = Array2::<f32>::zeros((ca, m));
    let mut g_p = Array2::<f32>::zeros((if inp.ref_role { cp } else { 0 }, m));
    let valid = |i: usize, j: usize| chunk.slots[chunk.anchors[i]] as usize != chunk.positives[j];
    let sides = Sides {
        q_rows: q_rows.view(),
        p_rows: p_rows.view(),
        dots: dots.view(),
        mask: chunk.mask,
        valid: &valid,
    };
    let (loss, pairs, g_dot, transposed) = sweep(inp, &sides, g_q.view_mut(), g_p.view_mut());
    let g_dot = if transposed { g_dot.t() } else { g_dot.view() };
    // The anchors' rows: c₁ G_Q r + ∂dot · x̂_P.
    let (c1, _) = inp.coefficients;
    let mut g_xa = g_dot.dot(&xp);
    par_mul(c1, g_q.view(), inp.r, 1.0, g_xa.view_mut());
    for (g, &a) in g_xa.rows().into_iter().zip(chunk.anchors) {
        let mut row = grads.q_hat.row_mut(a);
        row += &g;
    }
    if inp.ref_role {
        let mut g_xp = g_dot.t().dot(&xa);
        par_mul(c1, g_p.view(), inp.r, 1.0, g_xp.view_mut());
        for (g, &p) in g_xp.rows().into_iter().zip(chunk.positives) {
            let mut row = grads.r_hat.row_mut(p);
            row += &g;
        }
        par_mul(c1, g_q.t(), xa.view(), 1.0, grads.raw.view_mut());
        par_mul(c1, g_p.t(), xp.view(), 1.0, grads.raw.view_mut());
    }
    (loss, pairs)
}

/// A chunk's products: the anchors' `(ca, m)` and positives' `(cp, m)` rows, their `(ca, cp)`
/// dot products, the negatives' mask and which pairs count.
struct Sides<'a> {
    q_rows: ArrayView2<'a, f32>,
    p_rows: ArrayView2<'a, f32>,
    dots: ArrayView2<'a, f32>,
    mask: &'a [f32],
    valid: &'a (dyn Fn(usize, usize) -> bool + Sync),
}

/// Every pair of the chunk: the losses' sum, the pairs, and `∂/∂(x̂_a·x̂_p)` `(ca, cp)`
/// (transposed, `(cp, ca)`, when the last value is true); the weights added to `g_q` `(ca, m)`
/// and, with a reference role, `g_p` `(cp, m)`. The threads split the anchors (each its rows
/// of `g_q` and of `∂/∂dot`, and a partial `g_p` of its own) or, where there are more
/// positives, the positives (the other way round).
fn sweep(
    inp: &Inputs<'_>,
    sides: &Sides<'_>,
    mut g_q: ArrayViewMut2<'_, f32>,
    mut g_p: ArrayViewMut2<'_, f32>,
) -> (f64, u64, Array2<f32>, bool) {
    let (ca, cp) = sides.dots.dim();
    let m = sides.mask.len();
    let by_positive = inp.ref_role && cp > ca;
    let (own_rows, others) = if by_positive { (cp, ca) } else { (ca, cp) };
    let workers = inp.threads.min(own_rows).max(1);
    let per = own_rows.div_ceil(workers);
    let mut g_dot = Array2::<f32>::zeros((own_rows, others));
    let (mut own, other) = if by_positive {
        (g_p.view_mut(), g_q.view_mut())
    } else {
        (g_q.view_mut(), g_p.view_mut())
    };
    let other_rows = other.nrows();
    let results: Vec<(f64, u64, Array2<f32>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = own
            .axis_chunks_iter_mut(Axis(0), per)
            .zip(g_dot.axis_chunks_iter_mut(Axis(0), per))
            .enumerate()
            .map(|(t, (mut own, mut g_dot))| {
                scope.spawn(move || {
                    let mut partial = Array2::<f32>::zeros((other_rows, m));
                    let mut e = vec![0.0f32; m];
                    let (mut loss, mut pairs) = (0.0, 0u64);
                    let rows = own.rows_mut().into_iter().zip(g_dot.rows_mut());
                    for (k, (mut own_row, mut dot_row)) in rows.enumerate() {
                        let i = t * per + k;
                        for j in 0..others {
                            let (a, p) = if by_positive { (j, i) } else { (i, j) };
                            if !(sides.valid)(a, p) {
                                continue;
                            }
                            let row = PairRow {
                                q: sides.q_rows.row(a).to_slice().unwrap_or(&[]),
                                p: sides.p_rows.row(p).to_slice().unwrap_or(&[]),
                                mask: sides.mask,
                                coefficients: inp.coefficients,
                                dot: sides.dots[[a, p]],
                            };
                            let (l, w) = dispatch(&row, &mut e);
                            loss += l;
                            pairs += 1;
                            let c2 = f64::from(inp.coefficients.1);
                            dot_row[j] = (-c2 * w.1 * inp.scale) as f32;
                            let k = (inp.scale / w.0) as f32;
                            if let Some(own) = own_row.as_slice_mut() {
                                add_scaled(own, k, &e);
                            }
                            if other_rows > 0 {
                                if let Some(other) = partial.row_mut(j).as_slice_mut() {
                                    add_scaled(other, k, &e);
                                }
                            }
                        }
                    }
                    (loss, pairs, partial)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let (mut loss, mut pairs) = (0.0, 0);
    let mut other = other;
    for (l, n, partial) in results {
        loss += l;
        pairs += n;
        if other_rows > 0 {
            other += &partial;
        }
    }
    (loss, pairs, g_dot, by_positive)
}

/// `out += k · e`.
fn add_scaled(out: &mut [f32], k: f32, e: &[f32]) {
    for (o, &e) in out.iter_mut().zip(e) {
        *o += k * e;
    }
}

/// One pair's row: the anchor's and the positive's products with every reference, the
/// negatives' mask, `(c₁, c₂)` and `x̂_a·x̂_p`.
struct PairRow<'a> {
    q: &'a [f32],
    p: &'a [f32],
    mask: &'a [f32],
    coefficients: (f32, f32),
    dot: f32,
}

widest! {
    /// [`pair_kernel`] compiled for the widest vectors this CPU has (the same arithmetic on each).
    fn dispatch(row: &PairRow<'_>, e: &mut [f32]) -> (f64, (f64, f64)) {
        pair_kernel(row, e)
    }
}

/// One pair: its loss `log(1 + Σ_N e^{f})`, and `(sum, Σ_N e^{f − top} / sum)` with `e`
/// holding each negative's `e^{f − top}` (0 elsewhere), so that its softmax weight is
/// `e / sum`. Loops without branches that the compiler vectorises; sums in f64.
#[inline(always)]
fn pair_kernel(row: &PairRow<'_>, e: &mut [f32]) -> (f64, (f64, f64)) {
    let (c1, c2) = row.coefficients;
    let bias = c2 * row.dot;
    let f = |q: f32, p: f32| c1 * (q + p) - bias;
    // The largest exponent among the negatives, and 0 (PML's added one), over 16 lanes.
    let mut top = [0.0f32; 16];
    let ins = || row.q.iter().zip(row.p).zip(row.mask);
    let mut chunks = row
        .q
        .chunks_exact(16)
        .zip(row.p.chunks_exact(16))
        .zip(row.mask.chunks_exact(16));
    for ((q, p), k) in &mut chunks {
        for l in 0..16 {
            let v = if k[l] > 0.0 { f(q[l], p[l]) } else { 0.0 };
            top[l] = if v > top[l] { v } else { top[l] };
        }
    }
    let tail = row.q.len() - row.q.len() % 16;
    for ((&q, &p), &k) in ins().skip(tail) {
        let v = if k > 0.0 { f(q, p) } else { 0.0 };
        top[0] = if v > top[0] { v } else { top[0] };
    }
    let top = top.iter().fold(0.0f32, |t, &v| if v > t { v } else { t });
    for (e, ((&q, &p), &k)) in e.iter_mut().zip(ins()) {
        *e = k * exp_bounded(f(q, p) - top);
    }
    let negatives = lanes(e);
    let sum = negatives + (-f64::from(top)).exp();
    (f64::from(top) + sum.ln(), (sum, negatives / sum))
}
