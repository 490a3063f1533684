//! PML's `DynamicSoftMarginLoss` with its gradient, over every triplet without listing one.
//!
//! PML lists every triplet `(a, p, n)` (`B·P·N` of them), takes `x = D_ap − D_an`, soft-bins
//! the `x` into its histogram of `num_bins` bins of width `δ = 2 |min_val| / num_bins` from
//! `min_val` (each `x` split between its bin `k = ⌊(x − min) / δ⌋` and the next by
//! `α = frac((x − min) / δ)`), mixes it with the previous histogram by `momentum` (1 when
//! that is all zeros), normalises, and returns `mean(CDF[k] · x)`. Its gradient also flows
//! through the current batch's part of the histogram (through `α`): with `T` triplets, `H`
//! the mixed histogram's sum and `X_k` the sum of the `x` in bin `k`, every triplet of bin `k`
//! gets `∂L/∂x = (CDF[k] − momentum · X_k / (H δ)) / T`, one value per bin.
//!
//! So the loss needs, per bin, only counts and sums. Per anchor the negatives' distances are
//! sorted once; a positive's triplets in bin `k` are the negatives with
//! `D_an ∈ (D_ap − min − (k + 1) δ, D_ap − min − k δ]`, a run of the sorted row found by
//! binary search, whose count and prefix sums give the bin's count, `Σ x` and `Σ α`. A first
//! pass gathers the bins over every anchor; the second gives each positive `Σ_k count_k ∂L/∂x_k`
//! and each negative `−Σ` over the runs that hold it (a difference array over the sorted
//! row). Cost `O(N log N + P · num_bins · log N)` per anchor, memory the driver's blocks.
//!
//! As in PML, a triplet outside `[min, min + (num_bins − 1) δ)` is an error (PML's histogram
//! indexes past its end there), and no triplet means no loss and no histogram update. A
//! triplet within an ulp of a bin edge may be binned on the other side than PML's f32
//! arithmetic puts it.

use std::hash::Hash;
use std::sync::Mutex;

use ndarray::ArrayView1;

use super::driver::{self, Job, Mode};
use super::pair_call::{self, has_triplet, no_loss, PairLoss, PairLossConfig};
use super::pair_params::DynamicSoftMargin;
use super::scratch::{Scratch, Shared, Totals};
use crate::context::plan::Plan;
use crate::context::{ComputePath, Context};
use crate::data::inputs::{Imports, MiningSet};
use crate::error::{Error, Result};
use crate::runtime::memory::HostReservation;
use crate::runtime::pool::threads;
use crate::runtime::transfer;

/// The bins' sums over the triplets seen so far.
#[derive(Debug, Clone)]
struct Bins {
    /// Triplets per bin.
    count: Vec<f64>,
    /// `Σ x` per bin.
    x: Vec<f64>,
    /// The soft histogram: `1 − α` into the bin, `α` into the next.
    soft: Vec<f64>,
    /// A triplet fell outside the histogram.
    outside: bool,
}

impl Bins {
    fn new(n: usize) -> Self {
        Self {
            count: vec![0.0; n],
            x: vec![0.0; n],
            soft: vec![0.0; n],
            outside: false,
        }
    }

    fn add(&mut self, other: &Bins) {
        let pairs = [
            (&mut self.count, &other.count),
            (&mut self.x, &other.x),
            (&mut self.soft, &other.soft),
        ];
        for (a, b) in pairs {
            a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
        }
        self.outside |= other.outside;
    }
}

/// The rule's geometry: `min`, `δ` and the bins.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    min: f64,
    delta: f64,
    bins: usize,
}

impl Geometry {
    fn of(c: DynamicSoftMargin) -> Self {
        let min = f64::from(c.min_val);
        Self {
            min,
            delta: 2.0 * min.abs() / f64::from(c.num_bins),
            bins: c.num_bins as usize,
        }
    }

    /// The sorted row's positions of the negatives in bin `k` of a positive at `dp`: the run
    /// `(lo, hi]` of distances, as indices `[i0, i1)`.
    fn run(&self, sorted: &[f32], dp: f64, k: usize) -> (usize, usize) {
        // Both ends by the same formula, so that neighbouring runs share their edge exactly.
        let edge = |k: usize| dp - self.min - k as f64 * self.delta;
        let (lo, hi) = (edge(k + 1), edge(k));
        let i0 = sorted.partition_point(|&v| f64::from(v) <= lo);
        let i1 = sorted.partition_point(|&v| f64::from(v) <= hi);
        (i0, i1)
    }
}

