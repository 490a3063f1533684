//! The bad-input table of `RELIABILITY.md`, row by row (ids match), on the native path and on
//! the wgpu path: each bad input gets its typed error, before any work, and the context stays
//! usable. Then a property test feeds random inputs with random defects to every operation:
//! a clean input must give the native path's answer, a defective one its typed error, and
//! nothing may panic. Non-contiguous and transposed views are accepted and give the answer of
//! their contiguous copies.

use crate::common;

use ndarray::{array, Array1, Array2, ShapeBuilder};
use proptest::prelude::*;
use wgpu_metric_learning::{
    accuracy, all_pairs, batch_easy_hard_pairs, batch_hard_triplets, count_triplets, knn,
    knn_sharded, mine_triplets, multi_similarity_pairs, pair_margin_pairs, pairwise_distances,
    AccuracyConfig, AccuracyK, AdapterSelector, AllPairsConfig, BackendChoice, BankConfig,
    BatchEasyHardConfig, BatchHardConfig, Context, ContextConfig, DistanceConfig, Error, KnnConfig,
    MemoryBank, MiningSet, MultiSimilarityConfig, PairMarginConfig, PairwiseConfig, SelfExclusion,
    Strategy as Pick, TripletConfig, TripletType,
};

type Check = fn(&Error) -> bool;

fn shape(e: &Error) -> bool {
    matches!(e, Error::Shape { .. })
}
fn non_finite(e: &Error) -> bool {
    matches!(e, Error::NonFinite { .. })
}
fn invalid(e: &Error) -> bool {
    matches!(e, Error::InvalidParameter { .. })
}
fn over_budget(e: &Error) -> bool {
    matches!(e, Error::OverBudget { .. })
}
fn no_adapter(e: &Error) -> bool {
    matches!(e, Error::NoAdapter(_))
}

fn x(n: usize, d: usize) -> Array2<f32> {
    Array2::from_shape_fn((n, d), |(i, k)| ((i * 7 + k * 3) % 11) as f32 * 0.1 + 0.05)
}

fn with(mut a: Array2<f32>, at: (usize, usize), v: f32) -> Array2<f32> {
    a[at] = v;
    a
}

fn labels(n: usize) -> Array1<u32> {
    Array1::from_shape_fn(n, |i| (i % 3) as u32)
}

