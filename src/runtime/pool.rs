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

/// Rows of `out` per task in [`par_rows`] and below which it runs on the calling thread: a
/// task of fewer than this many values costs more to hand out than to do.
const PAR_ROWS_MIN_VALUES: usize = 1 << 16;

/// Runs `work(row0, rows, state)` over `out`'s rows in chunks on up to every core (each worker
/// with its own `state` from `init`), where `rows` is `out`'s rows from `row0`; on the calling
/// thread alone when `out` is small. Each chunk is one task's, so `work` sees every row once,
/// and a row's result cannot depend on how rows are split.
pub(crate) fn par_rows<S>(
    mut out: ndarray::ArrayViewMut2<'_, f32>,
    init: impl Fn() -> S + Sync,
    work: impl Fn(usize, ndarray::ArrayViewMut2<'_, f32>, &mut S) + Sync,
) {
    let (rows, cols) = out.dim();
    let per = PAR_ROWS_MIN_VALUES.div_ceil(cols.max(1)).max(1);
    let workers = threads().min(rows.div_ceil(per));
    if workers <= 1 {
        work(0, out, &mut init());
        return;
    }
    // A chunk per task, several per worker so that uneven cores balance.
    let chunk = rows.div_ceil(4 * workers).max(per);
    let chunks: Vec<std::sync::Mutex<Option<ndarray::ArrayViewMut2<'_, f32>>>> = out
        .axis_chunks_iter_mut(ndarray::Axis(0), chunk)
        .map(|c| std::sync::Mutex::new(Some(c)))
        .collect();
    par_items(workers, chunks.len(), init, |i, state| {
        // Each chunk is taken by exactly one task: the lock is never contended.
        let taken = chunks[i]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(rows) = taken {
            work(i * chunk, rows, state);
        }
    });
}

/// `c = alpha · a b + beta · c` ([`super::gemm::gemm`]), its rows (or, where it is wider
/// than tall, its columns) split over the cores; each product's bits do not depend on the
/// split.
pub(crate) fn par_mul(
    alpha: f32,
    a: ndarray::ArrayView2<'_, f32>,
    b: ndarray::ArrayView2<'_, f32>,
    beta: f32,
    mut c: ndarray::ArrayViewMut2<'_, f32>,
) {
    let (rows, cols) = c.dim();
    let workers = threads()
        .min((rows * cols * a.ncols()).div_ceil(1 << 20))
        .max(1);
    if workers == 1 {
        super::gemm::gemm(alpha, a, b, beta, c);
        return;
    }
    std::thread::scope(|scope| {
        if rows >= cols {
            // Whole tiles of every kernel per thread (12 rows, 32 columns).
            let per = rows.div_ceil(workers).next_multiple_of(12);
            for (t, c) in c.axis_chunks_iter_mut(ndarray::Axis(0), per).enumerate() {
                let a = a.slice(ndarray::s![t * per..t * per + c.nrows(), ..]);
                scope.spawn(move || super::gemm::gemm(alpha, a, b, beta, c));
            }
        } else {
            let per = cols.div_ceil(workers).next_multiple_of(32);
            for (t, c) in c.axis_chunks_iter_mut(ndarray::Axis(1), per).enumerate() {
                let b = b.slice(ndarray::s![.., t * per..t * per + c.ncols()]);
                scope.spawn(move || super::gemm::gemm(alpha, a, b, beta, c));
            }
        }
    });
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

    #[test]
    fn every_row_is_worked_once_whatever_the_size() {
        for (rows, cols) in [(0, 3), (1, 1), (5, 7), (3000, 40), (70_000, 1)] {
            let mut out = ndarray::Array2::<f32>::zeros((rows, cols));
            par_rows(
                out.view_mut(),
                || (),
                |row0, mut chunk, _| {
                    for (r, mut row) in chunk.rows_mut().into_iter().enumerate() {
                        row += (row0 + r) as f32 + 1.0;
                    }
                },
            );
            let want = ndarray::Array2::from_shape_fn((rows, cols), |(r, _)| r as f32 + 1.0);
            assert_eq!(out, want, "{rows} x {cols}");
        }
    }
}
