//! Recovery from the driver's out-of-memory: the wgpu path plans its tiles under the budget,
//! but the device may still refuse an allocation (other processes, fragmentation, a heap the
//! driver does not report). Then the operation runs again under half the planning budget,
//! down to its smallest tile, before the error reaches the caller.
//!
//! Plans read [`planning_budget`], which the retry lowers for the calling thread only; the
//! budget accounting itself is unchanged, so other threads sharing the context are not slowed.

use std::cell::Cell;

use ndarray::{s, ArrayView2};

use crate::context::Context;
use crate::error::{Error, Result};

thread_local! {
    /// The planning cap of the operation running on this thread (`u64::MAX`: none).
    static CAP: Cell<u64> = const { Cell::new(u64::MAX) };
}

/// Bytes an operation may plan its tiles for: what the budget leaves, lowered while retrying.
pub(crate) fn planning_budget(ctx: &Context) -> u64 {
    ctx.tracker().available().min(CAP.with(Cell::get))
}

/// Lowers the calling thread's planning budget to at most `cap` while it lives (a plan that
/// sets aside what its call would allocate before tiling: imported device rows).
pub(crate) struct CapGuard {
    outer: u64,
}

impl CapGuard {
    pub(crate) fn new(cap: u64) -> Self {
        let outer = CAP.with(|c| c.replace(cap.min(c.get())));
        Self { outer }
    }
}

impl Drop for CapGuard {
    fn drop(&mut self) {
        CAP.with(|c| c.set(self.outer));
    }
}

/// Runs `attempt` until it does not fail with [`Error::OutOfMemory`], halving the planning
/// budget after each failure. `attempt` must make a retry safe (rewind what it delivered);
/// every buffer of a failed attempt has been dropped, and so released, before the next one.
/// When even the smaller plan cannot be made (the tile is already minimal), the driver's
/// out-of-memory error is returned, not the planner's.
pub(crate) fn retry<T>(ctx: &Context, mut attempt: impl FnMut() -> Result<T>) -> Result<T> {
    let mut cap = planning_budget(ctx);
    let mut refused: Option<Error> = None;
    loop {
        let outer = CAP.with(|c| c.replace(cap));
        let result = attempt();
        CAP.with(|c| c.set(outer));
        match result {
            Err(e @ Error::OutOfMemory { .. }) if cap > 1 => {
                log::warn!("{e}; retrying with a planning budget of {} bytes", cap / 2);
                cap /= 2;
                refused = Some(e);
            }
            Err(e @ (Error::OverBudget { .. } | Error::DeviceLimit { .. })) => {
                return Err(refused.unwrap_or(e));
            }
            other => return other,
        }
    }
}

/// Receives consecutive blocks of whole rows `(row0, (rows, n))`.
pub(crate) type RowSink<'s> = dyn FnMut(usize, ArrayView2<'_, f32>) -> Result<()> + 's;

/// [`retry`] for producers of row blocks: a retry starts over, but rows already handed to
/// `on_block` are not handed again (every attempt produces consecutive rows from row 0, in
/// blocks whose boundaries may differ with the tile size).
pub(crate) fn retry_rows(
    ctx: &Context,
    on_block: &mut RowSink<'_>,
    mut produce: impl FnMut(&mut RowSink<'_>) -> Result<()>,
) -> Result<()> {
    let mut delivered = 0usize;
    retry(ctx, || {
        let mut resume = |r0: usize, block: ArrayView2<'_, f32>| {
            let end = r0 + block.nrows();
            if end <= delivered {
                return Ok(());
            }
            let skip = delivered.saturating_sub(r0);
            on_block(r0 + skip, block.slice(s![skip.., ..]))?;
            delivered = end;
            Ok(())
        };
        produce(&mut resume)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;

    fn oom() -> Error {
        Error::OutOfMemory {
            label: "test",
            requested: 1,
            message: "refused".into(),
            source: None,
        }
    }

    #[test]
    fn row_blocks_resume_after_a_retry_and_the_cap_halves() {
        let ctx = Context::native_cpu(Some(1 << 20));
        let rows = Array2::from_shape_fn((5, 2), |(i, j)| (10 * i + j) as f32);
        let mut seen = Vec::new();
        let mut caps = Vec::new();
        let mut on_block = |r0: usize, block: ArrayView2<'_, f32>| {
            for (i, row) in block.rows().into_iter().enumerate() {
                seen.push((r0 + i, row[0]));
            }
            Ok(())
        };
        retry_rows(&ctx, &mut on_block, |on_block| {
            caps.push(planning_budget(&ctx));
            // Blocks of 3 rows on the first attempt, which fails after one; of 2 after.
            let step = if caps.len() == 1 { 3 } else { 2 };
            for r0 in (0..5).step_by(step) {
                let end = (r0 + step).min(5);
                on_block(r0, rows.slice(s![r0..end, ..]))?;
                if caps.len() == 1 {
                    return Err(oom());
                }
            }
            Ok(())
        })
        .expect("the second attempt succeeds");
        let want: Vec<(usize, f32)> = (0..5).map(|i| (i, (10 * i) as f32)).collect();
        assert_eq!(seen, want, "each row once, in order");
        assert_eq!(caps, vec![1 << 20, 1 << 19]);
        assert_eq!(
            planning_budget(&ctx),
            1 << 20,
            "the cap ends with the operation"
        );
    }

    #[test]
    fn when_the_smaller_plan_cannot_be_made_the_refusal_is_returned() {
        let ctx = Context::native_cpu(Some(1 << 20));
        let mut attempts = 0;
        let got: Result<()> = retry(&ctx, || {
            attempts += 1;
            match attempts {
                1 => Err(oom()),
                _ => Err(Error::OverBudget {
                    op: "test",
                    required: 1 << 20,
                    budget: planning_budget(&ctx),
                }),
            }
        });
        assert!(matches!(got, Err(Error::OutOfMemory { .. })), "{got:?}");
        assert_eq!(attempts, 2);
    }
}
