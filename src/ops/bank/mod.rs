//! A memory bank (PML's `CrossBatchMemory`): a ring buffer of past embeddings and labels,
//! resident on the device, updated in place and mined against without re-uploading.
//!
//! Slots are written `head, head + 1, …` modulo the capacity. Until the bank has been filled
//! once, the references are slots `0 .. head`; afterwards, all of them (PML's rule). The
//! embeddings live in device pages that each fit one storage binding (on the native path, in
//! one host array); labels are kept on the host, where every miner needs them, and uploaded as
//! `u32` ids per mining call (4 bytes per row, against `4·d` for the embeddings).

mod checkpoint;
mod gpu;

pub use checkpoint::CheckpointLabel;

use std::hash::Hash;
use std::path::Path;

use ndarray::{s, Array1, Array2, ArrayView1, Axis, CowArray};

use crate::context::plan::DeviceCaps;
use crate::context::Context;
use crate::data::device_embeddings::DeviceEmbeddings;
use crate::data::device_rows::{max_page_rows, rows_bytes, DeviceRows, RowsView};
use crate::data::inputs::{self, BankRows, Embeddings, MiningSet, SelfExclusion, Side};
use crate::error::{Error, Result};
use crate::runtime::memory::{HostReservation, Transfers};
use crate::runtime::transfer;
use crate::validate;

/// Shape of a [`MemoryBank`].
///
/// # Example
/// ```
/// use wgpu_metric_learning::BankConfig;
/// let cfg = BankConfig::new(4096, 128);
/// assert_eq!((cfg.capacity, cfg.dim, cfg.page_rows), (4096, 128, None));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BankConfig {
    /// Rows the bank holds (PML's `memory_size`; PML's default is 1024). At least 1.
    pub capacity: usize,
    /// Floats per embedding (PML's `embedding_size`). At least 1.
    pub dim: usize,
    /// Rows per device page. `None` (the default): as many as one storage binding holds
    /// (128 MiB on lavapipe: 262 144 rows of 128 floats). A smaller value forces more pages
    /// (for tests); larger values are clamped to the device's maximum.
    pub page_rows: Option<usize>,
}

impl BankConfig {
    /// `capacity` rows of `dim` floats, pages as large as the device allows.
    ///
    /// See the example of [`BankConfig`].
    pub fn new(capacity: usize, dim: usize) -> Self {
        Self {
            capacity,
            dim,
            page_rows: None,
        }
    }
}

/// Where an enqueue put its rows, and how to mine with the rest of the batch.
///
/// See the examples of [`MemoryBank`] and [`MemoryBank::is_filled`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Enqueued {
    /// The slot each enqueued row was written to, in row order.
    pub slots: Vec<u32>,
    /// The batch rows to use as queries: all of them after [`MemoryBank::enqueue`], the
    /// unmasked ones after [`MemoryBank::enqueue_masked`].
    pub query_rows: Vec<usize>,
    /// The self-exclusion for mining those queries against [`MemoryBank::refs`]: each query's
    /// own slot after a plain enqueue (a row is never its own positive, also for a batch of
    /// one, where PML keeps the self pair), none after a masked one (the queries were not
    /// enqueued; PML does the same).
    pub self_exclusion: SelfExclusion,
    /// Host–device traffic of the enqueue (zero for a native bank).
    pub transfers: Transfers,
}

/// The bank's filled rows in slot order, copied to the host.
///
/// See the example of [`MemoryBank::snapshot`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct BankSnapshot<L> {
    /// `(len, dim)`.
    pub embeddings: Array2<f32>,
    /// `(len,)`.
    pub labels: Array1<L>,
}

/// What [`MemoryBank::save`] wrote.
///
/// See the example of [`MemoryBank::save`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Saved {
    /// Bytes of the checkpoint file.
    pub bytes: u64,
    /// Host–device traffic of reading the rows back (zero for a native bank).
    pub transfers: Transfers,
}

#[derive(Debug)]
enum Storage {
    Device(DeviceRows),
    /// The native path keeps the rows in host memory, counted against the budget.
    Host {
        rows: Array2<f32>,
        _reserved: HostReservation,
    },
}

