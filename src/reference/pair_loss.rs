//! Reference of [`crate::pair_loss`]: PML's `ContrastiveLoss`, `MultiSimilarityLoss`,
//! `SupConLoss`, `CircleLoss`, `NCALoss`, `GeneralizedLiftedStructureLoss` and `MarginLoss`
//! written out as PML computes them (per-pair losses then the reducer; masked logsumexps with
//! PML's added 0; SupCon's shift by the whole row's maximum; MarginLoss over its listed
//! triplets), every pair's gradient taken one by one in f64.

use ndarray::{Array2, ArrayView2};

use super::pair_gradient::pair_gradient;
pub use super::pair_weights::PairLossRef;
use super::pair_weights::{lse, pair_weights};
use crate::DistanceConfig;

/// The loss and gradients of [`pair_loss`], in f64.
#[derive(Debug, Clone)]
pub struct ReferencePairLoss {
    /// The reduced loss (0 when PML returns no loss).
    pub loss: f64,
    /// The reducers' divisors added up.
    pub nonzero: u64,
    /// `∂loss/∂queries` `(b, d)` through the queries' role as anchors only.
    pub query_grad: Array2<f64>,
    /// `∂loss/∂refs` `(m, d)` through the references' role.
    pub ref_grad: Array2<f64>,
    /// `∂loss/∂β` (MarginLoss with `learn_beta`; 0 otherwise).
    pub beta_grad: f64,
}

/// PML's `loss` over `lists` (per anchor, its positive and negative references), scored with
/// `distances` `(b, m)` ([`pair_weights`]); gradients from `queries` `(b, d)` and `refs`
/// `(m, d)`, pair by pair.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::reference::pair_loss::{pair_loss, PairLossRef};
/// use wgpu_metric_learning::{Contrastive, DistanceConfig};
/// let x = array![[1.0f32, 0.0], [0.6, 0.8], [0.0, 1.0]];
/// let d = array![[0.0f32, 0.9, 1.4], [0.9, 0.0, 0.6], [1.4, 0.6, 0.0]];
/// let lists = vec![(vec![1u32], vec![2u32]), (vec![0], vec![2]), (vec![], vec![0, 1])];
/// let rule = PairLossRef::Contrastive(Contrastive::default());
/// let out = pair_loss(x.view(), x.view(), d.view(), &lists, rule, DistanceConfig::default());
/// // Positive pairs 0.9, 0.9 (mean 0.9); negative pairs 1 − 0.6 twice (mean 0.4).
/// assert!((out.loss - 1.3).abs() < 1e-6);
/// ```
pub fn pair_loss(
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
    distances: ArrayView2<'_, f32>,
    lists: &[(Vec<u32>, Vec<u32>)],
    rule: PairLossRef,
    distance: DistanceConfig,
) -> ReferencePairLoss {
    let w = pair_weights(distances, lists, rule, distance);
    let mut out = ReferencePairLoss {
        loss: w.loss,
        nonzero: w.nonzero,
        query_grad: Array2::zeros(queries.dim()),
        ref_grad: Array2::zeros(refs.dim()),
        beta_grad: w.beta_grad,
    };
    for ((a, j), &w) in w.weights.indexed_iter().filter(|(_, &w)| w != 0.0) {
        let (dq, dr) = pair_gradient(distance, queries.row(a), refs.row(j), w);
        let mut qa = out.query_grad.row_mut(a);
        qa += &dq;
        let mut rr = out.ref_grad.row_mut(j);
        rr += &dr;
    }
    out
}

