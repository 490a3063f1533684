//! The device path of the pair losses ([`super::pair`]): the rules `pair_weights` runs
//! (Contrastive, MultiSimilarity, SupCon, Circle, NCA, GeneralizedLifted, Margin, FastAP,
//! ThresholdConsistentMargin, RankedList and IntraPairVariance; LiftedStructure and Histogram
//! with the queries as references; InstanceLoss's relabelled batch through the classifier
//! losses' `SOFTMAX` rule), each call through the losses' device loop ([`super::gpu`]:
//! distance tiles, the weights kernel, the two gradient products, one submission per pass),
//! and the anchors' words combined on the host into PML's reducers, in f64.
//!
//! Contrastive and TCM divide by counts over every anchor: a first pass counts them (words
//! only: no weights, no products), the second takes the weights already divided, as the
//! native path's two passes do. Lifted and Histogram gather every row's `log S` or
//! histograms first, IntraPairVariance its means in two passes. The others take one pass. A
//! call the device loop does not take (references past one page, buffers past the budget)
//! runs natively.

use ndarray::Array1;

use super::driver::{Job, Output};
use super::gpu::{self, PairRule, Raw, Rule};
use super::pair_global::{variance_gaps, with_positive};
use super::pair_params::{IntraPairVariance, Kind};
use super::scratch::Totals;
use crate::context::plan::Plan;
use crate::context::Context;
use crate::data::device_rows::Rows;
use crate::data::inputs::{self, Imports, MiningSet, SelfExclusion};
use crate::error::{Error, Result};
use crate::kernels::pair_weights::{code, MAX_EDGES, WORDS};
use crate::metric::Distance;
use crate::runtime::device::GpuDevice;
use crate::runtime::memory::HostReservation;

/// The loss, `∂loss/∂β` (Margin with a learnt β) and the gradients: what [`super::pair`]'s
/// native arms give.
pub(super) type Found = (f64, Option<f32>, Output);

/// The device rule of `kind` on `job` (its first pass's), or `None` where the rule has no
/// device path: the rules outside the module docs' list, SNR's distance, and FastAP past
/// `MAX_EDGES − 1` bins.
pub(super) fn rule(kind: Kind, job: &Job<'_>) -> Option<PairRule> {
    if job.snr.is_some() || job.ref_pairs {
        return None;
    }
    let (code, params, edges) = match kind {
        Kind::Contrastive(c) => (code::CONTRASTIVE, pad(&[c.pos_margin, c.neg_margin]), 0),
        Kind::MultiSimilarity(c) => (code::MULTI_SIMILARITY, pad(&[c.alpha, c.beta, c.base]), 0),
        Kind::SupCon(c) => (code::SUPCON, pad(&[c.temperature]), 0),
        Kind::Circle(c) => (code::CIRCLE, pad(&[c.m, c.gamma]), 0),
        Kind::Nca(c) => (code::NCA, pad(&[c.softmax_scale]), 0),
        Kind::GeneralizedLifted(c) => (
            code::GENERALIZED_LIFTED,
            pad(&[c.pos_margin, c.neg_margin]),
            0,
        ),
        Kind::Margin(c) => (code::MARGIN, pad(&[c.margin, c.beta]), 0),
        Kind::FastAp(c) if c.num_bins < MAX_EDGES => {
            // The bins' width over [0, 2] (Euclidean) or [0, 4] (squared), as natively.
            let max = match job.distance.distance {
                Distance::SquaredEuclidean => 4.0,
                _ => 2.0,
            };
            let delta = (max / f64::from(c.num_bins)) as f32;
            (code::FAST_AP, pad(&[delta]), c.num_bins + 1)
        }
        Kind::ThresholdConsistentMargin(c) => (
            code::THRESHOLD_CONSISTENT,
            pad(&[c.margin_plus, c.margin_minus]),
            0,
        ),
        // Their second passes read every query row's first-pass result by reference: with
        // the queries as references only.
        Kind::LiftedStructure(c) if job.refs_are_queries => {
            (code::LIFTED, pad(&[c.pos_margin, c.neg_margin]), 0)
        }
        Kind::RankedList(c) => {
            // The boundaries as natively: alpha (default 1 + margin / 2) and alpha - margin.
            let margin = f64::from(c.margin);
            let alpha = c.alpha.map_or(1.0 + margin / 2.0, f64::from);
            let (boundary, floor) = ((alpha - margin) as f32, alpha as f32);
            (
                code::RANKED_LIST,
                pad(&[boundary, floor, c.tp, c.tn, c.imbalance]),
                0,
            )
        }
        Kind::IntraPairVariance(_) => (code::INTRA_PAIR_VARIANCE, pad(&[]), 0),
        Kind::Histogram(c) if job.refs_are_queries && c.n_bins < MAX_EDGES => {
            let delta = (2.0 / f64::from(c.n_bins)) as f32;
            (code::HISTOGRAM, pad(&[delta]), c.n_bins + 1)
        }
        _ => return None,
    };
    let forward = matches!(
        kind,
        Kind::Contrastive(_)
            | Kind::ThresholdConsistentMargin(_)
            | Kind::LiftedStructure(_)
            | Kind::Histogram(_)
            | Kind::IntraPairVariance(_)
    );
    let stride = match kind {
        Kind::Histogram(_) => WORDS + 2 * edges as usize,
        _ => WORDS,
    };
    // The state's room (filled by each pass), so that plans count it.
    let b = job.set.labels.len();
    let state = match kind {
        Kind::LiftedStructure(_) => vec![0; b],
        Kind::Histogram(_) => vec![0; 2 * edges as usize + b],
        _ => Vec::new(),
    };
    Some(PairRule {
        code,
        params,
        edges,
        forward,
        state,
        stride,
    })
}

