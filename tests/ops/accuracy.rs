//! `accuracy` (PML's AccuracyCalculator kNN metrics): a hand-computed table (ties, a lone
//! query, `avg_of_avgs`, per class, `max_bin_count`), explicit references, all-lone NaN,
//! typed errors, and a property test on both paths against a brute-force transcription of
//! PML's definitions.

use crate::common;

use ndarray::{array, Array1, Array2, ArrayView1, ArrayView2};
use proptest::prelude::*;
use wgpu_metric_learning::{
    accuracy, pairwise_distances, AccuracyConfig, AccuracyK, AccuracyMetrics, Context, Error,
    MiningSet, PairwiseConfig, SelfExclusion,
};

fn close(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || (a - b).abs() < 1e-9
}

fn assert_metrics(got: &AccuracyMetrics, want: [f64; 5], what: &str) {
    let got = [
        got.precision_at_1,
        got.r_precision,
        got.mean_average_precision_at_r,
        got.mean_average_precision,
        got.mean_reciprocal_rank,
    ];
    for (name, (g, w)) in ["P@1", "R-precision", "MAP@R", "MAP", "MRR"]
        .iter()
        .zip(got.iter().zip(want))
    {
        assert!(close(*g, w), "{what}: {name} = {g}, want {w}");
    }
}

fn contexts() -> Vec<Context> {
    let mut all = vec![Context::native_cpu(None)];
    all.extend(common::gpu_context(None));
    all
}

/// Six points on a line, labels A A B A B C. Worked by hand in the comments: with every
/// other point as neighbours (squared L2), query 4 (x = 10) has points 0 and 5 tied at
/// distance 10 and takes 0 first; point 5 is lone.
#[test]
fn hand_computed_table() {
    let x = array![[0.0f32], [1.0], [3.0], [4.0], [10.0], [20.0]];
    let y = array![0u32, 0, 1, 0, 1, 2];
    for ctx in contexts() {
        let acc = accuracy(
            &ctx,
            &MiningSet::new(&x, &y),
            None,
            &AccuracyConfig::default(),
        )
        .expect("accuracy");
        // Per query (rel of the 5 neighbours; R):
        // 0: 1 0 1 0 0; R 2 → P1 1, RP .5, MAP@R .5, MAP (1 + 2/3)/2, MRR 1
        // 1: same as 0
        // 2: 0 0 0 1 0; R 1 → 0, 0, 0, 1/4, 1/4
        // 3: 0 1 1 0 0; R 2 → 0, .5, .25, (1/2 + 2/3)/2, 1/2
        // 4: 0 1 0 0 0; R 1 → 0, 0, 0, 1/2, 1/2
        assert_eq!((acc.k, acc.lone_queries), (5, 1));
        assert_metrics(
            &acc.metrics,
            [0.4, 0.3, 0.25, 0.6, 0.65],
            "mean over queries",
        );
        let a = [2.0 / 3.0, 0.5, 1.25 / 3.0, 0.75, 2.5 / 3.0];
        let b = [0.0, 0.0, 0.0, 0.375, 0.375];
        assert_eq!(acc.per_class.len(), 2, "class C has only a lone query");
        assert_eq!((acc.per_class[0].0, acc.per_class[1].0), (0, 1));
        assert_metrics(&acc.per_class[0].1, a, "class A");
        assert_metrics(&acc.per_class[1].1, b, "class B");
        let cfg = AccuracyConfig {
            avg_of_avgs: true,
            ..Default::default()
        };
        let avg = accuracy(&ctx, &MiningSet::new(&x, &y), None, &cfg).expect("avg_of_avgs");
        let mean: Vec<f64> = a.iter().zip(b).map(|(a, b)| (a + b) / 2.0).collect();
        assert_metrics(
            &avg.metrics,
            [mean[0], mean[1], mean[2], mean[3], mean[4]],
            "avg of avgs",
        );
        // max_bin_count: k = 2 (class A has 3 points, less the query itself).
        let cfg = AccuracyConfig {
            k: AccuracyK::MaxBinCount,
            ..Default::default()
        };
        let bins = accuracy(&ctx, &MiningSet::new(&x, &y), None, &cfg).expect("max_bin_count");
        assert_eq!(bins.k, 2);
        // Over 2 neighbours: MAP .5 .5 0 .25 .5 and MRR 1 1 0 .5 .5 (query 2 finds none).
        assert_metrics(
            &bins.metrics,
            [0.4, 0.3, 0.25, 0.35, 0.6],
            "k = max_bin_count",
        );
    }
}

