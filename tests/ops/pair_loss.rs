//! `pair_loss` (Contrastive, MultiSimilarity, SupCon, Circle) against the reference that
//! writes PML's computation out (`reference::pair_loss`), against finite differences, on
//! PML's edges (no pairs, one of each, one class), under small budgets, and its errors.

use crate::common;
use crate::common::{grid_embeddings, DISTANCES};

use ndarray::{array, Array1, Array2};
use proptest::prelude::*;
use wgpu_metric_learning::reference::pair_loss::{pair_loss as reference, PairLossRef};
use wgpu_metric_learning::{
    pair_loss, pair_loss_plan, Circle, ComputePath, Context, Contrastive, Distance, DistanceConfig,
    Error, FastAp, GeneralizedLifted, Histogram, IntraPairVariance, LiftedStructure, Margin,
    MiningSet, MultiSimilarity, NPairs, Nca, PairLoss, PairLossConfig, Pnp, PnpVariant, RankedList,
    SupCon, ThresholdConsistentMargin, TupletMargin,
};

const COSINE: DistanceConfig = DistanceConfig {
    distance: Distance::Cosine,
    normalize: true,
};

#[derive(Debug, Clone)]
pub(crate) struct Problem {
    pub(crate) labels: Array1<u32>,
    pub(crate) x: Array2<f32>,
    pub(crate) refs: Option<(Array1<u32>, Array2<f32>)>,
    pub(crate) rule: PairLossRef,
    pub(crate) distance: DistanceConfig,
    pub(crate) ref_grad: bool,
}

fn rule() -> impl Strategy<Value = PairLossRef> {
    prop_oneof![
        old_rule(),
        new_rule(),
        pnp_rule(),
        Just(PairLossRef::NPairs(NPairs))
    ]
}

/// The rules of PML's tuple and whole-batch losses.
fn new_rule() -> impl Strategy<Value = PairLossRef> {
    prop_oneof![
        (0.0f32..0.5, prop_oneof![Just(1.0f32), 0.3f32..2.0]).prop_map(
            |(pos_margin, neg_margin)| PairLossRef::LiftedStructure(LiftedStructure {
                pos_margin,
                neg_margin
            })
        ),
        prop_oneof![Just(100u32), 1u32..40]
            .prop_map(|n_bins| PairLossRef::Histogram(Histogram { n_bins })),
        (prop_oneof![Just(5.73f32), 0.0f32..30.0], 1.0f32..64.0)
            .prop_map(|(margin, scale)| PairLossRef::TupletMargin(TupletMargin { margin, scale })),
        (0.0f32..0.2, 0.0f32..0.2).prop_map(|(pos_eps, neg_eps)| {
            PairLossRef::IntraPairVariance(IntraPairVariance { pos_eps, neg_eps })
        }),
        (
            0.0f32..1.0,
            0.0f32..5.0,
            0.0f32..=1.0,
            prop_oneof![Just(None), (0.5f32..1.5).prop_map(Some)],
            0.0f32..3.0
        )
            .prop_map(|(margin, tn, imbalance, alpha, tp)| {
                PairLossRef::RankedList(RankedList {
                    margin,
                    tn,
                    imbalance,
                    alpha,
                    tp,
                })
            }),
        (0.5f32..2.0, 0.5f32..2.0, 0.0f32..1.0, -0.5f32..0.9).prop_map(
            |(lambda_plus, lambda_minus, margin_plus, margin_minus)| {
                PairLossRef::ThresholdConsistentMargin(ThresholdConsistentMargin {
                    lambda_plus,
                    lambda_minus,
                    margin_plus,
                    margin_minus,
                })
            }
        ),
    ]
}

/// PNP's rules: every variant, temperatures from PML's 0.01 up.
fn pnp_rule() -> impl Strategy<Value = PairLossRef> {
    (
        prop_oneof![
            Just(PnpVariant::O),
            Just(PnpVariant::Ds),
            Just(PnpVariant::Dq),
            Just(PnpVariant::Iu),
            Just(PnpVariant::Ib)
        ],
        prop_oneof![Just(0.01f32), 0.05f32..1.0],
        0.5f32..3.0,
        0.5f32..3.0,
    )
        .prop_map(|(variant, anneal, alpha, b)| {
            PairLossRef::Pnp(Pnp {
                b,
                alpha,
                anneal,
                variant,
            })
        })
}

