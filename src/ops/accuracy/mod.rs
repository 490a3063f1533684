//! PML's `AccuracyCalculator` metrics on any path: precision@1, R-precision, MAP@R, MAP and
//! MRR over an exact kNN, with lone-query exclusion, per-class results and `avg_of_avgs`; NMI
//! and AMI of a k-means clustering of the queries.
//!
//! The kNN metrics rank the references of each query with [`knn`](crate::knn()) and score
//! the labels of its neighbours. `cfg.self_exclusion` says which reference is each query
//! (PML's `ref_includes_query` is [`SelfExclusion::SameIndex`]). Lone queries (no reference
//! of their label, besides themselves) are left out, as in PML. NMI and AMI compare the
//! query labels with a [`kmeans`](crate::kmeans()) clustering of the queries into as many
//! clusters as there are distinct query labels (PML's Faiss k-means), every query counted.

use std::fmt;
use std::hash::Hash;
use std::str::FromStr;

use crate::context::plan::Plan;
use crate::context::{ComputePath, Context};
use crate::data::inputs::{self, Imports, MiningSet, SelfExclusion};
use crate::error::{Error, Result};
use crate::hooks::{Hooks, Reporter};
use crate::metric::{Distance, DistanceConfig};
use crate::ops::kmeans::{self, KmeansConfig};
use crate::ops::knn::{self};
use crate::ops::mutual_info::{adjusted_mutual_info, normalized_mutual_info};
use crate::runtime::memory::Transfers;
use crate::runtime::transfer;

const OP: &str = "accuracy";

/// One metric of PML's `AccuracyCalculator`, named as PML names it in `include` and in its
/// result (see [`AccuracyMetric::name`]).
///
/// # Example
/// ```
/// use wgpu_metric_learning::AccuracyMetric;
/// let nmi: AccuracyMetric = "NMI".parse()?;
/// assert_eq!(nmi, AccuracyMetric::Nmi);
/// assert_eq!(AccuracyMetric::MeanAveragePrecisionAtR.name(), "mean_average_precision_at_r");
/// assert!("nmi".parse::<AccuracyMetric>().is_err()); // PML's names are case-sensitive
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AccuracyMetric {
    /// `precision_at_1`.
    PrecisionAt1,
    /// `r_precision`.
    RPrecision,
    /// `mean_average_precision_at_r`.
    MeanAveragePrecisionAtR,
    /// `mean_average_precision`.
    MeanAveragePrecision,
    /// `mean_reciprocal_rank`.
    MeanReciprocalRank,
    /// `NMI`: normalised mutual information between the query labels and a k-means
    /// clustering of the queries into as many clusters as there are query labels.
    Nmi,
    /// `AMI`: adjusted mutual information, on the same clustering as [`AccuracyMetric::Nmi`].
    Ami,
}

impl AccuracyMetric {
    /// Every metric, in PML's order.
    pub const ALL: [AccuracyMetric; 7] = [
        Self::PrecisionAt1,
        Self::RPrecision,
        Self::MeanAveragePrecisionAtR,
        Self::MeanAveragePrecision,
        Self::MeanReciprocalRank,
        Self::Nmi,
        Self::Ami,
    ];

    /// The five kNN metrics: [`AccuracyConfig::include`]'s default.
    pub const KNN: [AccuracyMetric; 5] = [
        Self::PrecisionAt1,
        Self::RPrecision,
        Self::MeanAveragePrecisionAtR,
        Self::MeanAveragePrecision,
        Self::MeanReciprocalRank,
    ];

    /// PML's name of the metric (its `include` entry and result key).
    ///
    /// See the example of [`AccuracyMetric`].
    pub fn name(self) -> &'static str {
        match self {
            Self::PrecisionAt1 => "precision_at_1",
            Self::RPrecision => "r_precision",
            Self::MeanAveragePrecisionAtR => "mean_average_precision_at_r",
            Self::MeanAveragePrecision => "mean_average_precision",
            Self::MeanReciprocalRank => "mean_reciprocal_rank",
            Self::Nmi => "NMI",
            Self::Ami => "AMI",
        }
    }

    /// Whether the metric is read off the kNN (rather than the clustering).
    pub(crate) fn needs_knn(self) -> bool {
        !matches!(self, Self::Nmi | Self::Ami)
    }
}

