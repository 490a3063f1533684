//! The generated GEMM family against its reference and against the hand-written kernel: every
//! variant, built checked and trusted, gives the hand-written kernel's bits for every metric
//! on shapes off every tile (empty, one row, sizes around 64 and 128, depths off 16 and 32),
//! and the reference's values within round-off (one multiply-add chain, ascending; Vulkan lets
//! a device round `fma` twice, so bits match only on one device). Also: per-kernel GPU
//! timing.

use crate::common;
use crate::common::DISTANCES;

use std::sync::OnceLock;

use ndarray::Array2;
use proptest::prelude::*;
use wgpu_metric_learning::reference::gemm_tile::gemm_tile;
use wgpu_metric_learning::{
    knn, pairwise_distances, pairwise_distances_plan, Context, ContextConfig, Distance,
    DistanceConfig, DistanceKernel, GemmVariant, KnnConfig, PairwiseConfig, ShaderChecks, Tuning,
    GEMM_CANDIDATES,
};

/// One context per (kernel, checks): the hand-written kernel first, then every variant that
/// fits the adapter, checked and trusted. Made once per test binary (compiling 128 × 128
/// variants takes lavapipe a while).
fn contexts() -> Option<&'static [(String, Context)]> {
    static CTX: OnceLock<Option<Vec<(String, Context)>>> = OnceLock::new();
    CTX.get_or_init(|| {
        let open = |kernel, checks| {
            common::gpu_context_with(ContextConfig {
                distance_kernel: kernel,
                shader_checks: checks,
                ..Default::default()
            })
        };
        let hand = open(DistanceKernel::HandWritten, ShaderChecks::Checked)?;
        let limits = hand.limits()?.clone();
        let mut all = vec![("hand-written".to_string(), hand)];
        for &v in GEMM_CANDIDATES {
            let fits = u64::from(limits.max_compute_workgroup_storage_size) >= v.workgroup_bytes()
                && limits.max_compute_invocations_per_workgroup >= v.threads();
            if !fits {
                eprintln!("{}: does not fit this adapter, not run", v.name());
                continue;
            }
            for (checks, name) in [
                (ShaderChecks::Checked, "checked"),
                (ShaderChecks::Trusted, "trusted"),
            ] {
                let ctx = open(DistanceKernel::Variant(v), checks)?;
                all.push((format!("{} {name}", v.name()), ctx));
            }
        }
        Some(all)
    })
    .as_deref()
}

fn distances(ctx: &Context, q: &Array2<f32>, r: &Array2<f32>, cfg: &DistanceConfig) -> Array2<f32> {
    pairwise_distances(
        ctx,
        q.view(),
        r.view(),
        &PairwiseConfig {
            distance: *cfg,
            ..Default::default()
        },
    )
    .expect("pairwise_distances")
    .values
}

fn check(q: &Array2<f32>, r: &Array2<f32>, cfg: &DistanceConfig) {
    let Some(all) = contexts() else {
        return;
    };
    let want = distances(&all[0].1, q, r, cfg);
    // Against the reference within round-off: Vulkan lets `fma` round twice (lavapipe does),
    // so the reference's single-rounding chain is not the device's to the bit.
    let reference = gemm_tile(q.view(), r.view(), cfg);
    let scale = if cfg.normalize || cfg.distance == Distance::Cosine {
        1.0
    } else {
        q.rows()
            .into_iter()
            .chain(r.rows())
            .map(|row| row.dot(&row))
            .fold(0.0f32, f32::max)
    };
    let tol = 2e-5 * (1.0 + scale);
    for (g, w) in want.iter().zip(reference.iter()) {
        let (g2, w2) = match cfg.distance {
            Distance::Euclidean => (g * g, w * w),
            _ => (*g, *w),
        };
        assert!(
            (g2 - w2).abs() <= tol,
            "{cfg:?}: {g} against the reference's {w}"
        );
    }
    for (name, ctx) in &all[1..] {
        let got = distances(ctx, q, r, cfg);
        assert_eq!(got.dim(), want.dim(), "{name}: shape");
        if let Some(((i, j), g)) = got
            .indexed_iter()
            .zip(want.iter())
            .find(|((_, g), w)| g.to_bits() != w.to_bits())
            .map(|(g, _)| g)
        {
            panic!(
                "{name} {cfg:?} {:?} x {:?}: at ({i}, {j}) {g} where the hand-written kernel gives {}",
                q.dim(),
                r.dim(),
                want[[i, j]]
            );
        }
    }
}

fn matrix(rows: usize, d: usize, amp: f32) -> impl Strategy<Value = Array2<f32>> {
    proptest::collection::vec(-amp..amp, rows * d)
        .prop_map(move |v| Array2::from_shape_vec((rows, d), v).expect("sized"))
}

