//! Miners with their results left on the device ([`super::mine_on_device`]): the pair
//! miners of [`PairRule`] select on the device (`gpu.rs`); the other host miners' rows are
//! uploaded once.

use std::hash::Hash;

use crate::context::oom_retry;
use crate::context::Context;
use crate::data::device_output::{output_device, DeviceArray};
use crate::data::inputs::{Imports, MiningSet};
use crate::error::Result;
use crate::hooks::Reporter;
use crate::kernels::pair_select;
use crate::ops::triplets::{Triplets, TripletsOnDevice};
use crate::runtime::memory::Transfers;
use crate::runtime::transfer;

use super::rows::prepare_miner;
use super::{gpu, DeviceMinerConfig, MinerConfig, Pairs};
use super::{
    AllPairsConfig, AngularConfig, BatchEasyHardConfig, BatchHardConfig, DistanceWeightedConfig,
    HdcConfig, MultiSimilarityConfig, PairMarginConfig, Strategy, UniformHistogramConfig,
};

/// The selection of a pair miner ([`PairMinerConfig::rule`]): what
/// [`mine_on_device`](super::mine_on_device) runs on the device, and what the test oracle
/// `reference::pair_select` (feature `reference`) defines.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{PairMarginConfig, PairMinerConfig, PairRule};
/// let rule = PairMarginConfig::default().rule();
/// assert_eq!(rule, PairRule::PairMargin { pos_margin: 0.2, neg_margin: 0.8 });
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PairRule {
    /// Every positive and negative pair ([`all_pairs`](crate::all_pairs)); labels only.
    AllPairs,
    /// [`pair_margin_pairs`](crate::pair_margin_pairs).
    PairMargin {
        /// Positives farther than this are kept (similarities: less similar).
        pos_margin: f32,
        /// Negatives closer than this are kept (similarities: more similar).
        neg_margin: f32,
    },
    /// [`multi_similarity_pairs`](crate::multi_similarity_pairs).
    MultiSimilarity {
        /// The slack ε.
        epsilon: f32,
    },
    /// [`batch_easy_hard_pairs`](crate::batch_easy_hard_pairs).
    EasyHard {
        /// How the positive is picked.
        pos: Strategy,
        /// How the negative is picked.
        neg: Strategy,
        /// Admitted positive values `[lo, hi]`, if limited.
        pos_range: Option<(f32, f32)>,
        /// Admitted negative values `[lo, hi]`, if limited.
        neg_range: Option<(f32, f32)>,
    },
}

impl PairRule {
    /// The kernel's uniform block for this rule (its per-dispatch fields zero).
    fn params(&self, similarity: bool) -> pair_select::Params {
        use pair_select::{rule, strategy, Params};
        let code = |s: Strategy| match s {
            Strategy::Hard => strategy::HARD,
            Strategy::Semihard => strategy::SEMIHARD,
            Strategy::Easy => strategy::EASY,
            Strategy::All => strategy::ALL,
        };
        let base = Params {
            similarity: u32::from(similarity),
            ..Params::default()
        };
        match *self {
            PairRule::AllPairs => Params {
                rule: rule::ALL_PAIRS,
                ..base
            },
            PairRule::PairMargin {
                pos_margin,
                neg_margin,
            } => Params {
                rule: rule::PAIR_MARGIN,
                pos_margin,
                neg_margin,
                ..base
            },
            PairRule::MultiSimilarity { epsilon } => Params {
                rule: rule::MULTI_SIMILARITY,
                pos_margin: epsilon,
                ..base
            },
            PairRule::EasyHard {
                pos,
                neg,
                pos_range,
                neg_range,
            } => Params {
                rule: rule::EASY_HARD,
                pos_strategy: code(pos),
                neg_strategy: code(neg),
                ranged: u32::from(pos_range.is_some()) | (u32::from(neg_range.is_some()) << 1),
                pos_range: pos_range.map_or([0.0; 2], |(lo, hi)| [lo, hi]),
                neg_range: neg_range.map_or([0.0; 2], |(lo, hi)| [lo, hi]),
                ..base
            },
        }
    }
}

/// The config of a pair miner ([`AllPairsConfig`], [`PairMarginConfig`],
/// [`MultiSimilarityConfig`], [`BatchEasyHardConfig`]): [`mine_on_device`](super::mine_on_device) takes any
/// of them. Sealed.
///
/// See the example of [`PairRule`].
pub trait PairMinerConfig: MinerConfig {
    /// The miner's selection.
    fn rule(&self) -> PairRule;
}

impl PairMinerConfig for AllPairsConfig {
    fn rule(&self) -> PairRule {
        PairRule::AllPairs
    }
}

impl PairMinerConfig for PairMarginConfig {
    fn rule(&self) -> PairRule {
        PairRule::PairMargin {
            pos_margin: self.pos_margin,
            neg_margin: self.neg_margin,
        }
    }
}

impl PairMinerConfig for MultiSimilarityConfig {
    fn rule(&self) -> PairRule {
        PairRule::MultiSimilarity {
            epsilon: self.epsilon,
        }
    }
}

impl PairMinerConfig for BatchEasyHardConfig {
    fn rule(&self) -> PairRule {
        PairRule::EasyHard {
            pos: self.pos_strategy,
            neg: self.neg_strategy,
            pos_range: self.allowed_pos_range,
            neg_range: self.allowed_neg_range,
        }
    }
}

