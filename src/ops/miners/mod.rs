//! PML's pair and per-anchor miners: all pairs, `PairMarginMiner`, `MultiSimilarityMiner`,
//! `BatchHardMiner` and `BatchEasyHardMiner`; in submodules `AngularMiner`, `HDCMiner`,
//! `DistanceWeightedMiner` and `UniformHistogramMiner`.
//!
//! Their cost is the distance matrix (`O(b·m·d)`), which comes from the distance tile (GPU or
//! native) in blocks of whole anchor rows; each miner's choice is then one `O(m)` pass over a
//! row on the host, so host memory is bounded by one block (64 MiB of distances) whatever `b`.
//! Ties are broken by the lowest reference index everywhere.

use std::hash::Hash;

use ndarray::{Array2, ArrayView1, ArrayView2};

use crate::context::oom_retry;
use crate::context::plan::Plan;
use crate::context::{ComputePath, Context};
use crate::data::device_output::{output_device, DeviceArray};
use crate::data::inputs::{prepare, Imports, Labelled, MiningSet, SelfExclusion};
use crate::error::{Error, Result};
use crate::hooks::{Hooks, Reporter};
use crate::metric::{Distance, DistanceConfig};
use crate::ops::distance::{for_each_row_block, row_plan, Job};
use crate::ops::triplets::Triplets;
use crate::runtime::memory::Transfers;
use crate::runtime::transfer;
use crate::validate;

mod all_pair_values;
mod angular;
mod distance_weighted;
mod gpu;
mod hdc;
mod uniform_histogram;

pub use angular::{angular_triplets, AngularConfig};
pub use distance_weighted::{distance_weighted_triplets, DistanceWeightedConfig};
pub use hdc::{hdc_pairs, HdcConfig};
pub use uniform_histogram::{uniform_histogram_pairs, UniformHistogramConfig};

/// Distances per host block: 16 Mi floats = 64 MiB.
const BLOCK_FLOATS: usize = 1 << 24;

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

/// One anchor's view of the references: its distance row (if the miner uses distances) and
/// its ascending positive and negative reference indices.
struct Row<'r> {
    anchor: u32,
    values: Option<ArrayView1<'r, f32>>,
    positives: &'r [u32],
    negatives: &'r [u32],
}

impl Row<'_> {
    fn value(&self, r: u32) -> f32 {
        self.values.map_or(0.0, |v| v[r as usize])
    }
}

/// Calls `f` for every anchor in ascending order, reporting each anchor's `m` pairs and
/// checking for cancellation between blocks of rows.
fn for_each_row(
    op: &'static str,
    ctx: &Context,
    set: &Labelled<'_>,
    distance: &DistanceConfig,
    hooks: &Hooks,
    f: &mut dyn FnMut(&Row<'_>),
) -> Result<Transfers> {
    let pairs = set.labels.len() as u64 * set.ref_labels.len() as u64;
    let report = Reporter::new(hooks, op, pairs);
    let mut transfers = for_each_row_reporting(op, ctx, set, distance, &report, f)?;
    transfers.add(set.imported);
    Ok(transfers)
}

/// [`for_each_row`] reporting to `report` (`b · m` pairs): one pass of a miner that walks
/// the matrix more than once, each pass a [`Reporter::part`] of the call's progress. Its
/// transfers leave out the import of device-buffer inputs (`set.imported`, once per call).
fn for_each_row_reporting(
    op: &'static str,
    ctx: &Context,
    set: &Labelled<'_>,
    distance: &DistanceConfig,
    report: &Reporter<'_>,
    f: &mut dyn FnMut(&Row<'_>),
) -> Result<Transfers> {
    let (visited, transfers) = transfer::measure(|| -> Result<()> {
        let (b, m) = (set.labels.len(), set.ref_labels.len());
        let (mut positives, mut negatives) = (Vec::with_capacity(m), Vec::with_capacity(m));
        let mut visit = |a: usize, values: Option<ArrayView1<'_, f32>>| {
            set.lists_of(a, &mut positives, &mut negatives);
            f(&Row {
                anchor: a as u32,
                values,
                positives: &positives,
                negatives: &negatives,
            });
        };
        let rows = (BLOCK_FLOATS / m.max(1)).max(1);
        let (Some(queries), Some(refs)) = (set.queries, set.refs) else {
            for a0 in (0..b).step_by(rows) {
                report.check()?;
                let a1 = (a0 + rows).min(b);
                (a0..a1).for_each(|a| visit(a, None));
                report.add(((a1 - a0) * m) as u64);
            }
            return Ok(());
        };
        let mut on_block = |r0: usize, block: ArrayView2<'_, f32>| {
            for (i, row) in block.rows().into_iter().enumerate() {
                visit(r0 + i, Some(row));
            }
            Ok(())
        };
        let job = Job {
            op,
            ctx,
            queries: queries.reborrow(),
            cfg: distance,
            max_rows: rows,
            report,
        };
        for_each_row_block(&job, refs, &mut on_block)
    });
    visited.map(|()| transfers)
}

