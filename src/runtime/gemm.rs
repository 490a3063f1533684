//! The native paths' GEMM, `c = alpha · a b + beta · c` in f32: both operands packed into
//! the register tiles' layouts and multiplied by register-blocked micro-kernels (Goto's loop
//! nest), in place of matrixmultiply under the losses' products.
//!
//! The loop nest, outermost first: slices of [`KC`] of the inner dimension; blocks of
//! [`MC`] rows of `a`, packed by strips of `R` rows (`[strip][t][r]`); blocks of [`NC`]
//! columns of `b`, packed by panels of `W` (`[panel][t][j]`, 256 KiB, which stays in a core's
//! L2 while the strips stream through); then each strip (in L1) against every panel, an
//! `R × W` tile of sums in registers ([`dot_chain`]): `12 × 32` with AVX-512's 32 vector
//! registers, `6 × 16` with AVX2's 16, `6 × 8` on the baseline and `6 × 16` with NEON. This is
//! the kNN kernel's tile (`ops::knn::native_fused`). Rows of an operand that are contiguous
//! in memory are transposed 8 × 8 in AVX registers as they are packed. It runs at
//! matrixmultiply's speed (BENCHMARKS.md, 2026-12-07); what it adds is a kernel the library
//! controls: `WML_NATIVE_ISA` caps it, and [`gemm_slices`] packs each operand once for many
//! slices of the inner dimension.
//!
//! **The bits.** Each product is one chain of multiply-adds per [`KC`] of the inner
//! dimension, in order, and the chains are added to `c` in order: `alpha · acc + beta · c`
//! for the first (`alpha · acc` where `beta` is zero, `c` unread), `alpha · acc + c` for the
//! others. The multiply-adds are fused where the CPU has AVX2 and FMA (and on AArch64),
//! under every `WML_NATIVE_ISA` cap, and the last step never is, so a product's bits depend
//! neither on the instruction set, nor on the tile it falls in, nor on how a caller splits
//! `c` over threads. matrixmultiply sums the same chains but fuses that last step in its
//! whole tiles (not its edge ones): the two give the same bits wherever `alpha · acc` is
//! exact (`alpha` ±1: every product of the library but Angular's and VICReg's scaled ones).
//!
//! **Memory.** One call holds at most `4 · KC · (MC + NC)` bytes of packing (1.25 MiB) on
//! its thread while it runs, as matrixmultiply held its own.

use std::ops::Range;

use ndarray::{s, ArrayView1, ArrayView2, ArrayViewMut2, ArrayViewMut3, Axis};

/// The inner dimension in slices of this many, each one chain of multiply-adds: long chains
/// keep the packed strips and panels in cache, and 256 is matrixmultiply's.
pub(crate) const KC: usize = 256;
/// Columns of `b` packed at a time: `KC · NC` floats are 256 KiB, L2-resident on x86-64 and
/// Arm cores of the last decade. A multiple of every kernel's `W`.
const NC: usize = 256;
/// Rows of `a` packed at a time: a multiple of every kernel's `R`, long enough that each
/// packed panel of `b` serves many strips, 1 MiB of packing at most.
const MC: usize = 1008;

/// `c = alpha · a b + beta · c` for `a` `(m, k)`, `b` `(k, n)` and `c` `(m, n)`, any strides,
/// on the calling thread, with the widest kernel this CPU runs (module docs); where `beta` is
/// zero, `c` is not read (NaNs there do not carry).
///
/// # Panics
/// On shapes that do not chain, as ndarray's `general_mat_mul` does: a caller's bug.
pub(crate) fn gemm(
    alpha: f32,
    a: ArrayView2<'_, f32>,
    b: ArrayView2<'_, f32>,
    beta: f32,
    c: ArrayViewMut2<'_, f32>,
) {
    gemm_with(dispatch, alpha, (a, b), beta, c);
}

