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
//!
//! Each log-sum-exp subtracts its maximum and keeps its shifted exponentials as the softmax
//! weights: no exponential overflows, and one is taken per element.

use std::fmt::Debug;

use ndarray::ArrayView1;

use super::driver::{Scratch, Totals};
use super::info_nce::sigmoid;
use crate::metric::{Distance, DistanceConfig};

/// PML's `ContrastiveLoss(pos_margin, neg_margin)` (defaults 0 and 1): positive pairs pay
/// past `pos_margin`, negative pairs inside `neg_margin`.
///
/// # Example
/// ```
/// let rule = wgpu_metric_learning::Contrastive::default();
/// assert_eq!((rule.pos_margin, rule.neg_margin), (0.0, 1.0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Contrastive {
    /// Finite.
    pub pos_margin: f32,
    /// Finite.
    pub neg_margin: f32,
}

impl Default for Contrastive {
    fn default() -> Self {
        Self {
            pos_margin: 0.0,
            neg_margin: 1.0,
        }
    }
}

/// PML's `MultiSimilarityLoss(alpha, beta, base)` (defaults 2, 50, 0.5).
///
/// # Example
/// ```
/// let rule = wgpu_metric_learning::MultiSimilarity::default();
/// assert_eq!((rule.alpha, rule.beta, rule.base), (2.0, 50.0, 0.5));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MultiSimilarity {
    /// The positives' exponent weight. Finite, > 0.
    pub alpha: f32,
    /// The negatives' exponent weight. Finite, > 0.
    pub beta: f32,
    /// The shift in both exponents. Finite.
    pub base: f32,
}

impl Default for MultiSimilarity {
    fn default() -> Self {
        Self {
            alpha: 2.0,
            beta: 50.0,
            base: 0.5,
        }
    }
}

/// PML's `SupConLoss(temperature)` (default 0.1).
///
/// # Example
/// ```
/// assert_eq!(wgpu_metric_learning::SupCon::default().temperature, 0.1);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SupCon {
    /// Finite, > 0.
    pub temperature: f32,
}

impl Default for SupCon {
    fn default() -> Self {
        Self { temperature: 0.1 }
    }
}

/// PML's `CircleLoss(m, gamma)` (defaults 0.4 and 80), on cosine similarity only.
///
/// # Example
/// ```
/// let rule = wgpu_metric_learning::Circle::default();
/// assert_eq!((rule.m, rule.gamma), (0.4, 80.0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Circle {
    /// The relaxation margin. Finite.
    pub m: f32,
    /// The scale. Finite, > 0.
    pub gamma: f32,
}

impl Default for Circle {
    fn default() -> Self {
        Self {
            m: 0.4,
            gamma: 80.0,
        }
    }
}

/// PML's `NCALoss(softmax_scale)` (default 1; PML's default distance squared Euclidean on
/// normalised embeddings).
///
/// # Example
/// ```
/// assert_eq!(wgpu_metric_learning::Nca::default().softmax_scale, 1.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Nca {
    /// The factor on every logit. Finite, > 0.
    pub softmax_scale: f32,
}

impl Default for Nca {
    fn default() -> Self {
        Self { softmax_scale: 1.0 }
    }
}

/// PML's `GeneralizedLiftedStructureLoss(neg_margin, pos_margin)` (defaults 1 and 0).
///
/// # Example
/// ```
/// let rule = wgpu_metric_learning::GeneralizedLifted::default();
/// assert_eq!((rule.pos_margin, rule.neg_margin), (0.0, 1.0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GeneralizedLifted {
    /// Finite.
    pub pos_margin: f32,
    /// Finite.
    pub neg_margin: f32,
}

impl Default for GeneralizedLifted {
    fn default() -> Self {
        Self {
            pos_margin: 0.0,
            neg_margin: 1.0,
        }
    }
}

/// PML's `MarginLoss(margin, nu, beta, learn_beta)` over every triplet (defaults 0.2, 0, 1.2,
/// `false`), with one β for every class (PML's `num_classes=None`).
///
/// # Example
/// ```
/// let rule = wgpu_metric_learning::Margin::default();
/// assert_eq!((rule.margin, rule.beta, rule.learn_beta), (0.2, 1.2, false));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Margin {
    /// The margin around β. Finite.
    pub margin: f32,
    /// The weight of β's regulariser `ν β`, added to the loss when β is learnt. Finite.
    pub nu: f32,
    /// The boundary between positive and negative distances. Finite.
    pub beta: f32,
    /// β is a parameter: the loss includes `ν β` and the result carries `∂loss/∂β`
    /// ([`PairLoss::beta_grad`](crate::PairLoss::beta_grad)).
    pub learn_beta: bool,
}

impl Default for Margin {
    fn default() -> Self {
        Self {
            margin: 0.2,
            nu: 0.0,
            beta: 1.2,
            learn_beta: false,
        }
    }
}

/// PML's `FastAPLoss(num_bins)` (default 10), on Euclidean distance of normalised embeddings
/// (PML's default `LpDistance(power=2)`, or `power=1`).
///
/// # Example
/// ```
/// assert_eq!(wgpu_metric_learning::FastAp::default().num_bins, 10);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FastAp {
    /// Histogram bins over `[0, 2^power]`. 1 to 4 096.
    pub num_bins: u32,
}

