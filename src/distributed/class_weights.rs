//! Class-weight checkpoints over the ranks: every rank saves the shard it holds, then rank 0
//! names them all in the manifest; every rank loads the classes of an even split over the
//! group, however many ranks saved them (re-sharding). The files go to a directory every rank
//! sees (a shared file system).

use std::ops::Range;
use std::path::Path;

use super::Group;
use crate::context::Context;
use crate::data::files::Fnv;
use crate::error::Result;
use crate::ops::class_weights::{
    checkpoint_classes, load_weights, save_id, save_shard, save_weights_manifest, shard_file,
    LoadedWeights, ShardRecord, WeightsShard,
};
use crate::ops::loss::ClassifierKind;

/// Saves every rank's `shard` of class weights (with its optimizer state) into `dir`, then
/// the manifest naming them all (written by rank 0 once every shard is saved), so that a
/// checkpoint is whole or the previous one stays (collective). The shards must cover every
/// class once, as [`crate::distributed::classifier_loss`]'s sharded weights do.
///
/// # Errors
/// As [`crate::save_weights_shard`] and [`save_weights_manifest`] on the rank where it failed,
/// [`crate::Error::RankFailed`] on the others; [`crate::Error::InvalidParameter`] for ranks
/// whose `classes` or steps differ.
///
/// # Example
/// ```no_run
/// use wgpu_metric_learning::distributed::{mpi, save_class_weights, Group, GroupConfig};
/// use wgpu_metric_learning::{ClassifierKind, OptimizerState, WeightOptimizer, WeightsShard};
/// let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Funneled).expect("MPI");
/// let group = Group::new(&universe.world(), &GroupConfig::default());
/// let (kind, opt, state) = (ClassifierKind::arc_face(), WeightOptimizer::default(), OptimizerState::new());
/// let w = ndarray::Array2::<f32>::zeros((128, 1000)); // this rank's 1 000 classes
/// let first_class = 1000 * group.rank();
/// let shard = WeightsShard { kind: &kind, classes: 1000 * group.size(), first_class, weights: w.view(), optimizer: &opt, state: &state };
/// save_class_weights(&group, "ckpt".as_ref(), &shard)?;
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn save_class_weights(group: &Group, dir: &Path, shard: &WeightsShard<'_>) -> Result<()> {
    const OP: &str = "distributed save_class_weights";
    let steps = shard.state.steps();
    // The settings every shard must share: the loss's layout, the dimension, the optimizer.
    let kind = shard.kind;
    let d = match kind.classes_on_rows() {
        true => shard.weights.ncols(),
        false => shard.weights.nrows(),
    };
    let (code, settings) = shard.optimizer.stored();
    let mut optimizer = Fnv::new();
    optimizer.update(&code.to_le_bytes());
    settings
        .iter()
        .for_each(|v| optimizer.update(&v.to_le_bytes()));
    group.same_everywhere(
        OP,
        &[
            ("classes", shard.classes as u64),
            ("steps", steps),
            ("d", d as u64),
            ("centres per class", kind.centres_per_class() as u64),
            ("classes on rows", u64::from(kind.classes_on_rows())),
            ("optimizer", optimizer.0),
        ],
    )?;
    let id = save_id();
    let record = group.agree(OP, save_shard(dir, shard, id))?;
    let mine = [
        record.first_class as u64,
        record.classes as u64,
        record.bytes,
        record.checksum,
        id,
    ];
    let all = group.all_gather(OP, &mine)?;
    let written = match group.rank() {
        0 => {
            let records: Vec<ShardRecord> = all
                .chunks_exact(5)
                .map(|c| {
                    let (first, n) = (c[0] as usize, c[1] as usize);
                    ShardRecord {
                        file: shard_file(first, n, steps, c[4]),
                        first_class: first,
                        classes: n,
                        bytes: c[2],
                        checksum: c[3],
                    }
                })
                .collect();
            save_weights_manifest(dir, shard.classes, &records)
        }
        _ => Ok(()),
    };
    group.agree(OP, written)
}

/// Loads, on every rank, the classes of an even split of the checkpoint in `dir` over the
/// group (rank `r` of `n` holds classes `C·r/n .. C·(r+1)/n`), with the optimizer's state cut
/// alike, whatever number of ranks saved it (collective). Returns the rank's class range and
/// what [`load_weights`] returns for it.
///
/// # Errors
/// As [`load_weights`] on the rank where it failed, [`crate::Error::RankFailed`] on the
/// others; [`crate::Error::InvalidParameter`] when the ranks read manifests of different
/// classes.
///
/// # Example
/// ```no_run
/// use wgpu_metric_learning::distributed::{mpi, load_class_weights, Group, GroupConfig};
/// use wgpu_metric_learning::{BackendChoice, ClassifierKind, ContextConfig};
/// let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Funneled).expect("MPI");
/// let group = Group::new(&universe.world(), &GroupConfig::default());
/// let ctx = group.context(&ContextConfig { backend: BackendChoice::NativeCpu, ..Default::default() })?;
/// let (classes, loaded) = load_class_weights(&group, &ctx, "ckpt".as_ref(), &ClassifierKind::arc_face())?;
/// println!("rank {} holds classes {classes:?}", group.rank());
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn load_class_weights(
    group: &Group,
    ctx: &Context,
    dir: &Path,
    kind: &ClassifierKind,
) -> Result<(Range<usize>, LoadedWeights)> {
    const OP: &str = "distributed load_class_weights";
    let classes = group.agree(OP, checkpoint_classes(OP, dir))?;
    group.same_everywhere(OP, &[("checkpoint classes", classes as u64)])?;
    let (rank, size) = (group.rank(), group.size());
    // In u128: `classes · size` fits whatever the classes.
    let cut = |r: usize| (classes as u128 * r as u128 / size as u128) as usize;
    let range = cut(rank)..cut(rank + 1);
    let loaded = group.agree(OP, load_weights(ctx, dir, kind, range.clone()))?;
    Ok((range, loaded))
}
