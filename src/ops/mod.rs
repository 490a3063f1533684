//! The operations, one folder per family: `mod.rs` holds the public API (calls, config and
//! result types), `plan.rs` the sizing, `gpu.rs` the device path and `native.rs` the CPU
//! path. Exceptions: `accuracy`, `kmeans` and `mutual_info` are single files (host logic over
//! `knn`), and `bank` has no native path of its own (its CPU mode keeps the rows on the
//! host inside the same type). Operations may use each other without cycles; nothing below
//! imports them.

pub(crate) mod accuracy;
pub(crate) mod bank;
pub(crate) mod class_weights;
pub(crate) mod distance;
pub(crate) mod kmeans;
pub(crate) mod knn;
pub(crate) mod loss;
pub(crate) mod miners;
pub(crate) mod mutual_info;
pub(crate) mod triplets;
