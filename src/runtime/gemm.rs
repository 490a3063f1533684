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
type Kernel = fn(f32, (ArrayView2<'_, f32>, Right<'_>), &[Segment], &mut [ArrayViewMut2<'_, f32>]);

/// A product's right operand: as it lies (packed by the call), or [`PackedB`] already.
#[derive(Clone, Copy)]
enum Right<'a> {
    View(ArrayView2<'a, f32>),
    Packed(&'a PackedB),
}

impl Right<'_> {
    fn ncols(&self) -> usize {
        match self {
            Right::View(b) => b.ncols(),
            Right::Packed(b) => b.n,
        }
    }
}

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
    kernel(alpha, (a, Right::View(b)), &whole(k, beta), &mut [c]);
}

/// The segments of one product over `k`: chains of [`KC`], the first scaling `c` by `beta`,
/// the others adding to it.
fn whole(k: usize, beta: f32) -> Vec<Segment> {
    let mut segments = slices(&[k]);
    if let Some(first) = segments.first_mut() {
        first.beta = beta;
    }
    segments
}

/// The segments of [`gemm_slices`]: each slice between `ends` (from 0) in chains of [`KC`]
/// from its own start, as one GEMM on it sums, into its own output.
fn slices(ends: &[usize]) -> Vec<Segment> {
    let mut segments = Vec::new();
    let mut start = 0;
    for (t, &end) in ends.iter().enumerate() {
        for p0 in (start..end).step_by(KC) {
            segments.push(Segment {
                range: p0..(p0 + KC).min(end),
                out: t,
                beta: if p0 == start { 0.0 } else { 1.0 },
            });
        }
        start = end;
    }
    segments
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
    c: ArrayViewMut3<'_, f32>,
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
    slices_into(a, Right::View(b), ends, c);
}

/// [`gemm_slices`] from `a` and a right operand of the slices' shape; the shapes checked.
fn slices_into(
    a: ArrayView2<'_, f32>,
    b: Right<'_>,
    ends: &[usize],
    mut c: ArrayViewMut3<'_, f32>,
) {
    let mut start = 0;
    for (t, &end) in ends.iter().enumerate() {
        if start == end {
            c.index_axis_mut(Axis(0), t).fill(0.0);
        }
        start = end;
    }
    let mut outs: Vec<ArrayViewMut2<'_, f32>> = c.outer_iter_mut().collect();
    dispatch(1.0, (a, b), &slices(ends), &mut outs);
}

/// A right operand `b` `(k, n)` packed once into the panels of the kernel this CPU runs, for
/// the products [`gemm_packed`] and [`gemm_slices_packed`] take with it over the slices
/// between `ends` (`[k]`: one product): many calls (row blocks, threads) then share one
/// packing instead of packing `b` again each. `4 · k · n` bytes, rounded up to whole
/// panels ([`PackedB::bytes`]).
pub(crate) struct PackedB {
    /// The panel width it was packed for.
    w: usize,
    n: usize,
    ends: Vec<usize>,
    /// Per segment ([`slices`] of `ends`): its range and where its panels start in `data`.
    segments: Vec<(Range<usize>, usize)>,
    data: Vec<f32>,
}

impl PackedB {
    /// Packs `b` `(k, n)` for the slices between `ends` (ascending, the last at most `k`).
    ///
    /// # Panics
    /// On ends not ascending within `k`: a caller's bug.
    pub(crate) fn new(b: ArrayView2<'_, f32>, ends: &[usize]) -> Self {
        match panel_width() {
            32 => Self::packed::<32>(b, ends),
            16 => Self::packed::<16>(b, ends),
            _ => Self::packed::<8>(b, ends),
        }
    }

    /// The bytes a packing of `(k, n)` holds (an upper bound for every panel width).
    pub(crate) fn bytes(k: usize, n: usize) -> u64 {
        4 * k as u64 * n.next_multiple_of(32) as u64
    }

    /// [`PackedB::new`] for panels of `W` columns.
    fn packed<const W: usize>(b: ArrayView2<'_, f32>, ends: &[usize]) -> Self {
        let k = b.nrows();
        assert!(
            ends.windows(2).all(|e| e[0] < e[1]) && ends.last().is_none_or(|&e| e <= k),
            "PackedB: ({:?}) at {ends:?}",
            b.dim()
        );
        let n = b.ncols();
        let width = n.next_multiple_of(W);
        let segments: Vec<(Range<usize>, usize)> = slices(ends)
            .into_iter()
            .scan(0, |at, seg| {
                let start = *at;
                *at += width * seg.range.len();
                Some((seg.range, start))
            })
            .collect();
        let len = segments.last().map_or(0, |(r, at)| at + width * r.len());
        let mut data = vec![0.0f32; len];
        for (range, at) in &segments {
            let panels = &mut data[*at..*at + width * range.len()];
            pack::<W>(b.slice(s![range.clone(), ..]).t(), panels);
        }
        Self {
            w: W,
            n,
            ends: ends.to_vec(),
            segments,
            data,
        }
    }

    /// Segment `seg`'s panels for columns `j0 .. j0 + cols` (`j0` a multiple of the width).
    fn panels(&self, seg: usize, j0: usize, cols: usize) -> &[f32] {
        let (range, at) = &self.segments[seg];
        let kc = range.len();
        &self.data[at + j0 * kc..at + (j0 + cols).next_multiple_of(self.w) * kc]
    }
}

/// [`gemm`] with a packed right operand of one product (`ends` `[k]`).
///
/// # Panics
/// On shapes that do not chain or a packing of several slices: a caller's bug.
pub(crate) fn gemm_packed(
    alpha: f32,
    a: ArrayView2<'_, f32>,
    b: &PackedB,
    beta: f32,
    mut c: ArrayViewMut2<'_, f32>,
) {
    let k = a.ncols();
    assert!(
        b.ends == [k] && c.dim() == (a.nrows(), b.n),
        "gemm_packed: ({:?}) · ({k} at {:?}, {}) into ({:?})",
        a.dim(),
        b.ends,
        b.n,
        c.dim()
    );
    if k == 0 {
        // No chain: `c` is only scaled, as [`gemm`] scales it.
        c.map_inplace(|x| *x = if beta == 0.0 { 0.0 } else { beta * *x });
        return;
    }
    dispatch(alpha, (a, Right::Packed(b)), &whole(k, beta), &mut [c]);
}

/// [`gemm_slices`] with a packed right operand of the same slices.
///
/// # Panics
/// On shapes that do not chain: a caller's bug.
pub(crate) fn gemm_slices_packed(a: ArrayView2<'_, f32>, b: &PackedB, c: ArrayViewMut3<'_, f32>) {
    let k = a.ncols();
    assert!(
        b.ends.last().is_none_or(|&e| e <= k) && c.dim() == (b.ends.len(), a.nrows(), b.n),
        "gemm_slices_packed: ({:?}) · (at {:?}, {}) into ({:?})",
        a.dim(),
        b.ends,
        b.n,
        c.dim()
    );
    slices_into(a, Right::Packed(b), &b.ends, c);
}

/// The panel width of the kernel [`dispatch`] runs.
fn panel_width() -> usize {
    #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
    {
        use super::simd::{isa, Isa};
        match isa() {
            Isa::Avx512 => 32,
            Isa::Avx2 => 16,
            Isa::Baseline => 8,
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        16
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "x86", target_arch = "aarch64")))]
    {
        8
    }
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
    ab: (ArrayView2<'_, f32>, Right<'_>),
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
            ab: (ArrayView2<'_, f32>, Right<'_>),
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
    (a, b): (ArrayView2<'_, f32>, Right<'_>),
    segments: &[Segment],
    outs: &mut [ArrayViewMut2<'_, f32>],
) {
    let (m, n) = (a.nrows(), b.ncols());
    if let Right::Packed(packed) = b {
        assert!(
            packed.w == W && packed.segments.len() == segments.len(),
            "gemm: packed for panels of {} in {} segments, run with {W} in {}",
            packed.w,
            packed.segments.len(),
            segments.len()
        );
    }
    let longest = segments.iter().map(|s| s.range.len()).max().unwrap_or(0);
    if m == 0 || n == 0 || longest == 0 {
        return;
    }
    let mut a_pack = vec![0.0f32; m.next_multiple_of(R).min(MC) * longest];
    let b_len = match b {
        Right::View(_) => n.next_multiple_of(W).min(NC) * longest,
        Right::Packed(_) => 0,
    };
    let mut b_pack = vec![0.0f32; b_len];
    for (si, seg) in segments.iter().enumerate() {
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
                let panels: &[f32] = match b {
                    Right::View(b) => {
                        let panels = &mut b_pack[..cols.div_ceil(W) * W * kc];
                        pack::<W>(b.slice(s![p.clone(), j0..j0 + cols]).t(), panels);
                        panels
                    }
                    Right::Packed(packed) => {
                        debug_assert_eq!(packed.segments[si].0, p);
                        packed.panels(si, j0, cols)
                    }
                };
                for (strip_i, strip) in a_pack[..rows.div_ceil(R) * R * kc]
                    .chunks_exact(R * kc)
                    .enumerate()
                {
                    let (strip, _) = strip.as_chunks::<R>();
                    let r0 = i0 + strip_i * R;
                    for (pi, panel) in panels.chunks_exact(W * kc).enumerate() {
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
            // Lanes contiguous (a row-major `b`, seen transposed): a copy per `t`, of a
            // length known to the compiler where the group is whole (else it copies one
            // float at a time).
            for (t, column) in group.iter_mut().zip(part.columns()) {
                match column.as_slice().map(<&[f32; L]>::try_from) {
                    Some(Ok(whole)) => *t = *whole,
                    _ => copy(t.iter_mut(), column),
                }
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
mod tests;
