//! `row_norms` on the GPU against its CPU reference. The kernel's output is observable
//! exactly through a raw squared-Euclidean distance to a zero reference row:
//! `|q|² + 0 − 2·0` is the query's squared norm as the kernel computed it. Covers sizes off the
//! workgroup (256), zero rows, one column, huge values, and more workgroups than one dimension
//! of the grid holds (the row index folds `y` into `x`).

use crate::common;

use ndarray::{Array1, Array2};
use proptest::prelude::*;
use wgpu_metric_learning::reference::row_norms::row_norms;
use wgpu_metric_learning::{
    pairwise_distances, Context, ContextConfig, Distance, DistanceConfig, PairwiseConfig,
};

/// The squared norms of `x`'s rows as the GPU computes them.
fn gpu_norms(ctx: &Context, x: &Array2<f32>) -> Array1<f32> {
    let zero = Array2::<f32>::zeros((1, x.ncols()));
    let cfg = PairwiseConfig {
        distance: DistanceConfig {
            distance: Distance::SquaredEuclidean,
            normalize: false,
        },
        ..Default::default()
    };
    let d = pairwise_distances(ctx, x, &zero, &cfg).expect("distances to zero");
    d.values.column(0).to_owned()
}

/// The kernel sums `dot(v, v)` of each `vec4` in turn; the reference sums the same groups
/// with the same order, so only the fusing of a multiply-add may differ: one rounding.
fn check(ctx: &Context, x: &Array2<f32>) {
    let got = gpu_norms(ctx, x);
    let want = row_norms(x.view());
    assert_eq!(got.len(), want.len(), "one norm per row");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let tol = 1e-6 * w.abs() + 1e-30;
        assert!(
            g.is_finite() && (g - w).abs() <= tol,
            "row {i}: GPU {g}, reference {w}"
        );
    }
}

fn matrix(rows: usize, d: usize) -> impl Strategy<Value = Array2<f32>> {
    proptest::collection::vec(-4.0f32..4.0, rows * d)
        .prop_map(move |v| Array2::from_shape_vec((rows, d), v).expect("sized"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(16)))]

    #[test]
    fn row_norms_gpu_matches_reference(x in (1usize..600, 1usize..40).prop_flat_map(|(r, d)| matrix(r, d))) {
        if let Some(ctx) = common::shared_gpu() {
            check(ctx, &x);
        }
    }
}

#[test]
fn row_norms_edge_cases() {
    let Some(ctx) = common::shared_gpu() else {
        return;
    };
    // One column; a zero row; values whose squares are near f32's top; 257 rows (one past a
    // workgroup).
    let mut x = Array2::from_shape_fn((257, 1), |(i, _)| i as f32 - 128.0);
    x[[0, 0]] = 0.0;
    check(ctx, &x);
    let big = Array2::from_elem((3, 5), 1.0e18f32);
    check(ctx, &big);
}

#[test]
fn row_norms_fold_rows_past_the_workgroup_limit() {
    // Two workgroups of 256 per dimension: 1 500 rows need 6, folded into a 2 × 3 grid.
    let Some(probe) = common::shared_gpu() else {
        return;
    };
    let limits = wgpu::Limits {
        max_compute_workgroups_per_dimension: 2,
        ..probe.limits().cloned().expect("wgpu context has limits")
    };
    let ctx = common::gpu_context_with(ContextConfig {
        limits: Some(limits),
        ..Default::default()
    })
    .expect("an adapter accepts lower limits");
    let x = Array2::from_shape_fn((1500, 7), |(i, k)| ((i * 7 + k) % 11) as f32 - 5.0);
    check(&ctx, &x);
}
