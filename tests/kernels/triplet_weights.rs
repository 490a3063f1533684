//! `triplet_weights` (with `loss_backward`) on the GPU against their references: the loss's
//! counts and sum from `reference::triplet_weights` on the device's own distances, and the
//! gradients from its weights through `reference::loss_backward`. Rows of up to 600
//! references cross the kernel's 256-column blocks; empty sides, one class, ties on the grid,
//! every rule, distance and hinge.

use crate::common;
use crate::common::{assert_close, grid_embeddings, DISTANCES};

use ndarray::{Array1, Array2};
use proptest::prelude::*;
use wgpu_metric_learning::reference::loss_backward::loss_backward;
use wgpu_metric_learning::reference::triplet_weights::triplet_weights;
use wgpu_metric_learning::{
    pairwise_distances, triplet_margin_loss, ComputePath, Context, DistanceConfig, MiningSet,
    PairwiseConfig, TripletLossConfig,
};

/// A loss problem: queries, references (`None`: the queries), the loss.
#[derive(Debug, Clone)]
pub(crate) struct Problem {
    pub(crate) labels: Array1<u32>,
    pub(crate) embeddings: Array2<f32>,
    pub(crate) refs: Option<(Array1<u32>, Array2<f32>)>,
    pub(crate) cfg: TripletLossConfig,
}

/// Runs the loss on `ctx` (a wgpu context) and checks it against the kernels' references.
pub(crate) fn check(ctx: &Context, p: &Problem) {
    let (ref_labels, ref_emb) = p
        .refs
        .clone()
        .unwrap_or_else(|| (p.labels.clone(), p.embeddings.clone()));
    let queries = MiningSet::new(&p.embeddings, &p.labels);
    let ref_set = p.refs.as_ref().map(|(l, e)| MiningSet::new(e, l));
    let got = triplet_margin_loss(ctx, &queries, ref_set.as_ref(), &p.cfg).expect("loss");
    let what = format!("{:?} b={} m={}", p.cfg, p.labels.len(), ref_labels.len());
    assert_eq!(got.path, ComputePath::Wgpu, "{what}");
    let distances = pairwise_distances(
        ctx,
        &p.embeddings,
        &ref_emb,
        &PairwiseConfig {
            distance: p.cfg.distance,
            ..Default::default()
        },
    )
    .expect("distances")
    .values;
    let slots: Vec<u32> = match p.refs {
        None => (0..p.labels.len() as u32).collect(),
        Some(_) => vec![u32::MAX; p.labels.len()],
    };
    let want = triplet_weights(
        distances.view(),
        p.labels.as_slice().expect("contiguous"),
        ref_labels.as_slice().expect("contiguous"),
        &slots,
        &p.cfg,
    );
    assert_eq!(
        (got.triplets, got.nonzero),
        (want.triplets, want.nonzero),
        "{what}: triplets and positive losses"
    );
    let k = want.nonzero.max(1) as f64;
    let mean = want.loss / k;
    assert!(
        (f64::from(got.loss) - mean).abs() <= 1e-5 * mean.abs().max(1.0),
        "{what}: loss {} vs {mean}",
        got.loss
    );
    let weights = want.weights / k;
    let (g_q, g_r) = loss_backward(
        p.embeddings.view(),
        ref_emb.view(),
        weights.view(),
        p.cfg.distance,
    );
    match p.refs {
        None => assert_close(&got.query_grad, &(g_q + g_r), 2e-4, &what),
        Some(_) => {
            assert_close(&got.query_grad, &g_q, 2e-4, &what);
            match &got.ref_grad {
                Some(g) => assert_close(g, &g_r, 2e-4, &what),
                None => assert!(!p.cfg.ref_grad, "{what}: the references' gradient"),
            }
        }
    }
}

fn labels(rows: usize, classes: u32) -> impl Strategy<Value = Array1<u32>> {
    proptest::collection::vec(0..classes, rows).prop_map(Array1::from)
}

/// Problems of up to `b` queries and `m` references of up to `d` dimensions.
pub(crate) fn problem(b: usize, m: usize, d: usize) -> impl Strategy<Value = Problem> {
    (0..=b, 0..=m, 1..=d, 1u32..5, any::<bool>())
        .prop_flat_map(|(b, m, d, classes, with_refs)| {
            let refs = if with_refs {
                (labels(m, classes), grid_embeddings(m, d))
                    .prop_map(Some)
                    .boxed()
            } else {
                Just(None).boxed()
            };
            let cfg = (
                prop_oneof![Just(0.05f32), Just(0.0), Just(1.0), -0.5f32..2.0],
                common::triplet_rule(),
                0usize..4,
                any::<bool>(),
                any::<bool>(),
                any::<bool>(),
            )
                .prop_map(
                    |(margin, triplets, which, normalize, smooth_loss, ref_grad)| {
                        TripletLossConfig {
                            margin,
                            triplets,
                            distance: DistanceConfig {
                                distance: DISTANCES[which],
                                normalize,
                            },
                            smooth_loss,
                            ref_grad,
                            ..Default::default()
                        }
                    },
                );
            (labels(b, classes), grid_embeddings(b, d), refs, cfg)
        })
        .prop_map(|(labels, embeddings, refs, cfg)| Problem {
            labels,
            embeddings,
            refs,
            cfg,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(48)))]

    #[test]
    fn triplet_weights_match_the_reference_across_column_blocks(p in problem(6, 600, 4)) {
        if let Some(ctx) = common::shared_gpu() {
            check(ctx, &p);
        }
    }
}

/// `(n, d)` rows on the grid -2..=2 from a formula, none all zero.
pub(crate) fn formula_rows(n: usize, d: usize) -> Array2<f32> {
    Array2::from_shape_fn((n, d), |(i, k)| {
        let v = ((i * 7 + k * 3 + i / 5) % 5) as f32 - 2.0;
        if k == 0 && v == 0.0 {
            1.0
        } else {
            v
        }
    })
}

#[test]
fn the_anchors_own_column_past_the_first_block() {
    // The queries as references (each anchor's own column excluded) with rows of 300 and 520
    // references: the own column lands in every block of 256 slots, and at their edges.
    let Some(ctx) = common::shared_gpu() else {
        return;
    };
    for (n, classes) in [(300, 3u32), (520, 7)] {
        for cfg in [
            TripletLossConfig::default(),
            TripletLossConfig {
                margin: 0.5,
                triplets: wgpu_metric_learning::TripletRule::margin_miner(
                    wgpu_metric_learning::TripletType::Semihard,
                ),
                smooth_loss: true,
                ..Default::default()
            },
        ] {
            let p = Problem {
                labels: (0..n as u32).map(|i| i % classes).collect(),
                embeddings: formula_rows(n, 3),
                refs: None,
                cfg,
            };
            check(ctx, &p);
        }
    }
}
