//! The process-wide lifecycle guard: what must not run concurrently on some drivers (making
//! and destroying devices) against what may (submissions and polls, side by side).

use std::sync::{OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The process-wide guard of what must not run concurrently on some drivers: enumerating
/// adapters and querying them, making a device, compiling a pipeline, and destroying a
/// device (its pipelines, queue and device) take it whole; queue submissions and device
/// polls share it ([`submit`], [`poll`]), so that none of them runs while a device is made or
/// destroyed, while they still run side by side with each other.
///
/// Why: NVIDIA's Vulkan driver (580.159.04, H100 and H200) crashed or hung processes whose
/// threads made their first contexts at once. The crash's core shows a SIGSEGV in
/// `libnvidia-eglcore` under wgpu-hal's `expose_adapter`, while five other threads were in
/// `vkEnumeratePhysicalDevices` or in the driver's `vk_icdGetPhysicalDeviceProcAddr` on the
/// same instance (RELIABILITY.md). With creation serialised, the integration tests in one
/// process still hung: one thread in `vkDestroyDevice` and two others in `vkQueueSubmit` on
/// other devices, all three waiting inside the driver for good. Concurrent device and
/// pipeline creation crashes NVIDIA's Windows driver too (wgpu issue #10234). Creation and
/// destruction are rare, millisecond-long events; a submission or a poll takes the shared
/// side (an uncontended read lock, tens of nanoseconds). A device made or destroyed while
/// another thread waits for the GPU waits for that wait to end. With everything else held
/// off by this guard, `vkDestroyDevice` still hung inside the driver (H100, 1 run in 5), so
/// devices are no longer destroyed while the process runs ([`super::device_pool`]).
///
/// `WML_DEVICE_LOCK=off` turns the guard off, only to reproduce the driver's fault
/// (`benches/gpu-report.sh hunt`); read once per process.
pub(crate) fn lifecycle_lock() -> Option<RwLockWriteGuard<'static, ()>> {
    // A poisoned lock only means a panic while it was held; it guards no data.
    guard_on().then(|| {
        LIFECYCLE
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    })
}

/// [`lifecycle_lock`] if no thread holds either side of it at this moment: at the process's
/// exit, a thread still inside a driver call must not hang the exit.
pub(crate) fn try_lifecycle_lock() -> Option<RwLockWriteGuard<'static, ()>> {
    LIFECYCLE.try_write().ok()
}

static LIFECYCLE: RwLock<()> = RwLock::new(());

pub(crate) fn guard_on() -> bool {
    static OFF: OnceLock<bool> = OnceLock::new();
    !*OFF.get_or_init(|| {
        std::env::var("WML_DEVICE_LOCK").is_ok_and(|v| v.eq_ignore_ascii_case("off"))
    })
}

/// The shared side of [`lifecycle_lock`]. Never held across another acquisition: a waiting
/// writer blocks new readers, so a nested read could deadlock.
fn shared_lock() -> Option<RwLockReadGuard<'static, ()>> {
    guard_on().then(|| {
        LIFECYCLE
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    })
}

/// `queue.submit(commands)` under the shared side of the lifecycle guard.
pub(crate) fn submit(
    queue: &wgpu::Queue,
    commands: impl IntoIterator<Item = wgpu::CommandBuffer>,
) -> wgpu::SubmissionIndex {
    let _shared = shared_lock();
    queue.submit(commands)
}

/// `device.poll(kind)` under the shared side of the lifecycle guard, a wait included: a
/// device made or destroyed meanwhile waits for it. A wait is never cut into shorter timed
/// waits: in wgpu-core 30.0.1 a timed wait that ends early, while another thread polls or
/// submits on the same device, can trip a defensive assert in `Device::maintain` ("If the
/// queue is empty, the current submission index … should be at least the wait submission
/// index"; fixed upstream by gfx-rs/wgpu#9958), which eight threads on one context did.
pub(crate) fn poll(
    device: &wgpu::Device,
    kind: wgpu::PollType,
) -> std::result::Result<wgpu::PollStatus, wgpu::PollError> {
    let _shared = shared_lock();
    device.poll(kind)
}
