//! Devices kept for reuse: when a context is dropped, the device the library made for it
//! waits here for the next context on the same adapter with the same features and limits,
//! instead of being destroyed.
//!
//! Why: on NVIDIA's Vulkan driver (580.159.04, H100), `vkDestroyDevice` hung for good inside
//! the driver, joining a thread of its own, while other threads of the process (and another
//! process on the same GPU) ran kernels. The integration tests in one process at 8 threads
//! hung that way in 1 of 5 runs, every other thread waiting for the lifecycle guard that the
//! destroying thread held. A device that is not destroyed cannot hang there, and a context
//! made after another was dropped skips the device's creation.
//!
//! Only the wgpu device and queue are reused: the pipelines, the budget, the counters and
//! the tuner's choices are the new context's own. A device is parked only when the library
//! made it, it is not a GL device (whose EGL context belongs to an instance of its own), it
//! finished its work and it is not lost; one lost while parked is destroyed when it is next
//! taken. At most [`MAX_PARKED`] wait; a device beyond them is destroyed as before. Parked
//! devices are destroyed as the process exits (`atexit` hands them to a thread of their own),
//! when no other thread holds the guard.
//! `WML_DEVICE_LOCK=off` turns reuse off with the guard.
//!
//! **Devices still in use at exit.** A context held until the process ends (in a static, a
//! Python module, a thread that is never joined) keeps its device alive through the exit. On
//! NVIDIA (580.159.04, H200) such a process died of SIGSEGV after `main` had returned in 3 of
//! 9 runs of the integration tests: the exit ran `libEGL_nvidia`'s destructors while the
//! driver's own threads ran on in `libnvidia-eglcore`. The driver wants its devices destroyed
//! before the exit reaches its libraries (gfx-rs/wgpu#8365; ncnn destroys them from `atexit`
//! for this). wgpu destroys a device only when its last handle is dropped, which a held
//! context never does, so the exit destroys those devices by hand through wgpu-hal
//! (`vkDeviceWaitIdle`, `vkDestroyDevice`; their child objects go with them) under the whole
//! guard, which it keeps: a submission or poll of the library on another thread then waits.
//! Other calls (making, mapping or dropping a buffer) are not held off, so a program whose
//! other threads still use the library while it exits, wgpu#8365's own trigger, is outside
//! this guard. `WML_EXIT_TEARDOWN` says where: `auto` (the default: NVIDIA's Vulkan devices
//! on Linux, where the fault was seen), `all` (every Vulkan device: the tests use it on
//! lavapipe) or `off` (`stall` makes the destruction hang, for the tests); nowhere with
//! `WML_DEVICE_LOCK=off`, which leaves nothing to hold other threads off. The shared
//! instance is left alone: a buffer that outlives its context keeps a device alive unseen
//! here. On the H200 that destruction itself once hung in `vkDestroyDevice` (other processes
//! were using the GPU) and the exit, done waiting, went on into the crash; so with glibc,
//! when it has not finished after 10 s, the process ends there with its exit status
//! (`on_exit`, then `_exit`).

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, Once, OnceLock};
use std::time::Duration;

use super::guard::{guard_on, lifecycle_lock, poll, try_lifecycle_lock};

/// Set by a device's lost callback: why, and wgpu's message.
pub(crate) type LostFlag = Arc<Mutex<Option<(wgpu::DeviceLostReason, String)>>>;

/// The most devices parked at once, over every adapter: about as many contexts as a process
/// has ever held at once, beyond which parking would only keep memory.
pub(crate) const MAX_PARKED: usize = 16;

/// What a device was made with: a context asking for the same gets it. The adapter's info
/// names one physical adapter only where no other adapter's is equal (the context checks).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DeviceKey {
    pub(crate) info: wgpu::AdapterInfo,
    pub(crate) features: wgpu::Features,
    pub(crate) limits: wgpu::Limits,
}