/// Every API row of the table on `ctx`: (id, outcome, expected error).
fn api_rows(ctx: &Context) -> Vec<(u32, Result<(), Error>, Check)> {
    let d = DistanceConfig::default();
    let (q, r, y, ry) = (x(6, 4), x(9, 4), labels(6), labels(9));
    let set = MiningSet::new(&q, &y);
    let refs = MiningSet::new(&r, &ry);
    let knn_k = |k| KnnConfig {
        k,
        ..Default::default()
    };
    let semihard = TripletConfig::margin_miner(TripletType::Semihard);
    let margin = |m| TripletConfig {
        rule: wgpu_metric_learning::TripletRule::Margin {
            kind: TripletType::All,
            margin: m,
        },
        ..Default::default()
    };
    let mine = |s: &MiningSet<'_, u32>, r: Option<&MiningSet<'_, u32>>, c: &TripletConfig| {
        mine_triplets(ctx, s, r, c).map(drop)
    };
    let bank = || MemoryBank::<u32>::new(ctx, &BankConfig::new(8, 4));
    // The first 6 rows of `r` are `q`; shifted, they are not.
    let shifted = r.mapv(|v| v + 1.0);
    let huge = Array1::<u32>::zeros(1);
    let huge = huge
        .broadcast(1usize << 32)
        .expect("a zero-stride view of 2^32 labels");
    let transposed_nan = with(x(4, 6), (2, 1), f32::NAN);
    vec![
        (
            1,
            pairwise_distances(
                ctx,
                x(3, 0).view(),
                x(3, 0).view(),
                &PairwiseConfig {
                    distance: d,
                    ..Default::default()
                },
            )
            .map(drop),
            shape,
        ),
        (
            2,
            pairwise_distances(
                ctx,
                q.view(),
                x(9, 5).view(),
                &PairwiseConfig {
                    distance: d,
                    ..Default::default()
                },
            )
            .map(drop),
            shape,
        ),
        (
            3,
            pairwise_distances(
                ctx,
                with(x(6, 4), (2, 3), f32::NAN).view(),
                r.view(),
                &PairwiseConfig {
                    distance: d,
                    ..Default::default()
                },
            )
            .map(drop),
            non_finite,
        ),
        (
            4,
            pairwise_distances(
                ctx,
                q.view(),
                with(x(9, 4), (8, 0), f32::INFINITY).view(),
                &PairwiseConfig {
                    distance: d,
                    ..Default::default()
                },
            )
            .map(drop),
            non_finite,
        ),
        (
            5,
            pairwise_distances(
                ctx,
                transposed_nan.t(),
                x(9, 4).view(),
                &PairwiseConfig {
                    distance: d,
                    ..Default::default()
                },
            )
            .map(drop),
            non_finite,
        ),
        (
            6,
            knn(ctx, q.view(), r.view(), &knn_k(0)).map(drop),
            invalid,
        ),
        (
            7,
            knn(ctx, q.view(), r.view(), &knn_k(10)).map(drop),
            invalid,
        ),
        (
            8,
            knn(
                ctx,
                q.view(),
                q.view(),
                &KnnConfig {
                    k: 6,
                    self_exclusion: SelfExclusion::SameIndex,
                    ..Default::default()
                },
            )
            .map(drop),
            invalid,
        ),
        (
            9,
            knn(
                ctx,
                q.view(),
                r.view(),
                &KnnConfig {
                    k: 2,
                    self_exclusion: SelfExclusion::QuerySlots(vec![0; 5]),
                    ..Default::default()
                },
            )
            .map(drop),
            shape,
        ),
        (
            10,
            knn(ctx, q.view(), x(0, 4).view(), &knn_k(1)).map(drop),
            invalid,
        ),
        (
            11,
            knn(
                ctx,
                with(x(6, 4), (0, 0), f32::NEG_INFINITY).view(),
                r.view(),
                &knn_k(1),
            )
            .map(drop),
            non_finite,
        ),
        (
            12,
            knn_sharded(&[], q.view(), r.view(), &knn_k(1)).map(drop),
            invalid,
        ),
        (
            14,
            mine(&MiningSet::new(&q, labels(5).view()), None, &semihard),
            shape,
        ),
        (15, mine(&set, None, &margin(f32::NAN)), invalid),
        (
            16,
            mine(&MiningSet::from_labels(&y), None, &semihard),
            invalid,
        ),
        (
            17,
            mine(&set, Some(&MiningSet::new(x(9, 3).view(), &ry)), &semihard),
            shape,
        ),
        (
            18,
            mine(
                &set,
                Some(&refs),
                &TripletConfig {
                    self_exclusion: SelfExclusion::QuerySlots(vec![0; 7]),
                    ..Default::default()
                },
            ),
            shape,
        ),
        (
            19,
            mine(
                &set,
                Some(&refs),
                &TripletConfig {
                    self_exclusion: SelfExclusion::QuerySlots(vec![9; 6]),
                    ..Default::default()
                },
            ),
            invalid,
        ),
        (
            20,
            mine(
                &set,
                Some(&MiningSet::new(with(x(9, 4), (4, 2), f32::NAN).view(), &ry)),
                &semihard,
            ),
            non_finite,
        ),
        (
            21,
            // 9 queries, 6 references: "reference i is query i" cannot hold.
            mine(
                &refs,
                Some(&set),
                &TripletConfig {
                    self_exclusion: SelfExclusion::SameIndex,
                    ..Default::default()
                },
            ),
            shape,
        ),
        (
            22,
            count_triplets(
                ctx,
                &MiningSet::from_labels(huge),
                None,
                &TripletConfig::default(),
            )
            .map(drop),
            invalid,
        ),
        (
            23,
            multi_similarity_pairs(
                ctx,
                &set,
                None,
                &MultiSimilarityConfig {
                    epsilon: f32::NAN,
                    ..Default::default()
                },
            )
            .map(drop),
            invalid,
        ),
        (
            24,
            pair_margin_pairs(
                ctx,
                &set,
                None,
                &PairMarginConfig {
                    neg_margin: f32::INFINITY,
                    ..Default::default()
                },
            )
            .map(drop),
            invalid,
        ),
        (
            25,
            batch_easy_hard_pairs(
                ctx,
                &set,
                None,
                &BatchEasyHardConfig {
                    pos_strategy: Pick::Semihard,
                    neg_strategy: Pick::Semihard,
                    ..Default::default()
                },
            )
            .map(drop),
            invalid,
        ),
        (
            26,
            batch_easy_hard_pairs(
                ctx,
                &set,
                None,
                &BatchEasyHardConfig {
                    allowed_pos_range: Some((f32::NAN, 1.0)),
                    ..Default::default()
                },
            )
            .map(drop),
            invalid,
        ),
        (
            27,
            batch_hard_triplets(ctx, &MiningSet::from_labels(&y), None, &Default::default())
                .map(drop),
            invalid,
        ),
        (
            28,
            all_pairs(
                ctx,
                &MiningSet::from_labels(&ry),
                Some(&MiningSet::from_labels(&y)),
                &AllPairsConfig {
                    self_exclusion: SelfExclusion::SameIndex,
                    ..Default::default()
                },
            )
            .map(drop),
            shape,
        ),
        (
            29,
            MemoryBank::<u32>::new(ctx, &BankConfig::new(0, 4)).map(drop),
            invalid,
        ),
        (
            30,
            MemoryBank::<u32>::new(ctx, &BankConfig::new(8, 0)).map(drop),
            invalid,
        ),
        (
            31,
            bank()
                .and_then(|mut b| b.enqueue(ctx, &MiningSet::new(&r, &ry)))
                .map(drop),
            invalid,
        ),
        (
            32,
            bank()
                .and_then(|mut b| b.enqueue(ctx, &MiningSet::new(x(3, 5).view(), labels(3).view())))
                .map(drop),
            shape,
        ),
        (
            33,
            bank()
                .and_then(|mut b| b.enqueue(ctx, &MiningSet::new(x(3, 4).view(), labels(2).view())))
                .map(drop),
            shape,
        ),
        (
            34,
            bank()
                .and_then(|mut b| {
                    b.enqueue(
                        ctx,
                        &MiningSet::new(with(x(3, 4), (1, 1), f32::NAN).view(), labels(3).view()),
                    )
                })
                .map(drop),
            non_finite,
        ),
        (
            35,
            bank()
                .and_then(|mut b| {
                    b.enqueue_masked(
                        ctx,
                        &MiningSet::new(x(3, 4).view(), labels(3).view()),
                        array![true, false].view(),
                    )
                })
                .map(drop),
            shape,
        ),
        (
            36,
            accuracy(
                ctx,
                &MiningSet::new(&q, labels(5).view()),
                None,
                &AccuracyConfig::default(),
            )
            .map(drop),
            shape,
        ),
        (
            37,
            accuracy(
                ctx,
                &MiningSet::new(&q, &y),
                None,
                &AccuracyConfig {
                    k: AccuracyK::Fixed(0),
                    ..Default::default()
                },
            )
            .map(drop),
            invalid,
        ),
        (
            38,
            accuracy(
                ctx,
                &MiningSet::new(&q, &y),
                Some(&MiningSet::new(&shifted, &ry)),
                &AccuracyConfig {
                    self_exclusion: SelfExclusion::SameIndex,
                    ..Default::default()
                },
            )
            .map(drop),
            invalid,
        ),
        (
            39,
            accuracy(
                ctx,
                &MiningSet::new(&q, &y),
                Some(&MiningSet::new(&r, labels(8).view())),
                &AccuracyConfig::default(),
            )
            .map(drop),
            shape,
        ),
        (
            40,
            accuracy(
                ctx,
                &MiningSet::new(with(x(6, 4), (5, 3), f32::NAN).view(), &y),
                None,
                &AccuracyConfig::default(),
            )
            .map(drop),
            non_finite,
        ),
    ]
}

