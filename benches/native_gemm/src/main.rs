//! `c = a b` of `(M, K) · (K, N)` with matrixmultiply (ndarray's `general_mat_mul`) and with the
//! library's own GEMM, in turn, `reps` times: GFLOP/s of each and the largest difference
//! (0: the same bits). `n`/`t`: each operand row-major, or a transposed view of a row-major
//! array (as the losses pass `W` and `xᵀ`). `threads` > 1 splits `c` as the library's
//! `par_mul` does, one single-threaded GEMM per thread.
#![allow(dead_code, unused_macros)]

// The library's files as they are (`gemm` reads the vector set from its sibling `simd`).
#[path = "../../../src/runtime/gemm.rs"]
mod gemm;
#[path = "../../../src/runtime/simd.rs"]
mod simd;

use ndarray::{s, Array2, ArrayView2, ArrayViewMut2, Axis};
use std::time::Instant;

/// `c = a b` on `workers` threads, split as `runtime::pool::par_mul` splits it.
fn split(
    ours: bool,
    a: ArrayView2<f32>,
    b: ArrayView2<f32>,
    mut c: ArrayViewMut2<f32>,
    workers: usize,
) {
    let mul = move |a: ArrayView2<f32>, b: ArrayView2<f32>, mut c: ArrayViewMut2<f32>| match ours {
        true => gemm::gemm(1.0, a, b, 0.0, c),
        false => ndarray::linalg::general_mat_mul(1.0, &a, &b, 0.0, &mut c),
    };
    let (rows, cols) = c.dim();
    if workers == 1 {
        return mul(a, b, c);
    }
    std::thread::scope(|scope| {
        if rows >= cols {
            let per = rows.div_ceil(workers).next_multiple_of(12);
            for (t, c) in c.axis_chunks_iter_mut(Axis(0), per).enumerate() {
                let a = a.slice(s![t * per..t * per + c.nrows(), ..]);
                scope.spawn(move || mul(a, b, c));
            }
        } else {
            let per = cols.div_ceil(workers).next_multiple_of(32);
            for (t, c) in c.axis_chunks_iter_mut(Axis(1), per).enumerate() {
                let b = b.slice(s![.., t * per..t * per + c.ncols()]);
                scope.spawn(move || mul(a, b, c));
            }
        }
    });
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num =
        |i: usize, default: usize| args.get(i).and_then(|v| v.parse().ok()).unwrap_or(default);
    let (m, k, n) = (num(0, 512), num(1, 512), num(2, 2048));
    let (ta, tb) = (
        args.get(3).is_some_and(|v| v == "t"),
        args.get(4).is_some_and(|v| v == "t"),
    );
    let (reps, workers, pad) = (num(5, 5), num(6, 1), num(7, 0));
    let fill = |r: usize, c: usize, seed: usize| {
        Array2::from_shape_fn((r, c), |(i, j)| ((i * 7 + j * 3 + seed) % 11) as f32 * 0.1)
    };
    // `pad` floats past each row of `a`'s array: a leading dimension off the powers of two.
    let a_own = if ta { fill(k, m + pad, 1) } else { fill(m, k + pad, 1) };
    let b_own = if tb { fill(n, k, 2) } else { fill(k, n, 2) };
    let a = match ta {
        true => a_own.slice(s![.., ..m]).reversed_axes(),
        false => a_own.slice(s![.., ..k]),
    };
    let b = if tb { b_own.t() } else { b_own.view() };
    let (mut theirs, mut ours) = (Array2::<f32>::zeros((m, n)), Array2::<f32>::zeros((m, n)));
    let flops = 2.0 * (m * n * k) as f64;
    for _ in 0..reps {
        let t = Instant::now();
        split(false, a, b, theirs.view_mut(), workers);
        let mm = t.elapsed().as_secs_f64();
        let t = Instant::now();
        split(true, a, b, ours.view_mut(), workers);
        let own = t.elapsed().as_secs_f64();
        println!(
            "matrixmultiply {:.1} GFLOP/s, ours {:.1} GFLOP/s",
            flops / mm / 1e9,
            flops / own / 1e9
        );
    }
    let diff = theirs
        .iter()
        .zip(&ours)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    println!("largest difference {diff}");
}
