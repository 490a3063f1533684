//! Triplet mining (kernels `triplet_lists` and `triplet_select`, with `distance_tile` for the
//! margin rules) on the GPU and on the native CPU path against the plain triple-loop reference.
//!
//! The reference gets the distance matrix the path itself computes (`pairwise_distances` on the
//! same context runs the same arithmetic), so triplets are compared exactly, boundaries
//! included; the distances themselves are checked against their own reference in
//! `tests/distance_tile.rs`.

use crate::common;
use crate::common::DISTANCES;

use std::ops::ControlFlow;

use ndarray::{Array1, Array2};
use proptest::prelude::*;
use wgpu_metric_learning::reference::triplet_select::triplet_select;
use wgpu_metric_learning::{
    count_triplets, mine_triplets, mine_triplets_streaming, pairwise_distances, Context,
    CountMethod, Distance, DistanceConfig, Error, MiningSet, PairwiseConfig, SelfExclusion,
    TripletConfig, TripletRule, TripletType,
};

/// One mining problem: queries, optional refs (None = the queries themselves), and the config.
#[derive(Debug, Clone)]
struct Problem {
    labels: Array1<u32>,
    embeddings: Array2<f32>,
    refs: Option<(Array1<u32>, Array2<f32>)>,
    cfg: TripletConfig,
}

impl Problem {
    fn queries(&self) -> MiningSet<'_, u32> {
        MiningSet::new(self.embeddings.view(), self.labels.view())
    }

    fn ref_set(&self) -> Option<MiningSet<'_, u32>> {
        self.refs.as_ref().map(|(l, e)| MiningSet::new(e, l))
    }

    /// The reference answer, from the distances `ctx` itself computes.
    fn reference(&self, ctx: &Context) -> Array2<u32> {
        let (ref_labels, ref_emb) = match &self.refs {
            Some((l, e)) => (l.clone(), e.clone()),
            None => (self.labels.clone(), self.embeddings.clone()),
        };
        let slots: Vec<u32> = match (&self.refs, &self.cfg.self_exclusion) {
            (None, SelfExclusion::Auto) | (_, SelfExclusion::SameIndex) => {
                (0..self.labels.len() as u32).collect()
            }
            (_, SelfExclusion::QuerySlots(s)) => s.clone(),
            (Some(_), SelfExclusion::Auto) | (_, SelfExclusion::None) => {
                vec![u32::MAX; self.labels.len()]
            }
            (_, other) => panic!("no reference model for {other:?}"),
        };
        let distances = matches!(self.cfg.rule, TripletRule::Margin { .. }).then(|| {
            pairwise_distances(
                ctx,
                self.embeddings.view(),
                ref_emb.view(),
                &PairwiseConfig {
                    distance: self.cfg.distance,
                    ..Default::default()
                },
            )
            .expect("distances")
            .values
        });
        triplet_select(
            self.labels.as_slice().expect("contiguous"),
            ref_labels.as_slice().expect("contiguous"),
            &slots,
            distances.as_ref().map(|d| d.view()),
            &self.cfg.rule,
            self.cfg.distance.distance.is_similarity(),
        )
    }

    /// Mines on `ctx` in all three forms and checks each against the reference.
    fn check(&self, ctx: &Context) {
        let want = self.reference(ctx);
        let refs = self.ref_set();
        let got = mine_triplets(ctx, &self.queries(), refs.as_ref(), &self.cfg).expect("mine");
        assert_eq!(got.path, ctx.path(), "result names its path");
        let what = format!("{:?} on {}", self.cfg.rule, ctx.device_name());
        assert_same(&got.indices, &want, &what);
        let n = count_triplets(ctx, &self.queries(), refs.as_ref(), &self.cfg).expect("count");
        assert_eq!(n.count, want.nrows() as u64, "count-only form agrees");

        // Streaming with small chunks: consecutive, bounded, same order.
        let cfg = TripletConfig {
            max_chunk_triplets: 7,
            ..self.cfg.clone()
        };
        let cap = 7.max(
            self.refs
                .as_ref()
                .map_or(self.labels.len(), |(l, _)| l.len()),
        );
        let mut streamed: Vec<u32> = Vec::new();
        let delivered =
            mine_triplets_streaming(ctx, &self.queries(), refs.as_ref(), &cfg, |chunk| {
                assert!(
                    chunk.nrows() >= 1 && chunk.nrows() <= cap,
                    "chunk of {} rows, cap {cap}",
                    chunk.nrows()
                );
                streamed.extend(chunk.iter());
                ControlFlow::Continue(())
            })
            .expect("stream");
        assert_eq!(delivered.count, want.nrows() as u64, "streamed count");
        assert_eq!(
            streamed,
            want.iter().copied().collect::<Vec<_>>(),
            "streamed triplets, in order"
        );
    }
}

