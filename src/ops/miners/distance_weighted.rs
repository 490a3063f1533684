//! PML's `DistanceWeightedMiner` (Wu et al., 2017): negatives drawn with weights inverse to
//! the density of distances between points on the unit sphere.
//!
//! As PML computes it in `f32`: each distance `δ` (Euclidean, normalised) is raised to
//! `cutoff`, `log w = (2 − d)·ln δ − ((d − 3)/2)·ln(1 − δ²/4)` (`d` the embedding size), the
//! same-label entries' `log w` count as 0, `w = exp(log w − max)` with the max over every
//! finite entry of the matrix, and negatives at `δ ≥ nonzero_loss_cutoff` or with a
//! non-finite `log w` weigh 0. Each anchor with a positive and a negative of non-zero total
//! weight then gets as many triplets as there are references of its label (PML's
//! `get_random_triplet_indices`: its own slot counted, though never drawn), each with a
//! positive drawn uniformly and a negative drawn in proportion to its weight, both with
//! replacement.
//!
//! Differences from PML, on purpose: the draws use the library's generator, so the output
//! is, on a given path, a function of the inputs and the seed (whatever the budget) with
//! PML's distribution, not torch's numbers; rows are in anchor order, where PML groups
//! anchors by label; when no entry's `log w` is finite PML fails (`torch.max` of nothing)
//! and this returns no triplet. The distances are computed twice (the max, then the draws),
//! so host memory stays one block of rows.

use std::hash::Hash;

use crate::context::Context;
use crate::data::inputs::{Imports, MiningSet, SelfExclusion};
use crate::error::Result;
use crate::hooks::{Hooks, Reporter};
use crate::metric::DistanceConfig;
use crate::ops::triplets::{list_sizes, Triplets};
use crate::rng::SplitMix64;
use crate::validate;

use super::rows::{for_each_row_reporting, prepare_miner};
use super::{sealed, MinerConfig};

/// `DistanceWeightedMiner` settings; defaults are PML's, and the seed is the library's. The
/// distance is fixed: Euclidean on normalised embeddings, the only one PML accepts.
///
/// # Example
/// ```
/// let cfg = wgpu_metric_learning::DistanceWeightedConfig::default();
/// assert_eq!((cfg.cutoff, cfg.nonzero_loss_cutoff), (0.5, 1.4));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct DistanceWeightedConfig {
    /// Distances below this count as this (tames the weights of near points). Default 0.5.
    pub cutoff: f32,
    /// Negatives at this distance or farther are never drawn. Default 1.4.
    pub nonzero_loss_cutoff: f32,
    /// On a given path, the draws are a function of the inputs and this seed. Default 0.
    pub seed: u64,
    /// Which reference is each anchor itself. Default [`SelfExclusion::Auto`] (its own row
    /// when the references are the queries).
    pub self_exclusion: SelfExclusion,
    /// Progress (anchor–reference pairs compared, twice) and cancellation. Default: none.
    pub hooks: Hooks,
}

impl Default for DistanceWeightedConfig {
    fn default() -> Self {
        Self {
            cutoff: 0.5,
            nonzero_loss_cutoff: 1.4,
            seed: 0,
            self_exclusion: SelfExclusion::Auto,
            hooks: Hooks::default(),
        }
    }
}

