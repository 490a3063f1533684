//! The pair and per-anchor miners on the GPU path and the native path, each against a
//! brute-force emulation of PML's own formulation (masked full matrices, per-row argmin /
//! argmax) over the distance matrix the same path computes.

use crate::common;
use crate::common::DISTANCES;

use ndarray::{Array1, Array2};
use proptest::prelude::*;
use proptest::strategy::Strategy as _;
use wgpu_metric_learning::{
    all_pairs, batch_easy_hard_pairs, batch_hard_triplets, multi_similarity_pairs,
    pair_margin_pairs, pairwise_distances, AllPairsConfig, BatchEasyHardConfig, BatchHardConfig,
    Context, Distance, DistanceConfig, Error, MiningSet, MultiSimilarityConfig, PairMarginConfig,
    PairwiseConfig, SelfExclusion, Strategy,
};

#[derive(Debug, Clone)]
struct Case {
    labels: Array1<u32>,
    emb: Array2<f32>,
    distance: DistanceConfig,
}

impl Case {
    fn set(&self) -> MiningSet<'_, u32> {
        MiningSet::new(self.emb.view(), self.labels.view())
    }

    /// (distances, is_positive, is_negative) over (b, b), self excluded as in PML.
    fn matrices(&self, ctx: &Context) -> (Array2<f32>, Array2<bool>, Array2<bool>) {
        let d = pairwise_distances(
            ctx,
            self.emb.view(),
            self.emb.view(),
            &PairwiseConfig {
                distance: self.distance,
                ..Default::default()
            },
        )
        .expect("distances")
        .values;
        let b = self.labels.len();
        let pos =
            Array2::from_shape_fn((b, b), |(i, j)| i != j && self.labels[i] == self.labels[j]);
        let neg = Array2::from_shape_fn((b, b), |(i, j)| self.labels[i] != self.labels[j]);
        (d, pos, neg)
    }
}

fn flat(rows: &[[u32; 2]]) -> Array2<u32> {
    Array2::from_shape_fn((rows.len(), 2), |(i, j)| rows[i][j])
}

/// PML's `get_x_per_row`: candidates masked by range and semihard threshold, then the first
/// arg-min / arg-max of each row, or None when the row has no candidate.
fn x_per_row(
    d: &Array2<f32>,
    cand: &Array2<bool>,
    max: bool,
    range: Option<(f32, f32)>,
    thresholds: Option<&[Option<f32>]>,
) -> Vec<Option<(u32, f32)>> {
    (0..d.nrows())
        .map(|i| {
            let ok = |j: usize| {
                let v = d[[i, j]];
                let in_range = range.is_none_or(|(lo, hi)| v >= lo && v <= hi);
                let semihard = match thresholds.map(|t| t[i]) {
                    Some(Some(t)) => {
                        if max {
                            v < t
                        } else {
                            v > t
                        }
                    }
                    _ => true,
                };
                cand[[i, j]] && in_range && semihard
            };
            let mut best: Option<(u32, f32)> = None;
            for j in (0..d.ncols()).filter(|&j| ok(j)) {
                let v = d[[i, j]];
                if best.is_none_or(|(_, b)| if max { v > b } else { v < b }) {
                    best = Some((j as u32, v));
                }
            }
            best
        })
        .collect()
}

