//! The losses with class weights (`classifier_loss`: ArcFace and its family).

use numpy::{IntoPyArray, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use wgpu_metric_learning as wml;
use wml::{ClassifierKind, ClassifierLossConfig, ClassifierOptions, MarginGrad};

use crate::call::run;
use crate::context::PyContext;

/// PML's classifier loss `kind` (`"arcface"`, `"cosface"`, …) with its gradients: `(loss,
/// count, grad (b, d), weight_grad (the weights' shape))`; every option `None` is PML's
/// default, and one the loss does not take is a `ValueError`.
#[pyfunction]
#[pyo3(signature = (ctx, embeddings, labels, weights, kind, *, margin = None, scale = None, margin_grad = None, centres = None, temperature = None, softmax_scale = None, la = None, gamma = None, alpha = None))]
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
) -> PyResult<Bound<'py, PyTuple>> {
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
    let kind = ClassifierKind::from_options(kind, &options).map_err(crate::call::py_err)?;
    let (x, w) = (embeddings.as_array(), weights.as_array());
    let labels = labels.as_array();
    let labels = labels
        .as_slice()
        .map_or_else(|| labels.to_vec(), <[i64]>::to_vec);
    let inner = &ctx.inner;
    let out = run(py, move |hooks| {
        let cfg = ClassifierLossConfig { kind, hooks };
        wml::classifier_loss(inner, x, &labels, w, &cfg)
    })?;
    PyTuple::new(
        py,
        [
            out.loss.into_pyobject(py)?.into_any(),
            out.count.into_pyobject(py)?.into_any(),
            out.grad.into_pyarray(py).into_any(),
            out.weight_grad.into_pyarray(py).into_any(),
        ],
    )
}
