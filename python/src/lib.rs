//! The extension module behind the `wgpu_metric_learning` Python package
//! (`wgpu_metric_learning._native`).
//!
//! Thin on purpose: arguments arrive already converted by the package's Python layer (`float32`
//! matrices, `int64` labels, strings for enums), every call runs the library with the GIL
//! released on a worker thread while the calling thread watches for Ctrl-C (a pending
//! `KeyboardInterrupt` cancels the call through the library's [`CancelToken`]), and every
//! library [`Error`] becomes a Python exception carrying its whole message: bad input is a
//! `ValueError`, a budget or out-of-memory failure a `MemoryError`, a cancelled call a
//! `KeyboardInterrupt`, a file error an `OSError`, anything from the device a `RuntimeError`.
//! Inputs are borrowed from NumPy without copying (any strides); outputs are the library's own
//! arrays handed to NumPy without copying.

use std::ops::ControlFlow;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, TryLockError};
use std::time::Duration;

use ndarray::{Array1, Array2};
use numpy::{IntoPyArray, PyArray1, PyArray2, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::exceptions::{
    PyKeyboardInterrupt, PyMemoryError, PyOSError, PyRuntimeError, PyStopIteration, PyTypeError,
    PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use wgpu_metric_learning as wml;
use wml::{
    AccuracyConfig, AccuracyK, AccuracyMetrics, AdapterSelector, AllPairsConfig, BackendChoice,
    BankConfig, BatchEasyHardConfig, BatchHardConfig, CancelToken, Context, ContextConfig,
    Distance, DistanceConfig, Embeddings, Error, Hooks, InfoNceConfig, KmeansConfig, KnnConfig,
    MemoryBank, MiningSet, MnrlConfig, MultiSimilarityConfig, PairMarginConfig, PairwiseConfig,
    SelfExclusion, Strategy, TripletConfig, TripletLossConfig, TripletRule, TripletType,
};

/// How often the calling thread looks for a pending Ctrl-C while a call runs.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// The library's error as the Python exception its kind calls for, with the whole chain of
/// causes in the message.
fn py_err(e: Error) -> PyErr {
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
fn run<T: Send>(py: Python<'_>, op: impl FnOnce(Hooks) -> wml::Result<T> + Send) -> PyResult<T> {
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
fn run_whole<T: Send>(py: Python<'_>, op: impl FnOnce() -> wml::Result<T> + Send) -> PyResult<T> {
    match py.detach(|| catch_unwind(AssertUnwindSafe(op))) {
        Ok(result) => result.map_err(py_err),
        Err(panic) => Err(internal_error(&panic)),
    }
}

fn internal_error(panic: &Box<dyn std::any::Any + Send>) -> PyErr {
    PyRuntimeError::new_err(format!(
        "internal error (a bug in wgpu-metric-learning): {}",
        panic_message(panic)
    ))
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".to_string()
    }
}

fn distance_config(distance: &str, normalize: bool) -> PyResult<DistanceConfig> {
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
fn self_exclusion(arg: Option<&Bound<'_, PyAny>>) -> PyResult<SelfExclusion> {
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

fn self_exclusion_to_py<'py>(py: Python<'py>, e: &SelfExclusion) -> PyResult<Bound<'py, PyAny>> {
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

/// A library context: one device (or the native CPU path) and its memory budget.
#[pyclass(frozen, name = "Context", module = "wgpu_metric_learning._native")]
struct PyContext {
    inner: Arc<Context>,
}

#[pymethods]
impl PyContext {
    #[new]
    #[pyo3(signature = (backend = "auto", budget = None, adapter = None, fill_outputs_with_sentinel = false, kernel_timing = false))]
    fn new(
        py: Python<'_>,
        backend: &str,
        budget: Option<u64>,
        adapter: Option<&Bound<'_, PyAny>>,
        fill_outputs_with_sentinel: bool,
        kernel_timing: bool,
    ) -> PyResult<Self> {
        let (backend, wgpu_backends) = match backend {
            "auto" => (BackendChoice::Auto, None),
            "gpu" | "wgpu" => (BackendChoice::Wgpu, None),
            "cpu" | "native" => (BackendChoice::NativeCpu, None),
            "vulkan" => (BackendChoice::Wgpu, Some(wgpu::Backends::VULKAN)),
            "metal" => (BackendChoice::Wgpu, Some(wgpu::Backends::METAL)),
            "dx12" => (BackendChoice::Wgpu, Some(wgpu::Backends::DX12)),
            "gl" => (BackendChoice::Wgpu, Some(wgpu::Backends::GL)),
            other => {
                return Err(PyValueError::new_err(format!(
                    "backend must be 'auto', 'gpu', 'cpu', 'vulkan', 'metal', 'dx12' or 'gl', got {other:?}"
                )))
            }
        };
        let adapter = match adapter {
            None => AdapterSelector::Best,
            Some(a) if a.is_none() => AdapterSelector::Best,
            Some(a) => {
                if let Ok(i) = a.extract::<usize>() {
                    AdapterSelector::Index(i)
                } else if let Ok(name) = a.extract::<String>() {
                    AdapterSelector::NameContains(name)
                } else {
                    return Err(PyTypeError::new_err(
                        "adapter must be None, an index into list_adapters() or part of a name",
                    ));
                }
            }
        };
        let config = ContextConfig {
            backend,
            adapter,
            wgpu_backends,
            budget_bytes: budget,
            fill_outputs_with_sentinel,
            kernel_timing,
            ..Default::default()
        };
        let inner = run(py, move |_| Context::new(&config))?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// `"wgpu"` or `"native_cpu"`.
    #[getter]
    fn path(&self) -> &'static str {
        path_name(self.inner.path())
    }

    /// The adapter's name, or the CPU's on the native path.
    #[getter]
    fn device_name(&self) -> String {
        self.inner.device_name()
    }

    /// Tracked device bytes: `{"current_bytes", "peak_bytes", "budget_bytes"}`.
    fn memory<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let m = self.inner.memory();
        let d = PyDict::new(py);
        d.set_item("current_bytes", m.current_bytes)?;
        d.set_item("peak_bytes", m.peak_bytes)?;
        d.set_item("budget_bytes", m.budget_bytes)?;
        Ok(d)
    }

    /// Host–device traffic since the context was made.
    fn transfers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        transfers_dict(py, &self.inner.transfers())
    }

    /// Starts a new peak-memory measurement from the current use.
    fn reset_peak(&self) {
        self.inner.reset_peak();
    }

    fn __repr__(&self) -> String {
        format!(
            "Context(path={:?}, device={:?}, budget_bytes={})",
            path_name(self.inner.path()),
            self.inner.device_name(),
            self.inner.memory().budget_bytes
        )
    }
}

fn path_name(p: wml::ComputePath) -> &'static str {
    match p {
        wml::ComputePath::Wgpu => "wgpu",
        wml::ComputePath::NativeCpu => "native_cpu",
    }
}

fn transfers_dict<'py>(py: Python<'py>, t: &wml::Transfers) -> PyResult<Bound<'py, PyDict>> {
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