/// Equal triplet arrays, or a message naming the lengths and the first differing row.
fn assert_same(got: &Array2<u32>, want: &Array2<u32>, what: &str) {
    if got == want {
        return;
    }
    let first = got
        .rows()
        .into_iter()
        .zip(want.rows())
        .position(|(g, w)| g != w)
        .unwrap_or(got.nrows().min(want.nrows()));
    let row = |a: &Array2<u32>| (first < a.nrows()).then(|| a.row(first).to_vec());
    panic!(
        "{what}: {} triplets, reference {}; first difference at row {first}: got {:?}, want {:?}",
        got.nrows(),
        want.nrows(),
        row(got),
        row(want)
    );
}

/// Embeddings on a small integer grid, so that equal distances (tm = 0 exactly) are common.
fn embeddings(rows: usize, d: usize) -> impl Strategy<Value = Array2<f32>> {
    proptest::collection::vec(-2i8..=2, rows * d).prop_map(move |v| {
        Array2::from_shape_vec((rows, d), v.into_iter().map(f32::from).collect()).expect("sized")
    })
}

/// Labels with `classes` classes: 1 (every pair positive), few, or as many as rows.
fn labels(rows: usize, classes: usize) -> impl Strategy<Value = Array1<u32>> {
    proptest::collection::vec(0..classes.max(1) as u32, rows).prop_map(Array1::from)
}

fn problem() -> impl Strategy<Value = Problem> {
    (
        0usize..24,
        0usize..40,
        1usize..7,
        prop_oneof![Just(1usize), 2usize..5, Just(64)],
        any::<bool>(),
    )
        .prop_flat_map(|(b, m, d, classes, with_refs)| {
            let refs = if with_refs {
                (labels(m, classes), embeddings(m, d))
                    .prop_map(Some)
                    .boxed()
            } else {
                Just(None).boxed()
            };
            let count_method = prop_oneof![
                Just(CountMethod::Scan),
                Just(CountMethod::Sorted),
                Just(CountMethod::Auto)
            ];
            let cfg = (
                common::triplet_rule(),
                0usize..4,
                any::<bool>(),
                count_method,
            )
                .prop_map(|(rule, which, normalize, count_method)| TripletConfig {
                    count_method,
                    rule,
                    distance: DistanceConfig {
                        distance: DISTANCES[which],
                        normalize,
                    },
                    ..Default::default()
                });
            (labels(b, classes), embeddings(b, d), refs, cfg)
        })
        .prop_flat_map(|(labels, embeddings, refs, cfg)| {
            let b = labels.len();
            let m = refs.as_ref().map(|(l, _): &(Array1<u32>, _)| l.len());
            // With separate refs: no exclusion, or one slot per query (a memory-bank layout).
            let exclusion = match m {
                Some(m) if m > 0 => prop_oneof![
                    Just(SelfExclusion::None),
                    proptest::collection::vec(0..m as u32, b).prop_map(SelfExclusion::QuerySlots),
                ]
                .boxed(),
                Some(_) => Just(SelfExclusion::None).boxed(),
                // The references are the queries: each excluded as its own positive.
                None => Just(SelfExclusion::Auto).boxed(),
            };
            (Just((labels, embeddings, refs, cfg)), exclusion)
        })
        .prop_map(
            |((labels, embeddings, refs, cfg), self_exclusion)| Problem {
                labels,
                embeddings,
                refs,
                cfg: TripletConfig {
                    self_exclusion,
                    ..cfg
                },
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(32)))]

    #[test]
    fn triplet_select_gpu_matches_reference(p in problem()) {
        if let Some(ctx) = common::shared_gpu() {
            p.check(ctx);
        }
    }

    #[test]
    fn triplet_select_native_cpu_matches_reference(p in problem()) {
        p.check(&Context::native_cpu(None));
    }
}

fn grid(rows: usize, d: usize) -> Array2<f32> {
    Array2::from_shape_fn((rows, d), |(i, k)| ((i * 7 + k * 3) % 5) as f32 - 2.0)
}

fn cyclic(rows: usize, classes: u32) -> Array1<u32> {
    Array1::from_shape_fn(rows, |i| i as u32 % classes)
}