/// PML `BatchEasyHardMiner.mine`, written as PML writes it.
fn easy_hard_emulated(
    ctx: &Context,
    c: &Case,
    cfg: &BatchEasyHardConfig,
) -> (Array2<u32>, Array2<u32>) {
    let (d, pos, neg) = c.matrices(ctx);
    let inverted = c.distance.distance.is_similarity();
    // get_mine_function: hard/semihard → max (min if inverted), easy → min (max if inverted).
    let is_max = |s: Strategy| match s {
        Strategy::Hard | Strategy::Semihard => !inverted,
        _ => inverted,
    };
    let neg_fn = |s: Strategy| {
        if matches!(s, Strategy::Hard | Strategy::Semihard) {
            Strategy::Easy
        } else {
            Strategy::Hard
        }
    };
    let get_pos = |thr: Option<&[Option<f32>]>| {
        x_per_row(
            &d,
            &pos,
            is_max(cfg.pos_strategy),
            cfg.allowed_pos_range,
            thr,
        )
    };
    let get_neg = |thr: Option<&[Option<f32>]>| {
        x_per_row(
            &d,
            &neg,
            is_max(neg_fn(cfg.neg_strategy)),
            cfg.allowed_neg_range,
            thr,
        )
    };
    let values = |v: &[Option<(u32, f32)>]| v.iter().map(|x| x.map(|(_, d)| d)).collect::<Vec<_>>();
    let all_pos: Vec<[u32; 2]> = pos
        .indexed_iter()
        .filter(|(_, &b)| b)
        .map(|((i, j), _)| [i as u32, j as u32])
        .collect();
    let all_neg: Vec<[u32; 2]> = neg
        .indexed_iter()
        .filter(|(_, &b)| b)
        .map(|((i, j), _)| [i as u32, j as u32])
        .collect();
    let (ps, ns) = (cfg.pos_strategy, cfg.neg_strategy);
    let (p, n) = if ps == Strategy::Semihard && ns != Strategy::All {
        let n = get_neg(None);
        (get_pos(Some(&values(&n))), n)
    } else if ns == Strategy::Semihard && ps != Strategy::All {
        let p = get_pos(None);
        let n = get_neg(Some(&values(&p)));
        (p, n)
    } else {
        (get_pos(None), get_neg(None))
    };
    let rows = |v: &[Option<(u32, f32)>]| -> Vec<[u32; 2]> {
        v.iter()
            .enumerate()
            .filter_map(|(a, x)| x.map(|(j, _)| [a as u32, j]))
            .collect()
    };
    match (ps == Strategy::All, ns == Strategy::All) {
        (true, true) => (flat(&all_pos), flat(&all_neg)),
        (true, false) => (flat(&all_pos), flat(&rows(&n))),
        (false, true) => (flat(&rows(&p)), flat(&all_neg)),
        (false, false) => {
            let keep: Vec<usize> = (0..p.len())
                .filter(|&a| p[a].is_some() && n[a].is_some())
                .collect();
            let pick = |v: &[Option<(u32, f32)>]| -> Vec<[u32; 2]> {
                keep.iter()
                    .filter_map(|&a| v[a].map(|(j, _)| [a as u32, j]))
                    .collect()
            };
            (flat(&pick(&p)), flat(&pick(&n)))
        }
    }
}

/// PML `MultiSimilarityMiner.mine` with a stable sort.
fn multi_similarity_emulated(ctx: &Context, c: &Case, eps: f32) -> (Array2<u32>, Array2<u32>) {
    let (d, pos, neg) = c.matrices(ctx);
    let inv = c.distance.distance.is_similarity();
    if !pos.iter().any(|&x| x) || !neg.iter().any(|&x| x) {
        return (Array2::zeros((0, 2)), Array2::zeros((0, 2)));
    }
    let (mut kp, mut kn) = (Vec::new(), Vec::new());
    for a in 0..d.nrows() {
        let sorted = |mask: &Array2<bool>| {
            let mut idx: Vec<usize> = (0..d.ncols()).filter(|&j| mask[[a, j]]).collect();
            idx.sort_by(|&x, &y| d[[a, x]].total_cmp(&d[[a, y]]));
            idx
        };
        let (ps, ns) = (sorted(&pos), sorted(&neg));
        if ps.is_empty() || ns.is_empty() {
            continue;
        }
        let v = |j: usize| d[[a, j]];
        for &p in &ps {
            if (inv && v(p) - eps < v(ns[ns.len() - 1])) || (!inv && v(p) + eps > v(ns[0])) {
                kp.push([a as u32, p as u32]);
            }
        }
        for &n in &ns {
            if (inv && v(n) + eps > v(ps[0])) || (!inv && v(n) - eps < v(ps[ps.len() - 1])) {
                kn.push([a as u32, n as u32]);
            }
        }
    }
    (flat(&kp), flat(&kn))
}

const STRATEGIES: [Strategy; 4] = [
    Strategy::Hard,
    Strategy::Semihard,
    Strategy::Easy,
    Strategy::All,
];

fn case() -> impl proptest::strategy::Strategy<Value = Case> {
    (
        0usize..20,
        1usize..5,
        prop_oneof![Just(1u32), 2u32..5, Just(40)],
        0usize..4,
        any::<bool>(),
    )
        .prop_flat_map(|(b, d, classes, which, normalize)| {
            (
                proptest::collection::vec(0..classes, b),
                proptest::collection::vec(-2i8..=2, b * d),
                Just((
                    b,
                    d,
                    DistanceConfig {
                        distance: DISTANCES[which],
                        normalize,
                    },
                )),
            )
        })
        .prop_map(|(labels, values, (b, d, distance))| Case {
            labels: Array1::from(labels),
            emb: Array2::from_shape_vec((b, d), values.into_iter().map(f32::from).collect())
                .expect("sized"),
            distance,
        })
}