/// InstanceLoss on `gpu`: [`instance_job`]'s relabelled batch through the `SOFTMAX` rule,
/// the two roles' gradients added. `None` where the native path runs.
///
/// # Errors
/// As [`gpu::run_raw`].
pub(super) fn instance(
    (ctx, gpu): (&Context, &GpuDevice),
    job: &Job<'_>,
    ranks: &[u32],
    gamma: f32,
) -> Result<Option<Found>> {
    instance_job(ctx, job, (ranks, gamma), Imports::call(), |sub, rule| {
        let Some(raw) = gpu::run_raw(ctx, gpu, sub, &Rule::Pair(rule))? else {
            return Ok(None);
        };
        let (loss, beta_grad, mut out) = mean_of(ctx, sub, raw)?;
        if let Some(g) = out.ref_grad.take() {
            out.query_grad += &g;
        }
        Ok(Some((loss, beta_grad, out)))
    })
}

/// The device plan of [`instance`], or `None` where the native path would run.
///
/// # Errors
/// As [`gpu::plan`].
pub(super) fn instance_plan(
    (ctx, gpu): (&Context, &GpuDevice),
    job: &Job<'_>,
    gamma: f32,
) -> Result<Option<Plan>> {
    // The plan's sizes do not depend on the labels' values.
    let ranks = vec![0; job.set.labels.len()];
    let labels = 8 * ranks.len() as u64;
    instance_job(ctx, job, (&ranks, gamma), Imports::plan(), |sub, rule| {
        // The relabelled sides' labels are held beside the device loop.
        Ok(
            gpu::plan(ctx, gpu, sub, &Rule::Pair(rule))?.map(|mut plan| {
                plan.bytes += labels;
                plan.min_bytes += labels;
                plan
            }),
        )
    })
}

