//! IntraPairVarianceLoss on a similarity that is linear in each row (cosine, dot product) in
//! one distance pass instead of three.
//!
//! `Σ` over the positive pairs of `s_aj = q̂_a · r̂_j` is `Σ_c Q_c · C_c` less each query's own
//! slot, with `Q_c`, `C_c` the sums of class `c`'s normalised query and reference rows; over
//! the negative pairs it is `Q · R − Σ_c Q_c · C_c` (`Q`, `R` the sums of all rows). So the
//! two means come from `O((b + m) d)` sums, not from a pass over the distances. Then one pass
//! takes each pair's hinge `r`, adds its own term `2 α r / K` to the weights and sums the
//! hinges; the means' own term, `2 β R / K²` on every pair of a group, is the gradient of the
//! group's similarity sum, which the same class sums give: `kp (C_{l(a)} − own) + kn (R −
//! C_{l(a)})` for query `a`, the transposed sums for reference `j`; added to the driver's
//! gradient through the normalisation.

use std::sync::Mutex;

use ndarray::{Array2, ArrayView1, ArrayView2};

use super::backward::through_normalization;
use super::driver::{self, Job, Mode, Output};
use super::hat;
use super::info_nce::pair_counts;
use super::pair_params::IntraPairVariance;
use super::scratch::{Scratch, Shared, Totals};
use crate::context::Context;
use crate::data::inputs::NO_SLOT;
use crate::error::{Error, Result};
use crate::runtime::memory::HostReservation;

/// Per class, the f64 sums of rows `x` `(n, d)` with labels `labels` over `classes` ids.
fn class_sums(x: ArrayView2<'_, f32>, labels: &[u32], classes: usize) -> Array2<f64> {
    let mut sums = Array2::<f64>::zeros((classes, x.ncols()));
    for (row, &l) in x.rows().into_iter().zip(labels) {
        let mut s = sums.row_mut(l as usize);
        s.zip_mut_with(&row, |a, &v| *a += f64::from(v));
    }
    sums
}

/// The label of what the call holds beside the driver's blocks.
const HELD: &str = "intra pair variance rows and class sums";

/// Class ids of the call's labels: one more than the largest.
fn classes(job: &Job<'_>) -> usize {
    let set = job.set;
    let largest = set.labels.iter().chain(&set.ref_labels).copied().max();
    1 + largest.unwrap_or(0) as usize
}

/// Bytes the call holds beside the driver's blocks: the normalised rows and their gradients,
/// the read-back copies, the class sums.
///
/// # Errors
/// As [`Job::sides`].
pub(super) fn held_bytes(job: &Job<'_>) -> Result<u64> {
    let (queries, refs) = job.sides()?;
    let ((b, d), m) = (queries.dim(), refs.dim().0);
    let sums = 16 * (classes(job) * d) as u64;
    Ok(8 * ((b + m) * d) as u64 + job.read_back_bytes()? + sums)
}

/// Whether the call takes this module's one pass: a similarity linear in each row.
pub(super) fn applies(job: &Job<'_>) -> bool {
    matches!(
        job.distance.distance,
        crate::metric::Distance::Cosine | crate::metric::Distance::DotProduct
    )
}

