//! Reference of [`crate::classifier_loss`]: PML's classifier losses as PML writes them, in
//! f64, with the whole `(b, classes)` logit matrix and the gradient by the chain rule, entry by
//! entry.

use ndarray::{Array1, Array2, ArrayView2, Axis};

use crate::{ClassSampling, ClassifierKind, MarginGrad};

/// The reference's loss, the rows in its mean, and both gradients (the weights' in their
/// layout).
#[derive(Debug, Clone)]
pub struct ReferenceClassifierLoss {
    /// The mean loss.
    pub loss: f64,
    /// Rows in the mean.
    pub count: usize,
    /// `∂loss/∂embeddings` `(b, d)`.
    pub grad: Array2<f64>,
    /// `∂loss/∂weights`, in the weights' layout.
    pub weight_grad: Array2<f64>,
}

/// `kind` of `x` `(b, d)`, `labels` and `weights` in PML's layout.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{reference::classifier_loss::classifier_loss, ClassifierKind};
/// let kind = ClassifierKind::NormalizedSoftmax { temperature: 1.0 };
/// let out = classifier_loss(array![[1.0f32, 0.0]].view(), &[0], array![[1.0f32, 0.0], [0.0, 1.0]].view(), &kind);
/// // Logits 1 and 0: −log(e / (e + 1)).
/// assert!((out.loss - (1.0 + (-1.0f64).exp()).ln()).abs() < 1e-12);
/// ```
pub fn classifier_loss(
    x: ArrayView2<'_, f32>,
    labels: &[usize],
    weights: ArrayView2<'_, f32>,
    kind: &ClassifierKind,
) -> ReferenceClassifierLoss {
    let (x, w) = (x.mapv(f64::from), weights.mapv(f64::from));
    classifier_loss_f64(x.view(), labels, w.view(), kind)
}

/// [`classifier_loss`] over PartialFC's sample (`crate::ClassSampling`): the classes with a
/// row in `labels` and those `sampling` draws, their centres selected, the labels renumbered,
/// the weights' gradient 0 on every other class. With no class kept (no rows and none drawn)
/// the loss and its gradients are 0.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{reference::classifier_loss::classifier_loss_sampled, ClassSampling, ClassifierKind};
/// let kind = ClassifierKind::NormalizedSoftmax { temperature: 1.0 };
/// let w = array![[1.0f32, 0.0, 0.5], [0.0, 1.0, 0.5]];
/// let out = classifier_loss_sampled(array![[1.0f32, 0.0]].view(), &[0], w.view(), &kind, &ClassSampling { rate: 1e-9, seed: 0 });
/// // Class 0 alone (nothing drawn at that rate): the loss is 0, no gradient on the others.
/// assert!(out.loss.abs() < 1e-12 && out.weight_grad.column(1).iter().all(|&g| g == 0.0));
/// ```
pub fn classifier_loss_sampled(
    x: ArrayView2<'_, f32>,
    labels: &[usize],
    weights: ArrayView2<'_, f32>,
    kind: &ClassifierKind,
    sampling: &ClassSampling,
) -> ReferenceClassifierLoss {
    let per = kind.centres_per_class();
    let axis = if kind.classes_on_rows() {
        Axis(0)
    } else {
        Axis(1)
    };
    let classes = weights.len_of(axis) / per;
    let kept: Vec<usize> = (0..classes)
        .filter(|&j| labels.contains(&j) || sampling.draws(j as u64))
        .collect();
    let mut weight_grad = Array2::zeros(weights.dim());
    if kept.is_empty() {
        return ReferenceClassifierLoss {
            loss: 0.0,
            count: 0,
            grad: Array2::zeros(x.dim()),
            weight_grad,
        };
    }
    let centres: Vec<usize> = kept.iter().flat_map(|&j| j * per..(j + 1) * per).collect();
    let part = weights.select(axis, &centres);
    let renumbered: Vec<usize> = labels
        .iter()
        .map(|y| kept.iter().position(|j| j == y).unwrap_or(0))
        .collect();
    let out = classifier_loss(x, &renumbered, part.view(), kind);
    for (k, &c) in centres.iter().enumerate() {
        weight_grad
            .index_axis_mut(axis, c)
            .assign(&out.weight_grad.index_axis(axis, k));
    }
    ReferenceClassifierLoss { weight_grad, ..out }
}

