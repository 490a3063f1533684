//! Grouped counting and emitting (kernel `negative_buckets`, `CountMethod::Sorted` on the
//! wgpu path; the native path sorts negatives instead) against the plain triple-loop
//! reference: exact counts and triplets for every margin rule and distance, with many ties,
//! negative and zero margins, and positive lists on both sides of a power of two and of the
//! workgroup-memory sort. The reference `negative_buckets` itself is checked for the property
//! the kernel relies on: each positive's kept negatives are one run in bucket order.

use crate::common;
use crate::common::DISTANCES;

use ndarray::{Array1, Array2};
use proptest::prelude::*;
use wgpu_metric_learning::reference::negative_buckets::negative_buckets;
use wgpu_metric_learning::reference::triplet_select::triplet_select;
use wgpu_metric_learning::{
    count_triplets, mine_triplets, pairwise_distances, Context, CountMethod, Distance,
    DistanceConfig, MiningSet, PairwiseConfig, SelfExclusion, TripletConfig, TripletRule,
    TripletType,
};

const KINDS: [TripletType; 4] = [
    TripletType::All,
    TripletType::Hard,
    TripletType::Semihard,
    TripletType::Easy,
];

/// Counts and mines on `ctx` and checks both against the reference on the distances `ctx`
/// computes.
fn check(
    ctx: &Context,
    labels: &Array1<u32>,
    emb: &Array2<f32>,
    refs: &(Array1<u32>, Array2<f32>),
    cfg: &TripletConfig,
) {
    let queries = MiningSet::new(emb, labels);
    let ref_set = MiningSet::new(refs.1.view(), refs.0.view());
    let got = count_triplets(ctx, &queries, Some(&ref_set), cfg).expect("count");
    let distances = pairwise_distances(
        ctx,
        emb.view(),
        refs.1.view(),
        &PairwiseConfig {
            distance: cfg.distance,
            ..Default::default()
        },
    )
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
    let what = format!("{:?} {:?} on {}", cfg.rule, cfg.distance, ctx.device_name());
    assert_eq!(got.count, want.nrows() as u64, "count: {what}");
    let mined = mine_triplets(ctx, &queries, Some(&ref_set), cfg).expect("mine");
    assert!(mined.indices == want, "triplets: {what}");
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

/// One anchor's values and lists for the reference: `(values (1, m), positives, negatives,
/// counts)`, values on a coarse grid so that ties (tm exactly 0 or the margin) are common.
type Row = (Array2<f32>, Array2<u32>, Array2<u32>, [u32; 2]);

fn row() -> impl Strategy<Value = Row> {
    (1usize..40).prop_flat_map(|m| {
        (
            proptest::collection::vec(-4i8..=4, m),
            proptest::collection::vec(any::<bool>(), m),
        )
            .prop_map(move |(v, positive)| {
                let values = Array2::from_shape_fn((1, m), |(_, r)| f32::from(v[r]) * 0.1);
                let (mut pos, mut neg) = (Array2::zeros((1, m)), Array2::zeros((1, m)));
                let (mut p, mut n) = (0, 0);
                for (r, &is_pos) in positive.iter().enumerate() {
                    if is_pos {
                        pos[[0, p]] = r as u32;
                        p += 1;
                    } else {
                        neg[[0, n]] = r as u32;
                        n += 1;
                    }
                }
                (values, pos, neg, [p as u32, n as u32])
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(64)))]

    #[test]
    fn negative_buckets_reference_puts_each_positives_kept_negatives_in_one_run(
        (values, pos, neg, counts) in row(),
        k in 0usize..4,
        margin in prop_oneof![Just(0.2f32), Just(0.0), Just(0.1), -0.3f32..0.5],
        similarity in any::<bool>(),
    ) {
        let rule = TripletRule::Margin { kind: KINDS[k], margin };
        let buckets = negative_buckets(values.view(), pos.view(), neg.view(), &counts, &rule, similarity);
        let [n_pos, n_neg] = counts.map(|c| c as usize);
        let value = |list: &Array2<u32>, i: usize| values[[0, list[[0, i]] as usize]];
        let mut by_bucket: Vec<usize> = (0..n_neg).collect();
        by_bucket.sort_by_key(|&j| buckets[[0, j]]);
        for w in by_bucket.windows(2) {
            let same = buckets[[0, w[0]]] == buckets[[0, w[1]]];
            prop_assert!(same || value(&neg, w[0]) < value(&neg, w[1]), "buckets rise with the value");
        }
        for i in 0..n_pos {
            let ap = value(&pos, i);
            let kept: Vec<bool> = by_bucket
                .iter()
                .map(|&j| rule.keeps(ap, value(&neg, j), similarity))
                .collect();
            let first = kept.iter().position(|&k| k).unwrap_or(kept.len());
            let end = kept.iter().rposition(|&k| k).map_or(first, |e| e + 1);
            prop_assert!(kept[first..end].iter().all(|&k| k), "one run for positive {i}: {kept:?}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(48)))]

    #[test]
    fn negative_buckets_gpu_matches_reference((labels, emb, refs, cfg) in case()) {
        if let Some(ctx) = common::shared_gpu() {
            check(ctx, &labels, &emb, &refs, &cfg);
        }
    }

    #[test]
    fn negative_buckets_native_cpu_matches_reference((labels, emb, refs, cfg) in case()) {
        check(&Context::native_cpu(None), &labels, &emb, &refs, &cfg);
    }
}

#[test]
fn negative_buckets_long_rows_sort_pass_by_pass() {
    // 2 classes over 4200 references: ~2100 positives for the anchor, a row of 4096 sorted in
    // 78 bitonic dispatches (wider than the workgroup-memory sort), and its pairs emitted in
    // several dispatches (a bitmap of 132 words per pair); ties everywhere from the grid
    // values.
    let refs = (
        Array1::from_shape_fn(4200, |i| (i % 2) as u32),
        Array2::from_shape_fn((4200, 3), |(i, k)| ((i * 7 + k * 5) % 11) as f32 - 5.0),
    );
    let labels = Array1::from_elem(1, 1u32);
    let emb = Array2::from_shape_fn((1, 3), |(_, k)| k as f32 - 1.0);
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
