//! The native twin of the kNN kernels: each thread takes a block of queries (and, when there
//! are few queries, a shard of the references), computes cache-sized blocks of dot products
//! with a single-threaded GEMM and feeds every row to a bounded candidate list while the block
//! is still in cache. Small `k` goes to [`super::native_fused`] instead, which selects from
//! register tiles without writing the dot products out. Normalised rows are divided by their
//! norms as they are read (`ops::distance::native`); a call of at most 25 rows a side
//! computes its distances directly there, never in pieces (shards and ranks decide it for
//! the whole call).

use std::ops::Range;

use ndarray::{s, Array2, ArrayView2};

use super::calibrate;
use super::candidates::{admitted, shrink, Candidates};
use super::native_fused::{self, Block};
use super::{sort_rows, KnnConfig, Neighbours};
use crate::context::plan::Plan;
use crate::context::{ComputePath, Context, NativeKnnKernel};
use crate::error::{Error, Result};
use crate::hooks::Reporter;
use crate::kernels::knn_select::EMPTY_INDEX;
use crate::metric::Distance;
#[cfg(doc)]
use crate::ops::distance::native::is_direct;
use crate::ops::distance::native::{direct_into, finish, read_config, Norms};
use crate::runtime::gemm::gemm;
use crate::runtime::memory::HostReservation;
use crate::runtime::pool::{par_items, threads};

/// Query rows per block: enough for the GEMM to amortise packing a reference block.
const QUERY_BLOCK: usize = 256;
/// References per block: a `(256, 1024)` f32 block is 1 MiB, so the selection pass reads it
/// from the core's own cache right after the GEMM wrote it.
const REF_BLOCK: usize = 1024;
/// Fewest references per shard when a few queries are split over the threads by reference.
const MIN_SHARD: usize = 64;
/// Scores tested together against the bound: one vector compare for 16 rejections.
const LANES: usize = 16;
/// The label of a search's scratch reservation.
const SCRATCH: &str = "knn::native scratch";

/// The references' factors of the metric over one block, element `c` for reference `j0 + c`.
#[derive(Clone, Copy)]
struct RefFactors<'r> {
    scale: &'r [f32],
    sq: &'r [f32],
}

/// Feeds one row of dot products (`dots[c]` for reference `j0 + c`) to its candidates, except
/// reference `skip`; `oriented(dot, ref scale, ref squared norm)` is the metric, negated for
/// similarities so that smaller is better; `dots` holds at most [`REF_BLOCK`] elements.
/// Written so that the metric (a plain map over the row) and the bound test of `LANES`
/// elements at a time compile to vector code: a chunk where nothing beats the bound costs one
/// branch, not one per element (15–25 % off a k = 1 search at 100 000 × 1 000 × 128, 10–20 %
/// at k = 10 to 1 000, against testing each chunk lane by lane).
#[inline(always)]
fn feed_row(
    dots: &[f32],
    refs: RefFactors<'_>,
    (j0, skip, k): (usize, usize, usize),
    (list, scores): (&mut Candidates, &mut [f32; REF_BLOCK]),
    oriented: impl Fn(f32, f32, f32) -> f32,
) {
    let offer = |c: usize, o: f32, list: &mut Candidates| {
        if list.admits(o) && j0 + c != skip {
            list.offer(o, (j0 + c) as u32, k);
        }
    };
    // First the metric of every element, a plain map that compiles to vector code; then the
    // bound test, `LANES` at a time, visiting only the admitted lanes.
    let scores = &mut scores[..dots.len()];
    for (((o, &d), &rs), &rq) in scores.iter_mut().zip(dots).zip(refs.scale).zip(refs.sq) {
        *o = oriented(d, rs, rq);
    }
    let (chunks, rest) = scores.as_chunks::<LANES>();
    for (i, o) in chunks.iter().enumerate() {
        // `offer` tests again, as a shrink may tighten the bound meanwhile.
        let mut hits = admitted(o, list.bound);
        while hits != 0 {
            let l = hits.trailing_zeros() as usize;
            hits &= hits - 1;
            offer(i * LANES + l, o[l], list);
        }
    }
    let whole = chunks.len() * LANES;
    for (c, &o) in rest.iter().enumerate() {
        offer(whole + c, o, list);
    }
}

