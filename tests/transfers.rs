//! Host–device traffic as the transfer layer counts it: the host waits for the device at most
//! once per kNN query chunk and at most twice per mining anchor chunk (once for all-valid
//! rules), only results come back (never the lists a margin rule mines from), and every
//! result carries its own call's share of the context's counters. The native path moves
//! nothing.

use crate::common;

use ndarray::{Array1, Array2};
use wgpu_metric_learning::{
    accuracy, count_triplets, knn, knn_plan, knn_sharded, mine_triplets, mine_triplets_plan,
    pairwise_distances, AccuracyConfig, BankConfig, ComputePath, Context, KnnConfig, MemoryBank,
    MiningSet, Transfers, TripletConfig, TripletType,
};

fn data(rows: usize, d: usize, classes: usize) -> (Array2<f32>, Array1<u32>) {
    let x = Array2::from_shape_fn((rows, d), |(i, k)| {
        ((i as f32 * 0.37 + k as f32 * 1.13).sin() * 3.0).fract()
    });
    let y = Array1::from_shape_fn(rows, |i| (i % classes) as u32);
    (x, y)
}

/// What the context counted since `before`.
fn since(ctx: &Context, before: Transfers) -> Transfers {
    ctx.transfers().since(&before)
}

#[test]
fn knn_waits_at_most_once_per_query_chunk_and_reads_back_only_the_lists() {
    let (q, k) = (600, 5);
    let (x, _) = data(q, 16, 10);
    let cfg = KnnConfig {
        k,
        ..Default::default()
    };
    // A budget that takes several query chunks, and one that takes one.
    for budget in [1 << 20, 64 << 20] {
        let Some(ctx) = common::gpu_context_as_shipped(Some(budget)) else {
            return;
        };
        let plan = knn_plan(&ctx, &x, &x, &cfg).expect("plan");
        let before = ctx.transfers();
        let found = knn(&ctx, &x, &x, &cfg).expect("knn");
        let t = found.transfers;
        assert_eq!(since(&ctx, before), t, "the result counts its own call");
        let chunks = plan.chunks as u64;
        assert!(
            (1..=chunks).contains(&t.host_waits),
            "{plan:?}: {t:?} waits more than once per query chunk"
        );
        assert_eq!(
            t.bytes_down,
            (q * k * 8) as u64,
            "only the (key, index) lists"
        );
        if budget == 64 << 20 {
            // Resident references (one upload submission), one range per chunk: each chunk
            // is one submission. On a hardware adapter, a GEMM bucket tuned during the call
            // (not found in the tuner's cache) first submits what was recorded before it.
            assert_eq!(chunks, 1, "{plan:?}");
            let tuned = u64::from(t.host.tune_ns > 0);
            assert!(t.submissions <= chunks + 1 + tuned, "{plan:?}: {t:?}");
        }
    }
}

#[test]
fn margin_mining_waits_at_most_twice_per_anchor_chunk_and_never_reads_the_lists() {
    let (b, classes) = (300, 6);
    let (x, y) = data(b, 8, classes);
    let set = MiningSet::new(&x, &y);
    // Several anchor chunks, each of whose kept triplets (about 1650 per anchor here) fit one
    // output window of 300 000: a chunk that keeps more than its window holds takes one more
    // wait per extra window.
    let cfg = TripletConfig {
        max_chunk_triplets: 300_000,
        ..TripletConfig::margin_miner(TripletType::Semihard)
    };
    let Some(ctx) = common::gpu_context_as_shipped(Some(4 << 20)) else {
        return;
    };
    let plan = mine_triplets_plan(&ctx, &set, None, &cfg).expect("plan");
    assert!(plan.chunks > 1, "the case takes several chunks: {plan:?}");
    let before = ctx.transfers();
    let mined = mine_triplets(&ctx, &set, None, &cfg).expect("mine");
    let t = mined.transfers;
    assert_eq!(since(&ctx, before), t);
    assert!(!mined.is_empty(), "the case keeps semihard triplets");
    let chunks = plan.chunks as u64;
    assert!(
        t.host_waits <= 2 * chunks,
        "{plan:?}: {t:?} waits more than twice per anchor chunk"
    );
    // Per anchor: its list sizes (checked against the labels'); per (anchor, positive) pair:
    // its count; per triplet: its negative. No list comes back.
    let pairs = (b * (b / classes - 1)) as u64;
    let want = 8 * b as u64 + 4 * pairs + 4 * mined.len() as u64;
    assert_eq!(t.bytes_down, want, "{t:?}");
    // Counting takes the first wait of each chunk only.
    let counted = count_triplets(&ctx, &set, None, &cfg).expect("count");
    assert_eq!(counted.count, mined.len() as u64);
    assert!(
        counted.transfers.host_waits <= chunks,
        "{:?}",
        counted.transfers
    );
}