mod sealed {
    /// Only this crate's miner configs implement [`super::MinerConfig`].
    pub trait Sealed {}
}

/// The config of one of the pair and batch miners ([`AllPairsConfig`], [`PairMarginConfig`],
/// [`MultiSimilarityConfig`], [`BatchEasyHardConfig`], [`BatchHardConfig`], [`AngularConfig`],
/// [`HdcConfig`], [`DistanceWeightedConfig`], [`UniformHistogramConfig`]): what
/// [`miners_plan`] needs to plan the miner's call. Sealed; its methods are the crate's.
pub trait MinerConfig: sealed::Sealed {
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
}

/// How a pair or batch miner ([`all_pairs`], [`pair_margin_pairs`],
/// [`multi_similarity_pairs`], [`batch_easy_hard_pairs`], [`batch_hard_triplets`],
/// [`angular_triplets`], [`hdc_pairs`], [`distance_weighted_triplets`],
/// [`uniform_histogram_pairs`]) would run with these arguments on `ctx`: the miners walk the
/// distance matrix in blocks of whole rows (at most 64 MiB of distances on the host; the
/// angular miner's centres in blocks of the same rows or fewer, and the miners that select
/// over all pairs walk it up to three times), and this is the plan of those blocks (all
/// pairs, from labels alone, holds nothing). Nothing is computed.
///
/// # Errors
/// As the miner `cfg` belongs to, for bad inputs and settings; [`Error::OverBudget`] /
/// [`Error::DeviceLimit`] when not even one row fits.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{miners_plan, Context, MiningSet, PairMarginConfig};
/// let x = ndarray::Array2::<f32>::zeros((512, 64));
/// let y = ndarray::Array1::from_shape_fn(512, |i| i % 8);
/// let cfg = PairMarginConfig::default();
/// let plan = miners_plan(&Context::native_cpu(None), &MiningSet::new(&x, &y), None, &cfg)?;
/// assert_eq!(plan.rows, 512); // one block of rows: 512 × 512 distances fit 64 MiB
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn miners_plan<L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &impl MinerConfig,
) -> Result<Plan> {
    let mut imports = Imports::plan();
    let set = prepare_miner(ctx, queries, refs, cfg, &mut imports)?;
    let (b, m) = (set.labels.len(), set.ref_labels.len());
    let rows = (BLOCK_FLOATS / m.max(1)).max(1);
    match (set.queries, set.refs) {
        (Some(queries), Some(refs)) => {
            Ok(row_plan(cfg.op(), ctx, queries, &refs, rows)?.with_imports(imports.footprint()))
        }
        // Labels only: rows of lists on the host, nothing held.
        _ => Ok(Plan {
            path: ctx.path(),
            rows: b.min(rows).max(1),
            cols: m,
            chunks: b.div_ceil(rows),
            bytes: 0,
            min_bytes: 0,
        }),
    }
}

/// A miner's validated inputs: its settings first, then its inputs and self-exclusion.
fn prepare_miner<'s, L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &'s MiningSet<'_, L>,
    refs: Option<&'s MiningSet<'_, L>>,
    cfg: &impl MinerConfig,
    imports: &'s mut Imports,
) -> Result<Labelled<'s>> {
    cfg.check()?;
    let needs_embeddings = cfg.distance().is_some();
    prepare(
        cfg.op(),
        ctx,
        queries,
        refs,
        cfg.self_exclusion(),
        needs_embeddings,
        |_| Ok(true),
        imports,
    )
}

impl Triplets {
    /// Triplets from flat `(a, p, n)` rows, mined on `ctx`'s path.
    pub(super) fn from_flat(
        op: &'static str,
        ctx: &Context,
        flat: Vec<u32>,
        transfers: Transfers,
    ) -> Result<Self> {
        let indices =
            Array2::from_shape_vec((flat.len() / 3, 3), flat).map_err(|e| Error::Internal {
                op,
                message: format!("triplets are not whole (a, p, n) rows: {e}"),
            })?;
        Ok(Self {
            indices,
            path: ctx.path(),
            transfers,
        })
    }
}

impl Pairs {
    /// Pairs from flat `(a, p)` and `(a, n)` rows, computed on `ctx`'s path.
    pub(super) fn new(
        op: &'static str,
        ctx: &Context,
        positives: Vec<u32>,
        negatives: Vec<u32>,
        transfers: Transfers,
    ) -> Result<Self> {
        let array = |flat: Vec<u32>| {
            Array2::from_shape_vec((flat.len() / 2, 2), flat).map_err(|e| Error::Internal {
                op,
                message: format!("pairs are not whole (a, b) rows: {e}"),
            })
        };
        Ok(Self {
            positives: array(positives)?,
            negatives: array(negatives)?,
            path: ctx.path(),
            transfers,
        })
    }
}

