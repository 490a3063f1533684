//! Triplet mining: every valid triplet from labels (PML `get_all_triplets_indices`) and PML's
//! `TripletMarginMiner`, chunked by anchors under the budget, with no limit from `B·M·M`.

use std::hash::Hash;
use std::ops::ControlFlow;

use ndarray::{Array2, ArrayView1, ArrayView2};

use crate::context::{ComputePath, Context, GpuDevice};
use crate::distance::{Distance, DistanceConfig};
use crate::error::{Error, Result};
use crate::kernels::distance_tile::{self, DistanceTile, TileBuffers};
use crate::kernels::row_norms::{self, RowNorms};
use crate::kernels::triplet_lists::{self, ListBuffers, TripletLists};
use crate::kernels::triplet_select::{self, words, Pass, SelectBuffers, TripletSelect};
use crate::memory::TrackedBuffer;
use crate::mining_set::{self, MiningSet, Prepared, SelfExclusion};
use crate::native;
use crate::plan::{plan_rows, DeviceCaps, Footprint};
use crate::transfer::{self, Staging};

/// PML's `type_of_triplets` for [`TripletRule::Margin`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TripletType {
    /// `tm <= margin`.
    #[default]
    All,
    /// `tm <= margin` and `tm <= 0` (a tie, `tm = 0`, is hard).
    Hard,
    /// `0 < tm <= margin`.
    Semihard,
    /// `tm > margin` (`tm = margin` is not easy).
    Easy,
}

/// Which triplets to keep.
///
/// With `tm = d(a, n) − d(a, p)` for distances and `s(a, p) − s(a, n)` for similarities (PML's
/// sign convention), [`TripletRule::Margin`] keeps what PML's `TripletMarginMiner` keeps.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{TripletRule, TripletType};
/// let semihard = TripletRule::margin_miner(TripletType::Semihard);
/// assert_eq!(semihard, TripletRule::Margin { kind: TripletType::Semihard, margin: 0.2 });
/// assert!(semihard.keeps(0.5, 0.6, false)); // tm = 0.1 ∈ (0, 0.2]
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TripletRule {
    /// Every `(a, p, n)` with `label[a] = label[p] ≠ label[n]` (PML
    /// `get_all_triplets_indices`); needs labels only.
    AllValid,
    /// PML `TripletMarginMiner(margin, type_of_triplets)`; needs embeddings.
    Margin {
        /// all / hard / semihard / easy.
        kind: TripletType,
        /// The margin (PML default 0.2). Any finite value.
        margin: f32,
    },
}

impl TripletRule {
    /// `TripletMarginMiner` with PML's default margin, 0.2.
    pub fn margin_miner(kind: TripletType) -> Self {
        TripletRule::Margin { kind, margin: 0.2 }
    }

    /// Whether a triplet with anchor-positive value `ap` and anchor-negative value `an` is kept;
    /// `similarity` flips the sign of `tm` as PML's `is_inverted` does.
    pub fn keeps(&self, ap: f32, an: f32, similarity: bool) -> bool {
        let TripletRule::Margin { kind, margin } = *self else {
            return true;
        };
        let tm = if similarity { ap - an } else { an - ap };
        match kind {
            TripletType::All => tm <= margin,
            TripletType::Hard => tm <= margin && tm <= 0.0,
            TripletType::Semihard => tm <= margin && tm > 0.0,
            TripletType::Easy => tm > margin,
        }
    }

    /// The shader's `mode` code.
    pub(crate) fn mode(&self) -> u32 {
        match self {
            TripletRule::AllValid => 0,
            TripletRule::Margin { kind, .. } => match kind {
                TripletType::All => 1,
                TripletType::Hard => 2,
                TripletType::Semihard => 3,
                TripletType::Easy => 4,
            },
        }
    }

    fn margin(&self) -> f32 {
        match self {
            TripletRule::AllValid => 0.0,
            TripletRule::Margin { margin, .. } => *margin,
        }
    }
}

/// How to mine. Defaults: every valid triplet, PML's default distance, at most 4 Mi triplets
/// (48 MiB) per streamed chunk.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{TripletConfig, TripletRule, TripletType};
/// let cfg = TripletConfig { rule: TripletRule::margin_miner(TripletType::Hard), ..Default::default() };
/// assert_eq!(cfg.max_chunk_triplets, 1 << 22);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct TripletConfig {
    /// Which triplets. Default: [`TripletRule::AllValid`].
    pub rule: TripletRule,
    /// Distance for margin rules. Default: Euclidean on normalised embeddings (PML `LpDistance()`).
    pub distance: DistanceConfig,
    /// Self-exclusion when references are given. Default [`SelfExclusion::None`]; without
    /// references it is always [`SelfExclusion::SameIndex`] (PML's default).
    pub self_exclusion: SelfExclusion,
    /// Most triplets per chunk handed to a streaming callback (raised to the number of
    /// references if smaller: one pair can yield that many). Default `1 << 22`.
    pub max_chunk_triplets: usize,
}

