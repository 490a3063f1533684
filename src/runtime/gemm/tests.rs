//! The GEMM's kernels, loop nest and packings against the chains summed one element at a
//! time, bit for bit.

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

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    /// A right operand packed once gives each product's bits as packing it in the call
    /// does: one product (`beta` zero or not, the output strided) and slices, the
    /// operand row-major or transposed, shapes off the panels and past [`NC`] columns.
    #[test]
    fn packed_once_is_packed_per_call(
        m in 0usize..30,
        n in prop_oneof![0usize..70, 250usize..300],
        cuts in proptest::collection::btree_set(1usize..600, 1..4),
        short in 0usize..3,
        transposed in any::<bool>(),
        beta in prop_oneof![Just(0.0f32), Just(-1.3)],
    ) {
        let ends: Vec<usize> = cuts.into_iter().collect();
        let k = ends.last().copied().unwrap_or(0) + short;
        let a = values(m, k, 11);
        let b_own = laid_out(k, n, u8::from(transposed), 12);
        let b = view(&b_own, u8::from(transposed));
        let c0 = laid_out(m, n, 2, 13);
        let (mut want, mut got) = (c0.clone(), c0);
        gemm(0.7, a.view(), b, beta, view_mut(&mut want, 2));
        gemm_packed(0.7, a.view(), &PackedB::new(b, &[k]), beta, view_mut(&mut got, 2));
        prop_assert_eq!(view(&got, 2), view(&want, 2));
        let mut want = ndarray::Array3::from_elem((ends.len(), m, n), f32::NAN);
        let mut got = want.clone();
        gemm_slices(a.view(), b, &ends, want.view_mut());
        gemm_slices_packed(a.view(), &PackedB::new(b, &ends), got.view_mut());
        prop_assert_eq!(got, want);
    }
}

#[test]
fn packed_with_no_inner_dimension_scales_c() {
    let (a, b) = (Array2::<f32>::zeros((3, 0)), Array2::<f32>::zeros((0, 5)));
    let packed = PackedB::new(b.view(), &[0]);
    for beta in [0.0, 2.0] {
        let mut c = Array2::from_elem((3, 5), 1.5f32);
        gemm_packed(1.0, a.view(), &packed, beta, c.view_mut());
        assert_eq!(c, Array2::from_elem((3, 5), 1.5 * beta));
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
