//! The native twin of the triplet kernels: anchors in blocks dealt out to every thread; per
//! anchor its ascending positive and negative lists and, for margin rules, its distance row,
//! each (positive, negative) pair tested on the host in (a, p, n) order. Collected triplets
//! are counted first, so that each thread writes its anchors' rows straight into their final
//! place in the output.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use ndarray::{s, Array2, ArrayView1, ArrayView2};

use super::{list_sizes, CountMethod, Problem, TripletRule, Writer, OP};
use crate::context::plan::Plan;
use crate::context::{ComputePath, Context};
use crate::error::{Error, Result};
use crate::hooks::Reporter;
use crate::ops::distance::native::{
    distances_into, is_direct, normalized, read_config, scratch_bytes, Norms,
};
use crate::runtime::host_alloc::zeroed_u32;
use crate::runtime::memory::HostReservation;
use crate::runtime::pool::{par_items, threads, workers_within};

/// The label of a call's scratch reservation.
const SCRATCH: &str = "mine_triplets::native scratch";
/// Anchors per block at most: enough rows for the GEMM of a distance block.
const ANCHOR_BLOCK: usize = 256;
/// Blocks per thread aimed at, so that uneven anchors still balance.
const BLOCKS_PER_THREAD: usize = 4;
/// With [`CountMethod::Auto`], anchors with more positives than this count by sorting their
/// negatives' values (two binary searches per positive) rather than testing every pair.
const SORT_FROM_POSITIVES: usize = 16;

/// How the native path splits a call: anchors per block, the threads, and the scratch every
/// thread holds.
pub(super) struct NativePlan {
    rows: usize,
    threads: usize,
    /// Bytes of scratch over all threads (and of the normalised references, with `copy`),
    /// reserved against the budget while mining.
    scratch: u64,
    /// A normalised copy of the references is held ([`Blocks::new`]).
    copy: bool,
    /// The scratch of one-anchor blocks.
    min_scratch: u64,
}

impl NativePlan {
    pub(super) fn public(&self, problem: &Problem<'_>) -> Plan {
        Plan {
            path: ComputePath::NativeCpu,
            rows: self.rows,
            cols: problem.set.ref_labels.len(),
            chunks: problem.set.labels.len().div_ceil(self.rows),
            bytes: self.scratch,
            min_bytes: self.min_scratch,
        }
    }
}

/// Plans blocks of anchors: a few per thread, and for margin rules at most what the budget
/// available allows for one `(rows, m)` block of distances per thread; one thread per core,
/// or as many as the budget available gives one anchor's scratch each.
pub(super) fn plan(ctx: &Context, problem: &Problem<'_>) -> Result<NativePlan> {
    plan_on(threads(), ctx, problem)
}

/// [`plan`] on a machine of `cores` cores.
fn plan_on(cores: usize, ctx: &Context, problem: &Problem<'_>) -> Result<NativePlan> {
    let (b, m) = (
        problem.set.labels.len(),
        problem.set.ref_labels.len() as u64,
    );
    // An `Anchor`'s five lists of up to `m` elements, and a distance row of `m` floats; for
    // margin rules with a normalising distance, the block's rows and a slice of references
    // normalised ([`scratch_bytes`]).
    let margin = matches!(problem.rule, TripletRule::Margin { .. });
    let d = problem.set.queries.as_ref().map_or(0, |q| q.dim().1);
    let normalize = |rows| match margin {
        true => scratch_bytes((rows, m as usize, d), &problem.distance),
        false => 0,
    };
    let lists = 20 * m + normalize(0);
    let per_row = if margin { 4 * m } else { 0 } + normalize(1) - normalize(0);
    let required = lists + per_row;
    let budget = ctx.tracker().stats().budget_bytes;
    if required > budget {
        return Err(Error::OverBudget {
            op: OP,
            required,
            budget,
        });
    }
    let available = ctx.tracker().available();
    let threads = workers_within(cores, required, available);
    let room = (available / threads as u64).saturating_sub(lists);
    let fits = room.checked_div(per_row).unwrap_or(u64::MAX);
    let rows = ANCHOR_BLOCK
        .min(b.div_ceil(BLOCKS_PER_THREAD * threads))
        .min(usize::try_from(fits).unwrap_or(usize::MAX))
        .max(1);
    let scratch = threads as u64 * (lists + rows as u64 * per_row);
    // The references normalised once, where that fits beside the blocks: then no block
    // divides them again.
    let copy_bytes = match margin && problem.distance.normalizes() {
        true => 4 * m * d as u64,
        false => 0,
    };
    let copy = copy_bytes > 0 && scratch + copy_bytes <= available;
    let scratch = scratch + if copy { copy_bytes } else { 0 };
    if scratch > ctx.tracker().available() {
        // It would fit the budget, but not beside what is held now.
        return Err(Error::BudgetExceeded {
            label: SCRATCH,
            requested: scratch,
            in_use: ctx.memory().current_bytes,
            budget,
        });
    }
    Ok(NativePlan {
        rows,
        threads,
        scratch,
        copy,
        min_scratch: required,
    })
}

