//! One memory bank's contents on every rank.
//!
//! Every rank enqueues the same rows in rank order, so banks that start equal stay equal
//! after every step, whatever the batch sizes, and mining then runs locally on each rank
//! against [`MemoryBank::refs`]. This fixes the drift of PML's `CrossBatchMemory` under DDP,
//! whose gathered order differs between ranks. Each rank's own rows are its queries, each
//! excluded from its own slot ([`SelfExclusion::QuerySlots`]).

use std::hash::Hash;

use mpi::traits::Equivalence;
use ndarray::{Array1, Array2};

use super::Group;
use crate::context::Context;
use crate::data::inputs::{Embeddings, MiningSet, SelfExclusion};
use crate::error::{Error, Result};
use crate::ops::bank::{Enqueued, MemoryBank};
use crate::validate;

const OP: &str = "distributed enqueue";

/// Enqueues every rank's batch `(b_r, d)`, in rank order, into this rank's `bank`
/// (collective), so that banks that start equal stay equal; returns what this rank's own
/// batch needs to be mined against [`MemoryBank::refs`] (its slots, its rows as queries each
/// excluded from its own slot). Cost: one gather of all batches.
///
/// # Errors
/// On every rank when any rank's part fails (the others get [`Error::RankFailed`] naming
/// it): as [`MemoryBank::enqueue`]; [`Error::InvalidParameter`] for a batch without host
/// embeddings, batches past the capacity together, or banks whose `dim`, capacity, length or
/// next slot differ between ranks (rebuild them from one rank's [`MemoryBank::refs`]);
/// [`Error::Timeout`].
///
/// # Example
/// ```no_run
/// use wgpu_metric_learning::distributed::mpi::{self, traits::*};
/// use wgpu_metric_learning::distributed::{enqueue_global, Group, GroupConfig};
/// use wgpu_metric_learning::{BankConfig, Context, MemoryBank, MiningSet};
/// let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Funneled).expect("once");
/// let (group, ctx) = (Group::new(&universe.world(), &GroupConfig::default()), Context::native_cpu(None));
/// let mut bank = MemoryBank::<i64>::new(&ctx, &BankConfig::new(1024, 2))?;
/// let (x, y) = (ndarray::array![[0.0f32, 1.0]], ndarray::array![group.rank() as i64]);
/// let mine = enqueue_global(&group, &ctx, &mut bank, &MiningSet::new(&x, &y))?;
/// assert_eq!((bank.len(), mine.slots), (group.size(), vec![group.rank() as u32]));
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn enqueue_global<L>(
    group: &Group,
    ctx: &Context,
    bank: &mut MemoryBank<L>,
    batch: &MiningSet<'_, L>,
) -> Result<Enqueued>
where
    L: Hash + Eq + Copy + Default + Equivalence + 'static,
{
    let dim = bank.dim();
    let local = match batch.embeddings {
        Some(Embeddings::Host(x)) if x.ncols() != dim => Err(Error::Shape {
            op: OP,
            what: "batch embeddings",
            expected: format!("(b, {dim}) as the bank"),
            got: x.shape().to_vec(),
        }),
        Some(Embeddings::Host(x)) if x.nrows() != batch.labels.len() => Err(Error::Shape {
            op: OP,
            what: "batch labels",
            expected: format!("({},) to match the embeddings", x.nrows()),
            got: vec![batch.labels.len()],
        }),
        Some(Embeddings::Host(x)) => validate::finite(OP, "batch embeddings", x).map(|()| x),
        _ => Err(Error::InvalidParameter {
            op: OP,
            what: "batch embeddings",
            value: "none or device-resident".into(),
            rule: "the batch is sent to every rank from host rows",
        }),
    };
    let rows = group.agree(OP, local)?;
    // Banks that already differ cannot be kept equal (a rank whose earlier enqueue failed).
    group.same_everywhere(
        OP,
        &[
            ("bank dim", dim as u64),
            ("bank capacity", bank.capacity() as u64),
            ("rows in the bank", bank.len() as u64),
            ("the bank's next slot", bank.head() as u64),
            ("bank wrapped", u64::from(bank.is_filled())),
        ],
    )?;
    let counts = group.all_gather_counts(OP, rows.nrows())?;
    let total: usize = counts.iter().sum();
    if total > bank.capacity() {
        return Err(Error::InvalidParameter {
            op: OP,
            what: "rows of all ranks' batches",
            value: total.to_string(),
            rule: "at most the bank's capacity (PML asserts this of one batch)",
        });
    }
    let flat: Vec<f32> = rows.iter().copied().collect();
    let all_rows = group.all_gather(OP, &flat)?;
    let labels: Vec<L> = batch.labels.iter().copied().collect();
    let all_labels = group.all_gather(OP, &labels)?;
    let all_rows = Array2::from_shape_vec((total, dim), all_rows).map_err(|e| Error::Internal {
        op: OP,
        message: format!("the gathered rows' shape: {e}"),
    })?;
    let all_labels = Array1::from(all_labels);
    let done = bank.enqueue(ctx, &MiningSet::new(&all_rows, &all_labels));
    let done = group.agree(OP, done)?;
    // This rank's rows among all.
    let first: usize = counts[..group.rank()].iter().sum();
    let mine = first..first + rows.nrows();
    let slots = done.slots[mine].to_vec();
    Ok(Enqueued {
        query_rows: (0..slots.len()).collect(),
        self_exclusion: SelfExclusion::QuerySlots(slots.clone()),
        slots,
        transfers: done.transfers,
    })
}