impl Default for TripletConfig {
    fn default() -> Self {
        Self {
            rule: TripletRule::AllValid,
            distance: DistanceConfig::default(),
            self_exclusion: SelfExclusion::None,
            max_chunk_triplets: 1 << 22,
        }
    }
}

/// Mined triplets in lexicographic `(a, p, n)` order.
#[derive(Debug, Clone)]
pub struct Triplets {
    /// `(t, 3)`: rows `(anchor, positive, negative)`; anchors index the queries, positives and
    /// negatives the references.
    pub indices: Array2<u32>,
    /// Where they were mined.
    pub path: ComputePath,
}

impl Triplets {
    /// Number of triplets.
    pub fn len(&self) -> usize {
        self.indices.nrows()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.indices.nrows() == 0
    }

    /// Anchor indices `(t,)`.
    pub fn anchors(&self) -> ArrayView1<'_, u32> {
        self.indices.column(0)
    }

    /// Positive indices `(t,)`.
    pub fn positives(&self) -> ArrayView1<'_, u32> {
        self.indices.column(1)
    }

    /// Negative indices `(t,)`.
    pub fn negatives(&self) -> ArrayView1<'_, u32> {
        self.indices.column(2)
    }
}

/// The number of triplets a call found (or delivered, when streaming stopped early).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TripletCount {
    /// Triplets; a `u64`, because `B·M·M` easily passes 2³².
    pub count: u64,
    /// Where they were counted.
    pub path: ComputePath,
}

/// A validated triplet problem.
pub(crate) struct Problem<'a> {
    pub(crate) set: Prepared<'a>,
    pub(crate) rule: TripletRule,
    pub(crate) distance: DistanceConfig,
    /// Triplets per emitted chunk, at least the number of references.
    pub(crate) chunk: usize,
}

/// A streaming callback: receives consecutive chunks `(t, 3)`; `Break` stops mining.
pub(crate) type Callback<'s> = &'s mut dyn FnMut(ArrayView2<'_, u32>) -> ControlFlow<()>;

/// Where mined triplets go: appended to one flat `(a, p, n)` vector (no intermediate copy),
/// or handed to a callback chunk by chunk through a reused buffer.
pub(crate) enum Sink<'s> {
    Collect(&'s mut Vec<u32>),
    Stream {
        callback: Callback<'s>,
        buffer: Vec<u32>,
    },
}

impl Sink<'_> {
    /// Room for `triplets` more rows (collecting only: a stream holds one chunk at a time).
    pub(crate) fn reserve(&mut self, triplets: u64) {
        if let Sink::Collect(all) = self {
            all.reserve(3 * triplets as usize);
        }
    }

    /// Delivers the rows that `fill` appends to the vector it is given.
    pub(crate) fn deliver(&mut self, fill: impl FnOnce(&mut Vec<u32>)) -> ControlFlow<()> {
        match self {
            Sink::Collect(all) => {
                fill(all);
                ControlFlow::Continue(())
            }
            Sink::Stream { callback, buffer } => {
                buffer.clear();
                fill(buffer);
                match ArrayView2::from_shape((buffer.len() / 3, 3), &buffer[..]) {
                    Ok(rows) if rows.nrows() > 0 => callback(rows),
                    _ => ControlFlow::Continue(()),
                }
            }
        }
    }
}

fn prepare<'a, L: Hash + Eq + Copy>(
    op: &'static str,
    queries: &MiningSet<'a, L>,
    refs: Option<&MiningSet<'a, L>>,
    cfg: &TripletConfig,
) -> Result<Problem<'a>> {
    let needs_embeddings = match cfg.rule {
        TripletRule::AllValid => false,
        TripletRule::Margin { margin, .. } => {
            if !margin.is_finite() {
                return Err(Error::InvalidParameter {
                    op,
                    what: "margin",
                    value: margin.to_string(),
                    rule: "must be finite",
                });
            }
            true
        }
    };
    let set = mining_set::prepare(op, queries, refs, &cfg.self_exclusion, needs_embeddings)?;
    let chunk = cfg.max_chunk_triplets.max(set.ref_labels.len()).max(1);
    Ok(Problem {
        set,
        rule: cfg.rule,
        distance: cfg.distance,
        chunk,
    })
}

