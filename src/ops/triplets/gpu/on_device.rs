//! Triplets left on the device: the rows expanded there, chunk by chunk and window by window,
//! into the caller's array (`shaders/triplet_expand.wgsl`), in the host miner's order.
//!
//! The rows are written from each `(anchor, positive)` pair and its run of negatives: every
//! valid triplet expands the anchors' negative lists, a margin rule its kept negatives. The
//! host sends each window's segments (16 bytes per `(anchor, positive)` pair with triplets; a
//! margin rule, 8 more of offsets per pair) and reads back counts only: for a margin rule the
//! per-pair counts (4 bytes per pair, as the host miner), and 8 bytes per anchor of list sizes
//! to check. The array is sized by the count before anything is written: every valid triplet
//! is counted by label arithmetic; a margin rule whose anchors fit one chunk, with the array
//! beside it, is counted and written in one pass (`mine_in_one_chunk`); otherwise it is
//! counted first (one more pass over the distances), then mined in chunks in what the array
//! leaves of the budget. Progress covers both passes (`2 · b · m` pairs for a margin rule,
//! all reported when one pass did both).

use super::{Miner, Segment};
use crate::context::Context;
use crate::data::device_output::DeviceArray;
use crate::error::{Error, Result};
use crate::hooks::Reporter;
use crate::kernels::triplet_expand::{self, ExpandBuffers};
use crate::ops::triplets::{Problem, TripletRule, OP};
use crate::runtime::device::GpuDevice;
use crate::runtime::memory::TrackedBuffer;
use crate::runtime::transfer::{self, f32s, Recorder};

impl Miner<'_, '_> {
    /// Device output: records the expansion of one window's `segments` (none empty, at most
    /// `layout.out` rows in all), their negatives read from `source`, and the copy of the rows
    /// into `dst` from row `*row` on, which it advances.
    pub(super) fn record_expand(
        &self,
        rec: &mut Recorder<'_>,
        segments: &[Segment],
        source: &TrackedBuffer,
        dst: &DeviceArray<u32>,
        row: &mut u64,
    ) -> Result<()> {
        let Some(expand) = &self.expand else {
            return Err(Error::Internal {
                op: OP,
                message: "device output without the expansion kernel".into(),
            });
        };
        let mut starts = Vec::with_capacity(segments.len() + 1);
        let mut heads = Vec::with_capacity(2 * segments.len());
        let mut sources = Vec::with_capacity(segments.len());
        let mut rows = 0u32;
        for s in segments {
            starts.push(rows);
            heads.extend(s.head);
            sources.push(s.source);
            rows += s.rows;
        }
        starts.push(rows);
        // Bound the copy by the result's own rows: more would mean that the counts the
        // result was sized by and the device's disagree.
        if rows == 0 {
            return Ok(());
        }
        if *row + u64::from(rows) > dst.dim().0 as u64 || rows as usize > self.layout.out {
            return Err(Error::Internal {
                op: OP,
                message: format!(
                    "{rows} rows at row {row} of a ({}, 3) result (windows of {})",
                    dst.dim().0,
                    self.layout.out
                ),
            });
        }
        let buf = &self.buf;
        let params = triplet_expand::Params {
            segments: segments.len() as u32,
            rows,
            _pad: [0; 2],
        };
        rec.upload(&buf.expand_params, 0, &[params])?;
        rec.upload(&buf.starts, 0, &starts)?;
        rec.upload(&buf.heads, 0, &heads)?;
        rec.upload(&buf.sources, 0, &sources)?;
        rec.sentinel(&buf.expanded, f32s(3 * rows as usize))?;
        expand.encode(
            rec,
            u64::from(rows),
            &ExpandBuffers {
                params: &buf.expand_params,
                starts: &buf.starts,
                heads: &buf.heads,
                sources: &buf.sources,
                source,
                out: &buf.expanded,
            },
        )?;
        rec.copy(
            &buf.expanded,
            0,
            dst.tracked(),
            12 * *row,
            12 * u64::from(rows),
        );
        *row += u64::from(rows);
        Ok(())
    }

