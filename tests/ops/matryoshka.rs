//! Matryoshka widths of `ntxent_loss` and `multiple_negatives_ranking_loss` against the loss
//! run once per truncated copy (`reference::matryoshka`), on random shapes and widths (out of
//! order, repeated, the full width, odd ones, d = 1), under small budgets, and bad widths.

use crate::common;
use crate::common::assert_close;
// Its noise has prefixes of tiny norm too: one-wide ones are exact (module docs of
// `ops::loss::matryoshka`).
use crate::ops::ntxent_loss::{noise, problem_of, Problem};

use ndarray::{array, Array1};
use proptest::prelude::*;
use wgpu_metric_learning::reference::matryoshka::matryoshka as reference;
use wgpu_metric_learning::{
    multiple_negatives_ranking_loss, multiple_negatives_ranking_loss_plan, ntxent_loss,
    ComputePath, Context, Distance, DistanceConfig, Error, InfoNceConfig, Matryoshka, MiningSet,
    MnrlConfig,
};

const COSINE: DistanceConfig = DistanceConfig {
    distance: Distance::Cosine,
    normalize: true,
};

/// Up to four widths in `1..=d`, any order, repeats allowed, weights in `[-1, 2]`.
fn widths(d: usize) -> impl Strategy<Value = Matryoshka> {
    proptest::collection::vec((1..=d, prop_oneof![Just(1.0f32), -1.0f32..2.0]), 1..5).prop_map(
        |v| Matryoshka {
            dims: v.iter().map(|x| x.0).collect(),
            weights: v.iter().map(|x| x.1).collect(),
        },
    )
}

/// An NTXent problem (cosine) of up to 9 dimensions, with widths. No zero entries: a zero
/// prefix is clamped (torch's `g / 1e-12`, rounding noise times 10¹² in any implementation),
/// covered apart.
fn problem() -> impl Strategy<Value = (Problem, Matryoshka)> {
    problem_of(10, 13, 9).prop_flat_map(|mut p| {
        p.cfg.distance = COSINE;
        let no_zero = |v: &mut f32| *v = if *v == 0.0 { 0.5 } else { *v };
        p.x.map_inplace(no_zero);
        if let Some((_, r)) = p.refs.as_mut() {
            r.map_inplace(no_zero);
        }
        let d = p.x.ncols();
        (Just(p), widths(d))
    })
}

