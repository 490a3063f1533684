//! The native twin of the kNN kernels: blocks of distances from a threaded GEMM, each row's
//! block fed to a bounded candidate list with a running threshold, on every core.

use ndarray::{s, Array2, ArrayView2, ArrayViewMut2, Axis};

use super::{sort_rows, KnnConfig, Neighbours};
use crate::context::Context;
use crate::distance::Distance;
use crate::error::Result;
use crate::kernels::knn_select::{key_of, score_of, EMPTY_INDEX};
use crate::memory::HostReservation;
use crate::native::{finish, inv_norms, sq_norms};

/// Query rows per block: enough to amortise a pass over the references.
const QUERY_BLOCK: usize = 512;
/// References per block: a `(512, 4096)` f32 block is 8 MiB, within the last-level cache.
const REF_BLOCK: usize = 4096;

/// One row's candidates: every element that could still be among its best `k`, re-selected
/// down to `k` whenever the list reaches its capacity (Faiss's reservoir). The bound is then
/// the worst kept score, oriented so that smaller is better, and anything worse is never
/// stored: most elements cost one comparison.
struct Candidates {
    list: Vec<[u32; 2]>,
    /// Oriented score (`s`, or `-s` for similarities) an element must not exceed.
    bound: f32,
}

impl Candidates {
    fn capacity(k: usize) -> usize {
        2 * k + 64
    }

    fn new(k: usize) -> Self {
        Self {
            list: Vec::with_capacity(Self::capacity(k)),
            bound: f32::INFINITY,
        }
    }

    /// Stores reference `index` with oriented score `oriented` (callers skip scores above
    /// the bound; a NaN is stored, and its key orders it last, as in the kernel).
    #[inline]
    fn offer(&mut self, oriented: f32, index: u32, k: usize) {
        self.list.push([key_of(oriented, false), index]);
        if self.list.len() >= Self::capacity(k) {
            self.shrink(k);
        }
    }

    /// Keeps the best `k` by (key, index). Elements equal to the bound stay admissible: they
    /// lose the tie to the kept ones by index, since blocks arrive in index order.
    fn shrink(&mut self, k: usize) {
        if self.list.len() > k {
            self.list
                .select_nth_unstable_by(k - 1, |a, b| (a[0], a[1]).cmp(&(b[0], b[1])));
            self.list.truncate(k);
        }
        if self.list.len() == k {
            self.bound = score_of(self.list[k - 1][0], false);
        }
    }
}

/// Feeds one row of dot products (`dots[c]` for reference `j0 + c`) to its candidates;
/// `score(c, dot)` is the metric; similarities are negated so that smaller is better.
#[inline]
fn feed_row(
    dots: &[f32],
    j0: usize,
    skip: usize,
    largest: bool,
    k: usize,
    list: &mut Candidates,
    score: impl Fn(usize, f32) -> f32,
) {
    let sign = if largest { -1.0 } else { 1.0 };
    for (c, &dot) in dots.iter().enumerate() {
        let oriented = sign * score(c, dot);
        // Rejections first: one comparison for almost every element.
        if oriented > list.bound || j0 + c == skip {
            continue;
        }
        list.offer(oriented, (j0 + c) as u32, k);
    }
}

/// `queries` `(q, d)` against host `refs` `(n, d)`, validated; `excluded[i]` is row `i`'s own
/// reference index or `u32::MAX`.
pub(crate) fn search(
    ctx: &Context,
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
    cfg: &KnnConfig,
    excluded: &[u32],
) -> Result<Neighbours> {
    let (q, n, k) = (queries.nrows(), refs.nrows(), cfg.k);
    let largest = cfg.distance.distance.is_similarity();
    let (qb, nb) = (QUERY_BLOCK.min(q), REF_BLOCK.min(n).max(1));
    // The scratch is the distance block and the candidate lists; counted like device memory.
    let scratch = 4 * (qb * nb) as u64 + 8 * (qb * Candidates::capacity(k)) as u64;
    let _reserved = HostReservation::new("knn::native scratch", scratch, ctx.tracker())?;
    let (q2, r2) = (sq_norms(queries), sq_norms(refs));
    let (iq, ir) = (inv_norms(&q2, &cfg.distance), inv_norms(&r2, &cfg.distance));
    // Per reference, as contiguous slices: the scale and the scaled squared norm.
    let ir_s: Vec<f32> = ir.to_vec();
    let r2_s: Vec<f32> = r2.iter().zip(&ir).map(|(n, s)| n * s * s).collect();
    let mut out = Neighbours::empty(q, k);
    let mut block = Array2::<f32>::zeros((qb, nb));
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    for i0 in (0..q).step_by(qb) {
        let rows = qb.min(q - i0);
        let mut lists: Vec<Candidates> = (0..rows).map(|_| Candidates::new(k)).collect();
        let q_block = queries.slice(s![i0..i0 + rows, ..]);
        for j0 in (0..n).step_by(nb) {
            let cols = nb.min(n - j0);
            let mut dots = block.slice_mut(s![..rows, ..cols]);
            // Row-major with a stride of `nb`: each row is a contiguous slice.
            ndarray::linalg::general_mat_mul(
                1.0,
                &q_block,
                &refs.slice(s![j0..j0 + cols, ..]).t(),
                0.0,
                &mut dots,
            );
            let per = rows.div_ceil(threads).max(1);
            let feed = |first: usize, dots: ArrayViewMut2<'_, f32>, lists: &mut [Candidates]| {
                for (r, (row, list)) in dots.outer_iter().zip(lists).enumerate() {
                    let i = i0 + first + r;
                    let (sq, scale) = (q2[i] * iq[i] * iq[i], iq[i]);
                    let skip = excluded[i] as usize;
                    // One loop per metric, so the per-element work has no branch on it.
                    let copied;
                    let dots = match row.as_slice() {
                        Some(d) => d,
                        None => {
                            copied = row.to_vec();
                            &copied
                        }
                    };
                    let (irs, r2s) = (&ir_s[j0..j0 + cols], &r2_s[j0..j0 + cols]);
                    let metric = |d: Distance| {
                        move |c: usize, dot: f32| finish(d, sq, r2s[c], dot * scale * irs[c])
                    };
                    match cfg.distance.distance {
                        Distance::Cosine | Distance::DotProduct => {
                            feed_row(dots, j0, skip, largest, k, list, |c, dot| {
                                dot * scale * irs[c]
                            })
                        }
                        d => feed_row(dots, j0, skip, largest, k, list, metric(d)),
                    }
                }
            };
            std::thread::scope(|scope| {
                let chunks = dots.axis_chunks_iter_mut(Axis(0), per);
                for (t, (d, l)) in chunks.zip(lists.chunks_mut(per)).enumerate() {
                    let feed = &feed;
                    scope.spawn(move || feed(t * per, d, l));
                }
            });
        }
        let mut pairs = Vec::with_capacity(rows * k);
        for mut list in lists {
            list.shrink(k);
            list.list.resize(k, [u32::MAX, EMPTY_INDEX]);
            pairs.extend_from_slice(&list.list);
        }
        sort_rows(&mut pairs, k, largest, &mut out, i0);
    }
    Ok(out)
}
