//! One classifier loss call (`classifier_loss`, ArcFace by default) at a size of your choice,
//! for the scale PML cannot reach: its time, its plan and the process's peak RSS as one JSON
//! line. The weights are `(D, C)` (PML's layout), normal; the labels cycle through the
//! classes. `--path wgpu` runs on the first wgpu adapter (ArcFace, CosFace, NormalizedSoftmax
//! and ProxyNCA on the device; the line's `path` says where it ran), `--sample-rate R` with
//! PartialFC's sampling.
//!
//! ```sh
//! cargo run --release --example bench_classifier -- [--B 512] [--D 128] [--C 10000000]
//!     [--kind arcface] [--reps 1] [--path cpu|wgpu] [--sample-rate 1] [--budget-mib MIB]
//! ```

mod support;

use std::time::Instant;

use ndarray::Array2;
use support::{embeddings, flag, peak_rss_mib, summary, Rng};
use wgpu_metric_learning::{
    classifier_loss, classifier_loss_plan, BackendChoice, ClassSampling, ClassifierKind,
    ClassifierLossConfig, ClassifierOptions, ComputePath, Context, ContextConfig,
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
    // The context's default budget unless one is given.
    let budget = match flag("--budget-mib", "").as_str() {
        "" => None,
        mib => Some(mib.parse::<u64>()? << 20),
    };
    let ctx = match flag("--path", "cpu").as_str() {
        "wgpu" => Context::new(&ContextConfig {
            backend: BackendChoice::Wgpu,
            budget_bytes: budget,
            ..Default::default()
        })?,
        _ => Context::native_cpu(budget),
    };
    let cfg = ClassifierLossConfig {
        kind,
        sampling: ClassSampling {
            rate: flag("--sample-rate", "1").parse()?,
            seed: 0,
        },
        ..Default::default()
    };
    let plan = classifier_loss_plan(&ctx, x.view(), &labels, w.view(), &cfg)?;
    let mut times = Vec::new();
    let (mut loss, mut path) = (0.0, plan.path);
    // A warm-up where several repetitions are timed (the device's pipelines, first touches).
    let warm = usize::from(reps > 1);
    for rep in 0..reps.max(1) + warm {
        let start = Instant::now();
        let out = classifier_loss(&ctx, x.view(), &labels, w.view(), &cfg)?;
        if rep >= warm {
            times.push(start.elapsed().as_secs_f64());
        }
        (loss, path) = (out.loss, out.path);
    }
    let (median, _, _) = summary(&mut times);
    // As the other benches name the paths.
    let path = if path == ComputePath::Wgpu {
        "wgpu"
    } else {
        "cpu"
    };
    println!(
        "{{\"func\": \"classifier_{name}\", \"path\": \"{path}\", \"device\": \"{}\", \"B\": {b}, \
         \"D\": {d}, \"C\": {c}, \"loss\": {loss}, \"median_s\": {:.4}, \"tile_columns\": {}, \
         \"tiles\": {}, \"scratch_mib\": {:.1}, \"peak_rss_mib\": {:.0}}}",
        ctx.device_name(),
        median,
        plan.cols,
        plan.chunks,
        plan.bytes as f64 / (1 << 20) as f64,
        peak_rss_mib()
    );
    Ok(())
}
