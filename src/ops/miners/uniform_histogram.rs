//! PML's `UniformHistogramMiner`: each side's pair values cut into equal-width bins, and the
//! same number of pairs drawn at random from every non-empty bin.
//!
//! Bin `i` holds `edge[i] ≤ v < edge[i+1]`, the last also `v = max`. The draws use the
//! library's generator, not torch's: on a given path the output is a function of the inputs
//! and the seed (whatever the budget), and its distribution is PML's. A side without pairs
//! stays empty. NaN values (from distances that overflow) fall in no bin, where PML's
//! `torch.min` would make every edge NaN and fail. The values are visited three times
//! (range, bin counts, picks): kept on the host up to 4 Mi pairs, otherwise computed again
//! by the distance tile each time, so that host memory is the bins and the draws.

use std::hash::Hash;

use crate::context::Context;
use crate::data::inputs::{Imports, MiningSet, SelfExclusion};
use crate::error::{Error, Result};
use crate::hooks::Hooks;
use crate::metric::DistanceConfig;
use crate::rng::SplitMix64;

use super::all_pair_values::{PairValues, Side};
use super::rows::prepare_miner;
use super::{sealed, MinerConfig, Pairs};

/// `UniformHistogramMiner` settings; defaults are PML's, and the seed is the library's.
///
/// # Example
/// ```
/// let cfg = wgpu_metric_learning::UniformHistogramConfig::default();
/// assert_eq!((cfg.num_bins, cfg.pos_per_bin, cfg.neg_per_bin), (100, 10, 10));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct UniformHistogramConfig {
    /// Equal-width bins between each side's smallest and largest value (at least 1).
    /// Default 100.
    pub num_bins: usize,
    /// Positive pairs drawn from each non-empty bin, with replacement (at least 1).
    /// Default 10.
    pub pos_per_bin: usize,
    /// Negative pairs drawn from each non-empty bin, with replacement (at least 1).
    /// Default 10.
    pub neg_per_bin: usize,
    /// Default: Euclidean on normalised embeddings (PML's default distance).
    pub distance: DistanceConfig,
    /// On a given path, the draws are a function of the inputs and this seed. Default 0.
    pub seed: u64,
    /// Which reference is each anchor itself. Default [`SelfExclusion::Auto`] (its own row
    /// when the references are the queries).
    pub self_exclusion: SelfExclusion,
    /// Progress (anchor–reference pairs compared) and cancellation. Default: none.
    pub hooks: Hooks,
}

impl Default for UniformHistogramConfig {
    fn default() -> Self {
        Self {
            num_bins: 100,
            pos_per_bin: 10,
            neg_per_bin: 10,
            distance: DistanceConfig::default(),
            seed: 0,
            self_exclusion: SelfExclusion::Auto,
            hooks: Hooks::default(),
        }
    }
}

