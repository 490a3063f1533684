//! `ntxent_loss` and `multiple_negatives_ranking_loss` against the reference that writes every
//! positive pair's softmax out (`reference::ntxent_loss`), against finite differences, and on
//! PML's edges (no positive or negative pair, one of each), under small budgets.

use crate::common;
use crate::common::{assert_close, grid_embeddings, DISTANCES};

use ndarray::{array, Array1, Array2};
use proptest::prelude::*;
use wgpu_metric_learning::reference::ntxent_loss::ntxent_loss as reference;
use wgpu_metric_learning::reference::triplet_lists::triplet_lists;
use wgpu_metric_learning::{
    multiple_negatives_ranking_loss, ntxent_loss, pairwise_distances, Context, Distance,
    DistanceConfig, Error, InfoNceConfig, MiningSet, MnrlConfig, PairwiseConfig,
};

/// Queries, references (`None`: the queries), the loss.
#[derive(Debug, Clone)]
pub(crate) struct Problem {
    pub(crate) labels: Array1<u32>,
    pub(crate) x: Array2<f32>,
    pub(crate) refs: Option<(Array1<u32>, Array2<f32>)>,
    pub(crate) cfg: InfoNceConfig,
}

fn problem() -> impl Strategy<Value = Problem> {
    problem_of(11, 15, 4)
}

/// Problems of up to `b` queries and `m` references of up to `d` dimensions, every distance,
/// temperatures down to 0.05.
pub(crate) fn problem_of(b: usize, m: usize, d: usize) -> impl Strategy<Value = Problem> {
    (0..=b, 0..=m, 1..=d, 1u32..5, any::<bool>())
        .prop_flat_map(|(b, m, d, classes, with_refs)| {
            let labels = move |n| proptest::collection::vec(0..classes, n).prop_map(Array1::from);
            let refs = if with_refs {
                (labels(m), grid_embeddings(m, d)).prop_map(Some).boxed()
            } else {
                Just(None).boxed()
            };
            let cfg = (
                prop_oneof![Just(0.07f32), Just(1.0), 0.05f32..2.0],
                0usize..4,
                any::<bool>(),
                any::<bool>(),
            )
                .prop_map(|(temperature, which, normalize, ref_grad)| InfoNceConfig {
                    temperature,
                    distance: DistanceConfig {
                        distance: DISTANCES[which],
                        normalize,
                    },
                    ref_grad,
                    ..Default::default()
                });
            (labels(b), grid_embeddings(b, d), refs, cfg)
        })
        .prop_map(|(labels, x, refs, cfg)| Problem {
            labels,
            x,
            refs,
            cfg,
        })
}

fn check(p: &Problem, ctx: &Context) {
    let set = MiningSet::new(&p.x, &p.labels);
    let ref_set = p.refs.as_ref().map(|(l, e)| MiningSet::new(e, l));
    let got = ntxent_loss(ctx, &set, ref_set.as_ref(), &p.cfg).expect("loss");
    assert_eq!(got.path, ctx.path(), "the loss runs where the context does");
    let sides = (&p.x, &p.labels);
    let (ref_x, distances, lists) =
        common::reference_inputs(ctx, sides, p.refs.as_ref(), p.cfg.distance);
    let want = reference(
        p.x.view(),
        ref_x.view(),
        distances.view(),
        &lists,
        p.cfg.temperature,
        p.cfg.distance,
        true,
    );
    let what = format!("{:?}", p.cfg);
    assert_eq!(got.positive_pairs, want.positive_pairs, "{what}");
    assert!(
        (f64::from(got.loss) - want.loss).abs() <= 1e-5 * want.loss.abs().max(1.0),
        "{what}: loss {} vs {}",
        got.loss,
        want.loss
    );
    common::assert_loss_gradients(
        p.refs.is_some(),
        p.cfg.ref_grad,
        (&got.query_grad, got.ref_grad.as_ref()),
        (&want.query_grad, &want.ref_grad),
        &what,
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(192)))]

    #[test]
    fn ntxent_matches_the_written_out_reference(p in problem()) {
        check(&p, &Context::native_cpu(None));
    }

    /// The wgpu path (`info_nce_weights` and `loss_backward`) against the same reference,
    /// scored on the device's own distances.
    #[test]
    fn gpu_ntxent_matches_the_written_out_reference(p in problem()) {
        if let Some(ctx) = common::shared_gpu() {
            check(&p, ctx);
        }
    }

    #[test]
    fn mnrl_is_ntxent_with_one_positive_per_anchor(
        (b, extra, d) in (1usize..8, 0usize..6, 1usize..5),
        seed in any::<u64>(),
        scale in prop_oneof![Just(20.0f32), 0.5f32..50.0],
    ) {
        let native = Context::native_cpu(None);
        // Both paths: the native one, and the device where there is one.
        for ctx in std::iter::once(&native).chain(common::shared_gpu()) {
        let anchors = noise(b, d, seed);
        let candidates = noise(b + extra, d, seed ^ 0x5eed);
        let got = multiple_negatives_ranking_loss(ctx, &anchors, &candidates, &MnrlConfig { scale, ..Default::default() })
            .expect("loss");
        let cosine = DistanceConfig { distance: Distance::Cosine, normalize: true };
        let s = pairwise_distances(ctx, &anchors, &candidates, &PairwiseConfig { distance: cosine, ..Default::default() })
            .expect("cosines").values;
        let lists: Vec<(Vec<u32>, Vec<u32>)> = (0..b as u32)
            .map(|i| (vec![i], (0..(b + extra) as u32).filter(|&j| j != i).collect()))
            .collect();
        let want = reference(anchors.view(), candidates.view(), s.view(), &lists, 1.0 / scale, cosine, false);
        prop_assert_eq!(got.positive_pairs, b as u64);
        prop_assert!((f64::from(got.loss) - want.loss).abs() <= 1e-5 * want.loss.abs().max(1.0));
        assert_close(&got.query_grad, &want.query_grad, 2e-4, "anchors");
        assert_close(got.ref_grad.as_ref().expect("candidates' gradient"), &want.ref_grad, 2e-4, "candidates");
        prop_assert_eq!(got.path, ctx.path());
        }
    }
}

