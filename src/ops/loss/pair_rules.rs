//! The pair losses' rules ([`super::pair`]): their parameter types with PML's defaults, and
//! each rule's weights over one anchor's row.
//!
//! Each rule is a function of one anchor's row, its positives `P` and negatives `N` (PML's
//! pairs: same label, not the anchor itself; different label), in f64, with
//! `margin(x, y) = x − y` for distances and `y − x` for similarities (PML's):
//! - **Contrastive**: `relu(margin(D_ap, pos_margin))` per positive pair and
//!   `relu(margin(neg_margin, D_an))` per negative pair, each group averaged over its nonzero
//!   pairs (`AvgNonZeroReducer`) and the two means added. The divisors are known only after
//!   every anchor, so a first pass counts them (distances only, no gradient) and a second
//!   takes the weights already divided: one more distance product than the others cost.
//! - **MultiSimilarity**: `(1/α) log(1 + Σ_P e^{α margin(D_ap, base)}) +
//!   (1/β) log(1 + Σ_N e^{β margin(base, D_an)})`, averaged over every anchor (`MeanReducer`).
//! - **SupCon**: `z = ±D/τ`; `−(1/|P|) Σ_P (z_p − log Σ_{P∪N} e^{z})`, averaged over the
//!   anchors whose loss is positive.
//! - **Circle** (cosine only): `softplus(lse_P(−γ [1 + m − s_p]₊ (s_p − 1 + m)) +
//!   lse_N(γ [s_n + m]₊ (s_n − m)))`, the brackets detached as in PML, averaged over the
//!   anchors whose loss is positive; 0 for an anchor without positives or negatives.
//! - **NCA**: `z = ±scale · D`; `−log Σ_P softmax_{P∪N}(z)`, averaged over the anchors whose
//!   f32 probability is not 0 (PML drops the others); 0 where no anchor has a positive (PML's
//!   mean over nothing is NaN).
//! - **GeneralizedLifted**: `relu(lse_P(margin(D_ap, pos_margin)) +
//!   lse_N(margin(neg_margin, D_an)))`, an empty log-sum-exp 0, averaged over every anchor.
//! - **Margin**: over every triplet `(a, p, n)`, `relu(margin(D_ap, β) + μ) +
//!   relu(margin(β, D_an) + μ)`, divided by the number of nonzero terms (PML's
//!   `DivisorReducer`): an anchor's positive term counts `|N|` times and its negative term
//!   `|P|` times, so no triplet is listed. With `learn_beta` the loss adds `ν β` and the
//!   result carries `∂loss/∂β`.
//! - **FastAP** (Euclidean or squared Euclidean on normalised rows): the anchor's positive and
//!   negative distances soft-binned into `num_bins + 1` triangular pulses over `[0, 2^power]`
//!   (`p_b`, `n_b`); `1 − Σ_b p_b P_b / H_b / |P|` over the bins where `p_b P_b > 0` (`P`,
//!   `H` the cumulative positive and total counts), averaged over the anchors with a
//!   positive. PML builds a `(bins, B, B)` tensor and refuses references; both are fine here.
//! - **TupletMargin** (cosine): per positive `p`, `softplus(lse_N(scale s_an) − scale
//!   cos(acos(s_ap) − m))`, averaged over every positive pair.
//! - **RankedList**: the positives past `α − margin` and the negatives inside `α` (both above
//!   0), each side `Σ w gap / (Σ w + 10⁻⁵ m)` with `w = e^{T gap}`, mixed by `imbalance`,
//!   averaged over every anchor.
//! - **PNP** (cosine, no references): over the anchor's positives and itself, the clamped
//!   sigmoids of every negative's similarity less theirs summed into `R`, the variant's
//!   `f(R)` averaged; averaged over the anchors with a positive.
//! - **NPairs**: the cross entropy of a label's first row over every label's second row.
//! - **Instance** (cosine, no references): the cross entropy of `γ s` over every column, the
//!   target the rank of the anchor's label among the sorted distinct labels.
//!
//! The rules whose anchors share state (Lifted, Histogram, IntraPairVariance, TCM) are in
//! [`super::pair_global`].
//!
//! Each log-sum-exp subtracts its maximum and keeps its shifted exponentials as the softmax
//! weights: no exponential overflows, and one is taken per element.

use ndarray::ArrayView1;

