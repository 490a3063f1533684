//! The one loop every loss runs: anchors in blocks under the budget; per block the distance
//! rows (as the miners compute them), each turned by the loss into its row of weights
//! `W = ∂L/∂D` in place, then the block's two gradient products ([`super::backward`]); the
//! threads' part of a block is [`super::block`].
//!
//! Two shortcuts where every anchor fits one block: a loss whose rule needs a forward pass
//! first (Contrastive's divisors) runs both passes on one computation of the distances
//! ([`run_after`]), and rows that are their own references take both sides of the gradient
//! in one product, `(U + Uᵀ) x̂` ([`add_both_sides`]).

use ndarray::{s, Array2, ArrayView2};

use super::backward::{add_both_sides, add_ref_side, through_normalization};
use super::block::{Fresh, Pass};
use super::scratch::{AnchorRule, RefPairs, Scratch, Shared, Totals, NEAR_PAIR_BYTES};
use super::{hat, host_refs, host_rows};
use crate::context::plan::Plan;
use crate::context::{ComputePath, Context};
use crate::data::inputs::{self, Embeddings, Labelled, Rows};
use crate::error::{Error, Result};
use crate::hooks::{Hooks, Reporter};
use crate::metric::DistanceConfig;
use crate::ops::distance::native::normalized;
use crate::ops::distance::native::{is_direct, read_config, Norms};
use crate::runtime::memory::HostReservation;
use crate::runtime::pool::{threads, workers_within};

/// What a loss call asks of the loop.
pub(super) struct Job<'a> {
    pub(super) op: &'static str,
    pub(super) label: &'static str,
    pub(super) set: &'a Labelled<'a>,
    /// No references were given: the queries play both roles.
    pub(super) refs_are_queries: bool,
    pub(super) distance: DistanceConfig,
    pub(super) ref_grad: bool,
    /// The rule scores pairs of references too: every thread gets a [`RefPairs`].
    pub(super) ref_pairs: bool,
    /// PML's `SNRDistance` in place of `distance` (which is then squared Euclidean on raw
    /// rows), on normalised rows when `Some(true)`: the rows centred (`u = x − mean(x)`) and
    /// `D = |u_q − u_r|² / |u_q|²`, the ratio of the variances (module docs of
    /// [`super::pair`]).
    pub(super) snr: Option<bool>,
    pub(super) hooks: &'a Hooks,
}

impl<'a> Job<'a> {
    /// The call's queries and references (imported: never device buffers).
    ///
    /// # Errors
    /// [`Error::Internal`] when a side was not imported.
    pub(super) fn sides(&self) -> Result<(&'a Rows<'a>, Embeddings<'a>)> {
        let queries = self.set.queries.as_ref();
        let queries = queries.ok_or_else(|| inputs::unimported(self.op))?;
        let refs = self.set.refs.ok_or_else(|| inputs::unimported(self.op))?;
        Ok((queries, refs))
    }

    /// Bytes [`Job::host_sides`] allocates: host copies of the device-resident rows.
    ///
    /// # Errors
    /// As [`Job::sides`].
    pub(super) fn read_back_bytes(&self) -> Result<u64> {
        let (queries, refs) = self.sides()?;
        let ((b, d), m) = (queries.dim(), refs.dim().0);
        let floats = |rows: usize| 4 * (rows * d) as u64;
        let resident_refs = !self.refs_are_queries && !matches!(refs, Embeddings::Host(_));
        let queries = if matches!(queries, Rows::Resident(_)) {
            floats(b)
        } else {
            0
        };
        Ok(queries + if resident_refs { floats(m) } else { 0 })
    }

