//! PML's losses over the pairs (and triplets, tuples) of the distance matrix:
//! `ContrastiveLoss` (and `SignalToNoiseRatioContrastiveLoss`), `MultiSimilarityLoss`, `SupConLoss`, `CircleLoss`, `NCALoss`,
//! `GeneralizedLiftedStructureLoss`, `MarginLoss`, `FastAPLoss`, `TupletMarginLoss`,
//! `RankedListLoss`, `PNPLoss`, `NPairsLoss` and `InstanceLoss` (each anchor's row by itself),
//! `LiftedStructureLoss`, `HistogramLoss`, `IntraPairVarianceLoss` and
//! `ThresholdConsistentMarginLoss` (state shared across anchors), with their gradients,
//! through the loss driver ([`super::driver`]): anchors in blocks under the budget, each
//! anchor's row of distances turned into its row of weights `∂L/∂D` by the loss's rule
//! ([`super::pair_rules`], [`super::pair_global`], where each rule's formula is), then two
//! products with the embeddings. A loss whose weights need a whole-batch quantity
//! (Contrastive's divisors, Lifted's per-row sums, Histogram's histograms, a mean) gathers
//! it in forward passes first (distances only, no gradient): one more distance product for
//! Contrastive (none where every anchor fits one block: its two passes then share the
//! distances), TCM, Histogram and Lifted (two for Lifted against references), two for
//! IntraPairVariance. NPairs' plan is the whole batch's, though a call on host rows gathers
//! its `2 k` rows and runs the `(k, k)` problem only, natively: `k` is the batch's labels
//! (tens to thousands), whose product a device's round trip would only slow down.
//!
//! As PML's `GenericPairLoss`es, Contrastive, MultiSimilarity, SupCon, Circle,
//! GeneralizedLifted, Lifted, TupletMargin and IntraPairVariance return 0 with no gradient
//! with at most one positive and one negative pair; SupCon, Lifted and TupletMargin also
//! without any positive or any negative pair; NCA with at most one query; Margin and
//! Histogram without a triplet; FastAP, PNP and NPairs without an anchor that has a
//! positive; TCM without a pair; Instance without a row. "Positive" losses are decided on the f32 value, as PML's
//! reducers see them.
//!
//! `SignalToNoiseRatioContrastiveLoss` is the contrastive rule on PML's `SNRDistance`,
//! `var(q − r) / var(q)` over the dimensions: with `u` the centred rows it is
//! `|u_q − u_r|² / |u_q|²`, the driver's squared Euclidean blocks of the centred rows, each
//! query row divided by its squared norm (its derivative through that norm added to the
//! query's gradient, the gradient taken back through the centring). `AngularLoss` is not a
//! function of one distance matrix: its own blocks are in [`super::angular`].
//!
//! On a wgpu context Contrastive, MultiSimilarity, SupCon, Circle, NCA, GeneralizedLifted,
//! Margin, FastAP, ThresholdConsistentMargin, RankedList and IntraPairVariance run on the
//! device, LiftedStructure and Histogram with the queries as references, and Instance on
//! similarities (its batch relabelled, through the classifier losses' `SOFTMAX` rule)
//! ([`super::pair_device`]: one kernel skeleton, `pair_weights`, with each rule's pieces);
//! the others run natively there (device-resident rows read back, once per pass).

use std::hash::Hash;

use ndarray::{Array1, Array2, ArrayView1, Axis};

use super::driver::{self, Job, Mode};
use super::gpu::Rule;
use super::info_nce::pair_counts;
use super::pair_call::{has_triplet, job, no_loss, refuse_refs, PairLoss, PairLossConfig, SCRATCH};
use super::pair_global::{self, is_global, state_bytes, STATE};
use super::pair_params::{Kind, PairLossRule, PnpVariant};
use super::pair_rules::{anchor, Row};
use super::scratch::{AnchorRule, Scratch, Shared, Totals};
use super::{angular, dynamic_soft_margin, pair_device, pair_global_linear};
use crate::context::plan::Plan;
use crate::context::{ComputePath, Context};
use crate::data::device_rows::Rows;
use crate::data::inputs::{Imports, Labelled, MiningSet, SelfExclusion, NO_SLOT};
use crate::error::{Error, Result};
use crate::metric::Distance;
use crate::runtime::memory::HostReservation;
use crate::runtime::transfer;

