//! A row's bounded candidate list, shared by the native searches (the general path's GEMM
//! blocks and the fused kernel's tiles): Faiss's reservoir, re-selected down to `k` whenever
//! it fills.

use crate::kernels::knn_select::{key_of, score_of};

/// One row's candidates: every element that could still be among its best `k`, re-selected
/// down to `k` whenever the list reaches its capacity (Faiss's reservoir). The bound is then
/// the worst kept score, oriented so that smaller is better, and anything worse is never
/// stored: most elements cost one comparison.
pub(super) struct Candidates {
    pub(super) list: Vec<[u32; 2]>,
    /// Oriented score (`s`, or `-s` for similarities) an element must not exceed.
    pub(super) bound: f32,
}

impl Candidates {
    pub(super) fn capacity(k: usize) -> usize {
        2 * k + 64
    }

    pub(super) fn new(k: usize) -> Self {
        Self {
            list: Vec::with_capacity(Self::capacity(k)),
            bound: f32::INFINITY,
        }
    }

    #[inline]
    pub(super) fn admits(&self, o: f32) -> bool {
        admits(o, self.bound)
    }

    /// Stores reference `index` with oriented score `oriented`.
    #[inline]
    pub(super) fn offer(&mut self, oriented: f32, index: u32, k: usize) {
        self.list.push([key_of(oriented, false), index]);
        if self.list.len() >= Self::capacity(k) {
            self.shrink(k);
        }
    }

    /// Keeps the best `k` by (key, index). Elements equal to the bound stay admissible: they
    /// lose the tie to the kept ones by index, since a shard's blocks arrive in index order.
    fn shrink(&mut self, k: usize) {
        shrink(&mut self.list, k);
        if self.list.len() == k {
            // A worst kept element that is a NaN (its key orders it after +∞) must not become
            // a NaN bound, which would admit nothing but NaNs: everything stays admissible.
            let bound = score_of(self.list[k - 1][0], false);
            self.bound = if bound.is_nan() { f32::INFINITY } else { bound };
        }
    }
}

/// Whether oriented score `o` may enter a list bounded by `bound`: not above it. A NaN may
/// (its key orders it last, as in the kernel).
#[inline]
pub(super) fn admits(o: f32, bound: f32) -> bool {
    o <= bound || o.is_nan()
}

/// The lanes of `scores` (at most 64) that `bound` admits, one bit each, lowest lane first.
/// Most groups of scores admit nothing, which an or of compares (vector code) says at once;
/// then the set bits alone are visited, with no branch per lane to mispredict.
#[inline(always)]
pub(super) fn admitted(scores: &[f32], bound: f32) -> u64 {
    if !scores.iter().fold(false, |any, &o| any | admits(o, bound)) {
        return 0;
    }
    admitted_lanes(scores, bound)
}

/// [`admitted`] without its first test: the mask computed with no branch.
#[inline(always)]
pub(super) fn admitted_lanes(scores: &[f32], bound: f32) -> u64 {
    scores
        .iter()
        .enumerate()
        .fold(0u64, |m, (j, &o)| m | (u64::from(admits(o, bound)) << j))
}

/// Keeps the best `k` `(key, index)` pairs of `list`, in no particular order.
pub(super) fn shrink(list: &mut Vec<[u32; 2]>, k: usize) {
    if list.len() > k {
        list.select_nth_unstable_by(k - 1, |a, b| (a[0], a[1]).cmp(&(b[0], b[1])));
        list.truncate(k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A list whose worst kept element is a NaN (more NaNs than its capacity first) still
    /// admits, and keeps, the numbers that come after.
    #[test]
    fn a_nan_bound_still_admits_numbers() {
        for nan in [f32::NAN, -f32::NAN] {
            let k = 1;
            let mut list = Candidates::new(k);
            for i in 0..100 {
                if list.admits(nan) {
                    list.offer(nan, i, k);
                }
            }
            assert!(list.admits(0.5), "{nan:?}: bound {}", list.bound);
            list.offer(0.5, 100, k);
            shrink(&mut list.list, k);
            let best = if nan.is_sign_positive() { 100 } else { 0 };
            assert_eq!(list.list[0][1], best, "{nan:?}");
        }
    }
}