/// The rules of the first eight losses.
fn old_rule() -> impl Strategy<Value = PairLossRef> {
    prop_oneof![
        (
            prop_oneof![Just(0.0f32), 0.0f32..0.5],
            prop_oneof![Just(1.0f32), 0.3f32..2.0]
        )
            .prop_map(
                |(pos_margin, neg_margin)| PairLossRef::Contrastive(Contrastive {
                    pos_margin,
                    neg_margin
                })
            ),
        (
            0.5f32..4.0,
            prop_oneof![Just(50.0f32), 1.0f32..60.0],
            0.0f32..1.0
        )
            .prop_map(|(alpha, beta, base)| PairLossRef::MultiSimilarity(
                MultiSimilarity { alpha, beta, base }
            )),
        prop_oneof![Just(0.1f32), 0.05f32..1.0]
            .prop_map(|temperature| PairLossRef::SupCon(SupCon { temperature })),
        (
            prop_oneof![Just(0.4f32), 0.0f32..0.5],
            prop_oneof![Just(80.0f32), 1.0f32..100.0]
        )
            .prop_map(|(m, gamma)| PairLossRef::Circle(Circle { m, gamma })),
        prop_oneof![Just(1.0f32), 0.1f32..4.0]
            .prop_map(|softmax_scale| PairLossRef::Nca(Nca { softmax_scale })),
        (
            prop_oneof![Just(0.0f32), 0.0f32..0.5],
            prop_oneof![Just(1.0f32), 0.3f32..2.0]
        )
            .prop_map(|(pos_margin, neg_margin)| PairLossRef::GeneralizedLifted(
                GeneralizedLifted {
                    pos_margin,
                    neg_margin
                }
            )),
        prop_oneof![Just(10u32), 1u32..40]
            .prop_map(|num_bins| PairLossRef::FastAp(FastAp { num_bins })),
        (
            prop_oneof![Just(0.2f32), 0.0f32..0.5],
            0.0f32..0.5,
            prop_oneof![Just(1.2f32), 0.0f32..2.0],
            any::<bool>()
        )
            .prop_map(
                |(margin, nu, beta, learn_beta)| PairLossRef::Margin(Margin {
                    margin,
                    nu,
                    beta,
                    learn_beta
                })
            ),
    ]
}

/// Problems of up to `b` queries and `m` references of up to `d` dimensions.
pub(crate) fn problem_of(b: usize, m: usize, d: usize) -> impl Strategy<Value = Problem> {
    (0..=b, 0..=m, 1..=d, 1u32..5, any::<bool>())
        .prop_flat_map(|(b, m, d, classes, with_refs)| {
            let labels = move |n| proptest::collection::vec(0..classes, n).prop_map(Array1::from);
            let refs = if with_refs {
                (labels(m), grid_embeddings(m, d)).prop_map(Some).boxed()
            } else {
                Just(None).boxed()
            };
            let distance =
                (0usize..4, any::<bool>()).prop_map(|(which, normalize)| DistanceConfig {
                    distance: DISTANCES[which],
                    normalize,
                });
            (
                labels(b),
                grid_embeddings(b, d),
                refs,
                rule(),
                distance,
                any::<bool>(),
            )
        })
        .prop_map(|(labels, x, refs, rule, distance, ref_grad)| Problem {
            labels,
            x: off_grid(x, rule),
            // Histogram takes no references.
            refs: refs
                .filter(|_| {
                    !matches!(
                        rule,
                        PairLossRef::Histogram(_) | PairLossRef::Pnp(_) | PairLossRef::NPairs(_)
                    )
                })
                .map(|(l, r)| (l, off_grid(r, rule))),
            // Circle, Histogram, TupletMargin and TCM run on cosine similarity only.
            distance: match rule {
                PairLossRef::Circle(_)
                | PairLossRef::Histogram(_)
                | PairLossRef::TupletMargin(_)
                | PairLossRef::ThresholdConsistentMargin(_)
                | PairLossRef::Pnp(_) => COSINE,
                // FastAP runs on PML's LpDistance (normalised, power 1 or 2) only.
                PairLossRef::FastAp(_) => DistanceConfig {
                    distance: match distance.distance {
                        Distance::SquaredEuclidean | Distance::Cosine => Distance::SquaredEuclidean,
                        _ => Distance::Euclidean,
                    },
                    normalize: true,
                },
                _ => distance,
            },
            rule,
            ref_grad,
        })
}

/// FastAP's and the newer rules' rows moved off the grid: bins and thresholds have kinks
/// where grid rows put many distances exactly, so that the last bit of a distance (the
/// library's blocks against the reference's matrix) would pick the side of the kink.
fn off_grid(x: Array2<f32>, rule: PairLossRef) -> Array2<f32> {
    match rule {
        PairLossRef::FastAp(_)
        | PairLossRef::Histogram(_)
        | PairLossRef::TupletMargin(_)
        | PairLossRef::RankedList(_)
        | PairLossRef::ThresholdConsistentMargin(_)
        | PairLossRef::Pnp(_) => {
            let mut x = x;
            // Scattered offsets in ±0.2: rows that were equal end up ~0.1 apart, where the
            // cancellation of the distances' matrix form (it grows as the rows get closer:
            // ~1e-3 of a distance for rows 4e-5 apart) stays below the tests' tolerance even
            // though the blocks and the reference's matrix round differently.
            for ((i, k), v) in x.indexed_iter_mut() {
                let h = (i as u64 * 7919 + k as u64 * 104_729 + 17) % 1009;
                *v += 0.4 * (h as f32 / 1009.0 - 0.5);
            }
            x
        }
        _ => x,
    }
}

