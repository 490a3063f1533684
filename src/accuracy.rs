//! PML's `AccuracyCalculator` retrieval metrics over an exact kNN on any path: precision@1,
//! R-precision, MAP@R, MAP and MRR, with lone-query exclusion, per-class results and
//! `avg_of_avgs`.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

use ndarray::{ArrayView1, ArrayView2};

use crate::context::{ComputePath, Context};
use crate::distance::{Distance, DistanceConfig};
use crate::error::{Error, Result};
use crate::knn::{self, KnnConfig};
use crate::mining_set::{Embeddings, SelfExclusion};
use crate::progress::ProgressFn;
use crate::validate;

const OP: &str = "accuracy";

/// How many neighbours the metrics look at (PML's `k`).
///
/// # Example
/// ```
/// use wgpu_metric_learning::{accuracy, AccuracyConfig, AccuracyK, Context};
/// let x = ndarray::array![[0.0f32], [0.1], [0.2], [5.0]];
/// let y = ndarray::array![0u8, 0, 0, 1];
/// let cfg = AccuracyConfig { k: AccuracyK::MaxBinCount, ..Default::default() };
/// let acc = accuracy(&Context::native_cpu(None), x.view(), y.view(), None, &cfg)?;
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
    /// With explicit references: reference `i` is query `i` for `i < q` (PML's
    /// `ref_includes_query`), so each query skips itself. Without references this is implied.
    /// Default `false`.
    pub ref_includes_query: bool,
    /// Average per class first, then over classes (PML's `avg_of_avgs`). Default `false`:
    /// the mean over queries.
    pub avg_of_avgs: bool,
}

impl Default for AccuracyConfig {
    fn default() -> Self {
        Self {
            k: AccuracyK::All,
            distance: DistanceConfig {
                distance: Distance::SquaredEuclidean,
                normalize: false,
            },
            ref_includes_query: false,
            avg_of_avgs: false,
        }
    }
}

/// The five kNN metrics, each in `[0, 1]`, or NaN when every query is lone.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{accuracy, AccuracyConfig, Context};
/// let x = ndarray::array![[0.0f32], [1.0], [2.0]];
/// let y = ndarray::array![0u32, 1, 2]; // every query is lone
/// let acc = accuracy(&Context::native_cpu(None), x.view(), y.view(), None, &AccuracyConfig::default())?;
/// assert!(acc.metrics.precision_at_1.is_nan());
/// assert_eq!(acc.lone_queries, 3);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AccuracyMetrics {
    /// Whether the nearest neighbour shares the query's label.
    pub precision_at_1: f64,
    /// Relevant among the first `R` neighbours, over `R` (`R`: references sharing the
    /// query's label, less itself).
    pub r_precision: f64,
    /// `(1/R) Σ_{i ≤ R} rel_i · P@i`.
    pub mean_average_precision_at_r: f64,
    /// `(1/R) Σ_{i ≤ k} rel_i · P@i` (divided by `R` even when `k < R`, as PML ≥ 1.6.1).
    pub mean_average_precision: f64,
    /// `1 / rank` of the first relevant neighbour within `k`, 0 if none.
    pub mean_reciprocal_rank: f64,
}

impl AccuracyMetrics {
    const NAN: Self = Self {
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
        let [a, b, c, d, e] = sum.map(|s| s / n as f64);
        Self {
            precision_at_1: a,
            r_precision: b,
            mean_average_precision_at_r: c,
            mean_average_precision: d,
            mean_reciprocal_rank: e,
        }
    }

