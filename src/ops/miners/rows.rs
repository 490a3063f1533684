//! The row driver every host miner runs on: the distance matrix in blocks of whole anchor rows
//! (at most [`BLOCK_FLOATS`] distances on the host), each anchor's row handed to the miner with
//! its ascending positive and negative reference lists; labels-only miners get the lists alone.

use std::hash::Hash;

use ndarray::{Array2, ArrayView1, ArrayView2};

use crate::context::Context;
use crate::data::inputs::{prepare, Imports, Labelled, MiningSet};
use crate::error::{Error, Result};
use crate::hooks::{Hooks, Reporter};
use crate::metric::DistanceConfig;
use crate::ops::distance::{for_each_row_block, Job};
use crate::ops::triplets::Triplets;
use crate::runtime::memory::Transfers;
use crate::runtime::transfer;

use super::{MinerConfig, Pairs};

/// Distances per host block: 16 Mi floats = 64 MiB.
pub(super) const BLOCK_FLOATS: usize = 1 << 24;

/// One anchor's view of the references: its distance row (if the miner uses distances) and
/// its ascending positive and negative reference indices.
pub(super) struct Row<'r> {
    pub(super) anchor: u32,
    pub(super) values: Option<ArrayView1<'r, f32>>,
    pub(super) positives: &'r [u32],
    pub(super) negatives: &'r [u32],
}

impl Row<'_> {
    pub(super) fn value(&self, r: u32) -> f32 {
        self.values.map_or(0.0, |v| v[r as usize])
    }
}

/// Calls `f` for every anchor in ascending order, reporting each anchor's `m` pairs and
/// checking for cancellation between blocks of rows.
pub(super) fn for_each_row(
    op: &'static str,
    ctx: &Context,
    set: &Labelled<'_>,
    distance: &DistanceConfig,
    hooks: &Hooks,
    f: &mut dyn FnMut(&Row<'_>),
) -> Result<Transfers> {
    let pairs = set.labels.len() as u64 * set.ref_labels.len() as u64;
    let report = Reporter::new(hooks, op, pairs);
    let mut transfers = for_each_row_reporting(op, ctx, set, distance, &report, f)?;
    transfers.add(set.imported);
    Ok(transfers)
}

/// [`for_each_row`] reporting to `report` (`b · m` pairs): one pass of a miner that walks
/// the matrix more than once, each pass a [`Reporter::part`] of the call's progress. Its
/// transfers leave out the import of device-buffer inputs (`set.imported`, once per call).
pub(super) fn for_each_row_reporting(
    op: &'static str,
    ctx: &Context,
    set: &Labelled<'_>,
    distance: &DistanceConfig,
    report: &Reporter<'_>,
    f: &mut dyn FnMut(&Row<'_>),
) -> Result<Transfers> {
    let (visited, transfers) = transfer::measure(|| -> Result<()> {
        let (b, m) = (set.labels.len(), set.ref_labels.len());
        let (mut positives, mut negatives) = (Vec::with_capacity(m), Vec::with_capacity(m));
        let mut visit = |a: usize, values: Option<ArrayView1<'_, f32>>| {
            set.lists_of(a, &mut positives, &mut negatives);
            f(&Row {
                anchor: a as u32,
                values,
                positives: &positives,
                negatives: &negatives,
            });
        };
        let rows = (BLOCK_FLOATS / m.max(1)).max(1);
        let (Some(queries), Some(refs)) = (set.queries, set.refs) else {
            for a0 in (0..b).step_by(rows) {
                report.check()?;
                let a1 = (a0 + rows).min(b);
                (a0..a1).for_each(|a| visit(a, None));
                report.add(((a1 - a0) * m) as u64);
            }
            return Ok(());
        };
        let mut on_block = |r0: usize, block: ArrayView2<'_, f32>| {
            for (i, row) in block.rows().into_iter().enumerate() {
                visit(r0 + i, Some(row));
            }
            Ok(())
        };
        let job = Job {
            op,
            ctx,
            queries: queries.reborrow(),
            cfg: distance,
            max_rows: rows,
            report,
        };
        for_each_row_block(&job, refs, &mut on_block)
    });
    visited.map(|()| transfers)
}

/// A miner's validated inputs: its settings first, then its inputs and self-exclusion.
pub(super) fn prepare_miner<'s, L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &'s MiningSet<'_, L>,
    refs: Option<&'s MiningSet<'_, L>>,
    cfg: &impl MinerConfig,
    imports: &'s mut Imports,
) -> Result<Labelled<'s>> {
    cfg.check()?;
    let needs_embeddings = cfg.distance().is_some();
    prepare(
        cfg.op(),
        ctx,
        queries,
        refs,
        cfg.self_exclusion(),
        needs_embeddings,
        |_| Ok(true),
        imports,
    )
}

impl Triplets {
    /// Triplets from flat `(a, p, n)` rows, mined on `ctx`'s path.
    pub(super) fn from_flat(
        op: &'static str,
        ctx: &Context,
        flat: Vec<u32>,
        transfers: Transfers,
    ) -> Result<Self> {
        let indices =
            Array2::from_shape_vec((flat.len() / 3, 3), flat).map_err(|e| Error::Internal {
                op,
                message: format!("triplets are not whole (a, p, n) rows: {e}"),
            })?;
        Ok(Self {
            indices,
            path: ctx.path(),
            transfers,
        })
    }
}

impl Pairs {
    /// Pairs from flat `(a, p)` and `(a, n)` rows, computed on `ctx`'s path.
    pub(super) fn new(
        op: &'static str,
        ctx: &Context,
        positives: Vec<u32>,
        negatives: Vec<u32>,
        transfers: Transfers,
    ) -> Result<Self> {
        let array = |flat: Vec<u32>| {
            Array2::from_shape_vec((flat.len() / 2, 2), flat).map_err(|e| Error::Internal {
                op,
                message: format!("pairs are not whole (a, b) rows: {e}"),
            })
        };
        Ok(Self {
            positives: array(positives)?,
            negatives: array(negatives)?,
            path: ctx.path(),
            transfers,
        })
    }
}
