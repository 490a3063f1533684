//! PML's losses with learnable class weights (ArcFace, CosFace, SubCenterArcFace,
//! LargeMarginSoftmax, SphereFace, NormalizedSoftmax, ProxyNCA, SoftTriple, ProxyAnchor), with
//! the gradients for the embeddings and for the weights, without the `(b, classes)` logit
//! matrix.
//!
//! ProxyAnchor, a log-sum-exp per class over the batch, is one pass per tile
//! ([`classifier_anchor`]). Each of the others is a cross entropy over logits
//! `z_ij = scale · a_i · b_j · ψ(c_ij) + bias`, where `c_ij` is the cosine of row `i` and
//! class `j` (the best of a class's sub-centres, or SoftTriple's softmax over its centres),
//! `ψ` is the loss's margin on the target class, and `a`, `b` are norms where the loss keeps
//! them ([`classifier_params`](super::classifier_params)). The classes
//! are cut into tiles of centres. Pass 1 multiplies the normalised rows by a tile and folds the
//! logits into each row's running maximum and sum of exponentials; pass 2 multiplies again,
//! turns the products into `∂loss/∂c` and multiplies back, into the rows' gradient and into the
//! tile's weights' gradient, which is complete after that tile
//! ([`classifier_pass`]).
//!
//! So the work is three GEMMs of `b · centres · d` when pass 1's products are kept, four when
//! they are recomputed. They are kept where they are no larger than the weights (`b ≤ d`) and
//! fit in the budget: memory stays `O(b · d + centres · d)` plus one tile either way.
//!
//! ArcFace's slope on the target is PML's, through `acos`: `sin(θ + m) / sin θ` (1 on its
//! branch `θ > π − m`, 0 past `|c| = 1` as PML's clamp gives). At `|c| = 1` exactly, where
//! PML's is infinite, `sin θ` is held at its value for the f32 cosine next to 1
//! ([`MarginGrad::Pml`](crate::MarginGrad::Pml)); insightface's passes the gradient straight through
//! ([`MarginGrad::StraightThrough`](crate::MarginGrad::StraightThrough)).
//!
//! With [`ClassSampling`] (PartialFC's `sample_rate`), the softmax losses run over the classes
//! with a row and a seeded random share of the others ([`classifier_sample`]).
//!
//! On a wgpu context, ArcFace, CosFace, NormalizedSoftmax and ProxyNCA run on the device
//! ([`classifier_device`]: the centres as the pair losses' references, one per class), the
//! others and the class-sharded calls natively.

use ndarray::{Array2, ArrayView2};

use super::classifier_params::{ClassifierKind, Rule};
use super::classifier_pass::{self, Inputs, Tiling};
use super::classifier_sample::{self, ClassSampling, Renumbered};
use super::classifier_shards::{ClassShard, Exchange, ShardCollectives, Shards, Whole};
use super::driver::fits;
use super::{classifier_anchor, classifier_device};
use crate::context::plan::Plan;
use crate::context::{ComputePath, Context};
use crate::error::{Error, Result};
use crate::hooks::Hooks;
use crate::runtime::memory::HostReservation;
use crate::runtime::pool::threads;
use crate::validate;

const OP: &str = "classifier_loss";

/// Centres per tile at most: enough for the GEMMs to run at speed, small enough to stay in
/// cache-sized blocks whatever the number of classes.
const TILE_CENTRES: usize = 2048;

/// How [`classifier_loss`] computes. Default: PML's `ArcFaceLoss()`.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{ClassifierKind, ClassifierLossConfig};
/// let cfg = ClassifierLossConfig { kind: ClassifierKind::cos_face(), ..Default::default() };
/// assert_eq!(cfg.kind, ClassifierKind::CosFace { margin: 0.35, scale: 64.0 });
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ClassifierLossConfig {
    /// The loss and its parameters.
    pub kind: ClassifierKind,
    /// PartialFC's sampling of the classes (not for ProxyAnchor). Default: every class.
    pub sampling: ClassSampling,
    /// Cancellation (checked between tiles). Default: none.
    pub hooks: Hooks,
}