/// Sizes around the block tiles (0, 1, 63..65, 127..129, up to 200) and depths off every
/// depth step.
fn problem() -> impl Strategy<Value = (Array2<f32>, Array2<f32>, DistanceConfig)> {
    let size = prop_oneof![0usize..3, 60usize..70, 124usize..132, 0usize..200];
    (size.clone(), size, 1usize..70, 0usize..4, any::<bool>()).prop_flat_map(
        |(q, n, d, which, normalize)| {
            let cfg = DistanceConfig {
                distance: DISTANCES[which],
                normalize,
            };
            (matrix(q, d, 4.0), matrix(n, d, 4.0), Just(cfg))
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(6)))]

    #[test]
    fn every_variant_gives_the_hand_written_kernels_bits((q, r, cfg) in problem()) {
        check(&q, &r, &cfg);
    }
}

#[test]
fn ties_zero_rows_and_a_long_dimension_give_the_same_bits() {
    // Equal rows (ties), a zero row (normalisation's floor), and d = 300 (ten depth steps of
    // 32, with a tail), for every metric.
    let mut q = Array2::from_shape_fn((70, 300), |(i, k)| ((i * 7 + k * 3) % 11) as f32 - 5.0);
    q.row_mut(3).fill(0.0);
    let r = ndarray::concatenate![ndarray::Axis(0), q.view(), q.view()];
    for distance in DISTANCES {
        for normalize in [false, true] {
            check(
                &q,
                &r,
                &DistanceConfig {
                    distance,
                    normalize,
                },
            );
        }
    }
}

#[test]
fn variant_names_round_trip_and_invalid_shapes_are_refused() {
    for v in GEMM_CANDIDATES {
        assert!(v.is_valid(), "{} is a valid candidate", v.name());
        assert_eq!(GemmVariant::parse(&v.name()), Some(*v));
    }
    for bad in [
        "",
        "64x64_4x4",
        "64x64x16_3x4",
        "64x64x36_4x4",
        "8x8x16_4x4",
        "512x512x16_8x8",
    ] {
        assert_eq!(GemmVariant::parse(bad), None, "{bad:?}");
    }
}

/// With kernel timing on, a kNN names every kernel that ran, with positive times that sum to
/// no more than the call's wall time; without it, nothing is timed.
#[test]
fn kernel_timing_names_every_kernel_with_times_within_the_wall_time() {
    let Some(ctx) = common::gpu_context_with(ContextConfig {
        kernel_timing: true,
        ..Default::default()
    }) else {
        return;
    };
    let x = Array2::from_shape_fn((300, 24), |(i, k)| ((i * 13 + k * 7) % 17) as f32);
    let cfg = KnnConfig {
        k: 5,
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let found = knn(&ctx, &x, &x, &cfg).expect("knn");
    let wall = started.elapsed().as_secs_f64();
    match ctx.kernel_timing() {
        Ok(true) => {
            let stems: Vec<&str> = found.transfers.kernels.iter().map(|k| k.stem).collect();
            for stem in ["row_norms", "knn_select"] {
                assert!(stems.contains(&stem), "{stem} ran: {stems:?}");
            }
            assert!(
                stems.contains(&"gemm_tile") || stems.contains(&"distance_tile"),
                "a distance kernel ran: {stems:?}"
            );
            for k in found.transfers.kernels.iter() {
                assert!(k.dispatches > 0 && k.gpu_seconds > 0.0, "{k:?}");
            }
            let total = found.transfers.kernels.total_gpu_seconds();
            assert!(
                total <= wall,
                "kernels {total} s within the call's {wall} s"
            );
            assert_eq!(
                ctx.transfers().kernels,
                found.transfers.kernels,
                "the context's totals hold the call's"
            );
        }
        Ok(false) => panic!("kernel_timing was asked"),
        Err(reason) => {
            eprintln!("kernel timing unavailable here: {reason}");
            assert_eq!(found.transfers.kernels.iter().count(), 0);
        }
    }
    let plain = common::gpu_context(None).expect("an adapter, as before");
    let untimed = knn(&plain, &x, &x, &cfg).expect("knn");
    assert_eq!(
        untimed.transfers.kernels.iter().count(),
        0,
        "not asked, not timed"
    );
    assert_eq!(plain.kernel_timing(), Ok(false));
    assert!(
        untimed.transfers.host.wait_ns > 0,
        "the host's waits are timed"
    );
}

/// Tuning on the test adapter (lavapipe in CI: `tune_distance` tunes any adapter, while
/// operations never tune software ones): every candidate that fits runs, the winner is the
/// fastest, and a second call with the cache takes the winner from it.
#[test]
fn tuning_times_every_candidate_and_the_cache_returns_the_winner() {
    let Some(ctx) = common::gpu_context(None) else {
        return;
    };
    let report = ctx.tune_distance(64, 512, 20, false).expect("tuning");
    assert!(!report.from_cache);
    assert!(!report.candidates.is_empty(), "some candidate fits");
    let fastest = report
        .candidates
        .iter()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|c| c.0);
    assert_eq!(report.chosen, fastest, "{report:?}");
    assert!(report.candidates.iter().all(|c| c.1 > 0.0), "{report:?}");
    assert_eq!(report.bucket, "64x512x32");
    // The cache directory (`WML_TUNE_CACHE`, else under `$HOME/.cache`) is writable here.
    let again = ctx
        .tune_distance(64, 512, 20, true)
        .expect("from the cache");
    assert!(again.from_cache, "{again:?}");
    assert_eq!(again.chosen, report.chosen);
    // The context now computes that bucket with the winner: same bits as the hand-written.
    let q = Array2::from_shape_fn((64, 20), |(i, k)| ((i * 5 + k) % 9) as f32 - 4.0);
    let r = Array2::from_shape_fn((300, 20), |(i, k)| ((i * 3 + k * 2) % 7) as f32 - 3.0);
    let cfg = DistanceConfig::default();
    let hand = common::gpu_context_with(ContextConfig {
        distance_kernel: DistanceKernel::HandWritten,
        ..Default::default()
    })
    .expect("an adapter, as before");
    let got = distances(&ctx, &q, &r, &cfg);
    let want = distances(&hand, &q, &r, &cfg);
    assert!(got
        .iter()
        .zip(want.iter())
        .all(|(a, b)| a.to_bits() == b.to_bits()));
}

