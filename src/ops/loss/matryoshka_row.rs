//! One anchor's row at every Matryoshka width (the losses' `matryoshka` module): the InfoNCE
//! rule (the losses' `info_nce` module) in two passes over each width's row, with explicit
//! AVX-512F or AVX2 vectors where the CPU has them ([`avx512`], [`avx2`]) and the same
//! arithmetic one element at a time elsewhere and for the rows' tails. Every sum is in f64
//! over eight fixed lanes, and each vector set does the scalar code's operations in its
//! order (no fused multiply-add), so a row's bits are the same on every CPU; a test holds
//! each set to the scalar passes bit for bit.
//!
//! The passes run in place on the row's slab: widths ascending, `P_t = P_{t−1} + own_t` and
//! the negatives' exponentials (kept for the second pass); widths descending,
//! `C_t = V_t + C_{t+1}` written over `P_t`, with `β`'s terms and `α`'s sum. The
//! exponentials are taken against the logit slope `dz` itself (a cosine is at most 1), which
//! saves a pass for the row's largest logit; past [`SHIFT_BOUND`] they are taken against
//! that largest negative logit instead.
//!
//! Autovectorisation gave up on the fixed-lane f64 sums inside the loops of the
//! exponentials (scalar code, 4× slower), hence the explicit vectors. The rule's cost is
//! then mostly the exponential's polynomial: with AVX-512 the five widths' rows of an MNRL
//! call at B = 4 096 took 0.067–0.074 s where the autovectorised passes took 0.10–0.11 s
//! (BENCHMARKS.md, 2026-12-08).

use ndarray::{Array2, ArrayView2};

use super::{sigmoid, TINY};
use crate::data::inputs::Labelled;
use crate::runtime::simd::widest;
#[cfg(target_arch = "x86_64")]
use crate::runtime::simd::Isa;

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
    /// `(T, m)`: each width's `e^{z − top}` (zero at positives), from the first pass over a
    /// row to the second.
    pub(super) e: Vec<f32>,
    /// Per width: the current row's positives' own weights, and their `P_t` (the second
    /// pass overwrites `P_t` with `C_t`).
    pub(super) own: Vec<Vec<f64>>,
    pub(super) at_positives: Vec<Vec<f32>>,
    /// Per width: the negatives' `∂L/∂s` factor `k` of the current row, `None` where the
    /// row moves nothing at that width.
    pub(super) k: Vec<Option<f64>>,
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
            e: vec![0.0f32; t * m],
            own: vec![Vec::new(); t],
            at_positives: vec![Vec::new(); t],
            k: vec![None; t],
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

/// Every width of anchor `a`, whose positives [`find_positives`] found: `rows` `(T, m)`
/// holds its slices' own products, and leaves with `C_t = Σ_{t' ≥ t} V_{t'}` in row `t`;
/// adds its references' `β` and its losses to `scratch`, and writes each width's `α`
/// (before the suffix sums) into `alpha` `(T,)`.
pub(super) fn anchor_row(
    sh: &RowInputs<'_, '_>,
    a: usize,
    mut rows: ndarray::ArrayViewMut2<'_, f32>,
    scratch: &mut RowScratch,
    alpha: &mut [f64],
) {
    let mut rows: Vec<&mut [f32]> = rows
        .outer_iter_mut()
        .filter_map(|row| row.into_slice())
        .collect();
    debug_assert_eq!(rows.len(), sh.ends.len(), "the slab's rows are contiguous");
    dispatch(sh, a, &mut rows, scratch, alpha);
}

widest! {
    /// [`widths_kernel`] compiled for the widest vectors this CPU has (the same arithmetic,
    /// and so the same bits, on every one: no reduction's order depends on the vector width).
    fn dispatch(sh: &RowInputs<'_, '_>, a: usize, rows: &mut [&mut [f32]], scratch: &mut RowScratch, alpha: &mut [f64]) {
        widths_kernel(sh, a, rows, scratch, alpha)
    }
}

