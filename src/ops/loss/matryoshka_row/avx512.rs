//! The two passes of a row with AVX-512F (sixteen f32 lanes; the f64 sums in one register of
//! eight, the low half of each sixteen added before the high): the same operations in the
//! same order as `exps` and `weigh_row`, and so the same bits.

use std::arch::x86_64::*;

use super::{Weights, EXP_LOW, EXP_POLY, EXP_TOP, LN2_HI, LN2_LO, MAGIC};

/// [`exp_bounded`](super::exp_bounded) on sixteen lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn exp16(x: __m512) -> __m512 {
    let (low, one) = (_mm512_set1_ps(EXP_LOW), _mm512_set1_ps(1.0));
    // Zero below the clamp (a NaN compares false and goes on).
    let kept = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, low);
    // `clamp`: below, then above (a NaN compares false to both and stays).
    let x = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, low), x, low);
    let x = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, one), x, one);
    let magic = _mm512_set1_ps(MAGIC);
    let log2e = _mm512_set1_ps(std::f32::consts::LOG2_E);
    let shifted = _mm512_add_ps(_mm512_mul_ps(x, log2e), magic);
    let n = _mm512_sub_ps(shifted, magic);
    let r = _mm512_sub_ps(
        _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(LN2_HI))),
        _mm512_mul_ps(n, _mm512_set1_ps(LN2_LO)),
    );
    let mut p = _mm512_set1_ps(EXP_TOP);
    for c in EXP_POLY {
        p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(c));
    }
    let bits = _mm512_sub_epi32(
        _mm512_castps_si512(shifted),
        _mm512_set1_epi32(MAGIC.to_bits() as i32),
    );
    let scale = _mm512_slli_epi32::<23>(_mm512_add_epi32(bits, _mm512_set1_epi32(127)));
    _mm512_maskz_mov_ps(kept, _mm512_mul_ps(p, _mm512_castsi512_ps(scale)))
}

/// `exps` over the whole chunks of sixteen; returns their lanes and how
/// many elements they covered.
#[target_feature(enable = "avx512f")]
pub(super) fn exps(
    p: &[f32],
    ir: &[f32],
    labels: &[u32],
    label: u32,
    (c, top): (f32, f32),
    e: &mut [f32],
) -> ([f64; 8], usize) {
    let whole = p.len().min(ir.len()).min(labels.len()).min(e.len()) / 16 * 16;
    let (vc, vtop) = (_mm512_set1_ps(c), _mm512_set1_ps(top));
    let vlabel = _mm512_set1_epi32(label as i32);
    let mut acc = _mm512_setzero_pd();
    for j in (0..whole).step_by(16) {
        // SAFETY: `j + 16 ≤ whole`, within every slice read and written.
        unsafe {
            let pv = _mm512_loadu_ps(p.as_ptr().add(j));
            let irv = _mm512_loadu_ps(ir.as_ptr().add(j));
            let lv = _mm512_loadu_si512(labels.as_ptr().add(j).cast());
            let x = _mm512_sub_ps(_mm512_mul_ps(_mm512_mul_ps(vc, pv), irv), vtop);
            // Zero at the row's own label: `0 · e` (`e` is positive), as the scalar mask's
            // (which would keep a NaN there: the embeddings are checked finite before).
            let other = _mm512_cmpneq_epi32_mask(lv, vlabel);
            let v = _mm512_maskz_mov_ps(other, exp16(x));
            _mm512_storeu_ps(e.as_mut_ptr().add(j), v);
            let (low, high) = halves(v);
            acc = _mm512_add_pd(acc, _mm512_cvtps_pd(low));
            acc = _mm512_add_pd(acc, _mm512_cvtps_pd(high));
        }
    }
    (unpack(acc), whole)
}

/// The low and high eight lanes of `v`.
#[inline]
#[target_feature(enable = "avx512f")]
fn halves(v: __m512) -> (__m256, __m256) {
    let v = _mm512_castps_pd(v);
    (
        _mm256_castpd_ps(_mm512_castpd512_pd256(v)),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(v)),
    )
}

/// The eight lanes of `acc`, to go on with the remainder one element at a time.
#[inline]
#[target_feature(enable = "avx512f")]
fn unpack(acc: __m512d) -> [f64; 8] {
    let mut lanes = [0.0f64; 8];
    // SAFETY: `lanes` holds the eight f64 written.
    unsafe { _mm512_storeu_pd(lanes.as_mut_ptr(), acc) };
    lanes
}

/// `weigh_row` over the whole chunks of sixteen (not for a
/// one-wide width, `weights.line`); returns their lanes and how many elements they
/// covered.
#[target_feature(enable = "avx512f")]
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
    let whole = whole / 16 * 16;
    let k = _mm512_set1_pd(weights.k);
    let (vc, vv, vs) = (
        _mm512_set1_ps(weights.c),
        _mm512_set1_ps(weights.v_scale),
        _mm512_set1_ps(weights.s_scale),
    );
    let mut acc = _mm512_setzero_pd();
    for j in (0..whole).step_by(16) {
        // SAFETY: `j + 16 ≤ whole`, within every slice read and written.
        unsafe {
            let (e_low, e_high) = halves(_mm512_loadu_ps(e.as_ptr().add(j)));
            // `w = (k e) as f32`, in f64.
            let w_low = _mm512_cvtpd_ps(_mm512_mul_pd(k, _mm512_cvtps_pd(e_low)));
            let w_high = _mm512_cvtpd_ps(_mm512_mul_pd(k, _mm512_cvtps_pd(e_high)));
            let w = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                _mm512_castpd256_pd512(_mm256_castps_pd(w_low)),
                _mm256_castps_pd(w_high),
            ));
            let pv = _mm512_loadu_ps(out.as_ptr().add(j));
            let irv = _mm512_loadu_ps(ir.as_ptr().add(j));
            let z = _mm512_mul_ps(
                _mm512_mul_ps(_mm512_mul_ps(vc, pv), irv),
                _mm512_mul_ps(w, vs),
            );
            let (z_low, z_high) = halves(z);
            let (z_low, z_high) = (_mm512_cvtps_pd(z_low), _mm512_cvtps_pd(z_high));
            let b = beta.as_mut_ptr().add(j);
            let s_low = _mm512_loadu_pd(ir2.as_ptr().add(j));
            let s_high = _mm512_loadu_pd(ir2.as_ptr().add(j + 8));
            _mm512_storeu_pd(
                b,
                _mm512_add_pd(_mm512_loadu_pd(b), _mm512_mul_pd(z_low, s_low)),
            );
            _mm512_storeu_pd(
                b.add(8),
                _mm512_add_pd(_mm512_loadu_pd(b.add(8)), _mm512_mul_pd(z_high, s_high)),
            );
            acc = _mm512_add_pd(acc, z_low);
            acc = _mm512_add_pd(acc, z_high);
            let mut v = _mm512_mul_ps(_mm512_mul_ps(vv, w), irv);
            if NEXT {
                v = _mm512_add_ps(v, _mm512_loadu_ps(next.as_ptr().add(j)));
            }
            _mm512_storeu_ps(out.as_mut_ptr().add(j), v);
        }
    }
    (unpack(acc), whole)
}