/// A ring buffer of `capacity` embeddings `(capacity, dim)` and labels, on the context's
/// device (or in host memory on the native path).
///
/// Typical use, as PML's `CrossBatchMemory`: enqueue the batch, then mine the batch against
/// the bank with the self-exclusion the enqueue returns.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{mine_triplets, BankConfig, Context, MemoryBank, MiningSet, TripletConfig};
/// let ctx = Context::native_cpu(None);
/// let mut bank = MemoryBank::<i64>::new(&ctx, &BankConfig::new(4, 2))?;
/// let x = array![[1.0f32, 0.0], [0.9, 0.1], [0.0, 1.0]];
/// let y = array![0i64, 0, 1];
/// let batch = MiningSet::new(&x, &y);
/// let enq = bank.enqueue(&ctx, &batch)?;
/// assert_eq!((enq.slots.clone(), bank.len()), (vec![0, 1, 2], 3));
/// // Every valid triplet; a margin rule needs only `..TripletConfig::margin_miner(kind)`.
/// let cfg = TripletConfig { self_exclusion: enq.self_exclusion, ..Default::default() };
/// let t = mine_triplets(&ctx, &batch, Some(&bank.refs()), &cfg)?;
/// assert_eq!(t.indices, array![[0u32, 1, 2], [1, 0, 2]]);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug)]
pub struct MemoryBank<L> {
    storage: Storage,
    /// Labels of slots `0 .. len()`.
    labels: Vec<L>,
    capacity: usize,
    dim: usize,
    head: usize,
    filled: bool,
}

const NEW: &str = "MemoryBank::new";
const ENQUEUE: &str = "MemoryBank::enqueue";

/// A bank's shape: capacity and dimension at least 1, slots that fit `u32` indices.
fn check_config(op: &'static str, cfg: &BankConfig) -> Result<()> {
    for (what, value) in [("capacity", cfg.capacity), ("dim", cfg.dim)] {
        if value == 0 {
            return Err(Error::InvalidParameter {
                op,
                what,
                value: "0".into(),
                rule: "must be at least 1",
            });
        }
    }
    if cfg.capacity > inputs::MAX_ROWS {
        return Err(Error::InvalidParameter {
            op,
            what: "capacity",
            value: cfg.capacity.to_string(),
            rule: "at most 4 294 967 293 rows (slots are u32 indices)",
        });
    }
    Ok(())
}
const SAVE: &str = "MemoryBank::save";
const LOAD: &str = "MemoryBank::load";

