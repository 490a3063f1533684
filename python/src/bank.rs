//! `MemoryBank`: PML CrossBatchMemory's ring of past embeddings on the device.

use std::sync::Arc;

use ndarray::Array1;
use numpy::{IntoPyArray, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use wgpu_metric_learning as wml;
use wml::{BankConfig, Context, MemoryBank, MiningSet};

use crate::call::{run, run_whole, self_exclusion_to_py};
use crate::context::PyContext;

/// A ring of past embeddings and their labels on the context's device (PML's
/// CrossBatchMemory's storage).
#[pyclass(name = "MemoryBank", module = "wgpu_metric_learning._native")]
pub(crate) struct PyMemoryBank {
    pub(crate) ctx: Arc<Context>,
    pub(crate) bank: MemoryBank<i64>,
}

pub(crate) fn enqueued_tuple<'py>(
    py: Python<'py>,
    e: wml::Enqueued,
) -> PyResult<Bound<'py, PyTuple>> {
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
    pub(crate) fn new(
        py: Python<'_>,
        ctx: &PyContext,
        capacity: usize,
        dim: usize,
    ) -> PyResult<Self> {
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
    pub(crate) fn load(
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
    pub(crate) fn save(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<u64> {
        let (ctx, bank) = (&self.ctx, &self.bank);
        run_whole(py, move || bank.save(ctx, &path)).map(|s| s.bytes)
    }

    /// Enqueues a batch `(b, d)`, `(b,)`; returns `(slots, query_rows, self_exclusion)`.
    #[pyo3(signature = (embeddings, labels, mask = None))]
    pub(crate) fn enqueue<'py>(
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
    pub(crate) fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
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
    pub(crate) fn reset(&mut self) {
        self.bank.reset();
    }

    #[getter]
    pub(crate) fn capacity(&self) -> usize {
        self.bank.capacity()
    }

    #[getter]
    pub(crate) fn dim(&self) -> usize {
        self.bank.dim()
    }

    #[getter]
    pub(crate) fn head(&self) -> usize {
        self.bank.head()
    }

    #[getter]
    pub(crate) fn is_filled(&self) -> bool {
        self.bank.is_filled()
    }

    pub(crate) fn __len__(&self) -> usize {
        self.bank.len()
    }

    pub(crate) fn __repr__(&self) -> String {
        format!(
            "MemoryBank(capacity={}, dim={}, len={})",
            self.bank.capacity(),
            self.bank.dim(),
            self.bank.len()
        )
    }
}
