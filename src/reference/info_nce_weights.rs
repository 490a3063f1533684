//! Reference of `shaders/info_nce_weights.wgsl`: per anchor row of the distances, the InfoNCE
//! loss's sums and `W = ∂L/∂D` before the mean's division, by the kernel's passes (the
//! negatives' log-sum-exp, then the positives, then the negatives), in f64.

use ndarray::{Array2, ArrayView2};

use crate::DistanceConfig;

/// What [`info_nce_weights`] gives.
#[derive(Debug, Clone)]
pub struct InfoNceWeights {
    /// `(b, m)` `∂L/∂D` before the mean's division (`L` the sum of the positives' losses).
    pub weights: Array2<f64>,
    /// The sum of the positives' losses.
    pub loss: f64,
    /// Positive pairs: the mean's divisor.
    pub positives: u64,
}

/// PML's `NTXentLoss(temperature)` terms over `distances` `(b, m)`: for anchor `a`, positives
/// `ref_labels[p] == labels[a]` (not `self_slots[a]`) and negatives `ref_labels[n] !=
/// labels[a]`, logits `z = ±D / τ` (`+` for similarities), `L = log Σ_N e^{z_n}`, each
/// positive's loss `−log(x + ε)` with `x = σ(z_p − L)` and `ε` f32's smallest normal number.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::reference::info_nce_weights::info_nce_weights;
/// use wgpu_metric_learning::InfoNceConfig;
/// let s = array![[1.0f32, 0.0]]; // a positive at similarity 1, a negative at 0
/// let out = info_nce_weights(s.view(), &[0], &[0, 1], &[u32::MAX], 1.0, InfoNceConfig::default().distance);
/// assert_eq!(out.positives, 1);
/// assert!((out.loss - (1.0 + (-1.0f64).exp()).ln()).abs() < 1e-12);
/// ```
pub fn info_nce_weights(
    distances: ArrayView2<'_, f32>,
    labels: &[u32],
    ref_labels: &[u32],
    self_slots: &[u32],
    temperature: f32,
    distance: DistanceConfig,
) -> InfoNceWeights {
    const TINY: f64 = f32::MIN_POSITIVE as f64;
    let sigmoid = |t: f64| 1.0 / (1.0 + (-t).exp());
    let dz = if distance.distance.is_similarity() {
        1.0
    } else {
        -1.0
    } / f64::from(temperature);
    let mut out = InfoNceWeights {
        weights: Array2::zeros(distances.dim()),
        loss: 0.0,
        positives: 0,
    };
    for (a, row) in distances.rows().into_iter().enumerate() {
        let z = |j: usize| dz * f64::from(row[j]);
        let negatives: Vec<usize> = (0..row.len())
            .filter(|&j| ref_labels[j] != labels[a])
            .collect();
        let positives: Vec<usize> = (0..row.len())
            .filter(|&j| ref_labels[j] == labels[a] && j as u32 != self_slots[a])
            .collect();
        out.positives += positives.len() as u64;
        let top = negatives
            .iter()
            .map(|&n| z(n))
            .fold(f64::NEG_INFINITY, f64::max);
        let log_sum = top
            + negatives
                .iter()
                .map(|&n| (z(n) - top).exp())
                .sum::<f64>()
                .ln();
        let mut on_negatives = 0.0;
        for &p in &positives {
            let (x, rest) = match negatives.is_empty() {
                true => (1.0, 0.0),
                false => (sigmoid(z(p) - log_sum), sigmoid(log_sum - z(p))),
            };
            out.loss -= (x + TINY).ln();
            let flat = x / (x + TINY);
            out.weights[[a, p]] = -dz * flat * rest;
            on_negatives += flat * rest;
        }
        for &n in &negatives {
            out.weights[[a, n]] = dz * (z(n) - log_sum).exp() * on_negatives;
        }
    }
    out
}