use super::pair_params::{
    Circle, Contrastive, FastAp, GeneralizedLifted, Kind, Margin, MultiSimilarity, Nca, Pnp,
    PnpVariant, RankedList, SupCon, TupletMargin,
};
use super::scratch::{Scratch, Totals};
use super::{dense_row, sigmoid};

/// `margin(x, y)` as PML's distance takes it: `x − y` for distances, `y − x` for similarities.
pub(super) fn margin(similarity: bool, x: f64, y: f64) -> f64 {
    if similarity {
        y - x
    } else {
        x - y
    }
}

/// Writes `e^{x(j) − top}` to `w[j]` for every reference `j` of `js`, `top` the largest
/// logit (at least 0 with `add_one`, a logit of 0 among them), and returns `(log Σ e^{x},
/// Σ e^{x − top})`: each element's softmax weight is then `w[j] / Σ`, for one exponential per
/// element. Over nothing (without `add_one`): `(−∞, 0)`, no weight written.
pub(super) fn exps(
    js: impl Iterator<Item = u32> + Clone,
    x: impl Fn(u32) -> f64,
    add_one: bool,
    w: &mut [f64],
) -> (f64, f64) {
    let start = if add_one { 0.0 } else { f64::NEG_INFINITY };
    let top = js.clone().map(&x).fold(start, f64::max);
    if top == f64::NEG_INFINITY {
        return (top, 0.0);
    }
    let mut sum = if add_one { (-top).exp() } else { 0.0 };
    for j in js {
        let e = (x(j) - top).exp();
        w[j as usize] = e;
        sum += e;
    }
    (top + sum.ln(), sum)
}

/// Multiplies the weights of `js` by `factor`.
fn scale_weights(js: &[u32], factor: f64, w: &mut [f64]) {
    for &j in js {
        w[j as usize] *= factor;
    }
}

/// `log(1 + e^t)` without overflow.
pub(super) fn softplus(t: f64) -> f64 {
    t.max(0.0) + (-t.abs()).exp().ln_1p()
}

/// Whether PML's reducer counts `loss` as positive (on the f32 value).
pub(super) fn positive(loss: f64) -> bool {
    loss as f32 > 0.0
}

/// What one anchor's rule sees: its row of distances, whether they are similarities, and
/// Contrastive's divisors (nonzero positive and negative pairs, from the first pass).
pub(super) struct Row<'a> {
    pub(super) d: ArrayView1<'a, f32>,
    pub(super) similarity: bool,
    pub(super) divisors: (u64, u64),
    /// FastAP's histogram range: 2 for Euclidean, 4 for squared Euclidean distances.
    pub(super) histogram_max: f64,
    /// The anchor's own column (PNP counts the anchor among its positives), when the
    /// references are the queries.
    pub(super) own: Option<u32>,
    /// The anchor's own slot when it is one of its label's: left out of its positives, and
    /// so of SupCon's and NCA's dense rows (a slot of another label stays a negative).
    pub(super) skip: Option<u32>,
    /// The cross entropy's columns and the anchor's target column: NPairs' every label's
    /// second row, and the anchor's own second row when it is its label's first one;
    /// Instance's every column, and its label's rank.
    pub(super) pairs: Option<(&'a [u32], u32)>,
}

impl Row<'_> {
    fn at(&self, j: u32) -> f64 {
        f64::from(self.d[j as usize])
    }

    /// `∂margin(D, ·)/∂D`; `∂margin(·, D)/∂D` is its negation.
    fn first(&self) -> f64 {
        if self.similarity {
            -1.0
        } else {
            1.0
        }
    }
}

/// One anchor of `kind`: fills `s.weights` with `∂L/∂D` (Contrastive's already divided by
/// its group's count, the others' before the mean's division) and returns its sums.
pub(super) fn anchor(kind: Kind, row: &Row<'_>, s: &mut Scratch) -> Totals {
    match kind {
        Kind::Contrastive(c) => contrastive(c, row, s),
        Kind::SnrContrastive(c) => contrastive(c.contrastive(), row, s),
        Kind::MultiSimilarity(c) => multi_similarity(c, row, s),
        Kind::SupCon(c) => supcon(c, row, s),
        Kind::Circle(c) => circle(c, row, s),
        Kind::Nca(c) => nca(c, row, s),
        Kind::GeneralizedLifted(c) => generalized_lifted(c, row, s),
        Kind::Margin(c) => margin_rule(c, row, s),
        Kind::FastAp(c) => fast_ap(c, row, s),
        Kind::TupletMargin(c) => tuplet_margin(c, row, s),
        Kind::RankedList(c) => ranked_list(c, row, s),
        Kind::Pnp(c) => pnp(c, row, s),
        Kind::NPairs(_) => cross_entropy(row, 1.0, s),
        Kind::Instance(c) => cross_entropy(row, f64::from(c.gamma), s),
        // Their passes call their own rules (`super::pair_global`).
        Kind::LiftedStructure(_)
        | Kind::Histogram(_)
        | Kind::IntraPairVariance(_)
        | Kind::ThresholdConsistentMargin(_)
        | Kind::Angular(_)
        | Kind::DynamicSoftMargin(_) => Totals::default(),
    }
}