/// PML's pair loss that `cfg.rule` names ([`PairLossRule`]'s list) of `queries` `(b, d)`
/// against `refs` `(m, d)` (`None`: the queries themselves) over every pair (triplet, tuple),
/// in PML's semantics and reducers, with its gradient. Cost: two matrix products, one more
/// per forward pass (module docs), in `(rows, m)` blocks under the budget; no `(b, m)`
/// matrix, triplet or tuple exists. NPairs on host rows runs its `(k, k)` pairs only.
///
/// # Errors
/// [`Error::InvalidParameter`] for a parameter out of its range, a distance the rule's PML
/// loss asserts against (each rule's docs), references where PML refuses them (Histogram,
/// PNP, NPairs, Instance); otherwise as [`crate::triplet_margin_loss`].
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{pair_loss, Context, MiningSet, MultiSimilarity, PairLossConfig};
/// let ctx = Context::native_cpu(None);
/// let x = array![[1.0f32, 0.1], [0.1, 1.0], [0.9, 0.2], [0.0, 1.0]];
/// let labels = array![0, 1, 0, 1];
/// let cfg = PairLossConfig::<MultiSimilarity>::default();
/// let out = pair_loss(&ctx, &MiningSet::new(&x, &labels), None, &cfg)?;
/// assert_eq!((out.positive_pairs, out.negative_pairs, out.nonzero), (4, 8, 4));
/// assert_eq!(out.query_grad.dim(), (4, 2));
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn pair_loss<L: Hash + Ord + Copy, R: PairLossRule>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &PairLossConfig<R>,
) -> Result<PairLoss> {
    refuse_refs(refs, &cfg.rule)?;
    let mut imports = Imports::call();
    job(ctx, (queries, refs), cfg, &mut imports, |job| {
        match cfg.rule.kind() {
            Kind::NPairs(_) => n_pairs(ctx, job, cfg),
            Kind::Instance(_) => {
                // The ranks, and while they are made a sorted copy of the labels: held in
                // the budget; the run then holds the ranks in its state (`state_bytes`).
                let b = queries.labels.len() as u64;
                let sorting = (4 + std::mem::size_of::<L>() as u64) * b;
                let ranks = {
                    let _sorting = HostReservation::new(STATE, sorting, ctx.tracker())?;
                    ranks(queries)
                };
                run(ctx, job, cfg.rule.kind(), &ranks)
            }
            Kind::Angular(c) => angular::run(ctx, job, c),
            Kind::DynamicSoftMargin(c) => Ok(dynamic_soft_margin::run(ctx, job, c, &[])?.0),
            kind => run(ctx, job, kind, &[]),
        }
    })
}

/// Each row's label's rank among the sorted distinct labels (PML's `torch.unique(labels,
/// return_inverse=True)`): InstanceLoss's target columns.
fn ranks<L: Ord + Copy>(set: &MiningSet<'_, L>) -> Vec<u32> {
    let mut sorted = set.labels.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let rank = |l: &L| sorted.binary_search(l).unwrap_or_else(|i| i) as u32;
    set.labels.iter().map(rank).collect()
}