/// The adapters wgpu finds, best first: a list of dicts.
#[pyfunction]
fn list_adapters(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let found = py.detach(|| wml::list_adapters(None));
    let list = PyList::empty(py);
    for a in found {
        let d = PyDict::new(py);
        d.set_item("index", a.index)?;
        d.set_item("name", &a.name)?;
        d.set_item("backend", format!("{:?}", a.backend).to_lowercase())?;
        d.set_item("device_type", format!("{:?}", a.device_type))?;
        d.set_item("driver", &a.driver)?;
        d.set_item("software", a.is_software())?;
        list.append(d)?;
    }
    Ok(list)
}

/// A ring of past embeddings and their labels on the context's device (PML's
/// CrossBatchMemory's storage).
#[pyclass(name = "MemoryBank", module = "wgpu_metric_learning._native")]
struct PyMemoryBank {
    ctx: Arc<Context>,
    bank: MemoryBank<i64>,
}

fn enqueued_tuple<'py>(py: Python<'py>, e: wml::Enqueued) -> PyResult<Bound<'py, PyTuple>> {
    let exclusion = self_exclusion_to_py(py, &e.self_exclusion)?;
    let rows: Vec<i64> = e.query_rows.iter().map(|&r| r as i64).collect();
    PyTuple::new(
        py,
        [
            e.slots.into_pyarray(py).into_any(),
            rows.into_pyarray(py).into_any(),
            exclusion,
        ],
    )
}

#[pymethods]
impl PyMemoryBank {
    #[new]
    #[pyo3(signature = (ctx, capacity, dim))]
    fn new(py: Python<'_>, ctx: &PyContext, capacity: usize, dim: usize) -> PyResult<Self> {
        let c = Arc::clone(&ctx.inner);
        let bank = run(py, move |_| {
            MemoryBank::new(&c, &BankConfig::new(capacity, dim))
        })?;
        Ok(Self {
            ctx: Arc::clone(&ctx.inner),
            bank,
        })
    }

    /// Restores a bank written by `save`, on `ctx`.
    #[staticmethod]
    #[pyo3(signature = (ctx, path, capacity, dim))]
    fn load(
        py: Python<'_>,
        ctx: &PyContext,
        path: std::path::PathBuf,
        capacity: usize,
        dim: usize,
    ) -> PyResult<Self> {
        let c = Arc::clone(&ctx.inner);
        let bank = run(py, move |_| {
            MemoryBank::load(&c, &path, &BankConfig::new(capacity, dim))
        })?;
        Ok(Self {
            ctx: Arc::clone(&ctx.inner),
            bank,
        })
    }

    /// Writes the bank atomically to `path`; returns the bytes written.
    fn save(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<u64> {
        let (ctx, bank) = (&self.ctx, &self.bank);
        run_whole(py, move || bank.save(ctx, &path)).map(|s| s.bytes)
    }

    /// Enqueues a batch `(b, d)`, `(b,)`; returns `(slots, query_rows, self_exclusion)`.
    #[pyo3(signature = (embeddings, labels, mask = None))]
    fn enqueue<'py>(
        &mut self,
        py: Python<'py>,
        embeddings: PyReadonlyArray2<'py, f32>,
        labels: PyReadonlyArray1<'py, i64>,
        mask: Option<PyReadonlyArray1<'py, u8>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let (e, l) = (embeddings.as_array(), labels.as_array());
        // Bytes, not `bool`: a NumPy bool array may hold other values than 0 and 1.
        let m: Option<Array1<bool>> = mask.as_ref().map(|m| m.as_array().mapv(|v| v != 0));
        let (ctx, bank) = (&self.ctx, &mut self.bank);
        let done = run_whole(py, move || {
            let set = MiningSet::new(e, l);
            match &m {
                None => bank.enqueue(ctx, &set),
                Some(m) => bank.enqueue_masked(ctx, &set, m.view()),
            }
        })?;
        enqueued_tuple(py, done)
    }