/// `pair_loss` with the rule `p.rule` names.
pub(crate) fn run(
    ctx: &Context,
    p: &Problem,
    set: &MiningSet<'_, u32>,
    refs: Option<&MiningSet<'_, u32>>,
) -> PairLoss {
    fn with<R: wgpu_metric_learning::PairLossRule>(rule: R, p: &Problem) -> PairLossConfig<R> {
        PairLossConfig {
            rule,
            distance: p.distance,
            ref_grad: p.ref_grad,
            ..Default::default()
        }
    }
    match p.rule {
        PairLossRef::Contrastive(r) => pair_loss(ctx, set, refs, &with(r, p)),
        PairLossRef::MultiSimilarity(r) => pair_loss(ctx, set, refs, &with(r, p)),
        PairLossRef::SupCon(r) => pair_loss(ctx, set, refs, &with(r, p)),
        PairLossRef::Circle(r) => pair_loss(ctx, set, refs, &with(r, p)),
        PairLossRef::Nca(r) => pair_loss(ctx, set, refs, &with(r, p)),
        PairLossRef::GeneralizedLifted(r) => pair_loss(ctx, set, refs, &with(r, p)),
        PairLossRef::Margin(r) => pair_loss(ctx, set, refs, &with(r, p)),
        PairLossRef::FastAp(r) => pair_loss(ctx, set, refs, &with(r, p)),
        PairLossRef::LiftedStructure(r) => pair_loss(ctx, set, refs, &with(r, p)),
        PairLossRef::Histogram(r) => pair_loss(ctx, set, refs, &with(r, p)),
        PairLossRef::TupletMargin(r) => pair_loss(ctx, set, refs, &with(r, p)),
        PairLossRef::IntraPairVariance(r) => pair_loss(ctx, set, refs, &with(r, p)),
        PairLossRef::RankedList(r) => pair_loss(ctx, set, refs, &with(r, p)),
        PairLossRef::ThresholdConsistentMargin(r) => pair_loss(ctx, set, refs, &with(r, p)),
        PairLossRef::Pnp(r) => pair_loss(ctx, set, refs, &with(r, p)),
        PairLossRef::NPairs(r) => pair_loss(ctx, set, refs, &with(r, p)),
    }
    .expect("loss")
}

/// Whether `p` runs on the device on a wgpu context (`pair_weights`; Lifted and Histogram
/// with the queries as references; a call without references runs natively).
pub(crate) fn on_device(p: &Problem) -> bool {
    let symmetric = matches!(
        p.rule,
        PairLossRef::LiftedStructure(_) | PairLossRef::Histogram(_)
    );
    let m = p.refs.as_ref().map_or(p.labels.len(), |(l, _)| l.len());
    m > 0 && (symmetric && p.refs.is_none() || ruled(p.rule))
}

/// The rules with a device path for any references.
fn ruled(rule: PairLossRef) -> bool {
    matches!(
        rule,
        PairLossRef::Contrastive(_)
            | PairLossRef::MultiSimilarity(_)
            | PairLossRef::SupCon(_)
            | PairLossRef::Circle(_)
            | PairLossRef::Nca(_)
            | PairLossRef::GeneralizedLifted(_)
            | PairLossRef::Margin(_)
            | PairLossRef::FastAp(_)
            | PairLossRef::ThresholdConsistentMargin(_)
            | PairLossRef::RankedList(_)
            | PairLossRef::IntraPairVariance(_)
    )
}

