//! The two passes of [`super::classifier`] over tiles of classes.
//!
//! Pass 1 multiplies the normalised rows by a tile of normalised centres and folds each row's
//! logits into its running maximum and sum of exponentials (online, so no row ever holds all
//! its classes). Pass 2 takes the products again (kept from pass 1 where they fit, else
//! recomputed), turns them into `∂loss/∂cosine` per centre, and multiplies back: into the
//! rows' gradient (accumulated over tiles) and into the tile's centres' gradient (complete at
//! once, so it is finished and written out before the next tile).

use ndarray::{s, Array2, ArrayView1, ArrayView2, ArrayViewMut1, ArrayViewMut2, Axis};

use super::classifier_params::{Centres, Rule};
use super::classifier_shards::{RowPart, Shards};
use super::matryoshka_row::{exp_bounded, lanes, lanes_max};
use crate::error::{Error, Result};
use crate::hooks::Hooks;
use crate::runtime::host_alloc::zeroed_f32;
use crate::runtime::pool::{par_mul, threads};
use crate::runtime::simd::widest;

/// PML's `F.normalize` floor on a norm.
pub(super) const NORM_EPS: f64 = 1e-12;

/// `ln` of f32's least subnormal: a probability below it is 0 in PML's f32 softmax.
const LN_LEAST_F32: f64 = -103.278_929_903_431_85;

/// One call's inputs, with every centre's weight as a column of `w` `(d, centres)`.
pub(super) struct Inputs<'a> {
    pub(super) x: ArrayView2<'a, f32>,
    pub(super) labels: &'a [usize],
    pub(super) w: ArrayView2<'a, f32>,
    pub(super) rule: Rule,
    /// Rows whose probability underflows leave the mean (ProxyNCA).
    pub(super) drop_zero: bool,
}

/// The passes' shape: centres per tile, and whether pass 1's products are kept.
#[derive(Debug, Clone, Copy)]
pub(super) struct Tiling {
    pub(super) cols: usize,
    pub(super) keep: bool,
}

/// Where pass 1's products wait for pass 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// Nowhere: pass 2 computes them again.
    Recompute,
    /// In the centres' gradient's own columns (`(d, centres)`, `b ≤ d`).
    InGradient,
    /// In a matrix of their own.
    Apart,
}

/// The loss, the rows kept in its mean, the rows' gradient `(b, d)` and the centres' gradient
/// in the caller's layout.
pub(super) struct Output {
    pub(super) loss: f64,
    pub(super) count: usize,
    pub(super) grad: Array2<f32>,
    pub(super) weight_grad: Array2<f32>,
}

/// A row's running state.
#[derive(Debug, Clone, Copy)]
pub(super) struct Row {
    norm: f64,
    /// `scale · a`: the logit's factor before the class's `b`.
    k: f32,
    max: f32,
    sum: f64,
    target: f64,
    /// `ln Σ exp` after pass 1.
    lse: f64,
    /// `1 / count`, or 0 for a row out of the mean.
    weight: f64,
    /// `Σ_j ∂L/∂z_ij · z_ij`: the gradient through the row's norm (LargeMarginSoftmax).
    through_norm: f64,
}

