//! The execution context: which path runs (wgpu or native CPU), on which adapter, under which budget.

mod adapter;
pub(crate) mod oom_retry;
pub(crate) mod plan;

use std::sync::Arc;

pub use adapter::{list_adapters, AdapterSelector, AdapterSummary};

use crate::error::{Error, Result};
use crate::kernels;
pub use crate::kernels::distance::DistanceKernel;
use crate::kernels::gemm_tile::GemmVariant;
use crate::runtime::device::{Accounting, GpuDevice};
pub use crate::runtime::device::{ShaderChecks, Tuning};
use crate::runtime::device_pool::{self, DeviceKey};
use crate::runtime::memory::{MemoryStats, MemoryTracker, Transfers};
#[cfg(feature = "mpi")]
pub(crate) use adapter::nth_best_adapter;
use adapter::{enumerate, reported_device_memory, select_adapter, Listing};

/// Budget used when the adapter does not report its memory (DX12, GL, shared devices); Vulkan
/// and Metal contexts default to half of what the driver reports instead.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{ContextConfig, DEFAULT_BUDGET_BYTES};
/// // Pick a budget explicitly where the default would not suit a shared device.
/// let cfg = ContextConfig { budget_bytes: Some(DEFAULT_BUDGET_BYTES / 2), ..Default::default() };
/// assert_eq!(cfg.budget_bytes, Some(256 << 20));
/// ```
pub const DEFAULT_BUDGET_BYTES: u64 = 512 << 20;

/// Budget of the native CPU path: its scratch memory, not counting the returned arrays.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{Context, DEFAULT_CPU_BUDGET_BYTES};
/// assert_eq!(Context::native_cpu(None).memory().budget_bytes, DEFAULT_CPU_BUDGET_BYTES);
/// ```
pub const DEFAULT_CPU_BUDGET_BYTES: u64 = 1 << 30;

/// Which implementation runs the operations of a [`Context`].
///
/// # Example
/// ```
/// use wgpu_metric_learning::{BackendChoice, ComputePath, Context, ContextConfig};
/// let cfg = ContextConfig { backend: BackendChoice::NativeCpu, ..Default::default() };
/// assert_eq!(Context::new(&cfg)?.path(), ComputePath::NativeCpu);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// A hardware adapter through wgpu when one exists; the native CPU path when the only
    /// adapters are software rasterisers (lavapipe, llvmpipe, WARP: `DeviceType::Cpu`) or there
    /// is none, because those run our kernels about 10× slower than native code.
    #[default]
    Auto,
    /// Always wgpu, on whatever adapter is selected, software or not (this is what the tests use
    /// so that the WGSL kernels run on lavapipe in CI). Fails if there is no adapter.
    Wgpu,
    /// Always the native CPU path; no adapter is looked for.
    NativeCpu,
}

