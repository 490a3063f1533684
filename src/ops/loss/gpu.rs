//! The wgpu path of the losses: per block of anchors under the budget, the distance rows
//! (`distance_tile`, as the GPU miners compute them), each anchor's weights `U` and loss sums
//! (`triplet_weights` for the triplet loss, `info_nce_weights` for NTXent and MNRL), and the
//! two gradient products (`loss_backward`), all on the device;
//! one submission per block and one wait per call, which reads back only the loss sums and the
//! gradients `(b, d)` and `(m, d)`. The normalisation's backward and the mean's division then
//! run on the host, as on the native path ([`driver::finish_scaled`]).
//!
//! It takes the references in one page (one storage binding): past that, and for PML's swap,
//! the caller runs the native path.

use ndarray::Array2;

use super::driver::{self, Job, Output};
use super::scratch::{Totals, NEAR};
use super::{host_refs, host_rows};
use crate::context::oom_retry;
use crate::context::plan::{plan_rows, DeviceCaps, Footprint, Plan};
use crate::context::{ComputePath, Context};
use crate::data::device_rows::{max_page_rows, rows_bytes};
use crate::data::device_rows::{Rows, RowsView};
use crate::data::inputs::{self, Embeddings, Resident};
use crate::error::{Error, Result};
use crate::hooks::Reporter;
use crate::kernels::info_nce_weights::{self, InfoNceWeights};
use crate::kernels::loss_backward::{self, BackwardBuffers, LossBackward, Side};
use crate::kernels::pair_weights::{self, PairWeights};
use crate::kernels::triplet_weights::{self, TripletWeights, WeightBuffers, TOTAL_WORDS};
use crate::kernels::{distance_tile, grid_2d};
use crate::ops::distance::gpu::{distance_rows_buffers, DistanceRows};
use crate::ops::triplets::TripletRule;
use crate::runtime::device::GpuDevice;
use crate::runtime::memory::{HostReservation, TrackedBuffer};
use crate::runtime::transfer::{self, f32s, uniform_size, Recorder, Staging};

/// Which loss, besides the distance: the weights kernel and its rule.
pub(super) enum Rule {
    /// `triplet_weights`: PML's `TripletMarginLoss` over the triplets `triplets` keeps.
    Triplet {
        triplets: TripletRule,
        margin: f32,
        smooth: bool,
    },
    /// `info_nce_weights`: the InfoNCE family with logits `dz · D`.
    InfoNce { dz: f32 },
    /// `pair_weights`: one of PML's pair losses.
    Pair(PairRule),
}

/// A pair loss's rule as `pair_weights` takes it.
#[derive(Debug, Clone)]
pub(super) struct PairRule {
    /// A `pair_weights::code`.
    pub(super) code: u32,
    /// The rule's parameters (the shader's header names them).
    pub(super) params: [f32; 8],
    /// FastAP's bins (`num_bins + 1`).
    pub(super) edges: u32,
    /// A pass that gathers the anchors' words only: no weights, no gradient.
    pub(super) forward: bool,
    /// What the rule reads of earlier passes, after the labels (Lifted's, Histogram's).
    pub(super) state: Vec<u32>,
    /// Words per anchor: [`pair_weights::WORDS`], and Histogram's histograms.
    pub(super) stride: usize,
}

impl Rule {
    /// Words per anchor in the totals.
    fn words(&self) -> usize {
        match self {
            Rule::Pair(p) => p.stride,
            _ => TOTAL_WORDS,
        }
    }

    /// Words of state after the labels.
    fn state(&self) -> &[u32] {
        match self {
            Rule::Pair(p) => &p.state,
            _ => &[],
        }
    }
}

/// What a pair loss's pass gives: every anchor's [`pair_weights::WORDS`] words and the
/// gradients with respect to the normalised rows (empty after a forward pass).
pub(super) struct Raw {
    pub(super) words: Vec<u32>,
    grads: (Array2<f32>, Option<Array2<f32>>),
    /// The host memory the call holds ([`host_bytes`]), until [`finish`] is done with it.
    held: Option<HostReservation>,
}

