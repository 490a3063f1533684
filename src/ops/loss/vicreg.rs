//! PML's `VICRegLoss` with its gradient: no labels and no distance, only the two views'
//! statistics.
//!
//! With `Z`, `Z'` the two views `(n, d)` and `Zc` a view less its column means:
//! - invariance `λ · mean((Z − Z')²)`;
//! - variance `μ · mean_d relu(1 − √(var_d + ε)) / 2` per view (`var` with `n − 1`, as torch);
//! - covariance `ν · Σ_{i≠j} C_ij² / d` per view, `C = Zcᵀ Zc / (n − 1)`.
//!
//! PML forms the `(d, d)` matrix `C`. Its off-diagonal sum is `‖C‖²_F − Σ_d C_dd²`, and
//! `‖Zcᵀ Zc‖_F = ‖Zc Zcᵀ‖_F`, so where `n < d` (VICReg's expanders: `d` in the thousands) the
//! `(n, n)` Gram matrix `K = Zc Zcᵀ` gives it instead, and the gradient
//! `4ν / (d (n − 1)) · Zc (C − diag C)` is `4ν / (d (n − 1)) · (K Zc / (n − 1) − Zc diag C)`:
//! `n² d` work rather than `n d²`. Either matrix is at most `min(n, d)²`, no larger than a view,
//! so the call holds `O(n d)`: its working memory is reserved in the budget whole.

use ndarray::{Array1, Array2, ArrayView2, Axis};

use super::driver::fits;
use crate::context::plan::Plan;
use crate::context::{ComputePath, Context};
use crate::error::{Error, Result};
use crate::hooks::Hooks;
use crate::runtime::memory::HostReservation;
use crate::runtime::pool::par_mul;
use crate::validate;

const OP: &str = "vicreg_loss";

/// How [`vicreg_loss`] computes. Defaults: PML's `VICRegLoss()` (λ 25, μ 25, ν 1, ε 1e-4).
///
/// # Example
/// ```
/// let cfg = wgpu_metric_learning::VicRegConfig::default();
/// assert_eq!((cfg.invariance_lambda, cfg.variance_mu, cfg.covariance_v), (25.0, 25.0, 1.0));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct VicRegConfig {
    /// The invariance term's weight `λ`. Finite.
    pub invariance_lambda: f32,
    /// The variance terms' weight `μ`. Finite.
    pub variance_mu: f32,
    /// The covariance terms' weight `ν`. Finite.
    pub covariance_v: f32,
    /// Added to each variance under the square root. Finite and positive.
    pub eps: f32,
    /// Cancellation (checked before and after the work). Default: none.
    pub hooks: Hooks,
}

impl Default for VicRegConfig {
    fn default() -> Self {
        Self {
            invariance_lambda: 25.0,
            variance_mu: 25.0,
            covariance_v: 1.0,
            eps: 1e-4,
            hooks: Hooks::default(),
        }
    }
}

/// The result of [`vicreg_loss`]: the loss, its weighted terms (as PML's sub-losses, each
/// reduced by its mean), and the gradients.
///
/// See the example of [`vicreg_loss`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct VicRegLoss {
    /// `invariance + variance + covariance`.
    pub loss: f32,
    /// `λ · mean((Z − Z')²)`.
    pub invariance: f32,
    /// Both views' variance terms, `μ`-weighted.
    pub variance: f32,
    /// Both views' covariance terms, `ν`-weighted.
    pub covariance: f32,
    /// `∂loss/∂embeddings` `(n, d)` (both roles when no second view is given).
    pub grad: Array2<f32>,
    /// `∂loss/∂refs` `(n, d)` when a second view is given.
    pub ref_grad: Option<Array2<f32>>,
    /// Where it ran: the native path on every context.
    pub path: ComputePath,
}

