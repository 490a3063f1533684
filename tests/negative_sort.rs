//! The sorted-negatives count (kernel `negative_sort`, then `triplet_select`'s binary-search
//! `count`, and its host twin on the native path) against the plain triple-loop reference:
//! exact counts for every margin rule and distance, with many ties, negative and zero margins,
//! and negative lists on both sides of a power of two.

mod common;

use ndarray::{Array1, Array2};
use proptest::prelude::*;
use wgpu_metric_learning::reference::triplet_select::triplet_select;
use wgpu_metric_learning::{
    count_triplets, pairwise_distances, Context, CountMethod, Distance, DistanceConfig, MiningSet,
    SelfExclusion, TripletConfig, TripletRule, TripletType,
};

const KINDS: [TripletType; 4] = [
    TripletType::All,
    TripletType::Hard,
    TripletType::Semihard,
    TripletType::Easy,
];

const DISTANCES: [Distance; 4] = [
    Distance::Euclidean,
    Distance::SquaredEuclidean,
    Distance::Cosine,
    Distance::DotProduct,
];

/// Counts on `ctx` and checks them against the reference on the distances `ctx` computes.
fn check(
    ctx: &Context,
    labels: &Array1<u32>,
    emb: &Array2<f32>,
    refs: &(Array1<u32>, Array2<f32>),
    cfg: &TripletConfig,
) {
    let queries = MiningSet::with_embeddings(labels.view(), emb.view());
    let ref_set = MiningSet::with_embeddings(refs.0.view(), refs.1.view());
    let got = count_triplets(ctx, &queries, Some(&ref_set), cfg).expect("count");
    let distances = pairwise_distances(ctx, emb.view(), refs.1.view(), &cfg.distance)
        .expect("distances")
        .values;
    let slots = match &cfg.self_exclusion {
        SelfExclusion::QuerySlots(s) => s.clone(),
        _ => vec![u32::MAX; labels.len()],
    };
    let want = triplet_select(
        labels.as_slice().expect("contiguous"),
        refs.0.as_slice().expect("contiguous"),
        &slots,
        Some(distances.view()),
        &cfg.rule,
        cfg.distance.distance.is_similarity(),
    );
    assert_eq!(
        got.count,
        want.nrows() as u64,
        "{:?} {:?} on {}",
        cfg.rule,
        cfg.distance,
        ctx.device_name()
    );
}

/// Values on a coarse grid, so equal distances (tm exactly 0 or margin) are frequent.
fn grid(rows: usize, d: usize) -> impl Strategy<Value = Array2<f32>> {
    proptest::collection::vec(-2i8..=2, rows * d).prop_map(move |v| {
        Array2::from_shape_vec(
            (rows, d),
            v.into_iter().map(|x| f32::from(x) * 0.5).collect(),
        )
        .expect("sized")
    })
}

/// Queries, their embeddings, the references and the config of one count.
type Case = (
    Array1<u32>,
    Array2<f32>,
    (Array1<u32>, Array2<f32>),
    TripletConfig,
);

fn case() -> impl Strategy<Value = Case> {
    (
        1usize..6,
        prop_oneof![1usize..40, 60usize..70, 125usize..135],
        1usize..5,
        2u32..5,
    )
        .prop_flat_map(|(b, m, d, classes)| {
            let labels = proptest::collection::vec(0..classes, b).prop_map(Array1::from);
            let ref_labels = proptest::collection::vec(0..classes, m).prop_map(Array1::from);
            let cfg = (
                0usize..4,
                0usize..4,
                prop_oneof![Just(0.2f32), Just(0.0), Just(0.5), -0.5f32..1.0],
                any::<bool>(),
                prop_oneof![
                    Just(CountMethod::Sorted),
                    Just(CountMethod::Scan),
                    Just(CountMethod::Auto)
                ],
            )
                .prop_map(|(k, which, margin, normalize, count_method)| {
                    TripletConfig {
                        count_method,
                        rule: TripletRule::Margin {
                            kind: KINDS[k],
                            margin,
                        },
                        distance: DistanceConfig {
                            distance: DISTANCES[which],
                            normalize,
                        },
                        ..Default::default()
                    }
                });
            (labels, grid(b, d), (ref_labels, grid(m, d)), cfg)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(48)))]

    #[test]
    fn negative_sort_gpu_counts_match_reference((labels, emb, refs, cfg) in case()) {
        if let Some(ctx) = common::shared_gpu() {
            check(ctx, &labels, &emb, &refs, &cfg);
        }
    }

    #[test]
    fn negative_sort_native_cpu_counts_match_reference((labels, emb, refs, cfg) in case()) {
        check(&Context::native_cpu(None), &labels, &emb, &refs, &cfg);
    }
}

#[test]
fn negative_sort_long_rows_need_many_passes() {
    // 2 classes over 3000 references: ~1500 negatives per anchor, rows of 2048 and 66 bitonic
    // passes; ties everywhere from the grid values.
    let refs = (
        Array1::from_shape_fn(3000, |i| (i % 2) as u32),
        Array2::from_shape_fn((3000, 3), |(i, k)| ((i * 7 + k * 5) % 11) as f32 - 5.0),
    );
    let labels = Array1::from_shape_fn(3, |i| (i % 2) as u32);
    let emb = Array2::from_shape_fn((3, 3), |(i, k)| ((i + 2 * k) % 5) as f32 - 2.0);
    for kind in KINDS {
        for distance in [Distance::Euclidean, Distance::Cosine] {
            let cfg = TripletConfig {
                rule: TripletRule::margin_miner(kind),
                distance: DistanceConfig {
                    distance,
                    normalize: true,
                },
                count_method: CountMethod::Sorted,
                ..Default::default()
            };
            check(&Context::native_cpu(None), &labels, &emb, &refs, &cfg);
            if let Some(ctx) = common::shared_gpu() {
                check(ctx, &labels, &emb, &refs, &cfg);
            }
        }
    }
}
