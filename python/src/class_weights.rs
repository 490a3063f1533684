//! Class-weight checkpoints (`save_weights_shard`, `save_weights_manifest`, `load_weights`):
//! the library's format, re-sharded on load, for the drop-ins' weights and torch's optimizer
//! state (`wgpu_metric_learning.distributed.save_class_weights` wraps these).

use std::path::PathBuf;

use numpy::{IntoPyArray, PyReadonlyArray2};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use wgpu_metric_learning as wml;
use wml::{ClassifierKind, OptimizerState, ShardRecord, WeightOptimizer, WeightsShard};

use crate::call::py_err;
use crate::classifier::kind_of;
use crate::context::PyContext;

/// A manifest's record of one shard: `(file, first_class, classes, bytes, checksum)`.
type Record = (String, usize, usize, u64, u64);

/// The layout of the loss `kind` with `centres` per class (the rest does not matter here).
fn layout(kind: &str, centres: Option<usize>) -> PyResult<ClassifierKind> {
    kind_of(kind, (None, None, None, centres), [None; 5])
}

/// `("sgd", [lr, momentum, dampening, weight_decay, nesterov])` or `("adamw", [lr, beta1,
/// beta2, eps, weight_decay])`, torch's settings of each (`WeightOptimizer::from_settings`).
fn optimizer_of(name: &str, s: &[f32]) -> PyResult<WeightOptimizer> {
    <[f32; 5]>::try_from(s)
        .ok()
        .and_then(|s| WeightOptimizer::from_settings(name, s))
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "optimizer must be ('sgd' or 'adamw', five settings), got ({name:?}, {} settings)",
                s.len()
            ))
        })
}

/// Saves classes `first_class ..` (of `classes`) of the loss `kind`'s weights (PML's layout)
/// with the optimizer `(name, settings)` and its state (`steps`, `buffers` of the weights'
/// shape) into `directory` atomically; returns the shard's record for the manifest.
#[pyfunction]
#[pyo3(signature = (ctx, directory, kind, centres, classes, first_class, weights, optimizer, steps, buffers))]
#[allow(clippy::too_many_arguments, reason = "Python arguments")]
pub(crate) fn save_weights_shard(
    py: Python<'_>,
    ctx: &PyContext,
    directory: PathBuf,
    kind: &str,
    centres: Option<usize>,
    classes: usize,
    first_class: usize,
    weights: PyReadonlyArray2<'_, f32>,
    optimizer: (String, Vec<f32>),
    steps: u64,
    buffers: Vec<PyReadonlyArray2<'_, f32>>,
) -> PyResult<Record> {
    let kind = layout(kind, centres)?;
    let opt = optimizer_of(&optimizer.0, &optimizer.1)?;
    let buffers: Vec<_> = buffers.iter().map(|b| b.as_array().to_owned()).collect();
    let state = OptimizerState::restored(&ctx.inner, steps, buffers).map_err(py_err)?;
    let weights = weights.as_array();
    let shard = WeightsShard {
        kind: &kind,
        classes,
        first_class,
        weights,
        optimizer: &opt,
        state: &state,
    };
    let r = py
        .detach(|| wml::save_weights_shard(&directory, &shard))
        .map_err(py_err)?;
    Ok((r.file, r.first_class, r.classes, r.bytes, r.checksum))
}

/// Writes the manifest of `classes` classes naming `records` (every shard's, from
/// [`save_weights_shard`]), atomically, after every shard is saved.
#[pyfunction]
pub(crate) fn save_weights_manifest(
    directory: PathBuf,
    classes: usize,
    records: Vec<Record>,
) -> PyResult<()> {
    let records: Vec<ShardRecord> = records
        .into_iter()
        .map(
            |(file, first_class, classes, bytes, checksum)| ShardRecord {
                file,
                first_class,
                classes,
                bytes,
                checksum,
            },
        )
        .collect();
    wml::save_weights_manifest(&directory, classes, &records).map_err(py_err)
}

/// The classes of the checkpoint in `directory`, from its manifest alone.
#[pyfunction]
pub(crate) fn checkpoint_classes(directory: PathBuf) -> PyResult<usize> {
    wml::weights_checkpoint_classes(&directory).map_err(py_err)
}

/// Classes `start..end` of the checkpoint in `directory` (saved for the loss `kind`): `(weights,
/// classes in the checkpoint, (optimizer name, settings), steps, buffers)`, from whichever
/// shards hold them.
#[pyfunction]
#[pyo3(signature = (ctx, directory, kind, centres, start, end))]
pub(crate) fn load_weights<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    directory: PathBuf,
    kind: &str,
    centres: Option<usize>,
    start: usize,
    end: usize,
) -> PyResult<Bound<'py, PyTuple>> {
    let kind = layout(kind, centres)?;
    let inner = &ctx.inner;
    let loaded = py
        .detach(|| wml::load_weights(inner, &directory, &kind, start..end))
        .map_err(py_err)?;
    let (name, settings) = (loaded.optimizer.name(), loaded.optimizer.settings());
    let steps = loaded.state.steps();
    let buffers = PyList::empty(py);
    for b in loaded.state.buffers() {
        buffers.append(b.clone().into_pyarray(py))?;
    }
    PyTuple::new(
        py,
        [
            loaded.weights.into_pyarray(py).into_any(),
            loaded.classes.into_pyobject(py)?.into_any(),
            (name, settings.to_vec()).into_pyobject(py)?.into_any(),
            steps.into_pyobject(py)?.into_any(),
            buffers.into_any(),
        ],
    )
}
