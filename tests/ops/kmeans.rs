//! `kmeans` (Faiss's k-means on the library's top-1 search) against `reference::kmeans` on both
//! paths; Faiss's edge cases (n = k, empty clusters, subsampling, duplicates); stopping rules,
//! budget, progress and cancellation; typed errors. NMI and AMI: properties and hand values
//! here, scikit-learn itself in the Python tests; `accuracy` with NMI and AMI included.

use crate::common;

use std::sync::{Arc, Mutex};

use ndarray::{array, Array1, Array2};
use proptest::prelude::*;
use wgpu_metric_learning::reference;
use wgpu_metric_learning::{
    accuracy, adjusted_mutual_info, kmeans, normalized_mutual_info, AccuracyConfig, AccuracyMetric,
    CancelToken, Context, Error, Hooks, KmeansConfig, MiningSet,
};

fn contexts() -> Vec<Context> {
    let mut all = vec![Context::native_cpu(None)];
    all.extend(common::gpu_context(None));
    all
}

/// `n` points `(n, d)` around `blobs` random centres in [-10, 10]^d, spread `spread`, from
/// `seed` (xorshift), with their blob as label.
fn blobs(n: usize, d: usize, blobs: usize, spread: f32, seed: u64) -> (Array2<f32>, Array1<u32>) {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut unit = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f32 / (1u64 << 53) as f32
    };
    let centres = Array2::from_shape_fn((blobs, d), |_| unit() * 20.0 - 10.0);
    let labels = Array1::from_shape_fn(n, |i| (i % blobs) as u32);
    let x = Array2::from_shape_fn((n, d), |(i, j)| {
        centres[[labels[i] as usize, j]] + (unit() - 0.5) * 2.0 * spread
    });
    (x, labels)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: common::cases(48), ..ProptestConfig::default() })]

    /// Same assignments, centroids and iteration count as the f64 reference, wherever no
    /// decision of the reference came within f32 rounding of a tie.
    #[test]
    fn equals_the_reference(
        n in 1usize..90,
        d in 1usize..7,
        k_pick in 0usize..6,
        spread in prop_oneof![Just(0.5f32), Just(3.0f32), Just(20.0f32)],
        max_iterations in 0usize..8,
        mppc in prop_oneof![Just(0usize), Just(1), Just(3), Just(256)],
        tolerance in prop_oneof![Just(0.0f64), Just(0.01)],
        seed in 0u64..1000,
    ) {
        let (x, _) = blobs(n, d, 4, spread, seed);
        let cfg = KmeansConfig {
            clusters: 1 + k_pick.min(n - 1),
            max_iterations,
            tolerance,
            seed,
            max_points_per_centroid: mppc,
            ..Default::default()
        };
        let want = reference::kmeans::kmeans(x.view(), &cfg);
        prop_assume!(want.closest_call > 1e-4 && want.closest_stop > 1e-6);
        for ctx in contexts() {
            let got = kmeans(&ctx, &x, &cfg).expect("kmeans");
            let what = format!("{:?} {cfg:?}", ctx.path());
            prop_assert_eq!(got.assignments.to_vec(), want.assignments.clone(), "{}", what);
            prop_assert_eq!(got.iterations, want.iterations, "{}", what);
            prop_assert_eq!(got.centroids.dim(), want.centroids.dim());
            for (g, w) in got.centroids.iter().zip(&want.centroids) {
                prop_assert_eq!(g, w, "{}", what);
            }
            // f32 distances by the norm expansion: off by ~1e-7 of the squared norms each.
            let norms: f64 = x.iter().map(|&v| f64::from(v).powi(2)).sum();
            let scale = 1.0 + want.inertia;
            let tol = 1e-4 * scale + 1e-5 * norms;
            prop_assert!((got.inertia - want.inertia).abs() <= tol, "{} {} {}", what, got.inertia, want.inertia);
            let summed: f64 = got.distances.iter().map(|&v| f64::from(v)).sum();
            prop_assert!((summed - got.inertia).abs() <= 1e-9 * scale);
        }
    }
}

#[test]
fn as_many_clusters_as_points_makes_each_point_its_centroid() {
    let x = array![[3.0f32, 1.0], [0.0, 0.0], [3.0, 1.0], [-5.0, 2.0]];
    for ctx in contexts() {
        let cfg = KmeansConfig {
            clusters: 4,
            ..Default::default()
        };
        let km = kmeans(&ctx, &x, &cfg).expect("kmeans");
        assert_eq!(km.iterations, 0);
        assert_eq!(km.centroids, x);
        // Rows 0 and 2 are equal: both go to the lower centroid (Faiss's index would too).
        assert_eq!(km.assignments.to_vec(), vec![0, 1, 0, 3]);
        assert_eq!(km.inertia, 0.0);
    }
}