/// Every positive and negative pair (PML `get_all_pairs_indices`), row-major: positives
/// `(a, p)` with equal labels (never the anchor's own slot), negatives `(a, n)` with different
/// labels. `refs = None` means the references are the queries; `cfg.self_exclusion` says which
/// reference is each anchor itself (by default its own row when `refs` is `None`).
///
/// # Errors
/// As [`crate::mine_triplets`] for labels and self-exclusion.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{all_pairs, AllPairsConfig, Context, MiningSet, SelfExclusion};
/// let labels = array![0, 0, 1];
/// let p = all_pairs(&Context::native_cpu(None), &MiningSet::from_labels(&labels), None, &AllPairsConfig::default())?;
/// assert_eq!(p.positives, array![[0u32, 1], [1, 0]]);
/// assert_eq!(p.negatives.nrows(), 4);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn all_pairs<L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &AllPairsConfig,
) -> Result<Pairs> {
    const OP: &str = "all_pairs";
    let mut imports = Imports::call();
    let set = prepare_miner(ctx, queries, refs, cfg, &mut imports)?;
    let (mut pos, mut neg) = (Vec::new(), Vec::new());
    let transfers = for_each_row(
        OP,
        ctx,
        &set,
        &DistanceConfig::default(),
        &cfg.hooks,
        &mut |row| {
            pos.extend(row.positives.iter().flat_map(|&p| [row.anchor, p]));
            neg.extend(row.negatives.iter().flat_map(|&n| [row.anchor, n]));
        },
    )?;
    Pairs::new(OP, ctx, pos, neg, transfers)
}

/// Settings of [`all_pairs`]. Every field has a documented default.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{AllPairsConfig, SelfExclusion};
/// assert_eq!(AllPairsConfig::default().self_exclusion, SelfExclusion::Auto);
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AllPairsConfig {
    /// Which reference is each anchor itself. Default [`SelfExclusion::Auto`] (its own row
    /// when the references are the queries).
    pub self_exclusion: SelfExclusion,
    /// Progress (anchor–reference pairs) and cancellation. Default: none.
    pub hooks: Hooks,
}

/// `PairMarginMiner` settings; defaults are PML's.
///
/// # Example
/// ```
/// let cfg = wgpu_metric_learning::PairMarginConfig::default();
/// assert_eq!((cfg.pos_margin, cfg.neg_margin), (0.2, 0.8));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct PairMarginConfig {
    /// Positives farther than this are kept (similarities: less similar). Default 0.2.
    pub pos_margin: f32,
    /// Negatives closer than this are kept (similarities: more similar). Default 0.8.
    pub neg_margin: f32,
    /// Default: Euclidean on normalised embeddings (PML's default distance).
    pub distance: DistanceConfig,
    /// Which reference is each anchor itself. Default [`SelfExclusion::Auto`] (its own row
    /// when the references are the queries).
    pub self_exclusion: SelfExclusion,
    /// Progress (anchor–reference pairs compared) and cancellation. Default: none.
    pub hooks: Hooks,
}

impl Default for PairMarginConfig {
    fn default() -> Self {
        Self {
            pos_margin: 0.2,
            neg_margin: 0.8,
            distance: DistanceConfig::default(),
            self_exclusion: SelfExclusion::Auto,
            hooks: Hooks::default(),
        }
    }
}

/// PML `PairMarginMiner`: positive pairs with `d > pos_margin` and negative pairs with
/// `d < neg_margin` (strict; `s < pos_margin` and `s > neg_margin` for similarities),
/// row-major.
///
/// # Errors
/// As [`crate::mine_triplets`]; [`Error::InvalidParameter`] for a non-finite margin.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{pair_margin_pairs, Context, MiningSet, PairMarginConfig};
/// let (labels, emb) = (array![0, 0, 1], array![[1.0f32, 0.0], [0.0, 1.0], [1.0, 0.1]]);
/// let p = pair_margin_pairs(&Context::native_cpu(None),
///     &MiningSet::new(&emb, &labels), None, &PairMarginConfig::default())?;
/// assert_eq!(p.positives, array![[0u32, 1], [1, 0]]);  // far apart although the same class
/// assert_eq!(p.negatives, array![[0u32, 2], [2, 0]]);  // close although different classes
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn pair_margin_pairs<L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &PairMarginConfig,
) -> Result<Pairs> {
    const OP: &str = "pair_margin_pairs";
    let mut imports = Imports::call();
    let set = prepare_miner(ctx, queries, refs, cfg, &mut imports)?;
    let sim = cfg.distance.distance.is_similarity();
    let (mut pos, mut neg) = (Vec::new(), Vec::new());
    let transfers = for_each_row(OP, ctx, &set, &cfg.distance, &cfg.hooks, &mut |row| {
        for &p in row.positives {
            let v = row.value(p);
            if (sim && v < cfg.pos_margin) || (!sim && v > cfg.pos_margin) {
                pos.extend([row.anchor, p]);
            }
        }
        for &n in row.negatives {
            let v = row.value(n);
            if (sim && v > cfg.neg_margin) || (!sim && v < cfg.neg_margin) {
                neg.extend([row.anchor, n]);
            }
        }
    })?;
    Pairs::new(OP, ctx, pos, neg, transfers)
}