impl Default for ClassifierLossConfig {
    fn default() -> Self {
        Self {
            kind: ClassifierKind::arc_face(),
            sampling: ClassSampling::default(),
            hooks: Hooks::default(),
        }
    }
}

/// The result of [`classifier_loss`]: PML's mean loss and its gradients.
///
/// See the example of [`classifier_loss`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClassifierLoss {
    /// PML's value: the mean over the rows in it (ProxyAnchor: its two sums of class terms,
    /// over the classes with a row and over every class).
    pub loss: f32,
    /// Rows in the mean: all of them, except ProxyNCA's whose probability is 0 in f32 (PML
    /// drops those); for ProxyAnchor, the classes with a row in the batch.
    pub count: usize,
    /// `∂loss/∂embeddings` `(b, d)`.
    pub grad: Array2<f32>,
    /// `∂loss/∂weights`, in the weights' layout (0 on the classes a sampling left out; on the
    /// device path, column-major where its standard-layout copy did not fit the budget).
    pub weight_grad: Array2<f32>,
    /// The classes the loss ran over, on every process: all of them, or those of the sample
    /// ([`ClassifierLossConfig::sampling`]).
    pub classes_used: usize,
    /// Where it ran: the device for ArcFace, CosFace, NormalizedSoftmax and ProxyNCA on a
    /// wgpu context (one process, a call the device loop takes), else the native path.
    pub path: ComputePath,
}

/// PML's classifier loss `cfg.kind` of `embeddings` `(b, d)` with class indices `labels`
/// `(b,)` and class weights `weights` in PML's layout ([`ClassifierKind::weight_shape`]; pass
/// `w.t()` for the other), with both gradients. Cost: 3–4 GEMMs of `b · centres · d` (module
/// docs); memory `O(b · d + centres · d)` plus one tile of classes, never `(b, classes)`.
///
/// # Errors
/// [`Error::Shape`] for weights that do not match `d` or a whole number of classes, labels of
/// another length, or `d = 0`; [`Error::NonFinite`]; [`Error::InvalidParameter`] for a label
/// outside `[0, classes)`, a parameter that is not finite, a zero temperature or `gamma`, no
/// centres, or a `LargeMarginSoftmax`/`SphereFace` margin of 0; [`Error::OverBudget`];
/// `Cancelled`.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{classifier_loss, ClassifierLossConfig, Context};
/// let ctx = Context::native_cpu(None);
/// let (x, w) = (array![[1.0f32, 0.0], [1.0, 1.0]], array![[1.0f32, 0.0, -1.0], [0.0, 1.0, 0.0]]);
/// let out = classifier_loss(&ctx, x.view(), &[0, 1], w.view(), &ClassifierLossConfig::default())?;
/// assert!(out.loss > 0.0 && out.weight_grad.dim() == (2, 3));
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn classifier_loss(
    ctx: &Context,
    embeddings: ArrayView2<'_, f32>,
    labels: &[i64],
    weights: ArrayView2<'_, f32>,
    cfg: &ClassifierLossConfig,
) -> Result<ClassifierLoss> {
    classifier_shard(ctx, embeddings, labels, weights, cfg, &Whole(None))
}

