//! The one loop every loss runs: anchors in blocks under the budget; per block the distance
//! rows (as the miners compute them), each turned by the loss into its row of weights
//! `W = ∂L/∂D` in place, then the block's two gradient products ([`super::backward`]).

use ndarray::{s, Array2, ArrayView1, ArrayView2, ArrayViewMut1, ArrayViewMut2, Axis};

use super::backward::{
    add_ref_side, pair_weight, query_side, ref_side_into, through_normalization,
};
use super::{hat, host_refs, host_rows};
use crate::context::plan::Plan;
use crate::context::{ComputePath, Context};
use crate::data::inputs::{self, Embeddings, Labelled, Rows};
use crate::error::{Error, Result};
use crate::hooks::{Hooks, Reporter};
use crate::metric::{Distance, DistanceConfig};
use crate::ops::distance::native::normalized;
use crate::ops::distance::native::{distances_into, is_direct, read_config, Norms};
use crate::runtime::memory::HostReservation;
use crate::runtime::pool::{threads, workers_within};

/// Sums over the anchors seen so far.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Totals {
    /// The sum of the losses that the mean is over.
    pub(super) loss: f64,
    /// The mean's divisor: the losses it averages (positive triplet losses, positive pairs).
    pub(super) count: u64,
    /// What the loss ran over (triplets, pairs), for the caller's information.
    pub(super) items: u64,
    /// A rule's own sum beside the loss (MarginLoss: `∂L/∂β` before the mean's division).
    pub(super) aux: f64,
}

impl Totals {
    pub(super) fn add(&mut self, other: Totals) {
        self.loss += other.loss;
        self.count += other.count;
        self.items += other.items;
        self.aux += other.aux;
    }

    /// The mean; 0 over nothing.
    pub(super) fn mean(&self) -> f32 {
        if self.count == 0 {
            0.0
        } else {
            (self.loss / self.count as f64) as f32
        }
    }
}

/// One thread's per-anchor scratch, reused from anchor to anchor; each loss uses what it needs.
pub(super) struct Scratch {
    pub(super) positives: Vec<u32>,
    pub(super) negatives: Vec<u32>,
    /// Negatives as (value, reference).
    pub(super) order: Vec<(f32, u32)>,
    pub(super) sorted: Vec<f32>,
    pub(super) prefix: Vec<f64>,
    pub(super) runs: Vec<i64>,
    /// `∂L/∂D` over the anchor's row (before the mean's division), which the loss fills.
    pub(super) weights: Vec<f64>,
    /// Pairs of references, for a rule that scores them too ([`Job::ref_pairs`]).
    pub(super) pairs: Option<RefPairs>,
}

impl Scratch {
    /// Bytes for `m` references.
    pub(super) fn bytes(m: u64) -> u64 {
        // `prefix` and `runs` hold `m + 1`.
        m * (4 + 4 + 8 + 4 + 8 + 8 + 8) + 16
    }

    fn new(m: usize, pairs: Option<RefPairs>) -> Self {
        Self {
            pairs,
            positives: Vec::with_capacity(m),
            negatives: Vec::with_capacity(m),
            order: Vec::with_capacity(m),
            sorted: Vec::with_capacity(m),
            prefix: Vec::with_capacity(m + 1),
            runs: Vec::with_capacity(m + 1),
            weights: vec![0.0; m],
        }
    }
}

/// A loss's rule for one anchor: from its index and distance row `(m,)`, fill
/// [`Scratch::weights`] (zeroed before) and return its sums; the rows are there for
/// [`RefPairs`].
pub(super) type AnchorRule<'r> =
    dyn Fn(usize, ArrayView1<'_, f32>, &mut Scratch, &Shared<'_>) -> Totals + Sync + 'r;

/// References a [`RefPairs`] scores at once against every reference.
pub(super) const PAIR_ROWS: usize = 32;