/// `MultiSimilarityMiner` settings; defaults are PML's.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{Distance, MultiSimilarityConfig};
/// let cfg = MultiSimilarityConfig::default();
/// assert_eq!((cfg.epsilon, cfg.distance.distance), (0.1, Distance::Cosine));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct MultiSimilarityConfig {
    /// The slack ε. Default 0.1.
    pub epsilon: f32,
    /// Default: cosine similarity (PML's default for this miner).
    pub distance: DistanceConfig,
    /// Which reference is each anchor itself. Default [`SelfExclusion::Auto`] (its own row
    /// when the references are the queries).
    pub self_exclusion: SelfExclusion,
    /// Progress (anchor–reference pairs compared) and cancellation. Default: none.
    pub hooks: Hooks,
}

impl Default for MultiSimilarityConfig {
    fn default() -> Self {
        Self {
            epsilon: 0.1,
            distance: DistanceConfig {
                distance: Distance::Cosine,
                normalize: true,
            },
            self_exclusion: SelfExclusion::Auto,
            hooks: Hooks::default(),
        }
    }
}

/// Indices sorted by value ascending, ties by index (a stable sort; PML's `torch.sort` leaves
/// tie order unspecified).
fn sorted_by_value(row: &Row<'_>, indices: &[u32]) -> Vec<u32> {
    let mut v = indices.to_vec();
    v.sort_by(|&x, &y| row.value(x).total_cmp(&row.value(y)));
    v
}

/// PML `MultiSimilarityMiner`. For similarities: a positive `(a, p)` is kept if
/// `s(a,p) − ε < max_n s(a,n)`, a negative if `s(a,n) + ε > min_p s(a,p)`; for distances:
/// `d(a,p) + ε > min_n d(a,n)` and `d(a,n) − ε < max_p d(a,p)`. Rows are in anchor order and,
/// as in PML, each anchor's pairs in ascending order of value. An anchor with no positive (or
/// no negative) keeps nothing. The anchor's own slot is neither.
///
/// # Errors
/// As [`crate::mine_triplets`]; [`Error::InvalidParameter`] for a non-finite ε.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{multi_similarity_pairs, Context, MiningSet, MultiSimilarityConfig};
/// let (labels, emb) = (array![0, 0, 1], array![[1.0f32, 0.0], [0.0, 1.0], [1.0, 0.1]]);
/// let p = multi_similarity_pairs(&Context::native_cpu(None),
///     &MiningSet::new(&emb, &labels), None, &MultiSimilarityConfig::default())?;
/// assert_eq!(p.positives, array![[0u32, 1], [1, 0]]);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn multi_similarity_pairs<L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &MultiSimilarityConfig,
) -> Result<Pairs> {
    const OP: &str = "multi_similarity_pairs";
    let mut imports = Imports::call();
    let set = prepare_miner(ctx, queries, refs, cfg, &mut imports)?;
    let sim = cfg.distance.distance.is_similarity();
    let eps = cfg.epsilon;
    let (mut pos, mut neg) = (Vec::new(), Vec::new());
    let transfers = for_each_row(OP, ctx, &set, &cfg.distance, &cfg.hooks, &mut |row| {
        if row.positives.is_empty() || row.negatives.is_empty() {
            return;
        }
        let pos_sorted = sorted_by_value(row, row.positives);
        let neg_sorted = sorted_by_value(row, row.negatives);
        let (min_pos, max_pos) = (
            row.value(pos_sorted[0]),
            row.value(pos_sorted[pos_sorted.len() - 1]),
        );
        let (min_neg, max_neg) = (
            row.value(neg_sorted[0]),
            row.value(neg_sorted[neg_sorted.len() - 1]),
        );
        for &p in &pos_sorted {
            let v = row.value(p);
            if (sim && v - eps < max_neg) || (!sim && v + eps > min_neg) {
                pos.extend([row.anchor, p]);
            }
        }
        for &n in &neg_sorted {
            let v = row.value(n);
            if (sim && v + eps > min_pos) || (!sim && v - eps < max_pos) {
                neg.extend([row.anchor, n]);
            }
        }
    })?;
    Pairs::new(OP, ctx, pos, neg, transfers)
}