#[test]
fn triplet_select_under_a_tight_budget_chunks_anchors_and_windows() {
    // 64 KiB cannot hold one chunk of all 150 anchors × 230 refs (~5 × 138 KB of lists,
    // counts and offsets), so the anchors are chunked and the output windowed.
    let budget = 64 << 10;
    let Some(ctx) = common::gpu_context(Some(budget)) else {
        return;
    };
    check_under_budget(&ctx, budget, TripletType::Semihard);
}

/// 150 anchors against 230 refs, all valid and one margin rule, on `ctx` with `budget`: the
/// reference's answer, peak ≤ budget, some bytes counted, all released.
fn check_under_budget(ctx: &Context, budget: u64, kind: TripletType) {
    for rule in [TripletRule::AllValid, TripletRule::margin_miner(kind)] {
        let p = Problem {
            labels: cyclic(150, 4),
            embeddings: grid(150, 5),
            refs: Some((cyclic(230, 3), grid(230, 5))),
            cfg: TripletConfig {
                rule,
                ..Default::default()
            },
        };
        ctx.reset_peak();
        p.check(ctx);
        let mem = ctx.memory();
        assert!(
            mem.peak_bytes <= budget,
            "peak {} B over {budget} B",
            mem.peak_bytes
        );
        assert!(mem.peak_bytes > 0, "the working memory is counted");
        assert_eq!(mem.current_bytes, 0, "everything released");
    }
}

#[test]
fn native_triplets_under_a_budget_of_one_distance_row_per_thread() {
    // The native path's scratch per thread: five index/value lists and one distance row of
    // m elements each (24·m bytes), and (the distance normalises) the block's row and the
    // references normalised (4·(1 + m)·d). A budget of just that forces one anchor per block.
    let (m, d) = (230, 5);
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get()) as u64;
    let budget = threads * (24 * m + 4 * (1 + m) * d) + 100;
    let ctx = Context::native_cpu(Some(budget));
    check_under_budget(&ctx, budget, TripletType::Hard);
}

#[test]
fn triplet_select_budget_below_one_anchor_is_a_typed_error() {
    let budget = 1 << 10;
    for ctx in [
        Some(Context::native_cpu(Some(budget))),
        common::gpu_context(Some(budget)),
    ] {
        let Some(ctx) = ctx else {
            continue;
        };
        budget_below_one_anchor(&ctx, budget);
    }
}

fn budget_below_one_anchor(ctx: &Context, budget: u64) {
    let (labels, refs) = (cyclic(10, 2), cyclic(1000, 2));
    let (emb, ref_emb) = (grid(10, 4), grid(1000, 4));
    let queries = MiningSet::new(&emb, &labels);
    let refs = MiningSet::new(&ref_emb, &refs);
    let semihard = TripletConfig {
        rule: TripletRule::margin_miner(TripletType::Semihard),
        ..Default::default()
    };
    let attempts = [
        mine_triplets(ctx, &queries, Some(&refs), &TripletConfig::default())
            .map(|t| t.len() as u64),
        count_triplets(ctx, &queries, Some(&refs), &semihard).map(|n| n.count),
    ];
    for got in attempts {
        match got {
            Err(Error::OverBudget {
                required,
                budget: b,
                ..
            }) => assert!(
                required > budget && b == budget,
                "names bytes {required} and budget {b}"
            ),
            other => panic!("expected OverBudget, got {other:?}"),
        }
    }
    assert_eq!(ctx.memory().peak_bytes, 0, "nothing was allocated");
}

#[test]
fn triplet_count_passes_2_pow_32_without_overflow() {
    // 128 anchors × 40 000 refs × 40 000 = 2.0e11 candidate (a, p, n) combinations; with 2
    // classes every anchor has 20 000 positives × 20 000 negatives: 5.12e10 triplets > 2^32.
    let Some(ctx) = common::shared_gpu() else {
        return;
    };
    let (labels, refs) = (cyclic(128, 2), cyclic(40_000, 2));
    let n = count_triplets(
        ctx,
        &MiningSet::from_labels(&labels),
        Some(&MiningSet::from_labels(&refs)),
        &TripletConfig::default(),
    )
    .expect("count");
    assert_eq!(n.count, 128 * 20_000 * 20_000, "exact u64 count");
    let native = count_triplets(
        &Context::native_cpu(None),
        &MiningSet::from_labels(&labels),
        Some(&MiningSet::from_labels(&refs)),
        &TripletConfig::default(),
    )
    .expect("native count");
    assert_eq!(native.count, n.count, "paths agree");
}

