//! Quickstart: make a context on whatever the machine has, compute a distance matrix between
//! clustered embeddings, and print which path ran, how long it took and the memory it used.
//!
//! ```sh
//! cargo run --release --example quickstart                      # automatic choice
//! cargo run --release --example quickstart -- --backend wgpu    # force wgpu (even lavapipe)
//! cargo run --release --example quickstart -- --backend cpu --budget-mib 64
//! ```

use std::time::Instant;

use ndarray::Array2;
use wgpu_metric_learning::{
    list_adapters, pairwise_distances, BackendChoice, Context, ContextConfig, Distance,
    DistanceConfig, PairwiseConfig,
};

/// `classes` clusters of embeddings in `d` dimensions: row i belongs to class i % classes.
fn clustered(rows: usize, d: usize, classes: usize) -> Array2<f32> {
    Array2::from_shape_fn((rows, d), |(i, k)| {
        let centre = ((i % classes) as f32 * 2.3 + k as f32 * 0.7).sin();
        let noise = ((i as f32 * 12.9898 + k as f32 * 78.233).sin() * 43_758.547).fract();
        centre + 0.1 * noise
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
    };
    let backend = match value("--backend").map(String::as_str) {
        None | Some("auto") => BackendChoice::Auto,
        Some("wgpu") => BackendChoice::Wgpu,
        Some("cpu") => BackendChoice::NativeCpu,
        Some(other) => return Err(format!("--backend auto|wgpu|cpu, not {other}").into()),
    };
    let budget_bytes = value("--budget-mib")
        .map(|m| m.parse::<u64>().map(|m| m << 20))
        .transpose()?;

    for a in list_adapters(None) {
        println!(
            "adapter {}: {} ({:?}, {:?}){}",
            a.index,
            a.name,
            a.backend,
            a.device_type,
            if a.is_software() { " [software]" } else { "" }
        );
    }
    let ctx = Context::new(&ContextConfig {
        backend,
        budget_bytes,
        ..Default::default()
    })?;
    println!("running on: {} ({:?} path)", ctx.device_name(), ctx.path());

    let (queries, refs) = (clustered(1000, 128, 10), clustered(5000, 128, 10));
    let cfg = DistanceConfig {
        distance: Distance::Euclidean,
        normalize: true,
    };
    let start = Instant::now();
    let d = pairwise_distances(
        &ctx,
        queries.view(),
        refs.view(),
        &PairwiseConfig {
            distance: cfg,
            ..Default::default()
        },
    )?;
    let secs = start.elapsed().as_secs_f64();
    let same_class = d.values[[0, 10]];
    let other_class = d.values[[0, 11]];
    let mem = ctx.memory();
    println!(
        "distances {:?} in {:.1} ms: same class {same_class:.3}, other class {other_class:.3}",
        d.values.dim(),
        secs * 1e3
    );
    println!(
        "device memory: peak {:.1} MiB of a {:.1} MiB budget",
        mem.peak_bytes as f64 / (1 << 20) as f64,
        mem.budget_bytes as f64 / (1 << 20) as f64
    );
    Ok(())
}
