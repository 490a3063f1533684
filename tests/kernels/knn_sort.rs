//! kNN with its answer left on the device (`knn_on_device`: kernels `distance_tile` +
//! `knn_select`, then `knn_sort` per query chunk): the same lists, bit for bit, as `knn` and the
//! plain reference, on random shapes, every distance, ties, self-exclusion, several query chunks
//! (tight budgets), `k` past a workgroup, bank references and device
//! queries; no bytes read back; the arrays counted in the budget; every typed error.

use crate::common;
use crate::common::DISTANCES;

use ndarray::{Array1, Array2};
use proptest::prelude::*;
use wgpu_metric_learning::reference::knn_select::knn_select;
use wgpu_metric_learning::{
    knn, knn_on_device, knn_plan, pairwise_distances, BankConfig, Context, DeviceEmbeddings,
    Distance, DistanceConfig, Error, KnnConfig, MemoryBank, MiningSet, PairwiseConfig,
    SelfExclusion,
};

/// Rows on a coarse grid (frequent exact ties) or spread.
fn embeddings(n: usize, d: usize, seed: u64, ties: bool) -> Array2<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    Array2::from_shape_fn((n, d), |_| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let u = (state >> 40) as u32;
        if ties {
            (u % 3) as f32 - 1.0
        } else {
            (u as f32 / (1u32 << 24) as f32) * 2.0 - 1.0
        }
    })
}

fn bits(x: &Array2<f32>) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// `knn_on_device` on `ctx` equals `knn` on `ctx` bit for bit, and the reference selection over
/// `ctx`'s own distances.
fn check(ctx: &Context, queries: &Array2<f32>, refs: &Array2<f32>, cfg: &KnnConfig) {
    let found = knn_on_device(ctx, queries, refs, cfg).expect("knn_on_device");
    let (indices, scores) = (
        found.indices.to_host(ctx).expect("indices"),
        found.scores.to_host(ctx).expect("scores"),
    );
    let host = knn(ctx, queries, refs, cfg).expect("knn");
    assert_eq!(indices, host.indices, "indices");
    assert_eq!(bits(&scores), bits(&host.scores), "scores");
    let distance = PairwiseConfig {
        distance: cfg.distance,
        ..Default::default()
    };
    let dist = pairwise_distances(ctx, queries, refs, &distance).expect("distances");
    let excluded: Vec<u32> = match cfg.self_exclusion {
        SelfExclusion::SameIndex => (0..queries.nrows() as u32).collect(),
        _ => vec![u32::MAX; queries.nrows()],
    };
    let largest = cfg.distance.distance.is_similarity();
    let (ri, rv) = knn_select(dist.values.view(), cfg.k, largest, &excluded);
    assert_eq!(indices, ri, "reference indices");
    assert_eq!(bits(&scores), bits(&rv), "reference scores");
    assert_eq!(found.transfers.bytes_down, 0, "nothing read back");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(12)))]
    #[test]
    fn equals_knn_and_the_reference(
        q in 1usize..90,
        n in 1usize..300,
        d in 1usize..20,
        k_frac in 0.0f64..1.0,
        metric in 0usize..4,
        ties: bool,
        exclude: bool,
        seed: u64,
    ) {
        let Some(ctx) = common::shared_gpu() else { return Ok(()) };
        let exclude = exclude && n >= 2;
        let (queries, refs) = if exclude {
            let x = embeddings(n, d, seed, ties);
            (x.clone(), x)
        } else {
            (embeddings(q, d, seed, ties), embeddings(n, d, seed ^ 1, ties))
        };
        let visible = n - usize::from(exclude);
        let cfg = KnnConfig {
            k: 1 + ((visible - 1) as f64 * k_frac) as usize,
            distance: DistanceConfig { distance: DISTANCES[metric], normalize: metric == 2 },
            self_exclusion: if exclude { SelfExclusion::SameIndex } else { SelfExclusion::Auto },
            ..Default::default()
        };
        check(ctx, &queries, &refs, &cfg);
    }
}

