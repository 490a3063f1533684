//! The InfoNCE family with in-batch and memory-bank negatives: PML's `NTXentLoss` and
//! sentence-transformers' `MultipleNegativesRankingLoss`, with their gradients, anchor block by
//! anchor block, so that the `(b, m)` similarity matrix never exists whole.
//!
//! For an anchor with logits `z = ±D / τ`, positives `P` and negatives `N`, each positive's
//! loss is `−log(e^{z_p} / (e^{z_p} + S))` with `S = Σ_N e^{z_n}` shared by all of them; so
//! `∂ℓ_p/∂z_p = −S / (e^{z_p} + S)` and every negative gets `e^{z_n} Σ_P 1 / (e^{z_p} + S)`:
//! one pass over the anchor's row. On a wgpu context the same passes run on the device in f32
//! (`info_nce_weights`, the positives' terms taken in logs so that probabilities below f32's
//! normal range keep PML's `−log(x + ε)`), with the triplet loss's device blocks
//! ([`super::gpu`]). Natively, cosine similarity runs through the Matryoshka pass at the
//! whole width ([`super::matryoshka`]: vectorised f32 with f64 sums, 1.2× faster than this
//! module's rule and in smaller blocks), the other distances through this module's rule
//! over the driver's blocks, in f64.
//!
//! NTXent's positive pairs are `(a, p)` with the same label, `p` not `a` itself; an anchor
//! without negatives adds 0 per positive pair. As in PML the loss is 0, with no gradient,
//! when there is no positive pair or no negative pair, or at most one of each. The gradient
//! is torch's, PML's `1e-38` inside the log included (a positive pair whose probability is
//! below it passes almost none).

use std::collections::HashMap;
use std::hash::Hash;

use ndarray::{Array1, Array2, ArrayView1};

use super::driver::{self, Job};
use super::gpu;
use super::matryoshka::{self, Matryoshka, Truncations};
use super::scratch::{Scratch, Shared, Totals};
use super::{sigmoid, TINY};
use crate::context::plan::Plan;
use crate::context::{ComputePath, Context};
use crate::data::inputs::{self, Embeddings, Imports, Labelled, MiningSet, SelfExclusion, NO_SLOT};
use crate::error::{Error, Result};
use crate::hooks::Hooks;
use crate::metric::{Distance, DistanceConfig};
use crate::runtime::memory::Transfers;
use crate::runtime::transfer;
use crate::validate;

const NTXENT: &str = "ntxent_loss";
const MNRL: &str = "multiple_negatives_ranking_loss";
/// The label of a call's working memory.
const SCRATCH: &str = "info_nce working memory";

/// How [`ntxent_loss`] computes. Defaults: PML's `NTXentLoss()` (temperature 0.07, cosine
/// similarity).
///
/// # Example
/// ```
/// use wgpu_metric_learning::{Distance, InfoNceConfig};
/// let cfg = InfoNceConfig { temperature: 0.1, ..Default::default() };
/// assert_eq!(cfg.distance.distance, Distance::Cosine);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct InfoNceConfig {
    /// The temperature `τ` dividing every similarity (PML default 0.07). Finite, > 0.
    pub temperature: f32,
    /// The distance. Default: cosine similarity (PML's default for `NTXentLoss`); with a
    /// distance (Euclidean forms) the logits are `−D / τ`, as PML takes them.
    pub distance: DistanceConfig,
    /// Which reference is each query itself, never its own positive. Default
    /// [`SelfExclusion::Auto`]: the query's row when the references are the queries.
    pub self_exclusion: SelfExclusion,
    /// Also return the gradient with respect to the given references. Default `false` (a
    /// memory bank's rows are detached). Without references the queries' gradient holds both
    /// roles.
    pub ref_grad: bool,
    /// Also take the loss on truncated embeddings and return the weighted sum (cosine
    /// similarity only; runs on the native path). Default: none.
    pub matryoshka: Option<Matryoshka>,
    /// Progress (query–reference pairs) and cancellation. Default: none.
    pub hooks: Hooks,
}

impl Default for InfoNceConfig {
    fn default() -> Self {
        Self {
            temperature: 0.07,
            distance: DistanceConfig {
                distance: Distance::Cosine,
                normalize: true,
            },
            self_exclusion: SelfExclusion::Auto,
            ref_grad: false,
            matryoshka: None,
            hooks: Hooks::default(),
        }
    }
}

