//! The classes split over processes: what the passes of [`super::classifier_pass`] and
//! [`super::classifier_anchor`] exchange with the other shards. One process is the single
//! shard [`Whole`], which exchanges nothing; [`Exchange`] runs the exchanges on any engine's
//! [`ShardCollectives`] (MPI's in `distributed`, torch.distributed's from Python).
//!
//! A shard holds a contiguous range of the classes and every row of the batch. After pass 1,
//! each row's running maximum, sum and target logit are combined over the shards (length-`b`
//! vectors; the target's shard alone has it). After pass 2, the rows' gradients (and, where
//! the logit has the row's norm, its `Σ ∂L/∂z · z`) are summed over the shards and each
//! process keeps its own rows. A shard's class weights' gradient is complete on that shard.

use std::cell::Cell;
use std::ops::Range;

use ndarray::Array2;

use crate::error::{Error, Result};
use crate::hooks::Hooks;

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

    /// Given this shard's first class and its `count` of something (its sampled classes), the
    /// sum of the counts of the shards whose classes come before its own, and the sum of all.
    ///
    /// # Errors
    /// As [`Shards::combine_rows`].
    fn offsets(&self, first: usize, count: usize) -> Result<(usize, usize)>;

    /// Whether this is the only shard: one process, every class (the device path's calls).
    fn alone(&self) -> bool;
}

/// One process, every class: nothing to exchange. Its classes are numbered from 0, or as the
/// `(first, classes)` given (a shard's own checks and plan, which exchange nothing either).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Whole(pub(crate) Option<(usize, usize)>);

impl Shards for Whole {
    fn classes(&self, local: usize) -> (usize, usize) {
        self.0.unwrap_or((0, local))
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

    fn offsets(&self, _first: usize, count: usize) -> Result<(usize, usize)> {
        Ok((0, count))
    }

    fn alone(&self) -> bool {
        self.0.is_none()
    }
}

/// One row's parts from every shard, in shard order, as one: the largest maximum, the sums
/// rescaled to it (in f64), and the one target that is there (NaN if none is).
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

/// The collectives a class-sharded classifier loss asks of whatever connects the processes
/// (MPI, torch.distributed, …). Every process calls them in the same order; each call
/// returns the same answer on every process.
pub trait ShardCollectives {
    /// This process's place, `0 ≤ rank < size`.
    fn rank(&self) -> usize;
    /// The number of processes.
    fn size(&self) -> usize;
    /// Every process's `values` (the same length on each), concatenated in rank order.
    ///
    /// # Errors
    /// The engine's, as [`Error::RankFailed`] or [`Error::Timeout`].
    fn all_gather(&self, values: &[f64]) -> Result<Vec<f64>>;
    /// Block `rank` of the element-wise sum over every process of `send` (`size · block`
    /// values, in blocks in rank order).
    ///
    /// # Errors
    /// As [`ShardCollectives::all_gather`].
    fn reduce_scatter(&self, send: Vec<f64>, block: usize) -> Result<Vec<f64>>;
    /// Makes `local` collective: `Err` on every process when it is one on any (its own
    /// error there, [`Error::RankFailed`] elsewhere). The default exchanges one word.
    ///
    /// # Errors
    /// As above, and as [`ShardCollectives::all_gather`].
    fn agree(&self, op: &'static str, local: Result<()>) -> Result<()> {
        let failed = f64::from(u8::from(local.is_err()));
        let all = self.all_gather(&[failed])?;
        local?;
        match all.iter().position(|&v| v != 0.0) {
            Some(rank) => Err(Error::RankFailed {
                op,
                rank,
                message: "its part failed or was cancelled".into(),
            }),
            None => Ok(()),
        }
    }
}

/// Where this process's part of a class-sharded loss sits. See
/// [`classifier_loss_sharded`](crate::classifier_loss_sharded).
///
/// # Example
/// ```
/// use wgpu_metric_learning::ClassShard;
/// // The second of 3 processes, holding classes 40..80 of 100; 5, 7 and 6 rows.
/// let shard = ClassShard { first_class: 40, classes: 100, rows_of: vec![5, 7, 6] };
/// # let _ = shard;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassShard {
    /// This process's first class, numbered over every process's classes (its weights hold
    /// the classes from there, contiguous).
    pub first_class: usize,
    /// The classes over every process.
    pub classes: usize,
    /// Every process's rows, in rank order: the embeddings hold them all, concatenated.
    pub rows_of: Vec<usize>,
}

/// The exchanges of [`Shards`] on an engine's collectives: the rows' states gathered and
/// combined in rank order, the rows' gradients reduced and scattered (in f64, each process's
/// rows padded to the longest's), the cancellation agreed between the passes.
///
/// No process is left waiting when another fails on its own after the call's agreement (a
/// reservation raced by another thread, a failed allocation): every exchange opens with an
/// agreement, and [`Exchange::settle`] ends the call with one more. A process that fails
/// takes part in the next agreement with its error and returns, so the others meet it there
/// and return [`Error::RankFailed`] naming it, instead of waiting in an exchange it never
/// joins. An exchange that fails on one process only (its engine's own error) is the
/// engine's to end: the others wait for its timeout.
pub(crate) struct Exchange<'a> {
    op: &'static str,
    shard: &'a ClassShard,
    engine: &'a dyn ShardCollectives,
    hooks: &'a Hooks,
    /// An agreement or an exchange failed: every process knows already (or the engine is
    /// broken), and none waits for another agreement.
    settled: Cell<bool>,
}