/// PML `UniformHistogramMiner` over the pairs of `queries` `(b, d)` and `refs` `(m, d)`: for
/// each side, its pair values cut into `num_bins` bins by `torch.linspace(min, max,
/// num_bins + 1)`, and from every non-empty bin `pos_per_bin` (`neg_per_bin`) pairs drawn
/// uniformly with replacement; rows bin by bin, ascending, as PML concatenates them. The
/// draws are a function of the inputs and `cfg.seed` (PML's distribution, not torch's
/// numbers). Cost: three passes over the `b × m` values (module docs).
///
/// # Errors
/// As [`crate::mine_triplets`]; [`Error::InvalidParameter`] for zero bins or zero pairs
/// per bin (PML's `torch.multinomial` refuses to draw none).
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{uniform_histogram_pairs, Context, MiningSet, UniformHistogramConfig};
/// let labels = array![0, 0, 1, 1];
/// let x = array![[1.0f32, 0.0], [0.9, 0.1], [0.0, 1.0], [0.2, 0.8]];
/// let cfg = UniformHistogramConfig { num_bins: 4, pos_per_bin: 3, neg_per_bin: 2, ..Default::default() };
/// let p = uniform_histogram_pairs(&Context::native_cpu(None), &MiningSet::new(&x, &labels), None, &cfg)?;
/// // Positives: the four pairs have two values, in the first and last bins: 2 × 3 draws.
/// assert_eq!(p.positives.nrows(), 6);
/// assert_eq!(p.negatives.nrows() % 2, 0);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn uniform_histogram_pairs<L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &UniformHistogramConfig,
) -> Result<Pairs> {
    const OP: &str = "uniform_histogram_pairs";
    let mut imports = Imports::call();
    let set = prepare_miner(ctx, queries, refs, cfg, &mut imports)?;
    let mut values = PairValues::new(OP, ctx, &set, &cfg.distance, &cfg.hooks, 3);
    // First visit: each side's range.
    let mut range = [(f32::INFINITY, f32::NEG_INFINITY); 2];
    values.visit(&mut |side, v, _, _| {
        let r = &mut range[side as usize];
        *r = (r.0.min(v), r.1.max(v));
    })?;
    let edges = range.map(|(lo, hi)| (lo <= hi).then(|| linspace(lo, hi, cfg.num_bins + 1)));
    // Second visit: each bin's count.
    let mut counts = [vec![0u64; cfg.num_bins], vec![0u64; cfg.num_bins]];
    values.visit(&mut |side, v, _, _| {
        let s = side as usize;
        if let Some(bin) = edges[s].as_deref().and_then(|e| bin_of(e, v)) {
            counts[s][bin] += 1;
        }
    })?;
    // The draws: per bin, the ranks (in row-major order within the bin) of its picks, each
    // with its row in the output.
    let per_bin = [cfg.pos_per_bin, cfg.neg_per_bin];
    let mut picks: [Vec<Vec<(u64, usize)>>; 2] = [Vec::new(), Vec::new()];
    let mut rows = [0usize; 2];
    for side in [Side::Positive, Side::Negative] {
        let s = side as usize;
        let mut rng = SplitMix64::new(cfg.seed, s as u64);
        picks[s] = counts[s]
            .iter()
            .map(|&n| {
                if n == 0 {
                    return Vec::new();
                }
                let mut bin: Vec<(u64, usize)> = (0..per_bin[s])
                    .map(|j| (rng.below(n), rows[s] + j))
                    .collect();
                rows[s] += per_bin[s];
                bin.sort_unstable();
                bin
            })
            .collect();
    }
    drop(counts);
    // Third visit: the pairs at the drawn ranks.
    let mut out = rows.map(|n| vec![0u32; 2 * n]);
    if rows.iter().any(|&n| n > 0) {
        let mut seen = [vec![0u64; cfg.num_bins], vec![0u64; cfg.num_bins]];
        let mut next = [vec![0usize; cfg.num_bins], vec![0usize; cfg.num_bins]];
        values.visit(&mut |side, v, a, r| {
            let s = side as usize;
            let Some(bin) = edges[s].as_deref().and_then(|e| bin_of(e, v)) else {
                return;
            };
            let rank = seen[s][bin];
            seen[s][bin] += 1;
            let bin_picks = &picks[s][bin];
            while let Some(&(_, row)) = bin_picks.get(next[s][bin]).filter(|p| p.0 == rank) {
                out[s][2 * row..2 * row + 2].copy_from_slice(&[a, r]);
                next[s][bin] += 1;
            }
        })?;
        // Every draw must have met its pair: the visits saw the same values.
        let met = (0..2).all(|s| picks[s].iter().zip(&next[s]).all(|(p, &n)| p.len() == n));
        if !met {
            return Err(values.inconsistent());
        }
    } else {
        values.skip();
    }
    let [pos, neg] = out;
    let transfers = values.transfers();
    Pairs::new(OP, ctx, pos, neg, transfers)
}

