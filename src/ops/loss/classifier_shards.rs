//! The classes split over processes: what the passes of [`super::classifier_pass`] and
//! [`super::classifier_anchor`] exchange with the other shards. One process is the single
//! shard [`Whole`], which exchanges nothing; `distributed::classifier_loss` is the other.
//!
//! A shard holds a contiguous range of the classes and every row of the batch. After pass 1,
//! each row's running maximum, sum and target logit are combined over the shards (length-`b`
//! vectors; the target's shard alone has it). After pass 2, the rows' gradients (and, where
//! the logit has the row's norm, its `Σ ∂L/∂z · z`) are summed over the shards and each
//! process keeps its own rows. A shard's class weights' gradient is complete on that shard.

use std::ops::Range;

use ndarray::Array2;

use crate::error::Result;

/// A row's pass-1 state on one shard: its largest logit over the shard's classes, its sum of
/// `exp(z − max)` over them, and its target's logit (NaN where another shard has the target).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RowPart {
    pub(crate) max: f32,
    pub(crate) sum: f64,
    pub(crate) target: f64,
}

/// What a shard exchanges with the others (every shard calls each method in the same order).
pub(crate) trait Shards {
    /// The shard's first class and the number of classes over every shard, given the shard's
    /// own `local` classes.
    fn classes(&self, local: usize) -> (usize, usize);

    /// Replaces each row's part with its combination over every shard ([`combine`]), the same
    /// on every shard.
    ///
    /// # Errors
    /// The exchange's ([`crate::Error::Timeout`], [`crate::Error::RankFailed`]).
    fn combine_rows(&self, parts: &mut [RowPart]) -> Result<()>;

    /// Sums the rows' gradient `gx` `(rows, d)` and their `through` terms over the shards;
    /// returns this process's rows (their range, gradient and terms).
    ///
    /// # Errors
    /// As [`Shards::combine_rows`].
    fn sum_rows(
        &self,
        gx: Array2<f32>,
        through: Vec<f64>,
    ) -> Result<(Range<usize>, Array2<f32>, Vec<f64>)>;

    /// `v` summed over the shards, the same on every shard.
    ///
    /// # Errors
    /// As [`Shards::combine_rows`].
    fn sum(&self, v: f64) -> Result<f64>;
}

/// One process, every class: nothing to exchange.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Whole;

impl Shards for Whole {
    fn classes(&self, local: usize) -> (usize, usize) {
        (0, local)
    }

    fn combine_rows(&self, _parts: &mut [RowPart]) -> Result<()> {
        Ok(())
    }

    fn sum_rows(
        &self,
        gx: Array2<f32>,
        through: Vec<f64>,
    ) -> Result<(Range<usize>, Array2<f32>, Vec<f64>)> {
        Ok((0..gx.nrows(), gx, through))
    }

    fn sum(&self, v: f64) -> Result<f64> {
        Ok(v)
    }
}

/// One row's parts from every shard, in shard order, as one: the largest maximum, the sums
/// rescaled to it (in f64), and the one target that is there (NaN if none is).
#[cfg(any(feature = "mpi", test))]
pub(crate) fn combine(parts: impl Iterator<Item = RowPart> + Clone) -> RowPart {
    let max = parts
        .clone()
        .fold(f32::NEG_INFINITY, |m, p| if p.max > m { p.max } else { m });
    let mut sum = 0.0f64;
    let mut target = f64::NAN;
    for p in parts {
        // A shard whose logits all underflowed (or that had none) adds nothing.
        if p.max > f32::NEG_INFINITY {
            sum += p.sum * (f64::from(p.max) - f64::from(max)).exp();
        }
        if target.is_nan() {
            target = p.target;
        }
    }
    RowPart { max, sum, target }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_combine_as_one_row_over_every_class() {
        // Logits 1, 3 on one shard, 2 and the target 0.5 on the other.
        let a = RowPart {
            max: 3.0,
            sum: (1.0f64 - 3.0).exp() + 1.0,
            target: f64::NAN,
        };
        let b = RowPart {
            max: 2.0,
            sum: 1.0 + (0.5f64 - 2.0).exp(),
            target: 0.5,
        };
        let c = combine([a, b].into_iter());
        let whole: f64 = [1.0f64, 3.0, 2.0, 0.5]
            .iter()
            .map(|z| (z - 3.0).exp())
            .sum();
        assert_eq!(c.max, 3.0);
        assert!((c.sum - whole).abs() < 1e-15, "{} vs {whole}", c.sum);
        assert_eq!(c.target, 0.5);
        let empty = RowPart {
            max: f32::NEG_INFINITY,
            sum: 0.0,
            target: f64::NAN,
        };
        assert_eq!(combine([empty, b].into_iter()), b);
    }
}