/// The uniform block either weights kernel takes.
fn weight_params_size() -> u64 {
    uniform_size::<triplet_weights::Params>()
        .max(uniform_size::<info_nce_weights::Params>())
        .max(uniform_size::<pair_weights::Params>())
}

/// Device bytes of a call of `rule` with `b` anchors in blocks of `rows` against `m`
/// references of `dim4` `vec4`s (`ref_role`: they get a gradient): every buffer [`blocks`]
/// makes (the references are on the device before it plans, so the budget it plans in has
/// them).
fn footprint(
    rows: usize,
    (b, m, dim4): (usize, usize, usize),
    (rule, ref_role): (&Rule, bool),
    max_per_dim: u64,
) -> Footprint {
    let triplet = matches!(rule, Rule::Triplet { .. });
    let mut buffers = distance_rows_buffers(rows, m, dim4, 1);
    let totals = f32s(b * rule.words());
    let g_q = f32s(b * dim4 * 4);
    buffers.extend([
        weight_params_size(),
        2 * uniform_size::<loss_backward::Params>(),
        f32s(m + 2 * rows + rule.state().len()), // labels
        f32s(rows * m),                          // U
        loss_backward::partial_bytes(rows as u64, m as u64, dim4 as u64),
        totals,
        g_q,
        totals, // their staging
        g_q,
    ]);
    // Each row's columns by role, and the sums of its blocks.
    let blocks = if triplet {
        buffers.extend([
            4 * triplet_weights::list_words(rows as u64, m as u64),
            4 * triplet_weights::partial_words(rows as u64, m as u64),
        ]);
        triplet_weights::blocks(m as u64)
    } else {
        1
    };
    if ref_role {
        buffers.extend([f32s(m * dim4 * 4); 2]);
    }
    Footprint {
        bytes: buffers.iter().sum(),
        largest_buffer: buffers.iter().copied().max().unwrap_or(0),
        // The distance tiles' row blocks, and the folded second dimension of the weights
        // (a block of a row each) and the products (tiles of 64 rows).
        workgroups: (rows as u64)
            .div_ceil(distance_tile::BLOCK)
            .max(folded(rows as u64 * blocks, max_per_dim))
            .max(folded(
                (rows as u64).div_ceil(loss_backward::GROUP_ROWS),
                max_per_dim,
            )),
        workgroup_storage: distance_tile::WORKGROUP_STORAGE
            .max(triplet_weights::WORKGROUP_STORAGE)
            .max(info_nce_weights::WORKGROUP_STORAGE)
            .max(pair_weights::WORKGROUP_STORAGE)
            .max(loss_backward::WORKGROUP_STORAGE),
    }
}

/// The second dimension of `groups` workgroups folded into 2-D rows of `max_per_dim`
/// ([`grid_2d`]'s, as the kernels dispatch them).
fn folded(groups: u64, max_per_dim: u64) -> u64 {
    let max = u32::try_from(max_per_dim).unwrap_or(u32::MAX);
    u64::from(grid_2d(groups, max).1)
}

/// Device bytes the references take when uploaded (0 when they are already there), or `None`
/// when the device path cannot take them: more than one page (known before host rows are
/// uploaded), or their gradient's workgroups past the dispatch limits (the block's rows are
/// planned within them).
fn upload_bytes(
    op: &'static str,
    caps: &DeviceCaps,
    refs: Embeddings<'_>,
    d: usize,
) -> Option<u64> {
    let (m, dim4) = (refs.dim().0, d.div_ceil(4));
    let (pages, upload) = match (refs, max_page_rows(op, caps, dim4)) {
        (Embeddings::Bank(bank), _) => (bank.view.rows.pages_for(m), 0),
        (_, Ok(per_page)) => (m.div_ceil(per_page.max(1)), rows_bytes(m, dim4, per_page)),
        // Not one row fits a binding: the native path has no such limit.
        (_, Err(_)) => return None,
    };
    let max_per_dim = u64::from(caps.max_workgroups_per_dimension);
    let groups = |n: usize, per: u64| (n as u64).div_ceil(per);
    let fits = pages <= 1
        && folded(groups(m, loss_backward::GROUP_ROWS), max_per_dim) <= max_per_dim
        && groups(dim4, loss_backward::GROUP_VEC4S) <= max_per_dim;
    fits.then_some(upload)
}

