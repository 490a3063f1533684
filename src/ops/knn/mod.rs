//! k-nearest neighbours of queries among references: exact, any `k`, under the budget, on one
//! device or sharded over several.
//!
//! On the wgpu path, distance tiles of a query chunk against a range of references
//! (`shaders/distance_tile.wgsl`) feed a per-row radix selection that merges them into a running
//! best list (`shaders/knn_select.wgsl`); chunk sizes come from the context's remaining budget,
//! and references that do not fit it are streamed through in chunks. On the native path,
//! blocked GEMM with a per-row selection, or for `k ≤ 128` a fused kernel that selects from
//! register tiles of dot products. `knn_on_device` sorts each query chunk's lists on the device
//! (`shaders/knn_sort.wgsl`) and copies them into the caller's arrays.

mod calibrate;
mod candidates;
mod gpu;
mod native;
mod native_fused;

use ndarray::{s, Array2};

use crate::context::oom_retry;
use crate::context::plan::Plan;
use crate::context::{ComputePath, Context};
use crate::data::device_output::{output_device, DeviceArray};
use crate::data::inputs::{self, Embeddings, Imports, Pair, Rows, SelfExclusion};
use crate::error::{Error, Result};
use crate::hooks::{Hooks, Reporter};
use crate::kernels::knn_select::{key_of, score_of, EMPTY_INDEX};
use crate::metric::DistanceConfig;
use crate::ops::distance::native::is_direct;
use crate::runtime::memory::Transfers;
use crate::runtime::pool::threads;
use crate::runtime::transfer;

const OP: &str = "knn";

/// What [`knn`] searches for. Every field has a documented default.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{Distance, DistanceConfig, KnnConfig, SelfExclusion};
/// let cfg = KnnConfig {
///     k: 100,
///     distance: DistanceConfig { distance: Distance::Cosine, normalize: true },
///     self_exclusion: SelfExclusion::SameIndex, // PML's ref_includes_query
///     ..Default::default()
/// };
/// assert_eq!(KnnConfig::default().k, 10);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct KnnConfig {
    /// Neighbours per query: `1 ≤ k ≤` the references a query can see (all of them, less the
    /// query itself when it is excluded). No other cap. Default 10.
    pub k: usize,
    /// How queries and references are compared. Default [`DistanceConfig::default`]
    /// (Euclidean on L2-normalised embeddings, as PML); `normalize: false` is Faiss's
    /// convention.
    pub distance: DistanceConfig,
    /// Which reference is each query itself, left out of its neighbours by index (so ties
    /// with duplicates cannot leave the query in or a duplicate out):
    /// [`SelfExclusion::SameIndex`] is PML's `ref_includes_query` (reference `i` is query
    /// `i`); [`SelfExclusion::QuerySlots`] names a slot per query (a memory bank). Default
    /// [`SelfExclusion::Auto`], which excludes nothing here: the references are explicit.
    pub self_exclusion: SelfExclusion,
    /// Progress (query–reference pairs compared) and cancellation. Default: none.
    pub hooks: Hooks,
}

impl Default for KnnConfig {
    fn default() -> Self {
        Self {
            k: 10,
            distance: DistanceConfig::default(),
            self_exclusion: SelfExclusion::Auto,
            hooks: Hooks::default(),
        }
    }
}

/// The result of [`knn`] and [`knn_sharded`].
///
/// # Example
/// ```
/// use wgpu_metric_learning::{knn, Context, Distance, DistanceConfig, KnnConfig};
/// let q = ndarray::array![[1.0f32, 0.0]];
/// let r = ndarray::array![[0.0f32, 1.0], [1.0, 0.0], [1.0, 0.0]];
/// let cfg = KnnConfig { k: 3, distance: DistanceConfig { distance: Distance::DotProduct, normalize: false }, ..Default::default() };
/// let found = knn(&Context::native_cpu(None), &q, &r, &cfg)?;
/// assert_eq!(found.indices, ndarray::array![[1u32, 2, 0]]); // the tie goes to the lower index
/// assert_eq!(found.scores, ndarray::array![[1.0f32, 1.0, 0.0]]); // similarities: descending
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Knn {
    /// `(q, k)`: reference indices (rows of the references, or slots of a memory bank), best
    /// first; ties are broken by the lower index.
    pub indices: Array2<u32>,
    /// `(q, k)`: the matching distances (ascending) or similarities (descending).
    pub scores: Array2<f32>,
    /// Where it ran (for [`knn_sharded`]: the first context's path).
    pub path: ComputePath,
    /// Host–device traffic of the call, summed over shards (zero on the native path).
    pub transfers: Transfers,
}