    fn values(&self) -> [f64; 5] {
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
/// use wgpu_metric_learning::{accuracy, AccuracyConfig, ComputePath, Context};
/// let x = ndarray::array![[0.0f32], [0.1], [5.0], [5.1], [0.2]];
/// let y = ndarray::array![7i64, 7, 9, 9, 9];
/// let acc = accuracy(&Context::native_cpu(None), x.view(), y.view(), None, &AccuracyConfig::default())?;
/// let labels: Vec<i64> = acc.per_class.iter().map(|(l, _)| *l).collect();
/// assert_eq!(labels, vec![7, 9]);
/// assert_eq!(acc.per_class[0].1.precision_at_1, 1.0);
/// assert_eq!(acc.path, ComputePath::NativeCpu);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Accuracy<L> {
    /// The metrics: mean over non-lone queries, or over classes with `avg_of_avgs`.
    pub metrics: AccuracyMetrics,
    /// Per query label (ascending), the mean over its non-lone queries: PML's
    /// `return_per_class`. Labels whose queries are all lone are absent.
    pub per_class: Vec<(L, AccuracyMetrics)>,
    /// Queries left out because no reference shares their label (besides themselves).
    pub lone_queries: usize,
    /// The `k` the neighbours were searched with.
    pub k: usize,
    /// Where the kNN ran.
    pub path: ComputePath,
}

/// PML's `AccuracyCalculator.get_accuracy` for the kNN metrics: ranks the references of each
/// query `(q, d)` with [`knn`](crate::knn()) and scores the labels of its neighbours. Without `refs`, the
/// queries are their own references and each query skips itself; with `refs` `(n, d)` and
/// labels `(n,)`, set `ref_includes_query` when reference `i` is query `i`.
///
/// Lone queries (no reference of their label, besides themselves) are left out, as in PML.
///
/// # Errors
/// [`Error::Shape`] for label lengths that differ from the rows, or (with
/// `ref_includes_query`) fewer references than queries; [`Error::InvalidParameter`] for
/// `Fixed(0)`, a `k` above the references a query can see, or `ref_includes_query` with
/// references whose first `q` rows or labels are not the queries'; as [`knn`](crate::knn()) otherwise.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{accuracy, AccuracyConfig, Context};
/// let ctx = Context::native_cpu(None);
/// let x = array![[0.0f32, 0.0], [0.0, 0.1], [5.0, 5.0], [5.0, 5.1], [9.0, 0.0]];
/// let y = array![0u32, 0, 1, 1, 2]; // label 2 has a single point: a lone query
/// let acc = accuracy(&ctx, x.view(), y.view(), None, &AccuracyConfig::default())?;
/// assert_eq!(acc.metrics.precision_at_1, 1.0);
/// assert_eq!(acc.lone_queries, 1);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn accuracy<L>(
    ctx: &Context,
    queries: ArrayView2<'_, f32>,
    query_labels: ArrayView1<'_, L>,
    refs: Option<(ArrayView2<'_, f32>, ArrayView1<'_, L>)>,
    cfg: &AccuracyConfig,
) -> Result<Accuracy<L>>
where
    L: Copy + Eq + Hash + Ord,
{
    run(ctx, queries, query_labels, refs, cfg, None)
}

/// [`accuracy`], calling `progress` as its kNN search advances (as
/// [`knn_with_progress`](crate::knn_with_progress)); scoring the neighbours afterwards takes a
/// small fraction of the time.
///
/// # Errors
/// As [`accuracy`].
///
/// # Example
/// ```
/// use std::sync::Mutex;
/// use ndarray::{Array1, Array2};
/// use wgpu_metric_learning::{accuracy_with_progress, AccuracyConfig, Context, Progress};
/// let ctx = Context::native_cpu(None);
/// let x = Array2::from_shape_fn((200, 4), |(i, j)| ((i % 5) * 10 + j) as f32);
/// let y = Array1::from_shape_fn(200, |i| (i % 5) as u32);
/// let seen = Mutex::new(Vec::new());
/// let report = |p: Progress| seen.lock().unwrap().push(p.fraction());
/// let acc = accuracy_with_progress(&ctx, x.view(), y.view(), None, &AccuracyConfig::default(), &report)?;
/// assert_eq!(acc.metrics.precision_at_1, 1.0);
/// assert_eq!(seen.lock().unwrap().last(), Some(&1.0));
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn accuracy_with_progress<L>(
    ctx: &Context,
    queries: ArrayView2<'_, f32>,
    query_labels: ArrayView1<'_, L>,
    refs: Option<(ArrayView2<'_, f32>, ArrayView1<'_, L>)>,
    cfg: &AccuracyConfig,
    progress: ProgressFn<'_>,
) -> Result<Accuracy<L>>
where
    L: Copy + Eq + Hash + Ord,
{
    run(ctx, queries, query_labels, refs, cfg, Some(progress))
}

