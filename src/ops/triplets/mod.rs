//! Triplet mining: every valid triplet from labels (PML `get_all_triplets_indices`) and PML's
//! `TripletMarginMiner`, chunked by anchors under the budget, with no limit from `B·M·M`.
//!
//! On the wgpu path, for each chunk of anchors, the distance tile, the per-anchor
//! positive/negative lists, the per-pair counts (prefix-summed on the host as `u64`) and the
//! triplets are computed by kernels (`gpu/`); the native path sorts or scans each anchor's
//! negatives (`native.rs`).

use std::hash::Hash;
use std::ops::{ControlFlow, Range};

use ndarray::{Array2, ArrayView1, ArrayView2};

use crate::context::oom_retry;
use crate::context::plan::{DeviceCaps, Plan};
use crate::context::{ComputePath, Context};
use crate::data::device_output::{output_device, DeviceArray};
use crate::data::inputs::{self, Imports, Labelled, MiningSet, SelfExclusion};
use crate::error::{Error, Result};
use crate::hooks::{Hooks, Reporter};
use crate::metric::DistanceConfig;
use crate::runtime::memory::Transfers;
use crate::runtime::transfer;
use crate::validate;

#[cfg(test)]
mod bounds;
mod gpu;
mod native;
mod plan;
mod sink;

pub(crate) use sink::{Sink, Writer};

/// PML's `type_of_triplets` for [`TripletRule::Margin`].
///
/// # Example
/// ```
/// use wgpu_metric_learning::{TripletRule, TripletType};
/// // Distances d(a, p) = 0.5 and d(a, n) = 0.5: tm = 0, a tie, which is hard, not semihard.
/// let keeps = |kind| TripletRule::margin_miner(kind).keeps(0.5, 0.5, false);
/// assert!(keeps(TripletType::Hard) && keeps(TripletType::All));
/// assert!(!keeps(TripletType::Semihard) && !keeps(TripletType::Easy));
/// ```
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
    ///
    /// See the example of [`TripletRule`].
    pub fn margin_miner(kind: TripletType) -> Self {
        TripletRule::Margin { kind, margin: 0.2 }
    }

    /// Whether a triplet with anchor-positive value `ap` and anchor-negative value `an` is kept;
    /// `similarity` flips the sign of `tm` as PML's `is_inverted` does.
    ///
    /// See the example of [`TripletType`].
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

    /// How many of `sorted` (one anchor's negative values, ascending) this rule keeps against
    /// `ap` (the native path's sorted count): the length of [`Self::kept_range`].
    pub(crate) fn count_sorted(&self, sorted: &[f32], ap: f32, similarity: bool) -> u64 {
        self.kept_range(sorted, ap, similarity).len() as u64
    }

    /// The positions in `sorted` (one anchor's negative values, ascending) of the negatives
    /// this rule keeps against `ap`: one range, because each rule keeps an interval of `tm`
    /// and `tm` is monotone in the negative's value (f32 subtraction rounds monotonically).
    /// Each bound is one binary search evaluating exactly [`Self::keeps`]'s expression.
    pub(crate) fn kept_range(&self, sorted: &[f32], ap: f32, similarity: bool) -> Range<usize> {
        let n = sorted.len();
        let TripletRule::Margin { kind, margin } = *self else {
            return 0..n;
        };
        // The positions with tm <= x: a prefix for distances, a suffix for similarities.
        let le = |x: f32| {
            let split = sorted.partition_point(|&an| {
                let tm = if similarity { ap - an } else { an - ap };
                (tm <= x) != similarity
            });
            if similarity {
                split..n
            } else {
                0..split
            }
        };
        let below_margin = le(margin);
        match kind {
            TripletType::All => below_margin,
            TripletType::Hard => le(margin.min(0.0)),
            // `tm <= margin` without `tm <= 0`.
            TripletType::Semihard if similarity => {
                below_margin.start..le(0.0).start.max(below_margin.start)
            }
            TripletType::Semihard => le(0.0).end.min(below_margin.end)..below_margin.end,
            TripletType::Easy if similarity => 0..below_margin.start,
            TripletType::Easy => below_margin.end..n,
        }
    }

    /// The shader's `mode` code.
    pub(crate) fn mode(&self) -> u32 {
        use crate::kernels::common::rule;
        match self {
            TripletRule::AllValid => rule::ALL_VALID,
            TripletRule::Margin { kind, .. } => match kind {
                TripletType::All => rule::ALL,
                TripletType::Hard => rule::HARD,
                TripletType::Semihard => rule::SEMIHARD,
                TripletType::Easy => rule::EASY,
            },
        }
    }

    pub(crate) fn margin(&self) -> f32 {
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
    /// Which reference is each anchor itself, never its own positive. Default
    /// [`SelfExclusion::Auto`]: the anchor's own row when the references are the queries
    /// (`refs = None`, PML's default), nothing otherwise; a memory bank's enqueue gives
    /// [`SelfExclusion::QuerySlots`].
    pub self_exclusion: SelfExclusion,
    /// Most triplets per chunk handed to a streaming callback (raised to the number of
    /// references if smaller: one pair can yield that many). Default `1 << 22`.
    pub max_chunk_triplets: usize,
    /// How margin rules count each (anchor, positive) pair's triplets. Default
    /// [`CountMethod::Auto`]. The result is the same either way.
    pub count_method: CountMethod,
    /// Progress (anchor–reference pairs mined) and cancellation. Default: none.
    pub hooks: Hooks,
}

