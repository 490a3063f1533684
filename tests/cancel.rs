//! Cancellation through `cfg.hooks`: every operation, on both paths, returns
//! `Error::Cancelled` when its token is cancelled, with nothing left allocated; a long kNN
//! search and a triplet stream cancelled from another thread stop within one chunk.

use crate::common;

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

use ndarray::{Array1, Array2};
use wgpu_metric_learning::{
    accuracy, all_pairs, batch_easy_hard_pairs, batch_hard_triplets, count_triplets, knn,
    knn_sharded, mine_triplets, mine_triplets_streaming, multi_similarity_pairs, pair_margin_pairs,
    pairwise_distances, AccuracyConfig, AllPairsConfig, BatchEasyHardConfig, BatchHardConfig,
    CancelToken, Context, Error, Hooks, KnnConfig, MiningSet, MultiSimilarityConfig,
    PairMarginConfig, PairwiseConfig, Progress, Result, TripletConfig, TripletType,
};

fn data(rows: usize, d: usize, classes: usize) -> (Array2<f32>, Array1<u32>) {
    let x = Array2::from_shape_fn((rows, d), |(i, k)| {
        ((i as f32 * 0.37 + k as f32 * 1.13).sin() * 3.0).fract()
    });
    let y = Array1::from_shape_fn(rows, |i| (i % classes) as u32);
    (x, y)
}

/// The contexts a test runs on: the native path and, when there is one, the GPU.
fn contexts() -> Vec<Context> {
    let mut all = vec![Context::native_cpu(None)];
    all.extend(common::gpu_context(None));
    all
}

fn is_cancelled<T>(what: &str, got: Result<T>) {
    match got {
        Err(Error::Cancelled { .. }) => {}
        Err(e) => panic!("{what}: expected Cancelled, got {e}"),
        Ok(_) => panic!("{what}: expected Cancelled, got a result"),
    }
}

#[test]
fn every_operation_stops_when_cancelled_and_leaves_nothing_allocated() {
    let token = CancelToken::new();
    token.cancel();
    let hooks = Hooks::new().cancel_with(&token);
    let (x, y) = data(300, 8, 5);
    let set = MiningSet::new(&x, &y);
    for ctx in contexts() {
        let path = ctx.device_name();
        let knn_cfg = KnnConfig {
            k: 3,
            hooks: hooks.clone(),
            ..Default::default()
        };
        let triplets = TripletConfig {
            hooks: hooks.clone(),
            ..TripletConfig::margin_miner(TripletType::Semihard)
        };
        let pairwise = PairwiseConfig {
            hooks: hooks.clone(),
            ..Default::default()
        };
        is_cancelled(&path, pairwise_distances(&ctx, &x, &x, &pairwise));
        is_cancelled(&path, knn(&ctx, &x, &x, &knn_cfg));
        is_cancelled(&path, knn_sharded(&[&ctx, &ctx], &x, &x, &knn_cfg));
        let acc = AccuracyConfig {
            hooks: hooks.clone(),
            ..Default::default()
        };
        is_cancelled(&path, accuracy(&ctx, &set, None, &acc));
        is_cancelled(&path, mine_triplets(&ctx, &set, None, &triplets));
        is_cancelled(&path, count_triplets(&ctx, &set, None, &triplets));
        is_cancelled(
            &path,
            mine_triplets_streaming(&ctx, &set, None, &triplets, |_| ControlFlow::Continue(())),
        );
        let all = AllPairsConfig {
            hooks: hooks.clone(),
            ..Default::default()
        };
        is_cancelled(&path, all_pairs(&ctx, &set, None, &all));
        let margin = PairMarginConfig {
            hooks: hooks.clone(),
            ..Default::default()
        };
        is_cancelled(&path, pair_margin_pairs(&ctx, &set, None, &margin));
        let ms = MultiSimilarityConfig {
            hooks: hooks.clone(),
            ..Default::default()
        };
        is_cancelled(&path, multi_similarity_pairs(&ctx, &set, None, &ms));
        let easy_hard = BatchEasyHardConfig {
            hooks: hooks.clone(),
            ..Default::default()
        };
        is_cancelled(&path, batch_easy_hard_pairs(&ctx, &set, None, &easy_hard));
        let hard = BatchHardConfig {
            hooks: hooks.clone(),
            ..Default::default()
        };
        is_cancelled(&path, batch_hard_triplets(&ctx, &set, None, &hard));
        assert_eq!(
            ctx.memory().current_bytes,
            0,
            "{path}: nothing left allocated"
        );
    }
}

