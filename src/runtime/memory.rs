//! Device-memory accounting: the one point every library allocation goes through.
//!
//! wgpu has no portable "free VRAM" query and lavapipe happily over-commits its heap, so the
//! budget is enforced here, by the library, before the driver is asked. Every buffer the library
//! creates is a [`TrackedBuffer`]: reserving its bytes happens before creation and releasing them
//! happens when it is dropped, so `current` is exact and `peak` is the true high-water mark.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};

/// A snapshot of a context's tracked device memory.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{Context, MemoryStats};
/// let stats: MemoryStats = Context::native_cpu(Some(1 << 20)).memory();
/// assert!(stats.peak_bytes <= stats.budget_bytes);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Bytes held by live library buffers right now.
    pub current_bytes: u64,
    /// Highest `current_bytes` since the context was made or [`crate::Context::reset_peak`].
    pub peak_bytes: u64,
    /// The budget that allocations are checked against.
    pub budget_bytes: u64,
}

/// Host–device traffic of a call (or of a context's life): the times the host blocked on the
/// device, the submissions, and the bytes moved each way. Zero on the native CPU path.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{knn, Context, KnnConfig};
/// let x = ndarray::Array2::<f32>::ones((100, 8));
/// let found = knn(&Context::native_cpu(None), &x, &x, &KnnConfig::default())?;
/// assert_eq!(found.transfers.host_waits, 0); // no device, no wait
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Transfers {
    /// Blocking waits for the device (each `poll` that waits for a submission).
    pub host_waits: u64,
    /// Command-buffer submissions.
    pub submissions: u64,
    /// Bytes written from the host to device buffers.
    pub bytes_up: u64,
    /// Bytes read back from the device to the host.
    pub bytes_down: u64,
    /// Where the host's time went: uploads, waits, readbacks, tuning.
    pub host: HostTimes,
    /// GPU time per kernel, measured by timestamps when the context times kernels
    /// ([`crate::ContextConfig::kernel_timing`]); empty otherwise.
    pub kernels: KernelTimes,
}

impl Transfers {
    /// Nothing counted (`Default::default()`, usable in constants).
    pub(crate) const ZERO: Transfers = Transfers {
        host_waits: 0,
        submissions: 0,
        bytes_up: 0,
        bytes_down: 0,
        host: HostTimes {
            upload_ns: 0,
            wait_ns: 0,
            readback_ns: 0,
            tune_ns: 0,
            submit_ns: 0,
        },
        kernels: KernelTimes {
            dispatches: [0; KERNEL_STEMS.len()],
            gpu_ns: [0; KERNEL_STEMS.len()],
        },
    };

    pub(crate) fn add(&mut self, other: Transfers) {
        self.host_waits += other.host_waits;
        self.submissions += other.submissions;
        self.bytes_up += other.bytes_up;
        self.bytes_down += other.bytes_down;
        self.host.add(&other.host);
        self.kernels.add(&other.kernels);
    }

    /// What was counted between `before` and `self` (both totals of one context), field by
    /// field, saturating at 0.
    ///
    /// # Example
    /// ```
    /// use wgpu_metric_learning::Transfers;
    /// let (mut before, mut now) = (Transfers::default(), Transfers::default());
    /// before.host_waits = 2;
    /// now.host_waits = 5;
    /// assert_eq!(now.since(&before).host_waits, 3);
    /// ```
    pub fn since(&self, before: &Transfers) -> Transfers {
        Transfers {
            host_waits: self.host_waits.saturating_sub(before.host_waits),
            submissions: self.submissions.saturating_sub(before.submissions),
            bytes_up: self.bytes_up.saturating_sub(before.bytes_up),
            bytes_down: self.bytes_down.saturating_sub(before.bytes_down),
            host: HostTimes {
                upload_ns: self.host.upload_ns.saturating_sub(before.host.upload_ns),
                wait_ns: self.host.wait_ns.saturating_sub(before.host.wait_ns),
                readback_ns: self
                    .host
                    .readback_ns
                    .saturating_sub(before.host.readback_ns),
                tune_ns: self.host.tune_ns.saturating_sub(before.host.tune_ns),
                submit_ns: self.host.submit_ns.saturating_sub(before.host.submit_ns),
            },
            kernels: self.kernels.since(&before.kernels),
        }
    }
}

/// Host time of a call (or of a context's life), in nanoseconds (integers, so that
/// [`Transfers`] compares exactly): copying uploads into the driver's staging, submitting,
/// blocking on the device, copying results out of mapped memory, and tuning kernels on the
/// device.
///
/// # Example
/// ```
/// use wgpu_metric_learning::HostTimes;
/// let mut t = HostTimes::default();
/// t.wait_ns = 1_500_000_000;
/// assert_eq!(t.seconds(t.wait_ns), 1.5);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostTimes {
    /// `queue.write_buffer` calls (the host's copy; the transfer itself overlaps).
    pub upload_ns: u64,
    /// Blocking waits for the device (the counted `host_waits`).
    pub wait_ns: u64,
    /// Copies out of mapped staging memory.
    pub readback_ns: u64,
    /// Timing candidate kernels on the device ([`crate::Tuning`]).
    pub tune_ns: u64,
    /// `queue.submit` calls (wgpu's and the driver's work on the host, which grows with the
    /// bytes uploaded since the last submission: 36 ms after 51 MB on lavapipe).
    pub submit_ns: u64,
}

