//! How every call crosses into the library: the GIL released on a worker thread while the
//! caller watches for Ctrl-C, errors as Python exceptions, and the shared argument
//! conversions (distances, self-exclusion, labelled inputs and references).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use numpy::{PyArray1, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::exceptions::{
    PyKeyboardInterrupt, PyMemoryError, PyOSError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use wgpu_metric_learning as wml;
use wml::{
    CancelToken, Context, Distance, DistanceConfig, Embeddings, Error, Hooks, MiningSet,
    SelfExclusion,
};

use crate::bank::PyMemoryBank;
use crate::context::PyContext;
/// How often the calling thread looks for a pending Ctrl-C while a call runs.
pub(crate) const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// The library's error as the Python exception its kind calls for, with the whole chain of
/// causes in the message.
pub(crate) fn py_err(e: Error) -> PyErr {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    match e {
        Error::Shape { .. }
        | Error::NonFinite { .. }
        | Error::InvalidParameter { .. }
        | Error::Checkpoint { .. } => PyValueError::new_err(message),
        Error::OverBudget { .. } | Error::BudgetExceeded { .. } | Error::OutOfMemory { .. } => {
            PyMemoryError::new_err(message)
        }
        Error::Cancelled { .. } => PyKeyboardInterrupt::new_err(message),
        Error::Io { .. } => PyOSError::new_err(message),
        _ => PyRuntimeError::new_err(message),
    }
}

/// Runs `op` on a worker thread with the GIL released; the calling thread polls for signals
/// and cancels `op` (through the hooks it passes) when a Python signal handler raises.
/// Returns the handler's exception then, once `op` has stopped and freed what it held.
pub(crate) fn run<T: Send>(
    py: Python<'_>,
    op: impl FnOnce(Hooks) -> wml::Result<T> + Send,
) -> PyResult<T> {
    let token = CancelToken::new();
    let hooks = Hooks::new().cancel_with(&token);
    let outcome = py.detach(|| {
        std::thread::scope(|scope| {
            let (tx, rx) = mpsc::sync_channel(1);
            let spawned = std::thread::Builder::new().spawn_scoped(scope, move || {
                let result = catch_unwind(AssertUnwindSafe(|| op(hooks)));
                // The receiver waits for this send unless it already returned an error.
                let _ = tx.send(result);
            });
            if let Err(e) = spawned {
                let failed = PyRuntimeError::new_err(format!("cannot start a worker thread: {e}"));
                return (Ok(Err(Error::Cancelled { op: "call" })), Some(failed));
            }
            let mut interrupted: Option<PyErr> = None;
            loop {
                match rx.recv_timeout(SIGNAL_POLL) {
                    Ok(result) => return (result, interrupted),
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        if interrupted.is_none() {
                            if let Err(e) = Python::attach(|py| py.check_signals()) {
                                token.cancel();
                                interrupted = Some(e);
                            }
                        }
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        let gone =
                            PyRuntimeError::new_err("the worker thread ended without a result");
                        return (Ok(Err(Error::Cancelled { op: "call" })), Some(gone));
                    }
                }
            }
        })
    });
    match outcome {
        (_, Some(signal)) => Err(signal),
        (Ok(result), None) => result.map_err(py_err),
        (Err(panic), None) => Err(internal_error(&panic)),
    }
}

/// Runs `op`, which changes state (a bank's rows, a file), to its end with the GIL released
/// and without cancellation: a Ctrl-C meanwhile is raised by Python as soon as this returns,
/// once the change is whole, rather than reported as a failure of a change that was made.
pub(crate) fn run_whole<T: Send>(
    py: Python<'_>,
    op: impl FnOnce() -> wml::Result<T> + Send,
) -> PyResult<T> {
    match py.detach(|| catch_unwind(AssertUnwindSafe(op))) {
        Ok(result) => result.map_err(py_err),
        Err(panic) => Err(internal_error(&panic)),
    }
}

pub(crate) fn internal_error(panic: &Box<dyn std::any::Any + Send>) -> PyErr {
    PyRuntimeError::new_err(format!(
        "internal error (a bug in wgpu-metric-learning): {}",
        panic_message(panic)
    ))
}

pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".to_string()
    }
}

