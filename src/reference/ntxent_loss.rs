//! Reference of [`crate::ntxent_loss`] (and of [`crate::multiple_negatives_ranking_loss`],
//! which is the same loss with every candidate its own class): every positive pair's softmax
//! written out as PML writes it (each pair against its anchor's negatives, the maximum
//! subtracted), its gradient taken pair by pair in f64.

use ndarray::{Array2, ArrayView2};

use super::pair_gradient::pair_gradient;
use crate::DistanceConfig;

/// The loss and gradients of [`ntxent_loss`], in f64.
#[derive(Debug, Clone)]
pub struct ReferenceNtXent {
    /// The mean over the positive pairs (0 when PML returns no loss).
    pub loss: f64,
    /// Positive pairs.
    pub positive_pairs: u64,
    /// `∂loss/∂queries` `(b, d)` through the queries' role as anchors only.
    pub query_grad: Array2<f64>,
    /// `∂loss/∂refs` `(m, d)` through the references' role.
    pub ref_grad: Array2<f64>,
}

/// PML's `NTXentLoss(temperature)` over `lists` (per anchor, its positive and negative
/// references), scored with `distances` `(b, m)`; gradients from `queries` `(b, d)` and
/// `refs` `(m, d)`. `pml_empty`: PML's rule that at most one positive and one negative pair
/// give no loss (true for NTXent, false for MNRL's cross-entropy).
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::reference::ntxent_loss::ntxent_loss;
/// use wgpu_metric_learning::InfoNceConfig;
/// let x = array![[1.0f32, 0.0], [1.0, 0.0], [0.0, 1.0]];
/// let s = array![[1.0f32, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]];
/// let lists = vec![(vec![1u32], vec![2u32]), (vec![0], vec![2]), (vec![], vec![0, 1])];
/// let out = ntxent_loss(x.view(), x.view(), s.view(), &lists, 1.0, InfoNceConfig::default().distance, true);
/// // −log(e / (e + 1)) for both positive pairs.
/// assert!((out.loss - (1.0 + (-1.0f64).exp()).ln()).abs() < 1e-12);
/// ```
pub fn ntxent_loss(
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
    distances: ArrayView2<'_, f32>,
    lists: &[(Vec<u32>, Vec<u32>)],
    temperature: f32,
    distance: DistanceConfig,
    pml_empty: bool,
) -> ReferenceNtXent {
    let positive_pairs: u64 = lists.iter().map(|(p, _)| p.len() as u64).sum();
    let negative_pairs: u64 = lists.iter().map(|(_, n)| n.len() as u64).sum();
    let mut out = ReferenceNtXent {
        loss: 0.0,
        positive_pairs,
        query_grad: Array2::zeros(queries.dim()),
        ref_grad: Array2::zeros(refs.dim()),
    };
    // PML returns no loss with at most one positive and one negative pair (`pml_empty`: NTXent,
    // not sentence-transformers' cross-entropy); nothing to average or to push without both.
    let pml_none = positive_pairs <= 1 && negative_pairs <= 1;
    if positive_pairs == 0 || negative_pairs == 0 || (pml_empty && pml_none) {
        return out;
    }
    // Logits: similarities over τ, or negated distances over τ.
    let sign = if distance.distance.is_similarity() {
        1.0
    } else {
        -1.0
    };
    let tau = f64::from(temperature);
    let mut sum = 0.0;
    for (a, (positives, negatives)) in lists.iter().enumerate() {
        let z = |j: u32| sign * f64::from(distances[[a, j as usize]]) / tau;
        for &p in positives {
            // The pair's softmax over [p, negatives…], its maximum subtracted.
            let top = negatives.iter().map(|&n| z(n)).fold(z(p), f64::max);
            let den: f64 =
                (z(p) - top).exp() + negatives.iter().map(|&n| (z(n) - top).exp()).sum::<f64>();
            let prob = |j: u32| (z(j) - top).exp() / den;
            let eps = f64::from(f32::MIN_POSITIVE);
            let x = prob(p);
            sum -= (x + eps).ln();
            // ℓ = −log(x + ε), x = π_p: ∂ℓ/∂z_p = −x (1 − x) / (x + ε) and
            // ∂ℓ/∂z_n = x π_n / (x + ε); ∂z/∂D = sign / τ.
            let c = x / (x + eps);
            let mut terms = vec![(p, -c * (1.0 - x))];
            terms.extend(negatives.iter().map(|&n| (n, c * prob(n))));
            for (r, dl_dz) in terms {
                let w = dl_dz * sign / tau;
                let (dq, dr) = pair_gradient(distance, queries.row(a), refs.row(r as usize), w);
                let mut qa = out.query_grad.row_mut(a);
                qa += &dq;
                let mut rr = out.ref_grad.row_mut(r as usize);
                rr += &dr;
            }
        }
    }
    let k = positive_pairs as f64;
    out.loss = sum / k;
    out.query_grad /= k;
    out.ref_grad /= k;
    out
}
