//! PML's `HDCMiner`: of all positive pairs, the `⌈filter_percentage · count⌉` least close;
//! of all negative pairs, as many of the closest.
//!
//! The selection needs every pair's value once more after counting them: up to 4 Mi pairs
//! they are kept on the host (48 MiB); beyond that a first pass over the distances counts a
//! histogram of the values and a second keeps the pairs below the cut's bucket and, in a
//! heap, the best of the bucket's own, so that host memory follows the output, not `b · m`.
//! PML's `set_idx_externally` (filtering pairs given from outside) is not offered.

use std::collections::BinaryHeap;
use std::hash::Hash;

use crate::context::Context;
use crate::data::inputs::{Imports, MiningSet, SelfExclusion};
use crate::error::{Error, Result};
use crate::hooks::Hooks;
use crate::metric::DistanceConfig;

use super::all_pair_values::PairValues;
use super::rows::prepare_miner;
use super::{sealed, MinerConfig, Pairs};

/// `HDCMiner` settings; defaults are PML's.
///
/// # Example
/// ```
/// let cfg = wgpu_metric_learning::HdcConfig::default();
/// assert_eq!(cfg.filter_percentage, 0.5);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct HdcConfig {
    /// The fraction of each side's pairs kept, in `[0, 1]`: `⌈filter_percentage · count⌉`
    /// of them (PML rounds up in double precision). Default 0.5.
    pub filter_percentage: f64,
    /// Default: Euclidean on normalised embeddings (PML's default distance).
    pub distance: DistanceConfig,
    /// Which reference is each anchor itself. Default [`SelfExclusion::Auto`] (its own row
    /// when the references are the queries).
    pub self_exclusion: SelfExclusion,
    /// Progress (anchor–reference pairs compared) and cancellation. Default: none.
    pub hooks: Hooks,
}

impl Default for HdcConfig {
    fn default() -> Self {
        Self {
            filter_percentage: 0.5,
            distance: DistanceConfig::default(),
            self_exclusion: SelfExclusion::Auto,
            hooks: Hooks::default(),
        }
    }
}

/// PML `HDCMiner` (the hard-aware deeply cascaded miner) over all pairs of `queries` `(b, d)`
/// and `refs` `(m, d)`: of the `P` positive pairs, the `⌈filter_percentage · P⌉` farthest; of
/// the `N` negative pairs, the `⌈filter_percentage · N⌉` closest. Each side hardest first.
/// Ties at the cut are ours to break: equal values in row-major order, the first making the
/// cut (torch's `topk` order is unspecified, and not row-major: on sklearn's digits PML keeps
/// pair (83, 43) and drops (43, 83)). Cost: two passes over the `b × m` distances past 4 Mi
/// pairs, host memory following the output (module docs).
///
/// # Errors
/// As [`crate::mine_triplets`]; [`Error::InvalidParameter`] for a `filter_percentage`
/// outside `[0, 1]` (PML's `torch.topk` refuses `k` beyond the count).
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{hdc_pairs, Context, DistanceConfig, HdcConfig, MiningSet};
/// let labels = array![0, 0, 1, 1, 1, 0];
/// let x = ndarray::Array2::from_shape_fn((6, 1), |(i, _)| (i * i) as f32);
/// let cfg = HdcConfig { filter_percentage: 0.3,
///     distance: DistanceConfig { normalize: false, ..Default::default() }, ..Default::default() };
/// let p = hdc_pairs(&Context::native_cpu(None), &MiningSet::new(&x, &labels), None, &cfg)?;
/// // ⌈0.3 · 12⌉ of the 12 positive pairs, the farthest first (|0 − 25|); ⌈0.3 · 18⌉ negatives.
/// assert_eq!((p.positives.nrows(), p.positives.row(0).to_vec(), p.negatives.nrows()), (4, vec![0, 5], 6));
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn hdc_pairs<L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &HdcConfig,
) -> Result<Pairs> {
    const OP: &str = "hdc_pairs";
    let mut imports = Imports::call();
    let set = prepare_miner(ctx, queries, refs, cfg, &mut imports)?;
    let similarity = cfg.distance.distance.is_similarity();
    let mut values = PairValues::new(OP, ctx, &set, &cfg.distance, &cfg.hooks, 2);
    // Positives: the least close first (largest distance); negatives the closest first.
    let largest = [!similarity, similarity];
    let k = values.counts.map(|n| keep_count(cfg.filter_percentage, n));
    // First visit: a histogram of the top 16 bits of each pair's key.
    let mut histograms = [vec![0u64; 1 << 16], vec![0u64; 1 << 16]];
    values.visit(&mut |side, v, _, _| {
        let s = side as usize;
        histograms[s][(key(v, largest[s]) >> 16) as usize] += 1;
    })?;
    // The bucket holding the k-th pair: every pair of a lower bucket is kept, and those of
    // this one compete on their full key.
    let cut = [0, 1].map(|s| cut_bucket(&histograms[s], k[s]));
    // Below the cut bucket every pair is kept; of the bucket's own pairs only the best
    // `k − below` compete, in a heap whose top is the worst of them: host memory is `k` pairs.
    let below: [u64; 2] =
        [0, 1].map(|s| cut[s].map_or(0, |c| histograms[s][..c as usize].iter().sum()));
    drop(histograms);
    let mut kept: [Vec<Entry>; 2] = [0, 1].map(|s| Vec::with_capacity(below[s] as usize));
    let mut bucket: [BinaryHeap<Entry>; 2] = [BinaryHeap::new(), BinaryHeap::new()];
    let room = [0, 1].map(|s| (k[s] - below[s]) as usize);
    if cut.iter().all(Option::is_none) {
        values.skip();
    } else {
        values.visit(&mut |side, v, a, r| {
            let s = side as usize;
            let Some(c) = cut[s] else {
                return;
            };
            let key = key(v, largest[s]);
            if key >> 16 < c {
                kept[s].push((key, a, r));
            } else if key >> 16 == c {
                bucket[s].push((key, a, r));
                if bucket[s].len() > room[s] {
                    bucket[s].pop();
                }
            }
        })?;
    }
    // Every pair below the cut must have come back: the visits saw the same values.
    if (0..2).any(|s| kept[s].len() as u64 != below[s]) {
        return Err(values.inconsistent());
    }
    let rows = |mut pairs: Vec<Entry>, bucket: BinaryHeap<Entry>| -> Vec<u32> {
        pairs.extend(bucket.into_vec());
        pairs.sort_unstable();
        pairs.into_iter().flat_map(|(_, a, r)| [a, r]).collect()
    };
    let [pos_bucket, neg_bucket] = bucket;
    let [pos, neg] = kept;
    let transfers = values.transfers();
    Pairs::new(
        OP,
        ctx,
        rows(pos, pos_bucket),
        rows(neg, neg_bucket),
        transfers,
    )
}