/// The [`Plan`] of [`pair_loss`] with these arguments, allocating nothing: its path, anchors
/// per block and bytes.
///
/// # Errors
/// As [`pair_loss`]; [`Error::OverBudget`] when not even one anchor fits.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{pair_loss_plan, Context, Contrastive, MiningSet, PairLossConfig};
/// let ctx = Context::native_cpu(Some(64 << 20));
/// let x = ndarray::Array2::<f32>::ones((4096, 128));
/// let labels = ndarray::Array1::from_shape_fn(4096, |i| i % 2048);
/// let cfg = PairLossConfig::<Contrastive>::default();
/// let plan = pair_loss_plan(&ctx, &MiningSet::new(&x, &labels), None, &cfg)?;
/// assert!(plan.bytes <= 64 << 20 && plan.rows < 4096);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn pair_loss_plan<L: Hash + Ord + Copy, R: PairLossRule>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &PairLossConfig<R>,
) -> Result<Plan> {
    refuse_refs(refs, &cfg.rule)?;
    let mut imports = Imports::plan();
    let plan = job(ctx, (queries, refs), cfg, &mut imports, |job| {
        let kind = cfg.rule.kind();
        if !has_loss(job, kind).1 {
            return Ok(Plan::nothing(ctx.path(), job.set.ref_labels.len()));
        }
        match kind {
            Kind::Angular(_) => return angular::plan(ctx, job),
            Kind::DynamicSoftMargin(c) => return dynamic_soft_margin::plan(ctx, job, c),
            _ => {}
        }
        // What the passes keep between them is held beside the blocks, as the run holds it.
        let state = match kind {
            Kind::IntraPairVariance(_) if pair_global_linear::applies(job) => {
                pair_global_linear::held_bytes(job)?
            }
            _ => state_bytes(kind, job.set.labels.len()),
        };
        let _held = HostReservation::new(STATE, state, ctx.tracker())?;
        if let (Kind::Instance(c), Some(gpu)) = (kind, ctx.gpu()) {
            let b = job.set.labels.len();
            let native = driver::Sizing::new(ctx, job).map(|s| s.plan(b, b));
            if let Some(mut plan) = pair_device::instance_plan((ctx, gpu), job, c.gamma)? {
                if let Ok(native) = &native {
                    plan.min_bytes = plan.min_bytes.min(native.min_bytes);
                }
                return Ok(plan.with_imports((state, 0)));
            }
        }
        let device = pair_device::rule(kind, job).map(Rule::Pair);
        Ok(super::plan::plan(ctx, job, device.as_ref())?.with_imports((state, 0)))
    })?;
    Ok(plan.with_imports(imports.footprint()))
}

/// The pair counts, and whether PML computes a loss: not with at most one positive and one
/// negative pair (its `GenericPairLoss`es), nor without positives or negatives (SupCon), nor
/// for at most one query (NCA). MarginLoss returns none without a triplet and FastAP none
/// without an anchor that has a positive, which the run finds out.
fn has_loss(job: &Job<'_>, kind: Kind) -> ((u64, u64), bool) {
    let (positives, negatives) = pair_counts(job.set);
    let few = positives <= 1 && negatives <= 1;
    let b = job.set.labels.len();
    let has = match kind {
        Kind::Nca(_) => b > 1,
        Kind::Margin(_) | Kind::FastAp(_) => true,
        Kind::RankedList(_) | Kind::Instance(_) => b > 0,
        Kind::Angular(_) => positives > 0 && negatives > 0,
        Kind::ThresholdConsistentMargin(_) => positives + negatives > 0,
        Kind::Histogram(_) | Kind::DynamicSoftMargin(_) => has_triplet(job),
        Kind::Pnp(_) | Kind::NPairs(_) => positives > 0,
        Kind::SupCon(_) | Kind::LiftedStructure(_) | Kind::TupletMargin(_) => {
            !few && positives > 0 && negatives > 0
        }
        _ => !few,
    };
    ((positives, negatives), has)
}

/// NPairs' pairs of the queries' `labels` (as PML's `convert_to_pos_pairs_with_unique_labels`
/// picks them: each label's first row with its second): every pair's second row, and per
/// query its second row when it is a pair's first.
fn n_pairs_of(labels: &[u32]) -> (Vec<u32>, Vec<Option<u32>>) {
    let mut first: std::collections::HashMap<u32, (usize, Option<u32>)> = Default::default();
    for (i, &l) in labels.iter().enumerate() {
        let entry = first.entry(l).or_insert((i, None));
        if entry.0 != i && entry.1.is_none() {
            entry.1 = Some(i as u32);
        }
    }
    let mut targets = vec![None; labels.len()];
    let mut columns = Vec::new();
    for &(a, second) in first.values() {
        if let Some(p) = second {
            targets[a] = Some(p);
            columns.push(p);
        }
    }
    columns.sort_unstable();
    (columns, targets)
}

/// NPairs with references (its pairs gathered, [`n_pairs`]): every reference a column, each
/// query's target the reference of its label.
fn n_pairs_against(labels: &[u32], ref_labels: &[u32]) -> (Vec<u32>, Vec<Option<u32>>) {
    let mut at: std::collections::HashMap<u32, u32> = Default::default();
    for (j, &l) in ref_labels.iter().enumerate() {
        at.entry(l).or_insert(j as u32);
    }
    let targets = labels.iter().map(|l| at.get(l).copied()).collect();
    ((0..ref_labels.len() as u32).collect(), targets)
}

