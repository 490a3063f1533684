//! PML's per-anchor miners: `BatchEasyHardMiner` (one positive and one negative per anchor by
//! strategy) and `BatchHardMiner` (its hard/hard case as triplets).

use std::hash::Hash;

use ndarray::Array2;

use crate::context::Context;
use crate::data::inputs::{Imports, MiningSet, SelfExclusion};
use crate::error::{Error, Result};
use crate::hooks::Hooks;
use crate::metric::DistanceConfig;
use crate::ops::triplets::Triplets;

use super::rows::{for_each_row, prepare_miner, Row};
use super::{sealed, MinerConfig, Pairs};

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

impl sealed::Sealed for BatchEasyHardConfig {}
impl MinerConfig for BatchEasyHardConfig {
    runs!(Pairs, batch_easy_hard_pairs);
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
    runs!(Triplets, batch_hard_triplets);
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
