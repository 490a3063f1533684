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

use std::sync::{Arc, Condvar, Mutex, Once};
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

// The C runtime's, on every platform (the `libc` crate is a Linux-only dependency here).
unsafe extern "C" {
    fn atexit(callback: extern "C" fn()) -> std::ffi::c_int;
}

/// Starts the [`reaper`] and registers [`destroy_at_exit`] once, at the first park.
static AT_EXIT: Once = Once::new();

/// The exit's handshake with the [`reaper`]: `(asked, done)`.
static EXITING: (Mutex<(bool, bool)>, Condvar) = (Mutex::new((false, false)), Condvar::new());

/// How long the exit waits for the parked devices' destruction.
const EXIT_WAIT: Duration = Duration::from_secs(10);

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
    AT_EXIT.call_once(|| {
        let started = std::thread::Builder::new()
            .name("wml-device-reaper".into())
            .spawn(reaper);
        if started.is_ok() {
            // SAFETY: registers a plain function with no captured state; it runs once, at
            // exit. A failed registration (nonzero) only leaves the devices to the exit.
            let _ = unsafe { atexit(destroy_at_exit) };
        }
    });
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

/// Has the [`reaper`] destroy the parked devices as the process exits, waiting for it at most
/// [`EXIT_WAIT`]. A device's driver threads must not outlive the driver's libraries, which the
/// exit unloads: on NVIDIA (580.159.04) a process that left its parked devices to the exit
/// died of SIGSEGV there, in those threads. Not on this thread: the exiting thread's
/// thread-locals are gone, and wgpu's destruction uses some (a panic that cannot unwind).
extern "C" fn destroy_at_exit() {
    let (state, signal) = &EXITING;
    let Ok(mut s) = state.lock() else {
        return;
    };
    s.0 = true;
    signal.notify_all();
    let _ = signal.wait_timeout_while(s, EXIT_WAIT, |s| !s.1);
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
    if let Ok(mut parked) = PARKED.try_lock() {
        let all = std::mem::take(&mut *parked);
        drop(parked);
        match try_lifecycle_lock() {
            Some(_guard) => drop(all),
            None => std::mem::forget(all),
        }
    }
    if let Ok(mut s) = state.lock() {
        s.1 = true;
        signal.notify_all();
    }
}
