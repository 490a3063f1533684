//! `classifier_loss` (ArcFace and its family) against its written-out reference (the whole
//! logit matrix in f64), the reference against finite differences, tilings, ArcFace's
//! branches and `|c| = 1`, the budget and typed errors.

use crate::common::assert_close;
use crate::ops::ntxent_loss::noise;

use ndarray::Array2;
use proptest::prelude::*;
use wgpu_metric_learning::reference::classifier_loss::{
    classifier_loss as reference, classifier_loss_f64,
};
use wgpu_metric_learning::{
    classifier_loss, classifier_loss_plan, ClassifierKind, ClassifierLossConfig, Context, Error,
    MarginGrad,
};

fn config(kind: ClassifierKind) -> ClassifierLossConfig {
    ClassifierLossConfig {
        kind,
        ..Default::default()
    }
}

/// Every kind, with parameters drawn around PML's defaults (`u` in `[0, 1)`).
fn kinds(u: f32, per: usize) -> Vec<ClassifierKind> {
    let grad = if u < 0.5 {
        MarginGrad::Pml
    } else {
        MarginGrad::StraightThrough
    };
    vec![
        ClassifierKind::ArcFace {
            margin: 10.0 + 40.0 * u,
            scale: 8.0 + 56.0 * u,
            margin_grad: grad,
        },
        ClassifierKind::SubCenterArcFace {
            margin: 28.6,
            scale: 16.0,
            sub_centers: per,
            margin_grad: grad,
        },
        ClassifierKind::CosFace {
            margin: 0.5 * u,
            scale: 30.0,
        },
        ClassifierKind::LargeMarginSoftmax {
            margin: 1 + (u * 4.0) as u32,
            scale: 1.0 + u,
        },
        ClassifierKind::SphereFace {
            margin: 1 + (u * 4.0) as u32,
            scale: 1.0,
        },
        ClassifierKind::NormalizedSoftmax {
            temperature: 0.05 + u,
        },
        ClassifierKind::ProxyNca {
            softmax_scale: 0.5 + 4.0 * u,
        },
        ClassifierKind::SoftTriple {
            centers_per_class: per,
            la: 20.0,
            gamma: 0.1 + u,
            margin: 0.01,
        },
    ]
}

fn weights_for(kind: &ClassifierKind, classes: usize, d: usize, seed: u64) -> Array2<f32> {
    let (r, c) = kind.weight_shape(classes, d);
    noise(r, c, seed) * 2.0
}

fn labels_for(b: usize, classes: usize, seed: u64) -> Vec<usize> {
    (0..b)
        .map(|i| ((seed as usize).wrapping_add(i * 7919)) % classes)
        .collect()
}

fn as_i64(labels: &[usize]) -> Vec<i64> {
    labels.iter().map(|&y| y as i64).collect()
}

