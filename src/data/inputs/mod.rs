//! The inputs of every operation: where embeddings live ([`Embeddings`]), labelled sets
//! ([`MiningSet`]), and which reference is each query itself ([`SelfExclusion`]). They are
//! resolved and validated once, for every operation (`prepare.rs`: shapes, finiteness,
//! labels, self-exclusion, importing device rows), so that the same bad input gives the same
//! typed error everywhere.

use ndarray::{Array2, ArrayView1, ArrayView2};

use crate::data::device_embeddings::DeviceEmbeddings;
pub(crate) use crate::data::device_rows::Rows;
use crate::data::device_rows::RowsView;

/// Where embeddings `(n, d)` live.
///
/// Every operation takes its queries and references as `impl Into<Embeddings>` (a `&Array2`,
/// an `ArrayView2` or a [`DeviceEmbeddings`] converts) or inside a [`MiningSet`].
///
/// # Example
/// ```
/// use wgpu_metric_learning::{BankConfig, Context, Embeddings, MemoryBank};
/// let x = ndarray::Array2::<f32>::zeros((5, 3));
/// assert_eq!(Embeddings::from(&x).dim(), (5, 3));
/// let ctx = Context::native_cpu(None);
/// let bank = MemoryBank::<u32>::new(&ctx, &BankConfig::new(10, 3))?;
/// assert_eq!(bank.rows().dim(), (0, 3)); // its filled rows
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Embeddings<'a> {
    /// A host array (any layout; non-contiguous views are copied as they are uploaded).
    Host(ArrayView2<'a, f32>),
    /// The filled rows of a [`crate::MemoryBank`], resident on its device: usable as queries
    /// or references with the context that created the bank (not as a batch to enqueue).
    Bank(BankRows<'a>),
    /// Rows in a `wgpu::Buffer` of the context's device (a training step's embeddings): read
    /// there, never copied to the host.
    Device(DeviceEmbeddings<'a>),
}

impl<'a> From<DeviceEmbeddings<'a>> for Embeddings<'a> {
    fn from(x: DeviceEmbeddings<'a>) -> Self {
        Embeddings::Device(x)
    }
}

impl<'a> From<ArrayView2<'a, f32>> for Embeddings<'a> {
    fn from(x: ArrayView2<'a, f32>) -> Self {
        Embeddings::Host(x)
    }
}

impl<'a> From<&'a Array2<f32>> for Embeddings<'a> {
    fn from(x: &'a Array2<f32>) -> Self {
        Embeddings::Host(x.view())
    }
}

impl Embeddings<'_> {
    /// The same embeddings for a shorter lifetime (array views are invariant in theirs), so
    /// that queries and references of different lifetimes can meet in one call.
    pub(crate) fn reborrow(&self) -> Embeddings<'_> {
        match self {
            Embeddings::Host(x) => Embeddings::Host(x.view()),
            Embeddings::Bank(b) => Embeddings::Bank(BankRows {
                view: RowsView {
                    rows: b.view.rows,
                    len: b.view.len,
                },
            }),
            Embeddings::Device(x) => Embeddings::Device(*x),
        }
    }

    /// `(n, d)`.
    ///
    /// See the example of [`Embeddings`].
    pub fn dim(&self) -> (usize, usize) {
        match self {
            Embeddings::Host(x) => x.dim(),
            Embeddings::Bank(b) => (b.view.len, b.view.rows.dim()),
            Embeddings::Device(x) => x.dim(),
        }
    }
}

/// The filled rows of a [`crate::MemoryBank`] on its device, as [`Embeddings::Bank`] hands them
/// to the operations. Made only by [`crate::MemoryBank::rows`].
///
/// See the example of [`crate::MemoryBank::rows`].
#[derive(Clone, Copy, Debug)]
pub struct BankRows<'a> {
    pub(crate) view: RowsView<'a>,
}