/// How `BatchEasyHardMiner` picks an anchor's positive or negative.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{batch_easy_hard_pairs, BatchEasyHardConfig, Context, DistanceConfig, MiningSet, Strategy};
/// let labels = ndarray::array![0, 0, 0, 1];
/// let x = ndarray::array![[0.0f32], [1.0], [3.0], [2.5]];
/// let cfg = BatchEasyHardConfig {
///     pos_strategy: Strategy::Hard,
///     neg_strategy: Strategy::Hard,
///     distance: DistanceConfig { normalize: false, ..Default::default() },
///     ..Default::default()
/// };
/// let p = batch_easy_hard_pairs(&Context::native_cpu(None), &MiningSet::new(&x, &labels), None, &cfg)?;
/// assert_eq!(p.positives.row(0).to_vec(), vec![0, 2]); // anchor 0: farthest positive
/// assert_eq!(p.negatives.row(0).to_vec(), vec![0, 3]); // its only negative
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// The hardest: farthest positive / closest negative.
    Hard,
    /// The hardest that is still easier than the other side's choice (positives closer than
    /// the chosen negative; negatives farther than the chosen positive).
    Semihard,
    /// The easiest: closest positive / farthest negative.
    Easy,
    /// Every pair.
    All,
}

/// `BatchEasyHardMiner` settings; defaults are PML's (easy positives, semihard negatives).
///
/// # Example
/// ```
/// use wgpu_metric_learning::{BatchEasyHardConfig, Strategy};
/// let cfg = BatchEasyHardConfig::default();
/// assert_eq!((cfg.pos_strategy, cfg.neg_strategy), (Strategy::Easy, Strategy::Semihard));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct BatchEasyHardConfig {
    /// Default [`Strategy::Easy`].
    pub pos_strategy: Strategy,
    /// Default [`Strategy::Semihard`].
    pub neg_strategy: Strategy,
    /// Only positives with a value in `[lo, hi]` are candidates. Default `None`.
    pub allowed_pos_range: Option<(f32, f32)>,
    /// Only negatives with a value in `[lo, hi]` are candidates. Default `None`.
    pub allowed_neg_range: Option<(f32, f32)>,
    /// Default: Euclidean on normalised embeddings.
    pub distance: DistanceConfig,
    /// Which reference is each anchor itself. Default [`SelfExclusion::Auto`] (its own row
    /// when the references are the queries).
    pub self_exclusion: SelfExclusion,
    /// Progress (anchor–reference pairs compared) and cancellation. Default: none.
    pub hooks: Hooks,
}

impl Default for BatchEasyHardConfig {
    fn default() -> Self {
        Self {
            pos_strategy: Strategy::Easy,
            neg_strategy: Strategy::Semihard,
            allowed_pos_range: None,
            allowed_neg_range: None,
            distance: DistanceConfig::default(),
            self_exclusion: SelfExclusion::Auto,
            hooks: Hooks::default(),
        }
    }
}

/// The candidate of `indices` with the largest (`want_max`) or smallest value among those
/// passing `admit`; ties go to the lowest index (the first met).
fn pick(
    row: &Row<'_>,
    indices: &[u32],
    want_max: bool,
    admit: impl Fn(f32) -> bool,
) -> Option<(u32, f32)> {
    let mut best: Option<(u32, f32)> = None;
    for &r in indices {
        let v = row.value(r);
        if !admit(v) {
            continue;
        }
        let better = match best {
            None => true,
            Some((_, b)) => (want_max && v > b) || (!want_max && v < b),
        };
        if better {
            best = Some((r, v));
        }
    }
    best
}

fn in_range(range: Option<(f32, f32)>, v: f32) -> bool {
    range.is_none_or(|(lo, hi)| v >= lo && v <= hi)
}

fn check_range(op: &'static str, what: &'static str, range: Option<(f32, f32)>) -> Result<()> {
    match range {
        Some((lo, hi)) if lo.is_nan() || hi.is_nan() || lo > hi => Err(Error::InvalidParameter {
            op,
            what,
            value: format!("[{lo}, {hi}]"),
            rule: "must be [lo, hi] with lo <= hi",
        }),
        _ => Ok(()),
    }
}