/// Per query, sorted best-first neighbour lists padded with [`EMPTY_INDEX`] (a shard may hold
/// fewer than `k` references a query can see).
pub(crate) struct Neighbours {
    pub(crate) indices: Array2<u32>,
    pub(crate) scores: Array2<f32>,
}

impl Neighbours {
    pub(crate) fn empty(q: usize, k: usize) -> Self {
        Self {
            indices: Array2::from_elem((q, k), EMPTY_INDEX),
            scores: Array2::from_elem((q, k), f32::NAN),
        }
    }
}

/// The `k` nearest references of every query `(q, d)`: `refs` is a host array `(n, d)` or the
/// filled rows of a [`crate::MemoryBank`] (`bank.rows()`), searched where they live. Exact
/// (brute force), `O(q · n · d)`, in chunks under the budget (the `(q, n)` matrix never
/// exists); `cfg.hooks` reports the pairs compared and can cancel between chunks.
///
/// # Errors
/// [`Error::Shape`] if `d = 0`, the dimensions differ or the self-exclusion does not fit the
/// inputs; [`Error::NonFinite`]; [`Error::InvalidParameter`] if `k = 0` or `k` exceeds the
/// references a query can see, for a slot past the references or a bank of another context;
/// [`DeviceEmbeddings`](crate::DeviceEmbeddings)' errors; [`Error::OverBudget`] if not one
/// query row fits the budget; [`Error::Cancelled`]; device errors.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{knn, Context, KnnConfig, SelfExclusion};
/// let ctx = Context::native_cpu(None);
/// let x = array![[0.0f32, 1.0], [0.1, 1.0], [1.0, 0.0]];
/// let cfg = KnnConfig { k: 1, self_exclusion: SelfExclusion::SameIndex, ..Default::default() };
/// let found = knn(&ctx, &x, &x, &cfg)?;
/// assert_eq!(found.indices.column(0).to_vec(), vec![1, 0, 1]);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn knn<'q, 'r>(
    ctx: &Context,
    queries: impl Into<Embeddings<'q>>,
    refs: impl Into<Embeddings<'r>>,
    cfg: &KnnConfig,
) -> Result<Knn> {
    let (queries, refs) = (queries.into(), refs.into());
    let mut imports = Imports::call();
    let (pair, imported) =
        transfer::measure(|| check(ctx, queries.reborrow(), refs.reborrow(), cfg, &mut imports));
    let mut found = run(ctx, &pair?, cfg)?;
    found.transfers.add(imported);
    Ok(found)
}

