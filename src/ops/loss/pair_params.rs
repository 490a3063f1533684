//! The pair losses' parameter types ([`super::pair`]), with PML's defaults, and the sealed
//! trait that picks the loss from the type. Each rule's formula is in [`super::pair_rules`].

use std::fmt::Debug;

use crate::metric::{Distance, DistanceConfig};

/// PML's `ContrastiveLoss(pos_margin, neg_margin)` (defaults 0 and 1): positive pairs pay
/// past `pos_margin`, negative pairs inside `neg_margin`.
///
/// # Example
/// ```
/// let rule = wgpu_metric_learning::Contrastive::default();
/// assert_eq!((rule.pos_margin, rule.neg_margin), (0.0, 1.0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Contrastive {
    /// Finite.
    pub pos_margin: f32,
    /// Finite.
    pub neg_margin: f32,
}

impl Default for Contrastive {
    fn default() -> Self {
        Self {
            pos_margin: 0.0,
            neg_margin: 1.0,
        }
    }
}

/// PML's `SignalToNoiseRatioContrastiveLoss(pos_margin, neg_margin)` (defaults 0 and 1):
/// [`Contrastive`] on PML's `SNRDistance`, `var(q − r) / var(q)` over each row's dimensions
/// (the rows normalised first by default). Its [`PairLossConfig`](crate::PairLossConfig)
/// `distance` stands for the SNR distance: it must be squared Euclidean (the SNR's
/// numerator is the squared distance of the centred rows), and its `normalize` is
/// `SNRDistance`'s `normalize_embeddings`.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{Distance, PairLossConfig, SnrContrastive};
/// let cfg = PairLossConfig::<SnrContrastive>::default();
/// assert_eq!((cfg.distance.distance, cfg.distance.normalize), (Distance::SquaredEuclidean, true));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SnrContrastive {
    /// Finite.
    pub pos_margin: f32,
    /// Finite.
    pub neg_margin: f32,
}

impl Default for SnrContrastive {
    fn default() -> Self {
        Self {
            pos_margin: 0.0,
            neg_margin: 1.0,
        }
    }
}

impl SnrContrastive {
    /// The contrastive rule it applies to the SNR distances.
    pub(super) fn contrastive(self) -> Contrastive {
        Contrastive {
            pos_margin: self.pos_margin,
            neg_margin: self.neg_margin,
        }
    }
}

/// PML's `DynamicSoftMarginLoss(min_val, num_bins, momentum)` (defaults −2, 10, 0.01) on
/// PML's `LpDistance()` (Euclidean or squared Euclidean on normalised rows): every triplet's
/// `D_ap − D_an` weighted by its bin's CDF in the histogram PML keeps across calls. Through
/// [`pair_loss`](crate::pair_loss) it is one call of a fresh loss (no earlier histogram);
/// [`dynamic_soft_margin_loss`](crate::dynamic_soft_margin_loss) carries the histogram.
///
/// # Example
/// ```
/// let rule = wgpu_metric_learning::DynamicSoftMargin::default();
/// assert_eq!((rule.min_val, rule.num_bins, rule.momentum), (-2.0, 10, 0.01));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DynamicSoftMargin {
    /// The histogram's lowest value; its bins are `2 |min_val| / num_bins` wide. Finite, not 0.
    pub min_val: f32,
    /// 2 to 4 096.
    pub num_bins: u32,
    /// The current batch's weight in the histogram (1 when the earlier one is all zeros).
    /// Finite.
    pub momentum: f32,
}

impl Default for DynamicSoftMargin {
    fn default() -> Self {
        Self {
            min_val: -2.0,
            num_bins: 10,
            momentum: 0.01,
        }
    }
}

/// PML's `MultiSimilarityLoss(alpha, beta, base)` (defaults 2, 50, 0.5).
///
/// # Example
/// ```
/// let rule = wgpu_metric_learning::MultiSimilarity::default();
/// assert_eq!((rule.alpha, rule.beta, rule.base), (2.0, 50.0, 0.5));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MultiSimilarity {
    /// The positives' exponent weight. Finite, > 0.
    pub alpha: f32,
    /// The negatives' exponent weight. Finite, > 0.
    pub beta: f32,
    /// The shift in both exponents. Finite.
    pub base: f32,
}

impl Default for MultiSimilarity {
    fn default() -> Self {
        Self {
            alpha: 2.0,
            beta: 50.0,
            base: 0.5,
        }
    }
}