/// PML's `VICRegLoss` of `embeddings` `(n, d)` and their second view `refs` `(n, d)` (`None`:
/// the embeddings themselves, as PML's `ref_emb` defaults, so the invariance is 0), with its
/// gradients. Cost `O(n d min(n, d))`, memory `O(n d)` (module docs).
///
/// # Errors
/// [`Error::Shape`] for fewer than 2 rows (the variance divides by `n − 1`), no columns, or
/// views of different shapes; [`Error::NonFinite`] for a NaN or infinity;
/// [`Error::InvalidParameter`] for a weight that is not finite or an `eps` that is not
/// positive; [`Error::OverBudget`] when the working memory does not fit; `Cancelled`.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{vicreg_loss, Context, VicRegConfig};
/// let ctx = Context::native_cpu(None);
/// let (z, z2) = (array![[1.0f32, 0.0], [0.0, 1.0], [1.0, 1.0]], array![[1.0f32, 0.1], [0.0, 1.0], [0.9, 1.0]]);
/// let out = vicreg_loss(&ctx, z.view(), Some(z2.view()), &VicRegConfig::default())?;
/// assert!(out.invariance > 0.0 && out.ref_grad.is_some());
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn vicreg_loss(
    ctx: &Context,
    embeddings: ArrayView2<'_, f32>,
    refs: Option<ArrayView2<'_, f32>>,
    cfg: &VicRegConfig,
) -> Result<VicRegLoss> {
    let bytes = check(embeddings, refs, cfg)?;
    fits(ctx, OP, bytes)?;
    cfg.hooks.check(OP)?;
    let _held = HostReservation::new("vicreg working memory", bytes, ctx.tracker())?;
    let (n, d) = embeddings.dim();
    let z2 = refs.unwrap_or(embeddings);
    let (v1, c1, mut grad) = view_terms(embeddings, cfg);
    let (v2, c2, g2) = view_terms(z2, cfg);
    let lambda = f64::from(cfg.invariance_lambda);
    let mut squares = 0.0f64;
    for (a, b) in embeddings.iter().zip(z2) {
        squares += f64::from(a - b).powi(2);
    }
    let invariance = lambda * squares / (n * d) as f64;
    let k = (2.0 * lambda / (n * d) as f64) as f32;
    let diff = &embeddings - &z2;
    grad.scaled_add(k, &diff);
    let ref_grad = match refs {
        Some(_) => {
            let mut g = g2;
            g.scaled_add(-k, &diff);
            Some(g)
        }
        None => {
            // One tensor in both roles: its two views' gradients add (the invariance's cancel).
            grad.scaled_add(-k, &diff);
            grad += &g2;
            None
        }
    };
    cfg.hooks.check(OP)?;
    let (variance, covariance) = (v1 + v2, c1 + c2);
    Ok(VicRegLoss {
        loss: (invariance + variance + covariance) as f32,
        invariance: invariance as f32,
        variance: variance as f32,
        covariance: covariance as f32,
        grad,
        ref_grad,
        path: ComputePath::NativeCpu,
    })
}

/// The [`Plan`] of [`vicreg_loss`]: one block of every row, and the bytes it holds.
///
/// # Errors
/// As [`vicreg_loss`]; [`Error::OverBudget`] when the working memory does not fit.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{vicreg_loss_plan, Context, VicRegConfig};
/// let z = ndarray::Array2::<f32>::ones((256, 2048));
/// let plan = vicreg_loss_plan(&Context::native_cpu(None), z.view(), Some(z.view()), &VicRegConfig::default())?;
/// assert!(plan.bytes < 32 << 20);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn vicreg_loss_plan(
    ctx: &Context,
    embeddings: ArrayView2<'_, f32>,
    refs: Option<ArrayView2<'_, f32>>,
    cfg: &VicRegConfig,
) -> Result<Plan> {
    let bytes = check(embeddings, refs, cfg)?;
    fits(ctx, OP, bytes)?;
    let n = embeddings.nrows();
    Ok(Plan {
        path: ComputePath::NativeCpu,
        rows: n,
        cols: n,
        chunks: 1,
        bytes,
        min_bytes: bytes,
    })
}