#[test]
fn every_row_of_the_table_gets_its_typed_error_on_every_path() {
    let contexts = [Some(Context::native_cpu(None)), common::gpu_context(None)];
    for ctx in contexts.into_iter().flatten() {
        for (id, got, expected) in api_rows(&ctx) {
            match got {
                Err(e) if expected(&e) => {
                    // The message names the problem: never empty, one line.
                    let text = e.to_string();
                    assert!(!text.is_empty() && !text.contains('\n'), "row {id}: {text}");
                }
                other => panic!("row {id} on {}: got {other:?}", ctx.device_name()),
            }
        }
        assert_eq!(
            ctx.memory().current_bytes,
            0,
            "nothing held after the errors"
        );
        // Still usable.
        let d = pairwise_distances(&ctx, x(2, 4).view(), x(3, 4).view(), &Default::default());
        assert_eq!(d.expect("usable").values.dim(), (2, 3));
    }
}

/// The error an operation gives, without the operation's name: equal for the same bad input
/// whatever the operation.
fn without_op(e: &Error) -> String {
    match e {
        Error::Shape {
            what,
            expected,
            got,
            ..
        } => format!("Shape {{ what: {what}, expected: {expected}, got: {got:?} }}"),
        Error::InvalidParameter {
            what, value, rule, ..
        } => format!("InvalidParameter {{ what: {what}, value: {value}, rule: {rule} }}"),
        other => format!("{other:?}"),
    }
}

