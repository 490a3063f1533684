//! PartialFC's sampling of the classes (insightface's `sample_rate`): the softmax of a loss
//! with class weights runs over every class with a row in the batch and a random share of the
//! others, so that a step with millions of classes touches a fraction of them.
//!
//! Which classes are drawn is a function of the seed and the class index alone: class `j` is
//! drawn when a 64-bit mix of `(seed, j)`, read as a number in `[0, 1)`, is below the rate.
//! So the draw does not depend on how the classes are split over processes. A class-sharded
//! run equals one process with the same seed, and a checkpoint re-sharded to another world
//! size keeps drawing the same classes. insightface's `PartialFC_V2` instead keeps exactly
//! `int(rate · classes on the rank)` per rank, positives first, drawn from torch's generator:
//! the same in expectation while the positives are fewer than that.
//!
//! A shard may keep no class (no row of the batch in its range and none drawn): its passes
//! add nothing to the rows' sums, and it takes part in the exchanges all the same.
//!
//! The call gathers the drawn classes' centres into a compact copy, runs the loss's passes on
//! it with the classes renumbered over the shards' samples (one exchange of each shard's
//! count), and scatters the copy's gradient back: the weights' gradient is 0 on every class
//! that was not drawn, as insightface's gather `weight[index]` gives.

use ndarray::{s, Array2, ArrayView2};

use super::classifier_params::ClassifierKind;
use super::classifier_pass::zeros;
use super::classifier_shards::{RowPart, Shards};
use crate::error::{Error, Result};

/// PartialFC's sampling of the classes. Default: every class (`rate` 1), no sampling.
///
/// With `rate < 1` the softmax runs over every class with a row in the batch (on every
/// process) and each other class with probability `rate`, drawn from `seed` and the class's
/// index only (module docs of `classifier_sample`). The same seed draws the same classes:
/// change it every step (`seed: base + step`).
///
/// # Example
/// ```
/// use wgpu_metric_learning::{ClassSampling, ClassifierLossConfig};
/// let cfg = ClassifierLossConfig { sampling: ClassSampling { rate: 0.1, seed: 7 }, ..Default::default() };
/// let drawn = (0..10_000u64).filter(|&j| cfg.sampling.draws(j)).count();
/// assert!((900..1100).contains(&drawn));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClassSampling {
    /// The probability that a class without a row in the batch takes part, in `(0, 1]`.
    /// Default 1: every class.
    pub rate: f32,
    /// The draw's seed. Default 0.
    pub seed: u64,
}

impl Default for ClassSampling {
    fn default() -> Self {
        Self { rate: 1.0, seed: 0 }
    }
}

impl ClassSampling {
    /// Whether it samples at all (`rate < 1`).
    pub fn is_active(&self) -> bool {
        self.rate < 1.0
    }