fn run<L>(
    ctx: &Context,
    queries: ArrayView2<'_, f32>,
    query_labels: ArrayView1<'_, L>,
    refs: Option<(ArrayView2<'_, f32>, ArrayView1<'_, L>)>,
    cfg: &AccuracyConfig,
    progress: Option<ProgressFn<'_>>,
) -> Result<Accuracy<L>>
where
    L: Copy + Eq + Hash + Ord,
{
    let q = queries.nrows();
    let includes = refs.is_none() || cfg.ref_includes_query;
    let (ref_rows, ref_labels) = refs.unwrap_or((queries, query_labels));
    check_lengths(queries, query_labels, ref_rows, ref_labels, includes)?;
    if refs.is_some() && includes {
        check_prefix(queries, query_labels, ref_rows, ref_labels)?;
    }
    let own = usize::from(includes);
    let mut counts: HashMap<L, usize> = HashMap::new();
    for &l in ref_labels {
        *counts.entry(l).or_insert(0) += 1;
    }
    // R per query: references of its label, less itself.
    let relevant: Vec<usize> = query_labels
        .iter()
        .map(|l| counts.get(l).copied().unwrap_or(0).saturating_sub(own))
        .collect();
    let visible = ref_rows.nrows().saturating_sub(own);
    let k = match cfg.k {
        AccuracyK::All => visible,
        AccuracyK::MaxBinCount => relevant.iter().copied().max().unwrap_or(0),
        AccuracyK::Fixed(k) if k == 0 || k > visible => {
            return Err(Error::InvalidParameter {
                op: OP,
                what: "k",
                value: k.to_string(),
                rule: "1 ≤ k ≤ the references a query can see",
            })
        }
        AccuracyK::Fixed(k) => k,
    };
    let lone_queries = relevant.iter().filter(|&&r| r == 0).count();
    if k == 0 || lone_queries == q {
        // Nothing to search; the inputs must still be valid.
        validate::embeddings(OP, "queries", queries)?;
        validate::embeddings(OP, "refs", ref_rows)?;
        validate::same_dim(OP, queries, ref_rows)?;
        return Ok(Accuracy {
            metrics: AccuracyMetrics::NAN,
            per_class: Vec::new(),
            lone_queries,
            k,
            path: ctx.path(),
        });
    }
    let found = knn::run(
        ctx,
        queries,
        Embeddings::Host(ref_rows),
        &KnnConfig {
            k,
            distance: cfg.distance,
            self_exclusion: if includes {
                SelfExclusion::SameIndex
            } else {
                SelfExclusion::None
            },
        },
        progress,
    )?;
    let mut by_class: BTreeMap<L, Vec<AccuracyMetrics>> = BTreeMap::new();
    for (i, neighbours) in found.indices.rows().into_iter().enumerate() {
        let r = relevant[i];
        if r == 0 {
            continue;
        }
        let label = query_labels[i];
        let rel = neighbours.iter().map(|&j| ref_labels[j as usize] == label);
        by_class.entry(label).or_default().push(score(rel, r));
    }
    let per_class: Vec<(L, AccuracyMetrics)> = by_class
        .iter()
        .map(|(&l, m)| (l, AccuracyMetrics::mean(m.iter())))
        .collect();
    let metrics = if cfg.avg_of_avgs {
        AccuracyMetrics::mean(per_class.iter().map(|(_, m)| m))
    } else {
        AccuracyMetrics::mean(by_class.values().flatten())
    };
    Ok(Accuracy {
        metrics,
        per_class,
        lone_queries,
        k,
        path: found.path,
    })
}