impl DeviceKey {
    /// The key of a device made for `info` with `features` and `limits`, or `None` where
    /// such a device is never reused (GL, or the guard turned off).
    pub(crate) fn reusable(
        info: &wgpu::AdapterInfo,
        features: wgpu::Features,
        limits: &wgpu::Limits,
    ) -> Option<Self> {
        (info.backend != wgpu::Backend::Gl && guard_on()).then(|| Self {
            info: info.clone(),
            features,
            limits: limits.clone(),
        })
    }
}

struct Parked {
    key: DeviceKey,
    device: wgpu::Device,
    queue: wgpu::Queue,
    /// The lost flag of the context that held it last: set if the device was lost since.
    lost: LostFlag,
}

static PARKED: Mutex<Vec<Parked>> = Mutex::new(Vec::new());

/// Starts the [`reaper`] and registers the exit's handler once, at the first park or the
/// first device the exit must destroy by hand.
static AT_EXIT: Once = Once::new();

/// The process that started the [`reaper`].
static ARMED_IN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

fn arm() {
    AT_EXIT.call_once(|| {
        ARMED_IN.store(std::process::id(), std::sync::atomic::Ordering::Relaxed);
        let started = std::thread::Builder::new()
            .name("wml-device-reaper".into())
            .spawn(reaper);
        if started.is_ok() {
            register_exit_handler();
        }
    });
}

/// The exit's handshake with the [`reaper`]: `(asked, done)`.
static EXITING: (Mutex<(bool, bool)>, Condvar) = (Mutex::new((false, false)), Condvar::new());

/// How long the exit waits for the devices' destruction (1 s when a test stalls it).
fn exit_wait() -> Duration {
    if teardown() == Teardown::Stall {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(10)
    }
}

/// Keeps a finished, healthy device for the next context with `key`; hands it back when the
/// pool is full (the caller destroys it).
pub(crate) fn park(
    key: DeviceKey,
    device: wgpu::Device,
    queue: wgpu::Queue,
    lost: LostFlag,
) -> Option<(wgpu::Device, wgpu::Queue)> {
    let mut parked = PARKED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if parked.len() >= MAX_PARKED {
        return Some((device, queue));
    }
    arm();
    parked.push(Parked {
        key,
        device,
        queue,
        lost,
    });
    None
}

/// A parked device made with `key`, if one is there and still alive (the lost ones found on
/// the way are destroyed).
pub(crate) fn take(key: &DeviceKey) -> Option<(wgpu::Device, wgpu::Queue)> {
    loop {
        let found = {
            let mut parked = PARKED
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let i = parked.iter().position(|p| p.key == *key)?;
            parked.swap_remove(i)
        };
        // A loss is reported at a poll: give it the chance before trusting the device.
        let _ = poll(&found.device, wgpu::PollType::Poll);
        let lost = found.lost.lock().map_or(true, |l| l.is_some());
        if !lost {
            return Some((found.device, found.queue));
        }
        let _guard = lifecycle_lock();
        drop(found);
    }
}

/// Has the [`reaper`] destroy the parked devices (and those in use, where the driver needs
/// it) as the process exits, waiting for it at most [`exit_wait`]; whether it finished. A
/// device's driver threads must not outlive the driver's libraries, which the exit unloads:
/// on NVIDIA (580.159.04) a process that left its devices to the exit died of SIGSEGV there,
/// in those threads. Not on this thread: the exiting thread's thread-locals are gone, and
/// wgpu's destruction uses some (a panic that cannot unwind).
fn destroy_at_exit() -> bool {
    if std::process::id() != ARMED_IN.load(std::sync::atomic::Ordering::Relaxed) {
        // A forked child: it inherited the handler, not the reaper thread, and its copies of
        // the devices are not the driver's to destroy.
        return true;
    }
    let (state, signal) = &EXITING;
    let Ok(mut s) = state.lock() else {
        return false;
    };
    s.0 = true;
    signal.notify_all();
    signal
        .wait_timeout_while(s, exit_wait(), |s| !s.1)
        .is_ok_and(|(s, _)| s.1)
}

