//! PML's `TripletMarginLoss` and its gradient over every triplet (or those a
//! `TripletMarginMiner` keeps) without a triplet list.
//!
//! Per anchor, its negatives' distances are sorted once. For each positive `p`, the negatives
//! whose triplet the miner keeps and whose hinge is positive are then one run of that order
//! (both conditions are intervals of the negative's value), found by two binary searches that
//! evaluate PML's own f32 expressions. The loss over the run is `c (d_ap + margin) − Σ d_an`
//! from a prefix sum; `p`'s weight gains `c` and every negative in the run loses one, which a
//! difference array over the sorted order adds up for all positives at once. The smooth
//! (softplus) loss has no such shortcut: each kept triplet is evaluated, still with no memory
//! beyond the anchor's row. Nor has PML's swap, whose negative distance `min(d(a, n),
//! d(r_p, r_n))` depends on the positive: the anchor's positives are taken 32 at a time with
//! their distances to every reference ([`super::scratch::RefPairs`]), whose weights go back to the
//! references through the same two products as the anchors'.
//!
//! Triplets are PML's (`label[a] = label[p] ≠ label[n]`, `p` not the anchor itself per the
//! self-exclusion). The gradient goes through the distance and, when embeddings are
//! normalised, through the normalisation, as torch's autograd takes it (a zero Euclidean
//! distance passes no gradient).
//!
//! On a wgpu context the loss runs on the device ([`super::gpu`]): `triplet_weights`
//! compares every positive of an anchor's row with every negative (`2·P·N` comparisons per
//! anchor, no sort, the row split into blocks of 256 in parallel), so softplus costs what the
//! hinge does; `loss_backward` takes the weights to the embeddings. Swap stays on the native
//! path.

use std::hash::Hash;

use ndarray::{Array2, ArrayView1};

use super::driver::{self, Job};
use super::gpu;
use super::scratch::{Scratch, Shared, Totals, PAIR_ROWS};
use crate::context::plan::Plan;
use crate::context::{ComputePath, Context};
use crate::data::inputs::{self, Imports, Labelled, MiningSet, SelfExclusion};
use crate::error::Result;
use crate::hooks::Hooks;
use crate::metric::DistanceConfig;
use crate::ops::triplets::TripletRule;
use crate::runtime::memory::Transfers;
use crate::runtime::transfer;
use crate::validate;

const OP: &str = "triplet_margin_loss";
/// The label of a call's working memory.
const SCRATCH: &str = "triplet_margin_loss working memory";

/// How [`triplet_margin_loss`] computes. Defaults: PML's `TripletMarginLoss()` (margin 0.05,
/// every valid triplet, Euclidean distance on normalised embeddings, hinge, no swap).
///
/// # Example
/// ```
/// use wgpu_metric_learning::{TripletLossConfig, TripletRule, TripletType};
/// let fused = TripletLossConfig {
///     triplets: TripletRule::margin_miner(TripletType::Semihard),
///     ..Default::default()
/// };
/// assert_eq!(fused.margin, 0.05);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct TripletLossConfig {
    /// The loss's margin (PML default 0.05): a triplet's loss is
    /// `relu(d(a, p) − d(a, n) + margin)` for distances and `relu(s(a, n) − s(a, p) + margin)`
    /// for similarities. Any finite value.
    pub margin: f32,
    /// Which triplets: every valid one (default, [`TripletRule::AllValid`], PML's
    /// `TripletMarginLoss` without a miner) or those that PML's `TripletMarginMiner` keeps
    /// ([`TripletRule::Margin`], with its own margin), mined on this loss's distance and
    /// fused with the loss.
    pub triplets: TripletRule,
    /// The distance. Default: Euclidean on normalised embeddings (PML `LpDistance()`).
    pub distance: DistanceConfig,
    /// `softplus` instead of `relu` (PML `smooth_loss=True`). Default `false`.
    pub smooth_loss: bool,
    /// PML `swap=True`: a triplet's negative distance is the smaller of `d(a, n)` and
    /// `d(r_p, r_n)`, the distance between the positive's and the negative's reference rows
    /// (the larger similarity, for similarities); the miner still chooses by `d(a, n)`. On a
    /// tie each gets half the gradient, as torch's `minimum` gives it. Default `false`.
    ///
    /// Where PML is given references (`ref_emb`, as `CrossBatchMemory` gives its memory), it
    /// reads `d(p, n)` from the query-by-reference matrix with reference indices as rows
    /// (out of range or the wrong rows, its issue #748); here it is always `d(r_p, r_n)`, which
    /// with `refs = None` is PML's. Every kept triplet is then evaluated (no run sums), with
    /// the distances of up to 32 positives to every reference and, for the references'
    /// gradient, a `(m, d)` gradient per thread in the budget. Swap runs on the native path
    /// on every context (a wgpu context reads device-resident rows back): its reference
    /// pairs' weights would need float atomics or a second pass on the device.
    pub swap: bool,
    /// Which reference is each anchor itself, never its own positive. Default
    /// [`SelfExclusion::Auto`]: the anchor's row when the references are the queries
    /// (`refs = None`), nothing otherwise; a memory bank's enqueue gives
    /// [`SelfExclusion::QuerySlots`].
    pub self_exclusion: SelfExclusion,
    /// Also return the gradient with respect to the given references. Default `false`: a
    /// memory bank's rows are detached, as in PML's `CrossBatchMemory`. Without references the
    /// queries play both roles and their gradient holds both.
    pub ref_grad: bool,
    /// Progress (anchor–reference pairs) and cancellation. Default: none.
    pub hooks: Hooks,
}