impl fmt::Display for AccuracyMetric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AccuracyMetric {
    type Err = Error;

    /// PML's name of a metric.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for any other string.
    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| Error::InvalidParameter {
                op: OP,
                what: "include",
                value: s.to_string(),
                rule: "one of precision_at_1, r_precision, mean_average_precision_at_r, mean_average_precision, mean_reciprocal_rank, NMI, AMI",
            })
    }
}

/// How many neighbours the metrics look at (PML's `k`).
///
/// # Example
/// ```
/// use wgpu_metric_learning::{accuracy, AccuracyConfig, AccuracyK, Context, MiningSet};
/// let x = ndarray::array![[0.0f32], [0.1], [0.2], [5.0]];
/// let y = ndarray::array![0u8, 0, 0, 1];
/// let cfg = AccuracyConfig { k: AccuracyK::MaxBinCount, ..Default::default() };
/// let acc = accuracy(&Context::native_cpu(None), &MiningSet::new(&x, &y), None, &cfg)?;
/// assert_eq!(acc.k, 2); // class 0 has three points: two others per query
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AccuracyK {
    /// Every reference (less the query itself): PML's `k=None`, the default. Exact MAP.
    #[default]
    All,
    /// The largest number of references sharing a query's label (less the query itself):
    /// PML's `"max_bin_count"`, enough for R-precision and MAP@R and much cheaper than `All`.
    MaxBinCount,
    /// A fixed `k ≥ 1`. Below the largest class, R-precision and MAP@R only see `k`
    /// neighbours (PML warns about the same).
    Fixed(usize),
}

/// Settings of [`accuracy`]. Every field has a documented default.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{AccuracyConfig, AccuracyK, Distance};
/// let cfg = AccuracyConfig { k: AccuracyK::MaxBinCount, ..Default::default() };
/// assert_eq!(cfg.distance.distance, Distance::SquaredEuclidean);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct AccuracyConfig {
    /// Neighbours considered. Default [`AccuracyK::All`] (PML's default).
    pub k: AccuracyK,
    /// How neighbours are ranked. Default squared Euclidean on the raw embeddings: what
    /// PML's `AccuracyCalculator` gets from its default Faiss `IndexFlatL2`.
    pub distance: DistanceConfig,
    /// Which reference is each query itself, skipped as its neighbour and not counted as
    /// relevant to it. Default [`SelfExclusion::Auto`]: each query skips itself when the
    /// references are the queries (`refs = None`), nothing otherwise.
    /// [`SelfExclusion::SameIndex`] with explicit references is PML's `ref_includes_query`
    /// (their first `q` rows must then be the queries); a memory bank's enqueue gives
    /// [`SelfExclusion::QuerySlots`].
    pub self_exclusion: SelfExclusion,
    /// Average per class first, then over classes (PML's `avg_of_avgs`). Default `false`:
    /// the mean over queries.
    pub avg_of_avgs: bool,
    /// The metrics to compute (PML's `include`), at least one. Default the five kNN metrics
    /// ([`AccuracyMetric::KNN`]), where PML's default also has NMI and AMI: here they are
    /// asked for, as they cost a k-means. NMI and AMI cluster the raw query embeddings, as PML
    /// does (`distance` ranks the kNN metrics only); without a kNN metric no kNN search runs
    /// and `k` is not checked.
    pub include: Vec<AccuracyMetric>,
    /// The k-means behind NMI and AMI. Its `clusters` is replaced by the number of distinct
    /// query labels and its `hooks` by these, as PML asks Faiss. Default
    /// [`KmeansConfig::default`]: Faiss's settings with PML's 20 iterations.
    pub kmeans: KmeansConfig,
    /// Progress (query–reference pairs compared by the kNN search, then query–centroid
    /// pairs of the k-means) and cancellation. Default: none.
    pub hooks: Hooks,
}

impl Default for AccuracyConfig {
    fn default() -> Self {
        Self {
            k: AccuracyK::All,
            distance: DistanceConfig {
                distance: Distance::SquaredEuclidean,
                normalize: false,
            },
            self_exclusion: SelfExclusion::Auto,
            avg_of_avgs: false,
            include: AccuracyMetric::KNN.to_vec(),
            kmeans: KmeansConfig::default(),
            hooks: Hooks::default(),
        }
    }
}