#[test]
fn query_chunks_reference_ranges_and_a_wide_k_under_a_tight_budget() {
    let Some(ctx) = common::gpu_context(Some(3 << 20)) else {
        return;
    };
    let (queries, refs) = (embeddings(700, 24, 3, false), embeddings(5000, 24, 4, true));
    for (k, distance) in [
        (1, Distance::Euclidean),
        (300, Distance::Cosine),
        (513, Distance::DotProduct),
    ] {
        let cfg = KnnConfig {
            k,
            distance: DistanceConfig {
                distance,
                normalize: distance == Distance::Cosine,
            },
            ..Default::default()
        };
        let plan = knn_plan(&ctx, &queries, &refs, &cfg).expect("plan");
        assert!(plan.chunks > 1, "several query chunks: {plan:?}");
        ctx.reset_peak();
        check(&ctx, &queries, &refs, &cfg);
        let memory = ctx.memory();
        assert!(memory.peak_bytes <= memory.budget_bytes, "{memory:?}");
    }
}

#[test]
fn one_host_wait_no_bytes_down_and_the_arrays_count_in_the_budget() {
    let Some(ctx) = common::gpu_context_as_shipped(Some(64 << 20)) else {
        return;
    };
    let x = embeddings(400, 16, 5, false);
    let cfg = KnnConfig {
        k: 25,
        self_exclusion: SelfExclusion::SameIndex,
        ..Default::default()
    };
    let before = ctx.memory().current_bytes;
    let found = knn_on_device(&ctx, &x, &x, &cfg).expect("knn_on_device");
    assert_eq!(found.transfers.bytes_down, 0);
    assert_eq!(found.transfers.host_waits, 1, "{:?}", found.transfers);
    assert_eq!(found.indices.dim(), (400, 25));
    assert_eq!(found.indices.bytes(), 4 * 400 * 25);
    assert_eq!(
        ctx.memory().current_bytes - before,
        2 * 4 * 400 * 25,
        "the two arrays are held, nothing else"
    );
    drop(found);
    assert_eq!(
        ctx.memory().current_bytes,
        before,
        "dropping them frees them"
    );
}

#[test]
fn bank_references_and_device_queries() {
    let Some(ctx) = common::shared_gpu() else {
        return;
    };
    let (x, y) = (
        embeddings(300, 12, 6, true),
        Array1::from_shape_fn(300, |i| (i % 7) as i64),
    );
    let mut bank = MemoryBank::<i64>::new(ctx, &BankConfig::new(256, 12)).expect("bank");
    // Two batches into 256 slots: the ring wraps.
    for range in [0..200, 100..300] {
        let (xb, yb) = (
            x.slice(ndarray::s![range.clone(), ..]),
            y.slice(ndarray::s![range]),
        );
        bank.enqueue(ctx, &MiningSet::new(xb, yb)).expect("enqueue");
    }
    let buffer = common::upload(ctx, &x, 0, 12);
    let queries = DeviceEmbeddings::new(&buffer, 0, (300, 12));
    let cfg = KnnConfig {
        k: 17,
        ..Default::default()
    };
    let found = knn_on_device(ctx, queries, bank.rows(), &cfg).expect("device");
    let host = knn(ctx, &x, bank.rows(), &cfg).expect("host");
    assert_eq!(found.indices.to_host(ctx).expect("read"), host.indices);
    assert_eq!(
        bits(&found.scores.to_host(ctx).expect("read")),
        bits(&host.scores)
    );
}

/// `bytes` bytes of `buffer` read back through a mapped copy.
fn read_buffer(ctx: &Context, buffer: &wgpu::Buffer, bytes: u64) -> Vec<u32> {
    let (device, queue) = ctx.wgpu_device().expect("wgpu");
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("read"),
        size: bytes,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = device.create_command_encoder(&Default::default());
    encoder.copy_buffer_to_buffer(buffer, 0, &staging, 0, bytes);
    queue.submit([encoder.finish()]);
    staging
        .slice(..)
        .map_async(wgpu::MapMode::Read, |r| r.expect("map"));
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .expect("poll");
    let data = staging.slice(..).get_mapped_range().expect("mapped");
    bytemuck::cast_slice(&data).to_vec()
}