    /// The bank's rows and labels in slot order: `((len, d) float32, (len,) int64)`.
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let (ctx, bank) = (&self.ctx, &self.bank);
        let snap = run(py, move |_| bank.snapshot(ctx))?;
        PyTuple::new(
            py,
            [
                snap.embeddings.into_pyarray(py).into_any(),
                snap.labels.into_pyarray(py).into_any(),
            ],
        )
    }

    /// Empties the bank (its storage stays allocated).
    fn reset(&mut self) {
        self.bank.reset();
    }

    #[getter]
    fn capacity(&self) -> usize {
        self.bank.capacity()
    }

    #[getter]
    fn dim(&self) -> usize {
        self.bank.dim()
    }

    #[getter]
    fn head(&self) -> usize {
        self.bank.head()
    }

    #[getter]
    fn is_filled(&self) -> bool {
        self.bank.is_filled()
    }

    fn __len__(&self) -> usize {
        self.bank.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "MemoryBank(capacity={}, dim={}, len={})",
            self.bank.capacity(),
            self.bank.dim(),
            self.bank.len()
        )
    }
}

/// References of a labelled operation, borrowed for the call.
enum Refs<'py> {
    Queries,
    Bank(PyRef<'py, PyMemoryBank>),
    Arrays(
        Option<PyReadonlyArray2<'py, f32>>,
        PyReadonlyArray1<'py, i64>,
    ),
}