/// PML's `InstanceLoss(gamma)` written out as PML computes it: the `(b, b)` cosine matrix of
/// `queries` `(b, d)` (rows normalised as torch's `normalize`) scaled by `gamma`, each row's
/// cross entropy with its label's rank among the sorted distinct `labels` as the target
/// column, the mean; the gradient in f64 through the matrix and the normalisation, both
/// roles in [`ReferencePairLoss::query_grad`] (`ref_grad` is empty).
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::reference::pair_loss::instance_loss;
/// let x = array![[1.0f32, 0.0], [0.0, 2.0]];
/// // Labels 7 and 3: row 0's target is column 1 (7 ranks second), row 1's column 0.
/// let out = instance_loss(x.view(), &[7, 3], 1.0);
/// let want = (1.0f64.exp() + 1.0).ln();
/// assert!((out.loss - want).abs() < 1e-12);
/// ```
pub fn instance_loss<L: Ord + Copy>(
    queries: ArrayView2<'_, f32>,
    labels: &[L],
    gamma: f32,
) -> ReferencePairLoss {
    let (b, d) = queries.dim();
    let x = queries.mapv(f64::from);
    let norms: Vec<f64> = x.rows().into_iter().map(|r| r.dot(&r).sqrt()).collect();
    let mut x_hat = x.clone();
    for (mut r, &n) in x_hat.rows_mut().into_iter().zip(&norms) {
        r /= n.max(1e-12);
    }
    let mut sorted = labels.to_vec();
    sorted.sort();
    sorted.dedup();
    let gamma = f64::from(gamma);
    let s = x_hat.dot(&x_hat.t());
    let mut g_s = Array2::<f64>::zeros((b, b));
    let mut loss = 0.0;
    for a in 0..b {
        let t = sorted.binary_search(&labels[a]).unwrap_or(0);
        let z = s.row(a).mapv(|v| gamma * v);
        let top = z.fold(f64::NEG_INFINITY, |m, &v| m.max(v));
        let sum: f64 = z.iter().map(|v| (v - top).exp()).sum();
        loss += (top + sum.ln() - z[t]) / b as f64;
        for j in 0..b {
            let own = if j == t { 1.0 } else { 0.0 };
            g_s[[a, j]] = gamma * ((z[j] - top).exp() / sum - own) / b as f64;
        }
    }
    let g_hat = g_s.dot(&x_hat) + g_s.t().dot(&x_hat);
    let mut query_grad = Array2::<f64>::zeros((b, d));
    for (a, &norm) in norms.iter().enumerate() {
        let (g, h) = (g_hat.row(a), x_hat.row(a));
        let mut out = query_grad.row_mut(a);
        if norm > 1e-12 {
            out.assign(&((&g - &(&h * h.dot(&g))) / norm));
        } else {
            out.assign(&(&g / 1e-12));
        }
    }
    ReferencePairLoss {
        loss,
        nonzero: b as u64,
        query_grad,
        ref_grad: Array2::zeros((0, d)),
        beta_grad: 0.0,
    }
}