pub(crate) fn check(p: &Problem, ctx: &Context) {
    let set = MiningSet::new(&p.x, &p.labels);
    let ref_set = p.refs.as_ref().map(|(l, e)| MiningSet::new(e, l));
    let got = run(ctx, p, &set, ref_set.as_ref());
    // Scored on the distances of the path that runs the rule (the device's own, or the
    // native path's), so that kinks fall on the same side.
    let native = Context::native_cpu(None);
    let scorer = match on_device(p) {
        true => ctx,
        false => &native,
    };
    let sides = (&p.x, &p.labels);
    let (ref_x, distances, lists) =
        common::reference_inputs(scorer, sides, p.refs.as_ref(), p.distance);
    let want = reference(
        p.x.view(),
        ref_x.view(),
        distances.view(),
        &lists,
        p.rule,
        p.distance,
    );
    let what = format!("{p:?}");
    // Calls without a loss return before either path, with the context's; the rules with a
    // device path take it on a wgpu context.
    let path = match (ctx.path(), on_device(p)) {
        (ComputePath::Wgpu, true) => ComputePath::Wgpu,
        _ => ComputePath::NativeCpu,
    };
    assert!(
        got.path == path || got.path == ctx.path() && got.loss == 0.0,
        "{what}: {:?}",
        got.path
    );
    assert_eq!(got.nonzero, want.nonzero, "{what}");
    assert!(
        (f64::from(got.loss) - want.loss).abs() <= 1e-5 * want.loss.abs().max(1.0),
        "{what}: loss {} vs {}",
        got.loss,
        want.loss
    );
    match p.rule {
        PairLossRef::Margin(Margin {
            learn_beta: true, ..
        }) => {
            let g = f64::from(got.beta_grad.expect("learnt β has a gradient"));
            assert!(
                (g - want.beta_grad).abs() <= 1e-5 * want.beta_grad.abs().max(1.0),
                "{what}: ∂/∂β {g} vs {}",
                want.beta_grad
            );
        }
        _ => assert_eq!(got.beta_grad, None, "{what}"),
    }
    common::assert_loss_gradients(
        p.refs.is_some(),
        p.ref_grad,
        (&got.query_grad, got.ref_grad.as_ref()),
        (&want.query_grad, &want.ref_grad),
        &what,
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(256)))]

    #[test]
    fn pair_losses_match_the_written_out_reference(p in problem_of(11, 15, 4)) {
        check(&p, &Context::native_cpu(None));
    }

    /// On a wgpu context the rules with a device path run there (`pair_weights`), the others
    /// natively.
    #[test]
    fn pair_losses_on_a_gpu_context_match_the_reference(p in problem_of(6, 8, 3)) {
        if let Some(ctx) = common::shared_gpu() {
            check(&p, ctx);
        }
    }
}

/// Deterministic noise `(n, d)` from `seed` (the NTXent tests').
pub(crate) use crate::ops::ntxent_loss::noise;