impl Default for FastAp {
    fn default() -> Self {
        Self { num_bins: 10 }
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Contrastive {}
    impl Sealed for super::MultiSimilarity {}
    impl Sealed for super::SupCon {}
    impl Sealed for super::Circle {}
    impl Sealed for super::Nca {}
    impl Sealed for super::GeneralizedLifted {}
    impl Sealed for super::Margin {}
    impl Sealed for super::FastAp {}
}

/// A pair loss's rule: [`Contrastive`], [`MultiSimilarity`], [`SupCon`], [`Circle`],
/// [`Nca`], [`GeneralizedLifted`], [`Margin`] or [`FastAp`]. Its type picks the loss
/// [`pair_loss`](crate::pair_loss) computes and the distance
/// [`PairLossConfig`](crate::PairLossConfig) defaults to.
pub trait PairLossRule: sealed::Sealed + Debug + Clone + Copy + PartialEq + Default {
    /// The loss's name in errors (`contrastive_loss`, …).
    #[doc(hidden)]
    fn op(&self) -> &'static str;
    /// PML's default distance for the loss.
    #[doc(hidden)]
    fn default_distance() -> DistanceConfig;
    /// The rule as the driver runs it.
    #[doc(hidden)]
    fn kind(&self) -> Kind;
}

/// The rules, as [`pair_loss`](crate::pair_loss) runs them.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Contrastive(Contrastive),
    MultiSimilarity(MultiSimilarity),
    SupCon(SupCon),
    Circle(Circle),
    Nca(Nca),
    GeneralizedLifted(GeneralizedLifted),
    Margin(Margin),
    FastAp(FastAp),
}

const COSINE: DistanceConfig = DistanceConfig {
    distance: Distance::Cosine,
    normalize: true,
};

/// PML's `LpDistance()`.
const EUCLIDEAN: DistanceConfig = DistanceConfig {
    distance: Distance::Euclidean,
    normalize: true,
};

/// A rule's [`PairLossRule`] implementation: its name in errors, PML's default distance.
macro_rules! rule {
    ($rule:ident, $op:literal, $distance:expr) => {
        impl PairLossRule for $rule {
            fn op(&self) -> &'static str {
                $op
            }
            fn default_distance() -> DistanceConfig {
                $distance
            }
            fn kind(&self) -> Kind {
                Kind::$rule(*self)
            }
        }
    };
}

rule!(Contrastive, "contrastive_loss", EUCLIDEAN);
rule!(MultiSimilarity, "multi_similarity_loss", COSINE);
rule!(SupCon, "supcon_loss", COSINE);
rule!(Circle, "circle_loss", COSINE);
rule!(
    Nca,
    "nca_loss",
    DistanceConfig {
        distance: Distance::SquaredEuclidean,
        normalize: true,
    }
);
rule!(
    GeneralizedLifted,
    "generalized_lifted_structure_loss",
    EUCLIDEAN
);
rule!(Margin, "margin_loss", EUCLIDEAN);
rule!(
    FastAp,
    "fast_ap_loss",
    DistanceConfig {
        distance: Distance::SquaredEuclidean,
        normalize: true,
    }
);

/// `margin(x, y)` as PML's distance takes it: `x − y` for distances, `y − x` for similarities.
fn margin(similarity: bool, x: f64, y: f64) -> f64 {
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
fn exps(
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
fn scale(js: &[u32], factor: f64, w: &mut [f64]) {
    for &j in js {
        w[j as usize] *= factor;
    }
}

/// `log(1 + e^t)` without overflow.
fn softplus(t: f64) -> f64 {
    t.max(0.0) + (-t.abs()).exp().ln_1p()
}

/// Whether PML's reducer counts `loss` as positive (on the f32 value).
fn positive(loss: f64) -> bool {
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
        Kind::MultiSimilarity(c) => multi_similarity(c, row, s),
        Kind::SupCon(c) => supcon(c, row, s),
        Kind::Circle(c) => circle(c, row, s),
        Kind::Nca(c) => nca(c, row, s),
        Kind::GeneralizedLifted(c) => generalized_lifted(c, row, s),
        Kind::Margin(c) => margin_rule(c, row, s),
        Kind::FastAp(c) => fast_ap(c, row, s),
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
        scale(&s.positives, first / sum, w);
    }
    if !s.negatives.is_empty() {
        let (lse, sum) = exps(s.negatives.iter().copied(), xn, true, w);
        loss += lse / beta;
        scale(&s.negatives, -first / sum, w);
    }
    one(loss, s)
}

fn supcon(c: SupCon, row: &Row<'_>, s: &mut Scratch) -> Totals {
    if s.positives.is_empty() {
        return Totals::default();
    }
    let dz = -row.first() / f64::from(c.temperature);
    let z = |j: u32| dz * row.at(j);
    let all = s.positives.iter().chain(&s.negatives).copied();
    let (lse, sum) = exps(all, z, false, &mut s.weights);
    let k = s.positives.len() as f64;
    let loss = lse - s.positives.iter().map(|&p| z(p)).sum::<f64>() / k;
    let kept = positive(loss);
    // ∂ℓ/∂z_j = softmax_j − [j ∈ P] / |P|; nothing where the reducer drops the anchor.
    let on = if kept { dz / sum } else { 0.0 };
    scale(&s.positives, on, &mut s.weights);
    scale(&s.negatives, on, &mut s.weights);
    if !kept {
        return Totals::default();
    }
    for p in &s.positives {
        s.weights[*p as usize] -= dz / k;
    }
    one(loss, s)
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
    scale(&s.negatives, on, &mut s.weights);
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
    scale(&s.positives, if kept { first / sum_p } else { 0.0 }, w);
    scale(&s.negatives, if kept { -first / sum_n } else { 0.0 }, w);
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