/// NPairs on host rows: its pairs' rows gathered (each label's first row, as queries, and
/// its second, as references; `2 k` rows, held in the budget) and the cross entropy run on
/// that `(k, k)` problem alone, the gradients put back on their rows. PML's matrix is that
/// `(k, k)` one: running the whole `(b, b)` one would cost `(b / k)²` times more.
/// Device-resident rows run the whole batch instead.
fn n_pairs<R: PairLossRule>(
    ctx: &Context,
    job: &Job<'_>,
    cfg: &PairLossConfig<R>,
) -> Result<PairLoss> {
    let kind = cfg.rule.kind();
    let (Some(Rows::Host(x)), true) = (job.set.queries.as_ref(), job.refs_are_queries) else {
        return run(ctx, job, kind, &[]);
    };
    let (_, targets) = n_pairs_of(&job.set.labels);
    let (firsts, seconds): (Vec<usize>, Vec<usize>) = (targets.iter().enumerate())
        .filter_map(|(a, t)| Some((a, (*t)? as usize)))
        .unzip();
    let (k, (b, d)) = (firsts.len(), x.dim());
    if k == 0 {
        return run(ctx, job, kind, &[]);
    }
    // The gathered rows, the sub-problem's two gradients, the batch's gradient, the indices.
    // Where they do not fit (most labels in pairs under a tight budget), the whole batch runs
    // as its plan says.
    let bytes = 4 * (4 * k * d + b * d) as u64 + 24 * (b + k) as u64;
    let Ok(_held) = HostReservation::new(SCRATCH, bytes, ctx.tracker()) else {
        return run(ctx, job, kind, &[]);
    };
    let (xf, xs) = (x.select(Axis(0), &firsts), x.select(Axis(0), &seconds));
    let ids = Array1::from_iter(0..k as u32);
    let sub_cfg = PairLossConfig {
        rule: cfg.rule,
        distance: cfg.distance,
        self_exclusion: SelfExclusion::None,
        ref_grad: true,
        hooks: cfg.hooks.clone(),
    };
    let (sub_q, sub_r) = (MiningSet::new(&xf, &ids), MiningSet::new(&xs, &ids));
    let mut imports = Imports::call();
    let sub = match self::job(ctx, (&sub_q, Some(&sub_r)), &sub_cfg, &mut imports, |sub| {
        run(ctx, sub, kind, &[])
    }) {
        Err(Error::OverBudget { .. } | Error::BudgetExceeded { .. }) => {
            drop((_held, xf, xs));
            return run(ctx, job, kind, &[]);
        }
        other => other?,
    };
    let mut query_grad = Array2::zeros((b, d));
    for (i, &a) in firsts.iter().enumerate() {
        query_grad.row_mut(a).assign(&sub.query_grad.row(i));
    }
    if let Some(g) = &sub.ref_grad {
        for (i, &p) in seconds.iter().enumerate() {
            let mut row = query_grad.row_mut(p);
            row += &g.row(i);
        }
    }
    let (positive_pairs, negative_pairs) = pair_counts(job.set);
    let mut transfers = sub.transfers;
    transfers.add(job.set.imported);
    Ok(PairLoss {
        positive_pairs,
        negative_pairs,
        query_grad,
        ref_grad: None,
        transfers,
        ..sub
    })
}

/// Anchor `a`'s own reference slot where it is one of its label's (a slot of another label
/// stays a negative, as in its lists).
fn own_slot(set: &Labelled<'_>, a: usize) -> Option<u32> {
    let slot = set.self_slots[a];
    let same = slot != NO_SLOT && set.ref_labels.get(slot as usize) == Some(&set.labels[a]);
    same.then_some(slot)
}

