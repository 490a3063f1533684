//! Pairs mined straight into device arrays (`mine_on_device`: the distance tile, then
//! `pair_select` counting and writing): the rows of the host pair miners and of
//! `reference::pair_select`, in their order, for every pair miner and strategy, every
//! distance, margins exactly on a value (ties), rows past a workgroup's width, bank and
//! device-buffer references, several anchor chunks; no pair read back; the arrays counted in
//! the budget; typed errors.

use crate::common;
use crate::common::DISTANCES;

use ndarray::{s, Array1, Array2};
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use wgpu_metric_learning::reference::pair_select::pair_select;
use wgpu_metric_learning::{
    all_pairs, batch_easy_hard_pairs, mine_on_device, multi_similarity_pairs, pair_margin_pairs,
    pairwise_distances, AllPairsConfig, BatchEasyHardConfig, Context, DeviceEmbeddings,
    DistanceConfig, Error, Hooks, MiningSet, MultiSimilarityConfig, PairMarginConfig,
    PairMinerConfig, Pairs, PairwiseConfig, Progress, Strategy,
};

use common::grid_data as data;

const STRATEGIES: [Strategy; 4] = [
    Strategy::Hard,
    Strategy::Semihard,
    Strategy::Easy,
    Strategy::All,
];

/// One of the pair miners' configs.
enum Miner {
    All(AllPairsConfig),
    Margin(PairMarginConfig),
    Multi(MultiSimilarityConfig),
    EasyHard(BatchEasyHardConfig),
}

impl Miner {
    fn distance(&self) -> Option<DistanceConfig> {
        match self {
            Miner::All(_) => None,
            Miner::Margin(c) => Some(c.distance),
            Miner::Multi(c) => Some(c.distance),
            Miner::EasyHard(c) => Some(c.distance),
        }
    }

    fn on_device(
        &self,
        ctx: &Context,
        q: &MiningSet<'_, u32>,
        r: Option<&MiningSet<'_, u32>>,
    ) -> wgpu_metric_learning::Result<wgpu_metric_learning::PairsOnDevice> {
        match self {
            Miner::All(c) => mine_on_device(ctx, q, r, c),
            Miner::Margin(c) => mine_on_device(ctx, q, r, c),
            Miner::Multi(c) => mine_on_device(ctx, q, r, c),
            Miner::EasyHard(c) => mine_on_device(ctx, q, r, c),
        }
    }

    fn on_host(
        &self,
        ctx: &Context,
        q: &MiningSet<'_, u32>,
        r: Option<&MiningSet<'_, u32>>,
    ) -> Pairs {
        match self {
            Miner::All(c) => all_pairs(ctx, q, r, c),
            Miner::Margin(c) => pair_margin_pairs(ctx, q, r, c),
            Miner::Multi(c) => multi_similarity_pairs(ctx, q, r, c),
            Miner::EasyHard(c) => batch_easy_hard_pairs(ctx, q, r, c),
        }
        .expect("host miner")
    }

    fn rule(&self) -> wgpu_metric_learning::PairRule {
        match self {
            Miner::All(c) => c.rule(),
            Miner::Margin(c) => c.rule(),
            Miner::Multi(c) => c.rule(),
            Miner::EasyHard(c) => c.rule(),
        }
    }
}

