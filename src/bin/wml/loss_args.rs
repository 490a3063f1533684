//! The `wml loss` subcommands' arguments: the labelled inputs every loss reads and each
//! loss's parameters (defaults: PML's, applied in [`super::losses`]).

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

use crate::classifier::ClassifierArgs;

use super::{Common, Metric, TypeArg};

#[derive(Subcommand)]
pub(crate) enum LossCommand {
    /// PML TripletMarginLoss over every valid triplet, or over those --type keeps
    /// (TripletMarginMiner fused with the loss): prints {"loss", "nonzero", "triplets"}.
    TripletMargin(TripletLossArgs),
    /// PML NTXentLoss: every positive pair against its anchor's negatives; prints {"loss",
    /// "positive_pairs", "negative_pairs"}. Default distance: cosine.
    Ntxent(NtXentArgs),
    /// sentence-transformers MultipleNegativesRankingLoss: anchor i's positive is candidate
    /// i, every other candidate a negative (cosine similarity times --scale); prints {"loss",
    /// "positive_pairs", "negative_pairs"}.
    Mnrl(MnrlArgs),
    /// PML ContrastiveLoss: positive pairs past --pos-margin and negative pairs inside
    /// --neg-margin, each group averaged over its nonzero pairs; prints {"loss", "nonzero",
    /// "positive_pairs", "negative_pairs"}. Default distance: Euclidean, normalised.
    Contrastive(ContrastiveArgs),
    /// PML MultiSimilarityLoss, averaged over the batch; prints as contrastive does. Default
    /// distance: cosine.
    MultiSimilarity(MultiSimilarityArgs),
    /// PML SupConLoss, averaged over the anchors with a positive loss; prints as contrastive
    /// does. Default distance: cosine.
    Supcon(SupConArgs),
    /// PML CircleLoss (cosine only), averaged over the anchors with a positive loss; prints
    /// as contrastive does.
    Circle(CircleArgs),
    /// PML NCALoss, averaged over the anchors with a positive; prints as contrastive does.
    /// Default distance: squared Euclidean, normalised.
    Nca(NcaArgs),
    /// PML GeneralizedLiftedStructureLoss, averaged over the batch; prints as contrastive
    /// does. Default distance: Euclidean, normalised.
    GeneralizedLifted(GeneralizedLiftedArgs),
    /// PML MarginLoss over every triplet (one β); prints as contrastive does, and "beta_grad"
    /// with --learn-beta. Default distance: Euclidean, normalised.
    Margin(MarginArgs),
    /// PML FastAPLoss (Euclidean or squared Euclidean on normalised rows), averaged over the
    /// anchors with a positive; prints as contrastive does. Default distance: squared
    /// Euclidean, normalised.
    FastAp(FastApArgs),
    /// PML LiftedStructureLoss, averaged over the positive pairs; prints as contrastive does.
    /// Default distance: Euclidean, normalised.
    LiftedStructure(LiftedArgs),
    /// PML HistogramLoss (cosine, no references); prints as contrastive does ("nonzero": the
    /// pairs binned).
    Histogram(HistogramArgs),
    /// PML TupletMarginLoss (cosine), averaged over the positive pairs; prints as contrastive
    /// does.
    TupletMargin(TupletArgs),
    /// PML IntraPairVarianceLoss; prints as contrastive does. Default distance: cosine.
    IntraPairVariance(IntraPairVarianceArgs),
    /// PML RankedListLoss, averaged over the batch; prints as contrastive does. Default
    /// distance: Euclidean, normalised.
    RankedList(RankedListArgs),
    /// PML ThresholdConsistentMarginLoss (cosine); prints as contrastive does ("nonzero": the
    /// pairs past their margins).
    #[command(alias = "threshold-consistent-margin")]
    Tcm(TcmArgs),
    /// PML PNPLoss (cosine, no references), averaged over the anchors with a positive; prints
    /// as contrastive does.
    Pnp(PnpArgs),
    /// PML NPairsLoss (no references), averaged over its pairs (each label's first row with
    /// its second); prints as contrastive does. Default distance: dot product, normalised.
    NPairs(NPairsArgs),
    /// PML InstanceLoss (cosine, no references), averaged over the rows; prints as
    /// contrastive does.
    Instance(InstanceArgs),
    /// PML AngularLoss (Euclidean on normalised rows: its angle only), averaged over the
    /// positive pairs; prints as contrastive does.
    Angular(AngularArgs),
    /// PML VICRegLoss of two views (no labels); prints {"loss", "invariance", "variance",
    /// "covariance"}.
    Vicreg(VicRegArgs),
    /// PML SignalToNoiseRatioContrastiveLoss (the SNR distance; --metric's normalisation is
    /// SNRDistance's); prints as contrastive does.
    SnrContrastive(SnrContrastiveArgs),
    /// PML DynamicSoftMarginLoss, one call of a fresh loss (no earlier histogram); prints as
    /// contrastive does ("nonzero": the triplets).
    DynamicSoftMargin(DynamicSoftMarginArgs),
    /// PML ArcFaceLoss with its weights W (d, classes); prints {"loss", "count"} and writes
    /// --grad-out and --weight-grad-out.
    #[command(name = "arcface")]
    ArcFace(ClassifierArgs),
    /// PML SubCenterArcFaceLoss, W (d, classes · sub-centers); prints as arcface does.
    #[command(name = "sub-center-arcface")]
    SubCenterArcFace(ClassifierArgs),
    /// PML CosFaceLoss, W (d, classes); prints as arcface does.
    #[command(name = "cosface")]
    CosFace(ClassifierArgs),
    /// PML LargeMarginSoftmaxLoss, W (d, classes); prints as arcface does.
    LargeMarginSoftmax(ClassifierArgs),
    /// PML SphereFaceLoss, W (d, classes); prints as arcface does.
    #[command(name = "sphereface")]
    SphereFace(ClassifierArgs),
    /// PML NormalizedSoftmaxLoss, W (d, classes); prints as arcface does.
    NormalizedSoftmax(ClassifierArgs),
    /// PML ProxyNCALoss, proxies (classes, d); prints as arcface does ("count": the rows whose
    /// probability is not 0).
    ProxyNca(ClassifierArgs),
    /// PML ProxyAnchorLoss, proxies (classes, d); prints as arcface does ("count": the
    /// classes with a row in the batch).
    ProxyAnchor(ClassifierArgs),
    /// PML SoftTripleLoss, fc (d, classes · centers-per-class); prints as arcface does.
    SoftTriple(ClassifierArgs),
}

