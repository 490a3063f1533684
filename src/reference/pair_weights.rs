//! Reference of `shaders/pair_weights.wgsl` (and of every other pair rule): PML's
//! `ContrastiveLoss`, `MultiSimilarityLoss`, `SupConLoss`, `CircleLoss`, `NCALoss`,
//! `GeneralizedLiftedStructureLoss`, `MarginLoss` and `FastAPLoss` written out as PML computes
//! them from the distance matrix (per-pair losses then the reducer; masked logsumexps with
//! PML's added 0; SupCon's shift by the whole row's maximum; MarginLoss over its listed
//! triplets; FastAP's every bin by every pair), in f64: the loss, its reducers' divisors and
//! `∂loss/∂D` for every pair. The tuple and whole-batch rules are in
//! [`super::pair_loss_tuples`]; [`super::pair_loss::pair_loss`] takes the weights on to the
//! embeddings.

use ndarray::{Array2, ArrayView2};

use super::pair_loss_tuples::{dense, TupleRule};
use crate::{
    Circle, Contrastive, Distance, DistanceConfig, FastAp, GeneralizedLifted, Histogram,
    IntraPairVariance, LiftedStructure, Margin, MultiSimilarity, NPairs, Nca, Pnp, RankedList,
    SupCon, ThresholdConsistentMargin, TupletMargin,
};

/// Which loss the reference computes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PairLossRef {
    /// PML `ContrastiveLoss`.
    Contrastive(Contrastive),
    /// PML `MultiSimilarityLoss`.
    MultiSimilarity(MultiSimilarity),
    /// PML `SupConLoss`.
    SupCon(SupCon),
    /// PML `CircleLoss`.
    Circle(Circle),
    /// PML `NCALoss`.
    Nca(Nca),
    /// PML `GeneralizedLiftedStructureLoss`.
    GeneralizedLifted(GeneralizedLifted),
    /// PML `MarginLoss` (one β).
    Margin(Margin),
    /// PML `FastAPLoss`.
    FastAp(FastAp),
    /// PML `LiftedStructureLoss`.
    LiftedStructure(LiftedStructure),
    /// PML `HistogramLoss`.
    Histogram(Histogram),
    /// PML `TupletMarginLoss`.
    TupletMargin(TupletMargin),
    /// PML `IntraPairVarianceLoss`.
    IntraPairVariance(IntraPairVariance),
    /// PML `RankedListLoss`.
    RankedList(RankedList),
    /// PML `ThresholdConsistentMarginLoss`.
    ThresholdConsistentMargin(ThresholdConsistentMargin),
    /// PML `PNPLoss`.
    Pnp(Pnp),
    /// PML `NPairsLoss`.
    NPairs(NPairs),
}

impl PairLossRef {
    /// The rules `super::pair_loss_tuples` writes out.
    fn tuple(self) -> Option<TupleRule> {
        Some(match self {
            Self::LiftedStructure(c) => TupleRule::Lifted(c),
            Self::Histogram(c) => TupleRule::Histogram(c),
            Self::TupletMargin(c) => TupleRule::Tuplet(c),
            Self::IntraPairVariance(c) => TupleRule::Variance(c),
            Self::RankedList(c) => TupleRule::RankedList(c),
            Self::ThresholdConsistentMargin(c) => TupleRule::Tcm(c),
            Self::Pnp(c) => TupleRule::Pnp(c),
            Self::NPairs(c) => TupleRule::NPairs(c),
            _ => return None,
        })
    }
}

/// The loss and its weights, from [`pair_weights`].
#[derive(Debug, Clone)]
pub struct ReferencePairWeights {
    /// The reduced loss (0 when PML returns no loss).
    pub loss: f64,
    /// The reducers' divisors added up.
    pub nonzero: u64,
    /// `∂loss/∂D` `(b, m)`, the reducer's division included.
    pub weights: Array2<f64>,
    /// `∂loss/∂β` (MarginLoss with `learn_beta`; 0 otherwise).
    pub beta_grad: f64,
}

/// `log(Σ e^x)` as torch's `logsumexp` takes it, with PML's extra 0 when `add_one`; 0 over an
/// empty mask (PML's `masked_fill`).
pub(super) fn lse(xs: &[f64], add_one: bool) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut all = xs.to_vec();
    if add_one {
        all.push(0.0);
    }
    let top = all.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    top + all.iter().map(|x| (x - top).exp()).sum::<f64>().ln()
}

