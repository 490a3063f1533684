#![doc = include_str!("../README.md")]

mod context;
mod distance;
mod error;
pub mod kernels;
mod memory;
mod native;
mod plan;
pub mod reference;
mod transfer;
mod triplets;
mod validate;

pub use context::{
    list_adapters, AdapterSelector, AdapterSummary, BackendChoice, ComputePath, Context,
    ContextConfig, DEFAULT_BUDGET_BYTES, DEFAULT_CPU_BUDGET_BYTES,
};
pub use distance::{
    pairwise_distances, pairwise_distances_plan, Distance, DistanceConfig, PairwiseDistances,
};
pub use error::{Error, Result};
pub use kernels::WGSL_SOURCES;
pub use triplets::{
    count_triplets, mine_triplets, mine_triplets_streaming, MiningSet, SelfExclusion,
    TripletConfig, TripletCount, TripletRule, TripletType, Triplets,
};
pub use memory::MemoryStats;
pub use plan::{plan_rows, plan_tiles, DeviceCaps, Footprint, TilePlan};