    /// Both sides as host arrays (device-resident rows read back), and `None` for the
    /// references when they are the queries.
    ///
    /// # Errors
    /// As [`Job::sides`], or a failed read-back.
    pub(super) fn host_sides(&self, ctx: &Context) -> Result<(HostRows<'a>, Option<HostRows<'a>>)> {
        let (queries, refs) = self.sides()?;
        let q = host_rows(self.op, ctx, queries.reborrow())?;
        // The references are the queries' rows when not given: read back once.
        let r = match self.refs_are_queries {
            true => None,
            false => Some(host_refs(self.op, ctx, refs)?),
        };
        Ok((q, r))
    }
}

/// Rows on the host, borrowed or read back.
pub(super) type HostRows<'a> = ndarray::CowArray<'a, f32, ndarray::Ix2>;

/// `x` `(n, d)` as the job's distances and products read it: normalised where the distance
/// normalises ([`hat`]); for [`Job::snr`] normalised if asked, then each row centred.
fn rows_of(x: ArrayView2<'_, f32>, job: &Job<'_>) -> Array2<f32> {
    let Some(normalize) = job.snr else {
        return hat(x, &job.distance);
    };
    let mut u = if normalize {
        normalized(x)
    } else {
        x.to_owned()
    };
    for mut row in u.rows_mut() {
        let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / row.len().max(1) as f64;
        row.mapv_inplace(|v| (f64::from(v) - mean) as f32);
    }
    u
}

/// The loss sums and the gradients: the queries' `(b, d)` (both roles when they are the
/// references), the references' `(m, d)` when asked for and given.
pub(super) struct Output {
    pub(super) totals: Totals,
    pub(super) query_grad: Array2<f32>,
    pub(super) ref_grad: Option<Array2<f32>>,
}

/// The most a block's per-anchor rows take in the InfoNCE pass of
/// [`super::matryoshka`], unless that leaves a thread fewer than 16 anchors
/// ([`Sizing::within`]): larger blocks were no faster there (its rows' passes run out of
/// cache) and only raised the call's peak memory. The driver's own rules keep blocks up to
/// the budget: capped at this, FastAP at 4 096 rows and Contrastive against 16 384 references
/// held less (655 against 704 MiB) but took 5–10 % longer, within this machine's noise.
pub(super) const BLOCK_BYTES: u64 = 64 << 20;

/// How [`run`] sizes a call within the budget: what it holds whatever the blocks (`base`),
/// per thread (`scratch`) and per anchor of a block (`per_row`), and the threads and block
/// rows that fit.
pub(super) struct Sizing {
    base: u64,
    scratch: u64,
    per_row: u64,
    pub(super) threads: usize,
    pub(super) rows: usize,
}

impl Sizing {
    /// The sizes of `job` under the context's available memory.
    ///
    /// # Errors
    /// [`Error::OverBudget`] when one thread with a one-anchor block does not fit.
    pub(super) fn new(ctx: &Context, job: &Job<'_>) -> Result<Self> {
        let op = job.op;
        let (queries, refs) = job.sides()?;
        let ((b, d), m) = (queries.dim(), refs.dim().0);
        // The references' gradient is needed for the caller, or for the queries' own when
        // they are the references.
        let ref_role = job.refs_are_queries || job.ref_grad;
        let floats = |rows: usize| 4 * (rows * d) as u64;
        // Host copies of device-resident rows (read back), the normalised copies, the
        // gradients, every thread's scratch; per block row its distances and at most `m`
        // near pairs.
        let base = job.read_back_bytes()?
            + floats(b) * 2
            + if job.refs_are_queries { 0 } else { floats(m) }
            + if ref_role { floats(m) } else { 0 };
        let pairs = job
            .ref_pairs
            .then(|| RefPairs::bytes(m as u64, d as u64, ref_role));
        let scratch = Scratch::bytes(m as u64) + pairs.unwrap_or(0);
        // Per block row: its distances, its possible near pairs, its place in its thread's
        // order by label and (SNR) its scale's derivative.
        let per_row = (4 + NEAR_PAIR_BYTES) * m as u64 + 16;
        Self::within(ctx, op, (base, scratch, per_row), b, u64::MAX)
    }

