//! Progress reports and cancellation of long calls: every operation's config has a
//! [`Hooks`] field, empty by default.
//!
//! Work is counted in query–reference pairs compared (kNN, accuracy, distances, the miners) or
//! anchor–reference pairs mined (triplets). Operations check for cancellation between chunks:
//! a cancelled call returns [`Error::Cancelled`] within one chunk, with every buffer it had
//! allocated released.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

/// How far a call has got: pairs compared (or mined) so far, of the total. Reports arrive in
/// increasing order of `done`, never two at once, and the last one has `done == total` (a
/// call with nothing to do reports nothing).
///
/// # Example
/// ```
/// use wgpu_metric_learning::Progress;
/// let p = Progress { done: 250, total: 1000 };
/// assert_eq!(p.fraction(), 0.25);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Pairs done so far.
    pub done: u64,
    /// Pairs the call does in all (`q · n`, or anchors × references for triplets).
    pub total: u64,
}

impl Progress {
    /// `done / total` in `[0, 1]`; 1 for an empty call.
    ///
    /// See the example of [`Progress`].
    pub fn fraction(&self) -> f64 {
        match self.total {
            0 => 1.0,
            t => self.done as f64 / t as f64,
        }
    }
}

/// A flag that stops calls from another thread (a Ctrl-C handler, a UI's stop button): clones
/// share the flag. Once cancelled it stays so; make a new token for the next call.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{knn, CancelToken, Context, Error, Hooks, KnnConfig};
/// let token = CancelToken::new();
/// let cfg = KnnConfig { k: 1, hooks: Hooks::new().cancel_with(&token), ..Default::default() };
/// let x = ndarray::Array2::<f32>::ones((100, 4));
/// token.cancel(); // e.g. from another thread, while the search runs
/// assert!(matches!(knn(&Context::native_cpu(None), &x, &x, &cfg), Err(Error::Cancelled { .. })));
/// ```
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A token that is not cancelled.
    ///
    /// See the example of [`CancelToken`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks every call watching this token (or a clone) to stop at its next chunk.
    ///
    /// See the example of [`CancelToken`].
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether [`Self::cancel`] has been called.
    ///
    /// See the example of [`CancelToken`].
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// A progress callback: called from worker threads on the native path, hence `Send + Sync`.
type ProgressCallback = Arc<dyn Fn(Progress) + Send + Sync>;

/// Progress and cancellation of one call, set on the call's config (`cfg.hooks`). Both are
/// optional; [`Hooks::default`] has neither.
///
/// # Example
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use wgpu_metric_learning::{knn, Context, Hooks, KnnConfig, Progress};
/// let last = Arc::new(AtomicU64::new(0));
/// let seen = Arc::clone(&last);
/// let cfg = KnnConfig {
///     hooks: Hooks::new().on_progress(move |p: Progress| seen.store(p.done, Ordering::Relaxed)),
///     ..Default::default()
/// };
/// let x = ndarray::Array2::from_shape_fn((300, 8), |(i, j)| ((i * 7 + j) % 13) as f32);
/// knn(&Context::native_cpu(None), &x, &x, &cfg)?;
/// assert_eq!(last.load(Ordering::Relaxed), 300 * 300);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Clone, Default)]
pub struct Hooks {
    progress: Option<ProgressCallback>,
    cancel: Option<CancelToken>,
}

impl Hooks {
    /// No progress callback, no cancellation.
    ///
    /// See the example of [`Hooks`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Calls `f` as the call advances; see [`Progress`] for what is reported and when.
    ///
    /// See the example of [`Hooks`].
    pub fn on_progress(mut self, f: impl Fn(Progress) + Send + Sync + 'static) -> Self {
        self.progress = Some(Arc::new(f));
        self
    }

    /// Stops the call with [`Error::Cancelled`] at its next chunk once `token` is cancelled.
    ///
    /// See the example of [`CancelToken`].
    pub fn cancel_with(mut self, token: &CancelToken) -> Self {
        self.cancel = Some(token.clone());
        self
    }

    /// `Err(Cancelled)` once the token (if any) is cancelled.
    pub(crate) fn check(&self, op: &'static str) -> Result<()> {
        match &self.cancel {
            Some(token) if token.is_cancelled() => Err(Error::Cancelled { op }),
            _ => Ok(()),
        }
    }
}

impl fmt::Debug for Hooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hooks")
            .field("progress", &self.progress.as_ref().map(|_| "callback"))
            .field("cancel", &self.cancel)
            .finish()
    }
}