#[test]
fn explicit_references_and_all_lone_queries() {
    let q = array![[0.0f32, 0.0], [5.0, 5.0]];
    let ql = array![7i64, 8];
    let r = array![[5.0f32, 4.0], [0.0, 1.0], [0.0, 2.0], [5.0, 6.0]];
    let rl = array![8i64, 7, 8, 7];
    for ctx in contexts() {
        let acc = accuracy(
            &ctx,
            &MiningSet::new(&q, &ql),
            Some(&MiningSet::new(&r, &rl)),
            &AccuracyConfig::default(),
        )
        .expect("accuracy");
        // Query 0: neighbours 1 (7), 2 (8), 0 (8), 3 (7); R 2 → rel 1 0 0 1.
        // Query 1: neighbours 0 and 3 tie at distance 1 → 0 (8) then 3 (7), then 2, 1; rel 1 0 1 0.
        let q0 = [1.0, 0.5, 0.5, (1.0 + 0.5) / 2.0, 1.0];
        let q1 = [1.0, 0.5, 0.5, (1.0 + 2.0 / 3.0) / 2.0, 1.0];
        let mean: Vec<f64> = q0.iter().zip(q1).map(|(a, b)| (a + b) / 2.0).collect();
        assert_metrics(
            &acc.metrics,
            [mean[0], mean[1], mean[2], mean[3], mean[4]],
            "explicit refs",
        );
        assert_eq!((acc.k, acc.lone_queries), (4, 0));
        // Every label distinct: every query lone, every metric NaN.
        let lone = accuracy(
            &ctx,
            &MiningSet::new(&r, array![1u32, 2, 3, 4].view()),
            None,
            &AccuracyConfig::default(),
        )
        .expect("all lone");
        assert!(lone.metrics.precision_at_1.is_nan() && lone.metrics.mean_reciprocal_rank.is_nan());
        assert_eq!((lone.lone_queries, lone.per_class.len()), (4, 0));
    }
}

#[test]
fn bad_inputs_get_typed_errors() {
    let x = array![[0.0f32, 1.0], [1.0, 0.0], [1.0, 1.0]];
    let y = array![0u32, 0, 1];
    for ctx in contexts() {
        let run = |cfg: &AccuracyConfig,
                   refs: Option<(ArrayView2<'_, f32>, ArrayView1<'_, u32>)>| {
            accuracy(
                &ctx,
                &MiningSet::new(&x, &y),
                refs.map(|(e, l)| MiningSet::new(e, l)).as_ref(),
                cfg,
            )
        };
        let fixed = |k| AccuracyConfig {
            k: AccuracyK::Fixed(k),
            ..Default::default()
        };
        for k in [0, 3] {
            assert!(
                matches!(
                    run(&fixed(k), None),
                    Err(Error::InvalidParameter { what: "k", .. })
                ),
                "k = {k}"
            );
        }
        let short = array![0u32, 1];
        assert!(matches!(
            accuracy(
                &ctx,
                &MiningSet::new(&x, &short),
                None,
                &AccuracyConfig::default()
            ),
            Err(Error::Shape { what: "labels", .. })
        ));
        assert!(matches!(
            run(&AccuracyConfig::default(), Some((x.view(), short.view()))),
            Err(Error::Shape {
                what: "ref_labels",
                ..
            })
        ));
        let includes = AccuracyConfig {
            self_exclusion: SelfExclusion::SameIndex,
            ..Default::default()
        };
        let other = array![[0.0f32, 1.0], [1.0, 0.5], [1.0, 1.0], [2.0, 2.0]];
        let other_labels = array![0u32, 0, 1, 1];
        assert!(matches!(
            run(&includes, Some((other.view(), other_labels.view()))),
            Err(Error::InvalidParameter {
                what: "self_exclusion",
                ..
            })
        ));
        let fewer = array![[0.0f32, 1.0]];
        assert!(matches!(
            run(&includes, Some((fewer.view(), array![0u32].view()))),
            Err(Error::Shape { what: "refs", .. })
        ));
        let mut nan = x.clone();
        nan[[1, 1]] = f32::NAN;
        assert!(matches!(
            accuracy(
                &ctx,
                &MiningSet::new(&nan, &y),
                None,
                &AccuracyConfig::default()
            ),
            Err(Error::NonFinite { .. })
        ));
    }
}