impl<L: Hash + Eq + CheckpointLabel> MemoryBank<L> {
    /// Writes the bank (its filled rows, labels, head and filled flag) to `path` atomically
    /// (temporary file, flushed, renamed: a crash leaves the previous file or the new one,
    /// whole). The bank is read, not changed; on the GPU page by page.
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be written (the previous file untouched, the
    /// temporary one removed; if only the directory's final flush fails, the new file is in
    /// place, maybe not yet durable); [`Error::InvalidParameter`] for another context.
    ///
    /// # Example
    /// ```
    /// use ndarray::array;
    /// use wgpu_metric_learning::{BankConfig, Context, MemoryBank, MiningSet};
    /// let ctx = Context::native_cpu(None);
    /// let cfg = BankConfig::new(4, 2);
    /// let mut bank = MemoryBank::<i64>::new(&ctx, &cfg)?;
    /// bank.enqueue(&ctx, &MiningSet::new(&array![[1.0f32, 2.0], [3.0, 4.0]], &array![7i64, 8]))?;
    /// let path = std::env::temp_dir().join(format!("wml-doc-{}.bank", std::process::id()));
    /// let saved = bank.save(&ctx, &path)?;
    /// assert_eq!(saved.bytes, 56 + 2 * 8 + 2 * 2 * 4 + 8);
    /// let back = MemoryBank::<i64>::load(&ctx, &path, &cfg)?;
    /// assert_eq!(back.snapshot(&ctx)?, bank.snapshot(&ctx)?);
    /// # std::fs::remove_file(&path).ok();
    /// # Ok::<(), wgpu_metric_learning::Error>(())
    /// ```
    pub fn save(&self, ctx: &Context, path: impl AsRef<Path>) -> Result<Saved> {
        let len = self.len();
        let (rows, transfers) = transfer::measure(|| -> Result<_> {
            Ok(match &self.storage {
                Storage::Host { rows, .. } => CowArray::from(rows.slice(s![..len, ..])),
                Storage::Device(rows) => {
                    let gpu = gpu::gpu_of(ctx, SAVE, rows)?;
                    CowArray::from(rows.read(gpu, len)?)
                }
            })
        });
        let rows = rows?;
        let header = checkpoint::Header {
            capacity: self.capacity,
            dim: self.dim,
            len,
            head: self.head,
            filled: self.filled,
        };
        let bytes = checkpoint::save(SAVE, path.as_ref(), &header, &self.labels, rows.view())?;
        Ok(Saved { bytes, transfers })
    }

    /// A bank of `cfg`'s shape on `ctx`, restored from a checkpoint written by
    /// [`Self::save`] with the same capacity, dimension and label type: the same rows, labels,
    /// head and filled flag (the page size may differ). A new bank is returned only when the
    /// whole file was read and checked.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for a `cfg` that [`Self::new`] refuses (checked first);
    /// [`Error::Io`] when the file cannot be read; [`Error::Checkpoint`] for a file that is
    /// not a checkpoint, is truncated, extended or damaged (checksum), or holds another
    /// capacity, dimension or label type; [`Error::NonFinite`] for non-finite rows; the errors
    /// of [`Self::new`].
    ///
    /// # Example
    /// ```
    /// use wgpu_metric_learning::{BankConfig, Context, Error, MemoryBank};
    /// let ctx = Context::native_cpu(None);
    /// let path = std::env::temp_dir().join(format!("wml-doc-foreign-{}.bank", std::process::id()));
    /// std::fs::write(&path, b"not a bank")?;
    /// let loaded = MemoryBank::<u32>::load(&ctx, &path, &BankConfig::new(4, 2));
    /// assert!(matches!(loaded, Err(Error::Checkpoint { what: "size", .. })));
    /// # std::fs::remove_file(&path).ok();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load(ctx: &Context, path: impl AsRef<Path>, cfg: &BankConfig) -> Result<Self> {
        let path = path.as_ref();
        check_config(LOAD, cfg)?;
        let loaded = checkpoint::load::<L>(LOAD, path, (cfg.capacity, cfg.dim))?;
        validate::finite(LOAD, "embeddings", loaded.rows.view())?;
        let mut bank = Self::new(ctx, cfg)?;
        let rows = Embeddings::Host(loaded.rows.view());
        bank.write(ctx, rows, None, ArrayView1::from(&loaded.labels[..]))?;
        bank.labels = loaded.labels;
        bank.head = loaded.header.head;
        bank.filled = loaded.header.filled;
        Ok(bank)
    }
}

impl<L: Hash + Eq + Copy> MemoryBank<L> {
    /// An empty bank of `cfg.capacity` rows on `ctx`'s device (or host, on the native path),
    /// allocated whole now, through the budget.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for a capacity or dimension of 0; [`Error::OverBudget`] when
    /// the bank alone needs more than the budget, [`Error::BudgetExceeded`] when it does not
    /// fit beside what is already allocated; [`Error::DeviceLimit`] when one row does not fit
    /// a storage binding.
    ///
    /// # Example
    /// ```
    /// use wgpu_metric_learning::{BankConfig, Context, Error, MemoryBank};
    /// let ctx = Context::native_cpu(Some(1 << 20));
    /// let too_big = MemoryBank::<u32>::new(&ctx, &BankConfig::new(1 << 20, 128));
    /// assert!(matches!(too_big, Err(Error::OverBudget { .. })));
    /// ```
    pub fn new(ctx: &Context, cfg: &BankConfig) -> Result<Self> {
        check_config(NEW, cfg)?;
        let budget = ctx.memory().budget_bytes;
        let storage = match ctx.gpu() {
            Some(gpu) => {
                let dim4 = cfg.dim.div_ceil(4);
                let caps = DeviceCaps::from_limits(&gpu.limits);
                let largest = max_page_rows(NEW, &caps, dim4)?;
                let page_rows = cfg.page_rows.unwrap_or(largest).clamp(1, largest);
                let required = rows_bytes(cfg.capacity, dim4, page_rows);
                if required > budget {
                    return Err(Error::OverBudget {
                        op: NEW,
                        required,
                        budget,
                    });
                }
                Storage::Device(DeviceRows::new(gpu, cfg.capacity, cfg.dim, page_rows)?)
            }
            None => {
                let required = 4 * (cfg.capacity as u64).saturating_mul(cfg.dim as u64);
                if required > budget {
                    return Err(Error::OverBudget {
                        op: NEW,
                        required,
                        budget,
                    });
                }
                let reservation = HostReservation::new(NEW, required, ctx.tracker())?;
                Storage::Host {
                    rows: Array2::zeros((cfg.capacity, cfg.dim)),
                    _reserved: reservation,
                }
            }
        };
        Ok(Self {
            storage,
            labels: Vec::new(),
            capacity: cfg.capacity,
            dim: cfg.dim,
            head: 0,
            filled: false,
        })
    }

