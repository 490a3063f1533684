//! `classifier_loss` (ArcFace and its family) against its written-out reference (the whole
//! logit matrix in f64), the reference against finite differences, tilings, ArcFace's
//! branches and `|c| = 1`, the budget and typed errors.

use crate::common::assert_close;
use crate::ops::ntxent_loss::noise;

use ndarray::Array2;
use proptest::prelude::*;
use wgpu_metric_learning::reference::classifier_loss::{
    classifier_loss as reference, classifier_loss_f64, classifier_loss_sampled,
};
use wgpu_metric_learning::{
    classifier_loss, classifier_loss_plan, ClassSampling, ClassifierKind, ClassifierLoss,
    ClassifierLossConfig, ComputePath, Context, Error, MarginGrad,
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

/// The relative tolerance of an f32 answer against the f64 reference: 2·10⁻⁴, widened where
/// PML's ArcFace gradient goes through `acos`. There `sin(θ + m) / sin θ` magnifies the f32
/// cosine's rounding (about ε) by `1 / (1 − c²)` (the row's label columns): a cosine within
/// 10⁻⁴ of ±1 costs 6·10⁻⁴ relative, in PML's float32 as in ours. Within ~10⁻⁶ of ±1 the
/// check says little (a random draw lands there about once in 10⁵ runs); `arcface_edges`
/// holds `|c| = 1` itself.
fn tolerance(x: &Array2<f32>, labels: &[usize], w: &Array2<f32>, kind: &ClassifierKind) -> f64 {
    let per = match *kind {
        ClassifierKind::ArcFace {
            margin_grad: MarginGrad::Pml,
            ..
        } => 1,
        ClassifierKind::SubCenterArcFace {
            sub_centers,
            margin_grad: MarginGrad::Pml,
            ..
        } => sub_centers,
        _ => return 2e-4,
    };
    let unit = |v: ndarray::ArrayView1<f32>| {
        let v = v.mapv(f64::from);
        let n = v.dot(&v).sqrt();
        v / n.max(1e-300)
    };
    let mut kappa = 1.0f64;
    for (row, &y) in x.rows().into_iter().zip(labels) {
        let xh = unit(row);
        for k in 0..per {
            let c = xh.dot(&unit(w.column(y * per + k)));
            kappa = kappa.max(1.0 / (1.0 - c * c).max(f64::MIN_POSITIVE));
        }
    }
    2e-4 + 4.0 * f64::from(f32::EPSILON) * kappa
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
) -> ClassifierLoss {
    let got =
        classifier_loss(ctx, x.view(), &as_i64(labels), w.view(), &config(kind)).expect("loss");
    let want = reference(x.view(), labels, w.view(), &kind);
    let what = format!("{what} {kind:?}");
    assert_eq!(got.count, want.count, "{what}: count");
    let rel = tolerance(x, labels, w, &kind);
    let tol = rel * want.loss.abs().max(1.0);
    assert!(
        (f64::from(got.loss) - want.loss).abs() <= tol,
        "{what}: loss {} vs {}",
        got.loss,
        want.loss
    );
    assert_close(&got.grad, &want.grad, rel, &format!("{what}: grad"));
    assert_close(
        &got.weight_grad,
        &want.weight_grad,
        rel,
        &format!("{what}: weight grad"),
    );
    got
}

/// The kinds with a device path (`classifier_device`): the others run natively everywhere.
fn on_device(kind: &ClassifierKind) -> bool {
    matches!(
        kind,
        ClassifierKind::ArcFace { .. }
            | ClassifierKind::CosFace { .. }
            | ClassifierKind::NormalizedSoftmax { .. }
            | ClassifierKind::ProxyNca { .. }
    )
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

    /// On a wgpu context: ArcFace, CosFace, NormalizedSoftmax and ProxyNCA on the device
    /// (`path` says so), the others natively, all against the reference.
    #[test]
    fn a_gpu_context_matches_the_reference(
        b in 0usize..12,
        d in 3usize..9,
        classes in 1usize..40,
        seed in any::<u64>(),
        u in 0.0f32..1.0,
    ) {
        let Some(ctx) = crate::common::shared_gpu() else { return Ok(()); };
        let x = noise(b, d, seed) * 3.0;
        let labels = labels_for(b, classes, seed);
        for kind in kinds(u, 2) {
            let w = weights_for(&kind, classes, d, seed ^ 0x5eed);
            let what = format!("gpu b {b} d {d} classes {classes}");
            let got = check_against_reference(ctx, &x, &labels, &w, kind, &what);
            let want = if on_device(&kind) { ComputePath::Wgpu } else { ComputePath::NativeCpu };
            prop_assert_eq!(got.path, want, "{} {:?}", what, kind);
        }
    }
}

/// Many classes and rows on the device, in blocks under a small budget, and a sampled call
/// there: the reference's answers.
#[test]
fn the_device_path_runs_in_blocks_and_samples() {
    let Some(ctx) = crate::common::gpu_context(Some(8 << 20)) else {
        return;
    };
    let (b, d, classes) = (300, 24, 2500);
    let x = noise(b, d, 21) * 2.0;
    let labels = labels_for(b, classes, 5);
    for kind in [ClassifierKind::arc_face(), ClassifierKind::proxy_nca()] {
        let w = weights_for(&kind, classes, d, 8);
        let got = check_against_reference(&ctx, &x, &labels, &w, kind, "blocks");
        assert_eq!(got.path, ComputePath::Wgpu, "{kind:?}");
        let sampling = ClassSampling {
            rate: 0.05,
            seed: 3,
        };
        let cfg = ClassifierLossConfig {
            kind,
            sampling,
            ..Default::default()
        };
        let got =
            classifier_loss(&ctx, x.view(), &as_i64(&labels), w.view(), &cfg).expect("sampled");
        let want = classifier_loss_sampled(x.view(), &labels, w.view(), &kind, &sampling);
        assert_eq!(got.path, ComputePath::Wgpu);
        assert!((f64::from(got.loss) - want.loss).abs() <= 2e-4 * want.loss.abs().max(1.0));
        assert_close(&got.grad, &want.grad, 2e-4, "sampled grad");
        assert_close(
            &got.weight_grad,
            &want.weight_grad,
            2e-4,
            "sampled weight grad",
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// PartialFC's sampling against the reference over the same classes (selected there by
    /// `ClassSampling::draws` and the labels): every kind but ProxyAnchor, rates from nearly
    /// nothing to every class, empty batches included.
    #[test]
    fn sampling_matches_the_reference(
        b in 0usize..10,
        d in 3usize..8,
        classes in 1usize..40,
        per in 1usize..3,
        seed in any::<u64>(),
        rate in 0.01f32..1.0,
        u in 0.0f32..1.0,
    ) {
        let ctx = Context::native_cpu(None);
        let x = noise(b, d, seed) * 3.0;
        let labels = labels_for(b, classes, seed);
        let sampling = ClassSampling { rate, seed: seed.rotate_left(7) };
        for kind in kinds(u, per) {
            let w = weights_for(&kind, classes, d, seed ^ 0x5eed);
            let cfg = ClassifierLossConfig { kind, sampling, ..Default::default() };
            let got = classifier_loss(&ctx, x.view(), &as_i64(&labels), w.view(), &cfg).expect("sampled loss");
            let want = classifier_loss_sampled(x.view(), &labels, w.view(), &kind, &sampling);
            let what = format!("b {b} d {d} classes {classes} rate {rate} {kind:?}");
            let kept = (0..classes).filter(|&j| labels.contains(&j) || sampling.draws(j as u64)).count();
            prop_assert_eq!(got.classes_used, kept, "{}: classes used", what);
            prop_assert_eq!(got.count, want.count, "{}: count", what);
            let rel = tolerance(&x, &labels, &w, &kind);
            let tol = rel * want.loss.abs().max(1.0);
            prop_assert!((f64::from(got.loss) - want.loss).abs() <= tol, "{}: loss {} vs {}", what, got.loss, want.loss);
            assert_close(&got.grad, &want.grad, rel, &format!("{what}: grad"));
            assert_close(&got.weight_grad, &want.weight_grad, rel, &format!("{what}: weight grad"));
        }
    }
}

/// A rate of 1 is no sampling at all, bit for bit; a tiny rate keeps exactly the classes with
/// a row, and their gradient only; the plan shrinks with the sample.
#[test]
fn sampling_keeps_the_positives_and_only_them_at_a_tiny_rate() {
    let ctx = Context::native_cpu(None);
    let (b, d, classes) = (6, 5, 3000);
    let x = noise(b, d, 4);
    let labels: Vec<usize> = vec![7, 7, 1200, 2999, 0, 1200];
    let w = weights_for(&ClassifierKind::arc_face(), classes, d, 9);
    let full = classifier_loss(
        &ctx,
        x.view(),
        &as_i64(&labels),
        w.view(),
        &config(ClassifierKind::arc_face()),
    )
    .expect("full");
    let every = ClassifierLossConfig {
        sampling: ClassSampling { rate: 1.0, seed: 5 },
        ..Default::default()
    };
    let same = classifier_loss(&ctx, x.view(), &as_i64(&labels), w.view(), &every).expect("rate 1");
    assert_eq!((same.loss, same.classes_used), (full.loss, classes));
    assert_eq!(same.weight_grad, full.weight_grad);
    let tiny = ClassifierLossConfig {
        sampling: ClassSampling {
            rate: 1e-7,
            seed: 5,
        },
        ..Default::default()
    };
    let out =
        classifier_loss(&ctx, x.view(), &as_i64(&labels), w.view(), &tiny).expect("tiny rate");
    assert_eq!(out.classes_used, 4);
    for c in 0..classes {
        let touched = out.weight_grad.column(c).iter().any(|&g| g != 0.0);
        assert_eq!(touched, labels.contains(&c), "class {c}");
    }
    // No row and nothing drawn: no class at all, and nothing to lose.
    let none = Array2::<f32>::zeros((0, d));
    let out = classifier_loss(&ctx, none.view(), &[], w.view(), &tiny).expect("empty batch");
    assert_eq!((out.loss, out.classes_used), (0.0, 0));
    assert!(out.weight_grad.iter().all(|&g| g == 0.0));
    let plan = |cfg: &ClassifierLossConfig| {
        classifier_loss_plan(&ctx, x.view(), &as_i64(&labels), w.view(), cfg).expect("plan")
    };
    assert!(plan(&every).chunks > 1);
    assert_eq!(plan(&tiny).chunks, 1);
}

#[test]
fn sampling_refuses_what_it_cannot_do() {
    let ctx = Context::native_cpu(None);
    let x = noise(3, 4, 1);
    let w = noise(4, 5, 2);
    for rate in [0.0, -0.5, 1.5, f32::NAN, f32::INFINITY] {
        let cfg = ClassifierLossConfig {
            sampling: ClassSampling { rate, seed: 0 },
            ..Default::default()
        };
        let err = classifier_loss(&ctx, x.view(), &[0, 1, 2], w.view(), &cfg).expect_err("rate");
        assert!(
            matches!(
                err,
                Error::InvalidParameter {
                    what: "sampling.rate",
                    ..
                }
            ),
            "rate {rate}: {err}"
        );
    }
    let anchor = ClassifierLossConfig {
        kind: ClassifierKind::proxy_anchor(),
        sampling: ClassSampling { rate: 0.5, seed: 0 },
        ..Default::default()
    };
    let err = classifier_loss(&ctx, x.view(), &[0, 1, 2], w.t(), &anchor).expect_err("anchor");
    assert!(
        matches!(
            err,
            Error::InvalidParameter {
                what: "sampling.rate",
                ..
            }
        ),
        "{err}"
    );
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
    let native = Context::native_cpu(None);
    // The device path too (its cosine of row 0 and class 0 is exactly 1 as well).
    let contexts = std::iter::once(&native).chain(crate::common::shared_gpu());
    for ctx in contexts {
        for margin_grad in [MarginGrad::Pml, MarginGrad::StraightThrough] {
            let kind = ClassifierKind::ArcFace {
                margin: 28.6,
                scale: 64.0,
                margin_grad,
            };
            let got = check_against_reference(ctx, &x, &labels, &w, kind, "edges");
            assert!(got
                .grad
                .iter()
                .chain(&got.weight_grad)
                .all(|v| v.is_finite()));
        }
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

/// Class shards out of rank order (rank 0 holds the last classes), sampled: each process's
/// rows' gradient, its classes' gradient and the loss are one process's; a process whose
/// sampling differs fails every process alike.
#[test]
fn sampled_shards_in_any_order_equal_one_process() {
    use wgpu_metric_learning::{classifier_loss_sharded, ClassShard};
    let (d, classes) = (6, 30);
    let ranges = [20..30, 0..12, 12..20];
    let rows_of = vec![4, 0, 7];
    let b: usize = rows_of.iter().sum();
    let x = noise(b, d, 17) * 2.0;
    let labels = labels_for(b, classes, 3);
    let kind = ClassifierKind::cos_face();
    let w = weights_for(&kind, classes, d, 4);
    let sampling = ClassSampling { rate: 0.3, seed: 9 };
    let cfg = ClassifierLossConfig {
        kind,
        sampling,
        ..Default::default()
    };
    let ctx = Context::native_cpu(None);
    let single = classifier_loss(&ctx, x.view(), &as_i64(&labels), w.view(), &cfg).expect("one");
    let run = |seeds: [u64; 3]| {
        let state = Bounded::state();
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..3)
                .map(|rank| {
                    let (state, ranges, rows_of) = (state.clone(), ranges.clone(), rows_of.clone());
                    let (x, labels, w, ctx) = (&x, &labels, &w, &ctx);
                    scope.spawn(move || {
                        let engine = Bounded::new(rank, 3, state, &|_| {});
                        let shard = ClassShard {
                            first_class: ranges[rank].start,
                            classes,
                            rows_of,
                        };
                        let cfg = ClassifierLossConfig {
                            kind,
                            sampling: ClassSampling {
                                seed: seeds[rank],
                                ..sampling
                            },
                            ..Default::default()
                        };
                        let mine = w.slice(ndarray::s![.., ranges[rank].clone()]);
                        classifier_loss_sharded(
                            ctx,
                            x.view(),
                            &as_i64(labels),
                            mine,
                            &cfg,
                            &shard,
                            &engine,
                        )
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("thread"))
                .collect::<Vec<_>>()
        })
    };
    let outs = run([9, 9, 9]);
    let mut row = 0;
    for (rank, out) in outs.into_iter().enumerate() {
        let out = out.expect("sharded");
        assert!(
            (out.loss - single.loss).abs() <= 1e-5 * single.loss.abs().max(1.0),
            "rank {rank}"
        );
        assert_eq!(out.classes_used, single.classes_used);
        let rows = row..row + rows_of[rank];
        row = rows.end;
        let want = single.grad.slice(ndarray::s![rows, ..]).mapv(f64::from);
        assert_close(&out.grad, &want, 1e-5, &format!("rank {rank} grad"));
        let want = single
            .weight_grad
            .slice(ndarray::s![.., ranges[rank].clone()])
            .mapv(f64::from);
        assert_close(
            &out.weight_grad,
            &want,
            1e-5,
            &format!("rank {rank} weight grad"),
        );
    }
    for (rank, out) in run([9, 9, 10]).into_iter().enumerate() {
        match out {
            Err(Error::InvalidParameter {
                what: "sampling", ..
            }) => {}
            other => panic!("rank {rank}: a sampling that differs gave {other:?}"),
        }
    }
}

/// The case CI drew in `sampling_matches_the_reference` (a target cosine of 0.99992 with
/// PML's ArcFace gradient): the f32 gradient is 6·10⁻⁴ of its largest element off the f64
/// reference, past the flat 2·10⁻⁴ and within `tolerance`'s conditioning.
#[test]
fn a_target_cosine_near_one_is_held_to_its_conditioning() {
    let seed = 5_762_281_888_823_141_595u64;
    let (classes, d) = (28, 3);
    let x = noise(1, d, seed) * 3.0;
    let labels = labels_for(1, classes, seed);
    let kind = kinds(0.472_399_6, 1)[0];
    let w = weights_for(&kind, classes, d, seed ^ 0x5eed);
    let sampling = ClassSampling {
        rate: 0.460_760_3,
        seed: seed.rotate_left(7),
    };
    let cfg = ClassifierLossConfig {
        kind,
        sampling,
        ..Default::default()
    };
    let ctx = Context::native_cpu(None);
    let got = classifier_loss(&ctx, x.view(), &as_i64(&labels), w.view(), &cfg).expect("loss");
    let want = classifier_loss_sampled(x.view(), &labels, w.view(), &kind, &sampling);
    let scale = want.grad.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    let off = got
        .grad
        .iter()
        .zip(&want.grad)
        .map(|(&g, &w)| (f64::from(g) - w).abs() / scale)
        .fold(0.0, f64::max);
    let rel = tolerance(&x, &labels, &w, &kind);
    assert!(off > 2e-4 && off < rel, "{off} past 2e-4, within {rel}");
}

/// A process group of threads: each collective writes its part, waits for the others (at most
/// 20 s: a process left waiting panics and fails the test instead of hanging it), reads.
/// `after(n)` runs on the caller after its `n`-th exchange.
struct Bounded<'a> {
    rank: usize,
    size: usize,
    state: Shared,
    calls: std::cell::Cell<usize>,
    after: &'a dyn Fn(usize),
}

#[derive(Default)]
struct Round {
    slots: Vec<Vec<f64>>,
    arrived: usize,
    generation: u64,
    results: Vec<Vec<f64>>,
}

type Shared = std::sync::Arc<(std::sync::Mutex<Round>, std::sync::Condvar)>;

impl<'a> Bounded<'a> {
    /// What a group's engines share.
    fn state() -> Shared {
        std::sync::Arc::new(Default::default())
    }

    fn new(rank: usize, size: usize, state: Shared, after: &'a dyn Fn(usize)) -> Self {
        let calls = std::cell::Cell::new(0);
        Self {
            rank,
            size,
            state,
            calls,
            after,
        }
    }

    fn exchange(&self, values: Vec<f64>) -> Vec<Vec<f64>> {
        let (lock, cv) = &*self.state;
        let mut round = lock.lock().expect("round");
        if round.slots.len() < self.size {
            round.slots.resize(self.size, Vec::new());
        }
        let generation = round.generation;
        round.slots[self.rank] = values;
        round.arrived += 1;
        if round.arrived == self.size {
            round.results = std::mem::take(&mut round.slots);
            round.arrived = 0;
            round.generation += 1;
            cv.notify_all();
        } else {
            let limit = std::time::Duration::from_secs(20);
            let (r, waited) = cv
                .wait_timeout_while(round, limit, |r| r.generation == generation)
                .expect("round");
            assert!(!waited.timed_out(), "rank {} waits for a rank", self.rank);
            round = r;
        }
        let all = round.results.clone();
        drop(round);
        self.calls.set(self.calls.get() + 1);
        (self.after)(self.calls.get());
        all
    }
}

impl wgpu_metric_learning::ShardCollectives for Bounded<'_> {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn all_gather(&self, values: &[f64]) -> wgpu_metric_learning::Result<Vec<f64>> {
        Ok(self.exchange(values.to_vec()).concat())
    }
    fn reduce_scatter(
        &self,
        send: Vec<f64>,
        block: usize,
    ) -> wgpu_metric_learning::Result<Vec<f64>> {
        let all = self.exchange(send);
        let mine = self.rank * block..(self.rank + 1) * block;
        Ok(mine.map(|i| all.iter().map(|v| v[i]).sum()).collect())
    }
}

/// A process that fails on its own after the call's agreement (here its budget taken by a
/// memory bank another thread made, as a trainer's data thread might) returns its error, and
/// the others return `RankFailed` naming it: nobody waits for it, sampled or not.
#[test]
fn a_process_failing_after_the_agreement_leaves_nobody_waiting() {
    use wgpu_metric_learning::{classifier_loss_sharded, BankConfig, ClassShard, MemoryBank};
    let (d, classes) = (6, 30);
    let ranges = [0..10, 10..20, 20..30];
    let rows_of = vec![3, 4, 5];
    let b: usize = rows_of.iter().sum();
    let x = noise(b, d, 5);
    let labels = labels_for(b, classes, 8);
    let kind = ClassifierKind::arc_face();
    let w = weights_for(&kind, classes, d, 6);
    for sampling in [
        ClassSampling::default(),
        ClassSampling { rate: 0.5, seed: 2 },
    ] {
        let state = Bounded::state();
        let budget = 1u64 << 20;
        let outs: Vec<_> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..3)
                .map(|rank| {
                    let (state, ranges, rows_of) = (state.clone(), ranges.clone(), rows_of.clone());
                    let (x, labels, w) = (&x, &labels, &w);
                    scope.spawn(move || {
                        let ctx = Context::native_cpu(Some(budget));
                        let bank = std::sync::Mutex::new(None);
                        // Rank 1's free budget goes, all but 4 bytes, once the agreement and the
                        // sampling's check are over (its 2nd exchange).
                        let after = |n: usize| {
                            if rank == 1 && n == 2 {
                                let free = budget - ctx.memory().current_bytes;
                                let rows = (free / 4 - 1) as usize;
                                let cfg = BankConfig::new(rows, 1);
                                let held = MemoryBank::<u32>::new(&ctx, &cfg).expect("bank");
                                *bank.lock().expect("bank") = Some(held);
                            }
                        };
                        let engine = Bounded::new(rank, 3, state, &after);
                        let shard = ClassShard {
                            first_class: ranges[rank].start,
                            classes,
                            rows_of,
                        };
                        let cfg = ClassifierLossConfig {
                            kind,
                            sampling,
                            ..Default::default()
                        };
                        let mine = w.slice(ndarray::s![.., ranges[rank].clone()]);
                        let out = classifier_loss_sharded(
                            &ctx,
                            x.view(),
                            &as_i64(labels),
                            mine,
                            &cfg,
                            &shard,
                            &engine,
                        );
                        (out, engine.calls.get())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("no rank waits"))
                .collect()
        });
        for (rank, (out, calls)) in outs.into_iter().enumerate() {
            match (rank, out) {
                (1, Err(Error::OverBudget { .. })) => {}
                (0 | 2, Err(Error::RankFailed { rank: 1, .. })) => {}
                (rank, other) => panic!("{sampling:?}: rank {rank} gave {other:?}"),
            }
            // The agreement, the sampling's check, and the one where rank 1 tells its error.
            assert_eq!(calls, 3, "rank {rank}: exchanges");
        }
    }
}