/// The references `refs` of one shard against query rows `rows`: every row's best `k` as
/// `(key, index)` pairs, `k` per row (padded with empty slots), unsorted.
#[allow(
    clippy::too_many_arguments,
    reason = "one call site; the shared state of a search"
)]
fn search_block(
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
    norms: &(Norms, Norms),
    distance: Distance,
    excluded: &[u32],
    k: usize,
    rows: Range<usize>,
    shard: Range<usize>,
    tile: &mut Tile,
) -> Vec<[u32; 2]> {
    let mut lists: Vec<Candidates> = rows.clone().map(|_| Candidates::new(k)).collect();
    // One row's metric at a time, reused by every row.
    let mut scores = [0.0f32; REF_BLOCK];
    let (q_norms, r_norms) = norms;
    let Tile {
        dots: block,
        queries: q_scratch,
        refs: r_scratch,
    } = tile;
    let q_block = divided(
        queries.slice(s![rows.clone(), ..]),
        q_norms.div.get(rows.clone()).unwrap_or(&[]),
        q_scratch,
    );
    let nb = block.ncols();
    for j0 in shard.clone().step_by(nb) {
        let cols = nb.min(shard.end - j0);
        let mut dots = block.slice_mut(s![..rows.len(), ..cols]);
        let refs_block = divided(
            refs.slice(s![j0..j0 + cols, ..]),
            r_norms.div.get(j0..j0 + cols).unwrap_or(&[]),
            r_scratch,
        );
        match r_norms.direct {
            // A call small enough for torch's direct distances: the block holds distances
            // (or dot products), each from its two rows.
            true => direct_into(q_block, refs_block, distance, dots.view_mut()),
            false => gemm(1.0, q_block, refs_block.t(), 0.0, dots.view_mut()),
        }
        let (r_scale, r_sq) = (&r_norms.scale[j0..j0 + cols], &r_norms.sq[j0..j0 + cols]);
        for (r, list) in lists.iter_mut().enumerate() {
            let i = rows.start + r;
            let (scale, sq, skip) = (q_norms.scale[i], q_norms.sq[i], excluded[i] as usize);
            let row = block.row(r);
            // Rows of the owned block are contiguous; the copy only keeps this total.
            let copied;
            let dots = match row.as_slice() {
                Some(d) => &d[..cols],
                None => {
                    copied = row.slice(s![..cols]).to_vec();
                    &copied
                }
            };
            // One instance per metric, so the per-element work has no branch on it.
            let refs = RefFactors {
                scale: r_scale,
                sq: r_sq,
            };
            let at = (j0, skip, k);
            match distance {
                Distance::Cosine | Distance::DotProduct => {
                    feed_row(dots, refs, at, (list, &mut scores), |d, rs, _| {
                        -(d * scale * rs)
                    })
                }
                Distance::Euclidean | Distance::SquaredEuclidean if r_norms.direct => {
                    feed_row(dots, refs, at, (list, &mut scores), |d, _, _| d)
                }
                Distance::Euclidean => {
                    feed_row(dots, refs, at, (list, &mut scores), |d, rs, rq| {
                        finish(Distance::Euclidean, sq, rq, d * scale * rs)
                    })
                }
                Distance::SquaredEuclidean => {
                    feed_row(dots, refs, at, (list, &mut scores), |d, rs, rq| {
                        finish(Distance::SquaredEuclidean, sq, rq, d * scale * rs)
                    })
                }
            }
        }
    }
    let mut pairs = Vec::with_capacity(rows.len() * k);
    for mut list in lists {
        shrink(&mut list.list, k);
        list.list.resize(k, [u32::MAX, EMPTY_INDEX]);
        pairs.extend_from_slice(&list.list);
    }
    pairs
}

/// How a native search splits its work: query rows per block, reference shards per block
/// (when there are too few query blocks to keep every thread busy), which kernel, and the
/// scratch that holds.
#[derive(Debug)]
pub(super) struct NativePlan {
    rows: usize,
    /// Threads, each with its scratch reserved.
    threads: usize,
    shards: usize,
    /// The fused kernel (small `k`, when its scratch fits) rather than GEMM blocks.
    fused: bool,
    /// Bytes of scratch, reserved against the budget while the search runs.
    scratch: u64,
    /// The scratch of the smallest plan (one query row per block).
    min_scratch: u64,
}

impl NativePlan {
    pub(super) fn public(&self, q: usize, n: usize) -> Plan {
        Plan {
            path: ComputePath::NativeCpu,
            rows: self.rows,
            cols: n.div_ceil(self.shards),
            chunks: q.div_ceil(self.rows) * self.shards,
            bytes: self.scratch,
            min_bytes: self.min_scratch,
        }
    }
}