/// An anchor's result whose mean counts it once.
fn one(loss: f64, s: &Scratch) -> Totals {
    Totals {
        loss,
        count: 1,
        items: s.negatives.len() as u64,
        aux: 0.0,
    }
}

fn contrastive(c: Contrastive, row: &Row<'_>, s: &mut Scratch) -> Totals {
    let (pm, nm, sim, first) = (
        f64::from(c.pos_margin),
        f64::from(c.neg_margin),
        row.similarity,
        row.first(),
    );
    let share = |count: u64| if count == 0 { 0.0 } else { 1.0 / count as f64 };
    let (on_pos, on_neg) = (share(row.divisors.0), share(row.divisors.1));
    let mut totals = Totals::default();
    for &p in &s.positives {
        let l = margin(sim, row.at(p), pm).max(0.0);
        if positive(l) {
            totals.count += 1;
            totals.loss += l * on_pos;
            s.weights[p as usize] = first * on_pos;
        }
    }
    for &n in &s.negatives {
        let l = margin(sim, nm, row.at(n)).max(0.0);
        if positive(l) {
            totals.items += 1;
            totals.loss += l * on_neg;
            s.weights[n as usize] = -first * on_neg;
        }
    }
    totals
}

fn multi_similarity(c: MultiSimilarity, row: &Row<'_>, s: &mut Scratch) -> Totals {
    let (alpha, beta, base) = (f64::from(c.alpha), f64::from(c.beta), f64::from(c.base));
    let (sim, first) = (row.similarity, row.first());
    let xp = |p: u32| alpha * margin(sim, row.at(p), base);
    let xn = |n: u32| beta * margin(sim, base, row.at(n));
    let w = &mut s.weights;
    let mut loss = 0.0;
    if !s.positives.is_empty() {
        let (lse, sum) = exps(s.positives.iter().copied(), xp, true, w);
        loss += lse / alpha;
        scale_weights(&s.positives, first / sum, w);
    }
    if !s.negatives.is_empty() {
        let (lse, sum) = exps(s.negatives.iter().copied(), xn, true, w);
        loss += lse / beta;
        scale_weights(&s.negatives, -first / sum, w);
    }
    one(loss, s)
}

fn supcon(c: SupCon, row: &Row<'_>, s: &mut Scratch) -> Totals {
    if s.positives.is_empty() {
        return Totals::default();
    }
    let dz = -row.first() / f64::from(c.temperature);
    let Some((lse, sum, z)) = dense_softmax(row, dz as f32, s) else {
        return supcon_lists(c, row, s);
    };
    let k = s.positives.len() as f64;
    let loss = lse - s.positives.iter().map(|&p| z(p)).sum::<f64>() / k;
    if !supcon_kept(c, row, (loss, lse, sum), s) {
        return Totals::default();
    }
    // ∂ℓ/∂z_j = softmax_j − [j ∈ P] / |P|.
    dense_row::scaled(&s.sorted, dz / sum, &mut s.weights);
    for p in &s.positives {
        s.weights[*p as usize] -= dz / k;
    }
    one(loss, s)
}

/// The row's softmax over every column but the anchor's own ([`dense_row::softmax`], into
/// `s.sorted`) of the logits `dz · D`: `(log Σ e^z, Σ e^{z − top}, z)` with `z(j)` the logit
/// in the arithmetic the softmax used. `None` for a row not contiguous in memory.
fn dense_softmax<'a>(
    row: &Row<'a>,
    dz: f32,
    s: &mut Scratch,
) -> Option<(f64, f64, impl Fn(u32) -> f64 + 'a)> {
    let d = row.d.to_slice()?;
    s.sorted.resize(d.len(), 0.0);
    let skip = row.skip.map_or(usize::MAX, |j| j as usize);
    let (top, sum) = dense_row::softmax(d, dz, skip, &mut s.sorted);
    let z = move |j: u32| f64::from(dz * d[j as usize]);
    Some((f64::from(top) + sum.ln(), sum, z))
}