/// How margin rules find the kept triplets of each (anchor, positive) pair (to count them,
/// as the whole answer of [`count_triplets`] or before emitting them). All are exact and give
/// the same triplets in the same order.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{count_triplets, Context, CountMethod, MiningSet, TripletConfig, TripletType};
/// let labels = ndarray::array![0, 0, 1, 1, 0];
/// let x = ndarray::array![[0.0f32, 1.0], [0.2, 1.0], [1.0, 0.3], [0.9, 0.5], [0.5, 0.5]];
/// let set = MiningSet::new(&x, &labels);
/// let ctx = Context::native_cpu(None);
/// let count = |count_method| {
///     let cfg = TripletConfig { count_method, ..TripletConfig::margin_miner(TripletType::Semihard) };
///     count_triplets(&ctx, &set, None, &cfg).map(|c| c.count)
/// };
/// assert_eq!(count(CountMethod::Scan)?, count(CountMethod::Sorted)?);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CountMethod {
    /// The cheaper of the two by a cost model of the class sizes: sorting wins unless anchors
    /// have only one or two positives. The wgpu path decides per call, the native path per
    /// anchor (sorting above 16 positives).
    #[default]
    Auto,
    /// Test every (positive, negative) candidate: `O(P·N)` per anchor, to count and again to
    /// emit.
    Scan,
    /// Sort values once per anchor, then binary searches. On the GPU the anchor's positive
    /// values are sorted and its negatives grouped by the positives that keep them, so that
    /// each pair's kept negatives are one run: `O(P log² P + N log P)` per anchor, then
    /// `O(log N)` to count a pair and `O(N/32 + c)` to emit its `c` triplets. Natively the
    /// negative values are sorted: `O((N + P) log N)` per anchor to count.
    Sorted,
}

impl Default for TripletConfig {
    fn default() -> Self {
        Self {
            rule: TripletRule::AllValid,
            distance: DistanceConfig::default(),
            self_exclusion: SelfExclusion::Auto,
            max_chunk_triplets: 1 << 22,
            count_method: CountMethod::Auto,
            hooks: Hooks::default(),
        }
    }
}

impl TripletConfig {
    /// PML's `TripletMarginMiner(margin=0.2, type_of_triplets=kind)` with the other defaults.
    ///
    /// # Example
    /// ```
    /// use wgpu_metric_learning::{TripletConfig, TripletRule, TripletType};
    /// let cfg = TripletConfig::margin_miner(TripletType::Semihard);
    /// assert_eq!(cfg.rule, TripletRule::Margin { kind: TripletType::Semihard, margin: 0.2 });
    /// ```
    pub fn margin_miner(kind: TripletType) -> Self {
        Self {
            rule: TripletRule::margin_miner(kind),
            ..Self::default()
        }
    }
}

