//! A wgpu device and queue as the kernels see them: its limits, its compiled kernels, whether
//! it was lost, and the error scopes that turn wgpu's failures into [`Error`] variants. Below
//! the context (which makes one) and the kernels (which compile on one).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::device_pool::{self, DeviceKey, LostFlag};
pub(crate) use super::guard::{lifecycle_lock, poll, submit};
use crate::error::{Error, Result};
use crate::runtime::memory::{MemoryTracker, TransferCounter};

/// Whether kernel modules keep naga's runtime checks (bounds checks on every index, a
/// counter on every loop). Only kernels whose every index is bounded by construction are ever
/// built without them (the GEMM family; each wrapper says why it is safe).
///
/// # Example
/// ```
/// use wgpu_metric_learning::{ContextConfig, ShaderChecks};
/// // Force the checked modules, e.g. to rule out a kernel when hunting a device fault.
/// let cfg = ContextConfig { shader_checks: ShaderChecks::Checked, ..Default::default() };
/// assert_eq!(ShaderChecks::default(), ShaderChecks::Auto);
/// # let _ = cfg;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ShaderChecks {
    /// Trusted modules in release builds, checked ones in debug builds (the test suite's).
    #[default]
    Auto,
    /// Every module keeps naga's checks.
    Checked,
    /// Kernels safe by construction are built without checks, in every build.
    Trusted,
}

impl ShaderChecks {
    /// Whether modules keep their checks under this setting in this build.
    pub(crate) fn checked(self) -> bool {
        match self {
            ShaderChecks::Auto => cfg!(debug_assertions),
            ShaderChecks::Checked => true,
            ShaderChecks::Trusted => false,
        }
    }
}

/// How the GEMM family's variant is chosen for each device and shape bucket.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{ContextConfig, Tuning};
/// // A fixed, documented variant: no timing on the device, no cache file.
/// let cfg = ContextConfig { tuning: Tuning::Off, ..Default::default() };
/// assert_eq!(Tuning::default(), Tuning::Cached);
/// # let _ = cfg;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Tuning {
    /// No tuning: the documented default variant (`128x128x16_8x8` where it fits the
    /// device, else `64x64x16_4x4`).
    Off,
    /// Tune once per key (adapter, driver, wgpu and kernel versions, shape bucket) on first
    /// use, then reuse the winner from the user's cache directory. Software adapters are not
    /// tuned (they get the default).
    #[default]
    Cached,
    /// Tune on first use in this process whatever the cache holds (and update it), software
    /// adapters included.
    Eager,
}

/// A wgpu device and queue with everything the kernels need to know about them.
///
/// Dropping it waits for the device's work to finish (a device the library made), then
/// destroys its pipelines under [`lifecycle_lock`], and its device and queue too unless the
/// [`device_pool`] keeps them for a later context.
#[derive(Debug)]
pub(crate) struct GpuDevice {
    /// Taken by hand, under [`lifecycle_lock`]: destroyed or parked (see `Drop`).
    pub(crate) device: ManuallyDrop<wgpu::Device>,
    /// Taken by hand, with the device.
    pub(crate) queue: ManuallyDrop<wgpu::Queue>,
    pub(crate) info: wgpu::AdapterInfo,
    pub(crate) limits: wgpu::Limits,
    lost: LostFlag,
    kernels: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
    /// Unique per `GpuDevice` in the process. `wgpu::Device` equality compares ids that are
    /// only unique within one instance, and every context has its own instance.
    pub(crate) serial: u64,
    /// The context's budget accounting: every buffer made on this device goes through it.
    pub(crate) memory: Arc<MemoryTracker>,
    /// Fill every output with the sentinel before kernels write it.
    pub(crate) fill_sentinel: bool,
    /// Fault injection: the device pretends to hold only this many bytes.
    pub(crate) simulated_device_bytes: Option<u64>,
    /// Submissions, waits and bytes moved, over the device's life.
    pub(crate) transfers: Arc<TransferCounter>,
    /// Build every module with naga's runtime checks ([`ShaderChecks`]).
    pub(crate) checked_shaders: bool,
    /// How GEMM variants are chosen.
    pub(crate) tuning: Tuning,
    /// Time every dispatch with timestamps (the context asked, and the device can).
    pub(crate) kernel_timing: bool,
    /// Whether the device has `TIMESTAMP_QUERY` (the tuner times by timestamps then).
    pub(crate) timestamps: bool,
    /// The library made the device (else it is an application's, shared).
    own: bool,
    /// What the device was made with, where it may serve a later context once this one is
    /// dropped ([`device_pool`]).
    reuse: Option<DeviceKey>,
}

