//! Reference of the Matryoshka widths of [`crate::ntxent_loss`] and
//! [`crate::multiple_negatives_ranking_loss`]: the loss run once per width on copies of the
//! rows cut to it (as sentence-transformers' `MatryoshkaLoss` runs it), each through
//! [`super::ntxent_loss::ntxent_loss`] in f64, the gradients padded with zeros to the full width
//! and summed with the weights.

use ndarray::{s, Array2, ArrayView2};

use super::ntxent_loss::ntxent_loss;
use crate::{Distance, DistanceConfig};

/// The weighted loss, each width's loss and the gradients of [`matryoshka`], in f64.
#[derive(Debug, Clone)]
pub struct ReferenceMatryoshka {
    /// `Σ_t ω_t L_t`.
    pub loss: f64,
    /// `L_t` per given width.
    pub losses: Vec<f64>,
    /// `∂loss/∂queries` `(b, d)` through the queries' role as anchors only.
    pub query_grad: Array2<f64>,
    /// `∂loss/∂refs` `(m, d)` through the references' role.
    pub ref_grad: Array2<f64>,
}

/// The InfoNCE loss (temperature `τ`, cosine similarity) of `queries` `(b, d)` against `refs`
/// `(m, d)` over `lists` (per anchor, its positive and negative references), on the rows cut
/// to each of `dims` with `weights`; `pml_empty` as in [`ntxent_loss`].
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::reference::matryoshka::matryoshka;
/// let x = array![[1.0f32, 0.0], [1.0, 1.0], [0.0, 1.0]];
/// let lists = vec![(vec![1u32], vec![2u32]), (vec![0], vec![2]), (vec![], vec![0, 1])];
/// let out = matryoshka(x.view(), x.view(), &lists, 1.0, (&[1, 2], &[1.0, 0.5]), true);
/// // At width 1, rows 0 and 1 coincide and row 2 is zero.
/// assert!((out.losses[0] - (1.0 + (-1.0f64).exp()).ln()).abs() < 1e-12);
/// assert!((out.loss - out.losses[0] - 0.5 * out.losses[1]).abs() < 1e-12);
/// ```
pub fn matryoshka(
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
    lists: &[(Vec<u32>, Vec<u32>)],
    temperature: f32,
    (dims, weights): (&[usize], &[f32]),
    pml_empty: bool,
) -> ReferenceMatryoshka {
    let cosine = DistanceConfig {
        distance: Distance::Cosine,
        normalize: true,
    };
    let mut out = ReferenceMatryoshka {
        loss: 0.0,
        losses: Vec::new(),
        query_grad: Array2::zeros(queries.dim()),
        ref_grad: Array2::zeros(refs.dim()),
    };
    for (&e, &w) in dims.iter().zip(weights) {
        let (q, r) = (queries.slice(s![.., ..e]), refs.slice(s![.., ..e]));
        let cut = ntxent_loss(
            q,
            r,
            cosines(q, r).view(),
            lists,
            temperature,
            cosine,
            pml_empty,
        );
        let w = f64::from(w);
        out.loss += w * cut.loss;
        out.losses.push(cut.loss);
        let mut g = out.query_grad.slice_mut(s![.., ..e]);
        g.scaled_add(w, &cut.query_grad);
        let mut g = out.ref_grad.slice_mut(s![.., ..e]);
        g.scaled_add(w, &cut.ref_grad);
    }
    out
}

/// Cosine similarities `(b, m)` in f64 (norms clamped at `1e-12`), rounded to f32.
fn cosines(q: ArrayView2<'_, f32>, r: ArrayView2<'_, f32>) -> Array2<f32> {
    let unit = |x: ArrayView2<'_, f32>| {
        let mut x = x.mapv(f64::from);
        for mut row in x.rows_mut() {
            let norm = row.dot(&row).sqrt().max(1e-12);
            row /= norm;
        }
        x
    };
    unit(q).dot(&unit(r).t()).mapv(|v| v as f32)
}