/// Two distinct positions, eight copies each, asked for three clusters: the initial
/// centroids repeat a position, so a cluster empties and Faiss's split must refill it. Every
/// cluster ends with points and the inertia is tiny.
#[test]
fn empty_clusters_are_split_from_a_populated_one() {
    let mut rows = Vec::new();
    for i in 0..16 {
        let base = if i % 2 == 0 {
            [1.0f32, 2.0]
        } else {
            [-4.0, 8.0]
        };
        rows.extend_from_slice(&[base[0] + (i as f32) * 1e-3, base[1]]);
    }
    let x = Array2::from_shape_vec((16, 2), rows).expect("shape");
    for seed in 0..20 {
        let cfg = KmeansConfig {
            clusters: 3,
            seed,
            ..Default::default()
        };
        for ctx in contexts() {
            let km = kmeans(&ctx, &x, &cfg).expect("kmeans");
            let mut sizes = [0usize; 3];
            for &a in &km.assignments {
                sizes[a as usize] += 1;
            }
            assert!(sizes.iter().all(|&s| s > 0), "seed {seed}: sizes {sizes:?}");
            assert!(km.inertia < 1e-3, "seed {seed}: inertia {}", km.inertia);
            let want = reference::kmeans::kmeans(x.view(), &cfg);
            if want.closest_call > 1e-4 {
                assert_eq!(km.assignments.to_vec(), want.assignments, "seed {seed}");
            }
        }
    }
}

#[test]
fn subsampled_training_still_assigns_every_point() {
    let (x, y) = blobs(600, 3, 3, 0.5, 9);
    let cfg = KmeansConfig {
        clusters: 3,
        max_points_per_centroid: 10, // trains on 30 of the 600 points
        ..Default::default()
    };
    for ctx in contexts() {
        let km = kmeans(&ctx, &x, &cfg).expect("kmeans");
        assert_eq!(km.assignments.len(), 600);
        assert_eq!(
            normalized_mutual_info(&y, &km.assignments).expect("nmi"),
            1.0
        );
    }
}

#[test]
fn fixed_points_and_tolerance_stop_early() {
    let (x, _) = blobs(300, 4, 5, 1.0, 3);
    let base = KmeansConfig {
        clusters: 5,
        max_iterations: 100,
        ..Default::default()
    };
    let exact = kmeans(&Context::native_cpu(None), &x, &base).expect("kmeans");
    assert!(exact.iterations < 100, "no fixed point in 100 updates");
    // More updates past a fixed point change nothing.
    let longer = KmeansConfig {
        max_iterations: 1000,
        ..base.clone()
    };
    let again = kmeans(&Context::native_cpu(None), &x, &longer).expect("kmeans");
    assert_eq!(again.iterations, exact.iterations);
    assert_eq!(again.centroids, exact.centroids);
    let loose = KmeansConfig {
        tolerance: 0.5,
        ..base
    };
    let rough = kmeans(&Context::native_cpu(None), &x, &loose).expect("kmeans");
    assert!(rough.iterations <= exact.iterations);
    assert!(rough.inertia >= exact.inertia * (1.0 - 1e-6));
}

#[test]
fn a_tight_budget_splits_the_searches_and_changes_nothing() {
    let (x, _) = blobs(700, 16, 6, 2.0, 5);
    let cfg = KmeansConfig {
        clusters: 6,
        ..Default::default()
    };
    let whole = kmeans(&Context::native_cpu(None), &x, &cfg).expect("native");
    let Some(gpu) = common::gpu_context(Some(96 * 1024)) else {
        return;
    };
    let split = kmeans(&gpu, &x, &cfg).expect("tight budget");
    // Devices round differently: the same answer wherever no decision came near a tie.
    if reference::kmeans::kmeans(x.view(), &cfg).closest_call > 1e-4 {
        assert_eq!(split.assignments, whole.assignments);
        assert_eq!(split.centroids, whole.centroids);
    }
    let stats = gpu.memory();
    assert!(stats.peak_bytes <= stats.budget_bytes, "{stats:?}");
    assert!(split.transfers.submissions > 1);
}

