//! Pairwise distances between query and reference embeddings, tiled under the budget, and the
//! row blocks of the distance matrix that the miners consume.
//!
//! On the wgpu path the matrix is computed in tiles whose working set (inputs, norms, output
//! and readback staging) fits the context's remaining budget and the device's limits; each tile
//! is one dispatch of the distance tile (the tuned GEMM family or `shaders/distance_tile.wgsl`).

pub(crate) mod gpu;
pub(crate) mod native;

use ndarray::{s, Array2, ArrayView2};

use crate::context::oom_retry::{self, RowSink};
use crate::context::plan::{DeviceCaps, Plan};
use crate::context::{ComputePath, Context};
use crate::data::inputs::{self, Embeddings, Imports, Rows};
use crate::error::{Error, Result};
use crate::hooks::{Hooks, Reporter};
use crate::metric::DistanceConfig;
use crate::runtime::memory::{HostReservation, Transfers};
use crate::runtime::pool::{threads, workers_within};
use crate::runtime::transfer;

const OP: &str = "pairwise_distances";

/// One distance computation over validated queries: whose call it is, where it runs,
/// how rows compare, how many rows a block may have, and whom to tell of its progress.
#[derive(Clone, Copy)]
pub(crate) struct Job<'j> {
    pub(crate) op: &'static str,
    pub(crate) ctx: &'j Context,
    pub(crate) queries: Rows<'j>,
    pub(crate) cfg: &'j DistanceConfig,
    /// Most rows per block handed over (`usize::MAX`: as many as fit).
    pub(crate) max_rows: usize,
    pub(crate) report: &'j Reporter<'j>,
}

/// Settings of [`pairwise_distances`]. Every field has a documented default.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{Distance, DistanceConfig, PairwiseConfig};
/// let cfg = PairwiseConfig {
///     distance: DistanceConfig { distance: Distance::Cosine, normalize: true },
///     ..Default::default()
/// };
/// assert_eq!(PairwiseConfig::default().distance, DistanceConfig::default());
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PairwiseConfig {
    /// How queries and references are compared. Default [`DistanceConfig::default`]
    /// (Euclidean on L2-normalised embeddings, as PML).
    pub distance: DistanceConfig,
    /// Progress (pairs computed) and cancellation. Default: none.
    pub hooks: Hooks,
}

/// The result of [`pairwise_distances`].
///
/// # Example
/// ```
/// use wgpu_metric_learning::{pairwise_distances, Context};
/// let x = ndarray::array![[1.0f32, 0.0], [0.0, 1.0], [1.0, 1.0]];
/// let d = pairwise_distances(&Context::native_cpu(None), &x, &x, &Default::default())?;
/// assert_eq!(d.values.dim(), (3, 3));
/// assert!(d.values[[0, 0]].abs() < 1e-6);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PairwiseDistances {
    /// `(q, n)`: `values[[i, j]]` compares query `i` with reference `j`.
    pub values: Array2<f32>,
    /// Where it was computed.
    pub path: ComputePath,
    /// Host–device traffic of the call (zero on the native path).
    pub transfers: Transfers,
}

