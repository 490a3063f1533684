//! The inputs of every miner: labels (and embeddings) of the queries and of the references,
//! validated once, with labels made dense `u32` ids and self-exclusion made explicit slots.

use std::collections::HashMap;
use std::hash::Hash;

use ndarray::{ArrayView1, ArrayView2};

use crate::bank::BankRows;
use crate::context::Context;
use crate::device_rows::RowsView;
use crate::error::{Error, Result};
use crate::validate;

/// Which reference is the anchor itself, so that it is never its own positive. Explicit, not
/// by object identity as in PML.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{count_triplets, Context, MiningSet, SelfExclusion, TripletConfig};
/// let ctx = Context::native_cpu(None);
/// let labels = ndarray::array![0, 0, 1];
/// let set = MiningSet::labels(labels.view());
/// let count = |self_exclusion| {
///     let cfg = TripletConfig { self_exclusion, ..Default::default() };
///     count_triplets(&ctx, &set, Some(&set), &cfg).map(|c| c.count)
/// };
/// assert_eq!(count(SelfExclusion::None)?, 6); // (0,0,2), (1,1,2), (2,2,0), (2,2,1) too
/// assert_eq!(count(SelfExclusion::SameIndex)?, 2);
/// assert_eq!(count(SelfExclusion::QuerySlots(vec![1, 0, 2]))?, 2);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SelfExclusion {
    /// The references are unrelated to the queries: nothing is excluded.
    #[default]
    None,
    /// Reference `i` is query `i` (the references are the queries themselves): `p ≠ a`.
    SameIndex,
    /// Query `a` is stored at reference slot `slots[a]` (a memory bank): `p ≠ slots[a]`.
    QuerySlots(Vec<u32>),
}

/// Where the embeddings `(n, d)` of a mining side live.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{BankConfig, Context, Embeddings, MemoryBank};
/// let x = ndarray::Array2::<f32>::zeros((5, 3));
/// assert_eq!(Embeddings::from(x.view()).dim(), (5, 3));
/// let ctx = Context::native_cpu(None);
/// let bank = MemoryBank::<u32>::new(&ctx, &BankConfig::new(10, 3))?;
/// assert_eq!(bank.rows().dim(), (0, 3)); // its filled rows
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub enum Embeddings<'a> {
    /// A host array (any layout; non-contiguous views are copied as they are uploaded).
    Host(ArrayView2<'a, f32>),
    /// The filled rows of a [`crate::MemoryBank`], resident on its device: only usable as
    /// references, with the context that created the bank.
    Bank(BankRows<'a>),
}

impl<'a> From<ArrayView2<'a, f32>> for Embeddings<'a> {
    fn from(x: ArrayView2<'a, f32>) -> Self {
        Embeddings::Host(x)
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
        }
    }

    /// `(n, d)`.
    ///
    /// See the example of [`Embeddings`].
    pub fn dim(&self) -> (usize, usize) {
        match self {
            Embeddings::Host(x) => x.dim(),
            Embeddings::Bank(b) => (b.view.len, b.view.rows.dim()),
        }
    }
}

/// Labels `(b,)` and, for rules that need them, embeddings `(b, d)` of one side of a mining call.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::MiningSet;
/// let labels = array![0i64, 0, 1];
/// let set = MiningSet::labels(labels.view());
/// assert!(set.embeddings.is_none());
/// ```
#[derive(Debug, Clone, Copy)]
pub struct MiningSet<'a, L> {
    /// Class labels, one per row; any hashable type (`i64` as in PyTorch, `u32`, …).
    pub labels: ArrayView1<'a, L>,
    /// Embeddings, one row per label, or `None` for label-only rules.
    pub embeddings: Option<Embeddings<'a>>,
}

impl<L> MiningSet<'_, L> {
    /// The same set for a shorter lifetime.
    pub(crate) fn reborrow(&self) -> MiningSet<'_, L> {
        MiningSet {
            labels: self.labels.view(),
            embeddings: self.embeddings.as_ref().map(Embeddings::reborrow),
        }
    }
}

