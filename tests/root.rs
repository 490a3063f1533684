//! The integration tests, as one binary (wgpu's `tests/root.rs` habit): one link instead of
//! one per file, and one executable to carry to a machine with a GPU. Every kernel stem has
//! its module here (`tests/<stem>.rs`); `shaders::every_stem_has_its_four_files` checks that.
//!
//! GPU tests share one context per binary (`common::shared_gpu`); under `WML_REQUIRE_GPU=1` a
//! missing adapter fails them instead of skipping.

mod common;

mod accuracy;
mod bad_inputs;
mod cancel;
mod checkpoint;
#[cfg(feature = "cli")]
mod cli;
mod concurrency;
mod context;
mod device_inputs;
mod distance_tile;
mod front_doors;
mod gemm_tile;
mod info_nce_weights;
mod kmeans;
mod knn_select;
mod knn_sort;
mod loss_backward;
mod memory_bank;
mod miners;
mod modules;
mod negative_buckets;
mod ntxent_loss;
mod oom_retry;
mod pair_select;
mod plans;
mod row_norms;
mod sampling_miners;
mod shaders;
mod soak;
mod transfers;
mod triplet_expand;
mod triplet_lists;
mod triplet_margin_loss;
mod triplet_select;
mod triplet_weights;