/// Whether PML's reducer keeps SupCon's anchor with this `loss` (`lse` and `sum` its
/// softmax's): a loss within rounding of 0 is decided in PML's float32 arithmetic.
fn supcon_kept(c: SupCon, row: &Row<'_>, (loss, lse, sum): (f64, f64, f64), s: &Scratch) -> bool {
    let near_zero = loss.abs() < 1e-3 * (1.0 + (lse - sum.ln()).abs());
    match near_zero {
        true => supcon_f32(row, c.temperature, (&s.positives, &s.negatives)) > 0.0,
        false => positive(loss),
    }
}

/// [`supcon`] over the anchor's lists, for a row not contiguous in memory.
fn supcon_lists(c: SupCon, row: &Row<'_>, s: &mut Scratch) -> Totals {
    let dz = -row.first() / f64::from(c.temperature);
    let z = |j: u32| dz * row.at(j);
    let all = s.positives.iter().chain(&s.negatives).copied();
    let (lse, sum) = exps(all, z, false, &mut s.weights);
    let k = s.positives.len() as f64;
    let loss = lse - s.positives.iter().map(|&p| z(p)).sum::<f64>() / k;
    let kept = supcon_kept(c, row, (loss, lse, sum), s);
    // ∂ℓ/∂z_j = softmax_j − [j ∈ P] / |P|; nothing where the reducer drops the anchor.
    let on = if kept { dz / sum } else { 0.0 };
    scale_weights(&s.positives, on, &mut s.weights);
    scale_weights(&s.negatives, on, &mut s.weights);
    if !kept {
        return Totals::default();
    }
    for p in &s.positives {
        s.weights[*p as usize] -= dz / k;
    }
    one(loss, s)
}

/// One anchor's SupCon loss as PML's float32 arithmetic gives it: `x = ±D / τ` less the whole
/// row's maximum, `−mean_P(x_p − lse_{P∪N}(x))`.
fn supcon_f32(row: &Row<'_>, tau: f32, (pos, neg): (&[u32], &[u32])) -> f32 {
    let sign = if row.similarity { 1.0f32 } else { -1.0 };
    let row_max = row
        .d
        .iter()
        .map(|&d| sign * d / tau)
        .fold(f32::NEG_INFINITY, f32::max);
    let x = |j: u32| sign * row.d[j as usize] / tau - row_max;
    let top = pos
        .iter()
        .chain(neg)
        .map(|&j| x(j))
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = pos.iter().chain(neg).map(|&j| (x(j) - top).exp()).sum();
    let den = sum.ln() + top;
    -pos.iter().map(|&p| x(p) - den).sum::<f32>() / pos.len() as f32
}

fn circle(c: Circle, row: &Row<'_>, s: &mut Scratch) -> Totals {
    if s.positives.is_empty() || s.negatives.is_empty() {
        return Totals::default();
    }
    let (m, gamma) = (f64::from(c.m), f64::from(c.gamma));
    // The detached factors, then the logits.
    let ap = |p: u32| (1.0 + m - row.at(p)).max(0.0);
    let an = |n: u32| (row.at(n) + m).max(0.0);
    let lp = |p: u32| -gamma * ap(p) * (row.at(p) - (1.0 - m));
    let ln = |n: u32| gamma * an(n) * (row.at(n) - m);
    let w = &mut s.weights;
    let (lse_p, sum_p) = exps(s.positives.iter().copied(), lp, false, w);
    let (lse_n, sum_n) = exps(s.negatives.iter().copied(), ln, false, w);
    let t = lse_p + lse_n;
    let loss = softplus(t);
    let kept = positive(loss);
    // ∂ℓ/∂logit = σ(t) · softmax within the group, times the logit's slope.
    let g = if kept { sigmoid(t) } else { 0.0 };
    for &p in &s.positives {
        w[p as usize] *= g / sum_p * -gamma * ap(p);
    }
    for &n in &s.negatives {
        w[n as usize] *= g / sum_n * gamma * an(n);
    }
    if !kept {
        return Totals::default();
    }
    one(loss, s)
}