/// Equal when they call the same callback and watch the same token (configs compare their
/// hooks by identity: closures have no equality).
impl PartialEq for Hooks {
    fn eq(&self, other: &Self) -> bool {
        let progress = match (&self.progress, &other.progress) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        let cancel = match (&self.cancel, &other.cancel) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(&a.0, &b.0),
            _ => false,
        };
        progress && cancel
    }
}

/// One call's view of its hooks: sums the work finished on any thread and hands it to the
/// callback, one call at a time; answers whether the call was cancelled.
pub(crate) struct Reporter<'a> {
    hooks: &'a Hooks,
    op: &'static str,
    total: u64,
    /// Pairs done by this attempt, and the most ever reported. Held while the callback
    /// runs, so that reports never overtake each other.
    done: Mutex<(u64, u64)>,
    /// A part's reporter forwards what it newly reports to the whole's.
    whole: Option<&'a Reporter<'a>>,
}

impl<'a> Reporter<'a> {
    pub(crate) fn new(hooks: &'a Hooks, op: &'static str, total: u64) -> Self {
        Self {
            hooks,
            op,
            total,
            done: Mutex::new((0, 0)),
            whole: None,
        }
    }

    /// A reporter for one part of this call (a shard) doing `total` of its pairs: it restarts
    /// on its own after an out-of-memory, and forwards to this one only progress beyond what
    /// it reported before, so one part's retry never takes back another part's work.
    pub(crate) fn part(&'a self, total: u64) -> Reporter<'a> {
        Reporter {
            hooks: self.hooks,
            op: self.op,
            total,
            done: Mutex::new((0, 0)),
            whole: Some(self),
        }
    }

    /// `Err(Cancelled)` once the call's token is cancelled: checked between chunks.
    pub(crate) fn check(&self) -> Result<()> {
        self.hooks.check(self.op)
    }

    /// Whether the call was cancelled (for workers that cannot return an error themselves).
    pub(crate) fn cancelled(&self) -> bool {
        self.check().is_err()
    }

    /// Records `pairs` more pairs done; reports only progress beyond what was reported
    /// before (a retried call catches up silently).
    pub(crate) fn add(&self, pairs: u64) {
        if self.hooks.progress.is_none() {
            return;
        }
        // A poisoned lock means an earlier callback panicked; its count is still right.
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        let (attempt, reported) = &mut *done;
        *attempt = (*attempt + pairs).min(self.total);
        if *attempt <= *reported {
            return;
        }
        let new = *attempt - *reported;
        *reported = *attempt;
        match (self.whole, &self.hooks.progress) {
            (Some(whole), _) => whole.add(new),
            (None, Some(callback)) => callback(Progress {
                done: *reported,
                total: self.total,
            }),
            (None, None) => {}
        }
    }

    /// Starts counting a new attempt of the same call from zero (after an out-of-memory).
    pub(crate) fn restart(&self) {
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        done.0 = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_rise_never_repeat_and_stop_at_the_total() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let hooks = Hooks::new().on_progress(move |p| log.lock().expect("log").push(p.done));
        let r = Reporter::new(&hooks, "t", 10);
        r.add(4);
        r.restart(); // a retry: the first 4 again are not reported twice
        r.add(3);
        r.add(3);
        r.add(9);
        assert_eq!(*seen.lock().expect("log"), vec![4, 6, 10]);
    }

    #[test]
    fn a_part_that_restarts_takes_back_nothing_of_the_others() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let hooks = Hooks::new().on_progress(move |p| log.lock().expect("log").push(p.done));
        let whole = Reporter::new(&hooks, "t", 10);
        let (a, b) = (whole.part(5), whole.part(5));
        a.add(3);
        b.add(5);
        b.restart(); // b retries after an out-of-memory: its 5 are not reported again
        b.add(5);
        a.add(2);
        assert_eq!(*seen.lock().expect("log"), vec![3, 8, 10]);
    }

    #[test]
    fn a_cancelled_token_stops_every_reporter_watching_it() {
        let token = CancelToken::new();
        let hooks = Hooks::new().cancel_with(&token);
        let r = Reporter::new(&hooks, "t", 1);
        assert!(r.check().is_ok(), "not cancelled yet");
        token.clone().cancel();
        assert!(
            matches!(r.check(), Err(Error::Cancelled { op: "t" })),
            "a clone cancels"
        );
        assert!(Hooks::new().check("t").is_ok(), "no token, never cancelled");
    }

    #[test]
    fn hooks_compare_by_identity() {
        let token = CancelToken::new();
        let a = Hooks::new().cancel_with(&token);
        assert_eq!(a, a.clone(), "a clone watches the same token");
        assert_ne!(a, Hooks::new().cancel_with(&CancelToken::new()));
        assert_eq!(Hooks::new(), Hooks::default());
    }
}