/// With glibc, `on_exit`, which passes the exit's status: when the destruction did not
/// finish (the driver stuck in `vkDestroyDevice`, as it was on an H200 with other processes
/// on the GPU), letting the exit go on would unload the driver beside its busy thread, the
/// SIGSEGV this guards against. The process then ends at once with that status, stdio
/// flushed, without the exit handlers registered before this one and the libraries'
/// destructors (the driver's among them).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn register_exit_handler() {
    unsafe extern "C" {
        fn on_exit(
            callback: extern "C" fn(std::ffi::c_int, *mut std::ffi::c_void),
            arg: *mut std::ffi::c_void,
        ) -> std::ffi::c_int;
    }
    extern "C" fn at_exit(status: std::ffi::c_int, _arg: *mut std::ffi::c_void) {
        if !destroy_at_exit() {
            if std::env::var_os("WML_EXIT_TEARDOWN_REPORT").is_some() {
                // Not `eprintln!`: a closed stderr must not panic inside a C callback.
                let _ = writeln!(
                    std::io::stderr(),
                    "wml exit: the destruction did not finish; ending with status {status}"
                );
            }
            // SAFETY: flushes every C stream (Rust's stdout was flushed before `exit`), then
            // ends the process; nothing of this process runs after it.
            unsafe {
                libc::fflush(std::ptr::null_mut());
                libc::_exit(status);
            }
        }
    }
    // SAFETY: registers a plain function with no captured state and a null argument; it runs
    // once, at exit. A failed registration (nonzero) only leaves the devices to the exit.
    let _ = unsafe { on_exit(at_exit, std::ptr::null_mut()) };
}

/// Elsewhere `atexit`, which has no status to end the process with: a destruction that did
/// not finish is left to the exit.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn register_exit_handler() {
    // The C runtime's, on every platform (the `libc` crate is a Linux-only dependency here).
    unsafe extern "C" {
        fn atexit(callback: extern "C" fn()) -> std::ffi::c_int;
    }
    extern "C" fn at_exit() {
        let _ = destroy_at_exit();
    }
    // SAFETY: registers a plain function with no captured state; it runs once, at exit. A
    // failed registration (nonzero) only leaves the devices to the exit.
    let _ = unsafe { atexit(at_exit) };
}

/// The thread that destroys the parked devices when the exit asks: it waits until then, and
/// skips them (left as they are) when another thread holds the pool or the guard.
fn reaper() {
    let (state, signal) = &EXITING;
    let Ok(s) = state.lock() else {
        return;
    };
    let Ok(s) = signal.wait_while(s, |s| !s.0) else {
        return;
    };
    // Not held while destroying: a destruction that hangs must leave the exit its timeout.
    drop(s);
    if teardown() == Teardown::Stall {
        // A driver stuck in the destruction, for the tests: the exit must not wait for it.
        loop {
            std::thread::park();
        }
    }
    if let Ok(mut parked) = PARKED.try_lock() {
        let all = std::mem::take(&mut *parked);
        drop(parked);
        match try_lifecycle_lock() {
            Some(_guard) => drop(all),
            None => std::mem::forget(all),
        }
    }
    let devices = live::destroy_all();
    if std::env::var_os("WML_EXIT_TEARDOWN_REPORT").is_some() {
        // For the tests (a child process reports what its exit did); stderr is unbuffered.
        let _ = writeln!(
            std::io::stderr(),
            "wml exit: {devices} devices destroyed by hand"
        );
    }
    if let Ok(mut s) = state.lock() {
        s.1 = true;
        signal.notify_all();
    }
}

/// Where the exit destroys devices still in use by hand (`WML_EXIT_TEARDOWN`, read once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Teardown {
    /// NVIDIA's Vulkan devices (the default).
    Auto,
    /// Every Vulkan device.
    All,
    /// As `All`, with the destruction stuck (for the tests of the exit's fallback).
    Stall,
    Off,
}