/// [`classifier_loss`] with the classes split over processes: this one holds `weights` for
/// the classes from `shard.first_class` and every process's rows, in rank order, in
/// `embeddings` `(Σ rows_of, d)` (labels over every class); all call it at once through
/// `collectives`. Returns the single process's `loss`, `count`, `grad` of this process's rows
/// and `weight_grad` of its classes. Cost: its classes' passes, `(d + 4) · Σ b` f64 moved.
///
/// # Errors
/// As [`classifier_loss`]; [`Error::Shape`] for `rows_of` that are not one per process or do
/// not add up to the rows, or weights past `shard.classes`; the engine's errors. A part that
/// fails, even between exchanges, fails every process at once ([`Error::RankFailed`] elsewhere).
///
/// # Example
/// ```
/// use wgpu_metric_learning::{classifier_loss_sharded as sharded, ClassShard, Context, Result, ShardCollectives};
/// struct Alone; // one process: its collectives return what they are given
/// impl ShardCollectives for Alone {
///     fn rank(&self) -> usize { 0 }
///     fn size(&self) -> usize { 1 }
///     fn all_gather(&self, v: &[f64]) -> Result<Vec<f64>> { Ok(v.to_vec()) }
///     fn reduce_scatter(&self, v: Vec<f64>, _: usize) -> Result<Vec<f64>> { Ok(v) }
/// }
/// let (x, w, shard) = (ndarray::array![[1.0f32, 0.0]], ndarray::Array2::<f32>::eye(2), ClassShard { first_class: 0, classes: 2, rows_of: vec![1] });
/// sharded(&Context::native_cpu(None), x.view(), &[1], w.view(), &Default::default(), &shard, &Alone)?;
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn classifier_loss_sharded(
    ctx: &Context,
    embeddings: ArrayView2<'_, f32>,
    labels: &[i64],
    weights: ArrayView2<'_, f32>,
    cfg: &ClassifierLossConfig,
    shard: &ClassShard,
    collectives: &dyn ShardCollectives,
) -> Result<ClassifierLoss> {
    let exchange = Exchange::new(OP, shard, collectives, &cfg.hooks);
    let local = check_shard(embeddings, shard, collectives.rank(), collectives.size())
        .and_then(|()| check(embeddings, labels, weights, cfg, &exchange))
        .and_then(|call| sizing(ctx, &call))
        .and_then(|_| cfg.hooks.check(OP));
    collectives.agree(OP, local)?;
    same_sampling(&cfg.sampling, collectives)?;
    // Cancellation only where every process agrees on it (a process stopping alone would
    // leave the others waiting in an exchange).
    let quiet = ClassifierLossConfig {
        hooks: Hooks::default(),
        ..cfg.clone()
    };
    let out = classifier_shard(ctx, embeddings, labels, weights, &quiet, &exchange);
    exchange.settle(out)
}

/// Every process's sampling, compared: a process that samples where another does not would
/// run other exchanges. The same error on every process where any differs.
fn same_sampling(sampling: &ClassSampling, collectives: &dyn ShardCollectives) -> Result<()> {
    let seed = sampling.seed;
    let mine = [
        f64::from(sampling.rate),
        (seed >> 32) as f64,
        (seed & 0xffff_ffff) as f64,
    ];
    let all = collectives.all_gather(&mine)?;
    match all.chunks(3).position(|theirs| theirs != mine) {
        None => Ok(()),
        Some(rank) => Err(Error::InvalidParameter {
            op: OP,
            what: "sampling",
            value: format!("{sampling:?} on this process, another on process {rank}"),
            rule: "the same on every process",
        }),
    }
}

/// The [`Plan`] of [`classifier_loss_sharded`] on this process (no exchange).
///
/// # Errors
/// As [`classifier_loss_sharded`]'s own checks.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{classifier_loss_sharded_plan, ClassShard, ClassifierLossConfig, Context};
/// let (x, w) = (ndarray::Array2::<f32>::ones((512, 64)), ndarray::Array2::<f32>::ones((64, 50_000)));
/// let shard = ClassShard { first_class: 50_000, classes: 100_000, rows_of: vec![256, 256] };
/// let plan = classifier_loss_sharded_plan(&Context::native_cpu(None), x.view(), &vec![0; 512], w.view(), &ClassifierLossConfig::default(), &shard, 1)?;
/// assert!(plan.chunks > 1);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn classifier_loss_sharded_plan(
    ctx: &Context,
    embeddings: ArrayView2<'_, f32>,
    labels: &[i64],
    weights: ArrayView2<'_, f32>,
    cfg: &ClassifierLossConfig,
    shard: &ClassShard,
    rank: usize,
) -> Result<Plan> {
    check_shard(embeddings, shard, rank, shard.rows_of.len())?;
    let numbered = Whole(Some((shard.first_class, shard.classes)));
    plan_of(ctx, &check(embeddings, labels, weights, cfg, &numbered)?)
}