/// PML `BatchEasyHardMiner`: per anchor one positive and one negative by strategy (or all
/// pairs of a side with [`Strategy::All`]). For distances, hard = farthest positive / closest
/// negative, easy = the opposite; similarities mirror. A semihard positive is the hardest
/// strictly closer than the chosen negative, a semihard negative the hardest strictly farther
/// than the chosen positive. Anchors without a candidate are dropped; without [`Strategy::All`]
/// only anchors with both a positive and a negative remain, in ascending order.
///
/// # Errors
/// [`Error::InvalidParameter`] for two semihard strategies, semihard with all, or a range
/// that is not `[lo, hi]`; otherwise as [`crate::mine_triplets`].
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{batch_easy_hard_pairs, BatchEasyHardConfig, Context, DistanceConfig, MiningSet, Strategy};
/// let labels = array![0, 0, 1, 1, 0, 2, 1, 1, 1];
/// let x = ndarray::Array2::from_shape_fn((9, 1), |(i, _)| i as f32);
/// let cfg = BatchEasyHardConfig { pos_strategy: Strategy::Hard, neg_strategy: Strategy::Hard,
///     distance: DistanceConfig { normalize: false, ..Default::default() }, ..Default::default() };
/// let p = batch_easy_hard_pairs(&Context::native_cpu(None), &MiningSet::new(&x, &labels), None, &cfg)?;
/// assert_eq!(p.positives.column(1).to_vec(), vec![4, 4, 8, 8, 0, 2, 2, 2]);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn batch_easy_hard_pairs<L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &BatchEasyHardConfig,
) -> Result<Pairs> {
    const OP: &str = "batch_easy_hard_pairs";
    use Strategy::{All, Easy, Semihard};
    let (ps, ns) = (cfg.pos_strategy, cfg.neg_strategy);
    let mut imports = Imports::call();
    let set = prepare_miner(ctx, queries, refs, cfg, &mut imports)?;
    let sim = cfg.distance.distance.is_similarity();
    // `closer(x, y)`: value x is closer than y.
    let closer = move |x: f32, y: f32| if sim { x > y } else { x < y };
    let (pr, nr) = (cfg.allowed_pos_range, cfg.allowed_neg_range);
    // The hardest positive is the least close; the hardest negative the closest.
    let positive = move |row: &Row<'_>, strategy: Strategy, negative: Option<f32>| {
        let want_max = (strategy == Easy) == sim;
        pick(row, row.positives, want_max, |v| {
            in_range(pr, v) && negative.is_none_or(|n| closer(v, n))
        })
    };
    let negative = move |row: &Row<'_>, strategy: Strategy, positive: Option<f32>| {
        let want_max = (strategy == Easy) != sim;
        pick(row, row.negatives, want_max, |v| {
            in_range(nr, v) && positive.is_none_or(|p| closer(p, v))
        })
    };
    let (mut pos, mut neg) = (Vec::new(), Vec::new());
    let transfers = for_each_row(OP, ctx, &set, &cfg.distance, &cfg.hooks, &mut |row| {
        let a = row.anchor;
        match (ps, ns) {
            (All, All) => {
                pos.extend(row.positives.iter().flat_map(|&p| [a, p]));
                neg.extend(row.negatives.iter().flat_map(|&n| [a, n]));
            }
            (All, _) => {
                pos.extend(row.positives.iter().flat_map(|&p| [a, p]));
                if let Some((n, _)) = negative(row, ns, None) {
                    neg.extend([a, n]);
                }
            }
            (_, All) => {
                if let Some((p, _)) = positive(row, ps, None) {
                    pos.extend([a, p]);
                }
                neg.extend(row.negatives.iter().flat_map(|&n| [a, n]));
            }
            _ => {
                let (p, n) = if ps == Semihard {
                    let n = negative(row, ns, None);
                    (n.and_then(|(_, nv)| positive(row, ps, Some(nv))), n)
                } else if ns == Semihard {
                    let p = positive(row, ps, None);
                    (p, p.and_then(|(_, pv)| negative(row, ns, Some(pv))))
                } else {
                    (positive(row, ps, None), negative(row, ns, None))
                };
                if let (Some((p, _)), Some((n, _))) = (p, n) {
                    pos.extend([a, p]);
                    neg.extend([a, n]);
                }
            }
        }
    })?;
    Pairs::new(OP, ctx, pos, neg, transfers)
}

/// `BatchHardMiner` settings.
///
/// # Example
/// ```
/// let cfg = wgpu_metric_learning::BatchHardConfig::default();
/// assert!(cfg.distance.normalize);
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BatchHardConfig {
    /// Default: Euclidean on normalised embeddings.
    pub distance: DistanceConfig,
    /// Which reference is each anchor itself. Default [`SelfExclusion::Auto`] (its own row
    /// when the references are the queries).
    pub self_exclusion: SelfExclusion,
    /// Progress (anchor–reference pairs compared) and cancellation. Default: none.
    pub hooks: Hooks,
}