/// The result of [`ntxent_loss`] and [`multiple_negatives_ranking_loss`].
///
/// See the example of [`ntxent_loss`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct InfoNceLoss {
    /// The mean over the positive pairs of `−log softmax` (0 when PML returns no loss: no
    /// positive pair, no negative pair, or at most one of each); with Matryoshka widths, the
    /// weighted sum of their losses.
    pub loss: f32,
    /// With Matryoshka widths, each one's loss, in the given order; else empty.
    pub matryoshka_losses: Vec<f32>,
    /// Positive pairs: the mean's divisor.
    pub positive_pairs: u64,
    /// Negative pairs (query, reference).
    pub negative_pairs: u64,
    /// `∂loss/∂queries` `(b, d)`; without references it also holds the queries' role as
    /// references.
    pub query_grad: Array2<f32>,
    /// `∂loss/∂refs` `(m, d)` when asked for and references were given (always for
    /// [`multiple_negatives_ranking_loss`]: the candidates').
    pub ref_grad: Option<Array2<f32>>,
    /// Where it ran: [`ComputePath::Wgpu`] on a wgpu context (similarities, weights in f32 and
    /// both gradient products on the device), the native path otherwise, or where the
    /// references take more than one storage binding or the device buffers do not fit the
    /// budget (device rows read back; module docs of `info_nce`); calls without a loss (no
    /// positive or negative pair) return zeros before either, with the context's path.
    pub path: ComputePath,
    /// Host–device traffic of the call.
    pub transfers: Transfers,
}

/// PML's `NTXentLoss(temperature)` of `queries` `(b, d)` against `refs` `(m, d)` (`None`: the
/// queries themselves), with its gradient: every positive pair `(a, p)` scored against all
/// of `a`'s negatives, `−log(e^{s_ap/τ} / (e^{s_ap/τ} + Σ_n e^{s_an/τ}))`, and the mean over
/// the positive pairs returned (PML's `MeanReducer`; 0 without a gradient where PML returns
/// no loss, module docs). Cost: two matrix products, in `(rows, m)` blocks under the budget.
///
/// # Errors
/// [`Error::InvalidParameter`] for a temperature that is not finite and positive; otherwise
/// as [`crate::triplet_margin_loss`].
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{ntxent_loss, Context, InfoNceConfig, MiningSet};
/// let ctx = Context::native_cpu(None);
/// // Two views of two images: rows 0 and 2 are one image, rows 1 and 3 the other.
/// let x = array![[1.0f32, 0.1], [0.1, 1.0], [0.9, 0.2], [0.0, 1.0]];
/// let labels = array![0, 1, 0, 1];
/// let out = ntxent_loss(&ctx, &MiningSet::new(&x, &labels), None, &InfoNceConfig::default())?;
/// assert_eq!((out.positive_pairs, out.negative_pairs), (4, 8));
/// assert!(out.loss > 0.0 && out.loss < 0.1);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn ntxent_loss<L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &InfoNceConfig,
) -> Result<InfoNceLoss> {
    let mut imports = Imports::call();
    ntxent_job(ctx, (queries, refs), cfg, &mut imports, |job, trunc| {
        run(ctx, job, cfg.temperature, true, trunc)
    })
}

/// The [`Plan`] of [`ntxent_loss`] with these arguments, allocating nothing: its path (the
/// device where the call fits it, else the native path), anchors per block and bytes.
///
/// # Errors
/// As [`ntxent_loss`]; [`Error::OverBudget`] when not even one anchor fits.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{ntxent_loss_plan, Context, InfoNceConfig, MiningSet};
/// let ctx = Context::native_cpu(Some(64 << 20));
/// let x = ndarray::Array2::<f32>::ones((4096, 128));
/// let labels = ndarray::Array1::from_shape_fn(4096, |i| i % 2048);
/// let plan = ntxent_loss_plan(&ctx, &MiningSet::new(&x, &labels), None, &InfoNceConfig::default())?;
/// assert!(plan.bytes <= 64 << 20 && plan.rows < 4096);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn ntxent_loss_plan<L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &InfoNceConfig,
) -> Result<Plan> {
    let mut imports = Imports::plan();
    let plan = ntxent_job(ctx, (queries, refs), cfg, &mut imports, |job, trunc| {
        plan(ctx, job, cfg.temperature, true, trunc)
    })?;
    Ok(plan.with_imports(imports.footprint()))
}