fn teardown() -> Teardown {
    static MODE: OnceLock<Teardown> = OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("WML_EXIT_TEARDOWN") {
        Ok(v) if v.eq_ignore_ascii_case("off") => Teardown::Off,
        Ok(v) if v.eq_ignore_ascii_case("all") => Teardown::All,
        Ok(v) if v.eq_ignore_ascii_case("stall") => Teardown::Stall,
        _ => Teardown::Auto,
    })
}

/// Whether the exit destroys a library-made device of `info` by hand if it is still in use.
fn torn_down_at_exit(info: &wgpu::AdapterInfo) -> bool {
    /// PCI vendor id of NVIDIA.
    const NVIDIA: u32 = 0x10de;
    info.backend == wgpu::Backend::Vulkan
        && match teardown() {
            Teardown::Off => false,
            Teardown::All | Teardown::Stall => true,
            Teardown::Auto => cfg!(target_os = "linux") && info.vendor == NVIDIA,
        }
}

/// Records a device the library made, numbered `serial`, until [`forget_live`]: if the
/// process exits while it is still in use, the exit destroys it by hand where
/// [`torn_down_at_exit`] says so (see the module docs).
pub(crate) fn register_live(serial: u64, device: &wgpu::Device, info: &wgpu::AdapterInfo) {
    if guard_on() && torn_down_at_exit(info) && live::register(serial, device) {
        arm();
    }
}

/// The device numbered `serial` is no longer in use (parked or destroyed).
pub(crate) fn forget_live(serial: u64) {
    live::forget(serial);
}

/// The raw handles, on the targets where wgpu has a Vulkan backend.
#[cfg(any(
    windows,
    target_os = "linux",
    target_os = "android",
    target_os = "freebsd"
))]
mod live {
    use std::sync::Mutex;

    use super::super::guard::try_lifecycle_lock;

    /// The library's devices in use that the exit destroys by hand, by serial: what
    /// `vkDestroyDevice` needs.
    static LIVE: Mutex<Vec<(u64, ash::Device)>> = Mutex::new(Vec::new());

    pub(super) fn register(serial: u64, device: &wgpu::Device) -> bool {
        // SAFETY: only clones the dispatch table and handle; nothing is called through it
        // until the exit, when wgpu no longer runs.
        let Some(raw) = (unsafe { device.as_hal::<wgpu::hal::api::Vulkan>() })
            .map(|hal| hal.raw_device().clone())
        else {
            return false;
        };
        let mut live = LIVE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        live.push((serial, raw));
        true
    }

    pub(super) fn forget(serial: u64) {
        let mut live = LIVE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        live.retain(|(s, _)| *s != serial);
    }

    /// At exit, on the reaper: every recorded device destroyed by hand, under the whole
    /// guard, kept for good. Skipped when another thread holds the guard (inside a driver call
    /// that the destruction must not race). Returns how many devices it destroyed.
    pub(super) fn destroy_all() -> usize {
        let devices = std::mem::take(
            &mut *LIVE
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        if devices.is_empty() {
            return 0;
        }
        let Some(guard) = try_lifecycle_lock() else {
            return 0;
        };
        for (_, device) in &devices {
            // SAFETY: the process is exiting and this thread holds the whole guard for good
            // (recorded only with the guard on): no submission or poll of the library runs on
            // these devices again. Their child objects go with them (the driver frees a
            // device's memory with it); wgpu never drops its handles (a held context is never
            // dropped), so nothing destroys them twice.
            unsafe {
                let _ = device.device_wait_idle();
                device.destroy_device(None);
            }
        }
        std::mem::forget(guard);
        devices.len()
    }
}

/// No Vulkan backend on this target: nothing to destroy by hand.
#[cfg(not(any(
    windows,
    target_os = "linux",
    target_os = "android",
    target_os = "freebsd"
)))]
mod live {
    pub(super) fn register(_serial: u64, _device: &wgpu::Device) -> bool {
        false
    }
    pub(super) fn forget(_serial: u64) {}
    pub(super) fn destroy_all() -> usize {
        0
    }
}