/// How [`knn`] would run with these arguments on `ctx`: its query chunks and reference
/// ranges, whether the references stay resident, and the memory that holds, planned for the
/// budget available now. Nothing of this search runs; on the native path, the first plan
/// or call of a `(k, d)` bucket on a CPU may time its two kernels once on synthetic rows
/// (about 3 s on 2 cores, then cached: see [`crate::NativeKnnKernel`]), so that the plan
/// names the kernel the call will run.
///
/// # Errors
/// As [`knn`] for bad inputs; [`Error::OverBudget`] (naming the bytes of the smallest chunk)
/// or [`Error::DeviceLimit`] when not even one query row fits; [`Error::BudgetExceeded`]
/// (`"device embeddings (imported)"`) when device embeddings alone exceed the budget left.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{knn_plan, Context, Error, KnnConfig};
/// let x = ndarray::Array2::<f32>::zeros((1000, 16));
/// let cfg = KnnConfig { k: 10, ..Default::default() };
/// let plan = knn_plan(&Context::native_cpu(None), &x, &x, &cfg)?;
/// // The least budget this search runs in, natively:
/// let tight = Context::native_cpu(Some(plan.min_bytes));
/// assert!(knn_plan(&tight, &x, &x, &cfg).is_ok());
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn knn_plan<'q, 'r>(
    ctx: &Context,
    queries: impl Into<Embeddings<'q>>,
    refs: impl Into<Embeddings<'r>>,
    cfg: &KnnConfig,
) -> Result<Plan> {
    let (queries, refs) = (queries.into(), refs.into());
    let mut imports = Imports::plan();
    let pair = check(ctx, queries.reborrow(), refs.reborrow(), cfg, &mut imports)?;
    let (q, (n, d)) = (pair.queries.nrows(), pair.refs.dim());
    let plan = match ctx.gpu() {
        None => {
            let flags = (cfg.distance.normalizes(), is_direct(q, n));
            native::plan(ctx, (q, n, d), cfg.k, flags).map(|p| p.public(q, n))
        }
        Some(gpu) => gpu::plan(ctx, gpu, (q, d), &pair.refs, cfg.k, false).map(|p| p.public(q, n)),
    };
    Ok(plan?.with_imports(imports.footprint()))
}

/// [`knn`] over validated inputs.
pub(crate) fn run(ctx: &Context, pair: &Pair<'_>, cfg: &KnnConfig) -> Result<Knn> {
    let total = pair.queries.nrows() as u64 * pair.refs.dim().0 as u64;
    run_reporting(ctx, pair, cfg, &Reporter::new(&cfg.hooks, OP, total))
}

/// [`run`] as one part of a larger call, reporting into `report`.
pub(crate) fn run_reporting(
    ctx: &Context,
    pair: &Pair<'_>,
    cfg: &KnnConfig,
    report: &Reporter<'_>,
) -> Result<Knn> {
    let (found, transfers) = transfer::measure(|| {
        let direct = is_direct(pair.queries.nrows(), pair.refs.dim().0);
        let job = (pair.excluded.as_slice(), report, direct);
        search(ctx, pair.queries, pair.refs, cfg, job, gpu::Output::Host)
    });
    let found = found?;
    Ok(Knn {
        indices: found.indices,
        scores: found.scores,
        path: ctx.path(),
        transfers,
    })
}

/// The result of [`knn_on_device`]: the neighbour lists of [`knn`], left on the device.
///
/// See the example of [`knn_on_device`].
#[derive(Debug)]
#[non_exhaustive]
pub struct KnnOnDevice {
    /// `(q, k)`: reference indices (rows of the references, or slots of a memory bank), best
    /// first, ties broken by the lower index: [`Knn::indices`], on the device.
    pub indices: DeviceArray<u32>,
    /// `(q, k)`: the matching distances (ascending) or similarities (descending):
    /// [`Knn::scores`], on the device.
    pub scores: DeviceArray<f32>,
    /// Host–device traffic of the call: no bytes down, one host wait at the end (plus those
    /// of importing device embeddings).
    pub transfers: Transfers,
}