/// The device rows equal the host miner's on `ctx` and the reference's over `ctx`'s
/// distances, and only counts came back.
fn check(
    ctx: &Context,
    (q, qy): (&Array2<f32>, &Array1<u32>),
    refs: Option<(&Array2<f32>, &Array1<u32>)>,
    miner: &Miner,
) -> (usize, usize) {
    let queries = MiningSet::new(q, qy);
    let ref_set = refs.map(|(r, ry)| MiningSet::new(r, ry));
    let got = miner
        .on_device(ctx, &queries, ref_set.as_ref())
        .expect("on device");
    let positives = got.positives.to_host(ctx).expect("positives");
    let negatives = got.negatives.to_host(ctx).expect("negatives");
    let host = miner.on_host(ctx, &queries, ref_set.as_ref());
    assert_eq!(positives, host.positives, "positives of {:?}", miner.rule());
    assert_eq!(negatives, host.negatives, "negatives of {:?}", miner.rule());

    let (r, ry) = refs.unwrap_or((q, qy));
    let self_slots: Vec<u32> = match refs {
        None => (0..q.nrows() as u32).collect(),
        Some(_) => vec![u32::MAX; q.nrows()],
    };
    let distance = miner.distance();
    let values = distance.map(|d| {
        let cfg = PairwiseConfig {
            distance: d,
            ..Default::default()
        };
        pairwise_distances(ctx, q, r, &cfg)
            .expect("distances")
            .values
    });
    let similarity = distance.is_some_and(|d| d.distance.is_similarity());
    let (want_pos, want_neg) = pair_select(
        qy.as_slice().expect("dense"),
        ry.as_slice().expect("dense"),
        &self_slots,
        values.as_ref().map(|v| v.view()),
        &miner.rule(),
        similarity,
    );
    assert_eq!(
        positives,
        want_pos,
        "reference positives of {:?}",
        miner.rule()
    );
    assert_eq!(
        negatives,
        want_neg,
        "reference negatives of {:?}",
        miner.rule()
    );
    // 8 bytes of counts per anchor come back, and nothing else.
    assert_eq!(
        got.transfers.bytes_down,
        8 * q.nrows() as u64,
        "{:?}",
        got.transfers
    );
    (positives.nrows(), negatives.nrows())
}

/// A miner of kind `kind` on `distance`, its thresholds taken from `values` (so that some
/// values lie exactly on them).
fn miner(kind: usize, distance: DistanceConfig, pick: [usize; 4], values: &[f32]) -> Miner {
    let at = |i: usize| values[i % values.len()];
    match kind {
        0 => Miner::All(AllPairsConfig::default()),
        1 => Miner::Margin(PairMarginConfig {
            pos_margin: at(pick[0]),
            neg_margin: at(pick[1]),
            distance,
            ..Default::default()
        }),
        2 => Miner::Multi(MultiSimilarityConfig {
            epsilon: [0.0, 0.1, 0.5, 2.0][pick[0] % 4],
            distance,
            ..Default::default()
        }),
        _ => {
            let (mut ps, mut ns) = (STRATEGIES[pick[0] % 4], STRATEGIES[pick[1] % 4]);
            if ps == Strategy::Semihard && ns != Strategy::Hard && ns != Strategy::Easy {
                ns = Strategy::Hard;
            }
            if ns == Strategy::Semihard && ps == Strategy::All {
                ps = Strategy::Easy;
            }
            let range = |i: usize| {
                i.is_multiple_of(3).then(|| {
                    let (a, b) = (at(i), at(i / 3 + 1));
                    (a.min(b), a.max(b))
                })
            };
            Miner::EasyHard(BatchEasyHardConfig {
                pos_strategy: ps,
                neg_strategy: ns,
                allowed_pos_range: range(pick[2]),
                allowed_neg_range: range(pick[3]),
                distance,
                ..Default::default()
            })
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(16)))]
    #[test]
    fn equals_the_host_miners_and_the_reference(
        b in 1usize..40,
        m in 1usize..600,
        d in 1usize..10,
        classes in 1usize..6,
        kind in 0usize..4,
        metric in 0usize..4,
        normalize: bool,
        pick: [usize; 4],
        separate: bool,
        seed: u64,
    ) {
        let Some(ctx) = common::shared_gpu() else { return Ok(()) };
        let (q, qy) = data(b, d, classes, seed);
        let (r, ry) = data(m, d, classes, seed ^ 7);
        let distance = DistanceConfig { distance: DISTANCES[metric], normalize };
        let refs = if separate { &r } else { &q };
        let values = pairwise_distances(ctx, &q, refs, &PairwiseConfig { distance, ..Default::default() })
            .expect("distances")
            .values;
        let values: Vec<f32> = values.iter().copied().collect();
        let miner = miner(kind, distance, pick, &values);
        if separate {
            check(ctx, (&q, &qy), Some((&r, &ry)), &miner);
        } else {
            check(ctx, (&q, &qy), None, &miner);
        }
    }
}