/// Checks and prepares an NTXent call, and hands its job to `f`.
fn ntxent_job<L: Hash + Eq + Copy, T>(
    ctx: &Context,
    (queries, refs): (&MiningSet<'_, L>, Option<&MiningSet<'_, L>>),
    cfg: &InfoNceConfig,
    imports: &mut Imports,
    f: impl FnOnce(&Job<'_>, Option<&Truncations>) -> Result<T>,
) -> Result<T> {
    check_temperature(NTXENT, "temperature", cfg.temperature)?;
    if cfg.matryoshka.is_some() && cfg.distance.distance != Distance::Cosine {
        return Err(Error::InvalidParameter {
            op: NTXENT,
            what: "distance",
            value: format!("{:?}", cfg.distance.distance),
            rule: "Matryoshka widths take cosine similarity (each truncation normalised)",
        });
    }
    let set = inputs::prepare(
        NTXENT,
        ctx,
        queries,
        refs,
        &cfg.self_exclusion,
        true,
        |_| Ok(true),
        imports,
    )?;
    let trunc = truncations(NTXENT, &set, cfg.matryoshka.as_ref())?;
    f(
        &Job {
            op: NTXENT,
            label: SCRATCH,
            set: &set,
            refs_are_queries: refs.is_none(),
            distance: cfg.distance,
            ref_grad: cfg.ref_grad,
            ref_pairs: false,
            snr: None,
            hooks: &cfg.hooks,
        },
        trunc.as_ref(),
    )
}

/// How [`multiple_negatives_ranking_loss`] computes. Defaults: sentence-transformers'
/// `MultipleNegativesRankingLoss()` (scale 20, cosine similarity).
///
/// # Example
/// ```
/// let cfg = wgpu_metric_learning::MnrlConfig::default();
/// assert_eq!(cfg.scale, 20.0);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct MnrlConfig {
    /// The factor on every cosine similarity (the inverse temperature). Finite, > 0.
    pub scale: f32,
    /// sentence-transformers' `MatryoshkaLoss` around it: the loss on each truncation too,
    /// the weighted sum returned (native path). Default: none.
    pub matryoshka: Option<Matryoshka>,
    /// Progress and cancellation. Default: none.
    pub hooks: Hooks,
}

impl Default for MnrlConfig {
    fn default() -> Self {
        Self {
            scale: 20.0,
            matryoshka: None,
            hooks: Hooks::default(),
        }
    }
}

/// sentence-transformers' `MultipleNegativesRankingLoss`: `anchors` `(b, d)` against
/// `candidates` `(c, d)`, `c ≥ b`, where candidate `i` is anchor `i`'s positive and every other
/// candidate (the other anchors' positives, hard negatives, a memory bank's rows) a negative:
/// the mean over the anchors of the cross-entropy of `scale · cos(anchor, candidates)` with
/// target `i`. Returns the gradients of both sides (`ref_grad` holds the candidates'), in
/// `(rows, c)` blocks under the budget.
///
/// # Errors
/// [`Error::Shape`] when there are fewer candidates than anchors or the widths differ;
/// [`Error::InvalidParameter`] for a scale that is not finite and positive; otherwise as
/// [`ntxent_loss`].
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{multiple_negatives_ranking_loss, Context, MnrlConfig};
/// let ctx = Context::native_cpu(None);
/// let anchors = array![[1.0f32, 0.0], [0.0, 1.0]];
/// let candidates = array![[0.9f32, 0.1], [0.1, 0.9], [0.7, 0.7]]; // positives, then a hard negative
/// let out = multiple_negatives_ranking_loss(&ctx, &anchors, &candidates, &MnrlConfig::default())?;
/// assert_eq!(out.positive_pairs, 2);
/// assert_eq!(out.ref_grad.map(|g| g.dim()), Some((3, 2)));
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn multiple_negatives_ranking_loss<'a>(
    ctx: &Context,
    anchors: impl Into<Embeddings<'a>>,
    candidates: impl Into<Embeddings<'a>>,
    cfg: &MnrlConfig,
) -> Result<InfoNceLoss> {
    let mut imports = Imports::call();
    let sides = (anchors.into(), candidates.into());
    mnrl_job(ctx, sides, cfg, &mut imports, |job, trunc| {
        run(ctx, job, 1.0 / cfg.scale, false, trunc)
    })
}

