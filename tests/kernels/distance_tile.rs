//! `distance_tile` (with `row_norms`) on the GPU against the CPU reference, plus the native CPU
//! path, under tight budgets and lowered device limits, and every typed input error.

use crate::common;
use crate::common::DISTANCES;

use ndarray::{Array2, ArrayView2};
use proptest::prelude::*;
use wgpu_metric_learning::reference::distance_tile::distance_tile;
use wgpu_metric_learning::{
    pairwise_distances, ComputePath, Context, ContextConfig, Distance, DistanceConfig, Error,
    PairwiseConfig,
};

/// Asserts `got` matches `want` elementwise. Tolerance: relative to the largest term of the
/// formula |q|² + |r|² − 2 q·r; Euclidean values are compared squared, because the square root
/// turns an absolute round-off ε near 0 into √ε.
fn assert_matches(
    got: ArrayView2<'_, f32>,
    want: ArrayView2<'_, f32>,
    scale: f32,
    cfg: &DistanceConfig,
) {
    assert_eq!(got.shape(), want.shape(), "shape");
    let tol = 2e-5 * (1.0 + scale);
    for ((idx, g), w) in got.indexed_iter().zip(want.iter()) {
        let (g2, w2) = match cfg.distance {
            Distance::Euclidean => (g * g, w * w),
            _ => (*g, *w),
        };
        assert!(
            g.is_finite() && (g2 - w2).abs() <= tol,
            "{cfg:?} at {idx:?}: got {g}, reference {w} (tolerance {tol} on the compared value)"
        );
    }
}

/// The largest |x|² over the rows of both inputs (1 when normalised): the formula's scale.
fn scale_of(q: ArrayView2<'_, f32>, r: ArrayView2<'_, f32>, cfg: &DistanceConfig) -> f32 {
    if cfg.normalize || cfg.distance == Distance::Cosine {
        return 1.0;
    }
    q.rows()
        .into_iter()
        .chain(r.rows())
        .map(|row| row.dot(&row))
        .fold(0.0, f32::max)
}

fn check(ctx: &Context, q: &Array2<f32>, r: &Array2<f32>, cfg: &DistanceConfig) {
    let got = pairwise_distances(
        ctx,
        q.view(),
        r.view(),
        &PairwiseConfig {
            distance: *cfg,
            ..Default::default()
        },
    )
    .expect("pairwise_distances");
    assert_eq!(got.path, ctx.path(), "the result says which path ran");
    let want = distance_tile(q.view(), r.view(), cfg);
    assert_matches(
        got.values.view(),
        want.view(),
        scale_of(q.view(), r.view(), cfg),
        cfg,
    );
}

fn matrix(rows: usize, d: usize, amp: f32) -> impl Strategy<Value = Array2<f32>> {
    proptest::collection::vec(-amp..amp, rows * d)
        .prop_map(move |v| Array2::from_shape_vec((rows, d), v).expect("sized"))
}

/// (queries, refs, config): sizes first (including 0 and sizes off the 64-tile), then data.
fn problem() -> impl Strategy<Value = (Array2<f32>, Array2<f32>, DistanceConfig)> {
    (
        0usize..70,
        0usize..140,
        1usize..37,
        0usize..4,
        any::<bool>(),
        prop_oneof![Just(1.0f32), Just(8.0)],
    )
        .prop_flat_map(|(q, n, d, which, normalize, amp)| {
            let cfg = DistanceConfig {
                distance: DISTANCES[which],
                normalize,
            };
            (matrix(q, d, amp), matrix(n, d, amp), Just(cfg))
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(24)))]

    #[test]
    fn distance_tile_gpu_matches_reference((q, r, cfg) in problem()) {
        if let Some(ctx) = common::shared_gpu() {
            check(ctx, &q, &r, &cfg);
        }
    }

    #[test]
    fn distance_tile_native_cpu_matches_reference((q, r, cfg) in problem()) {
        check(&Context::native_cpu(None), &q, &r, &cfg);
    }
}

/// Deterministic data without a random generator: a smooth, non-repeating pattern.
fn pattern(rows: usize, d: usize, seed: f32) -> Array2<f32> {
    Array2::from_shape_fn((rows, d), |(i, k)| {
        ((i as f32 * 0.37 + k as f32 * 1.13 + seed).sin() * 3.0).fract()
    })
}

