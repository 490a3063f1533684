//! Losses with their gradients, computed without materialising triplets or the full
//! similarity matrix.
//!
//! Every loss here is a function of the distance matrix `D` `(b, m)` between queries and
//! references. Its gradient is first gathered into a weight matrix `W = ∂L/∂D`, anchor block by
//! anchor block (`W` rows overwrite the block's distance rows, so one `(rows, m)` block is all
//! the per-pair memory there is), and then taken through the distance and the L2
//! normalisation by two products with the embeddings ([`backward`]).

mod angular;
mod backward;
mod block;
mod classifier;
mod classifier_anchor;
mod classifier_device;
mod classifier_params;
mod classifier_pass;
mod classifier_sample;
mod classifier_shards;
mod dense_row;
mod driver;
mod dynamic_soft_margin;
mod gpu;
mod info_nce;
mod matryoshka;
mod matryoshka_row;
mod pair;
mod pair_call;
mod pair_device;
mod pair_global;
mod pair_global_linear;
mod pair_params;
mod pair_rules;
mod plan;
mod scratch;
mod triplet;
mod vicreg;

pub use classifier::{
    classifier_loss, classifier_loss_plan, classifier_loss_sharded, classifier_loss_sharded_plan,
    ClassifierLoss, ClassifierLossConfig,
};
pub use classifier_params::{ClassifierKind, ClassifierOptions, MarginGrad};
pub use classifier_sample::ClassSampling;
pub use classifier_shards::{ClassShard, ShardCollectives};
pub use dynamic_soft_margin::{
    dynamic_soft_margin_loss, dynamic_soft_margin_loss_plan, DynamicSoftMarginConfig,
    DynamicSoftMarginLoss,
};
pub use info_nce::{
    multiple_negatives_ranking_loss, multiple_negatives_ranking_loss_plan, ntxent_loss,
    ntxent_loss_plan, InfoNceConfig, InfoNceLoss, MnrlConfig,
};
pub use matryoshka::Matryoshka;
pub use pair::{pair_loss, pair_loss_plan};
pub use pair_call::{PairLoss, PairLossConfig};
pub use pair_params::{
    Angular, Circle, Contrastive, DynamicSoftMargin, FastAp, GeneralizedLifted, Histogram,
    Instance, IntraPairVariance, LiftedStructure, Margin, MultiSimilarity, NPairs, Nca,
    PairLossRule, Pnp, PnpVariant, RankedList, SnrContrastive, SupCon, ThresholdConsistentMargin,
    TupletMargin,
};
pub use triplet::{triplet_margin_loss, triplet_margin_loss_plan, TripletLoss, TripletLossConfig};
pub use vicreg::{vicreg_loss, vicreg_loss_plan, VicRegConfig, VicRegLoss};

use ndarray::{Array2, ArrayView2};

use crate::data::inputs::{host_refs, host_rows};
use crate::metric::DistanceConfig;
use crate::ops::distance::native::normalized;

/// `x` `(n, d)` as the loss's distances and products read it: normalised as torch's
/// `F.normalize` (see [`crate::ops::distance::native`]) when `cfg` normalises, else a copy.
fn hat(x: ArrayView2<'_, f32>, cfg: &DistanceConfig) -> Array2<f32> {
    match cfg.normalizes() {
        true => normalized(x),
        false => x.to_owned(),
    }
}

/// `1 / (1 + e^{−t})` without overflow.
fn sigmoid(t: f64) -> f64 {
    if t >= 0.0 {
        1.0 / (1.0 + (-t).exp())
    } else {
        let e = t.exp();
        e / (1.0 + e)
    }
}

/// PML's `small_val` inside the InfoNCE losses' log: f32's smallest normal number.
const TINY: f64 = f32::MIN_POSITIVE as f64;
