//! A loss's gradient taken from the distance matrix back to the embeddings: per pair the
//! weight `∂L/∂D` becomes `U` ([`pair_weight`]), then two products with the embeddings give the
//! gradients of the normalised rows, and [`through_normalization`] takes them through the L2
//! normalisation.
//!
//! With `q̂, r̂` the (normalised) rows and `D` the distance:
//! - Euclidean `|q̂ − r̂|`: `∂D/∂q̂ = (q̂ − r̂) / D`, so with `U = W / D` (0 where `D = 0`, as
//!   torch's `cdist` backward), `G_q̂ = q̂ · rowsum(U) − U r̂` and `G_r̂ = r̂ · colsum(U) − Uᵀ q̂`;
//! - squared Euclidean: the same with `U = 2W`;
//! - dot product and cosine: `G_q̂ = W r̂`, `G_r̂ = Wᵀ q̂`.

use ndarray::{s, Array2, ArrayView2, ArrayViewMut2, Axis};

use crate::metric::Distance;
use crate::runtime::gemm::gemm;
use crate::runtime::pool::threads;

/// Whether the distance is Euclidean in form (its gradient has the `rowsum`/`colsum` terms).
fn euclidean(distance: Distance) -> bool {
    matches!(distance, Distance::Euclidean | Distance::SquaredEuclidean)
}

/// `U` for a pair with weight `w = ∂L/∂D` and distance `d`.
#[inline]
pub(super) fn pair_weight(distance: Distance, w: f64, d: f32) -> f32 {
    match distance {
        Distance::Euclidean if d > 0.0 => (w / d as f64) as f32,
        Distance::Euclidean => 0.0,
        Distance::SquaredEuclidean => (2.0 * w) as f32,
        Distance::Cosine | Distance::DotProduct => w as f32,
    }
}

/// The queries' gradient `g` `(n, dim)` (overwritten) from their rows' `u` `(n, m)`, their
/// normalised rows `q_hat` `(n, dim)` and the references' `r_hat` `(m, dim)`.
pub(super) fn query_side(
    distance: Distance,
    u: ArrayView2<'_, f32>,
    q_hat: ArrayView2<'_, f32>,
    r_hat: ArrayView2<'_, f32>,
    mut g: ArrayViewMut2<'_, f32>,
) {
    if !euclidean(distance) {
        gemm(1.0, u, r_hat, 0.0, g.view_mut());
        return;
    }
    gemm(-1.0, u, r_hat, 0.0, g.view_mut());
    for ((mut g, q), u) in g.rows_mut().into_iter().zip(q_hat.rows()).zip(u.rows()) {
        g.scaled_add(u.sum(), &q);
    }
}

/// Adds the references' gradient from one block of query rows to `g` `(m, dim)`: `u`
/// `(rows, m)`, the block's `q_hat` `(rows, dim)`, all references' `r_hat` `(m, dim)`. The
/// references are split over the threads (each writes its own rows of `g`).
pub(super) fn add_ref_side(
    distance: Distance,
    u: ArrayView2<'_, f32>,
    q_hat: ArrayView2<'_, f32>,
    r_hat: ArrayView2<'_, f32>,
    mut g: ArrayViewMut2<'_, f32>,
) {
    let m = g.nrows();
    let per = m.div_ceil(threads()).max(1);
    std::thread::scope(|scope| {
        for (t, g) in g.axis_chunks_iter_mut(Axis(0), per).enumerate() {
            let j0 = t * per;
            let j = j0..j0 + g.nrows();
            let u = u.slice(s![.., j.clone()]);
            let r_hat = r_hat.slice(s![j, ..]);
            scope.spawn(move || ref_side_into(distance, u, q_hat, r_hat, g));
        }
    });
}

/// [`add_ref_side`] on the calling thread, for the references of `r_hat` `(m, dim)`, the
/// columns of `u` `(rows, m)`, into `g` `(m, dim)`.
pub(super) fn ref_side_into(
    distance: Distance,
    u: ArrayView2<'_, f32>,
    q_hat: ArrayView2<'_, f32>,
    r_hat: ArrayView2<'_, f32>,
    mut g: ArrayViewMut2<'_, f32>,
) {
    let sign = if euclidean(distance) { -1.0 } else { 1.0 };
    gemm(sign, u.t(), q_hat, 1.0, g.view_mut());
    if euclidean(distance) {
        for ((mut g, r), col) in g.rows_mut().into_iter().zip(r_hat.rows()).zip(u.columns()) {
            g.scaled_add(col.sum(), &r);
        }
    }
}

