//! [`bench_classifier`](../bench_classifier.rs) over MPI: one classifier loss call with the
//! classes sharded over the ranks (`distributed::classifier_loss`), each rank holding `1/N` of
//! the weights and of the batch's rows. Rank 0 prints one JSON line: the time, and every
//! rank's peak RSS. With `--optimizer sgd|adamw`, each rank then takes one optimizer step on
//! its shard (`weights_step`: SGD with momentum 0.9, or AdamW, both lr 0.01); with
//! `--checkpoint DIR`, the group then saves the shards and their state there
//! (`distributed::save_class_weights`) and loads them back on the even split. With
//! `--sample-rate R < 1`, the softmax runs over PartialFC's sample (`ClassSampling`).
//!
//! ```sh
//! cargo build --release --features mpi --example bench_classifier_mpi
//! mpirun -np 3 target/release/examples/bench_classifier_mpi [--B 512] [--D 128] [--C 10000000]
//!     [--kind arcface] [--sample-rate 1] [--optimizer sgd|adamw] [--checkpoint DIR]
//!     [--budget-mib 1024]
//! ```

mod support;

use std::time::Instant;

use ndarray::Array2;
use support::{embeddings, flag, peak_rss_mib, Rng};
use wgpu_metric_learning::distributed::{
    self, mpi, DistributedClassifierConfig, Group, GroupConfig,
};
use wgpu_metric_learning::{
    weights_step, ClassSampling, ClassifierKind, ClassifierLossConfig, ClassifierOptions, Context,
    OptimizerState, WeightOptimizer, WeightsShard,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (b, d, c): (usize, usize, usize) = (
        flag("--B", "512").parse()?,
        flag("--D", "128").parse()?,
        flag("--C", "10000000").parse()?,
    );
    let name = flag("--kind", "arcface");
    let kind = ClassifierKind::from_options(&name, &ClassifierOptions::default())?;
    let (universe, _) =
        mpi::initialize_with_threading(mpi::Threading::Funneled).ok_or("MPI initialises once")?;
    let group = Group::new(&universe.world(), &GroupConfig::default());
    let (rank, size) = (group.rank(), group.size());
    let cut = |n: usize, r: usize| n * r / size;
    // This rank's rows and classes (its shard of W, `(D, C/N)` in PML's layout).
    let (r0, r1) = (cut(b, rank), cut(b, rank + 1));
    let (c0, c1) = (cut(c, rank), cut(c, rank + 1));
    let mut rng = Rng(7 + rank as u64);
    let x = embeddings(&mut rng, r1 - r0, d);
    let (rows, cols) = kind.weight_shape(c1 - c0, d);
    let mut w = Array2::from_shape_simple_fn((rows, cols), || rng.normal());
    let labels: Vec<i64> = (r0..r1).map(|i| (i * 7919 % c) as i64).collect();
    // The library's accounting: the loss's scratch, and the optimizer's state while it lives.
    let budget: u64 = flag("--budget-mib", "1024").parse::<u64>()? << 20;
    let ctx = Context::native_cpu(Some(budget));
    let cfg = DistributedClassifierConfig {
        loss: ClassifierLossConfig {
            kind,
            sampling: ClassSampling {
                rate: flag("--sample-rate", "1").parse()?,
                seed: 0,
            },
            ..Default::default()
        },
        ..Default::default()
    };
    let start = Instant::now();
    let out = distributed::classifier_loss(&group, &ctx, x.view(), &labels, w.view(), &cfg)?;
    let seconds = start.elapsed().as_secs_f64();
    let optimizer = match flag("--optimizer", "none").as_str() {
        "sgd" => Some(WeightOptimizer::sgd(0.01, 0.9)),
        "adamw" => Some(WeightOptimizer::adamw(0.01)),
        _ => None,
    };
    let mut state = OptimizerState::new();
    let mut extra = String::new();
    if let Some(opt) = &optimizer {
        let start = Instant::now();
        weights_step(&ctx, w.view_mut(), out.weight_grad.view(), &mut state, opt)?;
        let step = group.all_gather("step", &[start.elapsed().as_secs_f64()])?;
        extra += &format!(
            ", \"step_seconds\": {:.3}",
            step.iter().fold(0.0f64, |a, &b| a.max(b))
        );
    }
    drop(out.weight_grad);
    let dir = flag("--checkpoint", "");
    if !dir.is_empty() {
        let dir = std::path::Path::new(&dir);
        let opt = optimizer.unwrap_or_default();
        let shard = WeightsShard {
            kind: &kind,
            classes: c,
            first_class: c0,
            weights: w.view(),
            optimizer: &opt,
            state: &state,
        };
        let start = Instant::now();
        distributed::save_class_weights(&group, dir, &shard)?;
        let saved = start.elapsed().as_secs_f64();
        drop((w, state));
        let start = Instant::now();
        let (_, loaded) = distributed::load_class_weights(&group, &ctx, dir, &kind)?;
        let loaded_s = start.elapsed().as_secs_f64();
        drop(loaded);
        extra += &format!(", \"save_seconds\": {saved:.3}, \"load_seconds\": {loaded_s:.3}");
    }
    let rss = group.all_gather("peak RSS", &[peak_rss_mib()])?;
    if rank == 0 {
        let rss: Vec<String> = rss.iter().map(|m| format!("{m:.0}")).collect();
        println!(
            "{{\"kind\": \"{name}\", \"ranks\": {size}, \"B\": {b}, \"D\": {d}, \"C\": {c}, \
             \"loss\": {}, \"classes_used\": {}, \"seconds\": {seconds:.3}{extra}, \
             \"peak_rss_mib\": [{}]}}",
            out.loss,
            out.classes_used,
            rss.join(", ")
        );
    }
    Ok(())
}
