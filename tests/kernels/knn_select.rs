//! k-nearest-neighbour search (`knn`: kernels `distance_tile` + `knn_select` on the GPU, blocked
//! GEMM + selection natively) against the plain reference `reference::knn_select` over the
//! same context's distance matrix: random shapes and k (1 and N included), every distance,
//! ties from duplicate rows, self-exclusion, several query chunks and reference ranges (small
//! budgets, small bindings, streamed references), memory banks, sharding over two contexts,
//! a tight budget with 100 000 references, and every typed error.

use crate::common;
use crate::common::DISTANCES;

use std::sync::{Arc, Mutex};

use ndarray::{s, Array1, Array2};
use proptest::prelude::*;
use wgpu_metric_learning::reference::knn_select::knn_select;
use wgpu_metric_learning::{
    knn, knn_plan, knn_sharded, pairwise_distances, BackendChoice, BankConfig, Context,
    ContextConfig, Distance, DistanceConfig, Error, Hooks, Knn, KnnConfig, MemoryBank, MiningSet,
    NativeKnnKernel, PairwiseConfig, Progress, SelfExclusion,
};

/// Embeddings with frequent exact duplicates (small integers) or spread values.
fn embeddings(n: usize, d: usize, seed: u64, ties: bool) -> Array2<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    Array2::from_shape_fn((n, d), |_| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let u = (state >> 33) as u32;
        if ties {
            (u % 3) as f32 - 1.0
        } else {
            (u as f32 / u32::MAX as f32) * 2.0 - 1.0
        }
    })
}

fn excluded(cfg: &KnnConfig, q: usize) -> Vec<u32> {
    match &cfg.self_exclusion {
        SelfExclusion::Auto | SelfExclusion::None => vec![u32::MAX; q],
        SelfExclusion::SameIndex => (0..q as u32).collect(),
        SelfExclusion::QuerySlots(s) => s.clone(),
        other => panic!("no reference model for {other:?}"),
    }
}

/// The search on `ctx` must equal the reference selection over `ctx`'s own distances, exactly
/// (same distance kernel or GEMM, so the same scores, and the same tie rule).
fn check_exact(ctx: &Context, queries: &Array2<f32>, refs: &Array2<f32>, cfg: &KnnConfig) -> Knn {
    let got = knn(ctx, queries.view(), refs.view(), cfg).expect("knn");
    let dist = pairwise_distances(
        ctx,
        queries.view(),
        refs.view(),
        &PairwiseConfig {
            distance: cfg.distance,
            ..Default::default()
        },
    )
    .expect("distances")
    .values;
    let largest = cfg.distance.distance.is_similarity();
    let (idx, val) = knn_select(dist.view(), cfg.k, largest, &excluded(cfg, queries.nrows()));
    assert_eq!(
        got.indices,
        idx,
        "indices, {cfg:?} on {}",
        ctx.device_name()
    );
    let same = got
        .scores
        .iter()
        .zip(&val)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(same, "scores, {cfg:?}: {:?} vs {:?}", got.scores, val);
    got
}

/// `got` is a correct answer up to rounding: its scores are `truth`'s (a distance matrix
/// computed elsewhere) within `tol`, sorted best first, with distinct, visible indices; an
/// index may differ from the reference's only where the reference's score is within `tol`.
fn check_close(got: &Knn, truth: &Array2<f32>, cfg: &KnnConfig, tol: f32) {
    let largest = cfg.distance.distance.is_similarity();
    let skip = excluded(cfg, truth.nrows());
    let (idx, val) = knn_select(truth.view(), cfg.k, largest, &skip);
    for i in 0..truth.nrows() {
        let mut seen = std::collections::HashSet::new();
        for j in 0..cfg.k {
            let (gi, wi) = (got.indices[[i, j]], idx[[i, j]]);
            assert!(seen.insert(gi), "row {i}: index {gi} twice");
            assert_ne!(gi, skip[i], "row {i}: the query itself");
            let true_score = truth[[i, gi as usize]];
            assert!(
                (true_score - val[[i, j]]).abs() <= tol
                    && (got.scores[[i, j]] - val[[i, j]]).abs() <= tol,
                "row {i} slot {j}: got {gi} ({} / true {true_score}), want {wi} ({})",
                got.scores[[i, j]],
                val[[i, j]]
            );
        }
    }
}

