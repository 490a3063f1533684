//! A wgpu device and queue as the kernels see them: its limits, its compiled kernels, whether
//! it was lost, and the error scopes that turn wgpu's failures into [`Error`] variants. Below
//! the context (which makes one) and the kernels (which compile on one).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::error::{Error, Result};
use crate::memory::{MemoryTracker, TransferCounter};

/// The process-wide guard of what must not run concurrently on some drivers: enumerating
/// adapters and querying them, making a device, compiling a pipeline, and destroying a
/// device (its pipelines, queue and device).
///
/// Why: NVIDIA's Vulkan driver (580.159.04, H100 and H200) crashed or hung processes whose
/// threads made their first contexts at once. The crash's core shows a SIGSEGV in
/// `libnvidia-eglcore` under wgpu-hal's `expose_adapter`, while five other threads were in
/// `vkEnumeratePhysicalDevices` or in the driver's `vk_icdGetPhysicalDeviceProcAddr` on the
/// same instance (RELIABILITY.md). Concurrent device and pipeline creation crashes NVIDIA's
/// Windows driver too (wgpu issue #10234), so those are under the guard as well. All of
/// these are rare, millisecond-long events: one lock across them costs an application
/// nothing measurable, while dispatches, uploads and readbacks (the hot path) never take it.
///
/// `WML_DEVICE_LOCK=off` turns the guard off, only to reproduce the driver's fault
/// (`benches/gpu-report.sh hunt`); read once per process.
pub(crate) fn lifecycle_lock() -> Option<MutexGuard<'static, ()>> {
    static LOCK: Mutex<()> = Mutex::new(());
    static OFF: OnceLock<bool> = OnceLock::new();
    let off = *OFF.get_or_init(|| {
        std::env::var("WML_DEVICE_LOCK").is_ok_and(|v| v.eq_ignore_ascii_case("off"))
    });
    // A poisoned lock only means a panic while it was held; it guards no data.
    (!off).then(|| {
        LOCK.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    })
}

/// A wgpu device and queue with everything the kernels need to know about them.
///
/// Dropping it waits for the device's work to finish, then destroys its pipelines, queue
/// and device under [`lifecycle_lock`].
#[derive(Debug)]
pub(crate) struct GpuDevice {
    /// Dropped by hand, under [`lifecycle_lock`] (see `Drop`).
    pub(crate) device: ManuallyDrop<wgpu::Device>,
    /// Dropped by hand, with the device.
    pub(crate) queue: ManuallyDrop<wgpu::Queue>,
    pub(crate) info: wgpu::AdapterInfo,
    pub(crate) limits: wgpu::Limits,
    lost: Arc<Mutex<Option<(wgpu::DeviceLostReason, String)>>>,
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
    pub(crate) transfers: TransferCounter,
}

/// How a [`GpuDevice`] accounts for what it does: the context's settings.
pub(crate) struct Accounting {
    pub(crate) memory: Arc<MemoryTracker>,
    pub(crate) fill_sentinel: bool,
    pub(crate) simulated_device_bytes: Option<u64>,
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
        Self {
            device: ManuallyDrop::new(device),
            queue: ManuallyDrop::new(queue),
            info,
            limits,
            lost,
            kernels: Mutex::new(HashMap::new()),
            serial: {
                static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            },
            memory: accounting.memory,
            fill_sentinel: accounting.fill_sentinel,
            simulated_device_bytes: accounting.simulated_device_bytes,
            transfers: TransferCounter::default(),
        }
    }

    /// After wgpu reported an error: `Err(DeviceLost)` if that is why. A destroyed device is
    /// only marked invalid at once; its lost callback runs at the next poll, so poll first.
    pub(crate) fn check_lost_after_error(&self) -> Result<()> {
        let _ = self.device.poll(wgpu::PollType::Poll);
        self.check_alive()
    }

    /// Waits until the device has finished everything submitted so far (errors ignored: the
    /// caller is already returning one). A call that stops early (cancelled) settles before it
    /// returns, so the buffers it releases are no longer in use.
    pub(crate) fn settle(&self) {
        let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
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

    fn cached<K: Kernel>(&self, key: TypeId) -> Option<Arc<K>> {
        let map = self.kernels.lock().ok()?;
        Arc::clone(map.get(&key)?).downcast::<K>().ok()
    }
}

impl Drop for GpuDevice {
    fn drop(&mut self) {
        // Finish the device's work outside the lock (bounded: a hung device must not hang
        // the drop), so that the destruction under it is short.
        let _ = self.device.poll(wgpu::PollType::Wait {
            submission_index: None,
            timeout: Some(std::time::Duration::from_secs(60)),
        });
        let kernels = self
            .kernels
            .get_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        let _guard = lifecycle_lock();
        drop(kernels);
        // SAFETY: each is dropped once, here, and never used after: `drop` is the last use.
        unsafe {
            ManuallyDrop::drop(&mut self.queue);
            ManuallyDrop::drop(&mut self.device);
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