/// The five kNN metrics, each in `[0, 1]`; NaN when every query is lone, and for a metric not
/// in [`AccuracyConfig::include`].
///
/// # Example
/// ```
/// use wgpu_metric_learning::{accuracy, AccuracyConfig, Context, MiningSet};
/// let x = ndarray::array![[0.0f32], [1.0], [2.0]];
/// let y = ndarray::array![0u32, 1, 2]; // every query is lone
/// let acc = accuracy(&Context::native_cpu(None), &MiningSet::new(&x, &y), None, &AccuracyConfig::default())?;
/// assert!(acc.metrics.precision_at_1.is_nan());
/// assert_eq!(acc.lone_queries, 3);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct AccuracyMetrics {
    /// Whether the nearest neighbour shares the query's label.
    pub precision_at_1: f64,
    /// Relevant among the first `R` neighbours, over `R` (`R`: references sharing the
    /// query's label, less itself); when `k < R`, over the `k` retrieved, as PML's relevance
    /// mask does.
    pub r_precision: f64,
    /// `(1/R) Σ_{i ≤ R} rel_i · P@i`.
    pub mean_average_precision_at_r: f64,
    /// `(1/R) Σ_{i ≤ k} rel_i · P@i` (divided by `R` even when `k < R`, as PML ≥ 1.6.1).
    pub mean_average_precision: f64,
    /// `1 / rank` of the first relevant neighbour within `k`, 0 if none.
    pub mean_reciprocal_rank: f64,
}

impl AccuracyMetrics {
    pub(crate) const NAN: Self = Self {
        precision_at_1: f64::NAN,
        r_precision: f64::NAN,
        mean_average_precision_at_r: f64::NAN,
        mean_average_precision: f64::NAN,
        mean_reciprocal_rank: f64::NAN,
    };

    fn mean<'m>(items: impl Iterator<Item = &'m AccuracyMetrics>) -> Self {
        let (mut sum, mut n) = ([0.0f64; 5], 0usize);
        for m in items {
            for (s, v) in sum.iter_mut().zip(m.values()) {
                *s += v;
            }
            n += 1;
        }
        if n == 0 {
            return Self::NAN;
        }
        Self::from_values(sum.map(|s| s / n as f64))
    }

    /// These metrics with those not in `include` set to NaN.
    pub(crate) fn only(mut self, include: &[AccuracyMetric]) -> Self {
        let fields = [
            (AccuracyMetric::PrecisionAt1, &mut self.precision_at_1),
            (AccuracyMetric::RPrecision, &mut self.r_precision),
            (
                AccuracyMetric::MeanAveragePrecisionAtR,
                &mut self.mean_average_precision_at_r,
            ),
            (
                AccuracyMetric::MeanAveragePrecision,
                &mut self.mean_average_precision,
            ),
            (
                AccuracyMetric::MeanReciprocalRank,
                &mut self.mean_reciprocal_rank,
            ),
        ];
        for (metric, value) in fields {
            if !include.contains(&metric) {
                *value = f64::NAN;
            }
        }
        self
    }

    /// The metrics from [`AccuracyMetrics::values`]' order.
    pub(crate) fn from_values([a, b, c, d, e]: [f64; 5]) -> Self {
        Self {
            precision_at_1: a,
            r_precision: b,
            mean_average_precision_at_r: c,
            mean_average_precision: d,
            mean_reciprocal_rank: e,
        }
    }

    pub(crate) fn values(&self) -> [f64; 5] {
        [
            self.precision_at_1,
            self.r_precision,
            self.mean_average_precision_at_r,
            self.mean_average_precision,
            self.mean_reciprocal_rank,
        ]
    }
}