/// The [`Plan`] of [`multiple_negatives_ranking_loss`] with these arguments, allocating
/// nothing: its path, anchors per block and bytes.
///
/// # Errors
/// As [`multiple_negatives_ranking_loss`]; [`Error::OverBudget`] when not even one anchor fits.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{multiple_negatives_ranking_loss_plan, Context, MnrlConfig};
/// let ctx = Context::native_cpu(Some(64 << 20));
/// let (anchors, candidates) = (ndarray::Array2::<f32>::ones((4096, 64)), ndarray::Array2::<f32>::ones((8192, 64)));
/// let plan = multiple_negatives_ranking_loss_plan(&ctx, &anchors, &candidates, &MnrlConfig::default())?;
/// assert_eq!(plan.cols, 8192);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn multiple_negatives_ranking_loss_plan<'a>(
    ctx: &Context,
    anchors: impl Into<Embeddings<'a>>,
    candidates: impl Into<Embeddings<'a>>,
    cfg: &MnrlConfig,
) -> Result<Plan> {
    let mut imports = Imports::plan();
    let sides = (anchors.into(), candidates.into());
    let plan = mnrl_job(ctx, sides, cfg, &mut imports, |job, trunc| {
        plan(ctx, job, 1.0 / cfg.scale, false, trunc)
    })?;
    Ok(plan.with_imports(imports.footprint()))
}

