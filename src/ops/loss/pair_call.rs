//! A pair loss call's configuration, result and checks: [`PairLossConfig`], [`PairLoss`],
//! each rule's parameters against its distance, and the preparation of the inputs into the
//! driver's [`Job`]; shared by `pair_loss` and the losses with passes of their own (the
//! angular and dynamic soft margin modules).

use std::hash::Hash;

use ndarray::Array2;

use super::driver::Job;
use super::info_nce::check_temperature;
use super::pair_params::{
    Angular, Contrastive, GeneralizedLifted, IntraPairVariance, Kind, LiftedStructure,
    PairLossRule, PnpVariant,
};
use crate::context::{ComputePath, Context};
use crate::data::inputs::{self, Imports, MiningSet, SelfExclusion};
use crate::error::{Error, Result};
use crate::hooks::Hooks;
use crate::metric::{Distance, DistanceConfig};
use crate::runtime::memory::Transfers;
use crate::validate;

/// The label of a call's working memory.
pub(super) const SCRATCH: &str = "pair loss working memory";
/// Histogram's most bins: four f64 vectors of `n_bins + 1` held for the call.
const MAX_HISTOGRAM_BINS: u32 = 65_536;
/// FastAP's most bins: each anchor's seven histograms of `num_bins + 1` f64 (at most 230 KB
/// per thread, held for one anchor) stay small next to its row.
const MAX_BINS: u32 = 4096;
/// DynamicSoftMargin's most bins: each anchor's bins are added under one lock shared by the
/// threads, so they stay small beside its row.
const MAX_DSM_BINS: u32 = 4096;

/// How [`pair_loss`](crate::pair_loss) computes: the rule (its type picks the loss) and the sides. Defaults:
/// the rule's PML defaults and PML's default distance for it (cosine similarity for
/// MultiSimilarity, SupCon, Circle, Histogram, TupletMargin, IntraPairVariance, TCM, PNP and
/// Instance;
/// Euclidean on normalised embeddings for Contrastive, GeneralizedLifted, Margin, Lifted and
/// RankedList; squared Euclidean on normalised embeddings for NCA and FastAP; dot product on
/// normalised embeddings for NPairs).
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
    /// for Circle, Histogram, TupletMargin, TCM, PNP and Instance, (squared) Euclidean on normalised
    /// rows only for FastAP.
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

/// The result of [`pair_loss`](crate::pair_loss).
///
/// See the example of [`pair_loss`](crate::pair_loss).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PairLoss {
    /// The loss as PML's default reducer gives it (module docs); 0 where PML returns no loss.
    pub loss: f32,
    /// What the mean divides by: nonzero positive plus nonzero negative pairs (Contrastive),
    /// anchors (MultiSimilarity, GeneralizedLifted, RankedList), anchors with a positive loss
    /// (SupCon, Circle), anchors whose positives' f32 probability is not 0 (Nca), anchors
    /// with a positive (FastAp), nonzero terms over the triplets (Margin), positive pairs
    /// (LiftedStructure, TupletMargin), anchors with a positive (Pnp), pairs (NPairs: one per
    /// label with two rows), rows (Instance), positive plus negative
    /// pairs (IntraPairVariance), the
    /// pairs binned (Histogram), the pairs past their margins (ThresholdConsistentMargin).
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

