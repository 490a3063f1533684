//! Prints the benchmark rows of `BENCHMARKS.md` for the distance tile: median time over
//! repeated runs (after one warm-up that also compiles the pipelines), GFLOP/s (2·q·n·d),
//! peak tracked device memory and the host's blocking waits per call, on the native CPU path and on the wgpu path (any adapter,
//! lavapipe included).
//!
//! ```sh
//! flock /tmp/bench.lock cargo run --release --example bench_report
//! cargo run --release --example bench_report -- --budget-mib 8   # tiles under a tight budget
//! cargo run --release --example bench_report -- --kernel hand-written  # or a GEMM variant's name
//! ```

use std::time::Instant;

use ndarray::Array2;
use wgpu_metric_learning::{
    pairwise_distances, BackendChoice, Context, ContextConfig, Distance, DistanceConfig,
    DistanceKernel, GemmVariant, PairwiseConfig,
};

fn data(rows: usize, d: usize, seed: f32) -> Array2<f32> {
    Array2::from_shape_fn((rows, d), |(i, k)| {
        ((i as f32 * 0.61 + k as f32 * 1.37 + seed).sin() * 7.0).fract()
    })
}

/// Timed runs per case, after one warm-up.
const REPS: usize = 5;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let budget_bytes = args
        .iter()
        .position(|a| a == "--budget-mib")
        .and_then(|i| args.get(i + 1))
        .map(|m| m.parse::<u64>().map(|m| m << 20))
        .transpose()?;
    let mut contexts = vec![Context::new(&ContextConfig {
        backend: BackendChoice::NativeCpu,
        budget_bytes,
        ..Default::default()
    })?];
    // The distance kernel: tuned (default), hand-written, or one GEMM variant by name.
    let distance_kernel = match args
        .iter()
        .position(|a| a == "--kernel")
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
    {
        None | Some("tuned") => DistanceKernel::Tuned,
        Some("hand-written") => DistanceKernel::HandWritten,
        Some(name) => DistanceKernel::Variant(
            GemmVariant::parse(name).ok_or(format!("--kernel {name}: not a GEMM variant"))?,
        ),
    };
    match Context::new(&ContextConfig {
        backend: BackendChoice::Wgpu,
        budget_bytes,
        distance_kernel,
        ..Default::default()
    }) {
        Ok(ctx) => contexts.push(ctx),
        Err(e) => eprintln!("no wgpu adapter: {e}"),
    }
    let cfg = PairwiseConfig {
        distance: DistanceConfig {
            distance: Distance::Cosine,
            normalize: true,
        },
        ..Default::default()
    };
    println!(
        "| path | device | q × n × d | median ms | GFLOP/s | peak MiB | budget MiB | host waits per op |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (q, n, d) in [(512, 4096, 128), (2048, 16384, 128)] {
        let (queries, refs) = (data(q, d, 0.1), data(n, d, 0.7));
        for ctx in &contexts {
            pairwise_distances(ctx, queries.view(), refs.view(), &cfg)?; // warm-up
            ctx.reset_peak();
            let before = ctx.transfers();
            let times: Vec<f64> = (0..REPS)
                .map(|_| {
                    let t = Instant::now();
                    pairwise_distances(ctx, queries.view(), refs.view(), &cfg)
                        .map(|_| t.elapsed().as_secs_f64())
                })
                .collect::<Result<_, _>>()?;
            let secs = median(times);
            let mem = ctx.memory();
            let waits = ctx.transfers().host_waits - before.host_waits;
            println!(
                "| {:?} | {} | {q} × {n} × {d} | {:.1} | {:.1} | {:.1} | {:.0} | {:.1} |",
                ctx.path(),
                ctx.device_name(),
                secs * 1e3,
                2.0 * (q * n * d) as f64 / secs / 1e9,
                mem.peak_bytes as f64 / (1 << 20) as f64,
                mem.budget_bytes as f64 / (1 << 20) as f64,
                waits as f64 / REPS as f64,
            );
        }
    }
    Ok(())
}
