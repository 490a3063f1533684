//! Reference of `shaders/triplet_weights.wgsl`: per anchor row of the distances, the triplet
//! loss's sums and `W = ∂L/∂D` before the mean's division, by the kernel's loop (every
//! positive against every negative of the row), in f64 where the kernel sums in f32.

use ndarray::{Array2, ArrayView2};

use crate::TripletLossConfig;

/// What [`triplet_weights`] gives.
#[derive(Debug, Clone)]
pub struct TripletWeights {
    /// `(b, m)` `∂L/∂D` before the mean's division (`L` the sum of the positive losses).
    pub weights: Array2<f64>,
    /// The sum of the positive losses.
    pub loss: f64,
    /// Triplets with a positive loss.
    pub nonzero: u64,
    /// Triplets kept.
    pub triplets: u64,
}

/// The sums and weights of PML's `TripletMarginLoss` (without swap) over `distances` `(b, m)`:
/// triplet `(a, p, n)` with `ref_labels[p] == labels[a] != ref_labels[n]` and
/// `p != self_slots[a]`, kept by `cfg.triplets`, scored with `relu` (or `softplus`) of PML's
/// f32 violation.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::reference::triplet_weights::triplet_weights;
/// use wgpu_metric_learning::TripletLossConfig;
/// // Anchor 0: positive 0 at 0.5, negative 1 at 0.52: loss 0.5 - 0.52 + 0.05 = 0.03.
/// let d = array![[0.5f32, 0.52]];
/// let out = triplet_weights(d.view(), &[0], &[0, 1], &[u32::MAX], &TripletLossConfig::default());
/// assert_eq!((out.triplets, out.nonzero), (1, 1));
/// assert_eq!(out.weights, array![[1.0, -1.0]]);
/// ```
pub fn triplet_weights(
    distances: ArrayView2<'_, f32>,
    labels: &[u32],
    ref_labels: &[u32],
    self_slots: &[u32],
    cfg: &TripletLossConfig,
) -> TripletWeights {
    let similarity = cfg.distance.distance.is_similarity();
    let dp = if similarity { -1.0 } else { 1.0 };
    let mut out = TripletWeights {
        weights: Array2::zeros(distances.dim()),
        loss: 0.0,
        nonzero: 0,
        triplets: 0,
    };
    for (a, row) in distances.rows().into_iter().enumerate() {
        let positive = |j: usize| ref_labels[j] == labels[a] && j as u32 != self_slots[a];
        let negative = |j: usize| ref_labels[j] != labels[a];
        for p in (0..row.len()).filter(|&p| positive(p)) {
            for n in (0..row.len()).filter(|&n| negative(n)) {
                let (ap, an) = (row[p], row[n]);
                if !cfg.triplets.keeps(ap, an, similarity) {
                    continue;
                }
                out.triplets += 1;
                let v = if similarity {
                    (an - ap) + cfg.margin
                } else {
                    (ap - an) + cfg.margin
                };
                let (loss, slope) = if !cfg.smooth_loss {
                    if v > 0.0 {
                        (v, 1.0)
                    } else {
                        (0.0, 0.0)
                    }
                } else if v > 20.0 {
                    (v, 1.0)
                } else {
                    let z = v.exp();
                    (z.ln_1p(), z / (z + 1.0))
                };
                if loss > 0.0 {
                    out.nonzero += 1;
                    out.loss += f64::from(loss);
                    out.weights[[a, p]] += dp * f64::from(slope);
                    out.weights[[a, n]] -= dp * f64::from(slope);
                }
            }
        }
    }
    out
}