#[test]
fn streaming_stops_when_asked() {
    let labels = cyclic(30, 3);
    for ctx in [Some(Context::native_cpu(None)), common::gpu_context(None)]
        .into_iter()
        .flatten()
    {
        let cfg = TripletConfig {
            max_chunk_triplets: 10,
            ..Default::default()
        };
        let mut chunks = 0;
        let got =
            mine_triplets_streaming(&ctx, &MiningSet::from_labels(&labels), None, &cfg, |_| {
                chunks += 1;
                ControlFlow::Break(())
            })
            .expect("stream");
        assert_eq!(chunks, 1, "no chunk after Break on {}", ctx.device_name());
        assert!(
            got.count >= 1 && got.count <= 30,
            "delivered count {}",
            got.count
        );
    }
}

#[test]
fn labels_of_any_hashable_type_give_the_same_triplets() {
    let ctx = Context::native_cpu(None);
    let as_u32 = Array1::from(vec![3u32, 3, 7, 7, 9]);
    let as_i64 = Array1::from(vec![-5i64, -5, 1 << 40, 1 << 40, 0]);
    let cfg = TripletConfig::default();
    let a = mine_triplets(&ctx, &MiningSet::from_labels(&as_u32), None, &cfg).expect("u32");
    let b = mine_triplets(&ctx, &MiningSet::from_labels(&as_i64), None, &cfg).expect("i64");
    assert_eq!(a.indices, b.indices, "only equality of labels matters");
    assert_eq!(
        a.len(),
        2 * 3 + 2 * 3,
        "two pairs of two, each with three negatives"
    );
}

#[test]
fn triplet_select_typed_errors_for_bad_input() {
    let ctx = Context::native_cpu(None);
    let labels = cyclic(4, 2);
    let emb = grid(4, 3);
    let margin = TripletConfig {
        rule: TripletRule::margin_miner(TripletType::Hard),
        ..Default::default()
    };
    let short = cyclic(3, 2);
    fn mine_with<'a>(
        ctx: &Context,
        q: MiningSet<'a, u32>,
        r: Option<MiningSet<'a, u32>>,
        cfg: &TripletConfig,
    ) -> Result<usize, Error> {
        mine_triplets(ctx, &q, r.as_ref(), cfg).map(|t| t.len())
    }
    let set = MiningSet::new(&emb, &labels);
    assert!(
        matches!(
            mine_with(&ctx, MiningSet::new(&emb, &short), None, &margin),
            Err(Error::Shape { what: "labels", .. })
        ),
        "label length mismatch"
    );
    assert!(
        matches!(
            mine_with(&ctx, set, Some(MiningSet::new(&emb, &short)), &margin),
            Err(Error::Shape {
                what: "ref_labels",
                ..
            })
        ),
        "ref label length mismatch"
    );
    assert!(
        matches!(
            mine_with(&ctx, MiningSet::from_labels(&labels), None, &margin),
            Err(Error::InvalidParameter {
                what: "queries",
                ..
            })
        ),
        "margin rule without embeddings"
    );
    let mut nan = emb.clone();
    nan[[1, 2]] = f32::NAN;
    assert!(
        matches!(
            mine_with(&ctx, MiningSet::new(&nan, &labels), None, &margin),
            Err(Error::NonFinite { row: 1, col: 2, .. })
        ),
        "NaN embedding"
    );
    let nan_margin = TripletConfig {
        rule: TripletRule::Margin {
            kind: TripletType::All,
            margin: f32::NAN,
        },
        ..Default::default()
    };
    assert!(
        matches!(
            mine_with(&ctx, set, None, &nan_margin),
            Err(Error::InvalidParameter { what: "margin", .. })
        ),
        "NaN margin"
    );
    let refs = MiningSet::new(&emb, &labels);
    let slots = |s: Vec<u32>| TripletConfig {
        self_exclusion: SelfExclusion::QuerySlots(s),
        ..Default::default()
    };
    assert!(
        matches!(
            mine_with(&ctx, set, Some(refs), &slots(vec![0, 1])),
            Err(Error::Shape { .. })
        ),
        "one slot per query"
    );
    assert!(
        matches!(
            mine_with(&ctx, set, Some(refs), &slots(vec![0, 1, 2, 4])),
            Err(Error::InvalidParameter {
                what: "self_exclusion",
                ..
            })
        ),
        "slot out of range"
    );
    // Fewer references than queries: "reference i is query i" cannot hold.
    let other = cyclic(3, 2);
    let same_index = TripletConfig {
        self_exclusion: SelfExclusion::SameIndex,
        ..Default::default()
    };
    assert!(
        matches!(
            mine_with(
                &ctx,
                MiningSet::from_labels(&labels),
                Some(MiningSet::from_labels(&other)),
                &same_index
            ),
            Err(Error::Shape { .. })
        ),
        "SameIndex needs at least as many refs as queries"
    );
}

