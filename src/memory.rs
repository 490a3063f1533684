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
/// use wgpu_metric_learning::MemoryStats;
/// let stats = MemoryStats { current_bytes: 0, peak_bytes: 4096, budget_bytes: 1 << 20 };
/// assert!(stats.peak_bytes <= stats.budget_bytes);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
pub struct Transfers {
    /// Blocking waits for the device (each `poll` that waits for a submission).
    pub host_waits: u64,
    /// Command-buffer submissions.
    pub submissions: u64,
    /// Bytes written from the host to device buffers.
    pub bytes_up: u64,
    /// Bytes read back from the device to the host.
    pub bytes_down: u64,
}

impl Transfers {
    pub(crate) fn add(&mut self, other: Transfers) {
        self.host_waits += other.host_waits;
        self.submissions += other.submissions;
        self.bytes_up += other.bytes_up;
        self.bytes_down += other.bytes_down;
    }
}

/// A context's running totals, shared by every thread using it.
#[derive(Debug, Default)]
pub(crate) struct TransferCounter {
    host_waits: AtomicU64,
    submissions: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
}

impl TransferCounter {
    /// Adds `t` to the totals.
    pub(crate) fn add(&self, t: Transfers) {
        self.host_waits.fetch_add(t.host_waits, Ordering::Relaxed);
        self.submissions.fetch_add(t.submissions, Ordering::Relaxed);
        self.bytes_up.fetch_add(t.bytes_up, Ordering::Relaxed);
        self.bytes_down.fetch_add(t.bytes_down, Ordering::Relaxed);
    }

    pub(crate) fn totals(&self) -> Transfers {
        Transfers {
            host_waits: self.host_waits.load(Ordering::Relaxed),
            submissions: self.submissions.load(Ordering::Relaxed),
            bytes_up: self.bytes_up.load(Ordering::Relaxed),
            bytes_down: self.bytes_down.load(Ordering::Relaxed),
        }
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
