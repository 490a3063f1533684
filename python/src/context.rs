//! `Context` (one device or the native CPU path, and its budget) and `list_adapters`.

use std::sync::Arc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use wgpu_metric_learning as wml;
use wml::{AdapterSelector, BackendChoice, Context, ContextConfig};

use crate::call::{path_name, run, transfers_dict};

/// A library context: one device (or the native CPU path) and its memory budget.
#[pyclass(frozen, name = "Context", module = "wgpu_metric_learning._native")]
pub(crate) struct PyContext {
    pub(crate) inner: Arc<Context>,
}

#[pymethods]
impl PyContext {
    #[new]
    #[pyo3(signature = (backend = "auto", budget = None, adapter = None, fill_outputs_with_sentinel = false, kernel_timing = false))]
    pub(crate) fn new(
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
    pub(crate) fn path(&self) -> &'static str {
        path_name(self.inner.path())
    }

    /// The adapter's name, or the CPU's on the native path.
    #[getter]
    pub(crate) fn device_name(&self) -> String {
        self.inner.device_name()
    }

    /// Tracked device bytes: `{"current_bytes", "peak_bytes", "budget_bytes"}`.
    pub(crate) fn memory<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let m = self.inner.memory();
        let d = PyDict::new(py);
        d.set_item("current_bytes", m.current_bytes)?;
        d.set_item("peak_bytes", m.peak_bytes)?;
        d.set_item("budget_bytes", m.budget_bytes)?;
        Ok(d)
    }

    /// Host–device traffic since the context was made.
    pub(crate) fn transfers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        transfers_dict(py, &self.inner.transfers())
    }

    /// Starts a new peak-memory measurement from the current use.
    pub(crate) fn reset_peak(&self) {
        self.inner.reset_peak();
    }

    pub(crate) fn __repr__(&self) -> String {
        format!(
            "Context(path={:?}, device={:?}, budget_bytes={})",
            path_name(self.inner.path()),
            self.inner.device_name(),
            self.inner.memory().budget_bytes
        )
    }
}

/// The adapters wgpu finds, best first: a list of dicts.
#[pyfunction]
pub(crate) fn list_adapters(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
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
