//! The reference of [`crate::pair_loss`]'s losses over tuples and whole-batch statistics
//! (`LiftedStructureLoss`, `HistogramLoss`, `TupletMarginLoss`, `IntraPairVarianceLoss`,
//! `RankedListLoss`, `ThresholdConsistentMarginLoss`), written out as PML computes them: the
//! listed pairs (and for Lifted and Histogram the pairs of pairs or triplets), the masks, the
//! reducers; `∂loss/∂D` gathered pair by pair in f64. Called by
//! [`super::pair_loss::pair_loss`] for these rules.

use std::collections::{BTreeSet, HashMap};

use ndarray::{Array2, ArrayView2};

use crate::{
    Histogram, IntraPairVariance, LiftedStructure, NPairs, Pnp, PnpVariant, RankedList,
    ThresholdConsistentMargin, TupletMargin,
};

/// The losses this module computes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum TupleRule {
    Lifted(LiftedStructure),
    Histogram(Histogram),
    Tuplet(TupletMargin),
    Variance(IntraPairVariance),
    RankedList(RankedList),
    Tcm(ThresholdConsistentMargin),
    Pnp(Pnp),
    NPairs(NPairs),
}

/// The loss, what its reducer divides by, and `∂loss/∂D` `(b, m)`.
pub(super) struct Dense {
    pub(super) loss: f64,
    pub(super) nonzero: u64,
    pub(super) w: Array2<f64>,
}