/// Per thread a block of dot products and its rows' candidate lists (or, for `k ≤`
/// [`native_fused::MAX_K`], the fused kernel's packed references and rows' lists); with
/// shards, the lists they hand back (with one, those are the output itself, which is not
/// counted). The fused kernel runs when its scratch for whole blocks fits what the budget has
/// available; otherwise the general path's blocks shrink until they fit, and failing that
/// the fused kernel's.
///
/// One thread per core where the budget allows, else the most threads for which some plan
/// fits (the same budget must work on a machine of many cores as on one of two).
///
/// With `normalizes`, the general path's threads also hold their block of query rows and of
/// references normalised ([`Norms::dividing`]); a `direct` call (the whole call's
/// [`is_direct`]) takes the general path.
pub(super) fn plan(
    ctx: &Context,
    dims: (usize, usize, usize),
    k: usize,
    (normalizes, direct): (bool, bool),
) -> Result<NativePlan> {
    plan_on(threads(), ctx, dims, (k, normalizes, direct))
}

/// [`plan`] on a machine of `cores` cores.
fn plan_on(
    cores: usize,
    ctx: &Context,
    dims: (usize, usize, usize),
    k: (usize, bool, bool),
) -> Result<NativePlan> {
    let mut threads = cores.max(1);
    loop {
        match plan_with(threads, ctx, dims, k) {
            Err(_) if threads > 1 => threads -= 1,
            // The least a call needs is one thread's: what a budget must hold for it to run.
            Ok(mut planned) if threads > 1 => {
                if let Ok(one) = plan_with(1, ctx, dims, k) {
                    planned.min_scratch = one.min_scratch;
                }
                return Ok(planned);
            }
            planned => return planned,
        }
    }
}

/// [`plan`] with `threads` threads.
fn plan_with(
    threads: usize,
    ctx: &Context,
    (q, n, d): (usize, usize, usize),
    (k, normalizes, direct): (usize, bool, bool),
) -> Result<NativePlan> {
    let workers = threads;
    let threads = threads as u64;
    let nb = REF_BLOCK.min(n).max(1);
    let shards_for = |qb: usize| {
        let q_blocks = q.div_ceil(qb).max(1) as u64;
        match q_blocks >= 2 * threads {
            true => 1,
            false => ((2 * threads).div_ceil(q_blocks) as usize)
                .min(n.div_ceil(MIN_SHARD))
                .max(1),
        }
    };
    let scratch_for = |qb: usize| {
        let normalized = if normalizes {
            4 * ((qb + nb) * d) as u64
        } else {
            0
        };
        let per_thread =
            4 * (qb * nb) as u64 + 8 * (qb * Candidates::capacity(k)) as u64 + normalized;
        let shards = shards_for(qb);
        let lists = if shards > 1 {
            8 * (q * k * shards) as u64
        } else {
            0
        };
        threads * per_thread + lists
    };
    let fused_for = |qb: usize| {
        let shards = shards_for(qb);
        let lists = if shards > 1 {
            8 * (q * k * shards) as u64
        } else {
            0
        };
        threads * native_fused::scratch_bytes(qb, (n, d), k) + lists
    };
    let kernel = ctx.native_knn_kernel();
    // The fused kernel has no direct distances (`is_direct`): tiny calls take the blocks.
    let small_k = k <= native_fused::MAX_K && kernel != NativeKnnKernel::Blocks && !direct;
    let available = ctx.tracker().available();
    // With few references the fused kernel's chunk is small, and its one-row plan can be the
    // least of all.
    let min_scratch = match small_k {
        true => scratch_for(1).min(fused_for(1)),
        false => scratch_for(1),
    };
    let plan = |qb: usize, fused: bool| {
        let scratch = if fused {
            fused_for(qb)
        } else {
            scratch_for(qb)
        };
        NativePlan {
            rows: qb,
            threads: workers,
            shards: shards_for(qb),
            fused,
            scratch,
            min_scratch,
        }
    };
    // The fused kernel with whole blocks where it fits (and the setting or, with `Auto`, this
    // CPU's measured choice takes it first); else the general path's blocks, shrunk to fit;
    // else the fused kernel's, shrunk (with `Fused`, those two swapped).
    // Whole blocks, as many per thread: 10 000 queries in 2 048-row blocks would be 5 blocks
    // on 2 threads, one thread idle for a fifth of the search; 6 blocks of 1 667 rows are not.
    let whole = {
        let blocks = q.div_ceil(native_fused::QUERY_BLOCK).max(1);
        q.div_ceil(blocks.next_multiple_of(workers.max(1)))
            .clamp(1, native_fused::QUERY_BLOCK)
    };
    if small_k && fused_for(whole) <= available && calibrate::fused_first(ctx, (q, n, d), k) {
        return Ok(plan(whole, true));
    }
    let shrunk = |start: usize, scratch: &dyn Fn(usize) -> u64| {
        let mut qb = start.min(q).max(1);
        while qb > 1 && scratch(qb) > available {
            qb = qb.div_ceil(2);
        }
        qb
    };
    let fused_shrunk = || {
        let qb = shrunk(native_fused::QUERY_BLOCK, &fused_for);
        (small_k && fused_for(qb) <= available).then(|| plan(qb, true))
    };
    if kernel == NativeKnnKernel::Fused {
        if let Some(p) = fused_shrunk() {
            return Ok(p);
        }
    }
    let qb = shrunk(QUERY_BLOCK, &scratch_for);
    if scratch_for(qb) <= available {
        return Ok(plan(qb, false));
    }
    if let Some(p) = fused_shrunk() {
        return Ok(p);
    }
    let memory = ctx.memory();
    if min_scratch > memory.budget_bytes {
        // Not even one query row per thread fits the budget: no plan can.
        return Err(Error::OverBudget {
            op: super::OP,
            required: min_scratch,
            budget: memory.budget_bytes,
        });
    }
    // It would fit the budget, but not beside what is held now.
    Err(Error::BudgetExceeded {
        label: SCRATCH,
        requested: min_scratch,
        in_use: memory.current_bytes,
        budget: memory.budget_bytes,
    })
}