/// How to build a [`Context`]. Every field has a documented default.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{BackendChoice, ContextConfig};
/// let cfg = ContextConfig { backend: BackendChoice::NativeCpu, budget_bytes: Some(64 << 20), ..Default::default() };
/// assert_eq!(cfg.budget_bytes, Some(64 << 20));
/// ```
#[derive(Debug, Clone, Default)]
pub struct ContextConfig {
    /// Which path runs operations. Default: [`BackendChoice::Auto`].
    pub backend: BackendChoice,
    /// Which adapter wgpu uses. Default: [`AdapterSelector::Best`].
    pub adapter: AdapterSelector,
    /// wgpu backends to look at. Default `None`: `WGPU_BACKEND` if set (e.g. `vulkan`, `gl`), else all.
    pub wgpu_backends: Option<wgpu::Backends>,
    /// Byte budget for the library's device allocations. Default `None`: half of what the
    /// driver reports (Vulkan: the largest device-local heap; Metal:
    /// `recommendedMaxWorkingSetSize`), else [`DEFAULT_BUDGET_BYTES`] (DX12, GL);
    /// [`DEFAULT_CPU_BUDGET_BYTES`] on the native CPU path.
    pub budget_bytes: Option<u64>,
    /// Limits to request from the adapter. Default `None`: the adapter's own limits (not the
    /// small WebGPU defaults). Lower limits are useful to test chunking.
    pub limits: Option<wgpu::Limits>,
    /// Fill every output buffer with a sentinel (NaN / `u32::MAX`) before kernels write it, so
    /// that output a kernel failed to write cannot pass as a plausible value. Default `false`
    /// (it costs an extra write per tile); the tests turn it on.
    pub fill_outputs_with_sentinel: bool,
    /// Fault injection for tests of the out-of-memory path: pretend the device holds only
    /// this many bytes, so that a buffer taking the tracked total past it fails exactly as
    /// the driver's out-of-memory does ([`Error::OutOfMemory`], caught in the same place),
    /// while the budget still allows it. Operations then retry with smaller tiles. Default
    /// `None`: only the real device refuses.
    pub simulated_device_bytes: Option<u64>,
    /// Whether kernel modules keep naga's runtime checks. Default [`ShaderChecks::Auto`]:
    /// trusted modules for the kernels that are safe by construction in release builds,
    /// checked ones in debug builds.
    pub shader_checks: ShaderChecks,
    /// How the distance GEMM's variant is chosen per device and shape, and on the native
    /// path whether kNN's `k ≤ 128` searches run the fused kernel or GEMM blocks (timed once
    /// per CPU model and shape bucket, see [`NativeKnnKernel`]). Default
    /// [`Tuning::Cached`]: tuned once on the device (software adapters are not: they get the
    /// default variant), the winner kept under the user's cache directory.
    pub tuning: Tuning,
    /// Time every dispatch by GPU timestamps, per kernel stem, into each result's
    /// [`crate::Transfers::kernels`]. Default `false`: it adds two timestamp writes per
    /// dispatch and one small readback per submission. Ignored (see
    /// [`Context::kernel_timing`]) where the adapter has no `TIMESTAMP_QUERY`.
    pub kernel_timing: bool,
    /// Which kernel computes distance tiles. Default [`DistanceKernel::Tuned`]; the others
    /// are for benchmarks and tests (every choice gives the same bits).
    pub distance_kernel: DistanceKernel,
    /// Which kernel the native path's kNN uses for `k ≤ 128`. Default
    /// [`NativeKnnKernel::Auto`]; the others are for benchmarks and tests (every choice gives
    /// the same bits).
    pub native_knn_kernel: NativeKnnKernel,
}

/// Which kernel the native CPU path's kNN (and k-means' assignment step) uses for `k ≤ 128`.
/// Above that `k`, and where a kernel's scratch does not fit the budget, the other runs.
/// Every choice gives the same neighbours and the same bits of their scores.
///
/// Measured (BENCHMARKS.md): which is faster depends on the CPU kind and `k` (the fused
/// kernel 1.2–2.1× GEMM blocks on an AVX-512 Xeon and 1.1–1.2× on an AVX2-only EPYC, where
/// the blocks won before its epilogue was vectorised; the blocks 1.07–1.11× on a Zen 4), so
/// [`NativeKnnKernel::Auto`] times both on the running CPU the first time a shape bucket is
/// met (with [`Tuning::Cached`] or [`Tuning::Eager`]; about 3 s, then kept in the tuning
/// cache) and runs the faster.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{BackendChoice, ContextConfig, NativeKnnKernel};
/// let cfg = ContextConfig {
///     backend: BackendChoice::NativeCpu,
///     native_knn_kernel: NativeKnnKernel::Blocks,
///     ..Default::default()
/// };
/// assert_eq!(NativeKnnKernel::default(), NativeKnnKernel::Auto);
/// # let _ = cfg;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NativeKnnKernel {
    /// The kernel measured faster on this CPU for the search's `k` and `d` (the blocks only
    /// when more than 5 % faster; with [`Tuning::Off`], or for searches under 10⁹ flops, the
    /// fused kernel), with whole blocks where its scratch fits; else GEMM blocks; else the
    /// fused kernel on fewer rows.
    #[default]
    Auto,
    /// The fused kernel, on fewer rows before GEMM blocks where whole blocks do not fit.
    Fused,
    /// GEMM blocks and a selection pass over each, whatever `k` (the fused kernel never runs).
    Blocks,
}

