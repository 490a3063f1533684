//! PML's `ProxyAnchorLoss` for [`super::classifier`]: a log-sum-exp per class over the batch,
//! so each tile of classes is complete in one pass (no running state across tiles).
//!
//! With `s_ic` the cosine of row `i` and proxy `c`, `P⁺` the classes with a row in the batch,
//! `C` every class:
//! `L = Σ_{c∈P⁺} log(1 + Σ_{y_i = c} e^{−α(s_ic − δ)}) / |P⁺| + Σ_c log(1 + Σ_{y_i ≠ c} e^{α(s_ic + δ)}) / C`,
//! each sum stabilised by its column's maximum (0 included, for the 1). A tile's columns are
//! split over the cores (each column's sums are one core's, in row order: the same bits
//! whatever the cores), then `∂L/∂s` replaces the products, and the tile's two gradient GEMMs
//! and normalisation backward run as in [`super::classifier_pass`].

use ndarray::{s, Array2, ArrayViewMut2, Axis};

use super::classifier_pass::{
    col_part, finish_tile, inverse_norms, normalise_rows, norms_of, own_rows, rescale, with_slice,
    zeros, Inputs, Output,
};
use super::classifier_shards::Shards;
use super::matryoshka_row::exp_bounded;
use crate::error::Result;
use crate::hooks::Hooks;
use crate::runtime::pool::par_mul;

/// The loss's `(margin δ, α)` and its two divisors.
#[derive(Debug, Clone, Copy)]
struct Params {
    delta: f32,
    alpha: f32,
    /// `1 / |P⁺|` and `1 / C`.
    pos_weight: f64,
    neg_weight: f64,
}

