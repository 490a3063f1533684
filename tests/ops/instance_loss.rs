//! `pair_loss` with PML's InstanceLoss against its written-out reference (the `(b, b)` matrix,
//! torch's label ranks), finite differences, the budget and its typed errors.

use crate::common;
use crate::ops::ntxent_loss::noise;

use ndarray::{Array1, Array2};
use proptest::prelude::*;
use wgpu_metric_learning::reference::pair_loss::instance_loss;
use wgpu_metric_learning::{
    pair_loss, pair_loss_plan, Context, DistanceConfig, Error, Instance, MiningSet, PairLoss,
    PairLossConfig,
};

fn config(gamma: f32) -> PairLossConfig<Instance> {
    PairLossConfig {
        rule: Instance { gamma },
        ..Default::default()
    }
}

/// Loss within 1e-5 relative, gradient within 1e-4 of its largest element.
fn assert_matches(got: &PairLoss, x: &Array2<f32>, labels: &[i64], gamma: f32) {
    let want = instance_loss(x.view(), labels, gamma);
    let what = format!("b {} gamma {gamma} labels {labels:?}", x.nrows());
    assert!(
        (f64::from(got.loss) - want.loss).abs() <= 1e-5 * want.loss.abs().max(1.0),
        "{what}: {} vs {}",
        got.loss,
        want.loss
    );
    assert_eq!(got.nonzero, want.nonzero, "{what}");
    let top = want.query_grad.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
    for (g, w) in got.query_grad.iter().zip(&want.query_grad) {
        assert!(
            (f64::from(*g) - w).abs() <= 1e-4 * top,
            "{what}: {g} vs {w}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random batches: unsorted, negative and sparse labels (ranks differ from first
    /// appearance), one class, all distinct, a zero row, scales from soft to PML's 64.
    #[test]
    fn matches_the_reference(
        b in 0usize..40,
        d in 1usize..20,
        seed in any::<u64>(),
        classes in 1i64..8,
        spread in prop_oneof![Just(1i64), Just(-7i64), Just(1000i64)],
        gamma in prop_oneof![Just(64.0f32), 0.5f32..80.0],
        zero_row in any::<bool>(),
    ) {
        let mut x = noise(b, d, seed);
        if zero_row && b > 0 {
            x.row_mut(b / 2).fill(0.0);
        }
        let labels: Vec<i64> = (0..b as u64)
            .map(|i| ((i.wrapping_mul(seed | 1) >> 3) as i64 % classes) * spread)
            .collect();
        let y = Array1::from(labels.clone());
        let set = MiningSet::new(&x, &y);
        let native = Context::native_cpu(None);
        // On a wgpu context the batch runs on the device (`SOFTMAX` on relabelled sides).
        for ctx in std::iter::once(&native).chain(common::shared_gpu()) {
            let got = pair_loss(ctx, &set, None, &config(gamma)).expect("loss");
            if b == 0 {
                prop_assert_eq!(got.loss, 0.0);
            } else {
                prop_assert_eq!(got.path, ctx.path());
                assert_matches(&got, &x, &labels, gamma);
            }
        }
    }
}

/// PML's InstanceLoss in f64 from the embeddings (targets: the labels' sorted ranks).
fn instance_f64(x: &Array2<f64>, labels: &[i64], gamma: f64) -> f64 {
    let mut sorted = labels.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut x_hat = x.clone();
    for mut r in x_hat.rows_mut() {
        let n = r.dot(&r).sqrt();
        r /= n;
    }
    let s = x_hat.dot(&x_hat.t()) * gamma;
    let b = labels.len();
    (0..b)
        .map(|a| {
            let t = sorted.binary_search(&labels[a]).expect("a label");
            let lse = s.row(a).iter().map(|v| v.exp()).sum::<f64>().ln();
            (lse - s[[a, t]]) / b as f64
        })
        .sum()
}

/// The gradient against finite differences of the loss written from the embeddings in f64.
#[test]
fn gradient_matches_finite_differences() {
    let x = noise(9, 5, 11);
    let labels = [4i64, -1, 9, 4, -1, 9, 4, 2, 30];
    let y = Array1::from(labels.to_vec());
    let got = pair_loss(
        &Context::native_cpu(None),
        &MiningSet::new(&x, &y),
        None,
        &config(3.0),
    )
    .expect("loss");
    let x64 = x.mapv(f64::from);
    let f = |x: &Array2<f64>| instance_f64(x, &labels, 3.0);
    assert!(f(&x64) > 0.0, "a test that cannot fail");
    crate::common::assert_finite_differences(&x64, f, &got.query_grad, 2e-3, "instance");
}

/// Blocks shrink under the budget, the answer does not change, the peak stays under it, and
/// one byte under the plan's least refuses.
#[test]
fn fits_a_small_budget() {
    let x = noise(200, 16, 3);
    let y = Array1::from_shape_fn(200, |i| (i % 7) as i64);
    let set = MiningSet::new(&x, &y);
    let cfg = config(64.0);
    let whole = pair_loss(&Context::native_cpu(None), &set, None, &cfg).expect("loss");
    let plan = pair_loss_plan(&Context::native_cpu(None), &set, None, &cfg).expect("plan");
    let budget = plan.min_bytes + 8 * 200 * 4;
    let ctx = Context::native_cpu(Some(budget));
    let split = pair_loss(&ctx, &set, None, &cfg).expect("loss");
    assert!(ctx.memory().peak_bytes <= budget);
    assert!((split.loss - whole.loss).abs() <= 1e-6 * whole.loss.abs());
    for (a, b) in split.query_grad.iter().zip(&whole.query_grad) {
        assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()));
    }
    let tight = Context::native_cpu(Some(plan.min_bytes - 1));
    assert!(matches!(
        pair_loss(&tight, &set, None, &cfg),
        Err(Error::OverBudget { .. })
    ));
}

#[test]
fn bad_parameters_are_typed_errors() {
    let ctx = Context::native_cpu(None);
    let x = noise(4, 3, 9);
    let y = ndarray::array![0i64, 0, 1, 1];
    let set = MiningSet::new(&x, &y);
    let bad = |r: Result<PairLoss, Error>| matches!(r, Err(Error::InvalidParameter { .. }));
    for gamma in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        assert!(bad(pair_loss(&ctx, &set, None, &config(gamma))), "{gamma}");
    }
    assert!(
        bad(pair_loss(&ctx, &set, Some(&set), &config(64.0))),
        "refs"
    );
    let euclid = PairLossConfig {
        distance: DistanceConfig::default(),
        ..config(64.0)
    };
    assert!(bad(pair_loss(&ctx, &set, None, &euclid)), "distance");
}
