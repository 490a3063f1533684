//! kNN over the ranks: every query block visits every rank's references, and its owner merges
//! the partial lists.
//!
//! The queries go round in blocks of [`GroupConfig::query_block`](super::GroupConfig) rows,
//! each broadcast by its owner; every rank searches its own references for the block (within
//! its context's budget) and sends its `k` best per row back to the owner, who merges them.
//! On a device the references are uploaded once and stay resident for every block when they
//! take at most half of the budget left; otherwise each block streams them from the host.
//! Results are bit for bit those of one call when every rank computes on that call's path
//! (see the [module](super)).
//!
//! `self_exclusion` is global: [`SelfExclusion::SameIndex`] excludes, for the global query
//! `i`, the global reference `i`; [`SelfExclusion::QuerySlots`] names a global reference per
//! local query. The hooks report this rank's pairs and cancel the whole group between query
//! blocks.

use ndarray::{s, Array1, Array2, ArrayView2};

use super::Group;
use crate::context::Context;
use crate::data::device_rows::Rows;
use crate::data::inputs::{Embeddings, MiningSet, SelfExclusion, MAX_ROWS, NO_SLOT};
use crate::error::{Error, Result};
use crate::hooks::{Hooks, Reporter};
use crate::kernels::knn_select::EMPTY_INDEX;
use crate::ops::bank::{BankConfig, MemoryBank};
use crate::ops::distance::native::is_direct;
use crate::ops::knn::{merge, search_step, Knn, KnnConfig, Neighbours};
use crate::runtime::memory::Transfers;
use crate::runtime::transfer;
use crate::validate;

const OP: &str = "distributed knn";

