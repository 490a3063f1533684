//! One front door per operation family: every public operation has its `_plan` and its
//! `_on_device` variant, or a reason written down here; and the miners' door (`mine`,
//! `mine_plan`, `mine_on_device`) gives, for every miner config, what the miner's PML-named
//! function gives.

use std::collections::BTreeSet;
use std::path::Path;

use crate::common;

use ndarray::{Array1, Array2};
use wgpu_metric_learning::{
    all_pairs, angular_triplets, batch_easy_hard_pairs, batch_hard_triplets,
    distance_weighted_triplets, hdc_pairs, mine, mine_on_device, mine_plan, mine_triplets,
    multi_similarity_pairs, pair_margin_pairs, uniform_histogram_pairs, AllPairsConfig,
    AngularConfig, BatchEasyHardConfig, BatchHardConfig, ComputePath, Context,
    DistanceWeightedConfig, Error, HdcConfig, MiningSet, MultiSimilarityConfig, PairMarginConfig,
    Pairs, TripletConfig, TripletType, Triplets, UniformHistogramConfig,
};

/// `(operation, its plan, its device variant)`; `None` with the reason in the comment.
const OPERATIONS: &[(&str, Option<&str>, Option<&str>)] = &[
    // The whole (b, m) matrix is the result: left on the device it would be the one thing
    // the library exists to avoid; knn_on_device is the device result of a distance search.
    ("pairwise_distances", Some("pairwise_distances_plan"), None),
    ("knn", Some("knn_plan"), Some("knn_on_device")),
    // Shards are the caller's: each is a knn call with its own plan (knn_plan) and result.
    ("knn_sharded", None, None),
    // Label statistics over the neighbour lists, returned as numbers: nothing to leave.
    ("accuracy", Some("accuracy_plan"), None),
    // Centroids and assignments are small and read by the host between iterations.
    ("kmeans", Some("kmeans_plan"), None),
    ("mine", Some("mine_plan"), Some("mine_on_device")),
    (
        "mine_triplets",
        Some("mine_triplets_plan"),
        Some("mine_triplets_on_device"),
    ),
    // Streaming hands each chunk to a host callback (its plan is mine_triplets_plan's).
    ("mine_triplets_streaming", None, None),
    // Label arithmetic: no distance, no memory to plan, a count to return.
    ("count_triplets", None, None),
    // The losses' gradients are host arrays for the autograd framework that called them.
    ("ntxent_loss", Some("ntxent_loss_plan"), None),
    (
        "multiple_negatives_ranking_loss",
        Some("multiple_negatives_ranking_loss_plan"),
        None,
    ),
    (
        "triplet_margin_loss",
        Some("triplet_margin_loss_plan"),
        None,
    ),
    ("pair_loss", Some("pair_loss_plan"), None),
    (
        "dynamic_soft_margin_loss",
        Some("dynamic_soft_margin_loss_plan"),
        None,
    ),
    ("vicreg_loss", Some("vicreg_loss_plan"), None),
    ("classifier_loss", Some("classifier_loss_plan"), None),
    // One process's part of the same loss: the native path, as classifier_loss.
    (
        "classifier_loss_sharded",
        Some("classifier_loss_sharded_plan"),
        None,
    ),
    // An element-wise update of host weights the caller holds (as the losses' gradients).
    ("weights_step", Some("weights_step_plan"), None),
    // Files: a row buffer beside what is saved, or what is loaded and returned.
    ("save_weights", None, None),
    ("save_weights_shard", None, None),
    ("save_weights_manifest", None, None),
    ("load_weights", None, None),
    ("export_weights_npy", None, None),
    ("weights_checkpoint_classes", None, None),
    // Label statistics of two clusterings, O(n) on the host.
    ("normalized_mutual_info", None, None),
    ("adjusted_mutual_info", None, None),
];

/// The PML names of the miners: thin aliases of [`mine`] (planned by `mine_plan`, left on the
/// device by `mine_on_device`).
const MINER_ALIASES: &[&str] = &[
    "all_pairs",
    "pair_margin_pairs",
    "multi_similarity_pairs",
    "batch_easy_hard_pairs",
    "batch_hard_triplets",
    "angular_triplets",
    "hdc_pairs",
    "distance_weighted_triplets",
    "uniform_histogram_pairs",
];

/// Not operations: the adapter list, the shipped GEMM kernels' sources and the native loops'
/// vector set.
const NOT_OPERATIONS: &[&str] = &["list_adapters", "gemm_kernels", "native_isa"];

/// The lowercase names `src/lib.rs` re-exports (its functions).
fn exported_functions() -> BTreeSet<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    crate::modules::root_exports(&src)
        .into_keys()
        .filter(|name| {
            name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                && name.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        })
        .collect()
}

