//! Times `knn` and `accuracy` on the inputs of `shared/anchors/bench_knn.py`, so the figures
//! sit next to Faiss and PML measured in the same run. Prints one `RESULT {json}` line.
//!
//! ```sh
//! cargo run --release --example bench_knn -- --func knn --k 10 --path cpu
//! cargo run --release --example bench_knn -- --func acc --path wgpu --reps 1
//! ```
//! `--func knn`: Q = 10 000 queries against N = 100 000 references (`--Q`, `--N`), d = 128,
//! normalised N(0, 1) rows, cosine, `--k` (default 10); reports GFLOP/s (`2·Q·N·d` per
//! search) and the recall of the first 50 queries against an f64 brute force.
//! `--func acc`: 20 000 points of 100 classes (`x = normalise(center[y] + 2·noise)`), queries
//! are the references, PML's default ranking (squared L2, raw), k = max_bin_count.
//! `--path wgpu|cpu`, `--reps` (default 3, after a warm-up on a small input that compiles
//! the pipelines), `--budget-mib` (default: the context's), `--output host|device` (`knn` only;
//! `device`: `knn_on_device`, the lists read back after the timing).
//! `--kernel auto|fused|blocks` (the native path's kNN kernel for `k ≤ 128`, default auto:
//! `ContextConfig::native_knn_kernel`; the line's `isa` names the vectors, which
//! `WML_NATIVE_ISA=avx2|baseline` caps). `--kernel-timing`: every kernel timed by timestamps, its GPU seconds per operation in
//! the line's `kernels`.

mod support;

use std::time::Instant;

use ndarray::{Array1, Array2};
use support::{embeddings, flag, kernel_timing_flag, peak_rss_mib, summary, traffic, Rng};
use wgpu_metric_learning::{
    accuracy, knn, knn_on_device, AccuracyConfig, AccuracyK, BackendChoice, Context, ContextConfig,
    Distance, DistanceConfig, KnnConfig, MiningSet, NativeKnnKernel,
};