/// The result of [`accuracy`].
///
/// # Example
/// ```
/// use wgpu_metric_learning::{accuracy, AccuracyConfig, ComputePath, Context, MiningSet};
/// let x = ndarray::array![[0.0f32], [0.1], [5.0], [5.1], [0.2]];
/// let y = ndarray::array![7i64, 7, 9, 9, 9];
/// let acc = accuracy(&Context::native_cpu(None), &MiningSet::new(&x, &y), None, &AccuracyConfig::default())?;
/// let labels: Vec<i64> = acc.per_class.iter().map(|(l, _)| *l).collect();
/// assert_eq!(labels, vec![7, 9]);
/// assert_eq!(acc.per_class[0].1.precision_at_1, 1.0);
/// assert_eq!(acc.path, ComputePath::NativeCpu);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Accuracy<L> {
    /// The kNN metrics: mean over non-lone queries, or over classes with `avg_of_avgs`.
    pub metrics: AccuracyMetrics,
    /// Per query label (ascending), the mean over its non-lone queries: PML's
    /// `return_per_class`. Labels whose queries are all lone are absent.
    pub per_class: Vec<(L, AccuracyMetrics)>,
    /// Queries left out because no reference shares their label (besides themselves).
    pub lone_queries: usize,
    /// NMI, when included: scikit-learn's `normalized_mutual_info_score` of the query labels
    /// and the k-means clusters (see [`crate::normalized_mutual_info`]).
    pub nmi: Option<f64>,
    /// AMI, when included: scikit-learn's `adjusted_mutual_info_score` of the same
    /// (see [`crate::adjusted_mutual_info`]).
    pub ami: Option<f64>,
    /// The `k` the neighbours were searched with (0 when no kNN metric was included).
    pub k: usize,
    /// Where the kNN ran.
    pub path: ComputePath,
    /// Host–device traffic of the call (its kNN search's, and importing device embeddings;
    /// zero on the native path).
    pub transfers: Transfers,
}

/// PML's `AccuracyCalculator.get_accuracy` of `queries` `(q, d)` against `refs` `(n, d)`
/// (host rows or a bank's `bank.refs()`; `None`: the queries, each skipping itself by
/// default). Cost: one [`knn`](crate::knn()) search, plus one [`kmeans`](crate::kmeans())
/// of the queries when NMI or AMI is included (see the module docs for the rules).
///
/// # Errors
/// [`Error::Shape`] for labels not one per row; [`Error::InvalidParameter`] for missing
/// embeddings, an empty `include`, `Fixed(0)`, a `k` above the references a query can see, or
/// [`SelfExclusion::SameIndex`] whose first references are not the queries; as
/// [`knn`](crate::knn()) and [`kmeans`](crate::kmeans()) otherwise.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{accuracy, AccuracyConfig, AccuracyMetric, Context, MiningSet};
/// let ctx = Context::native_cpu(None);
/// let x = array![[0.0f32, 0.0], [0.0, 0.1], [5.0, 5.0], [5.0, 5.1], [9.0, 0.0]];
/// let y = array![0u32, 0, 1, 1, 2]; // label 2 has a single point: a lone query
/// let acc = accuracy(&ctx, &MiningSet::new(&x, &y), None, &AccuracyConfig::default())?;
/// assert_eq!((acc.metrics.precision_at_1, acc.lone_queries, acc.nmi), (1.0, 1, None));
/// let cfg = AccuracyConfig { include: AccuracyMetric::ALL.to_vec(), ..Default::default() };
/// let acc = accuracy(&ctx, &MiningSet::new(&x, &y), None, &cfg)?;
/// assert_eq!(acc.nmi, Some(1.0)); // three clusters, one per label
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn accuracy<L>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &AccuracyConfig,
) -> Result<Accuracy<L>>
where
    L: Copy + Eq + Hash + Ord,
{
    let mut imports = Imports::call();
    let job = prepare(ctx, queries, refs, cfg, &mut imports)?;
    let lone_queries = job.relevant.iter().filter(|&&r| r == 0).count();
    let searches = job.wants_knn && !job.nothing_to_search();
    let kmeans_cfg = job.kmeans.clone();
    let q = job.set.labels.len();
    let total = match searches {
        true => q as u64 * job.set.ref_labels.len() as u64,
        false => 0,
    } + match &kmeans_cfg {
        Some(k) => kmeans::pairs_at_most(q, k),
        None => 0,
    };
    let report = Reporter::new(&cfg.hooks, OP, total);
    let mut transfers = job.set.imported;
    let mut out = Accuracy {
        metrics: AccuracyMetrics::NAN,
        per_class: Vec::new(),
        lone_queries,
        nmi: None,
        ami: None,
        k: if job.wants_knn { job.k } else { 0 },
        path: ctx.path(),
        transfers,
    };
    if searches {
        let part = report.part(q as u64 * job.set.ref_labels.len() as u64);
        let found = knn::run_reporting(ctx, &job.pair()?, &job.knn_config(cfg), &part)?;
        transfers.add(found.transfers);
        let (metrics, per_class) = job.score(&found.indices, queries, cfg);
        out.metrics = metrics.only(&cfg.include);
        out.per_class = per_class
            .into_iter()
            .map(|(l, m)| (l, m.only(&cfg.include)))
            .collect();
        out.path = found.path;
    } else {
        report.check()?;
    }
    if let Some(kcfg) = kmeans_cfg {
        let (nmi, ami) = match job.set.queries {
            Some(rows) if q > 0 => {
                let part = report.part(kmeans::pairs_at_most(q, &kcfg));
                let (found, moved) = transfer::measure(|| kmeans::run(ctx, rows, &kcfg, &part));
                transfers.add(moved);
                let clusters = found?.assignments;
                let labels = queries.labels.view();
                (
                    normalized_mutual_info(labels, clusters.view())?,
                    adjusted_mutual_info(labels, clusters.view())?,
                )
            }
            // No query: scikit-learn's score of two empty labelings.
            _ => (1.0, 1.0),
        };
        let has = |m| cfg.include.contains(&m);
        out.nmi = has(AccuracyMetric::Nmi).then_some(nmi);
        out.ami = has(AccuracyMetric::Ami).then_some(ami);
    }
    out.transfers = transfers;
    Ok(out)
}

