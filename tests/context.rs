//! Adapter listing and selection, the automatic path choice, shared devices, device loss.

use crate::common;

use ndarray::Array2;
use wgpu_metric_learning::{
    accuracy, batch_hard_triplets, count_triplets, knn, list_adapters, mine_triplets,
    pairwise_distances, AccuracyConfig, AdapterSelector, BackendChoice, BankConfig,
    BatchHardConfig, ComputePath, Context, ContextConfig, Distance, DistanceConfig, Error,
    KnnConfig, MemoryBank, MiningSet, PairwiseConfig, TripletConfig, TripletType,
};

fn small() -> Array2<f32> {
    Array2::from_shape_fn((3, 5), |(i, k)| (i * 5 + k) as f32 * 0.1)
}

/// The tests that list every adapter (GL's included) or make wgpu instances of their own run
/// one at a time: NVIDIA's EGL hung threads of one process that each made and dropped a GL
/// instance (an H200 server, 2026-11-26).
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An instance for `backend` alone (no GL instance unless the context runs on GL).
fn instance_for(backend: wgpu::Backend) -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends = wgpu::Backends::from(backend);
    wgpu::Instance::new(desc)
}

#[test]
fn adapters_are_listed_with_stable_indices() {
    let _one = one_at_a_time();
    let adapters = list_adapters(None);
    for a in &adapters {
        eprintln!(
            "adapter {}: {} ({:?}, {:?}, {}) software={}",
            a.index,
            a.name,
            a.backend,
            a.device_type,
            a.driver,
            a.is_software()
        );
    }
    if common::gpu_required() {
        assert!(
            !adapters.is_empty(),
            "WML_REQUIRE_GPU=1 but no adapter listed"
        );
    }
    for (i, a) in adapters.iter().enumerate() {
        assert_eq!(a.index, i, "index is the position");
    }
}