/// Rows 50–53: one self-exclusion rule. The same bad self-exclusion gives the same error
/// (variant, input, values) from every operation that takes one, on both paths, with host
/// references and with a memory bank's.
#[test]
fn the_same_bad_self_exclusion_gives_the_same_error_everywhere() {
    let (q, y) = (x(6, 4), labels(6));
    let (r, ry) = (x(4, 4), labels(4));
    let bad = [
        // 50: one slot too few.
        SelfExclusion::QuerySlots(vec![0, 1, 2, 3, 0]),
        // 51: a slot past the 4 references.
        SelfExclusion::QuerySlots(vec![0, 1, 2, 3, 0, 4]),
        // 52: reference i is query i, for 6 queries and 4 references.
        SelfExclusion::SameIndex,
    ];
    let mut contexts = vec![Context::native_cpu(None)];
    contexts.extend(common::gpu_context(None));
    assert!(contexts.len() == 2 || !common::gpu_required(), "both paths");
    for ctx in &contexts {
        eprintln!("self-exclusion errors on {}", ctx.device_name());
        let mut bank = MemoryBank::<u32>::new(ctx, &BankConfig::new(8, 4)).expect("bank");
        bank.enqueue(ctx, &MiningSet::new(&r, &ry))
            .expect("enqueue");
        let held = ctx.memory().current_bytes;
        let host = MiningSet::new(&r, &ry);
        let bank_refs = bank.refs();
        for refs in [&host, &bank_refs] {
            let set = MiningSet::new(&q, &y);
            for rule in &bad {
                let e = rule.clone();
                let errors: Vec<(&str, Result<(), Error>)> = vec![
                    (
                        "knn",
                        knn(
                            ctx,
                            &q,
                            refs.embeddings.expect("rows"),
                            &KnnConfig {
                                k: 1,
                                self_exclusion: e.clone(),
                                ..Default::default()
                            },
                        )
                        .map(drop),
                    ),
                    (
                        "accuracy",
                        accuracy(
                            ctx,
                            &set,
                            Some(refs),
                            &AccuracyConfig {
                                self_exclusion: e.clone(),
                                ..Default::default()
                            },
                        )
                        .map(drop),
                    ),
                    (
                        "mine_triplets",
                        mine_triplets(
                            ctx,
                            &set,
                            Some(refs),
                            &TripletConfig {
                                self_exclusion: e.clone(),
                                ..TripletConfig::margin_miner(TripletType::Semihard)
                            },
                        )
                        .map(drop),
                    ),
                    (
                        "count_triplets",
                        count_triplets(
                            ctx,
                            &set,
                            Some(refs),
                            &TripletConfig {
                                self_exclusion: e.clone(),
                                ..Default::default()
                            },
                        )
                        .map(drop),
                    ),
                    (
                        "all_pairs",
                        all_pairs(
                            ctx,
                            &set,
                            Some(refs),
                            &AllPairsConfig {
                                self_exclusion: e.clone(),
                                ..Default::default()
                            },
                        )
                        .map(drop),
                    ),
                    (
                        "pair_margin_pairs",
                        pair_margin_pairs(
                            ctx,
                            &set,
                            Some(refs),
                            &PairMarginConfig {
                                self_exclusion: e.clone(),
                                ..Default::default()
                            },
                        )
                        .map(drop),
                    ),
                    (
                        "multi_similarity_pairs",
                        multi_similarity_pairs(
                            ctx,
                            &set,
                            Some(refs),
                            &MultiSimilarityConfig {
                                self_exclusion: e.clone(),
                                ..Default::default()
                            },
                        )
                        .map(drop),
                    ),
                    (
                        "batch_easy_hard_pairs",
                        batch_easy_hard_pairs(
                            ctx,
                            &set,
                            Some(refs),
                            &BatchEasyHardConfig {
                                self_exclusion: e.clone(),
                                ..Default::default()
                            },
                        )
                        .map(drop),
                    ),
                    (
                        "batch_hard_triplets",
                        batch_hard_triplets(
                            ctx,
                            &set,
                            Some(refs),
                            &BatchHardConfig {
                                self_exclusion: e.clone(),
                                ..Default::default()
                            },
                        )
                        .map(drop),
                    ),
                ];
                let mut seen: Option<String> = None;
                for (op, got) in errors {
                    let text = match got {
                        Err(e) => without_op(&e),
                        Ok(()) => panic!("{op} with {rule:?} on {}: accepted", ctx.device_name()),
                    };
                    match &seen {
                        None => seen = Some(text),
                        Some(first) => assert_eq!(
                            first,
                            &text,
                            "{op} with {rule:?} on {}: another error than knn's",
                            ctx.device_name()
                        ),
                    }
                }
            }
        }
        assert_eq!(
            ctx.memory().current_bytes,
            held,
            "{}: the errors allocated nothing beyond the bank",
            ctx.device_name()
        );
    }
}

