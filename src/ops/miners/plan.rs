//! The plan of the host miners: the blocks of whole anchor rows the row driver walks.

use std::hash::Hash;

use crate::context::plan::Plan;
use crate::context::Context;
use crate::data::inputs::{Imports, MiningSet};
use crate::error::Result;
use crate::metric::{Distance, DistanceConfig};
use crate::ops::distance::row_plan;

use super::rows::{prepare_miner, BLOCK_FLOATS};
use super::MinerConfig;

/// The blocks of rows a host miner walks with these arguments (see [`super::mine_plan`]).
pub(super) fn rows_plan<L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &impl MinerConfig,
) -> Result<Plan> {
    let mut imports = Imports::plan();
    let set = prepare_miner(ctx, queries, refs, cfg, &mut imports)?;
    let (b, m) = (set.labels.len(), set.ref_labels.len());
    let rows = (BLOCK_FLOATS / m.max(1)).max(1);
    match (set.queries, set.refs) {
        (Some(queries), Some(refs)) => {
            let distance = cfg.distance().copied().unwrap_or(DistanceConfig {
                distance: Distance::Euclidean,
                normalize: false,
            });
            let plan = row_plan(cfg.op(), ctx, (queries, &refs), &distance, rows)?;
            Ok(plan.with_imports(imports.footprint()))
        }
        // Labels only: rows of lists on the host, nothing held.
        _ => Ok(Plan {
            path: ctx.path(),
            rows: b.min(rows).max(1),
            cols: m,
            chunks: b.div_ceil(rows),
            bytes: 0,
            min_bytes: 0,
        }),
    }
}
