//! `pair_loss`'s tuple and whole-batch losses (LiftedStructure, Histogram, TupletMargin,
//! IntraPairVariance, RankedList, ThresholdConsistentMargin, PNP) against finite differences of
//! their loss written here from the embeddings, under small budgets with their state, and
//! their errors. The proptests against the written-out reference are in `pair_loss`.

use crate::common;
use crate::ops::pair_loss::{noise, run, Problem};

use ndarray::{Array1, Array2};
use wgpu_metric_learning::reference::pair_loss::PairLossRef;
use wgpu_metric_learning::{
    pair_loss, pair_loss_plan, Context, Distance, DistanceConfig, Error, Histogram,
    IntraPairVariance, LiftedStructure, MiningSet, NPairs, PairLoss, PairLossConfig, PairLossRule,
    Pnp, PnpVariant, RankedList, ThresholdConsistentMargin, TupletMargin,
};

const COSINE: DistanceConfig = DistanceConfig {
    distance: Distance::Cosine,
    normalize: true,
};

/// The loss of `rule` from the embeddings in f64 (no references): cosine similarity, or
/// Euclidean distance of normalised rows for LiftedStructure and RankedList.
pub(crate) fn loss_f64(x: &Array2<f64>, labels: &[u32], rule: PairLossRef) -> f64 {
    let n = x.nrows();
    let xs: Vec<_> = (x.rows().into_iter())
        .map(|r| r.mapv(|v| v / r.dot(&r).sqrt()))
        .collect();
    let euclid = matches!(
        rule,
        PairLossRef::LiftedStructure(_) | PairLossRef::RankedList(_)
    );
    let dist = |a: usize, j: usize| {
        if euclid {
            let diff = &xs[a] - &xs[j];
            diff.dot(&diff).sqrt()
        } else {
            xs[a].dot(&xs[j])
        }
    };
    let same = |a: usize, j: usize| labels[a] == labels[j];
    let pos: Vec<(usize, usize)> = (0..n)
        .flat_map(|a| (0..n).map(move |j| (a, j)))
        .filter(|&(a, j)| a != j && same(a, j))
        .collect();
    let neg: Vec<(usize, usize)> = (0..n)
        .flat_map(|a| (0..n).map(move |j| (a, j)))
        .filter(|&(a, j)| !same(a, j))
        .collect();
    let mean = |v: Vec<f64>| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    match rule {
        PairLossRef::LiftedStructure(c) => {
            let (pm, nm) = (f64::from(c.pos_margin), f64::from(c.neg_margin));
            let s = |i: usize| -> f64 {
                (0..n)
                    .filter(|&k| !same(i, k))
                    .map(|k| (nm - dist(i, k)).exp())
                    .sum()
            };
            mean(
                pos.iter()
                    .map(|&(a, p)| {
                        let t = (s(a) + s(p)).ln() + dist(a, p) - pm;
                        t.max(0.0).powi(2) / 2.0
                    })
                    .collect(),
            )
        }
        PairLossRef::Histogram(c) => {
            let has_pos = |i: usize| (0..n).any(|j| j != i && same(i, j));
            let delta = 2.0 / f64::from(c.n_bins);
            let nodes = c.n_bins as usize + 1;
            let hist = |pairs: Vec<f64>| {
                let mut h = vec![0.0; nodes];
                for s in &pairs {
                    for (b, v) in h.iter_mut().enumerate() {
                        *v += (1.0 - ((s + 1.0) - b as f64 * delta).abs() / delta).max(0.0)
                            / pairs.len() as f64;
                    }
                }
                h
            };
            let upper = |pairs: &[(usize, usize)]| -> Vec<f64> {
                pairs
                    .iter()
                    .filter(|&&(a, j)| a < j)
                    .map(|&(a, j)| dist(a, j))
                    .collect()
            };
            let kept: Vec<(usize, usize)> = (neg.iter().copied())
                .filter(|&(a, j)| has_pos(a) || has_pos(j))
                .collect();
            let (hp, hn) = (hist(upper(&pos)), hist(upper(&kept)));
            (0..nodes)
                .map(|b| hn[b] * hp[..=b].iter().sum::<f64>())
                .sum()
        }
        PairLossRef::TupletMargin(c) => {
            let (scale, m) = (f64::from(c.scale), f64::from(c.margin).to_radians());
            mean(
                pos.iter()
                    .map(|&(a, p)| {
                        let cp = (dist(a, p).acos() - m).cos();
                        let sum: f64 = (0..n)
                            .filter(|&k| !same(a, k))
                            .map(|k| (scale * (dist(a, k) - cp)).exp())
                            .sum();
                        (1.0 + sum).ln()
                    })
                    .collect(),
            )
        }
        PairLossRef::IntraPairVariance(c) => {
            let (ep, en) = (f64::from(c.pos_eps), f64::from(c.neg_eps));
            let sims = |pairs: &[(usize, usize)]| -> Vec<f64> {
                pairs.iter().map(|&(a, j)| dist(a, j)).collect()
            };
            let (sp, sn) = (sims(&pos), sims(&neg));
            let (mp, mn) = (mean(sp.clone()), mean(sn.clone()));
            mean(
                sp.iter()
                    .map(|s| ((1.0 - ep) * mp - s).max(0.0).powi(2))
                    .collect(),
            ) + mean(
                sn.iter()
                    .map(|s| (s - (1.0 + en) * mn).max(0.0).powi(2))
                    .collect(),
            )
        }
        PairLossRef::RankedList(c) => {
            let margin = f64::from(c.margin);
            let alpha = c.alpha.map_or(1.0 + margin / 2.0, f64::from);
            let imbalance = f64::from(c.imbalance);
            let side = |a: usize, positive: bool| {
                let (t, edge, sign) = if positive {
                    (f64::from(c.tp), alpha - margin, 1.0)
                } else {
                    (f64::from(c.tn), alpha, -1.0)
                };
                let kept = (0..n).filter(|&j| {
                    let d = dist(a, j);
                    let inside = if positive { d > edge } else { d < edge };
                    j != a && same(a, j) == positive && inside && d > 0.0
                });
                let (mut num, mut den) = (0.0, 1e-5 * n as f64);
                for j in kept {
                    let gap = sign * (dist(a, j) - edge);
                    num += (t * gap).exp() * gap;
                    den += (t * gap).exp();
                }
                num / den
            };
            mean(
                (0..n)
                    .map(|a| (1.0 - imbalance) * side(a, true) + imbalance * side(a, false))
                    .collect(),
            )
        }
        PairLossRef::ThresholdConsistentMargin(c) => {
            let (mp, mn) = (f64::from(c.margin_plus), f64::from(c.margin_minus));
            let p: Vec<f64> = (pos.iter().map(|&(a, j)| dist(a, j)))
                .filter(|&s| s <= mp)
                .map(|s| mp - s)
                .collect();
            let q: Vec<f64> = (neg.iter().map(|&(a, j)| dist(a, j)))
                .filter(|&s| s >= mn)
                .map(|s| s - mn)
                .collect();
            f64::from(c.lambda_plus) * mean(p) + f64::from(c.lambda_minus) * mean(q)
        }
        PairLossRef::Pnp(c) => {
            let (tau, alpha, b) = (f64::from(c.anneal), f64::from(c.alpha), f64::from(c.b));
            let f = |r: f64| match c.variant {
                PnpVariant::O => r,
                PnpVariant::Ds => (1.0 + r).ln(),
                PnpVariant::Dq => (1.0 + r).powf(-alpha),
                PnpVariant::Iu => (1.0 + r) * (1.0 + r).ln(),
                PnpVariant::Ib => (b * r - (1.0 + b * r).ln()) / (b * b),
            };
            let per_anchor: Vec<f64> = (0..n)
                .filter(|&a| (0..n).any(|j| j != a && same(a, j)))
                .map(|a| {
                    let own: Vec<usize> = (0..n).filter(|&j| same(a, j)).collect();
                    own.iter()
                        .map(|&i| {
                            let r: f64 = (0..n)
                                .filter(|&k| !same(a, k))
                                .map(|k| 1.0 / (1.0 + (-(dist(a, k) - dist(a, i)) / tau).exp()))
                                .sum();
                            f(r)
                        })
                        .sum::<f64>()
                        / own.len() as f64
                })
                .collect();
            let m = mean(per_anchor);
            if c.variant == PnpVariant::Dq {
                1.0 - m
            } else {
                m
            }
        }
        PairLossRef::NPairs(_) => {
            // Each label's first row against every label's second row.
            let firsts: Vec<(usize, usize)> = (0..n)
                .filter(|&a| (0..a).all(|j| !same(a, j)))
                .filter_map(|a| ((a + 1)..n).find(|&j| same(a, j)).map(|p| (a, p)))
                .collect();
            mean(
                firsts
                    .iter()
                    .map(|&(a, p)| {
                        let all: f64 = firsts.iter().map(|&(_, q)| dist(a, q).exp()).sum();
                        all.ln() - dist(a, p)
                    })
                    .collect(),
            )
        }
        other => panic!("not a tuple rule: {other:?}"),
    }
}