/// The anchor's negatives sorted by distance into `s.order` and `s.sorted`, their prefix sums
/// into `s.prefix`.
fn sort_negatives(d: ArrayView1<'_, f32>, s: &mut Scratch) {
    s.order.clear();
    s.order
        .extend(s.negatives.iter().map(|&j| (d[j as usize], j)));
    s.order.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    s.sorted.clear();
    s.sorted.extend(s.order.iter().map(|o| o.0));
    s.prefix.clear();
    s.prefix.push(0.0);
    let mut acc = 0.0;
    for &v in &s.sorted {
        acc += f64::from(v);
        s.prefix.push(acc);
    }
}

/// Bytes the loss keeps beside the driver's blocks against `m` references: the call's bins
/// and each thread's, with its difference array over the negatives.
pub(super) fn state_bytes(c: DynamicSoftMargin, m: usize) -> u64 {
    // The call's bins, then the mixed histogram, its CDF and the slopes.
    let bins = 3 * (u64::from(c.num_bins) + 1);
    8 * 2 * bins + threads() as u64 * 8 * (bins + m as u64 + 1)
}

/// The loss, its triplets, the updated histogram and the gradients of `job` with the
/// previous histogram `previous` (empty or all zeros: PML's first call).
///
/// # Errors
/// [`Error::InvalidParameter`] when a triplet falls outside the histogram, or `previous`
/// has another length than `num_bins`; as the driver's otherwise.
pub(super) fn run(
    ctx: &Context,
    job: &Job<'_>,
    c: DynamicSoftMargin,
    previous: &[f32],
) -> Result<(PairLoss, Vec<f32>)> {
    let geo = Geometry::of(c);
    if !previous.is_empty() && previous.len() != geo.bins {
        return Err(Error::InvalidParameter {
            op: job.op,
            what: "histogram",
            value: format!("{} bins", previous.len()),
            rule: "must be empty or hold num_bins values (PML's hist_)",
        });
    }
    if !has_triplet(job) {
        // PML: no loss, and the histogram is left as it was.
        let counts = super::info_nce::pair_counts(job.set);
        return Ok((no_loss(ctx, job, counts, None)?, previous.to_vec()));
    }
    let state = state_bytes(c, job.set.ref_labels.len());
    let _state = HostReservation::new(super::pair_global::STATE, state, ctx.tracker())?;
    let (out, mut transfers) = transfer::measure(|| passes(ctx, job, c, geo, previous));
    transfers.add(job.set.imported);
    let (loss, triplets, histogram, out) = out?;
    let (positive_pairs, negative_pairs) = super::info_nce::pair_counts(job.set);
    let loss = PairLoss {
        loss: loss as f32,
        nonzero: triplets,
        positive_pairs,
        negative_pairs,
        query_grad: out.query_grad,
        ref_grad: out.ref_grad,
        beta_grad: None,
        path: ComputePath::NativeCpu,
        transfers,
    };
    Ok((loss, histogram))
}