/// The loss, what its mean divides by, and the gradients over `job` (module docs).
///
/// # Errors
/// As the driver's; [`Error::OverBudget`] when the rows and sums do not fit.
pub(super) fn intra_pair_variance(
    ctx: &Context,
    job: &Job<'_>,
    c: IntraPairVariance,
) -> Result<(f64, u64, Output)> {
    let set = job.set;
    let (queries, refs) = job.sides()?;
    let ((b, d), m) = (queries.dim(), refs.dim().0);
    let classes = classes(job);
    let ref_role = job.refs_are_queries || job.ref_grad;
    let _held = HostReservation::new(HELD, held_bytes(job)?, ctx.tracker())?;
    let (q, r_own) = job.host_sides(ctx)?;
    let q = q.view();
    let r = r_own.as_ref().map_or(q, |r| r.view());
    let q_hat = hat(q, &job.distance);
    let r_hat_own = (!job.refs_are_queries).then(|| hat(r, &job.distance));
    let r_hat = r_hat_own.as_ref().map_or(q_hat.view(), |x| x.view());
    let big_q = class_sums(q_hat.view(), &set.labels, classes);
    let big_c = class_sums(r_hat, &set.ref_labels, classes);
    let (q_all, r_all) = (
        big_q.sum_axis(ndarray::Axis(0)),
        big_c.sum_axis(ndarray::Axis(0)),
    );
    // Each query's own slot, where it is among its positives.
    let own = |a: usize| {
        let slot = set.self_slots[a];
        (slot != NO_SLOT && set.ref_labels.get(slot as usize) == Some(&set.labels[a]))
            .then_some(slot as usize)
    };
    let within: f64 = (0..classes).map(|k| big_q.row(k).dot(&big_c.row(k))).sum();
    let own_sum: f64 = (0..b)
        .filter_map(|a| own(a).map(|j| q_hat.row(a).dot(&r_hat.row(j))))
        .map(f64::from)
        .sum();
    let (np, nn) = pair_counts(set);
    let mean = |sum: f64, n: u64| if n == 0 { 0.0 } else { sum / n as f64 };
    let mu = [
        mean(within - own_sum, np),
        mean(q_all.dot(&r_all) - within, nn),
    ];
    let (ep, en) = (f64::from(c.pos_eps), f64::from(c.neg_eps));
    // (α, β) of `v = α s + β μ` for similarities.
    let gaps = [(-1.0, 1.0 - ep), (1.0, -(1.0 + en))];
    let relu = |group: usize, d: f32| {
        let (alpha, beta) = gaps[group];
        (alpha * f64::from(d) + beta * mu[group]).max(0.0)
    };
    let hinges = Mutex::new((0.0f64, 0.0f64));
    let (kp, kn) = (2.0 / np.max(1) as f64, 2.0 / nn.max(1) as f64);
    let pass = |a: usize, dist: ArrayView1<'_, f32>, s: &mut Scratch, _: &Shared<'_>| {
        s.lists(set, a);
        let (mut loss, mut sums) = (0.0, (0.0, 0.0));
        for &j in &s.positives {
            let r = relu(0, dist[j as usize]);
            loss += r * r / np as f64;
            sums.0 += r;
            s.weights[j as usize] = kp * gaps[0].0 * r;
        }
        for &j in &s.negatives {
            let r = relu(1, dist[j as usize]);
            loss += r * r / nn as f64;
            sums.1 += r;
            s.weights[j as usize] = kn * gaps[1].0 * r;
        }
        if let Ok(mut h) = hinges.lock() {
            h.0 += sums.0;
            h.1 += sums.1;
        }
        Totals {
            loss,
            ..Totals::default()
        }
    };
    let mut out = driver::run_as(ctx, job, &pass, Mode::Sum)?;
    let (rp, rn) = hinges.into_inner().map_err(|_| Error::Internal {
        op: job.op,
        message: "an intra pair variance pass panicked".into(),
    })?;
    // Every pair of a group gets `2 β R / K²` more: the gradient of the group's sum.
    let (wp, wn) = (kp * gaps[0].1 * mean(rp, np), kn * gaps[1].1 * mean(rn, nn));
    let mut g_q = Array2::<f32>::zeros((b, d));
    for (a, mut g) in g_q.rows_mut().into_iter().enumerate() {
        let k = set.labels[a] as usize;
        for (t, v) in g.iter_mut().enumerate() {
            let same = big_c[[k, t]] - own(a).map_or(0.0, |j| f64::from(r_hat[[j, t]]));
            *v = (wp * same + wn * (r_all[t] - big_c[[k, t]])) as f32;
        }
    }
    let normalizes = job.distance.normalizes();
    if ref_role {
        let mut g_r = Array2::<f32>::zeros((m, d));
        for (j, mut g) in g_r.rows_mut().into_iter().enumerate() {
            let k = set.ref_labels[j] as usize;
            for (t, v) in g.iter_mut().enumerate() {
                *v = (wp * big_q[[k, t]] + wn * (q_all[t] - big_q[[k, t]])) as f32;
            }
        }
        for a in 0..b {
            if let Some(j) = own(a) {
                let mut g = g_r.row_mut(j);
                g.scaled_add(-(wp as f32), &q_hat.row(a));
            }
        }
        if job.refs_are_queries {
            g_q += &g_r;
        } else if let Some(out_r) = out.ref_grad.as_mut() {
            through_normalization(&mut g_r, r, normalizes, 1.0);
            *out_r += &g_r;
        }
    }
    through_normalization(&mut g_q, q, normalizes, 1.0);
    out.query_grad += &g_q;
    Ok((out.totals.loss, np + nn, out))
}