    /// Device output, every valid triplet of anchors `a0 .. a0 + rows`: their lists, then
    /// windows of `(anchor, positive)` segments over the negative lists (one submission
    /// each, no wait), and the list sizes checked (one wait).
    pub(super) fn all_valid_on_device(
        &self,
        (a0, rows): (usize, usize),
        dst: &DeviceArray<u32>,
        row: &mut u64,
        report: &Reporter<'_>,
    ) -> Result<()> {
        let (gpu, m) = (self.gpu, self.layout.refs);
        let mut rec = Recorder::new(gpu, "mine_triplets::lists");
        self.record_lists(&mut rec, a0, rows)?;
        let done = rec.submit()?;
        let sizes = self.map_list_sizes(&done, rows);
        let mut window: Vec<Segment> = Vec::new();
        let mut in_window = 0;
        let mut submit = |window: &mut Vec<Segment>| -> Result<()> {
            report.check()?;
            let mut rec = Recorder::new(gpu, "mine_triplets::expand");
            self.record_expand(&mut rec, window, &self.buf.negatives, dst, row)?;
            window.clear();
            rec.submit().map(|_| ())
        };
        for (a, size) in self.sizes(a0, rows).chunks_exact(2).enumerate() {
            let (positives, negatives) = (size[0] as usize, size[1]);
            if negatives == 0 {
                continue;
            }
            for i in 0..positives {
                if in_window + negatives as usize > self.layout.out {
                    submit(&mut window)?;
                    in_window = 0;
                }
                window.push(Segment {
                    head: [(a0 + a) as u32, self.positive(a0 + a, i)],
                    source: (a * m) as u32,
                    rows: negatives,
                });
                in_window += negatives as usize;
            }
        }
        submit(&mut window)?;
        self.check_list_sizes(sizes, a0, self.sizes(a0, rows))
    }

    /// Device output, a margin rule's kept triplets of the chunk's pairs: per window, the
    /// emit and the expansion of its pairs' runs (one submission each, no wait).
    pub(super) fn emit_on_device(
        &mut self,
        (a0, pair_base): (usize, &[u32]),
        counts: &[u32],
        dst: &DeviceArray<u32>,
        row: &mut u64,
        report: &Reporter<'_>,
    ) -> Result<()> {
        let (offsets, windows) = self.windows(counts);
        for (i, window) in windows.iter().enumerate() {
            report.check()?;
            let mut rec = Recorder::new(self.gpu, "mine_triplets::emit");
            self.record_emit(&mut rec, window, &offsets, i == 0)?;
            // The window's negatives lie in `out` in pair order, each pair's run at its
            // count's prefix sum.
            let mut at = 0;
            let segments: Vec<Segment> = window
                .0
                .clone()
                .zip(self.pair_heads(a0, pair_base, window.0.clone()))
                .filter_map(|(pair, head)| {
                    let rows = counts[pair as usize];
                    let segment = Segment {
                        head,
                        source: at,
                        rows,
                    };
                    at += rows;
                    (rows > 0).then_some(segment)
                })
                .collect();
            self.record_expand(&mut rec, &segments, &self.buf.out, dst, row)?;
            rec.submit()?;
        }
        Ok(())
    }
}

/// Mines `problem` on `gpu` into `dst` `(t, 3)`, which its count sized: the rows are written
/// on the device, chunk by chunk and window by window, in `mine`'s order; the call waits
/// once at its end (besides the waits for counts and list sizes) and reads no triplet back.
/// Reports each anchor chunk's `rows × m` pairs and checks for cancellation before each.
pub(in crate::ops::triplets) fn mine_on_device(
    ctx: &Context,
    gpu: &GpuDevice,
    problem: &Problem<'_>,
    dst: &DeviceArray<u32>,
    report: &Reporter<'_>,
) -> Result<()> {
    let b = problem.set.labels.len();
    let m = problem.set.ref_labels.len();
    let mut miner = Miner::new(ctx, gpu, problem, true, true)?;
    let mut row = 0u64;
    for a0 in (0..b).step_by(miner.layout.anchors) {
        report.check()?;
        let rows = miner.layout.anchors.min(b - a0);
        if problem.rule == TripletRule::AllValid {
            miner.all_valid_on_device((a0, rows), dst, &mut row, report)?;
        } else {
            let (pair_base, counts) = miner.pair_counts(a0, rows)?;
            miner.emit_on_device((a0, &pair_base), &counts, dst, &mut row, report)?;
        }
        report.add((rows * m) as u64);
    }
    if row != dst.dim().0 as u64 {
        return Err(Error::Internal {
            op: OP,
            message: format!("{row} triplets written of {} counted", dst.dim().0),
        });
    }
    // Nothing to read: wait so that the call's buffers are idle when it frees them, and a lost
    // device is this call's error.
    transfer::wait_all(gpu)
}
