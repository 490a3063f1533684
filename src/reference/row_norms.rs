//! Reference of `shaders/row_norms.wgsl`.

use ndarray::{Array1, ArrayView2};

/// Squared L2 norm of every row of `matrix` `(n, d)` → `(n,)`.
///
/// Summed as the kernel does: four components at a time (the kernel reads `vec4`s of a row
/// zero-padded to a multiple of 4), each group added to the running total.
///
/// # Example
/// ```
/// use ndarray::array;
/// let n = wgpu_metric_learning::reference::row_norms::row_norms(array![[3.0f32, 4.0], [0.0, 0.0]].view());
/// assert_eq!(n.to_vec(), vec![25.0, 0.0]);
/// ```
pub fn row_norms(matrix: ArrayView2<'_, f32>) -> Array1<f32> {
    let d = matrix.ncols();
    Array1::from_iter(matrix.rows().into_iter().map(|row| {
        let mut acc = 0.0f32;
        for k4 in (0..d).step_by(4) {
            let mut group = 0.0f32;
            for k in k4..(k4 + 4).min(d) {
                group += row[k] * row[k];
            }
            acc += group;
        }
        acc
    }))
}
