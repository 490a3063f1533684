#![doc = include_str!("../README.md")]

// The layers, top to bottom (`tests/modules.rs` fails on an import that runs up):
// ops -> data -> context -> kernels -> runtime -> the leaf files below.
mod context;
mod data;
#[cfg(feature = "mpi")]
pub mod distributed;
mod error;
mod hooks;
mod kernels;
mod metric;
mod ops;
// The plain ndarray oracles of the kernels, for tests (this crate's turn the feature on).
#[cfg(any(test, feature = "reference"))]
pub mod reference;
mod rng;
mod runtime;
mod validate;

pub use context::plan::Plan;
pub use context::{
    list_adapters, AdapterSelector, AdapterSummary, BackendChoice, ComputePath, Context,
    ContextConfig, DistanceKernel, NativeKnnKernel, ShaderChecks, TuneReport, Tuning,
    DEFAULT_BUDGET_BYTES, DEFAULT_CPU_BUDGET_BYTES,
};
pub use data::device_embeddings::DeviceEmbeddings;
pub use data::device_output::{DeviceArray, DeviceElement};
pub use data::inputs::{BankRows, Embeddings, MiningSet, SelfExclusion};
pub use error::{Error, Result};
pub use hooks::{CancelToken, Hooks, Progress};
pub use kernels::gemm_tile::{gemm_kernels, GemmVariant, GEMM_CANDIDATES};
pub use kernels::{WgslKernel, WGSL_KERNELS};
pub use metric::{Distance, DistanceConfig};
pub use ops::accuracy::{
    accuracy, accuracy_plan, Accuracy, AccuracyConfig, AccuracyK, AccuracyMetric, AccuracyMetrics,
};
pub use ops::bank::{BankConfig, BankSnapshot, CheckpointLabel, Enqueued, MemoryBank, Saved};
pub use ops::class_weights::{
    export_weights_npy, load_weights, save_weights, save_weights_manifest, save_weights_shard,
    weights_checkpoint_classes, weights_step, weights_step_plan, LoadedWeights, OptimizerState,
    ShardRecord, WeightOptimizer, WeightsShard,
};
pub use ops::distance::{
    pairwise_distances, pairwise_distances_plan, PairwiseConfig, PairwiseDistances,
};
pub use ops::kmeans::{kmeans, kmeans_plan, Kmeans, KmeansConfig};
pub use ops::knn::{knn, knn_on_device, knn_plan, knn_sharded, Knn, KnnConfig, KnnOnDevice};
pub use ops::loss::{
    classifier_loss, classifier_loss_plan, classifier_loss_sharded, classifier_loss_sharded_plan,
    dynamic_soft_margin_loss, dynamic_soft_margin_loss_plan, multiple_negatives_ranking_loss,
    multiple_negatives_ranking_loss_plan, ntxent_loss, ntxent_loss_plan, pair_loss, pair_loss_plan,
    triplet_margin_loss, triplet_margin_loss_plan, vicreg_loss, vicreg_loss_plan, Angular, Circle,
    ClassSampling, ClassShard, ClassifierKind, ClassifierLoss, ClassifierLossConfig,
    ClassifierOptions, Contrastive, DynamicSoftMargin, DynamicSoftMarginConfig,
    DynamicSoftMarginLoss, FastAp, GeneralizedLifted, Histogram, InfoNceConfig, InfoNceLoss,
    Instance, IntraPairVariance, LiftedStructure, Margin, MarginGrad, Matryoshka, MnrlConfig,
    MultiSimilarity, NPairs, Nca, PairLoss, PairLossConfig, PairLossRule, Pnp, PnpVariant,
    RankedList, ShardCollectives, SnrContrastive, SupCon, ThresholdConsistentMargin, TripletLoss,
    TripletLossConfig, TupletMargin, VicRegConfig, VicRegLoss,
};
pub use ops::miners::{
    all_pairs, angular_triplets, batch_easy_hard_pairs, batch_hard_triplets,
    distance_weighted_triplets, hdc_pairs, mine, mine_on_device, mine_plan, multi_similarity_pairs,
    pair_margin_pairs, uniform_histogram_pairs, AllPairsConfig, AngularConfig, BatchEasyHardConfig,
    BatchHardConfig, DeviceMinerConfig, DistanceWeightedConfig, HdcConfig, MinerConfig,
    MultiSimilarityConfig, PairMarginConfig, PairMinerConfig, PairRule, Pairs, PairsOnDevice,
    Strategy, UniformHistogramConfig,
};
pub use ops::mutual_info::{adjusted_mutual_info, normalized_mutual_info};
pub use ops::triplets::{
    count_triplets, mine_triplets, mine_triplets_on_device, mine_triplets_plan,
    mine_triplets_streaming, CountMethod, TripletConfig, TripletCount, TripletRule, TripletType,
    Triplets, TripletsOnDevice,
};
pub use runtime::memory::{HostTimes, KernelTime, KernelTimes, MemoryStats, Transfers};
pub use runtime::simd::native_isa;