/// PML's NCA: `−log Σ_P softmax(scale · ±D)` over every reference but the anchor itself,
/// averaged over the anchors whose probability is not 0 in f32 (the others: no loss).
fn nca(c: Nca, row: &Row<'_>, s: &mut Scratch) -> Totals {
    if s.positives.is_empty() {
        return Totals::default();
    }
    let dz = -row.first() * f64::from(c.softmax_scale);
    let Some((lse, sum, z)) = dense_softmax(row, dz as f32, s) else {
        return nca_lists(c, row, s);
    };
    // The positives' share of the softmax. The dense row's exponentials are 0 past `e^{−87}`:
    // where the positives are that far below the row's largest logit, their own exponentials
    // are taken exactly (in f64) instead, so that PML's f32 zero is decided on them.
    let top = lse - sum.ln();
    let mut own: f64 = s
        .positives
        .iter()
        .map(|&p| f64::from(s.sorted[p as usize]))
        .sum();
    let exact = own < 1e-20;
    if exact {
        own = s.positives.iter().map(|&p| (z(p) - top).exp()).sum();
    }
    // PML keeps the anchor where its f32 probability is not 0.
    if (own / sum) as f32 == 0.0 {
        return Totals::default();
    }
    // ∂ℓ/∂z_j = softmax_j − [j ∈ P] e_j / Σ_P e.
    dense_row::scaled(&s.sorted, dz / sum, &mut s.weights);
    for &p in &s.positives {
        let e = match exact {
            true => (z(p) - top).exp(),
            false => f64::from(s.sorted[p as usize]),
        };
        s.weights[p as usize] = e * (dz / sum - dz / own);
    }
    one(sum.ln() - own.ln(), s)
}

/// [`nca`] over the anchor's lists, for a row not contiguous in memory.
fn nca_lists(c: Nca, row: &Row<'_>, s: &mut Scratch) -> Totals {
    let dz = -row.first() * f64::from(c.softmax_scale);
    let z = |j: u32| dz * row.at(j);
    let all = s.positives.iter().chain(&s.negatives).copied();
    let (_, sum) = exps(all, z, false, &mut s.weights);
    // The positives' share of the softmax, from the same shifted exponentials.
    let own: f64 = s.positives.iter().map(|&p| s.weights[p as usize]).sum();
    // PML keeps the anchor where its f32 probability is not 0.
    let kept = (own / sum) as f32 != 0.0;
    // ∂ℓ/∂z_j = softmax_j − [j ∈ P] e_j / Σ_P e.
    let on = if kept { dz / sum } else { 0.0 };
    let mine = if kept { dz / own } else { 0.0 };
    for &p in &s.positives {
        s.weights[p as usize] *= on - mine;
    }
    scale_weights(&s.negatives, on, &mut s.weights);
    if !kept {
        return Totals::default();
    }
    one(sum.ln() - own.ln(), s)
}

/// PML's generalized lifted structure: `relu(lse_P(margin(D, pos_margin)) +
/// lse_N(margin(neg_margin, D)))`, each log-sum-exp 0 over nothing, averaged over every anchor.
fn generalized_lifted(c: GeneralizedLifted, row: &Row<'_>, s: &mut Scratch) -> Totals {
    let (pm, nm, sim, first) = (
        f64::from(c.pos_margin),
        f64::from(c.neg_margin),
        row.similarity,
        row.first(),
    );
    let xp = |p: u32| margin(sim, row.at(p), pm);
    let xn = |n: u32| margin(sim, nm, row.at(n));
    let w = &mut s.weights;
    let or_zero = |v: f64| if v == f64::NEG_INFINITY { 0.0 } else { v };
    let (lse_p, sum_p) = exps(s.positives.iter().copied(), xp, false, w);
    let (lse_n, sum_n) = exps(s.negatives.iter().copied(), xn, false, w);
    let loss = (or_zero(lse_p) + or_zero(lse_n)).max(0.0);
    let kept = loss > 0.0;
    scale_weights(&s.positives, if kept { first / sum_p } else { 0.0 }, w);
    scale_weights(&s.negatives, if kept { -first / sum_n } else { 0.0 }, w);
    one(loss, s)
}