const OP: &str = "mine_triplets";

/// Mines triplets of `queries` `(b,)` against `refs` `(m,)` (`None`: the queries themselves,
/// each query excluded as its own positive), returning all of them in lexicographic
/// `(a, p, n)` order, as PML does.
///
/// On the wgpu path anchors are processed in chunks sized to the budget; for each chunk the
/// distance tile, the per-anchor positive/negative lists, the per-pair counts (prefix-summed
/// on the host as `u64`) and the triplets are computed by kernels. The whole result is held in
/// host memory: for outputs larger than memory use [`mine_triplets_streaming`] or
/// [`count_triplets`].
///
/// # Errors
/// [`Error::Shape`] when labels and embeddings disagree in length, `d` is 0 or differs, or the
/// self-exclusion slots are not one per query; [`Error::NonFinite`] for NaN/inf embeddings;
/// [`Error::InvalidParameter`] for a non-finite margin or a margin rule without embeddings;
/// [`Error::OverBudget`] / [`Error::DeviceLimit`] when one anchor's working set cannot fit.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{mine_triplets, Context, MiningSet, TripletConfig};
/// let ctx = Context::native_cpu(None);
/// let labels = array![0, 0, 1];
/// let t = mine_triplets(&ctx, &MiningSet::labels(labels.view()), None, &TripletConfig::default())?;
/// assert_eq!(t.indices, array![[0u32, 1, 2], [1, 0, 2]]);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn mine_triplets<'a, L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'a, L>,
    refs: Option<&MiningSet<'a, L>>,
    cfg: &TripletConfig,
) -> Result<Triplets> {
    let problem = prepare(OP, queries, refs, cfg)?;
    let mut flat: Vec<u32> = Vec::new();
    run(ctx, &problem, Some(Sink::Collect(&mut flat)))?;
    let rows = flat.len() / 3;
    let indices = Array2::from_shape_vec((rows, 3), flat).map_err(|e| Error::Readback {
        label: "mine_triplets::indices",
        message: e.to_string(),
    })?;
    Ok(Triplets {
        indices,
        path: ctx.path(),
    })
}

/// Mines like [`mine_triplets`] but hands the triplets to `on_chunk` in consecutive chunks
/// `(t, 3)` of at most `max(cfg.max_chunk_triplets, m)` rows, in the same order, so host and
/// device memory stay bounded whatever the total. Returning `ControlFlow::Break(())` stops.
///
/// # Errors
/// As [`mine_triplets`].
///
/// # Example
/// ```
/// use std::ops::ControlFlow;
/// use ndarray::array;
/// use wgpu_metric_learning::{mine_triplets_streaming, Context, MiningSet, TripletConfig};
/// let ctx = Context::native_cpu(None);
/// let labels = array![0, 0, 1, 1];
/// let mut seen = 0;
/// let n = mine_triplets_streaming(&ctx, &MiningSet::labels(labels.view()), None,
///     &TripletConfig::default(), |chunk| { seen += chunk.nrows(); ControlFlow::Continue(()) })?;
/// assert_eq!((n.count, seen), (8, 8));
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn mine_triplets_streaming<'a, L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'a, L>,
    refs: Option<&MiningSet<'a, L>>,
    cfg: &TripletConfig,
    mut on_chunk: impl FnMut(ArrayView2<'_, u32>) -> ControlFlow<()>,
) -> Result<TripletCount> {
    let problem = prepare(OP, queries, refs, cfg)?;
    let sink = Sink::Stream {
        callback: &mut on_chunk,
        buffer: Vec::new(),
    };
    let count = run(ctx, &problem, Some(sink))?;
    Ok(TripletCount {
        count,
        path: ctx.path(),
    })
}

/// Counts the triplets [`mine_triplets`] would return, without producing them (no output
/// buffers at all), as a `u64`.
///
/// # Errors
/// As [`mine_triplets`].
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{count_triplets, Context, MiningSet, TripletConfig};
/// let ctx = Context::native_cpu(None);
/// let labels = array![0, 0, 1, 1, 2];
/// let n = count_triplets(&ctx, &MiningSet::labels(labels.view()), None, &TripletConfig::default())?;
/// assert_eq!(n.count, 4 * 3);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn count_triplets<'a, L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'a, L>,
    refs: Option<&MiningSet<'a, L>>,
    cfg: &TripletConfig,
) -> Result<TripletCount> {
    let problem = prepare(OP, queries, refs, cfg)?;
    let count = run(ctx, &problem, None)?;
    Ok(TripletCount {
        count,
        path: ctx.path(),
    })
}