/// Runs both passes on the shard `shards` says (its classes numbered from its first); the
/// centres' gradient comes back as `(centres, d)` where `on_rows`, else `(d, centres)` (the
/// layout of the caller's weights), and the rows' gradient for this process's rows.
pub(super) fn run(
    inp: &Inputs<'_>,
    tiling: Tiling,
    on_rows: bool,
    (hooks, shards): (&Hooks, &dyn Shards),
    op: &'static str,
) -> Result<Output> {
    let (b, d) = inp.x.dim();
    let centres = inp.w.ncols();
    let per = inp.rule.centres.per_class();
    let (first, _) = shards.classes(centres / per);
    let (xhat, mut rows) = normalise_rows(inp);
    let shape = if on_rows { (centres, d) } else { (d, centres) };
    let mut weight_grad = zeros("classifier_loss::weight_grad (host)", shape)?;
    // Kept products lie in the centres' gradient, `(d, centres)` with `b ≤ d`, until pass 2
    // has read each tile's (its gradient then overwrites them): no second buffer of the
    // weights' size to allocate and fault in. Centres on rows keep them apart.
    let keep = match (tiling.keep, on_rows) {
        (false, _) => Keep::Recompute,
        (true, false) => Keep::InGradient,
        (true, true) => Keep::Apart,
    };
    let mut kept = zeros(
        "classifier_loss::products (host)",
        (b, if keep == Keep::Apart { centres } else { 0 }),
    )?;
    let tile_cols = if keep == Keep::Apart { 0 } else { tiling.cols };
    let mut tile = Array2::<f32>::zeros((b, tile_cols));
    let tiles: Vec<(usize, usize)> = (0..centres)
        .step_by(tiling.cols.max(1))
        .map(|c0| (c0, (c0 + tiling.cols).min(centres)))
        .collect();
    let mut none = Array2::<f32>::zeros((b, 0));
    let mut all_norms = Vec::with_capacity(centres);
    for &(c0, c1) in &tiles {
        hooks.check(op)?;
        // The raw weights go into the products; each column is scaled by its inverse norm in
        // the row passes (no normalised copy of the weights).
        let w = inp.w.slice(s![.., c0..c1]);
        let norms = norms_of(w);
        all_norms.extend_from_slice(&norms);
        let scale = inverse_norms(&norms);
        let mut prod = match keep {
            Keep::InGradient => weight_grad.slice_mut(s![..b, c0..c1]),
            Keep::Apart => kept.slice_mut(s![.., c0..c1]),
            Keep::Recompute => tile.slice_mut(s![.., ..c1 - c0]),
        };
        par_mul(1.0, xhat.view(), w, 0.0, prod.view_mut());
        by_rows(prod, none.view_mut(), &mut rows, |r0, prod, _, rows| {
            fold_rows(inp, (first + c0 / per, &norms, &scale), r0, prod, rows);
        });
    }
    combine_rows(shards, &mut rows)?;
    let (loss, count) = close_rows(inp, &mut rows);
    let mut gx = Array2::<f32>::zeros((b, d));
    let through_cols = if inp.rule.col_norm { tiling.cols } else { 0 };
    let mut through = Array2::<f32>::zeros((b, through_cols));
    for &(c0, c1) in &tiles {
        hooks.check(op)?;
        let n = c1 - c0;
        let w = inp.w.slice(s![.., c0..c1]);
        let norms = &all_norms[c0..c1];
        let scale = inverse_norms(norms);
        let mut prod = match keep {
            Keep::Apart => kept.slice_mut(s![.., c0..c1]),
            _ => tile.slice_mut(s![.., ..n]),
        };
        let rescale: &[f32] = match keep {
            Keep::Recompute => {
                par_mul(1.0, xhat.view(), w, 0.0, prod.view_mut());
                &scale
            }
            _ => &[],
        };
        // Kept in the gradient: each worker copies its rows out before they are overwritten.
        let stored = (keep == Keep::InGradient).then(|| weight_grad.slice(s![..b, c0..c1]));
        let mut terms = through.slice_mut(s![.., ..through_cols.min(n)]);
        by_rows(
            prod.view_mut(),
            terms.view_mut(),
            &mut rows,
            |r0, mut prod, terms, rows| {
                if let Some(stored) = &stored {
                    let rows_here = r0..r0 + prod.nrows();
                    prod.assign(&stored.slice(s![rows_here, ..]));
                }
                slope_rows(
                    inp,
                    (first + c0 / per, norms, rescale),
                    r0,
                    (prod, terms),
                    &scale,
                    rows,
                );
            },
        );
        // `prod` is now `∂loss/∂c` over each centre's norm: `∂loss/∂ŵ` scaled alike.
        par_mul(1.0, prod.view(), w.t(), 1.0, gx.view_mut());
        let mut out = if on_rows {
            weight_grad.slice_mut(s![c0..c1, ..]).reversed_axes()
        } else {
            weight_grad.slice_mut(s![.., c0..c1])
        };
        par_mul(1.0, xhat.t(), prod.view(), 0.0, out.view_mut());
        let col_terms: Vec<f64> = terms
            .sum_axis(Axis(0))
            .iter()
            .map(|&t| f64::from(t))
            .collect();
        finish_tile(w, (norms, inp.rule.col_norm.then_some(&col_terms[..])), out);
    }
    let gx = own_rows(inp, shards, &mut rows, gx)?;
    Ok(Output {
        loss: if count > 0 { loss / count as f64 } else { 0.0 },
        count,
        grad: gx,
        weight_grad,
    })
}