/// PML's `loss` over `lists` (per anchor, its positive and negative references) scored with
/// `distances` `(b, m)`: the loss and `∂loss/∂D`.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::reference::pair_loss::PairLossRef;
/// use wgpu_metric_learning::reference::pair_weights::pair_weights;
/// use wgpu_metric_learning::{Contrastive, DistanceConfig};
/// let d = array![[0.0f32, 0.9, 1.4], [0.9, 0.0, 0.6], [1.4, 0.6, 0.0]];
/// let lists = vec![(vec![1u32], vec![2u32]), (vec![0], vec![2]), (vec![], vec![0, 1])];
/// let rule = PairLossRef::Contrastive(Contrastive::default());
/// let out = pair_weights(d.view(), &lists, rule, DistanceConfig::default());
/// // Two positive pairs at 0.9 (each 1/2 of their mean), two negative ones at 0.6.
/// assert_eq!((out.nonzero, out.weights[[0, 1]], out.weights[[1, 2]]), (4, 0.5, -0.5));
/// ```
pub fn pair_weights(
    distances: ArrayView2<'_, f32>,
    lists: &[(Vec<u32>, Vec<u32>)],
    rule: PairLossRef,
    distance: DistanceConfig,
) -> ReferencePairWeights {
    let positives: usize = lists.iter().map(|(p, _)| p.len()).sum();
    let negatives: usize = lists.iter().map(|(_, n)| n.len()).sum();
    let mut out = ReferencePairWeights {
        loss: 0.0,
        nonzero: 0,
        weights: Array2::zeros(distances.dim()),
        beta_grad: 0.0,
    };
    let few = positives <= 1 && negatives <= 1;
    if let Some(tuple) = rule.tuple() {
        // PML's early returns: GenericPairLoss's few pairs, no pair of a kind.
        let has = match tuple {
            TupleRule::Lifted(_) | TupleRule::Tuplet(_) => !few && positives > 0 && negatives > 0,
            TupleRule::Variance(_) => !few,
            TupleRule::Tcm(_) => positives + negatives > 0,
            TupleRule::RankedList(_)
            | TupleRule::Histogram(_)
            | TupleRule::Pnp(_)
            | TupleRule::NPairs(_) => true,
        };
        if !has {
            return out;
        }
        let d = dense(distances, lists, tuple, distance.distance.is_similarity());
        (out.loss, out.nonzero, out.weights) = (d.loss, d.nonzero, d.w);
        return out;
    }
    let supcon = matches!(rule, PairLossRef::SupCon(_));
    let generic = !matches!(
        rule,
        PairLossRef::Nca(_) | PairLossRef::Margin(_) | PairLossRef::FastAp(_)
    );
    let nca_none = matches!(rule, PairLossRef::Nca(_)) && lists.len() <= 1;
    if generic && few || supcon && (positives == 0 || negatives == 0) || nca_none {
        return out;
    }
    let sim = distance.distance.is_similarity();
    // PML's `distance.margin(x, y)`.
    let margin = |x: f64, y: f64| if sim { y - x } else { x - y };
    let dist = |a: usize, j: u32| f64::from(distances[[a, j as usize]]);
    // Per anchor: its loss, and ∂loss/∂D for each of its pairs.
    let mut per_anchor: Vec<(f64, Vec<(u32, f64)>)> = Vec::new();
    for (a, (pos, neg)) in lists.iter().enumerate() {
        let mut terms = Vec::new();
        let loss = match rule {
            // Contrastive and Margin reduce over pairs below; the tuple rules returned above.
            PairLossRef::Contrastive(_)
            | PairLossRef::Margin(_)
            | PairLossRef::LiftedStructure(_)
            | PairLossRef::Histogram(_)
            | PairLossRef::TupletMargin(_)
            | PairLossRef::IntraPairVariance(_)
            | PairLossRef::RankedList(_)
            | PairLossRef::ThresholdConsistentMargin(_)
            | PairLossRef::Pnp(_)
            | PairLossRef::NPairs(_) => 0.0,
            PairLossRef::Nca(c) => {
                let scale = f64::from(c.softmax_scale);
                let sign = if sim { 1.0 } else { -1.0 };
                let z = |j: u32| sign * scale * dist(a, j);
                let all: Vec<u32> = pos.iter().chain(neg).copied().collect();
                let top = all.iter().map(|&j| z(j)).fold(f64::NEG_INFINITY, f64::max);
                let den: f64 = all.iter().map(|&j| (z(j) - top).exp()).sum();
                let prob = |j: u32| (z(j) - top).exp() / den;
                let kept: f64 = pos.iter().map(|&p| prob(p)).sum();
                if kept as f32 == 0.0 {
                    f64::NAN // dropped, as PML drops it
                } else {
                    for &j in &all {
                        let own = if pos.contains(&j) {
                            prob(j) / kept
                        } else {
                            0.0
                        };
                        terms.push((j, sign * scale * (prob(j) - own)));
                    }
                    -kept.ln()
                }
            }
            PairLossRef::FastAp(c) => {
                if pos.is_empty() {
                    f64::NAN // not averaged, as PML leaves it out
                } else {
                    let max = match distance.distance {
                        Distance::SquaredEuclidean => 4.0,
                        _ => 2.0,
                    };
                    fast_ap(c, max, |j| dist(a, j), (pos, neg), &mut terms)
                }
            }
            PairLossRef::GeneralizedLifted(c) => {
                let (pm, nm) = (f64::from(c.pos_margin), f64::from(c.neg_margin));
                let xp: Vec<f64> = pos.iter().map(|&p| margin(dist(a, p), pm)).collect();
                let xn: Vec<f64> = neg.iter().map(|&n| margin(nm, dist(a, n))).collect();
                let (lp, ln) = (lse(&xp, false), lse(&xn, false));
                let loss = (lp + ln).max(0.0);
                if loss > 0.0 {
                    let slope = if sim { -1.0 } else { 1.0 };
                    for (&p, x) in pos.iter().zip(&xp) {
                        terms.push((p, slope * (x - lp).exp()));
                    }
                    for (&n, x) in neg.iter().zip(&xn) {
                        terms.push((n, -slope * (x - ln).exp()));
                    }
                }
                loss
            }
            PairLossRef::MultiSimilarity(c) => {
                let (alpha, beta, base) =
                    (f64::from(c.alpha), f64::from(c.beta), f64::from(c.base));
                let xp: Vec<f64> = pos
                    .iter()
                    .map(|&p| alpha * margin(dist(a, p), base))
                    .collect();
                let xn: Vec<f64> = neg
                    .iter()
                    .map(|&n| beta * margin(base, dist(a, n)))
                    .collect();
                // d/dx (1/α) log(1 + Σ e^x) = e^x / (1 + Σ e^x) = e^{x − lse}, times
                // α ∂margin/∂D / α.
                let (lse_p, lse_n) = (lse(&xp, true), lse(&xn, true));
                let sign = if sim { -1.0 } else { 1.0 };
                for (&p, x) in pos.iter().zip(&xp) {
                    terms.push((p, sign * (x - lse_p).exp()));
                }
                for (&n, x) in neg.iter().zip(&xn) {
                    terms.push((n, -sign * (x - lse_n).exp()));
                }
                lse_p / alpha + lse_n / beta
            }
            PairLossRef::SupCon(c) => {
                let tau = f64::from(c.temperature);
                let sign = if sim { 1.0 } else { -1.0 };
                // The whole row's maximum, as PML subtracts it.
                let row_max = (0..distances.ncols())
                    .map(|j| sign * f64::from(distances[[a, j]]) / tau)
                    .fold(f64::NEG_INFINITY, f64::max);
                let z = |j: u32| sign * dist(a, j) / tau - row_max;
                let all: Vec<f64> = pos.iter().chain(neg).map(|&j| z(j)).collect();
                let den = lse(&all, false);
                let k = pos.len() as f64;
                // PML's float32 value, which its reducer sees.
                let tau32 = c.temperature;
                let sign32 = sign as f32;
                let row_max32 = (0..distances.ncols())
                    .map(|j| sign32 * distances[[a, j]] / tau32)
                    .fold(f32::NEG_INFINITY, f32::max);
                let x32 = |j: u32| sign32 * distances[[a, j as usize]] / tau32 - row_max32;
                let all32: Vec<f32> = pos.iter().chain(neg).map(|&j| x32(j)).collect();
                let top32 = all32.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let den32 = all32.iter().map(|x| (x - top32).exp()).sum::<f32>().ln() + top32;
                let loss32 = -pos.iter().map(|&p| x32(p) - den32).sum::<f32>() / pos.len() as f32;
                if pos.is_empty() || loss32 <= 0.0 {
                    0.0
                } else {
                    let loss = -pos.iter().map(|&p| z(p) - den).sum::<f64>() / k;
                    for &j in pos.iter().chain(neg) {
                        let own = if pos.contains(&j) { 1.0 / k } else { 0.0 };
                        terms.push((j, sign / tau * ((z(j) - den).exp() - own)));
                    }
                    loss
                }
            }
            PairLossRef::Circle(c) => {
                if pos.is_empty() || neg.is_empty() {
                    0.0
                } else {
                    let (m, gamma) = (f64::from(c.m), f64::from(c.gamma));
                    let lp: Vec<f64> = pos
                        .iter()
                        .map(|&p| -gamma * (1.0 + m - dist(a, p)).max(0.0) * (dist(a, p) - 1.0 + m))
                        .collect();
                    let ln: Vec<f64> = neg
                        .iter()
                        .map(|&n| gamma * (dist(a, n) + m).max(0.0) * (dist(a, n) - m))
                        .collect();
                    let (sp, sn) = (lse(&lp, false), lse(&ln, false));
                    let t = sp + sn;
                    let g = 1.0 / (1.0 + (-t).exp());
                    for (&p, l) in pos.iter().zip(&lp) {
                        let slope = -gamma * (1.0 + m - dist(a, p)).max(0.0);
                        terms.push((p, g * (l - sp).exp() * slope));
                    }
                    for (&n, l) in neg.iter().zip(&ln) {
                        let slope = gamma * (dist(a, n) + m).max(0.0);
                        terms.push((n, g * (l - sn).exp() * slope));
                    }
                    (1.0 + t.exp()).ln()
                }
            }
        };
        per_anchor.push((loss, terms));
    }
    // The reducers: per-pair means over the nonzero pairs (Contrastive), the mean over every
    // anchor (MultiSimilarity), over the anchors with a positive loss (SupCon, Circle).
    let mut scaled: Vec<(usize, u32, f64)> = Vec::new();
    match rule {
        PairLossRef::Contrastive(c) => {
            let (pm, nm) = (f64::from(c.pos_margin), f64::from(c.neg_margin));
            let slope = if sim { -1.0 } else { 1.0 };
            let pos_losses: Vec<(usize, u32, f64)> = lists
                .iter()
                .enumerate()
                .flat_map(|(a, (p, _))| p.iter().map(move |&p| (a, p)))
                .map(|(a, p)| (a, p, margin(dist(a, p), pm).max(0.0)))
                .filter(|&(_, _, l)| l as f32 > 0.0)
                .collect();
            let neg_losses: Vec<(usize, u32, f64)> = lists
                .iter()
                .enumerate()
                .flat_map(|(a, (_, n))| n.iter().map(move |&n| (a, n)))
                .map(|(a, n)| (a, n, margin(nm, dist(a, n)).max(0.0)))
                .filter(|&(_, _, l)| l as f32 > 0.0)
                .collect();
            for (group, sign) in [(&pos_losses, slope), (&neg_losses, -slope)] {
                if group.is_empty() {
                    continue;
                }
                let k = group.len() as f64;
                out.loss += group.iter().map(|t| t.2).sum::<f64>() / k;
                out.nonzero += group.len() as u64;
                scaled.extend(group.iter().map(|&(a, j, _)| (a, j, sign / k)));
            }
        }
        PairLossRef::Margin(c) => {
            let (mu, beta) = (f64::from(c.margin), f64::from(c.beta));
            let slope = if sim { -1.0 } else { 1.0 };
            let mut terms: Vec<(usize, u32, f64)> = Vec::new();
            let (mut sum, mut count, mut dbeta, mut triplets) = (0.0, 0u64, 0.0, 0u64);
            for (a, (pos, neg)) in lists.iter().enumerate() {
                for &p in pos {
                    for &n in neg {
                        triplets += 1;
                        let lp = margin(dist(a, p), beta) + mu;
                        let ln = margin(beta, dist(a, n)) + mu;
                        if lp as f32 > 0.0 {
                            sum += lp;
                            count += 1;
                            dbeta -= slope;
                            terms.push((a, p, slope));
                        }
                        if ln as f32 > 0.0 {
                            sum += ln;
                            count += 1;
                            dbeta += slope;
                            terms.push((a, n, -slope));
                        }
                    }
                }
            }
            if triplets == 0 {
                return out;
            }
            let k = if count == 0 { 0.0 } else { 1.0 / count as f64 };
            out.loss = sum * k;
            out.nonzero = count;
            out.beta_grad = dbeta * k;
            if c.learn_beta {
                out.loss += f64::from(c.nu) * beta;
                out.beta_grad += f64::from(c.nu);
            }
            scaled.extend(terms.into_iter().map(|(a, j, w)| (a, j, w * k)));
        }
        PairLossRef::Nca(_) | PairLossRef::FastAp(_) => {
            let kept: Vec<usize> = (0..lists.len())
                .filter(|&a| !per_anchor[a].0.is_nan())
                .collect();
            let k = kept.len() as f64;
            out.nonzero = kept.len() as u64;
            for &a in &kept {
                out.loss += per_anchor[a].0 / k;
                scaled.extend(per_anchor[a].1.iter().map(|&(j, w)| (a, j, w / k)));
            }
        }
        PairLossRef::MultiSimilarity(_) | PairLossRef::GeneralizedLifted(_) => {
            let k = lists.len() as f64;
            out.loss = per_anchor.iter().map(|t| t.0).sum::<f64>() / k;
            out.nonzero = lists.len() as u64;
            for (a, (_, terms)) in per_anchor.iter().enumerate() {
                scaled.extend(terms.iter().map(|&(j, w)| (a, j, w / k)));
            }
        }
        PairLossRef::LiftedStructure(_)
        | PairLossRef::Histogram(_)
        | PairLossRef::TupletMargin(_)
        | PairLossRef::IntraPairVariance(_)
        | PairLossRef::RankedList(_)
        | PairLossRef::ThresholdConsistentMargin(_)
        | PairLossRef::Pnp(_)
        | PairLossRef::NPairs(_) => {}
        PairLossRef::SupCon(_) | PairLossRef::Circle(_) => {
            let kept: Vec<usize> = (0..lists.len())
                .filter(|&a| per_anchor[a].0 as f32 > 0.0)
                .collect();
            let k = kept.len() as f64;
            out.nonzero = kept.len() as u64;
            for &a in &kept {
                out.loss += per_anchor[a].0 / k;
                scaled.extend(per_anchor[a].1.iter().map(|&(j, w)| (a, j, w / k)));
            }
        }
    }
    for (a, j, w) in scaled {
        out.weights[[a, j as usize]] += w;
    }
    out
}