/// A wgpu context with `budget` bytes and, optionally, a small storage binding (many pages).
fn gpu_with(budget: Option<u64>, binding: Option<u64>) -> Option<Context> {
    let limits = binding.map(|b| {
        let probe = common::gpu_context(None).expect("adapter");
        let mut l = probe.limits().expect("wgpu").clone();
        l.max_storage_buffer_binding_size = b;
        l
    });
    common::gpu_context_with(ContextConfig {
        budget_bytes: budget,
        limits,
        ..Default::default()
    })
}

fn config_strategy(n: usize, q: usize) -> impl Strategy<Value = KnnConfig> {
    (0usize..4, any::<bool>(), 0usize..3, 0u64..1000).prop_flat_map(
        move |(dist, normalize, excl, seed)| {
            // SameIndex needs a reference per query (PML's ref_includes_query).
            let excl = if excl == 1 && q > n { 0 } else { excl };
            let self_exclusion = match excl {
                0 => SelfExclusion::None,
                1 => SelfExclusion::SameIndex,
                _ => SelfExclusion::QuerySlots(
                    (0..q)
                        .map(|i| ((seed as usize + 3 * i) % n.max(1)) as u32)
                        .collect(),
                ),
            };
            let visible = if excl == 0 { n } else { n - 1 };
            (1..=visible.max(1)).prop_map(move |k| KnnConfig {
                k,
                distance: DistanceConfig {
                    distance: DISTANCES[dist],
                    normalize,
                },
                self_exclusion: self_exclusion.clone(),
                ..Default::default()
            })
        },
    )
}

fn case() -> impl Strategy<Value = (Array2<f32>, Array2<f32>, KnnConfig)> {
    (
        0usize..90,
        2usize..300,
        1usize..13,
        any::<bool>(),
        0u64..10_000,
    )
        .prop_flat_map(|(q, n, d, ties, seed)| {
            let queries = embeddings(q, d, seed, ties);
            let refs = embeddings(n, d, seed + 1, ties);
            config_strategy(n, q).prop_map(move |cfg| (queries.clone(), refs.clone(), cfg))
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(24)))]

    /// One context with the adapter's budget, one with a budget so small that queries come in
    /// several chunks and references are streamed in several ranges, one with a storage
    /// binding so small that resident references span many pages.
    #[test]
    fn gpu_knn_equals_the_reference((queries, refs, cfg) in case()) {
        thread_local! {
            static CONTEXTS: Vec<Context> = [
                gpu_with(None, None),
                gpu_with(Some(32 << 10), None),
                gpu_with(None, Some(4 << 10)),
            ].into_iter().flatten().collect();
        }
        CONTEXTS.with(|contexts| {
            assert!(!contexts.is_empty() || !common::gpu_required(), "GPU contexts");
            for ctx in contexts {
                ctx.reset_peak();
                check_exact(ctx, &queries, &refs, &cfg);
                let m = ctx.memory();
                assert!(m.peak_bytes <= m.budget_bytes, "peak {m:?}");
            }
        });
    }

    #[test]
    fn native_knn_matches_the_reference((queries, refs, cfg) in case()) {
        let ctx = Context::native_cpu(None);
        let got = knn(&ctx, queries.view(), refs.view(), &cfg).expect("knn");
        let truth = pairwise_distances(&ctx, queries.view(), refs.view(), &PairwiseConfig { distance: cfg.distance, ..Default::default() })
            .expect("distances")
            .values;
        check_close(&got, &truth, &cfg, 1e-5);
    }
}

/// A native context whose budget is the search's least (`knn_plan`'s `min_bytes`): the general
/// path's, one query row per GEMM block, below the fused kernel's scratch (a chunk of packed
/// references), which the plan on a roomy context shows. `None` where the fused kernel's
/// chunk is so small (32 references of dimension ≤ 2 at `k = 1`) that its one-row plan is the
/// least.
fn general_path(queries: &Array2<f32>, refs: &Array2<f32>, cfg: &KnnConfig) -> Option<Context> {
    if cfg.k == 1 && refs.ncols() <= 2 && refs.nrows() <= 32 {
        return None;
    }
    let roomy = knn_plan(&Context::native_cpu(None), queries, refs, cfg).expect("plan");
    let tight = Context::native_cpu(Some(roomy.min_bytes));
    let general = knn_plan(&tight, queries, refs, cfg).expect("tight plan");
    if cfg.k <= 128 && queries.nrows() > 0 {
        assert!(general.bytes < roomy.bytes, "{roomy:?} vs {general:?}");
    }
    Some(tight)
}

