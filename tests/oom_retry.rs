//! Recovery from device out-of-memory (`src/context/oom_retry.rs`): a context that pretends its device
//! holds only a few MiB (`ContextConfig::simulated_device_bytes`, failing allocations the way
//! the driver's out-of-memory does) while its budget allows 64 MiB. Every wgpu operation must
//! retry with smaller tiles and give exactly the answer of an unconstrained context, hand a
//! stream every triplet once, end with nothing allocated, and, when even its smallest tile
//! cannot fit, return `Error::OutOfMemory` and leave the context usable.

use crate::common;

use std::ops::ControlFlow;

use ndarray::{Array1, Array2};
use wgpu_metric_learning::{
    accuracy, batch_hard_triplets, count_triplets, knn, mine_triplets, mine_triplets_streaming,
    multi_similarity_pairs, pairwise_distances, AccuracyConfig, AccuracyK, BankConfig,
    BatchHardConfig, Context, ContextConfig, DistanceConfig, Error, KnnConfig, MemoryBank,
    MiningSet, MultiSimilarityConfig, PairwiseConfig, TripletConfig, TripletType,
};

const BUDGET: u64 = 64 << 20;
/// What the pretend device holds: far below what the plans for 64 MiB ask for.
const DEVICE: u64 = 2 << 20;

fn clustered(n: usize, d: usize, classes: u32, seed: u32) -> (Array2<f32>, Array1<u32>) {
    let x = Array2::from_shape_fn((n, d), |(i, k)| {
        let c = (i as u32 % classes) as f32;
        let h = ((i as u32 ^ seed).wrapping_mul(2_654_435_761) >> 8) as f32 / 16_777_216.0;
        (c * 1.7 + k as f32 * 0.3).sin() + 0.4 * (h * (k + 1) as f32).fract()
    });
    (x, Array1::from_shape_fn(n, |i| i as u32 % classes))
}

/// The reference context (budget only) and the faulty one; `None` without an adapter.
fn contexts() -> Option<(Context, Context)> {
    let roomy = common::gpu_context(Some(BUDGET))?;
    let faulty = common::gpu_context_with(ContextConfig {
        budget_bytes: Some(BUDGET),
        simulated_device_bytes: Some(DEVICE),
        ..Default::default()
    })?;
    Some((roomy, faulty))
}

/// Runs `op` on both contexts: the faulty one must give the same answer, within the pretend
/// device, and release everything; the roomy one must have needed more (so the retry ran).
fn same_after_retry<T: PartialEq + std::fmt::Debug>(
    what: &str,
    (roomy, faulty): &(Context, Context),
    op: impl Fn(&Context) -> T,
) {
    roomy.reset_peak();
    faulty.reset_peak();
    let want = op(roomy);
    let got = op(faulty);
    assert_eq!(got, want, "{what}: same answer after retrying");
    let (r, f) = (roomy.memory(), faulty.memory());
    assert!(
        r.peak_bytes > DEVICE,
        "{what}: the first plan must overflow the device ({} bytes)",
        r.peak_bytes
    );
    assert!(f.peak_bytes <= DEVICE, "{what}: peak {}", f.peak_bytes);
    assert_eq!(f.current_bytes, 0, "{what}: a retry leaks nothing");
}

#[test]
fn every_operation_retries_with_smaller_tiles_and_gives_the_same_answer() {
    let Some(pair) = contexts() else {
        return;
    };
    let (x, y) = clustered(500, 48, 9, 1);
    let (r, ry) = clustered(2000, 48, 9, 2);
    let set = MiningSet::new(&x, &y);

    same_after_retry("pairwise_distances", &pair, |ctx| {
        pairwise_distances(
            ctx,
            x.view(),
            r.view(),
            &PairwiseConfig {
                distance: DistanceConfig::default(),
                ..Default::default()
            },
        )
        .expect("distances")
        .values
    });
    same_after_retry("knn", &pair, |ctx| {
        let cfg = KnnConfig {
            k: 40,
            ..Default::default()
        };
        let found = knn(ctx, x.view(), r.view(), &cfg).expect("knn");
        (found.indices, found.scores)
    });
    same_after_retry("accuracy", &pair, |ctx| {
        let cfg = AccuracyConfig {
            k: AccuracyK::MaxBinCount,
            ..Default::default()
        };
        let acc = accuracy(ctx, &MiningSet::new(&r, &ry), None, &cfg).expect("accuracy");
        format!("{:?}", acc.metrics)
    });
    for kind in [TripletType::All, TripletType::Semihard] {
        let cfg = TripletConfig::margin_miner(kind);
        same_after_retry("mine_triplets", &pair, |ctx| {
            mine_triplets(ctx, &set, None, &cfg).expect("mine").indices
        });
        same_after_retry("count_triplets", &pair, |ctx| {
            count_triplets(ctx, &set, None, &cfg).expect("count").count
        });
        // Small chunks: several are delivered before the device refuses, and none twice.
        let cfg = TripletConfig {
            max_chunk_triplets: 5000,
            ..cfg
        };
        same_after_retry("mine_triplets_streaming", &pair, |ctx| {
            let mut rows = Vec::new();
            mine_triplets_streaming(ctx, &set, None, &cfg, |chunk| {
                rows.extend(chunk.iter().copied());
                ControlFlow::Continue(())
            })
            .expect("stream");
            rows
        });
    }
    same_after_retry("multi_similarity_pairs", &pair, |ctx| {
        let p = multi_similarity_pairs(ctx, &set, None, &MultiSimilarityConfig::default())
            .expect("pairs");
        (p.positives, p.negatives)
    });
    same_after_retry("batch_hard_triplets", &pair, |ctx| {
        batch_hard_triplets(ctx, &set, None, &BatchHardConfig::default())
            .expect("batch hard")
            .indices
    });
}