/// The kernels' signature: `alpha` times `segments` of `a b` into `outs`.
type Kernel =
    fn(f32, (ArrayView2<'_, f32>, ArrayView2<'_, f32>), &[Segment], &mut [ArrayViewMut2<'_, f32>]);

/// [`gemm`] with the given kernel.
fn gemm_with(
    kernel: Kernel,
    alpha: f32,
    (a, b): (ArrayView2<'_, f32>, ArrayView2<'_, f32>),
    beta: f32,
    mut c: ArrayViewMut2<'_, f32>,
) {
    assert!(
        a.ncols() == b.nrows() && c.dim() == (a.nrows(), b.ncols()),
        "gemm: ({:?}) · ({:?}) into ({:?})",
        a.dim(),
        b.dim(),
        c.dim()
    );
    let k = a.ncols();
    if k == 0 {
        c.map_inplace(|x| *x = if beta == 0.0 { 0.0 } else { beta * *x });
        return;
    }
    let segments: Vec<Segment> = (0..k)
        .step_by(KC)
        .map(|p0| Segment {
            range: p0..(p0 + KC).min(k),
            out: 0,
            // The first slice scales `c` by `beta`, the others add to it.
            beta: if p0 == 0 { beta } else { 1.0 },
        })
        .collect();
    kernel(alpha, (a, b), &segments, &mut [c]);
}

/// `c[t] = a[:, e_{t−1}..e_t] · b[e_{t−1}..e_t, :]` for the slices between `ends` (ascending,
/// from `e_{−1} = 0`; the last at most `k`), `a` `(m, k)`, `b` `(k, n)`, `c` `(ends, m, n)`:
/// each slice's product as [`gemm`] gives it (`alpha` 1, `beta` 0), every operand packed
/// once for all slices, where one [`gemm`] per slice packs both operands again for each.
///
/// # Panics
/// On shapes that do not chain or ends not ascending within `k`: a caller's bug.
pub(crate) fn gemm_slices(
    a: ArrayView2<'_, f32>,
    b: ArrayView2<'_, f32>,
    ends: &[usize],
    mut c: ArrayViewMut3<'_, f32>,
) {
    let k = a.ncols();
    assert!(
        b.nrows() == k
            && c.dim() == (ends.len(), a.nrows(), b.ncols())
            && ends.windows(2).all(|e| e[0] < e[1])
            && ends.last().is_none_or(|&e| e <= k),
        "gemm_slices: ({:?}) · ({:?}) at {ends:?} into ({:?})",
        a.dim(),
        b.dim(),
        c.dim()
    );
    let mut segments = Vec::new();
    let mut start = 0;
    for (t, &end) in ends.iter().enumerate() {
        // Each slice in chains of [`KC`] from its own start, as one GEMM on it sums.
        for p0 in (start..end).step_by(KC) {
            segments.push(Segment {
                range: p0..(p0 + KC).min(end),
                out: t,
                beta: if p0 == start { 0.0 } else { 1.0 },
            });
        }
        if start == end {
            c.index_axis_mut(Axis(0), t).fill(0.0);
        }
        start = end;
    }
    let mut outs: Vec<ArrayViewMut2<'_, f32>> = c.outer_iter_mut().collect();
    dispatch(1.0, (a, b), &segments, &mut outs);
}

/// One chain of multiply-adds over the inner dimension's `range`, added into output `out` as
/// `alpha · acc + beta · c` (`alpha · acc` where `beta` is zero).
struct Segment {
    range: Range<usize>,
    out: usize,
    beta: f32,
}

/// The widest kernel this CPU runs, on `segments` of `a b` into `outs`.
fn dispatch(
    alpha: f32,
    ab: (ArrayView2<'_, f32>, ArrayView2<'_, f32>),
    segments: &[Segment],
    outs: &mut [ArrayViewMut2<'_, f32>],
) {
    #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
    {
        use super::simd::{detected, isa, Isa};
        match isa() {
            // SAFETY: `isa` names AVX-512F + FMA only where the CPU (and the OS, which std's
            // detection checks) supports them.
            Isa::Avx512 => unsafe { gemm_avx512(alpha, ab, segments, outs) },
            // SAFETY: as above, AVX2 + FMA.
            Isa::Avx2 => unsafe { gemm_avx2(alpha, ab, segments, outs) },
            // Capped below a CPU with FMA (`WML_NATIVE_ISA`): the baseline tile, with fused
            // multiply-adds so that the bits stay those of the wider kernels.
            // SAFETY: `detected` says the CPU has AVX2 and FMA.
            Isa::Baseline if detected() >= Isa::Avx2 => unsafe {
                gemm_fma(alpha, ab, segments, outs)
            },
            Isa::Baseline => blocked::<6, 8, false>(alpha, ab, segments, outs),
        }
    }
    // NEON and its fused multiply-add are part of the AArch64 baseline.
    #[cfg(target_arch = "aarch64")]
    blocked::<6, 16, true>(alpha, ab, segments, outs);
    #[cfg(not(any(target_arch = "x86_64", target_arch = "x86", target_arch = "aarch64")))]
    blocked::<6, 8, false>(alpha, ab, segments, outs);
}

macro_rules! kernel {
    ($name:ident, $features:literal, $r:literal, $w:literal) => {
        #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
        #[target_feature(enable = $features)]
        fn $name(
            alpha: f32,
            ab: (ArrayView2<'_, f32>, ArrayView2<'_, f32>),
            segments: &[Segment],
            outs: &mut [ArrayViewMut2<'_, f32>],
        ) {
            blocked::<$r, $w, true>(alpha, ab, segments, outs)
        }
    };
}
kernel!(gemm_avx512, "avx512f,fma", 12, 32);
kernel!(gemm_avx2, "avx2,fma", 6, 16);
kernel!(gemm_fma, "fma", 6, 8);

/// The loop nest (module docs) over `segments` of the inner dimension, with tiles of `R` rows
/// × `W` columns, each multiply-add fused where `FMA`.
#[inline(always)]
fn blocked<const R: usize, const W: usize, const FMA: bool>(
    alpha: f32,
    (a, b): (ArrayView2<'_, f32>, ArrayView2<'_, f32>),
    segments: &[Segment],
    outs: &mut [ArrayViewMut2<'_, f32>],
) {
    let (m, n) = (a.nrows(), b.ncols());
    let longest = segments.iter().map(|s| s.range.len()).max().unwrap_or(0);
    if m == 0 || n == 0 || longest == 0 {
        return;
    }
    let mut a_pack = vec![0.0f32; m.next_multiple_of(R).min(MC) * longest];
    let mut b_pack = vec![0.0f32; n.next_multiple_of(W).min(NC) * longest];
    for seg in segments {
        let (p, kc) = (seg.range.clone(), seg.range.len());
        let Some(c) = outs.get_mut(seg.out) else {
            continue;
        };
        for i0 in (0..m).step_by(MC) {
            let rows = MC.min(m - i0);
            let strips = &mut a_pack[..rows.div_ceil(R) * R * kc];
            pack::<R>(a.slice(s![i0..i0 + rows, p.clone()]), strips);
            for j0 in (0..n).step_by(NC) {
                let cols = NC.min(n - j0);
                let panels = &mut b_pack[..cols.div_ceil(W) * W * kc];
                pack::<W>(b.slice(s![p.clone(), j0..j0 + cols]).t(), panels);
                for (si, strip) in a_pack[..rows.div_ceil(R) * R * kc]
                    .chunks_exact(R * kc)
                    .enumerate()
                {
                    let (strip, _) = strip.as_chunks::<R>();
                    let r0 = i0 + si * R;
                    for (pi, panel) in b_pack[..cols.div_ceil(W) * W * kc]
                        .chunks_exact(W * kc)
                        .enumerate()
                    {
                        let (panel, _) = panel.as_chunks::<W>();
                        let acc = dot_chain::<R, W, FMA>(panel, strip);
                        let q0 = j0 + pi * W;
                        let tile = c.slice_mut(s![r0..(r0 + R).min(m), q0..(q0 + W).min(n)]);
                        store(&acc, tile, alpha, seg.beta);
                    }
                }
            }
        }
    }
}

/// `tile = alpha · acc + beta · tile` over the tile's rows and columns (`alpha · acc` where
/// `beta` is zero); contiguous rows (the usual case) as slices, so that the loops vectorise.
#[inline(always)]
fn store<const R: usize, const W: usize>(
    acc: &[[f32; W]; R],
    mut tile: ArrayViewMut2<'_, f32>,
    alpha: f32,
    beta: f32,
) {
    for (acc, mut row) in acc.iter().zip(tile.rows_mut()) {
        match row.as_slice_mut() {
            Some(slice) => update(slice.iter_mut(), acc, alpha, beta),
            None => update(row.iter_mut(), acc, alpha, beta),
        }
    }
}

/// `c = alpha · x + beta · c` along a row (`alpha · x` where `beta` is zero).
#[inline(always)]
fn update<'c>(row: impl Iterator<Item = &'c mut f32>, acc: &[f32], alpha: f32, beta: f32) {
    if beta == 0.0 {
        for (c, &x) in row.zip(acc) {
            *c = alpha * x;
        }
    } else {
        for (c, &x) in row.zip(acc) {
            *c = alpha * x + beta * *c;
        }
    }
}

/// Copies `from` into `to` (as many as both have), as slices where `from` is contiguous.
#[inline(always)]
fn copy<'t>(to: impl Iterator<Item = &'t mut f32>, from: ArrayView1<'_, f32>) {
    match from.as_slice() {
        Some(from) => to.zip(from).for_each(|(t, &x)| *t = x),
        None => to.zip(from).for_each(|(t, &x)| *t = x),
    }
}

/// Packs `v` `(lanes, kc)` by groups of `L` lanes: `out[(g·kc + t)·L + l]` is `v[g·L + l, t]`,
/// zero past the last lane. Reads along whichever axis of `v` is contiguous.
#[inline(always)]
fn pack<const L: usize>(v: ArrayView2<'_, f32>, out: &mut [f32]) {
    let (lanes, kc) = v.dim();
    for (g, group) in out.chunks_exact_mut(L * kc).enumerate() {
        let (group, _) = group.as_chunks_mut::<L>();
        let part = v.slice(s![g * L..(g * L + L).min(lanes), ..]);
        let count = part.nrows();
        if count < L {
            group.iter_mut().for_each(|t| t[count..].fill(0.0));
        }
        if part.strides()[0] == 1 && count > 1 {
            // Lanes contiguous (a row-major `b`, seen transposed): a copy per `t`.
            for (t, column) in group.iter_mut().zip(part.columns()) {
                copy(t.iter_mut(), column);
            }
        } else if !transposed(part, group) {
            for (l, row) in part.rows().into_iter().enumerate() {
                copy(group.iter_mut().filter_map(|t| t.get_mut(l)), row);
            }
        }
    }
}

/// Packs `part` `(count ≤ L, kc)`, whose rows are contiguous, into `group[t][l]`, lanes past
/// `count` zero: by 8 × 8 blocks transposed in AVX registers where the CPU has AVX (one
/// element at a time, this took a fifth of a GEMM whose operands both need it), else one
/// element at a time. `false`, with nothing written, where a row is not contiguous.
#[inline(always)]
fn transposed<const L: usize>(part: ArrayView2<'_, f32>, group: &mut [[f32; L]]) -> bool {
    let mut rows: [&[f32]; L] = [&[]; L];
    for (slot, row) in rows.iter_mut().zip(part.rows()) {
        match row.to_slice() {
            Some(row) => *slot = row,
            None => return false,
        }
    }
    #[cfg(target_arch = "x86_64")]
    if L.is_multiple_of(4) && std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has AVX, checked on the line above.
        unsafe { avx::transpose(&rows, group) };
        return true;
    }
    for (t, lanes) in group.iter_mut().enumerate() {
        for (lane, row) in lanes.iter_mut().zip(&rows) {
            *lane = row.get(t).copied().unwrap_or(0.0);
        }
    }
    true
}

#[cfg(target_arch = "x86_64")]
mod avx {
    use std::arch::x86_64::{
        __m256, _mm256_castps256_ps128, _mm256_loadu_ps, _mm256_permute2f128_ps, _mm256_setzero_ps,
        _mm256_shuffle_ps, _mm256_storeu_ps, _mm256_unpackhi_ps, _mm256_unpacklo_ps, _mm_storeu_ps,
    };

    /// `group[t][l] = rows[l][t]` (zero where `rows[l]` is shorter, as an absent lane's
    /// empty row is), `L` a multiple of 4: 8 × 8 blocks through registers, the components
    /// past the last whole block one at a time.
    #[target_feature(enable = "avx")]
    pub(super) fn transpose<const L: usize>(rows: &[&[f32]; L], group: &mut [[f32; L]]) {
        let blocks = group.len() / 8;
        for l0 in (0..L).step_by(8) {
            let lanes = (L - l0).min(8);
            for b in 0..blocks {
                let t0 = b * 8;
                let rows = rows.get(l0..).unwrap_or_default();
                let columns = transpose8([
                    load8(rows, 0, t0),
                    load8(rows, 1, t0),
                    load8(rows, 2, t0),
                    load8(rows, 3, t0),
                    load8(rows, 4, t0),
                    load8(rows, 5, t0),
                    load8(rows, 6, t0),
                    load8(rows, 7, t0),
                ]);
                for (t, column) in columns.into_iter().enumerate() {
                    let to = &mut group[t0 + t][l0..l0 + lanes];
                    match to.len() {
                        // SAFETY: `to` holds the 8 floats written.
                        8 => unsafe { _mm256_storeu_ps(to.as_mut_ptr(), column) },
                        // SAFETY: `to` holds the 4 floats written (`L` is a multiple of 4).
                        _ => unsafe {
                            _mm_storeu_ps(to.as_mut_ptr(), _mm256_castps256_ps128(column))
                        },
                    }
                }
            }
        }
        for (t, lanes) in group.iter_mut().enumerate().skip(blocks * 8) {
            for (lane, row) in lanes.iter_mut().zip(rows) {
                *lane = row.get(t).copied().unwrap_or(0.0);
            }
        }
    }

    /// `rows[l][t0..t0 + 8]`, or zeros where `rows` has no such row or it is shorter.
    #[inline]
    #[target_feature(enable = "avx")]
    fn load8(rows: &[&[f32]], l: usize, t0: usize) -> __m256 {
        match rows.get(l).and_then(|row| row.get(t0..t0 + 8)) {
            // SAFETY: `from` holds the 8 floats read.
            Some(from) => unsafe { _mm256_loadu_ps(from.as_ptr()) },
            None => _mm256_setzero_ps(),
        }
    }

    /// The columns of the 8 × 8 block whose rows are `r`: pairs of rows interleaved, then
    /// pairs of pairs, then the 128-bit halves exchanged.
    #[inline]
    #[target_feature(enable = "avx")]
    fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(s0, s4),
            _mm256_permute2f128_ps::<0x20>(s1, s5),
            _mm256_permute2f128_ps::<0x20>(s2, s6),
            _mm256_permute2f128_ps::<0x20>(s3, s7),
            _mm256_permute2f128_ps::<0x31>(s0, s4),
            _mm256_permute2f128_ps::<0x31>(s1, s5),
            _mm256_permute2f128_ps::<0x31>(s2, s6),
            _mm256_permute2f128_ps::<0x31>(s3, s7),
        ]
    }
}

