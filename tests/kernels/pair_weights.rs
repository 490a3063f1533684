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
    pair_loss, pair_loss_plan, ComputePath, Contrastive, FastAp, MiningSet, MultiSimilarity,
    PairLossConfig, SupCon,
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
    // stride of 256 columns, by every rule.
    let Some(ctx) = common::shared_gpu() else {
        return;
    };
    let n = 300;
    let x = crate::kernels::triplet_weights::formula_rows(n, 3);
    let labels = Array1::from_iter((0..n as u32).map(|i| i % 4));
    let rules = [
        PairLossRef::Contrastive(Contrastive::default()),
        PairLossRef::MultiSimilarity(MultiSimilarity::default()),
        PairLossRef::SupCon(SupCon::default()),
        PairLossRef::FastAp(FastAp::default()),
    ];
    for rule in rules {
        let distance = match rule {
            PairLossRef::FastAp(_) | PairLossRef::Contrastive(_) => {
                wgpu_metric_learning::DistanceConfig::default()
            }
            _ => wgpu_metric_learning::DistanceConfig {
                distance: wgpu_metric_learning::Distance::Cosine,
                normalize: true,
            },
        };
        let p = Problem {
            labels: labels.clone(),
            x: x.clone(),
            refs: None,
            rule,
            distance,
            ref_grad: false,
        };
        check(&p, ctx);
    }
}

#[test]
fn blocks_under_a_tight_budget_give_the_roomy_answer() {
    let n = 200;
    let x = crate::kernels::triplet_weights::formula_rows(n, 6);
    let labels = Array1::from_iter((0..n as u32).map(|i| i % 7));
    let set = MiningSet::new(&x, &labels);
    let cfg = PairLossConfig::<MultiSimilarity>::default();
    let Some(roomy) = common::gpu_context(None) else {
        return;
    };
    let want = pair_loss(&roomy, &set, None, &cfg).expect("roomy");
    assert_eq!(want.path, ComputePath::Wgpu);
    let least = pair_loss_plan(&roomy, &set, None, &cfg)
        .expect("plan")
        .min_bytes;
    let budget = least + 64 * 1024;
    let tight = common::gpu_context(Some(budget)).expect("a GPU, as above");
    let plan = pair_loss_plan(&tight, &set, None, &cfg).expect("tight plan");
    assert!(plan.rows < n, "several blocks: {} rows", plan.rows);
    let got = pair_loss(&tight, &set, None, &cfg).expect("tight");
    assert_eq!(got.path, ComputePath::Wgpu);
    assert!(tight.memory().peak_bytes <= budget, "peak over {budget}");
    assert!((got.loss - want.loss).abs() <= 1e-6 * want.loss.abs().max(1.0));
    assert_eq!(got.nonzero, want.nonzero);
    let want_grad = want.query_grad.mapv(f64::from);
    common::assert_close(&got.query_grad, &want_grad, 1e-5, "tight vs roomy");
}
