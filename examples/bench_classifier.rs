//! One classifier loss call (`classifier_loss`, ArcFace by default) at a size of your choice,
//! for the scale PML cannot reach: its time, its plan and the process's peak RSS as one JSON
//! line. The weights are `(D, C)` (PML's layout), normal; the labels cycle through the
//! classes.
//!
//! ```sh
//! cargo run --release --example bench_classifier -- [--B 512] [--D 128] [--C 10000000]
//!     [--kind arcface] [--reps 1]
//! ```

mod support;

use std::time::Instant;

use ndarray::Array2;
use support::{embeddings, flag, peak_rss_mib, summary, Rng};
use wgpu_metric_learning::{
    classifier_loss, classifier_loss_plan, ClassifierKind, ClassifierLossConfig, ClassifierOptions,
    Context,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (b, d, c): (usize, usize, usize) = (
        flag("--B", "512").parse()?,
        flag("--D", "128").parse()?,
        flag("--C", "10000000").parse()?,
    );
    let reps: usize = flag("--reps", "1").parse()?;
    let name = flag("--kind", "arcface");
    let kind = ClassifierKind::from_options(&name, &ClassifierOptions::default())?;
    let mut rng = Rng(7);
    let x = embeddings(&mut rng, b, d);
    let (rows, cols) = kind.weight_shape(c, d);
    let w = Array2::from_shape_simple_fn((rows, cols), || rng.normal());
    let labels: Vec<i64> = (0..b).map(|i| (i * 7919 % c) as i64).collect();
    let ctx = Context::native_cpu(None);
    let cfg = ClassifierLossConfig {
        kind,
        ..Default::default()
    };
    let plan = classifier_loss_plan(&ctx, x.view(), &labels, w.view(), &cfg)?;
    let mut times = Vec::new();
    let mut loss = 0.0;
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        loss = classifier_loss(&ctx, x.view(), &labels, w.view(), &cfg)?.loss;
        times.push(start.elapsed().as_secs_f64());
    }
    let (median, _, _) = summary(&mut times);
    println!(
        "{{\"kind\": \"{name}\", \"B\": {b}, \"D\": {d}, \"C\": {c}, \"loss\": {loss}, \"seconds\": {:.3}, \
         \"tile_columns\": {}, \"tiles\": {}, \"scratch_mib\": {:.1}, \"peak_rss_mib\": {:.0}}}",
        median,
        plan.cols,
        plan.chunks,
        plan.bytes as f64 / (1 << 20) as f64,
        peak_rss_mib()
    );
    Ok(())
}