/// The path an operation actually ran on; every result carries one.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{knn, ComputePath, Context, KnnConfig};
/// let x = ndarray::array![[0.0f32, 1.0], [1.0, 0.0]];
/// let found = knn(&Context::native_cpu(None), x.view(), x.view(), &KnnConfig { k: 1, ..Default::default() })?;
/// assert_eq!(found.path, ComputePath::NativeCpu);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputePath {
    /// WGSL kernels through wgpu.
    Wgpu,
    /// The native multi-threaded CPU implementation.
    NativeCpu,
}

/// How a context's device came to be: `own` when the library made it (and installs its
/// handlers), and what it was made with where a later context may reuse it.
struct Made {
    own: bool,
    reuse: Option<DeviceKey>,
}

/// Why a context runs on the CPU path, or which device it drives.
#[derive(Debug)]
enum Engine {
    Gpu(Box<GpuDevice>),
    Cpu {
        /// The software adapter that auto-selection passed over, if any.
        passed_over: Option<String>,
    },
}

/// Where operations run and under which memory budget.
///
/// Make one with [`Context::new`] (adapter chosen by [`ContextConfig`]), [`Context::from_wgpu`]
/// (share a device your application already has) or [`Context::native_cpu`]. A context is
/// `Send + Sync`; one per device.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{ComputePath, Context};
/// let ctx = Context::native_cpu(None);
/// assert_eq!(ctx.path(), ComputePath::NativeCpu);
/// assert_eq!(ctx.memory().current_bytes, 0);
/// ```
#[derive(Debug)]
pub struct Context {
    engine: Engine,
    memory: Arc<MemoryTracker>,
    /// [`ContextConfig::kernel_timing`], for [`Context::kernel_timing`]'s answer.
    timing_asked: bool,
    /// [`ContextConfig::native_knn_kernel`].
    native_knn_kernel: NativeKnnKernel,
    /// [`ContextConfig::tuning`] (the native kNN kernel's choice as well as the GPU's).
    tuning: Tuning,
}

