//! The native CPU path's thread pool: one worker per core, items dealt out in turn. Imports
//! nothing of the crate, so every native implementation may use it.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Worker threads for the native path: one per available core.
pub(crate) fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |t| t.get())
}

/// Runs `work(item, state)` for every item in `0..items` on up to [`threads`] threads, items
/// dealt out in turn (so uneven items balance), each thread with its own `state` from `init`;
/// returns the results in item order.
///
/// A worker that panics (a bug) has its panic resumed on the calling thread, rather than a
/// partial result returned.
pub(crate) fn par_items<S, T: Send>(
    items: usize,
    init: impl Fn() -> S + Sync,
    work: impl Fn(usize, &mut S) -> T + Sync,
) -> Vec<T> {
    let next = AtomicUsize::new(0);
    let worker = || {
        let mut state = init();
        let mut done = Vec::new();
        loop {
            let item = next.fetch_add(1, Ordering::Relaxed);
            if item >= items {
                return done;
            }
            done.push((item, work(item, &mut state)));
        }
    };
    let helpers = threads().min(items).saturating_sub(1);
    let mut done = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..helpers).map(|_| scope.spawn(worker)).collect();
        let mut done = worker();
        for h in handles {
            match h.join() {
                Ok(d) => done.extend(d),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        done
    });
    done.sort_unstable_by_key(|d| d.0);
    done.into_iter().map(|d| d.1).collect()
}