/// [`classifier_loss`] of f64 inputs (for finite differences).
pub fn classifier_loss_f64(
    x: ArrayView2<'_, f64>,
    labels: &[usize],
    weights: ArrayView2<'_, f64>,
    kind: &ClassifierKind,
) -> ReferenceClassifierLoss {
    if let ClassifierKind::ProxyAnchor { margin, alpha } = *kind {
        return proxy_anchor(x, labels, weights, (f64::from(margin), f64::from(alpha)));
    }
    let on_rows = matches!(kind, ClassifierKind::ProxyNca { .. });
    let w = if on_rows { weights.t() } else { weights }.to_owned();
    let x = x.to_owned();
    let (b, d) = x.dim();
    let per = match *kind {
        ClassifierKind::SubCenterArcFace { sub_centers, .. } => sub_centers,
        ClassifierKind::SoftTriple {
            centers_per_class, ..
        } => centers_per_class,
        _ => 1,
    };
    let centres = w.ncols();
    let classes = centres / per;
    let xs: Vec<_> = x.rows().into_iter().map(|r| unit(r.to_owned())).collect();
    let ws: Vec<_> = w
        .columns()
        .into_iter()
        .map(|c| unit(c.to_owned()))
        .collect();
    // ∂loss/∂x̂, ∂loss/∂ŵ, and the gradients through the norms.
    let mut gxh = Array2::<f64>::zeros((b, d));
    let mut gwh = Array2::<f64>::zeros((centres, d));
    let mut gxn = vec![0.0; b];
    let mut gwn = vec![0.0; centres];
    let mut losses = Vec::new();
    let mut grads_z = Vec::new();
    for i in 0..b {
        let (xh, xn) = &xs[i];
        let mut z = vec![0.0; classes];
        let mut dz = vec![vec![0.0; per]; classes]; // ∂z_j/∂ĉ_{jk}
        let mut dzn = vec![(0.0, 0.0); classes]; // ∂z_j/∂‖x‖, ∂z_j/∂‖w_j‖
        for (j, zj) in z.iter_mut().enumerate() {
            let cs: Vec<f64> = (0..per).map(|k| xh.dot(&ws[j * per + k].0)).collect();
            let (c, dc) = centres_of(kind, &cs);
            let wn = ws[j * per].1;
            let (v, slope, through) = logit(kind, c, j == labels[i], (*xn, wn));
            *zj = v;
            dz[j] = dc.iter().map(|g| g * slope).collect();
            dzn[j] = through;
        }
        let top = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = top + z.iter().map(|v| (v - top).exp()).sum::<f64>().ln();
        let log_p = z[labels[i]] - lse;
        let kept = !matches!(kind, ClassifierKind::ProxyNca { .. }) || log_p >= -103.278_929_9;
        if kept {
            losses.push(-log_p);
        }
        let p: Vec<f64> = z.iter().map(|v| (v - lse).exp()).collect();
        grads_z.push((kept, p, dz, dzn));
    }
    let count = losses.len();
    for (i, (kept, p, dz, dzn)) in grads_z.into_iter().enumerate() {
        if !kept {
            continue;
        }
        for j in 0..classes {
            let g = (p[j] - f64::from(u8::from(j == labels[i]))) / count as f64;
            for (k, slope) in dz[j].iter().enumerate() {
                let col = j * per + k;
                let gc = g * slope;
                let (xh, wh) = (&xs[i].0, &ws[col].0);
                gxh.row_mut(i).scaled_add(gc, wh);
                gwh.row_mut(col).scaled_add(gc, xh);
            }
            gxn[i] += g * dzn[j].0;
            gwn[j * per] += g * dzn[j].1;
        }
    }
    let mut grad = Array2::zeros((b, d));
    for i in 0..b {
        let g = unit_back(gxh.row(i).to_owned(), &xs[i], gxn[i], x.row(i).to_owned());
        grad.row_mut(i).assign(&g);
    }
    let mut weight_grad = Array2::zeros((centres, d));
    for c in 0..centres {
        let g = unit_back(
            gwh.row(c).to_owned(),
            &ws[c],
            gwn[c],
            w.column(c).to_owned(),
        );
        weight_grad.row_mut(c).assign(&g);
    }
    let weight_grad = if on_rows {
        weight_grad
    } else {
        weight_grad.reversed_axes()
    };
    ReferenceClassifierLoss {
        loss: if count > 0 {
            losses.iter().sum::<f64>() / count as f64
        } else {
            0.0
        },
        count,
        grad,
        weight_grad,
    }
}

/// `v / max(‖v‖, ε)` and `‖v‖`.
fn unit(v: Array1<f64>) -> (Array1<f64>, f64) {
    let n = v.dot(&v).sqrt();
    (&v / n.max(1e-12), n)
}