/// Row 13: a memory bank of one wgpu context used with another (on the native path a bank's
/// rows are a host array, usable with any context).
#[test]
fn a_bank_of_another_device_is_refused() {
    let (Some(a), Some(b)) = (common::gpu_context(None), common::gpu_context(None)) else {
        return;
    };
    let (q, y) = (x(6, 4), labels(6));
    let mut bank = MemoryBank::<u32>::new(&a, &BankConfig::new(8, 4)).expect("bank");
    bank.enqueue(&a, &MiningSet::new(&q, &y)).expect("enqueue");
    let cfg = KnnConfig {
        k: 1,
        ..Default::default()
    };
    let got = knn(&b, q.view(), bank.rows(), &cfg);
    assert!(
        matches!(&got, Err(e) if invalid(e)),
        "row 13 (knn): {got:?}"
    );
    let set = MiningSet::from_labels(&y);
    let got = mine_triplets(&b, &set, Some(&bank.refs()), &TripletConfig::default());
    assert!(
        matches!(&got, Err(e) if invalid(e)),
        "row 13 (mining): {got:?}"
    );
    let native = Context::native_cpu(None);
    let got = knn(&native, q.view(), bank.rows(), &cfg);
    assert!(
        matches!(&got, Err(e) if invalid(e)),
        "row 13 (native): {got:?}"
    );
}

/// Rows 41–43: budgets below one tile, and an adapter that does not exist.
#[test]
fn budgets_below_one_tile_and_missing_adapters() {
    let (q, r) = (x(50, 64), x(4000, 64));
    // 41: a budget of 0 bytes.
    for ctx in [
        Some(Context::native_cpu(Some(0))),
        common::gpu_context(Some(0)),
    ]
    .into_iter()
    .flatten()
    {
        let got = knn(&ctx, q.view(), r.view(), &KnnConfig::default());
        assert!(
            matches!(&got, Err(e) if over_budget(e)),
            "row 41 on {}: {got:?}",
            ctx.device_name()
        );
    }
    // 42: a budget of 1 KiB, below one wgpu tile (the native path needs a row per thread).
    for ctx in [
        Some(Context::native_cpu(Some(1024))),
        common::gpu_context(Some(1024)),
    ]
    .into_iter()
    .flatten()
    {
        let y = labels(50);
        let set = MiningSet::new(&q, &y);
        let got = mine_triplets(
            &ctx,
            &set,
            None,
            &TripletConfig::margin_miner(TripletType::Hard),
        );
        assert!(
            matches!(&got, Err(e) if over_budget(e)),
            "row 42 on {}: {got:?}",
            ctx.device_name()
        );
    }
    // 43: an adapter index past the list.
    let got = Context::new(&ContextConfig {
        backend: BackendChoice::Wgpu,
        adapter: AdapterSelector::Index(999),
        ..Default::default()
    });
    assert!(
        matches!(&got, Err(e) if no_adapter(e)),
        "row 43: {:?}",
        got.err()
    );
}

