//! Retrieval evaluation as PML's `AccuracyCalculator` does it: a synthetic clustered set, its
//! exact kNN with `k = max_bin_count`, and precision@1, R-precision, MAP@R, MAP and MRR, with
//! a progress bar fed by the library's progress callback (`AccuracyConfig::hooks`).
//!
//! ```sh
//! cargo run --release --example knn_eval -- --points 20000 --classes 100 --dim 128
//! ```
//! Add `--backend wgpu` to force the wgpu path (lavapipe on a machine without a GPU: slow
//! enough to watch the bar) or `--backend cpu` for the native one; `--spread` sets how far
//! points stray from their class centre (larger: harder retrieval).

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ndarray::{Array1, Array2};
use support::{context_from_flags, flag, Rng};
use wgpu_metric_learning::{accuracy, AccuracyConfig, AccuracyK, Hooks, MiningSet, Progress};

/// Width of the bar in characters.
const BAR: usize = 40;

/// `n` points around `classes` random centres in `d` dimensions, with their labels.
fn clustered(
    rng: &mut Rng,
    n: usize,
    classes: usize,
    d: usize,
    spread: f32,
) -> (Array2<f32>, Array1<u32>) {
    let centres = Array2::from_shape_simple_fn((classes, d), || rng.normal());
    let labels = Array1::from_shape_fn(n, |i| (i % classes) as u32);
    let x = Array2::from_shape_fn((n, d), |(i, k)| {
        centres[[labels[i] as usize, k]] + spread * rng.normal()
    });
    (x, labels)
}

/// Redraws the bar on stderr when the whole percentage changes (the callback may come from
/// several threads; the library calls it one at a time, in order).
struct Bar {
    start: Instant,
    drawn: Mutex<Option<u64>>,
}

impl Bar {
    fn update(&self, p: Progress) {
        let percent = (p.fraction() * 100.0).floor() as u64;
        let Ok(mut drawn) = self.drawn.lock() else {
            return;
        };
        if *drawn == Some(percent) {
            return;
        }
        *drawn = Some(percent);
        let filled = (p.fraction() * BAR as f64).round() as usize;
        eprint!(
            "\r[{}{}] {percent:>3}%  {:.1} s",
            "#".repeat(filled),
            ".".repeat(BAR - filled),
            self.start.elapsed().as_secs_f64()
        );
        let _ = std::io::stderr().flush();
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = flag("--points", "20000").parse()?;
    let classes: usize = flag("--classes", "100").parse()?;
    let d: usize = flag("--dim", "128").parse()?;
    let spread: f32 = flag("--spread", "1.5").parse()?;
    let ctx = context_from_flags()?;
    println!(
        "{:?} path on {}; {n} points x {d}, {classes} classes, spread {spread}",
        ctx.path(),
        ctx.device_name()
    );
    let (x, y) = clustered(&mut Rng(3), n, classes, d, spread);
    // PML's defaults: every point is a query against all the others, k = the largest class
    // less one, embeddings L2-normalised, Euclidean distance.
    let bar = Arc::new(Bar {
        start: Instant::now(),
        drawn: Mutex::new(None),
    });
    let on_progress = Arc::clone(&bar);
    let cfg = AccuracyConfig {
        k: AccuracyK::MaxBinCount,
        hooks: Hooks::new().on_progress(move |p: Progress| on_progress.update(p)),
        ..Default::default()
    };
    let acc = accuracy(&ctx, &MiningSet::new(&x, &y), None, &cfg)?;
    eprintln!();
    let secs = bar.start.elapsed().as_secs_f64();
    let m = &acc.metrics;
    println!("k = {} neighbours per query, {:.2} s", acc.k, secs);
    println!("precision_at_1              {:.4}", m.precision_at_1);
    println!("r_precision                 {:.4}", m.r_precision);
    println!(
        "mean_average_precision_at_r {:.4}",
        m.mean_average_precision_at_r
    );
    println!(
        "mean_average_precision      {:.4}",
        m.mean_average_precision
    );
    println!("mean_reciprocal_rank        {:.4}", m.mean_reciprocal_rank);
    if let Some((worst, w)) = acc
        .per_class
        .iter()
        .min_by(|a, b| a.1.precision_at_1.total_cmp(&b.1.precision_at_1))
    {
        println!(
            "hardest class: {worst} (precision_at_1 {:.4})",
            w.precision_at_1
        );
    }
    let mem = ctx.memory();
    println!(
        "memory: peak {:.1} MiB of a {:.1} MiB budget",
        mem.peak_bytes as f64 / (1 << 20) as f64,
        mem.budget_bytes as f64 / (1 << 20) as f64
    );
    Ok(())
}