#[test]
fn gradients_match_finite_differences() {
    let x = noise(9, 5, 7);
    let labels = [0u32, 1, 2, 0, 1, 2, 0, 1, 3];
    let y = Array1::from(labels.to_vec());
    let ctx = Context::native_cpu(None);
    let set = MiningSet::new(&x, &y);
    let rules = [
        PairLossRef::LiftedStructure(LiftedStructure {
            pos_margin: 0.1,
            neg_margin: 1.2,
        }),
        PairLossRef::Histogram(Histogram { n_bins: 7 }),
        PairLossRef::TupletMargin(TupletMargin {
            margin: 5.73,
            scale: 4.0,
        }),
        PairLossRef::IntraPairVariance(IntraPairVariance {
            pos_eps: 0.05,
            neg_eps: 0.1,
        }),
        PairLossRef::RankedList(RankedList {
            margin: 0.4,
            tn: 2.0,
            imbalance: 0.3,
            alpha: None,
            tp: 1.0,
        }),
        PairLossRef::ThresholdConsistentMargin(ThresholdConsistentMargin {
            margin_plus: 0.6,
            margin_minus: -0.1,
            ..Default::default()
        }),
    ];
    let pnp = [
        PnpVariant::O,
        PnpVariant::Ds,
        PnpVariant::Dq,
        PnpVariant::Iu,
        PnpVariant::Ib,
    ]
    .map(|variant| {
        PairLossRef::Pnp(Pnp {
            anneal: 0.3,
            variant,
            ..Default::default()
        })
    });
    for rule in rules
        .into_iter()
        .chain(pnp)
        .chain([PairLossRef::NPairs(NPairs)])
    {
        let p = Problem {
            labels: y.clone(),
            x: x.clone(),
            refs: None,
            rule,
            distance: match rule {
                PairLossRef::LiftedStructure(_) | PairLossRef::RankedList(_) => {
                    DistanceConfig::default()
                }
                _ => COSINE,
            },
            ref_grad: false,
        };
        let got = run(&ctx, &p, &set, None);
        let x64 = x.mapv(f64::from);
        let f = |x: &Array2<f64>| loss_f64(x, &labels, rule);
        let want = f(&x64);
        assert!(want > 0.0, "{rule:?}: a test that cannot fail");
        assert!(
            (want - f64::from(got.loss)).abs() < 1e-5 * want.max(1.0),
            "{rule:?}: {} vs {want}",
            got.loss
        );
        let what = format!("{rule:?}");
        common::assert_finite_differences(&x64, f, &got.query_grad, 2e-3, &what);
    }
}

