//! The two passes of a row with AVX2 (eight f32 lanes, the f64 sums in two registers of
//! four): the same operations in the same order as `exps` and
//! `weigh_row`, and so the same bits.

use std::arch::x86_64::*;

use super::{Weights, EXP_LOW, EXP_POLY, EXP_TOP, LN2_HI, LN2_LO, MAGIC};

/// [`exp_bounded`](super::exp_bounded) on eight lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn exp8(x: __m256) -> __m256 {
    let (low, one) = (_mm256_set1_ps(EXP_LOW), _mm256_set1_ps(1.0));
    // Zero below the clamp (a NaN compares false and goes on).
    let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, low);
    // `clamp`: below, then above (a NaN compares false to both and stays).
    let x = _mm256_blendv_ps(x, low, _mm256_cmp_ps::<_CMP_LT_OQ>(x, low));
    let x = _mm256_blendv_ps(x, one, _mm256_cmp_ps::<_CMP_GT_OQ>(x, one));
    let magic = _mm256_set1_ps(MAGIC);
    let shifted = _mm256_add_ps(
        _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        magic,
    );
    let n = _mm256_sub_ps(shifted, magic);
    let r = _mm256_sub_ps(
        _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(LN2_HI))),
        _mm256_mul_ps(n, _mm256_set1_ps(LN2_LO)),
    );
    let mut p = _mm256_set1_ps(EXP_TOP);
    for c in EXP_POLY {
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c));
    }
    let bits = _mm256_sub_epi32(
        _mm256_castps_si256(shifted),
        _mm256_set1_epi32(MAGIC.to_bits() as i32),
    );
    let scale = _mm256_slli_epi32::<23>(_mm256_add_epi32(bits, _mm256_set1_epi32(127)));
    _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(scale)))
}

/// `acc` (eight f64 lanes in two registers) plus `v`'s lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn add_lanes(acc: (__m256d, __m256d), v: __m256) -> (__m256d, __m256d) {
    (
        _mm256_add_pd(acc.0, _mm256_cvtps_pd(_mm256_castps256_ps128(v))),
        _mm256_add_pd(acc.1, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v))),
    )
}

/// The lanes of `acc`, to go on with the remainder one element at a time.
#[inline]
#[target_feature(enable = "avx2")]
fn unpack(acc: (__m256d, __m256d)) -> [f64; 8] {
    let mut out = [0.0f64; 8];
    // SAFETY: `out` holds the eight f64 written, four at a time.
    unsafe {
        _mm256_storeu_pd(out.as_mut_ptr(), acc.0);
        _mm256_storeu_pd(out.as_mut_ptr().add(4), acc.1);
    }
    out
}

/// `exps` over the whole chunks of eight; returns their lanes and how
/// many elements they covered.
#[target_feature(enable = "avx2")]
pub(super) fn exps(
    p: &[f32],
    ir: &[f32],
    labels: &[u32],
    label: u32,
    (c, top): (f32, f32),
    e: &mut [f32],
) -> ([f64; 8], usize) {
    let whole = p.len().min(ir.len()).min(labels.len()).min(e.len()) / 8 * 8;
    let (vc, vtop) = (_mm256_set1_ps(c), _mm256_set1_ps(top));
    let vlabel = _mm256_set1_epi32(label as i32);
    let mut acc = (_mm256_setzero_pd(), _mm256_setzero_pd());
    for j in (0..whole).step_by(8) {
        // SAFETY: `j + 8 ≤ whole`, within every slice read and written.
        unsafe {
            let pv = _mm256_loadu_ps(p.as_ptr().add(j));
            let irv = _mm256_loadu_ps(ir.as_ptr().add(j));
            let lv = _mm256_loadu_si256(labels.as_ptr().add(j).cast());
            let x = _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(vc, pv), irv), vtop);
            // Zero at the row's own label: `0 · e` (`e` is positive), as the scalar mask's
            // (which would keep a NaN there: the embeddings are checked finite before).
            let same = _mm256_castsi256_ps(_mm256_cmpeq_epi32(lv, vlabel));
            let v = _mm256_andnot_ps(same, exp8(x));
            _mm256_storeu_ps(e.as_mut_ptr().add(j), v);
            acc = add_lanes(acc, v);
        }
    }
    (unpack(acc), whole)
}

/// `weigh_row` over the whole chunks of eight (not for a one-wide
/// width, `weights.line`); returns their lanes and how many elements they covered.
#[target_feature(enable = "avx2")]
pub(super) fn weigh_row<const NEXT: bool>(
    weights: &Weights,
    out: &mut [f32],
    next: &[f32],
    (e, ir, ir2): (&[f32], &[f32], &[f64]),
    beta: &mut [f64],
) -> ([f64; 8], usize) {
    debug_assert!(!weights.line);
    let mut whole = out
        .len()
        .min(e.len())
        .min(ir.len())
        .min(ir2.len())
        .min(beta.len());
    if NEXT {
        whole = whole.min(next.len());
    }
    let whole = whole / 8 * 8;
    let k = _mm256_set1_pd(weights.k);
    let (vc, vv, vs) = (
        _mm256_set1_ps(weights.c),
        _mm256_set1_ps(weights.v_scale),
        _mm256_set1_ps(weights.s_scale),
    );
    let mut acc = (_mm256_setzero_pd(), _mm256_setzero_pd());
    for j in (0..whole).step_by(8) {
        // SAFETY: `j + 8 ≤ whole`, within every slice read and written.
        unsafe {
            let ev = _mm256_loadu_ps(e.as_ptr().add(j));
            // `w = (k e) as f32`, in f64.
            let w_low = _mm256_cvtpd_ps(_mm256_mul_pd(
                k,
                _mm256_cvtps_pd(_mm256_castps256_ps128(ev)),
            ));
            let w_high = _mm256_cvtpd_ps(_mm256_mul_pd(
                k,
                _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(ev)),
            ));
            let w = _mm256_set_m128(w_high, w_low);
            let pv = _mm256_loadu_ps(out.as_ptr().add(j));
            let irv = _mm256_loadu_ps(ir.as_ptr().add(j));
            let z = _mm256_mul_ps(
                _mm256_mul_ps(_mm256_mul_ps(vc, pv), irv),
                _mm256_mul_ps(w, vs),
            );
            let z_low = _mm256_cvtps_pd(_mm256_castps256_ps128(z));
            let z_high = _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(z));
            let b = beta.as_mut_ptr().add(j);
            let (s_low, s_high) = (
                _mm256_loadu_pd(ir2.as_ptr().add(j)),
                _mm256_loadu_pd(ir2.as_ptr().add(j + 4)),
            );
            _mm256_storeu_pd(
                b,
                _mm256_add_pd(_mm256_loadu_pd(b), _mm256_mul_pd(z_low, s_low)),
            );
            _mm256_storeu_pd(
                b.add(4),
                _mm256_add_pd(_mm256_loadu_pd(b.add(4)), _mm256_mul_pd(z_high, s_high)),
            );
            acc = (_mm256_add_pd(acc.0, z_low), _mm256_add_pd(acc.1, z_high));
            let mut v = _mm256_mul_ps(_mm256_mul_ps(vv, w), irv);
            if NEXT {
                v = _mm256_add_ps(v, _mm256_loadu_ps(next.as_ptr().add(j)));
            }
            _mm256_storeu_ps(out.as_mut_ptr().add(j), v);
        }
    }
    (unpack(acc), whole)
}