/// The plan of a checked call on one process: the device's where the call runs there (its
/// loss has a device path, on a wgpu context, and the device loop takes it), else the native
/// path's. The least budget is the lesser of the two: below the device's, the call runs
/// natively.
fn plan_one(
    ctx: &Context,
    call: &Call,
    embeddings: ArrayView2<'_, f32>,
    weights: ArrayView2<'_, f32>,
) -> Result<Plan> {
    if let Some(gpu) = ctx.gpu() {
        let w = if call.on_rows { weights.t() } else { weights };
        let per = call.rule.centres.per_class();
        // A sample's plan is its copy's: any columns of its shape plan alike.
        let (w, labels) = match &call.kept {
            Some(kept) => (
                w.slice_move(ndarray::s![.., ..kept.len() * per]),
                classifier_sample::renumber(&call.labels, (0, call.centres / per), kept, 0),
            ),
            None => (w, call.labels.clone()),
        };
        let rows = (embeddings, &labels[..]);
        if let Some(mut plan) = classifier_device::plan((ctx, gpu), rows, w, &call.kind)? {
            // The sample's copy, and the centres' gradient transposed into the layout.
            let transposed = if call.on_rows { 0 } else { 4 * w.len() as u64 };
            plan.bytes += sample_bytes(call) + transposed;
            plan.min_bytes += sample_bytes(call);
            if let Ok(native) = plan_of(ctx, call) {
                plan.min_bytes = plan.min_bytes.min(native.min_bytes);
            }
            return Ok(plan);
        }
    }
    plan_of(ctx, call)
}

/// The native plan of a checked call.
fn plan_of(ctx: &Context, call: &Call) -> Result<Plan> {
    let (tiling, bytes, min_bytes) = sizing(ctx, call)?;
    Ok(Plan {
        path: ComputePath::NativeCpu,
        rows: call.b,
        cols: tiling.cols,
        chunks: call
            .kept
            .as_ref()
            .map_or(call.centres, |k| k.len() * call.rule.centres.per_class())
            .div_ceil(tiling.cols),
        bytes,
        min_bytes,
    })
}

/// The shard's own consistency: one row count per process, adding up to the embeddings'.
fn check_shard(
    embeddings: ArrayView2<'_, f32>,
    shard: &ClassShard,
    rank: usize,
    size: usize,
) -> Result<()> {
    let rows: usize = shard.rows_of.iter().sum();
    if shard.rows_of.len() != size || rank >= size || rows != embeddings.nrows() {
        return Err(Error::Shape {
            op: OP,
            what: "ClassShard::rows_of",
            expected: format!(
                "one count per process ({size}, this one {rank}), adding up to the embeddings' {} rows",
                embeddings.nrows()
            ),
            got: shard.rows_of.clone(),
        });
    }
    Ok(())
}

/// [`classifier_loss`] on one shard of the classes (`weights`, the shard's, classes numbered
/// from the shard's first as `shards` says; `labels` over every shard's classes), every row
/// of the batch in `embeddings`; `grad` holds this process's rows and `weight_grad` the
/// shard's. The loss and the count are over every shard.
fn classifier_shard(
    ctx: &Context,
    embeddings: ArrayView2<'_, f32>,
    labels: &[i64],
    weights: ArrayView2<'_, f32>,
    cfg: &ClassifierLossConfig,
    shards: &dyn Shards,
) -> Result<ClassifierLoss> {
    let call = check(embeddings, labels, weights, cfg, shards)?;
    if call.kept.is_some() {
        return sampled(ctx, embeddings, weights, cfg, shards, &call);
    }
    run_shard(ctx, embeddings, weights, cfg, shards, &call)
}

