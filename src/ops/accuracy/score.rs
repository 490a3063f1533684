//! A validated accuracy call ([`Job`]: `R` per query, the `k` to search with) and the scoring:
//! each query's metrics from its neighbour list's relevance, their per-class and overall
//! summaries (PML's `AccuracyCalculator` rules).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

use ndarray::ArrayView2;

use crate::context::Context;
use crate::data::inputs::{
    self, Embeddings, Imports, Labelled, MiningSet, Pair, SelfExclusion, NO_SLOT,
};
use crate::error::{Error, Result};
use crate::ops::kmeans::{self, KmeansConfig};
use crate::ops::knn::KnnConfig;

use super::{AccuracyConfig, AccuracyK, AccuracyMetrics, OP};

/// A validated accuracy call: its inputs, `R` per query and the `k` to search with.
pub(super) struct Job<'a> {
    pub(super) set: Labelled<'a>,
    /// Per query, the references relevant to it: of its label, less itself.
    pub(super) relevant: Vec<usize>,
    pub(super) k: usize,
    /// Whether a kNN metric is included.
    pub(super) wants_knn: bool,
    /// The k-means of NMI and AMI, when included: one cluster per distinct query label, as
    /// PML asks Faiss; the call's hooks.
    pub(super) kmeans: Option<KmeansConfig>,
}

impl<'a> Job<'a> {
    /// Whether the call has nothing to search: `k = 0` (no references a query can see), or
    /// every query lone.
    pub(super) fn nothing_to_search(&self) -> bool {
        self.k == 0 || self.relevant.iter().all(|&r| r == 0)
    }

    /// The kNN inputs: the queries against the references, each skipping its own slot.
    pub(super) fn pair(&self) -> Result<Pair<'a>> {
        match (self.set.queries, self.set.refs) {
            (Some(queries), Some(refs)) => Ok(Pair {
                queries,
                refs,
                excluded: self.set.self_slots.clone(),
            }),
            _ => Err(Error::Internal {
                op: OP,
                message: "validated inputs without embeddings".into(),
            }),
        }
    }

    /// The kNN metrics from the neighbours `(q, k)`: overall and per query label.
    pub(super) fn score<L: Copy + Ord>(
        &self,
        neighbours: &ndarray::Array2<u32>,
        queries: &MiningSet<'_, L>,
        cfg: &AccuracyConfig,
    ) -> (AccuracyMetrics, Vec<(L, AccuracyMetrics)>) {
        let set = &self.set;
        let each = query_metrics(
            neighbours.view(),
            &set.labels,
            &set.ref_labels,
            &self.relevant,
        );
        summarize(queries.labels.iter().copied().zip(each), cfg.avg_of_avgs)
    }

    pub(super) fn knn_config(&self, cfg: &AccuracyConfig) -> KnnConfig {
        KnnConfig {
            k: self.k,
            distance: cfg.distance,
            self_exclusion: SelfExclusion::Auto,
            hooks: cfg.hooks.clone(),
        }
    }
}

pub(super) fn prepare<'s, L>(
    ctx: &Context,
    queries: &'s MiningSet<'_, L>,
    refs: Option<&'s MiningSet<'_, L>>,
    cfg: &AccuracyConfig,
    imports: &'s mut Imports,
) -> Result<Job<'s>>
where
    L: Copy + Eq + Hash + Ord,
{
    if cfg.include.is_empty() {
        return Err(Error::InvalidParameter {
            op: OP,
            what: "include",
            value: "[]".into(),
            rule: "at least one metric",
        });
    }
    let wants_knn = cfg.include.iter().any(|m| m.needs_knn());
    let wants_clusters = cfg.include.iter().any(|m| !m.needs_knn());
    // R per query and k come from the labels: checked before any device work, and the
    // embeddings are imported only when there is something to search or cluster.
    let mut planned = (Vec::new(), 0, None);
    let check = |set: &Labelled<'_>| -> Result<bool> {
        // Host rows only: rows on a device are not read back to check them.
        if let (Some(Embeddings::Host(q)), Some(r), SelfExclusion::SameIndex) =
            (queries.embeddings, refs, &cfg.self_exclusion)
        {
            if let Some(Embeddings::Host(r)) = r.embeddings {
                check_prefix(q, &set.labels, r, &set.ref_labels)?;
            }
        }
        // PML sizes k only for the kNN metrics: a `k` no search uses is not checked.
        let (relevant, k) = relevant_and_k(set, cfg, wants_knn)?;
        let searches = wants_knn && k > 0 && relevant.iter().any(|&r| r > 0);
        let kmeans = wants_clusters.then(|| kmeans_config(&set.labels, cfg));
        let clusters = !set.labels.is_empty() && kmeans.is_some();
        if let (true, Some(kcfg)) = (clusters, &kmeans) {
            kmeans::check_config(kcfg, set.labels.len())?;
        }
        planned = (relevant, k, kmeans);
        Ok(searches || clusters)
    };
    let set = inputs::prepare(
        OP,
        ctx,
        queries,
        refs,
        &cfg.self_exclusion,
        true,
        check,
        imports,
    )?;
    let (relevant, k, kmeans) = planned;
    Ok(Job {
        set,
        relevant,
        k,
        wants_knn,
        kmeans,
    })
}

/// The k-means of NMI and AMI for these (dense) query labels: one cluster per distinct label,
/// as PML asks Faiss; the call's hooks.
fn kmeans_config(labels: &[u32], cfg: &AccuracyConfig) -> KmeansConfig {
    let mut distinct = labels.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    KmeansConfig {
        clusters: distinct.len(),
        hooks: cfg.hooks.clone(),
        ..cfg.kmeans.clone()
    }
}