/// Checks the rule's parameters against `distance`.
pub(super) fn check(op: &'static str, kind: Kind, distance: &DistanceConfig) -> Result<()> {
    let positive = |what: &'static str, value: f32| check_temperature(op, what, value);
    let finite = |what: &'static str, value: f32| validate::finite_param(op, what, value);
    match kind {
        Kind::SnrContrastive(c) => {
            finite("pos_margin", c.pos_margin)?;
            finite("neg_margin", c.neg_margin)?;
            if distance.distance == Distance::SquaredEuclidean {
                return Ok(());
            }
            Err(Error::InvalidParameter {
                op,
                what: "distance",
                value: format!("{:?}", distance.distance),
                rule: "must be squared Euclidean, standing for PML's SNRDistance (its normalize is normalize_embeddings)",
            })
        }
        Kind::Contrastive(Contrastive {
            pos_margin,
            neg_margin,
        })
        | Kind::GeneralizedLifted(GeneralizedLifted {
            pos_margin,
            neg_margin,
        })
        | Kind::LiftedStructure(LiftedStructure {
            pos_margin,
            neg_margin,
        }) => {
            finite("pos_margin", pos_margin)?;
            finite("neg_margin", neg_margin)
        }
        Kind::IntraPairVariance(IntraPairVariance { pos_eps, neg_eps }) => {
            finite("pos_eps", pos_eps)?;
            finite("neg_eps", neg_eps)
        }
        Kind::Histogram(c) => {
            if c.n_bins == 0 || c.n_bins > MAX_HISTOGRAM_BINS {
                return Err(Error::InvalidParameter {
                    op,
                    what: "n_bins",
                    value: c.n_bins.to_string(),
                    rule: "must be 1 to 65 536",
                });
            }
            cosine_only(op, distance)
        }
        Kind::TupletMargin(c) => {
            finite("margin", c.margin)?;
            positive("scale", c.scale)?;
            cosine_only(op, distance)
        }
        Kind::NPairs(_) => Ok(()),
        Kind::Instance(c) => {
            positive("gamma", c.gamma)?;
            cosine_only(op, distance)
        }
        Kind::DynamicSoftMargin(c) => {
            finite("min_val", c.min_val)?;
            finite("momentum", c.momentum)?;
            if c.min_val == 0.0 || !(2..=MAX_DSM_BINS).contains(&c.num_bins) {
                return Err(Error::InvalidParameter {
                    op,
                    what: "min_val, num_bins",
                    value: format!("{}, {}", c.min_val, c.num_bins),
                    rule: "min_val must not be 0 and num_bins must be 2 to 4 096",
                });
            }
            lp_only(op, distance)
        }
        Kind::Angular(c) => {
            let (c1, c2) = c.coefficients();
            if !(c.alpha.is_finite() && c1.is_finite() && c2.is_finite()) {
                return Err(Error::InvalidParameter {
                    op,
                    what: "alpha",
                    value: c.alpha.to_string(),
                    rule: "must be finite degrees with 4 tan²(alpha) finite",
                });
            }
            if *distance == Angular::default_distance() {
                return Ok(());
            }
            Err(Error::InvalidParameter {
                op,
                what: "distance",
                value: format!("{distance:?}"),
                rule: "must be Euclidean on normalised embeddings (as PML's AngularLoss asserts)",
            })
        }
        Kind::Pnp(c) => {
            if c.variant == PnpVariant::Ib {
                positive("b", c.b)?;
            }
            finite("alpha", c.alpha)?;
            positive("anneal", c.anneal)?;
            cosine_only(op, distance)
        }
        Kind::ThresholdConsistentMargin(c) => {
            finite("lambda_plus", c.lambda_plus)?;
            finite("lambda_minus", c.lambda_minus)?;
            finite("margin_plus", c.margin_plus)?;
            finite("margin_minus", c.margin_minus)?;
            cosine_only(op, distance)
        }
        Kind::RankedList(c) => {
            finite("margin", c.margin)?;
            finite("tn", c.tn)?;
            finite("tp", c.tp)?;
            if let Some(alpha) = c.alpha {
                finite("alpha", alpha)?;
            }
            if (0.0..=1.0).contains(&c.imbalance) {
                return Ok(());
            }
            Err(Error::InvalidParameter {
                op,
                what: "imbalance",
                value: c.imbalance.to_string(),
                rule: "must be 0 to 1",
            })
        }
        Kind::MultiSimilarity(c) => {
            positive("alpha", c.alpha)?;
            positive("beta", c.beta)?;
            finite("base", c.base)
        }
        Kind::SupCon(c) => positive("temperature", c.temperature),
        Kind::Nca(c) => positive("softmax_scale", c.softmax_scale),
        Kind::FastAp(c) => {
            if c.num_bins == 0 || c.num_bins > MAX_BINS {
                return Err(Error::InvalidParameter {
                    op,
                    what: "num_bins",
                    value: c.num_bins.to_string(),
                    rule: "must be 1 to 4 096",
                });
            }
            lp_only(op, distance)
        }
        Kind::Margin(c) => {
            finite("margin", c.margin)?;
            finite("nu", c.nu)?;
            finite("beta", c.beta)
        }
        Kind::Circle(c) => {
            finite("m", c.m)?;
            positive("gamma", c.gamma)?;
            cosine_only(op, distance)
        }
    }
}

