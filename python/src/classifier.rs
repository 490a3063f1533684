//! The losses with class weights (`classifier_loss`: ArcFace and its family).

use numpy::{IntoPyArray, PyArray1, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use wgpu_metric_learning as wml;
use wml::{
    ClassSampling, ClassShard, ClassifierKind, ClassifierLossConfig, ClassifierOptions, MarginGrad,
    ShardCollectives,
};

use crate::call::run;
use crate::context::PyContext;

/// PML's classifier loss `kind` (`"arcface"`, `"cosface"`, …) with its gradients: `(loss,
/// count, grad (b, d), weight_grad (the weights' shape), classes_used)`; every option `None`
/// is PML's default, and one the loss does not take is a `ValueError`. `sample_rate` and
/// `seed`: PartialFC's sampling of the classes (`ClassSampling`).
#[pyfunction]
#[pyo3(signature = (ctx, embeddings, labels, weights, kind, *, margin = None, scale = None, margin_grad = None, centres = None, temperature = None, softmax_scale = None, la = None, gamma = None, alpha = None, sample_rate = None, seed = None))]
#[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
pub(crate) fn classifier_loss<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    embeddings: PyReadonlyArray2<'py, f32>,
    labels: PyReadonlyArray1<'py, i64>,
    weights: PyReadonlyArray2<'py, f32>,
    kind: &str,
    margin: Option<f32>,
    scale: Option<f32>,
    margin_grad: Option<&str>,
    centres: Option<usize>,
    temperature: Option<f32>,
    softmax_scale: Option<f32>,
    la: Option<f32>,
    gamma: Option<f32>,
    alpha: Option<f32>,
    sample_rate: Option<f32>,
    seed: Option<u64>,
) -> PyResult<Bound<'py, PyTuple>> {
    let kind = kind_of(
        kind,
        (margin, scale, margin_grad, centres),
        [temperature, softmax_scale, la, gamma, alpha],
    )?;
    let sampling = ClassSampling {
        rate: sample_rate.unwrap_or(1.0),
        seed: seed.unwrap_or(0),
    };
    let (x, w) = (embeddings.as_array(), weights.as_array());
    let labels = labels.as_array();
    let labels = labels
        .as_slice()
        .map_or_else(|| labels.to_vec(), <[i64]>::to_vec);
    let inner = &ctx.inner;
    let out = run(py, move |hooks| {
        let cfg = ClassifierLossConfig {
            kind,
            sampling,
            hooks,
        };
        wml::classifier_loss(inner, x, &labels, w, &cfg)
    })?;
    PyTuple::new(
        py,
        [
            out.loss.into_pyobject(py)?.into_any(),
            out.count.into_pyobject(py)?.into_any(),
            out.grad.into_pyarray(py).into_any(),
            out.weight_grad.into_pyarray(py).into_any(),
            out.classes_used.into_pyobject(py)?.into_any(),
        ],
    )
}

/// The classes PartialFC's sampling runs over among `classes` (numbered from `first_class`)
/// for `labels`: `ClassSampling { rate, seed }.sample(..)`, as int64 indices.
#[pyfunction]
#[pyo3(signature = (classes, labels, rate, seed, first_class = 0))]
pub(crate) fn sampled_classes<'py>(
    py: Python<'py>,
    classes: usize,
    labels: PyReadonlyArray1<'py, i64>,
    rate: f32,
    seed: u64,
    first_class: usize,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    if !(rate > 0.0 && rate <= 1.0) {
        return Err(PyValueError::new_err(format!(
            "rate must be in (0, 1], got {rate}"
        )));
    }
    let labels: Vec<usize> = labels
        .as_array()
        .iter()
        .filter_map(|&y| usize::try_from(y).ok())
        .collect();
    let kept = ClassSampling { rate, seed }.sample(first_class..first_class + classes, &labels);
    let kept: Vec<i64> = kept.into_iter().map(|c| c as i64).collect();
    Ok(kept.into_pyarray(py))
}

/// The margin losses' options: `margin`, `scale`, `margin_grad`, `centres`.
type MarginOptions<'a> = (Option<f32>, Option<f32>, Option<&'a str>, Option<usize>);

/// The other losses' options: `temperature`, `softmax_scale`, `la`, `gamma`, `alpha`.
type OtherOptions = [Option<f32>; 5];

/// The loss `kind` with PML's defaults and the options given.
pub(crate) fn kind_of(
    kind: &str,
    (margin, scale, margin_grad, centres): MarginOptions<'_>,
    [temperature, softmax_scale, la, gamma, alpha]: OtherOptions,
) -> PyResult<ClassifierKind> {
    let margin_grad = match margin_grad {
        None => None,
        Some("pml") => Some(MarginGrad::Pml),
        Some("straight_through") => Some(MarginGrad::StraightThrough),
        Some(other) => {
            return Err(PyValueError::new_err(format!(
                "margin_grad must be 'pml' or 'straight_through', got {other:?}"
            )))
        }
    };
    let options = ClassifierOptions {
        margin,
        scale,
        margin_grad,
        centres,
        temperature,
        softmax_scale,
        la,
        gamma,
        alpha,
    };
    ClassifierKind::from_options(kind, &options).map_err(crate::call::py_err)
}