/// Runs `op` with hooks whose first progress report asks another thread to cancel, and
/// returns what `op` returned and the last report.
fn cancel_from_another_thread<T>(op: impl FnOnce(Hooks) -> Result<T>) -> (Result<T>, Progress) {
    let token = CancelToken::new();
    let (tx, rx) = mpsc::channel::<()>();
    let canceller = {
        let token = token.clone();
        std::thread::spawn(move || {
            if rx.recv().is_ok() {
                token.cancel();
            }
        })
    };
    let last = Arc::new(AtomicU64::new(0));
    let total = Arc::new(AtomicU64::new(0));
    let (seen, all) = (Arc::clone(&last), Arc::clone(&total));
    let tx = std::sync::Mutex::new(Some(tx));
    let hooks = Hooks::new()
        .cancel_with(&token)
        .on_progress(move |p: Progress| {
            seen.store(p.done, Ordering::SeqCst);
            all.store(p.total, Ordering::SeqCst);
            if let Some(tx) = tx.lock().expect("sender").take() {
                let _ = tx.send(());
                // Give the other thread the time to cancel before this chunk ends.
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        });
    let got = op(hooks);
    let _ = canceller.join();
    let progress = Progress {
        done: last.load(Ordering::SeqCst),
        total: total.load(Ordering::SeqCst),
    };
    (got, progress)
}

#[test]
fn a_long_knn_search_is_cancelled_from_another_thread_within_one_chunk() {
    let (x, _) = data(3000, 16, 10);
    let mut all = vec![Context::native_cpu(None)];
    // A small budget, so that the GPU search runs in many chunks.
    all.extend(common::gpu_context(Some(2 << 20)));
    for ctx in all {
        let (got, progress) = cancel_from_another_thread(|hooks| {
            let cfg = KnnConfig {
                k: 5,
                hooks,
                ..Default::default()
            };
            knn(&ctx, &x, &x, &cfg)
        });
        let path = ctx.device_name();
        is_cancelled(&path, got);
        assert!(
            progress.done < progress.total,
            "{path}: stopped before the end: {progress:?}"
        );
        assert_eq!(
            ctx.memory().current_bytes,
            0,
            "{path}: nothing left allocated"
        );
    }
}

#[test]
fn a_triplet_stream_is_cancelled_from_another_thread_within_one_chunk() {
    let (x, y) = data(2000, 8, 10);
    let set = MiningSet::new(&x, &y);
    let mut all = vec![Context::native_cpu(None)];
    all.extend(common::gpu_context(Some(2 << 20)));
    for ctx in all {
        let delivered = AtomicU64::new(0);
        let (got, progress) = cancel_from_another_thread(|hooks| {
            let cfg = TripletConfig {
                hooks,
                max_chunk_triplets: 10_000,
                ..Default::default()
            };
            mine_triplets_streaming(&ctx, &set, None, &cfg, |chunk| {
                delivered.fetch_add(chunk.nrows() as u64, Ordering::Relaxed);
                ControlFlow::Continue(())
            })
        });
        let path = ctx.device_name();
        is_cancelled(&path, got);
        assert!(
            progress.done < progress.total,
            "{path}: stopped before the end: {progress:?}"
        );
        let all = 2000u64 * 199 * 1800;
        assert!(
            delivered.load(Ordering::Relaxed) < all,
            "{path}: not every triplet was delivered"
        );
        assert_eq!(
            ctx.memory().current_bytes,
            0,
            "{path}: nothing left allocated"
        );
    }
}