#[test]
fn every_listed_adapter_can_run_a_kernel_by_index() {
    // A multi-GPU user makes one context per adapter; each must work. The one exception is
    // GL on a GPU that a native API drives: NVIDIA's EGL lists an H200 whose device wgpu
    // cannot create, which must then be a typed error naming the adapter.
    let _one = one_at_a_time();
    let adapters = list_adapters(None);
    let mut ran = 0;
    for a in &adapters {
        let made = Context::new(&ContextConfig {
            backend: BackendChoice::Wgpu,
            adapter: AdapterSelector::Index(a.index),
            ..Default::default()
        });
        let ctx = match made {
            Err(e @ Error::RequestDevice { .. })
                if a.backend == wgpu::Backend::Gl
                    && adapters
                        .iter()
                        .any(|n| n.backend != wgpu::Backend::Gl && !n.is_software()) =>
            {
                assert!(e.to_string().contains(&a.name), "names the adapter: {e}");
                eprintln!("adapter {} ({}) refused: {e:?}", a.index, a.name);
                continue;
            }
            // Debug: with wgpu's error, the source, which Display leaves to the front ends.
            made => made.unwrap_or_else(|e| panic!("adapter {} ({}): {e:?}", a.index, a.name)),
        };
        ran += 1;
        assert_eq!(
            ctx.adapter_info().map(|i| i.name.clone()),
            Some(a.name.clone()),
            "context uses the indexed adapter"
        );
        let d = pairwise_distances(
            &ctx,
            small().view(),
            small().view(),
            &PairwiseConfig {
                // Squared and raw: a self-distance is `|x|² + |x|² − 2 x·x`, a few ulps of
                // |x|² on any device (a square root would amplify them to ~1e-3).
                distance: DistanceConfig {
                    distance: Distance::SquaredEuclidean,
                    normalize: false,
                },
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("adapter {}: {e}", a.name));
        assert_eq!(d.path, ComputePath::Wgpu, "ran through wgpu");
        assert!(
            d.values[[1, 1]].abs() < 1e-4,
            "self-distance ≈ 0 on {}",
            a.name
        );
    }
    if common::gpu_required() {
        assert!(
            ran > 0,
            "WML_REQUIRE_GPU=1 but no listed adapter ran a kernel"
        );
    }
}

#[test]
fn auto_prefers_native_cpu_when_only_software_adapters_exist() {
    let _one = one_at_a_time();
    let adapters = list_adapters(None);
    let ctx = Context::new(&ContextConfig::default()).expect("auto never fails for lack of a GPU");
    if adapters.iter().all(|a| a.is_software()) {
        assert_eq!(
            ctx.path(),
            ComputePath::NativeCpu,
            "software only → native CPU"
        );
        if let Some(first) = adapters.first() {
            eprintln!("auto chose: {}", ctx.device_name());
            assert!(
                ctx.device_name().contains("native CPU"),
                "{}",
                ctx.device_name()
            );
            assert!(
                adapters.iter().any(|a| ctx.device_name().contains(&a.name)),
                "names the software adapter it passed over ({})",
                first.name
            );
        }
    } else {
        assert_eq!(ctx.path(), ComputePath::Wgpu, "hardware adapter → wgpu");
        let info = ctx.adapter_info().expect("wgpu context");
        assert_ne!(
            info.device_type,
            wgpu::DeviceType::Cpu,
            "picked the hardware one"
        );
    }
}

#[test]
fn forced_paths_are_honoured() {
    let cpu = Context::new(&ContextConfig {
        backend: BackendChoice::NativeCpu,
        ..Default::default()
    })
    .expect("cpu");
    assert_eq!(cpu.path(), ComputePath::NativeCpu, "forced CPU");
    if let Some(gpu) = common::shared_gpu() {
        assert_eq!(
            gpu.path(),
            ComputePath::Wgpu,
            "forced wgpu, even on a software adapter"
        );
        let info = gpu.adapter_info().expect("adapter info kept");
        let _one = one_at_a_time();
        let instance = instance_for(info.backend);
        let adapter = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()))
            .into_iter()
            .find(|a| a.get_info().name == info.name && a.get_info().backend == info.backend)
            .expect("the context's adapter is listed");
        assert_eq!(
            gpu.limits(),
            Some(&adapter.limits()),
            "the device got the adapter's real limits, not the WebGPU defaults"
        );
    }
}

#[test]
fn default_budget_comes_from_the_adapter_when_it_reports_memory() {
    let Some(ctx) = common::shared_gpu() else {
        return;
    };
    let budget = ctx.memory().budget_bytes;
    eprintln!("default budget on {}: {budget} B", ctx.device_name());
    assert!(budget > 0, "a usable default budget");
    if ctx.adapter_info().map(|i| i.backend) == Some(wgpu::Backend::Vulkan) {
        assert_ne!(
            budget,
            wgpu_metric_learning::DEFAULT_BUDGET_BYTES,
            "on Vulkan the heap size is known, so the default is derived from it"
        );
    }
}

#[test]
fn unknown_adapter_name_or_index_is_a_typed_error() {
    for adapter in [
        AdapterSelector::NameContains("no adapter has this name".into()),
        AdapterSelector::Index(10_000),
    ] {
        for backend in [BackendChoice::Wgpu, BackendChoice::Auto] {
            let got = Context::new(&ContextConfig {
                backend,
                adapter: adapter.clone(),
                ..Default::default()
            });
            assert!(
                matches!(got, Err(Error::NoAdapter(_))),
                "{adapter:?} with {backend:?}: an explicit choice that matches nothing fails"
            );
        }
    }
}