/// `∂/∂v` from `∂/∂v̂` `gh` (through PML's `F.normalize`) and `∂/∂‖v‖` `gn`.
fn unit_back(
    gh: Array1<f64>,
    (vh, n): &(Array1<f64>, f64),
    gn: f64,
    v: Array1<f64>,
) -> Array1<f64> {
    let along = if *n > 0.0 {
        &v * (gn / n)
    } else {
        Array1::zeros(v.len())
    };
    if *n >= 1e-12 {
        (&gh - &(vh * gh.dot(vh))) / *n + along
    } else {
        gh / 1e-12 + along
    }
}

/// PML's `ProxyAnchorLoss` as PML writes it: per class, `log(1 + Σ e^…)` over its rows and
/// over the others, `(B, C)` at once.
fn proxy_anchor(
    x: ArrayView2<'_, f64>,
    labels: &[usize],
    proxies: ArrayView2<'_, f64>,
    (delta, alpha): (f64, f64),
) -> ReferenceClassifierLoss {
    let (b, d) = x.dim();
    let classes = proxies.nrows();
    let xs: Vec<_> = x.rows().into_iter().map(|r| unit(r.to_owned())).collect();
    let ps: Vec<_> = proxies
        .rows()
        .into_iter()
        .map(|r| unit(r.to_owned()))
        .collect();
    let mut present = vec![false; classes];
    labels.iter().for_each(|&y| present[y] = true);
    let with_pos = present.iter().filter(|&&p| p).count().max(1) as f64;
    let mut gcos = Array2::<f64>::zeros((b, classes));
    let mut loss = 0.0;
    for j in 0..classes {
        for (positive, sign, divisor) in [(true, -1.0, with_pos), (false, 1.0, classes as f64)] {
            let rows: Vec<usize> = (0..b).filter(|&i| (labels[i] == j) == positive).collect();
            if rows.is_empty() {
                continue;
            }
            let v: Vec<f64> = rows
                .iter()
                .map(|&i| sign * alpha * (xs[i].0.dot(&ps[j].0) - sign * -delta))
                .collect();
            let top = v.iter().cloned().fold(0.0, f64::max);
            let lse = top + ((-top).exp() + v.iter().map(|x| (x - top).exp()).sum::<f64>()).ln();
            loss += lse / divisor;
            for (&i, x) in rows.iter().zip(&v) {
                gcos[[i, j]] += sign * alpha * (x - lse).exp() / divisor;
            }
        }
    }
    let mut grad = Array2::zeros((b, d));
    for i in 0..b {
        let gh = (0..classes).fold(Array1::zeros(d), |acc, j| acc + &ps[j].0 * gcos[[i, j]]);
        grad.row_mut(i)
            .assign(&unit_back(gh, &xs[i], 0.0, x.row(i).to_owned()));
    }
    let mut weight_grad = Array2::zeros((classes, d));
    for j in 0..classes {
        let gh = (0..b).fold(Array1::zeros(d), |acc, i| acc + &xs[i].0 * gcos[[i, j]]);
        weight_grad
            .row_mut(j)
            .assign(&unit_back(gh, &ps[j], 0.0, proxies.row(j).to_owned()));
    }
    ReferenceClassifierLoss {
        loss,
        count: present.iter().filter(|&&p| p).count(),
        grad,
        weight_grad,
    }
}

/// A class's cosine from its centres' and `∂c/∂c_k`.
fn centres_of(kind: &ClassifierKind, cs: &[f64]) -> (f64, Vec<f64>) {
    match *kind {
        ClassifierKind::SubCenterArcFace { .. } => {
            let best = (0..cs.len()).fold(0, |b, k| if cs[k] > cs[b] { k } else { b });
            let mut dc = vec![0.0; cs.len()];
            dc[best] = 1.0;
            (cs[best], dc)
        }
        ClassifierKind::SoftTriple { gamma, .. } => {
            let g = 1.0 / f64::from(gamma);
            let e: Vec<f64> = cs.iter().map(|c| (g * c).exp()).collect();
            let sum: f64 = e.iter().sum();
            let p: Vec<f64> = e.iter().map(|v| v / sum).collect();
            let s: f64 = p.iter().zip(cs).map(|(p, c)| p * c).sum();
            let dc = p
                .iter()
                .zip(cs)
                .map(|(p, c)| p * (1.0 + g * (c - s)))
                .collect();
            (s, dc)
        }
        _ => (cs[0], vec![1.0]),
    }
}