impl<'py> Refs<'py> {
    /// `None`, a `MemoryBank` of `ctx`, or `(embeddings or None, labels)`.
    fn extract(ctx: &PyContext, refs: Option<&Bound<'py, PyAny>>) -> PyResult<Self> {
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

    fn set(&self) -> Option<MiningSet<'_, i64>> {
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

fn check_same_context(ctx: &PyContext, bank_ctx: &Arc<Context>) -> PyResult<()> {
    if Arc::ptr_eq(&ctx.inner, bank_ctx) {
        Ok(())
    } else {
        Err(PyValueError::new_err(
            "the MemoryBank was made on another Context; use the context it lives on",
        ))
    }
}

/// References of an unlabelled operation: `None`, an array, or a `MemoryBank`.
enum Rows<'py> {
    Queries,
    Bank(PyRef<'py, PyMemoryBank>),
    Array(PyReadonlyArray2<'py, f32>),
}

impl<'py> Rows<'py> {
    fn extract(ctx: &PyContext, refs: Option<&Bound<'py, PyAny>>) -> PyResult<Self> {
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

    fn embeddings<'a>(&'a self, queries: Embeddings<'a>) -> Embeddings<'a> {
        match self {
            Self::Queries => queries,
            Self::Bank(b) => b.bank.rows(),
            Self::Array(a) => Embeddings::Host(a.as_array()),
        }
    }
}

/// Runs a labelled operation of the library (a miner, `accuracy`): the queries' embeddings
/// (or none) and labels against `refs` (see [`Refs::extract`]), with the GIL released.
fn labelled<'py, T: Send>(
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

/// Distances `(q, n)` between queries `(q, d)` and references.
#[pyfunction]
#[pyo3(signature = (ctx, queries, refs = None, *, distance = "euclidean", normalize = true))]
fn pairwise_distances<'py>(
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
fn knn<'py>(
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

fn triplet_rule(type_of_triplets: Option<&str>, margin: f32) -> PyResult<TripletRule> {
    let kind = match type_of_triplets {
        None => return Ok(TripletRule::AllValid),
        Some("all") => TripletType::All,
        Some("hard") => TripletType::Hard,
        Some("semihard") => TripletType::Semihard,
        Some("easy") => TripletType::Easy,
        Some(other) => {
            return Err(PyValueError::new_err(format!(
                "type_of_triplets must be None, 'all', 'hard', 'semihard' or 'easy', got {other:?}"
            )))
        }
    };
    Ok(TripletRule::Margin { kind, margin })
}

fn triplet_config(
    type_of_triplets: Option<&str>,
    margin: f32,
    distance: &str,
    normalize: bool,
    self_exclusion: Option<&Bound<'_, PyAny>>,
) -> PyResult<TripletConfig> {
    Ok(TripletConfig {
        rule: triplet_rule(type_of_triplets, margin)?,
        distance: distance_config(distance, normalize)?,
        self_exclusion: self::self_exclusion(self_exclusion)?,
        ..Default::default()
    })
}

/// Triplets `(t, 3)` uint32 rows `(a, p, n)` in PML's order.
#[pyfunction]
#[pyo3(signature = (ctx, embeddings, labels, refs = None, *, type_of_triplets = None, margin = 0.2, distance = "euclidean", normalize = true, self_exclusion = None))]
#[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
fn mine_triplets<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    embeddings: Option<PyReadonlyArray2<'py, f32>>,
    labels: PyReadonlyArray1<'py, i64>,
    refs: Option<&Bound<'py, PyAny>>,
    type_of_triplets: Option<&str>,
    margin: f32,
    distance: &str,
    normalize: bool,
    self_exclusion: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArray2<u32>>> {
    let cfg = triplet_config(
        type_of_triplets,
        margin,
        distance,
        normalize,
        self_exclusion,
    )?;
    let t = labelled(
        py,
        ctx,
        embeddings.as_ref(),
        &labels,
        refs,
        move |c, q, r, hooks| wml::mine_triplets(c, q, r, &TripletConfig { hooks, ..cfg }),
    )?;
    Ok(t.indices.into_pyarray(py))
}

/// The number of triplets `mine_triplets` would return, without writing them.
#[pyfunction]
#[pyo3(signature = (ctx, embeddings, labels, refs = None, *, type_of_triplets = None, margin = 0.2, distance = "euclidean", normalize = true, self_exclusion = None))]
#[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
fn count_triplets<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    embeddings: Option<PyReadonlyArray2<'py, f32>>,
    labels: PyReadonlyArray1<'py, i64>,
    refs: Option<&Bound<'py, PyAny>>,
    type_of_triplets: Option<&str>,
    margin: f32,
    distance: &str,
    normalize: bool,
    self_exclusion: Option<&Bound<'py, PyAny>>,
) -> PyResult<u64> {
    let cfg = triplet_config(
        type_of_triplets,
        margin,
        distance,
        normalize,
        self_exclusion,
    )?;
    let n = labelled(
        py,
        ctx,
        embeddings.as_ref(),
        &labels,
        refs,
        move |c, q, r, hooks| wml::count_triplets(c, q, r, &TripletConfig { hooks, ..cfg }),
    )?;
    Ok(n.count)
}

/// What the streaming thread sends: a chunk, or the end (the count, or the error).
enum Streamed {
    Chunk(Array2<u32>),
    End(wml::Result<u64>),
}

/// Triplets in bounded chunks, mined on a background thread one chunk ahead of the reader.
#[pyclass(name = "TripletChunks", module = "wgpu_metric_learning._native")]
struct TripletChunks {
    rx: Mutex<Option<mpsc::Receiver<Streamed>>>,
    token: CancelToken,
    count: Mutex<Option<u64>>,
    /// Set by `close`: the cancellation it causes ends the iteration instead of raising.
    closed: AtomicBool,
}

#[pymethods]
impl TripletChunks {
    #[new]
    #[pyo3(signature = (ctx, embeddings, labels, refs = None, *, type_of_triplets = None, margin = 0.2, distance = "euclidean", normalize = true, self_exclusion = None, max_chunk_triplets = 1 << 20))]
    #[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
    fn new<'py>(
        ctx: &PyContext,
        embeddings: Option<PyReadonlyArray2<'py, f32>>,
        labels: PyReadonlyArray1<'py, i64>,
        refs: Option<(
            Option<PyReadonlyArray2<'py, f32>>,
            PyReadonlyArray1<'py, i64>,
        )>,
        type_of_triplets: Option<&str>,
        margin: f32,
        distance: &str,
        normalize: bool,
        self_exclusion: Option<&Bound<'py, PyAny>>,
        max_chunk_triplets: usize,
    ) -> PyResult<Self> {
        let cfg = TripletConfig {
            max_chunk_triplets,
            ..triplet_config(
                type_of_triplets,
                margin,
                distance,
                normalize,
                self_exclusion,
            )?
        };
        // The thread outlives this call, so it owns copies of the inputs (`O(b·d + m·d)`,
        // bounded, unlike the triplets).
        let emb: Option<Array2<f32>> = embeddings.map(|e| e.as_array().to_owned());
        let lab: Array1<i64> = labels.as_array().to_owned();
        let refs: Option<(Option<Array2<f32>>, Array1<i64>)> =
            refs.map(|(e, l)| (e.map(|e| e.as_array().to_owned()), l.as_array().to_owned()));
        let token = CancelToken::new();
        let hooks = Hooks::new().cancel_with(&token);
        let c = Arc::clone(&ctx.inner);
        let (tx, rx) = mpsc::sync_channel::<Streamed>(1);
        let spawned = std::thread::Builder::new()
            .name("wml-triplets".into())
            .spawn(move || {
                let q = MiningSet {
                    embeddings: emb.as_ref().map(Embeddings::from),
                    labels: lab.view(),
                };
                let r = refs.as_ref().map(|(e, l)| MiningSet {
                    embeddings: e.as_ref().map(Embeddings::from),
                    labels: l.view(),
                });
                let cfg = TripletConfig { hooks, ..cfg };
                let sent = tx.clone();
                let result = catch_unwind(AssertUnwindSafe(|| {
                    wml::mine_triplets_streaming(&c, &q, r.as_ref(), &cfg, |chunk| {
                        // A reader that went away ends the mining at this chunk.
                        match sent.send(Streamed::Chunk(chunk.to_owned())) {
                            Ok(()) => ControlFlow::Continue(()),
                            Err(_) => ControlFlow::Break(()),
                        }
                    })
                }));
                let end = match result {
                    Ok(r) => r.map(|n| n.count),
                    Err(panic) => Err(Error::Internal {
                        op: "mine_triplets_streaming",
                        message: panic_message(&panic),
                    }),
                };
                let _ = tx.send(Streamed::End(end));
            });
        if let Err(e) = spawned {
            return Err(PyRuntimeError::new_err(format!(
                "cannot start the mining thread: {e}"
            )));
        }
        Ok(Self {
            rx: Mutex::new(Some(rx)),
            token,
            count: Mutex::new(None),
            closed: AtomicBool::new(false),
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<u32>>> {
        // `try_lock`: a second thread waiting here with the GIL held would deadlock the first,
        // which needs the GIL to look for Ctrl-C.
        let mut guard = match self.rx.try_lock() {
            Ok(guard) => guard,
            // A reader that panicked left the receiver as it was: still usable.
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                return Err(PyRuntimeError::new_err(
                    "the triplet stream is being read by another thread",
                ))
            }
        };
        // Closed from another thread while a reader held the receiver: end here, without
        // handing out the chunks mined meanwhile.
        if self.closed.load(Ordering::Acquire) {
            *guard = None;
            return Err(PyStopIteration::new_err(()));
        }
        // The receiver is moved out for the wait (it is `Send`, not `Sync`) and put back after.
        let Some(rx) = guard.take() else {
            return Err(PyStopIteration::new_err(()));
        };
        let token = &self.token;
        let (rx, received): (_, PyResult<Option<Streamed>>) = py.detach(move || loop {
            match rx.recv_timeout(SIGNAL_POLL) {
                Ok(s) => return (rx, Ok(Some(s))),
                Err(mpsc::RecvTimeoutError::Disconnected) => return (rx, Ok(None)),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Err(e) = Python::attach(|py| py.check_signals()) {
                        token.cancel();
                        return (rx, Err(e));
                    }
                }
            }
        });
        *guard = Some(rx);
        match received {
            Ok(Some(Streamed::Chunk(chunk))) => Ok(chunk.into_pyarray(py)),
            Ok(Some(Streamed::End(end))) => {
                *guard = None;
                if self.closed.load(Ordering::Acquire) {
                    return Err(PyStopIteration::new_err(()));
                }
                let n = end.map_err(py_err)?;
                if let Ok(mut count) = self.count.lock() {
                    *count = Some(n);
                }
                Err(PyStopIteration::new_err(()))
            }
            Ok(None) => {
                *guard = None;
                Err(PyRuntimeError::new_err(
                    "the mining thread ended without a result",
                ))
            }
            Err(e) => {
                *guard = None;
                Err(e)
            }
        }
    }

    /// The total number of triplets, once the iterator is exhausted (`None` before).
    #[getter]
    fn count(&self) -> Option<u64> {
        self.count.lock().ok().and_then(|c| *c)
    }

    /// Stops the mining thread; the iterator then ends.
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.token.cancel();
        // A reader in `__next__` holds the receiver; it then sees the cancelled end.
        if let Ok(mut rx) = self.rx.try_lock() {
            *rx = None;
        }
    }
}

impl Drop for TripletChunks {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

fn pairs_tuple<'py>(py: Python<'py>, p: wml::Pairs) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(
        py,
        [
            p.positives.into_pyarray(py).into_any(),
            p.negatives.into_pyarray(py).into_any(),
        ],
    )
}

/// Every positive and negative pair: `(positives (p, 2), negatives (n, 2))`.
#[pyfunction]
#[pyo3(signature = (ctx, labels, refs = None, *, self_exclusion = None))]
fn all_pairs<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    labels: PyReadonlyArray1<'py, i64>,
    refs: Option<&Bound<'py, PyAny>>,
    self_exclusion: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let exclusion = self::self_exclusion(self_exclusion)?;
    let p = labelled(py, ctx, None, &labels, refs, move |c, q, r, hooks| {
        let cfg = AllPairsConfig {
            self_exclusion: exclusion,
            hooks,
        };
        wml::all_pairs(c, q, r, &cfg)
    })?;
    pairs_tuple(py, p)
}