/// A Python object's collectives (`rank`, `size`, `all_gather(values)`,
/// `reduce_scatter(values, block)` over float64 arrays): torch.distributed's, from
/// `wgpu_metric_learning.distributed`.
struct PyCollectives {
    engine: Py<PyAny>,
    rank: usize,
    size: usize,
}

impl PyCollectives {
    /// `engine.method(array, *more)` as a float64 vector; a Python exception is this rank's
    /// failure.
    fn call(&self, method: &str, values: &[f64], block: Option<usize>) -> wml::Result<Vec<f64>> {
        Python::attach(|py| -> PyResult<Vec<f64>> {
            let array = PyArray1::from_slice(py, values);
            let out = match block {
                Some(b) => self.engine.call_method1(py, method, (array, b))?,
                None => self.engine.call_method1(py, method, (array,))?,
            };
            let out = out.bind(py).cast::<PyArray1<f64>>()?.readonly();
            Ok(out.as_array().to_vec())
        })
        .map_err(|e| wml::Error::RankFailed {
            op: "classifier_loss_sharded",
            rank: self.rank,
            message: format!("{method}: {e}"),
        })
    }
}

impl ShardCollectives for PyCollectives {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_gather(&self, values: &[f64]) -> wml::Result<Vec<f64>> {
        self.call("all_gather", values, None)
    }

    fn reduce_scatter(&self, send: Vec<f64>, block: usize) -> wml::Result<Vec<f64>> {
        self.call("reduce_scatter", &send, Some(block))
    }
}

/// One process's part of `classifier_loss` with the classes split over processes:
/// `embeddings` holds every process's rows in rank order (`rows_of` each), `weights` this
/// process's classes from `first_class` (of `classes`), and `collectives` moves the exchanges
/// (an object with `rank`, `size`, `all_gather` and `reduce_scatter`). Returns `(loss,
/// count, grad (this process's rows), weight_grad (its classes), classes_used)`.
#[pyfunction]
#[pyo3(signature = (ctx, embeddings, labels, weights, kind, first_class, classes, rows_of, collectives, *, margin = None, scale = None, margin_grad = None, centres = None, temperature = None, softmax_scale = None, la = None, gamma = None, alpha = None, sample_rate = None, seed = None))]
#[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
pub(crate) fn classifier_loss_sharded<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    embeddings: PyReadonlyArray2<'py, f32>,
    labels: PyReadonlyArray1<'py, i64>,
    weights: PyReadonlyArray2<'py, f32>,
    kind: &str,
    first_class: usize,
    classes: usize,
    rows_of: Vec<usize>,
    collectives: Py<PyAny>,
    margin: Option<f32>,
    scale: Option<f32>,
    margin_grad: Option<&str>,
    centres: Option<usize>,
    temperature: Option<f32>,
    softmax_scale: Option<f32>,
    la: Option<f32>,
    gamma: Option<f32>,
    alpha: Option<f32>,
    sample_rate: Option<f32>,
    seed: Option<u64>,
) -> PyResult<Bound<'py, PyTuple>> {
    let kind = kind_of(
        kind,
        (margin, scale, margin_grad, centres),
        [temperature, softmax_scale, la, gamma, alpha],
    )?;
    let sampling = ClassSampling {
        rate: sample_rate.unwrap_or(1.0),
        seed: seed.unwrap_or(0),
    };
    let rank: usize = collectives.getattr(py, "rank")?.extract(py)?;
    let size: usize = collectives.getattr(py, "size")?.extract(py)?;
    let engine = PyCollectives {
        engine: collectives,
        rank,
        size,
    };
    let shard = ClassShard {
        first_class,
        classes,
        rows_of,
    };
    let (x, w) = (embeddings.as_array(), weights.as_array());
    let labels = labels.as_array().to_vec();
    let inner = &ctx.inner;
    let out = run(py, move |hooks| {
        let cfg = ClassifierLossConfig {
            kind,
            sampling,
            hooks,
        };
        wml::classifier_loss_sharded(inner, x, &labels, w, &cfg, &shard, &engine)
    })?;
    PyTuple::new(
        py,
        [
            out.loss.into_pyobject(py)?.into_any(),
            out.count.into_pyobject(py)?.into_any(),
            out.grad.into_pyarray(py).into_any(),
            out.weight_grad.into_pyarray(py).into_any(),
            out.classes_used.into_pyobject(py)?.into_any(),
        ],
    )
}