impl HostTimes {
    fn add(&mut self, o: &HostTimes) {
        self.upload_ns += o.upload_ns;
        self.wait_ns += o.wait_ns;
        self.readback_ns += o.readback_ns;
        self.tune_ns += o.tune_ns;
        self.submit_ns += o.submit_ns;
    }

    /// `ns` in seconds.
    ///
    /// See the example of [`HostTimes`].
    pub fn seconds(&self, ns: u64) -> f64 {
        ns as f64 * 1e-9
    }
}

/// The kernel stems that [`KernelTimes`] has a slot for: every shipped WGSL kernel (checked
/// against [`crate::WGSL_KERNELS`] by a test) and the generated GEMM family.
pub(crate) const KERNEL_STEMS: &[&str] = &[
    "distance_tile",
    "gemm_tile",
    "info_nce_weights",
    "knn_select",
    "knn_sort",
    "loss_backward",
    "negative_buckets",
    "pair_select",
    "pair_weights",
    "row_norms",
    "triplet_expand",
    "triplet_lists",
    "triplet_select",
    "triplet_weights",
];

/// GPU time per kernel stem, from timestamp queries around each dispatch: how many dispatches
/// ran and their summed GPU nanoseconds.
///
/// # Example
/// ```
/// use wgpu_metric_learning::KernelTimes;
/// let none = KernelTimes::default();
/// assert_eq!(none.iter().count(), 0); // only kernels that ran are listed
/// assert_eq!(none.total_gpu_seconds(), 0.0);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct KernelTimes {
    dispatches: [u64; KERNEL_STEMS.len()],
    gpu_ns: [u64; KERNEL_STEMS.len()],
}

/// One kernel's line of [`KernelTimes`].
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct KernelTime {
    /// The kernel's stem (`shaders/<stem>.wgsl`).
    pub stem: &'static str,
    /// Dispatches timed.
    pub dispatches: u64,
    /// Their summed GPU time, in seconds.
    pub gpu_seconds: f64,
}

impl KernelTimes {
    /// The kernels that ran, in stem order.
    ///
    /// See the example of [`KernelTimes`].
    pub fn iter(&self) -> impl Iterator<Item = KernelTime> + '_ {
        KERNEL_STEMS
            .iter()
            .enumerate()
            .filter(|&(i, _)| self.dispatches[i] > 0)
            .map(|(i, &stem)| KernelTime {
                stem,
                dispatches: self.dispatches[i],
                gpu_seconds: self.gpu_ns[i] as f64 * 1e-9,
            })
    }

    /// The line of `stem`, if it ran.
    ///
    /// See the example of [`KernelTimes`].
    pub fn get(&self, stem: &str) -> Option<KernelTime> {
        self.iter().find(|k| k.stem == stem)
    }

    /// The GPU seconds of every kernel together.
    ///
    /// See the example of [`KernelTimes`].
    pub fn total_gpu_seconds(&self) -> f64 {
        self.gpu_ns.iter().sum::<u64>() as f64 * 1e-9
    }

    /// Adds one dispatch of `stem` that took `ns` (a stem without a slot is ignored).
    pub(crate) fn record(&mut self, stem: &str, ns: u64) {
        if let Some(i) = KERNEL_STEMS.iter().position(|&s| s == stem) {
            self.dispatches[i] += 1;
            self.gpu_ns[i] += ns;
        }
    }

    pub(crate) fn add(&mut self, o: &KernelTimes) {
        for i in 0..KERNEL_STEMS.len() {
            self.dispatches[i] += o.dispatches[i];
            self.gpu_ns[i] += o.gpu_ns[i];
        }
    }

    fn since(&self, before: &KernelTimes) -> KernelTimes {
        let mut out = *self;
        for i in 0..KERNEL_STEMS.len() {
            out.dispatches[i] = out.dispatches[i].saturating_sub(before.dispatches[i]);
            out.gpu_ns[i] = out.gpu_ns[i].saturating_sub(before.gpu_ns[i]);
        }
        out
    }
}

/// A context's running totals, shared by every thread using it.
#[derive(Debug, Default)]
pub(crate) struct TransferCounter {
    totals: std::sync::Mutex<Transfers>,
}

impl TransferCounter {
    /// Adds `t` to the totals.
    pub(crate) fn add(&self, t: Transfers) {
        // A poisoned lock only means a panic while adding; the totals are still counts.
        self.totals
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .add(t);
    }

