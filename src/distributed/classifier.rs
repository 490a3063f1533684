//! PML's losses with class weights over the ranks: the classes split by rank, so that no rank
//! holds more than its share of the weights and only length-`b` vectors and the rows cross.
//!
//! Every rank gathers every rank's rows and labels (uneven batches allowed) and runs the two
//! passes of [`crate::classifier_loss`] over its own classes. Between the passes, each row's
//! running maximum, sum of exponentials and target logit are exchanged and combined in rank
//! order (the same bits on every rank); after them, the rows' gradients are summed over the
//! ranks and scattered back to their owners (`MPI_Reduce_scatter_block`, in f64). A rank's
//! classes' weight gradient is complete where it is computed.
//!
//! With [`ClassWeights::Replicated`], every rank holds the whole of `W` and computes the
//! classes of an even split; the weight gradient is then gathered, so that every rank holds
//! all of it, identical everywhere (each class's gradient is computed once, by its rank).
//! [`DistributedClassifierConfig::check_replicas`] compares a checksum of every rank's `W`
//! first, so that replicas that drifted apart (a rank that skipped a step, a different
//! initialisation) fail every rank, naming one that differs, instead of training on.

use std::ops::Range;

use ndarray::{s, Array2, ArrayView2};

use super::{fingerprint, Group};
use crate::context::Context;
use crate::data::files::Fnv;
use crate::error::{Error, Result};
use crate::ops::loss::{
    classifier_loss_sharded, ClassShard, ClassifierLoss, ClassifierLossConfig, ShardCollectives,
};
use crate::validate;

const OP: &str = "distributed classifier_loss";

/// How the ranks hold the class weights `W`. Default: [`ClassWeights::Sharded`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClassWeights {
    /// Each rank holds a contiguous range of the classes, in rank order (any sizes, at least
    /// one class each): `W` is never whole anywhere. The weight gradient is the rank's range.
    #[default]
    Sharded,
    /// Every rank holds the whole of `W` (the same on every rank: the caller broadcasts it
    /// once); the work is split by classes and the weight gradient, whole, is on every rank.
    Replicated,
}

/// Which gradient of its rows each rank gets. Default: [`RankGradients::Averaged`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RankGradients {
    /// The single process's gradient times the number of ranks: averaging the backbone's
    /// gradients over the ranks (what DDP does) then gives exactly the single process's.
    #[default]
    Averaged,
    /// The single process's gradient of the rank's rows, as it is: summing the backbone's
    /// gradients over the ranks gives the single process's.
    Summed,
}

/// How [`classifier_loss`] runs over the ranks. Every field has a documented default.
///
/// # Example
/// ```
/// use wgpu_metric_learning::distributed::{ClassWeights, DistributedClassifierConfig};
/// let cfg = DistributedClassifierConfig { weights: ClassWeights::Replicated, ..Default::default() };
/// assert_eq!(DistributedClassifierConfig::default().weights, ClassWeights::Sharded);
/// # let _ = cfg;
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DistributedClassifierConfig {
    /// The loss, as for one process. Its hooks cancel the whole group before the passes and
    /// between them. Default: PML's `ArcFaceLoss()`.
    pub loss: ClassifierLossConfig,
    /// How `W` is held. Default: sharded by class.
    pub weights: ClassWeights,
    /// The scaling of the rows' gradient. Default: averaged (DDP's convention).
    pub gradients: RankGradients,
    /// With replicated weights: compare a checksum of every rank's `W` (its bits, one pass)
    /// before the loss, and fail on every rank if they differ. Set it every `k` steps to
    /// catch replicas that drift apart. Ignored when sharded. Default: false.
    pub check_replicas: bool,
}

