//! Distances, nearest neighbours and evaluation: `pairwise_distances`, `knn`, `accuracy`,
//! `kmeans`, NMI and AMI.

use numpy::{IntoPyArray, PyArray2, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use wgpu_metric_learning as wml;
use wml::{
    AccuracyConfig, AccuracyK, AccuracyMetrics, Embeddings, Error, KmeansConfig, KnnConfig,
    PairwiseConfig, SelfExclusion,
};

use crate::call::{distance_config, labelled, py_err, run, self_exclusion, Rows};
use crate::context::PyContext;

/// Distances `(q, n)` between queries `(q, d)` and references.
#[pyfunction]
#[pyo3(signature = (ctx, queries, refs = None, *, distance = "euclidean", normalize = true))]
pub(crate) fn pairwise_distances<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    queries: PyReadonlyArray2<'py, f32>,
    refs: Option<&Bound<'py, PyAny>>,
    distance: &str,
    normalize: bool,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let distance = distance_config(distance, normalize)?;
    let rows = Rows::extract(ctx, refs)?;
    let q = Embeddings::Host(queries.as_array());
    let r = rows.embeddings(Embeddings::Host(queries.as_array()));
    let c = &ctx.inner;
    let d = run(py, move |hooks| {
        wml::pairwise_distances(c, q, r, &PairwiseConfig { distance, hooks })
    })?;
    Ok(d.values.into_pyarray(py))
}

/// The `k` best references of every query: `(indices (q, k) uint32, scores (q, k) float32)`.
#[pyfunction]
#[pyo3(signature = (ctx, queries, refs = None, *, k = 10, distance = "euclidean", normalize = true, self_exclusion = None))]
#[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
pub(crate) fn knn<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    queries: PyReadonlyArray2<'py, f32>,
    refs: Option<&Bound<'py, PyAny>>,
    k: usize,
    distance: &str,
    normalize: bool,
    self_exclusion: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let distance = distance_config(distance, normalize)?;
    let rows = Rows::extract(ctx, refs)?;
    // With no references given they are the queries, and a query is not its own neighbour
    // (the library's `Auto` excludes nothing for knn, whose references are always explicit).
    let exclusion = match (self::self_exclusion(self_exclusion)?, &rows) {
        (SelfExclusion::Auto, Rows::Queries) => SelfExclusion::SameIndex,
        (e, _) => e,
    };
    let q = Embeddings::Host(queries.as_array());
    let r = rows.embeddings(Embeddings::Host(queries.as_array()));
    let c = &ctx.inner;
    let found = run(py, move |hooks| {
        let cfg = KnnConfig {
            k,
            distance,
            self_exclusion: exclusion,
            hooks,
        };
        wml::knn(c, q, r, &cfg)
    })?;
    PyTuple::new(
        py,
        [
            found.indices.into_pyarray(py).into_any(),
            found.scores.into_pyarray(py).into_any(),
        ],
    )
}

/// The included kNN metrics under PML's keys.
pub(crate) fn metrics_dict<'py>(
    py: Python<'py>,
    m: &AccuracyMetrics,
    include: &[wml::AccuracyMetric],
) -> PyResult<Bound<'py, PyDict>> {
    use wml::AccuracyMetric as M;
    let d = PyDict::new(py);
    for (metric, value) in [
        (M::PrecisionAt1, m.precision_at_1),
        (M::RPrecision, m.r_precision),
        (M::MeanAveragePrecisionAtR, m.mean_average_precision_at_r),
        (M::MeanAveragePrecision, m.mean_average_precision),
        (M::MeanReciprocalRank, m.mean_reciprocal_rank),
    ] {
        if include.contains(&metric) {
            d.set_item(metric.name(), value)?;
        }
    }
    Ok(d)
}

/// `include` as PML spells it (`None`: the five kNN metrics).
pub(crate) fn include_arg(include: Option<Vec<String>>) -> PyResult<Vec<wml::AccuracyMetric>> {
    match include {
        None => Ok(wml::AccuracyMetric::KNN.to_vec()),
        Some(names) => names
            .iter()
            .map(|n| {
                n.parse()
                    .map_err(|e: Error| PyValueError::new_err(e.to_string()))
            })
            .collect(),
    }
}