/// How a [`GpuDevice`] accounts for what it does: the context's settings.
pub(crate) struct Accounting {
    pub(crate) memory: Arc<MemoryTracker>,
    pub(crate) fill_sentinel: bool,
    pub(crate) simulated_device_bytes: Option<u64>,
    pub(crate) shader_checks: ShaderChecks,
    pub(crate) tuning: Tuning,
    pub(crate) kernel_timing: bool,
}

/// A compiled kernel: pipeline and bind-group layout, built once per device.
pub(crate) trait Kernel: Any + Send + Sync + Sized {
    fn build(gpu: &GpuDevice) -> Result<Self>;
}

impl GpuDevice {
    pub(crate) fn new(
        device: wgpu::Device,
        queue: wgpu::Queue,
        info: wgpu::AdapterInfo,
        own: bool,
        accounting: Accounting,
    ) -> Self {
        let lost = Arc::new(Mutex::new(None));
        if own {
            // The default handler panics; ours logs. Errors inside our operations are caught by
            // error scopes before they get here, so this only sees stray ones.
            device.on_uncaptured_error(Arc::new(|e: wgpu::Error| {
                log::error!("wgpu uncaptured error: {e}");
            }));
            let flag = Arc::clone(&lost);
            device.set_device_lost_callback(move |reason, message| {
                log::warn!("wgpu device lost ({reason:?}): {message}");
                if let Ok(mut slot) = flag.lock() {
                    *slot = Some((reason, message));
                }
            });
        }
        let limits = device.limits();
        let timestamps = device.features().contains(wgpu::Features::TIMESTAMP_QUERY);
        let serial = {
            static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        };
        if own {
            device_pool::register_live(serial, &device, &info);
        }
        Self {
            device: ManuallyDrop::new(device),
            queue: ManuallyDrop::new(queue),
            info,
            limits,
            lost,
            kernels: Mutex::new(HashMap::new()),
            serial,
            memory: accounting.memory,
            fill_sentinel: accounting.fill_sentinel,
            simulated_device_bytes: accounting.simulated_device_bytes,
            transfers: Arc::new(TransferCounter::default()),
            checked_shaders: accounting.shader_checks.checked(),
            tuning: accounting.tuning,
            kernel_timing: accounting.kernel_timing && timestamps,
            timestamps,
            own,
            reuse: None,
        }
    }

    /// Lets the device serve a later context made with `key` once this one is dropped.
    pub(crate) fn reusable(mut self, key: Option<DeviceKey>) -> Self {
        self.reuse = key.filter(|_| self.own);
        self
    }

    /// After wgpu reported an error: `Err(DeviceLost)` if that is why. A destroyed device is
    /// only marked invalid at once; its lost callback runs at the next poll, so poll first.
    pub(crate) fn check_lost_after_error(&self) -> Result<()> {
        let _ = poll(&self.device, wgpu::PollType::Poll);
        self.check_alive()
    }

    /// Waits until the device has finished everything submitted so far (errors ignored: the
    /// caller is already returning one). A call that stops early (cancelled) settles before it
    /// returns, so the buffers it releases are no longer in use.
    pub(crate) fn settle(&self) {
        let _ = poll(&self.device, wgpu::PollType::wait_indefinitely());
    }

    /// `result`, after settling if it is an error: a call that fails or is cancelled with work
    /// in flight returns only once the device is done with the buffers it then releases (so
    /// the budget accounting never frees bytes the device still uses, and a retry never
    /// allocates on top of them).
    pub(crate) fn settled<T>(&self, result: Result<T>) -> Result<T> {
        if result.is_err() {
            self.settle();
        }
        result
    }

