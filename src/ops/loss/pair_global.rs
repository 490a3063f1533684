//! The pair losses whose anchors share state, each run as more than one pass of the driver
//! (forward passes gather what every anchor's weights need, the last takes the gradient):
//! - **LiftedStructure**: per positive pair `(a, p)`, `relu(log(S_a + S_p) + margin(D_ap,
//!   pos_margin))² / 2` with `S_i = Σ_{N(i)} e^{margin(neg_margin, D_in)}` over row `i`'s
//!   negatives, averaged over every positive pair. As PML, `p` names a query row (`S_p` is
//!   row `p`'s, when `p` is a query other than `a`), also against references. Pass 1 stores
//!   every row's `log S_i`; with references pass 2 gathers per row
//!   `c_i = Σ relu(t) S_i / (S_a + S_p)` over the positive pairs that row `i` is either side
//!   of (without, the pairs come both ways and row `i`'s own pairs give it, twice); the last
//!   pass gives a negative `n` of row `i` the weight `c_i e^{margin(neg_margin, D_in)} / S_i`.
//!   PML forms a `(positive pairs, negative pairs)` mask.
//! - **Histogram** (cosine, no references): the distinct unordered positive and negative pairs
//!   of PML's triplets (negative pairs with a side that has a positive) soft-binned into
//!   `n_bins + 1` nodes over `[−1, 1]`, each histogram divided by its pair count; the loss is
//!   `Σ_b h⁻_b Σ_{c ≤ b} h⁺_c`. Pass 1 fills both histograms, pass 2 gives each pair the slope
//!   of the loss between its two nodes. A similarity of exactly 1 (PML: an index error) falls
//!   in the top bin.
//! - **IntraPairVariance**: over the positive pairs, `mean(relu(±(s − (1 ∓ ε) μ))²)` with `μ`
//!   the positive pairs' mean (its gradient included), the same over the negative pairs, the
//!   two added. Pass 1 takes the means, pass 2 the sums of `relu`, pass 3 the gradient; on
//!   cosine or dot product one pass ([`super::pair_global_linear`]: the means from class
//!   sums of the rows).
//! - **ThresholdConsistentMargin** (cosine): `λ⁺ mean(m⁺ − s)` over the positive pairs with
//!   `s ≤ m⁺` plus `λ⁻ mean(s − m⁻)` over the negative pairs with `s ≥ m⁻`. Pass 1 counts
//!   both groups, pass 2 takes the weights already divided.
//!
//! What a pass keeps between anchors is `O(b)` (LiftedStructure) or `O(b + n_bins)`
//! (Histogram), held in the budget beside the driver's blocks. Histogram's sums (and
//! Lifted's coefficients against references) are added in the order the threads reach
//! them: runs can differ in the last bits.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use ndarray::ArrayView1;

use super::driver::{self, Job, Mode, Output};
use super::pair_global_linear;
use super::pair_params::{
    Histogram, IntraPairVariance, Kind, LiftedStructure, ThresholdConsistentMargin,
};
use super::pair_rules::{exps, margin};
use super::scratch::{Scratch, Shared, Totals};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::runtime::memory::HostReservation;

/// The label of the state a call keeps between passes.
pub(super) const STATE: &str = "pair loss state between passes";

/// The loss, what its mean divides by, and the gradients.
pub(super) type Outcome = (f64, u64, Output);

/// Whether `kind` is one of this module's losses.
pub(super) fn is_global(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::LiftedStructure(_)
            | Kind::Histogram(_)
            | Kind::IntraPairVariance(_)
            | Kind::ThresholdConsistentMargin(_)
    )
}

/// Bytes `kind` keeps between passes for `b` queries: what the budget holds beside the
/// driver's blocks.
pub(super) fn state_bytes(kind: Kind, b: usize) -> u64 {
    match kind {
        Kind::LiftedStructure(_) => 16 * b as u64,
        // Two histograms and their two gradients, f64; the per-query flags and class counts.
        Kind::Histogram(c) => 32 * (u64::from(c.n_bins) + 1) + 25 * b as u64,
        // NPairs' targets, columns and the labels' first rows.
        Kind::NPairs(_) => 40 * b as u64,
        // Instance's columns and targets, and its ranks (or, before, the ranks and a sorted
        // copy of labels of up to 24 bytes).
        Kind::Instance(_) => 28 * b as u64,
        _ => 0,
    }
}

