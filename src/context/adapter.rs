//! Adapter discovery and choice: listing what wgpu finds, ranking it, and reading how much
//! memory a device reports (the default budget).

use crate::error::{Error, Result};

/// Which adapter a wgpu context uses.
///
/// # Example
/// ```no_run
/// use wgpu_metric_learning::{AdapterSelector, BackendChoice, Context, ContextConfig};
/// // One context per GPU on a multi-GPU machine.
/// let second = Context::new(&ContextConfig {
///     backend: BackendChoice::Wgpu,
///     adapter: AdapterSelector::Index(1),
///     ..Default::default()
/// })?;
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum AdapterSelector {
    /// The best one: hardware before software (discrete, integrated, virtual, other, CPU), then
    /// Vulkan/Metal/DX12 before GL. If `WGPU_ADAPTER_NAME` is set, the first adapter whose name
    /// contains it (case-insensitive) instead.
    #[default]
    Best,
    /// The adapter at this position of [`list_adapters`] (same backends filter).
    Index(usize),
    /// The first adapter whose name contains this text, case-insensitive.
    NameContains(String),
}

/// One adapter as seen by [`list_adapters`].
///
/// # Example
/// ```
/// use wgpu_metric_learning::list_adapters;
/// for a in list_adapters(None) {
///     println!("{}: {} ({:?}), software: {}", a.index, a.name, a.backend, a.is_software());
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AdapterSummary {
    /// Position in the list; pass it as [`AdapterSelector::Index`].
    pub index: usize,
    /// The adapter's name, e.g. `"llvmpipe (LLVM 15.0.6, 256 bits)"`.
    pub name: String,
    /// Its wgpu backend.
    pub backend: wgpu::Backend,
    /// Discrete, integrated, virtual, CPU (software) or other.
    pub device_type: wgpu::DeviceType,
    /// Driver name and version, as reported.
    pub driver: String,
}

impl AdapterSummary {
    /// Whether this is a software rasteriser (lavapipe, llvmpipe, WARP, SwiftShader).
    ///
    /// See the example of [`AdapterSummary`].
    pub fn is_software(&self) -> bool {
        self.device_type == wgpu::DeviceType::Cpu
    }
}

/// Lists every adapter wgpu finds for `backends` (`None`: `WGPU_BACKEND`, else all), in a stable
/// order, so that a multi-GPU user can make one [`Context`](crate::Context) per device with
/// [`AdapterSelector::Index`].
///
/// # Example
/// ```
/// for a in wgpu_metric_learning::list_adapters(None) {
///     println!("{}: {} ({:?}, {:?})", a.index, a.name, a.backend, a.device_type);
/// }
/// ```
pub fn list_adapters(backends: Option<wgpu::Backends>) -> Vec<AdapterSummary> {
    enumerate(backends, Listing::All)
        .adapters
        .iter()
        .enumerate()
        .map(|(index, a)| summarize(index, &a.get_info()))
        .collect()
}

fn summarize(index: usize, info: &wgpu::AdapterInfo) -> AdapterSummary {
    AdapterSummary {
        index,
        name: info.name.clone(),
        backend: info.backend,
        device_type: info.device_type,
        driver: format!("{} {}", info.driver, info.driver_info)
            .trim()
            .to_string(),
    }
}