/// What every worker shares: the problem, its block size and, for margin rules, the
/// embeddings and the references' norms.
struct Blocks<'p, 'a> {
    problem: &'p Problem<'a>,
    report: &'p Reporter<'p>,
    embeddings: Option<(ArrayView2<'a, f32>, ArrayView2<'a, f32>, Norms)>,
    /// The references normalised, when the plan had room for them (in its reservation).
    copy: Option<Array2<f32>>,
    /// Anchors per block.
    rows: usize,
    /// Threads, each with its scratch reserved.
    threads: usize,
    similarity: bool,
}

impl<'p, 'a> Blocks<'p, 'a> {
    /// Plans the call ([`plan`]) and reserves every thread's scratch (its lists and distance
    /// block) in the returned reservation.
    fn new(
        ctx: &Context,
        problem: &'p Problem<'a>,
        report: &'p Reporter<'p>,
    ) -> Result<(Self, HostReservation)> {
        let refs = problem.set.host_refs(OP)?;
        let planned = plan(ctx, problem)?;
        let reservation = HostReservation::new(SCRATCH, planned.scratch, ctx.tracker())?;
        // Only margin rules look at distances.
        let embeddings = match problem.rule {
            TripletRule::AllValid => None,
            TripletRule::Margin { .. } => match problem.set.queries {
                Some(q) => Some(q.host(OP)?).zip(refs),
                None => None,
            },
        };
        // A normalised copy of the references where the plan has room for it (each block then
        // divides only its own rows), else each block divides its slices of references too:
        // the same bits either way.
        let copy = match (&embeddings, planned.copy) {
            (Some((_, r)), true) => Some(normalized(*r)),
            _ => None,
        };
        let embeddings = embeddings.map(|(q, r)| {
            let direct = is_direct(q.nrows(), r.nrows());
            let norms = match &copy {
                Some(hat) => Norms::new(hat.view(), &read_config(&problem.distance)),
                None => Norms::dividing(r, &problem.distance),
            };
            (q, r, norms.direct(direct))
        });
        let plan = Self {
            problem,
            report,
            embeddings,
            copy,
            rows: planned.rows,
            threads: planned.threads,
            similarity: problem.distance.distance.is_similarity(),
        };
        Ok((plan, reservation))
    }

    fn blocks(&self) -> usize {
        self.problem.set.labels.len().div_ceil(self.rows)
    }

    fn anchors(&self, block: usize) -> Range<usize> {
        let b = self.problem.set.labels.len();
        block * self.rows..(block * self.rows + self.rows).min(b)
    }

    /// A worker's distance block (empty without embeddings).
    fn scratch(&self) -> Array2<f32> {
        match self.embeddings {
            Some(_) => Array2::zeros((self.rows, self.problem.set.ref_labels.len())),
            None => Array2::zeros((0, 0)),
        }
    }

