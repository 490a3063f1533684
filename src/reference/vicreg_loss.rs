//! Reference of [`crate::vicreg_loss`]: PML's `VICRegLoss` as PML writes it, in f64, with the
//! `(d, d)` covariance matrix (the library takes the smaller Gram matrix where `n < d`), and
//! its gradient by hand.

use ndarray::{Array1, Array2, ArrayView2, Axis};

/// The reference's loss, its terms, and the gradients of both views.
#[derive(Debug, Clone)]
pub struct ReferenceVicReg {
    /// The sum of the terms.
    pub loss: f64,
    /// `λ · mean((Z − Z')²)`.
    pub invariance: f64,
    /// Both views' variance terms.
    pub variance: f64,
    /// Both views' covariance terms.
    pub covariance: f64,
    /// `∂loss/∂Z` `(n, d)`.
    pub grad: Array2<f64>,
    /// `∂loss/∂Z'` `(n, d)`.
    pub ref_grad: Array2<f64>,
}

/// `(λ, μ, ν, ε)` as PML's `VICRegLoss(invariance_lambda, variance_mu, covariance_v, eps)`
/// of `z` and `z2` `(n, d)`, `n ≥ 2`, two distinct tensors.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::reference::vicreg_loss::vicreg_loss;
/// let z = array![[1.0f32, 0.0], [-1.0, 0.0]];
/// // Column variances 2 and 0: stds √2.0001 and √0.0001; no covariance.
/// let out = vicreg_loss(z.view(), z.view(), (25.0, 25.0, 1.0, 1e-4));
/// let want = 2.0 * 25.0 * (1.0 - 1e-4f64.sqrt()) / 4.0;
/// assert!((out.variance - want).abs() < 1e-6 && out.covariance == 0.0);
/// ```
pub fn vicreg_loss(
    z: ArrayView2<'_, f32>,
    z2: ArrayView2<'_, f32>,
    (lambda, mu, nu, eps): (f32, f32, f32, f32),
) -> ReferenceVicReg {
    let (n, d) = z.dim();
    let (a, b) = (z.mapv(f64::from), z2.mapv(f64::from));
    let (lambda, mu, nu, eps) = (
        f64::from(lambda),
        f64::from(mu),
        f64::from(nu),
        f64::from(eps),
    );
    let diff = &a - &b;
    let invariance = lambda * diff.mapv(|v| v * v).sum() / (n * d) as f64;
    let (v1, c1, g1) = view(&a, mu, nu, eps);
    let (v2, c2, g2) = view(&b, mu, nu, eps);
    let k = 2.0 * lambda / (n * d) as f64;
    ReferenceVicReg {
        loss: invariance + v1 + v2 + c1 + c2,
        invariance,
        variance: v1 + v2,
        covariance: c1 + c2,
        grad: g1 + &diff * k,
        ref_grad: g2 - &diff * k,
    }
}

/// One view's variance term, covariance term and their gradient.
fn view(x: &Array2<f64>, mu: f64, nu: f64, eps: f64) -> (f64, f64, Array2<f64>) {
    let (n, d) = x.dim();
    let dn = (n - 1) as f64;
    let mean = x.mean_axis(Axis(0)).unwrap_or_else(|| Array1::zeros(d));
    let xc = x - &mean;
    let c = xc.t().dot(&xc) / dn;
    let std: Array1<f64> = (0..d).map(|j| (c[[j, j]] + eps).sqrt()).collect();
    let variance = mu * std.iter().map(|s| (1.0 - s).max(0.0)).sum::<f64>() / (2.0 * d as f64);
    let mut off = c.clone();
    for j in 0..d {
        off[[j, j]] = 0.0;
    }
    let covariance = nu * off.mapv(|v| v * v).sum() / d as f64;
    // Covariance: ∂/∂xc = 4ν/(d (n − 1)) xc off; through the centring, less its column means.
    let g_cov = xc.dot(&off) * (4.0 * nu / (d as f64 * dn));
    let means = g_cov.mean_axis(Axis(0)).unwrap_or_else(|| Array1::zeros(d));
    let mut grad = g_cov - &means;
    // Variance: ∂/∂x of μ/(2d) relu(1 − std) = −μ/(2d) [std < 1] (x − mean) / ((n − 1) std).
    for ((i, j), g) in grad.indexed_iter_mut() {
        if 1.0 - std[j] > 0.0 {
            *g -= mu / (2.0 * d as f64) * xc[[i, j]] / (dn * std[j]);
        }
    }
    (variance, covariance, grad)
}