/// The native fused kernel (`k ≤ 128` where its scratch fits) equals the general path (the
/// same search under [`general_path`]'s budget), bit for bit: on small-integer data every dot product is
/// exact in any order of summation, so both paths see the same scores and only the selection
/// (keys, ties to the lower index, exclusion, padding lanes, chunks, shards, candidate lists)
/// differs. Dimensions up to 2 048 make chunks of 32 references, so rows cross several.
fn native_fused_case() -> impl Strategy<Value = (Array2<f32>, Array2<f32>, KnnConfig)> {
    let dims = prop_oneof![1usize..13, Just(300usize), Just(2048usize)];
    (0usize..40, 3usize..200, dims, 0u64..10_000).prop_flat_map(|(q, n, d, seed)| {
        let queries = embeddings(q, d, seed, true);
        let refs = embeddings(n, d, seed + 1, true);
        // k = 1 (its own kernel) half of the time.
        (config_strategy(n, q), any::<bool>()).prop_map(move |(cfg, one)| {
            let k = if one { 1 } else { cfg.k };
            let cfg = KnnConfig { k, ..cfg };
            (queries.clone(), refs.clone(), cfg)
        })
    })
}

/// `fused` and `general` are the same answer, bit for bit.
fn assert_same(fused: &Knn, general: &Knn, what: &str) {
    assert_eq!(fused.indices, general.indices, "indices, {what}");
    let same = fused
        .scores
        .iter()
        .zip(&general.scores)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(
        same,
        "scores, {what}: {:?} vs {:?}",
        fused.scores, general.scores
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(48)))]

    #[test]
    fn native_fused_search_is_the_general_paths((queries, refs, cfg) in native_fused_case()) {
        let native = Context::native_cpu(None);
        let Some(tight) = general_path(&queries, &refs, &cfg) else {
            return Ok(());
        };
        let fused = knn(&native, queries.view(), refs.view(), &cfg).expect("fused");
        let general = knn(&tight, queries.view(), refs.view(), &cfg).expect("tight");
        assert_same(&fused, &general, &format!("{cfg:?}"));
        // Each kernel chosen by name, with the whole default budget: the same answer.
        for kernel in [NativeKnnKernel::Blocks, NativeKnnKernel::Fused] {
            let chosen = Context::new(&ContextConfig {
                backend: BackendChoice::NativeCpu,
                native_knn_kernel: kernel,
                ..Default::default()
            })
            .expect("a native context");
            let got = knn(&chosen, queries.view(), refs.view(), &cfg).expect("chosen kernel");
            assert_same(&got, &fused, &format!("{kernel:?}, {cfg:?}"));
        }
        // k = 1 is also the first neighbour of k = 2 (fused as well, by candidate lists).
        if cfg.k == 1 && refs.nrows() >= 3 {
            let two = KnnConfig { k: 2, ..cfg.clone() };
            let two = knn(&native, queries.view(), refs.view(), &two).expect("k = 2");
            prop_assert_eq!(fused.indices.column(0), two.indices.column(0));
        }
    }
}

