//! One block of anchors split over the threads ([`Pass`]): each thread's distance rows
//! (unless a forward pass left them), the loss's rule on each anchor's row in order of
//! label, the weights turned into `U` ([`weights_to_u`]) and the anchors' side of the
//! gradient products.

use ndarray::{s, ArrayViewMut2, Axis};

use super::backward::query_side;
use super::scratch::{weights_to_u, AnchorRule, NearPair, Scratch, Shared, Totals};
use crate::hooks::Reporter;
use crate::ops::distance::native::distances_into;

/// What a block's pass computes besides its rule: its distances or not, its gradient or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fresh {
    /// The distances, and the rule's sums only.
    Distances,
    /// The distances, the rule's weights and the gradient.
    Gradient,
    /// The rule's sums on the distances a forward pass left.
    Forward,
    /// The weights and the gradient on the distances a forward pass left.
    Reused,
}

impl Fresh {
    fn distances(self) -> bool {
        matches!(self, Fresh::Distances | Fresh::Gradient)
    }

    fn forward(self) -> bool {
        matches!(self, Fresh::Distances | Fresh::Forward)
    }
}

/// The threads of one call's blocks: the rows they read, the call's progress, and each
/// thread's scratch.
pub(super) struct Pass<'p, 's> {
    pub(super) shared: &'p Shared<'s>,
    pub(super) report: &'p Reporter<'p>,
    pub(super) threads: usize,
    pub(super) scratches: &'p mut [Scratch],
    /// The caller takes both sides of the gradient after the block: the threads leave
    /// [`query_side`] out.
    pub(super) both: bool,
}

impl Pass<'_, '_> {
    /// The anchors `a0 ..` of one block (`u` its distance rows, `g` its gradient rows) split
    /// over the threads ([`block_weights`]): their sums, and each thread's near pairs.
    pub(super) fn block(
        &mut self,
        rule: &AnchorRule<'_>,
        fresh: Fresh,
        a0: usize,
        (mut u, mut g): (ArrayViewMut2<'_, f32>, ArrayViewMut2<'_, f32>),
    ) -> (Totals, Vec<Vec<NearPair>>) {
        let per = u.nrows().div_ceil(self.threads).max(1);
        let (shared, report, both) = (self.shared, self.report, self.both);
        std::thread::scope(|scope| {
            let workers: Vec<_> = u
                .axis_chunks_iter_mut(Axis(0), per)
                .zip(g.axis_chunks_iter_mut(Axis(0), per))
                .zip(self.scratches.iter_mut())
                .enumerate()
                .map(|(t, ((u, g), scratch))| {
                    scope.spawn(move || {
                        let a0 = a0 + t * per;
                        let how = (rule, fresh, both);
                        block_weights(shared, how, a0, (u, g), scratch, report)
                    })
                })
                .collect();
            let mut parts = (Totals::default(), Vec::new());
            for w in workers {
                match w.join() {
                    Ok((t, near)) => {
                        parts.0.add(t);
                        // Kept per thread: no second copy of the pairs.
                        parts.1.push(near);
                    }
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            parts
        })
    }
}

/// One thread's anchors `a0 ..` of a block: their distance rows into `u` (from the rows as
/// [`Shared`] holds them and the references' norms) unless `fresh` reuses those a forward
/// pass left there, each turned into `U` by the loss's rule and [`weights_to_u`], then the
/// anchors' gradient rows `g`; returns the sums and the near pairs, whose query side is
/// already in `g` (reference pairs the rule scored gather their gradient in the thread's
/// `scratch`). A forward `fresh`: only the sums, `u` left as the distances. With `both`,
/// the anchors' products are left to the caller ([`super::backward::add_both_sides`]).
fn block_weights(
    shared: &Shared<'_>,
    (rule, fresh, both): (&AnchorRule<'_>, Fresh, bool),
    a0: usize,
    (mut u, mut g): (ArrayViewMut2<'_, f32>, ArrayViewMut2<'_, f32>),
    scratch: &mut Scratch,
    report: &Reporter<'_>,
) -> (Totals, Vec<NearPair>) {
    let n = u.nrows();
    let mut totals = Totals::default();
    let mut near = Vec::new();
    // SNR: `D = s |u_q − u_r|²` with `s = 1 / |u_q|²`; each row's `−2 s Σ_j W D` multiplies
    // its own row in the query's gradient (the derivative through `s`).
    let scale = |i: usize| {
        shared
            .snr
            .then(|| 1.0 / f64::from(shared.q_norms.sq[a0 + i]))
    };
    if fresh.distances() {
        let q = shared.q_hat.slice(s![a0..a0 + n, ..]);
        distances_into(
            q,
            shared.r_hat,
            shared.r_norms,
            &shared.distance,
            u.view_mut(),
        );
        for (i, mut row) in u.rows_mut().into_iter().enumerate() {
            if let Some(s) = scale(i) {
                row.mapv_inplace(|d| (f64::from(d) * s) as f32);
            }
        }
    }
    let m = u.ncols();
    let forward = fresh.forward();
    let mut through_scale = vec![0.0f64; if shared.snr { n } else { 0 }];
    // The anchors by label, so that those of one label share their lists.
    let mut order: Vec<usize> = (0..n).collect();
    if let Some(labels) = shared.labels.get(a0..a0 + n) {
        order.sort_by_key(|&i| labels[i]);
    }
    for i in order {
        let row = u.row_mut(i);
        if report.cancelled() {
            return (totals, near);
        }
        scratch.weights.fill(0.0);
        totals.add(rule(a0 + i, row.view(), scratch, shared));
        if forward {
            // A first pass reports no progress: the call's total is the second pass's.
            continue;
        }
        if let Some(s) = scale(i) {
            let wd: f64 = scratch
                .weights
                .iter()
                .zip(&row)
                .map(|(w, &d)| w * f64::from(d))
                .sum();
            through_scale[i] = -2.0 * s * wd;
            scratch.weights.iter_mut().for_each(|w| *w *= s);
        }
        let x = (a0 + i, shared.q_hat.row(a0 + i), shared.q_norms.sq[a0 + i]);
        weights_to_u(shared, x, row, &scratch.weights, (&mut near, n * m));
        report.add(m as u64);
    }
    if forward {
        return (totals, near);
    }
    let q_hat = shared.q_hat.slice(s![a0..a0 + n, ..]);
    let distance = shared.distance.distance;
    if !both {
        query_side(distance, u.view(), q_hat, shared.r_hat, g.view_mut());
    }
    for (i, &c) in through_scale.iter().enumerate() {
        g.row_mut(i).scaled_add(c as f32, &q_hat.row(i));
    }
    for &(a, j, w) in &near {
        let mut row = g.row_mut(a - a0);
        row.scaled_add(w, &shared.q_hat.row(a));
        row.scaled_add(-w, &shared.r_hat.row(j as usize));
    }
    (totals, near)
}
