//! One anchor's row at one Matryoshka width (the losses' `matryoshka` module): the InfoNCE rule (the
//! losses' `info_nce` module) in f32 loops without branches that the compiler vectorises, compiled
//! for the widest vectors the CPU has, with every sum in f64 over eight fixed lanes (so the
//! same bits on every CPU). The exponentials are taken against the logit slope `dz` itself (a
//! cosine is at most 1), which saves a pass for the row's largest logit; past
//! [`SHIFT_BOUND`] they are taken against that largest negative logit instead.

use ndarray::{Array2, ArrayView2};

use super::{sigmoid, TINY};
use crate::data::inputs::Labelled;
use crate::runtime::simd::widest;

/// What every thread's rows read.
pub(super) struct RowInputs<'a, 's> {
    pub(super) set: &'a Labelled<'s>,
    /// The distinct widths, ascending.
    pub(super) ends: &'a [usize],
    /// `(T, b)`: `1 / |q_i|_t`, negative where clamped (then `1 / 1e-12`).
    pub(super) inv_q: ArrayView2<'a, f64>,
    /// `(T, m)`: `1 / |r_j|_t`, and its square where not clamped (else 0).
    pub(super) ir_abs: ArrayView2<'a, f32>,
    pub(super) ir_sq: ArrayView2<'a, f64>,
    pub(super) dz: f64,
    /// `ω_t / count`.
    pub(super) scale: &'a [f64],
}

/// One thread's working rows, kept from block to block.
pub(super) struct RowScratch {
    pub(super) e: Vec<f32>,
    /// The current row's positives' own weights.
    pub(super) own: Vec<f64>,
    /// The current row's running product `P_t` `(m,)`.
    pub(super) prefix: Vec<f32>,
    /// The current row's positives (the same at every width).
    pub(super) positives: Vec<u32>,
    /// `(T, m)` radial sums of the references, over this thread's anchors.
    pub(super) beta: Array2<f64>,
    /// Per truncation, the sum of this thread's anchors' losses.
    pub(super) losses: Vec<f64>,
    /// Per block row and truncation, `α`.
    pub(super) alpha: Vec<f64>,
}

impl RowScratch {
    pub(super) fn new(m: usize, t: usize) -> Self {
        Self {
            e: vec![0.0f32; m],
            own: Vec::new(),
            prefix: vec![0.0f32; m],
            positives: Vec::with_capacity(m),
            beta: Array2::zeros((t, m)),
            losses: vec![0.0; t],
            alpha: Vec::new(),
        }
    }
}

/// Finds anchor `a`'s positives (same label, not its own slot) into `scratch`, once for
/// every width of its row.
pub(super) fn find_positives(sh: &RowInputs<'_, '_>, a: usize, scratch: &mut RowScratch) {
    let set = sh.set;
    let (label, me) = (set.labels[a], set.self_slots[a]);
    let positives = &mut scratch.positives;
    positives.clear();
    // A chunk is looked into only where it holds the label.
    for (c, chunk) in set.ref_labels.chunks(8).enumerate() {
        if chunk.iter().fold(false, |any, &l| any | (l == label)) {
            for (j, &l) in (c * 8..).zip(chunk) {
                if l == label && j as u32 != me {
                    positives.push(j as u32);
                }
            }
        }
    }
}

/// Truncation `t` of anchor `a`, whose positives [`find_positives`] found: from its running
/// product row `scratch.prefix`, writes `V_t`'s row into `out`, adds its references' `β` and
/// its loss to `scratch`, and returns its `α`.
pub(super) fn anchor_row(
    sh: &RowInputs<'_, '_>,
    a: usize,
    t: usize,
    mut out: ndarray::ArrayViewMut1<'_, f32>,
    scratch: &mut RowScratch,
) -> f64 {
    let set = sh.set;
    let inv_a = sh.inv_q[[t, a]];
    let ia = inv_a.abs();
    let scale = sh.scale[t];
    let RowScratch {
        e,
        own,
        prefix,
        positives,
        beta,
        losses,
        ..
    } = scratch;
    let row = Row {
        // A one-wide prefix of an unclamped anchor is ±1 once normalised: its pairs with
        // unclamped references move nothing, exactly (the products would leave f32 rounding
        // of terms of size `|W| / |q|`, module docs of `matryoshka`).
        line: sh.ends[t] == 1 && inv_a > 0.0,
        prefix: prefix.as_slice(),
        labels: &set.ref_labels,
        ir_abs: sh.ir_abs.row(t).to_slice().unwrap_or_default(),
        ir_sq: sh.ir_sq.row(t).to_slice().unwrap_or_default(),
        label: set.labels[a],
        dz: sh.dz,
        ia,
        scale,
    };
    let out = out.as_slice_mut().unwrap_or_default();
    let mut beta = beta.row_mut(t);
    let beta = beta.as_slice_mut().unwrap_or_default();
    let (loss, ws) = dispatch(&row, (out, beta), (e, own), positives);
    losses[t] += loss;
    if inv_a > 0.0 {
        ws * ia * ia
    } else {
        0.0
    }
}