/// [`classifier_shard`] of a checked call (every class of `weights` in the softmax).
fn run_shard(
    ctx: &Context,
    embeddings: ArrayView2<'_, f32>,
    weights: ArrayView2<'_, f32>,
    cfg: &ClassifierLossConfig,
    shards: &dyn Shards,
    call: &Call,
) -> Result<ClassifierLoss> {
    let w = if call.on_rows { weights.t() } else { weights };
    let classes_used = shards
        .classes(call.centres / call.rule.centres.per_class())
        .1;
    if let (Some(gpu), true) = (ctx.gpu(), shards.alone()) {
        let rows = (embeddings, &call.labels[..]);
        if let Some(found) = classifier_device::run((ctx, gpu), rows, w, &cfg.kind, &cfg.hooks)? {
            let (loss, count, grad, centres) = found;
            return Ok(ClassifierLoss {
                loss: loss as f32,
                count,
                grad,
                weight_grad: in_layout(ctx, centres, call.on_rows),
                classes_used,
                path: ComputePath::Wgpu,
            });
        }
    }
    let (tiling, bytes, _) = sizing(ctx, call)?;
    cfg.hooks.check(OP)?;
    let _held = HostReservation::new("classifier loss working memory", bytes, ctx.tracker())?;
    let inputs = Inputs {
        x: embeddings,
        labels: &call.labels,
        w,
        rule: call.rule,
        drop_zero: matches!(cfg.kind, ClassifierKind::ProxyNca { .. }),
    };
    let run = (&cfg.hooks, shards);
    let out = match cfg.kind {
        ClassifierKind::ProxyAnchor { margin, alpha } => {
            classifier_anchor::run(&inputs, (margin, alpha), tiling.cols, run, OP)?
        }
        _ => classifier_pass::run(&inputs, tiling, call.on_rows, run, OP)?,
    };
    Ok(ClassifierLoss {
        loss: out.loss as f32,
        count: out.count,
        grad: out.grad,
        weight_grad: out.weight_grad,
        classes_used,
        path: ComputePath::NativeCpu,
    })
}

/// The device's centres' gradient `(centres, d)` in the weights' layout: as it is where the
/// classes are rows, else transposed into a standard-layout copy, counted while both exist
/// (where the copy does not fit, the transposed view's column-major array).
fn in_layout(ctx: &Context, centres: Array2<f32>, on_rows: bool) -> Array2<f32> {
    if on_rows {
        return centres;
    }
    let bytes = 4 * centres.len() as u64;
    match HostReservation::new("classifier loss weight_grad", bytes, ctx.tracker()) {
        Ok(_held) => centres.reversed_axes().as_standard_layout().into_owned(),
        Err(_) => centres.reversed_axes(),
    }
}

/// [`classifier_shard`] over the classes `call.kept` of the shard: their centres gathered,
/// the classes renumbered over every shard's sample, the gradient scattered back.
fn sampled(
    ctx: &Context,
    embeddings: ArrayView2<'_, f32>,
    weights: ArrayView2<'_, f32>,
    cfg: &ClassifierLossConfig,
    shards: &dyn Shards,
    call: &Call,
) -> Result<ClassifierLoss> {
    let kept = call.kept.as_deref().unwrap_or_default();
    let per = call.rule.centres.per_class();
    let local = call.centres / per;
    sizing(ctx, call)?;
    let _held = HostReservation::new(
        "classifier loss sampled classes",
        sample_bytes(call),
        ctx.tracker(),
    )?;
    let (first, _) = shards.classes(local);
    let (first_kept, total) = shards.offsets(first, kept.len())?;
    let compact = classifier_sample::gather(weights, kept, per, call.on_rows)?;
    // Checked already: the labels, renumbered, are in range; a shard may keep no class
    // (its passes then add nothing, and it takes part in the exchanges all the same).
    let part = Call {
        centres: kept.len() * per,
        labels: classifier_sample::renumber(&call.labels, (first, local), kept, first_kept),
        kept: None,
        ..*call
    };
    let renumbered = Renumbered {
        inner: shards,
        first: first_kept,
        classes: total,
    };
    let mut out = run_shard(ctx, embeddings, compact.view(), cfg, &renumbered, &part)?;
    drop(compact);
    out.weight_grad =
        classifier_sample::scatter(&out.weight_grad, kept, per, call.on_rows, weights.dim())?;
    Ok(out)
}