/// One thread's scratch for a rule that also scores pairs of references (the triplet loss's
/// swap, `d(r_p, r_n)`): the distances from up to [`PAIR_ROWS`] references to every
/// reference (computed as the anchors' rows are), the rule's weights `∂L/∂D` for them, and the
/// thread's gradient with respect to the normalised references from those pairs.
pub(super) struct RefPairs {
    /// The loaded references.
    rows: Vec<u32>,
    /// `(PAIR_ROWS, dim)` rows as the distances read them (normalised where they normalise).
    raw: Array2<f32>,
    /// `(PAIR_ROWS, m)` distances, then `U`.
    distances: Array2<f32>,
    /// With the gradient only: the rows normalised and their own gradient `(PAIR_ROWS, dim)`,
    /// and the `PAIR_ROWS · m` weights `∂L/∂D` (without, empty: nothing to take back).
    hat: Array2<f32>,
    own: Array2<f32>,
    weights: Vec<f64>,
    /// `(m, dim)`, when a gradient goes to the references.
    grad: Option<Array2<f32>>,
    near: Vec<NearPair>,
}

impl RefPairs {
    /// Bytes for `m` references of `dim` floats, with the gradient when `grad`.
    fn bytes(m: u64, dim: u64, grad: bool) -> u64 {
        let rows = PAIR_ROWS as u64;
        let gradient = 2 * rows * dim * 4 + rows * m * (8 + NEAR_PAIR_BYTES) + m * dim * 4;
        rows * 4 + rows * dim * 4 + rows * m * 4 + if grad { gradient } else { 0 }
    }

    fn new(m: usize, dim: usize, grad: bool) -> Self {
        let with_grad = if grad { PAIR_ROWS } else { 0 };
        Self {
            rows: Vec::with_capacity(PAIR_ROWS),
            raw: Array2::zeros((PAIR_ROWS, dim)),
            distances: Array2::zeros((PAIR_ROWS, m)),
            hat: Array2::zeros((with_grad, dim)),
            own: Array2::zeros((with_grad, dim)),
            weights: vec![0.0; with_grad * m],
            grad: grad.then(|| Array2::zeros((m, dim))),
            near: Vec::new(),
        }
    }

    /// Loads `rows` (at most [`PAIR_ROWS`] references): their distances to every reference,
    /// with zero weights.
    pub(super) fn load(&mut self, shared: &Shared<'_>, rows: &[u32]) {
        let (k, m) = (rows.len(), shared.r_hat.nrows());
        self.rows.clear();
        self.rows.extend_from_slice(rows);
        for (mut raw, &j) in self.raw.rows_mut().into_iter().zip(rows) {
            raw.assign(&shared.r_hat.row(j as usize));
        }
        distances_into(
            self.raw.slice(s![..k, ..]),
            shared.r_hat,
            shared.r_norms,
            &shared.distance,
            self.distances.slice_mut(s![..k, ..]),
        );
        if let Some(weights) = self.weights.get_mut(..k * m) {
            weights.fill(0.0);
        }
    }

    /// `D(r_{rows[i]}, r_j)` of the loaded rows.
    pub(super) fn distance(&self, i: usize, j: usize) -> f32 {
        self.distances[[i, j]]
    }

    /// Adds `w` to `∂L/∂D(r_{rows[i]}, r_j)` (nothing without the gradient).
    pub(super) fn add_weight(&mut self, i: usize, j: usize, w: f64) {
        let m = self.distances.ncols();
        if let Some(weight) = self.weights.get_mut(i * m + j) {
            *weight += w;
        }
    }

