//! The values of every positive and every negative pair, for the miners that select among
//! all pairs at once (`HDCMiner`'s top-k, `UniformHistogramMiner`'s bins): visited as many
//! times as the miner needs, from the host when they fit [`KEPT_PAIRS`], else computed again
//! by the distance tile for each visit, so that host memory stays bounded either way.

use crate::context::Context;
use crate::data::inputs::Labelled;
use crate::error::{Error, Result};
use crate::hooks::{Hooks, Reporter};
use crate::metric::DistanceConfig;
use crate::runtime::memory::Transfers;

use super::rows::for_each_row_reporting;
use crate::ops::triplets::list_sizes;

/// Most pairs kept on the host between visits: 4 Mi pairs, 48 MiB.
const KEPT_PAIRS: u64 = 1 << 22;

/// Which side of a pair: positive (same label) or negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Positive = 0,
    Negative = 1,
}

/// One pair: its side, its value, its anchor and its reference.
pub(super) type Visit<'f> = dyn FnMut(Side, f32, u32, u32) + 'f;

/// The pairs of a validated set, visited in row-major order (each anchor's positives
/// ascending, then its negatives ascending).
pub(super) struct PairValues<'s, 'a> {
    op: &'static str,
    ctx: &'s Context,
    set: &'s Labelled<'a>,
    distance: &'s DistanceConfig,
    report: Reporter<'s>,
    /// The number of positive and negative pairs.
    pub(super) counts: [u64; 2],
    /// After the first visit, every pair `(value, anchor, reference)` per side, when they fit.
    kept: Option<[Vec<(f32, u32, u32)>; 2]>,
    keep: bool,
    visits: u32,
    transfers: Transfers,
}

impl<'s, 'a> PairValues<'s, 'a> {
    /// Pairs for at most `visits` visits (the progress total: `b · m` pairs per distance pass).
    pub(super) fn new(
        op: &'static str,
        ctx: &'s Context,
        set: &'s Labelled<'a>,
        distance: &'s DistanceConfig,
        hooks: &'s Hooks,
        visits: u32,
    ) -> Self {
        let counts = pair_counts(set);
        let keep = counts[0] + counts[1] <= KEPT_PAIRS;
        let passes = if keep { 1 } else { u64::from(visits) };
        let pairs = set.labels.len() as u64 * set.ref_labels.len() as u64;
        Self {
            op,
            ctx,
            set,
            distance,
            report: Reporter::new(hooks, op, pairs.saturating_mul(passes)),
            counts,
            kept: None,
            keep,
            visits: 0,
            transfers: Transfers::default(),
        }
    }

    /// Calls `f` for every pair, in row-major order.
    pub(super) fn visit(&mut self, f: &mut Visit<'_>) -> Result<()> {
        self.report.check()?;
        if let Some(kept) = &self.kept {
            for (side, pairs) in [Side::Positive, Side::Negative].into_iter().zip(kept) {
                for &(v, a, r) in pairs {
                    f(side, v, a, r);
                }
            }
            return Ok(());
        }
        let mut kept: [Vec<(f32, u32, u32)>; 2] = if self.keep {
            [
                Vec::with_capacity(self.counts[0] as usize),
                Vec::with_capacity(self.counts[1] as usize),
            ]
        } else {
            [Vec::new(), Vec::new()]
        };
        let keep = self.keep;
        let pairs = self.set.labels.len() as u64 * self.set.ref_labels.len() as u64;
        let part = self.report.part(pairs);
        let transfers = for_each_row_reporting(
            self.op,
            self.ctx,
            self.set,
            self.distance,
            &part,
            &mut |row| {
                for (side, refs) in [
                    (Side::Positive, row.positives),
                    (Side::Negative, row.negatives),
                ] {
                    for &r in refs {
                        let v = row.value(r);
                        f(side, v, row.anchor, r);
                        if keep {
                            kept[side as usize].push((v, row.anchor, r));
                        }
                    }
                }
            },
        )?;
        self.transfers.add(transfers);
        self.visits += 1;
        if keep {
            self.kept = Some(kept);
        }
        Ok(())
    }

    /// A visit the miner does not need: when the values are computed again for each visit,
    /// its progress is reported as done, so that the call's progress reaches its total.
    pub(super) fn skip(&self) {
        if !self.keep {
            let pairs = self.set.labels.len() as u64 * self.set.ref_labels.len() as u64;
            self.report.part(pairs).add(pairs);
        }
    }

    /// The error for a visit that met other values than an earlier one (the distances of
    /// two passes must agree bit for bit).
    pub(super) fn inconsistent(&self) -> Error {
        Error::Internal {
            op: self.op,
            message: "a visit of the pair values saw other values than the last".into(),
        }
    }

    /// The host–device traffic of the call: the import of device-buffer inputs and every
    /// visit so far.
    pub(super) fn transfers(&self) -> Transfers {
        let mut t = self.transfers;
        t.add(self.set.imported);
        t
    }
}

/// The number of positive pairs (same label, not the anchor's own slot) and of negative
/// pairs, from the labels alone.
fn pair_counts(set: &Labelled<'_>) -> [u64; 2] {
    list_sizes(set).fold([0, 0], |[p, n], (pa, na)| [p + pa, n + na])
}