pub(crate) fn distance_config(distance: &str, normalize: bool) -> PyResult<DistanceConfig> {
    let distance = match distance {
        "euclidean" => Distance::Euclidean,
        "squared_euclidean" => Distance::SquaredEuclidean,
        "cosine" => Distance::Cosine,
        "dot" => Distance::DotProduct,
        other => {
            return Err(PyValueError::new_err(format!(
            "distance must be 'euclidean', 'squared_euclidean', 'cosine' or 'dot', got {other:?}"
        )))
        }
    };
    Ok(DistanceConfig {
        distance,
        normalize,
    })
}

/// `None` or `"auto"`, `"none"`, `"same_index"`, or one reference slot per query.
pub(crate) fn self_exclusion(arg: Option<&Bound<'_, PyAny>>) -> PyResult<SelfExclusion> {
    let Some(arg) = arg else {
        return Ok(SelfExclusion::Auto);
    };
    if arg.is_none() {
        return Ok(SelfExclusion::Auto);
    }
    if let Ok(s) = arg.extract::<String>() {
        return match s.as_str() {
            "auto" => Ok(SelfExclusion::Auto),
            "none" => Ok(SelfExclusion::None),
            "same_index" => Ok(SelfExclusion::SameIndex),
            other => Err(PyValueError::new_err(format!(
                "self_exclusion must be None, 'auto', 'none', 'same_index' or one slot per query, got {other:?}"
            ))),
        };
    }
    if let Ok(slots) = arg.extract::<PyReadonlyArray1<'_, u32>>() {
        return Ok(SelfExclusion::QuerySlots(slots.as_array().to_vec()));
    }
    arg.extract::<Vec<u32>>()
        .map(SelfExclusion::QuerySlots)
        .map_err(|_| {
            PyTypeError::new_err(
                "self_exclusion must be None, a string, or a sequence of non-negative slot indices",
            )
        })
}

pub(crate) fn self_exclusion_to_py<'py>(
    py: Python<'py>,
    e: &SelfExclusion,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(match e {
        SelfExclusion::Auto => "auto".into_pyobject(py)?.into_any(),
        SelfExclusion::None => "none".into_pyobject(py)?.into_any(),
        SelfExclusion::SameIndex => "same_index".into_pyobject(py)?.into_any(),
        SelfExclusion::QuerySlots(slots) => PyArray1::from_slice(py, slots).into_any(),
        other => {
            return Err(PyRuntimeError::new_err(format!(
                "a self-exclusion this version cannot express in Python: {other:?}"
            )))
        }
    })
}

pub(crate) fn path_name(p: wml::ComputePath) -> &'static str {
    match p {
        wml::ComputePath::Wgpu => "wgpu",
        wml::ComputePath::NativeCpu => "native_cpu",
    }
}

pub(crate) fn transfers_dict<'py>(
    py: Python<'py>,
    t: &wml::Transfers,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("host_waits", t.host_waits)?;
    d.set_item("submissions", t.submissions)?;
    d.set_item("bytes_up", t.bytes_up)?;
    d.set_item("bytes_down", t.bytes_down)?;
    let h = &t.host;
    d.set_item("upload_seconds", h.seconds(h.upload_ns))?;
    d.set_item("wait_seconds", h.seconds(h.wait_ns))?;
    d.set_item("readback_seconds", h.seconds(h.readback_ns))?;
    d.set_item("tune_seconds", h.seconds(h.tune_ns))?;
    d.set_item("submit_seconds", h.seconds(h.submit_ns))?;
    // Each kernel's dispatches and GPU seconds (with kernel timing on; empty otherwise).
    let kernels = PyDict::new(py);
    for k in t.kernels.iter() {
        let line = PyDict::new(py);
        line.set_item("dispatches", k.dispatches)?;
        line.set_item("gpu_seconds", k.gpu_seconds)?;
        kernels.set_item(k.stem, line)?;
    }
    d.set_item("kernels", kernels)?;
    Ok(d)
}

/// References of a labelled operation, borrowed for the call.
pub(crate) enum Refs<'py> {
    Queries,
    Bank(PyRef<'py, PyMemoryBank>),
    Arrays(
        Option<PyReadonlyArray2<'py, f32>>,
        PyReadonlyArray1<'py, i64>,
    ),
}

