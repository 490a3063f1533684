//! Softmaxes over a whole row in f32 loops without branches that the compiler vectorises,
//! compiled for the widest vectors the CPU has, with the exponentials of
//! [`super::matryoshka_row`] and their sums in f64 over eight fixed lanes (so the same bits
//! on every CPU): the cross entropy of InstanceLoss (every column a logit), and the
//! softmax of SupCon's and NCA's rules (every column but the anchor's own).

use super::matryoshka_row::{exp_bounded, lanes, lanes_max};
use crate::runtime::simd::widest;

widest! {
    /// The cross entropy of the logits `scale · d` `(m,)` with target column `target`
    /// (`st`): returns the loss and writes `∂loss/∂d` to `weights` (`scale (softmax −
    /// [j = target])`), using `e` `(m,)` as working space.
    pub(super) fn cross_entropy(d: &[f32], st: (f32, usize), weights: &mut [f64], e: &mut [f32]) -> f64 {
        row(d, st, weights, e)
    }
}

#[inline(always)]
fn row(d: &[f32], (scale, target): (f32, usize), weights: &mut [f64], e: &mut [f32]) -> f64 {
    // The largest logit, over 16 lanes.
    let mut top = [f32::NEG_INFINITY; 16];
    let mut chunks = d.chunks_exact(16);
    for c in &mut chunks {
        for (t, &v) in top.iter_mut().zip(c) {
            let z = scale * v;
            *t = if z > *t { z } else { *t };
        }
    }
    for &v in chunks.remainder() {
        let z = scale * v;
        top[0] = if z > top[0] { z } else { top[0] };
    }
    let top = top
        .iter()
        .fold(f32::NEG_INFINITY, |t, &v| if v > t { v } else { t });
    for (e, &v) in e.iter_mut().zip(d) {
        *e = exp_bounded(scale * v - top);
    }
    let sum = lanes(e);
    let k = f64::from(scale) / sum;
    for (w, &e) in weights.iter_mut().zip(e.iter()) {
        *w = k * f64::from(e);
    }
    weights[target] -= f64::from(scale);
    f64::from(top) + sum.ln() - f64::from(scale * d[target])
}

widest! {
    /// The softmax's numerators over the logits `z = dz · d` `(m,)` of every column but
    /// `skip` (`usize::MAX`: none): `e_j = e^{z_j − top}` ([`exp_bounded`]: 0 more than 87
    /// below `top`), 0 at `skip`. Returns `top`, the largest logit of those columns
    /// (`−∞` without any), and `Σ e`.
    pub(super) fn softmax(d: &[f32], dz: f32, skip: usize, e: &mut [f32]) -> (f32, f64) {
        for (e, &v) in e.iter_mut().zip(d) {
            *e = dz * v;
        }
        if let Some(own) = e.get_mut(skip) {
            *own = f32::NEG_INFINITY;
        }
        let top = lanes_max(e);
        if top == f32::NEG_INFINITY {
            e.fill(0.0);
            return (top, 0.0);
        }
        for e in e.iter_mut() {
            *e = exp_bounded(*e - top);
        }
        if let Some(own) = e.get_mut(skip) {
            *own = 0.0;
        }
        (top, lanes(e))
    }
}

widest! {
    /// `w_j = k · e_j` over a row.
    pub(super) fn scaled(e: &[f32], k: f64, w: &mut [f64]) {
        for (w, &e) in w.iter_mut().zip(e) {
            *w = k * f64::from(e);
        }
    }
}