/// One anchor's row at one width, as [`row_kernel`] reads it.
struct Row<'a> {
    /// `P_t`'s row `(m,)`.
    prefix: &'a [f32],
    labels: &'a [u32],
    /// `1 / |r_j|_t` and `1 / |r_j|_t²` (0 where clamped) `(m,)`.
    ir_abs: &'a [f32],
    ir_sq: &'a [f64],
    label: u32,
    dz: f64,
    /// `1 / |q|_t`.
    ia: f64,
    /// `ω_t / count`.
    scale: f64,
    /// The width is 1 and the anchor's prefix not clamped.
    line: bool,
}

widest! {
    /// [`row_kernel`] compiled for the widest vectors this CPU has (the same arithmetic, and so
    /// the same bits, on every one: no reduction's order depends on the vector width).
    fn dispatch(row: &Row<'_>, outs: (&mut [f32], &mut [f64]), work: (&mut [f32], &mut Vec<f64>), positives: &[u32]) -> (f64, f64) {
        row_kernel(row, outs, work, positives)
    }
}

/// The InfoNCE rule on one row (the module docs of the losses' `info_nce`), in f32 loops without
/// branches that the compiler vectorises (sums in f64): `V`'s row into `out`, `β`'s terms
/// added to `beta`; returns the row's loss and `Σ_j ω W s` (the caller's `α` before
/// `1 / |q|²`). `e` `(m,)` and `own` are working rows.
#[inline(always)]
fn row_kernel(
    row: &Row<'_>,
    (out, beta): (&mut [f32], &mut [f64]),
    (e, own): (&mut [f32], &mut Vec<f64>),
    positives: &[u32],
) -> (f64, f64) {
    let (dz, label) = (row.dz, row.label);
    if positives.is_empty() {
        out.fill(0.0);
        return (0.0, 0.0);
    }
    // The logits, and the negatives' `e^{z − top}`: against `dz` (cosines are at most 1, and
    // `e^{−2 dz}` stays above f32's least normal up to `SHIFT_BOUND`), or past it against
    // the largest negative logit. The logits are taken again where needed, not kept.
    let c = (dz * row.ia) as f32;
    let logit = |p: f32, ir: f32| c * p * ir;
    let top = if dz <= SHIFT_BOUND {
        dz as f32
    } else {
        let pairs = row.prefix.iter().zip(row.ir_abs).zip(row.labels);
        let negatives = pairs.filter(|x| *x.1 != label);
        negatives.fold(f32::NEG_INFINITY, |top, ((&p, &ir), _)| {
            top.max(logit(p, ir))
        })
    };
    let ins = row.prefix.iter().zip(row.ir_abs.iter().zip(row.labels));
    for (e, (&p, (&ir, &l))) in e.iter_mut().zip(ins) {
        let k = if l != label { 1.0 } else { 0.0 };
        *e = k * exp_bounded(logit(p, ir) - top);
    }
    let sum = lanes(e);
    if sum == 0.0 {
        // No negative: every positive's probability is 1, and nothing moves.
        out.fill(0.0);
        return (-(1.0 + TINY).ln() * positives.len() as f64, 0.0);
    }
    let log_sum = f64::from(top) + sum.ln();
    let (mut loss, mut on_negatives) = (0.0, 0.0);
    // Each positive's `∂ℓ/∂z_p` (its `e` is 0), added after the negatives'.
    own.clear();
    for &p in positives.iter() {
        let p = p as usize;
        let zp = f64::from(logit(row.prefix[p], row.ir_abs[p]));
        let (x, rest) = (sigmoid(zp - log_sum), sigmoid(log_sum - zp));
        let flat = x / (x + TINY);
        loss -= (x + TINY).ln();
        own.push(-dz * flat * rest);
        on_negatives += flat * rest;
    }
    // A negative's `W = ∂L/∂s = dz · e^{z_n − L} Σ_P flat · rest`; then `V = ω W / (|q| |r|)`
    // into `out`, and `ω W s` (`s = z / dz`) into `β` and `α`'s lanes.
    // In f64: `sum` can be as small as `e^{−2 dz}`, and `k` past f32's range.
    let k = dz * on_negatives / sum;
    let (v_scale, s_scale) = ((row.scale * row.ia) as f32, (row.scale / dz) as f32);
    let line = row.line;
    // `ω W s` replaces each column's `e` (read first), for `α`'s sum.
    let weigh = |w: f32, p: f32, ir: f32, ir2: f64, b: &mut f64, e: &mut f32| {
        let w = if line && ir2 > 0.0 { 0.0 } else { w };
        let z = logit(p, ir) * (w * s_scale);
        *b += f64::from(z) * ir2;
        *e = z;
        v_scale * w * ir
    };
    let outs = out.iter_mut().zip(e.iter_mut()).zip(beta.iter_mut());
    let ins = row.prefix.iter().zip(row.ir_abs.iter().zip(row.ir_sq));
    for (((o, e), b), (&p, (&ir, &ir2))) in outs.zip(ins) {
        *o = weigh((k * f64::from(*e)) as f32, p, ir, ir2, b, e);
    }
    // The positives, weighed as 0 above (their `e`), with their own weights.
    for (&p, &w) in positives.iter().zip(own.iter()) {
        let p = p as usize;
        let (prefix, ir, ir2) = (row.prefix[p], row.ir_abs[p], row.ir_sq[p]);
        out[p] = weigh(w as f32, prefix, ir, ir2, &mut beta[p], &mut e[p]);
    }
    (loss, lanes(e))
}

