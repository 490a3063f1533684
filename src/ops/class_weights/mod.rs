//! Class weights that outlive a call: an optimizer step on a process's shard of them
//! (torch's SGD and AdamW, [`optimizer`]) and checkpoints of the shards with that state,
//! which load on any number of processes and export as one `.npy` ([`checkpoint`]).
//!
//! The class-weight losses ([`crate::classifier_loss`], [`crate::classifier_loss_sharded`])
//! return each process's weight gradient; with these, a Rust program trains the weights it
//! holds (`weights_step`), saves them (`save_weights_shard`, then `save_weights_manifest`
//! once every shard is saved) and resumes on another world size (`load_weights` of the
//! range each process now holds). Python users keep torch's optimizers; their state and the
//! weights go into the same checkpoints (`wgpu_metric_learning.distributed.save_class_weights`,
//! on `OptimizerState::restored`), and `wml weights step|export` does it from the command
//! line.

mod checkpoint;
mod checkpoint_read;
mod optimizer;

// The distributed save and load (feature `mpi`).
pub use checkpoint::{
    save_weights, save_weights_manifest, save_weights_shard, ShardRecord, WeightsShard,
};
pub use checkpoint_read::{
    export_weights_npy, load_weights, weights_checkpoint_classes, LoadedWeights,
};
pub use optimizer::{weights_step, weights_step_plan, OptimizerState, WeightOptimizer};
#[cfg(feature = "mpi")]
pub(crate) use {
    checkpoint::{save_id, save_shard, shard_file},
    checkpoint_read::checkpoint_classes,
};