/// The labelled inputs and gradient outputs of the label-based losses.
#[derive(Args)]
pub(crate) struct LossInputs {
    /// Embeddings of the batch, (b, d).
    #[arg(long)]
    pub(crate) embeddings: PathBuf,
    /// Labels of the batch, (b,).
    #[arg(long)]
    pub(crate) labels: PathBuf,
    /// Embeddings of separate references (a memory bank's rows), (m, d) (with --ref-labels);
    /// without them the batch is its own reference set, a row never its own positive.
    #[arg(long, requires = "ref_labels")]
    pub(crate) ref_embeddings: Option<PathBuf>,
    /// Labels of the separate references, (m,) (with --ref-embeddings).
    #[arg(long, requires = "ref_embeddings")]
    pub(crate) ref_labels: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) metric: Metric,
    /// Output (b, d) float32 array: the gradient of the loss with respect to --embeddings.
    #[arg(long)]
    pub(crate) grad_out: PathBuf,
    /// Output (m, d) float32 array: the gradient with respect to --ref-embeddings.
    #[arg(long, requires = "ref_embeddings")]
    pub(crate) ref_grad_out: Option<PathBuf>,
}

#[derive(Args)]
pub(crate) struct TripletLossArgs {
    #[command(flatten)]
    pub(crate) inputs: LossInputs,
    /// The loss's margin. Default 0.05.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) margin: Option<f32>,
    /// Only the triplets TripletMarginMiner keeps, with this type_of_triplets.
    #[arg(long = "type", value_enum)]
    pub(crate) kind: Option<TypeArg>,
    /// The miner's margin (with --type). Default 0.2.
    #[arg(long, allow_negative_numbers = true, requires = "kind")]
    pub(crate) miner_margin: Option<f32>,
    /// softplus instead of relu (PML smooth_loss=True).
    #[arg(long)]
    pub(crate) smooth_loss: bool,
    /// A negative's distance is the smaller of d(a, n) and d(p, n), between the references'
    /// rows; for a similarity, the larger (PML swap=True).
    #[arg(long)]
    pub(crate) swap: bool,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Args)]
pub(crate) struct NtXentArgs {
    #[command(flatten)]
    pub(crate) inputs: LossInputs,
    /// The temperature. Default 0.07.
    #[arg(long)]
    pub(crate) temperature: Option<f32>,
    #[command(flatten)]
    pub(crate) matryoshka: MatryoshkaArgs,
    #[command(flatten)]
    pub(crate) common: Common,
}