/// Deterministic noise `(n, d)` from `seed`, entries in `[−0.5, 0.5)`.
pub(crate) fn noise(n: usize, d: usize, seed: u64) -> Array2<f32> {
    let mut state = seed | 1;
    Array2::from_shape_simple_fn((n, d), || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    })
}

/// PML's NTXent written out in f64 from the embeddings: the function whose finite differences
/// the gradient must match (two views of each of `n / 2` items, cosine similarity).
fn ntxent_f64(x: &Array2<f64>, labels: &[u32], temperature: f64) -> f64 {
    let xs: Vec<_> = x
        .rows()
        .into_iter()
        .map(|r| r.mapv(|v| v / r.dot(&r).sqrt()))
        .collect();
    let (mut sum, mut pairs) = (0.0, 0u64);
    for a in 0..xs.len() {
        let z = |j: usize| xs[a].dot(&xs[j]) / temperature;
        let negatives: f64 = (0..xs.len())
            .filter(|&n| labels[n] != labels[a])
            .map(|n| z(n).exp())
            .sum();
        for p in (0..xs.len()).filter(|&p| p != a && labels[p] == labels[a]) {
            sum -= (z(p).exp() / (z(p).exp() + negatives)).ln();
            pairs += 1;
        }
    }
    sum / pairs as f64
}

#[test]
fn gradient_matches_finite_differences() {
    let x = noise(8, 5, 42);
    let labels = [0u32, 1, 2, 3, 0, 1, 2, 3];
    let ctx = Context::native_cpu(None);
    for temperature in [0.07f32, 0.5] {
        let cfg = InfoNceConfig {
            temperature,
            ..Default::default()
        };
        let y = Array1::from(labels.to_vec());
        let got = ntxent_loss(&ctx, &MiningSet::new(&x, &y), None, &cfg).expect("loss");
        let x64 = x.mapv(f64::from);
        let f = |x: &Array2<f64>| ntxent_f64(x, &labels, f64::from(temperature));
        assert!((f(&x64) - f64::from(got.loss)).abs() < 1e-5 * f(&x64).max(1.0));
        let what = format!("τ {temperature}");
        common::assert_finite_differences(&x64, f, &got.query_grad, 2e-3, &what);
    }
}

#[test]
fn pml_returns_no_loss_without_pairs() {
    let ctx = Context::native_cpu(None);
    let cfg = InfoNceConfig::default();
    let x = array![[1.0f32, 0.0], [0.6, 0.8], [0.0, 1.0]];
    // One class: no negative pair. All distinct: no positive pair.
    for labels in [array![0u32, 0, 0], array![0u32, 1, 2]] {
        let out = ntxent_loss(&ctx, &MiningSet::new(&x, &labels), None, &cfg).expect("loss");
        assert_eq!(out.loss, 0.0);
        assert!(out.query_grad.iter().all(|&g| g == 0.0));
    }
    // One positive pair (0, 1) and one negative pair (0, 2): PML's GenericPairLoss returns 0.
    let refs_x = array![[0.6f32, 0.8], [0.0, 1.0]];
    let first = x.slice(ndarray::s![..1, ..]);
    let first_label = array![0u32];
    let one = ntxent_loss(
        &ctx,
        &MiningSet::new(first, &first_label),
        Some(&MiningSet::new(&refs_x, &array![0u32, 1])),
        &cfg,
    )
    .expect("loss");
    assert_eq!(
        (one.positive_pairs, one.negative_pairs, one.loss),
        (1, 1, 0.0)
    );
}