/// The fused kernel on many query blocks and on reference shards (few queries), on scores
/// that overflow, whose keys and ties must order as the general path orders them, and on
/// spread values at dimensions around the GEMM's 256-wide slices, where the two paths sum
/// in the same order: at k = 1, 2 and 10.
#[test]
fn native_fused_blocks_shards_and_overflow_match_the_general_path() {
    let native = Context::native_cpu(None);
    let huge = |x: Array2<f32>| x.mapv(|v| v * 1e30);
    // Normalised, a row of 1e20 has a squared norm of ∞, a scale of 0 and scores of NaN
    // (∞ · 0) with 100 such references, then 0 with the rest: more NaNs than a candidate list
    // holds (2k + 64) before the first number. (Where a NaN orders depends on its sign bit,
    // which the compiler does not keep: the paths must agree, whatever it is.)
    let nan_first = Array2::from_shape_fn((130, 2), |(i, _)| if i < 100 { 1e20 } else { 1.0 });
    let cases = [
        // At least 3 query blocks.
        (embeddings(5000, 3, 1, true), embeddings(70, 3, 2, true)),
        // 3 queries: the references are split in shards over the threads.
        (embeddings(3, 7, 3, true), embeddings(1000, 7, 4, true)),
        (
            huge(embeddings(50, 4, 5, true)),
            huge(embeddings(90, 4, 6, true)),
        ),
        // Queries of ±1e30 or 0 against references (a, -a): dot products of ±∞ (a fused
        // multiply-add of finite inputs never makes NaN: it rounds the exact sum once), and,
        // normalised, norms of ∞ that divide rows to zeros, as `F.normalize` does.
        (
            Array2::from_shape_fn((30, 2), |(i, j)| match (i % 3, j) {
                (0, _) | (1, 0) | (2, 1) => 1e30,
                (1, _) => -1e30,
                _ => 0.0,
            }),
            Array2::from_shape_fn(
                (40, 2),
                |(i, j)| if (i + j) % 2 == 0 { 1e30 } else { -1e30 },
            ),
        ),
        (Array2::from_elem((3, 2), 1e20), nan_first),
        (embeddings(20, 255, 8, false), embeddings(90, 255, 9, false)),
        (
            embeddings(20, 256, 10, false),
            embeddings(90, 256, 11, false),
        ),
        (
            embeddings(20, 257, 12, false),
            embeddings(90, 257, 13, false),
        ),
        (
            embeddings(20, 600, 14, false),
            embeddings(90, 600, 15, false),
        ),
    ];
    // The fused kernel's blocks: at most 2 048 rows, as many per thread (so on any machine
    // at least three blocks of these 5 000 queries).
    let rows = knn_plan(&native, &cases[0].0, &cases[0].1, &KnnConfig::default())
        .expect("plan")
        .rows;
    assert!(
        rows <= 2048 && 5000usize.div_ceil(rows) >= 3,
        "{rows} rows a block"
    );
    for (queries, refs) in &cases {
        for distance in DISTANCES {
            for (normalize, self_exclusion) in [
                (false, SelfExclusion::None),
                (true, SelfExclusion::SameIndex),
            ] {
                if self_exclusion == SelfExclusion::SameIndex && queries.nrows() > refs.nrows() {
                    continue;
                }
                for k in [1, 2, 10] {
                    let cfg = KnnConfig {
                        k,
                        distance: DistanceConfig {
                            distance,
                            normalize,
                        },
                        self_exclusion: self_exclusion.clone(),
                        ..Default::default()
                    };
                    let what = format!("{:?} × {:?}, {cfg:?}", queries.dim(), refs.dim());
                    let fused = knn(&native, queries.view(), refs.view(), &cfg).expect("fused");
                    let tight = general_path(queries, refs, &cfg).expect("a general path");
                    let general = knn(&tight, queries.view(), refs.view(), &cfg).expect("tight");
                    assert_same(&fused, &general, &what);
                }
            }
        }
    }
    // The overflow cases do reach infinite scores raw; normalised as torch's `F.normalize`
    // (division by the norm), a row whose norm overflows divides to zeros: finite scores.
    let (queries, refs) = &cases[3];
    let scores = |normalize| {
        let cfg = KnnConfig {
            k: 1,
            distance: DistanceConfig {
                distance: Distance::DotProduct,
                normalize,
            },
            ..Default::default()
        };
        knn(&native, queries.view(), refs.view(), &cfg)
            .expect("fused")
            .scores
    };
    assert!(
        scores(false).iter().any(|s| s.is_infinite()),
        "{:?}",
        scores(false)
    );
    assert!(
        scores(true).iter().all(|s| s.is_finite()) && scores(true).iter().any(|&s| s == 0.0),
        "{:?}",
        scores(true)
    );
}