/// Embeddings `(b, d)` (optional for rules that need labels only) and their labels `(b,)`:
/// one side of the label-based operations (the miners, [`crate::accuracy`], the bank's
/// enqueue).
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::MiningSet;
/// let (x, y) = (array![[1.0f32, 0.0], [0.0, 1.0]], array![0i64, 1]);
/// let batch = MiningSet::new(&x, &y);
/// assert_eq!(batch.len(), 2);
/// let labels_only = MiningSet::from_labels(&y);
/// assert!(labels_only.embeddings.is_none());
/// ```
#[derive(Debug, Clone, Copy)]
pub struct MiningSet<'a, L> {
    /// Embeddings, one row per label, or `None` for label-only rules.
    pub embeddings: Option<Embeddings<'a>>,
    /// Class labels, one per row; any hashable type (`i64` as in PyTorch, `u32`, …).
    pub labels: ArrayView1<'a, L>,
}

impl<'a, L> MiningSet<'a, L> {
    /// Embeddings `(b, d)` and their labels `(b,)`.
    ///
    /// See the example of [`MiningSet`].
    pub fn new(
        embeddings: impl Into<Embeddings<'a>>,
        labels: impl Into<ArrayView1<'a, L>>,
    ) -> Self {
        Self {
            embeddings: Some(embeddings.into()),
            labels: labels.into(),
        }
    }

    /// Labels `(b,)` only, for the rules that need no distances (every valid triplet, all
    /// pairs).
    ///
    /// See the example of [`MiningSet`].
    pub fn from_labels(labels: impl Into<ArrayView1<'a, L>>) -> Self {
        Self {
            embeddings: None,
            labels: labels.into(),
        }
    }

    /// Rows: the number of labels.
    ///
    /// See the example of [`MiningSet`].
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the set has no rows.
    ///
    /// See the example of [`MiningSet`].
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

impl<L> MiningSet<'_, L> {
    /// The same set for a shorter lifetime.
    pub(crate) fn reborrow(&self) -> MiningSet<'_, L> {
        MiningSet {
            embeddings: self.embeddings.as_ref().map(Embeddings::reborrow),
            labels: self.labels.view(),
        }
    }
}

/// Which reference is each query itself, never to be its own positive or neighbour:
/// explicit, not by object identity as in PML. One rule for every operation.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{count_triplets, Context, MiningSet, SelfExclusion, TripletConfig};
/// let ctx = Context::native_cpu(None);
/// let labels = ndarray::array![0, 0, 1];
/// let set = MiningSet::from_labels(&labels);
/// let count = |refs, self_exclusion| {
///     let cfg = TripletConfig { self_exclusion, ..Default::default() };
///     count_triplets(&ctx, &set, refs, &cfg).map(|c| c.count)
/// };
/// assert_eq!(count(None, SelfExclusion::Auto)?, 2); // refs are the queries: SameIndex
/// assert_eq!(count(Some(&set), SelfExclusion::Auto)?, 6); // other refs: nothing excluded
/// assert_eq!(count(Some(&set), SelfExclusion::SameIndex)?, 2);
/// assert_eq!(count(Some(&set), SelfExclusion::QuerySlots(vec![1, 0, 2]))?, 2);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SelfExclusion {
    /// [`SelfExclusion::SameIndex`] when the references are the queries (`refs = None` in the
    /// label-based operations, PML's default), [`SelfExclusion::None`] when they are given
    /// (always for [`crate::knn`], whose references are explicit). The default.
    #[default]
    Auto,
    /// The references are unrelated to the queries: nothing is excluded.
    None,
    /// Reference `i` is query `i` (PML's `ref_includes_query`: the references start with the
    /// queries). Needs at least as many references as queries.
    SameIndex,
    /// Query `a` is stored at reference slot `slots[a]` (a memory bank's
    /// [`crate::Enqueued::self_exclusion`]). Needs one slot per query, each a reference index.
    QuerySlots(Vec<u32>),
}

mod prepare;
pub(crate) use prepare::*;
