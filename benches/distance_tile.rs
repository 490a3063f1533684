//! Criterion benchmark of `pairwise_distances` (kernel stem `distance_tile`) on the wgpu path
//! (whatever adapter exists, lavapipe included) and on the native CPU path.
//!
//! `cargo bench --bench distance_tile`; the figures for `BENCHMARKS.md` come from
//! `cargo run --release --example bench_report`, which also prints GFLOP/s and peak memory.

use criterion::{criterion_main, BenchmarkId, Criterion, Throughput};
use ndarray::Array2;
use wgpu_metric_learning::{
    pairwise_distances, BackendChoice, Context, ContextConfig, Distance, DistanceConfig,
    PairwiseConfig,
};

fn data(rows: usize, d: usize, seed: f32) -> Array2<f32> {
    Array2::from_shape_fn((rows, d), |(i, k)| {
        ((i as f32 * 0.61 + k as f32 * 1.37 + seed).sin() * 7.0).fract()
    })
}

fn contexts() -> Vec<(&'static str, Context)> {
    let mut out = vec![("native_cpu", Context::native_cpu(None))];
    let wgpu = Context::new(&ContextConfig {
        backend: BackendChoice::Wgpu,
        ..Default::default()
    });
    match wgpu {
        Ok(ctx) => out.push(("wgpu", ctx)),
        Err(e) => eprintln!("no wgpu adapter, benchmarking the CPU path only: {e}"),
    }
    out
}

fn bench(c: &mut Criterion) {
    let (q, n, d) = (512, 4096, 128);
    let (queries, refs) = (data(q, d, 0.1), data(n, d, 0.7));
    let cfg = PairwiseConfig {
        distance: DistanceConfig {
            distance: Distance::Cosine,
            normalize: true,
        },
        ..Default::default()
    };
    let mut group = c.benchmark_group("distance_tile");
    group.sample_size(10);
    group.throughput(Throughput::Elements((q * n) as u64));
    for (name, ctx) in contexts() {
        eprintln!("{name}: {}", ctx.device_name());
        group.bench_with_input(
            BenchmarkId::new(name, format!("{q}x{n}x{d}")),
            &ctx,
            |b, ctx| {
                b.iter(|| {
                    pairwise_distances(ctx, queries.view(), refs.view(), &cfg).expect("distances")
                })
            },
        );
    }
    group.finish();
}

// criterion_group! generates an undocumented public function; keep it in a module that says so.
mod group {
    #![allow(
        missing_docs,
        reason = "criterion_group! generates an undocumented function"
    )]
    criterion::criterion_group!(benches, super::bench);
}
criterion_main!(group::benches);