    /// Rows the bank holds when full.
    ///
    /// See the example of [`MemoryBank::reset`].
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Floats per row.
    ///
    /// See the example of [`MemoryBank::reset`].
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Filled rows: `head()` until the bank has wrapped once, then `capacity()`.
    ///
    /// See the example of [`MemoryBank::is_filled`].
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// `true` before the first (non-empty) enqueue and after [`Self::reset`].
    ///
    /// See the example of [`MemoryBank::reset`].
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The slot the next enqueued row goes to (PML's `queue_idx`).
    ///
    /// See the example of [`MemoryBank::is_filled`].
    pub fn head(&self) -> usize {
        self.head
    }

    /// Whether the bank has been filled once (PML's `has_been_filled`).
    ///
    /// # Example
    /// ```
    /// use wgpu_metric_learning::{BankConfig, Context, MemoryBank, MiningSet};
    /// let ctx = Context::native_cpu(None);
    /// let mut bank = MemoryBank::<u32>::new(&ctx, &BankConfig::new(3, 1))?;
    /// let x = ndarray::array![[1.0f32], [2.0]];
    /// bank.enqueue(&ctx, &MiningSet::new(&x, ndarray::array![0u32, 1].view()))?;
    /// assert_eq!((bank.len(), bank.head(), bank.is_filled()), (2, 2, false));
    /// let enq = bank.enqueue(&ctx, &MiningSet::new(&x, ndarray::array![2u32, 3].view()))?;
    /// assert_eq!(enq.slots, vec![2, 0]); // wrapped around
    /// assert_eq!((bank.len(), bank.head(), bank.is_filled()), (3, 1, true));
    /// # Ok::<(), wgpu_metric_learning::Error>(())
    /// ```
    pub fn is_filled(&self) -> bool {
        self.filled
    }

    /// Rows per device page (`capacity()` on the native path).
    ///
    /// # Example
    /// ```
    /// use wgpu_metric_learning::{BankConfig, Context, MemoryBank, MiningSet};
    /// let bank = MemoryBank::<u32>::new(&Context::native_cpu(None), &BankConfig::new(100, 8))?;
    /// assert_eq!(bank.page_rows(), 100); // one page: host memory has no binding limit
    /// # Ok::<(), wgpu_metric_learning::Error>(())
    /// ```
    pub fn page_rows(&self) -> usize {
        match &self.storage {
            Storage::Device(rows) => rows.page_rows(),
            Storage::Host { .. } => self.capacity,
        }
    }

    /// Writes the batch's embeddings `(b, dim)` with its labels `(b,)` at slots
    /// `head .. head + b` modulo the capacity, wrapping across the end and across pages; only
    /// the batch's bytes move (device embeddings are copied on the device). An empty batch
    /// changes nothing (PML would mark the bank filled).
    ///
    /// # Errors
    /// The bank is unchanged after any. [`Error::Shape`] for a wrong `dim` or label count;
    /// [`Error::InvalidParameter`] for a batch without embeddings or of a bank's rows,
    /// `b > capacity` (PML asserts), another context, or device rows for a native bank;
    /// [`Error::NonFinite`]; [`DeviceEmbeddings`]' errors.
    ///
    /// # Example
    /// ```
    /// use ndarray::array;
    /// use wgpu_metric_learning::{BankConfig, Context, MemoryBank, MiningSet};
    /// let ctx = Context::native_cpu(None);
    /// let mut bank = MemoryBank::<u32>::new(&ctx, &BankConfig::new(3, 1))?;
    /// let (x, y) = (array![[1.0f32], [2.0]], array![7u32, 8]);
    /// bank.enqueue(&ctx, &MiningSet::new(&x, &y))?;
    /// let (x, y) = (array![[3.0f32], [4.0]], array![9u32, 9]);
    /// let e = bank.enqueue(&ctx, &MiningSet::new(&x, &y))?;
    /// assert_eq!(e.slots, vec![2, 0]);
    /// assert!(bank.is_filled()); // slot 0 now holds [4.0], label 9
    /// # Ok::<(), wgpu_metric_learning::Error>(())
    /// ```
    pub fn enqueue(&mut self, ctx: &Context, batch: &MiningSet<'_, L>) -> Result<Enqueued> {
        let (embeddings, labels) = self.check_batch(ctx, batch)?;
        self.check_len(labels.len())?;
        self.write(ctx, embeddings, None, labels)
    }

    /// Writes validated rows (only rows `chosen` of device embeddings, when given) and their
    /// labels at the head.
    fn write(
        &mut self,
        ctx: &Context,
        embeddings: Embeddings<'_>,
        chosen: Option<&[usize]>,
        labels: ArrayView1<'_, L>,
    ) -> Result<Enqueued> {
        let b = labels.len();
        let mut transfers = Transfers::default();
        match (&mut self.storage, embeddings) {
            (Storage::Host { rows, .. }, Embeddings::Host(embeddings)) => {
                for (i, row) in embeddings.rows().into_iter().enumerate() {
                    rows.row_mut((self.head + i) % self.capacity).assign(&row);
                }
            }
            (Storage::Device(rows), embeddings) => {
                let gpu = gpu::gpu_of(ctx, ENQUEUE, rows)?;
                let ring = gpu::Ring {
                    rows,
                    head: self.head,
                    capacity: self.capacity,
                };
                let (done, moved) = transfer::measure(|| {
                    gpu.settled(match embeddings {
                        Embeddings::Host(x) => gpu::enqueue_host(gpu, &ring, x),
                        Embeddings::Device(x) => gpu::enqueue_device(gpu, &ring, &x, chosen),
                        Embeddings::Bank(_) => Err(Error::Internal {
                            op: ENQUEUE,
                            message: "bank rows passed validation as a batch".into(),
                        }),
                    })
                });
                done?;
                transfers = moved;
            }
            (Storage::Host { .. }, _) => {
                return Err(Error::InvalidParameter {
                    op: ENQUEUE,
                    what: "embeddings",
                    value: "rows on a device".into(),
                    rule: "a native-CPU bank takes host arrays",
                })
            }
        }
        Ok(self.advance(labels.iter().copied(), (0..b).collect(), transfers))
    }

    /// MoCo-style: enqueues the rows where `mask` is `true` and returns the others as the
    /// queries, to be mined against the bank with no self-exclusion (PML's `enqueue_mask`).
    ///
    /// # Errors
    /// As [`Self::enqueue`], plus [`Error::Shape`] when `mask` is not `(b,)`; more masked rows
    /// than the capacity is [`Error::InvalidParameter`] (PML does not check).
    ///
    /// # Example
    /// ```
    /// use ndarray::array;
    /// use wgpu_metric_learning::{BankConfig, Context, MemoryBank, MiningSet, SelfExclusion};
    /// let ctx = Context::native_cpu(None);
    /// let mut bank = MemoryBank::<u32>::new(&ctx, &BankConfig::new(8, 1))?;
    /// let (x, y) = (array![[1.0f32], [2.0], [3.0]], array![0u32, 1, 2]);
    /// let e = bank.enqueue_masked(&ctx, &MiningSet::new(&x, &y), array![true, false, true].view())?;
    /// assert_eq!((e.slots, e.query_rows), (vec![0, 1], vec![1]));
    /// assert_eq!(e.self_exclusion, SelfExclusion::None);
    /// # Ok::<(), wgpu_metric_learning::Error>(())
    /// ```
    pub fn enqueue_masked(
        &mut self,
        ctx: &Context,
        batch: &MiningSet<'_, L>,
        mask: ArrayView1<'_, bool>,
    ) -> Result<Enqueued> {
        let (embeddings, labels) = self.check_batch(ctx, batch)?;
        if mask.len() != labels.len() {
            return Err(Error::Shape {
                op: ENQUEUE,
                what: "enqueue_mask",
                expected: format!("({},) to match labels", labels.len()),
                got: mask.shape().to_vec(),
            });
        }
        let (chosen, rest): (Vec<usize>, Vec<usize>) = (0..mask.len()).partition(|&i| mask[i]);
        self.check_len(chosen.len())?;
        let chosen_labels: Array1<L> = chosen.iter().map(|&i| labels[i]).collect();
        let mut done = match embeddings {
            Embeddings::Host(x) => {
                let rows = x.select(Axis(0), &chosen);
                self.write(
                    ctx,
                    Embeddings::Host(rows.view()),
                    None,
                    chosen_labels.view(),
                )?
            }
            device => self.write(ctx, device, Some(&chosen), chosen_labels.view())?,
        };
        done.query_rows = rest;
        done.self_exclusion = SelfExclusion::None;
        Ok(done)
    }

    /// Enqueues `b = labels.len()` dense rows `(b, dim)` at byte `offset` of `source`, a
    /// buffer of the bank's device with `COPY_SRC` usage, with no host round trip: shorthand
    /// for [`Self::enqueue`] of a [`DeviceEmbeddings`] (which also takes a row stride).
    ///
    /// # Errors
    /// As [`Self::enqueue`] (non-finite rows are found on the device, before the bank is
    /// touched) and as [`DeviceEmbeddings`].
    ///
    /// # Example
    /// ```no_run
    /// use ndarray::array;
    /// use wgpu_metric_learning::{BankConfig, Context, ContextConfig, MemoryBank};
    /// let ctx = Context::new(&ContextConfig::default())?;
    /// let (device, _) = ctx.wgpu_device().expect("a wgpu context");
    /// let source = device.create_buffer(&wgpu::BufferDescriptor {
    ///     label: None, size: 2 * 4 * 4, mapped_at_creation: false,
    ///     usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::STORAGE,
    /// });
    /// let mut bank = MemoryBank::<u32>::new(&ctx, &BankConfig::new(16, 4))?;
    /// bank.enqueue_buffer(&ctx, &source, 0, array![0u32, 1].view())?;
    /// # Ok::<(), wgpu_metric_learning::Error>(())
    /// ```
    pub fn enqueue_buffer(
        &mut self,
        ctx: &Context,
        source: &wgpu::Buffer,
        offset: u64,
        labels: ArrayView1<'_, L>,
    ) -> Result<Enqueued> {
        let rows = DeviceEmbeddings::new(source, offset, (labels.len(), self.dim));
        self.enqueue(ctx, &MiningSet::new(rows, labels))
    }

    /// The filled rows `(len, dim)` as queries or references for [`crate::knn`] and
    /// [`crate::pairwise_distances`], where they live
    /// (nothing is uploaded); result indices are slots.
    ///
    /// # Example
    /// ```
    /// use ndarray::array;
    /// use wgpu_metric_learning::{knn, BankConfig, Context, KnnConfig, MemoryBank, MiningSet};
    /// let ctx = Context::native_cpu(None);
    /// let mut bank = MemoryBank::<u32>::new(&ctx, &BankConfig::new(8, 2))?;
    /// let (x, y) = (array![[1.0f32, 0.0], [0.0, 1.0]], array![0u32, 1]);
    /// bank.enqueue(&ctx, &MiningSet::new(&x, &y))?;
    /// let found = knn(&ctx, &array![[0.1f32, 1.0]], bank.rows(), &KnnConfig { k: 1, ..Default::default() })?;
    /// assert_eq!(found.indices[[0, 0]], 1);
    /// # Ok::<(), wgpu_metric_learning::Error>(())
    /// ```
    pub fn rows(&self) -> Embeddings<'_> {
        let len = self.len();
        match &self.storage {
            Storage::Device(rows) => Embeddings::Bank(BankRows {
                view: RowsView { rows, len },
            }),
            Storage::Host { rows, .. } => Embeddings::Host(rows.slice(s![..len, ..])),
        }
    }

