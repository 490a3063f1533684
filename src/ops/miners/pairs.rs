//! PML's pair miners that keep pairs by their own values: all pairs, `PairMarginMiner` and
//! `MultiSimilarityMiner`.

use std::hash::Hash;

use crate::context::Context;
use crate::data::inputs::{Imports, MiningSet, SelfExclusion};
use crate::error::Result;
use crate::hooks::Hooks;
use crate::metric::{Distance, DistanceConfig};
use crate::validate;

use super::rows::{for_each_row, prepare_miner, Row};
use super::{sealed, MinerConfig, Pairs};

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
/// As [`crate::mine_triplets`]; [`crate::Error::InvalidParameter`] for a non-finite margin.
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
/// As [`crate::mine_triplets`]; [`crate::Error::InvalidParameter`] for a non-finite ε.
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

impl sealed::Sealed for AllPairsConfig {}
impl MinerConfig for AllPairsConfig {
    runs!(Pairs, all_pairs);
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
    runs!(Pairs, pair_margin_pairs);
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
    runs!(Pairs, multi_similarity_pairs);
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