#[test]
fn mining_and_knn_against_a_bank_retry_too() {
    let Some((roomy, faulty)) = contexts() else {
        return;
    };
    let (x, y) = clustered(1500, 32, 7, 3);
    let (q, qy) = clustered(400, 32, 7, 4);
    let run = |ctx: &Context| {
        let mut bank = MemoryBank::<u32>::new(ctx, &BankConfig::new(2000, 32)).expect("bank");
        bank.enqueue(ctx, &MiningSet::new(&x, &y)).expect("enqueue");
        ctx.reset_peak();
        let batch = MiningSet::new(&q, &qy);
        let cfg = TripletConfig::margin_miner(TripletType::Hard);
        let mined = mine_triplets(ctx, &batch, Some(&bank.refs()), &cfg).expect("mine");
        let hard = batch_hard_triplets(ctx, &batch, Some(&bank.refs()), &Default::default())
            .expect("batch hard");
        let cfg = KnnConfig {
            k: 25,
            ..Default::default()
        };
        let found = knn(ctx, q.view(), bank.rows(), &cfg).expect("knn");
        let held = 2000 * 32 * 4;
        (
            (mined.indices, hard.indices, found.indices),
            ctx.memory().peak_bytes - held,
        )
    };
    let (want, roomy_peak) = run(&roomy);
    let (got, faulty_peak) = run(&faulty);
    assert_eq!(got, want, "same answers against the bank");
    assert!(roomy_peak + 2000 * 32 * 4 > DEVICE, "the retry was needed");
    assert!(faulty_peak + 2000 * 32 * 4 <= DEVICE);
    assert_eq!(
        faulty.memory().current_bytes,
        0,
        "the bank is gone, so is all"
    );
}

#[test]
fn below_the_smallest_tile_it_is_out_of_memory_and_the_context_stays_usable() {
    let Some(ctx) = common::gpu_context_with(ContextConfig {
        budget_bytes: Some(BUDGET),
        simulated_device_bytes: Some(1 << 20),
        ..Default::default()
    }) else {
        return;
    };
    // Mining keeps its references resident: 20 000 × 64 floats (5 MiB) can never fit 1 MiB.
    let (x, y) = clustered(20, 64, 3, 5);
    let (r, ry) = clustered(20_000, 64, 3, 6);
    let refs = MiningSet::new(&r, &ry);
    let batch = MiningSet::new(&x, &y);
    let cfg = TripletConfig::margin_miner(TripletType::Hard);
    let got = mine_triplets(&ctx, &batch, Some(&refs), &cfg);
    assert!(
        matches!(got, Err(Error::OutOfMemory { .. })),
        "the driver's refusal, not a planner error: {got:?}"
    );
    assert_eq!(ctx.memory().current_bytes, 0, "nothing left allocated");
    // The same context still works for what fits.
    let refs = MiningSet::new(&x, &y);
    let small = mine_triplets(&ctx, &batch, Some(&refs), &cfg).expect("a small problem runs");
    // Against the same device with room (the native path's distances may differ in the last
    // bits, and a hard-triplet test `an <= ap` can turn on them).
    let roomy = common::gpu_context(None).expect("a second context on the adapter");
    let want = mine_triplets(&roomy, &batch, Some(&refs), &cfg).expect("roomy");
    assert_eq!(small.indices, want.indices);
}
