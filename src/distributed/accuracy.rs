//! PML's kNN accuracy metrics over the ranks.
//!
//! The search is [`knn`](super::knn()); each query's metrics are computed on its own rank,
//! and the means are taken over all queries in global order, so every rank returns what
//! [`accuracy`](crate::accuracy()) returns over the concatenations.
//!
//! `cfg.self_exclusion` is global as in [`knn`](super::knn()): [`SelfExclusion::SameIndex`]
//! (PML's `ref_includes_query`) means the first references of all ranks are the queries of
//! all ranks (their labels are checked; their rows are not compared across ranks). NMI and
//! AMI need a k-means of all queries, which is not distributed.

use std::collections::HashMap;
use std::hash::Hash;

use mpi::traits::Equivalence;
use ndarray::ArrayView2;

use super::{knn, Group};
use crate::context::Context;
use crate::data::inputs::{Embeddings, MiningSet, SelfExclusion, NO_SLOT};
use crate::error::{Error, Result};
use crate::ops::accuracy::{query_metrics, search_k, summarize};
use crate::ops::accuracy::{Accuracy, AccuracyConfig, AccuracyMetrics};
use crate::ops::knn::KnnConfig;
use crate::validate;

const OP: &str = "distributed accuracy";

/// PML's `AccuracyCalculator` kNN metrics (collective) of all ranks' queries `(b_r, d)`
/// against all ranks' references `(m_r, d)`, each rank holding a contiguous shard of each
/// (`refs = None`: the queries are their own references). Every rank returns the same
/// [`Accuracy`], equal to [`accuracy`](crate::accuracy()) over the concatenations.
///
/// # Errors
/// On every rank when any rank's part fails: as [`accuracy`](crate::accuracy()) and
/// [`knn`](super::knn()); [`Error::InvalidParameter`] for NMI or AMI, or when `k`, `include`,
/// `avg_of_avgs`, the self-exclusion or whether `refs` are given differ between ranks.
///
/// # Example
/// ```no_run
/// use wgpu_metric_learning::distributed::mpi::{self, traits::*};
/// use wgpu_metric_learning::distributed::{self, Group, GroupConfig};
/// use wgpu_metric_learning::{AccuracyConfig, Context, MiningSet};
/// let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Funneled).expect("once");
/// let (group, ctx) = (Group::new(&universe.world(), &GroupConfig::default()), Context::native_cpu(None));
/// // Two close rows of this rank's label, apart from every other rank's.
/// let r = group.rank() as f32;
/// let (x, y) = (ndarray::array![[1.0f32, r], [1.0, r + 0.01]], ndarray::array![r as i64, r as i64]);
/// let acc = distributed::accuracy(&group, &ctx, &MiningSet::new(&x, &y), None, &AccuracyConfig::default())?;
/// assert_eq!(acc.metrics.precision_at_1, 1.0);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn accuracy<L>(
    group: &Group,
    ctx: &Context,
    local_queries: &MiningSet<'_, L>,
    local_refs: Option<&MiningSet<'_, L>>,
    cfg: &AccuracyConfig,
) -> Result<Accuracy<L>>
where
    L: Copy + Eq + Hash + Ord + Default + Equivalence + 'static,
{
    let refs_given = local_refs.is_some();
    let local = (|| {
        if cfg.include.is_empty() || cfg.include.iter().any(|m| !m.needs_knn()) {
            return Err(Error::InvalidParameter {
                op: OP,
                what: "include",
                value: format!("{:?}", cfg.include),
                rule: "at least one metric, kNN metrics only (NMI and AMI are not distributed)",
            });
        }
        let queries = host_rows(local_queries, "queries")?;
        let refs = match local_refs {
            Some(r) => host_rows(r, "refs")?,
            None => queries,
        };
        if let SelfExclusion::QuerySlots(slots) = &cfg.self_exclusion {
            if slots.len() != queries.nrows() {
                return Err(Error::Shape {
                    op: OP,
                    what: "self-exclusion slots",
                    expected: format!("one per local query ({})", queries.nrows()),
                    got: vec![slots.len()],
                });
            }
        }
        if refs.ncols() != queries.ncols() || queries.ncols() == 0 {
            return Err(Error::Shape {
                op: OP,
                what: "refs",
                expected: format!("(m, {}) to match the queries, d ≥ 1", queries.ncols()),
                got: refs.shape().to_vec(),
            });
        }
        validate::finite(OP, "queries", queries)?;
        validate::finite(OP, "refs", refs)?;
        cfg.hooks.check(OP)?;
        Ok((queries, refs))
    })();
    let (queries, refs) = group.agree(OP, local)?;
    // What every rank must agree on before the result can be the same everywhere.
    let exclusion = match &cfg.self_exclusion {
        SelfExclusion::Auto => 0,
        SelfExclusion::None => 1,
        SelfExclusion::SameIndex => 2,
        SelfExclusion::QuerySlots(_) => 3,
    };
    group.same_everywhere(
        OP,
        &[
            ("embedding width d", queries.ncols() as u64),
            ("refs given", u64::from(refs_given)),
            ("k", super::fingerprint(&cfg.k)),
            ("include", super::fingerprint(&cfg.include)),
            ("avg_of_avgs", u64::from(cfg.avg_of_avgs)),
            (
                "self_exclusion (0 Auto, 1 None, 2 SameIndex, 3 QuerySlots)",
                exclusion,
            ),
        ],
    )?;
    let ref_labels = local_refs.map_or(&local_queries.labels, |r| &r.labels);
    let query_labels: Vec<L> = local_queries.labels.iter().copied().collect();
    let all_query_labels = group.all_gather(OP, &query_labels)?;
    let local_ref_labels: Vec<L> = ref_labels.iter().copied().collect();
    let all_ref_labels = group.all_gather(OP, &local_ref_labels)?;
    let (q_total, n_total) = (all_query_labels.len(), all_ref_labels.len());
    let query_offset: usize = group.all_gather_counts(OP, queries.nrows())?[..group.rank()]
        .iter()
        .sum();

    // Which global reference each local query is.
    let rule = match &cfg.self_exclusion {
        SelfExclusion::Auto if !refs_given => &SelfExclusion::SameIndex,
        SelfExclusion::Auto => &SelfExclusion::None,
        other => other,
    };
    if matches!(rule, SelfExclusion::SameIndex) && n_total < q_total {
        return Err(Error::Shape {
            op: OP,
            what: "references of all ranks",
            expected: format!("at least the {q_total} queries of all ranks (SameIndex)"),
            got: vec![n_total, queries.ncols()],
        });
    }
    if matches!(rule, SelfExclusion::SameIndex) && all_query_labels[..] != all_ref_labels[..q_total]
    {
        return Err(Error::InvalidParameter {
            op: OP,
            what: "self_exclusion",
            value: "SameIndex".into(),
            rule: "the first references of all ranks must be the queries of all ranks",
        });
    }
    let slots = match rule {
        SelfExclusion::QuerySlots(slots) => slots.clone(),
        SelfExclusion::SameIndex => (query_offset..query_offset + queries.nrows())
            .map(|i| i as u32)
            .collect(),
        SelfExclusion::Auto | SelfExclusion::None => vec![NO_SLOT; queries.nrows()],
    };
    // Named slots must be references (as in one process); the others are this function's.
    let named = matches!(rule, SelfExclusion::QuerySlots(_));
    let slots = group.agree(
        OP,
        match slots.iter().find(|&&s| named && s as usize >= n_total) {
            Some(&bad) => Err(Error::InvalidParameter {
                op: OP,
                what: "self-exclusion slot",
                value: bad.to_string(),
                rule: "a global reference index (below all ranks' references)",
            }),
            None => Ok(slots),
        },
    )?;

    // R per local query: the references of its label, less itself.
    let mut counts: HashMap<L, usize> = HashMap::new();
    for &l in &all_ref_labels {
        *counts.entry(l).or_insert(0) += 1;
    }
    let relevant: Vec<usize> = query_labels
        .iter()
        .zip(&slots)
        .map(|(l, &slot)| {
            let own = slot != NO_SLOT && all_ref_labels.get(slot as usize) == Some(l);
            counts.get(l).copied().unwrap_or(0) - usize::from(own)
        })
        .collect();
    let max_relevant = group
        .all_gather(OP, &[relevant.iter().copied().max().unwrap_or(0) as u64])?
        .into_iter()
        .max()
        .unwrap_or(0) as usize;
    let excludes = !matches!(rule, SelfExclusion::None | SelfExclusion::Auto) && q_total > 0;
    let k = search_k(cfg.k, n_total - usize::from(excludes), max_relevant)?;
    let lone_here = relevant.iter().filter(|&&r| r == 0).count() as u64;
    let lone_queries = group.all_gather(OP, &[lone_here])?.iter().sum::<u64>() as usize;

    let mut out = Accuracy {
        metrics: AccuracyMetrics::NAN,
        per_class: Vec::new(),
        lone_queries,
        nmi: None,
        ami: None,
        k,
        path: ctx.path(),
        transfers: Default::default(),
    };
    if k == 0 || max_relevant == 0 {
        return Ok(out);
    }
    let knn_cfg = KnnConfig {
        k,
        distance: cfg.distance,
        self_exclusion: match excludes {
            true => SelfExclusion::QuerySlots(slots),
            false => SelfExclusion::None,
        },
        hooks: cfg.hooks.clone(),
    };
    let found = knn(group, ctx, queries, refs, &knn_cfg)?;
    // Each query's metrics here, then every query's everywhere, in global order.
    let mine = query_metrics(
        found.indices.view(),
        &query_labels,
        &all_ref_labels,
        &relevant,
    );
    let flat: Vec<f64> = mine
        .iter()
        .flat_map(|m| match m {
            Some(m) => m.values(),
            None => [f64::NAN; 5],
        })
        .collect();
    let all = group.all_gather(OP, &flat)?;
    let each = all.chunks_exact(5).map(|v| {
        // A lone query's row is all NaN; a scored query's metrics are never NaN.
        let values = [v[0], v[1], v[2], v[3], v[4]];
        (!values[0].is_nan()).then(|| AccuracyMetrics::from_values(values))
    });
    let (metrics, per_class) =
        summarize(all_query_labels.iter().copied().zip(each), cfg.avg_of_avgs);
    out.metrics = metrics.only(&cfg.include);
    out.per_class = per_class
        .into_iter()
        .map(|(l, m)| (l, m.only(&cfg.include)))
        .collect();
    out.path = found.path;
    out.transfers = found.transfers;
    Ok(out)
}

/// A side's host rows with one label each.
fn host_rows<'a, L>(set: &MiningSet<'a, L>, what: &'static str) -> Result<ArrayView2<'a, f32>> {
    match set.embeddings {
        Some(Embeddings::Host(x)) if x.nrows() == set.labels.len() => Ok(x),
        Some(Embeddings::Host(x)) => Err(Error::Shape {
            op: OP,
            what,
            expected: format!("one label per row ({} rows)", x.nrows()),
            got: vec![set.labels.len()],
        }),
        _ => Err(Error::InvalidParameter {
            op: OP,
            what,
            value: "none or device-resident embeddings".into(),
            rule: "host arrays (queries are sent to every rank)",
        }),
    }
}
