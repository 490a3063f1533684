//! The gradient of one pair's distance with respect to both embeddings, in f64, through the
//! distance and the normalisation's Jacobian: the references' building block for losses.

use ndarray::{Array1, ArrayView1};

use crate::{Distance, DistanceConfig};

/// `x / max(|x|, 1e-12)` when `normalize`, in f64.
fn normalised(x: ArrayView1<'_, f32>, normalize: bool) -> Array1<f64> {
    let x = x.mapv(f64::from);
    if !normalize {
        return x;
    }
    let norm = x.dot(&x).sqrt().max(1e-12);
    x / norm
}

/// `∂D(q̂, r̂)/∂q̂`; `∂D/∂r̂` is its negation for Euclidean forms and `q̂` for similarities.
fn d_dq(distance: Distance, q: &Array1<f64>, r: &Array1<f64>) -> Array1<f64> {
    match distance {
        Distance::Euclidean => {
            let diff = q - r;
            let d = diff.dot(&diff).sqrt();
            if d > 0.0 {
                diff / d
            } else {
                Array1::zeros(q.len())
            }
        }
        Distance::SquaredEuclidean => (q - r) * 2.0,
        Distance::Cosine | Distance::DotProduct => r.clone(),
    }
}

fn d_dr(distance: Distance, q: &Array1<f64>, r: &Array1<f64>) -> Array1<f64> {
    match distance {
        Distance::Cosine | Distance::DotProduct => q.clone(),
        _ => -d_dq(distance, q, r),
    }
}

/// `g` (with respect to `x̂`) taken back to `x` through `x̂ = x / max(|x|, 1e-12)` by the
/// normalisation's Jacobian `(I − x̂ x̂ᵀ) / |x|`.
fn through_normalization(g: &Array1<f64>, x: ArrayView1<'_, f32>) -> Array1<f64> {
    let x = x.mapv(f64::from);
    let norm = x.dot(&x).sqrt();
    if norm <= 1e-12 {
        return g / 1e-12;
    }
    let x_hat = &x / norm;
    let mut out = Array1::zeros(x.len());
    for i in 0..x.len() {
        for j in 0..x.len() {
            let jacobian = (if i == j { 1.0 } else { 0.0 }) - x_hat[i] * x_hat[j];
            out[i] += jacobian * g[j] / norm;
        }
    }
    out
}

/// `D(q, r)` for the raw rows `q` and `r`, in f64.
pub(crate) fn pair_distance(
    cfg: DistanceConfig,
    q: ArrayView1<'_, f32>,
    r: ArrayView1<'_, f32>,
) -> f64 {
    let normalize = cfg.normalize || cfg.distance == Distance::Cosine;
    let (q, r) = (normalised(q, normalize), normalised(r, normalize));
    match cfg.distance {
        Distance::Euclidean => (&q - &r).mapv(|v| v * v).sum().sqrt(),
        Distance::SquaredEuclidean => (&q - &r).mapv(|v| v * v).sum(),
        Distance::Cosine | Distance::DotProduct => q.dot(&r),
    }
}

/// `w · ∂D(q, r)/∂q` and `w · ∂D(q, r)/∂r` for the raw rows `q` and `r`.
pub(crate) fn pair_gradient(
    cfg: DistanceConfig,
    q: ArrayView1<'_, f32>,
    r: ArrayView1<'_, f32>,
    w: f64,
) -> (Array1<f64>, Array1<f64>) {
    let normalize = cfg.normalize || cfg.distance == Distance::Cosine;
    let (q_hat, r_hat) = (normalised(q, normalize), normalised(r, normalize));
    let dq = d_dq(cfg.distance, &q_hat, &r_hat) * w;
    let dr = d_dr(cfg.distance, &q_hat, &r_hat) * w;
    if normalize {
        (through_normalization(&dq, q), through_normalization(&dr, r))
    } else {
        (dq, dr)
    }
}