#[test]
fn triplet_select_under_tiny_device_limits_folds_grids_and_chunks_anchors() {
    // At most 8 workgroups per dimension: the count grid (one workgroup per positive, up to
    // ~30 here) folds into z, and chunks hold at most 8 anchors. (Folding covers up to
    // limit² positives: 4.3e9 under real limits.)
    let Some(probe) = common::shared_gpu() else {
        return;
    };
    let limits = wgpu::Limits {
        max_compute_workgroups_per_dimension: 8,
        ..probe.limits().cloned().expect("wgpu context has limits")
    };
    let ctx = common::gpu_context_with(wgpu_metric_learning::ContextConfig {
        limits: Some(limits),
        ..Default::default()
    })
    .expect("an adapter accepts lower limits");
    for rule in [
        TripletRule::AllValid,
        TripletRule::margin_miner(TripletType::Hard),
    ] {
        let p = Problem {
            labels: cyclic(11, 2),
            embeddings: grid(11, 3),
            refs: Some((cyclic(61, 2), grid(61, 3))),
            cfg: TripletConfig {
                rule,
                ..Default::default()
            },
        };
        p.check(&ctx);
    }
}

#[test]
fn margin_count_over_2_pow_32_candidates_matches_its_own_distances() {
    // 64 × 10 000 × 10 000 = 6.4e9 candidate (a, p, n) combinations (> 2^32): what PML's
    // vectorised path cannot hold. The count is checked exactly against the rule applied to
    // the distance matrix the same context computes.
    let Some(ctx) = common::shared_gpu() else {
        return;
    };
    let (b, m) = (64, 10_000);
    let (labels, refs) = (
        cyclic(b, 100),
        Array1::from_shape_fn(m, |i| (i * 7 % 100) as u32),
    );
    let (emb, ref_emb) = (
        grid(b, 8),
        Array2::from_shape_fn((m, 8), |(i, k)| ((i * 13 + k * 5) % 11) as f32 - 5.0),
    );
    let rule = TripletRule::margin_miner(TripletType::Semihard);
    let cfg = TripletConfig {
        rule,
        ..Default::default()
    };
    let got = count_triplets(
        ctx,
        &MiningSet::new(&emb, &labels),
        Some(&MiningSet::new(&ref_emb, &refs)),
        &cfg,
    )
    .expect("count");
    let d = pairwise_distances(
        ctx,
        emb.view(),
        ref_emb.view(),
        &PairwiseConfig {
            distance: cfg.distance,
            ..Default::default()
        },
    )
    .expect("distances")
    .values;
    let mut want = 0u64;
    for a in 0..b {
        for p in (0..m).filter(|&p| refs[p] == labels[a]) {
            want += (0..m)
                .filter(|&n| refs[n] != labels[a] && rule.keeps(d[[a, p]], d[[a, n]], false))
                .count() as u64;
        }
    }
    assert_eq!(got.count, want, "exact count on {}", ctx.device_name());
    assert!(want > 0, "the case keeps triplets");
}

#[test]
fn overflowing_embeddings_give_triplets_or_a_typed_error_never_a_panic() {
    // Finite inputs whose squared norms overflow f32: raw Euclidean distances become inf - inf
    // = NaN. The answer must be a result or a typed error, on every path.
    let labels = cyclic(6, 2);
    let x = Array2::from_shape_fn((6, 3), |(i, j)| if (i + j) % 2 == 0 { 3e38 } else { -3e38 });
    let contexts = [Some(Context::native_cpu(None)), common::gpu_context(None)];
    for ctx in contexts.into_iter().flatten() {
        for kind in [TripletType::All, TripletType::Hard, TripletType::Easy] {
            let cfg = TripletConfig {
                rule: TripletRule::margin_miner(kind),
                distance: DistanceConfig {
                    distance: Distance::Euclidean,
                    normalize: false,
                },
                ..Default::default()
            };
            let set = MiningSet::new(&x, &labels);
            match mine_triplets(&ctx, &set, None, &cfg) {
                Ok(t) => assert!(t.indices.iter().all(|&i| i < 6), "indices in range"),
                Err(Error::InvalidParameter { what, .. }) => assert_eq!(what, "distances"),
                Err(e) => panic!("unexpected error {e}"),
            }
        }
    }
}
