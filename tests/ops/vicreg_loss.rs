//! `vicreg_loss` against its written-out reference (PML's `(d, d)` covariance in f64), on both
//! sides of `n = d` (the library's Gram matrix switches there), finite differences, the
//! budget and typed errors.

use crate::common;
use crate::ops::ntxent_loss::noise;

use ndarray::Array2;
use proptest::prelude::*;
use wgpu_metric_learning::reference::vicreg_loss::vicreg_loss as reference;
use wgpu_metric_learning::{vicreg_loss, vicreg_loss_plan, Context, Error, VicRegConfig};

fn config((lambda, mu, nu, eps): (f32, f32, f32, f32)) -> VicRegConfig {
    VicRegConfig {
        invariance_lambda: lambda,
        variance_mu: mu,
        covariance_v: nu,
        eps,
        ..Default::default()
    }
}

/// `got` within `tol` of the largest element of `want` (at least 1e-3: f32 rounding of the
/// covariance's `C − diag C` where the reference's gradient is 0).
fn close(got: &Array2<f32>, want: &Array2<f64>, tol: f64, what: &str) {
    let top = want.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
    for (g, w) in got.iter().zip(want) {
        assert!((f64::from(*g) - w).abs() <= tol * top, "{what}: {g} vs {w}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random views (n from 2, d from 1, either side of n = d), one view or two, PML's weights
    /// or others, rows scaled so that some columns' deviations pass 1 and others do not.
    #[test]
    fn matches_the_reference(
        n in 2usize..40,
        d in 1usize..40,
        seed in any::<u64>(),
        two_views in any::<bool>(),
        scale in prop_oneof![Just(1.0f32), 0.1f32..6.0],
        weights in prop_oneof![
            Just((25.0f32, 25.0f32, 1.0f32, 1e-4f32)),
            (0.0f32..30.0, 0.0f32..30.0, 0.0f32..3.0, 1e-5f32..0.1)
        ],
    ) {
        let z = noise(n, d, seed) * scale;
        let z2 = noise(n, d, seed ^ 0x5eed) * scale;
        let cfg = config(weights);
        let refs = two_views.then_some(z2.view());
        let got = vicreg_loss(&Context::native_cpu(None), z.view(), refs, &cfg).expect("loss");
        let want = reference(z.view(), refs.unwrap_or(z.view()), weights);
        let what = format!("n {n} d {d} two views {two_views}");
        for (g, w) in [
            (got.loss, want.loss),
            (got.invariance, want.invariance),
            (got.variance, want.variance),
            (got.covariance, want.covariance),
        ] {
            prop_assert!((f64::from(g) - w).abs() <= 1e-5 * want.loss.abs().max(1.0), "{}: {} vs {}", what, g, w);
        }
        match got.ref_grad {
            Some(r) => {
                close(&got.grad, &want.grad, 1e-4, &what);
                close(&r, &want.ref_grad, 1e-4, &what);
            }
            None => close(&got.grad, &(&want.grad + &want.ref_grad), 1e-4, &what),
        }
    }
}

/// PML's VICReg in f64 from both views (the function whose finite differences the gradients
/// must match).
fn vicreg_f64(z: &Array2<f64>, z2: &Array2<f64>) -> f64 {
    let (n, d) = z.dim();
    let term = |x: &Array2<f64>| {
        let mean = x.mean_axis(ndarray::Axis(0)).expect("rows");
        let xc = x - &mean;
        let c = xc.t().dot(&xc) / (n - 1) as f64;
        let var: f64 = (0..d)
            .map(|j| (1.0 - (c[[j, j]] + 1e-4).sqrt()).max(0.0))
            .sum();
        let mut off = 0.0;
        for ((i, j), v) in c.indexed_iter() {
            if i != j {
                off += v * v;
            }
        }
        25.0 * var / (2.0 * d as f64) + off / d as f64
    };
    let inv = 25.0 * (z - z2).mapv(|v| v * v).sum() / (n * d) as f64;
    inv + term(z) + term(z2)
}

#[test]
fn gradients_match_finite_differences() {
    for (n, d) in [(5, 8), (9, 4)] {
        let z = noise(n, d, 3) * 1.5;
        let z2 = noise(n, d, 4) * 1.5;
        let out = vicreg_loss(
            &Context::native_cpu(None),
            z.view(),
            Some(z2.view()),
            &VicRegConfig::default(),
        )
        .expect("loss");
        let (a, b) = (z.mapv(f64::from), z2.mapv(f64::from));
        let what = format!("({n}, {d})");
        assert!(vicreg_f64(&a, &b) > 0.0, "a test that cannot fail");
        common::assert_finite_differences(&a, |x| vicreg_f64(x, &b), &out.grad, 2e-3, &what);
        let ref_grad = out.ref_grad.expect("two views");
        common::assert_finite_differences(&b, |x| vicreg_f64(&a, x), &ref_grad, 2e-3, &what);
    }
}

#[test]
fn holds_its_plan_and_refuses_a_smaller_budget() {
    let z = noise(64, 300, 1);
    let cfg = VicRegConfig::default();
    let plan = vicreg_loss_plan(&Context::native_cpu(None), z.view(), None, &cfg).expect("plan");
    let ctx = Context::native_cpu(Some(plan.min_bytes));
    vicreg_loss(&ctx, z.view(), None, &cfg).expect("within the plan");
    assert!(ctx.memory().peak_bytes <= plan.min_bytes);
    let tight = Context::native_cpu(Some(plan.min_bytes - 1));
    assert!(matches!(
        vicreg_loss(&tight, z.view(), None, &cfg),
        Err(Error::OverBudget { .. })
    ));
}

#[test]
fn bad_inputs_are_typed_errors() {
    let ctx = Context::native_cpu(None);
    let cfg = VicRegConfig::default();
    let z = noise(4, 3, 9);
    let one = noise(1, 3, 9);
    assert!(matches!(
        vicreg_loss(&ctx, one.view(), None, &cfg),
        Err(Error::Shape { .. })
    ));
    let other = noise(4, 2, 9);
    assert!(matches!(
        vicreg_loss(&ctx, z.view(), Some(other.view()), &cfg),
        Err(Error::Shape { .. })
    ));
    let mut nan = z.clone();
    nan[[1, 2]] = f32::NAN;
    assert!(matches!(
        vicreg_loss(&ctx, z.view(), Some(nan.view()), &cfg),
        Err(Error::NonFinite { row: 1, col: 2, .. })
    ));
    for eps in [0.0, -1.0, f32::NAN] {
        let bad = VicRegConfig {
            eps,
            ..VicRegConfig::default()
        };
        assert!(matches!(
            vicreg_loss(&ctx, z.view(), None, &bad),
            Err(Error::InvalidParameter { .. })
        ));
    }
}