/// [`knn`] with its answer left on the device, for a training step that uses the neighbours
/// there (a loss that gathers them, say): the same lists, bit for bit, in two
/// [`DeviceArray`]s; nothing is read back and the call waits once, at its end. The arrays
/// (`8 · q · k` bytes) are allocated first and count in the budget while they live; the search
/// plans its chunks in what is left ([`knn_plan`] plans [`knn`], not this call).
///
/// # Errors
/// As [`knn`]; [`Error::InvalidParameter`] on a native context (results on the device need a
/// wgpu context); [`Error::BudgetExceeded`] or [`Error::DeviceLimit`] when the arrays do not
/// fit the budget or a buffer.
///
/// # Example
/// ```no_run
/// use wgpu_metric_learning::{knn, knn_on_device, Context, ContextConfig, KnnConfig, SelfExclusion};
/// let ctx = Context::new(&ContextConfig::default())?;
/// let x = ndarray::Array2::from_shape_fn((500, 32), |(i, j)| ((i * 7 + j * 3) % 11) as f32);
/// let cfg = KnnConfig { k: 20, self_exclusion: SelfExclusion::SameIndex, ..Default::default() };
/// let found = knn_on_device(&ctx, &x, &x, &cfg)?;
/// assert_eq!(found.transfers.bytes_down, 0);
/// assert_eq!(found.indices.to_host(&ctx)?, knn(&ctx, &x, &x, &cfg)?.indices);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn knn_on_device<'q, 'r>(
    ctx: &Context,
    queries: impl Into<Embeddings<'q>>,
    refs: impl Into<Embeddings<'r>>,
    cfg: &KnnConfig,
) -> Result<KnnOnDevice> {
    let gpu = output_device(OP, ctx)?;
    let (queries, refs) = (queries.into(), refs.into());
    let mut imports = Imports::call();
    let (found, transfers) = transfer::measure(|| {
        let pair = check(ctx, queries.reborrow(), refs.reborrow(), cfg, &mut imports)?;
        let q = pair.queries.nrows();
        let indices = DeviceArray::new(gpu, "knn::indices", (q, cfg.k))?;
        let scores = DeviceArray::new(gpu, "knn::scores", (q, cfg.k))?;
        let total = q as u64 * pair.refs.dim().0 as u64;
        let report = Reporter::new(&cfg.hooks, OP, total);
        let output = gpu::Output::Device {
            indices: &indices,
            scores: &scores,
        };
        let direct = is_direct(pair.queries.nrows(), pair.refs.dim().0);
        let job = (pair.excluded.as_slice(), &report, direct);
        search(ctx, pair.queries, pair.refs.reborrow(), cfg, job, output)?;
        Ok::<_, Error>((indices, scores))
    });
    let (indices, scores) = found?;
    Ok(KnnOnDevice {
        indices,
        scores,
        transfers,
    })
}