/// The `k` nearest references of this rank's queries `(q_r, d)` among every rank's
/// references `(n_r, d)` (collective; host arrays, either may be empty). Indices are global
/// (rank `r`'s references numbered after those of ranks `0..r`), as is `cfg.self_exclusion`;
/// the result equals [`knn`](crate::knn()) over the concatenation for this rank's rows
/// (ties to the lower global index). Cost per query block: `query_block · d · 4` bytes to
/// every rank, `query_block · k · 8` back from each; no rank holds more than its own
/// references.
///
/// # Errors
/// On every rank when any rank's part fails (the others get [`Error::RankFailed`] naming
/// it): as [`knn`](crate::knn()) over all ranks' references; [`Error::Shape`] or
/// [`Error::InvalidParameter`] when `d`, `k`, the distance, the self-exclusion or
/// `query_block` differ between ranks; [`Error::Timeout`] when the others do not arrive.
///
/// # Example
/// See the [module example](super).
pub fn knn<'q, 'r>(
    group: &Group,
    ctx: &Context,
    local_queries: impl Into<ArrayView2<'q, f32>>,
    local_refs: impl Into<ArrayView2<'r, f32>>,
    cfg: &KnnConfig,
) -> Result<Knn> {
    let (local_queries, local_refs) = (local_queries.into(), local_refs.into());
    let (q_local, d) = local_queries.dim();
    let n_local = local_refs.nrows();
    let rank = group.rank();
    // This rank's inputs, before anything moves.
    let local = (|| {
        if d == 0 || local_refs.ncols() != d {
            return Err(Error::Shape {
                op: OP,
                what: "local_refs",
                expected: format!("(n, {d}) to match local_queries, d ≥ 1"),
                got: local_refs.shape().to_vec(),
            });
        }
        if let SelfExclusion::QuerySlots(slots) = &cfg.self_exclusion {
            if slots.len() != q_local {
                return Err(Error::Shape {
                    op: OP,
                    what: "self-exclusion slots",
                    expected: format!("one per local query ({q_local})"),
                    got: vec![slots.len()],
                });
            }
        }
        validate::finite(OP, "local_queries", local_queries)?;
        validate::finite(OP, "local_refs", local_refs)?;
        cfg.hooks.check(OP)
    })();
    group.agree(OP, local)?;
    // Settings that would put the ranks' collectives out of step (or answer differently).
    let exclusion = match &cfg.self_exclusion {
        SelfExclusion::Auto | SelfExclusion::None => 0,
        SelfExclusion::SameIndex => 1,
        SelfExclusion::QuerySlots(_) => 2,
    };
    group.same_everywhere(
        OP,
        &[
            ("k", cfg.k as u64),
            ("distance", cfg.distance.distance as u64),
            ("normalize", u64::from(cfg.distance.normalize)),
            (
                "self_exclusion (0 none, 1 SameIndex, 2 QuerySlots)",
                exclusion,
            ),
            ("query_block", group.cfg.query_block as u64),
        ],
    )?;

    // Every rank's shape; the rules that span ranks give every rank the same answer.
    let shapes = group.all_gather(OP, &[q_local as u64, n_local as u64, d as u64])?;
    let (mut queries_of, mut refs_of) = (Vec::new(), Vec::new());
    for (r, shape) in shapes.chunks_exact(3).enumerate() {
        if shape[2] != d as u64 {
            return Err(Error::Shape {
                op: OP,
                what: "every rank's embeddings",
                expected: format!("{d} columns, as rank {rank}'s"),
                got: vec![r, shape[2] as usize],
            });
        }
        queries_of.push(shape[0] as usize);
        refs_of.push(shape[1] as usize);
    }
    let (q_total, n_total): (usize, usize) = (queries_of.iter().sum(), refs_of.iter().sum());
    let query_offset: usize = queries_of[..rank].iter().sum();
    let bounds: Vec<(usize, usize)> = refs_of
        .iter()
        .scan(0, |at, &n| {
            *at += n;
            Some((*at - n, *at))
        })
        .collect();
    for (what, rows) in [
        ("references of all ranks", n_total),
        ("queries of all ranks", q_total),
    ] {
        if rows > MAX_ROWS {
            return Err(Error::InvalidParameter {
                op: OP,
                what,
                value: rows.to_string(),
                rule: "at most u32::MAX - 2 (indices are u32, two values are markers)",
            });
        }
    }
    let excludes = match &cfg.self_exclusion {
        SelfExclusion::Auto | SelfExclusion::None => false,
        SelfExclusion::SameIndex if n_total < q_total => {
            return Err(Error::Shape {
                op: OP,
                what: "references of all ranks",
                expected: format!("at least the {q_total} queries of all ranks (SameIndex)"),
                got: vec![n_total, d],
            })
        }
        // As one process: without queries nothing is excluded.
        SelfExclusion::SameIndex | SelfExclusion::QuerySlots(_) => q_total > 0,
    };
    let visible = n_total - usize::from(excludes);
    if cfg.k == 0 || cfg.k > visible {
        return Err(Error::InvalidParameter {
            op: OP,
            what: "k",
            value: cfg.k.to_string(),
            rule: "1 ≤ k ≤ the references a query can see (all ranks', less the query itself when excluded)",
        });
    }
    // This rank's queries' global slots.
    let slots = match &cfg.self_exclusion {
        SelfExclusion::QuerySlots(slots) => match slots.iter().find(|&&s| s as usize >= n_total) {
            Some(&bad) => Err(Error::InvalidParameter {
                op: OP,
                what: "self-exclusion slot",
                value: bad.to_string(),
                rule: "a global reference index (below all ranks' references)",
            }),
            None => Ok(slots.clone()),
        },
        SelfExclusion::SameIndex => Ok((query_offset..query_offset + q_local)
            .map(|i| i as u32)
            .collect()),
        SelfExclusion::Auto | SelfExclusion::None => Ok(vec![NO_SLOT; q_local]),
    };
    let slots = group.agree(OP, slots)?;

    let k = cfg.k;
    let largest = cfg.distance.distance.is_similarity();
    // The widest message of a block must fit MPI's i32 counts.
    let widest = d.max(group.size() * k).max(1);
    let block = group.cfg.query_block.min(i32::MAX as usize / widest).max(1);
    let report = Reporter::new(&cfg.hooks, OP, q_total as u64 * n_local as u64);
    let local_cfg = KnnConfig {
        k: k.min(n_local),
        hooks: Hooks::default(),
        ..cfg.clone()
    };
    let mut transfers = Transfers::default();
    let (resident, moved) = transfer::measure(|| resident_refs(ctx, local_refs));
    transfers.add(moved);
    let resident = group.agree(OP, resident)?;
    let refs = match &resident {
        Some(bank) => bank.rows(),
        None => Embeddings::Host(local_refs),
    };
    let mut answer = Neighbours::empty(q_local, k);
    // An owner's failure to merge is reported after the loop, so that its peers, already on
    // the next block, are not left waiting for it.
    let mut merged_all = Ok(());
    for (owner, &owned) in queries_of.iter().enumerate() {
        for start in (0..owned).step_by(block) {
            let rows = block.min(owned - start);
            // The block's rows and global slots, from their owner.
            let (mut queries, mut block_slots) = (vec![0f32; rows * d], vec![NO_SLOT; rows]);
            if owner == rank {
                let mine = local_queries.slice(s![start..start + rows, ..]);
                for (dst, &src) in queries.iter_mut().zip(mine.iter()) {
                    *dst = src;
                }
                block_slots.copy_from_slice(&slots[start..start + rows]);
            }
            let queries = group.broadcast(OP, owner, queries)?;
            let block_slots = group.broadcast(OP, owner, block_slots)?;
            // This rank's best `k` (at most its references) per row, padded to `k`.
            let part = (|| {
                report.check()?;
                let queries = ArrayView2::from_shape((rows, d), &queries[..]).map_err(|e| {
                    Error::Internal {
                        op: OP,
                        message: format!("a query block's shape: {e}"),
                    }
                })?;
                let (start_ref, end_ref) = bounds[rank];
                let excluded: Vec<u32> = block_slots
                    .iter()
                    .map(|&g| match g as usize {
                        g if (start_ref..end_ref).contains(&g) => (g - start_ref) as u32,
                        _ => NO_SLOT,
                    })
                    .collect();
                let (found, moved) = transfer::measure(|| {
                    let rows = Rows::Host(queries);
                    let refs = refs.reborrow();
                    // Direct or not as one call over all ranks' rows would be.
                    let direct = is_direct(q_total, n_total);
                    search_step(ctx, rows, refs, &local_cfg, (&excluded, direct), &report)
                });
                transfers.add(moved);
                found
            })();
            let found = group.agree(OP, part)?;
            let (mut indices, mut scores) = (vec![EMPTY_INDEX; rows * k], vec![f32::NAN; rows * k]);
            let width = found.indices.ncols();
            for i in 0..rows {
                for j in 0..width {
                    indices[i * k + j] = found.indices[[i, j]];
                    scores[i * k + j] = found.scores[[i, j]];
                }
            }
            // Every rank sends `rows · k` of each: no counts to exchange first.
            let counts = vec![rows * k; group.size()];
            let all_indices = group.gather_counted(OP, owner, indices, &counts)?;
            let all_scores = group.gather_counted(OP, owner, scores, &counts)?;
            let (Some(all_indices), Some(all_scores)) = (all_indices, all_scores) else {
                continue; // not this rank's block
            };
            let parts: Result<Vec<Neighbours>> = (0..group.size())
                .map(|r| {
                    let range = r * rows * k..(r + 1) * rows * k;
                    let shape = (rows, k);
                    Ok(Neighbours {
                        indices: Array2::from_shape_vec(shape, all_indices[range.clone()].to_vec())
                            .map_err(|e| internal(&e))?,
                        scores: Array2::from_shape_vec(shape, all_scores[range].to_vec())
                            .map_err(|e| internal(&e))?,
                    })
                })
                .collect();
            match parts {
                Ok(parts) => {
                    let merged = merge(&parts, &bounds, rows, k, largest);
                    answer
                        .indices
                        .slice_mut(s![start..start + rows, ..])
                        .assign(&merged.indices);
                    answer
                        .scores
                        .slice_mut(s![start..start + rows, ..])
                        .assign(&merged.scores);
                }
                Err(e) => merged_all = merged_all.and(Err(e)),
            }
        }
    }
    group.agree(OP, merged_all)?;
    Ok(Knn {
        indices: answer.indices,
        scores: answer.scores,
        path: ctx.path(),
        transfers,
    })
}