/// A pair by its key, then its anchor and reference: `torch.topk`'s order, ties row-major.
type Entry = (u32, u32, u32);

/// `⌈filter_percentage · n⌉` as PML computes it (in double precision), at most `n`.
fn keep_count(filter_percentage: f64, n: u64) -> u64 {
    ((filter_percentage * n as f64).ceil() as u64).min(n)
}

/// A key whose ascending order is `torch.topk`'s order of `v`: descending values when
/// `largest`, ascending otherwise (NaN, from an overflowing distance, counts as the largest,
/// as in `torch.topk`).
fn key(v: f32, largest: bool) -> u32 {
    // −0 and +0 are one value to torch: their order is the pairs'. Every NaN (also one with
    // its sign bit set, as x86 makes them) is the largest.
    let bits = if v == 0.0 {
        0
    } else if v.is_nan() {
        0x7fc0_0000
    } else {
        v.to_bits()
    };
    let ascending = if bits >> 31 == 1 {
        !bits
    } else {
        bits | 0x8000_0000
    };
    if largest {
        !ascending
    } else {
        ascending
    }
}

/// The bucket of the `k`-th smallest key (`None` when none is kept).
fn cut_bucket(histogram: &[u64], k: u64) -> Option<u32> {
    if k == 0 {
        return None;
    }
    let mut seen = 0;
    for (bucket, &n) in histogram.iter().enumerate() {
        seen += n;
        if seen >= k {
            return Some(bucket as u32);
        }
    }
    None
}

impl sealed::Sealed for HdcConfig {}
impl MinerConfig for HdcConfig {
    runs!(Pairs, hdc_pairs);
    fn op(&self) -> &'static str {
        "hdc_pairs"
    }
    fn self_exclusion(&self) -> &SelfExclusion {
        &self.self_exclusion
    }
    fn distance(&self) -> Option<&DistanceConfig> {
        Some(&self.distance)
    }
    fn check(&self) -> Result<()> {
        let f = self.filter_percentage;
        if (0.0..=1.0).contains(&f) {
            Ok(())
        } else {
            Err(Error::InvalidParameter {
                op: self.op(),
                what: "filter_percentage",
                value: f.to_string(),
                rule: "must be in [0, 1]",
            })
        }
    }
    fn hooks(&self) -> &Hooks {
        &self.hooks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_order_values_as_topk_does() {
        let values = [
            f32::NEG_INFINITY,
            -2.0,
            -0.0,
            0.0,
            1e-30,
            0.5,
            3.0,
            f32::INFINITY,
        ];
        for w in values.windows(2) {
            assert!(key(w[0], false) <= key(w[1], false), "{w:?}");
            assert!(key(w[0], true) >= key(w[1], true), "{w:?}");
        }
        assert!(key(f32::NAN, true) < key(f32::INFINITY, true));
        assert_eq!(key(-0.0, true), key(0.0, true));
        assert_eq!(key(-f32::NAN, true), key(f32::NAN, true));
    }

    #[test]
    fn the_cut_is_the_bucket_of_the_kth_key() {
        let mut h = vec![0u64; 1 << 16];
        h[3] = 2;
        h[7] = 5;
        assert_eq!(cut_bucket(&h, 0), None);
        assert_eq!(cut_bucket(&h, 2), Some(3));
        assert_eq!(cut_bucket(&h, 3), Some(7));
        assert_eq!(cut_bucket(&h, 7), Some(7));
        assert_eq!(keep_count(0.3, 12), 4);
        assert_eq!(keep_count(1.0, 12), 12);
        assert_eq!(keep_count(0.0, 12), 0);
    }
}
