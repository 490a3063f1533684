//! `pair_loss` with PML's AngularLoss against its written-out reference (every pair's row of
//! negatives), with and without references, finite differences, the budget and typed errors.

use crate::common::{self, assert_loss_gradients, reference_inputs};
use crate::ops::ntxent_loss::noise;

use ndarray::{Array1, Array2};
use proptest::prelude::*;
use wgpu_metric_learning::reference::pair_loss::angular_loss;
use wgpu_metric_learning::{
    pair_loss, pair_loss_plan, Angular, Context, DistanceConfig, Error, MiningSet, PairLoss,
    PairLossConfig,
};

fn config(alpha: f32, ref_grad: bool) -> PairLossConfig<Angular> {
    PairLossConfig {
        rule: Angular { alpha },
        ref_grad,
        ..Default::default()
    }
}

/// The library against the reference on `(x, labels)` and optional references.
fn check(
    ctx: &Context,
    (x, labels): (&Array2<f32>, &Array1<u32>),
    refs: Option<&(Array1<u32>, Array2<f32>)>,
    (alpha, ref_grad): (f32, bool),
) {
    let set = MiningSet::new(x, labels);
    let ref_set = refs.map(|(l, e)| MiningSet::new(e, l));
    let got = pair_loss(ctx, &set, ref_set.as_ref(), &config(alpha, ref_grad)).expect("loss");
    let native = Context::native_cpu(None);
    let (ref_x, _, lists) = reference_inputs(&native, (x, labels), refs, DistanceConfig::default());
    let want = angular_loss(x.view(), ref_x.view(), &lists, alpha);
    let what = format!("b {} refs {} alpha {alpha}", x.nrows(), ref_x.nrows());
    assert_eq!(got.nonzero, want.nonzero, "{what}");
    assert!(
        (f64::from(got.loss) - want.loss).abs() <= 1e-5 * want.loss.abs().max(1.0),
        "{what}: {} vs {}",
        got.loss,
        want.loss
    );
    assert_loss_gradients(
        refs.is_some(),
        ref_grad,
        (&got.query_grad, got.ref_grad.as_ref()),
        (&want.query_grad, &want.ref_grad),
        &what,
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random batches (empty, one class, sizes off the lanes), with references or not, the
    /// references' gradient or not, raw rows of any norm (PML leaves the negatives raw),
    /// angles from 10 to 50 degrees, budgets that split the classes into chunks.
    #[test]
    fn matches_the_reference(
        b in 0usize..30,
        m in 1usize..50,
        d in 1usize..24,
        classes in 1u32..6,
        seed in any::<u64>(),
        with_refs in any::<bool>(),
        ref_grad in any::<bool>(),
        alpha in prop_oneof![Just(40.0f32), 10.0f32..50.0],
        scale in prop_oneof![Just(1.0f32), 0.1f32..3.0],
        tight in any::<bool>(),
    ) {
        let x = noise(b, d, seed) * scale;
        let labels = Array1::from_shape_fn(b, |i| ((i as u64 * 7 + seed) % u64::from(classes)) as u32);
        let refs = with_refs.then(|| {
            let r = noise(m, d, seed ^ 0xabc) * scale;
            let l = Array1::from_shape_fn(m, |i| ((i as u64 * 5 + seed / 3) % u64::from(classes)) as u32);
            (l, r)
        });
        let ctx = if tight {
            let set = MiningSet::new(&x, &labels);
            let ref_set = refs.as_ref().map(|(l, e)| MiningSet::new(e, l));
            let cfg = config(alpha, ref_grad);
            let plan = pair_loss_plan(&Context::native_cpu(None), &set, ref_set.as_ref(), &cfg)
                .expect("plan");
            Context::native_cpu(Some(plan.min_bytes + 2048))
        } else {
            Context::native_cpu(None)
        };
        check(&ctx, (&x, &labels), refs.as_ref(), (alpha, ref_grad));
        prop_assert!(ctx.memory().peak_bytes <= ctx.memory().budget_bytes);
    }
}

/// Finite differences of the loss written from the embeddings in f64 (no references: every
/// row in all three roles).
#[test]
fn gradient_matches_finite_differences() {
    let x = noise(10, 6, 21) * 2.0;
    let labels = [0u32, 1, 2, 0, 1, 2, 0, 1, 3, 3];
    let y = Array1::from(labels.to_vec());
    let got = pair_loss(
        &Context::native_cpu(None),
        &MiningSet::new(&x, &y),
        None,
        &config(35.0, false),
    )
    .expect("loss");
    let f = |x: &Array2<f64>| angular_f64(x, &labels, 35.0);
    let x64 = x.mapv(f64::from);
    assert!(f(&x64) > 0.0, "a test that cannot fail");
    common::assert_finite_differences(&x64, f, &got.query_grad, 2e-3, "angular");
}

/// PML's AngularLoss in f64 from the embeddings, without references.
fn angular_f64(x: &Array2<f64>, labels: &[u32], alpha: f64) -> f64 {
    let sq = alpha.to_radians().tan().powi(2);
    let (c1, c2) = ((4.0 * sq) as f32 as f64, (2.0 * (1.0 + sq)) as f32 as f64);
    let unit = |i: usize| {
        let r = x.row(i);
        &r / r.dot(&r).sqrt()
    };
    let n = labels.len();
    let (mut sum, mut pairs) = (0.0, 0);
    for a in 0..n {
        for p in (0..n).filter(|&p| p != a && labels[p] == labels[a]) {
            let (xa, xp) = (unit(a), unit(p));
            let s = &xa + &xp;
            let inner: f64 = (0..n)
                .filter(|&j| labels[j] != labels[a])
                .map(|j| (c1 * s.dot(&x.row(j)) - c2 * xa.dot(&xp)).exp())
                .sum();
            sum += inner.ln_1p();
            pairs += 1;
        }
    }
    sum / f64::from(pairs)
}

/// Large classes split into chunks under a small budget: the same answer, the peak under the
/// budget, one byte under the plan's least refuses.
#[test]
fn fits_a_small_budget() {
    let x = noise(300, 16, 3);
    let y = Array1::from_shape_fn(300, |i| (i % 2) as u32);
    let set = MiningSet::new(&x, &y);
    let cfg = config(40.0, false);
    let whole = pair_loss(&Context::native_cpu(None), &set, None, &cfg).expect("loss");
    let plan = pair_loss_plan(&Context::native_cpu(None), &set, None, &cfg).expect("plan");
    assert!(plan.rows >= 150, "one chunk per class without a budget");
    assert!(whole.loss > 0.0 && whole.nonzero == 2 * 150 * 149);
    let ctx = Context::native_cpu(Some(plan.min_bytes + 40 * 300 * 4 * 6));
    let split = pair_loss(&ctx, &set, None, &cfg).expect("loss");
    assert!(ctx.memory().peak_bytes <= ctx.memory().budget_bytes);
    let small = pair_loss_plan(&ctx, &set, None, &cfg).expect("plan");
    assert!(small.rows < 150, "chunks: {}", small.rows);
    assert!((split.loss - whole.loss).abs() <= 1e-5 * whole.loss.abs());
    let top = whole.query_grad.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (a, b) in split.query_grad.iter().zip(&whole.query_grad) {
        assert!((a - b).abs() <= 1e-5 * top);
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
    let y = ndarray::array![0u32, 0, 1, 1];
    let set = MiningSet::new(&x, &y);
    let bad = |r: Result<PairLoss, Error>| matches!(r, Err(Error::InvalidParameter { .. }));
    for alpha in [f32::NAN, f32::INFINITY, -f32::INFINITY] {
        assert!(
            bad(pair_loss(&ctx, &set, None, &config(alpha, false))),
            "{alpha}"
        );
    }
    for distance in [
        DistanceConfig {
            normalize: false,
            ..DistanceConfig::default()
        },
        PairLossConfig::<wgpu_metric_learning::SupCon>::default().distance,
    ] {
        let cfg = PairLossConfig {
            distance,
            ..config(40.0, false)
        };
        assert!(bad(pair_loss(&ctx, &set, None, &cfg)), "{distance:?}");
    }
}