/// sentence-transformers' `MatryoshkaLoss` around an InfoNCE loss.
#[derive(Args)]
pub(crate) struct MatryoshkaArgs {
    /// Also take the loss on the embeddings cut to these widths (comma-separated) and print
    /// the weighted sum, with each width's loss as "matryoshka_losses".
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub(crate) matryoshka_dims: Option<Vec<usize>>,
    /// One weight per width (comma-separated). Default 1 each.
    #[arg(
        long,
        value_delimiter = ',',
        num_args = 1..,
        allow_negative_numbers = true,
        requires = "matryoshka_dims"
    )]
    pub(crate) matryoshka_weights: Option<Vec<f32>>,
}

#[derive(Args)]
pub(crate) struct ContrastiveArgs {
    #[command(flatten)]
    pub(crate) inputs: LossInputs,
    /// Positive pairs pay past this. Default 0.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) pos_margin: Option<f32>,
    /// Negative pairs pay inside this. Default 1.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) neg_margin: Option<f32>,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Args)]
pub(crate) struct MultiSimilarityArgs {
    #[command(flatten)]
    pub(crate) inputs: LossInputs,
    /// The positives' exponent weight. Default 2.
    #[arg(long)]
    pub(crate) alpha: Option<f32>,
    /// The negatives' exponent weight. Default 50.
    #[arg(long)]
    pub(crate) beta: Option<f32>,
    /// The shift in both exponents. Default 0.5.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) base: Option<f32>,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Args)]
pub(crate) struct SupConArgs {
    #[command(flatten)]
    pub(crate) inputs: LossInputs,
    /// The temperature. Default 0.1.
    #[arg(long)]
    pub(crate) temperature: Option<f32>,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Args)]
pub(crate) struct CircleArgs {
    #[command(flatten)]
    pub(crate) inputs: LossInputs,
    /// The relaxation margin. Default 0.4.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) m: Option<f32>,
    /// The scale. Default 80.
    #[arg(long)]
    pub(crate) gamma: Option<f32>,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Args)]
pub(crate) struct NcaArgs {
    #[command(flatten)]
    pub(crate) inputs: LossInputs,
    /// The factor on every logit. Default 1.
    #[arg(long)]
    pub(crate) softmax_scale: Option<f32>,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Args)]
pub(crate) struct GeneralizedLiftedArgs {
    #[command(flatten)]
    pub(crate) inputs: LossInputs,
    /// Default 0.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) pos_margin: Option<f32>,
    /// Default 1.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) neg_margin: Option<f32>,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Args)]
pub(crate) struct MarginArgs {
    #[command(flatten)]
    pub(crate) inputs: LossInputs,
    /// The margin around β. Default 0.2.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) margin: Option<f32>,
    /// β's regulariser weight, with --learn-beta. Default 0.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) nu: Option<f32>,
    /// The boundary between positive and negative distances. Default 1.2.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) beta: Option<f32>,
    /// β is learnt: add ν β to the loss and print "beta_grad".
    #[arg(long)]
    pub(crate) learn_beta: bool,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Args)]
pub(crate) struct FastApArgs {
    #[command(flatten)]
    pub(crate) inputs: LossInputs,
    /// Histogram bins. Default 10.
    #[arg(long)]
    pub(crate) num_bins: Option<u32>,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Args)]
pub(crate) struct MnrlArgs {
    /// Anchors, (b, d).
    #[arg(long)]
    pub(crate) anchors: PathBuf,
    /// Candidates, (c, d), c ≥ b: candidate i is anchor i's positive, the rest negatives.
    #[arg(long)]
    pub(crate) candidates: PathBuf,
    /// The scale on cosine similarities. Default 20.
    #[arg(long)]
    pub(crate) scale: Option<f32>,
    #[command(flatten)]
    pub(crate) matryoshka: MatryoshkaArgs,
    /// Output (b, d) float32 array: the gradient with respect to --anchors.
    #[arg(long)]
    pub(crate) grad_out: PathBuf,
    /// Output (c, d) float32 array: the gradient with respect to --candidates.
    #[arg(long)]
    pub(crate) candidates_grad_out: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Args)]
pub(crate) struct LiftedArgs {
    #[command(flatten)]
    pub(crate) inputs: LossInputs,
    /// Default 0.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) pos_margin: Option<f32>,
    /// Default 1.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) neg_margin: Option<f32>,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Args)]
pub(crate) struct HistogramArgs {
    #[command(flatten)]
    pub(crate) inputs: LossInputs,
    /// Bins over [-1, 1]. Default 100.
    #[arg(long)]
    pub(crate) n_bins: Option<u32>,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Args)]