/// PML `DistanceWeightedMiner`: triplets `(a, p, n)` of `queries` `(b, d)` against `refs`
/// `(m, d)` (`None`: the queries), per anchor as many as there are references of its label,
/// each with a uniform positive and a negative drawn by PML's weight of its distance. Rows are
/// in anchor order and a function of the inputs and `cfg.seed` (PML's distribution, not
/// torch's numbers; see the module docs). Cost: two passes over the `b × m` distances in
/// row blocks.
///
/// # Errors
/// As [`crate::mine_triplets`]; [`crate::Error::InvalidParameter`] for a non-finite cutoff.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{distance_weighted_triplets, Context, DistanceWeightedConfig, MiningSet};
/// let labels = array![0, 0, 1, 1];
/// let x = array![[1.0f32, 0.0, 0.0], [0.8, 0.6, 0.0], [0.6, 0.8, 0.0], [0.0, 0.6, 0.8]];
/// let cfg = DistanceWeightedConfig { seed: 7, ..Default::default() };
/// let t = distance_weighted_triplets(&Context::native_cpu(None), &MiningSet::new(&x, &labels), None, &cfg)?;
/// assert_eq!(t.len(), 8); // two per anchor: each label has two rows
/// for row in t.indices.rows() {
///     assert_eq!(labels[row[0] as usize], labels[row[1] as usize]);
///     assert_ne!(labels[row[0] as usize], labels[row[2] as usize]);
/// }
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn distance_weighted_triplets<L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &DistanceWeightedConfig,
) -> Result<Triplets> {
    const OP: &str = "distance_weighted_triplets";
    let mut imports = Imports::call();
    let set = prepare_miner(ctx, queries, refs, cfg, &mut imports)?;
    let distance = DistanceConfig::default();
    let d = set.queries.map_or(0, |q| q.dim().1) as f64;
    let weight = LogWeight::new(d, cfg.cutoff);
    let (b, m) = (set.labels.len(), set.ref_labels.len());
    let pairs = b as u64 * m as u64;
    let report = Reporter::new(&cfg.hooks, OP, pairs.saturating_mul(2));
    // An anchor's number of triplets: the references of its label (its own slot counted).
    let counts: Vec<u64> = list_sizes(&set).map(|(_, n)| m as u64 - n).collect();
    // First pass: the max of `log w` over the finite entries, same-label entries as 0.
    let mut max = f32::NEG_INFINITY;
    let mut transfers =
        for_each_row_reporting(OP, ctx, &set, &distance, &report.part(pairs), &mut |row| {
            let a = row.anchor as usize;
            let own = Some(set.self_slots[a])
                .filter(|&s| (s as usize) < m && set.ref_labels[s as usize] == set.labels[a]);
            for &r in row.positives.iter().chain(own.as_slice()) {
                if weight.of(row.value(r)).is_finite() {
                    max = max.max(0.0);
                }
            }
            for &n in row.negatives {
                let lw = weight.of(row.value(n));
                if lw.is_finite() {
                    max = max.max(lw);
                }
            }
        })?;
    let mut indices = Vec::new();
    if max.is_finite() {
        let mut cumulative = Vec::with_capacity(m);
        let second =
            for_each_row_reporting(OP, ctx, &set, &distance, &report.part(pairs), &mut |row| {
                if row.positives.is_empty() || row.negatives.is_empty() {
                    return;
                }
                // PML's weights, normalised by their row sum, in f32.
                let w: Vec<f32> = row
                    .negatives
                    .iter()
                    .map(|&n| {
                        let delta = row.value(n).max(cfg.cutoff);
                        let lw = weight.of(row.value(n));
                        if lw.is_finite() && delta < cfg.nonzero_loss_cutoff {
                            (lw - max).exp()
                        } else {
                            0.0
                        }
                    })
                    .collect();
                let sum: f32 = w.iter().sum();
                if sum.is_nan() || sum <= 0.0 {
                    return;
                }
                cumulative.clear();
                let mut total = 0.0f64;
                cumulative.extend(w.iter().map(|&x| {
                    total += f64::from(x / sum);
                    total
                }));
                if total.is_nan() || total <= 0.0 {
                    return;
                }
                let a = row.anchor;
                let mut rng = SplitMix64::new(cfg.seed, u64::from(a));
                let count = counts[a as usize];
                for _ in 0..count {
                    let p = row.positives[rng.below(row.positives.len() as u64) as usize];
                    let u = rng.unit() * total;
                    // The first negative whose cumulative weight exceeds u (never one of weight 0).
                    let at = cumulative
                        .partition_point(|&c| c <= u)
                        .min(cumulative.len() - 1);
                    indices.extend([a, p, row.negatives[at]]);
                }
            })?;
        transfers.add(second);
    } else {
        // Nothing to draw: the second pass's progress is done at once.
        report.part(pairs).add(pairs);
    }
    transfers.add(set.imported);
    Triplets::from_flat(OP, ctx, indices, transfers)
}

/// `log w(δ)` of PML's miner in `f32`, with its constants rounded from double precision as
/// torch rounds a Python float against a `float32` tensor.
struct LogWeight {
    cutoff: f32,
    two_minus_d: f32,
    half_d_minus_3: f32,
}

impl LogWeight {
    fn new(d: f64, cutoff: f32) -> Self {
        Self {
            cutoff,
            two_minus_d: (2.0 - d) as f32,
            half_d_minus_3: ((d - 3.0) / 2.0) as f32,
        }
    }

    /// Of a raw distance (the cutoff applied here; NaN stays NaN, as in `torch.clamp`).
    fn of(&self, distance: f32) -> f32 {
        let delta = if distance < self.cutoff {
            self.cutoff
        } else {
            distance
        };
        self.two_minus_d * delta.ln() - self.half_d_minus_3 * (1.0 - 0.25 * (delta * delta)).ln()
    }
}

impl sealed::Sealed for DistanceWeightedConfig {}
impl MinerConfig for DistanceWeightedConfig {
    runs!(Triplets, distance_weighted_triplets);
    fn op(&self) -> &'static str {
        "distance_weighted_triplets"
    }
    fn self_exclusion(&self) -> &SelfExclusion {
        &self.self_exclusion
    }
    fn distance(&self) -> Option<&DistanceConfig> {
        const EUCLIDEAN_NORMALISED: DistanceConfig = DistanceConfig {
            distance: crate::metric::Distance::Euclidean,
            normalize: true,
        };
        Some(&EUCLIDEAN_NORMALISED)
    }
    fn check(&self) -> Result<()> {
        validate::finite_param(self.op(), "cutoff", self.cutoff)?;
        validate::finite_param(self.op(), "nonzero_loss_cutoff", self.nonzero_loss_cutoff)
    }
    fn hooks(&self) -> &Hooks {
        &self.hooks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_weight_is_pmls_formula_with_the_cutoff() {
        let w = LogWeight::new(5.0, 0.5);
        let f = |x: f32| -3.0 * x.ln() - 1.0 * (1.0 - 0.25 * x * x).ln();
        assert_eq!(w.of(1.2), f(1.2));
        assert_eq!(w.of(0.1), f(0.5)); // below the cutoff
        assert_eq!(w.of(2.0), f32::INFINITY); // ln 0 on the far side of the sphere
        assert!(w.of(2.5).is_nan());
        assert!(w.of(f32::NAN).is_nan());
    }
}