/// Mines `problem`, streaming chunks into `sink` (or only counting when `None`); returns the
/// number of triplets found (delivered, if the sink stopped early).
pub(crate) fn run(ctx: &Context, problem: &Problem<'_>, sink: Option<Sink<'_>>) -> Result<u64> {
    if problem.set.labels.is_empty() || problem.set.ref_labels.is_empty() {
        return Ok(0);
    }
    match ctx.gpu() {
        None => Ok(native::triplets(problem, sink)),
        Some(gpu) => on_gpu(ctx, gpu, problem, sink),
    }
}

/// Sizes of every buffer one anchor chunk uses; the plan's footprint and the allocations both
/// come from here, so the plan counts exactly what is allocated.
#[derive(Debug, Clone, Copy)]
struct Layout {
    anchors: usize,
    refs: usize,
    /// `vec4`s per embedding row; 0 for label-only rules (distance buffers are 4-byte dummies).
    dim4: usize,
    /// Triplets per output window; 0 when only counting (output buffers are dummies).
    out: usize,
}

fn f32s(n: usize) -> u64 {
    transfer::buffer_size(4 * n as u64)
}

fn uniform_size<T>() -> u64 {
    transfer::buffer_size(std::mem::size_of::<T>() as u64)
}

impl Layout {
    fn with_embeddings(&self) -> bool {
        self.dim4 > 0
    }
    fn ref_embeddings(&self) -> u64 {
        f32s(self.refs * self.dim4 * 4)
    }
    fn ref_norms(&self) -> u64 {
        f32s(if self.with_embeddings() { self.refs } else { 0 })
    }
    fn anchor_embeddings(&self) -> u64 {
        f32s(self.anchors * self.dim4 * 4)
    }
    fn anchor_norms(&self) -> u64 {
        f32s(if self.with_embeddings() {
            self.anchors
        } else {
            0
        })
    }
    fn distances(&self) -> u64 {
        f32s(if self.with_embeddings() {
            self.anchors * self.refs
        } else {
            0
        })
    }
    fn matrix(&self) -> u64 {
        f32s(self.anchors * self.refs)
    }
    fn offsets(&self) -> u64 {
        // One `vec2<u32>` per pair; at least one, since the shader's element is 8 bytes.
        let pairs = if self.out > 0 {
            self.anchors * self.refs
        } else {
            1
        };
        transfer::buffer_size(8 * pairs.max(1) as u64)
    }
    /// The emit pass writes one u32 (the negative) per triplet; the host adds (a, p).
    fn out(&self) -> u64 {
        f32s(self.out)
    }

    fn footprint(&self) -> Footprint {
        let buffers = [
            uniform_size::<triplet_lists::Params>(),
            uniform_size::<triplet_select::Params>(),
            uniform_size::<row_norms::Params>(),
            uniform_size::<row_norms::Params>(),
            uniform_size::<distance_tile::Params>(),
            f32s(self.refs),       // ref labels
            self.ref_embeddings(), // refs stay resident across chunks
            self.ref_norms(),
            f32s(self.anchors), // anchor labels
            f32s(self.anchors), // self slots
            self.anchor_embeddings(),
            self.anchor_norms(),
            self.distances(),
            self.matrix(),          // positives
            self.matrix(),          // negatives
            self.matrix(),          // pair counts
            self.matrix(),          // pair-count staging
            f32s(2 * self.anchors), // list counts
            f32s(2 * self.anchors), // list-count staging
            self.offsets(),
            self.out(),
            self.out(), // output staging
        ];
        let refs_groups = (self.refs as u64).div_ceil(distance_tile::BLOCK);
        Footprint {
            bytes: buffers.iter().sum(),
            largest_buffer: buffers.iter().copied().max().unwrap_or(0),
            workgroups: refs_groups.max(self.anchors as u64),
            workgroup_storage: distance_tile::WORKGROUP_STORAGE
                .max(triplet_select::WORKGROUP_STORAGE),
        }
    }
}

/// Anchors per chunk and triplets per output window: windows as large as asked (halved down to
/// one pair's worst case, `m`, if needed), then as many anchors as fit beside them.
fn plan(problem: &Problem<'_>, emit: bool, budget: u64, caps: &DeviceCaps) -> Result<Layout> {
    let (b, m) = (problem.set.labels.len(), problem.set.ref_labels.len());
    let dim4 = problem.set.queries.map_or(0, |q| q.ncols().div_ceil(4));
    let min_out = if emit { m } else { 0 };
    let mut out = if emit { problem.chunk } else { 0 };
    loop {
        let cost = |anchors| {
            Layout {
                anchors,
                refs: m,
                dim4,
                out,
            }
            .footprint()
        };
        match plan_rows(OP, b, m, budget, caps, cost) {
            Ok(p) => {
                return Ok(Layout {
                    anchors: p.rows,
                    refs: m,
                    dim4,
                    out,
                })
            }
            Err(_) if out > min_out => out = (out / 2).max(min_out),
            Err(e) => return Err(e),
        }
    }
}