/// The bytes a sampled call holds besides its passes': the kept classes' list, their
/// centres' copy and its gradient.
fn sample_bytes(call: &Call) -> u64 {
    call.kept.as_ref().map_or(0, |kept| {
        let centres = (kept.len() * call.rule.centres.per_class()) as u64;
        kept.len() as u64 * 8 + 2 * centres * call.d as u64 * 4
    })
}

/// The [`Plan`] of [`classifier_loss`]: every row, `cols` centres per tile, and the bytes.
///
/// # Errors
/// As [`classifier_loss`]; [`Error::OverBudget`] when one class's tile does not fit.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{classifier_loss_plan, ClassifierLossConfig, Context};
/// let (x, w) = (ndarray::Array2::<f32>::ones((512, 64)), ndarray::Array2::<f32>::ones((64, 100_000)));
/// let labels = vec![0i64; 512];
/// let plan = classifier_loss_plan(&Context::native_cpu(None), x.view(), &labels, w.view(), &ClassifierLossConfig::default())?;
/// assert!(plan.chunks > 1 && plan.bytes < 64 << 20);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn classifier_loss_plan(
    ctx: &Context,
    embeddings: ArrayView2<'_, f32>,
    labels: &[i64],
    weights: ArrayView2<'_, f32>,
    cfg: &ClassifierLossConfig,
) -> Result<Plan> {
    let call = check(embeddings, labels, weights, cfg, &Whole(None))?;
    plan_one(ctx, &call, embeddings, weights)
}

/// A checked call.
struct Call {
    kind: ClassifierKind,
    b: usize,
    d: usize,
    centres: usize,
    on_rows: bool,
    rule: Rule,
    labels: Vec<usize>,
    /// The shard's classes in a sampled softmax (`None`: every class).
    kept: Option<Vec<usize>>,
}

fn check(
    embeddings: ArrayView2<'_, f32>,
    labels: &[i64],
    weights: ArrayView2<'_, f32>,
    cfg: &ClassifierLossConfig,
    shards: &dyn Shards,
) -> Result<Call> {
    check_kind(&cfg.kind)?;
    classifier_sample::check(&cfg.sampling, &cfg.kind, OP)?;
    validate::embeddings(OP, "embeddings", embeddings)?;
    validate::finite(OP, "weights", weights)?;
    let (b, d) = embeddings.dim();
    let per = cfg.kind.centres_per_class();
    let on_rows = cfg.kind.classes_on_rows();
    let (dim, centres) = if on_rows {
        (weights.ncols(), weights.nrows())
    } else {
        (weights.nrows(), weights.ncols())
    };
    if dim != d || centres == 0 || centres % per != 0 {
        let expected = if on_rows {
            "(classes, d)"
        } else {
            "(d, classes · centres per class)"
        };
        return Err(Error::Shape {
            op: OP,
            what: "weights",
            expected: format!("{expected} with d = {d}, classes >= 1, {per} centres per class"),
            got: weights.shape().to_vec(),
        });
    }
    if labels.len() != b {
        return Err(Error::Shape {
            op: OP,
            what: "labels",
            expected: format!("({b},) to match embeddings"),
            got: vec![labels.len()],
        });
    }
    let (first, classes) = shards.classes(centres / per);
    if first + centres / per > classes {
        return Err(Error::Shape {
            op: OP,
            what: "weights",
            expected: format!(
                "at most {} classes from class {first}",
                classes - first.min(classes)
            ),
            got: weights.shape().to_vec(),
        });
    }
    let labels = labels
        .iter()
        .enumerate()
        .map(|(i, &y)| match usize::try_from(y) {
            Ok(c) if c < classes => Ok(c),
            _ => Err(Error::InvalidParameter {
                op: OP,
                what: "labels",
                value: format!("{y} at row {i} ({classes} classes)"),
                rule: "a label is a class index in [0, classes)",
            }),
        })
        .collect::<Result<Vec<_>>>()?;
    let kept = cfg
        .sampling
        .is_active()
        .then(|| classifier_sample::draw(&cfg.sampling, first, centres / per, &labels));
    Ok(Call {
        kind: cfg.kind,
        b,
        d,
        centres,
        on_rows,
        rule: Rule::of(&cfg.kind),
        labels,
        kept,
    })
}