/// PML's loss `cfg.loss.kind` over every rank's rows (collective): this rank's `embeddings`
/// `(b_r, d)` with `labels` `(b_r,)` (class indices over every rank's classes), and its
/// `weights` in PML's layout: its classes' (sharded: rank `r`'s classes numbered after those
/// of ranks `0..r`) or the whole (replicated). `loss` and `count` are the single process's on
/// the concatenated batch and `W`, on every rank; `grad` is this rank's rows' (scaled as
/// `cfg.gradients` says); `weight_grad` is the rank's classes' (sharded) or the whole
/// (replicated), in the weights' layout. Equal to one process within f32 rounding.
/// Cost per rank: the gathered rows `(Σ b_r, d)`, the passes over its classes, and
/// `Σ b_r · (d + 1)` f64 reduced and scattered.
///
/// # Errors
/// On every rank when any rank's part fails (the others get [`Error::RankFailed`]): as
/// [`crate::classifier_loss`] on that rank's part; [`Error::InvalidParameter`] when the loss,
/// the modes, the sampling or `d` differ between ranks, or replicated weights differ in shape,
/// number fewer classes than ranks or (with `check_replicas`) in value; [`Error::Cancelled`];
/// [`Error::Timeout`].
///
/// # Example
/// See the [module example](super) for the group; then
/// `distributed::classifier_loss(&group, &ctx, x.view(), &labels, w_shard.view(), &cfg)?`.
pub fn classifier_loss(
    group: &Group,
    ctx: &Context,
    embeddings: ArrayView2<'_, f32>,
    labels: &[i64],
    weights: ArrayView2<'_, f32>,
    cfg: &DistributedClassifierConfig,
) -> Result<ClassifierLoss> {
    let kind = cfg.loss.kind;
    let (per, on_rows) = (kind.centres_per_class(), kind.classes_on_rows());
    let d = embeddings.ncols();
    let centres = if on_rows {
        weights.nrows()
    } else {
        weights.ncols()
    };
    let local = (|| {
        validate::finite(OP, "embeddings", embeddings)?;
        if labels.len() != embeddings.nrows() {
            return Err(Error::Shape {
                op: OP,
                what: "labels",
                expected: format!("({},) to match embeddings", embeddings.nrows()),
                got: vec![labels.len()],
            });
        }
        cfg.loss.hooks.check(OP)
    })();
    group.agree(OP, local)?;
    // Every mode decides which collectives run: the same everywhere, or none runs.
    let modes =
        u64::from(cfg.check_replicas) << 2 | (cfg.weights as u64) << 1 | cfg.gradients as u64;
    group.same_everywhere(
        OP,
        &[
            ("loss", fingerprint(&kind)),
            ("weights, gradients and check_replicas modes", modes),
            ("d", d as u64),
        ],
    )?;
    let shapes = group.all_gather(OP, &[embeddings.nrows() as u64, centres as u64])?;
    let rows_of: Vec<usize> = shapes.iter().step_by(2).map(|&n| n as usize).collect();
    let centres_of: Vec<usize> = shapes
        .iter()
        .skip(1)
        .step_by(2)
        .map(|&n| n as usize)
        .collect();
    let (first, classes, mine) = class_range(group, cfg.weights, &centres_of, per)?;
    if cfg.weights == ClassWeights::Replicated && cfg.check_replicas {
        let sum = checksum(weights);
        group.same_everywhere(OP, &[("replicated weights' checksum", sum)])?;
    }
    let weights = match (cfg.weights, on_rows) {
        (ClassWeights::Sharded, _) => weights,
        (ClassWeights::Replicated, true) => weights.slice_move(s![mine.clone(), ..]),
        (ClassWeights::Replicated, false) => weights.slice_move(s![.., mine.clone()]),
    };
    let x = gather_rows(group, embeddings)?;
    let y = group.all_gather(OP, labels)?;
    let shard = ClassShard {
        first_class: first,
        classes,
        rows_of,
    };
    let mut out = classifier_loss_sharded(
        ctx,
        x.view(),
        &y,
        weights,
        &cfg.loss,
        &shard,
        &GroupCollectives(group),
    )?;
    if cfg.gradients == RankGradients::Averaged {
        out.grad *= group.size() as f32;
    }
    if cfg.weights == ClassWeights::Replicated {
        out.weight_grad = gather_classes(group, out.weight_grad, on_rows)?;
    }
    Ok(out)
}

/// This rank's first class, the classes over every rank, and its centres in its `weights`
/// (all of them when sharded).
fn class_range(
    group: &Group,
    mode: ClassWeights,
    centres_of: &[usize],
    per: usize,
) -> Result<(usize, usize, Range<usize>)> {
    let rank = group.rank();
    let classes_of: Vec<usize> = centres_of.iter().map(|&c| c / per).collect();
    match mode {
        ClassWeights::Sharded => {
            let first = classes_of[..rank].iter().sum();
            Ok((first, classes_of.iter().sum(), 0..centres_of[rank]))
        }
        ClassWeights::Replicated => {
            let classes = classes_of[0];
            if classes_of.iter().any(|&c| c != classes) || classes < group.size() {
                return Err(Error::InvalidParameter {
                    op: OP,
                    what: "replicated weights' classes on each rank",
                    value: format!("{classes_of:?}"),
                    rule: "the same on every rank, and at least one class per rank",
                });
            }
            let cut = |r: usize| classes * r / group.size();
            let (c0, c1) = (cut(rank), cut(rank + 1));
            Ok((c0, classes, c0 * per..c1 * per))
        }
    }
}

/// A checksum of `w`'s values, bit for bit in logical order (FNV-1a over 32-bit words).
fn checksum(w: ArrayView2<'_, f32>) -> u64 {
    let mut sum = Fnv::new();
    w.iter().for_each(|v| sum.word(v.to_bits()));
    sum.0
}

/// Every rank's rows `(Σ b_r, d)` (embeddings, or a weight gradient's classes), in rank order.
fn gather_rows(group: &Group, x: ArrayView2<'_, f32>) -> Result<Array2<f32>> {
    let d = x.ncols();
    let flat: Vec<f32> = x.iter().copied().collect();
    let all = group.all_gather(OP, &flat)?;
    Array2::from_shape_vec((all.len() / d.max(1), d), all).map_err(|_| Error::Shape {
        op: OP,
        what: "gathered rows",
        expected: format!("(n, {d})"),
        got: vec![],
    })
}

/// The whole weight gradient from every rank's classes', in the weights' layout.
fn gather_classes(group: &Group, part: Array2<f32>, on_rows: bool) -> Result<Array2<f32>> {
    // As `(centres, d)` rows, the classes in rank order.
    let rows = if on_rows { part } else { part.reversed_axes() };
    let whole = gather_rows(group, rows.view())?;
    Ok(if on_rows {
        whole
    } else {
        whole.reversed_axes().as_standard_layout().into_owned()
    })
}

/// The group's collectives for [`classifier_loss_sharded`], every wait bounded by its timeout.
struct GroupCollectives<'a>(&'a Group);

impl ShardCollectives for GroupCollectives<'_> {
    fn rank(&self) -> usize {
        self.0.rank()
    }

    fn size(&self) -> usize {
        self.0.size()
    }

    fn all_gather(&self, values: &[f64]) -> Result<Vec<f64>> {
        self.0.all_gather(OP, values)
    }

    fn reduce_scatter(&self, send: Vec<f64>, block: usize) -> Result<Vec<f64>> {
        self.0.reduce_scatter_sum(OP, send, block)
    }

    fn agree(&self, op: &'static str, local: Result<()>) -> Result<()> {
        self.0.agree(op, local)
    }
}