    /// Takes the loaded rows' weights through the distance into the thread's gradient (as
    /// the anchors' rows are: [`weights_to_u`], then both sides' products); nothing when no
    /// gradient goes to the references or every weight is 0.
    pub(super) fn flush(&mut self, shared: &Shared<'_>) {
        let (k, m) = (self.rows.len(), shared.r_hat.nrows());
        let Some(grad) = self.grad.as_mut() else {
            return;
        };
        if self.weights[..k * m].iter().all(|&w| w == 0.0) {
            return;
        }
        for (i, &p) in self.rows.iter().enumerate() {
            let p = p as usize;
            self.hat.row_mut(i).assign(&shared.r_hat.row(p));
            let weights = &self.weights[i * m..(i + 1) * m];
            let x = (p, shared.r_hat.row(p), shared.r_norms.sq[p]);
            let near = (&mut self.near, k * m);
            weights_to_u(shared, x, self.distances.row_mut(i), weights, near);
        }
        let distance = shared.distance.distance;
        let (u, hat) = (
            self.distances.slice(s![..k, ..]),
            self.hat.slice(s![..k, ..]),
        );
        ref_side_into(distance, u, hat, shared.r_hat, grad.view_mut());
        query_side(
            distance,
            u,
            hat,
            shared.r_hat,
            self.own.slice_mut(s![..k, ..]),
        );
        for (own, &p) in self.own.rows().into_iter().zip(&self.rows) {
            let mut g = grad.row_mut(p as usize);
            g += &own;
        }
        for &(p, j, w) in &self.near {
            let diff = &shared.r_hat.row(p) - &shared.r_hat.row(j as usize);
            grad.row_mut(p).scaled_add(w, &diff);
            grad.row_mut(j as usize).scaled_add(-w, &diff);
        }
        self.near.clear();
    }
}

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

/// Below this share of `|q̂|² + |r̂|²`, a squared Euclidean distance computed as
/// `|q̂|² + |r̂|² − 2 q̂·r̂` has lost most of its digits to cancellation (identical rows give
/// ~3e-4, not 0). Its pair's gradient `w (q̂ − r̂) / D` is then taken from the difference
/// itself, outside the matrix products, so that near-duplicates get the exact derivative (as
/// torch's `cdist` backward gives for small inputs; its matrix-product form, used past 25
/// rows, is as noisy there as the distance).
pub(super) const NEAR: f32 = 1e-3;

/// A pair whose gradient is taken directly: anchor, reference, and `w / |q̂ − r̂|`.
type NearPair = (usize, u32, f32);

/// Bytes of one [`NearPair`], counted per possible pair of a block (collapsed embeddings
/// make every pair near).
const NEAR_PAIR_BYTES: u64 = std::mem::size_of::<NearPair>() as u64;