/// The loss of `rule` from the embeddings in f64, distances computed here (cosine, or
/// Euclidean on normalised rows for Contrastive): what finite differences differentiate.
fn loss_f64(x: &Array2<f64>, labels: &[u32], rule: PairLossRef) -> f64 {
    let n = x.nrows();
    let xs: Vec<_> = x
        .rows()
        .into_iter()
        .map(|r| r.mapv(|v| v / r.dot(&r).sqrt()))
        .collect();
    let euclid = matches!(
        rule,
        PairLossRef::Contrastive(_)
            | PairLossRef::GeneralizedLifted(_)
            | PairLossRef::Margin(_)
            | PairLossRef::Nca(_)
            | PairLossRef::FastAp(_)
    );
    let squared = matches!(rule, PairLossRef::Nca(_) | PairLossRef::FastAp(_));
    let dist = |a: usize, j: usize| {
        if euclid {
            let diff = &xs[a] - &xs[j];
            let sq = diff.dot(&diff);
            if squared {
                sq
            } else {
                sq.sqrt()
            }
        } else {
            xs[a].dot(&xs[j])
        }
    };
    let lists: Vec<(Vec<usize>, Vec<usize>)> = (0..n)
        .map(|a| {
            let pos = (0..n)
                .filter(|&j| j != a && labels[j] == labels[a])
                .collect();
            let neg = (0..n).filter(|&j| labels[j] != labels[a]).collect();
            (pos, neg)
        })
        .collect();
    let lse = |v: Vec<f64>, one: bool| -> f64 {
        let s: f64 = v.iter().map(|x| x.exp()).sum::<f64>() + if one { 1.0 } else { 0.0 };
        s.ln()
    };
    match rule {
        PairLossRef::Contrastive(c) => {
            let (pm, nm) = (f64::from(c.pos_margin), f64::from(c.neg_margin));
            let pos: Vec<f64> = lists
                .iter()
                .enumerate()
                .flat_map(|(a, (p, _))| p.iter().map(move |&p| (a, p)))
                .map(|(a, p)| (dist(a, p) - pm).max(0.0))
                .filter(|&l| l > 0.0)
                .collect();
            let neg: Vec<f64> = lists
                .iter()
                .enumerate()
                .flat_map(|(a, (_, n))| n.iter().map(move |&n| (a, n)))
                .map(|(a, n)| (nm - dist(a, n)).max(0.0))
                .filter(|&l| l > 0.0)
                .collect();
            let mean = |v: &[f64]| {
                if v.is_empty() {
                    0.0
                } else {
                    v.iter().sum::<f64>() / v.len() as f64
                }
            };
            mean(&pos) + mean(&neg)
        }
        PairLossRef::MultiSimilarity(c) => {
            let (al, be, base) = (f64::from(c.alpha), f64::from(c.beta), f64::from(c.base));
            lists
                .iter()
                .enumerate()
                .map(|(a, (p, ng))| {
                    lse(p.iter().map(|&p| al * (base - dist(a, p))).collect(), true) / al
                        + lse(ng.iter().map(|&j| be * (dist(a, j) - base)).collect(), true) / be
                })
                .sum::<f64>()
                / n as f64
        }
        PairLossRef::SupCon(c) => {
            let t = f64::from(c.temperature);
            let losses: Vec<f64> = lists
                .iter()
                .enumerate()
                .filter(|(_, (p, _))| !p.is_empty())
                .map(|(a, (p, ng))| {
                    let den = lse(p.iter().chain(ng).map(|&j| dist(a, j) / t).collect(), false);
                    -p.iter().map(|&j| dist(a, j) / t - den).sum::<f64>() / p.len() as f64
                })
                .filter(|&l| l > 0.0)
                .collect();
            losses.iter().sum::<f64>() / losses.len() as f64
        }
        PairLossRef::Nca(c) => {
            let sc = f64::from(c.softmax_scale);
            let losses: Vec<f64> = lists
                .iter()
                .enumerate()
                .filter(|(_, (p, _))| !p.is_empty())
                .map(|(a, (p, ng))| {
                    let all = lse(
                        p.iter().chain(ng).map(|&j| -sc * dist(a, j)).collect(),
                        false,
                    );
                    all - lse(p.iter().map(|&j| -sc * dist(a, j)).collect(), false)
                })
                .collect();
            losses.iter().sum::<f64>() / losses.len() as f64
        }
        PairLossRef::GeneralizedLifted(c) => {
            let (pm, nm) = (f64::from(c.pos_margin), f64::from(c.neg_margin));
            let or0 = |v: Vec<f64>| if v.is_empty() { 0.0 } else { lse(v, false) };
            lists
                .iter()
                .enumerate()
                .map(|(a, (p, ng))| {
                    (or0(p.iter().map(|&j| dist(a, j) - pm).collect())
                        + or0(ng.iter().map(|&j| nm - dist(a, j)).collect()))
                    .max(0.0)
                })
                .sum::<f64>()
                / n as f64
        }
        PairLossRef::Margin(c) => {
            let (mu, beta) = (f64::from(c.margin), f64::from(c.beta));
            let (mut sum, mut count) = (0.0, 0u64);
            for (a, (p, ng)) in lists.iter().enumerate() {
                for &j in p {
                    for &k in ng {
                        for l in [dist(a, j) - beta + mu, beta - dist(a, k) + mu] {
                            if l > 0.0 {
                                sum += l;
                                count += 1;
                            }
                        }
                    }
                }
            }
            sum / count as f64
                + if c.learn_beta {
                    f64::from(c.nu) * beta
                } else {
                    0.0
                }
        }
        PairLossRef::FastAp(c) => {
            let edges = c.num_bins as usize + 1;
            let delta = 4.0 / f64::from(c.num_bins);
            let pulse = |d: f64, b: usize| (1.0 - (d - b as f64 * delta).abs() / delta).max(0.0);
            let losses: Vec<f64> = lists
                .iter()
                .enumerate()
                .filter(|(_, (p, _))| !p.is_empty())
                .map(|(a, (p, ng))| {
                    let (mut cp, mut ch, mut ap) = (0.0, 0.0, 0.0);
                    for b in 0..edges {
                        let hp: f64 = p.iter().map(|&j| pulse(dist(a, j), b)).sum();
                        let hn: f64 = ng.iter().map(|&j| pulse(dist(a, j), b)).sum();
                        cp += hp;
                        ch += hp + hn;
                        if hp * cp > 0.0 && ch > 0.0 {
                            ap += hp * cp / ch;
                        }
                    }
                    1.0 - ap / p.len() as f64
                })
                .collect();
            losses.iter().sum::<f64>() / losses.len() as f64
        }
        PairLossRef::Circle(c) => {
            let (m, g) = (f64::from(c.m), f64::from(c.gamma));
            // The relu factors are detached in PML: finite differences hold them at x.
            let losses: Vec<f64> = lists
                .iter()
                .enumerate()
                .map(|(a, (p, ng))| {
                    let lp = p
                        .iter()
                        .map(|&j| -g * (1.0 + m - dist(a, j)).max(0.0) * (dist(a, j) - 1.0 + m));
                    let ln = ng
                        .iter()
                        .map(|&j| g * (dist(a, j) + m).max(0.0) * (dist(a, j) - m));
                    (1.0 + (lse(lp.collect(), false) + lse(ln.collect(), false)).exp()).ln()
                })
                .collect();
            losses.iter().sum::<f64>() / n as f64
        }
        other => crate::ops::pair_loss_tuples::loss_f64(x, labels, other),
    }
}