#[test]
fn a_device_the_application_owns_can_be_shared() {
    let Some(info) = common::shared_gpu().and_then(Context::adapter_info) else {
        return;
    };
    let _one = one_at_a_time();
    let instance = instance_for(info.backend);
    let adapter =
        pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions::default()))
            .expect("an adapter");
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("application device"),
        required_limits: adapter.limits(),
        ..Default::default()
    }))
    .expect("device");
    let ctx = Context::from_wgpu(
        device,
        queue,
        adapter.get_info(),
        &ContextConfig {
            budget_bytes: Some(1 << 20),
            ..Default::default()
        },
    )
    .expect("the kernels fit the adapter's limits");
    let d = pairwise_distances(
        &ctx,
        small().view(),
        small().view(),
        &PairwiseConfig {
            distance: DistanceConfig::default(),
            ..Default::default()
        },
    )
    .expect("runs on the shared device");
    assert_eq!(d.path, ComputePath::Wgpu, "wgpu path");
    assert!(
        ctx.memory().peak_bytes <= 1 << 20,
        "within the given budget"
    );
}

/// After `Device::destroy`, every operation returns a typed error at once (never a hang, a
/// panic or a plausible answer), a bank made before the loss included; a new context works.
#[test]
fn operations_after_device_loss_return_a_typed_error() {
    let Some(ctx) = common::gpu_context(None) else {
        return;
    };
    let x = small();
    let y = ndarray::array![0u32, 0, 1];
    let mut bank = MemoryBank::<u32>::new(&ctx, &BankConfig::new(8, 5)).expect("bank");
    bank.enqueue(&ctx, &MiningSet::new(&x, &y))
        .expect("enqueue before the loss");
    let (device, _) = ctx.wgpu_device().expect("wgpu context");
    device.destroy();
    let set = MiningSet::new(&x, &y);
    let knn_cfg = KnnConfig {
        k: 1,
        ..Default::default()
    };
    let margin = TripletConfig::margin_miner(TripletType::All);
    let outcomes: Vec<(&str, Result<(), Error>)> = vec![
        (
            "pairwise_distances",
            pairwise_distances(
                &ctx,
                x.view(),
                x.view(),
                &PairwiseConfig {
                    distance: DistanceConfig::default(),
                    ..Default::default()
                },
            )
            .map(drop),
        ),
        ("knn", knn(&ctx, x.view(), x.view(), &knn_cfg).map(drop)),
        (
            "knn on the bank",
            knn(&ctx, x.view(), bank.rows(), &knn_cfg).map(drop),
        ),
        (
            "accuracy",
            accuracy(
                &ctx,
                &MiningSet::new(&x, &y),
                None,
                &AccuracyConfig::default(),
            )
            .map(drop),
        ),
        (
            "mine_triplets",
            mine_triplets(&ctx, &set, None, &margin).map(drop),
        ),
        (
            "count_triplets",
            count_triplets(&ctx, &set, None, &margin).map(drop),
        ),
        (
            "mine against the bank",
            mine_triplets(&ctx, &set, Some(&bank.refs()), &margin).map(drop),
        ),
        (
            "batch_hard_triplets",
            batch_hard_triplets(&ctx, &set, None, &BatchHardConfig::default()).map(drop),
        ),
        (
            "enqueue",
            bank.enqueue(&ctx, &MiningSet::new(&x, &y)).map(drop),
        ),
        ("snapshot", bank.snapshot(&ctx).map(drop)),
        (
            "a new bank",
            MemoryBank::<u32>::new(&ctx, &BankConfig::new(8, 5)).map(drop),
        ),
    ];
    for (what, got) in outcomes {
        assert!(
            matches!(got, Err(Error::DeviceLost { .. })),
            "{what} after a loss: {got:?}"
        );
    }
    // The process can go on with a fresh context.
    let fresh = common::gpu_context(None).expect("a new context after a loss");
    pairwise_distances(
        &fresh,
        x.view(),
        x.view(),
        &PairwiseConfig {
            distance: DistanceConfig::default(),
            ..Default::default()
        },
    )
    .expect("the new context works");
}