fn check_against_reference(
    ctx: &Context,
    x: &Array2<f32>,
    labels: &[usize],
    w: &Array2<f32>,
    kind: ClassifierKind,
    what: &str,
) {
    let got =
        classifier_loss(ctx, x.view(), &as_i64(labels), w.view(), &config(kind)).expect("loss");
    let want = reference(x.view(), labels, w.view(), &kind);
    let what = format!("{what} {kind:?}");
    assert_eq!(got.count, want.count, "{what}: count");
    let tol = 2e-4 * want.loss.abs().max(1.0);
    assert!(
        (f64::from(got.loss) - want.loss).abs() <= tol,
        "{what}: loss {} vs {}",
        got.loss,
        want.loss
    );
    assert_close(&got.grad, &want.grad, 2e-4, &format!("{what}: grad"));
    assert_close(
        &got.weight_grad,
        &want.weight_grad,
        2e-4,
        &format!("{what}: weight grad"),
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Random batches (none included), dimensions from 1 (3 for the angular margins), one class
    /// or several, centres per class from 1, every kind.
    #[test]
    fn matches_the_reference(
        b in 0usize..12,
        d in 1usize..9,
        classes in 1usize..7,
        per in 1usize..4,
        seed in any::<u64>(),
        u in 0.0f32..1.0,
    ) {
        let x = noise(b, d, seed) * 3.0;
        let labels = labels_for(b, classes, seed);
        for kind in kinds(u, per) {
            // At d < 3 a target cosine near 1 is common, where f32 rounding of the cosine moves
            // the angle's slope (infinite at 1) most: `arcface_edges` covers |c| = 1 exactly.
            let angular = matches!(
                kind,
                ClassifierKind::ArcFace { .. }
                    | ClassifierKind::SubCenterArcFace { .. }
                    | ClassifierKind::LargeMarginSoftmax { .. }
                    | ClassifierKind::SphereFace { .. }
            );
            if angular && d < 3 {
                continue;
            }
            let w = weights_for(&kind, classes, d, seed ^ 0x5eed);
            check_against_reference(&Context::native_cpu(None), &x, &labels, &w, kind, &format!("b {b} d {d} classes {classes}"));
        }
    }
}

/// The reference's hand-written gradients against central finite differences of its loss, for
/// every kind (away from ArcFace's branch point and LargeMarginSoftmax's `k` steps).
#[test]
fn reference_gradients_are_the_derivatives() {
    let (b, d, classes) = (5, 4, 3);
    let labels = labels_for(b, classes, 3);
    for kind in kinds(0.3, 2) {
        let x = noise(b, d, 11).mapv(|v| f64::from(v) * 3.0);
        let w = weights_for(&kind, classes, d, 12).mapv(f64::from);
        let loss = |x: &Array2<f64>, w: &Array2<f64>| {
            classifier_loss_f64(x.view(), &labels, w.view(), &kind).loss
        };
        let want = classifier_loss_f64(x.view(), &labels, w.view(), &kind);
        let h = 1e-6;
        for (which, base, grad) in [("x", &x, &want.grad), ("w", &w, &want.weight_grad)] {
            for ((i, j), &g) in grad.indexed_iter() {
                let (mut up, mut down) = (base.clone(), base.clone());
                up[[i, j]] += h;
                down[[i, j]] -= h;
                let fd = if which == "x" {
                    (loss(&up, &w) - loss(&down, &w)) / (2.0 * h)
                } else {
                    (loss(&x, &up) - loss(&x, &down)) / (2.0 * h)
                };
                assert!(
                    (g - fd).abs() < 1e-5 * fd.abs().max(1.0),
                    "{kind:?} ∂/∂{which}[{i}, {j}] = {g}, fd {fd}"
                );
            }
        }
    }
}

/// Many tiles, products recomputed (a tight budget) or kept (the default), give the answer of
/// one tile: 5 000 classes, ragged last tile, and `b > d` (nothing kept) beside `b ≤ d`.
#[test]
fn tilings_agree() {
    for (b, d) in [(6, 16), (40, 8)] {
        let classes = 5_003;
        let x = noise(b, d, 5);
        let labels = labels_for(b, classes, 9);
        for kind in [
            ClassifierKind::arc_face(),
            ClassifierKind::large_margin_softmax(),
            ClassifierKind::sub_center_arc_face(),
            ClassifierKind::proxy_anchor(),
        ] {
            let w = weights_for(&kind, classes, d, 6) * 0.5;
            let cfg = config(kind);
            let labels = as_i64(&labels);
            let roomy = Context::native_cpu(None);
            let plan =
                classifier_loss_plan(&roomy, x.view(), &labels, w.view(), &cfg).expect("plan");
            assert!(plan.chunks > 1, "{kind:?}: {plan:?}");
            let tight = Context::native_cpu(Some(plan.min_bytes + 4096));
            let small =
                classifier_loss_plan(&tight, x.view(), &labels, w.view(), &cfg).expect("plan");
            assert!(
                small.cols < plan.cols && small.bytes <= plan.min_bytes + 4096,
                "{small:?}"
            );
            let a = classifier_loss(&roomy, x.view(), &labels, w.view(), &cfg).expect("roomy");
            let c = classifier_loss(&tight, x.view(), &labels, w.view(), &cfg).expect("tight");
            assert!(tight.memory().peak_bytes <= tight.memory().budget_bytes);
            assert!(
                (a.loss - c.loss).abs() <= 1e-5 * a.loss.abs().max(1.0),
                "{kind:?}"
            );
            let (ga, gc) = (a.grad.mapv(f64::from), c.weight_grad.mapv(f64::from));
            assert_close(&c.grad, &ga, 1e-5, "grad");
            assert_close(&a.weight_grad, &gc, 1e-5, "weight grad");
            let want = reference(
                x.view(),
                &labels.iter().map(|&y| y as usize).collect::<Vec<_>>(),
                w.view(),
                &kind,
            );
            assert!((f64::from(a.loss) - want.loss).abs() < 1e-4 * want.loss.max(1.0));
        }
    }
}

/// ArcFace where the target's cosine is exactly 1 (a row along its class's weight: PML's
/// slope is infinite, the library's is held at the next f32 cosine), past `π − m` (the else
/// branch), and both margin gradients.
#[test]
fn arcface_edges() {
    let x = ndarray::array![[2.0f32, 0.0], [-1.0, 0.01], [0.0, 3.0]];
    let w = ndarray::array![[1.0f32, 0.0, 0.5], [0.0, 1.0, 0.5]];
    let labels = [0usize, 0, 1];
    for margin_grad in [MarginGrad::Pml, MarginGrad::StraightThrough] {
        let kind = ClassifierKind::ArcFace {
            margin: 28.6,
            scale: 64.0,
            margin_grad,
        };
        check_against_reference(&Context::native_cpu(None), &x, &labels, &w, kind, "edges");
        let got = classifier_loss(
            &Context::native_cpu(None),
            x.view(),
            &[0, 0, 1],
            w.view(),
            &config(kind),
        )
        .expect("loss");
        assert!(got
            .grad
            .iter()
            .chain(&got.weight_grad)
            .all(|v| v.is_finite()));
    }
}

/// ProxyNCA drops a row whose probability underflows, as PML's `non_zero` does.
#[test]
fn proxy_nca_drops_rows_that_underflow() {
    let x = ndarray::array![[1.0f32, 0.0], [0.0, 1.0]];
    let proxies = ndarray::array![[1.0f32, 0.0], [-1.0, 0.0]];
    let kind = ClassifierKind::ProxyNca {
        softmax_scale: 40.0,
    };
    // Row 0 is labelled with the opposite proxy: log p = −160 < ln(least f32).
    let got = classifier_loss(
        &Context::native_cpu(None),
        x.view(),
        &[1, 1],
        proxies.view(),
        &config(kind),
    )
    .expect("loss");
    assert_eq!(got.count, 1);
    assert!(got.grad.row(0).iter().all(|&v| v == 0.0));
    check_against_reference(
        &Context::native_cpu(None),
        &x,
        &[1, 1],
        &proxies,
        kind,
        "nca",
    );
}

#[test]
fn bad_inputs_are_typed_errors() {
    let ctx = Context::native_cpu(None);
    let x = noise(3, 4, 1);
    let w = noise(4, 5, 2);
    let cfg = ClassifierLossConfig::default();
    let err = classifier_loss(&ctx, x.view(), &[0, 5, 1], w.view(), &cfg).expect_err("label");
    assert!(
        matches!(err, Error::InvalidParameter { what: "labels", .. }),
        "{err}"
    );
    let err = classifier_loss(&ctx, x.view(), &[0, -1, 1], w.view(), &cfg).expect_err("negative");
    assert!(
        matches!(err, Error::InvalidParameter { what: "labels", .. }),
        "{err}"
    );
    let err = classifier_loss(&ctx, x.view(), &[0, 1], w.view(), &cfg).expect_err("length");
    assert!(matches!(err, Error::Shape { what: "labels", .. }), "{err}");
    let err = classifier_loss(&ctx, x.view(), &[0, 1, 2], w.t(), &cfg).expect_err("layout");
    assert!(
        matches!(
            err,
            Error::Shape {
                what: "weights",
                ..
            }
        ),
        "{err}"
    );
    let sub = config(ClassifierKind::sub_center_arc_face());
    let err = classifier_loss(&ctx, x.view(), &[0, 1, 0], w.view(), &sub).expect_err("centres");
    assert!(
        matches!(
            err,
            Error::Shape {
                what: "weights",
                ..
            }
        ),
        "{err}"
    );
    let mut nan = w.clone();
    nan[[1, 2]] = f32::NAN;
    let err = classifier_loss(&ctx, x.view(), &[0, 1, 2], nan.view(), &cfg).expect_err("nan");
    assert!(
        matches!(
            err,
            Error::NonFinite {
                what: "weights",
                row: 1,
                col: 2,
                ..
            }
        ),
        "{err}"
    );
    for kind in [
        ClassifierKind::LargeMarginSoftmax {
            margin: 0,
            scale: 1.0,
        },
        ClassifierKind::NormalizedSoftmax { temperature: 0.0 },
        ClassifierKind::CosFace {
            margin: f32::NAN,
            scale: 1.0,
        },
        ClassifierKind::SoftTriple {
            centers_per_class: 0,
            la: 20.0,
            gamma: 0.1,
            margin: 0.01,
        },
    ] {
        let err = classifier_loss(&ctx, x.view(), &[0, 1, 2], w.view(), &config(kind))
            .expect_err("param");
        assert!(
            matches!(err, Error::InvalidParameter { .. }),
            "{kind:?}: {err}"
        );
    }
    let tiny = Context::native_cpu(Some(64));
    let err = classifier_loss(&tiny, x.view(), &[0, 1, 2], w.view(), &cfg).expect_err("budget");
    assert!(matches!(err, Error::OverBudget { .. }), "{err}");
}

/// Kinds by name with PML's defaults and the options each takes.
#[test]
fn kinds_from_names_and_options() {
    use wgpu_metric_learning::ClassifierOptions;
    let none = ClassifierOptions::default();
    for (name, want) in [
        ("arcface", ClassifierKind::arc_face()),
        ("sub_center_arcface", ClassifierKind::sub_center_arc_face()),
        ("cosface", ClassifierKind::cos_face()),
        (
            "large-margin-softmax",
            ClassifierKind::large_margin_softmax(),
        ),
        ("sphereface", ClassifierKind::sphere_face()),
        ("normalized_softmax", ClassifierKind::normalized_softmax()),
        ("proxy-nca", ClassifierKind::proxy_nca()),
        ("soft-triple", ClassifierKind::soft_triple()),
        ("proxy_anchor", ClassifierKind::proxy_anchor()),
    ] {
        assert_eq!(ClassifierKind::from_options(name, &none).expect(name), want);
    }
    let o = ClassifierOptions {
        centres: Some(4),
        margin: Some(0.2),
        ..none
    };
    let kind = ClassifierKind::from_options("soft-triple", &o).expect("soft triple");
    assert_eq!(
        kind,
        ClassifierKind::SoftTriple {
            centers_per_class: 4,
            la: 20.0,
            gamma: 0.1,
            margin: 0.2
        }
    );
    for (name, o) in [
        (
            "arcface",
            ClassifierOptions {
                temperature: Some(0.1),
                ..none
            },
        ),
        (
            "large-margin-softmax",
            ClassifierOptions {
                margin: Some(2.5),
                ..none
            },
        ),
        ("no-such-loss", none),
    ] {
        let err = ClassifierKind::from_options(name, &o).expect_err(name);
        assert!(
            matches!(err, Error::InvalidParameter { .. }),
            "{name}: {err}"
        );
    }
}