#[test]
fn progress_rises_to_its_total_and_cancellation_stops_it() {
    let (x, _) = blobs(400, 8, 4, 1.0, 11);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let hooks = Hooks::new().on_progress(move |p| log.lock().expect("log").push((p.done, p.total)));
    let cfg = KmeansConfig {
        clusters: 4,
        hooks,
        ..Default::default()
    };
    kmeans(&Context::native_cpu(None), &x, &cfg).expect("kmeans");
    let seen = seen.lock().expect("log").clone();
    let total = (20 * 400 + 400) * 4;
    assert!(seen.windows(2).all(|w| w[0].0 < w[1].0), "{seen:?}");
    assert_eq!(seen.last().copied(), Some((total, total)));
    let token = CancelToken::new();
    token.cancel();
    let cancelled = KmeansConfig {
        clusters: 4,
        hooks: Hooks::new().cancel_with(&token),
        ..Default::default()
    };
    for ctx in contexts() {
        let err = kmeans(&ctx, &x, &cancelled).expect_err("cancelled");
        assert!(matches!(err, Error::Cancelled { .. }), "{err}");
    }
}

#[test]
fn bad_inputs_are_typed_errors() {
    let x = array![[0.0f32, 1.0], [2.0, 3.0]];
    let ctx = Context::native_cpu(None);
    for clusters in [0usize, 3] {
        let cfg = KmeansConfig {
            clusters,
            ..Default::default()
        };
        let err = kmeans(&ctx, &x, &cfg).expect_err("clusters");
        assert!(
            matches!(
                err,
                Error::InvalidParameter {
                    what: "clusters",
                    ..
                }
            ),
            "{err}"
        );
    }
    let cfg = KmeansConfig {
        clusters: 1,
        tolerance: f64::NAN,
        ..Default::default()
    };
    let err = kmeans(&ctx, &x, &cfg).expect_err("tolerance");
    assert!(matches!(
        err,
        Error::InvalidParameter {
            what: "tolerance",
            ..
        }
    ));
    let nan = array![[0.0f32, f32::NAN]];
    let one = KmeansConfig {
        clusters: 1,
        ..Default::default()
    };
    let err = kmeans(&ctx, &nan, &one).expect_err("NaN");
    assert!(matches!(err, Error::NonFinite { .. }), "{err}");
    let empty = Array2::<f32>::zeros((0, 3));
    assert!(kmeans(&ctx, &empty, &one).is_err());
}

#[test]
fn device_embeddings_and_bank_rows_are_clustered_in_place() {
    let Some(ctx) = common::shared_gpu() else {
        return;
    };
    let (x, _) = blobs(200, 5, 4, 0.5, 21);
    let cfg = KmeansConfig {
        clusters: 4,
        ..Default::default()
    };
    let host = kmeans(ctx, &x, &cfg).expect("host");
    let buffer = common::upload(ctx, &x, 0, 5);
    let rows = wgpu_metric_learning::DeviceEmbeddings::new(&buffer, 0, (200, 5));
    let device = kmeans(ctx, rows, &cfg).expect("device");
    assert_eq!(device.assignments, host.assignments);
    assert!(device.transfers.bytes_down >= 200 * 5 * 4);
    // Host points go up once, not once per search: beyond what the same k-means on rows
    // already on the device uploads, less than twice their padded bytes (rows of 8 floats).
    assert!(host.iterations >= 2, "{}", host.iterations);
    let extra = host.transfers.bytes_up - device.transfers.bytes_up;
    assert!(
        extra < 2 * 200 * 8 * 4,
        "{:?} {:?}",
        host.transfers,
        device.transfers
    );
    let bank = common::wrapped_bank(ctx, &blobs(300, 5, 4, 0.5, 22).0, &Array1::zeros(300));
    let km = kmeans(ctx, bank.rows(), &cfg).expect("bank");
    // The bank's rows in slot order are the rows it clusters.
    let held = bank.snapshot(ctx).expect("snapshot").embeddings;
    let want = kmeans(&Context::native_cpu(None), &held, &cfg).expect("snapshot rows");
    assert_eq!(km.assignments, want.assignments);
}

// ---- NMI and AMI ----