/// Rows 44–45: non-contiguous and transposed views are accepted, with the answer of their
/// contiguous copies, on every path.
#[test]
fn strided_and_transposed_views_are_accepted() {
    let contexts = [Some(Context::native_cpu(None)), common::gpu_context(None)];
    for ctx in contexts.into_iter().flatten() {
        let wide = x(12, 10);
        let strided = wide.slice(ndarray::s![..;2, ..;2]); // (6, 5), both strides 2
        let fortran = Array2::from_shape_vec((9, 5).f(), x(9, 5).iter().copied().collect())
            .expect("column-major");
        let every_other = labels(12);
        let y = every_other.slice(ndarray::s![..;2]);
        let d = DistanceConfig::default();
        let got = pairwise_distances(
            &ctx,
            strided,
            fortran.view(),
            &PairwiseConfig {
                distance: d,
                ..Default::default()
            },
        )
        .expect("44: strided");
        let want = pairwise_distances(
            &ctx,
            strided.to_owned().view(),
            fortran.as_standard_layout().view(),
            &PairwiseConfig {
                distance: d,
                ..Default::default()
            },
        )
        .expect("contiguous");
        assert_eq!(got.values, want.values, "row 44");
        let t = x(5, 6);
        let cfg = TripletConfig::margin_miner(TripletType::All);
        let set = MiningSet::new(t.t(), y);
        let got = mine_triplets(&ctx, &set, None, &cfg).expect("45: transposed");
        let owned_y = y.to_owned();
        let owned_t = t.t().to_owned();
        let want = mine_triplets(&ctx, &MiningSet::new(&owned_t, &owned_y), None, &cfg)
            .expect("contiguous");
        assert_eq!(got.indices, want.indices, "row 45");
    }
}

/// One random defect (or none) of a generated problem.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Defect {
    None,
    NaN,
    Infinite,
    DimMismatch,
    ZeroDim,
    LabelLength,
    KZero,
    KTooLarge,
}

fn defect() -> impl proptest::strategy::Strategy<Value = Defect> {
    prop_oneof![
        3 => Just(Defect::None),
        1 => Just(Defect::NaN),
        1 => Just(Defect::Infinite),
        1 => Just(Defect::DimMismatch),
        1 => Just(Defect::ZeroDim),
        1 => Just(Defect::LabelLength),
        1 => Just(Defect::KZero),
        1 => Just(Defect::KTooLarge),
    ]
}

/// What a defect must produce (for operations it concerns).
fn expected(defect: Defect) -> Option<Check> {
    match defect {
        Defect::None => None,
        Defect::NaN | Defect::Infinite => Some(non_finite),
        Defect::DimMismatch | Defect::ZeroDim | Defect::LabelLength => Some(shape),
        Defect::KZero | Defect::KTooLarge => Some(invalid),
    }
}

struct Case {
    q: Array2<f32>,
    r: Array2<f32>,
    y: Array1<u32>,
    ry: Array1<u32>,
    k: usize,
}