impl<'a> Exchange<'a> {
    pub(crate) fn new(
        op: &'static str,
        shard: &'a ClassShard,
        engine: &'a dyn ShardCollectives,
        hooks: &'a Hooks,
    ) -> Self {
        Self {
            op,
            shard,
            engine,
            hooks,
            settled: Cell::new(false),
        }
    }

    /// `out`, the result of the call's local work and exchanges, made collective: `Ok` on
    /// every process, or `Err` on every process (this one's own error where it failed,
    /// [`Error::RankFailed`] naming it elsewhere).
    ///
    /// # Errors
    /// `out`'s, or another process's as above, or the engine's.
    pub(crate) fn settle<T>(&self, out: Result<T>) -> Result<T> {
        if self.settled.get() {
            return out;
        }
        match out {
            Ok(v) => self.agree(Ok(())).map(|()| v),
            Err(e) => match self.agree(Err(e)) {
                Err(e) => Err(e),
                // An engine whose `agree` dropped this process's error.
                Ok(()) => Err(Error::RankFailed {
                    op: self.op,
                    rank: self.engine.rank(),
                    message: "its part failed".into(),
                }),
            },
        }
    }

    /// The engine's agreement on `local`, remembered when it fails.
    fn agree(&self, local: Result<()>) -> Result<()> {
        self.settled_on(self.engine.agree(self.op, local))
    }

    /// `out` of an exchange, remembered when it fails.
    fn settled_on<T>(&self, out: Result<T>) -> Result<T> {
        if out.is_err() {
            self.settled.set(true);
        }
        out
    }
}

impl Shards for Exchange<'_> {
    fn classes(&self, _local: usize) -> (usize, usize) {
        (self.shard.first_class, self.shard.classes)
    }

    fn combine_rows(&self, parts: &mut [RowPart]) -> Result<()> {
        // Cancelled between the passes on every process alike.
        self.agree(self.hooks.check(self.op))?;
        let mine: Vec<f64> = parts
            .iter()
            .flat_map(|p| [f64::from(p.max), p.sum, p.target])
            .collect();
        let all = self.settled_on(self.engine.all_gather(&mine))?;
        let b = parts.len();
        if all.len() != b * 3 * self.engine.size() {
            return Err(Error::Shape {
                op: self.op,
                what: "row states gathered from every process",
                expected: format!("{} values", b * 3 * self.engine.size()),
                got: vec![all.len()],
            });
        }
        for (i, p) in parts.iter_mut().enumerate() {
            let of_rank = (0..self.engine.size()).map(|r| {
                let v = &all[(r * b + i) * 3..(r * b + i) * 3 + 3];
                RowPart {
                    max: v[0] as f32,
                    sum: v[1],
                    target: v[2],
                }
            });
            *p = combine(of_rank);
        }
        Ok(())
    }

    fn sum_rows(
        &self,
        gx: Array2<f32>,
        through: Vec<f64>,
    ) -> Result<(Range<usize>, Array2<f32>, Vec<f64>)> {
        self.agree(Ok(()))?;
        let d = gx.ncols();
        let rows_of = &self.shard.rows_of;
        let most = rows_of.iter().copied().max().unwrap_or(0);
        let block = most * (d + 1);
        // Each process's rows in a block of the longest's size, each row its gradient and
        // its term.
        let mut send = vec![0.0f64; block * rows_of.len()];
        let mut at = 0;
        for (r, &n) in rows_of.iter().enumerate() {
            for i in 0..n {
                let row = &mut send[r * block + i * (d + 1)..r * block + (i + 1) * (d + 1)];
                for (v, &g) in row.iter_mut().zip(gx.row(at + i)) {
                    *v = f64::from(g);
                }
                row[d] = through[at + i];
            }
            at += n;
        }
        let recv = self.settled_on(self.engine.reduce_scatter(send, block))?;
        let rank = self.engine.rank();
        let n = rows_of[rank];
        if recv.len() < n * (d + 1) {
            return Err(Error::Shape {
                op: self.op,
                what: "rows' gradients scattered to this process",
                expected: format!("{} values", n * (d + 1)),
                got: vec![recv.len()],
            });
        }
        let start: usize = rows_of[..rank].iter().sum();
        let mut own = Array2::<f32>::zeros((n, d));
        let mut terms = Vec::with_capacity(n);
        for (i, mut row) in own.rows_mut().into_iter().enumerate() {
            let v = &recv[i * (d + 1)..(i + 1) * (d + 1)];
            for (o, &g) in row.iter_mut().zip(v) {
                *o = g as f32;
            }
            terms.push(v[d]);
        }
        Ok((start..start + n, own, terms))
    }

    fn sum(&self, v: f64) -> Result<f64> {
        self.agree(Ok(()))?;
        Ok(self.settled_on(self.engine.all_gather(&[v]))?.iter().sum())
    }

    fn offsets(&self, first: usize, count: usize) -> Result<(usize, usize)> {
        // Class indices and counts: exact in f64 (below 2^53). The shards' classes are
        // ordered by their first class, whatever their ranks.
        self.agree(Ok(()))?;
        let all = self.settled_on(self.engine.all_gather(&[first as f64, count as f64]))?;
        if all.len() != 2 * self.engine.size() {
            return Err(Error::Shape {
                op: self.op,
                what: "first classes and counts gathered from every process",
                expected: format!("{} values", 2 * self.engine.size()),
                got: vec![all.len()],
            });
        }
        let shards = all.chunks_exact(2);
        let before: f64 = shards
            .clone()
            .filter(|s| s[0] < first as f64)
            .map(|s| s[1])
            .sum();
        let total: f64 = shards.map(|s| s[1]).sum();
        Ok((before as usize, total as usize))
    }

    fn alone(&self) -> bool {
        false
    }
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