impl Context {
    /// Builds a context as `config` says: picks the path and the adapter, requests the
    /// adapter's real limits, installs error and device-lost handlers that log instead of
    /// panicking, and sets the budget.
    ///
    /// # Errors
    /// [`Error::NoAdapter`] when [`BackendChoice::Wgpu`] finds no (matching) adapter, or when an
    /// explicit [`AdapterSelector`] matches none; [`Error::DeviceLimit`] when the device's
    /// limits fall short of what the kernels use (4 storage buffers per stage or 128
    /// invocations per workgroup, as a GLES 3.1 device may offer: the kernels use up to 8 and
    /// 256; [`BackendChoice::Auto`] then takes the native CPU path instead);
    /// [`Error::RequestDevice`] when the adapter refuses the device (e.g. limits above what it
    /// supports).
    ///
    /// # Example
    /// ```no_run
    /// use wgpu_metric_learning::{Context, ContextConfig};
    /// let ctx = Context::new(&ContextConfig::default())?;
    /// println!("running on {:?} ({})", ctx.path(), ctx.device_name());
    /// # Ok::<(), wgpu_metric_learning::Error>(())
    /// ```
    pub fn new(config: &ContextConfig) -> Result<Self> {
        if config.backend == BackendChoice::NativeCpu {
            return Ok(Self::native_cpu_with(config, None));
        }
        // Best by rank only: a name (here or in WGPU_ADAPTER_NAME) or an index needs them all.
        let by_rank = config.adapter == AdapterSelector::Best
            && std::env::var("WGPU_ADAPTER_NAME").map_or(true, |n| n.is_empty());
        let listing = if by_rank {
            Listing::BestOnly
        } else {
            Listing::All
        };
        let found = enumerate(config.wgpu_backends, listing);
        let explicit = config.adapter != AdapterSelector::Best;
        // When GL was enumerated its lock is held to the end: the adapters not chosen are
        // dropped inside `select_adapter`, and a GL device makes its EGL context, under it.
        // Adapters that look alike (several GPUs of one model, where the driver gives no PCI
        // bus): a parked device could belong to any of them, so none is reused.
        let infos: Vec<wgpu::AdapterInfo> = found.adapters.iter().map(|a| a.get_info()).collect();
        let adapter = match select_adapter(found.adapters, &config.adapter) {
            Ok(a) => a,
            Err(e) if config.backend == BackendChoice::Auto && !explicit => {
                log::info!("{e}; using the native CPU path");
                return Ok(Self::native_cpu_with(config, None));
            }
            Err(e) => return Err(e),
        };
        let info = adapter.get_info();
        if config.backend == BackendChoice::Auto && info.device_type == wgpu::DeviceType::Cpu {
            log::info!(
                "only a software adapter ({}) is available; using the native CPU path",
                info.name
            );
            return Ok(Self::native_cpu_with(config, Some(info.name)));
        }
        let required_limits = config.limits.clone().unwrap_or_else(|| adapter.limits());
        if let Err(e) = kernels::check_limits("Context::new", &required_limits) {
            if config.backend == BackendChoice::Auto && config.limits.is_none() {
                log::info!(
                    "{} cannot run the kernels ({e}); using the native CPU path",
                    info.name
                );
                return Ok(Self::native_cpu_with(config, Some(info.name)));
            }
            return Err(e);
        }
        // Timestamps whenever the adapter has them: the tuner times candidates with them, and
        // `kernel_timing` times every dispatch.
        let features = adapter.features() & wgpu::Features::TIMESTAMP_QUERY;
        let alike = infos.iter().filter(|i| **i == info).count();
        let key = DeviceKey::reusable(&info, features, &required_limits).filter(|_| alike <= 1);
        let (device, queue) = match key.as_ref().and_then(device_pool::take) {
            Some(parked) => parked,
            None => {
                let _guard = crate::runtime::device::lifecycle_lock();
                pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
                    label: Some("wgpu-metric-learning"),
                    required_features: features,
                    required_limits,
                    experimental_features: wgpu::ExperimentalFeatures::disabled(),
                    memory_hints: wgpu::MemoryHints::Performance,
                    trace: wgpu::Trace::Off,
                }))
                .map_err(|source| Error::RequestDevice {
                    adapter: info.name.clone(),
                    source,
                })?
            }
        };
        let budget = config.budget_bytes.unwrap_or_else(|| {
            reported_device_memory(&adapter).map_or(DEFAULT_BUDGET_BYTES, |heap| heap / 2)
        });
        let made = Made {
            own: true,
            reuse: key,
        };
        Ok(Self::on_device(device, queue, info, made, config, budget))
    }

    /// Wraps a device and queue that the caller already has, so an application with its own
    /// wgpu device can share it. The device's current limits are used as they are. No error or
    /// device-lost handler is installed (they belong to the application); the library's own
    /// operations still capture their errors with error scopes. The budget is
    /// `config.budget_bytes` or [`DEFAULT_BUDGET_BYTES`]; `config.backend` and `adapter` are ignored.
    ///
    /// # Errors
    /// [`Error::DeviceLimit`] when the device's limits fall short of what the kernels use
    /// (WebGPU's default limits are enough).
    ///
    /// # Example
    /// ```no_run
    /// # fn app_device() -> (wgpu::Device, wgpu::Queue, wgpu::AdapterInfo) { unimplemented!() }
    /// use wgpu_metric_learning::{Context, ContextConfig};
    /// let (device, queue, info) = app_device();
    /// let ctx = Context::from_wgpu(device, queue, info, &ContextConfig::default())?;
    /// # Ok::<(), wgpu_metric_learning::Error>(())
    /// ```
    pub fn from_wgpu(
        device: wgpu::Device,
        queue: wgpu::Queue,
        adapter_info: wgpu::AdapterInfo,
        config: &ContextConfig,
    ) -> Result<Self> {
        kernels::check_limits("Context::from_wgpu", &device.limits())?;
        let budget = config.budget_bytes.unwrap_or(DEFAULT_BUDGET_BYTES);
        let made = Made {
            own: false,
            reuse: None,
        };
        Ok(Self::on_device(
            device,
            queue,
            adapter_info,
            made,
            config,
            budget,
        ))
    }

    /// A context on a device, made as `made` says.
    fn on_device(
        device: wgpu::Device,
        queue: wgpu::Queue,
        info: wgpu::AdapterInfo,
        made: Made,
        config: &ContextConfig,
        budget: u64,
    ) -> Self {
        let memory = Arc::new(MemoryTracker::new(budget));
        let accounting = Accounting {
            memory: Arc::clone(&memory),
            fill_sentinel: config.fill_outputs_with_sentinel,
            simulated_device_bytes: config.simulated_device_bytes,
            shader_checks: config.shader_checks,
            tuning: config.tuning,
            kernel_timing: config.kernel_timing,
        };
        let gpu = GpuDevice::new(device, queue, info, made.own, accounting).reusable(made.reuse);
        gpu.install(kernels::distance::DistanceTile::with_setting(
            config.distance_kernel,
        ));
        Self {
            engine: Engine::Gpu(Box::new(gpu)),
            memory,
            timing_asked: config.kernel_timing,
            native_knn_kernel: config.native_knn_kernel,
            tuning: config.tuning,
        }
    }

    /// A context on the native CPU path, with `budget_bytes` (default
    /// [`DEFAULT_CPU_BUDGET_BYTES`]) for its scratch memory.
    ///
    /// # Example
    /// ```
    /// let ctx = wgpu_metric_learning::Context::native_cpu(Some(1 << 20));
    /// assert_eq!(ctx.memory().budget_bytes, 1 << 20);
    /// ```
    pub fn native_cpu(budget_bytes: Option<u64>) -> Self {
        let config = ContextConfig {
            budget_bytes,
            ..Default::default()
        };
        Self::native_cpu_with(&config, None)
    }

    fn native_cpu_with(config: &ContextConfig, passed_over: Option<String>) -> Self {
        Self {
            engine: Engine::Cpu { passed_over },
            memory: Arc::new(MemoryTracker::new(
                config.budget_bytes.unwrap_or(DEFAULT_CPU_BUDGET_BYTES),
            )),
            timing_asked: config.kernel_timing,
            native_knn_kernel: config.native_knn_kernel,
            tuning: config.tuning,
        }
    }

    /// [`ContextConfig::native_knn_kernel`].
    pub(crate) fn native_knn_kernel(&self) -> NativeKnnKernel {
        self.native_knn_kernel
    }

    /// [`ContextConfig::tuning`].
    pub(crate) fn tuning(&self) -> Tuning {
        self.tuning
    }

    /// The path this context's operations run on.
    ///
    /// # Example
    /// ```
    /// use wgpu_metric_learning::{Context, ContextConfig};
    /// let ctx = Context::new(&ContextConfig::default())?;
    /// // Without a hardware GPU: the native path, naming the software adapter it passed over.
    /// println!("{:?} on {}", ctx.path(), ctx.device_name());
    /// if let Some(info) = ctx.adapter_info() {
    ///     println!("{:?}, max buffer {} bytes", info.device_type, ctx.limits().map_or(0, |l| l.max_buffer_size));
    /// }
    /// # Ok::<(), wgpu_metric_learning::Error>(())
    /// ```
    pub fn path(&self) -> ComputePath {
        match self.engine {
            Engine::Gpu(_) => ComputePath::Wgpu,
            Engine::Cpu { .. } => ComputePath::NativeCpu,
        }
    }

    /// The wgpu adapter's description, on the wgpu path.
    ///
    /// See the example of [`Context::path`].
    pub fn adapter_info(&self) -> Option<&wgpu::AdapterInfo> {
        match &self.engine {
            Engine::Gpu(g) => Some(&g.info),
            Engine::Cpu { .. } => None,
        }
    }

    /// The device's limits as granted, on the wgpu path.
    ///
    /// See the example of [`Context::path`].
    pub fn limits(&self) -> Option<&wgpu::Limits> {
        self.gpu().map(|g| &g.limits)
    }

    /// A human-readable name of what runs: the adapter's name and backend, or the CPU path
    /// (naming the software adapter it was preferred to, if any).
    ///
    /// See the example of [`Context::path`].
    pub fn device_name(&self) -> String {
        match &self.engine {
            Engine::Gpu(g) => format!("{} ({:?})", g.info.name, g.info.backend),
            Engine::Cpu {
                passed_over: Some(name),
            } => format!("native CPU (preferred to software adapter {name})"),
            Engine::Cpu { passed_over: None } => "native CPU".to_string(),
        }
    }

    /// The wgpu device and queue, on the wgpu path, to share them with the application's own
    /// work (the converse of [`Context::from_wgpu`]). A device the library made outlives the
    /// context: once the context is dropped, it may serve the next context made on the same
    /// adapter with the same limits (devices are reused, not destroyed, outside GL).
    ///
    /// # Example
    /// ```
    /// use wgpu_metric_learning::Context;
    /// assert!(Context::native_cpu(None).wgpu_device().is_none());
    /// ```
    pub fn wgpu_device(&self) -> Option<(&wgpu::Device, &wgpu::Queue)> {
        self.gpu().map(|g| (&*g.device, &*g.queue))
    }

    /// Tracked memory: current and peak bytes, and the budget.
    ///
    /// # Example
    /// ```
    /// use wgpu_metric_learning::{knn, Context, KnnConfig};
    /// let ctx = Context::native_cpu(Some(64 << 20));
    /// let x = ndarray::Array2::<f32>::ones((500, 8));
    /// ctx.reset_peak();
    /// knn(&ctx, x.view(), x.view(), &KnnConfig::default())?;
    /// let m = ctx.memory();
    /// assert!(m.peak_bytes > 0 && m.peak_bytes <= m.budget_bytes);
    /// assert_eq!(m.current_bytes, 0); // scratch released; the result is the caller's
    /// # Ok::<(), wgpu_metric_learning::Error>(())
    /// ```
    pub fn memory(&self) -> MemoryStats {
        self.memory.stats()
    }

    /// Whether dispatches are timed: `Ok(true)` when [`ContextConfig::kernel_timing`] asked
    /// and the device has timestamps, `Ok(false)` when it did not ask, and `Err(reason)`
    /// when it asked but cannot (the native path, or an adapter without `TIMESTAMP_QUERY`).
    ///
    /// # Example
    /// ```
    /// use wgpu_metric_learning::Context;
    /// assert!(Context::native_cpu(None).kernel_timing().is_err());
    /// ```
    pub fn kernel_timing(&self) -> std::result::Result<bool, String> {
        match self.gpu() {
            None => Err("the native CPU path runs no kernels".into()),
            Some(g) if g.kernel_timing => Ok(true),
            Some(g) if self.timing_asked && !g.timestamps => Err(format!(
                "{} ({:?}) has no TIMESTAMP_QUERY",
                g.info.name, g.info.backend
            )),
            Some(_) => Ok(false),
        }
    }

    /// Tunes the distance GEMM for tiles of `(rows, cols)` at dimension `d` on this context's
    /// device now, whatever [`ContextConfig::tuning`] says, and makes the winner this
    /// context's choice for that shape bucket; with `use_cache` a cached winner is taken as
    /// it is. The winner is written to the cache (see [`Tuning`]). Cost: one compilation
    /// and six dispatches of each candidate on a tile of at most 2048 × 8192 × `d` (well
    /// under a second on a discrete GPU; `wml tune` does this for the usual shapes).
    ///
    /// # Errors
    /// [`Error::NoDevice`] on the native CPU path; [`Error::BudgetExceeded`] when the budget
    /// cannot hold even a one-row tile; [`Error::Wgpu`], [`Error::Poll`] or
    /// [`Error::DeviceLost`] if the device fails.
    ///
    /// # Example
    /// ```no_run
    /// use wgpu_metric_learning::{Context, ContextConfig};
    /// let ctx = Context::new(&ContextConfig::default())?;
    /// let report = ctx.tune_distance(10_000, 100_000, 128, false)?;
    /// println!("{}: {:?}", report.bucket, report.chosen.map(|v| v.name()));
    /// # Ok::<(), wgpu_metric_learning::Error>(())
    /// ```
    pub fn tune_distance(
        &self,
        rows: usize,
        cols: usize,
        d: usize,
        use_cache: bool,
    ) -> Result<TuneReport> {
        let gpu = self.gpu().ok_or(Error::NoDevice {
            op: "tune_distance",
        })?;
        let started = std::time::Instant::now();
        let (bucket, t) = kernels::tune::tune_now(
            gpu,
            rows as u64,
            cols as u64,
            d.div_ceil(4) as u64,
            use_cache,
        )?;
        Ok(TuneReport {
            bucket,
            chosen: t.chosen,
            candidates: t.timings,
            tile: (t.shape.0 as usize, t.shape.1 as usize, t.shape.2 as usize),
            by_timestamps: t.by_timestamps,
            from_cache: t.from_cache,
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// Host–device traffic over the context's life: blocking waits, submissions, bytes moved
    /// each way (zero on the native path). Every result also carries its own call's.
    ///
    /// # Example
    /// ```
    /// use wgpu_metric_learning::{Context, Transfers};
    /// assert_eq!(Context::native_cpu(None).transfers(), Transfers::default());
    /// ```
    pub fn transfers(&self) -> Transfers {
        self.gpu()
            .map_or_else(Transfers::default, |g| g.transfers.totals())
    }

    /// Restarts peak tracking from the current bytes (e.g. before measuring one operation).
    ///
    /// See the example of [`Context::memory`].
    pub fn reset_peak(&self) {
        self.memory.reset_peak();
    }

    pub(crate) fn gpu(&self) -> Option<&GpuDevice> {
        match &self.engine {
            Engine::Gpu(g) => Some(g),
            Engine::Cpu { .. } => None,
        }
    }

    pub(crate) fn tracker(&self) -> &Arc<MemoryTracker> {
        &self.memory
    }
}

/// What [`Context::tune_distance`] found for one shape bucket.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TuneReport {
    /// The bucket: `ROWSxCOLSxD`, each a power of two (rows ≤ 4096, columns ≤ 65 536).
    pub bucket: String,
    /// The winner (`None` when no candidate fits the device: the hand-written kernel runs).
    pub chosen: Option<GemmVariant>,
    /// Each candidate that ran and its median seconds on the tile (only the winner's, from
    /// the cache).
    pub candidates: Vec<(GemmVariant, f64)>,
    /// The tile the candidates ran on, `(rows, cols, d)`; zeros when taken from the cache.
    pub tile: (usize, usize, usize),
    /// Timed by GPU timestamps (else by the wall clock of a submit-and-wait).
    pub by_timestamps: bool,
    /// Taken from the cache without running anything.
    pub from_cache: bool,
    /// Seconds the tuning took.
    pub seconds: f64,
}

/// A wgpu context with sentinel-filled outputs for the crate's unit tests, or `None` (with a
/// notice) when there is no adapter and `WML_REQUIRE_GPU=1` does not demand one.
#[cfg(test)]
pub(crate) fn test_gpu_context() -> Option<Context> {
    let config = ContextConfig {
        backend: BackendChoice::Wgpu,
        fill_outputs_with_sentinel: true,
        ..Default::default()
    };
    match Context::new(&config) {
        Ok(ctx) => Some(ctx),
        Err(e) if std::env::var("WML_REQUIRE_GPU").is_ok_and(|v| v == "1") => {
            panic!("WML_REQUIRE_GPU=1 but no GPU context: {e}")
        }
        Err(e) => {
            eprintln!("skipped: no adapter ({e})");
            None
        }
    }
}

#[cfg(test)]
mod device_guard_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_and_error_are_send_and_sync() {
        fn shareable<T: Send + Sync>() {}
        shareable::<Context>();
        shareable::<crate::Error>();
    }

    #[test]
    fn native_cpu_context_has_no_device() {
        let ctx = Context::native_cpu(Some(123));
        assert_eq!(ctx.path(), ComputePath::NativeCpu, "forced CPU path");
        assert!(ctx.adapter_info().is_none(), "no adapter on the CPU path");
        assert_eq!(ctx.memory().budget_bytes, 123, "budget as configured");
    }
}