#[test]
fn mutual_information_properties() {
    let a = array![0u32, 0, 0, 1, 1, 2, 2, 2, 2, 3];
    let b = array![5i64, 5, 1, 1, 1, 9, 9, 9, 2, 2];
    let nmi = normalized_mutual_info(&a, &b).expect("nmi");
    let ami = adjusted_mutual_info(&a, &b).expect("ami");
    assert!((0.0..=1.0).contains(&nmi) && ami < nmi, "{nmi} {ami}");
    // Symmetric, and blind to renaming.
    assert_eq!(normalized_mutual_info(&b, &a).expect("nmi"), nmi);
    assert!((adjusted_mutual_info(&b, &a).expect("ami") - ami).abs() < 1e-15);
    let renamed = b.mapv(|v| 100 - v);
    assert!((normalized_mutual_info(&a, &renamed).expect("nmi") - nmi).abs() < 1e-15);
    // scikit-learn's special cases.
    let one = array![4u8, 4, 4];
    assert_eq!(normalized_mutual_info(&one, &one).expect("nmi"), 1.0);
    assert_eq!(
        adjusted_mutual_info(&one, &array![1u8, 2, 3]).expect("ami"),
        0.0
    );
    let none = Array1::<u32>::zeros(0);
    assert_eq!(adjusted_mutual_info(&none, &none).expect("ami"), 1.0);
    assert_eq!(adjusted_mutual_info(&a, &a).expect("ami"), 1.0);
    let err = normalized_mutual_info(&a, &one).expect_err("lengths");
    assert!(matches!(err, Error::Shape { .. }), "{err}");
}

/// AMI by its definition, the expectation of MI over every permutation of one labeling,
/// enumerated (6! = 720 permutations).
#[test]
fn adjusted_mutual_info_matches_the_permutation_expectation() {
    let a = [0u8, 0, 1, 1, 1, 2];
    let b = [0u8, 1, 1, 0, 2, 2];
    let mi = |x: &[u8], y: &[u8]| -> f64 {
        let n = x.len() as f64;
        let mut total = 0.0;
        for u in 0..3u8 {
            for v in 0..3u8 {
                let nuv = x.iter().zip(y).filter(|&(&p, &q)| p == u && q == v).count() as f64;
                let nu = x.iter().filter(|&&p| p == u).count() as f64;
                let nv = y.iter().filter(|&&q| q == v).count() as f64;
                if nuv > 0.0 {
                    total += nuv / n * (n * nuv / (nu * nv)).ln();
                }
            }
        }
        total
    };
    let h = |x: &[u8]| -> f64 {
        let n = x.len() as f64;
        (0..3u8)
            .map(|u| x.iter().filter(|&&p| p == u).count() as f64 / n)
            .filter(|&p| p > 0.0)
            .map(|p| -p * p.ln())
            .sum()
    };
    let mut expected = 0.0;
    let mut count = 0.0;
    let mut perm = [0usize, 1, 2, 3, 4, 5];
    permutations(&mut perm, 0, &mut |p| {
        let shuffled: Vec<u8> = p.iter().map(|&i| b[i]).collect();
        expected += mi(&a, &shuffled);
        count += 1.0;
    });
    expected /= count;
    let want = (mi(&a, &b) - expected) / ((h(&a) + h(&b)) / 2.0 - expected);
    let got = adjusted_mutual_info(&a[..], &b[..]).expect("ami");
    assert!((got - want).abs() < 1e-12, "{got} vs {want}");
}

fn permutations(p: &mut [usize; 6], at: usize, visit: &mut impl FnMut(&[usize; 6])) {
    if at == p.len() {
        visit(p);
        return;
    }
    for i in at..p.len() {
        p.swap(at, i);
        permutations(p, at + 1, visit);
        p.swap(at, i);
    }
}

// ---- accuracy with NMI and AMI ----