/// The InfoNCE rule (the module docs of the losses' `info_nce`) at every width of one row,
/// in two passes over each width's row ([`avx512`]'s or [`avx2`]'s vectors where the CPU
/// has them, the scalar loops over eight lanes for the rest; sums in f64):
/// - widths ascending: `P_t = P_{t−1} + own_t` in place, the negatives' exponentials and
///   their sum, then each positive's loss and weight;
/// - widths descending: `V_t` (`ω W / (|q| |r|)`) plus `C_{t+1}` over `P_t`, with `β`'s terms
///   and `α`'s sum.
#[inline(always)]
fn widths_kernel(
    sh: &RowInputs<'_, '_>,
    a: usize,
    rows: &mut [&mut [f32]],
    scratch: &mut RowScratch,
    alpha: &mut [f64],
) {
    let (tn, set) = (rows.len(), sh.set);
    let (label, dz) = (set.labels[a], sh.dz);
    let m = set.ref_labels.len();
    let RowScratch {
        e,
        own,
        at_positives,
        k,
        positives,
        beta,
        losses,
        ..
    } = scratch;
    for t in 0..tn {
        if t > 0 {
            let (low, high) = rows.split_at_mut(t);
            let prefix = &low[t - 1];
            high[0]
                .iter_mut()
                .zip(prefix.iter())
                .for_each(|(p, &x)| *p += x);
        }
        k[t] = None;
        if positives.is_empty() {
            continue;
        }
        let p: &[f32] = rows[t];
        let ir = sh.ir_abs.row(t).to_slice().unwrap_or_default();
        let ia = sh.inv_q[[t, a]].abs();
        // The logits, and the negatives' `e^{z − top}`: against `dz` (cosines are at most 1,
        // and `e^{−2 dz}` stays above f32's least normal up to `SHIFT_BOUND`), or past it
        // against the largest negative logit. The logits are taken again where needed.
        let c = (dz * ia) as f32;
        let top = if dz <= SHIFT_BOUND {
            dz as f32
        } else {
            let pairs = p.iter().zip(ir).zip(&set.ref_labels);
            let negatives = pairs.filter(|x| *x.1 != label);
            negatives.fold(f32::NEG_INFINITY, |top, ((&p, &ir), _)| top.max(c * p * ir))
        };
        let e = &mut e[t * m..(t + 1) * m];
        let sum = exps(p, ir, &set.ref_labels, label, (c, top), e);
        if sum == 0.0 {
            // No negative: every positive's probability is 1, and nothing moves.
            losses[t] -= (1.0 + TINY).ln() * positives.len() as f64;
            continue;
        }
        let log_sum = f64::from(top) + sum.ln();
        let (mut loss, mut on_negatives) = (0.0, 0.0);
        // Each positive's `∂ℓ/∂z_p` (its `e` is 0), added after the negatives'.
        let (own, kept) = (&mut own[t], &mut at_positives[t]);
        own.clear();
        kept.clear();
        for &j in positives.iter() {
            let j = j as usize;
            let zp = f64::from(c * p[j] * ir[j]);
            let (x, rest) = (sigmoid(zp - log_sum), sigmoid(log_sum - zp));
            let flat = x / (x + TINY);
            loss -= (x + TINY).ln();
            own.push(-dz * flat * rest);
            kept.push(p[j]);
            on_negatives += flat * rest;
        }
        losses[t] += loss;
        // A negative's `W = ∂L/∂s = dz · e^{z_n − L} Σ_P flat · rest`, `k` times its `e`.
        // In f64: `sum` can be as small as `e^{−2 dz}`, and `k` past f32's range.
        k[t] = Some(dz * on_negatives / sum);
    }
    for t in (0..tn).rev() {
        let inv_a = sh.inv_q[[t, a]];
        let ia = inv_a.abs();
        let (low, high) = rows.split_at_mut(t + 1);
        let (out, next) = (&mut *low[t], high.first().map(|row| &**row));
        let Some(kt) = k[t] else {
            // `V_t = 0`: `C_t` is `C_{t+1}`.
            match next {
                Some(next) => out.copy_from_slice(next),
                None => out.fill(0.0),
            }
            alpha[t] = 0.0;
            continue;
        };
        let scale = sh.scale[t];
        let weights = Weights {
            k: kt,
            c: (dz * ia) as f32,
            v_scale: (scale * ia) as f32,
            s_scale: (scale / dz) as f32,
            // A one-wide prefix of an unclamped anchor is ±1 once normalised: its pairs
            // with unclamped references move nothing, exactly (the products would leave
            // f32 rounding of terms of size `|W| / |q|`, module docs of `matryoshka`).
            line: sh.ends[t] == 1 && inv_a > 0.0,
        };
        let ir = sh.ir_abs.row(t).to_slice().unwrap_or_default();
        let ir2 = sh.ir_sq.row(t).to_slice().unwrap_or_default();
        let mut beta = beta.row_mut(t);
        let beta = beta.as_slice_mut().unwrap_or_default();
        let e = &e[t * m..(t + 1) * m];
        let mut ws = match next {
            Some(next) => weigh_row::<true>(&weights, out, next, (e, ir, ir2), beta),
            None => weigh_row::<false>(&weights, out, &[], (e, ir, ir2), beta),
        };
        // The positives, weighed as 0 above (their `e`), with their own weights and their
        // `P_t` as kept before the pass overwrote it.
        for ((&j, &w), &p) in positives.iter().zip(&own[t]).zip(&at_positives[t]) {
            let j = j as usize;
            let after = next.map_or(0.0, |next| next[j]);
            let (v, z) = weights.one(w as f32, p, ir[j], ir2[j]);
            beta[j] += f64::from(z) * ir2[j];
            ws += f64::from(z);
            out[j] = if next.is_some() { v + after } else { v };
        }
        alpha[t] = if inv_a > 0.0 { ws * ia * ia } else { 0.0 };
    }
}