/// Runs `kind` (one of [`is_global`]'s) over `job`, its state held in the budget.
///
/// # Errors
/// As the driver's; [`Error::OverBudget`] when the state does not fit.
pub(super) fn run(ctx: &Context, job: &Job<'_>, kind: Kind) -> Result<Outcome> {
    let b = job.set.labels.len();
    let _state = HostReservation::new(STATE, state_bytes(kind, b), ctx.tracker())?;
    let sim = job.distance.distance.is_similarity();
    match kind {
        Kind::LiftedStructure(c) => lifted(ctx, job, c, sim),
        Kind::Histogram(c) => histogram(ctx, job, c),
        Kind::IntraPairVariance(c) => intra_pair_variance(ctx, job, c, sim),
        Kind::ThresholdConsistentMargin(c) => tcm(ctx, job, c),
        _ => Err(Error::Internal {
            op: job.op,
            message: "a per-anchor pair loss reached the passes of the global ones".into(),
        }),
    }
}

/// f64 values shared by the threads of a pass: each anchor sets its own and adds to others'.
struct SharedF64s(Vec<AtomicU64>);

impl SharedF64s {
    fn new(n: usize, value: f64) -> Self {
        Self((0..n).map(|_| AtomicU64::new(value.to_bits())).collect())
    }

    fn get(&self, i: usize) -> f64 {
        f64::from_bits(self.0[i].load(Ordering::Relaxed))
    }

    fn set(&self, i: usize, value: f64) {
        self.0[i].store(value.to_bits(), Ordering::Relaxed);
    }

    fn add(&self, i: usize, value: f64) {
        let add = |bits: u64| Some((f64::from_bits(bits) + value).to_bits());
        // The closure never refuses, so the update always lands.
        let _ = self.0[i].fetch_update(Ordering::Relaxed, Ordering::Relaxed, add);
    }
}

/// The driver's rule `|anchor, distances, scratch| body` of `job`, the anchor's lists filled.
macro_rules! with_lists {
    ($job:expr, |$a:pat_param, $d:ident, $s:ident| $body:expr) => {
        |a: usize, $d: ArrayView1<'_, f32>, $s: &mut Scratch, _: &Shared<'_>| -> Totals {
            $s.lists($job.set, a);
            let $a = a;
            $body
        }
    };
}

/// `log(e^x + e^y)`; −∞ when both are.
fn log_add(x: f64, y: f64) -> f64 {
    let top = x.max(y);
    if top == f64::NEG_INFINITY {
        return top;
    }
    top + ((x - top).exp() + (y - top).exp()).ln()
}