/// Distances between every query `(q, d)` and every reference `(n, d)` → `(q, n)`. The
/// references may be a host array or a memory bank's rows (`bank.rows()`, read where they
/// are); any array layout is accepted. Tiles of the matrix fit the budget left.
///
/// # Errors
/// [`Error::Shape`] if `d = 0` or the two `d` differ; [`Error::NonFinite`];
/// [`Error::InvalidParameter`] for a bank of another context;
/// [`DeviceEmbeddings`](crate::DeviceEmbeddings)' errors; [`Error::OverBudget`] /
/// [`Error::DeviceLimit`] if not even a 1 × 1 tile fits; [`Error::Cancelled`]; device errors.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{pairwise_distances, Context, Distance, DistanceConfig, PairwiseConfig};
/// let ctx = Context::native_cpu(None);
/// let q = array![[1.0f32, 0.0], [0.0, 2.0]];
/// let cfg = PairwiseConfig {
///     distance: DistanceConfig { distance: Distance::Cosine, ..Default::default() },
///     ..Default::default()
/// };
/// let d = pairwise_distances(&ctx, &q, &q, &cfg)?;
/// assert!((d.values[[0, 0]] - 1.0).abs() < 1e-6 && d.values[[0, 1]].abs() < 1e-6);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn pairwise_distances<'q, 'r>(
    ctx: &Context,
    queries: impl Into<Embeddings<'q>>,
    refs: impl Into<Embeddings<'r>>,
    cfg: &PairwiseConfig,
) -> Result<PairwiseDistances> {
    let (queries, refs) = (queries.into(), refs.into());
    let mut imports = Imports::call();
    let (pair, imported) = transfer::measure(|| {
        let sides = (queries.reborrow(), refs.reborrow());
        inputs::prepare_pair(OP, ctx, sides, None, |_, _| Ok(()), &mut imports)
    });
    let pair = pair?;
    let (q, n) = (pair.queries.nrows(), pair.refs.dim().0);
    let report = Reporter::new(&cfg.hooks, OP, q as u64 * n as u64);
    let job = Job {
        op: OP,
        ctx,
        queries: pair.queries,
        cfg: &cfg.distance,
        max_rows: usize::MAX,
        report: &report,
    };
    let (values, transfers) = transfer::measure(|| match (ctx.gpu(), pair.refs) {
        (_, _) if q == 0 || n == 0 => Ok(Array2::zeros((q, n))),
        (None, Embeddings::Host(r)) => {
            let queries = pair.queries.host(OP)?;
            let dims = (q, n, queries.ncols());
            let (workers, _held) = reserve_scratch(OP, ctx, dims, &cfg.distance)?;
            let how = (&cfg.distance, native::is_direct(q, n), workers);
            native::pairwise_distances(queries, r, how, &report)
        }
        (Some(gpu), Embeddings::Host(r)) => oom_retry::retry(ctx, || {
            report.restart();
            gpu::matrix(&job, gpu, r)
        }),
        (_, refs) => {
            let mut values = Array2::zeros((q, n));
            let mut on_block = |r0: usize, block: ArrayView2<'_, f32>| {
                let rows = block.nrows();
                values.slice_mut(s![r0..r0 + rows, ..]).assign(&block);
                Ok(())
            };
            for_each_row_block(&job, refs, &mut on_block)?;
            Ok(values)
        }
    });
    let mut transfers = transfers;
    transfers.add(imported);
    Ok(PairwiseDistances {
        values: values?,
        path: ctx.path(),
        transfers,
    })
}

/// How [`pairwise_distances`] would run with these arguments on `ctx`: its tiles and the
/// memory they hold, planned for the budget available now. Nothing is computed.
///
/// # Errors
/// As [`pairwise_distances`] for bad inputs; [`Error::OverBudget`] (naming the bytes of the
/// smallest tile) or [`Error::DeviceLimit`] when not even a 1 × 1 tile fits.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{pairwise_distances_plan, Context};
/// let ctx = Context::native_cpu(None);
/// let x = ndarray::Array2::<f32>::zeros((1000, 64));
/// let plan = pairwise_distances_plan(&ctx, &x, &x, &Default::default())?;
/// assert_eq!((plan.rows, plan.cols), (1000, 1000)); // natively, one pass; output not counted
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn pairwise_distances_plan<'q, 'r>(
    ctx: &Context,
    queries: impl Into<Embeddings<'q>>,
    refs: impl Into<Embeddings<'r>>,
    cfg: &PairwiseConfig,
) -> Result<Plan> {
    let (queries, refs) = (queries.into(), refs.into());
    let mut imports = Imports::plan();
    let sides = (queries.reborrow(), refs.reborrow());
    let pair = inputs::prepare_pair(OP, ctx, sides, None, |_, _| Ok(()), &mut imports)?;
    let plan = row_plan(
        OP,
        ctx,
        (pair.queries, &pair.refs),
        &cfg.distance,
        usize::MAX,
    )?;
    Ok(plan.with_imports(imports.footprint()))
}

/// Reserves the native path's scratch for blocks of `rows` queries against `n` references of
/// `d` floats ([`native::pairwise_scratch`] per thread), for as many threads as the budget
/// available gives it (one at the least); returns the threads.
///
/// # Errors
/// [`Error::OverBudget`] when one thread's exceeds the whole budget;
/// [`Error::BudgetExceeded`] when it does not fit beside what is held.
fn reserve_scratch(
    op: &'static str,
    ctx: &Context,
    dims: (usize, usize, usize),
    cfg: &DistanceConfig,
) -> Result<(usize, HostReservation)> {
    let per_thread = native::pairwise_scratch(dims, cfg);
    let budget = ctx.tracker().stats().budget_bytes;
    if per_thread > budget {
        return Err(Error::OverBudget {
            op,
            required: per_thread,
            budget,
        });
    }
    let workers = workers_within(threads(), per_thread, ctx.tracker().available());
    let held = HostReservation::new(
        "distance scratch",
        workers as u64 * per_thread,
        ctx.tracker(),
    )?;
    Ok((workers, held))
}

