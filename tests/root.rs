//! The integration tests, as one binary (wgpu's `tests/root.rs` habit): one link instead of
//! one per file, and one executable to carry to a machine with a GPU. Every kernel stem has
//! its module in `tests/kernels/<stem>.rs` (`shaders::every_stem_has_its_four_files` checks
//! that), every operation family its own in `tests/ops/<op>.rs`; what cuts across them
//! (contexts, bad inputs, cancellation, plans, the CLI, the layout) sits here.
//!
//! GPU tests share one context per binary (`common::shared_gpu`); under `WML_REQUIRE_GPU=1` a
//! missing adapter fails them instead of skipping.

mod common;

mod bad_inputs;
mod cancel;
#[cfg(feature = "cli")]
mod cli;
#[cfg(feature = "cli")]
mod cli_weights;
mod concurrency;
mod context;
mod front_doors;
mod kernels;
mod modules;
mod oom_retry;
mod ops;
mod plans;
mod shaders;
mod soak;
mod transfers;