/// The logit of cosine `c` (target or not) with norms `(‖x‖, ‖w‖)`: its value, `∂z/∂c` and
/// `(∂z/∂‖x‖, ∂z/∂‖w‖)`.
fn logit(
    kind: &ClassifierKind,
    c: f64,
    target: bool,
    (xn, wn): (f64, f64),
) -> (f64, f64, (f64, f64)) {
    match *kind {
        ClassifierKind::ArcFace {
            margin,
            scale,
            margin_grad,
        }
        | ClassifierKind::SubCenterArcFace {
            margin,
            scale,
            margin_grad,
            ..
        } => {
            let s = f64::from(scale);
            if !target {
                return (s * c, s, (0.0, 0.0));
            }
            let m = f64::from(margin).to_radians();
            let theta = c.clamp(-1.0, 1.0).acos();
            let straight = margin_grad == MarginGrad::StraightThrough;
            if theta as f32 <= (std::f64::consts::PI - m) as f32 {
                let slope = match (straight, c.abs() <= 1.0) {
                    (true, _) => 1.0,
                    (false, true) => (theta + m).sin() / (1.0 - c * c).sqrt().max(3.452_669_6e-4),
                    (false, false) => 0.0,
                };
                (s * (theta + m).cos(), s * slope, (0.0, 0.0))
            } else {
                let slope = if straight || c.abs() <= 1.0 { 1.0 } else { 0.0 };
                (
                    s * (c.clamp(-1.0, 1.0) - m * m.sin()),
                    s * slope,
                    (0.0, 0.0),
                )
            }
        }
        ClassifierKind::CosFace { margin, scale } => {
            let s = f64::from(scale);
            let shift = if target { f64::from(margin) } else { 0.0 };
            (s * (c - shift), s, (0.0, 0.0))
        }
        ClassifierKind::LargeMarginSoftmax { margin, scale }
        | ClassifierKind::SphereFace { margin, scale } => {
            let lms = matches!(kind, ClassifierKind::LargeMarginSoftmax { .. });
            let wn = if lms { wn } else { 1.0 };
            let s = f64::from(scale);
            let (psi, slope) = if target {
                multiple_angle(margin, c)
            } else {
                (c, 1.0)
            };
            let z = s * xn * wn * psi;
            let through_w = if lms { s * xn * psi } else { 0.0 };
            (z, s * xn * wn * slope, (s * wn * psi, through_w))
        }
        ClassifierKind::NormalizedSoftmax { temperature } => {
            let t = f64::from(temperature);
            (c / t, 1.0 / t, (0.0, 0.0))
        }
        ClassifierKind::ProxyNca { softmax_scale } => {
            let s = f64::from(softmax_scale);
            (-s * (2.0 - 2.0 * c), 2.0 * s, (0.0, 0.0))
        }
        // Not a cross entropy: `proxy_anchor` computes it.
        ClassifierKind::ProxyAnchor { .. } => (c, 1.0, (0.0, 0.0)),
        ClassifierKind::SoftTriple { la, margin, .. } => {
            let shift = if target { f64::from(margin) } else { 0.0 };
            (f64::from(la) * (c - shift), f64::from(la), (0.0, 0.0))
        }
    }
}

/// LargeMarginSoftmax's `ψ(c) = (−1)^k cos(mθ) − 2k` and its slope, `cos(mθ)` by its
/// expansion in powers of `c` and `1 − c²` as PML writes it, the slope by differentiating
/// each power.
fn multiple_angle(m: u32, c: f64) -> (f64, f64) {
    let binom =
        |n: u32, k: u32| (0..k).fold(1.0, |acc, i| acc * f64::from(n - i) / f64::from(i + 1));
    let (mut v, mut dv) = (0.0, 0.0);
    for n in 0..=m / 2 {
        let coef = if n % 2 == 0 { 1.0 } else { -1.0 } * binom(m, 2 * n);
        let (p, q) = (f64::from(m - 2 * n), f64::from(n));
        let s = 1.0 - c * c;
        v += coef * c.powf(p) * s.powf(q);
        let d_cp = if p > 0.0 { p * c.powf(p - 1.0) } else { 0.0 };
        let d_s = if q > 0.0 {
            q * s.powf(q - 1.0) * (-2.0 * c)
        } else {
            0.0
        };
        dv += coef * (d_cp * s.powf(q) + c.powf(p) * d_s);
    }
    let theta = c.clamp(-1.0, 1.0).acos() as f32;
    let k = (theta / (std::f32::consts::PI / m as f32)).floor();
    let sign = if k as i64 % 2 == 0 { 1.0 } else { -1.0 };
    (sign * v - 2.0 * f64::from(k), sign * dv)
}