/// `e_j = e^{c p_j ir_j − top}` where `labels[j] ≠ label` (else 0), and their sum in f64 over
/// eight interleaved lanes ([`lanes`]' order).
#[inline(always)]
fn exps(
    p: &[f32],
    ir: &[f32],
    labels: &[u32],
    label: u32,
    (c, top): (f32, f32),
    e: &mut [f32],
) -> f64 {
    #[cfg(target_arch = "x86_64")]
    let start = match rows_isa() {
        // SAFETY: `rows_isa` says the CPU has AVX-512F.
        Isa::Avx512 => unsafe { avx512::exps(p, ir, labels, label, (c, top), e) },
        // SAFETY: `rows_isa` says the CPU has AVX2.
        Isa::Avx2 => unsafe { avx2::exps(p, ir, labels, label, (c, top), e) },
        Isa::Baseline => ([0.0f64; 8], 0),
    };
    #[cfg(not(target_arch = "x86_64"))]
    let start = ([0.0f64; 8], 0);
    exps_rest(p, ir, labels, label, (c, top), e, start)
}

/// [`exps`] one element at a time from `done`, its lanes `acc` so far.
#[inline(always)]
fn exps_rest(
    p: &[f32],
    ir: &[f32],
    labels: &[u32],
    label: u32,
    (c, top): (f32, f32),
    e: &mut [f32],
    (mut acc, done): ([f64; 8], usize),
) -> f64 {
    let step = |acc: &mut f64, e: &mut f32, p: f32, ir: f32, l: u32| {
        let k = if l != label { 1.0 } else { 0.0 };
        *e = k * exp_bounded(c * p * ir - top);
        *acc += f64::from(*e);
    };
    let (e, p, ir, labels) = (&mut e[done..], &p[done..], &ir[done..], &labels[done..]);
    let (e8, e_rest) = e.as_chunks_mut::<8>();
    let (p8, p_rest) = p.as_chunks::<8>();
    let (i8, i_rest) = ir.as_chunks::<8>();
    let (l8, l_rest) = labels.as_chunks::<8>();
    for (((e, p), ir), l) in e8.iter_mut().zip(p8).zip(i8).zip(l8) {
        for x in 0..8 {
            step(&mut acc[x], &mut e[x], p[x], ir[x], l[x]);
        }
    }
    let rest = e_rest.iter_mut().zip(p_rest).zip(i_rest).zip(l_rest);
    for (acc, (((e, &p), &ir), &l)) in acc.iter_mut().zip(rest) {
        step(acc, e, p, ir, l);
    }
    acc.into_iter().fold(0.0, |a, b| a + b)
}

/// The vectors the rows' passes run ([`avx512`]'s, [`avx2`]'s, or neither): what
/// the CPU has, unless `WML_NATIVE_ISA` caps it below.
#[cfg(target_arch = "x86_64")]
fn rows_isa() -> Isa {
    crate::runtime::simd::isa()
}