/// The losses PML defines on its `LpDistance(p=2)` of normalised embeddings only (power 1
/// or 2): FastAP, DynamicSoftMargin.
fn lp_only(op: &'static str, distance: &DistanceConfig) -> Result<()> {
    let lp = matches!(
        distance.distance,
        Distance::Euclidean | Distance::SquaredEuclidean
    );
    if lp && distance.normalize {
        return Ok(());
    }
    Err(Error::InvalidParameter {
        op,
        what: "distance",
        value: format!("{distance:?}"),
        rule: "must be Euclidean or squared Euclidean on normalised embeddings (as PML asserts for this loss)",
    })
}

/// The losses PML defines on cosine similarity only.
fn cosine_only(op: &'static str, distance: &DistanceConfig) -> Result<()> {
    if distance.distance == Distance::Cosine {
        return Ok(());
    }
    Err(Error::InvalidParameter {
        op,
        what: "distance",
        value: format!("{:?}", distance.distance),
        rule: "must be cosine similarity (as PML asserts for this loss)",
    })
}

/// Refuses references for the losses PML computes over the queries' own pairs only.
pub(super) fn refuse_refs<L, R: PairLossRule>(
    refs: Option<&MiningSet<'_, L>>,
    rule: &R,
) -> Result<()> {
    let own_pairs = matches!(
        rule.kind(),
        Kind::Histogram(_) | Kind::Pnp(_) | Kind::NPairs(_) | Kind::Instance(_)
    );
    if own_pairs && refs.is_some() {
        return Err(Error::InvalidParameter {
            op: rule.op(),
            what: "refs",
            value: "given".into(),
            rule: "must be None: the loss is over the queries' own pairs (as PML's)",
        });
    }
    Ok(())
}

/// Checks and prepares a call, and hands its job to `f`.
pub(super) fn job<L: Hash + Eq + Copy, R: PairLossRule, T>(
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
    // SNR: squared Euclidean distances of the centred rows, divided by the driver.
    let snr = matches!(cfg.rule.kind(), Kind::SnrContrastive(_)).then_some(cfg.distance.normalize);
    let distance = match snr {
        Some(_) => DistanceConfig {
            distance: Distance::SquaredEuclidean,
            normalize: false,
        },
        None => cfg.distance,
    };
    f(&Job {
        op,
        label: SCRATCH,
        set: &set,
        refs_are_queries: refs.is_none(),
        distance,
        ref_grad: cfg.ref_grad,
        ref_pairs: false,
        snr,
        hooks: &cfg.hooks,
    })
}

/// The result of a call where PML returns no loss: zeros, the pair counts `counts`, the
/// gradients' shapes (the references' when asked for), `beta_grad` as given.
///
/// # Errors
/// `Cancelled` when the call's token is.
pub(super) fn no_loss(
    ctx: &Context,
    job: &Job<'_>,
    (positive_pairs, negative_pairs): (u64, u64),
    beta_grad: Option<f32>,
) -> Result<PairLoss> {
    job.hooks.check(job.op)?;
    let (b, d) = job.set.queries.as_ref().map_or((0, 0), |q| q.dim());
    let m = job.set.ref_labels.len();
    Ok(PairLoss {
        loss: 0.0,
        nonzero: 0,
        positive_pairs,
        negative_pairs,
        query_grad: Array2::zeros((b, d)),
        ref_grad: (job.ref_grad && !job.refs_are_queries).then(|| Array2::zeros((m, d))),
        beta_grad,
        path: ctx.path(),
        transfers: job.set.imported,
    })
}

/// Whether an anchor has a positive and a negative among the references (PML's triplets).
pub(super) fn has_triplet(job: &Job<'_>) -> bool {
    let set = job.set;
    let mut per_class: std::collections::HashMap<u32, u64> = Default::default();
    for &l in &set.ref_labels {
        *per_class.entry(l).or_default() += 1;
    }
    let m = set.ref_labels.len() as u64;
    (set.labels.iter().zip(&set.self_slots)).any(|(label, &slot)| {
        let same = per_class.get(label).copied().unwrap_or(0);
        let own = set.ref_labels.get(slot as usize) == Some(label);
        same > u64::from(own) && same < m
    })
}