fn check_ntxent(p: &Problem, m: &Matryoshka, ctx: &Context) {
    let cfg = InfoNceConfig {
        matryoshka: Some(m.clone()),
        ..p.cfg.clone()
    };
    let set = MiningSet::new(&p.x, &p.labels);
    let ref_set = p.refs.as_ref().map(|(l, e)| MiningSet::new(e, l));
    let got = ntxent_loss(ctx, &set, ref_set.as_ref(), &cfg).expect("loss");
    let sides = (&p.x, &p.labels);
    let (ref_x, _, lists) = common::reference_inputs(ctx, sides, p.refs.as_ref(), COSINE);
    let widths = (m.dims.as_slice(), m.weights.as_slice());
    let want = reference(
        p.x.view(),
        ref_x.view(),
        &lists,
        p.cfg.temperature,
        widths,
        true,
    );
    let what = format!("{m:?} {:?}", p.cfg);
    let close = |a: f32, b: f64| (f64::from(a) - b).abs() <= 2e-5 * b.abs().max(1.0);
    assert!(
        close(got.loss, want.loss),
        "{what}: {} vs {}",
        got.loss,
        want.loss
    );
    if want.loss != 0.0 || got.loss != 0.0 {
        assert_eq!(got.matryoshka_losses.len(), m.dims.len(), "{what}");
        for (g, w) in got.matryoshka_losses.iter().zip(&want.losses) {
            assert!(close(*g, *w), "{what}: width loss {g} vs {w}");
        }
    }
    common::assert_loss_gradients(
        p.refs.is_some(),
        p.cfg.ref_grad,
        (&got.query_grad, got.ref_grad.as_ref()),
        (&want.query_grad, &want.ref_grad),
        &what,
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(160)))]

    #[test]
    fn ntxent_widths_match_the_loss_per_truncated_copy((p, m) in problem()) {
        check_ntxent(&p, &m, &Context::native_cpu(None));
    }

    /// On a wgpu context the widths run natively too (and say so).
    #[test]
    fn ntxent_widths_on_a_device_context((p, m) in problem()) {
        if let Some(ctx) = common::shared_gpu() {
            check_ntxent(&p, &m, ctx);
        }
    }

    #[test]
    fn mnrl_widths_match_the_loss_per_truncated_copy(
        (b, extra, d) in (1usize..9, 0usize..7, 1usize..11),
        seed in any::<u64>(),
        scale in prop_oneof![Just(20.0f32), 0.5f32..50.0],
        widths_seed in any::<u64>(),
    ) {
        let anchors = noise(b, d, seed);
        let candidates = noise(b + extra, d, seed ^ 0x5eed);
        let m = pick_widths(d, widths_seed);
        let cfg = MnrlConfig { scale, matryoshka: Some(m.clone()), ..Default::default() };
        let got = multiple_negatives_ranking_loss(&Context::native_cpu(None), &anchors, &candidates, &cfg)
            .expect("loss");
        let lists: Vec<(Vec<u32>, Vec<u32>)> = (0..b as u32)
            .map(|i| (vec![i], (0..(b + extra) as u32).filter(|&j| j != i).collect()))
            .collect();
        let widths = (m.dims.as_slice(), m.weights.as_slice());
        let want = reference(anchors.view(), candidates.view(), &lists, 1.0 / scale, widths, false);
        prop_assert!((f64::from(got.loss) - want.loss).abs() <= 2e-5 * want.loss.abs().max(1.0));
        assert_close(&got.query_grad, &want.query_grad, 2e-4, "anchors");
        assert_close(got.ref_grad.as_ref().expect("candidates' gradient"), &want.ref_grad, 2e-4, "candidates");
        prop_assert_eq!(got.path, ComputePath::NativeCpu);
    }
}

/// Up to five widths in `1..=d` from `seed` (repeats and the full width likely at small `d`).
fn pick_widths(d: usize, seed: u64) -> Matryoshka {
    let mut state = seed | 1;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let n = 1 + (next() % 5) as usize;
    let dims: Vec<usize> = (0..n).map(|_| 1 + (next() % d as u64) as usize).collect();
    let weights = (0..n).map(|_| (next() % 5) as f32 * 0.5).collect();
    Matryoshka { dims, weights }
}

#[test]
fn the_full_width_alone_is_the_plain_loss() {
    let ctx = Context::native_cpu(None);
    let (anchors, candidates) = (noise(24, 13, 3), noise(40, 13, 4));
    let plain =
        multiple_negatives_ranking_loss(&ctx, &anchors, &candidates, &MnrlConfig::default())
            .expect("plain");
    let cfg = MnrlConfig {
        matryoshka: Some(Matryoshka::new([13])),
        ..Default::default()
    };
    let full = multiple_negatives_ranking_loss(&ctx, &anchors, &candidates, &cfg).expect("full");
    assert!((full.loss - plain.loss).abs() <= 1e-6 * plain.loss);
    assert_eq!(full.matryoshka_losses, vec![full.loss]);
    assert!(plain.matryoshka_losses.is_empty());
    let grads = [
        (&full.query_grad, &plain.query_grad),
        (
            full.ref_grad.as_ref().expect("r"),
            plain.ref_grad.as_ref().expect("r"),
        ),
    ];
    for (a, b) in grads {
        let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for (x, y) in a.iter().zip(b.iter()) {
            assert!((x - y).abs() <= 1e-5 * scale, "{x} vs {y}");
        }
    }
}

