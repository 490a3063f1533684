#![doc = include_str!("../README.md")]

mod accuracy;
mod bank;
mod context;
mod device_rows;
mod distance;
mod error;
mod host_alloc;
pub mod kernels;
mod knn;
mod memory;
mod miners;
mod mining_set;
mod native;
mod oom_retry;
mod plan;
mod progress;
pub mod reference;
mod transfer;
mod triplets;
mod validate;

pub use accuracy::{
    accuracy, accuracy_with_progress, Accuracy, AccuracyConfig, AccuracyK, AccuracyMetrics,
};
pub use bank::{BankConfig, BankRows, BankSnapshot, Enqueued, MemoryBank};
pub use context::{
    list_adapters, AdapterSelector, AdapterSummary, BackendChoice, ComputePath, Context,
    ContextConfig, DEFAULT_BUDGET_BYTES, DEFAULT_CPU_BUDGET_BYTES,
};
pub use distance::{
    pairwise_distances, pairwise_distances_plan, Distance, DistanceConfig, PairwiseDistances,
};
pub use error::{Error, Result};
pub use kernels::WGSL_SOURCES;
pub use knn::{knn, knn_sharded, knn_with_progress, Knn, KnnConfig};
pub use memory::MemoryStats;
pub use miners::{
    all_pairs, batch_easy_hard_pairs, batch_hard_triplets, multi_similarity_pairs,
    pair_margin_pairs, BatchEasyHardConfig, BatchHardConfig, MultiSimilarityConfig,
    PairMarginConfig, Pairs, Strategy,
};
pub use mining_set::{Embeddings, MiningSet, SelfExclusion};
pub use plan::{plan_rows, plan_tiles, DeviceCaps, Footprint, TilePlan};
pub use progress::{Progress, ProgressFn};
pub use triplets::{
    count_triplets, mine_triplets, mine_triplets_streaming, CountMethod, TripletConfig,
    TripletCount, TripletRule, TripletType, Triplets,
};
