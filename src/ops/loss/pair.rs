//! PML's losses over the pairs (and triplets) of the distance matrix: `ContrastiveLoss`,
//! `MultiSimilarityLoss`, `SupConLoss`, `CircleLoss`, `NCALoss`,
//! `GeneralizedLiftedStructureLoss`, `MarginLoss` and `FastAPLoss`, with their gradients,
//! through the loss driver ([`super::driver`]): anchors in blocks under the budget, each
//! anchor's row of distances turned into its row of weights `∂L/∂D` by the loss's rule
//! ([`super::pair_rules`], where each rule's formula is), then two products with the
//! embeddings. Contrastive's two means have divisors known only after every anchor, so a
//! first pass counts them (distances only, no gradient) and a second takes the weights
//! already divided: one more distance product than the others cost.
//!
//! As PML's `GenericPairLoss`es, Contrastive, MultiSimilarity, SupCon, Circle and
//! GeneralizedLifted return 0 with no gradient with at most one positive and one negative
//! pair; SupCon also without any positive or any negative pair; NCA with at most one query;
//! Margin without a triplet; FastAP without an anchor that has a positive. "Positive" losses
//! are decided on the f32 value, as PML's reducers see them.
//!
//! They run on the native path on every context (a wgpu context reads device-resident rows
//! back, once per pass: twice for Contrastive): their device rules are not written yet.

use std::hash::Hash;

use ndarray::{Array2, ArrayView1};

use super::driver::{self, Job, Mode, Scratch, Shared};
use super::info_nce::{check_temperature, pair_counts};
use super::pair_rules::{anchor, Contrastive, GeneralizedLifted, Kind, PairLossRule, Row};
use crate::context::plan::Plan;
use crate::context::{ComputePath, Context};
use crate::data::inputs::{self, Imports, MiningSet, SelfExclusion};
use crate::error::{Error, Result};
use crate::hooks::Hooks;
use crate::metric::{Distance, DistanceConfig};
use crate::runtime::memory::Transfers;
use crate::runtime::transfer;
use crate::validate;

/// The label of a call's working memory.
const SCRATCH: &str = "pair loss working memory";
/// FastAP's most bins: each anchor's seven histograms of `num_bins + 1` f64 (at most 230 KB
/// per thread, held for one anchor) stay small next to its row.
const MAX_BINS: u32 = 4096;
/// How [`pair_loss`] computes: the rule (its type picks the loss) and the sides. Defaults:
/// the rule's PML defaults and PML's default distance for it (cosine similarity for
/// MultiSimilarity, SupCon and Circle; Euclidean on normalised embeddings for Contrastive,
/// GeneralizedLifted and Margin; squared Euclidean on normalised embeddings for NCA and
/// FastAP).
///
/// # Example
/// ```
/// use wgpu_metric_learning::{Circle, Distance, PairLossConfig};
/// let cfg = PairLossConfig { rule: Circle { m: 0.25, gamma: 256.0 }, ..Default::default() };
/// assert_eq!(cfg.distance.distance, Distance::Cosine);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct PairLossConfig<R: PairLossRule> {
    /// The loss and its parameters.
    pub rule: R,
    /// The distance: any (PML's `margin` and sign conventions follow it), but cosine only
    /// for [`Circle`](crate::Circle).
    pub distance: DistanceConfig,
    /// Which reference is each query itself, never its own positive. Default
    /// [`SelfExclusion::Auto`]: the query's row when the references are the queries.
    pub self_exclusion: SelfExclusion,
    /// Also return the gradient with respect to the given references. Default `false` (a
    /// memory bank's rows are detached). Without references the queries' gradient holds both
    /// roles.
    pub ref_grad: bool,
    /// Progress (query–reference pairs) and cancellation. Default: none.
    pub hooks: Hooks,
}

impl<R: PairLossRule> Default for PairLossConfig<R> {
    fn default() -> Self {
        Self {
            rule: R::default(),
            distance: R::default_distance(),
            self_exclusion: SelfExclusion::Auto,
            ref_grad: false,
            hooks: Hooks::default(),
        }
    }
}

