//! A long run of a training loop: enqueue a batch into a memory bank, mine it against the bank
//! (semihard, and a stream of every valid triplet), search its neighbours among the bank's
//! rows, again and again. Tracked bytes must come back to the same baseline after every
//! iteration (no leak, not one byte), and at the end the bank must equal its host model.
//!
//! In CI it runs for `WML_SOAK_SECS` seconds (default 10) on each path; the full two minutes
//! run with `cargo test --test root soak -- --ignored`.

use crate::common;

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use ndarray::{Array1, Array2};
use wgpu_metric_learning::{
    knn, mine_triplets, mine_triplets_streaming, BankConfig, Context, KnnConfig, MemoryBank,
    MiningSet, TripletConfig, TripletType,
};

const DIM: usize = 24;
const CAPACITY: usize = 700;
const BATCH: usize = 96;

fn soak_on_every_path(duration: Duration) {
    let contexts = [
        Some(Context::native_cpu(Some(64 << 20))),
        common::gpu_context(Some(64 << 20)),
    ];
    for ctx in contexts.into_iter().flatten() {
        soak(&ctx, duration);
    }
}

#[test]
fn a_short_soak_leaks_nothing() {
    let secs = std::env::var("WML_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    soak_on_every_path(Duration::from_secs(secs));
}

#[test]
#[ignore = "two minutes per path; run with --ignored"]
fn a_two_minute_soak_leaks_nothing() {
    soak_on_every_path(Duration::from_secs(120));
}

fn soak(ctx: &Context, duration: Duration) {
    let mut bank = MemoryBank::<u32>::new(ctx, &BankConfig::new(CAPACITY, DIM)).expect("bank");
    let baseline = ctx.memory().current_bytes;
    let mut model_rows = Array2::<f32>::zeros((CAPACITY, DIM));
    let mut model_labels = vec![0u32; CAPACITY];
    let (mut head, mut len) = (0usize, 0usize);
    let started = Instant::now();
    let mut iterations = 0u64;
    let mut triplets = 0u64;
    while started.elapsed() < duration || iterations < 3 {
        let seed = iterations as usize;
        let x = Array2::from_shape_fn((BATCH, DIM), |(r, k)| {
            let h = ((seed * BATCH + r) * 7919 + k * 104_729) % 10_007;
            ((r % 6) as f32 * 0.9 + k as f32 * 0.13).cos() + h as f32 * 2e-5
        });
        let y = Array1::from_shape_fn(BATCH, |r| ((r + seed) % 6) as u32);
        let done = bank.enqueue(ctx, &MiningSet::new(&x, &y)).expect("enqueue");
        for r in 0..BATCH {
            let slot = (head + r) % CAPACITY;
            model_rows.row_mut(slot).assign(&x.row(r));
            model_labels[slot] = y[r];
        }
        head = (head + BATCH) % CAPACITY;
        len = (len + BATCH).min(CAPACITY);

        let batch = MiningSet::new(&x, &y);
        let cfg = TripletConfig {
            self_exclusion: done.self_exclusion.clone(),
            ..TripletConfig::margin_miner(TripletType::Semihard)
        };
        triplets += mine_triplets(ctx, &batch, Some(&bank.refs()), &cfg)
            .expect("mine")
            .len() as u64;
        let cfg = TripletConfig {
            self_exclusion: done.self_exclusion.clone(),
            max_chunk_triplets: 20_000,
            ..Default::default()
        };
        let streamed = mine_triplets_streaming(ctx, &batch, Some(&bank.refs()), &cfg, |_| {
            ControlFlow::Continue(())
        })
        .expect("stream");
        triplets += streamed.count;
        let cfg = KnnConfig {
            k: 10,
            ..Default::default()
        };
        let found = knn(ctx, x.view(), bank.rows(), &cfg).expect("knn");
        assert_eq!(found.indices.dim(), (BATCH, 10));
        assert_eq!(
            ctx.memory().current_bytes,
            baseline,
            "iteration {iterations}: tracked bytes back to the baseline"
        );
        iterations += 1;
    }
    let snap = bank.snapshot(ctx).expect("snapshot");
    assert_eq!(bank.len(), len);
    assert_eq!(snap.embeddings, model_rows.slice(ndarray::s![..len, ..]));
    assert_eq!(snap.labels.to_vec(), model_labels[..len].to_vec());
    assert_eq!(ctx.memory().current_bytes, baseline);
    eprintln!(
        "soak on {}: {iterations} iterations in {:.1} s, {triplets} triplets, leak 0 bytes \
         (baseline {baseline} bytes, peak {})",
        ctx.device_name(),
        started.elapsed().as_secs_f64(),
        ctx.memory().peak_bytes
    );
}