/// Every device buffer of a mining call.
struct Buffers {
    lists_params: TrackedBuffer,
    select_params: TrackedBuffer,
    anchor_norm_params: TrackedBuffer,
    ref_norm_params: TrackedBuffer,
    tile_params: TrackedBuffer,
    ref_labels: TrackedBuffer,
    ref_embeddings: TrackedBuffer,
    ref_norms: TrackedBuffer,
    anchor_labels: TrackedBuffer,
    self_slots: TrackedBuffer,
    anchor_embeddings: TrackedBuffer,
    anchor_norms: TrackedBuffer,
    distances: TrackedBuffer,
    positives: TrackedBuffer,
    negatives: TrackedBuffer,
    pair_counts: TrackedBuffer,
    pair_count_staging: Staging,
    list_counts: TrackedBuffer,
    list_count_staging: Staging,
    pair_base: TrackedBuffer,
    offsets: TrackedBuffer,
    out: TrackedBuffer,
    out_staging: Staging,
}

impl Buffers {
    fn new(ctx: &Context, gpu: &GpuDevice, l: &Layout) -> Result<Self> {
        let input = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
        let make = |label, size| transfer::create_buffer(ctx, gpu, label, size, input);
        let output = |label, size| transfer::output(ctx, gpu, label, size);
        let uniform = |label, size| {
            transfer::create_buffer(
                ctx,
                gpu,
                label,
                size,
                wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            )
        };
        Ok(Self {
            lists_params: uniform(
                "mine_triplets::lists_params",
                uniform_size::<triplet_lists::Params>(),
            )?,
            select_params: uniform(
                "mine_triplets::select_params",
                uniform_size::<triplet_select::Params>(),
            )?,
            anchor_norm_params: uniform(
                "mine_triplets::anchor_norm_params",
                uniform_size::<row_norms::Params>(),
            )?,
            ref_norm_params: uniform(
                "mine_triplets::ref_norm_params",
                uniform_size::<row_norms::Params>(),
            )?,
            tile_params: uniform(
                "mine_triplets::tile_params",
                uniform_size::<distance_tile::Params>(),
            )?,
            ref_labels: make("mine_triplets::ref_labels", f32s(l.refs))?,
            ref_embeddings: make("mine_triplets::ref_embeddings", l.ref_embeddings())?,
            ref_norms: output("mine_triplets::ref_norms", l.ref_norms())?,
            anchor_labels: make("mine_triplets::anchor_labels", f32s(l.anchors))?,
            self_slots: make("mine_triplets::self_slots", f32s(l.anchors))?,
            anchor_embeddings: make("mine_triplets::anchor_embeddings", l.anchor_embeddings())?,
            anchor_norms: output("mine_triplets::anchor_norms", l.anchor_norms())?,
            distances: output("mine_triplets::distances", l.distances())?,
            positives: output("mine_triplets::positives", l.matrix())?,
            negatives: output("mine_triplets::negatives", l.matrix())?,
            pair_counts: output("mine_triplets::pair_counts", l.matrix())?,
            pair_count_staging: Staging::new(
                ctx,
                gpu,
                "mine_triplets::pair_count_staging",
                l.matrix(),
            )?,
            list_counts: output("mine_triplets::list_counts", f32s(2 * l.anchors))?,
            list_count_staging: Staging::new(
                ctx,
                gpu,
                "mine_triplets::list_count_staging",
                f32s(2 * l.anchors),
            )?,
            pair_base: make("mine_triplets::pair_base", f32s(l.anchors + 1))?,
            offsets: make("mine_triplets::offsets", l.offsets())?,
            out: output("mine_triplets::out", l.out())?,
            out_staging: Staging::new(ctx, gpu, "mine_triplets::out_staging", l.out())?,
        })
    }
}