fn check_kind(kind: &ClassifierKind) -> Result<()> {
    let bad = |what: &'static str, value: String, rule: &'static str| {
        Err(Error::InvalidParameter {
            op: OP,
            what,
            value,
            rule,
        })
    };
    let finite = |what, v: f32| validate::finite_param(OP, what, v);
    match *kind {
        ClassifierKind::ArcFace { margin, scale, .. }
        | ClassifierKind::CosFace { margin, scale } => {
            finite("margin", margin)?;
            finite("scale", scale)
        }
        ClassifierKind::SubCenterArcFace {
            margin,
            scale,
            sub_centers,
            ..
        } => {
            finite("margin", margin)?;
            finite("scale", scale)?;
            if sub_centers == 0 {
                return bad("sub_centers", "0".into(), "at least 1");
            }
            Ok(())
        }
        ClassifierKind::LargeMarginSoftmax { margin, scale }
        | ClassifierKind::SphereFace { margin, scale } => {
            finite("scale", scale)?;
            if margin == 0 {
                // PML divides π by it.
                return bad("margin", "0".into(), "an integer of at least 1");
            }
            Ok(())
        }
        ClassifierKind::NormalizedSoftmax { temperature } => {
            finite("temperature", temperature)?;
            if temperature == 0.0 {
                return bad("temperature", "0".into(), "nonzero");
            }
            Ok(())
        }
        ClassifierKind::ProxyNca { softmax_scale } => finite("softmax_scale", softmax_scale),
        ClassifierKind::ProxyAnchor { margin, alpha } => {
            finite("margin", margin)?;
            finite("alpha", alpha)
        }
        ClassifierKind::SoftTriple {
            centers_per_class,
            la,
            gamma,
            margin,
        } => {
            finite("la", la)?;
            finite("gamma", gamma)?;
            finite("margin", margin)?;
            if gamma == 0.0 || centers_per_class == 0 {
                let value = format!("gamma {gamma}, centers_per_class {centers_per_class}");
                return bad(
                    "gamma",
                    value,
                    "gamma nonzero and at least 1 centre per class",
                );
            }
            Ok(())
        }
    }
}

/// The tiling, its bytes, and the bytes of the smallest plan (one class per tile, nothing
/// kept).
fn sizing(ctx: &Context, call: &Call) -> Result<(Tiling, u64, u64)> {
    let per = call.rule.centres.per_class();
    // A sampled call's passes run over its sample's centres, beside their copy.
    let used = call.kept.as_ref().map_or(call.centres, |k| k.len() * per);
    let extra = sample_bytes(call);
    let (b, d, centres) = (call.b as u64, call.d as u64, used as u64);
    let row_state = 64 + 8;
    let fixed = b * d * 4 + b * row_state;
    let workers = threads() as u64;
    let tile = |cols: u64, keep: bool| {
        // Kept products lie in the weights' gradient (pass 2 copies a tile's out at a time),
        // unless the classes are on its rows.
        let products = if keep && call.on_rows {
            b * centres * 4
        } else {
            b * cols * 4
        };
        let through = if call.rule.col_norm { b * cols * 4 } else { 0 };
        // The tile's norms and their inverses, each worker's row of logits and exponentials.
        extra + fixed + cols * 12 + products + through + workers * cols * 8
    };
    let min_bytes = tile(per as u64, false);
    let available = ctx.tracker().available();
    let mut cols = (TILE_CENTRES.min(used) / per).max(1) * per;
    // ProxyAnchor's tiles are complete in one pass: nothing to keep.
    let one_pass = matches!(call.kind, ClassifierKind::ProxyAnchor { .. });
    let keep = !one_pass && b <= d && tile(cols as u64, true) <= available;
    while !keep && cols > per && tile(cols as u64, false) > available {
        cols = (cols / 2 / per).max(1) * per;
    }
    let bytes = tile(cols as u64, keep);
    fits(ctx, OP, bytes)?;
    Ok((Tiling { cols, keep }, bytes, min_bytes))
}