/// Runs the loss over tiles of `cols` proxies of the shard `shards` says; `count` in the
/// output is `|P⁺|` (over every shard).
pub(super) fn run(
    inp: &Inputs<'_>,
    (margin, alpha): (f32, f32),
    cols: usize,
    (hooks, shards): (&Hooks, &dyn Shards),
    op: &'static str,
) -> Result<Output> {
    let (b, d) = inp.x.dim();
    let classes = inp.w.ncols();
    let (first, total) = shards.classes(classes);
    // Every shard has every row: `|P⁺|` is the same on each.
    let mut present = vec![false; total];
    for &y in inp.labels {
        present[y] = true;
    }
    let with_pos = present.iter().filter(|&&p| p).count();
    let params = Params {
        delta: margin,
        alpha,
        pos_weight: 1.0 / with_pos.max(1) as f64,
        neg_weight: 1.0 / total as f64,
    };
    let (xhat, mut rows) = normalise_rows(inp);
    let mut tile = Array2::<f32>::zeros((b, cols));
    let mut gx = Array2::<f32>::zeros((b, d));
    let mut weight_grad = zeros("classifier_loss::weight_grad (host)", (classes, d))?;
    let (mut pos_terms, mut neg_terms) = (Vec::with_capacity(classes), Vec::with_capacity(classes));
    for c0 in (0..classes).step_by(cols.max(1)) {
        hooks.check(op)?;
        let c1 = (c0 + cols).min(classes);
        let w = inp.w.slice(s![.., c0..c1]);
        let norms = norms_of(w);
        let scale = inverse_norms(&norms);
        let mut prod = tile.slice_mut(s![.., ..c1 - c0]);
        par_mul(1.0, xhat.view(), w, 0.0, prod.view_mut());
        let per = col_part(b, c1 - c0);
        std::thread::scope(|scope| {
            let parts: Vec<_> = prod
                .axis_chunks_iter_mut(Axis(1), per)
                .zip(scale.chunks(per))
                .enumerate()
                .map(|(t, (part, scale))| {
                    let class0 = first + c0 + t * per;
                    scope.spawn(move || columns(inp.labels, class0, scale, params, part))
                })
                .collect();
            for part in parts {
                match part.join() {
                    Ok((pos, neg)) => {
                        pos_terms.extend(pos);
                        neg_terms.extend(neg);
                    }
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
        });
        par_mul(1.0, prod.view(), w.t(), 1.0, gx.view_mut());
        let mut out = weight_grad.slice_mut(s![c0..c1, ..]).reversed_axes();
        par_mul(1.0, xhat.t(), prod.view(), 0.0, out.view_mut());
        finish_tile(w, (&norms, None), out);
    }
    let gx = own_rows(inp, shards, &mut rows, gx)?;
    let pos: f64 = pos_terms.iter().sum();
    let neg: f64 = neg_terms.iter().sum();
    Ok(Output {
        loss: shards.sum(pos * params.pos_weight + neg * params.neg_weight)?,
        count: with_pos,
        grad: gx,
        weight_grad,
    })
}

/// One core's columns (classes from `class0`) of a tile's products `prod` `(b, m)`: scales
/// them to cosines, returns each class's positive and negative terms, and leaves
/// `∂L/∂s / ‖p‖` in `prod` (what the GEMMs with the raw proxies take).
fn columns(
    labels: &[usize],
    class0: usize,
    scale: &[f32],
    p: Params,
    mut prod: ArrayViewMut2<'_, f32>,
) -> (Vec<f64>, Vec<f64>) {
    let m = prod.ncols();
    let (alpha, delta) = (p.alpha, p.delta);
    let own = |i: usize| labels[i].checked_sub(class0).filter(|&j| j < m);
    // Each column's largest exponent of either sum, 0 included (the 1 inside the log).
    let (mut pos_top, mut neg_top) = (vec![0.0f32; m], vec![0.0f32; m]);
    let mut v = vec![0.0f32; m];
    for (i, row) in prod.rows_mut().into_iter().enumerate() {
        with_slice(row, |c| {
            rescale(c, scale);
            exponents(c, (alpha, delta), &mut v);
            if let Some(j) = own(i) {
                pos_top[j] = pos_top[j].max(-alpha * (c[j] - delta));
                v[j] = f32::NEG_INFINITY;
            }
            for (t, &x) in neg_top.iter_mut().zip(&v) {
                *t = if x > *t { x } else { *t };
            }
        });
    }
    let (mut pos_sum, mut neg_sum) = (vec![0.0f64; m], vec![0.0f64; m]);
    let mut positives = vec![0usize; m];
    let mut e = vec![0.0f32; m];
    for (i, row) in prod.rows().into_iter().enumerate() {
        let owned;
        let c: &[f32] = match row.as_slice() {
            Some(c) => c,
            None => {
                owned = row.to_vec();
                &owned
            }
        };
        exponents(c, (alpha, delta), &mut v);
        for ((e, &x), &t) in e.iter_mut().zip(&v).zip(&neg_top) {
            *e = exp_bounded(x - t);
        }
        if let Some(j) = own(i) {
            e[j] = 0.0;
            positives[j] += 1;
            pos_sum[j] += f64::from(-alpha * (c[j] - delta) - pos_top[j]).exp();
        }
        for (s, &e) in neg_sum.iter_mut().zip(&e) {
            *s += f64::from(e);
        }
    }
    // log(1 + Σ e^x) = top + log(e^{−top} + Σ e^{x − top}); 0 for a class without terms.
    let lse = |top: f32, sum: f64| f64::from(top) + (f64::from(-top).exp() + sum).ln();
    let b = labels.len();
    let pos_lse: Vec<f64> = (0..m).map(|j| lse(pos_top[j], pos_sum[j])).collect();
    let neg_lse: Vec<f64> = (0..m).map(|j| lse(neg_top[j], neg_sum[j])).collect();
    let pos_terms = (0..m)
        .map(|j| if positives[j] > 0 { pos_lse[j] } else { 0.0 })
        .collect();
    let neg_terms = (0..m)
        .map(|j| if positives[j] < b { neg_lse[j] } else { 0.0 })
        .collect();
    // ∂L/∂s: α e^{x − lse} / C off the class, −α e^{x − lse} / |P⁺| on it.
    let neg_k = (p.neg_weight * f64::from(alpha)) as f32;
    let neg_shift: Vec<f32> = neg_lse.iter().map(|&l| l as f32).collect();
    for (i, row) in prod.rows_mut().into_iter().enumerate() {
        with_slice(row, |c| {
            exponents(c, (alpha, delta), &mut v);
            let target = own(i).map(|j| (j, c[j]));
            for (((c, &x), &l), &s) in c.iter_mut().zip(&v).zip(&neg_shift).zip(scale) {
                *c = neg_k * exp_bounded(x - l) * s;
            }
            if let Some((j, cos)) = target {
                let x = f64::from(-alpha * (cos - delta));
                let g = -p.pos_weight * f64::from(alpha) * (x - pos_lse[j]).exp();
                c[j] = (g * f64::from(scale[j])) as f32;
            }
        });
    }
    (pos_terms, neg_terms)
}

/// `α (s + δ)` per column: the negative sums' exponents.
fn exponents(c: &[f32], (alpha, delta): (f32, f32), v: &mut [f32]) {
    for (v, &c) in v.iter_mut().zip(c) {
        *v = alpha * (c + delta);
    }
}