/// Rows of any layout (a column-major view) give the answer of the same rows in standard
/// layout: every term of the gradient, the radial one included.
#[test]
fn inputs_of_any_layout_give_the_same_answer() {
    let ctx = Context::native_cpu(None);
    let (anchors, candidates) = (noise(24, 13, 5), noise(40, 13, 6));
    let fortran = |x: &ndarray::Array2<f32>| x.t().as_standard_layout().to_owned();
    let (fa, fc) = (fortran(&anchors), fortran(&candidates));
    let cfg = MnrlConfig {
        matryoshka: Some(Matryoshka::new([13, 5, 2])),
        ..Default::default()
    };
    let standard =
        multiple_negatives_ranking_loss(&ctx, &anchors, &candidates, &cfg).expect("standard");
    let (va, vc) = (fa.t(), fc.t());
    assert!(!va.is_standard_layout() && !vc.is_standard_layout());
    let strided = multiple_negatives_ranking_loss(&ctx, va, vc, &cfg).expect("strided");
    assert_eq!(strided.loss, standard.loss);
    assert_eq!(strided.query_grad, standard.query_grad);
    assert_eq!(strided.ref_grad, standard.ref_grad);
}

#[test]
fn blocks_under_a_small_budget_give_the_whole_answer() {
    let (anchors, candidates) = (noise(96, 20, 5), noise(160, 20, 6));
    let cfg = MnrlConfig {
        matryoshka: Some(Matryoshka::new([20, 7, 12, 7, 3])),
        ..Default::default()
    };
    let whole =
        multiple_negatives_ranking_loss(&Context::native_cpu(None), &anchors, &candidates, &cfg)
            .expect("loss");
    let roomy = Context::native_cpu(Some(1 << 30));
    let least = multiple_negatives_ranking_loss_plan(&roomy, &anchors, &candidates, &cfg)
        .expect("plan")
        .min_bytes;
    for budget in [least, least + 3 * 4 * 5 * 160, least * 2] {
        let ctx = Context::native_cpu(Some(budget));
        let plan =
            multiple_negatives_ranking_loss_plan(&ctx, &anchors, &candidates, &cfg).expect("plan");
        assert!(plan.bytes <= budget && plan.rows < 96, "{plan:?}");
        let split =
            multiple_negatives_ranking_loss(&ctx, &anchors, &candidates, &cfg).expect("loss");
        assert!(
            ctx.memory().peak_bytes <= budget,
            "peak {} of {budget}",
            ctx.memory().peak_bytes
        );
        assert!((split.loss - whole.loss).abs() <= 1e-6 * whole.loss);
        assert_eq!(split.query_grad, whole.query_grad, "rows are their own");
        let (a, b) = (
            split.ref_grad.expect("r"),
            whole.ref_grad.as_ref().expect("r"),
        );
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-6 * (1.0 + y.abs()));
        }
    }
    let tight = Context::native_cpu(Some(least - 1));
    let err = multiple_negatives_ranking_loss(&tight, &anchors, &candidates, &cfg);
    assert!(matches!(err, Err(Error::OverBudget { .. })), "{err:?}");
}