/// The two passes: the bins, then the weights.
fn passes(
    ctx: &Context,
    job: &Job<'_>,
    c: DynamicSoftMargin,
    geo: Geometry,
    previous: &[f32],
) -> Result<(f64, u64, Vec<f32>, driver::Output)> {
    let total = Mutex::new(Bins::new(geo.bins + 1));
    let pass1 = |a: usize, d: ArrayView1<'_, f32>, s: &mut Scratch, _: &Shared<'_>| {
        s.lists(job.set, a);
        if s.positives.is_empty() || s.negatives.is_empty() {
            return Totals::default();
        }
        sort_negatives(d, s);
        let mut bins = Bins::new(geo.bins + 1);
        let n = s.sorted.len();
        for &p in &s.positives {
            let dp = f64::from(d[p as usize]);
            // Outside: x ≥ min + (bins − 1) δ (the nearest negatives) or x < min (the farthest).
            let (near, far) = (f64::from(s.sorted[0]), f64::from(s.sorted[n - 1]));
            let top = dp - geo.min - (geo.bins - 1) as f64 * geo.delta;
            if near <= top || far > dp - geo.min {
                bins.outside = true;
            }
            for k in 0..geo.bins - 1 {
                let (i0, i1) = geo.run(&s.sorted, dp, k);
                if i1 <= i0 {
                    continue;
                }
                let count = (i1 - i0) as f64;
                let sum_dn = s.prefix[i1] - s.prefix[i0];
                let sum_x = count * dp - sum_dn;
                let sum_alpha = (sum_x - count * geo.min) / geo.delta - count * k as f64;
                bins.count[k] += count;
                bins.x[k] += sum_x;
                bins.soft[k] += count - sum_alpha;
                bins.soft[k + 1] += sum_alpha;
            }
        }
        if let Ok(mut t) = total.lock() {
            t.add(&bins);
        }
        Totals::default()
    };
    driver::run_as(ctx, job, &pass1, Mode::Forward)?;
    let bins = total.into_inner().map_err(|_| Error::Internal {
        op: job.op,
        message: "a dynamic soft margin pass panicked".into(),
    })?;
    if bins.outside {
        return Err(Error::InvalidParameter {
            op: job.op,
            what: "min_val",
            value: c.min_val.to_string(),
            rule: "must put every triplet's D_ap − D_an in [min_val, min_val + (num_bins − 1) δ) (PML's histogram indexes past its end otherwise)",
        });
    }
    let triplets: f64 = bins.count.iter().sum();
    if triplets == 0.0 {
        // `run` returned before the passes without a triplet.
        return Err(Error::Internal {
            op: job.op,
            message: "a call with triplets binned none".into(),
        });
    }
    // The mixed histogram, its CDF and each bin's ∂L/∂x.
    let old: f64 = previous.iter().map(|&v| f64::from(v)).sum();
    let m = if old != 0.0 {
        f64::from(c.momentum)
    } else {
        1.0
    };
    let mixed: Vec<f64> = (0..geo.bins)
        .map(|k| (1.0 - m) * previous.get(k).map_or(0.0, |&v| f64::from(v)) + m * bins.soft[k])
        .collect();
    let h: f64 = mixed.iter().sum();
    let mut cdf = vec![0.0; geo.bins];
    let mut acc = 0.0;
    for (c, u) in cdf.iter_mut().zip(&mixed) {
        acc += u / h;
        *c = acc;
    }
    let loss: f64 = (0..geo.bins).map(|k| cdf[k] * bins.x[k]).sum::<f64>() / triplets;
    let slope: Vec<f64> = (0..geo.bins)
        .map(|k| (cdf[k] - m * bins.x[k] / (h * geo.delta)) / triplets)
        .collect();
    let pass2 = |a: usize, d: ArrayView1<'_, f32>, s: &mut Scratch, _: &Shared<'_>| {
        s.lists(job.set, a);
        if s.positives.is_empty() || s.negatives.is_empty() {
            return Totals::default();
        }
        sort_negatives(d, s);
        // A difference array over the sorted negatives: each run's −slope.
        let n = s.sorted.len();
        let mut diff = vec![0.0f64; n + 1];
        for &p in &s.positives {
            let dp = f64::from(d[p as usize]);
            let mut own = 0.0;
            for (k, &g) in slope.iter().enumerate().take(geo.bins - 1) {
                let (i0, i1) = geo.run(&s.sorted, dp, k);
                if i1 <= i0 {
                    continue;
                }
                own += (i1 - i0) as f64 * g;
                diff[i0] -= g;
                diff[i1] += g;
            }
            s.weights[p as usize] = own;
        }
        let mut acc = 0.0;
        for (i, &(_, j)) in s.order.iter().enumerate() {
            acc += diff[i];
            s.weights[j as usize] = acc;
        }
        Totals::default()
    };
    let out = driver::run_as(ctx, job, &pass2, Mode::Sum)?;
    let histogram = mixed.iter().map(|u| (u / h) as f32).collect();
    Ok((loss, triplets as u64, histogram, out))
}

/// How [`dynamic_soft_margin_loss`] computes: the rule and the sides' settings, and PML's
/// histogram from the call before.
///
/// # Example
/// ```
/// let cfg = wgpu_metric_learning::DynamicSoftMarginConfig::default();
/// assert!(cfg.histogram.is_empty() && cfg.loss.rule.num_bins == 10);
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DynamicSoftMarginConfig {
    /// The rule, the distance (PML's `LpDistance()` by default), self-exclusion, the
    /// references' gradient and the hooks.
    pub loss: PairLossConfig<DynamicSoftMargin>,
    /// PML's `hist_` after the previous call (`num_bins` values): empty, or all zeros, on the
    /// first call.
    pub histogram: Vec<f32>,
}