/// A device whose limits fall short of the kernels' (GLES 3.1 may offer 4 storage buffers per
/// stage; the kernels bind up to 8) is refused when the context is made, with the limit named,
/// rather than at the first call.
#[test]
fn a_device_below_the_kernels_limits_is_refused_with_the_limit_named() {
    let Some(probe) = common::shared_gpu() else {
        return;
    };
    let limits = wgpu::Limits {
        max_storage_buffers_per_shader_stage: 4,
        ..probe.limits().cloned().expect("wgpu context has limits")
    };
    let got = Context::new(&ContextConfig {
        backend: BackendChoice::Wgpu,
        limits: Some(limits),
        ..Default::default()
    });
    match got {
        Err(Error::DeviceLimit {
            what: "max_storage_buffers_per_shader_stage",
            requested,
            limit: 4,
            ..
        }) => assert!(requested > 4, "names the need: {requested}"),
        Err(e) => panic!("expected DeviceLimit, got {e}"),
        Ok(ctx) => panic!("made a context on {}", ctx.device_name()),
    }
}

/// A configuration whose device no other test asks for: its limits differ from the adapter's
/// by `tag` in one that no kernel uses (so no other test's context takes its parked device).
fn config_of_its_own(tag: u32) -> Option<ContextConfig> {
    let ctx = common::gpu_context(None)?;
    let mut limits = ctx.wgpu_device()?.0.limits();
    limits.max_texture_dimension_1d -= tag;
    Some(ContextConfig {
        backend: BackendChoice::Wgpu,
        limits: Some(limits),
        fill_outputs_with_sentinel: true,
        ..Default::default()
    })
}

/// Whether `ctx` runs on GL, whose devices are never reused (and whose devices compare by
/// ids unique only within each context's own instance).
fn on_gl(ctx: &Context) -> bool {
    ctx.adapter_info()
        .is_some_and(|i| i.backend == wgpu::Backend::Gl)
}

/// `ctx`'s kNN lists of a small set match the native path's.
fn answers_as_native(ctx: &Context) {
    let x = ndarray::Array2::from_shape_fn((37, 5), |(i, j)| ((i * 7 + j * 3) % 11) as f32);
    let cfg = KnnConfig {
        k: 3,
        ..Default::default()
    };
    let ours = knn(ctx, x.view(), x.view(), &cfg).expect("knn on the device");
    let native = knn(&Context::native_cpu(None), x.view(), x.view(), &cfg).expect("native knn");
    assert_eq!(ours.indices, native.indices);
}

#[test]
fn a_dropped_contexts_device_serves_the_next_context_alike() {
    let Some(cfg) = config_of_its_own(7) else {
        return;
    };
    let first = Context::new(&cfg).expect("context");
    let device = first.wgpu_device().expect("device").0.clone();
    let gl = on_gl(&first);
    answers_as_native(&first);
    drop(first);
    let second = Context::new(&cfg).expect("context");
    if !gl {
        let same = second.wgpu_device().expect("device").0 == &device;
        assert!(same, "a parked device serves the next context");
    }
    // Only the device is shared: the budget and the counters are the new context's.
    assert_eq!(second.transfers().submissions, 0);
    assert_eq!(second.memory().current_bytes, 0);
    answers_as_native(&second);
}

#[test]
fn a_lost_device_is_never_handed_to_a_later_context() {
    let Some(cfg) = config_of_its_own(11) else {
        return;
    };
    let first = Context::new(&cfg).expect("context");
    let device = first.wgpu_device().expect("device").0.clone();
    device.destroy();
    drop(first);
    let second = Context::new(&cfg).expect("context after a loss");
    if !on_gl(&second) {
        assert!(second.wgpu_device().expect("device").0 != &device);
    }
    answers_as_native(&second);
}

#[test]
fn a_device_lost_while_parked_is_destroyed_when_next_asked_for() {
    let Some(cfg) = config_of_its_own(13) else {
        return;
    };
    let first = Context::new(&cfg).expect("context");
    let device = first.wgpu_device().expect("device").0.clone();
    drop(first);
    // Lost while no context holds it.
    device.destroy();
    let second = Context::new(&cfg).expect("context after a loss");
    if !on_gl(&second) {
        assert!(second.wgpu_device().expect("device").0 != &device);
    }
    answers_as_native(&second);
}