#[test]
fn bad_widths_are_typed_errors() {
    let ctx = Context::native_cpu(None);
    let x = noise(4, 3, 9);
    let labels = array![0u32, 0, 1, 1];
    let cases = [
        Matryoshka::new([]),
        Matryoshka::new([0]),
        Matryoshka::new([4]),
        Matryoshka {
            dims: vec![2, 1],
            weights: vec![1.0],
        },
        Matryoshka {
            dims: vec![2],
            weights: vec![f32::NAN],
        },
    ];
    for m in cases {
        let cfg = InfoNceConfig {
            matryoshka: Some(m.clone()),
            ..Default::default()
        };
        let err = ntxent_loss(&ctx, &MiningSet::new(&x, &labels), None, &cfg);
        assert!(
            matches!(err, Err(Error::InvalidParameter { .. })),
            "{m:?}: {err:?}"
        );
        let cfg = MnrlConfig {
            matryoshka: Some(m.clone()),
            ..Default::default()
        };
        let err = multiple_negatives_ranking_loss(&ctx, &x, &x, &cfg);
        assert!(
            matches!(err, Err(Error::InvalidParameter { .. })),
            "{m:?}: {err:?}"
        );
    }
    // Widths take cosine similarity.
    let cfg = InfoNceConfig {
        matryoshka: Some(Matryoshka::new([2])),
        distance: DistanceConfig {
            distance: Distance::Euclidean,
            normalize: true,
        },
        ..Default::default()
    };
    let err = ntxent_loss(&ctx, &MiningSet::new(&x, &labels), None, &cfg);
    assert!(
        matches!(
            err,
            Err(Error::InvalidParameter {
                what: "distance",
                ..
            })
        ),
        "{err:?}"
    );
    // A call without a loss still returns one zero per width.
    let one = Array1::from(vec![0u32; 4]);
    let cfg = InfoNceConfig {
        matryoshka: Some(Matryoshka::new([3, 1, 1])),
        ..Default::default()
    };
    let out = ntxent_loss(&ctx, &MiningSet::new(&x, &one), None, &cfg).expect("no loss");
    assert_eq!(out.matryoshka_losses, vec![0.0; 3]);
}

#[test]
fn a_zero_prefix_is_clamped_as_torch_clamps_it() {
    // Row 0's first two entries are zero: at width 2 its norm is clamped at 1e-12, every
    // similarity 0, and its gradient is torch's `g / 1e-12`.
    let mut x = noise(6, 5, 11);
    x[[0, 0]] = 0.0;
    x[[0, 1]] = 0.0;
    let labels = array![0u32, 1, 2, 0, 1, 2];
    let m = Matryoshka::new([2, 5]);
    let cfg = InfoNceConfig {
        matryoshka: Some(m.clone()),
        ..Default::default()
    };
    let got = ntxent_loss(
        &Context::native_cpu(None),
        &MiningSet::new(&x, &labels),
        None,
        &cfg,
    )
    .expect("loss");
    let lists = wgpu_metric_learning::reference::triplet_lists::triplet_lists(
        labels.as_slice().expect("contiguous"),
        labels.as_slice().expect("contiguous"),
        &(0..6).collect::<Vec<u32>>(),
    );
    let want = reference(
        x.view(),
        x.view(),
        &lists,
        0.07,
        (&m.dims, &m.weights),
        true,
    );
    for (g, w) in got.matryoshka_losses.iter().zip(&want.losses) {
        assert!((f64::from(*g) - w).abs() <= 1e-5 * w, "{g} vs {w}");
    }
    assert!(got.query_grad.iter().all(|g| g.is_finite()));
    // Rows other than the clamped one are ordinary.
    let both = &want.query_grad + &want.ref_grad;
    assert_close(
        &got.query_grad.slice(ndarray::s![1.., ..]).to_owned(),
        &both.slice(ndarray::s![1.., ..]).to_owned(),
        2e-4,
        "unclamped rows",
    );
}

#[test]
fn sharp_temperatures_shift_by_the_largest_logit() {
    // Past a slope of 40 the exponentials are taken against each row's largest negative
    // logit, not against the slope: both sides of that bound against the reference.
    let x = noise(12, 6, 21);
    let labels = array![0u32, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3];
    let m = Matryoshka {
        dims: vec![6, 2, 4],
        weights: vec![1.0, 0.5, 0.25],
    };
    let lists = wgpu_metric_learning::reference::triplet_lists::triplet_lists(
        labels.as_slice().expect("contiguous"),
        labels.as_slice().expect("contiguous"),
        &(0..12).collect::<Vec<u32>>(),
    );
    for temperature in [0.03f32, 0.01, 0.002] {
        let cfg = InfoNceConfig {
            temperature,
            matryoshka: Some(m.clone()),
            ..Default::default()
        };
        let got = ntxent_loss(
            &Context::native_cpu(None),
            &MiningSet::new(&x, &labels),
            None,
            &cfg,
        )
        .expect("loss");
        let widths = (m.dims.as_slice(), m.weights.as_slice());
        let want = reference(x.view(), x.view(), &lists, temperature, widths, true);
        let what = format!("τ {temperature}");
        assert!(got.loss.is_finite(), "{what}");
        assert!(
            (f64::from(got.loss) - want.loss).abs() <= 2e-5 * want.loss.max(1.0),
            "{what}: {} vs {}",
            got.loss,
            want.loss
        );
        assert_close(
            &got.query_grad,
            &(&want.query_grad + &want.ref_grad),
            2e-4,
            &what,
        );
    }
}