/// One width's figures for its second pass.
struct Weights {
    /// The negatives' `W = k e`.
    k: f64,
    /// The logit slope over `|q|`: `z = c p ir`.
    c: f32,
    /// `ω / (count |q|)` and `ω / (count dz)`.
    v_scale: f32,
    s_scale: f32,
    /// The width is 1 and the anchor's prefix not clamped.
    line: bool,
}

impl Weights {
    /// A column's `V = ω W / (|q| |r|)` and `ω W s` from its weight `w = ∂L/∂s`, its `P_t`
    /// and its reference's `1 / |r|` and `1 / |r|²`.
    #[inline(always)]
    fn one(&self, w: f32, p: f32, ir: f32, ir2: f64) -> (f32, f32) {
        let w = if self.line && ir2 > 0.0 { 0.0 } else { w };
        let z = (self.c * p * ir) * (w * self.s_scale);
        (self.v_scale * w * ir, z)
    }
}

/// The second pass over one width's row: `out` holds `P_t` and leaves with `V_t` (plus
/// `next`, `C_{t+1}`, where `NEXT`); `β`'s terms are added to `beta`; returns `Σ_j ω W s`
/// over eight interleaved lanes.
#[inline(always)]
fn weigh_row<const NEXT: bool>(
    weights: &Weights,
    out: &mut [f32],
    next: &[f32],
    (e, ir, ir2): (&[f32], &[f32], &[f64]),
    beta: &mut [f64],
) -> f64 {
    #[cfg(target_arch = "x86_64")]
    let start = match rows_isa() {
        _ if weights.line => ([0.0f64; 8], 0),
        // SAFETY: `rows_isa` says the CPU has AVX-512F.
        Isa::Avx512 => unsafe { avx512::weigh_row::<NEXT>(weights, out, next, (e, ir, ir2), beta) },
        // SAFETY: `rows_isa` says the CPU has AVX2.
        Isa::Avx2 => unsafe { avx2::weigh_row::<NEXT>(weights, out, next, (e, ir, ir2), beta) },
        Isa::Baseline => ([0.0f64; 8], 0),
    };
    #[cfg(not(target_arch = "x86_64"))]
    let start = ([0.0f64; 8], 0);
    weigh_rest::<NEXT>(weights, out, next, (e, ir, ir2), beta, start)
}