/// One query's metrics from the relevance of its neighbours (best first) and its `R ≥ 1`.
fn score(rel: impl Iterator<Item = bool>, r: usize) -> AccuracyMetrics {
    let (mut hits, mut hits_at_r, mut ap, mut ap_at_r, mut first) = (0usize, 0usize, 0.0, 0.0, 0);
    let mut at_1 = false;
    for (i, is_rel) in rel.enumerate() {
        if !is_rel {
            continue;
        }
        hits += 1;
        let precision = hits as f64 / (i + 1) as f64;
        ap += precision;
        if i < r {
            hits_at_r += 1;
            ap_at_r += precision;
        }
        if first == 0 {
            first = i + 1;
        }
        at_1 |= i == 0;
    }
    AccuracyMetrics {
        precision_at_1: f64::from(u8::from(at_1)),
        r_precision: hits_at_r as f64 / r as f64,
        mean_average_precision_at_r: ap_at_r / r as f64,
        mean_average_precision: ap / r as f64,
        mean_reciprocal_rank: if first == 0 { 0.0 } else { 1.0 / first as f64 },
    }
}

fn check_lengths<L>(
    queries: ArrayView2<'_, f32>,
    query_labels: ArrayView1<'_, L>,
    refs: ArrayView2<'_, f32>,
    ref_labels: ArrayView1<'_, L>,
    includes: bool,
) -> Result<()> {
    let shape = |what, expected: String, got: Vec<usize>| Error::Shape {
        op: OP,
        what,
        expected,
        got,
    };
    if query_labels.len() != queries.nrows() {
        let expected = format!("({},) to match the queries", queries.nrows());
        return Err(shape("query_labels", expected, vec![query_labels.len()]));
    }
    if ref_labels.len() != refs.nrows() {
        let expected = format!("({},) to match the references", refs.nrows());
        return Err(shape("ref_labels", expected, vec![ref_labels.len()]));
    }
    if includes && refs.nrows() < queries.nrows() {
        let expected = format!(
            "at least {} rows, since they include the queries",
            queries.nrows()
        );
        return Err(shape("refs", expected, vec![refs.nrows(), refs.ncols()]));
    }
    Ok(())
}

/// With `ref_includes_query`, the first `q` references must be the queries (labels equal,
/// embeddings equal within `torch.allclose`'s default tolerances), as PML requires.
fn check_prefix<L: PartialEq>(
    queries: ArrayView2<'_, f32>,
    query_labels: ArrayView1<'_, L>,
    refs: ArrayView2<'_, f32>,
    ref_labels: ArrayView1<'_, L>,
) -> Result<()> {
    let labels_match = query_labels.iter().zip(ref_labels).all(|(a, b)| a == b);
    let rows_match = queries.ncols() == refs.ncols()
        && queries.outer_iter().zip(refs.outer_iter()).all(|(a, b)| {
            a.iter()
                .zip(b)
                .all(|(x, y)| (x - y).abs() <= 1e-8 + 1e-5 * y.abs())
        });
    if labels_match && rows_match {
        return Ok(());
    }
    Err(Error::InvalidParameter {
        op: OP,
        what: "ref_includes_query",
        value: "true".into(),
        rule: "the first q references (rows and labels) must be the queries",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_query_by_hand() {
        // Neighbours: rel, not, rel, rel; R = 4 (one relevant reference was not retrieved).
        let m = score([true, false, true, true].into_iter(), 4);
        assert_eq!(m.precision_at_1, 1.0);
        assert_eq!(m.r_precision, 3.0 / 4.0);
        let ap = (1.0 + 2.0 / 3.0 + 3.0 / 4.0) / 4.0;
        assert!((m.mean_average_precision_at_r - ap).abs() < 1e-12);
        assert!((m.mean_average_precision - ap).abs() < 1e-12);
        assert_eq!(m.mean_reciprocal_rank, 1.0);
        // R = 2 cuts R-precision and MAP@R at two neighbours, not MAP.
        let m = score([false, true, true].into_iter(), 2);
        assert_eq!((m.precision_at_1, m.r_precision), (0.0, 0.5));
        assert!((m.mean_average_precision_at_r - 0.25).abs() < 1e-12);
        assert!((m.mean_average_precision - (0.5 + 2.0 / 3.0) / 2.0).abs() < 1e-12);
        assert_eq!(m.mean_reciprocal_rank, 0.5);
    }
}