/// Checks and prepares an MNRL call (every candidate its own class), and hands its job to `f`.
fn mnrl_job<T>(
    ctx: &Context,
    (anchors, candidates): (Embeddings<'_>, Embeddings<'_>),
    cfg: &MnrlConfig,
    imports: &mut Imports,
    f: impl FnOnce(&Job<'_>, Option<&Truncations>) -> Result<T>,
) -> Result<T> {
    check_temperature(MNRL, "scale", cfg.scale)?;
    let (b, c) = (anchors.dim().0, candidates.dim().0);
    if c < b {
        return Err(Error::Shape {
            op: MNRL,
            what: "candidates",
            expected: format!("at least {b} rows (one positive per anchor)"),
            got: vec![c, candidates.dim().1],
        });
    }
    // Every candidate its own class: anchor i's only positive is candidate i.
    let (anchor_ids, candidate_ids): (Array1<u32>, Array1<u32>) =
        ((0..b as u32).collect(), (0..c as u32).collect());
    let queries = MiningSet {
        embeddings: Some(anchors.reborrow()),
        labels: anchor_ids.view(),
    };
    let refs = MiningSet {
        embeddings: Some(candidates.reborrow()),
        labels: candidate_ids.view(),
    };
    let set = inputs::prepare(
        MNRL,
        ctx,
        &queries,
        Some(&refs),
        &SelfExclusion::None,
        true,
        |_| Ok(true),
        imports,
    )?;
    let trunc = truncations(MNRL, &set, cfg.matryoshka.as_ref())?;
    f(
        &Job {
            op: MNRL,
            label: SCRATCH,
            set: &set,
            refs_are_queries: false,
            distance: DistanceConfig {
                distance: Distance::Cosine,
                normalize: true,
            },
            ref_grad: true,
            ref_pairs: false,
            snr: None,
            hooks: &cfg.hooks,
        },
        trunc.as_ref(),
    )
}

/// The checked Matryoshka widths of a prepared call, if any.
fn truncations(
    op: &'static str,
    set: &Labelled<'_>,
    matryoshka: Option<&Matryoshka>,
) -> Result<Option<Truncations>> {
    let d = set.queries.as_ref().map_or(0, |q| q.dim().1);
    matryoshka.map(|m| Truncations::new(op, m, d)).transpose()
}

pub(super) fn check_temperature(op: &'static str, what: &'static str, value: f32) -> Result<()> {
    validate::finite_param(op, what, value)?;
    if value > 0.0 && (1.0 / value).is_finite() {
        return Ok(());
    }
    Err(Error::InvalidParameter {
        op,
        what,
        value: value.to_string(),
        rule: "must be positive (and its inverse finite)",
    })
}

/// Positive and negative pairs over all anchors, from the label counts.
pub(super) fn pair_counts(set: &Labelled<'_>) -> (u64, u64) {
    let mut per_class: HashMap<u32, u64> = HashMap::new();
    for &l in &set.ref_labels {
        *per_class.entry(l).or_default() += 1;
    }
    let m = set.ref_labels.len() as u64;
    let (mut positives, mut negatives) = (0u64, 0u64);
    for (&label, &slot) in set.labels.iter().zip(&set.self_slots) {
        let same = per_class.get(&label).copied().unwrap_or(0);
        let own = slot != NO_SLOT && set.ref_labels.get(slot as usize) == Some(&label);
        positives += same - u64::from(own);
        negatives += m - same;
    }
    (positives, negatives)
}

/// The pair counts of `set`, and whether the call has a loss to compute: `pml_empty` applies
/// PML's rules for calls it returns no loss for (NTXent), which sentence-transformers'
/// cross-entropy does not have (MNRL).
fn pairs_and_loss(set: &Labelled<'_>, pml_empty: bool) -> ((u64, u64), bool) {
    let (positive_pairs, negative_pairs) = pair_counts(set);
    // PML's GenericPairLoss and NTXentLoss return no loss for these; without a negative the
    // cross-entropy is 0 anyway.
    let pml_none = positive_pairs == 0 || (positive_pairs <= 1 && negative_pairs <= 1);
    let none = negative_pairs == 0 || positive_pairs == 0 || (pml_empty && pml_none);
    ((positive_pairs, negative_pairs), !none)
}

/// `∂z/∂D` for the logits `z = ±D / τ`.
fn logit_slope(job: &Job<'_>, temperature: f32) -> f64 {
    let similarity = job.distance.distance.is_similarity();
    let sign = if similarity { 1.0 } else { -1.0 };
    sign / f64::from(temperature)
}

/// The plan of [`run`] (see [`pairs_and_loss`] for `pml_empty`).
fn plan(
    ctx: &Context,
    job: &Job<'_>,
    temperature: f32,
    pml_empty: bool,
    trunc: Option<&Truncations>,
) -> Result<Plan> {
    if !pairs_and_loss(job.set, pml_empty).1 {
        // Zeros, returned before either path.
        return Ok(Plan::nothing(ctx.path(), job.set.ref_labels.len()));
    }
    if let Some(trunc) = trunc {
        return matryoshka::plan(ctx, job, trunc);
    }
    let rule = gpu::Rule::InfoNce {
        dz: logit_slope(job, temperature) as f32,
    };
    match whole_width(job) {
        Some(whole) => {
            let native = matryoshka::plan(ctx, job, &whole);
            super::plan::plan_beside(ctx, job, Some(&rule), native)
        }
        None => super::plan::plan(ctx, job, Some(&rule)),
    }
}

/// For cosine similarity, the one width of the whole embedding: the native path then runs
/// the Matryoshka pass's kernel (vectorised, in f32 with f64 sums, in blocks of at most
/// 64 MiB), faster than the driver's f64 rule; `None` for the other distances.
fn whole_width(job: &Job<'_>) -> Option<Truncations> {
    let d = job.set.queries.as_ref().map_or(0, |q| q.dim().1);
    let cosine = job.distance.distance == Distance::Cosine;
    (cosine && d > 0)
        .then(|| Truncations::new(job.op, &Matryoshka::new([d]), d).ok())
        .flatten()
}

/// Runs the loss (see [`pairs_and_loss`] for `pml_empty`).
fn run(
    ctx: &Context,
    job: &Job<'_>,
    temperature: f32,
    pml_empty: bool,
    trunc: Option<&Truncations>,
) -> Result<InfoNceLoss> {
    let ((positive_pairs, negative_pairs), has_loss) = pairs_and_loss(job.set, pml_empty);
    let (b, d) = job.set.queries.as_ref().map_or((0, 0), |q| q.dim());
    let m = job.set.ref_labels.len();
    if !has_loss {
        job.hooks.check(job.op)?;
        return Ok(InfoNceLoss {
            loss: 0.0,
            matryoshka_losses: trunc.map_or_else(Vec::new, Truncations::zeros),
            positive_pairs,
            negative_pairs,
            query_grad: Array2::zeros((b, d)),
            ref_grad: (job.ref_grad && !job.refs_are_queries).then(|| Array2::zeros((m, d))),
            path: ctx.path(),
            transfers: job.set.imported,
        });
    }
    let dz = logit_slope(job, temperature);
    if let Some(trunc) = trunc {
        let (pass, mut transfers) =
            transfer::measure(|| matryoshka::run(ctx, job, trunc, dz, positive_pairs));
        transfers.add(job.set.imported);
        let pass = pass?;
        return Ok(InfoNceLoss {
            loss: pass.loss as f32,
            matryoshka_losses: pass.losses,
            positive_pairs,
            negative_pairs,
            query_grad: pass.query_grad,
            ref_grad: pass.ref_grad,
            path: ComputePath::NativeCpu,
            transfers,
        });
    }
    let set = job.set;
    let anchor = |a: usize, row: ArrayView1<'_, f32>, s: &mut Scratch, _: &Shared<'_>| {
        s.lists(set, a);
        if s.positives.is_empty() {
            return Totals::default();
        }
        let z = |j: u32| dz * f64::from(row[j as usize]);
        // L = log Σ_N e^{z_n}; a positive's probability is then x = σ(z_p − L) and every
        // quantity below lies in [0, 1], however far apart the logits are.
        let top = s
            .negatives
            .iter()
            .map(|&n| z(n))
            .fold(f64::NEG_INFINITY, f64::max);
        let log_sum = top
            + s.negatives
                .iter()
                .map(|&n| (z(n) - top).exp())
                .sum::<f64>()
                .ln();
        let mut loss = 0.0;
        let mut on_negatives = 0.0;
        for &p in &s.positives {
            // With no negatives, L = −∞: x = 1 and nothing moves.
            let (x, rest) = if s.negatives.is_empty() {
                (1.0, 0.0)
            } else {
                (sigmoid(z(p) - log_sum), sigmoid(log_sum - z(p)))
            };
            // PML's `−log(x + ε)`: its derivative is the plain softmax one times x / (x + ε),
            // which flattens it where the positive's probability x is below ε (f32's smallest
            // normal), as in PML.
            let flat = x / (x + TINY);
            loss -= (x + TINY).ln();
            s.weights[p as usize] -= dz * flat * rest;
            // ∂ℓ_p/∂z_n = flat · e^{z_n} / (e^{z_p} + e^L) = flat · (1 − x) · e^{z_n − L}.
            on_negatives += flat * rest;
        }
        for &n in &s.negatives {
            s.weights[n as usize] += dz * (z(n) - log_sum).exp() * on_negatives;
        }
        Totals {
            loss,
            count: s.positives.len() as u64,
            items: s.negatives.len() as u64,
            aux: 0.0,
        }
    };
    // On the device where there is one (`info_nce_weights`, in f32), else the native path.
    let on_device = || -> Result<Option<driver::Output>> {
        match ctx.gpu() {
            Some(gpu) => gpu::run(ctx, gpu, job, &gpu::Rule::InfoNce { dz: dz as f32 }),
            None => Ok(None),
        }
    };
    // Natively, cosine through the Matryoshka pass at the whole width, else the driver.
    let native = || match whole_width(job) {
        Some(whole) => matryoshka::run(ctx, job, &whole, dz, positive_pairs)
            .map(|p| (p.loss as f32, p.query_grad, p.ref_grad)),
        None => driver::run(ctx, job, &anchor)
            .map(|out| (out.totals.mean(), out.query_grad, out.ref_grad)),
    };
    let (out, mut transfers) = transfer::measure(|| match on_device()? {
        Some(out) => Ok((
            (out.totals.mean(), out.query_grad, out.ref_grad),
            ComputePath::Wgpu,
        )),
        None => native().map(|out| (out, ComputePath::NativeCpu)),
    });
    transfers.add(job.set.imported);
    let ((loss, query_grad, ref_grad), path) = out?;
    Ok(InfoNceLoss {
        loss,
        matryoshka_losses: Vec::new(),
        positive_pairs,
        negative_pairs,
        query_grad,
        ref_grad,
        path,
        transfers,
    })
}
