//! Times one memory-bank case as PML's `CrossBatchMemory` is timed in
//! `shared/anchors/bench_pml.py` (`cbm_<type>`): a full bank of M rows × 128, then per step a
//! fresh batch of B rows is enqueued and mined against the bank (TripletMarginMiner, margin
//! 0.2, normalised Euclidean, each query excluded at its own slot). Prints one JSON line.
//!
//! ```sh
//! cargo run --release --example bench_bank -- --path wgpu --func cbm_semihard --M 4096 --C 100
//! ```
//! `--func`: `enqueue` (enqueue only), `cbm_<all|hard|semihard|easy>` (enqueue + mine, the
//! triplets as arrays) or `cbm_<type>_count` (enqueue + count only). `--path wgpu|cpu`,
//! `--B` (default 128), `--reps` (default 5, after one warm-up step), `--budget-mib` (default:
//! the context's default budget), `--kernel-timing` (GPU seconds per kernel in `kernels`).

mod support;

use std::time::Instant;

use ndarray::{Array1, Array2};
use support::{embeddings, flag, kernel_timing_flag, peak_rss_mib, summary, traffic, Rng};
use wgpu_metric_learning::{
    count_triplets, mine_triplets, BackendChoice, BankConfig, Context, ContextConfig, MemoryBank,
    MiningSet, TripletConfig, TripletType,
};

const DIM: usize = 128;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (b, m, c): (usize, usize, u64) = (
        flag("--B", "128").parse()?,
        flag("--M", "4096").parse()?,
        flag("--C", "100").parse()?,
    );
    let func = flag("--func", "cbm_semihard");
    let reps: usize = flag("--reps", "5").parse()?;
    let budget = match flag("--budget-mib", "").as_str() {
        "" => None,
        mib => Some(mib.parse::<u64>()? << 20),
    };
    let backend = match flag("--path", "wgpu").as_str() {
        "cpu" => BackendChoice::NativeCpu,
        _ => BackendChoice::Wgpu,
    };
    let ctx = Context::new(&ContextConfig {
        backend,
        budget_bytes: budget,
        kernel_timing: kernel_timing_flag(),
        ..Default::default()
    })?;
    let kind = match func.trim_end_matches("_count") {
        "enqueue" => None,
        "cbm_all" => Some(TripletType::All),
        "cbm_hard" => Some(TripletType::Hard),
        "cbm_semihard" => Some(TripletType::Semihard),
        "cbm_easy" => Some(TripletType::Easy),
        other => return Err(format!("unknown --func {other}").into()),
    };

    let mut rng = Rng(0xB0B);
    let mut bank = MemoryBank::<i64>::new(&ctx, &BankConfig::new(m, DIM))?;
    let fill = embeddings(&mut rng, m, DIM);
    let fill_labels = Array1::from_shape_simple_fn(m, || (rng.next() % c) as i64);
    bank.enqueue(&ctx, &MiningSet::new(&fill, &fill_labels))?;
    let batches: Vec<(Array2<f32>, Array1<i64>)> = (0..=reps)
        .map(|_| {
            let x = embeddings(&mut rng, b, DIM);
            (
                x,
                Array1::from_shape_simple_fn(b, || (rng.next() % c) as i64),
            )
        })
        .collect();

    ctx.reset_peak();
    let mut before = ctx.transfers();
    let (mut steps, mut enqueues) = (Vec::new(), Vec::new());
    let mut count = 0u64;
    for (i, (x, y)) in batches.iter().enumerate() {
        let t = Instant::now();
        let done = bank.enqueue(&ctx, &MiningSet::new(x, y))?;
        let enqueued = t.elapsed().as_secs_f64();
        if let Some(kind) = kind {
            let cfg = TripletConfig {
                self_exclusion: done.self_exclusion,
                ..TripletConfig::margin_miner(kind)
            };
            let queries = MiningSet::new(x, y);
            count = if func.ends_with("_count") {
                count_triplets(&ctx, &queries, Some(&bank.refs()), &cfg)?.count
            } else {
                mine_triplets(&ctx, &queries, Some(&bank.refs()), &cfg)?.len() as u64
            };
        }
        // Step 0 is the warm-up (pipelines compile on first use).
        if i == 0 {
            before = ctx.transfers();
        } else {
            steps.push(t.elapsed().as_secs_f64());
            enqueues.push(enqueued);
        }
    }
    let moved = traffic(&ctx, before, steps.len());
    let (median, min, max) = summary(&mut steps);
    let (enqueue_median, _, _) = summary(&mut enqueues);
    let mem = ctx.memory();
    println!(
        "RESULT {{\"impl\": \"wml\", \"path\": \"{}\", \"device\": \"{}\", \"func\": \"{func}\", \"B\": {b}, \"M\": {m}, \"C\": {c}, \"count\": {count}, \"median_s\": {median:.4}, \"min_s\": {min:.4}, \"max_s\": {max:.4}, \"enqueue_median_s\": {enqueue_median:.7}, {moved}, \"peak_device_mib\": {:.1}, \"budget_mib\": {}, \"peak_rss_mb\": {:.1}}}",
        match backend {
            BackendChoice::NativeCpu => "cpu",
            _ => "wgpu",
        },
        ctx.device_name(),
        mem.peak_bytes as f64 / (1 << 20) as f64,
        mem.budget_bytes >> 20,
        peak_rss_mib()
    );
    Ok(())
}
