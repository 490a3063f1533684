//! The miners: triplets (whole, counted or streamed in chunks) and every pair and batch
//! miner.

use std::ops::ControlFlow;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, TryLockError};

use ndarray::{Array1, Array2};
use numpy::{IntoPyArray, PyArray2, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::exceptions::{PyRuntimeError, PyStopIteration, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use wgpu_metric_learning as wml;
use wml::{
    AllPairsConfig, BatchEasyHardConfig, BatchHardConfig, CancelToken, Embeddings, Error, Hooks,
    MiningSet, MultiSimilarityConfig, PairMarginConfig, Strategy, TripletConfig, TripletRule,
    TripletType,
};

use crate::call::{distance_config, labelled, panic_message, py_err, self_exclusion, SIGNAL_POLL};
use crate::context::PyContext;

pub(crate) fn triplet_rule(type_of_triplets: Option<&str>, margin: f32) -> PyResult<TripletRule> {
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

pub(crate) fn triplet_config(
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
pub(crate) fn mine_triplets<'py>(
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
pub(crate) fn count_triplets<'py>(
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
pub(crate) enum Streamed {
    Chunk(Array2<u32>),
    End(wml::Result<u64>),
}

/// Triplets in bounded chunks, mined on a background thread one chunk ahead of the reader.
#[pyclass(name = "TripletChunks", module = "wgpu_metric_learning._native")]
pub(crate) struct TripletChunks {
    pub(crate) rx: Mutex<Option<mpsc::Receiver<Streamed>>>,
    pub(crate) token: CancelToken,
    pub(crate) count: Mutex<Option<u64>>,
    /// Set by `close`: the cancellation it causes ends the iteration instead of raising.
    pub(crate) closed: AtomicBool,
}

#[pymethods]
impl TripletChunks {
    #[new]
    #[pyo3(signature = (ctx, embeddings, labels, refs = None, *, type_of_triplets = None, margin = 0.2, distance = "euclidean", normalize = true, self_exclusion = None, max_chunk_triplets = 1 << 20))]
    #[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
    pub(crate) fn new<'py>(
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

    pub(crate) fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    pub(crate) fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<u32>>> {
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
    pub(crate) fn count(&self) -> Option<u64> {
        self.count.lock().ok().and_then(|c| *c)
    }

    /// Stops the mining thread; the iterator then ends.
    pub(crate) fn close(&self) {
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

pub(crate) fn pairs_tuple<'py>(py: Python<'py>, p: wml::Pairs) -> PyResult<Bound<'py, PyTuple>> {
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
pub(crate) fn all_pairs<'py>(
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
pub(crate) fn pair_margin_pairs<'py>(
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
pub(crate) fn multi_similarity_pairs<'py>(
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

pub(crate) fn strategy(name: &str, what: &str) -> PyResult<Strategy> {
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
pub(crate) fn batch_easy_hard_pairs<'py>(
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
pub(crate) fn batch_hard_triplets<'py>(
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
pub(crate) fn angular_triplets<'py>(
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
pub(crate) fn distance_weighted_triplets<'py>(
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
pub(crate) fn hdc_pairs<'py>(
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
pub(crate) fn uniform_histogram_pairs<'py>(
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