/// PML's `PairMarginMiner`: `(positives (p, 2), negatives (n, 2))`.
#[pyfunction]
#[pyo3(signature = (ctx, embeddings, labels, refs = None, *, pos_margin = 0.2, neg_margin = 0.8, distance = "euclidean", normalize = true, self_exclusion = None))]
#[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
fn pair_margin_pairs<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    embeddings: PyReadonlyArray2<'py, f32>,
    labels: PyReadonlyArray1<'py, i64>,
    refs: Option<&Bound<'py, PyAny>>,
    pos_margin: f32,
    neg_margin: f32,
    distance: &str,
    normalize: bool,
    self_exclusion: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let distance = distance_config(distance, normalize)?;
    let exclusion = self::self_exclusion(self_exclusion)?;
    let p = labelled(
        py,
        ctx,
        Some(&embeddings),
        &labels,
        refs,
        move |c, q, r, hooks| {
            let cfg = PairMarginConfig {
                pos_margin,
                neg_margin,
                distance,
                self_exclusion: exclusion,
                hooks,
            };
            wml::pair_margin_pairs(c, q, r, &cfg)
        },
    )?;
    pairs_tuple(py, p)
}

/// PML's `MultiSimilarityMiner`: `(positives (p, 2), negatives (n, 2))`.
#[pyfunction]
#[pyo3(signature = (ctx, embeddings, labels, refs = None, *, epsilon = 0.1, distance = "cosine", normalize = true, self_exclusion = None))]
#[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
fn multi_similarity_pairs<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    embeddings: PyReadonlyArray2<'py, f32>,
    labels: PyReadonlyArray1<'py, i64>,
    refs: Option<&Bound<'py, PyAny>>,
    epsilon: f32,
    distance: &str,
    normalize: bool,
    self_exclusion: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let distance = distance_config(distance, normalize)?;
    let exclusion = self::self_exclusion(self_exclusion)?;
    let p = labelled(
        py,
        ctx,
        Some(&embeddings),
        &labels,
        refs,
        move |c, q, r, hooks| {
            let cfg = MultiSimilarityConfig {
                epsilon,
                distance,
                self_exclusion: exclusion,
                hooks,
            };
            wml::multi_similarity_pairs(c, q, r, &cfg)
        },
    )?;
    pairs_tuple(py, p)
}