    pub(crate) fn totals(&self) -> Transfers {
        *self
            .totals
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Tracks current and peak bytes against a fixed budget; shared by all buffers of a context.
#[derive(Debug)]
pub(crate) struct MemoryTracker {
    budget: u64,
    current: AtomicU64,
    peak: AtomicU64,
}

impl MemoryTracker {
    pub(crate) fn new(budget: u64) -> Self {
        Self {
            budget,
            current: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        }
    }

    /// Bytes that can still be reserved without exceeding the budget.
    pub(crate) fn available(&self) -> u64 {
        self.budget
            .saturating_sub(self.current.load(Ordering::Acquire))
    }

    /// Reserves `bytes` or fails without changing anything. Concurrent reservations are
    /// resolved by compare-and-swap so two threads can never jointly overshoot the budget.
    pub(crate) fn reserve(&self, label: &'static str, bytes: u64) -> Result<()> {
        let mut current = self.current.load(Ordering::Acquire);
        loop {
            let next = current.saturating_add(bytes);
            if next > self.budget {
                return Err(Error::BudgetExceeded {
                    label,
                    requested: bytes,
                    in_use: current,
                    budget: self.budget,
                });
            }
            match self.current.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::AcqRel);
                    return Ok(());
                }
                Err(seen) => current = seen,
            }
        }
    }

    pub(crate) fn release(&self, bytes: u64) {
        self.current.fetch_sub(bytes, Ordering::AcqRel);
    }

    pub(crate) fn reset_peak(&self) {
        self.peak
            .store(self.current.load(Ordering::Acquire), Ordering::Release);
    }

    pub(crate) fn stats(&self) -> MemoryStats {
        MemoryStats {
            current_bytes: self.current.load(Ordering::Acquire),
            peak_bytes: self.peak.load(Ordering::Acquire),
            budget_bytes: self.budget,
        }
    }
}

/// A wgpu buffer whose bytes are counted by its context's [`MemoryTracker`] while it lives.
#[derive(Debug)]
pub(crate) struct TrackedBuffer {
    buffer: wgpu::Buffer,
    size: u64,
    tracker: Arc<MemoryTracker>,
    /// Unique in the process: a recording tells the buffers it touched apart by it.
    id: u64,
}

impl TrackedBuffer {
    /// Wraps a buffer whose `size` bytes were already reserved in `tracker`.
    pub(crate) fn new(buffer: wgpu::Buffer, size: u64, tracker: Arc<MemoryTracker>) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Self {
            buffer,
            size,
            tracker,
            id: NEXT.fetch_add(1, Ordering::Relaxed),
        }
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub(crate) fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    pub(crate) fn size(&self) -> u64 {
        self.size
    }
}

impl Drop for TrackedBuffer {
    fn drop(&mut self) {
        // Free the allocation now rather than when wgpu's last internal reference goes, so the
        // driver's memory follows our accounting.
        self.buffer.destroy();
        self.tracker.release(self.size);
    }
}

/// Host bytes that the native path holds for as long as an object lives (a memory bank's
/// rows), counted by the same tracker as device buffers so the budget means one thing.
#[derive(Debug)]
pub(crate) struct HostReservation {
    bytes: u64,
    tracker: Arc<MemoryTracker>,
}

impl HostReservation {
    /// Reserves `bytes` in `tracker`, or fails without changing anything.
    pub(crate) fn new(
        label: &'static str,
        bytes: u64,
        tracker: &Arc<MemoryTracker>,
    ) -> Result<Self> {
        tracker.reserve(label, bytes)?;
        Ok(Self {
            bytes,
            tracker: Arc::clone(tracker),
        })
    }
}

impl Drop for HostReservation {
    fn drop(&mut self) {
        self.tracker.release(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_tracks_current_and_peak() {
        let t = MemoryTracker::new(100);
        t.reserve("a", 60).expect("60 of 100 fits");
        t.reserve("b", 40).expect("100 of 100 fits");
        assert_eq!(t.stats().current_bytes, 100, "both reservations counted");
        t.release(60);
        assert_eq!(t.stats().current_bytes, 40, "release subtracts");
        assert_eq!(t.stats().peak_bytes, 100, "peak keeps the high-water mark");
        t.reset_peak();
        assert_eq!(t.stats().peak_bytes, 40, "reset_peak restarts from current");
    }

    #[test]
    fn over_budget_reservation_fails_and_changes_nothing() {
        let t = MemoryTracker::new(100);
        t.reserve("a", 70).expect("fits");
        match t.reserve("b", 31) {
            Err(Error::BudgetExceeded {
                label,
                requested,
                in_use,
                budget,
            }) => {
                assert_eq!((label, requested, in_use, budget), ("b", 31, 70, 100));
            }
            other => panic!("expected BudgetExceeded, got {other:?}"),
        }
        assert_eq!(
            t.stats().current_bytes,
            70,
            "a failed reservation is not counted"
        );
        assert_eq!(t.available(), 30, "available is budget minus current");
    }

    #[test]
    fn concurrent_reservations_never_overshoot() {
        let t = Arc::new(MemoryTracker::new(1000));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let t = Arc::clone(&t);
                std::thread::spawn(move || (0..100).filter(|_| t.reserve("x", 7).is_ok()).count())
            })
            .collect();
        let granted: usize = handles
            .into_iter()
            .map(|h| h.join().expect("thread ran"))
            .sum();
        assert_eq!(
            granted,
            1000 / 7,
            "exactly floor(budget / 7) reservations fit"
        );
        assert!(t.stats().peak_bytes <= 1000, "peak never passes the budget");
    }
}