#[test]
fn masked_columns_far_above_the_shift_stay_finite() {
    let ctx = Context::native_cpu(None);
    // MNRL at scale 100: the positive's logit 95 sits 88.7 above the hardest negative's, where
    // e^x leaves f32's range.
    let anchors = array![[1.0f32, 0.0]];
    let candidates = array![[0.95f32, 0.312_25], [0.063, 0.998], [-0.2, 0.98]];
    for matryoshka in [None, Some(Matryoshka::new([2, 1]))] {
        let cfg = MnrlConfig {
            scale: 100.0,
            matryoshka: matryoshka.clone(),
            ..Default::default()
        };
        let got = multiple_negatives_ranking_loss(&ctx, &anchors, &candidates, &cfg).expect("loss");
        let lists = vec![(vec![0u32], vec![1u32, 2])];
        let m = matryoshka.unwrap_or_else(|| Matryoshka::new([2]));
        let want = reference(
            anchors.view(),
            candidates.view(),
            &lists,
            0.01,
            (&m.dims, &m.weights),
            false,
        );
        assert!(
            got.loss.is_finite() && got.query_grad.iter().all(|g| g.is_finite()),
            "{got:?}"
        );
        assert!(
            (f64::from(got.loss) - want.loss).abs() <= 2e-5 * want.loss.max(1.0),
            "{} vs {}",
            got.loss,
            want.loss
        );
        assert_close(&got.query_grad, &want.query_grad, 2e-4, "anchors");
    }
    // NTXent at τ = 0.01 against references where anchor 0 has positives and no negative
    // (its shift would be −∞) and anchor 1 negatives only: nothing moves, and the call stays
    // finite.
    let x = noise(2, 4, 3);
    let refs = noise(3, 4, 4);
    let (labels, ref_labels) = (array![0u32, 1], array![0u32, 0, 0]);
    for matryoshka in [None, Some(Matryoshka::new([4, 2]))] {
        let cfg = InfoNceConfig {
            temperature: 0.01,
            matryoshka: matryoshka.clone(),
            ref_grad: true,
            ..Default::default()
        };
        let got = ntxent_loss(
            &ctx,
            &MiningSet::new(&x, &labels),
            Some(&MiningSet::new(&refs, &ref_labels)),
            &cfg,
        )
        .expect("loss");
        let lists = vec![(vec![0u32, 1, 2], vec![]), (vec![], vec![0, 1, 2])];
        let m = matryoshka.unwrap_or_else(|| Matryoshka::new([4]));
        let want = reference(
            x.view(),
            refs.view(),
            &lists,
            0.01,
            (&m.dims, &m.weights),
            true,
        );
        assert!(got.loss.is_finite(), "{got:?}");
        assert!(
            (f64::from(got.loss) - want.loss).abs() <= 2e-5 * want.loss.max(1.0),
            "{} vs {}",
            got.loss,
            want.loss
        );
        assert_close(&got.query_grad, &want.query_grad, 2e-4, "queries");
        assert_close(
            got.ref_grad.as_ref().expect("asked"),
            &want.ref_grad,
            2e-4,
            "references",
        );
    }
}
