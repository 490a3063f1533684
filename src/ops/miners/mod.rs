//! The miners, one front door for all of them: [`mine`] (results on the host), [`mine_plan`]
//! (what a call would take) and [`mine_on_device`] (results left on the device), the config's
//! type picking the miner and its output. PML's miner names stay as thin aliases
//! ([`all_pairs`], [`pair_margin_pairs`], …).
//!
//! The host miners' cost is the distance matrix (`O(b·m·d)`), which comes from the distance
//! tile (GPU or native) in blocks of whole anchor rows (`rows.rs`); each miner's choice is then
//! one `O(m)` pass over a row on the host, so host memory is bounded by one block (64 MiB of
//! distances) whatever `b`. Ties are broken by the lowest reference index everywhere. The four
//! pair miners of [`PairRule`] and the triplet miner also select on the device
//! (`on_device.rs`, `gpu.rs`); the others' device results are their host results uploaded.

use std::hash::Hash;

use ndarray::Array2;

use crate::context::plan::Plan;
use crate::context::{ComputePath, Context};
use crate::data::inputs::{MiningSet, SelfExclusion};
use crate::error::Result;
use crate::hooks::Hooks;
use crate::metric::DistanceConfig;
use crate::ops::triplets::{
    mine_triplets, mine_triplets_on_device, mine_triplets_plan, TripletConfig, TripletRule,
    Triplets, TripletsOnDevice,
};
use crate::runtime::memory::Transfers;

/// In a miner config's `MinerConfig` impl: its `Output` and the `run` that calls its
/// PML-named function (defined before the submodules, which use it).
macro_rules! runs {
    ($output:ty, $miner:ident) => {
        type Output = $output;
        fn run<L: std::hash::Hash + Eq + Copy>(
            &self,
            ctx: &crate::context::Context,
            queries: &crate::data::inputs::MiningSet<'_, L>,
            refs: Option<&crate::data::inputs::MiningSet<'_, L>>,
        ) -> crate::error::Result<$output> {
            $miner(ctx, queries, refs, self)
        }
    };
}

mod all_pair_values;
mod angular;
mod distance_weighted;
mod easy_hard;
mod gpu;
mod hdc;
mod on_device;
mod pairs;
mod plan;
mod rows;
mod uniform_histogram;

pub use angular::{angular_triplets, AngularConfig};
pub use distance_weighted::{distance_weighted_triplets, DistanceWeightedConfig};
pub use easy_hard::{
    batch_easy_hard_pairs, batch_hard_triplets, BatchEasyHardConfig, BatchHardConfig, Strategy,
};
pub use hdc::{hdc_pairs, HdcConfig};
pub use on_device::{PairMinerConfig, PairRule, PairsOnDevice};
pub use pairs::{
    all_pairs, multi_similarity_pairs, pair_margin_pairs, AllPairsConfig, MultiSimilarityConfig,
    PairMarginConfig,
};
pub use uniform_histogram::{uniform_histogram_pairs, UniformHistogramConfig};

/// Positive and negative pairs, PML's `(a1, p, a2, n)` as two `(k, 2)` arrays.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{all_pairs, Context, MiningSet};
/// let labels = ndarray::array![0, 0, 1];
/// let set = MiningSet::from_labels(&labels);
/// let p = all_pairs(&Context::native_cpu(None), &set, None, &Default::default())?;
/// assert_eq!(p.positives, ndarray::array![[0u32, 1], [1, 0]]);
/// assert_eq!(p.negatives.nrows(), 4); // (0,2), (1,2), (2,0), (2,1)
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Pairs {
    /// `(k₁, 2)`: rows `(anchor, positive)`.
    pub positives: Array2<u32>,
    /// `(k₂, 2)`: rows `(anchor, negative)`.
    pub negatives: Array2<u32>,
    /// Where the distances were computed.
    pub path: ComputePath,
    /// Host–device traffic of the call (zero on the native path).
    pub transfers: Transfers,
}

mod sealed {
    /// Only this crate's miner configs implement [`super::MinerConfig`].
    pub trait Sealed {}
}