/// The `R × W` sums of a strip's rows (`strip[t][r]`: component `t` of row `r`) and a packed
/// panel (`panel[t][j]`: component `t` of column `j`), over as many components as both
/// have: one chain of multiply-adds per sum in component order, each fused where `FMA`. The
/// accumulators, the two panel vectors and a broadcast fill the vector registers.
#[inline(always)]
pub(crate) fn dot_chain<const R: usize, const W: usize, const FMA: bool>(
    panel: &[[f32; W]],
    strip: &[[f32; R]],
) -> [[f32; W]; R] {
    let mut acc = [[0.0f32; W]; R];
    for (b, a) in panel.iter().zip(strip) {
        // Copies, so that the compiler keeps them (and `acc`) in vector registers.
        let (a, b) = (*a, *b);
        for r in 0..R {
            for j in 0..W {
                acc[r][j] = match FMA {
                    true => a[r].mul_add(b[j], acc[r][j]),
                    false => a[r] * b[j] + acc[r][j],
                };
            }
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array2, ArrayView2, ArrayViewMut2};
    use proptest::prelude::*;

    /// What [`gemm`] computes, element by element: each product's chains of [`KC`] in f32,
    /// fused where `fma`, added to `c` in order.
    fn chained(
        (alpha, beta, fma): (f32, f32, bool),
        a: ArrayView2<'_, f32>,
        b: ArrayView2<'_, f32>,
        c: ArrayView2<'_, f32>,
    ) -> Array2<f32> {
        let k = a.ncols();
        Array2::from_shape_fn(c.dim(), |(i, j)| {
            let mut out = if beta == 0.0 { 0.0 } else { beta * c[[i, j]] };
            for p0 in (0..k).step_by(KC) {
                let mut acc = 0.0f32;
                for t in p0..(p0 + KC).min(k) {
                    acc = match fma {
                        true => a[[i, t]].mul_add(b[[t, j]], acc),
                        false => a[[i, t]] * b[[t, j]] + acc,
                    };
                }
                out = match (p0, beta == 0.0) {
                    (0, true) => alpha * acc,
                    (0, false) => alpha * acc + beta * c[[i, j]],
                    _ => alpha * acc + out,
                };
            }
            out
        })
    }

    /// Values with every bit of the mantissa in use, in `[-4, 4)`: a sum in another order, a
    /// chain split elsewhere or a multiply-add fused where it should not be changes the bits.
    fn values(rows: usize, cols: usize, seed: u64) -> Array2<f32> {
        Array2::from_shape_fn((rows, cols), |(i, j)| {
            let h = (i as u64)
                .wrapping_mul(0x9E37_79B9)
                .wrapping_add((j as u64).wrapping_mul(0x85EB_CA6B))
                .wrapping_add(seed.wrapping_mul(0xC2B2_AE35))
                .wrapping_mul(0x2545_F491_4F6C_DD1D);
            (h >> 41) as f32 / (1u32 << 20) as f32 - 4.0
        })
    }

    /// An owned array laid out so that its view ([`view`]) of shape `(rows, cols)` is
    /// row-major (0), transposed (1), every other row of a taller array (2) or with its rows
    /// reversed (3).
    fn laid_out(rows: usize, cols: usize, layout: u8, seed: u64) -> Array2<f32> {
        match layout {
            1 => values(cols, rows, seed),
            2 => values(2 * rows, cols, seed),
            _ => values(rows, cols, seed),
        }
    }

    fn view(own: &Array2<f32>, layout: u8) -> ArrayView2<'_, f32> {
        match layout {
            1 => own.t(),
            2 => own.slice(s![..;2, ..]),
            3 => own.slice(s![..;-1, ..]),
            _ => own.view(),
        }
    }

    fn view_mut(own: &mut Array2<f32>, layout: u8) -> ArrayViewMut2<'_, f32> {
        match layout {
            1 => own.view_mut().reversed_axes(),
            2 => own.slice_mut(s![..;2, ..]),
            3 => own.slice_mut(s![..;-1, ..]),
            _ => own.view_mut(),
        }
    }

    fn check<const R: usize, const W: usize, const FMA: bool>(
        (m, k, n): (usize, usize, usize),
        (alpha, beta): (f32, f32),
        layouts: (u8, u8, u8),
    ) {
        let a_own = laid_out(m, k, layouts.0, 1);
        let b_own = laid_out(k, n, layouts.1, 2);
        let (a, b) = (view(&a_own, layouts.0), view(&b_own, layouts.1));
        let mut c_own = laid_out(m, n, layouts.2, 3);
        if beta == 0.0 {
            // NaNs where `beta` is zero: they must not carry.
            c_own.fill(f32::NAN);
        }
        let want = chained((alpha, beta, FMA), a, b, view(&c_own, layouts.2));
        gemm_with(
            blocked::<R, W, FMA>,
            alpha,
            (a, b),
            beta,
            view_mut(&mut c_own, layouts.2),
        );
        let got = view(&c_own, layouts.2);
        let same = got
            .iter()
            .zip(&want)
            .all(|(g, w)| g.to_bits() == w.to_bits());
        assert!(
            same,
            "R {R} W {W} fma {FMA} {m}x{k}x{n} {layouts:?}: {got} vs {want}"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        /// Every kernel shape, called directly whatever this CPU runs, on shapes off every
        /// tile and block (the inner dimension across two slices), each operand and the
        /// output row-major, transposed, strided or reversed, `alpha` not a power of two and
        /// `beta` zero, one or other, bit for bit against the chains summed one element at a
        /// time.
        #[test]
        fn every_kernel_sums_as_the_chains(
            m in 0usize..40,
            k in prop_oneof![0usize..20, 250usize..520],
            n in 0usize..70,
            alpha in prop_oneof![Just(1.0f32), Just(-0.7), Just(3.3)],
            beta in prop_oneof![Just(0.0f32), Just(1.0), Just(-1.9)],
            layouts in (0u8..4, 0u8..4, 0u8..4),
        ) {
            let shape = (m, k, n);
            check::<12, 32, true>(shape, (alpha, beta), layouts);
            check::<6, 16, true>(shape, (alpha, beta), layouts);
            check::<6, 8, true>(shape, (alpha, beta), layouts);
            check::<6, 8, false>(shape, (alpha, beta), layouts);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]
        /// Each slice's product, bit for bit as one [`gemm`] on the slice gives it (its chains
        /// split at [`KC`] from the slice's own start): slices of one column, of more than
        /// [`KC`], ending short of `k`, and an operand seen transposed.
        #[test]
        fn slices_are_each_slices_gemm(
            m in 0usize..30,
            n in 0usize..50,
            cuts in proptest::collection::btree_set(1usize..700, 1..5),
            short in 0usize..3,
            transposed in any::<bool>(),
        ) {
            let ends: Vec<usize> = cuts.into_iter().collect();
            let k = ends.last().copied().unwrap_or(0) + short;
            let a = values(m, k, 6);
            let b_own = laid_out(k, n, u8::from(transposed), 7);
            let b = view(&b_own, u8::from(transposed));
            let mut got = ndarray::Array3::from_elem((ends.len(), m, n), f32::NAN);
            gemm_slices(a.view(), b, &ends, got.view_mut());
            let mut start = 0;
            for (t, &end) in ends.iter().enumerate() {
                let (a, b) = (a.slice(s![.., start..end]), b.slice(s![start..end, ..]));
                let want = chained((1.0, 0.0, fused()), a, b, Array2::zeros((m, n)).view());
                prop_assert_eq!(got.index_axis(Axis(0), t), want.view(), "slice {}", t);
                start = end;
            }
        }
    }

    /// Whether the kernel this CPU dispatches to fuses (under every cap).
    fn fused() -> bool {
        cfg!(target_arch = "aarch64")
            || crate::runtime::simd::detected() >= crate::runtime::simd::Isa::Avx2
    }

    #[test]
    fn blocks_edges_and_the_dispatched_kernel() {
        // More rows than [`MC`] and columns than [`NC`], with inner dimensions that run the
        // 8 × 8 transposes and their tails.
        check::<12, 32, true>((MC + 5, 13, NC + 33), (1.0, 0.0), (0, 1, 0));
        check::<6, 8, false>((MC + 5, 21, NC + 33), (2.5, 1.0), (1, 1, 2));
        // The kernel this CPU dispatches to, through `gemm`.
        for (alpha, beta) in [(1.0, 0.0), (-0.3, 1.7)] {
            let (a, b, c) = (values(30, 300, 4), values(300, 20, 5), values(30, 20, 8));
            let mut got = c.clone();
            gemm(alpha, a.view(), b.view(), beta, got.view_mut());
            assert_eq!(
                got,
                chained((alpha, beta, fused()), a.view(), b.view(), c.view())
            );
        }
    }
}