/// PML's MarginLoss over the anchor's triplets: each positive's term
/// `relu(margin(D_ap, β) + μ)` counted once per negative and each negative's
/// `relu(margin(β, D_an) + μ)` once per positive; the mean's divisor is the nonzero terms.
/// `aux` gathers `∂/∂β` of the sum.
fn margin_rule(c: Margin, row: &Row<'_>, s: &mut Scratch) -> Totals {
    let (mu, beta, sim, first) = (
        f64::from(c.margin),
        f64::from(c.beta),
        row.similarity,
        row.first(),
    );
    let (np, nn) = (s.positives.len() as u64, s.negatives.len() as u64);
    let mut totals = Totals {
        items: np * nn,
        ..Totals::default()
    };
    if np == 0 || nn == 0 {
        return totals;
    }
    for &p in &s.positives {
        let l = margin(sim, row.at(p), beta) + mu;
        if positive(l) {
            totals.loss += nn as f64 * l;
            totals.count += nn;
            totals.aux -= nn as f64 * first;
            s.weights[p as usize] = nn as f64 * first;
        }
    }
    for &n in &s.negatives {
        let l = margin(sim, beta, row.at(n)) + mu;
        if positive(l) {
            totals.loss += np as f64 * l;
            totals.count += np;
            totals.aux += np as f64 * first;
            s.weights[n as usize] = -(np as f64) * first;
        }
    }
    totals
}

/// PML's FastAP for one anchor: its positives' and negatives' distances soft-binned into
/// `num_bins + 1` triangular pulses over `[0, 2^power]`, `AP = Σ_b p_b P_b / H_b / |P|` over
/// the bins where `p_b P_b > 0` (`P`, `H`: cumulative positive and total counts), loss
/// `1 − AP`, averaged over the anchors with a positive. Each distance moves the (at most
/// two) pulses it falls in: `∂L/∂D_j = Σ_c ∂L/∂h_c · ∂pulse_c/∂D_j`.
fn fast_ap(c: FastAp, row: &Row<'_>, s: &mut Scratch) -> Totals {
    if s.positives.is_empty() {
        return Totals::default();
    }
    let edges = c.num_bins as usize + 1;
    let delta = row.histogram_max / f64::from(c.num_bins);
    // The pulses distance `d` falls in: (bin, height, ∂height/∂d).
    let pulses = |d: f64| {
        let b = (d / delta).floor();
        [b, b + 1.0].into_iter().filter_map(move |b| {
            let offset = d - b * delta;
            let height = 1.0 - offset.abs() / delta;
            let inside = b >= 0.0 && (b as usize) < edges && height > 0.0;
            // torch's |x| has slope 0 at 0.
            let slope = if offset == 0.0 {
                0.0
            } else {
                -offset.signum() / delta
            };
            inside.then_some((b as usize, height, slope))
        })
    };
    let (mut pos, mut neg) = (vec![0.0f64; edges], vec![0.0f64; edges]);
    for (js, h) in [(&s.positives, &mut pos), (&s.negatives, &mut neg)] {
        for &j in js.iter() {
            for (b, height, _) in pulses(row.at(j)) {
                h[b] += height;
            }
        }
    }
    let k = s.positives.len() as f64;
    // AP and ∂(1 − AP)/∂p_c, ∂(1 − AP)/∂n_c, the cumulative sums taken back from the top.
    let (mut ap, mut cum_p, mut cum_h) = (0.0, 0.0, 0.0);
    let (mut a, mut b) = (vec![0.0f64; edges], vec![0.0f64; edges]);
    let mut own = vec![0.0f64; edges];
    for i in 0..edges {
        cum_p += pos[i];
        cum_h += pos[i] + neg[i];
        if pos[i] * cum_p > 0.0 && cum_h > 0.0 {
            ap += pos[i] * cum_p / cum_h;
            own[i] = cum_p / cum_h;
            a[i] = pos[i] / cum_h - pos[i] * cum_p / (cum_h * cum_h);
            b[i] = -pos[i] * cum_p / (cum_h * cum_h);
        }
    }
    let (mut gp, mut gn) = (vec![0.0f64; edges], vec![0.0f64; edges]);
    let (mut tail_a, mut tail_b) = (0.0, 0.0);
    for i in (0..edges).rev() {
        tail_a += a[i];
        tail_b += b[i];
        gp[i] = -(own[i] + tail_a) / k;
        gn[i] = -tail_b / k;
    }
    for (js, g) in [(&s.positives, &gp), (&s.negatives, &gn)] {
        for &j in js.iter() {
            s.weights[j as usize] = pulses(row.at(j)).map(|(b, _, slope)| g[b] * slope).sum();
        }
    }
    one(1.0 - ap / k, s)
}