    /// `Err(DeviceLost)` once the device-lost callback has fired.
    pub(crate) fn check_alive(&self) -> Result<()> {
        match self.lost.lock().ok().and_then(|g| g.clone()) {
            Some((reason, message)) => Err(Error::DeviceLost { reason, message }),
            None => Ok(()),
        }
    }

    /// The compiled kernel `K`, built on first use and cached for the device's lifetime.
    pub(crate) fn kernel<K: Kernel>(&self) -> Result<Arc<K>> {
        let key = TypeId::of::<K>();
        if let Some(k) = self.cached::<K>(key) {
            return Ok(k);
        }
        // Built outside the lock: pipeline creation can take milliseconds, and two threads
        // racing here merely build it twice.
        let built: Arc<K> = Arc::new(K::build(self)?);
        if let Ok(mut map) = self.kernels.lock() {
            let entry = map.entry(key).or_insert_with(|| built.clone());
            if let Ok(k) = Arc::clone(entry).downcast::<K>() {
                return Ok(k);
            }
        }
        Ok(built)
    }

    /// Installs `k` as this device's kernel `K` (one built with settings `Kernel::build`
    /// cannot see), replacing any built before.
    pub(crate) fn install<K: Kernel>(&self, k: K) {
        if let Ok(mut map) = self.kernels.lock() {
            map.insert(TypeId::of::<K>(), Arc::new(k));
        }
    }

    fn cached<K: Kernel>(&self, key: TypeId) -> Option<Arc<K>> {
        let map = self.kernels.lock().ok()?;
        Arc::clone(map.get(&key)?).downcast::<K>().ok()
    }
}

impl Drop for GpuDevice {
    fn drop(&mut self) {
        // Finish the device's work outside the lock (bounded: a hung device must not hang
        // the drop), so that the destruction under it is short. Not an application's device:
        // dropping our handles destroys nothing there, and its work is not ours to wait for.
        let finished = self.own
            && poll(
                &self.device,
                wgpu::PollType::Wait {
                    submission_index: None,
                    timeout: Some(Duration::from_secs(60)),
                },
            )
            .is_ok();
        let kernels = self
            .kernels
            .get_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        let _guard = lifecycle_lock();
        device_pool::forget_live(self.serial);
        drop(kernels);
        // SAFETY: each is taken once, here, and never used after: `drop` is the last use.
        let (device, queue) = unsafe {
            (
                ManuallyDrop::take(&mut self.device),
                ManuallyDrop::take(&mut self.queue),
            )
        };
        // A finished, healthy device of ours waits for the next context instead of being
        // destroyed (see `device_pool` for why).
        let healthy = finished && self.check_alive().is_ok();
        if let Some(key) = self.reuse.take().filter(|_| healthy) {
            // Handed back when the pool is full: destroyed below, under the guard.
            let _ = device_pool::park(key, device, queue, Arc::clone(&self.lost));
        }
    }
}

/// Runs `f` inside out-of-memory and validation error scopes and maps what they caught.
pub(crate) fn scoped<T>(
    gpu: &GpuDevice,
    label: &'static str,
    requested: u64,
    f: impl FnOnce() -> T,
) -> Result<T> {
    let oom = gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let validation = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let value = f();
    // Scopes pop innermost first.
    let validation = pollster::block_on(validation.pop());
    let oom = pollster::block_on(oom.pop());
    if let Some(source) = oom {
        return Err(Error::OutOfMemory {
            label,
            requested,
            message: "the driver refused it".into(),
            source: Some(source),
        });
    }
    if let Some(source) = validation {
        gpu.check_lost_after_error()?;
        return Err(Error::Wgpu { op: label, source });
    }
    Ok(value)
}

/// Runs `f` (pipeline or bind-group creation, encoding) under a validation scope.
pub(crate) fn checked<T>(gpu: &GpuDevice, op: &'static str, f: impl FnOnce() -> T) -> Result<T> {
    scoped(gpu, op, 0, f)
}