/// The result of [`dynamic_soft_margin_loss`].
///
/// See the example of [`dynamic_soft_margin_loss`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DynamicSoftMarginLoss {
    /// The loss (`nonzero`: the triplets), the pair counts and the gradients.
    pub loss: PairLoss,
    /// The histogram after this call, for the next (unchanged without a triplet).
    pub histogram: Vec<f32>,
}

/// PML's `DynamicSoftMarginLoss` of `queries` `(b, d)` against `refs` `(m, d)` (`None`: the
/// queries), with the histogram PML carries from call to call, and its gradient (through
/// this batch's part of the histogram, as PML's autograd takes it; the previous histogram is
/// a constant, where PML's second backward raises). Cost `O(b (m log m + P · num_bins · log
/// m))` and the driver's blocks (module docs); no triplet is listed.
///
/// # Errors
/// [`Error::InvalidParameter`] for parameters out of range, another distance than
/// (squared) Euclidean on normalised rows, a `histogram` of another length than `num_bins`,
/// or a triplet outside the histogram (where PML raises an index error); otherwise as
/// [`crate::pair_loss`].
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{dynamic_soft_margin_loss, Context, DynamicSoftMarginConfig, MiningSet};
/// let ctx = Context::native_cpu(None);
/// let x = array![[1.0f32, 0.1], [0.9, 0.2], [0.1, 1.0], [0.2, 0.9]];
/// let labels = array![0, 0, 1, 1];
/// let mut cfg = DynamicSoftMarginConfig::default();
/// let first = dynamic_soft_margin_loss(&ctx, &MiningSet::new(&x, &labels), None, &cfg)?;
/// assert_eq!((first.loss.nonzero, first.histogram.len()), (8, 10));
/// cfg.histogram = first.histogram; // the next call mixes it in with momentum 0.01
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn dynamic_soft_margin_loss<L: Hash + Ord + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &DynamicSoftMarginConfig,
) -> Result<DynamicSoftMarginLoss> {
    let mut imports = Imports::call();
    let rule = cfg.loss.rule;
    if !cfg.histogram.is_empty() && cfg.histogram.len() != rule.num_bins as usize {
        return Err(Error::InvalidParameter {
            op: "dynamic_soft_margin_loss",
            what: "histogram",
            value: format!("{} bins", cfg.histogram.len()),
            rule: "must be empty or hold num_bins values (PML's hist_)",
        });
    }
    let (loss, histogram) = pair_call::job(ctx, (queries, refs), &cfg.loss, &mut imports, |job| {
        run(ctx, job, rule, &cfg.histogram)
    })?;
    Ok(DynamicSoftMarginLoss { loss, histogram })
}

/// The [`Plan`] of [`dynamic_soft_margin_loss`], allocating nothing: [`crate::pair_loss_plan`]'s
/// with `cfg.loss` (the histogram holds `num_bins` values whatever it is).
///
/// # Errors
/// As [`dynamic_soft_margin_loss`]; [`Error::OverBudget`] when not even one anchor fits.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{dynamic_soft_margin_loss_plan, Context, DynamicSoftMarginConfig, MiningSet};
/// let x = ndarray::Array2::<f32>::ones((512, 64));
/// let labels = ndarray::Array1::from_shape_fn(512, |i| i % 8);
/// let ctx = Context::native_cpu(Some(16 << 20));
/// let plan = dynamic_soft_margin_loss_plan(&ctx, &MiningSet::new(&x, &labels), None, &DynamicSoftMarginConfig::default())?;
/// assert!(plan.bytes <= 16 << 20);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn dynamic_soft_margin_loss_plan<L: Hash + Ord + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &DynamicSoftMarginConfig,
) -> Result<Plan> {
    let mut imports = Imports::plan();
    let plan = pair_call::job(ctx, (queries, refs), &cfg.loss, &mut imports, |job| {
        if !has_triplet(job) {
            return Ok(Plan::nothing(ctx.path(), job.set.ref_labels.len()));
        }
        plan(ctx, job, cfg.loss.rule)
    })?;
    Ok(plan.with_imports(imports.footprint()))
}

/// The plan of `job`: the driver's blocks beside the state the loss holds.
///
/// # Errors
/// [`Error::OverBudget`] when the state and one block do not fit.
pub(super) fn plan(ctx: &Context, job: &Job<'_>, c: DynamicSoftMargin) -> Result<Plan> {
    let state = state_bytes(c, job.set.ref_labels.len());
    let _held = HostReservation::new(super::pair_global::STATE, state, ctx.tracker())?;
    Ok(super::plan::plan(ctx, job, None)?.with_imports((state, 0)))
}