/// The result of [`pair_loss`].
///
/// See the example of [`pair_loss`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PairLoss {
    /// The loss as PML's default reducer gives it (module docs); 0 where PML returns no loss.
    pub loss: f32,
    /// What the mean divides by: nonzero positive plus nonzero negative pairs (Contrastive),
    /// anchors (MultiSimilarity, GeneralizedLifted), anchors with a positive loss (SupCon,
    /// Circle), anchors whose positives' f32 probability is not 0 (Nca), anchors with a
    /// positive (FastAp), nonzero terms over the triplets (Margin).
    pub nonzero: u64,
    /// Positive pairs (query, reference).
    pub positive_pairs: u64,
    /// Negative pairs (query, reference).
    pub negative_pairs: u64,
    /// `∂loss/∂queries` `(b, d)`; without references it also holds the queries' role as
    /// references.
    pub query_grad: Array2<f32>,
    /// `∂loss/∂refs` `(m, d)` when asked for and references were given.
    pub ref_grad: Option<Array2<f32>>,
    /// `∂loss/∂β` for [`Margin`](crate::Margin) with `learn_beta`, else `None`.
    pub beta_grad: Option<f32>,
    /// Where it ran: the native path (on every context, for now).
    pub path: ComputePath,
    /// Host–device traffic of the call.
    pub transfers: Transfers,
}

/// PML's pair loss that `cfg.rule` names (`ContrastiveLoss`, `MultiSimilarityLoss`,
/// `SupConLoss`, `CircleLoss`, `NCALoss`, `GeneralizedLiftedStructureLoss`, `MarginLoss`,
/// `FastAPLoss`) of `queries` `(b, d)` against `refs` `(m, d)` (`None`: the queries
/// themselves) over every pair (every triplet for Margin), in PML's semantics and reducers,
/// with its gradient. Cost: two matrix products (three for Contrastive), in `(rows, m)`
/// blocks under the budget; no `(b, m)` matrix and no triplet exists.
///
/// # Errors
/// [`Error::InvalidParameter`] for a parameter out of its range, Circle on another
/// distance than cosine, FastAP on another than (squared) Euclidean of normalised rows;
/// otherwise as [`crate::triplet_margin_loss`].
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{pair_loss, Context, MiningSet, MultiSimilarity, PairLossConfig};
/// let ctx = Context::native_cpu(None);
/// let x = array![[1.0f32, 0.1], [0.1, 1.0], [0.9, 0.2], [0.0, 1.0]];
/// let labels = array![0, 1, 0, 1];
/// let cfg = PairLossConfig::<MultiSimilarity>::default();
/// let out = pair_loss(&ctx, &MiningSet::new(&x, &labels), None, &cfg)?;
/// assert_eq!((out.positive_pairs, out.negative_pairs, out.nonzero), (4, 8, 4));
/// assert_eq!(out.query_grad.dim(), (4, 2));
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn pair_loss<L: Hash + Eq + Copy, R: PairLossRule>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &PairLossConfig<R>,
) -> Result<PairLoss> {
    let mut imports = Imports::call();
    job(ctx, (queries, refs), cfg, &mut imports, |job| {
        run(ctx, job, cfg.rule.kind())
    })
}

/// The [`Plan`] of [`pair_loss`] with these arguments, allocating nothing: its path, anchors
/// per block and bytes.
///
/// # Errors
/// As [`pair_loss`]; [`Error::OverBudget`] when not even one anchor fits.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{pair_loss_plan, Context, Contrastive, MiningSet, PairLossConfig};
/// let ctx = Context::native_cpu(Some(64 << 20));
/// let x = ndarray::Array2::<f32>::ones((4096, 128));
/// let labels = ndarray::Array1::from_shape_fn(4096, |i| i % 2048);
/// let cfg = PairLossConfig::<Contrastive>::default();
/// let plan = pair_loss_plan(&ctx, &MiningSet::new(&x, &labels), None, &cfg)?;
/// assert!(plan.bytes <= 64 << 20 && plan.rows < 4096);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn pair_loss_plan<L: Hash + Eq + Copy, R: PairLossRule>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &PairLossConfig<R>,
) -> Result<Plan> {
    let mut imports = Imports::plan();
    let plan = job(ctx, (queries, refs), cfg, &mut imports, |job| {
        if has_loss(job, cfg.rule.kind()).1 {
            super::plan::plan(ctx, job, None)
        } else {
            Ok(Plan::nothing(ctx.path(), job.set.ref_labels.len()))
        }
    })?;
    Ok(plan.with_imports(imports.footprint()))
}