/// Lifted and Histogram hold their state in the budget: blocks shrink, the answer does not
/// change, the peak stays under the budget, and one byte under the plan's least refuses.
#[test]
fn state_and_blocks_fit_a_small_budget() {
    let x = noise(96, 16, 3);
    let y = Array1::from_shape_fn(96, |i| (i % 6) as u32);
    let set = MiningSet::new(&x, &y);
    fn both<R: PairLossRule>(rule: R, set: &MiningSet<'_, u32>) {
        let cfg = PairLossConfig {
            rule,
            distance: R::default_distance(),
            ..Default::default()
        };
        let whole = pair_loss(&Context::native_cpu(None), set, None, &cfg).expect("loss");
        let plan =
            pair_loss_plan(&Context::native_cpu(Some(400_000)), set, None, &cfg).expect("plan");
        let budget = plan.min_bytes + 4 * 96 * 4;
        let ctx = Context::native_cpu(Some(budget));
        let split = pair_loss(&ctx, set, None, &cfg).expect("loss");
        assert!(ctx.memory().peak_bytes <= budget, "{rule:?}");
        assert!((split.loss - whole.loss).abs() <= 1e-6 * whole.loss.abs().max(1.0));
        for (a, b) in split.query_grad.iter().zip(&whole.query_grad) {
            assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{rule:?}");
        }
        let tight = Context::native_cpu(Some(plan.min_bytes - 1));
        assert!(
            matches!(
                pair_loss(&tight, set, None, &cfg),
                Err(Error::OverBudget { .. })
            ),
            "{rule:?}"
        );
    }
    both(LiftedStructure::default(), &set);
    both(Histogram { n_bins: 4000 }, &set);
    both(IntraPairVariance::default(), &set);
}