    /// The distance rows of `anchors`, computed into `scratch` (margin rules only).
    fn distances<'d>(
        &self,
        anchors: &Range<usize>,
        scratch: &'d mut Array2<f32>,
    ) -> Option<ArrayView2<'d, f32>> {
        let (queries, refs, norms) = self.embeddings.as_ref()?;
        let refs = self.copy.as_ref().map_or(*refs, |hat| hat.view());
        let mut out = scratch.slice_mut(s![..anchors.len(), ..]);
        let q = queries.slice(s![anchors.clone(), ..]);
        distances_into(q, refs, norms, &self.problem.distance, out.view_mut());
        Some(scratch.slice(s![..anchors.len(), ..]))
    }

    /// Runs `each(anchor, row)` for every anchor of every block on every thread (a worker's
    /// `Anchor` lists reused), returning per block what `each` returned, in order. Blocks
    /// are reported when `reports` (the call's last pass); once the call is cancelled the
    /// remaining blocks are skipped and [`Error::Cancelled`] returned.
    fn per_anchor<T: Send>(
        &self,
        reports: bool,
        each: impl Fn(&mut Anchor, usize, Option<ArrayView1<'_, f32>>) -> T + Sync,
    ) -> Result<Vec<Vec<T>>> {
        let m = self.problem.set.ref_labels.len() as u64;
        let done = par_items(
            self.threads,
            self.blocks(),
            || (Anchor::default(), self.scratch()),
            |block, (anchor, scratch)| {
                if self.report.cancelled() {
                    return Vec::new();
                }
                let anchors = self.anchors(block);
                let dist = self.distances(&anchors, scratch);
                let out = anchors
                    .clone()
                    .map(|a| {
                        let row = dist.as_ref().map(|d| d.row(a - anchors.start));
                        anchor.load(self, a, row);
                        each(anchor, a, row)
                    })
                    .collect();
                if reports {
                    self.report.add(anchors.len() as u64 * m);
                }
                out
            },
        );
        self.report.check()?;
        Ok(done)
    }
}

/// One worker's lists for the anchor at hand, reused from anchor to anchor.
#[derive(Default)]
struct Anchor {
    positives: Vec<u32>,
    negatives: Vec<u32>,
    /// The negatives' distance values, in the negatives' order (margin rules).
    values: Vec<f32>,
    /// The negatives kept for one positive.
    kept: Vec<u32>,
    /// `values` in ascending order (sorted counting).
    sorted: Vec<f32>,
}

impl Anchor {
    fn load(&mut self, plan: &Blocks<'_, '_>, a: usize, row: Option<ArrayView1<'_, f32>>) {
        plan.problem
            .set
            .lists_of(a, &mut self.positives, &mut self.negatives);
        self.values.clear();
        if let Some(row) = row {
            self.values
                .extend(self.negatives.iter().map(|&n| row[n as usize]));
        }
    }

    /// How many triplets the loaded anchor has.
    fn count(&mut self, plan: &Blocks<'_, '_>, row: Option<ArrayView1<'_, f32>>) -> u64 {
        let Some(row) = row else {
            return (self.positives.len() * self.negatives.len()) as u64;
        };
        let (rule, similarity) = (plan.problem.rule, plan.similarity);
        let sort = match plan.problem.count_method {
            CountMethod::Scan => false,
            CountMethod::Sorted => true,
            CountMethod::Auto => self.positives.len() > SORT_FROM_POSITIVES,
        };
        if sort {
            self.sorted.clear();
            self.sorted.extend_from_slice(&self.values);
            self.sorted.sort_unstable_by(f32::total_cmp);
            let sorted = &self.sorted;
            return self
                .positives
                .iter()
                .map(|&p| rule.count_sorted(sorted, row[p as usize], similarity))
                .sum();
        }
        let values = &self.values;
        self.positives
            .iter()
            .map(|&p| {
                let ap = row[p as usize];
                let kept = values
                    .iter()
                    .map(|&an| u64::from(rule.keeps(ap, an, similarity)));
                kept.sum::<u64>()
            })
            .sum()
    }