/// PML's definitions, transcribed: full sort of each query's distances (ties by index).
fn brute_force(x: &Array2<f32>, y: &Array1<u32>, k_kind: AccuracyK, avg_of_avgs: bool) -> [f64; 5] {
    let native = Context::native_cpu(None);
    let cfg = AccuracyConfig::default();
    let d = pairwise_distances(
        &native,
        x.view(),
        x.view(),
        &PairwiseConfig {
            distance: cfg.distance,
            ..Default::default()
        },
    )
    .expect("distances")
    .values;
    let n = y.len();
    let count = |l: u32| y.iter().filter(|&&v| v == l).count() - 1;
    let k = match k_kind {
        AccuracyK::All => n - 1,
        AccuracyK::MaxBinCount => y.iter().map(|&l| count(l)).max().unwrap_or(0),
        AccuracyK::Fixed(k) => k,
    };
    let mut per: std::collections::BTreeMap<u32, Vec<[f64; 5]>> = Default::default();
    for i in 0..n {
        let r = count(y[i]);
        if r == 0 {
            continue;
        }
        let mut order: Vec<usize> = (0..n).filter(|&j| j != i).collect();
        order.sort_by(|&a, &b| d[[i, a]].total_cmp(&d[[i, b]]).then(a.cmp(&b)));
        let rel: Vec<bool> = order[..k].iter().map(|&j| y[j] == y[i]).collect();
        let p_at = |i: usize| rel[..=i].iter().filter(|&&b| b).count() as f64 / (i + 1) as f64;
        let m = [
            f64::from(u8::from(rel[0])),
            // PML divides R-precision by its relevance mask's width, min(R, k).
            rel[..r.min(k)].iter().filter(|&&b| b).count() as f64 / r.min(k) as f64,
            (0..r.min(k)).filter(|&i| rel[i]).map(p_at).sum::<f64>() / r as f64,
            (0..k).filter(|&i| rel[i]).map(p_at).sum::<f64>() / r as f64,
            rel.iter()
                .position(|&b| b)
                .map_or(0.0, |p| 1.0 / (p + 1) as f64),
        ];
        per.entry(y[i]).or_default().push(m);
    }
    let mean = |v: &[[f64; 5]]| {
        let mut s = [0.0; 5];
        for m in v {
            for (a, b) in s.iter_mut().zip(m) {
                *a += b / v.len() as f64;
            }
        }
        s
    };
    if per.is_empty() {
        return [f64::NAN; 5];
    }
    if avg_of_avgs {
        let classes: Vec<[f64; 5]> = per.values().map(|v| mean(v)).collect();
        mean(&classes)
    } else {
        let all: Vec<[f64; 5]> = per.values().flatten().copied().collect();
        mean(&all)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(16)))]

    /// Integer coordinates: exact distances on both paths, so rankings (ties included) and
    /// metrics must match the transcription exactly.
    #[test]
    fn both_paths_match_the_definitions(
        (x, y) in (2usize..60, 1usize..5, 1u32..8).prop_flat_map(|(n, d, classes)| (
            proptest::collection::vec(-3i8..4, n * d)
                .prop_map(move |v| Array2::from_shape_vec((n, d), v.into_iter().map(f32::from).collect()).expect("shape")),
            proptest::collection::vec(0..classes, n).prop_map(Array1::from),
        )),
        kind in 0usize..3,
        fixed in 1usize..60,
        avg_of_avgs in any::<bool>(),
    ) {
        let n = y.len();
        let k = [AccuracyK::All, AccuracyK::MaxBinCount, AccuracyK::Fixed(fixed.min(n - 1))][kind];
        let want = brute_force(&x, &y, k, avg_of_avgs);
        let cfg = AccuracyConfig { k, avg_of_avgs, ..Default::default() };
        for ctx in contexts() {
            let got = accuracy(&ctx, &MiningSet::new(&x, &y), None, &cfg).expect("accuracy");
            assert_metrics(&got.metrics, want, &ctx.device_name());
        }
    }
}