fn case(defect: Defect, b: usize, m: usize, d: usize, classes: u32, seed: u32) -> Case {
    let gen = |n: usize, d: usize, salt: u32| {
        Array2::from_shape_fn((n, d), |(i, k)| {
            let h = (i as u32 * 7919 + k as u32 * 104_729 + seed * 31 + salt)
                .wrapping_mul(2_654_435_761);
            (h >> 8) as f32 / 16_777_216.0 - 0.5
        })
    };
    let dq = if defect == Defect::ZeroDim { 0 } else { d };
    let dr = if defect == Defect::DimMismatch {
        d + 1
    } else {
        dq
    };
    let mut q = gen(b, dq, 1);
    let r = gen(m, dr, 2);
    if matches!(defect, Defect::NaN | Defect::Infinite) {
        let v = if defect == Defect::NaN {
            f32::NAN
        } else {
            f32::NEG_INFINITY
        };
        q[((seed as usize) % b, (seed as usize) % d)] = v;
    }
    let ly = if defect == Defect::LabelLength {
        b + 1
    } else {
        b
    };
    Case {
        y: Array1::from_shape_fn(ly, |i| (i as u32 * 5 + seed) % classes),
        ry: Array1::from_shape_fn(m, |i| (i as u32 * 3 + seed) % classes),
        k: match defect {
            Defect::KZero => 0,
            Defect::KTooLarge => m + 1,
            _ => 1 + (seed as usize) % m,
        },
        q,
        r,
    }
}

/// Checks one operation's outcome: the defect's error when the defect concerns it, else the
/// native answer (compared by `same`).
fn judge<T>(
    what: &str,
    defect: Option<Check>,
    got: Result<T, Error>,
    want: impl FnOnce() -> Result<T, Error>,
    same: impl Fn(&T, &T) -> bool,
) -> Result<(), TestCaseError> {
    match (defect, got) {
        (Some(check), Err(e)) => prop_assert!(check(&e), "{what}: wrong error {e:?}"),
        (Some(_), Ok(_)) => prop_assert!(false, "{what}: a defective input gave a result"),
        (None, Err(e)) => prop_assert!(false, "{what}: a clean input failed: {e:?}"),
        (None, Ok(g)) => {
            let w = want().map_err(|e| TestCaseError::fail(format!("{what}: native {e:?}")))?;
            prop_assert!(same(&g, &w), "{what}: differs from the native path");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(24)))]

    #[test]
    fn random_defects_give_typed_errors_and_clean_inputs_the_native_answer(
        defect in defect(),
        b in 1usize..40,
        m in 1usize..60,
        d in 1usize..9,
        classes in 1u32..5,
        seed in 0u32..1000,
    ) {
        let c = case(defect, b, m, d, classes, seed);
        let native = Context::native_cpu(None);
        let gpu = common::shared_gpu();
        let Some(ctx) = gpu.or(Some(&native)) else { return Ok(()) };
        // Squared distances: a plain Euclidean near 0 amplifies rounding through the root.
        let dist = DistanceConfig { distance: wgpu_metric_learning::Distance::SquaredEuclidean, normalize: true };
        // Distances: every defect of the embeddings concerns them; labels and k do not.
        let emb_defect = match defect {
            Defect::LabelLength | Defect::KZero | Defect::KTooLarge => None,
            other => expected(other),
        };
        judge(
            "pairwise_distances", emb_defect,
            pairwise_distances(ctx, c.q.view(), c.r.view(), &PairwiseConfig { distance: dist, ..Default::default() }).map(|p| p.values),
            || pairwise_distances(&native, c.q.view(), c.r.view(), &PairwiseConfig { distance: dist, ..Default::default() }).map(|p| p.values),
            |g, w| g.dim() == w.dim() && g.iter().zip(w).all(|(a, b)| (a - b).abs() <= 1e-4),
        )?;
        let knn_defect = if defect == Defect::LabelLength { None } else { expected(defect) };
        let cfg = KnnConfig { k: c.k, distance: dist, ..Default::default() };
        judge(
            "knn", knn_defect,
            knn(ctx, c.q.view(), c.r.view(), &cfg).map(|f| f.scores),
            || knn(&native, c.q.view(), c.r.view(), &cfg).map(|f| f.scores),
            |g, w| g.dim() == w.dim() && g.iter().zip(w).all(|(a, b)| (a - b).abs() <= 1e-4),
        )?;
        // Mining: every defect but k concerns it.
        let mine_defect = match defect {
            Defect::KZero | Defect::KTooLarge => None,
            other => expected(other),
        };
        let set = MiningSet::new(c.q.view(), c.y.view());
        let refs = MiningSet::new(c.r.view(), c.ry.view());
        let all = TripletConfig::default();
        judge(
            "mine_triplets", mine_defect,
            mine_triplets(ctx, &set, Some(&refs), &all).map(|t| t.indices),
            || mine_triplets(&native, &set, Some(&refs), &all).map(|t| t.indices),
            |g, w| g == w,
        )?;
        judge(
            "count_triplets", mine_defect,
            count_triplets(ctx, &set, Some(&refs), &all).map(|t| t.count),
            || count_triplets(&native, &set, Some(&refs), &all).map(|t| t.count),
            |g, w| g == w,
        )?;
        // Miners with distances: outcomes only (float ties may pick differently per path).
        let hard = batch_hard_triplets(ctx, &set, Some(&refs), &Default::default());
        if let Some(check) = mine_defect {
            prop_assert!(matches!(&hard, Err(e) if check(e)), "batch_hard: {hard:?}");
        } else {
            prop_assert!(hard.is_ok(), "batch_hard: {hard:?}");
        }
        let ms = multi_similarity_pairs(ctx, &set, Some(&refs), &Default::default());
        prop_assert_eq!(ms.is_ok(), mine_defect.is_none(), "multi_similarity: {:?}", ms.err());
        // Accuracy on the queries themselves: labels and embeddings concern it, k does not
        // (it picks its own), and neither do the references' dimensions.
        let acc_defect = match defect {
            Defect::KZero | Defect::KTooLarge | Defect::DimMismatch => None,
            other => expected(other),
        };
        let acc = accuracy(ctx, &MiningSet::new(c.q.view(), c.y.view()), None, &AccuracyConfig::default());
        if let Some(check) = acc_defect {
            prop_assert!(matches!(&acc, Err(e) if check(e)), "accuracy: {acc:?}");
        } else {
            prop_assert!(acc.is_ok(), "accuracy: {:?}", acc.err());
        }
        // A bank of m rows takes the queries when they fit; defects of the batch concern it.
        let mut bank = MemoryBank::<u32>::new(ctx, &BankConfig::new(m.max(b), c.r.ncols().max(1)))
            .map_err(|e| TestCaseError::fail(format!("bank: {e:?}")))?;
        let enq = bank.enqueue(ctx, &MiningSet::new(c.q.view(), c.y.view()));
        let bank_defect = match defect {
            Defect::KZero | Defect::KTooLarge => None,
            other => expected(other),
        };
        if let Some(check) = bank_defect {
            prop_assert!(matches!(&enq, Err(e) if check(e)), "enqueue: {enq:?}");
            prop_assert!(bank.is_empty(), "a refused batch leaves the bank as it was");
        } else {
            prop_assert!(enq.is_ok(), "enqueue: {:?}", enq.err());
        }
    }
}