/// [`knn`] with the references split into one contiguous shard per context, searched in
/// parallel (one thread per context, each under its own budget), and the shards' lists merged
/// on the host with the same order and tie rule: the answer is the single-device answer.
///
/// Progress reports come from every shard, summed; cancelling stops every shard at its next
/// chunk.
///
/// # Errors
/// As [`knn`]; [`Error::InvalidParameter`] when `contexts` is empty or either side is not a
/// host array (a bank's or a buffer's rows live on one device). A shard that panics (a bug) panics the caller.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{knn, knn_sharded, Context, KnnConfig};
/// let (a, b) = (Context::native_cpu(None), Context::native_cpu(None));
/// let q = array![[1.0f32, 0.0]];
/// let r = array![[0.0f32, 1.0], [1.0, 0.1], [1.0, 0.0], [0.5, 0.5]];
/// let cfg = KnnConfig { k: 3, ..Default::default() };
/// let one = knn(&a, &q, &r, &cfg)?;
/// let two = knn_sharded(&[&a, &b], &q, &r, &cfg)?;
/// assert_eq!(one.indices, two.indices);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn knn_sharded<'q, 'r>(
    contexts: &[&Context],
    queries: impl Into<Embeddings<'q>>,
    refs: impl Into<Embeddings<'r>>,
    cfg: &KnnConfig,
) -> Result<Knn> {
    let Some(first) = contexts.first() else {
        return Err(Error::InvalidParameter {
            op: OP,
            what: "contexts",
            value: "[]".into(),
            rule: "at least one context is needed",
        });
    };
    let (queries, refs) = (queries.into(), refs.into());
    let (Embeddings::Host(queries), Embeddings::Host(refs)) = (queries, refs) else {
        return Err(Error::InvalidParameter {
            op: OP,
            what: "queries and refs",
            value: "device-resident embeddings".into(),
            rule:
                "knn_sharded takes host queries and references (it splits them over its contexts)",
        });
    };
    let mut imports = Imports::call();
    let pair = check(
        first,
        Embeddings::Host(queries.view()),
        Embeddings::Host(refs.view()),
        cfg,
        &mut imports,
    )?;
    let (queries, excluded) = (pair.queries, &pair.excluded);
    let n = refs.nrows();
    let total = queries.nrows() as u64 * n as u64;
    let report = Reporter::new(&cfg.hooks, OP, total);
    let report = &report;
    let shards = contexts.len().min(n).max(1);
    let bounds: Vec<(usize, usize)> = (0..shards)
        .map(|s| (s * n / shards, (s + 1) * n / shards))
        .collect();
    let results: Vec<(Result<Neighbours>, Transfers)> = std::thread::scope(|scope| {
        let handles: Vec<_> = bounds
            .iter()
            .zip(contexts)
            .map(|(&(start, end), ctx)| {
                let local: Vec<u32> = excluded
                    .iter()
                    .map(|&e| match e as usize {
                        i if (start..end).contains(&i) => (i - start) as u32,
                        _ => inputs::NO_SLOT,
                    })
                    .collect();
                let shard = refs.slice(s![start..end, ..]);
                let cfg = KnnConfig {
                    k: cfg.k.min(end - start),
                    ..cfg.clone()
                };
                scope.spawn(move || {
                    let part = report.part(queries.nrows() as u64 * shard.nrows() as u64);
                    transfer::measure(|| {
                        // Direct or not as the whole call, whatever the shard's size.
                        let direct = is_direct(queries.nrows(), n);
                        let job = (local.as_slice(), &part, direct);
                        let shard = Embeddings::Host(shard);
                        search(ctx, queries, shard, &cfg, job, gpu::Output::Host)
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    // Each shard counted its traffic on its own thread.
    let mut transfers = Transfers::default();
    for (_, t) in &results {
        transfers.add(*t);
    }
    transfer::absorb(transfers);
    let parts = results
        .into_iter()
        .map(|(found, _)| found)
        .collect::<Result<Vec<_>>>()?;
    let largest = cfg.distance.distance.is_similarity();
    let found = merge(&parts, &bounds, queries.nrows(), cfg.k, largest);
    Ok(Knn {
        indices: found.indices,
        scores: found.scores,
        path: first.path(),
        transfers,
    })
}

/// Validates every input before any work: the inputs and self-exclusion as every operation
/// does, then `k` against the references a query can see.
fn check<'a>(
    ctx: &Context,
    queries: Embeddings<'a>,
    refs: Embeddings<'a>,
    cfg: &KnnConfig,
    imports: &'a mut Imports,
) -> Result<Pair<'a>> {
    // `k` is checked against the references a query can see before any device work.
    let check_k = |n: usize, excluded: &[u32]| {
        // Every slot indexes the references, so one reference is hidden from each excluding
        // query.
        let sees_itself = excluded.iter().any(|&e| (e as usize) < n);
        let visible = n - usize::from(sees_itself);
        if cfg.k == 0 || cfg.k > visible {
            return Err(Error::InvalidParameter {
                op: OP,
                what: "k",
                value: cfg.k.to_string(),
                rule: if cfg.k == 0 {
                    "k must be at least 1"
                } else {
                    "k must not exceed the references a query can see (n, less the query itself when excluded)"
                },
            });
        }
        Ok(())
    };
    let sides = (queries, refs);
    inputs::prepare_pair(OP, ctx, sides, Some(&cfg.self_exclusion), check_k, imports)
}

/// One device's (or the CPU's) search over validated inputs; rows may come back padded when
/// `k` exceeds what a row can see (shards only).
fn search(
    ctx: &Context,
    queries: Rows<'_>,
    refs: Embeddings<'_>,
    cfg: &KnnConfig,
    (excluded, report, direct): (&[u32], &Reporter<'_>, bool),
    output: gpu::Output<'_>,
) -> Result<Neighbours> {
    let (q, k) = (queries.nrows(), cfg.k);
    if q == 0 || k == 0 {
        return Ok(Neighbours::empty(q, k));
    }
    match (refs, ctx.gpu()) {
        (Embeddings::Host(r), None) => {
            native::search(ctx, queries.host(OP)?, r, cfg, (excluded, direct), report)
        }
        (refs, Some(gpu)) => oom_retry::retry(ctx, || {
            report.restart();
            let job = gpu::Job {
                cfg,
                excluded,
                report,
                output,
            };
            gpu.settled(gpu::search(ctx, gpu, queries, refs, job))
        }),
        (Embeddings::Bank(_), None) => Err(inputs::foreign_bank(OP, ctx.device_name())),
        (Embeddings::Device(_), None) => Err(inputs::unimported(OP)),
    }
}

/// [`knn`] of validated rows against validated references (host rows, or rows resident on
/// `ctx`'s device) as one step of a larger call (k-means searches once per iteration, a
/// distributed search once per query block): its progress goes to `report`, a part of the
/// caller's. Rows come back padded when `cfg.k` exceeds what a row can see.
pub(crate) fn search_step(
    ctx: &Context,
    queries: Rows<'_>,
    refs: Embeddings<'_>,
    cfg: &KnnConfig,
    (excluded, direct): (&[u32], bool),
    report: &Reporter<'_>,
) -> Result<Neighbours> {
    let job = (excluded, report, direct);
    search(ctx, queries, refs, cfg, job, gpu::Output::Host)
}

/// Sorts `rows` lists of `k` `(key, index)` pairs (flat, row-major) best first into `out`'s
/// rows, converting keys back to scores. Rows are spread over the available threads.
pub(crate) fn sort_rows(
    pairs: &mut [[u32; 2]],
    k: usize,
    largest: bool,
    out: &mut Neighbours,
    row0: usize,
) {
    let rows = pairs.len() / k.max(1);
    let threads = threads();
    let per = rows.div_ceil(threads).max(1);
    let indices = out.indices.slice_mut(s![row0..row0 + rows, ..]);
    let scores = out.scores.slice_mut(s![row0..row0 + rows, ..]);
    let sort_block = |pairs: &mut [[u32; 2]],
                      mut idx: ndarray::ArrayViewMut2<'_, u32>,
                      mut val: ndarray::ArrayViewMut2<'_, f32>| {
        for (r, list) in pairs.chunks_exact_mut(k).enumerate() {
            list.sort_unstable_by(|a, b| (a[0], a[1]).cmp(&(b[0], b[1])));
            for (j, &[key, index]) in list.iter().enumerate() {
                idx[[r, j]] = index;
                val[[r, j]] = if index >= EMPTY_INDEX {
                    f32::NAN
                } else {
                    score_of(key, largest)
                };
            }
        }
    };
    if rows * k < 1 << 16 || threads == 1 {
        sort_block(pairs, indices, scores);
        return;
    }
    std::thread::scope(|scope| {
        let mut rest = (pairs, indices, scores);
        let mut workers = Vec::new();
        while !rest.0.is_empty() {
            let take = per.min(rest.0.len() / k);
            let (p, p_rest) = rest.0.split_at_mut(take * k);
            let (i, i_rest) = rest.1.split_at(ndarray::Axis(0), take);
            let (v, v_rest) = rest.2.split_at(ndarray::Axis(0), take);
            workers.push(scope.spawn(move || sort_block(p, i, v)));
            rest = (p_rest, i_rest, v_rest);
        }
        // A worker only panics on a bug: its panic is passed on, with its message.
        for w in workers {
            if let Err(panic) = w.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
}

/// Merges per-shard lists (shard `s` covers references `bounds[s]`) into the best `k` per row.
pub(crate) fn merge(
    parts: &[Neighbours],
    bounds: &[(usize, usize)],
    q: usize,
    k: usize,
    largest: bool,
) -> Neighbours {
    let mut pairs = Vec::with_capacity(q * k);
    let mut row: Vec<[u32; 2]> = Vec::new();
    for i in 0..q {
        row.clear();
        for (part, &(start, _)) in parts.iter().zip(bounds) {
            for (&index, &score) in part.indices.row(i).iter().zip(part.scores.row(i)) {
                if index < EMPTY_INDEX {
                    row.push([key_of(score, largest), index + start as u32]);
                }
            }
        }
        row.sort_unstable_by(|a, b| (a[0], a[1]).cmp(&(b[0], b[1])));
        row.resize(k, [u32::MAX, EMPTY_INDEX]);
        pairs.extend_from_slice(&row[..k]);
    }
    let mut out = Neighbours::empty(q, k);
    sort_rows(&mut pairs, k, largest, &mut out, 0);
    out
}