impl Default for TripletLossConfig {
    fn default() -> Self {
        Self {
            margin: 0.05,
            triplets: TripletRule::AllValid,
            distance: DistanceConfig::default(),
            smooth_loss: false,
            swap: false,
            self_exclusion: SelfExclusion::Auto,
            ref_grad: false,
            hooks: Hooks::default(),
        }
    }
}

/// The result of [`triplet_margin_loss`].
///
/// See the example of [`triplet_margin_loss`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TripletLoss {
    /// The mean loss over the triplets whose loss is positive (PML's `AvgNonZeroReducer`);
    /// 0 when there is none.
    pub loss: f32,
    /// Triplets whose loss is positive: the mean's divisor.
    pub nonzero: u64,
    /// Triplets the loss ran over (every valid one, or those the miner kept).
    pub triplets: u64,
    /// `∂loss/∂queries` `(b, d)`; without references it also holds the queries' role as
    /// references.
    pub query_grad: Array2<f32>,
    /// `∂loss/∂refs` `(m, d)` when asked for ([`TripletLossConfig::ref_grad`]) and references
    /// were given.
    pub ref_grad: Option<Array2<f32>>,
    /// Where it ran: [`ComputePath::Wgpu`] on a wgpu context (distances, weights and both
    /// gradient products on the device), except with [`TripletLossConfig::swap`], references
    /// that take more than one storage binding, or device buffers (the gradients and one
    /// block) that do not fit the budget: those run on the native path (reading
    /// device-resident rows back).
    pub path: ComputePath,
    /// Host–device traffic of the call: the uploads, and the gradients (or the rows) read
    /// back.
    pub transfers: Transfers,
}

/// PML's `TripletMarginLoss` over the triplets of `queries` `(b, d)` against `refs` `(m, d)`
/// (`None`: the queries themselves), all of them or those `cfg.triplets` keeps, with its
/// gradient. Returns the mean over the positive losses (PML's `AvgNonZeroReducer`; zero, with
/// zero gradients, when there is none) and its gradient as torch's autograd takes it. Cost:
/// mining's plus two matrix products, in `(rows, m)` blocks under the budget, no triplet list.
///
/// # Errors
/// As [`crate::mine_triplets`] with a margin rule; [`Error::InvalidParameter`](crate::Error::InvalidParameter)
/// for a non-finite margin; [`Error::OverBudget`](crate::Error::OverBudget) when one anchor's
/// row, the gradients and the normalised copies do not fit; [`Error::Cancelled`](crate::Error::Cancelled).
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{triplet_margin_loss, Context, MiningSet, TripletLossConfig};
/// let ctx = Context::native_cpu(None);
/// let x = array![[1.0f32, 0.0], [0.8, 0.6], [0.6, 0.8]];
/// let labels = array![0, 0, 1];
/// let out = triplet_margin_loss(&ctx, &MiningSet::new(&x, &labels), None, &TripletLossConfig::default())?;
/// // Triplets (0, 1, 2) and (1, 0, 2): only the second is inside the margin.
/// assert_eq!((out.triplets, out.nonzero), (2, 1));
/// assert_eq!(out.query_grad.dim(), (3, 2));
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn triplet_margin_loss<L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &TripletLossConfig,
) -> Result<TripletLoss> {
    let mut imports = Imports::call();
    triplet_job(ctx, (queries, refs), cfg, &mut imports, |job| {
        run(ctx, job, cfg)
    })
}