    /// The filled rows as references for any miner: labels `(len,)` and embeddings
    /// `(len, dim)` (on the device: [`Embeddings::Bank`], nothing is uploaded).
    ///
    /// See the example of [`MemoryBank`].
    pub fn refs(&self) -> MiningSet<'_, L> {
        MiningSet {
            labels: ArrayView1::from(&self.labels[..]),
            embeddings: Some(self.rows()),
        }
    }

    /// Copies the filled rows to the host in slot order.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for another context; device errors.
    ///
    /// # Example
    /// ```
    /// use wgpu_metric_learning::{BankConfig, Context, MemoryBank, MiningSet};
    /// let ctx = Context::native_cpu(None);
    /// let mut bank = MemoryBank::<i32>::new(&ctx, &BankConfig::new(8, 2))?;
    /// bank.enqueue(&ctx, &MiningSet::new(ndarray::array![[1.0f32, 2.0]].view(), ndarray::array![5].view()))?;
    /// let snap = bank.snapshot(&ctx)?;
    /// assert_eq!(snap.embeddings, ndarray::array![[1.0f32, 2.0]]);
    /// assert_eq!(snap.labels, ndarray::array![5]);
    /// # Ok::<(), wgpu_metric_learning::Error>(())
    /// ```
    pub fn snapshot(&self, ctx: &Context) -> Result<BankSnapshot<L>> {
        let embeddings = match &self.storage {
            Storage::Host { rows, .. } => rows.slice(s![..self.len(), ..]).to_owned(),
            Storage::Device(rows) => {
                let gpu = gpu::gpu_of(ctx, "MemoryBank::snapshot", rows)?;
                rows.read(gpu, self.len())?
            }
        };
        Ok(BankSnapshot {
            embeddings,
            labels: Array1::from(self.labels.clone()),
        })
    }

    /// Empties the bank (PML's `reset_queue`); its memory stays allocated.
    ///
    /// # Example
    /// ```
    /// use wgpu_metric_learning::{BankConfig, Context, MemoryBank, MiningSet};
    /// let ctx = Context::native_cpu(None);
    /// let mut bank = MemoryBank::<u32>::new(&ctx, &BankConfig::new(4, 1))?;
    /// bank.enqueue(&ctx, &MiningSet::new(ndarray::array![[1.0f32]].view(), ndarray::array![0u32].view()))?;
    /// bank.reset();
    /// assert!(bank.is_empty() && bank.head() == 0 && !bank.is_filled());
    /// assert_eq!((bank.capacity(), bank.dim()), (4, 1));
    /// # Ok::<(), wgpu_metric_learning::Error>(())
    /// ```
    pub fn reset(&mut self) {
        self.labels.clear();
        self.head = 0;
        self.filled = false;
    }

    fn check_len(&self, b: usize) -> Result<()> {
        if b > self.capacity {
            return Err(Error::InvalidParameter {
                op: ENQUEUE,
                what: "batch size",
                value: b.to_string(),
                rule: "a batch may not hold more rows than the bank's capacity",
            });
        }
        Ok(())
    }

    /// The batch's embeddings and labels, validated as every operation validates its queries,
    /// and of the bank's dimension.
    fn check_batch<'b>(
        &self,
        ctx: &Context,
        batch: &'b MiningSet<'_, L>,
    ) -> Result<(Embeddings<'b>, ArrayView1<'b, L>)> {
        let Some(embeddings) = &batch.embeddings else {
            return Err(Error::InvalidParameter {
                op: ENQUEUE,
                what: "embeddings",
                value: "None".into(),
                rule: "a memory bank stores embeddings: the batch needs them",
            });
        };
        let (b, d) = inputs::check_embeddings(ENQUEUE, ctx, Side::Batch, embeddings)?;
        if d != self.dim {
            return Err(Error::Shape {
                op: ENQUEUE,
                what: "embeddings",
                expected: format!("(b, {}) to match the bank", self.dim),
                got: vec![b, d],
            });
        }
        if batch.labels.len() != b {
            return Err(Error::Shape {
                op: ENQUEUE,
                what: "labels",
                expected: format!("({b},) to match embeddings"),
                got: vec![batch.labels.len()],
            });
        }
        Ok((embeddings.reborrow(), batch.labels.view()))
    }

    /// Records the labels of rows written at `head ..` and moves the head (PML's
    /// `add_to_memory`, with its "filled once the head wraps or reaches the end" rule).
    fn advance(
        &mut self,
        labels: impl Iterator<Item = L>,
        query_rows: Vec<usize>,
        transfers: Transfers,
    ) -> Enqueued {
        let mut slots = Vec::new();
        for label in labels {
            let slot = self.head;
            match self.labels.get_mut(slot) {
                Some(l) => *l = label,
                None => self.labels.push(label),
            }
            slots.push(slot as u32);
            self.head = (self.head + 1) % self.capacity;
            if self.head == 0 {
                self.filled = true;
            }
        }
        Enqueued {
            self_exclusion: SelfExclusion::QuerySlots(slots.clone()),
            slots,
            query_rows,
            transfers,
        }
    }
}