#[test]
fn gradients_match_finite_differences() {
    let x = noise(8, 5, 42);
    let labels = [0u32, 1, 2, 3, 0, 1, 2, 3];
    let y = Array1::from(labels.to_vec());
    let ctx = Context::native_cpu(None);
    let set = MiningSet::new(&x, &y);
    let rules = [
        PairLossRef::Contrastive(Contrastive {
            pos_margin: 0.1,
            neg_margin: 1.2,
        }),
        PairLossRef::MultiSimilarity(MultiSimilarity::default()),
        PairLossRef::SupCon(SupCon::default()),
        // Small γ: the detached factors' own derivative is then small next to the rest.
        PairLossRef::Circle(Circle { m: 0.4, gamma: 2.0 }),
        PairLossRef::Nca(Nca { softmax_scale: 2.0 }),
        PairLossRef::GeneralizedLifted(GeneralizedLifted::default()),
        PairLossRef::FastAp(FastAp::default()),
        PairLossRef::Margin(Margin {
            margin: 0.2,
            nu: 0.1,
            beta: 1.0,
            learn_beta: true,
        }),
    ];
    for rule in rules {
        let p = Problem {
            labels: y.clone(),
            x: x.clone(),
            refs: None,
            rule,
            distance: match rule {
                PairLossRef::Contrastive(_)
                | PairLossRef::GeneralizedLifted(_)
                | PairLossRef::Margin(_) => DistanceConfig::default(),
                PairLossRef::Nca(_) | PairLossRef::FastAp(_) => DistanceConfig {
                    distance: Distance::SquaredEuclidean,
                    normalize: true,
                },
                _ => COSINE,
            },
            ref_grad: false,
        };
        let got = run(&ctx, &p, &set, None);
        let x64 = x.mapv(f64::from);
        let f = |x: &Array2<f64>| loss_f64(x, &labels, rule);
        assert!(
            (f(&x64) - f64::from(got.loss)).abs() < 1e-5 * f(&x64).max(1.0),
            "{rule:?}: {} vs {}",
            got.loss,
            f(&x64)
        );
        if let PairLossRef::Margin(c) = rule {
            // ∂/∂β by finite differences too.
            let h = 1e-6f32;
            let at = |beta: f32| loss_f64(&x64, &labels, PairLossRef::Margin(Margin { beta, ..c }));
            let (up, down) = (c.beta + h, c.beta - h);
            let fd = (at(up) - at(down)) / f64::from(up - down);
            let g = f64::from(got.beta_grad.expect("learnt β"));
            assert!(
                (g - fd).abs() < 2e-3 * fd.abs().max(1.0),
                "∂/∂β {g} vs {fd}"
            );
        }
        if matches!(rule, PairLossRef::Circle(_)) {
            // Finite differences would move the detached factors too.
            continue;
        }
        let what = format!("{rule:?}");
        common::assert_finite_differences(&x64, f, &got.query_grad, 2e-3, &what);
    }
}

#[test]
fn pml_returns_no_loss_with_at_most_one_pair_of_each() {
    let ctx = Context::native_cpu(None);
    let x = array![[1.0f32, 0.0], [0.6, 0.8], [0.0, 1.0]];
    let first = x.slice(ndarray::s![..1, ..]);
    let refs_x = array![[0.6f32, 0.8], [0.0, 1.0]];
    let (one_label, ref_labels) = (array![0u32], array![0u32, 1]);
    let one = MiningSet::new(first, &one_label);
    let refs = MiningSet::new(&refs_x, &ref_labels);
    let out = pair_loss(
        &ctx,
        &one,
        Some(&refs),
        &PairLossConfig::<MultiSimilarity>::default(),
    )
    .expect("loss");
    assert_eq!(
        (
            out.positive_pairs,
            out.negative_pairs,
            out.loss,
            out.nonzero
        ),
        (1, 1, 0.0, 0)
    );
    // SupCon also without any negative pair; MultiSimilarity's positives still pay.
    let same = array![0u32, 0, 0];
    let all = MiningSet::new(&x, &same);
    let sup = pair_loss(&ctx, &all, None, &PairLossConfig::<SupCon>::default()).expect("loss");
    assert_eq!(sup.loss, 0.0);
    assert!(sup.query_grad.iter().all(|&g| g == 0.0));
    let ms = pair_loss(
        &ctx,
        &all,
        None,
        &PairLossConfig::<MultiSimilarity>::default(),
    )
    .expect("loss");
    assert!(ms.loss > 0.0 && ms.nonzero == 3);
    // Contrastive without a positive distance past the margin nor a negative inside it: 0.
    let far = array![[1.0f32, 0.0], [1.0, 0.0], [-1.0, 0.0], [-1.0, 0.0]];
    let y = array![0u32, 0, 1, 1];
    let c = pair_loss(
        &ctx,
        &MiningSet::new(&far, &y),
        None,
        &PairLossConfig::<Contrastive>::default(),
    )
    .expect("loss");
    assert_eq!((c.loss, c.nonzero), (0.0, 0));
    assert!(c.query_grad.iter().all(|&g| g == 0.0));
}