fn lifted(ctx: &Context, job: &Job<'_>, c: LiftedStructure, sim: bool) -> Result<Outcome> {
    let (pm, nm) = (f64::from(c.pos_margin), f64::from(c.neg_margin));
    let first = if sim { -1.0 } else { 1.0 };
    let b = job.set.labels.len();
    let logs = SharedF64s::new(b, f64::NEG_INFINITY);
    let coef = SharedF64s::new(b, 0.0);
    let xn = move |d: f32| margin(sim, nm, f64::from(d));
    let pass1 = with_lists!(job, |a, d, s| {
        let x = |n: u32| xn(d[n as usize]);
        logs.set(
            a,
            exps(s.negatives.iter().copied(), x, false, &mut s.weights).0,
        );
        Totals::default()
    });
    driver::run_as(ctx, job, &pass1, Mode::Forward)?;
    // Positive pair (a, p): its log-sum-exp (0 over no negative, PML's masked fill), its
    // `relu(t)`, and the other row it reaches (a query other than a).
    let pair = |a: usize, p: u32, d_ap: f32| {
        let other = (p as usize) < b && p as usize != a;
        let l_p = if other {
            logs.get(p as usize)
        } else {
            f64::NEG_INFINITY
        };
        let lse = log_add(logs.get(a), l_p);
        let lse = if lse == f64::NEG_INFINITY { 0.0 } else { lse };
        let g = (lse + margin(sim, f64::from(d_ap), pm)).max(0.0);
        (lse, g, other.then_some(l_p))
    };
    // Without references the pairs come both ways ((a, p) and (p, a) share their lse and,
    // but for rounding, their distance): a row's coefficient is then its own pairs' twice,
    // known in the last pass, in a fixed order. With references a pass gathers it first.
    let symmetric = job.refs_are_queries;
    if !symmetric {
        let pass2 = with_lists!(job, |a, d, s| {
            let mut own = 0.0;
            for &p in &s.positives {
                let (lse, g, other) = pair(a, p, d[p as usize]);
                own += g * (logs.get(a) - lse).exp();
                if let Some(l_p) = other {
                    coef.add(p as usize, g * (l_p - lse).exp());
                }
            }
            coef.add(a, own);
            Totals::default()
        });
        driver::run_as(ctx, job, &pass2, Mode::Forward)?;
    }
    let pass3 = with_lists!(job, |a, d, s| {
        let (mut loss, mut own) = (0.0, 0.0);
        let l_a = logs.get(a);
        for &p in &s.positives {
            let (lse, g, other) = pair(a, p, d[p as usize]);
            loss += g * g / 2.0;
            s.weights[p as usize] = first * g;
            let both = if other.is_some() { 2.0 } else { 1.0 };
            own += both * g * (l_a - lse).exp();
        }
        let on = if symmetric { own } else { coef.get(a) };
        if on > 0.0 {
            for &n in &s.negatives {
                s.weights[n as usize] = -first * on * (xn(d[n as usize]) - l_a).exp();
            }
        }
        Totals {
            loss,
            count: s.positives.len() as u64,
            items: s.negatives.len() as u64,
            aux: 0.0,
        }
    });
    let out = driver::run_as(ctx, job, &pass3, Mode::Mean)?;
    Ok((f64::from(out.totals.mean()), out.totals.count, out))
}

/// Histogram's node of a similarity: the lower node `r` (`floor((s + 1) / Δ)` in f32, as
/// PML) and the weight of node `r + 1` (node `r`'s is 1 minus it), the similarity clamped to
/// `[−1, 1]` and a similarity of 1 put in the top bin.
fn nodes(s: f32, n_bins: u32, delta: f64) -> (usize, f64) {
    let s = s.clamp(-1.0, 1.0);
    let r = ((s + 1.0) / delta as f32)
        .floor()
        .clamp(0.0, (n_bins - 1) as f32);
    let (s, r) = (f64::from(s), f64::from(r));
    (r as usize, (s + 1.0 - r * delta) / delta)
}

/// Per query row of `labels`: its class has a positive (another row), so that Histogram
/// keeps the negative pairs it is a side of, as PML does.
pub(super) fn with_positive(labels: &[u32]) -> Vec<bool> {
    let mut per_class: HashMap<u32, usize> = HashMap::new();
    for &l in labels {
        *per_class.entry(l).or_default() += 1;
    }
    (labels.iter())
        .map(|l| per_class.get(l).is_some_and(|&n| n > 1))
        .collect()
}

/// IntraPairVariance's `(α, β)` of `v = α D + β μ` for the positive and the negative pairs:
/// positives want to rise on a similarity, negatives to fall.
pub(super) fn variance_gaps(c: IntraPairVariance, sim: bool) -> [(f64, f64); 2] {
    let (ep, en) = (f64::from(c.pos_eps), f64::from(c.neg_eps));
    if sim {
        [(-1.0, 1.0 - ep), (1.0, -(1.0 + en))]
    } else {
        [(1.0, -(1.0 + ep)), (-1.0, 1.0 - en)]
    }
}