/// InstanceLoss's batch as the pair losses' device loop takes it, handed to `f` with the
/// `SOFTMAX` rule (scale `γ`, no margin): the rows against themselves, each row labelled by
/// its label's rank and each column by its index, so that a row's one positive is its target
/// column and every column (its own too) is a logit, as PML's `(b, b)` cross entropy has it.
/// `None` for device-resident rows or a distance that is not a similarity.
fn instance_job<T>(
    ctx: &Context,
    job: &Job<'_>,
    (ranks, gamma): (&[u32], f32),
    mut imports: Imports,
    f: impl FnOnce(&Job<'_>, PairRule) -> Result<Option<T>>,
) -> Result<Option<T>> {
    let (Some(Rows::Host(x)), true) = (
        job.set.queries.as_ref(),
        job.distance.distance.is_similarity(),
    ) else {
        return Ok(None);
    };
    let b = x.nrows();
    let Ok(_labels) = HostReservation::new(job.label, 8 * b as u64, ctx.tracker()) else {
        return Ok(None);
    };
    let rows = Array1::from(ranks.to_vec());
    let columns: Array1<u32> = (0..b as u32).collect();
    let (queries, refs) = (
        MiningSet::new(*x, rows.view()),
        MiningSet::new(*x, columns.view()),
    );
    let none = &SelfExclusion::None;
    let set = inputs::prepare(
        job.op,
        ctx,
        &queries,
        Some(&refs),
        none,
        true,
        |_| Ok(true),
        &mut imports,
    )?;
    let sub = Job {
        op: job.op,
        label: job.label,
        set: &set,
        refs_are_queries: false,
        distance: job.distance,
        ref_grad: true,
        ref_pairs: false,
        snr: None,
        hooks: job.hooks,
    };
    let rule = PairRule {
        code: code::SOFTMAX,
        params: pad(&[gamma]),
        edges: 0,
        forward: false,
        state: Vec::new(),
        stride: WORDS,
    };
    f(&sub, rule)
}

/// `head` followed by zeros: a rule's parameters as the kernel takes them.
pub(super) fn pad(head: &[f32]) -> [f32; 8] {
    let mut all = [0.0; 8];
    all[..head.len()].copy_from_slice(head);
    all
}

/// One anchor's words: three f32, four counts.
struct Words {
    floats: [f64; 3],
    counts: [u64; 4],
}

/// Every anchor's [`Words`] (of `stride` words each); an error where an anchor's eighth word
/// is not the zero the kernel writes (the sentinel: an anchor it never reached).
fn words(op: &'static str, raw: &Raw, stride: usize) -> Result<Vec<Words>> {
    raw.words
        .chunks_exact(stride)
        .map(|w| match w[7] {
            0 => Ok(Words {
                floats: [0, 1, 2].map(|i| f64::from(f32::from_bits(w[i]))),
                counts: [3, 4, 5, 6].map(|i| u64::from(w[i])),
            }),
            _ => Err(Error::Internal {
                op,
                message: "pair_weights left an anchor's words unwritten".into(),
            }),
        })
        .collect()
}

/// `1 / count` as the gradients' factor; 0 over nothing.
fn share(count: u64) -> f64 {
    if count == 0 {
        0.0
    } else {
        1.0 / count as f64
    }
}

/// The mean of the anchors' losses (word 0) over what they count (count 0), the gradients
/// divided by it: the rules whose reducer is a mean over anchors or pairs.
pub(super) fn mean_of(ctx: &Context, job: &Job<'_>, raw: Raw) -> Result<Found> {
    let mut t = Totals::default();
    for w in words(job.op, &raw, WORDS)? {
        t.loss += w.floats[0];
        t.count += w.counts[0];
        t.items += w.counts[1];
    }
    let loss = f64::from(t.mean());
    let out = gpu::finish(ctx, job, raw, t, share(t.count) as f32)?;
    Ok((loss, None, out))
}

/// The rule's own `(loss, divisor)`, the gradients as the weights give them (the rule divided
/// already).
fn summed(ctx: &Context, job: &Job<'_>, raw: Raw, (loss, count): (f64, u64)) -> Result<Found> {
    let totals = Totals {
        loss,
        count,
        items: 0,
        aux: 0.0,
    };
    let out = gpu::finish(ctx, job, raw, totals, 1.0)?;
    Ok((loss, None, out))
}

/// `kind` on `gpu`, or `None` where it has no device rule or the device loop does not take the
/// call (the caller then runs the native path). Called where PML computes a loss.
///
/// # Errors
/// As [`gpu::run_raw`].
pub(super) fn run(
    ctx: &Context,
    gpu: &GpuDevice,
    job: &Job<'_>,
    kind: Kind,
) -> Result<Option<Found>> {
    let Some(first) = rule(kind, job) else {
        return Ok(None);
    };
    // No reference: nothing for the device (RankedList still counts every anchor natively).
    if job.set.ref_labels.is_empty() {
        return Ok(None);
    }
    let op = job.op;
    let pass = |rule: &PairRule| gpu::run_raw(ctx, gpu, job, &Rule::Pair(rule.clone()));
    match kind {
        Kind::Contrastive(_) | Kind::ThresholdConsistentMargin(_) => {
            let Some(counted) = pass(&first)? else {
                return Ok(None);
            };
            let (cp, cn) = words(op, &counted, WORDS)?
                .iter()
                .fold((0, 0), |(p, n), w| (p + w.counts[0], n + w.counts[1]));
            drop(counted);
            // Each group's mean over its nonzero pairs; TCM's weighted by its λs.
            let (lp, ln) = match kind {
                Kind::ThresholdConsistentMargin(c) => {
                    (f64::from(c.lambda_plus), f64::from(c.lambda_minus))
                }
                _ => (1.0, 1.0),
            };
            let (on_pos, on_neg) = (lp * share(cp), ln * share(cn));
            let [p0, p1, ..] = first.params;
            let second = PairRule {
                params: pad(&[p0, p1, on_pos as f32, on_neg as f32]),
                forward: false,
                ..first.clone()
            };
            let Some(raw) = pass(&second)? else {
                return Ok(None);
            };
            let loss: f64 = words(op, &raw, WORDS)?
                .iter()
                .map(|w| on_pos * w.floats[0] + on_neg * w.floats[1])
                .sum();
            summed(ctx, job, raw, (loss, cp + cn)).map(Some)
        }
        Kind::LiftedStructure(_) => lifted(ctx, gpu, job, first),
        Kind::Histogram(c) => histogram(ctx, gpu, job, first, c.n_bins),
        Kind::IntraPairVariance(c) => intra_pair_variance(ctx, gpu, job, first, c),
        Kind::Margin(c) => {
            let Some(raw) = pass(&first)? else {
                return Ok(None);
            };
            let first_slope = if job.distance.distance.is_similarity() {
                -1.0
            } else {
                1.0
            };
            // Each term counts once per pair of the other side (the rule's docs).
            let mut t = Totals::default();
            for w in words(op, &raw, WORDS)? {
                let [cp, cn, np, nn] = w.counts;
                t.loss += nn as f64 * w.floats[0] + np as f64 * w.floats[1];
                t.count += cp * nn + cn * np;
                t.items += np * nn;
                t.aux += first_slope * ((np * cn) as f64 - (nn * cp) as f64);
            }
            // PML returns no loss (nor β's regulariser) without a triplet.
            let (loss, beta_grad) = match (t.items, t.count) {
                (0, _) | (_, 0) => (0.0, 0.0),
                (_, count) => (t.loss / count as f64, t.aux / count as f64),
            };
            let reg = c.learn_beta && t.items > 0;
            let (nu, beta) = (f64::from(c.nu), f64::from(c.beta));
            let loss = loss + if reg { nu * beta } else { 0.0 };
            let beta_grad = beta_grad + if reg { nu } else { 0.0 };
            let factor = share(t.count) as f32;
            let out = gpu::finish(ctx, job, raw, t, factor)?;
            Ok(Some((loss, c.learn_beta.then_some(beta_grad as f32), out)))
        }
        _ => {
            // The mean over the anchors the rule counts.
            let Some(raw) = pass(&first)? else {
                return Ok(None);
            };
            mean_of(ctx, job, raw).map(Some)
        }
    }
}

/// Lifted on the device: the first pass gives every row its `log S` (the kernel's words), the
/// second reads them back by row and takes the mean over the positive pairs.
fn lifted(ctx: &Context, gpu: &GpuDevice, job: &Job<'_>, first: PairRule) -> Result<Option<Found>> {
    let Some(logs) = gpu::run_raw(ctx, gpu, job, &Rule::Pair(first.clone()))? else {
        return Ok(None);
    };
    // Each row's log S, as the kernel wrote it (f32, so back without rounding).
    let state = words(job.op, &logs, WORDS)?
        .iter()
        .map(|w| (w.floats[0] as f32).to_bits())
        .collect();
    drop(logs);
    let second = PairRule {
        forward: false,
        state,
        ..first
    };
    let Some(raw) = gpu::run_raw(ctx, gpu, job, &Rule::Pair(second))? else {
        return Ok(None);
    };
    mean_of(ctx, job, raw).map(Some)
}

/// Histogram on the device: the first pass gives every anchor its share of both histograms
/// (its pairs with later rows), added here in f64; the loss and its derivative by node are
/// PML's (as natively), and the second pass gives each pair the slope between its nodes.
fn histogram(
    ctx: &Context,
    gpu: &GpuDevice,
    job: &Job<'_>,
    first: PairRule,
    n_bins: u32,
) -> Result<Option<Found>> {
    let (op, set) = (job.op, job.set);
    let edges = n_bins as usize + 1;
    // Each row's flag: its class has a positive (PML keeps a negative pair with such a side).
    let flags = with_positive(&set.labels).into_iter().map(u32::from);
    let state = |front: Vec<u32>| front.into_iter().chain(flags.clone()).collect();
    let pass1 = PairRule {
        state: state(vec![0; 2 * edges]),
        ..first.clone()
    };
    let Some(binned) = gpu::run_raw(ctx, gpu, job, &Rule::Pair(pass1))? else {
        return Ok(None);
    };
    let (mut pos, mut neg) = (vec![0.0f64; edges], vec![0.0f64; edges]);
    let (mut np, mut nn) = (0u64, 0u64);
    for (w, anchor) in words(op, &binned, first.stride)?
        .iter()
        .zip(binned.words.chunks_exact(first.stride))
    {
        np += w.counts[0];
        nn += w.counts[1];
        for (c, node) in anchor[WORDS..].chunks_exact(2).enumerate() {
            pos[c] += f64::from(f32::from_bits(node[0]));
            neg[c] += f64::from(f32::from_bits(node[1]));
        }
    }
    drop(binned);
    let (kp, kn) = (np.max(1) as f64, nn.max(1) as f64);
    // φ = cumsum(h⁺); loss = Σ h⁻ φ; ∂/∂h⁺_c = Σ_{b ≥ c} h⁻_b, ∂/∂h⁻_b = φ_b.
    let phi: Vec<f64> = pos
        .iter()
        .scan(0.0, |acc, p| {
            *acc += p / kp;
            Some(*acc)
        })
        .collect();
    let loss: f64 = neg.iter().zip(&phi).map(|(n, f)| n / kn * f).sum();
    let mut g_pos: Vec<f64> = neg
        .iter()
        .rev()
        .scan(0.0, |acc, n| {
            *acc += n / kn;
            Some(*acc)
        })
        .collect();
    g_pos.reverse();
    let delta = 2.0 / f64::from(n_bins);
    let slopes = |g: &[f64], count: f64| -> Vec<u32> {
        g.iter()
            .map(|v| ((v / delta / count) as f32).to_bits())
            .collect()
    };
    let front = [slopes(&g_pos, kp), slopes(&phi, kn)].concat();
    let pass2 = PairRule {
        forward: false,
        state: state(front),
        stride: WORDS,
        ..first
    };
    let Some(raw) = gpu::run_raw(ctx, gpu, job, &Rule::Pair(pass2))? else {
        return Ok(None);
    };
    summed(ctx, job, raw, (loss, np + nn)).map(Some)
}

/// IntraPairVariance on the device, as natively: a pass for each group's mean distance `μ`,
/// one for the mean of its hinges `relu(a D + b μ)`, and the last for the squares and the
/// weights `(2 / K) (a r + b R / K)`.
fn intra_pair_variance(
    ctx: &Context,
    gpu: &GpuDevice,
    job: &Job<'_>,
    first: PairRule,
    c: IntraPairVariance,
) -> Result<Option<Found>> {
    let op = job.op;
    // Each group's sums and pairs over every anchor.
    let sums = |raw: &Raw| -> Result<([f64; 2], [u64; 2])> {
        let all = words(op, raw, WORDS)?;
        Ok(all.iter().fold(([0.0; 2], [0; 2]), |(s, n), w| {
            (
                [s[0] + w.floats[0], s[1] + w.floats[1]],
                [n[0] + w.counts[0], n[1] + w.counts[1]],
            )
        }))
    };
    let mean = |sum: f64, n: u64| if n == 0 { 0.0 } else { sum / n as f64 };
    let Some(raw) = gpu::run_raw(ctx, gpu, job, &Rule::Pair(first.clone()))? else {
        return Ok(None);
    };
    let (d_sums, [np, nn]) = sums(&raw)?;
    // Each pass's words (and the host memory its call holds) go before the next pass plans.
    drop(raw);
    let gaps = variance_gaps(c, job.distance.distance.is_similarity());
    let mu = [mean(d_sums[0], np), mean(d_sums[1], nn)];
    let hinges = [
        gaps[0].0 as f32,
        (gaps[0].1 * mu[0]) as f32,
        gaps[1].0 as f32,
        (gaps[1].1 * mu[1]) as f32,
    ];
    let pass = |edges: u32, forward: bool, tail: [f64; 4]| PairRule {
        params: pad(&[hinges.as_slice(), &tail.map(|v| v as f32)].concat()),
        edges,
        forward,
        ..first.clone()
    };
    let Some(raw) = gpu::run_raw(ctx, gpu, job, &Rule::Pair(pass(1, true, [0.0; 4])))? else {
        return Ok(None);
    };
    let (r_sums, _) = sums(&raw)?;
    drop(raw);
    let (rp, rn) = (mean(r_sums[0], np), mean(r_sums[1], nn));
    let two = |n: u64| if n == 0 { 0.0 } else { 2.0 / n as f64 };
    let tail = [two(np), two(nn), gaps[0].1 * rp, gaps[1].1 * rn];
    let Some(raw) = gpu::run_raw(ctx, gpu, job, &Rule::Pair(pass(2, false, tail)))? else {
        return Ok(None);
    };
    let (squares, _) = sums(&raw)?;
    let loss = mean(squares[0], np) + mean(squares[1], nn);
    summed(ctx, job, raw, (loss, np + nn)).map(Some)
}