/// Per query, the references relevant to it (of its label, less itself), and the `k` to
/// search with.
fn relevant_and_k(
    set: &Labelled<'_>,
    cfg: &AccuracyConfig,
    wants_knn: bool,
) -> Result<(Vec<usize>, usize)> {
    let m = set.ref_labels.len();
    let mut counts: HashMap<u32, usize> = HashMap::new();
    for &l in &set.ref_labels {
        *counts.entry(l).or_insert(0) += 1;
    }
    // R per query: references of its label, less itself when its own slot has its label.
    let relevant: Vec<usize> = set
        .labels
        .iter()
        .zip(&set.self_slots)
        .map(|(l, &slot)| {
            let own = slot != NO_SLOT && set.ref_labels.get(slot as usize) == Some(l);
            counts.get(l).copied().unwrap_or(0) - usize::from(own)
        })
        .collect();
    if !wants_knn {
        return Ok((relevant, 0));
    }
    // As knn: a query that excludes a reference sees one fewer.
    let sees_itself = set.self_slots.iter().any(|&s| (s as usize) < m);
    let visible = m - usize::from(sees_itself);
    let k = search_k(cfg.k, visible, relevant.iter().copied().max().unwrap_or(0))?;
    Ok((relevant, k))
}

/// Each query's kNN metrics from its neighbours `(q, k)` (indices into `ref_labels`) and its
/// `R` (`relevant`); `None` for a lone query (`R = 0`).
pub(crate) fn query_metrics<T: PartialEq>(
    neighbours: ArrayView2<'_, u32>,
    labels: &[T],
    ref_labels: &[T],
    relevant: &[usize],
) -> Vec<Option<AccuracyMetrics>> {
    neighbours
        .rows()
        .into_iter()
        .zip(labels.iter().zip(relevant))
        .map(|(neighbours, (label, &r))| {
            let rel = neighbours
                .iter()
                .map(|&j| ref_labels.get(j as usize) == Some(label));
            (r > 0).then(|| score(rel, r))
        })
        .collect()
}

/// The overall metrics and the per-label means from each query's label and metrics (lone
/// queries `None`, left out), in query order: PML's mean over queries, or over labels with
/// `avg_of_avgs`.
pub(crate) fn summarize<L: Copy + Ord>(
    per_query: impl Iterator<Item = (L, Option<AccuracyMetrics>)>,
    avg_of_avgs: bool,
) -> (AccuracyMetrics, Vec<(L, AccuracyMetrics)>) {
    let mut by_class: BTreeMap<L, Vec<AccuracyMetrics>> = BTreeMap::new();
    for (label, metrics) in per_query {
        if let Some(m) = metrics {
            by_class.entry(label).or_default().push(m);
        }
    }
    let per_class: Vec<(L, AccuracyMetrics)> = by_class
        .iter()
        .map(|(&l, m)| (l, AccuracyMetrics::mean(m.iter())))
        .collect();
    let metrics = if avg_of_avgs {
        AccuracyMetrics::mean(per_class.iter().map(|(_, m)| m))
    } else {
        AccuracyMetrics::mean(by_class.values().flatten())
    };
    (metrics, per_class)
}

/// The `k` to search with: every visible reference, the largest `R`, or a fixed `k` checked
/// against the `visible` references.
pub(crate) fn search_k(k: AccuracyK, visible: usize, max_relevant: usize) -> Result<usize> {
    match k {
        AccuracyK::All => Ok(visible),
        AccuracyK::MaxBinCount => Ok(max_relevant),
        AccuracyK::Fixed(k) if k == 0 || k > visible => Err(Error::InvalidParameter {
            op: OP,
            what: "k",
            value: k.to_string(),
            rule: "1 ≤ k ≤ the references a query can see",
        }),
        AccuracyK::Fixed(k) => Ok(k),
    }
}

/// One query's metrics from the relevance of its `k ≥ 1` neighbours (best first) and its
/// `R ≥ 1`.
fn score(rel: impl Iterator<Item = bool>, r: usize) -> AccuracyMetrics {
    let (mut hits, mut hits_at_r, mut ap, mut ap_at_r, mut first) = (0usize, 0usize, 0.0, 0.0, 0);
    let mut at_1 = false;
    let mut k = 0;
    for (i, is_rel) in rel.enumerate() {
        k = i + 1;
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
        // PML divides by its relevance mask's width, min(R, k); MAP@R and MAP keep R.
        r_precision: hits_at_r as f64 / r.min(k).max(1) as f64,
        mean_average_precision_at_r: ap_at_r / r as f64,
        mean_average_precision: ap / r as f64,
        mean_reciprocal_rank: if first == 0 { 0.0 } else { 1.0 / first as f64 },
    }
}

/// With [`SelfExclusion::SameIndex`] (PML's `ref_includes_query`), the first `q` references
/// must be the queries (labels equal, embeddings equal within `torch.allclose`'s default
/// tolerances), as PML requires. `SelfExclusion` already checked that there are `q` of them.
fn check_prefix(
    queries: ArrayView2<'_, f32>,
    query_labels: &[u32],
    refs: ArrayView2<'_, f32>,
    ref_labels: &[u32],
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
        what: "self_exclusion",
        value: "SameIndex".into(),
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
        // k = 3 < R = 5: R-precision over the three retrieved (PML), MAP@R and MAP over R.
        let m = score([true, false, true].into_iter(), 5);
        assert_eq!(m.r_precision, 2.0 / 3.0);
        assert!((m.mean_average_precision_at_r - (1.0 + 2.0 / 3.0) / 5.0).abs() < 1e-12);
        assert!((m.mean_average_precision - (1.0 + 2.0 / 3.0) / 5.0).abs() < 1e-12);
    }
}
