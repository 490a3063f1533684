//! `info_nce_weights` (with `loss_backward`) on the GPU against their references: NTXent's
//! loss and positive pairs from `reference::info_nce_weights` on the device's own distances,
//! and the gradients from its weights through `reference::loss_backward`. Rows of up to 600
//! references cross the kernel's 256-wide strides; empty sides, one class, ties on the grid,
//! every distance, temperatures down to 0.05 (far-apart logits), with and without the
//! references' gradient.

use crate::common;
use crate::common::assert_close;
use crate::ops::ntxent_loss::{problem_of, Problem};

use proptest::prelude::*;
use wgpu_metric_learning::reference::info_nce_weights::info_nce_weights;
use wgpu_metric_learning::reference::loss_backward::loss_backward;
use wgpu_metric_learning::{
    ntxent_loss, pairwise_distances, ComputePath, Context, InfoNceConfig, MiningSet, PairwiseConfig,
};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(48)))]

    #[test]
    fn info_nce_weights_match_the_reference(p in problem_of(6, 599, 4)) {
        if let Some(ctx) = common::shared_gpu() {
            check(ctx, p);
        }
    }
}

#[test]
fn the_anchors_own_column_past_the_first_stride() {
    // The queries as references, 300 of them: each anchor's own column is skipped in every
    // stride of 256 columns.
    let Some(ctx) = common::shared_gpu() else {
        return;
    };
    let n = 300;
    check(
        ctx,
        Problem {
            labels: (0..n as u32).map(|i| i % 4).collect(),
            x: crate::kernels::triplet_weights::formula_rows(n, 3),
            refs: None,
            cfg: InfoNceConfig {
                temperature: 0.5,
                ..Default::default()
            },
        },
    );
}

/// Runs NTXent on `ctx` (a wgpu context) and checks it against the kernels' references.
fn check(ctx: &Context, p: Problem) {
    let Problem {
        labels,
        x,
        refs,
        cfg,
    } = p;
    let (ref_labels, ref_x) = refs.clone().unwrap_or((labels.clone(), x.clone()));
    let set = MiningSet::new(&x, &labels);
    let ref_set = refs.as_ref().map(|(l, e)| MiningSet::new(e, l));
    let got = ntxent_loss(ctx, &set, ref_set.as_ref(), &cfg).expect("loss");
    let what = format!("{cfg:?} b={} m={}", labels.len(), ref_labels.len());
    let slots: Vec<u32> = match refs {
        None => (0..labels.len() as u32).collect(),
        Some(_) => vec![u32::MAX; labels.len()],
    };
    let pairwise = PairwiseConfig {
        distance: cfg.distance,
        ..Default::default()
    };
    let d = pairwise_distances(ctx, &x, &ref_x, &pairwise)
        .expect("distances")
        .values;
    let want = info_nce_weights(
        d.view(),
        labels.as_slice().expect("contiguous"),
        ref_labels.as_slice().expect("contiguous"),
        &slots,
        cfg.temperature,
        cfg.distance,
    );
    assert_eq!(got.positive_pairs, want.positives, "{what}");
    let (positives, negatives) = (got.positive_pairs, got.negative_pairs);
    if positives == 0 || negatives == 0 || positives <= 1 && negatives <= 1 {
        // PML returns no loss there: nothing reaches a kernel.
        assert_eq!(got.loss, 0.0);
        return;
    }
    assert_eq!(got.path, ComputePath::Wgpu);
    let k = want.positives as f64;
    let mean = want.loss / k;
    assert!(
        (f64::from(got.loss) - mean).abs() <= 1e-5 * mean.abs().max(1.0),
        "{what}: loss {} vs {mean}",
        got.loss
    );
    let weights = want.weights / k;
    let (g_q, g_r) = loss_backward(x.view(), ref_x.view(), weights.view(), cfg.distance);
    match (&refs, &got.ref_grad) {
        (None, _) => assert_close(&got.query_grad, &(g_q + g_r), 2e-4, &what),
        (Some(_), g) => {
            assert_close(&got.query_grad, &g_q, 2e-4, &what);
            assert_eq!(g.is_some(), cfg.ref_grad, "{what}");
            if let Some(g) = g {
                assert_close(g, &g_r, 2e-4, &what);
            }
        }
    }
}