#[test]
fn k_equal_to_n_and_k_one_with_duplicates() {
    let Some(ctx) = common::shared_gpu() else {
        return;
    };
    let native = Context::native_cpu(None);
    // Every reference three times: ties everywhere, broken by index.
    let base = embeddings(40, 5, 7, true);
    let refs = ndarray::concatenate(ndarray::Axis(0), &[base.view(), base.view(), base.view()])
        .expect("stack");
    let queries = embeddings(67, 5, 8, true);
    for distance in DISTANCES {
        for k in [1, refs.nrows()] {
            let cfg = KnnConfig {
                k,
                distance: DistanceConfig {
                    distance,
                    normalize: false,
                },
                ..Default::default()
            };
            check_exact(ctx, &queries, &refs, &cfg);
            check_exact(&native, &queries, &refs, &cfg);
        }
    }
}

#[test]
fn self_exclusion_is_by_index_even_among_identical_rows() {
    let native = Context::native_cpu(None);
    let x = Array2::from_elem((6, 3), 1.0f32);
    // Raw rows of ones: every distance is exactly 0 on any device, a true tie.
    let cfg = KnnConfig {
        k: 5,
        self_exclusion: SelfExclusion::SameIndex,
        distance: DistanceConfig {
            distance: Distance::SquaredEuclidean,
            normalize: false,
        },
        ..Default::default()
    };
    let contexts: Vec<&Context> = common::shared_gpu().into_iter().chain([&native]).collect();
    for ctx in contexts {
        let found = knn(ctx, x.view(), x.view(), &cfg).expect("knn");
        for i in 0..6u32 {
            let want: Vec<u32> = (0..6).filter(|&j| j != i).collect();
            assert_eq!(found.indices.row(i as usize).to_vec(), want, "row {i}");
        }
    }
}

#[test]
fn tight_budget_with_100k_references_stays_under_it() {
    let budget = 8 << 20;
    let contexts = [
        Some(Context::native_cpu(Some(budget))),
        common::gpu_context(Some(budget)),
    ];
    for ctx in contexts.into_iter().flatten() {
        tight_budget_with_100k_references(&ctx, budget);
    }
}

fn tight_budget_with_100k_references(ctx: &Context, budget: u64) {
    let (q, n, d) = (40, 100_000, 64);
    let queries = embeddings(q, d, 1, false);
    let refs = embeddings(n, d, 2, false);
    let native = Context::native_cpu(None);
    for k in [1, 10, 3000] {
        let cfg = KnnConfig {
            k,
            distance: DistanceConfig {
                distance: Distance::Cosine,
                normalize: true,
            },
            ..Default::default()
        };
        ctx.reset_peak();
        let got = knn(ctx, queries.view(), refs.view(), &cfg).expect("knn under 8 MiB");
        let m = ctx.memory();
        assert!(
            m.peak_bytes <= budget,
            "peak {} > 8 MiB on {}",
            m.peak_bytes,
            ctx.device_name()
        );
        assert!(m.peak_bytes > 0, "the scratch is counted");
        assert_eq!(m.current_bytes, 0, "everything released");
        let truth = pairwise_distances(
            &native,
            queries.view(),
            refs.view(),
            &PairwiseConfig {
                distance: cfg.distance,
                ..Default::default()
            },
        )
        .expect("distances")
        .values;
        check_close(&got, &truth, &cfg, 1e-5);
    }
}