/// Each row's pass-1 state combined over the shards (nothing changes on a single one).
fn combine_rows(shards: &dyn Shards, rows: &mut [Row]) -> Result<()> {
    let mut parts: Vec<RowPart> = rows
        .iter()
        .map(|r| RowPart {
            max: r.max,
            sum: r.sum,
            target: r.target,
        })
        .collect();
    shards.combine_rows(&mut parts)?;
    for (r, p) in rows.iter_mut().zip(&parts) {
        (r.max, r.sum, r.target) = (p.max, p.sum, p.target);
    }
    Ok(())
}

/// The rows' gradient `gx` (holding `∂loss/∂x̂` of every row on this shard) summed over the
/// shards and finished, for this process's rows.
pub(super) fn own_rows(
    inp: &Inputs<'_>,
    shards: &dyn Shards,
    rows: &mut [Row],
    gx: Array2<f32>,
) -> Result<Array2<f32>> {
    let through = rows.iter().map(|r| r.through_norm).collect();
    let (own, mut gx, through) = shards.sum_rows(gx, through)?;
    let rows = &mut rows[own.clone()];
    for (r, t) in rows.iter_mut().zip(through) {
        r.through_norm = t;
    }
    let mine = Inputs {
        x: inp.x.slice(s![own.clone(), ..]),
        labels: &inp.labels[own],
        w: inp.w,
        rule: inp.rule,
        drop_zero: inp.drop_zero,
    };
    finish_rows(&mine, rows, gx.view_mut());
    Ok(gx)
}

/// A zeroed `(rows, cols)` matrix in huge pages where Linux offers them (these are the size of
/// the weights: faulting them in 4 KiB pages costs as much as a pass over them), or an
/// out-of-memory error naming `label`.
pub(super) fn zeros(label: &'static str, (rows, cols): (usize, usize)) -> Result<Array2<f32>> {
    let len = rows.checked_mul(cols);
    let oom = || Error::OutOfMemory {
        label,
        requested: (rows as u64).saturating_mul(cols as u64).saturating_mul(4),
        message: "the host could not allocate it".into(),
        source: None,
    };
    let v = len.and_then(zeroed_f32).ok_or_else(oom)?;
    Array2::from_shape_vec((rows, cols), v).map_err(|_| oom())
}

/// `x / max(‖x‖, ε)` per row, and the rows' starting states.
pub(super) fn normalise_rows(inp: &Inputs<'_>) -> (Array2<f32>, Vec<Row>) {
    let mut xhat = inp.x.to_owned();
    let rows = xhat
        .rows_mut()
        .into_iter()
        .map(|mut r| {
            let norm = r.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>().sqrt();
            let inv = (1.0 / norm.max(NORM_EPS)) as f32;
            r.mapv_inplace(|v| v * inv);
            let a = if inp.rule.row_norm { norm } else { 1.0 };
            Row {
                norm,
                k: (inp.rule.scale * a) as f32,
                max: f32::NEG_INFINITY,
                sum: 0.0,
                // Set by the shard that has the row's target class.
                target: f64::NAN,
                lse: 0.0,
                weight: 0.0,
                through_norm: 0.0,
            }
        })
        .collect();
    (xhat, rows)
}

widest! {
    /// `Σ_r a[r, k] b[r, k]` per column `k` of `(d, n)` views of one layout, in f64, in the
    /// order their memory runs (the weights are `(d, classes)` or, for proxies, its transpose).
    fn col_sums(a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>) -> Vec<f64> {
        col_sums_plain(a, b)
    }
}