/// PML's `AccuracyCalculator` metrics: a dict with `metrics`, `per_class` (label → metrics),
/// `lone_queries` and `k`.
#[pyfunction]
#[pyo3(signature = (ctx, embeddings, labels, refs = None, *, k = None, distance = "squared_euclidean", normalize = false, self_exclusion = None, avg_of_avgs = false, include = None, kmeans_seed = 1234, kmeans_iterations = 20))]
#[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
pub(crate) fn accuracy<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    embeddings: PyReadonlyArray2<'py, f32>,
    labels: PyReadonlyArray1<'py, i64>,
    refs: Option<&Bound<'py, PyAny>>,
    k: Option<&Bound<'py, PyAny>>,
    distance: &str,
    normalize: bool,
    self_exclusion: Option<&Bound<'py, PyAny>>,
    avg_of_avgs: bool,
    include: Option<Vec<String>>,
    kmeans_seed: u64,
    kmeans_iterations: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let include = include_arg(include)?;
    let kept = include.clone();
    let k = match k {
        None => AccuracyK::All,
        Some(k) if k.is_none() => AccuracyK::All,
        Some(k) => {
            if let Ok(n) = k.extract::<usize>() {
                AccuracyK::Fixed(n)
            } else {
                match k.extract::<String>().as_deref() {
                    Ok("all") => AccuracyK::All,
                    Ok("max_bin_count") => AccuracyK::MaxBinCount,
                    _ => {
                        return Err(PyValueError::new_err(
                            "k must be None, 'all', 'max_bin_count' or a positive integer",
                        ))
                    }
                }
            }
        }
    };
    let distance = distance_config(distance, normalize)?;
    let exclusion = self::self_exclusion(self_exclusion)?;
    let acc = labelled(
        py,
        ctx,
        Some(&embeddings),
        &labels,
        refs,
        move |c, q, r, hooks| {
            let cfg = AccuracyConfig {
                k,
                distance,
                self_exclusion: exclusion,
                avg_of_avgs,
                include,
                kmeans: KmeansConfig {
                    seed: kmeans_seed,
                    max_iterations: kmeans_iterations,
                    ..Default::default()
                },
                hooks,
            };
            wml::accuracy(c, q, r, &cfg)
        },
    )?;
    let out = PyDict::new(py);
    let metrics = metrics_dict(py, &acc.metrics, &kept)?;
    if let Some(nmi) = acc.nmi {
        metrics.set_item("NMI", nmi)?;
    }
    if let Some(ami) = acc.ami {
        metrics.set_item("AMI", ami)?;
    }
    out.set_item("metrics", metrics)?;
    let per_class = PyDict::new(py);
    for (label, m) in &acc.per_class {
        per_class.set_item(label, metrics_dict(py, m, &kept)?)?;
    }
    out.set_item("per_class", per_class)?;
    out.set_item("lone_queries", acc.lone_queries)?;
    out.set_item("k", acc.k)?;
    Ok(out)
}

/// k-means of the points (Faiss's, on the library's top-1 search): `(centroids (k, d) float32,
/// assignments (n,) uint32, distances (n,) float32, inertia, iterations)`.
#[pyfunction]
#[pyo3(signature = (ctx, points, clusters, *, max_iterations = 20, tolerance = 0.0, seed = 1234, max_points_per_centroid = 256))]
#[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
pub(crate) fn kmeans<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    points: PyReadonlyArray2<'py, f32>,
    clusters: usize,
    max_iterations: usize,
    tolerance: f64,
    seed: u64,
    max_points_per_centroid: usize,
) -> PyResult<Bound<'py, PyTuple>> {
    let x = points.as_array();
    let c = &ctx.inner;
    let km = run(py, move |hooks| {
        let cfg = KmeansConfig {
            clusters,
            max_iterations,
            tolerance,
            seed,
            max_points_per_centroid,
            hooks,
        };
        wml::kmeans(c, x, &cfg)
    })?;
    PyTuple::new(
        py,
        [
            km.centroids.into_pyarray(py).into_any(),
            km.assignments.into_pyarray(py).into_any(),
            km.distances.into_pyarray(py).into_any(),
            km.inertia.into_pyobject(py)?.into_any(),
            km.iterations.into_pyobject(py)?.into_any(),
        ],
    )
}

/// scikit-learn's `normalized_mutual_info_score` (arithmetic mean) of two int64 labelings.
#[pyfunction]
pub(crate) fn normalized_mutual_info(
    labels_true: PyReadonlyArray1<'_, i64>,
    labels_pred: PyReadonlyArray1<'_, i64>,
) -> PyResult<f64> {
    wml::normalized_mutual_info(labels_true.as_array(), labels_pred.as_array()).map_err(py_err)
}

/// scikit-learn's `adjusted_mutual_info_score` (arithmetic mean) of two int64 labelings.
#[pyfunction]
pub(crate) fn adjusted_mutual_info(
    py: Python<'_>,
    labels_true: PyReadonlyArray1<'_, i64>,
    labels_pred: PyReadonlyArray1<'_, i64>,
) -> PyResult<f64> {
    let (a, b) = (labels_true.as_array(), labels_pred.as_array());
    // The expected mutual information can take a while: other Python threads run meanwhile.
    py.detach(|| wml::adjusted_mutual_info(a, b))
        .map_err(py_err)
}
