//! `pair_loss` with PML's SignalToNoiseRatioContrastiveLoss: the value against PML's
//! contrastive reducer over the written-out SNR distances, the gradient against finite
//! differences of the loss in f64, with and without references and normalisation.

use crate::common::{self, reference_inputs};
use crate::ops::ntxent_loss::noise;

use ndarray::{Array1, Array2};
use proptest::prelude::*;
use wgpu_metric_learning::reference::pair_loss::{
    pair_loss as reference, snr_distances, PairLossRef,
};
use wgpu_metric_learning::{
    pair_loss, Context, Contrastive, Distance, DistanceConfig, Error, MiningSet, PairLossConfig,
    SnrContrastive,
};

fn config(rule: SnrContrastive, normalize: bool, ref_grad: bool) -> PairLossConfig<SnrContrastive> {
    PairLossConfig {
        rule,
        distance: DistanceConfig {
            distance: Distance::SquaredEuclidean,
            normalize,
        },
        ref_grad,
        ..Default::default()
    }
}

/// PML's contrastive loss over `d` and the pairs of `(labels, ref_labels)` (the diagonal left
/// out when `same`), in f64: each kind's mean over its nonzero pairs, added; 0 with at most
/// one pair of each kind.
fn contrastive_f64(
    d: &Array2<f64>,
    labels: &[u32],
    ref_labels: &[u32],
    same: bool,
    c: SnrContrastive,
) -> f64 {
    let (mut pos, mut neg) = (Vec::new(), Vec::new());
    for (i, &l) in labels.iter().enumerate() {
        for (j, &r) in ref_labels.iter().enumerate() {
            if same && i == j {
                continue;
            }
            if l == r {
                pos.push(d[[i, j]]);
            } else {
                neg.push(d[[i, j]]);
            }
        }
    }
    if pos.len() <= 1 && neg.len() <= 1 {
        return 0.0;
    }
    let mean_nonzero = |v: Vec<f64>| {
        let nz: Vec<f64> = v.into_iter().filter(|&x| x > 0.0).collect();
        if nz.is_empty() {
            0.0
        } else {
            nz.iter().sum::<f64>() / nz.len() as f64
        }
    };
    let (pm, nm) = (f64::from(c.pos_margin), f64::from(c.neg_margin));
    mean_nonzero(pos.iter().map(|x| (x - pm).max(0.0)).collect())
        + mean_nonzero(neg.iter().map(|x| (nm - x).max(0.0)).collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn matches_the_reference_and_finite_differences(
        b in 1usize..10,
        m in 1usize..12,
        d in 2usize..8,
        classes in 1u32..4,
        seed in any::<u64>(),
        with_refs in any::<bool>(),
        normalize in any::<bool>(),
        ref_grad in any::<bool>(),
        margins in prop_oneof![Just((0.0f32, 1.0f32)), (0.0f32..0.8, 0.5f32..2.5)],
    ) {
        let rule = SnrContrastive { pos_margin: margins.0, neg_margin: margins.1 };
        let x = noise(b, d, seed);
        let labels = Array1::from_shape_fn(b, |i| ((i as u64 + seed) % u64::from(classes)) as u32);
        let refs = with_refs.then(|| {
            let l = Array1::from_shape_fn(m, |i| ((i as u64 * 3 + seed / 5) % u64::from(classes)) as u32);
            (l, noise(m, d, seed ^ 77))
        });
        // SNR divides by each query row's variance: a nearly constant row makes it
        // ill-conditioned (f32 centring loses the digits that f64 keeps), so rows vary.
        let x64 = x.mapv(f64::from);
        let spread = snr_distances(x64.view(), x64.view(), normalize);
        prop_assume!(spread.iter().all(|v| v.is_finite() && *v < 1e3));
        let set = MiningSet::new(&x, &labels);
        let ref_set = refs.as_ref().map(|(l, e)| MiningSet::new(e, l));
        let cfg = config(rule, normalize, ref_grad);
        let got = pair_loss(&Context::native_cpu(None), &set, ref_set.as_ref(), &cfg).expect("loss");
        // The value: PML's contrastive reducer over the written-out SNR distances.
        let (ref_x, _, lists) = reference_inputs(&Context::native_cpu(None), (&x, &labels), refs.as_ref(), DistanceConfig::default());
        let snr = snr_distances(x.mapv(f64::from).view(), ref_x.mapv(f64::from).view(), normalize);
        let c = Contrastive { pos_margin: rule.pos_margin, neg_margin: rule.neg_margin };
        let want = reference(x.view(), ref_x.view(), snr.mapv(|v| v as f32).view(), &lists, PairLossRef::Contrastive(c), DistanceConfig::default());
        prop_assert_eq!(got.nonzero, want.nonzero);
        prop_assert!((f64::from(got.loss) - want.loss).abs() <= 1e-5 * want.loss.abs().max(1.0), "{} vs {}", got.loss, want.loss);
        // The gradients: finite differences of the loss in f64.
        let ref_labels: Vec<u32> = refs.as_ref().map_or(labels.to_vec(), |(l, _)| l.to_vec());
        let labels = labels.to_vec();
        let same = refs.is_none();
        let loss = |q: &Array2<f64>, r: &Array2<f64>| {
            contrastive_f64(&snr_distances(q.view(), r.view(), normalize), &labels, &ref_labels, same, rule)
        };
        let (x64, r64) = (x.mapv(f64::from), ref_x.mapv(f64::from));
        if same {
            common::assert_finite_differences(&x64, |q| loss(q, q), &got.query_grad, 2e-3, "no refs");
        } else {
            common::assert_finite_differences(&x64, |q| loss(q, &r64), &got.query_grad, 2e-3, "queries");
            match got.ref_grad {
                Some(g) => common::assert_finite_differences(&r64, |r| loss(&x64, r), &g, 2e-3, "refs"),
                None => prop_assert!(!ref_grad),
            }
        }
    }
}

#[test]
fn a_constant_query_row_and_other_distances_are_typed_errors() {
    let ctx = Context::native_cpu(None);
    let mut x = noise(4, 3, 9);
    let y = ndarray::array![0u32, 0, 1, 1];
    let cfg = config(SnrContrastive::default(), false, false);
    x.row_mut(2).fill(0.5);
    let bad = |r: Result<wgpu_metric_learning::PairLoss, Error>| {
        matches!(r, Err(Error::InvalidParameter { .. }))
    };
    assert!(bad(pair_loss(&ctx, &MiningSet::new(&x, &y), None, &cfg)));
    let x = noise(4, 3, 9);
    let euclid = PairLossConfig {
        distance: DistanceConfig::default(),
        ..cfg
    };
    assert!(bad(pair_loss(&ctx, &MiningSet::new(&x, &y), None, &euclid)));
    let _ = Array2::<f32>::zeros((1, 1));
}