/// Rows 46–49: empty inputs are not errors; they give empty answers of the right shape.
#[test]
fn empty_inputs_give_empty_answers() {
    let contexts = [Some(Context::native_cpu(None)), common::gpu_context(None)];
    for ctx in contexts.into_iter().flatten() {
        let (none, r) = (x(0, 4), x(9, 4));
        let cfg = KnnConfig {
            k: 3,
            ..Default::default()
        };
        let found = knn(&ctx, none.view(), r.view(), &cfg).expect("46");
        assert_eq!(found.indices.dim(), (0, 3), "row 46");
        let d = pairwise_distances(&ctx, none.view(), r.view(), &Default::default()).expect("47");
        assert_eq!(d.values.dim(), (0, 9), "row 47");
        let (y, ry) = (labels(0), labels(9));
        let set = MiningSet::new(&none, &y);
        let refs = MiningSet::new(&r, &ry);
        let cfg = TripletConfig::margin_miner(TripletType::Semihard);
        let t = mine_triplets(&ctx, &set, Some(&refs), &cfg).expect("48");
        assert_eq!(t.indices.dim(), (0, 3), "row 48");
        let acc = accuracy(
            &ctx,
            &MiningSet::new(&none, &y),
            None,
            &AccuracyConfig::default(),
        )
        .expect("49");
        assert!(
            acc.metrics.precision_at_1.is_nan(),
            "row 49: no query, no metric"
        );
        assert_eq!(acc.lone_queries, 0);
    }
}