/// Progress reports rise to `q · n` one at a time and leave the answer unchanged: the native
/// path with few queries (reference shards on every thread) and with many (query blocks), and
/// the wgpu path under a budget that forces several query chunks.
#[test]
fn progress_reports_rise_to_the_total_and_change_nothing() {
    let contexts = [
        Some(Context::native_cpu(None)),
        common::gpu_context(Some(2 << 20)),
    ];
    for ctx in contexts.into_iter().flatten() {
        for (q, n) in [(3, 5000), (700, 1500)] {
            let queries = embeddings(q, 16, 5, false);
            let refs = embeddings(n, 16, 6, false);
            let cfg = KnnConfig {
                k: 7,
                ..Default::default()
            };
            let seen = Arc::new(Mutex::new(Vec::new()));
            let log = Arc::clone(&seen);
            let with_hooks = KnnConfig {
                hooks: Hooks::new().on_progress(move |p: Progress| {
                    log.lock().expect("lock").push(p);
                }),
                ..cfg.clone()
            };
            let with =
                knn(&ctx, queries.view(), refs.view(), &with_hooks).expect("knn with progress");
            let without = knn(&ctx, queries.view(), refs.view(), &cfg).expect("knn");
            assert_eq!(with.indices, without.indices);
            assert_eq!(with.scores, without.scores);
            let seen = seen.lock().expect("lock").clone();
            let total = (q * n) as u64;
            assert!(seen.iter().all(|p| p.total == total), "{seen:?}");
            assert!(seen.windows(2).all(|w| w[0].done < w[1].done), "{seen:?}");
            assert_eq!(seen.last().map(|p| p.done), Some(total));
            if q == 700 {
                assert!(seen.len() > 1, "{} reported once", ctx.device_name());
            }
        }
    }
}

#[test]
fn sharded_over_two_contexts_gives_the_single_device_answer() {
    let (Some(a), Some(b)) = (
        common::gpu_context(None),
        common::gpu_context(Some(1 << 20)),
    ) else {
        return;
    };
    let native = Context::native_cpu(None);
    let queries = embeddings(70, 9, 3, true);
    let refs = embeddings(501, 9, 4, true);
    for self_exclusion in [SelfExclusion::None, SelfExclusion::SameIndex] {
        let cfg = KnnConfig {
            k: 300,
            self_exclusion,
            ..Default::default()
        };
        let one = knn(&a, queries.view(), refs.view(), &cfg).expect("single");
        let two = knn_sharded(&[&a, &b], queries.view(), refs.view(), &cfg).expect("sharded");
        assert_eq!(one.indices, two.indices, "same neighbours");
        assert_eq!(one.scores, two.scores, "same scores");
        // A GPU and the native path side by side: the same answer up to rounding.
        let mixed = knn_sharded(&[&a, &native], queries.view(), refs.view(), &cfg).expect("mixed");
        let truth = pairwise_distances(
            &a,
            queries.view(),
            refs.view(),
            &PairwiseConfig {
                distance: cfg.distance,
                ..Default::default()
            },
        )
        .expect("distances")
        .values;
        check_close(&mixed, &truth, &cfg, 1e-5);
    }
}

#[test]
fn knn_against_a_memory_bank_equals_knn_against_its_snapshot() {
    let gpu = common::shared_gpu();
    let native = Context::native_cpu(None);
    for ctx in gpu.into_iter().chain([&native]) {
        let mut bank = MemoryBank::<u32>::new(ctx, &BankConfig::new(50, 6)).expect("bank");
        for step in 0..3 {
            let x = embeddings(23, 6, step, true);
            let labels = Array1::from_elem(23, 0u32);
            let enq = bank
                .enqueue(ctx, &MiningSet::new(&x, &labels))
                .expect("enqueue");
            let cfg = KnnConfig {
                k: 12,
                self_exclusion: enq.self_exclusion.clone(),
                ..Default::default()
            };
            let got = knn(ctx, x.view(), bank.rows(), &cfg).expect("bank knn");
            let snap = bank.snapshot(ctx).expect("snapshot");
            check_exact(ctx, &x, &snap.embeddings, &cfg);
            let host = knn(ctx, x.view(), snap.embeddings.view(), &cfg).expect("host knn");
            assert_eq!(got.indices, host.indices, "step {step}");
            assert_eq!(got.scores, host.scores, "step {step}");
        }
    }
}