/// The sum of `x` in f64 over eight interleaved lanes, then across them: an order that
/// does not depend on the vector width, and that the compiler vectorises.
#[inline(always)]
pub(super) fn lanes(x: &[f32]) -> f64 {
    let mut acc = [0.0f64; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f64::from(v);
        }
    }
    for (a, &v) in acc.iter_mut().zip(chunks.remainder()) {
        *a += f64::from(v);
    }
    acc.into_iter().fold(0.0, |a, b| a + b)
}

/// The largest of `x` over 16 lanes (NaNs never win), in a loop the compiler vectorises.
#[inline(always)]
pub(super) fn lanes_max(x: &[f32]) -> f32 {
    let mut top = [f32::NEG_INFINITY; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (t, &v) in top.iter_mut().zip(c) {
            *t = if v > *t { v } else { *t };
        }
    }
    for &v in chunks.remainder() {
        top[0] = if v > top[0] { v } else { top[0] };
    }
    top.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b))
}

/// Up to this logit slope, a row's exponentials are taken against `dz` itself (`e^{−2 dz}`
/// stays above f32's least normal), past it against its largest negative logit (found in a
/// pass of its own).
const SHIFT_BOUND: f64 = 40.0;

/// `e^x` for `x` clamped to `[−87, 1]` (−87: near f32's least normal), in straight-line
/// arithmetic that the compiler vectorises: `2^n · p(r)` with `x = n ln 2 + r`,
/// `|r| ≤ ln 2 / 2`, and `p` the Taylor polynomial to degree 7 (relative error below 3e-7).
#[inline(always)]
pub(super) fn exp_bounded(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2^23: adding it rounds to an integer.
    const LN2_HI: f32 = 0.693_359_4; // ln 2's leading bits, so that `n · LN2_HI` is exact.
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Above: a column the mask zeroes may be far above the shift (a positive past the
    // largest negative, or every column when there is no negative and the shift is −∞).
    let x = x.clamp(-87.0, 1.0);
    let shifted = x * std::f32::consts::LOG2_E + MAGIC;
    let n = shifted - MAGIC;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    // Horner over 1/k!, k = 7 … 0.
    let mut p = 1.0 / 5_040.0;
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = p * r + c;
    }
    // The integer `n` sits in the low bits of `shifted`; `2^n` is its exponent field.
    let bits = (shifted.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let scale = f32::from_bits(((bits + 127) << 23) as u32);
    p * scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_f32_rounding_of_std() {
        let mut worst = 0.0f64;
        for i in 0..200_000 {
            let x = 1.0 - (i as f32) * 88.0 / 200_000.0;
            let (a, b) = (f64::from(exp_bounded(x)), f64::from(x).exp());
            worst = worst.max(((a - b) / b).abs());
        }
        assert!(worst < 3e-7, "relative error {worst}");
        assert!(exp_bounded(-100.0) < 2e-38);
        assert_eq!(exp_bounded(0.0), 1.0);
        // Past the clamp, e¹: never an infinity for the masks' zeros to turn into NaN.
        for x in [88.7f32, 89.0, 200.0, f32::INFINITY] {
            assert!((exp_bounded(x) - std::f32::consts::E).abs() < 1e-6, "{x}");
        }
    }
}