/// Mined triplets in lexicographic `(a, p, n)` order.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{mine_triplets, Context, MiningSet, TripletConfig};
/// let labels = ndarray::array![0, 1, 0];
/// let t = mine_triplets(&Context::native_cpu(None), &MiningSet::from_labels(&labels), None, &TripletConfig::default())?;
/// assert_eq!(t.len(), 2);
/// assert_eq!(t.anchors().to_vec(), vec![0, 2]);
/// assert_eq!(t.positives().to_vec(), vec![2, 0]);
/// assert_eq!(t.negatives().to_vec(), vec![1, 1]);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Triplets {
    /// `(t, 3)`: rows `(anchor, positive, negative)`; anchors index the queries, positives and
    /// negatives the references.
    pub indices: Array2<u32>,
    /// Where they were mined.
    pub path: ComputePath,
    /// Host–device traffic of the call (zero on the native path).
    pub transfers: Transfers,
}

impl Triplets {
    /// Number of triplets.
    ///
    /// See the example of [`Triplets`].
    pub fn len(&self) -> usize {
        self.indices.nrows()
    }

    /// Whether there are none.
    ///
    /// See the example of [`Triplets`].
    pub fn is_empty(&self) -> bool {
        self.indices.nrows() == 0
    }

    /// Anchor indices `(t,)`.
    ///
    /// See the example of [`Triplets`].
    pub fn anchors(&self) -> ArrayView1<'_, u32> {
        self.indices.column(0)
    }

    /// Positive indices `(t,)`.
    ///
    /// See the example of [`Triplets`].
    pub fn positives(&self) -> ArrayView1<'_, u32> {
        self.indices.column(1)
    }

    /// Negative indices `(t,)`.
    ///
    /// See the example of [`Triplets`].
    pub fn negatives(&self) -> ArrayView1<'_, u32> {
        self.indices.column(2)
    }
}

/// The number of triplets a call found (or delivered, when streaming stopped early).
///
/// # Example
/// ```
/// use wgpu_metric_learning::{count_triplets, Context, MiningSet, TripletConfig};
/// // 60 000 labels in 10 classes: about 3.2·10¹⁴ triplets, counted without producing them.
/// let labels = ndarray::Array1::from_shape_fn(60_000, |i| i % 10);
/// let n = count_triplets(&Context::native_cpu(None), &MiningSet::from_labels(&labels), None, &TripletConfig::default())?;
/// assert_eq!(n.count, 60_000 * 5_999 * 54_000);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TripletCount {
    /// Triplets; a `u64`, because `B·M·M` easily passes 2³².
    pub count: u64,
    /// Where they were counted.
    pub path: ComputePath,
    /// Host–device traffic of the call (zero on the native path).
    pub transfers: Transfers,
}

/// A validated triplet problem.
pub(crate) struct Problem<'a> {
    pub(crate) set: Labelled<'a>,
    pub(crate) rule: TripletRule,
    pub(crate) distance: DistanceConfig,
    /// Triplets per emitted chunk, at least the number of references.
    pub(crate) chunk: usize,
    pub(crate) count_method: CountMethod,
}

fn prepare<'s, L: Hash + Eq + Copy>(
    op: &'static str,
    ctx: &Context,
    queries: &'s MiningSet<'_, L>,
    refs: Option<&'s MiningSet<'_, L>>,
    cfg: &TripletConfig,
    imports: &'s mut Imports,
) -> Result<Problem<'s>> {
    let needs_embeddings = match cfg.rule {
        TripletRule::AllValid => false,
        TripletRule::Margin { margin, .. } => {
            validate::finite_param(op, "margin", margin)?;
            true
        }
    };
    let set = inputs::prepare(
        op,
        ctx,
        queries,
        refs,
        &cfg.self_exclusion,
        needs_embeddings,
        |_| Ok(true),
        imports,
    )?;
    let chunk = cfg.max_chunk_triplets.max(set.ref_labels.len()).max(1);
    Ok(Problem {
        set,
        rule: cfg.rule,
        distance: cfg.distance,
        chunk,
        count_method: cfg.count_method,
    })
}

pub(crate) const OP: &str = "mine_triplets";