/// PML's `SupConLoss(temperature)` (default 0.1).
///
/// # Example
/// ```
/// assert_eq!(wgpu_metric_learning::SupCon::default().temperature, 0.1);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SupCon {
    /// Finite, > 0.
    pub temperature: f32,
}

impl Default for SupCon {
    fn default() -> Self {
        Self { temperature: 0.1 }
    }
}

/// PML's `CircleLoss(m, gamma)` (defaults 0.4 and 80), on cosine similarity only.
///
/// # Example
/// ```
/// let rule = wgpu_metric_learning::Circle::default();
/// assert_eq!((rule.m, rule.gamma), (0.4, 80.0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Circle {
    /// The relaxation margin. Finite.
    pub m: f32,
    /// The scale. Finite, > 0.
    pub gamma: f32,
}

impl Default for Circle {
    fn default() -> Self {
        Self {
            m: 0.4,
            gamma: 80.0,
        }
    }
}

/// PML's `NCALoss(softmax_scale)` (default 1; PML's default distance squared Euclidean on
/// normalised embeddings).
///
/// # Example
/// ```
/// assert_eq!(wgpu_metric_learning::Nca::default().softmax_scale, 1.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Nca {
    /// The factor on every logit. Finite, > 0.
    pub softmax_scale: f32,
}

impl Default for Nca {
    fn default() -> Self {
        Self { softmax_scale: 1.0 }
    }
}

/// PML's `GeneralizedLiftedStructureLoss(neg_margin, pos_margin)` (defaults 1 and 0).
///
/// # Example
/// ```
/// let rule = wgpu_metric_learning::GeneralizedLifted::default();
/// assert_eq!((rule.pos_margin, rule.neg_margin), (0.0, 1.0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GeneralizedLifted {
    /// Finite.
    pub pos_margin: f32,
    /// Finite.
    pub neg_margin: f32,
}

impl Default for GeneralizedLifted {
    fn default() -> Self {
        Self {
            pos_margin: 0.0,
            neg_margin: 1.0,
        }
    }
}

/// PML's `MarginLoss(margin, nu, beta, learn_beta)` over every triplet (defaults 0.2, 0, 1.2,
/// `false`), with one β for every class (PML's `num_classes=None`).
///
/// # Example
/// ```
/// let rule = wgpu_metric_learning::Margin::default();
/// assert_eq!((rule.margin, rule.beta, rule.learn_beta), (0.2, 1.2, false));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Margin {
    /// The margin around β. Finite.
    pub margin: f32,
    /// The weight of β's regulariser `ν β`, added to the loss when β is learnt. Finite.
    pub nu: f32,
    /// The boundary between positive and negative distances. Finite.
    pub beta: f32,
    /// β is a parameter: the loss includes `ν β` and the result carries `∂loss/∂β`
    /// ([`PairLoss::beta_grad`](crate::PairLoss::beta_grad)).
    pub learn_beta: bool,
}

impl Default for Margin {
    fn default() -> Self {
        Self {
            margin: 0.2,
            nu: 0.0,
            beta: 1.2,
            learn_beta: false,
        }
    }
}

/// PML's `FastAPLoss(num_bins)` (default 10), on Euclidean distance of normalised embeddings
/// (PML's default `LpDistance(power=2)`, or `power=1`).
///
/// # Example
/// ```
/// assert_eq!(wgpu_metric_learning::FastAp::default().num_bins, 10);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FastAp {
    /// Histogram bins over `[0, 2^power]`. 1 to 4 096.
    pub num_bins: u32,
}

impl Default for FastAp {
    fn default() -> Self {
        Self { num_bins: 10 }
    }
}

/// PML's `LiftedStructureLoss(neg_margin, pos_margin)` (defaults 1 and 0).
///
/// # Example
/// ```
/// let rule = wgpu_metric_learning::LiftedStructure::default();
/// assert_eq!((rule.pos_margin, rule.neg_margin), (0.0, 1.0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LiftedStructure {
    /// Finite.
    pub pos_margin: f32,
    /// Finite.
    pub neg_margin: f32,
}

impl Default for LiftedStructure {
    fn default() -> Self {
        Self {
            pos_margin: 0.0,
            neg_margin: 1.0,
        }
    }
}

/// PML's `HistogramLoss(n_bins)` (default 100; PML's `delta` is `2 / n_bins`), on cosine
/// similarity, without references (as PML).
///
/// # Example
/// ```
/// assert_eq!(wgpu_metric_learning::Histogram::default().n_bins, 100);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Histogram {
    /// Bins over `[−1, 1]`. 1 to 65 536.
    pub n_bins: u32,
}