/// PML `BatchHardMiner`: for every anchor with a positive and a negative, in ascending order,
/// the triplet (anchor, hardest positive, hardest negative); ties go to the lowest index.
///
/// # Errors
/// As [`crate::mine_triplets`].
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{batch_hard_triplets, BatchHardConfig, Context, DistanceConfig, MiningSet};
/// let labels = array![0, 0, 1, 1, 0, 2, 1, 1, 1];
/// let x = ndarray::Array2::from_shape_fn((9, 1), |(i, _)| i as f32);
/// let cfg = BatchHardConfig { distance: DistanceConfig { normalize: false, ..Default::default() }, ..Default::default() };
/// let t = batch_hard_triplets(&Context::native_cpu(None), &MiningSet::new(&x, &labels), None, &cfg)?;
/// assert_eq!(t.anchors().to_vec(), vec![0, 1, 2, 3, 4, 6, 7, 8]);
/// assert_eq!(t.negatives().to_vec(), vec![2, 2, 1, 4, 3, 5, 5, 5]);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn batch_hard_triplets<L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &BatchHardConfig,
) -> Result<Triplets> {
    let pairs = batch_easy_hard_pairs(
        ctx,
        queries,
        refs,
        &BatchEasyHardConfig {
            pos_strategy: Strategy::Hard,
            neg_strategy: Strategy::Hard,
            allowed_pos_range: None,
            allowed_neg_range: None,
            distance: cfg.distance,
            self_exclusion: cfg.self_exclusion.clone(),
            hooks: cfg.hooks.clone(),
        },
    )?;
    let rows = pairs.positives.nrows();
    let indices = Array2::from_shape_fn((rows, 3), |(i, j)| match j {
        0 => pairs.positives[[i, 0]],
        1 => pairs.positives[[i, 1]],
        _ => pairs.negatives[[i, 1]],
    });
    Ok(Triplets {
        indices,
        path: pairs.path,
        transfers: pairs.transfers,
    })
}

impl sealed::Sealed for AllPairsConfig {}
impl MinerConfig for AllPairsConfig {
    fn op(&self) -> &'static str {
        "all_pairs"
    }
    fn self_exclusion(&self) -> &SelfExclusion {
        &self.self_exclusion
    }
    fn distance(&self) -> Option<&DistanceConfig> {
        None
    }
    fn check(&self) -> Result<()> {
        Ok(())
    }
    fn hooks(&self) -> &Hooks {
        &self.hooks
    }
}

impl sealed::Sealed for PairMarginConfig {}
impl MinerConfig for PairMarginConfig {
    fn op(&self) -> &'static str {
        "pair_margin_pairs"
    }
    fn self_exclusion(&self) -> &SelfExclusion {
        &self.self_exclusion
    }
    fn distance(&self) -> Option<&DistanceConfig> {
        Some(&self.distance)
    }
    fn check(&self) -> Result<()> {
        validate::finite_param(self.op(), "pos_margin", self.pos_margin)?;
        validate::finite_param(self.op(), "neg_margin", self.neg_margin)
    }
    fn hooks(&self) -> &Hooks {
        &self.hooks
    }
}

impl sealed::Sealed for MultiSimilarityConfig {}
impl MinerConfig for MultiSimilarityConfig {
    fn op(&self) -> &'static str {
        "multi_similarity_pairs"
    }
    fn self_exclusion(&self) -> &SelfExclusion {
        &self.self_exclusion
    }
    fn distance(&self) -> Option<&DistanceConfig> {
        Some(&self.distance)
    }
    fn check(&self) -> Result<()> {
        validate::finite_param(self.op(), "epsilon", self.epsilon)
    }
    fn hooks(&self) -> &Hooks {
        &self.hooks
    }
}

impl sealed::Sealed for BatchEasyHardConfig {}
impl MinerConfig for BatchEasyHardConfig {
    fn op(&self) -> &'static str {
        "batch_easy_hard_pairs"
    }
    fn self_exclusion(&self) -> &SelfExclusion {
        &self.self_exclusion
    }
    fn distance(&self) -> Option<&DistanceConfig> {
        Some(&self.distance)
    }
    fn check(&self) -> Result<()> {
        use Strategy::{All, Semihard};
        let op = self.op();
        let (ps, ns) = (self.pos_strategy, self.neg_strategy);
        if ps == Semihard && ns == Semihard {
            return Err(Error::InvalidParameter {
                op,
                what: "strategies",
                value: "semihard, semihard".into(),
                rule: "positives and negatives cannot both be semihard",
            });
        }
        if (ps == Semihard && ns == All) || (ps == All && ns == Semihard) {
            return Err(Error::InvalidParameter {
                op,
                what: "strategies",
                value: format!("{ps:?}, {ns:?}"),
                rule: "semihard cannot be combined with all",
            });
        }
        check_range(op, "allowed_pos_range", self.allowed_pos_range)?;
        check_range(op, "allowed_neg_range", self.allowed_neg_range)
    }
    fn hooks(&self) -> &Hooks {
        &self.hooks
    }
}

impl sealed::Sealed for BatchHardConfig {}
impl MinerConfig for BatchHardConfig {
    fn op(&self) -> &'static str {
        "batch_hard_triplets"
    }
    fn self_exclusion(&self) -> &SelfExclusion {
        &self.self_exclusion
    }
    fn distance(&self) -> Option<&DistanceConfig> {
        Some(&self.distance)
    }
    fn check(&self) -> Result<()> {
        Ok(())
    }
    fn hooks(&self) -> &Hooks {
        &self.hooks
    }
}