/// The adapters of `backends` (default: `WGPU_BACKEND`, else all), Vulkan, Metal and DX12
/// from one instance shared by every context this crate creates, GL from an instance of its
/// own per call.
///
/// One instance, because wgpu names resources by ids unique only within their instance: a
/// buffer of another context's device would otherwise resolve to an unrelated buffer of this
/// one, where a shared instance lets wgpu see that it belongs to another device (a typed
/// error, see [`crate::DeviceEmbeddings`]). Not for GL: its instance holds one EGL display
/// whose context threads would contend for.
///
/// With [`Listing::BestOnly`], GL is not enumerated when a native API offers a discrete GPU:
/// no GL adapter can rank above it, and a GL instance costs an EGL display. NVIDIA's EGL
/// deadlocked when several threads of one process each made and dropped such an instance (the
/// test suite on an H200 hung after three tests); the GL instances that are still made are
/// made, and their unused adapters dropped, one at a time ([`Enumerated`]).
pub(crate) fn enumerate(backends: Option<wgpu::Backends>, listing: Listing) -> Enumerated {
    static SHARED: std::sync::OnceLock<wgpu::Instance> = std::sync::OnceLock::new();
    static GL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let backends = backends
        .or_else(wgpu::Backends::from_env)
        .unwrap_or(wgpu::Backends::all());
    let instance = |backends| {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        desc.backends = backends;
        wgpu::Instance::new(desc)
    };
    let native = backends - wgpu::Backends::GL;
    let mut adapters = Vec::new();
    let mut gl_lock = None;
    if !native.is_empty() {
        // One enumeration at a time: NVIDIA's driver crashed (SIGSEGV in libnvidia-eglcore,
        // under wgpu-hal's `expose_adapter`) when several threads enumerated the physical
        // devices of one instance at once, as the first contexts of a process do.
        let _guard = crate::runtime::device::lifecycle_lock();
        let shared = SHARED.get_or_init(|| {
            quiet_device_select_layer();
            instance(wgpu::Backends::all() - wgpu::Backends::GL)
        });
        adapters.extend(pollster::block_on(shared.enumerate_adapters(native)));
    }
    let discrete = adapters
        .iter()
        .any(|a| a.get_info().device_type == wgpu::DeviceType::DiscreteGpu);
    if backends.contains(wgpu::Backends::GL) && !(discrete && listing == Listing::BestOnly) {
        // A poisoned lock only means another enumeration panicked; the guard is still sound.
        gl_lock = Some(GL.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        let gl = instance(wgpu::Backends::GL);
        adapters.extend(pollster::block_on(
            gl.enumerate_adapters(wgpu::Backends::GL),
        ));
    }
    Enumerated {
        adapters,
        _gl_lock: gl_lock,
    }
}

/// Keeps Mesa's Vulkan device-selection layer from probing a Wayland display that cannot
/// exist: without `XDG_RUNTIME_DIR`, libwayland prints "error: XDG_RUNTIME_DIR is invalid or
/// not set in the environment." at every enumeration, although nothing failed (a container,
/// ssh without a session). The layer only orders devices, which [`enumerate`]'s callers do
/// themselves. A user who steers it (`MESA_VK_DEVICE_SELECT`, `NODEVICE_SELECT` either way) or
/// who can reach Wayland is left alone.
///
/// It sets `NODEVICE_SELECT=1` once, before the crate's Vulkan instance exists, under the
/// lifecycle lock. Changing the environment races a `getenv` in another thread of the process
/// at that instant (glibc); it happens only in the case that would otherwise print the error,
/// and setting `XDG_RUNTIME_DIR` or `NODEVICE_SELECT` avoids it.
fn quiet_device_select_layer() {
    if !cfg!(all(
        unix,
        not(target_vendor = "apple"),
        not(target_os = "android")
    )) {
        return;
    }
    let var = std::env::var_os;
    let wayland_reachable = var("XDG_RUNTIME_DIR")
        .is_some_and(|d| std::path::Path::new(&d).is_absolute())
        || var("WAYLAND_SOCKET").is_some()
        || var("WAYLAND_DISPLAY").is_some_and(|d| std::path::Path::new(&d).is_absolute());
    let steered = var("NODEVICE_SELECT").is_some() || var("MESA_VK_DEVICE_SELECT").is_some();
    if !wayland_reachable && !steered {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
}

/// What [`enumerate`] found and, when it made a GL instance, the lock that keeps every other
/// GL enumeration out until this is dropped: the adapters first (fields drop in order), so that
/// the GL instance of those not kept goes while the lock is held.
pub(crate) struct Enumerated {
    pub(crate) adapters: Vec<wgpu::Adapter>,
    /// Held, never read.
    _gl_lock: Option<std::sync::MutexGuard<'static, ()>>,
}

/// What [`enumerate`] must list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Listing {
    /// Every adapter: positions are [`AdapterSelector::Index`]'s.
    All,
    /// Enough to pick [`AdapterSelector::Best`]: the best adapter is among them.
    BestOnly,
}

/// Lower is better: hardware before software, native APIs before GL.
fn adapter_rank(device_type: wgpu::DeviceType, backend: wgpu::Backend) -> (u8, u8) {
    let device = match device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    let api = match backend {
        wgpu::Backend::Vulkan | wgpu::Backend::Metal | wgpu::Backend::Dx12 => 0,
        _ => 1,
    };
    (device, api)
}

/// The position in [`list_adapters`] of the `n`-th adapter (counted modulo their number) of
/// the best kind present ([`AdapterSelector::Best`]'s order): with several GPUs of one kind,
/// `n` = a process's local rank spreads the processes of a node over all of them. `None`
/// when wgpu finds no adapter.
#[cfg(feature = "mpi")]
pub(crate) fn nth_best_adapter(backends: Option<wgpu::Backends>, n: usize) -> Option<usize> {
    let ranks: Vec<_> = enumerate(backends, Listing::All)
        .adapters
        .iter()
        .map(|a| {
            let info = a.get_info();
            adapter_rank(info.device_type, info.backend)
        })
        .collect();
    let best = ranks.iter().min()?;
    let of_best: Vec<usize> = (0..ranks.len()).filter(|&i| ranks[i] == *best).collect();
    of_best.get(n % of_best.len()).copied()
}

pub(crate) fn select_adapter(
    adapters: Vec<wgpu::Adapter>,
    selector: &AdapterSelector,
) -> Result<wgpu::Adapter> {
    let by_name = |adapters: Vec<wgpu::Adapter>, needle: &str| {
        let needle = needle.to_lowercase();
        let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
        adapters
            .into_iter()
            .find(|a| a.get_info().name.to_lowercase().contains(&needle))
            .ok_or_else(|| {
                Error::NoAdapter(format!(
                    "no adapter name contains {needle:?}; found {names:?}"
                ))
            })
    };
    match selector {
        AdapterSelector::Index(i) => {
            let n = adapters.len();
            adapters
                .into_iter()
                .nth(*i)
                .ok_or_else(|| Error::NoAdapter(format!("adapter index {i} requested, {n} found")))
        }
        AdapterSelector::NameContains(name) => by_name(adapters, name),
        AdapterSelector::Best => match std::env::var("WGPU_ADAPTER_NAME") {
            Ok(name) if !name.is_empty() => by_name(adapters, &name),
            _ => adapters
                .into_iter()
                .min_by_key(|a| {
                    let info = a.get_info();
                    adapter_rank(info.device_type, info.backend)
                })
                .ok_or_else(|| Error::NoAdapter("wgpu found no adapter".into())),
        },
    }
}

/// The device memory the adapter reports, where the driver tells it: the largest
/// device-local heap on Vulkan, Metal's `recommendedMaxWorkingSetSize`; `None` elsewhere (DX12,
/// GL, where [`crate::DEFAULT_BUDGET_BYTES`] applies).
pub(crate) fn reported_device_memory(adapter: &wgpu::Adapter) -> Option<u64> {
    // A physical-device query: under the guard, as enumeration is.
    let _guard = crate::runtime::device::lifecycle_lock();
    match adapter.get_info().backend {
        wgpu::Backend::Vulkan => vulkan_device_memory(adapter),
        wgpu::Backend::Metal => metal_working_set(adapter),
        _ => None,
    }
}

/// The largest device-local heap. wgpu-core 30 builds its Vulkan backend only on these
/// targets (on Apple ones only through MoltenVK, which this crate does not enable).
#[cfg(any(
    windows,
    target_os = "linux",
    target_os = "android",
    target_os = "freebsd"
))]
fn vulkan_device_memory(adapter: &wgpu::Adapter) -> Option<u64> {
    // SAFETY: we only read immutable physical-device properties through the instance that owns
    // the adapter, and keep no handle past this call.
    let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
    let props = unsafe {
        hal.shared_instance()
            .raw_instance()
            .get_physical_device_memory_properties(hal.raw_physical_device())
    };
    props
        .memory_heaps_as_slice()
        .iter()
        .filter(|h| h.flags.contains(ash::vk::MemoryHeapFlags::DEVICE_LOCAL))
        .map(|h| h.size)
        .max()
}