    /// Whether class `class` (numbered over every process's classes) is drawn: it takes part
    /// whether or not it has a row. Every class is drawn at `rate ≥ 1`.
    pub fn draws(&self, class: u64) -> bool {
        let u = (self.key(class) >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
        u < f64::from(self.rate)
    }

    /// The classes of `classes` (a shard's range, numbered over every process's) that a call
    /// with labels `labels` runs over: those with a row and those drawn, in order. Every class of the range when not sampling. Cost: one hash per class.
    ///
    /// # Example
    /// ```
    /// use wgpu_metric_learning::ClassSampling;
    /// let s = ClassSampling { rate: 1e-6, seed: 3 };
    /// assert_eq!(s.sample(100..200, &[150, 7, 150]), vec![150]);
    /// ```
    pub fn sample(&self, classes: std::ops::Range<usize>, labels: &[usize]) -> Vec<usize> {
        let first = classes.start;
        if !self.is_active() {
            return classes.collect();
        }
        let mut kept = draw(self, first, classes.len(), labels);
        for c in &mut kept {
            *c += first;
        }
        kept
    }

    /// The class's uniform 64-bit key (two rounds of splitmix64's finaliser).
    fn key(&self, class: u64) -> u64 {
        mix(self.seed ^ mix(class.wrapping_add(0x9E37_79B9_7F4A_7C15)))
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The sampling's own rules: a rate in `(0, 1]`, and a loss that is a softmax over classes.
pub(super) fn check(
    sampling: &ClassSampling,
    kind: &ClassifierKind,
    op: &'static str,
) -> Result<()> {
    let rate = sampling.rate;
    if !(rate > 0.0 && rate <= 1.0) {
        return Err(Error::InvalidParameter {
            op,
            what: "sampling.rate",
            value: rate.to_string(),
            rule: "a share of the classes in (0, 1]",
        });
    }
    if sampling.is_active() && matches!(kind, ClassifierKind::ProxyAnchor { .. }) {
        return Err(Error::InvalidParameter {
            op,
            what: "sampling.rate",
            value: format!("{rate} with ProxyAnchor"),
            rule: "PartialFC's sampling is for the softmax losses: ProxyAnchor's terms are per class, over every class",
        });
    }
    Ok(())
}

/// The shard's classes in the softmax, in order: indices into its `local` classes (numbered
/// from `first` over every shard) with a row among `labels` or drawn.
pub(super) fn draw(
    sampling: &ClassSampling,
    first: usize,
    local: usize,
    labels: &[usize],
) -> Vec<usize> {
    let mut positives: Vec<usize> = labels
        .iter()
        .filter(|&&y| y >= first && y - first < local)
        .map(|&y| y - first)
        .collect();
    positives.sort_unstable();
    positives.dedup();
    let mut kept = Vec::new();
    let mut next = positives.iter().copied().peekable();
    for c in 0..local {
        let positive = next.next_if_eq(&c).is_some();
        if positive || sampling.draws((first + c) as u64) {
            kept.push(c);
        }
    }
    kept
}

/// The labels over the shards' samples: a class of this shard's its place after the samples
/// of the shards of lower classes (`first_kept`); another shard's a class outside this
/// shard's range (its place is its own shard's business: its shard keeps it, so the samples
/// below this shard's are not empty when it is below, nor those above when it is above).
pub(super) fn renumber(
    labels: &[usize],
    (first, local): (usize, usize),
    kept: &[usize],
    first_kept: usize,
) -> Vec<usize> {
    labels
        .iter()
        .map(|&y| {
            if y < first {
                0
            } else if y - first < local {
                // Every class with a row is kept.
                first_kept + kept.binary_search(&(y - first)).unwrap_or(0)
            } else {
                first_kept + kept.len()
            }
        })
        .collect()
}

/// The kept classes' centres of `weights` in its layout (`on_rows`: a class's `per` centres
/// are rows, else columns).
pub(super) fn gather(
    weights: ArrayView2<'_, f32>,
    kept: &[usize],
    per: usize,
    on_rows: bool,
) -> Result<Array2<f32>> {
    let d = if on_rows {
        weights.ncols()
    } else {
        weights.nrows()
    };
    let centres = kept.len() * per;
    let shape = if on_rows { (centres, d) } else { (d, centres) };
    let mut out = zeros("classifier_loss::sampled weights (host)", shape)?;
    if on_rows {
        for (k, &c) in kept.iter().enumerate() {
            let rows = s![c * per..(c + 1) * per, ..];
            out.slice_mut(s![k * per..(k + 1) * per, ..])
                .assign(&weights.slice(rows));
        }
    } else {
        // Row by row of `(d, centres)`: each row read forward once (the kept are in order).
        for (mut to, from) in out.rows_mut().into_iter().zip(weights.rows()) {
            for (k, &c) in kept.iter().enumerate() {
                for t in 0..per {
                    to[k * per + t] = from[c * per + t];
                }
            }
        }
    }
    Ok(out)
}

/// The gradient of the kept classes' centres put back in the shard's `shape`, 0 elsewhere.
pub(super) fn scatter(
    part: &Array2<f32>,
    kept: &[usize],
    per: usize,
    on_rows: bool,
    shape: (usize, usize),
) -> Result<Array2<f32>> {
    let mut out = zeros("classifier_loss::weight_grad (host)", shape)?;
    if on_rows {
        for (k, &c) in kept.iter().enumerate() {
            out.slice_mut(s![c * per..(c + 1) * per, ..])
                .assign(&part.slice(s![k * per..(k + 1) * per, ..]));
        }
    } else {
        for (mut to, from) in out.rows_mut().into_iter().zip(part.rows()) {
            for (k, &c) in kept.iter().enumerate() {
                for t in 0..per {
                    to[c * per + t] = from[k * per + t];
                }
            }
        }
    }
    Ok(out)
}

/// A shard's exchanges, its classes numbered over the shards' samples.
pub(super) struct Renumbered<'a> {
    pub(super) inner: &'a dyn Shards,
    pub(super) first: usize,
    pub(super) classes: usize,
}

impl Shards for Renumbered<'_> {
    fn classes(&self, _local: usize) -> (usize, usize) {
        (self.first, self.classes)
    }

    fn combine_rows(&self, parts: &mut [RowPart]) -> Result<()> {
        self.inner.combine_rows(parts)
    }

    fn sum_rows(
        &self,
        gx: Array2<f32>,
        through: Vec<f64>,
    ) -> Result<(std::ops::Range<usize>, Array2<f32>, Vec<f64>)> {
        self.inner.sum_rows(gx, through)
    }

    fn sum(&self, v: f64) -> Result<f64> {
        self.inner.sum(v)
    }

    fn offsets(&self, first: usize, count: usize) -> Result<(usize, usize)> {
        self.inner.offsets(first, count)
    }

    fn alone(&self) -> bool {
        self.inner.alone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positives_are_always_kept_and_the_draw_ignores_the_split() {
        let s = ClassSampling {
            rate: 0.3,
            seed: 11,
        };
        let labels = [5usize, 17, 17, 40];
        let whole = draw(&s, 0, 60, &labels);
        for &y in &labels {
            assert!(whole.binary_search(&y).is_ok(), "{y} kept");
        }
        // Two shards of the same classes keep the same ones.
        let (a, b) = (draw(&s, 0, 25, &labels), draw(&s, 25, 35, &labels));
        let joined: Vec<usize> = a.iter().copied().chain(b.iter().map(|c| c + 25)).collect();
        assert_eq!(joined, whole);
        // About the rate among the others.
        let many = draw(&s, 0, 100_000, &[]);
        assert!((28_000..32_000).contains(&many.len()), "{}", many.len());
        // Nothing drawn and no positive: one class all the same.
        let tiny = ClassSampling {
            rate: 1e-9,
            seed: 1,
        };
        assert!(draw(&tiny, 3, 4, &[]).is_empty());
        assert_eq!(draw(&tiny, 3, 4, &[4, 6]), vec![1, 3]);
    }

    #[test]
    fn labels_renumber_over_the_samples() {
        // This shard: classes 10..20, kept 12, 15 (places 4, 5 after 4 earlier).
        let kept = [2usize, 5];
        let got = renumber(&[12, 15, 3, 25], (10, 10), &kept, 4);
        assert_eq!(got, vec![4, 5, 0, 6]);
    }
}