/// On a device, this rank's references uploaded once, into a bank whose slot `i` holds row
/// `i`, rather than with every query block: when they take at most half of the budget left,
/// so that the search's tiles keep room. `None` on the native path, for no rows, or when
/// they do not fit (the blocks then stream them from the host).
fn resident_refs(ctx: &Context, refs: ArrayView2<'_, f32>) -> Result<Option<MemoryBank<u32>>> {
    if ctx.gpu().is_none() || refs.nrows() == 0 {
        return Ok(None);
    }
    let memory = ctx.memory();
    let left = memory.budget_bytes.saturating_sub(memory.current_bytes);
    if refs.len() as u64 * 4 > left / 2 {
        return Ok(None);
    }
    let made =
        MemoryBank::new(ctx, &BankConfig::new(refs.nrows(), refs.ncols())).and_then(|mut bank| {
            let labels = Array1::<u32>::zeros(refs.nrows());
            bank.enqueue(ctx, &MiningSet::new(refs, &labels))?;
            Ok(bank)
        });
    match made {
        Ok(bank) => Ok(Some(bank)),
        // Memory taken meanwhile, or a driver that refuses: stream from the host instead.
        Err(
            Error::BudgetExceeded { .. } | Error::OverBudget { .. } | Error::OutOfMemory { .. },
        ) => Ok(None),
        Err(e) => Err(e),
    }
}

fn internal(e: &ndarray::ShapeError) -> Error {
    Error::Internal {
        op: OP,
        message: format!("a gathered list's shape: {e}"),
    }
}
