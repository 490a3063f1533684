//! The native CPU path's thread pool: one worker per core, items dealt out in turn. Imports
//! nothing of the crate, so every native implementation may use it.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Worker threads for the native path: one per available core.
pub(crate) fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |t| t.get())
}

/// How many workers fit: every core (`cores`), or fewer where `available` bytes cannot give
/// each its `per_worker` bytes; at least one (a caller refuses a plan whose one worker does
/// not fit). The same budget must work on a machine of many cores as on one of two: a plan
/// that took one scratch per core would refuse there what a small machine runs.
pub(crate) fn workers_within(cores: usize, per_worker: u64, available: u64) -> usize {
    match available.checked_div(per_worker) {
        Some(fit) => usize::try_from(fit)
            .unwrap_or(usize::MAX)
            .clamp(1, cores.max(1)),
        None => cores.max(1),
    }
}

/// Runs `work(item, state)` for every item in `0..items` on up to `workers` threads, items
/// dealt out in turn (so uneven items balance), each thread with its own `state` from `init`;
/// returns the results in item order.
///
/// A worker that panics (a bug) has its panic resumed on the calling thread, rather than a
/// partial result returned.
pub(crate) fn par_items<S, T: Send>(
    workers: usize,
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
    let helpers = workers.min(items).saturating_sub(1);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_are_the_cores_or_what_the_budget_gives_each() {
        assert_eq!(
            workers_within(16, 100, 10_000),
            16,
            "every core when all fit"
        );
        assert_eq!(workers_within(16, 100, 550), 5, "as many as fit whole");
        assert_eq!(
            workers_within(16, 100, 50),
            1,
            "one, which its caller checks"
        );
        assert_eq!(workers_within(16, 0, 0), 16, "no scratch: every core");
        assert_eq!(workers_within(0, 1, 1), 1, "at least one");
    }

    #[test]
    fn items_come_back_in_order_on_any_number_of_workers() {
        for workers in [1, 2, 7] {
            let got = par_items(
                workers,
                20,
                || 0usize,
                |i, seen| {
                    *seen += 1;
                    i * i
                },
            );
            assert_eq!(got, (0..20).map(|i| i * i).collect::<Vec<_>>(), "{workers}");
        }
    }
}
