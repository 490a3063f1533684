#![doc = include_str!("../README.md")]

mod accuracy;
mod bank;
mod context;
mod device;
mod device_embeddings;
mod device_output;
mod device_rows;
mod distance;
#[cfg(feature = "mpi")]
pub mod distributed;
mod error;
mod hooks;
mod host_alloc;
mod inputs;
mod kernels;
mod kmeans;
mod knn;
mod loss;
mod memory;
mod metric;
mod miners;
mod mutual_info;
mod native;
mod oom_retry;
mod plan;
pub mod reference;
mod rng;
mod transfer;
mod triplets;
mod validate;

pub use accuracy::{
    accuracy, accuracy_plan, Accuracy, AccuracyConfig, AccuracyK, AccuracyMetric, AccuracyMetrics,
};
pub use bank::{BankConfig, BankSnapshot, CheckpointLabel, Enqueued, MemoryBank, Saved};
pub use context::{
    list_adapters, AdapterSelector, AdapterSummary, BackendChoice, ComputePath, Context,
    ContextConfig, DistanceKernel, NativeKnnKernel, ShaderChecks, TuneReport, Tuning,
    DEFAULT_BUDGET_BYTES, DEFAULT_CPU_BUDGET_BYTES,
};
pub use device_embeddings::DeviceEmbeddings;
pub use device_output::{DeviceArray, DeviceElement};
pub use distance::{
    pairwise_distances, pairwise_distances_plan, PairwiseConfig, PairwiseDistances,
};
pub use error::{Error, Result};
pub use hooks::{CancelToken, Hooks, Progress};
pub use inputs::{BankRows, Embeddings, MiningSet, SelfExclusion};
pub use kernels::gemm_tile::{gemm_kernels, GemmVariant, GEMM_CANDIDATES};
pub use kernels::{WgslKernel, WGSL_KERNELS};
pub use kmeans::{kmeans, Kmeans, KmeansConfig};
pub use knn::{knn, knn_on_device, knn_plan, knn_sharded, Knn, KnnConfig, KnnOnDevice};
pub use loss::{
    multiple_negatives_ranking_loss, ntxent_loss, triplet_margin_loss, InfoNceConfig, InfoNceLoss,
    MnrlConfig, TripletLoss, TripletLossConfig,
};
pub use memory::{HostTimes, KernelTime, KernelTimes, MemoryStats, Transfers};
pub use metric::{Distance, DistanceConfig};
pub use miners::{
    all_pairs, angular_triplets, batch_easy_hard_pairs, batch_hard_triplets,
    distance_weighted_triplets, hdc_pairs, mine_pairs_on_device, miners_plan,
    multi_similarity_pairs, pair_margin_pairs, uniform_histogram_pairs, AllPairsConfig,
    AngularConfig, BatchEasyHardConfig, BatchHardConfig, DistanceWeightedConfig, HdcConfig,
    MinerConfig, MultiSimilarityConfig, PairMarginConfig, PairMinerConfig, PairRule, Pairs,
    PairsOnDevice, Strategy, UniformHistogramConfig,
};
pub use mutual_info::{adjusted_mutual_info, normalized_mutual_info};
pub use plan::Plan;
pub use triplets::{
    count_triplets, mine_triplets, mine_triplets_on_device, mine_triplets_plan,
    mine_triplets_streaming, CountMethod, TripletConfig, TripletCount, TripletRule, TripletType,
    Triplets, TripletsOnDevice,
};