/// Pairs left on the device by [`mine_on_device`](super::mine_on_device): PML's `(a1, p, a2, n)` as two
/// `(k, 2)` arrays of `(anchor, reference)` rows.
///
/// See the example of [`mine_on_device`](super::mine_on_device).
#[derive(Debug)]
#[non_exhaustive]
pub struct PairsOnDevice {
    /// `(k₁, 2)`: rows `(anchor, positive)`.
    pub positives: DeviceArray<u32>,
    /// `(k₂, 2)`: rows `(anchor, negative)`.
    pub negatives: DeviceArray<u32>,
    /// Host–device traffic of the call: inputs, labels and offsets up, 8 bytes of counts per
    /// anchor down, never a distance or a pair.
    pub transfers: Transfers,
}

/// A pair miner of [`PairRule`] with its pairs left on the device ([`super::mine_on_device`]).
///
/// The distances are computed on the device in chunks of whole anchor rows under the budget
/// and stay there: `shaders/pair_select.wgsl` counts each anchor's kept pairs (one workgroup
/// per anchor: a reduction for multi-similarity and easy/hard, then an order-preserving
/// workgroup scan over the row), 8 bytes per anchor come back, the host turns them into
/// offsets and sizes the arrays, and the kernel writes the rows (multi-similarity sorts each
/// anchor's rows by value on the device, as the host miner does). When every anchor fits
/// one chunk and the arrays fit beside it, the writing pass reuses the counting pass's
/// distances; otherwise it computes them again in what the arrays leave of the budget. The
/// call waits for the counts and once at its end. Progress covers both passes (`2 · b · m`
/// pairs). Values are assumed finite: where a distance overflows to NaN (inputs near
/// `f32::MAX`), a pick among NaN values may differ from the host miner's.
fn pairs_on_device<L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &impl PairMinerConfig,
) -> Result<PairsOnDevice> {
    let gpu = output_device(gpu::DEVICE_OP, ctx)?;
    let mut imports = Imports::call();
    let set = prepare_miner(ctx, queries, refs, cfg, &mut imports)?;
    let distance = cfg.distance();
    let similarity = distance.is_some_and(|d| d.distance.is_similarity());
    let template = cfg.rule().params(similarity);
    let (mined, mut transfers) = transfer::measure(|| {
        let pairs = set.labels.len() as u64 * set.ref_labels.len() as u64;
        let report = Reporter::new(cfg.hooks(), gpu::DEVICE_OP, 2 * pairs);
        report.check()?;
        oom_retry::retry(ctx, || {
            report.restart();
            gpu.settled(gpu::mine_pairs(ctx, gpu, &set, distance, template, &report))
        })
    });
    transfers.add(set.imported);
    let [positives, negatives] = mined?;
    Ok(PairsOnDevice {
        positives,
        negatives,
        transfers,
    })
}

/// `pairs`, mined on the host, uploaded into two device arrays.
fn uploaded_pairs(op: &'static str, ctx: &Context, pairs: Pairs) -> Result<PairsOnDevice> {
    let gpu = output_device(op, ctx)?;
    let (arrays, mut transfers) = transfer::measure(|| -> Result<_> {
        Ok([
            DeviceArray::from_host(gpu, "mine_on_device::positives", pairs.positives.view())?,
            DeviceArray::from_host(gpu, "mine_on_device::negatives", pairs.negatives.view())?,
        ])
    });
    transfers.add(pairs.transfers);
    let [positives, negatives] = arrays?;
    Ok(PairsOnDevice {
        positives,
        negatives,
        transfers,
    })
}

/// `triplets`, mined on the host, uploaded into one device array.
fn uploaded_triplets(
    op: &'static str,
    ctx: &Context,
    triplets: Triplets,
) -> Result<TripletsOnDevice> {
    let gpu = output_device(op, ctx)?;
    let (array, mut transfers) = transfer::measure(|| {
        DeviceArray::from_host(gpu, "mine_on_device::triplets", triplets.indices.view())
    });
    transfers.add(triplets.transfers);
    Ok(TripletsOnDevice {
        triplets: array?,
        transfers,
    })
}

/// The pair miners that select on the device.
macro_rules! selected_on_device {
    ($($config:ty),*) => {$(
        impl DeviceMinerConfig for $config {
            type DeviceOutput = PairsOnDevice;
            fn run_on_device<L: Hash + Eq + Copy>(
                &self,
                ctx: &Context,
                queries: &MiningSet<'_, L>,
                refs: Option<&MiningSet<'_, L>>,
            ) -> Result<PairsOnDevice> {
                pairs_on_device(ctx, queries, refs, self)
            }
        }
    )*};
}
selected_on_device!(
    AllPairsConfig,
    PairMarginConfig,
    MultiSimilarityConfig,
    BatchEasyHardConfig
);

/// The miners that select on the host, their rows uploaded: `(config, output, upload)`.
macro_rules! uploaded {
    ($(($config:ty, $output:ty, $upload:ident)),*) => {$(
        impl DeviceMinerConfig for $config {
            type DeviceOutput = $output;
            fn run_on_device<L: Hash + Eq + Copy>(
                &self,
                ctx: &Context,
                queries: &MiningSet<'_, L>,
                refs: Option<&MiningSet<'_, L>>,
            ) -> Result<$output> {
                // Refused on a native context before any work.
                output_device(self.op(), ctx)?;
                $upload(self.op(), ctx, self.run(ctx, queries, refs)?)
            }
        }
    )*};
}
uploaded!(
    (BatchHardConfig, TripletsOnDevice, uploaded_triplets),
    (AngularConfig, TripletsOnDevice, uploaded_triplets),
    (DistanceWeightedConfig, TripletsOnDevice, uploaded_triplets),
    (HdcConfig, PairsOnDevice, uploaded_pairs),
    (UniformHistogramConfig, PairsOnDevice, uploaded_pairs)
);