/// Host bytes [`run`] holds for `b` anchors and `m` references of `d` floats: the anchors'
/// words and the gradients read back, copies of device-resident rows for the
/// normalisation's backward, and a pair rule's state with its upload's copy.
fn host_bytes((b, m, d): (usize, usize, usize), rule: &Rule, ref_role: bool) -> u64 {
    let floats = |n: usize| 4 * (n * d) as u64;
    let words = 4 * (b * rule.words()) as u64 + 8 * rule.state().len() as u64;
    words + floats(b) * 2 + if ref_role { floats(m) * 2 } else { 0 }
}

/// The plan of [`run`] on `gpu`, or `None` where [`run`] leaves the call to the native path
/// (the references past one page or the dispatch limits, the call's device buffers past the
/// budget or a binding).
///
/// # Errors
/// Input errors only (a device-buffer side not imported).
pub(super) fn plan(
    ctx: &Context,
    gpu: &GpuDevice,
    job: &Job<'_>,
    rule: &Rule,
) -> Result<Option<Plan>> {
    let (op, set) = (job.op, job.set);
    let queries = set.queries.as_ref().ok_or_else(|| inputs::unimported(op))?;
    let refs = set.refs.ok_or_else(|| inputs::unimported(op))?;
    let ((b, d), m) = (queries.dim(), set.ref_labels.len());
    if b == 0 || m == 0 {
        // Nothing goes to the device.
        return Ok(Some(Plan::nothing(ComputePath::Wgpu, m)));
    }
    let caps = DeviceCaps::from_limits(&gpu.limits);
    let Some(upload) = upload_bytes(op, &caps, refs, d) else {
        return Ok(None);
    };
    let ref_role = job.refs_are_queries || job.ref_grad;
    // The references are uploaded and the host memory held before the blocks plan.
    let held = upload + host_bytes((b, m, d), rule, ref_role);
    let Some(left) = oom_retry::planning_budget(ctx).checked_sub(held) else {
        return Ok(None);
    };
    let max_per_dim = u64::from(caps.max_workgroups_per_dimension);
    let cost = |rows| footprint(rows, (b, m, d.div_ceil(4)), (rule, ref_role), max_per_dim);
    match plan_rows(op, b, m, left, &caps, cost) {
        Ok(tiles) => {
            let mut plan = tiles.public(b, m, cost(1).bytes + held);
            plan.bytes += held;
            Ok(Some(plan))
        }
        Err(Error::OverBudget { .. } | Error::DeviceLimit { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The loss's sums and gradients on `gpu`, or `None` when the references take more than one
/// page, their gradient's workgroups exceed the dispatch limits, or the call's device buffers
/// (its gradients and one block) do not fit the budget or a binding: the caller then runs
/// the native path. Reports `b × m` pairs, block by block.
///
/// # Errors
/// Device errors (out of memory after the retries, a lost device); [`Error::Cancelled`].
pub(super) fn run(
    ctx: &Context,
    gpu: &GpuDevice,
    job: &Job<'_>,
    rule: &Rule,
) -> Result<Option<Output>> {
    let Some(raw) = run_raw(ctx, gpu, job, rule)? else {
        return Ok(None);
    };
    // The kernel writes zeros after each anchor's counts: anything else (the sentinel) is a
    // row it never wrote.
    let sums = sum_totals(&raw.words).ok_or_else(|| Error::Internal {
        op: job.op,
        message: "the loss kernel left an anchor's totals unwritten".into(),
    })?;
    let factor = if sums.count == 0 {
        0.0
    } else {
        (1.0 / sums.count as f64) as f32
    };
    finish(ctx, job, raw, sums, factor).map(Some)
}

/// [`run`]'s device work: the anchors' words and the gradients with respect to the
/// normalised rows, or `None` where the native path runs.
///
/// # Errors
/// As [`run`].
pub(super) fn run_raw(
    ctx: &Context,
    gpu: &GpuDevice,
    job: &Job<'_>,
    rule: &Rule,
) -> Result<Option<Raw>> {
    let op = job.op;
    let set = job.set;
    let queries = set.queries.as_ref().ok_or_else(|| inputs::unimported(op))?;
    let refs = set.refs.ok_or_else(|| inputs::unimported(op))?;
    let ((b, d), m) = (queries.dim(), set.ref_labels.len());
    let report = Reporter::new(job.hooks, op, b as u64 * m as u64);
    report.check()?;
    let ref_role = job.refs_are_queries || job.ref_grad;
    if b == 0 || m == 0 {
        // No pair: zero words (a zero loss) and zero gradients, with nothing to put on the
        // device.
        return Ok(Some(Raw {
            held: None,
            words: vec![0; b * rule.words()],
            grads: (
                Array2::zeros((b, d)),
                ref_role.then(|| Array2::zeros((m, d))),
            ),
        }));
    }
    // Decided as the plan decides: a call that does not fit allocates nothing here.
    if plan(ctx, gpu, job, rule)?.is_none() {
        return Ok(None);
    }
    let resident = match Resident::of(op, gpu, refs.reborrow()) {
        Ok(rows) if rows.rows().pages_for(m) == 1 => rows,
        // References that do not fit the device budget stay on the host, natively.
        Ok(_) | Err(Error::OverBudget { .. } | Error::DeviceLimit { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let bytes = host_bytes((b, m, d), rule, ref_role);
    let held = HostReservation::new(job.label, bytes, ctx.tracker())?;
    let attempt = oom_retry::retry(ctx, || {
        report.check()?;
        report.restart();
        gpu.settled(blocks(ctx, gpu, job, rule, &resident, (ref_role, &report)))
    });
    match attempt {
        // The call's whole gradients and sums live on the device beside a block: where they
        // (or one block) do not fit the budget or a binding, the native path, which needs
        // less of both, runs instead.
        Err(Error::OverBudget { .. } | Error::DeviceLimit { .. }) => Ok(None),
        other => other.map(|raw| {
            Some(Raw {
                held: Some(held),
                ..raw
            })
        }),
    }
}

/// The gradients of `raw` scaled by `factor` and taken back through the normalisation on the
/// host, as on the native path ([`driver::finish_scaled`]), with `totals` as the sums.
///
/// # Errors
/// Reading device-resident rows back.
pub(super) fn finish(
    ctx: &Context,
    job: &Job<'_>,
    raw: Raw,
    totals: Totals,
    factor: f32,
) -> Result<Output> {
    let op = job.op;
    let queries = job
        .set
        .queries
        .as_ref()
        .ok_or_else(|| inputs::unimported(op))?;
    let refs = job.set.refs.ok_or_else(|| inputs::unimported(op))?;
    let ((b, d), m) = (queries.dim(), job.set.ref_labels.len());
    if b == 0 || m == 0 {
        // Zero gradients: nothing to read back.
        return Ok(Output {
            totals,
            query_grad: Array2::zeros((b, d)),
            ref_grad: (job.ref_grad && !job.refs_are_queries).then(|| Array2::zeros((m, d))),
        });
    }
    let q = host_rows(op, ctx, queries.reborrow())?;
    let r_own = match job.refs_are_queries || !job.ref_grad {
        true => None,
        false => Some(host_refs(op, ctx, refs)?),
    };
    let q = q.view();
    let r = r_own.as_ref().map_or(q, |r| r.view());
    let (g_q, g_r) = raw.grads;
    let g_r = g_r.filter(|_| job.refs_are_queries || job.ref_grad);
    // Held (with the rows' copies) until the gradients are finished.
    let _held = raw.held;
    Ok(driver::finish_scaled(
        job,
        totals,
        (g_q, g_r),
        (q, r),
        factor,
    ))
}

/// The blocks of [`run_raw`] (one attempt under the current planning budget): every anchor's
/// words, the queries' gradient `(b, d)` and, with `ref_role`, the references' `(m, d)`, with
/// respect to the normalised rows (none after a forward pass).
fn blocks(
    ctx: &Context,
    gpu: &GpuDevice,
    job: &Job<'_>,
    rule: &Rule,
    resident: &Resident<'_>,
    (ref_role, report): (bool, &Reporter<'_>),
) -> Result<Raw> {
    let (op, set) = (job.op, job.set);
    let queries = set.queries.as_ref().ok_or_else(|| inputs::unimported(op))?;
    let ((b, d), m) = (queries.dim(), set.ref_labels.len());
    let dim4 = d.div_ceil(4);
    let caps = DeviceCaps::from_limits(&gpu.limits);
    let budget = oom_retry::planning_budget(ctx);
    let max_per_dim = u64::from(caps.max_workgroups_per_dimension);
    let plan = plan_rows(op, b.max(1), m, budget, &caps, |rows| {
        footprint(rows, (b, m, dim4), (rule, ref_role), max_per_dim)
    })?;
    let rows = plan.rows;
    let view = RowsView {
        rows: resident.rows(),
        len: m,
    };
    let (ref_rows, ref_norms) = view.rows.page(0)?;
    let input = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
    let uniform = wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST;
    let make = |label, size, usage| transfer::create_buffer(gpu, label, size, usage);
    let distance = DistanceRows::new(gpu, rows, view)?;
    let weight_params = make("loss_gpu::weight_params", weight_params_size(), uniform)?;
    let backward_params = [
        make(
            "loss_gpu::query_side_params",
            uniform_size::<loss_backward::Params>(),
            uniform,
        )?,
        make(
            "loss_gpu::ref_side_params",
            uniform_size::<loss_backward::Params>(),
            uniform,
        )?,
    ];
    let state0 = m + 2 * rows;
    let labels = make("loss_gpu::labels", f32s(state0 + rule.state().len()), input)?;
    let words = rule.words();
    let u = transfer::output(gpu, "loss_gpu::u", f32s(rows * m))?;
    // The products' chunk sums, when few output tiles split the summed index.
    let partial = transfer::output(
        gpu,
        "loss_gpu::partial",
        loss_backward::partial_bytes(rows as u64, m as u64, dim4 as u64),
    )?;
    // The triplet loss's columns by role and sums per block of a row.
    let triplet_buffers = match rule {
        Rule::Triplet { .. } => Some((
            transfer::output(
                gpu,
                "loss_gpu::lists",
                4 * triplet_weights::list_words(rows as u64, m as u64),
            )?,
            transfer::output(
                gpu,
                "loss_gpu::partials",
                4 * triplet_weights::partial_words(rows as u64, m as u64),
            )?,
        )),
        Rule::InfoNce { .. } | Rule::Pair(_) => None,
    };
    // A forward pass (a pair loss's first) takes no gradient: no weights, no products.
    let forward = matches!(rule, Rule::Pair(p) if p.forward);
    let totals = transfer::output(gpu, "loss_gpu::totals", f32s(b * words))?;
    let g_q = transfer::output(gpu, "loss_gpu::query_grad", f32s(b * dim4 * 4))?;
    let g_r: Option<TrackedBuffer> = ref_role
        .then(|| transfer::output(gpu, "loss_gpu::ref_grad", f32s(m * dim4 * 4)))
        .transpose()?;
    let totals_staging = Staging::new(gpu, "loss_gpu::totals_staging", f32s(b * words))?;
    let g_q_staging = Staging::new(gpu, "loss_gpu::query_grad_staging", f32s(b * dim4 * 4))?;
    let g_r_staging = ref_role
        .then(|| Staging::new(gpu, "loss_gpu::ref_grad_staging", f32s(m * dim4 * 4)))
        .transpose()?;
    let backward = gpu.kernel::<LossBackward>()?;

    let softplus_floor = triplet_weights::softplus_floor();
    let metric = job.distance.distance.code();
    let normalize = u32::from(job.distance.normalizes());
    // The buffers of either row-wise weights kernel (info_nce_weights, pair_weights).
    let weight_buffers = [
        &weight_params,
        &distance.distances,
        &labels,
        &distance.queries,
        ref_rows,
        &distance.query_norms,
        ref_norms,
        &u,
        &totals,
    ];
    let mut rec = Recorder::new(gpu, op);
    match rule.state() {
        [] => rec.upload(&labels, 0, &set.ref_labels)?,
        // One upload (a second to the same buffer would split the submission): the labels,
        // the blocks' anchors (written per block), the state.
        state => {
            let mut all = set.ref_labels.to_vec();
            all.resize(state0, 0);
            all.extend_from_slice(state);
            rec.upload(&labels, 0, &all)?;
        }
    }
    rec.sentinel(&totals, f32s(b * words))?;
    if !forward {
        rec.sentinel(&g_q, f32s(b * dim4 * 4))?;
        if let Some(g_r) = &g_r {
            rec.clear(g_r, f32s(m * dim4 * 4));
        }
    }
    for a0 in (0..b).step_by(rows) {
        report.check()?;
        let n = rows.min(b - a0);
        let own: Vec<u32> = (a0..a0 + n)
            .flat_map(|a| [set.labels[a], set.self_slots[a]])
            .collect();
        rec.upload(&labels, f32s(m), &own)?;
        // In-batch, the queries are already on the device as the references: copied there,
        // not uploaded a second time.
        let rows = match job.refs_are_queries {
            true => Rows::Resident(view),
            false => queries.reborrow(),
        };
        distance.encode(&mut rec, rows, a0, n, view, &job.distance)?;
        if !forward {
            rec.sentinel(&u, f32s(n * m))?;
        }
        match (rule, &triplet_buffers) {
            (
                &Rule::Triplet {
                    triplets,
                    margin,
                    smooth,
                },
                Some((lists, partials)),
            ) => {
                let params = triplet_weights::Params {
                    anchors: n as u32,
                    refs: m as u32,
                    dim4: dim4 as u32,
                    metric,
                    normalize,
                    mode: triplets.mode(),
                    miner_margin: triplets.margin(),
                    margin,
                    softplus: u32::from(smooth),
                    near: NEAR,
                    row0: a0 as u32,
                    softplus_floor,
                };
                rec.upload(&weight_params, 0, &[params])?;
                rec.sentinel(lists, 4 * triplet_weights::list_words(n as u64, m as u64))?;
                let words = triplet_weights::partial_words(n as u64, m as u64);
                rec.sentinel(partials, 4 * words)?;
                let wb = WeightBuffers {
                    params: &weight_params,
                    distances: &distance.distances,
                    lists,
                    queries: &distance.queries,
                    refs: ref_rows,
                    query_sq_norms: &distance.query_norms,
                    ref_sq_norms: ref_norms,
                    u: &u,
                    partials,
                    totals: &totals,
                    labels: &labels,
                };
                let kernel = gpu.kernel::<TripletWeights>()?;
                kernel.encode(&mut rec, (n as u64, m as u64), &wb)?;
            }
            (&Rule::InfoNce { dz }, _) => {
                let params = info_nce_weights::Params {
                    anchors: n as u32,
                    refs: m as u32,
                    dim4: dim4 as u32,
                    metric,
                    normalize,
                    dz,
                    near: NEAR,
                    row0: a0 as u32,
                };
                rec.upload(&weight_params, 0, &[params])?;
                let kernel = gpu.kernel::<InfoNceWeights>()?;
                kernel.encode(&mut rec, n as u64, &weight_buffers)?;
            }
            (Rule::Pair(p), _) => {
                let [p0, p1, p2, p3, p4, p5, p6, p7] = p.params;
                let params = pair_weights::Params {
                    anchors: n as u32,
                    refs: m as u32,
                    dim4: dim4 as u32,
                    metric,
                    normalize,
                    near: NEAR,
                    row0: a0 as u32,
                    rule: p.code,
                    forward: u32::from(p.forward),
                    edges: p.edges,
                    state0: state0 as u32,
                    stride: words as u32,
                    p0,
                    p1,
                    p2,
                    p3,
                    p4,
                    p5,
                    p6,
                    p7,
                };
                rec.upload(&weight_params, 0, &[params])?;
                let kernel = gpu.kernel::<PairWeights>()?;
                kernel.encode(&mut rec, n as u64, &weight_buffers)?;
            }
            (Rule::Triplet { .. }, None) => {
                return Err(Error::Internal {
                    op,
                    message: "the triplet loss's buffers were not made".into(),
                })
            }
        }
        if forward {
            report.add((n * m) as u64);
            continue;
        }
        let shape = (n as u64, m as u64, dim4 as u64);
        let sides = [(Side::Query, Some(&g_q)), (Side::Ref, g_r.as_ref())];
        for ((side, out), params) in sides.into_iter().zip(&backward_params) {
            let Some(out) = out else { continue };
            let p = loss_backward::Params {
                rows: n as u32,
                refs: m as u32,
                dim4: dim4 as u32,
                metric,
                normalize,
                out_row0: a0 as u32,
                chunk: 0,
                splits: 1,
            };
            let bb = BackwardBuffers {
                params,
                u: &u,
                queries: &distance.queries,
                query_sq_norms: &distance.query_norms,
                refs: ref_rows,
                ref_sq_norms: ref_norms,
                out,
                partial: &partial,
            };
            backward.encode(&mut rec, side, shape, p, &bb)?;
        }
        report.add((n * m) as u64);
    }
    rec.read_back(&totals, 0, &totals_staging, 0, f32s(b * words));
    if !forward {
        rec.read_back(&g_q, 0, &g_q_staging, 0, f32s(b * dim4 * 4));
        if let (Some(g_r), Some(staging)) = (&g_r, &g_r_staging) {
            rec.read_back(g_r, 0, staging, 0, f32s(m * dim4 * 4));
        }
    }
    let done = rec.submit()?;
    let words_read = totals_staging.map(&done, f32s(b * words));
    let words = words_read.read::<u32, _>(gpu, b * words, <[u32]>::to_vec)?;
    if forward {
        return Ok(Raw {
            held: None,
            words,
            grads: (Array2::zeros((0, d)), None),
        });
    }
    let g_q_read = g_q_staging.map(&done, f32s(b * dim4 * 4));
    let g_r_read = g_r_staging
        .as_ref()
        .map(|s| s.map(&done, f32s(m * dim4 * 4)));
    let g_q = g_q_read.read::<f32, _>(gpu, b * dim4 * 4, |v| unpad(v, b, d))?;
    let g_r = match g_r_read {
        Some(read) => Some(read.read::<f32, _>(gpu, m * dim4 * 4, |v| unpad(v, m, d))?),
        None => None,
    };
    Ok(Raw {
        held: None,
        words,
        grads: (g_q, g_r),
    })
}

/// The call's sums from every anchor's [`TOTAL_WORDS`] words; `None` when an anchor's
/// padding words are not the zeros the kernel writes.
fn sum_totals(words: &[u32]) -> Option<Totals> {
    let mut t = Totals::default();
    let wide = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
    for a in words.chunks_exact(TOTAL_WORDS) {
        if a[5..] != [0, 0, 0] {
            return None;
        }
        t.add(Totals {
            loss: f64::from(f32::from_bits(a[0])),
            count: wide(a[1], a[2]),
            items: wide(a[3], a[4]),
            aux: 0.0,
        });
    }
    Some(t)
}

/// `(n, d)` from `n` rows of `ceil(d / 4)` zero-padded `vec4`s.
fn unpad(v: &[f32], n: usize, d: usize) -> Array2<f32> {
    let mut out = Array2::zeros((n, d));
    transfer::unpad_rows_into(v, d.div_ceil(4), out.view_mut());
    out
}