    /// The threads and block rows of a call of `b` anchors that holds `base` bytes whatever
    /// the blocks, `scratch` per thread and `per_row` per anchor of a block, its blocks at
    /// most `cap` bytes (unless that leaves a thread fewer than 16 anchors).
    ///
    /// # Errors
    /// [`Error::OverBudget`] when one thread with a one-anchor block does not fit.
    pub(super) fn within(
        ctx: &Context,
        op: &'static str,
        (base, scratch, per_row): (u64, u64, u64),
        b: usize,
        cap: u64,
    ) -> Result<Self> {
        fits(ctx, op, base + scratch + per_row)?;
        let available = ctx.tracker().available();
        // A thread per core, or as many as the budget gives a scratch and a block row each.
        let threads = workers_within(threads(), scratch + per_row, available.saturating_sub(base));
        let room = available.saturating_sub(base + threads as u64 * scratch);
        let room = room.min(cap.max(threads as u64 * 16 * per_row));
        let rows = usize::try_from(room.checked_div(per_row).unwrap_or(u64::MAX))
            .unwrap_or(usize::MAX)
            .clamp(1, b.max(1));
        // As many blocks, of even sizes: no short last block that repeats every per-block
        // cost (the references' packing and their gradient's pass) for a few rows.
        let rows = b.max(1).div_ceil(b.max(1).div_ceil(rows));
        Ok(Self {
            base,
            scratch,
            per_row,
            threads,
            rows,
        })
    }

    /// Bytes held with this sizing.
    pub(super) fn bytes(&self) -> u64 {
        self.base + self.threads as u64 * self.scratch + self.rows as u64 * self.per_row
    }

    /// The plan of a call of `b` anchors against `m` references.
    pub(super) fn plan(&self, b: usize, m: usize) -> Plan {
        Plan {
            path: ComputePath::NativeCpu,
            rows: self.rows,
            cols: m,
            chunks: b.div_ceil(self.rows),
            bytes: self.bytes(),
            min_bytes: self.base + self.scratch + self.per_row,
        }
    }
}

/// [`Error::OverBudget`] unless `bytes` fit what the context has left: what a call already
/// holds (a loss's state between passes) counts too.
pub(super) fn fits(ctx: &Context, op: &'static str, bytes: u64) -> Result<()> {
    let budget = ctx.tracker().stats().budget_bytes;
    let available = ctx.tracker().available();
    if bytes > available {
        return Err(Error::OverBudget {
            op,
            required: bytes + budget.saturating_sub(available),
            budget,
        });
    }
    Ok(())
}

/// What [`run_as`] does with the rule's weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Gradients, divided by [`Totals::count`] (the mean).
    Mean,
    /// Gradients as the rule's weights give them: the rule applied the reduction itself.
    Sum,
    /// Only the rule's sums: no weights taken back, the gradients left zero (a first pass
    /// that counts what a second pass divides by).
    Forward,
}

/// Runs `rule` over every anchor of `job.set` and takes the gradients back to the embeddings;
/// the mean's division (by [`Totals::count`]) is applied to the gradients here.
pub(super) fn run(ctx: &Context, job: &Job<'_>, rule: &AnchorRule<'_>) -> Result<Output> {
    run_as(ctx, job, rule, Mode::Mean)
}

/// [`run`], with the weights used as `mode` says.
pub(super) fn run_as(
    ctx: &Context,
    job: &Job<'_>,
    rule: &AnchorRule<'_>,
    mode: Mode,
) -> Result<Output> {
    let then = |_: Totals| -> Box<AnchorRule<'_>> { Box::new(|a, d, s, sh| rule(a, d, s, sh)) };
    Ok(run_after(ctx, job, None, &then, mode)?.1)
}