pub(crate) struct TupletArgs {
    #[command(flatten)]
    pub(crate) inputs: LossInputs,
    /// The angular margin in degrees. Default 5.73.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) margin: Option<f32>,
    /// Default 64.
    #[arg(long)]
    pub(crate) scale: Option<f32>,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Args)]
pub(crate) struct IntraPairVarianceArgs {
    #[command(flatten)]
    pub(crate) inputs: LossInputs,
    /// Default 0.01.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) pos_eps: Option<f32>,
    /// Default 0.01.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) neg_eps: Option<f32>,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Args)]
pub(crate) struct RankedListArgs {
    #[command(flatten)]
    pub(crate) inputs: LossInputs,
    /// The gap between the positives' and negatives' boundaries (PML requires it).
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) margin: f32,
    /// The negatives' temperature (PML's Tn; required).
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) tn: f32,
    /// The negatives' share, 0 to 1. Default 0.5.
    #[arg(long)]
    pub(crate) imbalance: Option<f32>,
    /// The negatives' boundary. Default 1 + margin / 2.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) alpha: Option<f32>,
    /// The positives' temperature (PML's Tp). Default 0.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) tp: Option<f32>,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Args)]
pub(crate) struct TcmArgs {
    #[command(flatten)]
    pub(crate) inputs: LossInputs,
    /// Default 1.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) lambda_plus: Option<f32>,
    /// Default 1.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) lambda_minus: Option<f32>,
    /// Default 0.9.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) margin_plus: Option<f32>,
    /// Default 0.5.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) margin_minus: Option<f32>,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Args)]
pub(crate) struct PnpArgs {
    #[command(flatten)]
    pub(crate) inputs: LossInputs,
    /// Ib's factor. Default 2.
    #[arg(long)]
    pub(crate) b: Option<f32>,
    /// Dq's exponent. Default 1.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) alpha: Option<f32>,
    /// The sigmoid's temperature. Default 0.01.
    #[arg(long)]
    pub(crate) anneal: Option<f32>,
    /// PML's variant. Default o.
    #[arg(long, value_enum)]
    pub(crate) variant: Option<PnpVariantArg>,
    #[command(flatten)]
    pub(crate) common: Common,
}

/// PML's PNPLoss variants.
#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum PnpVariantArg {
    Ds,
    Dq,
    Iu,
    Ib,
    O,
}

#[derive(Args)]
pub(crate) struct NPairsArgs {
    #[command(flatten)]
    pub(crate) inputs: LossInputs,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Args)]
pub(crate) struct InstanceArgs {
    #[command(flatten)]
    pub(crate) inputs: LossInputs,
    /// The similarities' scale. Default 64.
    #[arg(long)]
    pub(crate) gamma: Option<f32>,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Args)]
pub(crate) struct AngularArgs {
    #[command(flatten)]
    pub(crate) inputs: LossInputs,
    /// The angle in degrees. Default 40.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) alpha: Option<f32>,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Args)]
pub(crate) struct VicRegArgs {
    /// The first view, (n, d).
    #[arg(long)]
    pub(crate) embeddings: PathBuf,
    /// The second view, (n, d); default: the first (the invariance is then 0).
    #[arg(long)]
    pub(crate) ref_embeddings: Option<PathBuf>,
    /// The invariance term's weight. Default 25.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) invariance_lambda: Option<f32>,
    /// The variance terms' weight. Default 25.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) variance_mu: Option<f32>,
    /// The covariance terms' weight. Default 1.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) covariance_v: Option<f32>,
    /// Added to each variance under the square root. Default 1e-4.
    #[arg(long)]
    pub(crate) eps: Option<f32>,
    /// Output (n, d) float32 array: the gradient with respect to --embeddings.
    #[arg(long)]
    pub(crate) grad_out: PathBuf,
    /// Output (n, d) float32 array: the gradient with respect to --ref-embeddings.
    #[arg(long)]
    pub(crate) ref_grad_out: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Args)]
pub(crate) struct SnrContrastiveArgs {
    #[command(flatten)]
    pub(crate) inputs: LossInputs,
    /// Default 0.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) pos_margin: Option<f32>,
    /// Default 1.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) neg_margin: Option<f32>,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Args)]
pub(crate) struct DynamicSoftMarginArgs {
    #[command(flatten)]
    pub(crate) inputs: LossInputs,
    /// The histogram's lowest value. Default -2.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) min_val: Option<f32>,
    /// Default 10.
    #[arg(long)]
    pub(crate) num_bins: Option<u32>,
    /// Default 0.01 (a fresh loss's first call uses 1).
    #[arg(long)]
    pub(crate) momentum: Option<f32>,
    #[command(flatten)]
    pub(crate) common: Common,
}