impl Default for Histogram {
    fn default() -> Self {
        Self { n_bins: 100 }
    }
}

/// PML's `TupletMarginLoss(margin, scale)` (defaults 5.73° and 64), on cosine similarity.
///
/// # Example
/// ```
/// let rule = wgpu_metric_learning::TupletMargin::default();
/// assert_eq!((rule.margin, rule.scale), (5.73, 64.0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TupletMargin {
    /// The angular margin in degrees. Finite.
    pub margin: f32,
    /// Finite, > 0.
    pub scale: f32,
}

impl Default for TupletMargin {
    fn default() -> Self {
        Self {
            margin: 5.73,
            scale: 64.0,
        }
    }
}

/// PML's `IntraPairVarianceLoss(pos_eps, neg_eps)` (defaults 0.01 and 0.01).
///
/// # Example
/// ```
/// let rule = wgpu_metric_learning::IntraPairVariance::default();
/// assert_eq!((rule.pos_eps, rule.neg_eps), (0.01, 0.01));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IntraPairVariance {
    /// Finite.
    pub pos_eps: f32,
    /// Finite.
    pub neg_eps: f32,
}

impl Default for IntraPairVariance {
    fn default() -> Self {
        Self {
            pos_eps: 0.01,
            neg_eps: 0.01,
        }
    }
}

/// PML's `RankedListLoss(margin, Tn, imbalance, alpha, Tp)`. PML has no default for `margin`
/// and `Tn`; here 0.4 (the paper's) and 1; then PML's: `imbalance` 0.5, `alpha` `None`
/// (`1 + margin / 2`), `Tp` 0. References are the library's extension (PML refuses them):
/// each query's row is then its row of references, `10⁻⁵ m` in the divisors.
///
/// # Example
/// ```
/// let rule = wgpu_metric_learning::RankedList::default();
/// assert_eq!((rule.margin, rule.tn, rule.alpha), (0.4, 1.0, None));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankedList {
    /// The gap between the positives' and the negatives' boundaries. Finite.
    pub margin: f32,
    /// The negatives' weighting temperature. Finite.
    pub tn: f32,
    /// The negatives' share of the loss. 0 to 1.
    pub imbalance: f32,
    /// The negatives' boundary; `None`: `1 + margin / 2`. Finite.
    pub alpha: Option<f32>,
    /// The positives' weighting temperature. Finite.
    pub tp: f32,
}

impl Default for RankedList {
    fn default() -> Self {
        Self {
            margin: 0.4,
            tn: 1.0,
            imbalance: 0.5,
            alpha: None,
            tp: 0.0,
        }
    }
}

/// PML's `ThresholdConsistentMarginLoss(lambda_plus, lambda_minus, margin_plus,
/// margin_minus)` (defaults 1, 1, 0.9, 0.5), on cosine similarity. References are the
/// library's extension: the pairs are then the queries' with the references (PML indexes
/// the embeddings with the references' pairs).
///
/// # Example
/// ```
/// let rule = wgpu_metric_learning::ThresholdConsistentMargin::default();
/// assert_eq!((rule.margin_plus, rule.margin_minus), (0.9, 0.5));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThresholdConsistentMargin {
    /// The positive part's weight. Finite.
    pub lambda_plus: f32,
    /// The negative part's weight. Finite.
    pub lambda_minus: f32,
    /// Positive pairs at or below it pay. Finite.
    pub margin_plus: f32,
    /// Negative pairs at or above it pay. Finite.
    pub margin_minus: f32,
}

impl Default for ThresholdConsistentMargin {
    fn default() -> Self {
        Self {
            lambda_plus: 1.0,
            lambda_minus: 1.0,
            margin_plus: 0.9,
            margin_minus: 0.5,
        }
    }
}

/// PML's `NPairsLoss()` (distance `DotProductSimilarity()`, on normalised embeddings by
/// PML's default), without references (as PML). It has no parameter.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{Distance, NPairs, PairLossConfig};
/// assert_eq!(PairLossConfig::<NPairs>::default().distance.distance, Distance::DotProduct);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NPairs;