/// `torch.linspace(start, end, steps)` in `f32` by the formula of PyTorch's kernel: the
/// first half from `start`, the second half back from `end` (so both ends are exact). Its
/// vectorised CPU loop rounds inner edges differently by an ulp at most, which moves only a
/// value lying within an ulp of an edge to the neighbouring bin.
fn linspace(start: f32, end: f32, steps: usize) -> Vec<f32> {
    if steps == 1 {
        return vec![start];
    }
    let step = (end - start) / (steps - 1) as f32;
    let half = steps / 2;
    (0..steps)
        .map(|i| {
            if i < half {
                start + step * i as f32
            } else {
                end - step * (steps - 1 - i) as f32
            }
        })
        .collect()
}

/// The bin of `v` among the bins between consecutive `edges` (PML's test per bin:
/// `edge[i] ≤ v < edge[i+1]`, and `≤` for the last), or `None` outside them (NaN).
fn bin_of(edges: &[f32], v: f32) -> Option<usize> {
    let last = edges.len() - 1;
    if !(v >= edges[0] && v <= edges[last]) {
        return None;
    }
    // The number of edges at or below v is at least 1 (edges[0] ≤ v).
    let i = edges.partition_point(|&e| e <= v);
    Some((i - 1).min(last - 1))
}

impl sealed::Sealed for UniformHistogramConfig {}
impl MinerConfig for UniformHistogramConfig {
    runs!(Pairs, uniform_histogram_pairs);
    fn op(&self) -> &'static str {
        "uniform_histogram_pairs"
    }
    fn self_exclusion(&self) -> &SelfExclusion {
        &self.self_exclusion
    }
    fn distance(&self) -> Option<&DistanceConfig> {
        Some(&self.distance)
    }
    fn check(&self) -> Result<()> {
        for (what, value) in [
            ("num_bins", self.num_bins),
            ("pos_per_bin", self.pos_per_bin),
            ("neg_per_bin", self.neg_per_bin),
        ] {
            if value == 0 {
                return Err(Error::InvalidParameter {
                    op: self.op(),
                    what,
                    value: value.to_string(),
                    rule: "must be at least 1",
                });
            }
        }
        // The output holds at most num_bins · per_bin rows per side, indexed by u32.
        let most = self.pos_per_bin.max(self.neg_per_bin);
        if self
            .num_bins
            .checked_mul(most)
            .is_none_or(|rows| rows > u32::MAX as usize / 2)
        {
            return Err(Error::InvalidParameter {
                op: self.op(),
                what: "num_bins",
                value: format!("{} bins of {most} pairs", self.num_bins),
                rule: "num_bins · per_bin must be below 2³¹",
            });
        }
        Ok(())
    }
    fn hooks(&self) -> &Hooks {
        &self.hooks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linspace_has_exact_ends_and_even_steps() {
        let e = linspace(0.25, 1.75, 7);
        assert_eq!(e, vec![0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75]);
        assert_eq!(linspace(2.0, 2.0, 3), vec![2.0; 3]);
        let e = linspace(0.1, 0.7, 101);
        assert_eq!((e[0], e[100]), (0.1, 0.7));
    }

    #[test]
    fn bins_follow_pml_boundaries() {
        let e = [0.0, 1.0, 2.0, 3.0];
        assert_eq!(bin_of(&e, 0.0), Some(0));
        assert_eq!(bin_of(&e, 0.999), Some(0));
        assert_eq!(bin_of(&e, 1.0), Some(1)); // an inner edge opens the next bin
        assert_eq!(bin_of(&e, 3.0), Some(2)); // the last bin holds its upper edge
        assert_eq!(bin_of(&e, 3.5), None);
        assert_eq!(bin_of(&e, f32::NAN), None);
        // One value: every edge equal, everything in the last bin (as PML's loop finds).
        assert_eq!(bin_of(&[2.0, 2.0, 2.0], 2.0), Some(1));
    }
}