#[test]
fn blocks_under_a_small_budget_give_the_whole_answer() {
    let x = noise(64, 16, 1);
    let refs = noise(256, 16, 2);
    let y = Array1::from_shape_fn(64, |i| (i % 7) as u32);
    let ry = Array1::from_shape_fn(256, |i| (i % 5) as u32);
    let (set, ref_set) = (MiningSet::new(&x, &y), MiningSet::new(&refs, &ry));
    let cfg = PairLossConfig::<Contrastive> {
        ref_grad: true,
        ..Default::default()
    };
    let whole = pair_loss(&Context::native_cpu(None), &set, Some(&ref_set), &cfg).expect("loss");
    let small = Context::native_cpu(Some(200_000));
    let plan = pair_loss_plan(&small, &set, Some(&ref_set), &cfg).expect("plan");
    assert!(plan.rows < 64, "blocks: {plan:?}");
    let budget = plan.min_bytes + 4 * 256 * 4;
    let ctx = Context::native_cpu(Some(budget));
    let split = pair_loss(&ctx, &set, Some(&ref_set), &cfg).expect("loss");
    assert!(ctx.memory().peak_bytes <= budget);
    assert_eq!(split.nonzero, whole.nonzero);
    assert!((split.loss - whole.loss).abs() <= 1e-6 * whole.loss);
    for (a, b) in split.query_grad.iter().zip(&whole.query_grad) {
        assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()));
    }
    let (sr, wr) = (split.ref_grad.expect("refs"), whole.ref_grad.expect("refs"));
    for (a, b) in sr.iter().zip(&wr) {
        assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()));
    }
    let tight = Context::native_cpu(Some(plan.min_bytes - 1));
    assert!(matches!(
        pair_loss(&tight, &set, Some(&ref_set), &cfg),
        Err(Error::OverBudget { .. })
    ));
}