#[inline(always)]
fn col_sums_plain(a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>) -> Vec<f64> {
    let mut acc = vec![0.0f64; a.ncols()];
    if a.strides()[1] == 1 && b.strides()[1] == 1 {
        for (ra, rb) in a.rows().into_iter().zip(b.rows()) {
            let (ra, rb) = (
                ra.as_slice().unwrap_or_default(),
                rb.as_slice().unwrap_or_default(),
            );
            for ((acc, &x), &y) in acc.iter_mut().zip(ra).zip(rb) {
                *acc += f64::from(x) * f64::from(y);
            }
        }
    } else {
        for ((acc, ca), cb) in acc.iter_mut().zip(a.columns()).zip(b.columns()) {
            *acc = ca
                .iter()
                .zip(cb)
                .map(|(&x, &y)| f64::from(x) * f64::from(y))
                .sum();
        }
    }
    acc
}

/// Columns per core's part of a `(d, n)` tile (one part where the tile is small).
pub(super) fn col_part(d: usize, n: usize) -> usize {
    let workers = threads().min((d * n).div_ceil(1 << 16)).max(1);
    n.div_ceil(workers).max(1)
}

/// The norms of the columns of `w` `(d, n)`, parts of the columns on the cores.
pub(super) fn norms_of(w: ArrayView2<'_, f32>) -> Vec<f64> {
    let per = col_part(w.nrows(), w.ncols());
    std::thread::scope(|scope| {
        let parts: Vec<_> = w
            .axis_chunks_iter(Axis(1), per)
            .map(|part| scope.spawn(move || col_sums(part, part)))
            .collect();
        let mut norms = Vec::with_capacity(w.ncols());
        for part in parts {
            match part.join() {
                Ok(sums) => norms.extend(sums.into_iter().map(f64::sqrt)),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        norms
    })
}

/// [`finish_cols`] on parts of the tile's columns on the cores.
pub(super) fn finish_tile(
    w: ArrayView2<'_, f32>,
    (norms, through): (&[f64], Option<&[f64]>),
    mut out: ArrayViewMut2<'_, f32>,
) {
    let per = col_part(w.nrows(), w.ncols());
    std::thread::scope(|scope| {
        let parts = out
            .axis_chunks_iter_mut(Axis(1), per)
            .zip(w.axis_chunks_iter(Axis(1), per))
            .zip(norms.chunks(per))
            .enumerate();
        for (t, ((out, w), norms)) in parts {
            let through = through.map(|all| &all[t * per..t * per + norms.len()]);
            scope.spawn(move || finish_cols(w, (norms, through), out));
        }
    });
}

/// `1 / max(norm, ε)` per column.
pub(super) fn inverse_norms(norms: &[f64]) -> Vec<f32> {
    norms
        .iter()
        .map(|&n| (1.0 / n.max(NORM_EPS)) as f32)
        .collect()
}

/// Values below f32's least normal in magnitude made zero (in a loop that vectorises).
fn flush_subnormal(p: &mut [f32]) {
    for v in p.iter_mut() {
        *v = if v.abs() < f32::MIN_POSITIVE { 0.0 } else { *v };
    }
}

/// `p *= scale` element-wise (`scale` empty: nothing to do).
pub(super) fn rescale(p: &mut [f32], scale: &[f32]) {
    for (v, &s) in p.iter_mut().zip(scale) {
        *v *= s;
    }
}

/// Runs `work(first row, prod rows, other rows, states)` over parts of the rows on the cores;
/// `other` has the rows of `prod` (and any columns, none included).
fn by_rows(
    mut prod: ArrayViewMut2<'_, f32>,
    mut other: ArrayViewMut2<'_, f32>,
    rows: &mut [Row],
    work: impl Fn(usize, ArrayViewMut2<'_, f32>, ArrayViewMut2<'_, f32>, &mut [Row]) + Sync,
) {
    let b = rows.len();
    // A part of fewer than 2¹⁶ values costs more to hand out than to do.
    let workers = threads().min((b * prod.ncols()).div_ceil(1 << 16)).max(1);
    let per = b.div_ceil(workers).max(1);
    let mut parts: Vec<_> = prod
        .axis_chunks_iter_mut(Axis(0), per)
        .zip(other.axis_chunks_iter_mut(Axis(0), per))
        .zip(rows.chunks_mut(per))
        .enumerate()
        .collect();
    let work = &work;
    std::thread::scope(|scope| {
        let last = parts.pop();
        for (t, ((p, o), r)) in parts {
            scope.spawn(move || work(t * per, p, o, r));
        }
        if let Some((t, ((p, o), r))) = last {
            work(t * per, p, o, r);
        }
    });
}

/// A row's logits over the tile's classes into `z`, from its products `prod` (centres of the
/// tile, `norms` theirs); returns the target's `(class in the tile, its cosine, its b)`.
fn logits(
    inp: &Inputs<'_>,
    (class0, norms): (usize, &[f64]),
    (label, row): (usize, &Row),
    prod: &[f32],
    z: &mut [f32],
    (slopes, row_slopes): (&mut [f64], &mut [f32]),
) -> Option<(usize, f64, f64)> {
    let rule = &inp.rule;
    let per = rule.centres.per_class();
    let (k, bias) = (row.k, rule.bias as f32);
    if per == 1 && rule.col_norm {
        for ((z, &c), &nw) in z.iter_mut().zip(prod).zip(norms) {
            *z = k * nw as f32 * c + bias;
        }
    } else if per == 1 {
        for (z, &c) in z.iter_mut().zip(prod) {
            *z = k * c + bias;
        }
    } else if matches!(rule.centres, Centres::Max(_)) {
        // The best centre's cosine, in branch-free f32 (the class's value is exactly it).
        for (z, cs) in z.iter_mut().zip(prod.chunks_exact(per)) {
            let best = cs
                .iter()
                .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
            *z = k * best + bias;
        }
    } else {
        // SoftTriple: the classes' values, and each centre's slope for pass 2.
        rule.centres.soft_row(prod, z, row_slopes);
        for z in z.iter_mut() {
            *z = k * *z + bias;
        }
    }
    let t = label.checked_sub(class0).filter(|&t| t < z.len())?;
    let c = rule.centres.reduce(&prod[t * per..(t + 1) * per], slopes);
    let b = if rule.col_norm { norms[t] } else { 1.0 };
    Some((t, c, b))
}

/// Each centre's slope of a row, for SoftTriple only (else empty).
fn soft_scratch(inp: &Inputs<'_>, centres: usize) -> Vec<f32> {
    match inp.rule.centres {
        Centres::Soft(..) => vec![0.0; centres],
        _ => Vec::new(),
    }
}

/// Pass 1 on a part of the rows: scales the products to cosines (in place, where pass 2 may
/// find them), then each row's running maximum, sum and target logit.
fn fold_rows(
    inp: &Inputs<'_>,
    (class0, norms, scale): (usize, &[f64], &[f32]),
    r0: usize,
    mut prod: ArrayViewMut2<'_, f32>,
    rows: &mut [Row],
) {
    let per = inp.rule.centres.per_class();
    let classes = prod.ncols() / per;
    let (mut z, mut e) = (vec![0.0f32; classes], vec![0.0f32; classes]);
    let mut slopes = vec![0.0f64; per];
    let mut row_slopes = soft_scratch(inp, prod.ncols());
    for (t, (p, row)) in prod.rows_mut().into_iter().zip(rows).enumerate() {
        with_slice(p, |p| {
            rescale(p, scale);
            let label = inp.labels[r0 + t];
            let tile = (class0, norms);
            let scratch = (&mut slopes[..], &mut row_slopes[..]);
            if let Some((j, c, b)) = logits(inp, tile, (label, row), p, &mut z, scratch) {
                let a = if inp.rule.row_norm { row.norm } else { 1.0 };
                let (zt, _) = inp.rule.target(c, a, b);
                z[j] = zt as f32;
                row.target = f64::from(z[j]);
            }
        });
        let top = lanes_max(&z).max(row.max);
        exp_shifted(&z, top, &mut e);
        row.sum = row.sum * f64::from(exp_bounded(row.max - top)) + lanes(&e);
        row.max = top;
    }
}

/// Runs `f` on `row` as a slice: a copy, written back, where the row is not contiguous.
pub(super) fn with_slice<R>(mut row: ArrayViewMut1<'_, f32>, f: impl FnOnce(&mut [f32]) -> R) -> R {
    if let Some(s) = row.as_slice_mut() {
        return f(s);
    }
    let mut owned = row.to_vec();
    let out = f(&mut owned);
    row.assign(&ArrayView1::from(&owned[..]));
    out
}

/// Each row's `ln Σ exp` and weight in the mean; returns the summed loss and the rows in it.
fn close_rows(inp: &Inputs<'_>, rows: &mut [Row]) -> (f64, usize) {
    let mut loss = 0.0;
    let mut count = 0usize;
    for row in rows.iter_mut() {
        row.lse = f64::from(row.max) + row.sum.ln();
        let log_p = row.target - row.lse;
        // PML keeps a ProxyNCA row only where its f32 probability is not 0.
        let kept = !(inp.drop_zero && log_p < LN_LEAST_F32);
        row.weight = if kept { 1.0 } else { 0.0 };
        if kept {
            loss -= log_p;
            count += 1;
        }
    }
    for row in rows.iter_mut() {
        row.weight /= count.max(1) as f64;
    }
    (loss, count)
}

/// Pass 2 on a part of the rows: overwrites `prod` with `∂loss/∂cosine` per centre, puts
/// `∂loss/∂z · z` per class in `terms` (when it has columns: the gradient through the
/// classes' norms) and adds it up per row (through the row's norm).
fn slope_rows(
    inp: &Inputs<'_>,
    (class0, norms, again): (usize, &[f64], &[f32]),
    r0: usize,
    (mut prod, mut terms): (ArrayViewMut2<'_, f32>, ArrayViewMut2<'_, f32>),
    scale: &[f32],
    rows: &mut [Row],
) {
    let per = inp.rule.centres.per_class();
    let classes = prod.ncols() / per;
    let mut scratch = (
        vec![0.0f32; classes],
        vec![0.0f32; classes],
        vec![0.0f64; per],
        soft_scratch(inp, prod.ncols()),
    );
    for (t, row) in rows.iter_mut().enumerate() {
        let mut term = terms.row_mut(t);
        with_slice(prod.row_mut(t), |p| {
            if row.weight == 0.0 {
                p.fill(0.0);
                term.fill(0.0);
                return;
            }
            rescale(p, again);
            let label = inp.labels[r0 + t];
            slope_row(
                inp,
                (class0, norms),
                (label, row),
                p,
                term.view_mut(),
                &mut scratch,
            );
            // ∂loss/∂(raw product) = ∂loss/∂c / ‖w‖: the GEMMs take the raw weights.
            rescale(p, scale);
            // Subnormal weights flushed: the two GEMMs would take a microcode assist per
            // multiply-add with one on Intel cores, and they move nothing.
            flush_subnormal(p);
        });
    }
}

/// [`slope_rows`] for one row: `p` from its cosines to `∂loss/∂c` per centre.
fn slope_row(
    inp: &Inputs<'_>,
    tile: (usize, &[f64]),
    (label, row): (usize, &mut Row),
    p: &mut [f32],
    mut term: ndarray::ArrayViewMut1<'_, f32>,
    (z, e, slopes, row_slopes): &mut (Vec<f32>, Vec<f32>, Vec<f64>, Vec<f32>),
) {
    let rule = &inp.rule;
    let per = rule.centres.per_class();
    let target = logits(inp, tile, (label, row), p, z, (slopes, row_slopes));
    let a = if rule.row_norm { row.norm } else { 1.0 };
    let target = target.map(|(j, c, b)| {
        let (zt, slope) = rule.target(c, a, b);
        z[j] = zt as f32;
        (j, slope)
    });
    exp_shifted(z, row.lse as f32, e);
    let w = row.weight as f32;
    // Off the target: ∂L/∂z = w p, and ∂z/∂c = k b.
    if per == 1 && rule.col_norm {
        for ((p, &e), &nw) in p.iter_mut().zip(e.iter()).zip(tile.1) {
            *p = w * e * row.k * nw as f32;
        }
    } else if per == 1 {
        for (p, &e) in p.iter_mut().zip(e.iter()) {
            *p = w * e * row.k;
        }
    }
    if rule.row_norm || rule.col_norm {
        let mut through = 0.0f64;
        for (j, (&e, &z)) in e.iter().zip(z.iter()).enumerate() {
            let v = w * e * z;
            through += f64::from(v);
            // Kept per class only where the classes' norms need it.
            if let Some(term) = term.get_mut(j) {
                *term = v;
            }
        }
        row.through_norm += through;
    }
    if let Some((j, _)) = target {
        // The target's own `− w`.
        e[j] -= 1.0;
        if rule.row_norm || rule.col_norm {
            let minus = w * z[j];
            if let Some(term) = term.get_mut(j) {
                *term -= minus;
            }
            row.through_norm -= f64::from(minus);
        }
    }
    if per > 1 {
        // ∂L/∂c = w (p − [target]) k, then through the class's centres.
        for (j, cs) in p.chunks_exact_mut(per).enumerate() {
            let g = match target {
                Some((t, slope)) if t == j => f64::from(w * e[j]) * slope,
                _ => f64::from(w * e[j]) * f64::from(row.k),
            };
            // SoftTriple's slopes come from `logits` (empty for the others).
            let soft = row_slopes.get(j * per..(j + 1) * per).unwrap_or_default();
            rule.centres.spread(cs, g, soft);
        }
    } else if let Some((j, slope)) = target {
        p[j] = (f64::from(w * e[j]) * slope) as f32;
    }
}

/// A tile's centres' gradient `out` `(d, n)`, holding `∂loss/∂ŵ` over each centre's norm,
/// taken on through the normalisation (and the norm, where the logit has it); `w` the tile's
/// weights, `norms` theirs, `through` the logits' `Σ_i ∂loss/∂z · z` per centre.
fn finish_cols(
    w: ArrayView2<'_, f32>,
    (norms, through): (&[f64], Option<&[f64]>),
    mut out: ArrayViewMut2<'_, f32>,
) {
    // ∂/∂w = g/‖w‖ − (g/‖w‖ · w) w/‖w‖² + (Σ ∂z · z / ‖w‖²) w, the first term already in `out`.
    let dots = col_sums(out.view(), w);
    let coef: ndarray::Array1<f64> = norms
        .iter()
        .enumerate()
        .map(|(k, &n)| {
            if n < NORM_EPS {
                // Under PML's floor the normalisation is a plain scaling.
                return 0.0;
            }
            let along = through.map_or(0.0, |t| t[k]);
            (along - dots[k]) / (n * n)
        })
        .collect();
    // In f64: the two terms cancel where the gradient is (nearly) along `w` (exactly, at
    // d = 1), and f32 would leave the rounding of the first as the answer.
    ndarray::Zip::from(&mut out)
        .and(&w)
        .and_broadcast(&coef)
        .for_each(|o, &w, &c| *o = (f64::from(*o) + c * f64::from(w)) as f32);
}

/// The rows' gradient, from `∂loss/∂x̂` in `gx` (replaced in place).
pub(super) fn finish_rows(inp: &Inputs<'_>, rows: &[Row], mut gx: ArrayViewMut2<'_, f32>) {
    // The rows' backward is the centres' on the transposed views, once `∂loss/∂x̂` is over
    // each row's norm as `∂loss/∂ŵ` arrives.
    let norms: Vec<f64> = rows.iter().map(|r| r.norm).collect();
    let through: Vec<f64> = rows.iter().map(|r| r.through_norm).collect();
    for (mut g, &s) in gx.rows_mut().into_iter().zip(&inverse_norms(&norms)) {
        g *= s;
    }
    let through = inp.rule.row_norm.then_some(&through[..]);
    finish_tile(inp.x.t(), (&norms, through), gx.reversed_axes());
}

widest! {
    /// `e = exp(z − shift)` (arguments at most 1), compiled for the widest vectors the CPU has.
    fn exp_shifted(z: &[f32], shift: f32, e: &mut [f32]) {
        exp_plain(z, shift, e);
    }
}

#[inline(always)]
fn exp_plain(z: &[f32], shift: f32, e: &mut [f32]) {
    for (e, &z) in e.iter_mut().zip(z) {
        *e = exp_bounded(z - shift);
    }
}
