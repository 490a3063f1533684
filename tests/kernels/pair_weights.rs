//! `pair_weights` (with `distance_tile` and `loss_backward`) on the GPU against its reference:
//! every rule with a device path (Contrastive, MultiSimilarity, SupCon, Circle, NCA,
//! GeneralizedLifted, Margin, FastAP, ThresholdConsistentMargin, RankedList,
//! IntraPairVariance, and LiftedStructure and
//! Histogram with the queries as references) through `pair_loss`, the
//! loss, its divisors, `∂loss/∂β` and both gradients against `reference::pair_weights` taken
//! on through `reference::pair_loss`, scored on the device's own distances. Rows of up to 600
//! references cross the kernel's 256-wide strides; empty sides, one class, ties on the grid,
//! every distance, with and without references and their gradient; tight budgets that cut the
//! anchors into many blocks.

use crate::common;
use crate::ops::pair_loss::{check, on_device, problem_of, Problem};

use ndarray::Array1;
use proptest::prelude::*;
use wgpu_metric_learning::reference::pair_loss::PairLossRef;
use wgpu_metric_learning::{
    pair_loss, pair_loss_plan, ComputePath, Context, Distance, DistanceConfig, MiningSet, PairLoss,
    PairLossConfig, PairLossRule, Plan,
};

/// Problems whose rule has a device path.
fn device_problem(b: usize, m: usize, d: usize) -> impl Strategy<Value = Problem> {
    problem_of(b, m, d).prop_filter("a rule with a device path", on_device)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(64)))]

    #[test]
    fn pair_weights_match_the_reference(p in device_problem(24, 600, 5)) {
        if let Some(ctx) = common::shared_gpu() {
            check(&p, ctx);
        }
    }
}

#[test]
fn the_anchors_own_column_past_the_first_stride() {
    // The queries as references, 300 of them: each anchor's own column is skipped in every
    // stride of 256 columns, by every rule with a device path.
    let Some(ctx) = common::shared_gpu() else {
        return;
    };
    let n = 300;
    let x = crate::kernels::triplet_weights::formula_rows(n, 3);
    let labels = Array1::from_iter((0..n as u32).map(|i| i % 4));
    for rule in device_rules() {
        let p = Problem {
            labels: labels.clone(),
            x: x.clone(),
            refs: None,
            rule,
            distance: distance_of(rule),
            ref_grad: false,
        };
        assert!(on_device(&p), "{rule:?}");
        check(&p, ctx);
    }
}

/// Every rule with a device path, with PML's defaults.
fn device_rules() -> [PairLossRef; 13] {
    [
        PairLossRef::Contrastive(Default::default()),
        PairLossRef::MultiSimilarity(Default::default()),
        PairLossRef::SupCon(Default::default()),
        PairLossRef::Circle(Default::default()),
        PairLossRef::Nca(Default::default()),
        PairLossRef::GeneralizedLifted(Default::default()),
        PairLossRef::Margin(Default::default()),
        PairLossRef::FastAp(Default::default()),
        PairLossRef::ThresholdConsistentMargin(Default::default()),
        PairLossRef::RankedList(Default::default()),
        PairLossRef::IntraPairVariance(Default::default()),
        PairLossRef::LiftedStructure(Default::default()),
        PairLossRef::Histogram(Default::default()),
    ]
}

/// A distance `rule` takes: cosine where PML asserts it, else normalised Euclidean.
fn distance_of(rule: PairLossRef) -> DistanceConfig {
    match rule {
        PairLossRef::Circle(_)
        | PairLossRef::Histogram(_)
        | PairLossRef::ThresholdConsistentMargin(_)
        | PairLossRef::SupCon(_) => DistanceConfig {
            distance: Distance::Cosine,
            normalize: true,
        },
        _ => DistanceConfig::default(),
    }
}

/// `rule`'s plan and loss on `set` (the queries as references) under `ctx`.
fn loss_of(ctx: &Context, rule: PairLossRef, set: &MiningSet<'_, u32>) -> (Plan, PairLoss) {
    fn with<R: PairLossRule>(
        ctx: &Context,
        rule: R,
        set: &MiningSet<'_, u32>,
        distance: DistanceConfig,
    ) -> (Plan, PairLoss) {
        let cfg = PairLossConfig {
            rule,
            distance,
            ..Default::default()
        };
        let plan = pair_loss_plan(ctx, set, None, &cfg).expect("plan");
        (plan, pair_loss(ctx, set, None, &cfg).expect("loss"))
    }
    let d = distance_of(rule);
    match rule {
        PairLossRef::Contrastive(r) => with(ctx, r, set, d),
        PairLossRef::MultiSimilarity(r) => with(ctx, r, set, d),
        PairLossRef::SupCon(r) => with(ctx, r, set, d),
        PairLossRef::Circle(r) => with(ctx, r, set, d),
        PairLossRef::Nca(r) => with(ctx, r, set, d),
        PairLossRef::GeneralizedLifted(r) => with(ctx, r, set, d),
        PairLossRef::Margin(r) => with(ctx, r, set, d),
        PairLossRef::FastAp(r) => with(ctx, r, set, d),
        PairLossRef::ThresholdConsistentMargin(r) => with(ctx, r, set, d),
        PairLossRef::RankedList(r) => with(ctx, r, set, d),
        PairLossRef::IntraPairVariance(r) => with(ctx, r, set, d),
        PairLossRef::LiftedStructure(r) => with(ctx, r, set, d),
        PairLossRef::Histogram(r) => with(ctx, r, set, d),
        other => panic!("{other:?} has no device path"),
    }
}

#[test]
fn blocks_under_a_tight_budget_give_the_roomy_answer() {
    // Several blocks of anchors (row0 > 0): the state of Lifted and Histogram, and the words,
    // are indexed by the anchor's row in the call, not in its block.
    let n = 200;
    let x = crate::kernels::triplet_weights::formula_rows(n, 6);
    let labels = Array1::from_iter((0..n as u32).map(|i| i % 7));
    let set = MiningSet::new(&x, &labels);
    let Some(roomy) = common::gpu_context(None) else {
        return;
    };
    for rule in device_rules() {
        let (roomy_plan, want) = loss_of(&roomy, rule, &set);
        assert_eq!(want.path, ComputePath::Wgpu, "{rule:?}");
        // The least budget (in steps of 64 KiB above the least of either path's) that the
        // device takes: it holds the call's whole gradients and a few rows of a block.
        let (budget, tight) = (1..64u64)
            .map(|k| roomy_plan.min_bytes + k * 64 * 1024)
            .map(|budget| (budget, common::gpu_context(Some(budget)).expect("a GPU")))
            .find(|(_, ctx)| loss_of(ctx, rule, &set).0.path == ComputePath::Wgpu)
            .expect("a budget the device takes");
        tight.reset_peak();
        let (plan, got) = loss_of(&tight, rule, &set);
        assert!(plan.rows < n, "{rule:?}: several blocks, not {plan:?}");
        let what = format!("{rule:?}");
        assert_eq!(got.path, ComputePath::Wgpu, "{what}");
        assert!(
            tight.memory().peak_bytes <= budget,
            "{what}: peak over {budget}"
        );
        assert!(
            (got.loss - want.loss).abs() <= 1e-5 * want.loss.abs().max(1.0),
            "{what}: {} vs {}",
            got.loss,
            want.loss
        );
        assert_eq!(got.nonzero, want.nonzero, "{what}");
        let want_grad = want.query_grad.mapv(f64::from);
        common::assert_close(&got.query_grad, &want_grad, 1e-5, &what);
    }
}
