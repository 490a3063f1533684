//! Mining one batch of clustered embeddings every way the library offers: all triplets from
//! the labels alone, PML's `TripletMarginMiner` (each type) as arrays, the count-only form,
//! the streaming form for outputs larger than memory, and the pair and hardest-triplet miners.
//!
//! ```sh
//! cargo run --release --example mining -- --batch 512 --classes 32 --dim 64
//! ```
//! Add `--backend wgpu` to force the wgpu path (lavapipe on a machine without a GPU) or
//! `--backend cpu` for the native one; the default picks as the library does.

mod support;

use std::ops::ControlFlow;
use std::time::Instant;

use ndarray::Array2;
use support::{batch_around, context_from_flags, flag, Rng};
use wgpu_metric_learning::{
    batch_hard_triplets, count_triplets, mine_triplets, mine_triplets_streaming,
    multi_similarity_pairs, BatchHardConfig, MiningSet, MultiSimilarityConfig, TripletConfig,
    TripletType,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let b: usize = flag("--batch", "512").parse()?;
    let classes: usize = flag("--classes", "32").parse()?;
    let d: usize = flag("--dim", "64").parse()?;
    let ctx = context_from_flags()?;
    println!(
        "{:?} path on {}; batch {b} x {d}, {classes} classes",
        ctx.path(),
        ctx.device_name()
    );
    let mut rng = Rng(11);
    let centres = Array2::from_shape_simple_fn((classes, d), || rng.normal());
    let (x, y) = batch_around(&mut rng, &centres, b, 0.8);
    // Without references the batch is mined against itself, a row never its own positive.
    let labels_only = MiningSet::from_labels(&y);
    let batch = MiningSet::new(&x, &y);
    let timed = |what: &str, count: u64, start: Instant| {
        let ms = start.elapsed().as_secs_f64() * 1e3;
        println!("{what:<34} {count:>12} {ms:>9.2} ms");
    };
    println!("{:<34} {:>12} {:>12}", "what", "count", "time");

    let t = Instant::now();
    let all = mine_triplets(&ctx, &labels_only, None, &TripletConfig::default())?;
    timed("all triplets (labels only)", all.len() as u64, t);
    if let Some(first) = all.indices.rows().into_iter().next() {
        println!("  first (a, p, n) = {first}, in PML's lexicographic order");
    }
    for kind in [TripletType::Hard, TripletType::Semihard, TripletType::Easy] {
        let cfg = TripletConfig::margin_miner(kind);
        let t = Instant::now();
        let mined = mine_triplets(&ctx, &batch, None, &cfg)?;
        timed(&format!("margin miner {kind:?}"), mined.len() as u64, t);
    }

    // Counting allocates no output at all: the size of a mining problem before paying for it.
    let cfg = TripletConfig::margin_miner(TripletType::All);
    let t = Instant::now();
    let counted = count_triplets(&ctx, &batch, None, &cfg)?;
    timed("margin miner All (tm > 0), count", counted.count, t);

    // Streaming: chunks of at most 100 000 rows, in order; memory stays bounded by the chunk
    // whatever the total (the labels-only problem here has millions of triplets).
    let cfg = TripletConfig {
        max_chunk_triplets: 100_000,
        ..TripletConfig::default()
    };
    let (mut chunks, mut rows) = (0usize, 0usize);
    let t = Instant::now();
    let streamed = mine_triplets_streaming(&ctx, &labels_only, None, &cfg, |chunk| {
        chunks += 1;
        rows += chunk.nrows();
        ControlFlow::Continue(())
    })?;
    timed(
        &format!("all triplets, {chunks} streamed chunks"),
        streamed.count,
        t,
    );
    assert_eq!(rows, all.len(), "streaming delivers the same triplets");

    let t = Instant::now();
    let hardest = batch_hard_triplets(&ctx, &batch, None, &BatchHardConfig::default())?;
    timed("batch hard (one per anchor)", hardest.len() as u64, t);
    let t = Instant::now();
    let ms = multi_similarity_pairs(&ctx, &batch, None, &MultiSimilarityConfig::default())?;
    let pairs = (ms.positives.nrows() + ms.negatives.nrows()) as u64;
    timed("multi-similarity pairs (pos + neg)", pairs, t);

    let mem = ctx.memory();
    println!(
        "device memory: peak {:.1} MiB of a {:.1} MiB budget",
        mem.peak_bytes as f64 / (1 << 20) as f64,
        mem.budget_bytes as f64 / (1 << 20) as f64
    );
    Ok(())
}