/// The rows every block reads, normalised as torch normalises them where the distance
/// normalises ([`crate::ops::distance::native`]), and their norms.
pub(super) struct Shared<'a> {
    distance: DistanceConfig,
    /// [`Job::snr`]: each query row's distances divided by its squared norm.
    snr: bool,
    q_hat: ArrayView2<'a, f32>,
    r_hat: ArrayView2<'a, f32>,
    q_norms: &'a Norms,
    r_norms: &'a Norms,
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
        let per_row = (4 + NEAR_PAIR_BYTES) * m as u64;
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
    };
    let mut g_q = Array2::<f32>::zeros((b, d));
    let mut g_r = ref_role.then(|| Array2::<f32>::zeros((m, d)));
    let mut totals = Totals::default();
    let mut block = Array2::<f32>::zeros((rows, m));
    // Each thread's scratch, kept from block to block; the gradient its reference pairs
    // gather is added to the references' once, after the last block.
    let mut scratches: Vec<Scratch> = (0..threads)
        .map(|_| Scratch::new(m, job.ref_pairs.then(|| RefPairs::new(m, d, ref_role))))
        .collect();
    for c0 in (0..b).step_by(rows) {
        report.check()?;
        let c1 = (c0 + rows).min(b);
        let mut u = block.slice_mut(s![..c1 - c0, ..]);
        let per = (c1 - c0).div_ceil(threads).max(1);
        let mut g_block = g_q.slice_mut(s![c0..c1, ..]);
        let (parts, near) = std::thread::scope(|scope| {
            let workers: Vec<_> = u
                .axis_chunks_iter_mut(Axis(0), per)
                .zip(g_block.axis_chunks_iter_mut(Axis(0), per))
                .zip(scratches.iter_mut())
                .enumerate()
                .map(|(t, ((u, g), scratch))| {
                    let (shared, report) = (&shared, &report);
                    scope.spawn(move || {
                        let forward = mode == Mode::Forward;
                        let a0 = c0 + t * per;
                        block_weights(shared, (rule, forward), a0, (u, g), scratch, report)
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
        });
        totals.add(parts);
        report.check()?;
        if mode == Mode::Forward {
            continue;
        }
        if let Some(g_r) = g_r.as_mut() {
            add_ref_side(
                distance.distance,
                block.slice(s![..c1 - c0, ..]),
                q_hat.slice(s![c0..c1, ..]),
                r_hat,
                g_r.view_mut(),
            );
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
    Ok(finish_scaled(job, totals, (g_q, g_r), (q, r), factor))
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

/// One thread's anchors `a0 ..` of a block: their distance rows into `u` (from the rows as
/// [`Shared`] holds them and the references' norms), each turned into `U` by the loss's rule
/// and [`weights_to_u`], then the anchors' gradient rows `g`; returns the sums and
/// the near pairs, whose query side is already in `g` (reference pairs the rule scored gather
/// their gradient in the thread's `scratch`). `forward`: only the sums.
fn block_weights(
    shared: &Shared<'_>,
    (rule, forward): (&AnchorRule<'_>, bool),
    a0: usize,
    (mut u, mut g): (ArrayViewMut2<'_, f32>, ArrayViewMut2<'_, f32>),
    scratch: &mut Scratch,
    report: &Reporter<'_>,
) -> (Totals, Vec<NearPair>) {
    let n = u.nrows();
    let mut totals = Totals::default();
    let mut near = Vec::new();
    let q = shared.q_hat.slice(s![a0..a0 + n, ..]);
    distances_into(
        q,
        shared.r_hat,
        shared.r_norms,
        &shared.distance,
        u.view_mut(),
    );
    let m = u.ncols();
    // SNR: `D = s |u_q − u_r|²` with `s = 1 / |u_q|²`; each row's `−2 s Σ_j W D` multiplies
    // its own row in the query's gradient (the derivative through `s`).
    let mut through_scale = vec![0.0f64; if shared.snr { n } else { 0 }];
    for (i, mut row) in u.rows_mut().into_iter().enumerate() {
        if report.cancelled() {
            return (totals, near);
        }
        let scale = shared
            .snr
            .then(|| 1.0 / f64::from(shared.q_norms.sq[a0 + i]));
        if let Some(s) = scale {
            row.mapv_inplace(|d| (f64::from(d) * s) as f32);
        }
        scratch.weights.fill(0.0);
        totals.add(rule(a0 + i, row.view(), scratch, shared));
        if forward {
            // A first pass reports no progress: the call's total is the second pass's.
            continue;
        }
        if let Some(s) = scale {
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
    query_side(distance, u.view(), q_hat, shared.r_hat, g.view_mut());
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

/// The weights of row `a` (an anchor, or a reference of [`RefPairs`]), whose normalised row
/// is `x_hat` and squared norm `x2`, turned into `U` ([`pair_weight`]) in place of its
/// distances `row`; Euclidean pairs closer than [`NEAR`] go to `near` instead (their `U` is 0),
/// a list of at most `most` pairs, the worst case the budget counts.
fn weights_to_u(
    shared: &Shared<'_>,
    (a, x_hat, x2): (usize, ArrayView1<'_, f32>, f32),
    mut row: ArrayViewMut1<'_, f32>,
    weights: &[f64],
    (near, most): (&mut Vec<NearPair>, usize),
) {
    let distance = shared.distance.distance;
    let euclidean = distance == Distance::Euclidean;
    for (j, (d, &w)) in row.iter_mut().zip(weights).enumerate() {
        if euclidean && w != 0.0 && *d * *d < NEAR * (x2 + shared.r_norms.sq[j]) {
            let diff = &x_hat - &shared.r_hat.row(j);
            let exact = diff.dot(&diff).sqrt();
            if exact > 0.0 {
                if near.len() == near.capacity() {
                    // Doubling, but never past the worst case the budget counts.
                    let room = most.saturating_sub(near.len()).max(1);
                    near.reserve_exact(near.capacity().max(16).min(room));
                }
                near.push((a, j as u32, (w / exact as f64) as f32));
            }
            *d = 0.0;
        } else {
            *d = pair_weight(distance, w, *d);
        }
    }
}