#[cfg(not(any(
    windows,
    target_os = "linux",
    target_os = "android",
    target_os = "freebsd"
)))]
fn vulkan_device_memory(_adapter: &wgpu::Adapter) -> Option<u64> {
    None
}

/// Metal's own estimate of how much memory the device can use without hurting performance
/// (unified memory on Apple silicon: a share of system memory).
#[cfg(target_vendor = "apple")]
fn metal_working_set(adapter: &wgpu::Adapter) -> Option<u64> {
    use objc2_metal::MTLDevice;
    // SAFETY: a read-only property of the adapter's device; no handle is kept.
    let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Metal>() }?;
    let bytes = hal.raw_device().recommendedMaxWorkingSetSize();
    (bytes > 0).then_some(bytes)
}

#[cfg(not(target_vendor = "apple"))]
fn metal_working_set(_adapter: &wgpu::Adapter) -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hardware_ranks_before_software_and_native_before_gl() {
        use wgpu::{Backend as B, DeviceType as D};
        let discrete_gl = adapter_rank(D::DiscreteGpu, B::Gl);
        let integrated_vk = adapter_rank(D::IntegratedGpu, B::Vulkan);
        let lavapipe = adapter_rank(D::Cpu, B::Vulkan);
        let llvmpipe_gl = adapter_rank(D::Cpu, B::Gl);
        assert!(discrete_gl < integrated_vk, "device type comes first");
        assert!(integrated_vk < lavapipe, "any GPU beats a software adapter");
        assert!(lavapipe < llvmpipe_gl, "Vulkan beats GL at equal type");
    }
}