/// Adds to `g` `(n, dim)` the gradient of rows that are both the queries and the
/// references, from their `u` `(n, n)` (made `U + Uᵀ` in place) and normalised rows `x_hat`
/// `(n, dim)`: [`query_side`] and [`add_ref_side`] at once, as `(U + Uᵀ) x̂` (and, Euclidean,
/// `x̂` times its row sums), one product on every core instead of two.
pub(super) fn add_both_sides(
    distance: Distance,
    mut u: ArrayViewMut2<'_, f32>,
    x_hat: ArrayView2<'_, f32>,
    mut g: ArrayViewMut2<'_, f32>,
) {
    symmetrize(u.view_mut());
    let sign = if euclidean(distance) { -1.0 } else { 1.0 };
    crate::runtime::pool::par_mul(sign, u.view(), x_hat, 1.0, g.view_mut());
    if euclidean(distance) {
        for ((mut g, x), row) in g.rows_mut().into_iter().zip(x_hat.rows()).zip(u.rows()) {
            g.scaled_add(row.sum(), &x);
        }
    }
}

/// `u` `(n, n)` made `u + uᵀ` in place, a pair of tiles at a time: the lower tile is read and
/// written back by rows through a transposed copy, since its columns are `n` floats apart
/// (with `n` a power of two, every one of them in one cache set).
fn symmetrize(mut u: ArrayViewMut2<'_, f32>) {
    const TILE: usize = 32;
    debug_assert_eq!(u.nrows(), u.ncols(), "a square block");
    let n = u.nrows().min(u.ncols());
    let Some(data) = u.as_slice_mut() else {
        let t = u.t().to_owned();
        u += &t;
        return;
    };
    let mut t = [[0.0f32; TILE]; TILE];
    for i0 in (0..n).step_by(TILE) {
        let i1 = (i0 + TILE).min(n);
        for i in i0..i1 {
            for j in i..i1 {
                let sum = data[i * n + j] + data[j * n + i];
                data[i * n + j] = sum;
                data[j * n + i] = sum;
            }
        }
        for j0 in (i1..n).step_by(TILE) {
            let j1 = (j0 + TILE).min(n);
            for (b, j) in (j0..j1).enumerate() {
                for (a, &v) in data[j * n + i0..j * n + i1].iter().enumerate() {
                    t[a][b] = v;
                }
            }
            for (a, i) in (i0..i1).enumerate() {
                for (b, v) in data[i * n + j0..i * n + j1].iter_mut().enumerate() {
                    *v += t[a][b];
                    t[a][b] = *v;
                }
            }
            for (b, j) in (j0..j1).enumerate() {
                for (a, v) in data[j * n + i0..j * n + i1].iter_mut().enumerate() {
                    *v = t[a][b];
                }
            }
        }
    }
}

/// Takes `g` `(n, dim)`, the gradient with respect to the normalised rows of `x` `(n, dim)`,
/// through `x̂ = x / max(|x|, 1e-12)` (torch's `normalize`: `(g − x̂ (x̂·g)) / |x|`, or
/// `g / 1e-12` where the norm is clamped), when `normalizes`; then multiplies it by `factor`.
/// Rows on every core (each row's arithmetic is its own: the same bits on any split).
pub(super) fn through_normalization(
    g: &mut Array2<f32>,
    x: ArrayView2<'_, f32>,
    normalizes: bool,
    factor: f32,
) {
    let dim = x.ncols();
    crate::runtime::pool::par_rows(
        g.view_mut(),
        || ndarray::Array1::<f32>::zeros(dim),
        |row0, mut chunk, x_hat| {
            let rows = chunk.rows_mut().into_iter();
            for (mut g, x) in rows.zip(x.slice(ndarray::s![row0.., ..]).rows()) {
                if normalizes {
                    let norm = x.dot(&x).sqrt();
                    if norm > 1e-12 {
                        x_hat.zip_mut_with(&x, |h, &v| *h = v / norm);
                        let along = x_hat.dot(&g);
                        g.scaled_add(-along, x_hat);
                        g /= norm;
                    } else {
                        g /= 1e-12;
                    }
                }
                g *= factor;
            }
        },
    );
}