/// PML's `InstanceLoss(gamma)` (default 64) on cosine similarity, without references (as
/// PML): each row's cross entropy over the batch's scaled similarities `γ s_ij` (its own
/// column included), the target column being its label's rank among the sorted distinct
/// labels (PML's `torch.unique(labels, return_inverse=True)`), averaged over the rows.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{Distance, Instance, PairLossConfig};
/// let cfg = PairLossConfig::<Instance>::default();
/// assert_eq!((cfg.rule.gamma, cfg.distance.distance), (64.0, Distance::Cosine));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Instance {
    /// The similarities' scale. Positive.
    pub gamma: f32,
}

impl Default for Instance {
    fn default() -> Self {
        Self { gamma: 64.0 }
    }
}

/// PML's `AngularLoss(alpha)` (default 40 degrees) on PML's default `LpDistance()`: for
/// every positive pair `(a, p)`, `log(1 + Σ_n e^{4 tan²α (x̂_a + x̂_p)·r_n − 2 (1 + tan²α)
/// x̂_a·x̂_p})` over the anchor's negatives `n`, averaged over the positive pairs. As in PML,
/// the anchor and the positive are normalised and the negatives are not.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{Angular, Distance, PairLossConfig};
/// let cfg = PairLossConfig::<Angular>::default();
/// assert_eq!((cfg.rule.alpha, cfg.distance.distance), (40.0, Distance::Euclidean));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Angular {
    /// The angle in degrees. Finite, with `4 tan²α` finite in f32.
    pub alpha: f32,
}

impl Default for Angular {
    fn default() -> Self {
        Self { alpha: 40.0 }
    }
}

impl Angular {
    /// `(c₁, c₂) = (4 tan²α, 2 (1 + tan²α))` of the angle in degrees, as PML takes them
    /// (`tan²α` in f64, then used against f32 values).
    pub(super) fn coefficients(self) -> (f32, f32) {
        let t = f64::from(self.alpha).to_radians().tan();
        let sq = t * t;
        ((4.0 * sq) as f32, (2.0 * (1.0 + sq)) as f32)
    }
}

/// PML's `PNPLoss` variants: how an anchor's soft count `R` of negatives ranked above each
/// positive becomes its cost `f(R)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PnpVariant {
    /// `log(1 + R)`.
    Ds,
    /// `(1 + R)^(−α)`, the loss `1 − mean`.
    Dq,
    /// `(1 + R) log(1 + R)`.
    Iu,
    /// `(b R − log(1 + b R)) / b²`.
    Ib,
    /// `R` (PML's default).
    #[default]
    O,
}

/// PML's `PNPLoss(b, alpha, anneal, variant)` (defaults 2, 1, 0.01, `"O"`), on cosine
/// similarity, without references (as PML).
///
/// # Example
/// ```
/// use wgpu_metric_learning::{Pnp, PnpVariant};
/// let rule = Pnp::default();
/// assert_eq!((rule.anneal, rule.variant), (0.01, PnpVariant::O));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pnp {
    /// `Ib`'s factor. Finite, > 0 for `Ib`.
    pub b: f32,
    /// `Dq`'s exponent. Finite.
    pub alpha: f32,
    /// The sigmoid's temperature. Finite, > 0.
    pub anneal: f32,
    /// Default [`PnpVariant::O`].
    pub variant: PnpVariant,
}