    /// Calls `f(p, negatives kept with p)` for every positive of the loaded anchor in order,
    /// until `f` returns `false`.
    fn emit(
        &mut self,
        plan: &Blocks<'_, '_>,
        row: Option<ArrayView1<'_, f32>>,
        mut f: impl FnMut(u32, &[u32]) -> bool,
    ) {
        let (rule, similarity) = (plan.problem.rule, plan.similarity);
        for &p in &self.positives {
            let negatives: &[u32] = match (row, rule) {
                (None, _) | (_, TripletRule::AllValid) => &self.negatives,
                (Some(row), rule) => {
                    let ap = row[p as usize];
                    // Branch-free compaction: about half the tests go each way, and a
                    // mispredicted branch per negative costs more than a wasted store.
                    self.kept.resize(self.negatives.len(), 0);
                    let mut len = 0;
                    for (&n, &an) in self.negatives.iter().zip(&self.values) {
                        self.kept[len] = n;
                        len += usize::from(rule.keeps(ap, an, similarity));
                    }
                    &self.kept[..len]
                }
            };
            if !f(p, negatives) {
                return;
            }
        }
    }
}

/// Rows `(a, p, n)` for every `n` of `negatives` into `out` (exactly `3 · negatives.len()`).
fn write_rows(out: &mut [u32], a: u32, p: u32, negatives: &[u32]) {
    for (row, &n) in out.chunks_exact_mut(3).zip(negatives) {
        row.copy_from_slice(&[a, p, n]);
    }
}

/// Mines `problem` on the native path into `writer`, or counts when `None`; returns the
/// number of triplets found (delivered, if a streaming callback stopped early).
pub(crate) fn triplets(
    ctx: &Context,
    problem: &Problem<'_>,
    writer: Option<Writer<'_>>,
    report: &Reporter<'_>,
) -> Result<u64> {
    let (plan, _reserved) = Blocks::new(ctx, problem, report)?;
    let Some(mut writer) = writer else {
        let counts = plan.per_anchor(true, |anchor, _, row| anchor.count(&plan, row))?;
        return Ok(counts.iter().flatten().sum());
    };
    if let Some(all) = writer.collect_target() {
        return collect(&plan, all);
    }
    // Streaming keeps the order on the calling thread: memory stays bounded by one chunk.
    let m = problem.set.ref_labels.len() as u64;
    let (mut anchor, mut scratch) = (Anchor::default(), plan.scratch());
    for block in 0..plan.blocks() {
        report.check()?;
        let anchors = plan.anchors(block);
        let dist = plan.distances(&anchors, &mut scratch);
        for a in anchors.clone() {
            let row = dist.as_ref().map(|d| d.row(a - anchors.start));
            anchor.load(&plan, a, row);
            anchor.emit(&plan, row, |p, negatives| {
                writer.block(a as u32, p, negatives);
                !writer.stopped()
            });
            if writer.stopped() {
                return writer.finish();
            }
        }
        report.add(anchors.len() as u64 * m);
    }
    writer.finish()
}