/// The rule `then` makes from the sums of a forward pass of `first` (its sums only, no
/// gradient), run as [`run_as`] runs a rule; returns the first pass's sums too. When every
/// anchor fits one block, both passes read one computation of the distances: the forward
/// pass then costs its rule alone. Without `first`, `then` gets zero sums.
pub(super) fn run_after<'r>(
    ctx: &Context,
    job: &Job<'_>,
    first: Option<&AnchorRule<'_>>,
    then: &dyn Fn(Totals) -> Box<AnchorRule<'r>>,
    mode: Mode,
) -> Result<(Totals, Output)> {
    let (queries, refs) = job.sides()?;
    let ((b, d), m) = (queries.dim(), refs.dim().0);
    let report = Reporter::new(job.hooks, job.op, b as u64 * m as u64);
    report.check()?;
    let ref_role = job.refs_are_queries || job.ref_grad;
    let sizing = Sizing::new(ctx, job)?;
    let (threads, rows) = (sizing.threads, sizing.rows);
    let _held = HostReservation::new(job.label, sizing.bytes(), ctx.tracker())?;
    let (q, r_own) = job.host_sides(ctx)?;
    let q = q.view();
    let r = r_own.as_ref().map_or(q, |r| r.view());

    // Every distance and product reads the rows as torch's normalisation makes them
    // (see `ops::distance::native`); the raw rows are for the normalisation's backward.
    let distance = read_config(&job.distance);
    let q_hat = rows_of(q, job);
    let r_hat_own = (!job.refs_are_queries).then(|| rows_of(r, job));
    let r_hat = r_hat_own.as_ref().map_or(q_hat.view(), |x| x.view());
    let q_norms = Norms::new(q_hat.view(), &distance);
    if job.snr.is_some() {
        if let Some(row) = q_norms.sq.iter().position(|&v| v.is_nan() || v <= 0.0) {
            return Err(Error::InvalidParameter {
                op: job.op,
                what: "embeddings",
                value: format!("row {row}"),
                rule:
                    "must vary: the signal-to-noise distance divides by each query row's variance",
            });
        }
    }
    let r_norms = Norms::new(r_hat, &distance).direct(is_direct(b, m));
    let shared = Shared {
        distance,
        snr: job.snr.is_some(),
        q_hat: q_hat.view(),
        r_hat,
        q_norms: &q_norms,
        r_norms: &r_norms,
        labels: &job.set.labels,
    };
    let mut g_q = Array2::<f32>::zeros((b, d));
    let mut g_r = ref_role.then(|| Array2::<f32>::zeros((m, d)));
    let mut block = Array2::<f32>::zeros((rows, m));
    // Each thread's scratch, kept from block to block; the gradient its reference pairs
    // gather is added to the references' once, after the last block.
    let mut scratches: Vec<Scratch> = (0..threads)
        .map(|_| Scratch::new(m, job.ref_pairs.then(|| RefPairs::new(m, d, ref_role))))
        .collect();
    // A forward pass over blocks of its own, unless one block holds every anchor. One
    // block of rows that are their own references (and `n × n`, hence square) takes both
    // sides of the gradient in one product ([`add_both_sides`]).
    let one_block = rows >= b;
    let both = one_block && job.refs_are_queries && m == b;
    let mut pass = Pass {
        shared: &shared,
        report: &report,
        threads,
        scratches: &mut scratches,
        both,
    };
    let mut counted = Totals::default();
    let mut second = None;
    if let (Some(first), false) = (first, one_block) {
        for c0 in (0..b).step_by(rows) {
            report.check()?;
            let c1 = (c0 + rows).min(b);
            let u = block.slice_mut(s![..c1 - c0, ..]);
            let g = g_q.slice_mut(s![c0..c1, ..]);
            counted.add(pass.block(first, Fresh::Distances, c0, (u, g)).0);
        }
        report.check()?;
        second = Some(then(counted));
    }
    let mut totals = Totals::default();
    for c0 in (0..b).step_by(rows) {
        report.check()?;
        let c1 = (c0 + rows).min(b);
        let mut u = block.slice_mut(s![..c1 - c0, ..]);
        let mut g = g_q.slice_mut(s![c0..c1, ..]);
        let fresh = match mode {
            Mode::Forward => Fresh::Distances,
            _ => Fresh::Gradient,
        };
        let (parts, near) = match (second.as_ref(), first) {
            (Some(rule), _) => pass.block(rule.as_ref(), fresh, c0, (u, g)),
            // The first block makes the rule; with one block and a forward pass, that pass
            // runs here and the rule reuses its distances.
            (None, first) => {
                let mut fresh = fresh;
                if let Some(first) = first {
                    let view = (u.view_mut(), g.view_mut());
                    counted = pass.block(first, Fresh::Distances, c0, view).0;
                    report.check()?;
                    fresh = match mode {
                        Mode::Forward => Fresh::Forward,
                        _ => Fresh::Reused,
                    };
                }
                let rule = second.insert(then(counted));
                pass.block(rule.as_ref(), fresh, c0, (u, g))
            }
        };
        totals.add(parts);
        report.check()?;
        if mode == Mode::Forward {
            continue;
        }
        if let Some(g_r) = g_r.as_mut() {
            if both {
                // The rows are their own references: both sides at once, after the block.
                add_both_sides(
                    distance.distance,
                    block.slice_mut(s![..b, ..b]),
                    q_hat.view(),
                    g_q.view_mut(),
                );
            } else {
                add_ref_side(
                    distance.distance,
                    block.slice(s![..c1 - c0, ..]),
                    q_hat.slice(s![c0..c1, ..]),
                    r_hat,
                    g_r.view_mut(),
                );
            }
            for &(a, j, w) in near.iter().flatten() {
                let j = j as usize;
                let mut g = g_r.row_mut(j);
                g.scaled_add(w, &r_hat.row(j));
                g.scaled_add(-w, &q_hat.row(a));
            }
        }
    }
    if let Some(g_r) = g_r.as_mut() {
        for g in scratches
            .iter()
            .filter_map(|s| s.pairs.as_ref()?.grad.as_ref())
        {
            *g_r += g;
        }
    }
    let factor = match (mode, totals.count) {
        (Mode::Mean, 0) | (Mode::Forward, _) => 0.0,
        (Mode::Mean, count) => (1.0 / count as f64) as f32,
        (Mode::Sum, _) => 1.0,
    };
    let out = finish_scaled(job, totals, (g_q, g_r), (q, r), factor);
    Ok((counted, out))
}

