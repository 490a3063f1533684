//! The GPU core's figures, one JSON line each (the GPU report's `report.json` rows):
//!
//! - `peak-fma`: a WGSL loop of 8 independent `vec4` FMA chains, the fp32 rate this adapter
//!   reaches through wgpu and naga (the "% of peak" denominator of every other row);
//! - `peak-copy`: a `vec4` copy kernel over 256 MiB, the bandwidth it reaches;
//! - `gemm-QxNxD`: the distance tile `pairwise_distances(Q × N × D)` (cosine) with every GEMM
//!   variant and the hand-written kernel, each built checked and trusted: the kernel's GPU time
//!   by timestamps (median of the runs), its TFLOP/s, and the host's upload, wait and readback
//!   seconds of the call (the end-to-end explanation); then the tuned choice;
//! - `gemm-knn-QxNxD-kK`: kNN with the tuned variant, every kernel's GPU time and the wall time.
//!
//! ```sh
//! cargo run --release --example bench_gemm -- [--Q 2048 --N 16384 --D 128] [--reps 5]
//!     [--knn 10000x100000x128] [--k 10] [--quick]
//! ```
//! Prints nothing for a kernel kind without timestamps but says so (`"timing": "wall"`).

mod support;

use std::time::Instant;

use ndarray::Array2;
use wgpu_metric_learning::{
    knn, pairwise_distances, BackendChoice, Context, ContextConfig, Distance, DistanceConfig,
    DistanceKernel, GemmVariant, KernelTimes, KnnConfig, PairwiseConfig, ShaderChecks,
    GEMM_CANDIDATES,
};

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn data(rows: usize, d: usize, seed: f32) -> Array2<f32> {
    Array2::from_shape_fn((rows, d), |(i, k)| {
        ((i as f32 * 0.61 + k as f32 * 1.37 + seed).sin() * 7.0).fract()
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The GPU seconds of the distance kernels (a GEMM variant or the hand-written tile).
fn distance_seconds(kernels: &KernelTimes) -> f64 {
    kernels
        .iter()
        .filter(|k| k.stem == "gemm_tile" || k.stem == "distance_tile")
        .map(|k| k.gpu_seconds)
        .sum()
}

fn json_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let (q, n, d) = if quick {
        (256, 2048, 64)
    } else {
        (
            arg(&args, "--Q", 2048usize),
            arg(&args, "--N", 16384usize),
            arg(&args, "--D", 128usize),
        )
    };
    let reps = arg(&args, "--reps", if quick { 2usize } else { 5 });
    let knn_shape: String = arg(
        &args,
        "--knn",
        if quick {
            "500x5000x64".to_string()
        } else {
            "10000x100000x128".to_string()
        },
    );
    let k = arg(&args, "--k", 10usize);
    let open = |kernel, checks| {
        Context::new(&ContextConfig {
            backend: BackendChoice::Wgpu,
            kernel_timing: true,
            distance_kernel: kernel,
            shader_checks: checks,
            ..Default::default()
        })
    };
    let base = open(DistanceKernel::Tuned, ShaderChecks::Trusted)?;
    let device = base.device_name();
    let driver = base
        .adapter_info()
        .map(|i| format!("{} {}", i.driver, i.driver_info))
        .unwrap_or_default();
    let timing = match base.kernel_timing() {
        Ok(true) => "timestamps",
        _ => "wall",
    };
    let tag = format!(
        "\"device\": {}, \"driver\": {}, \"timing\": \"{timing}\"",
        json_str(&device),
        json_str(driver.trim())
    );

    let (fma_tflops, copy_gbs) = peaks(&base, quick)?;
    println!("{{\"case\": \"peak-fma\", \"kernel_tflops\": {fma_tflops:.3}, {tag}}}");
    println!("{{\"case\": \"peak-copy\", \"gbytes_per_s\": {copy_gbs:.1}, {tag}}}");

    // The distance tile with every variant, checked and trusted.
    let (queries, refs) = (data(q, d, 0.1), data(n, d, 0.7));
    let cfg = PairwiseConfig {
        distance: DistanceConfig {
            distance: Distance::Cosine,
            normalize: true,
        },
        ..Default::default()
    };
    let flop = 2.0 * (q * n * d) as f64;
    let case = format!("gemm-{q}x{n}x{d}");
    let mut kernels: Vec<(String, DistanceKernel)> =
        vec![("hand-written".into(), DistanceKernel::HandWritten)];
    kernels.extend(
        GEMM_CANDIDATES
            .iter()
            .map(|v| (v.name(), DistanceKernel::Variant(*v))),
    );
    kernels.push(("tuned".into(), DistanceKernel::Tuned));
    for (name, kernel) in kernels {
        for (checks, checks_name) in [
            (ShaderChecks::Checked, "checked"),
            (ShaderChecks::Trusted, "trusted"),
        ] {
            if name == "tuned" && checks == ShaderChecks::Checked {
                continue;
            }
            if let DistanceKernel::Variant(v) = kernel {
                let fits = base.limits().is_some_and(|l| {
                    u64::from(l.max_compute_workgroup_storage_size) >= v.workgroup_bytes()
                });
                if !fits {
                    println!("{{\"case\": \"{case}\", \"variant\": \"{name}\", \"checks\": \"{checks_name}\", \"skipped\": \"does not fit the device\", {tag}}}");
                    continue;
                }
            }
            let ctx = open(kernel, checks)?;
            let chosen = if name == "tuned" {
                let t = Instant::now();
                let report = ctx.tune_distance(q, n, d, true)?;
                eprintln!(
                    "tuned {} in {:.2} s: {:?}",
                    report.bucket,
                    t.elapsed().as_secs_f64(),
                    report.chosen.map(|v| v.name())
                );
                report
                    .chosen
                    .map_or("hand-written".to_string(), |v| v.name())
            } else {
                name.clone()
            };
            pairwise_distances(&ctx, queries.view(), refs.view(), &cfg)?; // warm-up, compile
            let (mut kernel_s, mut wall_s, mut up, mut wait, mut down) =
                (vec![], vec![], vec![], vec![], vec![]);
            for _ in 0..reps {
                let t = Instant::now();
                let out = pairwise_distances(&ctx, queries.view(), refs.view(), &cfg)?;
                wall_s.push(t.elapsed().as_secs_f64());
                let tr = out.transfers;
                kernel_s.push(distance_seconds(&tr.kernels));
                up.push(tr.host.seconds(tr.host.upload_ns));
                wait.push(tr.host.seconds(tr.host.wait_ns));
                down.push(tr.host.seconds(tr.host.readback_ns));
            }
            let ks = median(kernel_s);
            let tflops = flop / ks * 1e-12;
            println!(
                "{{\"case\": \"{case}\", \"variant\": \"{chosen}\", \"tuned\": {}, \"checks\": \"{checks_name}\", \"kernel_seconds\": {ks:.6}, \"ours_seconds\": {:.6}, \"kernel_tflops\": {tflops:.3}, \"peak_tflops\": {fma_tflops:.3}, \"upload_seconds\": {:.6}, \"wait_seconds\": {:.6}, \"readback_seconds\": {:.6}, {tag}}}",
                name == "tuned",
                median(wall_s),
                median(up),
                median(wait),
                median(down)
            );
        }
    }

    // kNN with the tuned variant: every kernel's time.
    let dims: Vec<usize> = knn_shape
        .split('x')
        .filter_map(|s| s.parse().ok())
        .collect();
    if let [kq, kn, kd] = dims[..] {
        let ctx = open(DistanceKernel::Tuned, ShaderChecks::Trusted)?;
        let report = ctx.tune_distance(kq.min(4096), kn, kd, true)?;
        let (x, r) = (data(kq, kd, 0.3), data(kn, kd, 0.9));
        let kcfg = KnnConfig {
            k,
            distance: DistanceConfig {
                distance: Distance::Cosine,
                normalize: true,
            },
            ..Default::default()
        };
        knn(&ctx, x.view(), r.view(), &kcfg)?; // warm-up
        let mut walls = Vec::new();
        let mut last = None;
        for _ in 0..reps {
            let t = Instant::now();
            let found = knn(&ctx, x.view(), r.view(), &kcfg)?;
            walls.push(t.elapsed().as_secs_f64());
            last = Some(found.transfers);
        }
        let tr = last.ok_or("no run")?;
        let gemm = distance_seconds(&tr.kernels);
        let flop = 2.0 * (kq * kn * kd) as f64;
        println!(
            "{{\"case\": \"gemm-knn-{kq}x{kn}x{kd}-k{k}\", \"variant\": \"{}\", \"ours_seconds\": {:.6}, \"gemm_seconds\": {gemm:.6}, \"kernel_tflops\": {:.3}, \"peak_tflops\": {fma_tflops:.3}, \"kernels\": {}, \"wait_seconds\": {:.6}, \"upload_seconds\": {:.6}, \"readback_seconds\": {:.6}, {tag}}}",
            report.chosen.map_or("hand-written".to_string(), |v: GemmVariant| v.name()),
            median(walls),
            flop / gemm * 1e-12,
            support::kernels_json(&tr.kernels, 1.0),
            tr.host.seconds(tr.host.wait_ns),
            tr.host.seconds(tr.host.upload_ns),
            tr.host.seconds(tr.host.readback_ns),
        );
    }
    Ok(())
}

/// The FMA-loop peak (TFLOP/s) and the copy bandwidth (GB/s) of `ctx`'s device, by
/// timestamps where it has them (else wall clock around a submit-and-wait), best of 5.
fn peaks(ctx: &Context, quick: bool) -> Result<(f64, f64), Box<dyn std::error::Error>> {
    let (device, queue) = ctx.wgpu_device().ok_or("no wgpu device")?;
    const ITERS: u32 = 1024;
    let fma = format!(
        "@group(0) @binding(0) var<storage, read_write> out: array<vec4<f32>>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {{
    let i = g.x + g.y * n.x * 256u;
    let s = f32(i) * 1e-9;
    var a0 = vec4<f32>(s); var a1 = a0 + 1.0; var a2 = a0 + 2.0; var a3 = a0 + 3.0;
    var a4 = a0 + 4.0; var a5 = a0 + 5.0; var a6 = a0 + 6.0; var a7 = a0 + 7.0;
    let m = vec4<f32>(0.999999);
    let c = vec4<f32>(1e-7);
    for (var k = 0u; k < {ITERS}u; k++) {{
        a0 = fma(a0, m, c); a1 = fma(a1, m, c); a2 = fma(a2, m, c); a3 = fma(a3, m, c);
        a4 = fma(a4, m, c); a5 = fma(a5, m, c); a6 = fma(a6, m, c); a7 = fma(a7, m, c);
    }}
    out[i] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}}"
    );
    let copy = "@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
    let i = g.x + g.y * n.x * 256u;
    if (i < arrayLength(&dst)) { dst[i] = src[i]; }
}";
    let (groups_x, groups_y): (u32, u32) = if quick { (256, 4) } else { (1024, 64) };
    let threads = u64::from(groups_x) * u64::from(groups_y) * 256;
    let fma_flop = threads as f64 * f64::from(ITERS) * 8.0 * 4.0 * 2.0;
    let copy_bytes: u64 = if quick { 16 << 20 } else { 256 << 20 };
    let make = |src: &str| {
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("peak"),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        });
        device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("peak"),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        })
    };
    let storage = |bytes: u64| {
        device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("peak"),
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        })
    };
    let fma_pipe = make(&fma);
    let fma_out = storage(threads * 16);
    let fma_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("peak"),
        layout: &fma_pipe.get_bind_group_layout(0),
        entries: &[wgpu::BindGroupEntry {
            binding: 0,
            resource: fma_out.as_entire_binding(),
        }],
    });
    let copy_pipe = make(copy);
    let (src, dst) = (storage(copy_bytes), storage(copy_bytes));
    let copy_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("peak"),
        layout: &copy_pipe.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: src.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: dst.as_entire_binding(),
            },
        ],
    });
    let copy_threads = copy_bytes / 16;
    let copy_x = 1024u32;
    let copy_y = copy_threads.div_ceil(256 * u64::from(copy_x)) as u32;
    let timestamps = device.features().contains(wgpu::Features::TIMESTAMP_QUERY);
    let period = f64::from(queue.get_timestamp_period()) * 1e-9;
    let time = |pipe: &wgpu::ComputePipeline, group: &wgpu::BindGroup, x: u32, y: u32| -> f64 {
        let set = timestamps.then(|| {
            device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("peak"),
                ty: wgpu::QueryType::Timestamp,
                count: 2,
            })
        });
        let resolve = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("peak"),
            size: 16,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let read = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("peak"),
            size: 16,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("peak"),
                timestamp_writes: set.as_ref().map(|s| wgpu::ComputePassTimestampWrites {
                    query_set: s,
                    beginning_of_pass_write_index: Some(0),
                    end_of_pass_write_index: Some(1),
                }),
            });
            pass.set_pipeline(pipe);
            pass.set_bind_group(0, group, &[]);
            pass.dispatch_workgroups(x, y, 1);
        }
        if let Some(s) = &set {
            enc.resolve_query_set(s, 0..2, &resolve, 0);
            enc.copy_buffer_to_buffer(&resolve, 0, &read, 0, 16);
        }
        let t = Instant::now();
        let index = queue.submit([enc.finish()]);
        let _ = device.poll(wgpu::PollType::Wait {
            submission_index: Some(index),
            timeout: None,
        });
        let wall = t.elapsed().as_secs_f64();
        if set.is_none() {
            return wall;
        }
        read.slice(..).map_async(wgpu::MapMode::Read, |_| {});
        let _ = device.poll(wgpu::PollType::wait_indefinitely());
        let ticks: Vec<u64> = match read.slice(..).get_mapped_range() {
            Ok(v) => bytemuck::cast_slice(&v[..]).to_vec(),
            Err(_) => return wall,
        };
        read.unmap();
        (ticks[1].saturating_sub(ticks[0])) as f64 * period
    };
    let best = |v: Vec<f64>| v.into_iter().fold(f64::INFINITY, f64::min);
    let fma_s = best(
        (0..5)
            .map(|_| time(&fma_pipe, &fma_group, groups_x, groups_y))
            .collect(),
    );
    let copy_s = best(
        (0..5)
            .map(|_| time(&copy_pipe, &copy_group, copy_x, copy_y))
            .collect(),
    );
    Ok((
        fma_flop / fma_s * 1e-12,
        2.0 * copy_bytes as f64 / copy_s * 1e-9,
    ))
}