fn strategy(name: &str, what: &str) -> PyResult<Strategy> {
    match name {
        "hard" => Ok(Strategy::Hard),
        "semihard" => Ok(Strategy::Semihard),
        "easy" => Ok(Strategy::Easy),
        "all" => Ok(Strategy::All),
        other => Err(PyValueError::new_err(format!(
            "{what} must be 'hard', 'semihard', 'easy' or 'all', got {other:?}"
        ))),
    }
}

/// PML's `BatchEasyHardMiner`: `(positives (p, 2), negatives (n, 2))`.
#[pyfunction]
#[pyo3(signature = (ctx, embeddings, labels, refs = None, *, pos_strategy = "easy", neg_strategy = "semihard", allowed_pos_range = None, allowed_neg_range = None, distance = "euclidean", normalize = true, self_exclusion = None))]
#[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
fn batch_easy_hard_pairs<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    embeddings: PyReadonlyArray2<'py, f32>,
    labels: PyReadonlyArray1<'py, i64>,
    refs: Option<&Bound<'py, PyAny>>,
    pos_strategy: &str,
    neg_strategy: &str,
    allowed_pos_range: Option<(f32, f32)>,
    allowed_neg_range: Option<(f32, f32)>,
    distance: &str,
    normalize: bool,
    self_exclusion: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let distance = distance_config(distance, normalize)?;
    let exclusion = self::self_exclusion(self_exclusion)?;
    let (pos_strategy, neg_strategy) = (
        strategy(pos_strategy, "pos_strategy")?,
        strategy(neg_strategy, "neg_strategy")?,
    );
    let p = labelled(
        py,
        ctx,
        Some(&embeddings),
        &labels,
        refs,
        move |c, q, r, hooks| {
            let cfg = BatchEasyHardConfig {
                pos_strategy,
                neg_strategy,
                allowed_pos_range,
                allowed_neg_range,
                distance,
                self_exclusion: exclusion,
                hooks,
            };
            wml::batch_easy_hard_pairs(c, q, r, &cfg)
        },
    )?;
    pairs_tuple(py, p)
}

/// PML's `BatchHardMiner`: triplets `(t, 3)`, one per anchor that has both sides.
#[pyfunction]
#[pyo3(signature = (ctx, embeddings, labels, refs = None, *, distance = "euclidean", normalize = true, self_exclusion = None))]
#[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
fn batch_hard_triplets<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    embeddings: PyReadonlyArray2<'py, f32>,
    labels: PyReadonlyArray1<'py, i64>,
    refs: Option<&Bound<'py, PyAny>>,
    distance: &str,
    normalize: bool,
    self_exclusion: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArray2<u32>>> {
    let distance = distance_config(distance, normalize)?;
    let exclusion = self::self_exclusion(self_exclusion)?;
    let t = labelled(
        py,
        ctx,
        Some(&embeddings),
        &labels,
        refs,
        move |c, q, r, hooks| {
            let cfg = BatchHardConfig {
                distance,
                self_exclusion: exclusion,
                hooks,
            };
            wml::batch_hard_triplets(c, q, r, &cfg)
        },
    )?;
    Ok(t.indices.into_pyarray(py))
}

/// PML's `AngularMiner`: triplets `(t, 3)` whose angle exceeds `angle` degrees.
#[pyfunction]
#[pyo3(signature = (ctx, embeddings, labels, refs = None, *, angle = 20.0, self_exclusion = None))]
fn angular_triplets<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    embeddings: PyReadonlyArray2<'py, f32>,
    labels: PyReadonlyArray1<'py, i64>,
    refs: Option<&Bound<'py, PyAny>>,
    angle: f64,
    self_exclusion: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArray2<u32>>> {
    let exclusion = self::self_exclusion(self_exclusion)?;
    let t = labelled(
        py,
        ctx,
        Some(&embeddings),
        &labels,
        refs,
        move |c, q, r, hooks| {
            let cfg = wml::AngularConfig {
                angle,
                self_exclusion: exclusion,
                hooks,
            };
            wml::angular_triplets(c, q, r, &cfg)
        },
    )?;
    Ok(t.indices.into_pyarray(py))
}

/// PML's `DistanceWeightedMiner`: triplets `(t, 3)` drawn with seed `seed`.
#[pyfunction]
#[pyo3(signature = (ctx, embeddings, labels, refs = None, *, cutoff = 0.5, nonzero_loss_cutoff = 1.4, seed = 0, self_exclusion = None))]
#[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
fn distance_weighted_triplets<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    embeddings: PyReadonlyArray2<'py, f32>,
    labels: PyReadonlyArray1<'py, i64>,
    refs: Option<&Bound<'py, PyAny>>,
    cutoff: f32,
    nonzero_loss_cutoff: f32,
    seed: u64,
    self_exclusion: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArray2<u32>>> {
    let exclusion = self::self_exclusion(self_exclusion)?;
    let t = labelled(
        py,
        ctx,
        Some(&embeddings),
        &labels,
        refs,
        move |c, q, r, hooks| {
            let cfg = wml::DistanceWeightedConfig {
                cutoff,
                nonzero_loss_cutoff,
                seed,
                self_exclusion: exclusion,
                hooks,
            };
            wml::distance_weighted_triplets(c, q, r, &cfg)
        },
    )?;
    Ok(t.indices.into_pyarray(py))
}

