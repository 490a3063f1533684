//! Reference of `shaders/negative_sort.wgsl`.

use ndarray::{Array2, ArrayView2};

/// Per anchor `a` of `values` `(b, m)`: the values of its first `counts[a]` negatives
/// (`negatives` `(b, m)`, ascending reference indices), sorted ascending and padded with
/// `+inf` to `width` columns, as `(b, width)`.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::reference::negative_sort::negative_sort;
/// let values = array![[0.5f32, 0.1, 0.9]];
/// let sorted = negative_sort(values.view(), array![[0u32, 2, 0]].view(), &[2], 4);
/// assert_eq!(sorted, array![[0.5f32, 0.9, f32::INFINITY, f32::INFINITY]]);
/// ```
pub fn negative_sort(
    values: ArrayView2<'_, f32>,
    negatives: ArrayView2<'_, u32>,
    counts: &[u32],
    width: usize,
) -> Array2<f32> {
    let mut out = Array2::from_elem((values.nrows(), width), f32::INFINITY);
    for (a, mut row) in out.rows_mut().into_iter().enumerate() {
        let n = counts.get(a).map_or(0, |&c| c as usize).min(width);
        let mut kept: Vec<f32> = (0..n)
            .map(|j| values[[a, negatives[[a, j]] as usize]])
            .collect();
        kept.sort_by(f32::total_cmp);
        for (o, v) in row.iter_mut().zip(kept) {
            *o = v;
        }
    }
    out
}