/// Runs `pass` over `pairs`, split into dispatches that fit a 2-D grid of the device
/// (`limit²` workgroups), each with its own `[pair_lo, pair_hi)` in the uniform block.
fn dispatch_pairs(
    gpu: &GpuDevice,
    select: &TripletSelect,
    pass: Pass,
    sb: &SelectBuffers<'_>,
    params: &mut triplet_select::Params,
    pairs: std::ops::Range<u32>,
) -> Result<()> {
    let limit = u64::from(gpu.limits.max_compute_workgroups_per_dimension);
    let per_group = match pass {
        Pass::Count => 1,
        Pass::Emit => triplet_select::EMIT_WORKGROUP_SIZE,
    };
    let step = (limit * limit * per_group).min(u64::from(u32::MAX)) as u32;
    let mut lo = pairs.start;
    while lo < pairs.end {
        let hi = lo.saturating_add(step).min(pairs.end);
        params.pair_lo = lo;
        params.pair_hi = hi;
        transfer::write(gpu, sb.params, 0, &[*params])?;
        let mut enc = encoder(gpu, "mine_triplets::select");
        select.encode(gpu, &mut enc, pass, u64::from(hi - lo), sb)?;
        transfer::submit_and_wait(gpu, enc)?;
        lo = hi;
    }
    Ok(())
}

/// Walks pairs in order, yielding each one's chunk-local anchor and positive slot.
struct PairCursor<'a> {
    pair_base: &'a [u32],
    anchor: usize,
    pair: u32,
}

impl<'a> PairCursor<'a> {
    /// Positioned at `pair`.
    fn new(pair_base: &'a [u32], pair: u32) -> Self {
        // The owner of `pair`: the last anchor whose base is at most `pair`.
        let anchor = pair_base.partition_point(|&b| b <= pair).saturating_sub(1);
        Self {
            pair_base,
            anchor,
            pair,
        }
    }

    /// The current pair's (anchor, index among the anchor's positives); then moves on.
    fn next_pair(&mut self) -> (usize, usize) {
        while self.pair_base[self.anchor + 1] <= self.pair {
            self.anchor += 1;
        }
        let here = (self.anchor, (self.pair - self.pair_base[self.anchor]) as usize);
        self.pair += 1;
        here
    }
}

/// Appends a window's triplets to `rows` as `(a, p, n)`: pair `k` of the window contributes
/// `counts[k]` consecutive negatives, all with the pair's (anchor, positive).
fn expand(
    rows: &mut Vec<u32>,
    negatives: &[u32],
    counts: &[u32],
    mut pairs: PairCursor<'_>,
    anchor_positive: impl Fn(usize, usize) -> (u32, u32),
) {
    let base = rows.len();
    rows.resize(base + 3 * negatives.len(), 0);
    let mut out = rows[base..].chunks_exact_mut(3);
    let mut rest = negatives;
    for &c in counts {
        let (a, i) = pairs.next_pair();
        let (head, tail) = rest.split_at((c as usize).min(rest.len()));
        rest = tail;
        if head.is_empty() {
            continue;
        }
        let (anchor, positive) = anchor_positive(a, i);
        // `head` first: zip stops on it without taking a row from `out`.
        for (&n, row) in head.iter().zip(out.by_ref()) {
            row.copy_from_slice(&[anchor, positive, n]);
        }
    }
}

fn encoder(gpu: &GpuDevice, label: &'static str) -> wgpu::CommandEncoder {
    gpu.device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) })
}