fn strategies() -> impl proptest::strategy::Strategy<Value = (Strategy, Strategy)> {
    (0usize..4, 0usize..4)
        .prop_map(|(p, n)| (STRATEGIES[p], STRATEGIES[n]))
        .prop_filter("PML rejects these combinations", |(p, n)| {
            let semi = |s: &Strategy| *s == Strategy::Semihard;
            let all = |s: &Strategy| *s == Strategy::All;
            let rejected = (semi(p) && (semi(n) || all(n))) || (all(p) && semi(n));
            !rejected
        })
}

/// An allowed value range `[lo, hi]`, or none.
type Range = Option<(f32, f32)>;

fn range() -> impl proptest::strategy::Strategy<Value = Range> {
    prop_oneof![
        Just(None),
        (-1.0f32..1.0, 0.0f32..3.0).prop_map(|(lo, w)| Some((lo, lo + w)))
    ]
}

fn check_all(
    ctx: &Context,
    c: &Case,
    (ps, ns): (Strategy, Strategy),
    ranges: (Range, Range),
    margins: (f32, f32),
    eps: f32,
) {
    let cfg = BatchEasyHardConfig {
        pos_strategy: ps,
        neg_strategy: ns,
        allowed_pos_range: ranges.0,
        allowed_neg_range: ranges.1,
        distance: c.distance,
        self_exclusion: SelfExclusion::Auto,
        ..Default::default()
    };
    let got = batch_easy_hard_pairs(ctx, &c.set(), None, &cfg).expect("easy-hard");
    let (wp, wn) = easy_hard_emulated(ctx, c, &cfg);
    assert_eq!(
        (&got.positives, &got.negatives),
        (&wp, &wn),
        "BatchEasyHard {ps:?}/{ns:?} {ranges:?}"
    );

    let hard = batch_hard_triplets(
        ctx,
        &c.set(),
        None,
        &BatchHardConfig {
            distance: c.distance,
            ..Default::default()
        },
    )
    .expect("batch hard");
    let (hp, hn) = easy_hard_emulated(
        ctx,
        c,
        &BatchEasyHardConfig {
            pos_strategy: Strategy::Hard,
            neg_strategy: Strategy::Hard,
            allowed_pos_range: None,
            allowed_neg_range: None,
            ..cfg.clone()
        },
    );
    assert_eq!(hard.anchors(), hp.column(0), "BatchHard anchors");
    assert_eq!(hard.positives(), hp.column(1), "BatchHard positives");
    assert_eq!(hard.negatives(), hn.column(1), "BatchHard negatives");

    let ms = multi_similarity_pairs(
        ctx,
        &c.set(),
        None,
        &MultiSimilarityConfig {
            epsilon: eps,
            distance: c.distance,
            ..Default::default()
        },
    )
    .expect("multi-similarity");
    let (mp, mn) = multi_similarity_emulated(ctx, c, eps);
    assert_eq!(
        (&ms.positives, &ms.negatives),
        (&mp, &mn),
        "MultiSimilarity eps {eps}"
    );

    let (d, pos, neg) = c.matrices(ctx);
    let inv = c.distance.distance.is_similarity();
    let pm = pair_margin_pairs(
        ctx,
        &c.set(),
        None,
        &PairMarginConfig {
            pos_margin: margins.0,
            neg_margin: margins.1,
            distance: c.distance,
            ..Default::default()
        },
    )
    .expect("pair margin");
    let sel = |mask: &Array2<bool>, keep: &dyn Fn(f32) -> bool| -> Array2<u32> {
        let rows: Vec<[u32; 2]> = mask
            .indexed_iter()
            .filter(|&((i, j), &m)| m && keep(d[[i, j]]))
            .map(|((i, j), _)| [i as u32, j as u32])
            .collect();
        flat(&rows)
    };
    let wp = sel(&pos, &|v| if inv { v < margins.0 } else { v > margins.0 });
    let wn = sel(&neg, &|v| if inv { v > margins.1 } else { v < margins.1 });
    assert_eq!(
        (&pm.positives, &pm.negatives),
        (&wp, &wn),
        "PairMargin {margins:?}"
    );

    let ap = all_pairs(
        ctx,
        &MiningSet::from_labels(c.labels.view()),
        None,
        &AllPairsConfig {
            self_exclusion: SelfExclusion::Auto,
            ..Default::default()
        },
    )
    .expect("all pairs");
    assert_eq!(
        (&ap.positives, &ap.negatives),
        (&sel(&pos, &|_| true), &sel(&neg, &|_| true)),
        "all pairs"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(32)))]

    #[test]
    fn miners_gpu_match_pml_emulation(c in case(), s in strategies(), r in (range(), range()), m in (-0.5f32..2.0, -0.5f32..2.0), eps in 0.0f32..0.5) {
        if let Some(ctx) = common::shared_gpu() {
            check_all(ctx, &c, s, r, m, eps);
        }
    }

    #[test]
    fn miners_native_cpu_match_pml_emulation(c in case(), s in strategies(), r in (range(), range()), m in (-0.5f32..2.0, -0.5f32..2.0), eps in 0.0f32..0.5) {
        check_all(&Context::native_cpu(None), &c, s, r, m, eps);
    }
}