/// Mines triplets of `queries` `(b,)` against `refs` `(m,)` (`None`: the queries themselves),
/// returning all of them in lexicographic `(a, p, n)` order, as PML does; an anchor is never
/// its own positive (`cfg.self_exclusion`). Anchors run in chunks under the budget; the whole
/// result is held in host memory (for more, [`mine_triplets_streaming`] or
/// [`count_triplets`]).
///
/// # Errors
/// [`Error::Shape`] for labels and rows of different lengths, `d` 0 or differing, or slots
/// not one per query; [`Error::NonFinite`]; [`Error::InvalidParameter`] for a non-finite
/// margin, a margin rule without embeddings, a slot past the references or a bank of another
/// context; [`DeviceEmbeddings`](crate::DeviceEmbeddings)' errors; [`Error::OverBudget`] /
/// [`Error::DeviceLimit`] when one anchor cannot fit; [`Error::Cancelled`]; device errors.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{mine_triplets, Context, MiningSet, TripletConfig};
/// let ctx = Context::native_cpu(None);
/// let labels = array![0, 0, 1];
/// let t = mine_triplets(&ctx, &MiningSet::from_labels(&labels), None, &TripletConfig::default())?;
/// assert_eq!(t.indices, array![[0u32, 1, 2], [1, 0, 2]]);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn mine_triplets<L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &TripletConfig,
) -> Result<Triplets> {
    let mut imports = Imports::call();
    let problem = prepare(OP, ctx, queries, refs, cfg, &mut imports)?;
    let mut flat: Vec<u32> = Vec::new();
    let writer = Writer::new(Sink::Collect(&mut flat), problem.chunk, &cfg.hooks, OP);
    let (mined, mut transfers) = transfer::measure(|| run(ctx, &problem, Some(writer), &cfg.hooks));
    transfers.add(problem.set.imported);
    mined?;
    let indices = triplet_rows(OP, flat)?;
    Ok(Triplets {
        indices,
        path: ctx.path(),
        transfers,
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
/// let n = mine_triplets_streaming(&ctx, &MiningSet::from_labels(&labels), None,
///     &TripletConfig::default(), |chunk| { seen += chunk.nrows(); ControlFlow::Continue(()) })?;
/// assert_eq!((n.count, seen), (8, 8));
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn mine_triplets_streaming<L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &TripletConfig,
    mut on_chunk: impl FnMut(ArrayView2<'_, u32>) -> ControlFlow<()>,
) -> Result<TripletCount> {
    let mut imports = Imports::call();
    let problem = prepare(OP, ctx, queries, refs, cfg, &mut imports)?;
    let writer = Writer::new(Sink::Stream(&mut on_chunk), problem.chunk, &cfg.hooks, OP);
    let (count, mut transfers) = transfer::measure(|| run(ctx, &problem, Some(writer), &cfg.hooks));
    transfers.add(problem.set.imported);
    Ok(TripletCount {
        count: count?,
        path: ctx.path(),
        transfers,
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
/// let n = count_triplets(&ctx, &MiningSet::from_labels(&labels), None, &TripletConfig::default())?;
/// assert_eq!(n.count, 4 * 3);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn count_triplets<L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &TripletConfig,
) -> Result<TripletCount> {
    let mut imports = Imports::call();
    let problem = prepare(OP, ctx, queries, refs, cfg, &mut imports)?;
    let (count, mut transfers) = transfer::measure(|| run(ctx, &problem, None, &cfg.hooks));
    transfers.add(problem.set.imported);
    Ok(TripletCount {
        count: count?,
        path: ctx.path(),
        transfers,
    })
}

/// The result of [`mine_triplets_on_device`]: the triplets of [`mine_triplets`], left on the
/// device.
///
/// See the example of [`mine_triplets_on_device`].
#[derive(Debug)]
#[non_exhaustive]
pub struct TripletsOnDevice {
    /// `(t, 3)` rows `(anchor, positive, negative)`: [`Triplets::indices`], in the same order,
    /// on the device. `t` is the count, known on the host.
    pub triplets: DeviceArray<u32>,
    /// Host–device traffic of the call: no triplet read back, only counts (see
    /// [`mine_triplets_on_device`]).
    pub transfers: Transfers,
}

impl TripletsOnDevice {
    /// The number of triplets (rows of [`Self::triplets`]).
    ///
    /// See the example of [`mine_triplets_on_device`].
    pub fn len(&self) -> usize {
        self.triplets.dim().0
    }

    /// Whether no triplet was found.
    ///
    /// See the example of [`mine_triplets_on_device`].
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// [`mine_triplets`] with the triplets left on the device, for a loss that gathers them there:
/// the same `(t, 3)` rows, in the same order, in a [`DeviceArray`] sized exactly, with the
/// count on the host.
///
/// Cost: [`mine_triplets`]'s (a margin rule over several chunks counts first); only counts
/// come back. The array (`12 · t` bytes) counts in the budget while it lives
/// ([`mine_triplets_plan`] plans [`mine_triplets`], not this call).
///
/// # Errors
/// As [`mine_triplets`]; [`Error::InvalidParameter`] on a native context (results on the
/// device need a wgpu context); [`Error::BudgetExceeded`] or [`Error::DeviceLimit`] when the
/// array does not fit the budget left or one buffer.
///
/// # Example
/// ```no_run
/// use wgpu_metric_learning::{mine_triplets, mine_triplets_on_device, Context, ContextConfig, MiningSet, TripletConfig, TripletType};
/// let ctx = Context::new(&ContextConfig::default())?;
/// let x = ndarray::Array2::from_shape_fn((64, 8), |(i, j)| ((i * 5 + j) % 13) as f32);
/// let y = ndarray::Array1::from_shape_fn(64, |i| i % 4);
/// let batch = MiningSet::new(&x, &y);
/// let cfg = TripletConfig::margin_miner(TripletType::Semihard);
/// let mined = mine_triplets_on_device(&ctx, &batch, None, &cfg)?;
/// assert_eq!(mined.triplets.to_host(&ctx)?, mine_triplets(&ctx, &batch, None, &cfg)?.indices);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn mine_triplets_on_device<L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &TripletConfig,
) -> Result<TripletsOnDevice> {
    let gpu = output_device(OP, ctx)?;
    let mut imports = Imports::call();
    let problem = prepare(OP, ctx, queries, refs, cfg, &mut imports)?;
    let (mined, mut transfers) = transfer::measure(|| {
        let (b, m) = (problem.set.labels.len(), problem.set.ref_labels.len());
        let all_valid = problem.rule == TripletRule::AllValid;
        // Progress of both passes (a margin rule counts, then writes), one after the other.
        let pairs = b as u64 * m as u64;
        let report = Reporter::new(&cfg.hooks, OP, pairs * if all_valid { 1 } else { 2 });
        report.check()?;
        let count = if b == 0 || m == 0 {
            0
        } else if all_valid {
            all_valid_count(&problem.set)
        } else {
            // One pass when the anchors fit one chunk and the array fits beside it; else the
            // count sizes the array, and the rows are mined in chunks in what it leaves.
            let part = report.part(pairs);
            let first = oom_retry::retry(ctx, || {
                part.restart();
                gpu.settled(gpu::mine_in_one_chunk(ctx, gpu, &problem, &part))
            })?;
            match first {
                gpu::OneChunk::Mined(triplets) => {
                    // The second pass's share of the progress, done by the same pass.
                    report.part(pairs).add(pairs);
                    return Ok(triplets);
                }
                gpu::OneChunk::Counted(count) => count,
                gpu::OneChunk::Chunked => oom_retry::retry(ctx, || {
                    part.restart();
                    gpu.settled(gpu::mine(ctx, gpu, &problem, (None, true), &part))
                })?,
            }
        };
        let triplets = gpu::triplet_array(gpu, count)?;
        if count > 0 {
            let part = report.part(pairs);
            oom_retry::retry(ctx, || {
                part.restart();
                gpu.settled(gpu::mine_on_device(ctx, gpu, &problem, &triplets, &part))
            })?;
        }
        Ok::<_, Error>(triplets)
    });
    transfers.add(problem.set.imported);
    Ok(TripletsOnDevice {
        triplets: mined?,
        transfers,
    })
}

/// How [`mine_triplets`] (or [`mine_triplets_streaming`]) would run with these arguments on
/// `ctx`: anchors per chunk and the memory a chunk holds with the call's outputs, planned for
/// the budget available now from the inputs' class sizes. Nothing is mined;
/// [`count_triplets`] needs at most as much.
///
/// # Errors
/// As [`mine_triplets`] for bad inputs; [`Error::OverBudget`] (naming the bytes of one
/// anchor's working set) or [`Error::DeviceLimit`] when not even one anchor fits.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{mine_triplets_plan, Context, MiningSet, TripletConfig};
/// let labels = ndarray::Array1::from_shape_fn(4096, |i| i % 100);
/// let ctx = Context::native_cpu(Some(64 << 20));
/// let plan = mine_triplets_plan(&ctx, &MiningSet::from_labels(&labels), None, &TripletConfig::default())?;
/// assert!(plan.bytes <= 64 << 20);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn mine_triplets_plan<L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &TripletConfig,
) -> Result<Plan> {
    let mut imports = Imports::plan();
    let problem = prepare(OP, ctx, queries, refs, cfg, &mut imports)?;
    let b = problem.set.labels.len();
    let plan = match ctx.gpu() {
        None => native::plan(ctx, &problem).map(|p| p.public(&problem)),
        Some(gpu) => {
            let caps = DeviceCaps::from_limits(&gpu.limits);
            let budget = oom_retry::planning_budget(ctx);
            plan::plan_call(&problem, true, false, budget, &caps).map(|p| p.public(b))
        }
    };
    Ok(plan?.with_imports(imports.footprint()))
}

/// Collected `(a, p, n)` rows as a `(t, 3)` array.
pub(crate) fn triplet_rows(op: &'static str, flat: Vec<u32>) -> Result<Array2<u32>> {
    let rows = flat.len() / 3;
    Array2::from_shape_vec((rows, 3), flat).map_err(|e| Error::Internal {
        op,
        message: format!("triplets are not whole (a, p, n) rows: {e}"),
    })
}

/// Mines `problem` into `writer` (or only counts when `None`); returns the number of
/// triplets found (delivered, if a streaming callback stopped early).
pub(crate) fn run(
    ctx: &Context,
    problem: &Problem<'_>,
    writer: Option<Writer<'_>>,
    hooks: &Hooks,
) -> Result<u64> {
    let (b, m) = (problem.set.labels.len(), problem.set.ref_labels.len());
    let report = Reporter::new(hooks, OP, b as u64 * m as u64);
    report.check()?;
    if b == 0 || m == 0 {
        return Ok(0);
    }
    let mut writer = writer;
    let all_valid = problem.rule == TripletRule::AllValid;
    if all_valid && writer.is_none() {
        // Pure label arithmetic: counting needs no device.
        report.add(b as u64 * m as u64);
        return Ok(all_valid_count(&problem.set));
    }
    let Some(gpu) = ctx.gpu() else {
        // The native path sizes its own output (it counts every anchor first).
        return native::triplets(ctx, problem, writer, &report);
    };
    if let (true, Some(w)) = (all_valid, writer.as_mut()) {
        w.reserve(all_valid_count(&problem.set));
    }
    // After a device out-of-memory the mining starts over with smaller chunks; the writer
    // drops what it had already delivered, so nothing is handed over twice.
    let start = writer.as_ref().map(Writer::mark);
    let counted = oom_retry::retry(ctx, || {
        if let (Some(w), Some(mark)) = (writer.as_mut(), start) {
            w.rewind(mark);
        }
        report.restart();
        gpu.settled(gpu::mine(
            ctx,
            gpu,
            problem,
            (writer.as_mut(), false),
            &report,
        ))
    })?;
    writer.map_or(Ok(counted), Writer::finish)
}

/// The number of valid triplets, `Σ_a |P_a|·|N_a|`, from class sizes alone (`O(b + m)`).
pub(crate) fn all_valid_count(set: &Labelled<'_>) -> u64 {
    list_sizes(set).map(|(p, n)| p * n).sum()
}

/// Per anchor, `(|P_a|, |N_a|)`: its positive and negative reference counts, from class sizes
/// alone (`O(b + m)`).
pub(crate) fn list_sizes<'s, 'a>(
    set: &'s Labelled<'a>,
) -> impl Iterator<Item = (u64, u64)> + use<'s, 'a> {
    let classes = set
        .labels
        .iter()
        .chain(&set.ref_labels)
        .max()
        .map_or(0, |&l| l as usize + 1);
    let mut size = vec![0u64; classes];
    for &l in &set.ref_labels {
        size[l as usize] += 1;
    }
    let m = set.ref_labels.len() as u64;
    set.labels
        .iter()
        .zip(&set.self_slots)
        .map(move |(&l, &me)| {
            let same = size[l as usize];
            let own = set.ref_labels.get(me as usize).is_some_and(|&r| r == l);
            (same - u64::from(own), m - same)
        })
}