/// The [`Plan`] of [`triplet_margin_loss`] with these arguments, allocating nothing: its path
/// (the device where the call fits it, else the native path), anchors per block and bytes.
///
/// # Errors
/// As [`triplet_margin_loss`]; [`Error::OverBudget`](crate::Error::OverBudget) when not even
/// one anchor fits.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{triplet_margin_loss_plan, Context, MiningSet, TripletLossConfig};
/// let ctx = Context::native_cpu(Some(64 << 20));
/// let x = ndarray::Array2::<f32>::ones((4096, 128));
/// let labels = ndarray::Array1::from_shape_fn(4096, |i| i % 100);
/// let cfg = TripletLossConfig::default();
/// let plan = triplet_margin_loss_plan(&ctx, &MiningSet::new(&x, &labels), None, &cfg)?;
/// assert!(plan.bytes <= 64 << 20);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn triplet_margin_loss_plan<L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &TripletLossConfig,
) -> Result<Plan> {
    let mut imports = Imports::plan();
    let plan = triplet_job(ctx, (queries, refs), cfg, &mut imports, |job| {
        super::plan::plan(ctx, job, device_rule(cfg).as_ref())
    })?;
    Ok(plan.with_imports(imports.footprint()))
}

/// Checks and prepares a triplet-loss call, and hands its job to `f`.
fn triplet_job<L: Hash + Eq + Copy, T>(
    ctx: &Context,
    (queries, refs): (&MiningSet<'_, L>, Option<&MiningSet<'_, L>>),
    cfg: &TripletLossConfig,
    imports: &mut Imports,
    f: impl FnOnce(&Job<'_>) -> Result<T>,
) -> Result<T> {
    validate::finite_param(OP, "margin", cfg.margin)?;
    if let TripletRule::Margin { margin, .. } = cfg.triplets {
        validate::finite_param(OP, "miner margin", margin)?;
    }
    let set = inputs::prepare(
        OP,
        ctx,
        queries,
        refs,
        &cfg.self_exclusion,
        true,
        |_| Ok(true),
        imports,
    )?;
    f(&Job {
        op: OP,
        label: SCRATCH,
        set: &set,
        refs_are_queries: refs.is_none(),
        distance: cfg.distance,
        ref_grad: cfg.ref_grad,
        ref_pairs: cfg.swap,
        snr: None,
        hooks: &cfg.hooks,
    })
}

/// The device kernel's rule for `cfg`, or `None` for swap (the native path's reference
/// pairs).
fn device_rule(cfg: &TripletLossConfig) -> Option<gpu::Rule> {
    (!cfg.swap).then_some(gpu::Rule::Triplet {
        triplets: cfg.triplets,
        margin: cfg.margin,
        smooth: cfg.smooth_loss,
    })
}

/// Runs the loss on `job`.
fn run(ctx: &Context, job: &Job<'_>, cfg: &TripletLossConfig) -> Result<TripletLoss> {
    let set = job.set;
    let rule = Rule {
        set,
        triplets: cfg.triplets,
        margin: cfg.margin,
        similarity: cfg.distance.distance.is_similarity(),
        smooth: cfg.smooth_loss,
        swap: cfg.swap,
    };
    let anchor = |a: usize, row: ArrayView1<'_, f32>, s: &mut Scratch, shared: &Shared<'_>| {
        rule.anchor(a, row, s, shared)
    };
    // The device path where there is one (and the call fits it), except for swap.
    let on_device = || -> Result<Option<driver::Output>> {
        match (ctx.gpu(), device_rule(cfg)) {
            (Some(gpu), Some(rule)) => gpu::run(ctx, gpu, job, &rule),
            _ => Ok(None),
        }
    };
    let (out, mut transfers) = transfer::measure(|| match on_device()? {
        Some(out) => Ok((out, ComputePath::Wgpu)),
        None => driver::run(ctx, job, &anchor).map(|out| (out, ComputePath::NativeCpu)),
    });
    transfers.add(set.imported);
    let (out, path) = out?;
    Ok(TripletLoss {
        loss: out.totals.mean(),
        nonzero: out.totals.count,
        triplets: out.totals.items,
        query_grad: out.query_grad,
        ref_grad: out.ref_grad,
        path,
        transfers,
    })
}

/// What one anchor's triplets depend on.
struct Rule<'a> {
    set: &'a Labelled<'a>,
    triplets: TripletRule,
    margin: f32,
    similarity: bool,
    smooth: bool,
    swap: bool,
}

/// PML's softplus (torch's, threshold 20) in f32, and its derivative.
fn softplus(v: f32) -> (f32, f32) {
    if v > 20.0 {
        (v, 1.0)
    } else {
        let z = v.exp();
        (z.ln_1p(), z / (z + 1.0))
    }
}

/// The hinge and its derivative (torch's `relu`: 0 at 0).
fn relu(v: f32) -> (f32, f32) {
    if v > 0.0 {
        (v, 1.0)
    } else {
        (0.0, 0.0)
    }
}

/// PML's swap: the smaller of `an = d(a, n)` and `pn = d(r_p, r_n)` (the larger, for
/// similarities), with `an`'s share of the gradient: all of it, none, or half on a tie (torch's
/// `minimum` / `maximum`).
fn swapped(an: f32, pn: f32, similarity: bool) -> (f32, f64) {
    if an == pn {
        (an, 0.5)
    } else if (an < pn) != similarity {
        (an, 1.0)
    } else {
        (pn, 0.0)
    }
}