impl<'a, L> MiningSet<'a, L> {
    /// Labels only.
    ///
    /// See the example of [`MiningSet`].
    pub fn labels(labels: ArrayView1<'a, L>) -> Self {
        Self {
            labels,
            embeddings: None,
        }
    }

    /// Labels and embeddings.
    ///
    /// See the example of [`crate::mine_triplets`].
    pub fn with_embeddings(labels: ArrayView1<'a, L>, embeddings: ArrayView2<'a, f32>) -> Self {
        Self {
            labels,
            embeddings: Some(Embeddings::Host(embeddings)),
        }
    }
}

/// Validated miner inputs.
pub(crate) struct Prepared<'a> {
    pub(crate) labels: Vec<u32>,
    pub(crate) ref_labels: Vec<u32>,
    /// Per query, the reference slot never to use as its positive (`NO_SLOT`: none).
    pub(crate) self_slots: Vec<u32>,
    /// Query embeddings, when the miner needs them.
    pub(crate) queries: Option<ArrayView2<'a, f32>>,
    /// Reference embeddings, when the miner needs them.
    pub(crate) refs: Option<Embeddings<'a>>,
}

impl<'a> Prepared<'a> {
    /// The reference embeddings as a host array. Bank rows only exist on a device, and
    /// [`prepare`] lets them through only for a context on that device, so the host paths
    /// never see them; this is the typed error if one ever did.
    pub(crate) fn host_refs(&self, op: &'static str) -> Result<Option<ArrayView2<'a, f32>>> {
        match self.refs {
            None => Ok(None),
            Some(Embeddings::Host(r)) => Ok(Some(r)),
            Some(Embeddings::Bank(_)) => Err(Error::InvalidParameter {
                op,
                what: "context",
                value: "native CPU".into(),
                rule: "a memory bank can only be used with the context that created it",
            }),
        }
    }

    /// Anchor `a`'s ascending positive references (same label, not its own slot) and negative
    /// references (other label), into the given vectors (cleared first, reused by callers).
    /// The host twin of `shaders/triplet_lists.wgsl`, shared by the native path and the miners.
    pub(crate) fn lists_of(&self, a: usize, positives: &mut Vec<u32>, negatives: &mut Vec<u32>) {
        let (label, me) = (self.labels[a], self.self_slots[a]);
        positives.clear();
        negatives.clear();
        for (r, &other) in self.ref_labels.iter().enumerate() {
            if other != label {
                negatives.push(r as u32);
            } else if r as u32 != me {
                positives.push(r as u32);
            }
        }
    }
}

/// `self_slots` value meaning "no reference is this query".
pub(crate) const NO_SLOT: u32 = u32::MAX;

fn dense_labels<L: Hash + Eq + Copy>(
    labels: ArrayView1<'_, L>,
    refs: ArrayView1<'_, L>,
) -> (Vec<u32>, Vec<u32>) {
    let mut ids: HashMap<L, u32> = HashMap::new();
    let mut id = |l: &L| {
        let next = ids.len() as u32;
        *ids.entry(*l).or_insert(next)
    };
    let a: Vec<u32> = labels.iter().map(&mut id).collect();
    let r: Vec<u32> = refs.iter().map(&mut id).collect();
    (a, r)
}

fn check_set<L>(op: &'static str, side: &'static str, set: &MiningSet<'_, L>) -> Result<()> {
    let (labels_what, emb_what) = match side {
        "queries" => ("labels", "embeddings"),
        _ => ("ref_labels", "ref_embeddings"),
    };
    let rows = match set.embeddings {
        None => None,
        Some(Embeddings::Host(e)) => {
            validate::embeddings(op, emb_what, e)?;
            Some(e.nrows())
        }
        // Bank rows were validated as they were enqueued.
        Some(Embeddings::Bank(_)) if side == "queries" => {
            return Err(Error::InvalidParameter {
                op,
                what: emb_what,
                value: "Embeddings::Bank".into(),
                rule: "a memory bank can only be the references; pass the queries as a host array",
            })
        }
        Some(Embeddings::Bank(b)) => Some(b.view.len),
    };
    if let Some(rows) = rows.filter(|&r| r != set.labels.len()) {
        return Err(Error::Shape {
            op,
            what: labels_what,
            expected: format!("({rows},) to match {emb_what}"),
            got: set.labels.shape().to_vec(),
        });
    }
    if set.labels.len() >= NO_SLOT as usize {
        return Err(Error::InvalidParameter {
            op,
            what: labels_what,
            value: set.labels.len().to_string(),
            rule: "at most 2^32 - 2 rows per side (indices are u32)",
        });
    }
    Ok(())
}

/// Validates one miner call: lengths, embeddings (finite, same `d`), self-exclusion slots.
/// Without `refs` the references are the queries and each query is excluded as its own
/// positive (PML's default).
pub(crate) fn prepare<'s, L: Hash + Eq + Copy>(
    op: &'static str,
    ctx: &Context,
    queries: &'s MiningSet<'_, L>,
    refs: Option<&'s MiningSet<'_, L>>,
    self_exclusion: &SelfExclusion,
    needs_embeddings: bool,
) -> Result<Prepared<'s>> {
    // One lifetime for both sides from here on (array views are invariant in theirs).
    let queries = queries.reborrow();
    let refs = refs.map(MiningSet::reborrow);
    let (queries, refs) = (&queries, refs.as_ref());
    check_set(op, "queries", queries)?;
    let (ref_set, exclusion) = match refs {
        Some(r) => {
            check_set(op, "refs", r)?;
            (r, self_exclusion)
        }
        None => (queries, &SelfExclusion::SameIndex),
    };
    if needs_embeddings {
        let missing = if queries.embeddings.is_none() {
            Some("embeddings")
        } else if ref_set.embeddings.is_none() {
            Some("ref_embeddings")
        } else {
            None
        };
        if let Some(what) = missing {
            return Err(Error::InvalidParameter {
                op,
                what,
                value: "None".into(),
                rule: "this miner compares distances and needs embeddings",
            });
        }
    }
    if let (Some(q), Some(r)) = (queries.embeddings, ref_set.embeddings) {
        let (dq, dr) = (q.dim().1, r.dim().1);
        if dq != dr {
            return Err(Error::Shape {
                op,
                what: "refs",
                expected: format!("(n, {dq}) to match queries"),
                got: vec![r.dim().0, dr],
            });
        }
    }
    if let Some(Embeddings::Bank(bank)) = ref_set.embeddings {
        match ctx.gpu() {
            Some(gpu) => bank.view.rows.check_device(op, gpu)?,
            None => {
                return Err(Error::InvalidParameter {
                    op,
                    what: "context",
                    value: ctx.device_name(),
                    rule: "a memory bank can only be used with the context that created it",
                })
            }
        }
    }
    let (b, m) = (queries.labels.len(), ref_set.labels.len());
    let self_slots = match exclusion {
        SelfExclusion::None => vec![NO_SLOT; b],
        SelfExclusion::SameIndex => {
            if b != m {
                return Err(Error::Shape {
                    op,
                    what: "ref_labels",
                    expected: format!("({b},): SelfExclusion::SameIndex needs refs = queries"),
                    got: vec![m],
                });
            }
            (0..b as u32).collect()
        }
        SelfExclusion::QuerySlots(slots) => {
            if slots.len() != b {
                return Err(Error::Shape {
                    op,
                    what: "self_exclusion slots",
                    expected: format!("({b},): one slot per query"),
                    got: vec![slots.len()],
                });
            }
            if let Some(&bad) = slots.iter().find(|&&s| s as usize >= m) {
                return Err(Error::InvalidParameter {
                    op,
                    what: "self_exclusion slot",
                    value: bad.to_string(),
                    rule: "must index the references",
                });
            }
            slots.clone()
        }
    };
    let (labels, ref_labels) = dense_labels(queries.labels, ref_set.labels);
    Ok(Prepared {
        labels,
        ref_labels,
        self_slots,
        queries: match queries.embeddings {
            Some(Embeddings::Host(q)) if needs_embeddings => Some(q),
            _ => None,
        },
        refs: ref_set.embeddings.filter(|_| needs_embeddings),
    })
}