/// The selection of a pair miner ([`PairMinerConfig::rule`]): what
/// [`mine_pairs_on_device`] runs on the device, and what [`crate::reference::pair_select`]
/// defines.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{PairMarginConfig, PairMinerConfig, PairRule};
/// let rule = PairMarginConfig::default().rule();
/// assert_eq!(rule, PairRule::PairMargin { pos_margin: 0.2, neg_margin: 0.8 });
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PairRule {
    /// Every positive and negative pair ([`all_pairs`]); labels only.
    AllPairs,
    /// [`pair_margin_pairs`].
    PairMargin {
        /// Positives farther than this are kept (similarities: less similar).
        pos_margin: f32,
        /// Negatives closer than this are kept (similarities: more similar).
        neg_margin: f32,
    },
    /// [`multi_similarity_pairs`].
    MultiSimilarity {
        /// The slack ε.
        epsilon: f32,
    },
    /// [`batch_easy_hard_pairs`].
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
    fn params(&self, similarity: bool) -> gpu_params::Params {
        use gpu_params::{rule, strategy, Params};
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

use crate::kernels::pair_select as gpu_params;

/// The config of a pair miner ([`AllPairsConfig`], [`PairMarginConfig`],
/// [`MultiSimilarityConfig`], [`BatchEasyHardConfig`]): [`mine_pairs_on_device`] takes any
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

/// The name of [`mine_pairs_on_device`] in errors.
const DEVICE_OP: &str = "mine_pairs_on_device";

/// Pairs left on the device by [`mine_pairs_on_device`]: PML's `(a1, p, a2, n)` as two
/// `(k, 2)` arrays of `(anchor, reference)` rows.
///
/// See the example of [`mine_pairs_on_device`].
#[derive(Debug)]
pub struct PairsOnDevice {
    /// `(k₁, 2)`: rows `(anchor, positive)`.
    pub positives: DeviceArray<u32>,
    /// `(k₂, 2)`: rows `(anchor, negative)`.
    pub negatives: DeviceArray<u32>,
    /// Host–device traffic of the call: inputs, labels and offsets up, 8 bytes of counts per
    /// anchor down, never a distance or a pair.
    pub transfers: Transfers,
}

/// A pair miner ([`all_pairs`], [`pair_margin_pairs`], [`multi_similarity_pairs`] or
/// [`batch_easy_hard_pairs`], by the type of `cfg`) with its pairs left on the device, for a
/// loss that gathers them there: the same rows, in the same order, as the host miner on
/// `ctx`, in two [`DeviceArray`]s sized exactly, with the counts on the host.
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
/// pairs).
///
/// No plan covers this call ([`miners_plan`] plans the host miners). Values are assumed
/// finite: where a distance overflows to NaN (inputs near `f32::MAX`), a pick among NaN
/// values may differ from the host miner's.
///
/// # Errors
/// As the host miner of `cfg`; [`Error::InvalidParameter`] on a native context (results on
/// the device need a wgpu context); [`Error::BudgetExceeded`] or [`Error::DeviceLimit`] when
/// an array does not fit the budget left or one buffer.
///
/// # Example
/// ```no_run
/// use wgpu_metric_learning::{mine_pairs_on_device, pair_margin_pairs, Context, ContextConfig, MiningSet, PairMarginConfig};
/// let ctx = Context::new(&ContextConfig::default())?;
/// let x = ndarray::Array2::from_shape_fn((64, 8), |(i, j)| ((i * 5 + j) % 13) as f32);
/// let y = ndarray::Array1::from_shape_fn(64, |i| i % 4);
/// let batch = MiningSet::new(&x, &y);
/// let cfg = PairMarginConfig::default();
/// let mined = mine_pairs_on_device(&ctx, &batch, None, &cfg)?;
/// let host = pair_margin_pairs(&ctx, &batch, None, &cfg)?;
/// assert_eq!(mined.positives.to_host(&ctx)?, host.positives);
/// assert_eq!(mined.negatives.to_host(&ctx)?, host.negatives);
/// println!("{} negative pairs in {:?}", mined.negatives.dim().0, mined.negatives.buffer());
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn mine_pairs_on_device<L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &impl PairMinerConfig,
) -> Result<PairsOnDevice> {
    let gpu = output_device(DEVICE_OP, ctx)?;
    let mut imports = Imports::call();
    let set = prepare_miner(ctx, queries, refs, cfg, &mut imports)?;
    let distance = cfg.distance();
    let similarity = distance.is_some_and(|d| d.distance.is_similarity());
    let template = cfg.rule().params(similarity);
    let (mined, mut transfers) = transfer::measure(|| {
        let pairs = set.labels.len() as u64 * set.ref_labels.len() as u64;
        let report = Reporter::new(cfg.hooks(), DEVICE_OP, 2 * pairs);
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