/// Runs the loss: zeros where PML returns none, else the driver (twice for Contrastive);
/// `ranks` are Instance's target columns per query ([`ranks`]), empty for the others.
fn run(ctx: &Context, job: &Job<'_>, kind: Kind, ranks: &[u32]) -> Result<PairLoss> {
    let ((positive_pairs, negative_pairs), has) = has_loss(job, kind);
    let learn_beta = matches!(kind, Kind::Margin(c) if c.learn_beta);
    if !has {
        let beta_grad = learn_beta.then_some(0.0);
        return no_loss(ctx, job, (positive_pairs, negative_pairs), beta_grad);
    }
    let similarity = job.distance.distance.is_similarity();
    let histogram_max = match job.distance.distance {
        Distance::SquaredEuclidean => 4.0,
        _ => 2.0,
    };
    let (set, refs_are_queries) = (job.set, job.refs_are_queries);
    // What a per-anchor rule keeps for the call (NPairs' pairs); the global rules hold theirs.
    let kept = if is_global(kind) {
        0
    } else {
        state_bytes(kind, set.labels.len())
    };
    let _state = HostReservation::new(STATE, kept, ctx.tracker())?;
    let (columns, targets) = match kind {
        Kind::NPairs(_) if refs_are_queries => n_pairs_of(&set.labels),
        Kind::NPairs(_) => n_pairs_against(&set.labels, &set.ref_labels),
        Kind::Instance(_) => (
            (0..set.ref_labels.len() as u32).collect(),
            ranks.iter().map(|&r| Some(r)).collect(),
        ),
        _ => (Vec::new(), Vec::new()),
    };
    let (columns, targets) = (&columns, &targets);
    let rule = |divisors: (u64, u64)| {
        move |a: usize, d: ArrayView1<'_, f32>, s: &mut Scratch, _: &Shared<'_>| {
            s.lists(set, a);
            let row = Row {
                d,
                similarity,
                divisors,
                histogram_max,
                own: refs_are_queries.then_some(a as u32),
                skip: own_slot(set, a),
                pairs: targets
                    .get(a)
                    .copied()
                    .flatten()
                    .map(|t| (columns.as_slice(), t)),
            };
            anchor(kind, &row, s)
        }
    };
    let native = || match kind {
        _ if is_global(kind) => {
            let (loss, nonzero, mut out) = pair_global::run(ctx, job, kind)?;
            out.totals.count = nonzero;
            Ok((loss, None, out))
        }
        Kind::Contrastive(_) | Kind::SnrContrastive(_) => {
            // The counting pass, then the weights divided by its counts.
            let then = |t: Totals| -> Box<AnchorRule<'_>> { Box::new(rule((t.count, t.items))) };
            let (_, mut out) = driver::run_after(ctx, job, Some(&rule((0, 0))), &then, Mode::Sum)?;
            out.totals.count += out.totals.items;
            Ok((out.totals.loss, None, out))
        }
        Kind::Margin(c) => {
            let out = driver::run(ctx, job, &rule((0, 0)))?;
            let t = out.totals;
            // PML returns no loss (nor β's regulariser) without a triplet.
            let (loss, beta_grad) = match (t.items, t.count) {
                (0, _) => (0.0, 0.0),
                (_, 0) => (0.0, 0.0),
                (_, count) => (t.loss / count as f64, t.aux / count as f64),
            };
            let reg = learn_beta && t.items > 0;
            let (nu, beta) = (f64::from(c.nu), f64::from(c.beta));
            let loss = loss + if reg { nu * beta } else { 0.0 };
            let beta_grad = beta_grad + if reg { nu } else { 0.0 };
            Ok((loss, learn_beta.then_some(beta_grad as f32), out))
        }
        _ => {
            let out = driver::run(ctx, job, &rule((0, 0)))?;
            // PNP's Dq is 1 − the mean (its rule's sums negated).
            let dq = matches!(kind, Kind::Pnp(c) if c.variant == PnpVariant::Dq);
            let shift = if dq { 1.0 } else { 0.0 };
            Ok((shift + f64::from(out.totals.mean()), None, out))
        }
    };
    // On the device where the rule has a device path and the call fits it, else natively.
    let (out, mut transfers) = transfer::measure(|| {
        let on_device = match (ctx.gpu(), kind) {
            (Some(gpu), Kind::Instance(c)) => {
                pair_device::instance((ctx, gpu), job, ranks, c.gamma)?
            }
            (Some(gpu), _) => pair_device::run(ctx, gpu, job, kind)?,
            (None, _) => None,
        };
        match on_device {
            Some(found) => Ok((found, ComputePath::Wgpu)),
            None => native().map(|found| (found, ComputePath::NativeCpu)),
        }
    });
    transfers.add(job.set.imported);
    let ((loss, beta_grad, out), path) = out?;
    Ok(PairLoss {
        loss: loss as f32,
        nonzero: out.totals.count,
        positive_pairs,
        negative_pairs,
        query_grad: out.query_grad,
        ref_grad: out.ref_grad,
        beta_grad,
        path,
        transfers,
    })
}