/// The plan of [`for_each_row_block`] (and of [`pairwise_distances`], whose whole matrix is
/// its blocks) for validated inputs.
pub(crate) fn row_plan(
    op: &'static str,
    ctx: &Context,
    (queries, refs): (Rows<'_>, &Embeddings<'_>),
    cfg: &DistanceConfig,
    max_rows: usize,
) -> Result<Plan> {
    let (q, (n, d)) = (queries.nrows(), refs.dim());
    let budget = oom_retry::planning_budget(ctx);
    let Some(gpu) = ctx.gpu() else {
        // The native path allocates the blocks it hands over and, normalising, each thread's
        // block of rows normalised.
        let rows = q.min(max_rows).max(1);
        // As many threads as the budget gives their scratch, one at the least.
        let per_thread = native::pairwise_scratch((rows, n, d), cfg);
        let workers = workers_within(threads(), per_thread, budget);
        return Ok(Plan {
            path: ComputePath::NativeCpu,
            rows,
            cols: n,
            chunks: q.div_ceil(rows),
            bytes: workers as u64 * per_thread,
            min_bytes: per_thread,
        });
    };
    let caps = DeviceCaps::from_limits(&gpu.limits);
    match refs {
        Embeddings::Host(_) => {
            let plan = gpu::tile_plan(op, (q, n, d), max_rows, budget, &caps)?;
            let min = gpu::tile_footprint(1, 1, d.div_ceil(4), 1).bytes;
            Ok(plan.tile.public(q, n, min))
        }
        Embeddings::Bank(bank) => {
            let (plan, min) = gpu::row_block_plan(op, (q, max_rows), bank.view, budget, &caps)?;
            Ok(plan.tile.public(q, n, min))
        }
        Embeddings::Device(_) => Err(inputs::unimported(op)),
    }
}

/// Hands the distances of the job's queries `(q, d)` against `refs` `(n, d)` (validated) to
/// `on_block` in consecutive blocks of whole rows `(row0, (rows, n))`, each at most
/// `job.max_rows` rows, on whichever path the context runs; host memory stays bounded by one
/// block whatever `q`. After a device out-of-memory the blocks resume where they were.
pub(crate) fn for_each_row_block(
    job: &Job<'_>,
    refs: Embeddings<'_>,
    on_block: &mut RowSink<'_>,
) -> Result<()> {
    let Job {
        op,
        ctx,
        queries,
        cfg,
        report,
        ..
    } = *job;
    let (q, n) = (queries.nrows(), refs.dim().0);
    let max_rows = job.max_rows.max(1);
    if q == 0 {
        return Ok(());
    }
    match (ctx.gpu(), refs) {
        (None, Embeddings::Host(refs)) => {
            let queries = queries.host(op)?;
            let dims = (max_rows.min(q), n, queries.ncols());
            let (workers, _held) = reserve_scratch(op, ctx, dims, cfg)?;
            let how = (cfg, native::is_direct(q, n), workers);
            for r0 in (0..q).step_by(max_rows) {
                let rows = max_rows.min(q - r0);
                let block = queries.slice(s![r0..r0 + rows, ..]);
                let block = native::pairwise_distances(block, refs, how, report)?;
                on_block(r0, block.view())?;
            }
            Ok(())
        }
        (Some(_), _) if n == 0 => {
            for r0 in (0..q).step_by(max_rows) {
                on_block(r0, Array2::zeros((max_rows.min(q - r0), 0)).view())?;
            }
            Ok(())
        }
        (Some(gpu), Embeddings::Host(refs)) => oom_retry::retry_rows(ctx, on_block, |on_block| {
            report.restart();
            gpu::host_row_blocks(job, gpu, refs, on_block)
        }),
        (Some(gpu), Embeddings::Bank(bank)) => oom_retry::retry_rows(ctx, on_block, |on_block| {
            report.restart();
            gpu::row_blocks(job, gpu, bank.view, on_block)
        }),
        (None, Embeddings::Bank(_)) => Err(Error::Internal {
            op,
            message: "a device bank reached the native path".into(),
        }),
        (_, Embeddings::Device(_)) => Err(inputs::unimported(op)),
    }
}