#[test]
fn every_public_operation_has_its_plan_and_device_variant_or_a_reason() {
    let exported = exported_functions();
    assert!(
        exported.contains("knn") && exported.contains("mine_on_device"),
        "read the exports: {exported:?}"
    );
    let mut covered: BTreeSet<&str> = NOT_OPERATIONS.iter().copied().collect();
    covered.extend(MINER_ALIASES);
    for &(op, plan, device) in OPERATIONS {
        for name in std::iter::once(op).chain(plan).chain(device) {
            assert!(exported.contains(name), "{name} is not exported");
            covered.insert(name);
        }
    }
    let uncovered: Vec<&String> = exported
        .iter()
        .filter(|f| !covered.contains(f.as_str()))
        .collect();
    assert!(
        uncovered.is_empty(),
        "public functions missing from the operations table (add their plan and device \
         variant, or a reason): {uncovered:?}"
    );
}

fn data(n: usize, d: usize, classes: usize) -> (Array2<f32>, Array1<u32>) {
    let x = Array2::from_shape_fn((n, d), |(i, k)| {
        ((i as f32 * 0.61 + k as f32 * 1.7).sin() * 2.0).fract()
    });
    let y = Array1::from_shape_fn(n, |i| (i % classes) as u32);
    (x, y)
}

fn same_pairs(what: &str, a: &Pairs, b: &Pairs) {
    assert_eq!(a.positives, b.positives, "{what}: positives");
    assert_eq!(a.negatives, b.negatives, "{what}: negatives");
}

/// Each config through the door on `ctx`: the same rows as its PML-named function, a plan,
/// and (on a wgpu context) the same rows left on the device.
fn through_the_door(ctx: &Context, set: &MiningSet<'_, u32>, refs: Option<&MiningSet<'_, u32>>) {
    macro_rules! pairs {
        ($cfg:expr, $f:ident) => {{
            let cfg = $cfg;
            let what = stringify!($f);
            let host = mine(ctx, set, refs, &cfg).expect(what);
            same_pairs(what, &host, &$f(ctx, set, refs, &cfg).expect(what));
            mine_plan(ctx, set, refs, &cfg).expect(what);
            match mine_on_device(ctx, set, refs, &cfg) {
                Ok(on) => {
                    assert_eq!(
                        on.positives.to_host(ctx).expect(what),
                        host.positives,
                        "{what}"
                    );
                    assert_eq!(
                        on.negatives.to_host(ctx).expect(what),
                        host.negatives,
                        "{what}"
                    );
                }
                Err(Error::InvalidParameter { .. }) if ctx.path() == ComputePath::NativeCpu => {}
                Err(e) => panic!("{what} on device: {e}"),
            }
        }};
    }
    macro_rules! triplets {
        ($cfg:expr, $f:ident) => {{
            let cfg = $cfg;
            let what = stringify!($f);
            let host: Triplets = mine(ctx, set, refs, &cfg).expect(what);
            assert_eq!(
                host.indices,
                $f(ctx, set, refs, &cfg).expect(what).indices,
                "{what}"
            );
            mine_plan(ctx, set, refs, &cfg).expect(what);
            match mine_on_device(ctx, set, refs, &cfg) {
                Ok(on) => {
                    assert_eq!(
                        on.triplets.to_host(ctx).expect(what),
                        host.indices,
                        "{what}"
                    )
                }
                Err(Error::InvalidParameter { .. }) if ctx.path() == ComputePath::NativeCpu => {}
                Err(e) => panic!("{what} on device: {e}"),
            }
        }};
    }
    pairs!(AllPairsConfig::default(), all_pairs);
    pairs!(PairMarginConfig::default(), pair_margin_pairs);
    pairs!(MultiSimilarityConfig::default(), multi_similarity_pairs);
    pairs!(BatchEasyHardConfig::default(), batch_easy_hard_pairs);
    pairs!(HdcConfig::default(), hdc_pairs);
    pairs!(UniformHistogramConfig::default(), uniform_histogram_pairs);
    triplets!(BatchHardConfig::default(), batch_hard_triplets);
    triplets!(AngularConfig::default(), angular_triplets);
    triplets!(
        DistanceWeightedConfig::default(),
        distance_weighted_triplets
    );
    triplets!(
        TripletConfig::margin_miner(TripletType::Semihard),
        mine_triplets
    );
    triplets!(TripletConfig::default(), mine_triplets);
}

#[test]
fn every_miner_config_goes_through_the_same_door() {
    let (x, y) = data(40, 6, 4);
    let (r, ry) = data(33, 6, 4);
    let (set, refs) = (MiningSet::new(&x, &y), MiningSet::new(&r, &ry));
    let native = Context::native_cpu(None);
    through_the_door(&native, &set, None);
    through_the_door(&native, &set, Some(&refs));
    if let Some(gpu) = common::shared_gpu() {
        through_the_door(gpu, &set, None);
        through_the_door(gpu, &set, Some(&refs));
    }
}
