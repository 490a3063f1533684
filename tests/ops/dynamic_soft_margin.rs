//! `dynamic_soft_margin_loss` against its written-out reference (every triplet listed, PML's
//! histogram and autograd's path through it): values, the updated histogram and gradients,
//! with and without references and an earlier histogram; the out-of-range error; the budget.

use crate::common::{assert_loss_gradients, reference_inputs};
use crate::ops::ntxent_loss::noise;

use ndarray::Array1;
use proptest::prelude::*;
use wgpu_metric_learning::reference::dynamic_soft_margin::dynamic_soft_margin_loss as reference;
use wgpu_metric_learning::{
    dynamic_soft_margin_loss, dynamic_soft_margin_loss_plan, pair_loss, pair_loss_plan, Context,
    Distance, DistanceConfig, DynamicSoftMargin, DynamicSoftMarginConfig, Error, MiningSet,
    PairLossConfig,
};

fn config(
    rule: DynamicSoftMargin,
    distance: Distance,
    ref_grad: bool,
    histogram: Vec<f32>,
) -> DynamicSoftMarginConfig {
    DynamicSoftMarginConfig {
        loss: PairLossConfig {
            rule,
            distance: DistanceConfig {
                distance,
                normalize: true,
            },
            ref_grad,
            ..Default::default()
        },
        histogram,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn matches_the_reference(
        b in 0usize..16,
        m in 1usize..24,
        d in 1usize..8,
        classes in 1u32..5,
        seed in any::<u64>(),
        with_refs in any::<bool>(),
        ref_grad in any::<bool>(),
        squared in any::<bool>(),
        min_val in prop_oneof![Just(-2.0f32), Just(-3.0f32), -5.0f32..-1.0],
        num_bins in prop_oneof![Just(10u32), 2u32..40],
        momentum in prop_oneof![Just(0.01f32), 0.0f32..1.0],
        earlier in any::<bool>(),
    ) {
        let x = noise(b, d, seed);
        let labels = Array1::from_shape_fn(b, |i| ((i as u64 + seed) % u64::from(classes)) as u32);
        let refs = with_refs.then(|| {
            let l = Array1::from_shape_fn(m, |i| ((i as u64 * 3 + seed / 7) % u64::from(classes)) as u32);
            (l, noise(m, d, seed ^ 99))
        });
        let distance = if squared { Distance::SquaredEuclidean } else { Distance::Euclidean };
        let rule = DynamicSoftMargin { min_val, num_bins, momentum };
        let previous: Vec<f32> = if earlier {
            let raw: Vec<f32> = (0..num_bins).map(|k| ((k as u64 * 31 + seed) % 7) as f32 + 0.5).collect();
            let sum: f32 = raw.iter().sum();
            raw.iter().map(|v| v / sum).collect()
        } else {
            Vec::new()
        };
        let cfg = config(rule, distance, ref_grad, previous.clone());
        let set = MiningSet::new(&x, &labels);
        let ref_set = refs.as_ref().map(|(l, e)| MiningSet::new(e, l));
        let got = dynamic_soft_margin_loss(&Context::native_cpu(None), &set, ref_set.as_ref(), &cfg);
        let native = Context::native_cpu(None);
        let (ref_x, distances, lists) = reference_inputs(&native, (&x, &labels), refs.as_ref(), cfg.loss.distance);
        let want = reference(x.view(), ref_x.view(), distances.view(), &lists, rule, &previous, cfg.loss.distance);
        let Some((want, hist)) = want else {
            prop_assert!(matches!(got, Err(Error::InvalidParameter { what: "min_val", .. })), "{:?}", got.map(|g| g.loss.loss));
            return Ok(());
        };
        let got = got.expect("loss");
        prop_assert_eq!(got.loss.nonzero, want.nonzero);
        prop_assert!((f64::from(got.loss.loss) - want.loss).abs() <= 1e-5 * want.loss.abs().max(1.0), "{} vs {}", got.loss.loss, want.loss);
        prop_assert_eq!(got.histogram.len(), hist.len());
        for (g, w) in got.histogram.iter().zip(&hist) {
            prop_assert!((f64::from(*g) - w).abs() <= 1e-6, "histogram {} vs {}", g, w);
        }
        assert_loss_gradients(
            refs.is_some(),
            ref_grad,
            (&got.loss.query_grad, got.loss.ref_grad.as_ref()),
            (&want.query_grad, &want.ref_grad),
            "dynamic soft margin",
        );
    }
}

/// Through `pair_loss` it is a fresh loss's call; the histogram threads through calls.
#[test]
fn pair_loss_is_the_first_call_and_the_histogram_carries() {
    let x = noise(40, 8, 5);
    let y = Array1::from_shape_fn(40, |i| (i % 4) as u32);
    let set = MiningSet::new(&x, &y);
    let ctx = Context::native_cpu(None);
    let cfg = config(
        DynamicSoftMargin::default(),
        Distance::Euclidean,
        false,
        Vec::new(),
    );
    let first = dynamic_soft_margin_loss(&ctx, &set, None, &cfg).expect("loss");
    let fresh = pair_loss(&ctx, &set, None, &cfg.loss).expect("loss");
    assert_eq!(first.loss.loss, fresh.loss);
    assert!((first.histogram.iter().sum::<f32>() - 1.0).abs() < 1e-5);
    let next = DynamicSoftMarginConfig {
        histogram: first.histogram.clone(),
        ..cfg.clone()
    };
    let second = dynamic_soft_margin_loss(&ctx, &set, None, &next).expect("loss");
    // The same batch again: momentum 0.01 mixes the same histogram in, which is unchanged.
    for (a, b) in second.histogram.iter().zip(&first.histogram) {
        assert!((a - b).abs() < 1e-6);
    }
    assert!(second.loss.loss != 0.0);
    let wrong = DynamicSoftMarginConfig {
        histogram: vec![0.1; 3],
        ..cfg
    };
    assert!(matches!(
        dynamic_soft_margin_loss(&ctx, &set, None, &wrong),
        Err(Error::InvalidParameter {
            what: "histogram",
            ..
        })
    ));
}

#[test]
fn fits_its_plan_and_refuses_bad_parameters() {
    let x = noise(120, 16, 3);
    let y = Array1::from_shape_fn(120, |i| (i % 3) as u32);
    let set = MiningSet::new(&x, &y);
    let cfg = config(
        DynamicSoftMargin::default(),
        Distance::Euclidean,
        false,
        Vec::new(),
    );
    let whole = pair_loss(&Context::native_cpu(None), &set, None, &cfg.loss).expect("loss");
    let plan = pair_loss_plan(&Context::native_cpu(None), &set, None, &cfg.loss).expect("plan");
    let own =
        dynamic_soft_margin_loss_plan(&Context::native_cpu(None), &set, None, &cfg).expect("plan");
    assert_eq!(
        (own.bytes, own.min_bytes, own.rows),
        (plan.bytes, plan.min_bytes, plan.rows)
    );
    let budget = plan.min_bytes + 4 * 120 * 8;
    let ctx = Context::native_cpu(Some(budget));
    let split = pair_loss(&ctx, &set, None, &cfg.loss).expect("loss");
    assert!(ctx.memory().peak_bytes <= budget);
    assert!((split.loss - whole.loss).abs() <= 1e-6 * whole.loss.abs().max(1e-3));
    let tight = Context::native_cpu(Some(plan.min_bytes - 1));
    assert!(matches!(
        pair_loss(&tight, &set, None, &cfg.loss),
        Err(Error::OverBudget { .. } | Error::BudgetExceeded { .. })
    ));
    let bad = |rule: DynamicSoftMargin, distance: DistanceConfig| {
        let cfg = PairLossConfig {
            rule,
            distance,
            ..Default::default()
        };
        matches!(
            pair_loss(&Context::native_cpu(None), &set, None, &cfg),
            Err(Error::InvalidParameter { .. })
        )
    };
    let lp = DistanceConfig::default();
    for rule in [
        DynamicSoftMargin {
            min_val: 0.0,
            ..Default::default()
        },
        DynamicSoftMargin {
            num_bins: 1,
            ..Default::default()
        },
        DynamicSoftMargin {
            momentum: f32::NAN,
            ..Default::default()
        },
    ] {
        assert!(bad(rule, lp), "{rule:?}");
    }
    let raw = DistanceConfig {
        normalize: false,
        ..lp
    };
    let cosine = DistanceConfig {
        distance: Distance::Cosine,
        normalize: true,
    };
    assert!(bad(DynamicSoftMargin::default(), raw));
    assert!(bad(DynamicSoftMargin::default(), cosine));
}