/// `log Σ e^x` over `xs` (with an extra 0 when `add_one`); 0 over an empty mask (PML).
fn lse(xs: &[f64], add_one: bool) -> f64 {
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

/// `rule` over `lists` (per query, its positive and negative references) scored by
/// `distances` `(b, m)`, `sim` when they are similarities.
pub(super) fn dense(
    distances: ArrayView2<'_, f32>,
    lists: &[(Vec<u32>, Vec<u32>)],
    rule: TupleRule,
    sim: bool,
) -> Dense {
    let mut out = Dense {
        loss: 0.0,
        nonzero: 0,
        w: Array2::zeros(distances.dim()),
    };
    let dist = |a: usize, j: u32| f64::from(distances[[a, j as usize]]);
    let margin = |x: f64, y: f64| if sim { y - x } else { x - y };
    let first = if sim { -1.0 } else { 1.0 };
    let pos: Vec<(usize, u32)> = (lists.iter().enumerate())
        .flat_map(|(a, (p, _))| p.iter().map(move |&p| (a, p)))
        .collect();
    let neg: Vec<(usize, u32)> = (lists.iter().enumerate())
        .flat_map(|(a, (_, n))| n.iter().map(move |&n| (a, n)))
        .collect();
    match rule {
        TupleRule::Lifted(c) => {
            let (pm, nm) = (f64::from(c.pos_margin), f64::from(c.neg_margin));
            let k = pos.len() as f64;
            for &(a, p) in &pos {
                // PML's n_per_p: the negative pairs whose anchor is a or p (as indices).
                let kept: Vec<(usize, u32)> = (neg.iter().copied())
                    .filter(|&(a2, _)| a2 == a || a2 == p as usize)
                    .collect();
                let xs: Vec<f64> = kept
                    .iter()
                    .map(|&(a2, n)| margin(nm, dist(a2, n)))
                    .collect();
                let l = lse(&xs, false);
                let t = l + margin(dist(a, p), pm);
                let g = t.max(0.0);
                out.loss += g * g / 2.0 / k;
                out.w[[a, p as usize]] += first * g / k;
                for (&(a2, n), x) in kept.iter().zip(&xs) {
                    out.w[[a2, n as usize]] -= first * g * (x - l).exp() / k;
                }
            }
            out.nonzero = pos.len() as u64;
        }
        TupleRule::Histogram(c) => histogram(c, distances, lists, &mut out),
        TupleRule::Tuplet(c) => {
            let (scale, m) = (f64::from(c.scale), f64::from(c.margin).to_radians());
            let k = pos.len() as f64;
            for &(a, p) in &pos {
                let s = dist(a, p).clamp(-1.0, 1.0);
                let cp = (s.acos() - m).cos();
                let negs = &lists[a].1;
                let xs: Vec<f64> = negs.iter().map(|&n| scale * (dist(a, n) - cp)).collect();
                if xs.is_empty() {
                    continue;
                }
                let l = lse(&xs, true);
                out.loss += l / k;
                let sin = (1.0 - s * s).sqrt();
                let dc = if sin > 0.0 {
                    (s.acos() - m).sin() / sin
                } else {
                    0.0
                };
                for (&n, x) in negs.iter().zip(&xs) {
                    let soft = (x - l).exp();
                    out.w[[a, n as usize]] += scale * soft / k;
                    out.w[[a, p as usize]] -= scale * soft * dc / k;
                }
            }
            out.nonzero = pos.len() as u64;
        }
        TupleRule::Variance(c) => {
            let (ep, en) = (f64::from(c.pos_eps), f64::from(c.neg_eps));
            // PML's variance_with_eps: (1 − ε) μ − s where it wants s to rise, else s − (1 + ε) μ.
            let groups = [(&pos, ep, sim), (&neg, en, !sim)];
            for (pairs, eps, increase) in groups {
                if pairs.is_empty() {
                    continue;
                }
                let k = pairs.len() as f64;
                let mu = pairs.iter().map(|&(a, j)| dist(a, j)).sum::<f64>() / k;
                let v = |s: f64| {
                    if increase {
                        (1.0 - eps) * mu - s
                    } else {
                        s - (1.0 + eps) * mu
                    }
                };
                let (dv_ds, dv_dmu) = if increase {
                    (-1.0, 1.0 - eps)
                } else {
                    (1.0, -(1.0 + eps))
                };
                let mut dmu = 0.0;
                for &(a, j) in pairs.iter() {
                    let r = v(dist(a, j)).max(0.0);
                    out.loss += r * r / k;
                    out.w[[a, j as usize]] += 2.0 * r * dv_ds / k;
                    dmu += 2.0 * r * dv_dmu / k;
                }
                // μ's gradient reaches every pair of the group by 1/k.
                for &(a, j) in pairs.iter() {
                    out.w[[a, j as usize]] += dmu / k;
                }
                out.nonzero += pairs.len() as u64;
            }
        }
        TupleRule::RankedList(c) => ranked_list(c, distances, lists, &mut out),
        TupleRule::Pnp(c) => pnp(c, distances, lists, &mut out),
        TupleRule::NPairs(_) => {
            // PML's convert_to_pos_pairs_with_unique_labels: all positive pairs in row-major
            // order, the first one of each anchor label.
            let mut seen = HashMap::new();
            for &(a, p) in &pos {
                seen.entry(lists[a].0.first().map(|_| label_of(lists, a)))
                    .or_insert((a, p));
            }
            let pairs: Vec<(usize, u32)> = seen.into_values().collect();
            let k = pairs.len() as f64;
            for &(a, target) in &pairs {
                let xs: Vec<f64> = pairs.iter().map(|&(_, p)| -first * dist(a, p)).collect();
                let l = lse(&xs, false);
                out.loss += (l + first * dist(a, target)) / k;
                for (&(_, p), x) in pairs.iter().zip(&xs) {
                    let own = if p == target { 1.0 } else { 0.0 };
                    out.w[[a, p as usize]] += -first * ((x - l).exp() - own) / k;
                }
            }
            out.nonzero = pairs.len() as u64;
        }
        TupleRule::Tcm(c) => {
            let (mp, mn) = (c.margin_plus, c.margin_minus);
            let p_sel: Vec<&(usize, u32)> = pos
                .iter()
                .filter(|&&(a, j)| distances[[a, j as usize]] <= mp)
                .collect();
            let n_sel: Vec<&(usize, u32)> = neg
                .iter()
                .filter(|&&(a, j)| distances[[a, j as usize]] >= mn)
                .collect();
            if !p_sel.is_empty() {
                let k = p_sel.len() as f64;
                let lambda = f64::from(c.lambda_plus);
                for &&(a, j) in &p_sel {
                    out.loss += lambda * (f64::from(mp) - dist(a, j)) / k;
                    out.w[[a, j as usize]] -= lambda / k;
                }
            }
            if !n_sel.is_empty() {
                let k = n_sel.len() as f64;
                let lambda = f64::from(c.lambda_minus);
                for &&(a, j) in &n_sel {
                    out.loss += lambda * (dist(a, j) - f64::from(mn)) / k;
                    out.w[[a, j as usize]] += lambda / k;
                }
            }
            out.nonzero = (p_sel.len() + n_sel.len()) as u64;
        }
    }
    out
}

/// A label for query `a` from the lists (refs are the queries): the smallest row of its
/// class, itself or a positive.
fn label_of(lists: &[(Vec<u32>, Vec<u32>)], a: usize) -> usize {
    lists[a]
        .0
        .iter()
        .map(|&p| p as usize)
        .chain([a])
        .min()
        .unwrap_or(a)
}

/// PML's HistogramLoss: every triplet, its pairs sorted and made unique, PML's densities
/// (`scatter_add` of each pair's two node weights, divided by the pairs), `Σ h⁻ cumsum(h⁺)`.
fn histogram(
    c: Histogram,
    distances: ArrayView2<'_, f32>,
    lists: &[(Vec<u32>, Vec<u32>)],
    out: &mut Dense,
) {
    let (mut pos, mut neg) = (BTreeSet::new(), BTreeSet::new());
    for (a, (p, n)) in lists.iter().enumerate() {
        for &j in p {
            for &k in n {
                pos.insert((a.min(j as usize), a.max(j as usize)));
                neg.insert((a.min(k as usize), a.max(k as usize)));
            }
        }
    }
    if pos.is_empty() {
        return;
    }
    let nodes = c.n_bins as usize + 1;
    let delta = 2.0 / f64::from(c.n_bins);
    // (node r, weight of r, weight of r + 1); the top bin takes a similarity of 1.
    let split = |s: f32| {
        let s = s.clamp(-1.0, 1.0);
        let r = ((s + 1.0) / delta as f32).floor() as usize;
        let r = r.min(nodes - 2);
        let s = f64::from(s);
        let up = (s + 1.0 - r as f64 * delta) / delta;
        (r, 1.0 - up, up)
    };
    let density = |pairs: &BTreeSet<(usize, usize)>| {
        let mut h = vec![0.0; nodes];
        for &(i, j) in pairs {
            let (r, lo, up) = split(distances[[i, j]]);
            h[r] += lo;
            h[r + 1] += up;
        }
        h.iter()
            .map(|v| v / pairs.len() as f64)
            .collect::<Vec<f64>>()
    };
    let (hp, hn) = (density(&pos), density(&neg));
    for b in 0..nodes {
        let phi: f64 = hp[..=b].iter().sum();
        out.loss += hn[b] * phi;
    }
    let dp: Vec<f64> = (0..nodes).map(|c| hn[c..].iter().sum()).collect();
    let dn: Vec<f64> = (0..nodes).map(|b| hp[..=b].iter().sum()).collect();
    for (pairs, g) in [(&pos, &dp), (&neg, &dn)] {
        for &(i, j) in pairs {
            let (r, _, _) = split(distances[[i, j]]);
            out.w[[i, j]] += (g[r + 1] - g[r]) / delta / pairs.len() as f64;
        }
    }
    out.nonzero = (pos.len() + neg.len()) as u64;
}

/// PML's RankedListLoss over each query's whole row: the masks `P*` and `N*` (values above 0
/// only), `w = e^{T gap}`, `Σ w gap / Σ (w + 10⁻⁵)` per side, averaged over the queries.
fn ranked_list(
    c: RankedList,
    distances: ArrayView2<'_, f32>,
    lists: &[(Vec<u32>, Vec<u32>)],
    out: &mut Dense,
) {
    let (b, m) = distances.dim();
    if b == 0 {
        return;
    }
    let margin = f64::from(c.margin);
    let alpha = c.alpha.map_or(1.0 + margin / 2.0, f64::from);
    let imbalance = f64::from(c.imbalance);
    let label_of: Vec<HashMap<u32, bool>> = lists
        .iter()
        .map(|(p, n)| {
            p.iter()
                .map(|&j| (j, true))
                .chain(n.iter().map(|&j| (j, false)))
                .collect()
        })
        .collect();
    for a in 0..b {
        let d = |j: usize| distances[[a, j]];
        // (side, temperature, share, its mask, gap(D) and ∂gap/∂D).
        let sides = [
            (true, f64::from(c.tp), 1.0 - imbalance, alpha - margin, 1.0),
            (false, f64::from(c.tn), imbalance, alpha, -1.0),
        ];
        for (positive, t, share, edge, sign) in sides {
            let kept: Vec<usize> = (0..m)
                .filter(|&j| {
                    let v = d(j);
                    let side = label_of[a].get(&(j as u32)) == Some(&positive);
                    let inside = if positive {
                        v > (alpha - margin) as f32
                    } else {
                        v < alpha as f32
                    };
                    side && inside && v > 0.0
                })
                .collect();
            let gap = |j: usize| sign * (f64::from(d(j)) - edge);
            let den: f64 = kept.iter().map(|&j| (t * gap(j)).exp()).sum::<f64>() + 1e-5 * m as f64;
            let num: f64 = kept.iter().map(|&j| (t * gap(j)).exp() * gap(j)).sum();
            if den == 0.0 {
                continue; // no reference at all: the side is 0 (PML: NaN)
            }
            out.loss += share * num / den / b as f64;
            for &j in &kept {
                let w = (t * gap(j)).exp();
                // Quotient rule on num / den, each term's w differentiated too.
                let dnum = w * (t * gap(j) + 1.0) * sign;
                let dden = w * t * sign;
                out.w[[a, j]] += share * (dnum * den - num * dden) / (den * den) / b as f64;
            }
        }
    }
    out.nonzero = b as u64;
}

/// PML's PNPLoss: per anchor with a positive, over its positives and itself (PML's `I_pos`
/// with its diagonal), the clamped sigmoids of every negative's similarity minus theirs
/// summed into `R`, the variant's `f(R)` averaged; the mean over those anchors (`Dq`: one
/// minus it).
fn pnp(c: Pnp, distances: ArrayView2<'_, f32>, lists: &[(Vec<u32>, Vec<u32>)], out: &mut Dense) {
    let (tau, alpha, b) = (f64::from(c.anneal), f64::from(c.alpha), f64::from(c.b));
    let safe: Vec<usize> = (0..lists.len())
        .filter(|&a| !lists[a].0.is_empty())
        .collect();
    if safe.is_empty() {
        return;
    }
    let k = safe.len() as f64;
    let value = |r: f64| match c.variant {
        PnpVariant::O => r,
        PnpVariant::Ds => (1.0 + r).ln(),
        PnpVariant::Dq => (1.0 + r).powf(-alpha),
        PnpVariant::Iu => (1.0 + r) * (1.0 + r).ln(),
        PnpVariant::Ib => (b * r - (1.0 + b * r).ln()) / (b * b),
    };
    let slope = |r: f64| match c.variant {
        PnpVariant::O => 1.0,
        PnpVariant::Ds => 1.0 / (1.0 + r),
        PnpVariant::Dq => -alpha * (1.0 + r).powf(-alpha - 1.0),
        PnpVariant::Iu => (1.0 + r).ln() + 1.0,
        PnpVariant::Ib => (b - b / (1.0 + b * r)) / (b * b),
    };
    let mut mean = 0.0;
    for &a in &safe {
        let (pos, neg) = &lists[a];
        let own: Vec<usize> = pos.iter().map(|&p| p as usize).chain([a]).collect();
        let d = |j: usize| f64::from(distances[[a, j]]);
        for &i in &own {
            let exponent = |n: usize| -(d(n) - d(i)) / tau;
            let sig = |n: usize| 1.0 / (1.0 + exponent(n).clamp(-50.0, 50.0).exp());
            let r: f64 = neg.iter().map(|&n| sig(n as usize)).sum();
            mean += value(r) / own.len() as f64 / k;
            for &n in neg {
                let n = n as usize;
                let y = sig(n);
                let inside = exponent(n).abs() <= 50.0;
                let g = if inside { y * (1.0 - y) / tau } else { 0.0 };
                let g = g * slope(r) / own.len() as f64 / k;
                let g = if c.variant == PnpVariant::Dq { -g } else { g };
                out.w[[a, n]] += g;
                out.w[[a, i]] -= g;
            }
        }
    }
    out.loss = if c.variant == PnpVariant::Dq {
        1.0 - mean
    } else {
        mean
    };
    out.nonzero = safe.len() as u64;
}