fn histogram(ctx: &Context, job: &Job<'_>, c: Histogram) -> Result<Outcome> {
    let set = job.set;
    let has_pos = with_positive(&set.labels);
    let (n_bins, size) = (c.n_bins, c.n_bins as usize + 1);
    let delta = 2.0 / f64::from(n_bins);
    // The anchor's pairs the histograms hold: each unordered pair once (a < j), negative
    // pairs when a side has a positive.
    let pos_kept = |a: usize, j: u32| j as usize > a;
    let neg_kept = |a: usize, j: u32| j as usize > a && (has_pos[a] || has_pos[j as usize]);
    // (positive histogram, negative histogram, their pair counts).
    let hists = Mutex::new((vec![0.0f64; size], vec![0.0f64; size], 0u64, 0u64));
    let pass1 = with_lists!(job, |a, d, s| {
        // The anchor's pairs binned outside the lock (node and upper weight, positives then
        // negatives: at most `m`, the scratch's size), added under it.
        s.runs.clear();
        s.prefix.clear();
        let kept_pos = s.positives.iter().filter(|&&j| pos_kept(a, j));
        let kept_neg = s.negatives.iter().filter(|&&j| neg_kept(a, j));
        let np = kept_pos.clone().count();
        for &j in kept_pos.chain(kept_neg) {
            let (r, upper) = nodes(d[j as usize], n_bins, delta);
            s.runs.push(r as i64);
            s.prefix.push(upper);
        }
        // A poisoned lock only means another thread panicked: the driver reports that.
        if let Ok(mut h) = hists.lock() {
            for (i, (&r, &upper)) in s.runs.iter().zip(&s.prefix).enumerate() {
                let side = if i < np { &mut h.0 } else { &mut h.1 };
                // The two weights add up to 1.
                side[r as usize] += 1.0 - upper;
                side[r as usize + 1] += upper;
            }
            h.2 += np as u64;
            h.3 += (s.runs.len() - np) as u64;
        }
        Totals::default()
    });
    driver::run_as(ctx, job, &pass1, Mode::Forward)?;
    let (pos, neg, np, nn) = hists.into_inner().map_err(|_| Error::Internal {
        op: job.op,
        message: "a histogram pass panicked".into(),
    })?;
    let pairs = np + nn;
    let (np, nn) = (np.max(1) as f64, nn.max(1) as f64);
    // φ = cumsum(h⁺); loss = Σ h⁻ φ; ∂/∂h⁺_c = Σ_{b ≥ c} h⁻_b, ∂/∂h⁻_b = φ_b.
    let mut phi = vec![0.0f64; size];
    let mut acc = 0.0;
    for (f, p) in phi.iter_mut().zip(&pos) {
        acc += p / np;
        *f = acc;
    }
    let loss: f64 = neg.iter().zip(&phi).map(|(n, f)| n / nn * f).sum();
    let mut g_pos = vec![0.0f64; size];
    let mut tail = 0.0;
    for (g, n) in g_pos.iter_mut().zip(&neg).rev() {
        tail += n / nn;
        *g = tail;
    }
    // The slope between the pair's two nodes; none outside [−1, 1], where it is clamped.
    let slope = |g: &[f64], s: f32, count: f64| {
        if !(-1.0..=1.0).contains(&s) {
            return 0.0;
        }
        let (r, _) = nodes(s, n_bins, delta);
        (g[r + 1] - g[r]) / delta / count
    };
    let pass2 = with_lists!(job, |a, d, s| {
        for &j in s.positives.iter().filter(|&&j| pos_kept(a, j)) {
            s.weights[j as usize] = slope(&g_pos, d[j as usize], np);
        }
        for &j in s.negatives.iter().filter(|&&j| neg_kept(a, j)) {
            s.weights[j as usize] = slope(&phi, d[j as usize], nn);
        }
        Totals::default()
    });
    let out = driver::run_as(ctx, job, &pass2, Mode::Sum)?;
    Ok((loss, pairs, out))
}