/// `queries` `(q, d)` against host `refs` `(n, d)`, validated; `excluded[i]` is row `i`'s own
/// reference index or `u32::MAX`; `direct`: the whole call (of which this may be a shard or a
/// rank's part) computes its distances directly ([`is_direct`]). Each finished block (each
/// chunk of references, in the fused kernel) is reported; once cancelled, the rest is
/// skipped and the search returns [`Error::Cancelled`].
pub(crate) fn search(
    ctx: &Context,
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
    cfg: &KnnConfig,
    (excluded, direct): (&[u32], bool),
    report: &Reporter<'_>,
) -> Result<Neighbours> {
    let (q, n, k) = (queries.nrows(), refs.nrows(), cfg.k);
    let largest = cfg.distance.distance.is_similarity();
    let nb = REF_BLOCK.min(n).max(1);
    let normalizes = cfg.distance.normalizes();
    let plan = plan(ctx, (q, n, queries.ncols()), k, (normalizes, direct))?;
    let (qb, shards) = (plan.rows, plan.shards);
    let q_blocks = q.div_ceil(qb);
    let _reserved = HostReservation::new(SCRATCH, plan.scratch, ctx.tracker())?;
    // PML's arithmetic: the kernels divide each element by its row's norm as they read it,
    // as torch normalises (see `ops::distance::native`); then cosine is a dot product.
    let distance_cfg = read_config(&cfg.distance);
    let norms = (
        Norms::dividing(queries, &cfg.distance),
        Norms::dividing(refs, &cfg.distance).direct(direct),
    );
    let shard_of = |s: usize| s * n / shards..(s + 1) * n / shards;
    let parts = par_items(
        plan.threads,
        q_blocks * shards,
        || match plan.fused {
            true => Scratch::Fused(native_fused::Scratch::new(queries.ncols(), n, qb)),
            false => Scratch::Tile(Tile::new((qb, nb), queries.ncols(), normalizes)),
        },
        |item, scratch| {
            if report.cancelled() {
                return Vec::new();
            }
            let (b, shard) = (item / shards, item % shards);
            let (rows, shard) = (b * qb..(b * qb + qb).min(q), shard_of(shard));
            let pairs = rows.len() as u64 * shard.len() as u64;
            let distance = distance_cfg.distance;
            match scratch {
                // The fused kernel reports (and stops when cancelled) chunk by chunk.
                Scratch::Fused(scratch) => {
                    let block = Block {
                        queries,
                        refs,
                        norms: &norms,
                        excluded,
                        rows,
                        shard,
                        report,
                    };
                    native_fused::search_block(&block, distance, k, scratch)
                }
                Scratch::Tile(tile) => {
                    let found = search_block(
                        queries, refs, &norms, distance, excluded, k, rows, shard, tile,
                    );
                    report.add(pairs);
                    found
                }
            }
        },
    );
    report.check()?;
    let mut parts = parts;
    let mut out = Neighbours::empty(q, k);
    for (b, block) in parts.chunks_mut(shards).enumerate() {
        let mut pairs = if shards == 1 {
            std::mem::take(&mut block[0])
        } else {
            merge_shards(block, k)
        };
        sort_rows(&mut pairs, k, largest, &mut out, b * qb);
    }
    Ok(out)
}

/// One thread's scratch: a block of dot products, or the fused kernel's buffers.
enum Scratch {
    Tile(Tile),
    Fused(native_fused::Scratch),
}