/// PML's TupletMargin for one anchor (cosine): per positive `p`, `c_p = cos(acos(s_ap) − m)`
/// and `softplus(lse_N(scale s_an) − scale c_p)`, summed for the mean over every positive
/// pair. Where `|s_ap| = 1` torch's `acos` has an infinite slope (NaN gradients in PML); the
/// pair's slope is taken as 0 there.
fn tuplet_margin(c: TupletMargin, row: &Row<'_>, s: &mut Scratch) -> Totals {
    let mut totals = Totals {
        count: s.positives.len() as u64,
        items: s.negatives.len() as u64,
        ..Totals::default()
    };
    if s.negatives.is_empty() {
        return totals;
    }
    let (scale, m) = (f64::from(c.scale), f64::from(c.margin).to_radians());
    let w = &mut s.weights;
    let (lse, sum) = exps(s.negatives.iter().copied(), |n| scale * row.at(n), false, w);
    let mut on_negatives = 0.0;
    for &p in &s.positives {
        let cos = row.at(p).clamp(-1.0, 1.0);
        let theta = cos.acos();
        let t = lse - scale * (theta - m).cos();
        totals.loss += softplus(t);
        let g = sigmoid(t);
        on_negatives += g;
        let sin = (1.0 - cos * cos).sqrt();
        let slope = if sin > 0.0 {
            (theta - m).sin() / sin
        } else {
            0.0
        };
        w[p as usize] = -g * scale * slope;
    }
    scale_weights(&s.negatives, scale * on_negatives / sum, w);
    totals
}

/// PML's RankedList for one anchor: the positives past `α − margin` and the negatives inside
/// `α` (both above 0), each group's `Σ w (gap) / (Σ w + 10⁻⁵ m)` with `w = e^{T · gap}` (not
/// detached: its derivative is in the weights), mixed by `imbalance`; the mean is over every
/// anchor.
fn ranked_list(c: RankedList, row: &Row<'_>, s: &mut Scratch) -> Totals {
    let margin = f64::from(c.margin);
    let alpha = c.alpha.map_or(1.0 + margin / 2.0, f64::from);
    let (boundary, floor) = ((alpha - margin) as f32, alpha as f32);
    let eps = 1e-5 * row.d.len() as f64;
    let imbalance = f64::from(c.imbalance);
    let mut loss = 0.0;
    // (group, temperature, sign of the gap in D, share, D's side of the boundary).
    let groups = [
        (
            &s.positives,
            f64::from(c.tp),
            1.0,
            1.0 - imbalance,
            alpha - margin,
        ),
        (&s.negatives, f64::from(c.tn), -1.0, imbalance, alpha),
    ];
    for (k, (js, t, sign, share, edge)) in groups.into_iter().enumerate() {
        let kept = |j: u32| {
            let d = row.d[j as usize];
            d > 0.0 && if k == 0 { d > boundary } else { d < floor }
        };
        let gap = |j: u32| sign * (row.at(j) - edge);
        let (mut num, mut den) = (0.0, eps);
        for &j in js.iter().filter(|&&j| kept(j)) {
            let w = (t * gap(j)).exp();
            num += w * gap(j);
            den += w;
        }
        // Over no reference at all (m = 0) PML's 0 / 0 is NaN; here the side is 0.
        let part = if den > 0.0 { num / den } else { 0.0 };
        loss += share * part;
        // ∂(num/den)/∂gap = w (T gap + 1 − T part) / den; ∂gap/∂D = sign.
        for &j in js.iter().filter(|&&j| kept(j)) {
            let w = (t * gap(j)).exp();
            s.weights[j as usize] = share * sign * w * (t * gap(j) + 1.0 - t * part) / den;
        }
    }
    one(loss, s)
}