#[test]
fn blocks_under_a_small_budget_give_the_whole_answer() {
    // MNRL at (64, 64 + 192): the (b, c) matrix in blocks of a few rows.
    let anchors = noise(64, 16, 1);
    let candidates = noise(256, 16, 2);
    let cfg = MnrlConfig::default();
    let whole =
        multiple_negatives_ranking_loss(&Context::native_cpu(None), &anchors, &candidates, &cfg)
            .expect("loss");
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get()) as u64;
    let fixed = 4 * 16 * (2 * 64 + 2 * 256) + threads * 256 * 48;
    let budget = fixed + 4 * (20 * 256 + 16);
    let ctx = Context::native_cpu(Some(budget));
    let split = multiple_negatives_ranking_loss(&ctx, &anchors, &candidates, &cfg).expect("loss");
    assert!(ctx.memory().peak_bytes <= budget);
    assert!((split.loss - whole.loss).abs() <= 1e-6 * whole.loss);
    for (a, b) in split.query_grad.iter().zip(&whole.query_grad) {
        assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()));
    }
    let (sr, wr) = (
        split.ref_grad.expect("candidates"),
        whole.ref_grad.expect("candidates"),
    );
    for (a, b) in sr.iter().zip(&wr) {
        assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()));
    }
}

#[test]
fn bad_parameters_are_typed_errors() {
    let ctx = Context::native_cpu(None);
    let x = noise(4, 3, 9);
    let labels = array![0u32, 0, 1, 1];
    for temperature in [0.0f32, -1.0, f32::NAN, 1e-45] {
        let cfg = InfoNceConfig {
            temperature,
            ..Default::default()
        };
        assert!(
            matches!(
                ntxent_loss(&ctx, &MiningSet::new(&x, &labels), None, &cfg),
                Err(Error::InvalidParameter { .. })
            ),
            "temperature {temperature}"
        );
    }
    let fewer = noise(3, 3, 1);
    assert!(matches!(
        multiple_negatives_ranking_loss(&ctx, &x, &fewer, &MnrlConfig::default()),
        Err(Error::Shape { .. })
    ));
    let narrow = noise(5, 2, 1);
    assert!(matches!(
        multiple_negatives_ranking_loss(&ctx, &x, &narrow, &MnrlConfig::default()),
        Err(Error::Shape { .. })
    ));
}

#[test]
fn far_apart_logits_stay_finite() {
    // Raw dot products of long vectors at a small temperature: logits thousands apart, where
    // one shift for a whole anchor would underflow every exponential to 0/0.
    let x = array![
        [30.0f32, 0.0],
        [29.0, 1.0],
        [0.0, 30.0],
        [1.0, 29.0],
        [-30.0, 0.0]
    ];
    let labels = array![0u32, 0, 1, 1, 0];
    let ctx = Context::native_cpu(None);
    let cfg = InfoNceConfig {
        temperature: 0.05,
        distance: DistanceConfig {
            distance: Distance::DotProduct,
            normalize: false,
        },
        ..Default::default()
    };
    let got = ntxent_loss(&ctx, &MiningSet::new(&x, &labels), None, &cfg).expect("loss");
    assert!(got.loss.is_finite() && got.query_grad.iter().all(|g| g.is_finite()));
    let s = pairwise_distances(
        &ctx,
        &x,
        &x,
        &PairwiseConfig {
            distance: cfg.distance,
            ..Default::default()
        },
    )
    .expect("dots")
    .values;
    let slots: Vec<u32> = (0..5).collect();
    let all = labels.as_slice().expect("contiguous");
    let lists = triplet_lists(all, all, &slots);
    let want = reference(
        x.view(),
        x.view(),
        s.view(),
        &lists,
        0.05,
        cfg.distance,
        true,
    );
    assert!((f64::from(got.loss) - want.loss).abs() <= 1e-5 * want.loss.abs().max(1.0));
    assert_close(
        &got.query_grad,
        &(&want.query_grad + &want.ref_grad),
        1e-4,
        "far logits",
    );
}