/// A general-path thread's scratch: its block of dot products `(qb, nb)` and, for
/// normalised distances, its query rows and its block of references normalised.
struct Tile {
    dots: Array2<f32>,
    queries: Array2<f32>,
    refs: Array2<f32>,
}

impl Tile {
    fn new((qb, nb): (usize, usize), d: usize, normalizes: bool) -> Self {
        let (q, r) = if normalizes { (qb, nb) } else { (0, 0) };
        Self {
            dots: Array2::zeros((qb, nb)),
            queries: Array2::zeros((q, d)),
            refs: Array2::zeros((r, d)),
        }
    }
}

/// `rows` divided element by element by their `div` into `out` (the first rows), or `rows`
/// themselves when there is nothing to divide by (`div` empty or `out` without rows).
fn divided<'a>(
    rows: ArrayView2<'a, f32>,
    div: &[f32],
    out: &'a mut Array2<f32>,
) -> ArrayView2<'a, f32> {
    if div.is_empty() || out.nrows() == 0 {
        return rows;
    }
    let mut part = out.slice_mut(s![..rows.nrows(), ..]);
    for ((mut o, x), &div) in part.rows_mut().into_iter().zip(rows.rows()).zip(div) {
        o.zip_mut_with(&x, |o, &x| *o = x / div);
    }
    out.slice(s![..rows.nrows(), ..])
}

/// One query block's lists from every shard, `k` pairs per row each, merged to the best `k`.
fn merge_shards(block: &[Vec<[u32; 2]>], k: usize) -> Vec<[u32; 2]> {
    let rows = block[0].len() / k;
    let mut pairs = Vec::with_capacity(rows * k);
    let mut row = Vec::with_capacity(block.len() * k);
    for r in 0..rows {
        row.clear();
        for part in block {
            row.extend_from_slice(&part[r * k..(r + 1) * k]);
        }
        shrink(&mut row, k);
        pairs.extend_from_slice(&row);
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A budget below one scratch per core runs on fewer threads instead of refusing; the
    /// least a call needs is one thread's scratch.
    #[test]
    fn many_cores_run_fewer_threads_under_a_budget_two_cores_fit() {
        let (dims, k) = ((1000, 5000, 64), (10, false, false));
        let roomy = Context::native_cpu(Some(1 << 40));
        let min_of = |threads| {
            plan_with(threads, &roomy, dims, k)
                .expect("fits")
                .min_scratch
        };
        let (one, two, sixteen) = (min_of(1), min_of(2), min_of(16));
        assert!(two <= 2 * one && sixteen > 4 * one, "{one} {two} {sixteen}");
        let budget = sixteen - 1;
        let ctx = Context::native_cpu(Some(budget));
        for (cores, most) in [(2, 2), (16, 15), (64, 15)] {
            let plan = plan_on(cores, &ctx, dims, k).expect("fewer threads fit");
            assert!(
                (1..=most).contains(&plan.threads),
                "{cores} cores: {} threads",
                plan.threads
            );
            assert!(plan.scratch <= budget, "{cores} cores: {} B", plan.scratch);
            assert_eq!(plan.min_scratch, one, "one thread's least");
        }
        let tight = Context::native_cpu(Some(one - 1));
        let refused = plan_on(16, &tight, dims, k);
        assert!(
            matches!(refused, Err(Error::OverBudget { required, .. }) if required == one),
            "{refused:?}"
        );
    }

    /// The calibration's timed search runs whole blocks on every thread and no shards, in
    /// both kernels: a sharded fused search restarts its rows' bounds in each shard and would
    /// time slower than the searches of many queries it stands for.
    #[test]
    fn the_calibrations_search_is_not_sharded() {
        use crate::context::{BackendChoice, ContextConfig};
        for kernel in [NativeKnnKernel::Fused, NativeKnnKernel::Blocks] {
            let ctx = Context::new(&ContextConfig {
                backend: BackendChoice::NativeCpu,
                native_knn_kernel: kernel,
                ..Default::default()
            })
            .expect("native context");
            for (threads, d) in [(1, 128), (2, 128), (2, 8), (4, 512), (8, 128)] {
                let (q, n) = calibrate::timed_shape(d, threads);
                let plan = plan_with(threads, &ctx, (q, n, d), (10, true, false)).expect("fits");
                let what = format!("{kernel:?}, {threads} threads, d {d}");
                assert_eq!(plan.shards, 1, "{what}");
                assert_eq!(plan.fused, kernel == NativeKnnKernel::Fused, "{what}");
            }
        }
    }
}