/// The config of a miner: [`TripletConfig`], [`AllPairsConfig`], [`PairMarginConfig`],
/// [`MultiSimilarityConfig`], [`BatchEasyHardConfig`], [`BatchHardConfig`],
/// [`AngularConfig`], [`HdcConfig`], [`DistanceWeightedConfig`] or
/// [`UniformHistogramConfig`]. Its type picks the miner [`mine`] runs and its
/// [`Output`](MinerConfig::Output) ([`Pairs`] or [`Triplets`]). Sealed; the hidden methods
/// are the crate's.
pub trait MinerConfig: sealed::Sealed {
    /// What the miner returns on the host: [`Pairs`] or [`Triplets`].
    type Output;
    /// The miner's name in errors.
    #[doc(hidden)]
    fn op(&self) -> &'static str;
    /// The self-exclusion the miner resolves.
    #[doc(hidden)]
    fn self_exclusion(&self) -> &SelfExclusion;
    /// The distance it compares by, or `None` when it needs labels only.
    #[doc(hidden)]
    fn distance(&self) -> Option<&DistanceConfig>;
    /// `Err` for settings the miner refuses, before any input is looked at.
    #[doc(hidden)]
    fn check(&self) -> Result<()>;
    /// Its progress and cancellation hooks.
    #[doc(hidden)]
    fn hooks(&self) -> &Hooks;
    /// Runs the miner (what [`mine`] calls).
    #[doc(hidden)]
    fn run<L: Hash + Eq + Copy>(
        &self,
        ctx: &Context,
        queries: &MiningSet<'_, L>,
        refs: Option<&MiningSet<'_, L>>,
    ) -> Result<Self::Output>;
    /// Plans the miner (what [`mine_plan`] calls): by default the row driver's blocks.
    #[doc(hidden)]
    fn plan<L: Hash + Eq + Copy>(
        &self,
        ctx: &Context,
        queries: &MiningSet<'_, L>,
        refs: Option<&MiningSet<'_, L>>,
    ) -> Result<Plan>
    where
        Self: Sized,
    {
        plan::rows_plan(ctx, queries, refs, self)
    }
}

/// A [`MinerConfig`] whose miner can leave its result on the device: every one.
/// [`DeviceOutput`](DeviceMinerConfig::DeviceOutput) is [`PairsOnDevice`] or
/// [`TripletsOnDevice`]. Sealed.
pub trait DeviceMinerConfig: MinerConfig {
    /// What the miner leaves on the device.
    type DeviceOutput;
    /// Runs the miner into device arrays (what [`mine_on_device`] calls).
    #[doc(hidden)]
    fn run_on_device<L: Hash + Eq + Copy>(
        &self,
        ctx: &Context,
        queries: &MiningSet<'_, L>,
        refs: Option<&MiningSet<'_, L>>,
    ) -> Result<Self::DeviceOutput>;
}

/// Mines `queries` (anchors) against `refs` (default: the queries) with the miner `cfg`
/// configures, PML's semantics: pairs or triplets as `cfg`'s type says. Same as the miner's
/// PML-named function ([`pair_margin_pairs`] for a [`PairMarginConfig`], [`mine_triplets`]
/// for a [`TripletConfig`], …), whose docs give each rule.
///
/// Cost: the `(b, m)` distance matrix in blocks under the budget, then one pass per row.
///
/// # Errors
/// [`Error::InvalidParameter`](crate::Error::InvalidParameter) for settings the miner refuses;
/// as the inputs' checks ([`MiningSet`]) for bad inputs; [`Error::Cancelled`](crate::Error)
/// from its hooks.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{mine, Context, MiningSet, PairMarginConfig, TripletConfig};
/// let x = ndarray::array![[1.0f32, 0.0], [0.0, 1.0], [1.0, 0.1]];
/// let y = ndarray::array![0, 0, 1];
/// let (ctx, set) = (Context::native_cpu(None), MiningSet::new(&x, &y));
/// let pairs = mine(&ctx, &set, None, &PairMarginConfig::default())?;
/// assert_eq!(pairs.negatives, ndarray::array![[0u32, 2], [2, 0]]);
/// let triplets = mine(&ctx, &set, None, &TripletConfig::default())?;
/// assert_eq!(triplets.len(), 2);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn mine<L: Hash + Eq + Copy, C: MinerConfig>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &C,
) -> Result<C::Output> {
    cfg.run(ctx, queries, refs)
}