const DIM: usize = 128;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let func = flag("--func", "knn");
    let reps: usize = flag("--reps", "3").parse()?;
    let budget = match flag("--budget-mib", "").as_str() {
        "" => None,
        mib => Some(mib.parse::<u64>()? << 20),
    };
    let path = flag("--path", "wgpu");
    let native_knn_kernel = match flag("--kernel", "auto").as_str() {
        "auto" => NativeKnnKernel::Auto,
        "fused" => NativeKnnKernel::Fused,
        "blocks" => NativeKnnKernel::Blocks,
        other => return Err(format!("--kernel auto|fused|blocks, not {other}").into()),
    };
    let ctx = Context::new(&ContextConfig {
        backend: if path == "cpu" {
            BackendChoice::NativeCpu
        } else {
            BackendChoice::Wgpu
        },
        budget_bytes: budget,
        kernel_timing: kernel_timing_flag(),
        native_knn_kernel,
        ..Default::default()
    })?;
    let mut rng = Rng(0xC0FFEE);
    let mut times = Vec::new();
    // The context's traffic counters after the case's warm-up.
    let mut before;
    let extra = match func.as_str() {
        "knn" => {
            let (q, n, k): (usize, usize, usize) = (
                flag("--Q", "10000").parse()?,
                flag("--N", "100000").parse()?,
                flag("--k", "10").parse()?,
            );
            let queries = embeddings(&mut rng, q, DIM);
            let refs = embeddings(&mut rng, n, DIM);
            let cfg = KnnConfig {
                k,
                distance: DistanceConfig {
                    distance: Distance::Cosine,
                    normalize: true,
                },
                ..Default::default()
            };
            let warm = KnnConfig {
                k: 1,
                ..cfg.clone()
            };
            knn(
                &ctx,
                queries.slice(ndarray::s![..8, ..]),
                refs.slice(ndarray::s![..64, ..]),
                &warm,
            )?;
            ctx.reset_peak();
            before = ctx.transfers();
            let on_device = flag("--output", "host") == "device";
            let mut found = None;
            for _ in 0..reps {
                let t = Instant::now();
                if on_device {
                    let kept = knn_on_device(&ctx, queries.view(), refs.view(), &cfg)?;
                    times.push(t.elapsed().as_secs_f64());
                    // Read back outside the timing and the traffic, for the recall check.
                    let reading = ctx.transfers();
                    found = Some((kept.indices.to_host(&ctx)?, kept.scores.to_host(&ctx)?));
                    let read = ctx.transfers();
                    before.host_waits += read.host_waits - reading.host_waits;
                    before.submissions += read.submissions - reading.submissions;
                    before.bytes_down += read.bytes_down - reading.bytes_down;
                } else {
                    let got = knn(&ctx, queries.view(), refs.view(), &cfg)?;
                    times.push(t.elapsed().as_secs_f64());
                    found = Some((got.indices, got.scores));
                }
            }
            let (indices, scores) = found.ok_or("--reps 0")?;
            let recall = recall(&queries, &refs, &indices, 50.min(q));
            let (median, _, _) = summary(&mut times.clone());
            let gflops = 2.0 * (q * n * DIM) as f64 / median / 1e9;
            format!(
                "\"output\": \"{}\", \"Q\": {q}, \"N\": {n}, \"k\": {k}, \"gflops\": {gflops:.2}, \"recall_vs_f64_first50\": {recall:.4}, \"top1_mean\": {:.6}",
                if on_device { "device" } else { "host" },
                scores.column(0).mean().unwrap_or(f32::NAN)
            )
        }
        "acc" => {
            let (n, classes) = (20_000usize, 100u64);
            let centers = Array2::from_shape_simple_fn((classes as usize, DIM), || rng.normal());
            let y = Array1::from_shape_simple_fn(n, || (rng.next() % classes) as i64);
            let mut x = Array2::from_shape_fn((n, DIM), |(i, j)| {
                centers[[y[i] as usize, j]] + 2.0 * rng.normal()
            });
            for mut row in x.rows_mut() {
                let norm = row.dot(&row).sqrt().max(1e-12);
                row /= norm;
            }
            let cfg = AccuracyConfig {
                k: AccuracyK::MaxBinCount,
                ..Default::default()
            };
            let small = x.slice(ndarray::s![..64, ..]);
            accuracy(
                &ctx,
                &MiningSet::new(small, y.slice(ndarray::s![..64])),
                None,
                &cfg,
            )?;
            ctx.reset_peak();
            before = ctx.transfers();
            let mut last = None;
            for _ in 0..reps {
                let t = Instant::now();
                last = Some(accuracy(&ctx, &MiningSet::new(&x, &y), None, &cfg)?);
                times.push(t.elapsed().as_secs_f64());
            }
            let acc = last.ok_or("--reps 0")?;
            format!(
                "\"n\": {n}, \"classes\": {classes}, \"k\": {}, \"precision_at_1\": {:.4}, \"r_precision\": {:.4}, \"mean_average_precision_at_r\": {:.4}",
                acc.k,
                acc.metrics.precision_at_1,
                acc.metrics.r_precision,
                acc.metrics.mean_average_precision_at_r
            )
        }
        other => return Err(format!("unknown --func {other}").into()),
    };
    let moved = traffic(&ctx, before, reps);
    let driver = ctx
        .adapter_info()
        .map_or_else(String::new, |i| format!("{} {}", i.driver, i.driver_info));
    let (median, min, max) = summary(&mut times);
    let mem = ctx.memory();
    println!(
        "RESULT {{\"impl\": \"wml\", \"path\": \"{path}\", \"device\": \"{}\", \"driver\": \"{}\", \"func\": \"{func}\", \"kernel\": \"{}\", \"isa\": \"{}\", {extra}, {moved}, \"median_s\": {median:.4}, \"min_s\": {min:.4}, \"max_s\": {max:.4}, \"peak_device_mib\": {:.1}, \"budget_mib\": {}, \"peak_rss_mb\": {:.1}}}",
        ctx.device_name(),
        driver.trim().replace('"', "'"),
        flag("--kernel", "auto"),
        wgpu_metric_learning::native_isa(),
        mem.peak_bytes as f64 / (1 << 20) as f64,
        mem.budget_bytes >> 20,
        peak_rss_mib()
    );
    Ok(())
}

/// Mean overlap of the found lists with an f64 brute force (cosine of normalised rows) over
/// the first `rows` queries.
fn recall(queries: &Array2<f32>, refs: &Array2<f32>, found: &Array2<u32>, rows: usize) -> f64 {
    let k = found.ncols();
    let mut total = 0.0;
    for i in 0..rows {
        let q = queries.row(i);
        let mut sims: Vec<(f64, usize)> = refs
            .rows()
            .into_iter()
            .enumerate()
            .map(|(j, r)| {
                (
                    q.iter()
                        .zip(r)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum(),
                    j,
                )
            })
            .collect();
        sims.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let truth: std::collections::HashSet<usize> = sims[..k].iter().map(|s| s.1).collect();
        let hit = found
            .row(i)
            .iter()
            .filter(|&&j| truth.contains(&(j as usize)))
            .count();
        total += hit as f64 / k as f64;
    }
    total / rows.max(1) as f64
}