#[test]
fn batch_hard_matches_pml_test_vectors_on_every_path() {
    // tests/miners/test_batch_hard_miner.py: labels and 1-D embeddings 0..8, unnormalised L2.
    let labels = Array1::from(vec![0u32, 0, 1, 1, 0, 2, 1, 1, 1]);
    let x = Array2::from_shape_fn((9, 1), |(i, _)| i as f32);
    let cfg = BatchHardConfig {
        distance: DistanceConfig {
            distance: Distance::Euclidean,
            normalize: false,
        },
        ..Default::default()
    };
    for ctx in [Some(Context::native_cpu(None)), common::gpu_context(None)]
        .into_iter()
        .flatten()
    {
        let t = batch_hard_triplets(&ctx, &MiningSet::new(&x, &labels), None, &cfg).expect("mine");
        assert_eq!(
            t.anchors().to_vec(),
            vec![0, 1, 2, 3, 4, 6, 7, 8],
            "anchors on {}",
            ctx.device_name()
        );
        assert_eq!(
            t.positives().to_vec(),
            vec![4, 4, 8, 8, 0, 2, 2, 2],
            "positives"
        );
        // PML accepts 3 or 5 for anchor 4 (a tie); the lowest index wins here.
        assert_eq!(
            t.negatives().to_vec(),
            vec![2, 2, 1, 4, 3, 5, 5, 5],
            "negatives"
        );
    }
}

#[test]
fn miners_reject_bad_parameters() {
    let ctx = Context::native_cpu(None);
    let labels = Array1::from(vec![0u32, 1]);
    let x = Array2::<f32>::zeros((2, 2));
    let set = MiningSet::new(&x, &labels);
    for (p, n) in [
        (Strategy::Semihard, Strategy::Semihard),
        (Strategy::Semihard, Strategy::All),
        (Strategy::All, Strategy::Semihard),
    ] {
        let cfg = BatchEasyHardConfig {
            pos_strategy: p,
            neg_strategy: n,
            ..Default::default()
        };
        assert!(
            matches!(
                batch_easy_hard_pairs(&ctx, &set, None, &cfg),
                Err(Error::InvalidParameter {
                    what: "strategies",
                    ..
                })
            ),
            "{p:?}/{n:?}"
        );
    }
    let cfg = BatchEasyHardConfig {
        allowed_pos_range: Some((1.0, 0.0)),
        ..Default::default()
    };
    assert!(
        matches!(
            batch_easy_hard_pairs(&ctx, &set, None, &cfg),
            Err(Error::InvalidParameter {
                what: "allowed_pos_range",
                ..
            })
        ),
        "lo > hi"
    );
    let cfg = MultiSimilarityConfig {
        epsilon: f32::NAN,
        ..Default::default()
    };
    assert!(
        matches!(
            multi_similarity_pairs(&ctx, &set, None, &cfg),
            Err(Error::InvalidParameter {
                what: "epsilon",
                ..
            })
        ),
        "NaN epsilon"
    );
    let cfg = PairMarginConfig {
        neg_margin: f32::INFINITY,
        ..Default::default()
    };
    assert!(
        matches!(
            pair_margin_pairs(&ctx, &set, None, &cfg),
            Err(Error::InvalidParameter {
                what: "neg_margin",
                ..
            })
        ),
        "inf margin"
    );
    assert!(
        matches!(
            pair_margin_pairs(
                &ctx,
                &MiningSet::from_labels(&labels),
                None,
                &PairMarginConfig::default()
            ),
            Err(Error::InvalidParameter {
                what: "queries",
                ..
            })
        ),
        "distance miners need embeddings"
    );
}