#[test]
fn every_strategy_pair_on_rows_wider_than_a_workgroup() {
    let Some(ctx) = common::shared_gpu() else {
        return;
    };
    let (x, y) = data(700, 5, 4, 21);
    let (q, qy) = (
        x.slice(s![..30, ..]).to_owned(),
        y.slice(s![..30]).to_owned(),
    );
    let distance = DistanceConfig::default();
    for ps in STRATEGIES {
        for ns in STRATEGIES {
            let cfg = BatchEasyHardConfig {
                pos_strategy: ps,
                neg_strategy: ns,
                distance,
                ..Default::default()
            };
            let miner = Miner::EasyHard(cfg.clone());
            let refs = Some((&x, &y));
            let valid = !matches!(
                (ps, ns),
                (Strategy::Semihard, Strategy::Semihard | Strategy::All)
                    | (Strategy::All, Strategy::Semihard)
            );
            if valid {
                check(ctx, (&q, &qy), refs, &miner);
            } else {
                let got = mine_on_device(ctx, &MiningSet::new(&q, &qy), None, &cfg);
                assert!(
                    matches!(
                        got,
                        Err(Error::InvalidParameter {
                            what: "strategies",
                            ..
                        })
                    ),
                    "{got:?}"
                );
            }
        }
    }
    for distance in DISTANCES {
        let cfg = MultiSimilarityConfig {
            distance: DistanceConfig {
                distance,
                normalize: false,
            },
            ..Default::default()
        };
        let (pos, neg) = check(ctx, (&q, &qy), Some((&x, &y)), &Miner::Multi(cfg));
        assert!(pos + neg > 0, "{distance:?} keeps something");
    }
    let (pos, neg) = check(ctx, (&x, &y), None, &Miner::All(AllPairsConfig::default()));
    assert_eq!(pos + neg, 700 * 699, "every ordered pair but the diagonal");
}

#[test]
fn several_chunks_under_a_tight_budget() {
    let Some(shared) = common::shared_gpu() else {
        return;
    };
    let (x, y) = data(400, 16, 6, 22);
    let set = MiningSet::new(&x, &y);
    let cfg = PairMarginConfig {
        pos_margin: 0.5,
        neg_margin: 1.0,
        ..Default::default()
    };
    let host = pair_margin_pairs(shared, &set, None, &cfg).expect("host");
    let arrays = 8 * (host.positives.nrows() + host.negatives.nrows()) as u64;
    let Some(ctx) = common::gpu_context(Some(arrays + (400 << 10))) else {
        return;
    };
    let reports = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&reports);
    let cfg = PairMarginConfig {
        hooks: Hooks::new().on_progress(move |p: Progress| {
            seen.lock().expect("lock").push((p.done, p.total));
        }),
        ..cfg
    };
    ctx.reset_peak();
    let mined = mine_on_device(&ctx, &set, None, &cfg).expect("on device");
    let memory = ctx.memory();
    assert!(memory.peak_bytes <= memory.budget_bytes, "{memory:?}");
    let done = reports.lock().expect("lock").clone();
    let counting = done.iter().filter(|&&(d, _)| d <= 400 * 400).count();
    assert!(counting > 1, "several anchor chunks: {done:?}");
    assert_eq!(
        done.last(),
        Some(&(2 * 400 * 400, 2 * 400 * 400)),
        "both passes"
    );
    assert_eq!(mined.positives.to_host(&ctx).expect("read"), host.positives);
    assert_eq!(mined.negatives.to_host(&ctx).expect("read"), host.negatives);
}

#[test]
fn bank_and_device_buffer_references() {
    let Some(ctx) = common::shared_gpu() else {
        return;
    };
    let (x, y) = data(300, 12, 4, 23);
    let (q, qy) = (
        x.slice(s![..50, ..]).to_owned(),
        y.slice(s![..50]).to_owned(),
    );
    let bank = common::wrapped_bank(ctx, &x, &y);
    let queries = MiningSet::new(&q, &qy);
    let cfg = MultiSimilarityConfig::default();
    let got = mine_on_device(ctx, &queries, Some(&bank.refs()), &cfg).expect("bank");
    let host = multi_similarity_pairs(ctx, &queries, Some(&bank.refs()), &cfg).expect("host");
    assert_eq!(got.positives.to_host(ctx).expect("read"), host.positives);
    assert_eq!(got.negatives.to_host(ctx).expect("read"), host.negatives);

    let buffer = common::upload(ctx, &x, 0, 12);
    let rows = DeviceEmbeddings::new(&buffer, 0, (300, 12));
    let refs = MiningSet::new(rows, &y);
    let cfg = BatchEasyHardConfig::default();
    let got = mine_on_device(ctx, &queries, Some(&refs), &cfg).expect("device refs");
    let want =
        batch_easy_hard_pairs(ctx, &queries, Some(&MiningSet::new(&x, &y)), &cfg).expect("host");
    assert_eq!(got.positives.to_host(ctx).expect("read"), want.positives);
    assert_eq!(got.negatives.to_host(ctx).expect("read"), want.negatives);
}