/// One anchor's FastAP loss as PML writes it (every bin's pulse over every pair, cumulative
/// sums, the bins where `p_b P_b > 0`), its `∂loss/∂D` per pair pushed to `terms` from the
/// derivative of every bin's term by every bin's counts (a double loop).
fn fast_ap(
    c: FastAp,
    max: f64,
    dist: impl Fn(u32) -> f64,
    (pos, neg): (&[u32], &[u32]),
    terms: &mut Vec<(u32, f64)>,
) -> f64 {
    let edges = c.num_bins as usize + 1;
    let delta = max / f64::from(c.num_bins);
    let mid = |b: usize| b as f64 * delta;
    let pulse = |d: f64, b: usize| (1.0 - (d - mid(b)).abs() / delta).max(0.0);
    // torch's derivative of relu(1 − |d − mid| / Δ): 0 where the relu or |·| is at its kink.
    let slope = |d: f64, b: usize| {
        let x = d - mid(b);
        if pulse(d, b) > 0.0 && x != 0.0 {
            -x.signum() / delta
        } else {
            0.0
        }
    };
    let hist = |js: &[u32]| -> Vec<f64> {
        (0..edges)
            .map(|b| js.iter().map(|&j| pulse(dist(j), b)).sum())
            .collect()
    };
    let (p, n) = (hist(pos), hist(neg));
    let cum = |v: &dyn Fn(usize) -> f64, b: usize| (0..=b).map(v).sum::<f64>();
    let cp = |b: usize| cum(&|i| p[i], b);
    let ch = |b: usize| cum(&|i| p[i] + n[i], b);
    let safe = |b: usize| p[b] * cp(b) > 0.0 && ch(b) > 0.0;
    let k = pos.len() as f64;
    let ap: f64 = (0..edges)
        .filter(|&b| safe(b))
        .map(|b| p[b] * cp(b) / ch(b))
        .sum();
    // ∂loss/∂p_c and ∂loss/∂n_c: every safe term T_b = p_b P_b / H_b by every count.
    let (mut gp, mut gn) = (vec![0.0; edges], vec![0.0; edges]);
    for b in (0..edges).filter(|&b| safe(b)) {
        let (pb, pc, hb) = (p[b], cp(b), ch(b));
        for c in 0..=b {
            let own = if c == b { pc / hb } else { 0.0 };
            gp[c] -= (own + pb / hb - pb * pc / (hb * hb)) / k;
            gn[c] -= (-pb * pc / (hb * hb)) / k;
        }
    }
    for (js, g) in [(pos, &gp), (neg, &gn)] {
        for &j in js {
            let d = dist(j);
            terms.push((j, (0..edges).map(|b| g[b] * slope(d, b)).sum()));
        }
    }
    1.0 - ap / k
}