/// PML's PNP for one anchor with a positive (cosine, no references): over `i` in its
/// positives and itself, `R_i = Σ_N σ((s_n − s_i) / anneal)` (the sigmoid's exponent clamped
/// to ±50, where its slope is 0, as PML), `f(R_i)` by the variant, averaged over the `|P| + 1`
/// of them; the mean is over the anchors with a positive (`Dq`: `1 −` it, the sum negated
/// here and 1 added by the caller). The negatives are sorted once: for each `i` only those
/// within `50 · anneal` of `s_i` are evaluated, the others each adding the clamped value.
fn pnp(c: Pnp, row: &Row<'_>, s: &mut Scratch) -> Totals {
    let Some(own) = row.own.filter(|_| !s.positives.is_empty()) else {
        return Totals::default();
    };
    let (tau, alpha, b) = (f64::from(c.anneal), f64::from(c.alpha), f64::from(c.b));
    // (f(R), f'(R)) of the variant; Dq's negated (its loss is 1 − the mean).
    let f = |r: f64| match c.variant {
        PnpVariant::O => (r, 1.0),
        PnpVariant::Ds => ((1.0 + r).ln(), 1.0 / (1.0 + r)),
        PnpVariant::Dq => (
            -(1.0 + r).powf(-alpha),
            alpha * (1.0 + r).powf(-alpha - 1.0),
        ),
        PnpVariant::Iu => ((1.0 + r) * (1.0 + r).ln(), (1.0 + r).ln() + 1.0),
        PnpVariant::Ib => (
            (b * r - (1.0 + b * r).ln()) / (b * b),
            (1.0 - 1.0 / (1.0 + b * r)) / b,
        ),
    };
    // σ(x / τ) with PML's clamp, and its slope in x (0 where clamped).
    let sigmoid = |x: f64| {
        let exponent = -x / tau;
        let y = 1.0 / (1.0 + exponent.clamp(-50.0, 50.0).exp());
        let slope = if exponent.abs() > 50.0 {
            0.0
        } else {
            y * (1.0 - y) / tau
        };
        (y, slope)
    };
    let (low, high) = (sigmoid(f64::NEG_INFINITY).0, sigmoid(f64::INFINITY).0);
    s.order.clear();
    s.order
        .extend(s.negatives.iter().map(|&n| (row.d[n as usize], n)));
    s.order.sort_unstable_by(|x, y| x.0.total_cmp(&y.0));
    // Past this gap both ways the sigmoid is clamped; a little wider, so that only the
    // exact test inside decides.
    let reach = 50.0 * tau * (1.0 + 1e-6) + 1e-12;
    let count = s.positives.len() as f64 + 1.0;
    let mut loss = 0.0;
    for i in s.positives.iter().copied().chain([own]) {
        let s_i = row.at(i);
        let lo = s.order.partition_point(|v| f64::from(v.0) < s_i - reach);
        let hi = s.order.partition_point(|v| f64::from(v.0) <= s_i + reach);
        let window = &s.order[lo..hi];
        s.prefix.clear();
        s.prefix
            .extend(window.iter().map(|v| sigmoid(f64::from(v.0) - s_i).0));
        let inside: f64 = s.prefix.iter().sum();
        let rank = lo as f64 * low + (s.order.len() - hi) as f64 * high + inside;
        let (value, slope) = f(rank);
        loss += value / count;
        let on = slope / count;
        for (&(v, n), &y) in window.iter().zip(&s.prefix) {
            let exponent = -(f64::from(v) - s_i) / tau;
            if exponent.abs() > 50.0 {
                continue;
            }
            let g = on * y * (1.0 - y) / tau;
            s.weights[n as usize] += g;
            s.weights[i as usize] -= g;
        }
    }
    one(loss, s)
}

/// The cross entropy of one anchor's logits `±scale · D` (+ for similarities) over its
/// [`Row::pairs`] columns, the target column given; nothing for an anchor without one. PML's
/// NPairs (scale 1) for a label's first row with a second, over every label's second row;
/// PML's Instance (scale `γ`) over every column. The mean is over those anchors.
fn cross_entropy(row: &Row<'_>, scale: f64, s: &mut Scratch) -> Totals {
    let Some((columns, target)) = row.pairs else {
        return Totals::default();
    };
    let sign = -row.first() * scale;
    if let (Some(d), true) = (row.d.as_slice(), columns.len() == row.d.len()) {
        // Every column a logit (Instance): the vectorised row.
        s.sorted.resize(d.len(), 0.0);
        let loss = dense_row::cross_entropy(
            d,
            (sign as f32, target as usize),
            &mut s.weights,
            &mut s.sorted,
        );
        return Totals {
            loss,
            count: 1,
            items: columns.len() as u64,
            aux: 0.0,
        };
    }
    let z = |j: u32| sign * row.at(j);
    let (lse, sum) = exps(columns.iter().copied(), z, false, &mut s.weights);
    // ∂/∂z_j = softmax_j − [j = target]; ∂z/∂D = sign.
    scale_weights(columns, sign / sum, &mut s.weights);
    s.weights[target as usize] -= sign;
    Totals {
        loss: lse - z(target),
        count: 1,
        items: columns.len() as u64,
        aux: 0.0,
    }
}