#[test]
fn all_valid_mining_waits_at_most_once_per_anchor_chunk_and_counting_not_at_all() {
    let (b, classes) = (300, 6);
    let (x, y) = data(b, 8, classes);
    let set = MiningSet::new(&x, &y);
    let cfg = TripletConfig::default();
    let Some(ctx) = common::gpu_context_as_shipped(Some(1 << 20)) else {
        return;
    };
    let plan = mine_triplets_plan(&ctx, &set, None, &cfg).expect("plan");
    let mined = mine_triplets(&ctx, &set, None, &cfg).expect("mine");
    assert!(
        (1..=plan.chunks as u64).contains(&mined.transfers.host_waits),
        "{plan:?}: {:?}",
        mined.transfers
    );
    let counted = count_triplets(&ctx, &set, None, &cfg).expect("count");
    assert_eq!(counted.count, mined.len() as u64);
    assert_eq!(
        counted.transfers,
        Transfers::default(),
        "label arithmetic only"
    );
}

#[test]
fn every_result_counts_its_own_call_and_the_native_path_moves_nothing() {
    let (x, y) = data(200, 12, 5);
    let set = MiningSet::new(&x, &y);
    let Some(gpu) = common::gpu_context_as_shipped(None) else {
        return;
    };
    let native = Context::native_cpu(None);
    for ctx in [&native, &gpu] {
        let on_gpu = ctx.path() == ComputePath::Wgpu;
        let check = |what: &str, before: Transfers, t: Transfers| {
            assert_eq!(since(ctx, before), t, "{what}");
            assert_eq!(t.host_waits > 0, on_gpu, "{what}: {t:?}");
            assert_eq!(t.bytes_down > 0, on_gpu, "{what}: {t:?}");
        };
        let before = ctx.transfers();
        let d = pairwise_distances(ctx, &x, &x, &Default::default()).expect("distances");
        check("pairwise_distances", before, d.transfers);
        let before = ctx.transfers();
        let acc = accuracy(ctx, &set, None, &AccuracyConfig::default()).expect("accuracy");
        check("accuracy", before, acc.transfers);
        let before = ctx.transfers();
        let cfg = KnnConfig::default();
        let sharded = knn_sharded(&[ctx, ctx], &x, &x, &cfg).expect("sharded");
        check("knn_sharded", before, sharded.transfers);
        if on_gpu {
            // Each shard waits for its lists unless the other shard's poll ran its callback
            // first (both shards share this device), so at least one wait in all.
            assert!(sharded.transfers.host_waits >= 1, "{:?}", sharded.transfers);
        }
        let mut bank = MemoryBank::<u32>::new(ctx, &BankConfig::new(64, 12)).expect("bank");
        let before = ctx.transfers();
        let (bx, by) = data(40, 12, 5);
        let enq = bank
            .enqueue(ctx, &MiningSet::new(&bx, &by))
            .expect("enqueue");
        assert_eq!(since(ctx, before), enq.transfers, "enqueue");
        let waits = u64::from(on_gpu);
        assert_eq!(enq.transfers.host_waits, waits, "one wait, at the end");
    }
    assert_eq!(native.transfers(), Transfers::default());
}