fn intra_pair_variance(
    ctx: &Context,
    job: &Job<'_>,
    c: IntraPairVariance,
    sim: bool,
) -> Result<Outcome> {
    let means = with_lists!(job, |_, d, s| Totals {
        loss: s.positives.iter().map(|&j| f64::from(d[j as usize])).sum(),
        aux: s.negatives.iter().map(|&j| f64::from(d[j as usize])).sum(),
        count: s.positives.len() as u64,
        items: s.negatives.len() as u64,
    });
    if pair_global_linear::applies(job) {
        return pair_global_linear::intra_pair_variance(ctx, job, c);
    }
    let t = driver::run_as(ctx, job, &means, Mode::Forward)?.totals;
    let (np, nn) = (t.count, t.items);
    let mean = |sum: f64, n: u64| if n == 0 { 0.0 } else { sum / n as f64 };
    let gaps = variance_gaps(c, sim);
    let mu = [mean(t.loss, np), mean(t.aux, nn)];
    let relu = move |group: usize, d: f32| {
        let (alpha, beta) = gaps[group];
        (alpha * f64::from(d) + beta * mu[group]).max(0.0)
    };
    let sums = with_lists!(job, |_, d, s| Totals {
        loss: s.positives.iter().map(|&j| relu(0, d[j as usize])).sum(),
        aux: s.negatives.iter().map(|&j| relu(1, d[j as usize])).sum(),
        ..Totals::default()
    });
    let r = driver::run_as(ctx, job, &sums, Mode::Forward)?.totals;
    let (rp, rn) = (mean(r.loss, np), mean(r.aux, nn));
    // ∂/∂s_j of mean(relu(v)²) = (2/K) (α r_j + β R / K): μ's own slope is 1/K.
    let (bp, bn) = (gaps[0].1, gaps[1].1);
    let grad = with_lists!(job, |_, d, s| {
        let mut totals = Totals::default();
        for &j in &s.positives {
            let r = relu(0, d[j as usize]);
            totals.loss += r * r / np as f64;
            s.weights[j as usize] = 2.0 / np as f64 * (gaps[0].0 * r + bp * rp);
        }
        for &j in &s.negatives {
            let r = relu(1, d[j as usize]);
            totals.loss += r * r / nn as f64;
            s.weights[j as usize] = 2.0 / nn as f64 * (gaps[1].0 * r + bn * rn);
        }
        totals
    });
    let out = driver::run_as(ctx, job, &grad, Mode::Sum)?;
    Ok((out.totals.loss, np + nn, out))
}

fn tcm(ctx: &Context, job: &Job<'_>, c: ThresholdConsistentMargin) -> Result<Outcome> {
    let (mp, mn) = (c.margin_plus, c.margin_minus);
    let counts = with_lists!(job, |_, d, s| Totals {
        count: s.positives.iter().filter(|&&j| d[j as usize] <= mp).count() as u64,
        items: s.negatives.iter().filter(|&&j| d[j as usize] >= mn).count() as u64,
        ..Totals::default()
    });
    let t = driver::run_as(ctx, job, &counts, Mode::Forward)?.totals;
    let share = |lambda: f32, n: u64| {
        if n == 0 {
            0.0
        } else {
            f64::from(lambda) / n as f64
        }
    };
    let (on_pos, on_neg) = (
        share(c.lambda_plus, t.count),
        share(c.lambda_minus, t.items),
    );
    let grad = with_lists!(job, |_, d, s| {
        let mut loss = 0.0;
        for &j in s.positives.iter().filter(|&&j| d[j as usize] <= mp) {
            loss += on_pos * f64::from(mp - d[j as usize]);
            s.weights[j as usize] = -on_pos;
        }
        for &j in s.negatives.iter().filter(|&&j| d[j as usize] >= mn) {
            loss += on_neg * f64::from(d[j as usize] - mn);
            s.weights[j as usize] = on_neg;
        }
        Totals {
            loss,
            ..Totals::default()
        }
    });
    let out = driver::run_as(ctx, job, &grad, Mode::Sum)?;
    Ok((out.totals.loss, t.count + t.items, out))
}