/// Checks the rule's parameters against `distance`.
fn check(op: &'static str, kind: Kind, distance: &DistanceConfig) -> Result<()> {
    let positive = |what: &'static str, value: f32| check_temperature(op, what, value);
    let finite = |what: &'static str, value: f32| validate::finite_param(op, what, value);
    match kind {
        Kind::Contrastive(Contrastive {
            pos_margin,
            neg_margin,
        })
        | Kind::GeneralizedLifted(GeneralizedLifted {
            pos_margin,
            neg_margin,
        }) => {
            finite("pos_margin", pos_margin)?;
            finite("neg_margin", neg_margin)
        }
        Kind::MultiSimilarity(c) => {
            positive("alpha", c.alpha)?;
            positive("beta", c.beta)?;
            finite("base", c.base)
        }
        Kind::SupCon(c) => positive("temperature", c.temperature),
        Kind::Nca(c) => positive("softmax_scale", c.softmax_scale),
        Kind::FastAp(c) => {
            let lp = matches!(
                distance.distance,
                Distance::Euclidean | Distance::SquaredEuclidean
            );
            if c.num_bins == 0 || c.num_bins > MAX_BINS {
                return Err(Error::InvalidParameter {
                    op,
                    what: "num_bins",
                    value: c.num_bins.to_string(),
                    rule: "must be 1 to 4 096",
                });
            }
            if lp && distance.normalize {
                return Ok(());
            }
            Err(Error::InvalidParameter {
                op,
                what: "distance",
                value: format!("{distance:?}"),
                rule: "must be Euclidean or squared Euclidean on normalised embeddings (as PML's FastAPLoss asserts)",
            })
        }
        Kind::Margin(c) => {
            finite("margin", c.margin)?;
            finite("nu", c.nu)?;
            finite("beta", c.beta)
        }
        Kind::Circle(c) => {
            finite("m", c.m)?;
            positive("gamma", c.gamma)?;
            if distance.distance == Distance::Cosine {
                return Ok(());
            }
            Err(Error::InvalidParameter {
                op,
                what: "distance",
                value: format!("{:?}", distance.distance),
                rule: "must be cosine similarity (as PML's CircleLoss asserts)",
            })
        }
    }
}