/// How [`accuracy`] would run with these arguments on `ctx`: the plan of its kNN search with
/// the `k` the labels give and, with NMI or AMI included, of its k-means (one search of every
/// query against the centroids, and the k-means' host memory); the two run one after the
/// other, so `bytes` is the larger of theirs and `chunks` their sum. Nothing is searched.
///
/// # Errors
/// As [`accuracy`] for bad inputs; as [`knn_plan`](crate::knn_plan) when not even one query
/// row fits.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{accuracy_plan, AccuracyConfig, AccuracyK, Context, MiningSet};
/// let x = ndarray::Array2::<f32>::zeros((2000, 32));
/// let y = ndarray::Array1::from_shape_fn(2000, |i| i % 20);
/// let cfg = AccuracyConfig { k: AccuracyK::MaxBinCount, ..Default::default() };
/// let plan = accuracy_plan(&Context::native_cpu(None), &MiningSet::new(&x, &y), None, &cfg)?;
/// assert!(plan.bytes > 0);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn accuracy_plan<L>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &AccuracyConfig,
) -> Result<Plan>
where
    L: Copy + Eq + Hash + Ord,
{
    let mut imports = Imports::plan();
    let job = prepare(ctx, queries, refs, cfg, &mut imports)?;
    let search = match job.wants_knn && !job.nothing_to_search() {
        true => {
            let pair = job.pair()?;
            let queries = inputs::embeddings_of(pair.queries);
            Some(crate::ops::knn::knn_plan(
                ctx,
                queries,
                pair.refs,
                &job.knn_config(cfg),
            )?)
        }
        false => None,
    };
    let clustering = match (&job.kmeans, job.set.queries) {
        (Some(kcfg), Some(rows)) if rows.nrows() > 0 => Some(kmeans::plan(ctx, rows, kcfg)?),
        _ => None,
    };
    let plan = match (search, clustering) {
        // One after the other: the larger of the two at once, every chunk of both.
        (Some(s), Some(c)) => Plan {
            chunks: s.chunks + c.chunks,
            bytes: s.bytes.max(c.bytes),
            min_bytes: s.min_bytes.max(c.min_bytes),
            ..s
        },
        (Some(p), None) | (None, Some(p)) => p,
        // The call returns at once: no chunk, no memory.
        (None, None) => Plan {
            path: ctx.path(),
            rows: job.set.labels.len(),
            cols: job.set.ref_labels.len(),
            chunks: 0,
            bytes: 0,
            min_bytes: 0,
        },
    };
    Ok(plan.with_imports(imports.footprint()))
}

mod score;
use score::prepare;
#[cfg(feature = "mpi")]
pub(crate) use score::{query_metrics, search_k, summarize};