/// PML's `AngularLoss(alpha)` written out as PML computes it: every positive pair `(a, p)` of
/// `lists` (per query `(b, d)`, its positive and negative references `(m, d)`), the anchor and
/// positive normalised, the negatives raw, `log(1 + Σ_n e^{c₁ (x̂_a + x̂_p)·r_n − c₂ x̂_a·x̂_p})`
/// (`c₁ = 4 tan²α`, `c₂ = 2 (1 + tan²α)`, rounded to f32 as torch applies them), the mean over
/// the positive pairs; 0 without a positive or a negative pair. The gradient in f64, pair by
/// pair, split by role as [`pair_loss`]'s.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::reference::pair_loss::angular_loss;
/// let x = array![[1.0f32, 0.0], [1.0, 0.0], [0.0, 1.0]];
/// let lists = vec![(vec![1u32], vec![2u32]), (vec![0], vec![2]), (vec![], vec![0, 1])];
/// // Both pairs: x̂_a + x̂_p = (2, 0) is orthogonal to the negative, and x̂_a·x̂_p = 1.
/// let out = angular_loss(x.view(), x.view(), &lists, 40.0);
/// let c2 = 2.0 * (1.0 + 40f64.to_radians().tan().powi(2)) as f32 as f64;
/// assert!((out.loss - (-c2).exp().ln_1p()).abs() < 1e-9);
/// ```
pub fn angular_loss(
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
    lists: &[(Vec<u32>, Vec<u32>)],
    alpha: f32,
) -> ReferencePairLoss {
    let d = queries.ncols();
    let mut out = ReferencePairLoss {
        loss: 0.0,
        nonzero: 0,
        query_grad: Array2::zeros(queries.dim()),
        ref_grad: Array2::zeros(refs.dim()),
        beta_grad: 0.0,
    };
    let pairs: usize = lists.iter().map(|(p, _)| p.len()).sum();
    let negatives: usize = lists.iter().map(|(_, n)| n.len()).sum();
    if pairs == 0 || negatives == 0 {
        return out;
    }
    let sq = f64::from(alpha).to_radians().tan().powi(2);
    let (c1, c2) = (
        f64::from((4.0 * sq) as f32),
        f64::from((2.0 * (1.0 + sq)) as f32),
    );
    let unit = |x: ndarray::ArrayView1<'_, f32>| {
        let x = x.mapv(f64::from);
        let n = x.dot(&x).sqrt();
        (&x / n.max(1e-12), n)
    };
    // Through torch's normalize: (g − x̂ (x̂·g)) / |x|, or g / 1e-12 where clamped.
    let back = |g: &ndarray::Array1<f64>, x_hat: &ndarray::Array1<f64>, n: f64| {
        if n > 1e-12 {
            (g - &(x_hat * x_hat.dot(g))) / n
        } else {
            g / 1e-12
        }
    };
    let k = pairs as f64;
    for (a, (pos, neg)) in lists.iter().enumerate() {
        let (xa, na) = unit(queries.row(a));
        for &p in pos {
            let (xp, np) = unit(refs.row(p as usize));
            let sum = &xa + &xp;
            let dot = xa.dot(&xp);
            let f: Vec<f64> = neg
                .iter()
                .map(|&n| c1 * sum.dot(&refs.row(n as usize).mapv(f64::from)) - c2 * dot)
                .collect();
            out.loss += lse(&f, true) / k;
            out.nonzero += 1;
            if f.is_empty() {
                continue;
            }
            let total = lse(&f, true);
            let (mut ga, mut gp) = (ndarray::Array1::zeros(d), ndarray::Array1::zeros(d));
            for (&n, &fv) in neg.iter().zip(&f) {
                let w = (fv - total).exp() / k;
                let r = refs.row(n as usize).mapv(f64::from);
                ga += &(&r * (c1 * w) - &xp * (c2 * w));
                gp += &(&r * (c1 * w) - &xa * (c2 * w));
                let mut g = out.ref_grad.row_mut(n as usize);
                g += &(&sum * (c1 * w));
            }
            let mut g = out.query_grad.row_mut(a);
            g += &back(&ga, &xa, na);
            let mut g = out.ref_grad.row_mut(p as usize);
            g += &back(&gp, &xp, np);
        }
    }
    out
}

/// PML's `SNRDistance` matrix of `queries` `(b, d)` against `refs` `(m, d)`, written as PML
/// writes it (each row normalised first when `normalize`): `var(q − r) / var(q)` with torch's
/// unbiased variances over the dimensions, in f64.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::reference::pair_loss::snr_distances;
/// let q = array![[1.0, 2.0, 3.0]];
/// let r = array![[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]];
/// let d = snr_distances(q.view(), r.view(), false);
/// assert_eq!((d[[0, 0]], d[[0, 1]]), (0.0, 4.0));
/// ```
pub fn snr_distances(
    queries: ArrayView2<'_, f64>,
    refs: ArrayView2<'_, f64>,
    normalize: bool,
) -> Array2<f64> {
    let prepared = |x: ArrayView2<'_, f64>| {
        let mut x = x.to_owned();
        if normalize {
            for mut row in x.rows_mut() {
                let n = row.dot(&row).sqrt().max(1e-12);
                row /= n;
            }
        }
        x
    };
    let var = |v: ndarray::ArrayView1<'_, f64>| {
        let mean = v.sum() / v.len() as f64;
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (v.len() as f64 - 1.0)
    };
    let (q, r) = (prepared(queries), prepared(refs));
    Array2::from_shape_fn((q.nrows(), r.nrows()), |(i, j)| {
        var((&q.row(i) - &r.row(j)).view()) / var(q.row(i))
    })
}
