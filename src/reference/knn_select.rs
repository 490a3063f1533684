//! Reference of `shaders/knn_select.wgsl` (and of the whole k-nearest-neighbour search, given
//! the distance matrix).

use ndarray::{Array2, ArrayView2};

/// Per query row of `scores` `(q, n)`: the `k` best references, best first (smallest score,
/// or largest with `largest`), ties broken by the lower index, skipping reference
/// `excluded[i]` for row `i` (`u32::MAX`: none). Returns `(indices, scores)`, each `(q, k)`;
/// a row with fewer than `k` candidates is padded with index `u32::MAX - 1` and score NaN.
///
/// `-0.0` and `0.0` are equal scores (they tie and go by index), as in the kernel.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::reference::knn_select::knn_select;
/// let scores = array![[0.5f32, 0.1, 0.1, 0.9]];
/// let (idx, val) = knn_select(scores.view(), 3, false, &[1]);
/// assert_eq!(idx, array![[2u32, 0, 3]]);
/// assert_eq!(val, array![[0.1f32, 0.5, 0.9]]);
/// ```
pub fn knn_select(
    scores: ArrayView2<'_, f32>,
    k: usize,
    largest: bool,
    excluded: &[u32],
) -> (Array2<u32>, Array2<f32>) {
    let q = scores.nrows();
    let mut indices = Array2::from_elem((q, k), u32::MAX - 1);
    let mut values = Array2::from_elem((q, k), f32::NAN);
    for (i, row) in scores.rows().into_iter().enumerate() {
        let skip = excluded.get(i).copied().unwrap_or(u32::MAX);
        let mut order: Vec<(f32, u32)> = row
            .iter()
            .enumerate()
            .map(|(j, &s)| (if s == 0.0 { 0.0 } else { s }, j as u32))
            .filter(|&(_, j)| j != skip)
            .collect();
        order.sort_by(|a, b| {
            let by_score = if largest {
                b.0.total_cmp(&a.0)
            } else {
                a.0.total_cmp(&b.0)
            };
            by_score.then(a.1.cmp(&b.1))
        });
        for (slot, (s, j)) in order.into_iter().take(k).enumerate() {
            indices[[i, slot]] = j;
            values[[i, slot]] = s;
        }
    }
    (indices, values)
}
