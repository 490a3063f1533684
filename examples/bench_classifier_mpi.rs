//! [`bench_classifier`](../bench_classifier.rs) over MPI: one classifier loss call with the
//! classes sharded over the ranks (`distributed::classifier_loss`), each rank holding `1/N` of
//! the weights and of the batch's rows. Rank 0 prints one JSON line: the time, and every
//! rank's peak RSS.
//!
//! ```sh
//! cargo build --release --features mpi --example bench_classifier_mpi
//! mpirun -np 3 target/release/examples/bench_classifier_mpi [--B 512] [--D 128] [--C 10000000]
//!     [--kind arcface]
//! ```

mod support;

use std::time::Instant;

use ndarray::Array2;
use support::{embeddings, flag, peak_rss_mib, Rng};
use wgpu_metric_learning::distributed::{
    self, mpi, DistributedClassifierConfig, Group, GroupConfig,
};
use wgpu_metric_learning::{ClassifierKind, ClassifierLossConfig, ClassifierOptions, Context};

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
    let w = Array2::from_shape_simple_fn((rows, cols), || rng.normal());
    let labels: Vec<i64> = (r0..r1).map(|i| (i * 7919 % c) as i64).collect();
    let ctx = Context::native_cpu(None);
    let cfg = DistributedClassifierConfig {
        loss: ClassifierLossConfig {
            kind,
            ..Default::default()
        },
        ..Default::default()
    };
    let start = Instant::now();
    let out = distributed::classifier_loss(&group, &ctx, x.view(), &labels, w.view(), &cfg)?;
    let seconds = start.elapsed().as_secs_f64();
    let rss = group.all_gather("peak RSS", &[peak_rss_mib()])?;
    if rank == 0 {
        let rss: Vec<String> = rss.iter().map(|m| format!("{m:.0}")).collect();
        println!(
            "{{\"kind\": \"{name}\", \"ranks\": {size}, \"B\": {b}, \"D\": {d}, \"C\": {c}, \
             \"loss\": {}, \"seconds\": {seconds:.3}, \"peak_rss_mib\": [{}]}}",
            out.loss,
            rss.join(", ")
        );
    }
    Ok(())
}