impl Rule<'_> {
    /// Anchor `a`'s triplets against its distance row `(m,)`: their sums (the positive
    /// losses, their count, the triplets) and the row's `∂L/∂D` in `s.weights` (and, with
    /// swap, the weights of pairs of references in `s.pairs`).
    fn anchor(
        &self,
        a: usize,
        row: ArrayView1<'_, f32>,
        s: &mut Scratch,
        shared: &Shared<'_>,
    ) -> Totals {
        let similarity = self.similarity;
        s.lists(self.set, a);
        s.order.clear();
        s.order
            .extend(s.negatives.iter().map(|&n| (row[n as usize], n)));
        s.order
            .sort_unstable_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
        s.sorted.clear();
        s.sorted.extend(s.order.iter().map(|x| x.0));
        // ∂v/∂d(a, p) for the violation v (∂v/∂d(a, n) is its negation): +1 for distances,
        // −1 for similarities.
        let dp = if similarity { -1.0 } else { 1.0 };
        let margin = self.margin;
        // PML's f32 expression: `distance.margin(ap, an) + margin`.
        let violation = |ap: f32, an: f32| {
            if similarity {
                (an - ap) + margin
            } else {
                (ap - an) + margin
            }
        };
        let mut t = Totals::default();
        if self.smooth || self.swap {
            // Every kept triplet evaluated; with swap, the positives PAIR_ROWS at a time
            // with their distances to every reference.
            let hinge = if self.smooth { softplus } else { relu };
            let mut pairs = s.pairs.as_mut().filter(|_| self.swap);
            let per = if pairs.is_some() {
                PAIR_ROWS
            } else {
                usize::MAX
            };
            for chunk in s.positives.chunks(per) {
                if let Some(pairs) = pairs.as_mut() {
                    pairs.load(shared, chunk);
                }
                for (i, &p) in chunk.iter().enumerate() {
                    let ap = row[p as usize];
                    let kept = self.triplets.kept_range(&s.sorted, ap, similarity);
                    t.items += kept.len() as u64;
                    let mut on_p = 0.0f64;
                    for &(an, n) in &s.order[kept] {
                        let (an, via_an) = match &pairs {
                            Some(pairs) => swapped(an, pairs.distance(i, n as usize), similarity),
                            None => (an, 1.0),
                        };
                        let (loss, slope) = hinge(violation(ap, an));
                        // AvgNonZeroReducer: a softplus that underflowed to 0 is not averaged.
                        if loss > 0.0 {
                            t.count += 1;
                            t.loss += loss as f64;
                            on_p += slope as f64;
                            let w = dp * slope as f64;
                            s.weights[n as usize] -= w * via_an;
                            if let Some(pairs) = pairs.as_mut().filter(|_| via_an < 1.0) {
                                pairs.add_weight(i, n as usize, -w * (1.0 - via_an));
                            }
                        }
                    }
                    s.weights[p as usize] += dp * on_p;
                }
                if let Some(pairs) = pairs.as_mut() {
                    pairs.flush(shared);
                }
            }
            return t;
        }
        let n = s.sorted.len();
        s.prefix.clear();
        s.prefix.push(0.0);
        let mut sum = 0.0f64;
        for &v in &s.sorted {
            sum += v as f64;
            s.prefix.push(sum);
        }
        s.runs.clear();
        s.runs.resize(n + 1, 0);
        for &p in &s.positives {
            let ap = row[p as usize];
            let kept = self.triplets.kept_range(&s.sorted, ap, similarity);
            t.items += kept.len() as u64;
            // The positive losses: a prefix of the order for distances, a suffix for
            // similarities (the violation is monotone in the negative's value).
            let split = s
                .sorted
                .partition_point(|&an| (violation(ap, an) > 0.0) != similarity);
            let live = if similarity { split..n } else { 0..split };
            let (lo, hi) = (kept.start.max(live.start), kept.end.min(live.end));
            if lo >= hi {
                continue;
            }
            let c = (hi - lo) as u64;
            let an_sum = s.prefix[hi] - s.prefix[lo];
            let c_f = c as f64;
            t.count += c;
            t.loss += if similarity {
                an_sum + c_f * (margin as f64 - ap as f64)
            } else {
                c_f * (ap as f64 + margin as f64) - an_sum
            };
            s.weights[p as usize] += dp * c_f;
            s.runs[lo] += 1;
            s.runs[hi] -= 1;
        }
        // Each negative is in the runs of the positives whose run covers its position.
        let mut running = 0i64;
        for (&delta, &(_, n)) in s.runs.iter().zip(&s.order) {
            running += delta;
            s.weights[n as usize] -= dp * running as f64;
        }
        t
    }
}