impl Default for Pnp {
    fn default() -> Self {
        Self {
            b: 2.0,
            alpha: 1.0,
            anneal: 0.01,
            variant: PnpVariant::O,
        }
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Contrastive {}
    impl Sealed for super::MultiSimilarity {}
    impl Sealed for super::SupCon {}
    impl Sealed for super::Circle {}
    impl Sealed for super::Nca {}
    impl Sealed for super::GeneralizedLifted {}
    impl Sealed for super::Margin {}
    impl Sealed for super::FastAp {}
    impl Sealed for super::LiftedStructure {}
    impl Sealed for super::Histogram {}
    impl Sealed for super::TupletMargin {}
    impl Sealed for super::IntraPairVariance {}
    impl Sealed for super::RankedList {}
    impl Sealed for super::ThresholdConsistentMargin {}
    impl Sealed for super::Pnp {}
    impl Sealed for super::NPairs {}
    impl Sealed for super::Instance {}
    impl Sealed for super::Angular {}
    impl Sealed for super::SnrContrastive {}
    impl Sealed for super::DynamicSoftMargin {}
}

/// A pair loss's rule: [`Contrastive`], [`MultiSimilarity`], [`SupCon`], [`Circle`],
/// [`Nca`], [`GeneralizedLifted`], [`Margin`], [`FastAp`], [`LiftedStructure`],
/// [`Histogram`], [`TupletMargin`], [`IntraPairVariance`], [`RankedList`],
/// [`ThresholdConsistentMargin`], [`Pnp`], [`NPairs`], [`Instance`], [`Angular`],
/// [`SnrContrastive`] or [`DynamicSoftMargin`]. Its type picks the loss
/// [`pair_loss`](crate::pair_loss) computes and the distance
/// [`PairLossConfig`](crate::PairLossConfig) defaults to.
pub trait PairLossRule: sealed::Sealed + Debug + Clone + Copy + PartialEq + Default {
    /// The loss's name in errors (`contrastive_loss`, …).
    #[doc(hidden)]
    fn op(&self) -> &'static str;
    /// PML's default distance for the loss.
    #[doc(hidden)]
    fn default_distance() -> DistanceConfig;
    /// The rule as the driver runs it.
    #[doc(hidden)]
    fn kind(&self) -> Kind;
}

/// The rules, as [`pair_loss`](crate::pair_loss) runs them.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Contrastive(Contrastive),
    MultiSimilarity(MultiSimilarity),
    SupCon(SupCon),
    Circle(Circle),
    Nca(Nca),
    GeneralizedLifted(GeneralizedLifted),
    Margin(Margin),
    FastAp(FastAp),
    LiftedStructure(LiftedStructure),
    Histogram(Histogram),
    TupletMargin(TupletMargin),
    IntraPairVariance(IntraPairVariance),
    RankedList(RankedList),
    ThresholdConsistentMargin(ThresholdConsistentMargin),
    Pnp(Pnp),
    NPairs(NPairs),
    Instance(Instance),
    Angular(Angular),
    SnrContrastive(SnrContrastive),
    DynamicSoftMargin(DynamicSoftMargin),
}

const COSINE: DistanceConfig = DistanceConfig {
    distance: Distance::Cosine,
    normalize: true,
};

/// PML's `LpDistance()`.
const EUCLIDEAN: DistanceConfig = DistanceConfig {
    distance: Distance::Euclidean,
    normalize: true,
};

/// A rule's [`PairLossRule`] implementation: its name in errors, PML's default distance.
macro_rules! rule {
    ($rule:ident, $op:literal, $distance:expr) => {
        impl PairLossRule for $rule {
            fn op(&self) -> &'static str {
                $op
            }
            fn default_distance() -> DistanceConfig {
                $distance
            }
            fn kind(&self) -> Kind {
                Kind::$rule(*self)
            }
        }
    };
}

rule!(Contrastive, "contrastive_loss", EUCLIDEAN);
rule!(MultiSimilarity, "multi_similarity_loss", COSINE);
rule!(SupCon, "supcon_loss", COSINE);
rule!(Circle, "circle_loss", COSINE);
rule!(
    Nca,
    "nca_loss",
    DistanceConfig {
        distance: Distance::SquaredEuclidean,
        normalize: true,
    }
);
rule!(
    GeneralizedLifted,
    "generalized_lifted_structure_loss",
    EUCLIDEAN
);
rule!(Margin, "margin_loss", EUCLIDEAN);
rule!(
    FastAp,
    "fast_ap_loss",
    DistanceConfig {
        distance: Distance::SquaredEuclidean,
        normalize: true,
    }
);
rule!(LiftedStructure, "lifted_structure_loss", EUCLIDEAN);
rule!(Histogram, "histogram_loss", COSINE);
rule!(TupletMargin, "tuplet_margin_loss", COSINE);
rule!(IntraPairVariance, "intra_pair_variance_loss", COSINE);
rule!(RankedList, "ranked_list_loss", EUCLIDEAN);
rule!(
    ThresholdConsistentMargin,
    "threshold_consistent_margin_loss",
    COSINE
);
rule!(Pnp, "pnp_loss", COSINE);
rule!(
    NPairs,
    "n_pairs_loss",
    DistanceConfig {
        distance: Distance::DotProduct,
        normalize: true,
    }
);
rule!(Instance, "instance_loss", COSINE);
rule!(Angular, "angular_loss", EUCLIDEAN);
rule!(
    SnrContrastive,
    "snr_contrastive_loss",
    DistanceConfig {
        distance: Distance::SquaredEuclidean,
        normalize: true,
    }
);
rule!(DynamicSoftMargin, "dynamic_soft_margin_loss", EUCLIDEAN);