/// Checks the call; returns its working bytes: per view its centred copy, its gradient, its
/// Gram matrix (`min(n, d)²`) and a product of the view's shape; the difference of the views.
fn check(
    embeddings: ArrayView2<'_, f32>,
    refs: Option<ArrayView2<'_, f32>>,
    cfg: &VicRegConfig,
) -> Result<u64> {
    validate::embeddings(OP, "embeddings", embeddings)?;
    let (n, d) = embeddings.dim();
    if n < 2 {
        return Err(Error::Shape {
            op: OP,
            what: "embeddings",
            expected: "(n, d) with n >= 2 (the variance divides by n - 1)".into(),
            got: vec![n, d],
        });
    }
    if let Some(r) = refs {
        if r.dim() != (n, d) {
            return Err(Error::Shape {
                op: OP,
                what: "refs",
                expected: format!("({n}, {d}) to match embeddings"),
                got: r.shape().to_vec(),
            });
        }
        validate::finite(OP, "refs", r)?;
    }
    validate::finite_param(OP, "invariance_lambda", cfg.invariance_lambda)?;
    validate::finite_param(OP, "variance_mu", cfg.variance_mu)?;
    validate::finite_param(OP, "covariance_v", cfg.covariance_v)?;
    if !(cfg.eps.is_finite() && cfg.eps > 0.0) {
        return Err(Error::InvalidParameter {
            op: OP,
            what: "eps",
            value: cfg.eps.to_string(),
            rule: "must be finite and positive",
        });
    }
    let view = 4 * (n * d) as u64;
    let gram = 4 * n.min(d).pow(2) as u64;
    Ok(2 * (3 * view + gram + 32 * d as u64) + view)
}

/// One view's `μ`-weighted variance term, `ν`-weighted covariance term, and their gradient
/// `(n, d)`.
fn view_terms(z: ArrayView2<'_, f32>, cfg: &VicRegConfig) -> (f64, f64, Array2<f32>) {
    let (n, d) = z.dim();
    let dn = (n - 1) as f64;
    let mean: Array1<f64> = z.map_axis(Axis(0), |c| {
        c.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64
    });
    let mut zc = z.to_owned();
    for mut row in zc.rows_mut() {
        for (v, &m) in row.iter_mut().zip(&mean) {
            *v = (f64::from(*v) - m) as f32;
        }
    }
    let var: Array1<f64> = zc.map_axis(Axis(0), |c| {
        c.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / dn
    });
    let eps = f64::from(cfg.eps);
    let std = var.mapv(|v| (v + eps).sqrt());
    let (mu, nu) = (f64::from(cfg.variance_mu), f64::from(cfg.covariance_v));
    let variance = mu / (2.0 * d as f64) * std.iter().map(|s| (1.0 - s).max(0.0)).sum::<f64>();
    // ∂/∂z of μ/(2d) relu(1 − std_d): −μ/(2d) [std_d < 1] (z − m_d) / ((n − 1) std_d).
    let var_coef: Vec<f32> = std
        .iter()
        .map(|&s| {
            if 1.0 - s > 0.0 {
                (-mu / (2.0 * d as f64) / (dn * s)) as f32
            } else {
                0.0
            }
        })
        .collect();
    // The off-diagonal `Σ C_ij²` and `Zc (C − diag C)`, from the smaller Gram matrix.
    let mut product = Array2::<f32>::zeros((n, d));
    let off = if n < d {
        let mut k = Array2::<f32>::zeros((n, n));
        par_mul(1.0, zc.view(), zc.t(), 0.0, k.view_mut());
        par_mul(
            (1.0 / dn) as f32,
            k.view(),
            zc.view(),
            0.0,
            product.view_mut(),
        );
        for (mut p, c) in product.rows_mut().into_iter().zip(zc.rows()) {
            for (j, (p, &c)) in p.iter_mut().zip(c).enumerate() {
                *p = (f64::from(*p) - f64::from(c) * var[j]) as f32;
            }
        }
        let total = k.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / (dn * dn);
        total - var.iter().map(|v| v * v).sum::<f64>()
    } else {
        let mut c = Array2::<f32>::zeros((d, d));
        par_mul((1.0 / dn) as f32, zc.t(), zc.view(), 0.0, c.view_mut());
        c.diag_mut().fill(0.0);
        par_mul(1.0, zc.view(), c.view(), 0.0, product.view_mut());
        c.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>()
    };
    let covariance = nu * off / d as f64;
    // ∂/∂Zc = 4ν/(d (n − 1)) · (Zc C − Zc diag C); through the centring, less its column means.
    let k = 4.0 * nu / (d as f64 * dn);
    let mut grad = Array2::<f32>::zeros((n, d));
    for (g, &p) in grad.iter_mut().zip(&product) {
        *g = (k * f64::from(p)) as f32;
    }
    let means = grad.mean_axis(Axis(0)).unwrap_or_else(|| Array1::zeros(d));
    for (mut g, c) in grad.rows_mut().into_iter().zip(zc.rows()) {
        for (j, (g, &c)) in g.iter_mut().zip(c).enumerate() {
            *g += var_coef[j] * c - means[j];
        }
    }
    (variance, covariance, grad)
}