#[test]
fn bad_inputs_get_typed_errors() {
    let native = Context::native_cpu(None);
    let contexts: Vec<&Context> = common::shared_gpu().into_iter().chain([&native]).collect();
    let x = embeddings(5, 3, 1, false);
    let cfg = |k| KnnConfig {
        k,
        ..Default::default()
    };
    for ctx in contexts {
        let k_err = |r: Result<Knn, Error>, k: usize| match r {
            Err(Error::InvalidParameter {
                what: "k", value, ..
            }) => assert_eq!(value, k.to_string()),
            other => panic!("k = {k}: {other:?}"),
        };
        k_err(knn(ctx, x.view(), x.view(), &cfg(0)), 0);
        k_err(knn(ctx, x.view(), x.view(), &cfg(6)), 6);
        let own = KnnConfig {
            self_exclusion: SelfExclusion::SameIndex,
            ..cfg(5)
        };
        k_err(knn(ctx, x.view(), x.view(), &own), 5);
        let empty = Array2::<f32>::zeros((0, 3));
        k_err(knn(ctx, x.view(), empty.view(), &cfg(1)), 1);
        let mut bad = x.clone();
        bad[[2, 1]] = f32::NAN;
        assert!(matches!(
            knn(ctx, bad.view(), x.view(), &cfg(1)),
            Err(Error::NonFinite {
                what: "queries",
                row: 2,
                col: 1,
                ..
            })
        ));
        bad[[2, 1]] = f32::INFINITY;
        assert!(matches!(
            knn(ctx, x.view(), bad.view(), &cfg(1)),
            Err(Error::NonFinite {
                what: "refs",
                row: 2,
                col: 1,
                ..
            })
        ));
        let wide = embeddings(5, 4, 1, false);
        assert!(matches!(
            knn(ctx, x.view(), wide.view(), &cfg(1)),
            Err(Error::Shape { .. })
        ));
        let flat = Array2::<f32>::zeros((5, 0));
        assert!(matches!(
            knn(ctx, flat.view(), flat.view(), &cfg(1)),
            Err(Error::Shape { .. })
        ));
        let slots = KnnConfig {
            self_exclusion: SelfExclusion::QuerySlots(vec![0, 1]),
            ..cfg(1)
        };
        assert!(matches!(
            knn(ctx, x.view(), x.view(), &slots),
            Err(Error::Shape {
                what: "self_exclusion",
                ..
            })
        ));
        assert!(matches!(
            knn_sharded(&[], x.view(), x.view(), &cfg(1)),
            Err(Error::InvalidParameter {
                what: "contexts",
                ..
            })
        ));
        // No queries: an empty answer, not an error.
        let none = knn(ctx, empty.view(), x.view(), &cfg(2)).expect("no queries");
        assert_eq!(none.indices.dim(), (0, 2));
    }
    // A bank belongs to the context that made it.
    if let Some(gpu) = common::shared_gpu() {
        let mut bank = MemoryBank::<u32>::new(gpu, &BankConfig::new(8, 3)).expect("bank");
        bank.enqueue(gpu, &MiningSet::new(&x, Array1::zeros(5).view()))
            .expect("enqueue");
        let other = gpu_with(None, None).expect("second context");
        for ctx in [&other, &native] {
            assert!(matches!(
                knn(ctx, x.view(), bank.rows(), &cfg(1)),
                Err(Error::InvalidParameter {
                    what: "context",
                    ..
                })
            ));
        }
        let narrow = x.slice(s![.., ..2]).to_owned();
        assert!(matches!(
            knn(gpu, narrow.view(), bank.rows(), &cfg(1)),
            Err(Error::Shape { .. })
        ));
    }
}

/// Natively, a call decides once whether it computes its distances directly (at most 25 rows
/// a side, as `torch.cdist`): shards of a larger call never do, so sharding over native
/// contexts gives the single call's bits.
#[test]
fn native_shards_of_a_small_call_give_the_single_call_bits() {
    let (a, b) = (Context::native_cpu(None), Context::native_cpu(None));
    // 20 queries against 40 references: not direct; each shard of 20 alone would be.
    let queries = embeddings(20, 6, 7, false);
    let refs = embeddings(40, 6, 8, false);
    for distance in [
        Distance::Euclidean,
        Distance::SquaredEuclidean,
        Distance::Cosine,
    ] {
        let cfg = KnnConfig {
            k: 30,
            distance: DistanceConfig {
                distance,
                normalize: true,
            },
            ..Default::default()
        };
        let one = knn(&a, queries.view(), refs.view(), &cfg).expect("single");
        let two = knn_sharded(&[&a, &b], queries.view(), refs.view(), &cfg).expect("sharded");
        assert_eq!(one.indices, two.indices, "{distance:?}");
        assert_eq!(one.scores, two.scores, "{distance:?}");
    }
}