/// Checks and prepares a call, and hands its job to `f`.
fn job<L: Hash + Eq + Copy, R: PairLossRule, T>(
    ctx: &Context,
    (queries, refs): (&MiningSet<'_, L>, Option<&MiningSet<'_, L>>),
    cfg: &PairLossConfig<R>,
    imports: &mut Imports,
    f: impl FnOnce(&Job<'_>) -> Result<T>,
) -> Result<T> {
    let op = cfg.rule.op();
    check(op, cfg.rule.kind(), &cfg.distance)?;
    let set = inputs::prepare(
        op,
        ctx,
        queries,
        refs,
        &cfg.self_exclusion,
        true,
        |_| Ok(true),
        imports,
    )?;
    f(&Job {
        op,
        label: SCRATCH,
        set: &set,
        refs_are_queries: refs.is_none(),
        distance: cfg.distance,
        ref_grad: cfg.ref_grad,
        ref_pairs: false,
        hooks: &cfg.hooks,
    })
}

/// The pair counts, and whether PML computes a loss: not with at most one positive and one
/// negative pair (its `GenericPairLoss`es), nor without positives or negatives (SupCon), nor
/// for at most one query (NCA). MarginLoss returns none without a triplet and FastAP none
/// without an anchor that has a positive, which the run finds out.
fn has_loss(job: &Job<'_>, kind: Kind) -> ((u64, u64), bool) {
    let (positives, negatives) = pair_counts(job.set);
    let few = positives <= 1 && negatives <= 1;
    let has = match kind {
        Kind::Nca(_) => job.set.labels.len() > 1,
        Kind::Margin(_) | Kind::FastAp(_) => true,
        Kind::SupCon(_) => !few && positives > 0 && negatives > 0,
        _ => !few,
    };
    ((positives, negatives), has)
}

/// Runs the loss: zeros where PML returns none, else the driver (twice for Contrastive).
fn run(ctx: &Context, job: &Job<'_>, kind: Kind) -> Result<PairLoss> {
    let ((positive_pairs, negative_pairs), has) = has_loss(job, kind);
    let (b, d) = job.set.queries.as_ref().map_or((0, 0), |q| q.dim());
    let m = job.set.ref_labels.len();
    let learn_beta = matches!(kind, Kind::Margin(c) if c.learn_beta);
    if !has {
        job.hooks.check(job.op)?;
        return Ok(PairLoss {
            loss: 0.0,
            nonzero: 0,
            positive_pairs,
            negative_pairs,
            query_grad: Array2::zeros((b, d)),
            ref_grad: (job.ref_grad && !job.refs_are_queries).then(|| Array2::zeros((m, d))),
            beta_grad: learn_beta.then_some(0.0),
            path: ctx.path(),
            transfers: job.set.imported,
        });
    }
    let similarity = job.distance.distance.is_similarity();
    let histogram_max = match job.distance.distance {
        Distance::SquaredEuclidean => 4.0,
        _ => 2.0,
    };
    let set = job.set;
    let rule = |divisors: (u64, u64)| {
        move |a: usize, d: ArrayView1<'_, f32>, s: &mut Scratch, _: &Shared<'_>| {
            set.lists_of(a, &mut s.positives, &mut s.negatives);
            let row = Row {
                d,
                similarity,
                divisors,
                histogram_max,
            };
            anchor(kind, &row, s)
        }
    };
    let (out, mut transfers) = transfer::measure(|| match kind {
        Kind::Contrastive(_) => {
            let counted = driver::run_as(ctx, job, &rule((0, 0)), Mode::Forward)?.totals;
            let divisors = (counted.count, counted.items);
            let mut out = driver::run_as(ctx, job, &rule(divisors), Mode::Sum)?;
            out.totals.count += out.totals.items;
            Ok((out.totals.loss, None, out))
        }
        Kind::Margin(c) => {
            let out = driver::run(ctx, job, &rule((0, 0)))?;
            let t = out.totals;
            // PML returns no loss (nor β's regulariser) without a triplet.
            let (loss, beta_grad) = match (t.items, t.count) {
                (0, _) => (0.0, 0.0),
                (_, 0) => (0.0, 0.0),
                (_, count) => (t.loss / count as f64, t.aux / count as f64),
            };
            let reg = learn_beta && t.items > 0;
            let (nu, beta) = (f64::from(c.nu), f64::from(c.beta));
            let loss = loss + if reg { nu * beta } else { 0.0 };
            let beta_grad = beta_grad + if reg { nu } else { 0.0 };
            Ok((loss, learn_beta.then_some(beta_grad as f32), out))
        }
        _ => {
            let out = driver::run(ctx, job, &rule((0, 0)))?;
            Ok((f64::from(out.totals.mean()), None, out))
        }
    });
    transfers.add(job.set.imported);
    let (loss, beta_grad, out) = out?;
    Ok(PairLoss {
        loss: loss as f32,
        nonzero: out.totals.count,
        positive_pairs,
        negative_pairs,
        query_grad: out.query_grad,
        ref_grad: out.ref_grad,
        beta_grad,
        path: ComputePath::NativeCpu,
        transfers,
    })
}