#[test]
fn distance_tile_edge_cases_on_gpu() {
    let Some(ctx) = common::shared_gpu() else {
        return;
    };
    for cfg in DISTANCES.map(|distance| DistanceConfig {
        distance,
        normalize: false,
    }) {
        // Zero vectors (normalisation's 1e-12 floor), duplicates, and d = 1.
        let mut q = pattern(5, 6, 0.1);
        q.row_mut(0).fill(0.0);
        let r = ndarray::concatenate![ndarray::Axis(0), q.view(), pattern(3, 6, 0.7)];
        check(ctx, &q, &r, &cfg);
        check(
            ctx,
            &q,
            &r,
            &DistanceConfig {
                normalize: true,
                ..cfg
            },
        );
        check(ctx, &pattern(3, 1, 0.2), &pattern(129, 1, 0.3), &cfg);
        // Empty queries or refs give an empty matrix of the right shape.
        let got = pairwise_distances(
            ctx,
            pattern(0, 6, 0.0).view(),
            r.view(),
            &PairwiseConfig {
                distance: cfg,
                ..Default::default()
            },
        )
        .expect("empty queries");
        assert_eq!(got.values.shape(), &[0, 8], "(0, n)");
        let got = pairwise_distances(
            ctx,
            q.view(),
            pattern(0, 6, 0.0).view(),
            &PairwiseConfig {
                distance: cfg,
                ..Default::default()
            },
        )
        .expect("empty refs");
        assert_eq!(got.values.shape(), &[5, 0], "(q, 0)");
    }
}

#[test]
fn distance_tile_accepts_transposed_and_strided_views() {
    let Some(ctx) = common::shared_gpu() else {
        return;
    };
    let cfg = DistanceConfig::default();
    let qt = pattern(7, 20, 0.3); // (d, q) stored; its transpose is the query matrix
    let r = pattern(40, 7, 0.9);
    let r_strided = r.slice(ndarray::s![..;2, ..]);
    let got = pairwise_distances(
        ctx,
        qt.t(),
        r_strided,
        &PairwiseConfig {
            distance: cfg,
            ..Default::default()
        },
    )
    .expect("any layout");
    let want = distance_tile(qt.t(), r_strided, &cfg);
    assert_matches(got.values.view(), want.view(), 1.0, &cfg);
}

#[test]
fn distance_tile_under_a_1_mib_budget_stays_under_it() {
    let budget = 1 << 20;
    let Some(ctx) = common::gpu_context(Some(budget)) else {
        return;
    };
    // Unconstrained, one tile would need ~2 × 300 × 2000 × 4 B = 4.8 MB of output and staging.
    let (q, r) = (pattern(300, 37, 0.4), pattern(2000, 37, 0.5));
    let cfg = DistanceConfig::default();
    ctx.reset_peak();
    check(&ctx, &q, &r, &cfg);
    let mem = ctx.memory();
    assert!(
        mem.peak_bytes <= budget,
        "peak {} B over the {budget} B budget",
        mem.peak_bytes
    );
    assert!(
        mem.peak_bytes > budget / 4,
        "the planner used the budget: peak {}",
        mem.peak_bytes
    );
    assert_eq!(mem.current_bytes, 0, "every buffer was released");
}

#[test]
fn distance_tile_budget_below_one_tile_is_a_typed_error() {
    let budget = 64;
    let Some(ctx) = common::gpu_context(Some(budget)) else {
        return;
    };
    let (q, r) = (pattern(10, 16, 0.4), pattern(10, 16, 0.5));
    match pairwise_distances(
        &ctx,
        q.view(),
        r.view(),
        &PairwiseConfig {
            distance: DistanceConfig::default(),
            ..Default::default()
        },
    ) {
        Err(Error::OverBudget {
            op,
            required,
            budget: b,
        }) => {
            assert_eq!(op, "pairwise_distances", "names the operation");
            assert!(
                required > budget,
                "names the bytes one tile needs: {required}"
            );
            assert_eq!(b, budget, "names the budget");
        }
        other => panic!("expected OverBudget, got {other:?}"),
    }
    assert_eq!(ctx.memory().peak_bytes, 0, "nothing was allocated");
}

