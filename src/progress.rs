//! Progress reports of long searches ([`crate::knn_with_progress`],
//! [`crate::accuracy_with_progress`]), counted in query–reference pairs compared.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// How far a search has got: pairs of (query, reference) compared so far, of the total.
/// Reports arrive in increasing order of `done`, never two at once, and the last one has
/// `done == total` (a search with nothing to compare reports nothing).
///
/// # Example
/// ```
/// use wgpu_metric_learning::Progress;
/// let p = Progress { done: 250, total: 1000 };
/// assert_eq!(p.fraction(), 0.25);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Pairs compared so far.
    pub done: u64,
    /// Pairs the search compares in all (`q · n`).
    pub total: u64,
}

impl Progress {
    /// `done / total` in `[0, 1]`; 1 for an empty search.
    ///
    /// See the example of [`Progress`].
    pub fn fraction(&self) -> f64 {
        match self.total {
            0 => 1.0,
            t => self.done as f64 / t as f64,
        }
    }
}

/// A caller's progress callback: called from the worker threads of the native path, hence
/// `Sync`. Any closure `Fn(Progress) + Sync` coerces to it by reference.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{Progress, ProgressFn};
/// let print = |p: Progress| eprintln!("{:.0}%", 100.0 * p.fraction());
/// let callback: ProgressFn<'_> = &print;
/// callback(Progress { done: 1, total: 2 });
/// ```
pub type ProgressFn<'a> = &'a (dyn Fn(Progress) + Sync);

/// Sums the work finished on any thread and hands it to the callback, one call at a time.
pub(crate) struct Reporter<'a> {
    callback: Option<ProgressFn<'a>>,
    total: u64,
    /// Pairs done by this attempt, and the most ever reported. Held while the callback
    /// runs, so that reports never overtake each other.
    done: Mutex<(u64, u64)>,
}

impl<'a> Reporter<'a> {
    pub(crate) fn new(callback: Option<ProgressFn<'a>>, total: u64) -> Self {
        Self {
            callback,
            total,
            done: Mutex::new((0, 0)),
        }
    }

    /// A reporter that tells no one (the plain entry points).
    pub(crate) fn silent() -> Self {
        Self::new(None, 0)
    }

    /// Reports what `finished` (a running total kept by device callbacks) holds beyond
    /// `seen`, the total reported before; returns the new total.
    pub(crate) fn catch_up(&self, finished: &AtomicU64, seen: u64) -> u64 {
        let now = finished.load(Ordering::Relaxed);
        if now > seen {
            self.add(now - seen);
        }
        now.max(seen)
    }

    /// Records `pairs` more pairs compared; reports only progress beyond what was reported
    /// before (a retried search catches up silently).
    pub(crate) fn add(&self, pairs: u64) {
        let Some(callback) = self.callback else {
            return;
        };
        // A poisoned lock means an earlier callback panicked; its count is still right.
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        let (attempt, reported) = &mut *done;
        *attempt = (*attempt + pairs).min(self.total);
        if *attempt > *reported {
            *reported = *attempt;
            callback(Progress {
                done: *reported,
                total: self.total,
            });
        }
    }

    /// Starts counting a new attempt of the same search from zero (after an out-of-memory).
    pub(crate) fn restart(&self) {
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        done.0 = 0;
    }
}