/// PML's `HDCMiner`: `(positives (p, 2), negatives (n, 2))`, hardest first.
#[pyfunction]
#[pyo3(signature = (ctx, embeddings, labels, refs = None, *, filter_percentage = 0.5, distance = "euclidean", normalize = true, self_exclusion = None))]
#[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
fn hdc_pairs<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    embeddings: PyReadonlyArray2<'py, f32>,
    labels: PyReadonlyArray1<'py, i64>,
    refs: Option<&Bound<'py, PyAny>>,
    filter_percentage: f64,
    distance: &str,
    normalize: bool,
    self_exclusion: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let distance = distance_config(distance, normalize)?;
    let exclusion = self::self_exclusion(self_exclusion)?;
    let p = labelled(
        py,
        ctx,
        Some(&embeddings),
        &labels,
        refs,
        move |c, q, r, hooks| {
            let cfg = wml::HdcConfig {
                filter_percentage,
                distance,
                self_exclusion: exclusion,
                hooks,
            };
            wml::hdc_pairs(c, q, r, &cfg)
        },
    )?;
    pairs_tuple(py, p)
}

/// PML's `UniformHistogramMiner`: `(positives (p, 2), negatives (n, 2))`, bin by bin.
#[pyfunction]
#[pyo3(signature = (ctx, embeddings, labels, refs = None, *, num_bins = 100, pos_per_bin = 10, neg_per_bin = 10, distance = "euclidean", normalize = true, seed = 0, self_exclusion = None))]
#[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
fn uniform_histogram_pairs<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    embeddings: PyReadonlyArray2<'py, f32>,
    labels: PyReadonlyArray1<'py, i64>,
    refs: Option<&Bound<'py, PyAny>>,
    num_bins: usize,
    pos_per_bin: usize,
    neg_per_bin: usize,
    distance: &str,
    normalize: bool,
    seed: u64,
    self_exclusion: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let distance = distance_config(distance, normalize)?;
    let exclusion = self::self_exclusion(self_exclusion)?;
    let p = labelled(
        py,
        ctx,
        Some(&embeddings),
        &labels,
        refs,
        move |c, q, r, hooks| {
            let cfg = wml::UniformHistogramConfig {
                num_bins,
                pos_per_bin,
                neg_per_bin,
                distance,
                seed,
                self_exclusion: exclusion,
                hooks,
            };
            wml::uniform_histogram_pairs(c, q, r, &cfg)
        },
    )?;
    pairs_tuple(py, p)
}

/// The included kNN metrics under PML's keys.
fn metrics_dict<'py>(
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
fn include_arg(include: Option<Vec<String>>) -> PyResult<Vec<wml::AccuracyMetric>> {
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
fn accuracy<'py>(
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
fn kmeans<'py>(
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
fn normalized_mutual_info(
    labels_true: PyReadonlyArray1<'_, i64>,
    labels_pred: PyReadonlyArray1<'_, i64>,
) -> PyResult<f64> {
    wml::normalized_mutual_info(labels_true.as_array(), labels_pred.as_array()).map_err(py_err)
}

/// scikit-learn's `adjusted_mutual_info_score` (arithmetic mean) of two int64 labelings.
#[pyfunction]
fn adjusted_mutual_info(
    py: Python<'_>,
    labels_true: PyReadonlyArray1<'_, i64>,
    labels_pred: PyReadonlyArray1<'_, i64>,
) -> PyResult<f64> {
    let (a, b) = (labels_true.as_array(), labels_pred.as_array());
    // The expected mutual information can take a while: other Python threads run meanwhile.
    py.detach(|| wml::adjusted_mutual_info(a, b))
        .map_err(py_err)
}

/// A loss's value, its two counts and its gradients, as one tuple.
fn loss_tuple<'py>(
    py: Python<'py>,
    loss: f32,
    counts: (u64, u64),
    query_grad: Array2<f32>,
    ref_grad: Option<Array2<f32>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let ref_grad = match ref_grad {
        Some(g) => g.into_pyarray(py).into_any(),
        None => py.None().into_bound(py),
    };
    PyTuple::new(
        py,
        [
            loss.into_pyobject(py)?.into_any(),
            counts.0.into_pyobject(py)?.into_any(),
            counts.1.into_pyobject(py)?.into_any(),
            query_grad.into_pyarray(py).into_any(),
            ref_grad,
        ],
    )
}