#[test]
fn distance_tile_under_tiny_device_limits_tiles_by_workgroups_and_bindings() {
    // Ask the adapter for far smaller limits than it has: at most 2 workgroups per dimension
    // (tiles of ≤ 128 × 128) and 16 KiB per storage binding, so a small problem needs many
    // tiles, as a huge one would under the real limits.
    let Some(probe) = common::shared_gpu() else {
        return;
    };
    let limits = wgpu::Limits {
        max_compute_workgroups_per_dimension: 2,
        max_storage_buffer_binding_size: 16 << 10,
        ..probe.limits().cloned().expect("wgpu context has limits")
    };
    let ctx = common::gpu_context_with(ContextConfig {
        limits: Some(limits),
        ..Default::default()
    })
    .expect("an adapter accepts lower limits");
    assert_eq!(
        ctx.limits().map(|l| l.max_compute_workgroups_per_dimension),
        Some(2),
        "the device got the requested limit"
    );
    for distance in DISTANCES {
        let cfg = DistanceConfig {
            distance,
            normalize: true,
        };
        check(&ctx, &pattern(150, 9, 0.1), &pattern(301, 9, 0.2), &cfg);
    }
}

#[test]
fn distance_tile_typed_errors_for_bad_input() {
    let ctx = Context::native_cpu(None);
    let gpu = common::shared_gpu();
    let cfg = DistanceConfig::default();
    let good = pattern(4, 3, 0.0);
    for ctx in std::iter::once(&ctx).chain(gpu) {
        let zero_dim = Array2::<f32>::zeros((4, 0));
        assert!(
            matches!(
                pairwise_distances(
                    ctx,
                    zero_dim.view(),
                    zero_dim.view(),
                    &PairwiseConfig {
                        distance: cfg,
                        ..Default::default()
                    }
                ),
                Err(Error::Shape {
                    what: "queries",
                    ..
                })
            ),
            "d = 0 is a shape error"
        );
        let other_dim = pattern(4, 5, 0.0);
        match pairwise_distances(
            ctx,
            good.view(),
            other_dim.view(),
            &PairwiseConfig {
                distance: cfg,
                ..Default::default()
            },
        ) {
            Err(Error::Shape { what, got, .. }) => {
                assert_eq!(
                    (what, got),
                    ("refs", vec![4, 5]),
                    "names refs and its shape"
                )
            }
            other => panic!("expected a shape error, got {other:?}"),
        }
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut r = good.clone();
            r[[2, 1]] = bad;
            match pairwise_distances(
                ctx,
                good.view(),
                r.view(),
                &PairwiseConfig {
                    distance: cfg,
                    ..Default::default()
                },
            ) {
                Err(Error::NonFinite { what, row, col, .. }) => {
                    assert_eq!((what, row, col), ("refs", 2, 1), "names where")
                }
                other => panic!("expected NonFinite for {bad}, got {other:?}"),
            }
        }
    }
}

#[test]
fn native_cpu_path_reports_itself() {
    let ctx = Context::native_cpu(None);
    let got = pairwise_distances(
        &ctx,
        pattern(2, 3, 0.0).view(),
        pattern(2, 3, 1.0).view(),
        &PairwiseConfig {
            distance: DistanceConfig::default(),
            ..Default::default()
        },
    )
    .expect("runs");
    assert_eq!(
        got.path,
        ComputePath::NativeCpu,
        "the result names its path"
    );
}

/// PML's arithmetic on the native path: rows normalised by division as `F.normalize`, and
/// (at most 25 rows a side) distances computed directly as `torch.cdist`. PML's test grid of
/// 16 unit rows at 0°, 1°, …, 15° then ties exactly where PML's own distances tie (found with
/// torch 2.15 and PML 2.9: `d(i, i − 1) == d(i, i + 1)` bit for bit for these `i`).
#[test]
fn native_distances_tie_where_pmls_tie_on_its_angle_grid() {
    let ctx = Context::native_cpu(None);
    let x = Array2::from_shape_fn((16, 2), |(i, j)| {
        let a = (i as f64).to_radians();
        (if j == 0 { a.cos() } else { a.sin() }) as f32
    });
    for (distance, pml_ties) in [
        (Distance::Cosine, vec![3, 5, 6, 7, 8, 9, 10, 11, 13]),
        (Distance::Euclidean, vec![1, 6]),
    ] {
        let cfg = PairwiseConfig {
            distance: DistanceConfig {
                distance,
                normalize: true,
            },
            ..Default::default()
        };
        let d = pairwise_distances(&ctx, &x, &x, &cfg)
            .expect("distances")
            .values;
        let ties: Vec<usize> = (1..15)
            .filter(|&i| d[[i, i - 1]].to_bits() == d[[i, i + 1]].to_bits())
            .collect();
        assert_eq!(ties, pml_ties, "{distance:?}");
    }
}