/// [`weigh_row`] one element at a time from `done`, its lanes `acc` so far.
#[inline(always)]
fn weigh_rest<const NEXT: bool>(
    weights: &Weights,
    out: &mut [f32],
    next: &[f32],
    (e, ir, ir2): (&[f32], &[f32], &[f64]),
    beta: &mut [f64],
    (mut acc, done): ([f64; 8], usize),
) -> f64 {
    let step = |acc: &mut f64, o: &mut f32, next: f32, e: f32, ir: f32, ir2: f64, b: &mut f64| {
        let w = (weights.k * f64::from(e)) as f32;
        let (v, z) = weights.one(w, *o, ir, ir2);
        *b += f64::from(z) * ir2;
        *acc += f64::from(z);
        *o = if NEXT { v + next } else { v };
    };
    let (out, e, ir, ir2, beta) = (
        &mut out[done..],
        &e[done..],
        &ir[done..],
        &ir2[done..],
        &mut beta[done..],
    );
    let next = next.get(done..).unwrap_or_default();
    let (o8, o_rest) = out.as_chunks_mut::<8>();
    let (e8, e_rest) = e.as_chunks::<8>();
    let (i8, i_rest) = ir.as_chunks::<8>();
    let (s8, s_rest) = ir2.as_chunks::<8>();
    let (b8, b_rest) = beta.as_chunks_mut::<8>();
    let (n8, n_rest) = next.as_chunks::<8>();
    let chunks = o8.iter_mut().zip(e8).zip(i8).zip(s8).zip(b8);
    if NEXT {
        for (((((o, e), ir), ir2), b), next) in chunks.zip(n8) {
            for x in 0..8 {
                step(
                    &mut acc[x],
                    &mut o[x],
                    next[x],
                    e[x],
                    ir[x],
                    ir2[x],
                    &mut b[x],
                );
            }
        }
    } else {
        for ((((o, e), ir), ir2), b) in chunks {
            for x in 0..8 {
                step(&mut acc[x], &mut o[x], 0.0, e[x], ir[x], ir2[x], &mut b[x]);
            }
        }
    }
    let rest = o_rest
        .iter_mut()
        .zip(e_rest)
        .zip(i_rest)
        .zip(s_rest)
        .zip(b_rest);
    for (x, ((((o, &e), &ir), &ir2), b)) in rest.enumerate() {
        let next = n_rest.get(x).copied().unwrap_or(0.0);
        step(&mut acc[x], o, next, e, ir, ir2, b);
    }
    acc.into_iter().fold(0.0, |a, b| a + b)
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

/// `e^x` for `x` clamped to `[−87, 1]` (−87: near f32's least normal), and 0 below −87, in
/// straight-line arithmetic that the compiler vectorises: `2^n · p(r)` with `x = n ln 2 + r`,
/// `|r| ≤ ln 2 / 2`, and `p` the Taylor polynomial to degree 7 (relative error below 3e-7).
///
/// Below −87 it gives 0 rather than `e^{−87}`: a loss's weights are such exponentials times
/// factors below 1, and were then subnormal, which Intel cores compute through microcode
/// assists. With the logits of PML's LargeMarginSoftmax (nearly every one far below its
/// row's log-sum-exp) that made a call 50× slower (77 s against 1.4 s with subnormals
/// flushed, BENCHMARKS.md, 2026-12-08).
#[inline(always)]
pub(super) fn exp_bounded(x: f32) -> f32 {
    let under = x < EXP_LOW;
    // Above: a column the mask zeroes may be far above the shift (a positive past the
    // largest negative, or every column when there is no negative and the shift is −∞).
    let x = x.clamp(EXP_LOW, 1.0);
    let shifted = x * std::f32::consts::LOG2_E + MAGIC;
    let n = shifted - MAGIC;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    // Horner over 1/k!, k = 7 … 0, unfused: the same bits on every CPU without a library
    // call where the code is built without FMA.
    let mut p = EXP_TOP;
    for c in EXP_POLY {
        p = p * r + c;
    }
    // The integer `n` sits in the low bits of `shifted`; `2^n` is its exponent field.
    let bits = (shifted.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let scale = f32::from_bits(((bits + 127) << 23) as u32);
    if under {
        0.0
    } else {
        p * scale
    }
}

/// [`exp_bounded`]'s clamp below (near f32's least normal).
const EXP_LOW: f32 = -87.0;
/// 1.5 · 2^23: adding it rounds to an integer.
const MAGIC: f32 = 12_582_912.0;
/// ln 2's leading bits, so that `n · LN2_HI` is exact, and the rest.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// The Taylor polynomial's coefficients, 1/7! then 1/6! … 1/0!.
const EXP_TOP: f32 = 1.0 / 5_040.0;
const EXP_POLY: [f32; 7] = [
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];

/// The two passes with AVX-512F vectors.
#[cfg(target_arch = "x86_64")]
mod avx512;

/// The two passes with AVX2 vectors.
#[cfg(target_arch = "x86_64")]
mod avx2;

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of `len` with values that reach both ends of the exponential's clamp, a few
    /// columns of the row's own label, and f64 weights of every magnitude.
    /// A row's products, inverse norms, labels, squared inverse norms and `C_{t+1}`.
    type TestRow = (Vec<f32>, Vec<f32>, Vec<u32>, Vec<f64>, Vec<f32>);

    fn row(len: usize, seed: u64) -> TestRow {
        let mut rng = crate::rng::SplitMix64::new(seed, 0);
        let mut unit = || (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        let p = (0..len).map(|_| (unit() - 0.5) * 2.4).collect();
        let ir = (0..len).map(|_| 0.5 + unit()).collect();
        let labels = (0..len).map(|_| u32::from(unit() < 0.2)).collect();
        let ir2 = (0..len)
            .map(|j| if j % 7 == 3 { 0.0 } else { f64::from(unit()) })
            .collect();
        let next = (0..len).map(|_| unit() - 0.5).collect();
        (p, ir, labels, ir2, next)
    }

    /// The vector passes (every set this CPU has, whatever `WML_NATIVE_ISA` says) against
    /// the same passes one element at a time: the same bits, rows off every vector width,
    /// with and without `C_{t+1}`.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_passes_are_the_scalar_ones() {
        use crate::runtime::simd::detected;
        type Exps =
            unsafe fn(&[f32], &[f32], &[u32], u32, (f32, f32), &mut [f32]) -> ([f64; 8], usize);
        type Weigh = unsafe fn(
            &Weights,
            &mut [f32],
            &[f32],
            (&[f32], &[f32], &[f64]),
            &mut [f64],
        ) -> ([f64; 8], usize);
        let mut sets: Vec<(&str, Exps, Weigh, Weigh)> = Vec::new();
        if detected() >= Isa::Avx2 {
            sets.push((
                "avx2",
                avx2::exps,
                avx2::weigh_row::<true>,
                avx2::weigh_row::<false>,
            ));
        }
        if detected() >= Isa::Avx512 {
            sets.push((
                "avx512",
                avx512::exps,
                avx512::weigh_row::<true>,
                avx512::weigh_row::<false>,
            ));
        }
        for len in [0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 100] {
            let (p, ir, labels, ir2, next) = row(len, len as u64);
            for (c, top) in [(3.0f32, 20.0f32), (60.0, 20.0), (-200.0, 1.5)] {
                let mut want_e = vec![0.0; len];
                let sum = exps_rest(&p, &ir, &labels, 1, (c, top), &mut want_e, ([0.0; 8], 0));
                for &(name, exps, weigh_next, weigh_last) in &sets {
                    let mut e = vec![f32::NAN; len];
                    // SAFETY: `detected` says the CPU has the set.
                    let start = unsafe { exps(&p, &ir, &labels, 1, (c, top), &mut e) };
                    let got = exps_rest(&p, &ir, &labels, 1, (c, top), &mut e, start);
                    assert_eq!(got.to_bits(), sum.to_bits(), "{name} sum, len {len}");
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&e), bits(&want_e), "{name} e, len {len}");
                    for k in [0.37, 1e30] {
                        let weights = Weights {
                            k,
                            c,
                            v_scale: 0.3,
                            s_scale: -1.7,
                            line: false,
                        };
                        for (with_next, weigh) in [(true, weigh_next), (false, weigh_last)] {
                            let (mut want_out, mut want_beta) = (p.clone(), ir2.clone());
                            let run =
                                |out: &mut Vec<f32>, beta: &mut Vec<f64>, start| match with_next {
                                    true => weigh_rest::<true>(
                                        &weights,
                                        out,
                                        &next,
                                        (&want_e, &ir, &ir2),
                                        beta,
                                        start,
                                    ),
                                    false => weigh_rest::<false>(
                                        &weights,
                                        out,
                                        &[],
                                        (&want_e, &ir, &ir2),
                                        beta,
                                        start,
                                    ),
                                };
                            let want = run(&mut want_out, &mut want_beta, ([0.0; 8], 0));
                            let (mut out, mut beta) = (p.clone(), ir2.clone());
                            let nexts: &[f32] = if with_next { &next } else { &[] };
                            // SAFETY: `detected` says the CPU has the set.
                            let start = unsafe {
                                weigh(&weights, &mut out, nexts, (&want_e, &ir, &ir2), &mut beta)
                            };
                            let got = run(&mut out, &mut beta, start);
                            let what = format!("{name} k {k} next {with_next} len {len}");
                            assert_eq!(got.to_bits(), want.to_bits(), "{what}: α");
                            assert_eq!(bits(&out), bits(&want_out), "{what}: out");
                            let bits64 =
                                |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                            assert_eq!(bits64(&beta), bits64(&want_beta), "{what}: β");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn exp_is_within_f32_rounding_of_std() {
        let mut worst = 0.0f64;
        for i in 0..200_000 {
            let x = 1.0 - (i as f32) * 88.0 / 200_000.0;
            let (a, b) = (f64::from(exp_bounded(x)), f64::from(x).exp());
            worst = worst.max(((a - b) / b).abs());
        }
        assert!(worst < 3e-7, "relative error {worst}");
        assert_eq!(exp_bounded(-100.0), 0.0, "no subnormal products downstream");
        assert!(exp_bounded(-87.0) > f32::MIN_POSITIVE);
        assert_eq!(exp_bounded(0.0), 1.0);
        // Past the clamp, e¹: never an infinity for the masks' zeros to turn into NaN.
        for x in [88.7f32, 89.0, 200.0, f32::INFINITY] {
            assert!((exp_bounded(x) - std::f32::consts::E).abs() < 1e-6, "{x}");
        }
    }
}