/// Counts every anchor's triplets, sizes `all` once, then fills each block's part of it from
/// the threads.
fn collect(plan: &Blocks<'_, '_>, all: &mut Vec<u32>) -> Result<u64> {
    let counts: Vec<Vec<u64>> = match plan.problem.rule {
        TripletRule::AllValid => {
            let sizes: Vec<u64> = list_sizes(&plan.problem.set).map(|(p, n)| p * n).collect();
            sizes.chunks(plan.rows).map(<[u64]>::to_vec).collect()
        }
        TripletRule::Margin { .. } => {
            plan.per_anchor(false, |anchor, _, row| anchor.count(plan, row))?
        }
    };
    let total: u64 = counts.iter().flatten().sum();
    let mut out = usize::try_from(3 * total)
        .ok()
        .and_then(zeroed_u32)
        .ok_or_else(|| Error::OutOfMemory {
            label: "mine_triplets::indices (host)",
            requested: 12 * total,
            message: "the host could not allocate the triplets; stream them instead".into(),
            source: None,
        })?;
    // Each block's part of the output, taken by whichever thread takes the block.
    let mut parts = Vec::with_capacity(counts.len());
    let mut rest = &mut out[..];
    for block in &counts {
        let (part, tail) = rest.split_at_mut(3 * block.iter().sum::<u64>() as usize);
        parts.push(Mutex::new(part));
        rest = tail;
    }
    let offsets: Vec<Vec<usize>> = counts
        .iter()
        .map(|block| {
            block
                .iter()
                .scan(0, |at, &c| {
                    let start = *at;
                    *at += 3 * c as usize;
                    Some(start)
                })
                .collect()
        })
        .collect();
    // Whether an anchor emitted other than it counted: only possible with non-finite
    // distances (embeddings whose norms overflow f32), which the two passes may order apart.
    let disagreed = AtomicBool::new(false);
    plan.per_anchor(true, |anchor, a, row| {
        let block = a / plan.rows;
        let mut at = offsets[block][a % plan.rows];
        let end = at + 3 * counts[block][a % plan.rows] as usize;
        // Each block's part is locked by the one thread working on that block.
        let Ok(mut out) = parts[block].lock() else {
            return;
        };
        anchor.emit(plan, row, |p, negatives| {
            let next = at + 3 * negatives.len();
            if next > end {
                return false;
            }
            write_rows(&mut out[at..next], a as u32, p, negatives);
            at = next;
            true
        });
        if at != end {
            disagreed.store(true, Ordering::Relaxed);
        }
    })?;
    drop(parts);
    if disagreed.into_inner() {
        return Err(Error::InvalidParameter {
            op: OP,
            what: "distances",
            value: "not finite".into(),
            rule:
                "margin rules need finite distances: embeddings whose norms overflow f32 give none",
        });
    }
    if all.is_empty() {
        *all = out;
    } else {
        all.extend_from_slice(&out);
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::inputs::{Labelled, NO_SLOT};
    use crate::metric::DistanceConfig;
    use crate::ops::triplets::{CountMethod, TripletType};

    /// 700 anchors against 2000 references in 10 classes under a margin rule: 48 000 bytes of
    /// scratch per thread. A 256 KiB budget holds five threads' worth, so a machine of 16 cores
    /// (an H200 server) ran five threads where it refused the call, while two cores fit.
    #[test]
    fn many_cores_run_fewer_threads_under_a_budget_two_cores_fit() {
        let problem = Problem {
            set: Labelled {
                labels: (0..700u32).map(|i| i % 10).collect(),
                ref_labels: (0..2000u32).map(|i| i % 10).collect(),
                self_slots: vec![NO_SLOT; 700],
                queries: None,
                refs: None,
                imported: Default::default(),
            },
            rule: TripletRule::margin_miner(TripletType::Semihard),
            distance: DistanceConfig::default(),
            chunk: 1 << 20,
            count_method: CountMethod::Auto,
        };
        let budget = 256 << 10;
        let ctx = Context::native_cpu(Some(budget));
        for (cores, threads) in [(1, 1), (2, 2), (16, 5), (64, 5)] {
            let plan = plan_on(cores, &ctx, &problem).expect("one thread's scratch fits");
            assert_eq!(plan.threads, threads, "{cores} cores");
            assert!(plan.scratch <= budget, "{cores} cores: {} B", plan.scratch);
            assert_eq!(plan.min_scratch, 48_000, "one thread, one anchor");
        }
        let tight = Context::native_cpu(Some(47_999));
        assert!(matches!(
            plan_on(16, &tight, &problem),
            Err(Error::OverBudget {
                required: 48_000,
                ..
            })
        ));
    }
}
