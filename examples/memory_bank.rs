//! A training-style loop with a memory bank (PML's `CrossBatchMemory`): each step draws a
//! batch of clustered embeddings, enqueues it into the bank and mines semihard triplets of the
//! batch against everything the bank holds, excluding each row's own slot.
//!
//! ```sh
//! cargo run --release --example memory_bank -- --steps 12 --capacity 1024 --batch 128 --classes 100
//! ```
//! Add `--backend wgpu` to force the wgpu path (lavapipe on a machine without a GPU) or
//! `--backend cpu` for the native one; the default picks as the library does.

mod support;

use std::time::Instant;

use ndarray::Array2;
use support::{batch_around, context_from_flags, flag, Rng};
use wgpu_metric_learning::{
    mine_triplets, BankConfig, MemoryBank, MiningSet, TripletConfig, TripletType,
};

const DIM: usize = 64;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let steps: usize = flag("--steps", "12").parse()?;
    let capacity: usize = flag("--capacity", "1024").parse()?;
    let b: usize = flag("--batch", "128").parse()?;
    let classes: usize = flag("--classes", "100").parse()?;
    let ctx = context_from_flags()?;
    println!(
        "{:?} path on {}; bank of {capacity} x {DIM}, batch {b}, {classes} classes",
        ctx.path(),
        ctx.device_name()
    );

    let mut rng = Rng(7);
    let centres = Array2::from_shape_simple_fn((classes, DIM), || rng.normal());
    let mut bank = MemoryBank::<u32>::new(&ctx, &BankConfig::new(capacity, DIM))?;
    println!("step  bank rows  filled  triplets      enqueue ms  mine ms  device MiB now/peak");
    for step in 0..steps {
        let (x, y) = batch_around(&mut rng, &centres, b, 1.2);
        let t = Instant::now();
        // As PML: the batch goes in first, so it is mined against itself too, never a row
        // against its own slot.
        let done = bank.enqueue(&ctx, &MiningSet::new(&x, &y))?;
        let enqueued = t.elapsed();
        let cfg = TripletConfig {
            self_exclusion: done.self_exclusion,
            ..TripletConfig::margin_miner(TripletType::Semihard)
        };
        let t = Instant::now();
        let queries = MiningSet::new(&x, &y);
        let triplets = mine_triplets(&ctx, &queries, Some(&bank.refs()), &cfg)?;
        let mined = t.elapsed();
        let mem = ctx.memory();
        println!(
            "{step:>4}  {:>9}  {:>6}  {:>12}  {:>10.2}  {:>7.1}  {:>8.1} / {:.1}",
            bank.len(),
            bank.is_filled(),
            triplets.len(),
            enqueued.as_secs_f64() * 1e3,
            mined.as_secs_f64() * 1e3,
            mem.current_bytes as f64 / (1 << 20) as f64,
            mem.peak_bytes as f64 / (1 << 20) as f64,
        );
    }
    Ok(())
}