fn on_gpu(
    ctx: &Context,
    gpu: &GpuDevice,
    problem: &Problem<'_>,
    mut sink: Option<Sink<'_>>,
) -> Result<u64> {
    let (b, m) = (problem.set.labels.len(), problem.set.ref_labels.len());
    let caps = DeviceCaps::from_limits(&gpu.limits);
    let layout = plan(problem, sink.is_some(), ctx.tracker().available(), &caps)?;
    let buf = Buffers::new(ctx, gpu, &layout)?;
    let lists = gpu.kernel::<TripletLists>()?;
    let select = gpu.kernel::<TripletSelect>()?;
    let embeddings = problem.set.queries.zip(problem.set.refs);
    let (norms, tile) = if embeddings.is_some() {
        (
            Some(gpu.kernel::<RowNorms>()?),
            Some(gpu.kernel::<DistanceTile>()?),
        )
    } else {
        (None, None)
    };
    let dim4 = layout.dim4 as u32;

    transfer::write(gpu, &buf.ref_labels, 0, &problem.set.ref_labels)?;
    if let Some((_, refs)) = embeddings {
        transfer::write(
            gpu,
            &buf.ref_embeddings,
            0,
            &transfer::padded_rows(refs, 0, m, layout.dim4),
        )?;
        let params = row_norms::Params {
            rows: m as u32,
            dim4,
            _pad: [0; 2],
        };
        transfer::write(gpu, &buf.ref_norm_params, 0, &[params])?;
        transfer::fill_sentinel(ctx, gpu, &buf.ref_norms, f32s(m))?;
    }
    let mut select_params = triplet_select::Params {
        anchors: 0,
        refs: m as u32,
        _pad0: 0,
        mode: problem.rule.mode(),
        inverted: u32::from(problem.distance.distance.is_similarity()),
        margin: problem.rule.margin(),
        pair_lo: 0,
        pair_hi: 0,
        start: [0; 2],
        _pad: [0; 2],
    };

    let mut total = 0u64;
    for a0 in (0..b).step_by(layout.anchors) {
        let rows = layout.anchors.min(b - a0);
        let span = a0..a0 + rows;
        transfer::write(
            gpu,
            &buf.anchor_labels,
            0,
            &problem.set.labels[span.clone()],
        )?;
        transfer::write(gpu, &buf.self_slots, 0, &problem.set.self_slots[span])?;
        let lists_params = triplet_lists::Params {
            anchors: rows as u32,
            refs: m as u32,
            _pad: [0; 2],
        };
        transfer::write(gpu, &buf.lists_params, 0, &[lists_params])?;
        select_params.anchors = rows as u32;
        transfer::write(gpu, &buf.select_params, 0, &[select_params])?;
        for (buffer, bytes) in [
            (&buf.positives, f32s(rows * m)),
            (&buf.negatives, f32s(rows * m)),
            (&buf.pair_counts, f32s(rows * m)),
            (&buf.list_counts, f32s(2 * rows)),
        ] {
            transfer::fill_sentinel(ctx, gpu, buffer, bytes)?;
        }

        let mut enc = encoder(gpu, "mine_triplets::count");
        if let (Some((queries, _)), Some(norms), Some(tile)) = (embeddings, &norms, &tile) {
            transfer::write(
                gpu,
                &buf.anchor_embeddings,
                0,
                &transfer::padded_rows(queries, a0, rows, layout.dim4),
            )?;
            let params = row_norms::Params {
                rows: rows as u32,
                dim4,
                _pad: [0; 2],
            };
            transfer::write(gpu, &buf.anchor_norm_params, 0, &[params])?;
            let tile_params = distance_tile::Params {
                rows: rows as u32,
                cols: m as u32,
                dim4,
                metric: problem.distance.distance.code(),
                normalize: u32::from(
                    problem.distance.normalize || problem.distance.distance == Distance::Cosine,
                ),
                _pad: [0; 3],
            };
            transfer::write(gpu, &buf.tile_params, 0, &[tile_params])?;
            transfer::fill_sentinel(ctx, gpu, &buf.anchor_norms, f32s(rows))?;
            transfer::fill_sentinel(ctx, gpu, &buf.distances, f32s(rows * m))?;
            if a0 == 0 {
                let r = &buf;
                norms.encode(
                    gpu,
                    &mut enc,
                    m as u64,
                    &r.ref_norm_params,
                    &r.ref_embeddings,
                    &r.ref_norms,
                )?;
            }
            norms.encode(
                gpu,
                &mut enc,
                rows as u64,
                &buf.anchor_norm_params,
                &buf.anchor_embeddings,
                &buf.anchor_norms,
            )?;
            let tb = TileBuffers {
                params: &buf.tile_params,
                queries: &buf.anchor_embeddings,
                refs: &buf.ref_embeddings,
                query_sq_norms: &buf.anchor_norms,
                ref_sq_norms: &buf.ref_norms,
                out: &buf.distances,
            };
            tile.encode(gpu, &mut enc, rows as u64, m as u64, &tb)?;
        }
        let lb = ListBuffers {
            params: &buf.lists_params,
            anchor_labels: &buf.anchor_labels,
            ref_labels: &buf.ref_labels,
            self_slots: &buf.self_slots,
            positives: &buf.positives,
            negatives: &buf.negatives,
            list_counts: &buf.list_counts,
        };
        lists.encode(gpu, &mut enc, rows as u64, &lb)?;
        buf.list_count_staging
            .copy_from(&mut enc, &buf.list_counts, 8 * rows as u64);
        // Emitting needs each pair's positive on the host, to expand negatives to (a, p, n).
        // The pair-count staging buffer is free until the count pass.
        if sink.is_some() {
            buf.pair_count_staging
                .copy_from(&mut enc, &buf.positives, 4 * (rows * m) as u64);
        }
        transfer::submit_and_wait(gpu, enc)?;
        let lists: Vec<u32> = buf
            .list_count_staging
            .read::<u32, _>(gpu, 2 * rows, <[u32]>::to_vec)?;
        let positive_lists: Vec<u32> = if sink.is_some() {
            buf.pair_count_staging
                .read::<u32, _>(gpu, rows * m, <[u32]>::to_vec)?
        } else {
            Vec::new()
        };

        // Pairs are numbered densely in (anchor, positive) order; anchor a owns
        // pair_base[a] .. pair_base[a + 1].
        let mut pair_base = Vec::with_capacity(rows + 1);
        let mut pairs = 0u32;
        for counts in lists.chunks_exact(2) {
            pair_base.push(pairs);
            pairs += counts[0];
        }
        pair_base.push(pairs);
        if pairs == 0 {
            continue;
        }
        transfer::write(gpu, &buf.pair_base, 0, &pair_base)?;
        let sb = SelectBuffers {
            params: &buf.select_params,
            distances: &buf.distances,
            positives: &buf.positives,
            negatives: &buf.negatives,
            list_counts: &buf.list_counts,
            pair_base: &buf.pair_base,
            pair_counts: &buf.pair_counts,
            offsets: &buf.offsets,
            out: &buf.out,
        };

        // Per-pair counts. Every valid triplet: the anchor's negative count, known from the
        // lists. Margin rules: the count pass, one workgroup per pair.
        let counts: Vec<u32> = if problem.rule.mode() == 0 {
            let mut counts = Vec::with_capacity(pairs as usize);
            for (a, pair) in lists.chunks_exact(2).enumerate() {
                counts.resize(pair_base[a + 1] as usize, pair[1]);
            }
            if sink.is_some() {
                transfer::write(gpu, &buf.pair_counts, 0, &counts)?;
            }
            counts
        } else {
            transfer::fill_sentinel(ctx, gpu, &buf.pair_counts, f32s(pairs as usize))?;
            dispatch_pairs(gpu, &select, Pass::Count, &sb, &mut select_params, 0..pairs)?;
            let mut enc = encoder(gpu, "mine_triplets::count_readback");
            buf.pair_count_staging
                .copy_from(&mut enc, &buf.pair_counts, 4 * u64::from(pairs));
            transfer::submit_and_wait(gpu, enc)?;
            buf.pair_count_staging
                .read::<u32, _>(gpu, pairs as usize, <[u32]>::to_vec)?
        };
        let chunk_total: u64 = counts.iter().map(|&c| u64::from(c)).sum();
        let Some(sink) = sink.as_mut() else {
            total += chunk_total;
            continue;
        };

        // Exclusive prefix sums of the counts (u64) place each pair's triplets; windows of
        // whole pairs, each at most `layout.out` triplets, cut the output to the buffer.
        let mut offsets = Vec::with_capacity(pairs as usize);
        let mut windows: Vec<(u32, u32, u64, u64)> = Vec::new(); // (pair_lo, pair_hi, start, end)
        let mut at = 0u64;
        for (pair, &c) in counts.iter().enumerate() {
            offsets.push(words(at));
            let (pair, c) = (pair as u32, u64::from(c));
            match windows.last_mut() {
                Some(w) if at + c - w.2 <= layout.out as u64 => {
                    w.1 = pair + 1;
                    w.3 = at + c;
                }
                _ => windows.push((pair, pair + 1, at, at + c)),
            }
            at += c;
        }
        transfer::write(gpu, &buf.offsets, 0, &offsets)?;
        sink.reserve(chunk_total);
        for (pair_lo, pair_hi, start, end) in windows.into_iter().filter(|w| w.3 > w.2) {
            let len = (end - start) as usize;
            select_params.start = words(start);
            transfer::fill_sentinel(ctx, gpu, &buf.out, f32s(len))?;
            dispatch_pairs(gpu, &select, Pass::Emit, &sb, &mut select_params, pair_lo..pair_hi)?;
            let mut enc = encoder(gpu, "mine_triplets::emit_readback");
            buf.out_staging.copy_from(&mut enc, &buf.out, 4 * len as u64);
            transfer::submit_and_wait(gpu, enc)?;
            let flow = buf.out_staging.read::<u32, _>(gpu, len, |negatives| {
                sink.deliver(|rows| {
                    expand(
                        rows,
                        negatives,
                        &counts[pair_lo as usize..pair_hi as usize],
                        PairCursor::new(&pair_base, pair_lo),
                        |a, i| ((a0 + a) as u32, positive_lists[a * m + i]),
                    )
                })
            })?;
            total += len as u64;
            if flow.is_break() {
                return Ok(total);
            }
        }
    }
    Ok(total)
}