#[test]
fn bad_parameters_and_inputs_are_typed_errors() {
    let ctx = Context::native_cpu(None);
    let x = noise(4, 3, 9);
    let labels = ndarray::array![0u32, 0, 1, 1];
    let set = MiningSet::new(&x, &labels);
    let bad = |r: Result<PairLoss, Error>| matches!(r, Err(Error::InvalidParameter { .. }));
    let euclid = DistanceConfig::default();
    for n_bins in [0, 65_537] {
        let h = PairLossConfig {
            rule: Histogram { n_bins },
            ..Default::default()
        };
        assert!(bad(pair_loss(&ctx, &set, None, &h)), "n_bins {n_bins}");
    }
    let h = PairLossConfig::<Histogram>::default();
    assert!(bad(pair_loss(&ctx, &set, Some(&set), &h)), "refs");
    let pnp = PairLossConfig::<Pnp>::default();
    assert!(bad(pair_loss(&ctx, &set, Some(&set), &pnp)), "refs");
    for anneal in [0.0, -1.0, f32::NAN] {
        let pnp = PairLossConfig {
            rule: Pnp {
                anneal,
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(bad(pair_loss(&ctx, &set, None, &pnp)), "anneal {anneal}");
    }
    assert!(bad(pair_loss(
        &ctx,
        &set,
        None,
        &PairLossConfig::<Histogram> {
            distance: euclid,
            ..Default::default()
        }
    )));
    assert!(bad(pair_loss(
        &ctx,
        &set,
        None,
        &PairLossConfig::<TupletMargin> {
            distance: euclid,
            ..Default::default()
        }
    )));
    assert!(bad(pair_loss(
        &ctx,
        &set,
        None,
        &PairLossConfig::<ThresholdConsistentMargin> {
            distance: euclid,
            ..Default::default()
        }
    )));
    for imbalance in [-0.1, 1.1, f32::NAN] {
        let r = PairLossConfig {
            rule: RankedList {
                imbalance,
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(
            bad(pair_loss(&ctx, &set, None, &r)),
            "imbalance {imbalance}"
        );
    }
    let t = PairLossConfig {
        rule: TupletMargin {
            scale: 0.0,
            ..Default::default()
        },
        ..Default::default()
    };
    assert!(bad(pair_loss(&ctx, &set, None, &t)), "scale 0");
}

/// NPairs gathers its pairs' rows; under a budget its plan allows but the gathered rows do
/// not fit (every label in a pair), it runs the whole batch: the same answer, the peak under
/// the budget.
#[test]
fn n_pairs_fits_the_budget_its_plan_gives() {
    let x = noise(64, 32, 5);
    let y = Array1::from_shape_fn(64, |i| (i / 2) as u32);
    let set = MiningSet::new(&x, &y);
    let cfg = PairLossConfig::<NPairs>::default();
    let whole = pair_loss(&Context::native_cpu(None), &set, None, &cfg).expect("loss");
    assert_eq!(whole.nonzero, 32);
    let plan = pair_loss_plan(&Context::native_cpu(None), &set, None, &cfg).expect("plan");
    let ctx = Context::native_cpu(Some(plan.min_bytes));
    let tight = pair_loss(&ctx, &set, None, &cfg).expect("loss within the plan's least");
    assert!(ctx.memory().peak_bytes <= plan.min_bytes);
    assert!((tight.loss - whole.loss).abs() <= 1e-6 * whole.loss.abs().max(1.0));
    for (a, b) in tight.query_grad.iter().zip(&whole.query_grad) {
        assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()));
    }
}