#[test]
fn bad_parameters_are_typed_errors() {
    let ctx = Context::native_cpu(None);
    let x = noise(4, 3, 9);
    let labels = array![0u32, 0, 1, 1];
    let set = MiningSet::new(&x, &labels);
    let bad = |r: Result<PairLoss, Error>| matches!(r, Err(Error::InvalidParameter { .. }));
    for v in [0.0f32, -1.0, f32::NAN, 1e-45] {
        let sup = PairLossConfig {
            rule: SupCon { temperature: v },
            ..Default::default()
        };
        assert!(bad(pair_loss(&ctx, &set, None, &sup)), "temperature {v}");
        let ms = PairLossConfig {
            rule: MultiSimilarity {
                beta: v,
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(bad(pair_loss(&ctx, &set, None, &ms)), "beta {v}");
    }
    let c = PairLossConfig {
        rule: Contrastive {
            pos_margin: f32::INFINITY,
            neg_margin: 1.0,
        },
        ..Default::default()
    };
    assert!(bad(pair_loss(&ctx, &set, None, &c)));
    for num_bins in [0, 4097] {
        let fast = PairLossConfig {
            rule: FastAp { num_bins },
            ..Default::default()
        };
        assert!(
            bad(pair_loss(&ctx, &set, None, &fast)),
            "num_bins {num_bins}"
        );
    }
    let circle = PairLossConfig::<Circle> {
        distance: DistanceConfig::default(),
        ..Default::default()
    };
    assert!(
        bad(pair_loss(&ctx, &set, None, &circle)),
        "Circle on a distance"
    );
}

/// NCA keeps an anchor whose positive lies so far below its nearest neighbour that its
/// probability is a float32 subnormal (as PML does), with the exact loss, and drops one whose
/// probability underflows to 0. The library's vectorised exponentials stop at `e^{−87}`;
/// these anchors are past it.
#[test]
fn nca_keeps_subnormal_probabilities_and_drops_zero_ones() {
    // Two classes on opposite sides of the circle: each row's positive is at squared
    // distance 4 (the farthest), a negative of the other class at nearly 0.
    let x = array![[1.0f32, 0.0], [-1.0, 0.0], [1.0, 0.05], [-1.0, 0.05]];
    let labels = array![0u32, 0, 1, 1];
    let distance = DistanceConfig {
        distance: Distance::SquaredEuclidean,
        normalize: true,
    };
    let rows = x.mapv(f64::from);
    let hat = |i: usize| {
        let r = rows.row(i);
        &r / r.dot(&r).sqrt()
    };
    let d = |i: usize, j: usize| {
        let diff = hat(i) - hat(j);
        diff.dot(&diff)
    };
    for (scale, kept) in [(24.0f32, 4usize), (30.0, 0)] {
        let cfg = PairLossConfig {
            rule: Nca {
                softmax_scale: scale,
            },
            distance,
            ..Default::default()
        };
        let got = pair_loss(
            &Context::native_cpu(None),
            &MiningSet::new(&x, &labels),
            None,
            &cfg,
        )
        .expect("loss");
        // PML in f64: `−log Σ_P softmax`, kept where the probability is not 0 in f32.
        let lse = |v: Vec<f64>| {
            let top = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            top + v.iter().map(|z| (z - top).exp()).sum::<f64>().ln()
        };
        let losses: Vec<f64> = (0..4)
            .filter_map(|a| {
                let others = (0..4).filter(|&j| j != a);
                let all = lse(others
                    .clone()
                    .map(|j| -f64::from(scale) * d(a, j))
                    .collect());
                let same = others.filter(|&j| labels[j] == labels[a]);
                let own = lse(same.map(|j| -f64::from(scale) * d(a, j)).collect());
                ((own - all).exp() as f32 != 0.0).then_some(all - own)
            })
            .collect();
        assert_eq!(
            (got.nonzero as usize, losses.len()),
            (kept, kept),
            "scale {scale}"
        );
        let want = match kept {
            0 => 0.0,
            n => losses.iter().sum::<f64>() / n as f64,
        };
        assert!(
            (f64::from(got.loss) - want).abs() <= 1e-5 * want.max(1.0),
            "scale {scale}: {} vs {want}",
            got.loss
        );
        assert!(got.query_grad.iter().all(|g| g.is_finite()));
    }
}

/// With given references and an anchor's own slot among them, the slot leaves the anchor's
/// positives only where it holds the anchor's label; a slot of another label stays a
/// negative (in SupCon's and NCA's dense softmax rows as in their lists), on every path.
#[test]
fn an_own_slot_of_another_label_stays_a_negative() {
    use wgpu_metric_learning::reference::triplet_lists::triplet_lists;
    use wgpu_metric_learning::{pairwise_distances, PairwiseConfig, SelfExclusion};
    let x = crate::ops::ntxent_loss::noise(6, 5, 11);
    let r = crate::ops::ntxent_loss::noise(9, 5, 12);
    let labels = array![0u32, 1, 2, 0, 1, 2];
    let ref_labels = array![0u32, 2, 2, 1, 1, 0, 2, 0, 1];
    // Queries 0 and 4 sit at slots of their label, the others at slots of another.
    let slots = vec![0u32, 2, 1, 8, 3, 5];
    let lists = triplet_lists(
        labels.as_slice().expect("contiguous"),
        ref_labels.as_slice().expect("contiguous"),
        &slots,
    );
    let (set, refs) = (MiningSet::new(&x, &labels), MiningSet::new(&r, &ref_labels));
    let native = Context::native_cpu(None);
    for rule in [
        PairLossRef::SupCon(SupCon::default()),
        PairLossRef::Nca(Nca::default()),
    ] {
        let distance = match rule {
            PairLossRef::SupCon(_) => COSINE,
            _ => DistanceConfig::default(),
        };
        for ctx in std::iter::once(&native).chain(common::shared_gpu()) {
            fn call<R: wgpu_metric_learning::PairLossRule>(
                ctx: &Context,
                rule: R,
                (distance, slots): (DistanceConfig, &[u32]),
                (set, refs): (&MiningSet<'_, u32>, &MiningSet<'_, u32>),
            ) -> Result<PairLoss, Error> {
                let cfg = PairLossConfig {
                    rule,
                    distance,
                    self_exclusion: SelfExclusion::QuerySlots(slots.to_vec()),
                    ..Default::default()
                };
                pair_loss(ctx, set, Some(refs), &cfg)
            }
            let how = (distance, slots.as_slice());
            let got = match rule {
                PairLossRef::SupCon(c) => call(ctx, c, how, (&set, &refs)),
                PairLossRef::Nca(c) => call(ctx, c, how, (&set, &refs)),
                _ => unreachable!("two rules"),
            }
            .expect("loss");
            let pw = PairwiseConfig {
                distance,
                ..Default::default()
            };
            let d = pairwise_distances(ctx, &x, &r, &pw)
                .expect("distances")
                .values;
            let want = reference(x.view(), r.view(), d.view(), &lists, rule, distance);
            assert!(
                (f64::from(got.loss) - want.loss).abs() <= 1e-5 * want.loss.abs().max(1.0),
                "{rule:?} on {:?}: {} vs {}",
                ctx.path(),
                got.loss,
                want.loss
            );
            let top = want.query_grad.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
            for (g, w) in got.query_grad.iter().zip(&want.query_grad) {
                assert!(
                    (f64::from(*g) - w).abs() <= 2e-4 * top,
                    "{rule:?}: {g} vs {w}"
                );
            }
        }
    }
}