#[test]
fn copy_to_writes_a_buffer_of_the_caller_and_refuses_bad_targets() {
    let (Some(ctx), Some(other)) = (common::shared_gpu(), common::gpu_context(None)) else {
        return;
    };
    let x = embeddings(50, 8, 7, false);
    let cfg = KnnConfig {
        k: 5,
        ..Default::default()
    };
    let found = knn_on_device(ctx, &x, &x, &cfg).expect("knn_on_device");
    let (device, _) = ctx.wgpu_device().expect("wgpu");
    let target = |size, usage| {
        device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("target"),
            size,
            usage,
            mapped_at_creation: false,
        })
    };
    let usage =
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC;
    let mine = target(16 + found.indices.bytes(), usage);
    found.indices.copy_to(ctx, &mine, 16).expect("copy");
    let copied = read_buffer(ctx, &mine, 16 + found.indices.bytes());
    let host = knn(ctx, &x, &x, &cfg).expect("knn");
    assert_eq!(&copied[4..], host.indices.as_slice().expect("dense"));

    let invalid = |r: Result<(), Error>, what: &str| {
        assert!(
            matches!(r, Err(Error::InvalidParameter { what: w, .. }) if w == what),
            "{r:?}"
        );
    };
    invalid(found.indices.copy_to(ctx, &mine, 2), "target");
    invalid(
        found.indices.copy_to(ctx, found.indices.buffer(), 0),
        "target",
    );
    invalid(found.indices.copy_to(ctx, &mine, 20), "target");
    invalid(
        found.indices.copy_to(
            ctx,
            &target(found.indices.bytes(), wgpu::BufferUsages::STORAGE),
            0,
        ),
        "target",
    );
    invalid(found.indices.to_host(&other).map(|_| ()), "ctx");
    invalid(found.indices.copy_to(&other, &mine, 0), "ctx");
    invalid(
        found
            .indices
            .to_host(&Context::native_cpu(None))
            .map(|_| ()),
        "ctx",
    );
    if ctx.adapter_info().map(|i| i.backend) != Some(wgpu::Backend::Gl) {
        // Documented: buffers of two GL contexts cannot be told apart.
        let (other_device, _) = other.wgpu_device().expect("wgpu");
        let foreign = other_device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("foreign"),
            size: found.indices.bytes(),
            usage,
            mapped_at_creation: false,
        });
        invalid(found.indices.copy_to(ctx, &foreign, 0), "target");
    }
}

#[test]
fn bad_calls_are_typed_errors() {
    let x = embeddings(10, 4, 8, false);
    let native = Context::native_cpu(None);
    let got = knn_on_device(&native, &x, &x, &KnnConfig::default());
    assert!(
        matches!(got, Err(Error::InvalidParameter { what: "ctx", .. })),
        "{got:?}"
    );
    let Some(ctx) = common::shared_gpu() else {
        return;
    };
    for k in [0, 11] {
        let cfg = KnnConfig {
            k,
            ..Default::default()
        };
        let got = knn_on_device(ctx, &x, &x, &cfg);
        assert!(
            matches!(got, Err(Error::InvalidParameter { what: "k", .. })),
            "k = {k}: {got:?}"
        );
    }
    let mut bad = x.clone();
    bad[[3, 1]] = f32::NAN;
    let got = knn_on_device(ctx, &bad, &x, &KnnConfig::default());
    assert!(matches!(got, Err(Error::NonFinite { .. })), "{got:?}");
    // No queries: empty arrays.
    let none = Array2::<f32>::zeros((0, 4));
    let found = knn_on_device(ctx, &none, &x, &KnnConfig::default()).expect("empty");
    assert_eq!(found.indices.dim(), (0, 10));
    assert_eq!(found.indices.to_host(ctx).expect("read").dim(), (0, 10));
}

#[test]
fn results_left_on_the_device_move_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<wgpu_metric_learning::DeviceArray<u32>>();
    send_sync::<wgpu_metric_learning::KnnOnDevice>();
    send_sync::<wgpu_metric_learning::TripletsOnDevice>();
}