#[test]
fn the_arrays_count_in_the_budget_and_nothing_kept_is_an_empty_array() {
    let Some(ctx) = common::gpu_context_as_shipped(Some(64 << 20)) else {
        return;
    };
    let (x, y) = data(100, 8, 3, 24);
    let set = MiningSet::new(&x, &y);
    let before = ctx.memory().current_bytes;
    let mined = mine_on_device(&ctx, &set, None, &PairMarginConfig::default()).expect("mined");
    let (pos, neg) = (mined.positives.dim().0, mined.negatives.dim().0);
    assert!(pos > 0 && neg > 0);
    assert_eq!(
        ctx.memory().current_bytes - before,
        mined.positives.bytes() + mined.negatives.bytes(),
        "only the arrays are held"
    );
    drop(mined);
    assert_eq!(ctx.memory().current_bytes, before);

    // One class: no negative; with multi-similarity, nothing at all.
    let one = Array1::<u32>::zeros(100);
    let set = MiningSet::new(&x, &one);
    let none = mine_on_device(&ctx, &set, None, &PairMarginConfig::default()).expect("one class");
    assert_eq!(none.negatives.to_host(&ctx).expect("read").dim(), (0, 2));
    let none =
        mine_on_device(&ctx, &set, None, &MultiSimilarityConfig::default()).expect("one class");
    assert_eq!(none.positives.dim(), (0, 2));
    assert_eq!(none.negatives.dim(), (0, 2));
    // No reference at all.
    let empty = (Array2::<f32>::zeros((0, 8)), Array1::<u32>::zeros(0));
    let refs = MiningSet::new(&empty.0, &empty.1);
    let got = mine_on_device(&ctx, &set, Some(&refs), &PairMarginConfig::default())
        .expect("no reference");
    assert_eq!((got.positives.dim(), got.negatives.dim()), ((0, 2), (0, 2)));
}

#[test]
fn bad_calls_are_typed_errors() {
    let (x, y) = data(10, 4, 2, 25);
    let set = MiningSet::new(&x, &y);
    let got = mine_on_device(
        &Context::native_cpu(None),
        &set,
        None,
        &PairMarginConfig::default(),
    );
    assert!(
        matches!(got, Err(Error::InvalidParameter { what: "ctx", .. })),
        "{got:?}"
    );
    let Some(ctx) = common::shared_gpu() else {
        return;
    };
    let cfg = PairMarginConfig {
        pos_margin: f32::NAN,
        ..Default::default()
    };
    let got = mine_on_device(ctx, &set, None, &cfg);
    assert!(
        matches!(
            got,
            Err(Error::InvalidParameter {
                what: "pos_margin",
                ..
            })
        ),
        "{got:?}"
    );
    let labels_only = MiningSet::<u32>::from_labels(&y);
    let got = mine_on_device(ctx, &labels_only, None, &PairMarginConfig::default());
    assert!(
        matches!(got, Err(Error::InvalidParameter { .. })),
        "{got:?}"
    );
    // Labels alone are enough for every pair.
    let got =
        mine_on_device(ctx, &labels_only, None, &AllPairsConfig::default()).expect("labels only");
    let host = all_pairs(ctx, &labels_only, None, &AllPairsConfig::default()).expect("host");
    assert_eq!(got.positives.to_host(ctx).expect("read"), host.positives);
    assert_eq!(got.negatives.to_host(ctx).expect("read"), host.negatives);
}