/// PML's `TripletMarginLoss` and its gradient: `(loss, nonzero, triplets, grad (b, d),
/// ref_grad (m, d) or None)`.
#[pyfunction]
#[pyo3(signature = (ctx, embeddings, labels, refs = None, *, margin = 0.05, type_of_triplets = None, miner_margin = 0.2, distance = "euclidean", normalize = true, smooth_loss = false, swap = false, self_exclusion = None, ref_grad = false))]
#[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
fn triplet_margin_loss<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    embeddings: PyReadonlyArray2<'py, f32>,
    labels: PyReadonlyArray1<'py, i64>,
    refs: Option<&Bound<'py, PyAny>>,
    margin: f32,
    type_of_triplets: Option<&str>,
    miner_margin: f32,
    distance: &str,
    normalize: bool,
    smooth_loss: bool,
    swap: bool,
    self_exclusion: Option<&Bound<'py, PyAny>>,
    ref_grad: bool,
) -> PyResult<Bound<'py, PyTuple>> {
    let cfg = TripletLossConfig {
        margin,
        triplets: triplet_rule(type_of_triplets, miner_margin)?,
        distance: distance_config(distance, normalize)?,
        smooth_loss,
        swap,
        self_exclusion: self::self_exclusion(self_exclusion)?,
        ref_grad,
        ..Default::default()
    };
    let out = labelled(
        py,
        ctx,
        Some(&embeddings),
        &labels,
        refs,
        move |c, q, r, hooks| {
            wml::triplet_margin_loss(c, q, r, &TripletLossConfig { hooks, ..cfg })
        },
    )?;
    loss_tuple(
        py,
        out.loss,
        (out.nonzero, out.triplets),
        out.query_grad,
        out.ref_grad,
    )
}

/// PML's `NTXentLoss` and its gradient: `(loss, positive_pairs, negative_pairs, grad (b, d),
/// ref_grad (m, d) or None)`.
#[pyfunction]
#[pyo3(signature = (ctx, embeddings, labels, refs = None, *, temperature = 0.07, distance = "cosine", normalize = true, self_exclusion = None, ref_grad = false))]
#[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
fn ntxent_loss<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    embeddings: PyReadonlyArray2<'py, f32>,
    labels: PyReadonlyArray1<'py, i64>,
    refs: Option<&Bound<'py, PyAny>>,
    temperature: f32,
    distance: &str,
    normalize: bool,
    self_exclusion: Option<&Bound<'py, PyAny>>,
    ref_grad: bool,
) -> PyResult<Bound<'py, PyTuple>> {
    let cfg = InfoNceConfig {
        temperature,
        distance: distance_config(distance, normalize)?,
        self_exclusion: self::self_exclusion(self_exclusion)?,
        ref_grad,
        ..Default::default()
    };
    let out = labelled(
        py,
        ctx,
        Some(&embeddings),
        &labels,
        refs,
        move |c, q, r, hooks| wml::ntxent_loss(c, q, r, &InfoNceConfig { hooks, ..cfg }),
    )?;
    let counts = (out.positive_pairs, out.negative_pairs);
    loss_tuple(py, out.loss, counts, out.query_grad, out.ref_grad)
}

/// sentence-transformers' `MultipleNegativesRankingLoss` and its gradients: `(loss,
/// positive_pairs, negative_pairs, anchor_grad (b, d), candidate_grad (c, d))`.
#[pyfunction]
#[pyo3(signature = (ctx, anchors, candidates, *, scale = 20.0))]
fn multiple_negatives_ranking_loss<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    anchors: PyReadonlyArray2<'py, f32>,
    candidates: PyReadonlyArray2<'py, f32>,
    scale: f32,
) -> PyResult<Bound<'py, PyTuple>> {
    let (a, c) = (anchors.as_array(), candidates.as_array());
    let inner = &ctx.inner;
    let out = run(py, move |hooks| {
        wml::multiple_negatives_ranking_loss(inner, a, c, &MnrlConfig { scale, hooks })
    })?;
    let counts = (out.positive_pairs, out.negative_pairs);
    loss_tuple(py, out.loss, counts, out.query_grad, out.ref_grad)
}

/// The extension module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyContext>()?;
    m.add_class::<PyMemoryBank>()?;
    m.add_class::<TripletChunks>()?;
    m.add_function(wrap_pyfunction!(list_adapters, m)?)?;
    m.add_function(wrap_pyfunction!(pairwise_distances, m)?)?;
    m.add_function(wrap_pyfunction!(knn, m)?)?;
    m.add_function(wrap_pyfunction!(mine_triplets, m)?)?;
    m.add_function(wrap_pyfunction!(count_triplets, m)?)?;
    m.add_function(wrap_pyfunction!(all_pairs, m)?)?;
    m.add_function(wrap_pyfunction!(pair_margin_pairs, m)?)?;
    m.add_function(wrap_pyfunction!(multi_similarity_pairs, m)?)?;
    m.add_function(wrap_pyfunction!(batch_easy_hard_pairs, m)?)?;
    m.add_function(wrap_pyfunction!(batch_hard_triplets, m)?)?;
    m.add_function(wrap_pyfunction!(angular_triplets, m)?)?;
    m.add_function(wrap_pyfunction!(distance_weighted_triplets, m)?)?;
    m.add_function(wrap_pyfunction!(hdc_pairs, m)?)?;
    m.add_function(wrap_pyfunction!(uniform_histogram_pairs, m)?)?;
    m.add_function(wrap_pyfunction!(accuracy, m)?)?;
    m.add_function(wrap_pyfunction!(kmeans, m)?)?;
    m.add_function(wrap_pyfunction!(normalized_mutual_info, m)?)?;
    m.add_function(wrap_pyfunction!(adjusted_mutual_info, m)?)?;
    m.add_function(wrap_pyfunction!(triplet_margin_loss, m)?)?;
    m.add_function(wrap_pyfunction!(ntxent_loss, m)?)?;
    m.add_function(wrap_pyfunction!(multiple_negatives_ranking_loss, m)?)?;
    Ok(())
}