/// Tuning inside an operation (`Tuning::Eager` tunes any adapter, lavapipe included) times
/// the operation's own tile: the call holds no more than its plan says, works under bindings
/// smaller than a tuning tile of its own would need, and gives the hand-written kernel's
/// bits. (The first tuner timed a tile of its own: on an H100 the plans' peaks went over and
/// every candidate failed under 16 KiB bindings.)
#[test]
fn tuning_inside_an_operation_stays_within_its_plan_and_small_bindings() {
    let Some(probe) = common::shared_gpu() else {
        return;
    };
    let limits = wgpu::Limits {
        max_storage_buffer_binding_size: 16 << 10,
        ..probe.limits().cloned().expect("a wgpu context has limits")
    };
    let eager = |limits: Option<wgpu::Limits>, kernel| {
        common::gpu_context_with(ContextConfig {
            tuning: Tuning::Eager,
            limits,
            budget_bytes: Some(8 << 20),
            distance_kernel: kernel,
            ..Default::default()
        })
        .expect("an adapter, as before")
    };
    let q = Array2::from_shape_fn((90, 12), |(i, k)| ((i * 5 + k) % 9) as f32 - 4.0);
    let r = Array2::from_shape_fn((200, 12), |(i, k)| ((i * 3 + k * 2) % 7) as f32 - 3.0);
    let hand = eager(None, DistanceKernel::HandWritten);
    for limits in [None, Some(limits)] {
        let small = limits.is_some();
        let ctx = eager(limits, DistanceKernel::Tuned);
        for distance in [Distance::Euclidean, Distance::Cosine] {
            let cfg = PairwiseConfig {
                distance: DistanceConfig {
                    distance,
                    normalize: true,
                },
                ..Default::default()
            };
            let plan = pairwise_distances_plan(&ctx, q.view(), r.view(), &cfg).expect("plan");
            ctx.reset_peak();
            let before = ctx.transfers();
            let got = pairwise_distances(&ctx, q.view(), r.view(), &cfg).expect("distances");
            let spent = ctx.transfers().since(&before);
            let peak = ctx.memory().peak_bytes;
            assert!(
                peak <= plan.bytes,
                "small bindings {small}: peak {peak} above the plan's {plan:?}"
            );
            if distance == Distance::Euclidean {
                assert!(
                    spent.host.tune_ns > 0,
                    "small bindings {small}: tuned first"
                );
            }
            let want = pairwise_distances(&hand, q.view(), r.view(), &cfg).expect("hand");
            assert!(
                got.values
                    .iter()
                    .zip(want.values.iter())
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "small bindings {small}, {distance:?}: not the hand-written kernel's bits"
            );
        }
        let found = knn(&ctx, q.view(), r.view(), &KnnConfig::default()).expect("knn");
        let want = knn(&hand, q.view(), r.view(), &KnnConfig::default()).expect("knn");
        assert_eq!(found.indices, want.indices, "small bindings {small}");
    }
}