#[test]
fn accuracy_scores_the_kmeans_of_the_queries() {
    let (x, y) = blobs(240, 6, 6, 4.0, 31);
    let ctx = Context::native_cpu(None);
    let cfg = AccuracyConfig {
        include: AccuracyMetric::ALL.to_vec(),
        ..Default::default()
    };
    let acc = accuracy(&ctx, &MiningSet::new(&x, &y), None, &cfg).expect("accuracy");
    let km = kmeans(
        &ctx,
        &x,
        &KmeansConfig {
            clusters: 6,
            ..Default::default()
        },
    )
    .expect("kmeans");
    let nmi = normalized_mutual_info(&y, &km.assignments).expect("nmi");
    let ami = adjusted_mutual_info(&y, &km.assignments).expect("ami");
    assert_eq!(acc.nmi, Some(nmi));
    assert_eq!(acc.ami, Some(ami));
    assert!(acc.metrics.precision_at_1 > 0.0);
    // Only the clustering: no kNN, kNN metrics NaN.
    let only = AccuracyConfig {
        include: vec![AccuracyMetric::Ami],
        ..Default::default()
    };
    for ctx in contexts() {
        let acc = accuracy(&ctx, &MiningSet::new(&x, &y), None, &only).expect("accuracy");
        assert_eq!((acc.nmi, acc.ami, acc.k), (None, Some(ami), 0));
        assert!(acc.metrics.precision_at_1.is_nan() && acc.per_class.is_empty());
    }
    // Some kNN metrics: the others are NaN.
    let some = AccuracyConfig {
        include: vec![AccuracyMetric::RPrecision],
        ..Default::default()
    };
    let acc = accuracy(&ctx, &MiningSet::new(&x, &y), None, &some).expect("accuracy");
    assert!(acc.metrics.precision_at_1.is_nan() && acc.metrics.r_precision > 0.0);
    assert!(acc.per_class[0].1.mean_reciprocal_rank.is_nan());
    let none = AccuracyConfig {
        include: Vec::new(),
        ..Default::default()
    };
    let err = accuracy(&ctx, &MiningSet::new(&x, &y), None, &none).expect_err("empty include");
    assert!(
        matches!(
            err,
            Error::InvalidParameter {
                what: "include",
                ..
            }
        ),
        "{err}"
    );
}

/// The plan covers what runs: the k-means alone (even when every query is lone, so no kNN
/// search runs), the kNN search alone, or both one after the other.
#[test]
fn accuracy_plans_its_kmeans() {
    use wgpu_metric_learning::accuracy_plan;
    let (x, y) = blobs(400, 8, 5, 1.0, 41);
    let ctx = Context::native_cpu(None);
    let with = |include: Vec<AccuracyMetric>| AccuracyConfig {
        include,
        ..Default::default()
    };
    let set = MiningSet::new(&x, &y);
    let knn_only =
        accuracy_plan(&ctx, &set, None, &with(vec![AccuracyMetric::PrecisionAt1])).expect("plan");
    let kmeans_only =
        accuracy_plan(&ctx, &set, None, &with(vec![AccuracyMetric::Nmi])).expect("plan");
    let both = accuracy_plan(&ctx, &set, None, &with(AccuracyMetric::ALL.to_vec())).expect("plan");
    assert!(
        kmeans_only.chunks > 0 && kmeans_only.bytes > 0,
        "{kmeans_only:?}"
    );
    assert_eq!(both.chunks, knn_only.chunks + kmeans_only.chunks);
    assert_eq!(both.bytes, knn_only.bytes.max(kmeans_only.bytes));
    // Every query lone: no kNN search, the k-means still runs and is planned.
    let lone: Array1<u32> = Array1::from_iter(0..400);
    let lone_set = MiningSet::new(&x, &lone);
    let cfg = with(vec![AccuracyMetric::PrecisionAt1, AccuracyMetric::Ami]);
    let plan = accuracy_plan(&ctx, &lone_set, None, &cfg).expect("plan");
    assert!(plan.chunks > 0 && plan.bytes > 0, "{plan:?}");
    let acc = accuracy(&ctx, &lone_set, None, &cfg).expect("accuracy");
    assert_eq!((acc.lone_queries, acc.ami), (400, Some(1.0)));
    // A k no search uses is not checked; a bad k-means setting is.
    let unused_k = AccuracyConfig {
        k: wgpu_metric_learning::AccuracyK::Fixed(10_000),
        ..with(vec![AccuracyMetric::Nmi])
    };
    assert!(accuracy(&ctx, &set, None, &unused_k).is_ok());
    let bad = AccuracyConfig {
        kmeans: KmeansConfig {
            tolerance: -1.0,
            ..Default::default()
        },
        ..with(vec![AccuracyMetric::Nmi])
    };
    let err = accuracy(&ctx, &set, None, &bad).expect_err("tolerance");
    assert!(
        matches!(
            err,
            Error::InvalidParameter {
                what: "tolerance",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn metric_names_are_pmls() {
    for m in AccuracyMetric::ALL {
        assert_eq!(m.name().parse::<AccuracyMetric>().expect("parse"), m);
        assert_eq!(m.to_string(), m.name());
    }
    assert!("map".parse::<AccuracyMetric>().is_err());
}