/// The gradients multiplied by `factor` (the mean's division, or the rule's own) and the
/// normalisation's backward of the gradients with respect to the
/// normalised rows, `g_q` `(b, d)` and `g_r` `(m, d)` (when a gradient goes to the
/// references), from the raw rows `q` and `r`; with the queries as references both roles are
/// one row's.
pub(super) fn finish_scaled(
    job: &Job<'_>,
    totals: Totals,
    (mut g_q, g_r): (Array2<f32>, Option<Array2<f32>>),
    (q, r): (ArrayView2<'_, f32>, ArrayView2<'_, f32>),
    factor: f32,
) -> Output {
    let normalizes = job.snr.unwrap_or(job.distance.normalizes());
    let back = |g: &mut Array2<f32>, x: ArrayView2<'_, f32>| {
        if job.snr.is_some() {
            // Through the centring: each row's gradient less its mean.
            for mut row in g.rows_mut() {
                let mean = row.sum() / row.len().max(1) as f32;
                row -= mean;
            }
        }
        through_normalization(g, x, normalizes, factor);
    };
    if job.refs_are_queries {
        if let Some(g_r) = &g_r {
            g_q += g_r;
        }
        back(&mut g_q, q);
        return Output {
            totals,
            query_grad: g_q,
            ref_grad: None,
        };
    }
    back(&mut g_q, q);
    let ref_grad = g_r.map(|mut g| {
        back(&mut g, r);
        g
    });
    Output {
        totals,
        query_grad: g_q,
        ref_grad,
    }
}