/// How [`mine`] would run with these arguments on `ctx`, computing nothing: the blocks of
/// whole anchor rows of the distance matrix the host miners walk (at most 64 MiB of distances
/// on the host; all pairs, from labels alone, holds nothing), or [`mine_triplets_plan`] for a
/// [`TripletConfig`].
///
/// # Errors
/// As [`mine`] for bad inputs and settings; [`Error::OverBudget`](crate::Error) /
/// [`Error::DeviceLimit`](crate::Error) when not even one row fits.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{mine_plan, Context, MiningSet, PairMarginConfig};
/// let x = ndarray::Array2::<f32>::zeros((512, 64));
/// let y = ndarray::Array1::from_shape_fn(512, |i| i % 8);
/// let cfg = PairMarginConfig::default();
/// let plan = mine_plan(&Context::native_cpu(None), &MiningSet::new(&x, &y), None, &cfg)?;
/// assert_eq!(plan.rows, 512); // one block of rows: 512 × 512 distances fit 64 MiB
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn mine_plan<L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &impl MinerConfig,
) -> Result<Plan> {
    cfg.plan(ctx, queries, refs)
}

/// [`mine`] with its result left on the device, for a loss that gathers it there: the same
/// rows in the same order, in [`DeviceArray`](crate::DeviceArray)s sized exactly. The four
/// pair miners of [`PairRule`] and the triplet miner select on the device (only counts come
/// back; see [`mine_triplets_on_device`] and [`PairsOnDevice`]); the others select on the
/// host as [`mine`] does and upload their rows once.
///
/// # Errors
/// As [`mine`]; [`Error::InvalidParameter`](crate::Error) on a native context (results on the
/// device need a wgpu context); [`Error::BudgetExceeded`](crate::Error) or
/// [`Error::DeviceLimit`](crate::Error) when an array does not fit.
///
/// # Example
/// ```no_run
/// use wgpu_metric_learning::{mine, mine_on_device, Context, ContextConfig, MiningSet, PairMarginConfig};
/// let ctx = Context::new(&ContextConfig::default())?;
/// let x = ndarray::Array2::from_shape_fn((64, 8), |(i, j)| ((i * 5 + j) % 13) as f32);
/// let y = ndarray::Array1::from_shape_fn(64, |i| i % 4);
/// let (batch, cfg) = (MiningSet::new(&x, &y), PairMarginConfig::default());
/// let mined = mine_on_device(&ctx, &batch, None, &cfg)?;
/// assert_eq!(mined.positives.to_host(&ctx)?, mine(&ctx, &batch, None, &cfg)?.positives);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn mine_on_device<L: Hash + Eq + Copy, C: DeviceMinerConfig>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &C,
) -> Result<C::DeviceOutput> {
    cfg.run_on_device(ctx, queries, refs)
}

impl sealed::Sealed for TripletConfig {}
impl MinerConfig for TripletConfig {
    runs!(Triplets, mine_triplets);
    fn op(&self) -> &'static str {
        "mine_triplets"
    }
    fn self_exclusion(&self) -> &SelfExclusion {
        &self.self_exclusion
    }
    fn distance(&self) -> Option<&DistanceConfig> {
        match self.rule {
            TripletRule::AllValid => None,
            TripletRule::Margin { .. } => Some(&self.distance),
        }
    }
    fn check(&self) -> Result<()> {
        // mine_triplets checks its own settings, with its inputs.
        Ok(())
    }
    fn hooks(&self) -> &Hooks {
        &self.hooks
    }
    fn plan<L: Hash + Eq + Copy>(
        &self,
        ctx: &Context,
        queries: &MiningSet<'_, L>,
        refs: Option<&MiningSet<'_, L>>,
    ) -> Result<Plan> {
        mine_triplets_plan(ctx, queries, refs, self)
    }
}

impl DeviceMinerConfig for TripletConfig {
    type DeviceOutput = TripletsOnDevice;
    fn run_on_device<L: Hash + Eq + Copy>(
        &self,
        ctx: &Context,
        queries: &MiningSet<'_, L>,
        refs: Option<&MiningSet<'_, L>>,
    ) -> Result<TripletsOnDevice> {
        mine_triplets_on_device(ctx, queries, refs, self)
    }
}