impl<'py> Refs<'py> {
    /// `None`, a `MemoryBank` of `ctx`, or `(embeddings or None, labels)`.
    pub(crate) fn extract(ctx: &PyContext, refs: Option<&Bound<'py, PyAny>>) -> PyResult<Self> {
        let Some(refs) = refs.filter(|r| !r.is_none()) else {
            return Ok(Self::Queries);
        };
        if let Ok(bank) = refs.cast::<PyMemoryBank>() {
            let bank = bank
                .try_borrow()
                .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
            check_same_context(ctx, &bank.ctx)?;
            return Ok(Self::Bank(bank));
        }
        let (emb, labels): (Option<PyReadonlyArray2<'py, f32>>, PyReadonlyArray1<'py, i64>) =
            refs.extract().map_err(|_| {
                PyTypeError::new_err(
                    "refs must be None, a MemoryBank, or (float32 (m, d) array or None, int64 (m,) labels)",
                )
            })?;
        Ok(Self::Arrays(emb, labels))
    }

    pub(crate) fn set(&self) -> Option<MiningSet<'_, i64>> {
        match self {
            Self::Queries => None,
            Self::Bank(b) => Some(b.bank.refs()),
            Self::Arrays(e, l) => Some(MiningSet {
                embeddings: e.as_ref().map(|e| Embeddings::Host(e.as_array())),
                labels: l.as_array(),
            }),
        }
    }
}

pub(crate) fn check_same_context(ctx: &PyContext, bank_ctx: &Arc<Context>) -> PyResult<()> {
    if Arc::ptr_eq(&ctx.inner, bank_ctx) {
        Ok(())
    } else {
        Err(PyValueError::new_err(
            "the MemoryBank was made on another Context; use the context it lives on",
        ))
    }
}

/// References of an unlabelled operation: `None`, an array, or a `MemoryBank`.
pub(crate) enum Rows<'py> {
    Queries,
    Bank(PyRef<'py, PyMemoryBank>),
    Array(PyReadonlyArray2<'py, f32>),
}

impl<'py> Rows<'py> {
    pub(crate) fn extract(ctx: &PyContext, refs: Option<&Bound<'py, PyAny>>) -> PyResult<Self> {
        let Some(refs) = refs.filter(|r| !r.is_none()) else {
            return Ok(Self::Queries);
        };
        if let Ok(bank) = refs.cast::<PyMemoryBank>() {
            let bank = bank
                .try_borrow()
                .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
            check_same_context(ctx, &bank.ctx)?;
            return Ok(Self::Bank(bank));
        }
        refs.extract().map(Self::Array).map_err(|_| {
            PyTypeError::new_err("refs must be None, a float32 (m, d) array or a MemoryBank")
        })
    }

    pub(crate) fn embeddings<'a>(&'a self, queries: Embeddings<'a>) -> Embeddings<'a> {
        match self {
            Self::Queries => queries,
            Self::Bank(b) => b.bank.rows(),
            Self::Array(a) => Embeddings::Host(a.as_array()),
        }
    }
}

/// Runs a labelled operation of the library (a miner, `accuracy`): the queries' embeddings
/// (or none) and labels against `refs` (see [`Refs::extract`]), with the GIL released.
pub(crate) fn labelled<'py, T: Send>(
    py: Python<'py>,
    ctx: &PyContext,
    embeddings: Option<&PyReadonlyArray2<'py, f32>>,
    labels: &PyReadonlyArray1<'py, i64>,
    refs: Option<&Bound<'py, PyAny>>,
    op: impl FnOnce(&Context, &MiningSet<'_, i64>, Option<&MiningSet<'_, i64>>, Hooks) -> wml::Result<T>
        + Send,
) -> PyResult<T> {
    let refs = Refs::extract(ctx, refs)?;
    let q = MiningSet {
        embeddings: embeddings.map(|e| Embeddings::Host(e.as_array())),
        labels: labels.as_array(),
    };
    let r = refs.set();
    let c = &ctx.inner;
    run(py, move |hooks| op(c, &q, r.as_ref(), hooks))
}
