//! Reference of [`crate::dynamic_soft_margin_loss`]: PML's `DynamicSoftMarginLoss` with every
//! triplet listed, its histogram as PML builds it, and the gradient through the histogram
//! taken term by term in f64.

use ndarray::{Array2, ArrayView2};

use super::pair_gradient::pair_gradient;
use super::pair_loss::ReferencePairLoss;
use crate::{DistanceConfig, DynamicSoftMargin};

/// PML's `DynamicSoftMarginLoss` written out as PML computes it: every triplet of `lists`
/// scored by `distances` `(b, m)`, `x = D_ap − D_an` soft-binned into the histogram mixed
/// with `previous` (PML's `hist_`; momentum 1 when it sums to 0) and normalised, the loss
/// `mean(CDF[k] x)`; `∂loss/∂D` through the CDF and through this batch's histogram
/// (`∂h/∂α`, as PML's autograd), in f64, with the gradient from `queries` `(b, d)` and
/// `refs` `(m, d)`. `None` when a triplet falls outside the histogram (PML's index error);
/// the histogram is returned as it was without a triplet.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::reference::dynamic_soft_margin::dynamic_soft_margin_loss;
/// use wgpu_metric_learning::{DistanceConfig, DynamicSoftMargin};
/// let x = array![[1.0f32, 0.0], [0.0, 1.0]];
/// let d = array![[0.0f32, 0.5], [0.5, 0.0]];
/// let lists = vec![(vec![], vec![1u32]), (vec![], vec![0u32])];
/// let rule = DynamicSoftMargin::default();
/// let (out, hist) = dynamic_soft_margin_loss(x.view(), x.view(), d.view(), &lists, rule, &[], DistanceConfig::default()).expect("inside");
/// assert!(out.loss == 0.0 && hist.is_empty());
/// ```
pub fn dynamic_soft_margin_loss(
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
    distances: ArrayView2<'_, f32>,
    lists: &[(Vec<u32>, Vec<u32>)],
    rule: DynamicSoftMargin,
    previous: &[f32],
    distance: DistanceConfig,
) -> Option<(ReferencePairLoss, Vec<f64>)> {
    let mut out = ReferencePairLoss {
        loss: 0.0,
        nonzero: 0,
        query_grad: Array2::zeros(queries.dim()),
        ref_grad: Array2::zeros(refs.dim()),
        beta_grad: 0.0,
    };
    let dist = |a: usize, j: u32| f64::from(distances[[a, j as usize]]);
    let mut triplets = Vec::new();
    for (a, (pos, neg)) in lists.iter().enumerate() {
        for &p in pos {
            for &n in neg {
                triplets.push((a, p, n, dist(a, p) - dist(a, n)));
            }
        }
    }
    let previous: Vec<f64> = previous.iter().map(|&v| f64::from(v)).collect();
    if triplets.is_empty() {
        return Some((out, previous));
    }
    let bins = rule.num_bins as usize;
    let min = f64::from(rule.min_val);
    let delta = 2.0 * min.abs() / bins as f64;
    let pos = |x: f64| (x - min) / delta;
    if triplets
        .iter()
        .any(|t| pos(t.3) < 0.0 || pos(t.3).floor() as usize + 1 >= bins)
    {
        return None;
    }
    let old: f64 = previous.iter().sum();
    let m = if old != 0.0 {
        f64::from(rule.momentum)
    } else {
        1.0
    };
    let mut u: Vec<f64> = (0..bins)
        .map(|k| (1.0 - m) * previous.get(k).copied().unwrap_or(0.0))
        .collect();
    for t in &triplets {
        let k = pos(t.3).floor() as usize;
        let alpha = pos(t.3) - k as f64;
        u[k] += m * (1.0 - alpha);
        u[k + 1] += m * alpha;
    }
    let h: f64 = u.iter().sum();
    let hist: Vec<f64> = u.iter().map(|v| v / h).collect();
    let cdf: Vec<f64> = hist
        .iter()
        .scan(0.0, |acc, v| {
            *acc += v;
            Some(*acc)
        })
        .collect();
    let count = triplets.len() as f64;
    out.loss = triplets
        .iter()
        .map(|t| cdf[pos(t.3).floor() as usize] * t.3)
        .sum::<f64>()
        / count;
    out.nonzero = triplets.len() as u64;
    // ∂L/∂hist_b = Σ_t x_t [k_t ≥ b] / T; ∂hist_b/∂x_t = m/(δ H) ([b = k_t + 1] − [b = k_t]).
    let g_hist: Vec<f64> = (0..bins)
        .map(|b| {
            triplets
                .iter()
                .filter(|t| pos(t.3).floor() as usize >= b)
                .map(|t| t.3)
                .sum::<f64>()
                / count
        })
        .collect();
    let mut w = Array2::<f64>::zeros(distances.dim());
    for &(a, p, n, x) in &triplets {
        let k = pos(x).floor() as usize;
        let g = cdf[k] / count + m / (delta * h) * (g_hist[k + 1] - g_hist[k]);
        w[[a, p as usize]] += g;
        w[[a, n as usize]] -= g;
    }
    for ((a, j), &g) in w.indexed_iter().filter(|(_, &g)| g != 0.0) {
        let (dq, dr) = pair_gradient(distance, queries.row(a), refs.row(j), g);
        let mut qa = out.query_grad.row_mut(a);
        qa += &dq;
        let mut rr = out.ref_grad.row_mut(j);
        rr += &dr;
    }
    Some((out, hist))
}
