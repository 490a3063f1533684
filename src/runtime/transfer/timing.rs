//! GPU time per dispatch, from timestamp queries at the beginning and end of each compute
//! pass (every dispatch has a pass of its own).
//!
//! A [`PassTimes`] holds a query set for up to [`PASSES`] passes. A [`super::Recorder`] of a
//! context that times kernels gives each dispatch a pair of its slots; when it submits, the
//! set is resolved and copied into a small mapped buffer, and the readback is parked on this
//! thread ([`park`]). The call's [`super::measure`] collects what this thread parked
//! ([`collect`]) once the call is done (its waits have already covered those submissions):
//! no extra wait inside the call, and the per-kernel totals land in the call's `Transfers`
//! and the context's.

use std::cell::RefCell;
use std::sync::{mpsc, Arc};

use super::create_buffer;
use crate::error::{Error, Result};
use crate::runtime::device::GpuDevice;
use crate::runtime::memory::{KernelTimes, TrackedBuffer, TransferCounter};

/// Passes one query set times (two timestamps each).
pub(crate) const PASSES: u32 = 128;

/// A query set and the buffers that bring its timestamps back.
pub(crate) struct PassTimes {
    set: wgpu::QuerySet,
    resolve: TrackedBuffer,
    read: TrackedBuffer,
    /// The stem of each timed pass, in slot order.
    stems: Vec<&'static str>,
    capacity: u32,
}

impl PassTimes {
    /// Room for `passes` passes (at most [`PASSES`] per set is what the recorder uses).
    pub(crate) fn new(gpu: &GpuDevice, passes: u32) -> Result<Self> {
        let bytes = 16 * u64::from(passes);
        let resolve = create_buffer(
            gpu,
            "timing::resolve",
            bytes,
            wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        )?;
        let read = create_buffer(
            gpu,
            "timing::read",
            bytes,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        let set = crate::runtime::device::checked(gpu, "timing::query_set", || {
            gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("timing"),
                ty: wgpu::QueryType::Timestamp,
                count: 2 * passes,
            })
        })?;
        Ok(Self {
            set,
            resolve,
            read,
            stems: Vec::new(),
            capacity: passes,
        })
    }

    /// The timestamp writes of the next pass, which runs kernel `stem`; `None` when full.
    pub(crate) fn next(
        &mut self,
        stem: &'static str,
    ) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        let slot = self.stems.len() as u32;
        if slot >= self.capacity {
            return None;
        }
        self.stems.push(stem);
        Some(wgpu::ComputePassTimestampWrites {
            query_set: &self.set,
            beginning_of_pass_write_index: Some(2 * slot),
            end_of_pass_write_index: Some(2 * slot + 1),
        })
    }

    /// Whether no pass was timed yet.
    pub(crate) fn is_empty(&self) -> bool {
        self.stems.is_empty()
    }

    /// Whether every slot is taken.
    pub(crate) fn is_full(&self) -> bool {
        self.stems.len() as u32 >= self.capacity
    }

    /// Records resolving the timed passes' timestamps and copying them to the mapped buffer.
    pub(crate) fn resolve(&self, encoder: &mut wgpu::CommandEncoder) {
        let queries = 2 * self.stems.len() as u32;
        if queries == 0 {
            return;
        }
        encoder.resolve_query_set(&self.set, 0..queries, self.resolve.buffer(), 0);
        encoder.copy_buffer_to_buffer(
            self.resolve.buffer(),
            0,
            self.read.buffer(),
            0,
            8 * u64::from(queries),
        );
    }

    /// After the submission that resolved them: starts mapping the timestamps; the result is
    /// read by [`Parked::read`].
    pub(crate) fn map(self, gpu: &GpuDevice, index: wgpu::SubmissionIndex) -> Parked {
        let (tx, rx) = mpsc::channel();
        let bytes = 16 * self.stems.len() as u64;
        self.read
            .buffer()
            .slice(..bytes)
            .map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
        Parked {
            times: self,
            device: (*gpu.device).clone(),
            period_ns: f64::from(gpu.queue.get_timestamp_period()),
            index,
            done: rx,
            counter: Arc::clone(&gpu.transfers),
        }
    }

    /// The nanoseconds of each timed pass, once mapped (for the tuner, which waits itself).
    pub(crate) fn read_now(&self, period_ns: f64) -> Result<Vec<u64>> {
        read_pairs(&self.read, self.stems.len(), period_ns)
    }

    /// The mapped buffer, for the tuner's own map.
    pub(crate) fn read_buffer(&self) -> &wgpu::Buffer {
        self.read.buffer()
    }
}

/// `passes` (begin, end) pairs of ticks from the mapped `buffer`, as nanoseconds.
fn read_pairs(buffer: &TrackedBuffer, passes: usize, period_ns: f64) -> Result<Vec<u64>> {
    let bytes = 16 * passes as u64;
    if bytes == 0 {
        return Ok(Vec::new());
    }
    let out = {
        let view = buffer
            .buffer()
            .slice(..bytes)
            .get_mapped_range()
            .map_err(|e| Error::Readback {
                label: "timing::read",
                source: Box::new(e),
            })?;
        let ticks: &[u64] = bytemuck::cast_slice(&view[..]);
        ticks
            .chunks_exact(2)
            // Unwritten or reordered stamps (a driver may give 0): no time rather than a
            // wrapped-around one.
            .map(|p| (p[1].saturating_sub(p[0]) as f64 * period_ns).round() as u64)
            .collect()
    };
    buffer.buffer().unmap();
    Ok(out)
}

/// Timestamps of a submitted recording, being mapped.
pub(crate) struct Parked {
    times: PassTimes,
    device: wgpu::Device,
    period_ns: f64,
    index: wgpu::SubmissionIndex,
    done: mpsc::Receiver<std::result::Result<(), wgpu::BufferAsyncError>>,
    counter: Arc<TransferCounter>,
}

impl Parked {
    /// The per-kernel times, waiting for the submission if it is not done (it is, when the
    /// call that made it waited for its results); also added to the context's totals.
    fn read(self) -> KernelTimes {
        let mapped = match self.done.try_recv() {
            Ok(r) => r,
            Err(_) => {
                let _ = crate::runtime::device::poll(
                    &self.device,
                    wgpu::PollType::Wait {
                        submission_index: Some(self.index.clone()),
                        timeout: Some(std::time::Duration::from_secs(60)),
                    },
                );
                self.done
                    .recv_timeout(std::time::Duration::from_secs(1))
                    .unwrap_or(Err(wgpu::BufferAsyncError))
            }
        };
        let mut kernels = KernelTimes::default();
        if mapped.is_err() {
            log::warn!("kernel timing: timestamps could not be read back");
            return kernels;
        }
        match read_pairs(&self.times.read, self.times.stems.len(), self.period_ns) {
            Ok(ns) => {
                for (stem, ns) in self.times.stems.iter().zip(ns) {
                    kernels.record(stem, ns);
                }
            }
            Err(e) => log::warn!("kernel timing: {e}"),
        }
        self.counter.add(crate::runtime::memory::Transfers {
            kernels,
            ..crate::runtime::memory::Transfers::ZERO
        });
        kernels
    }
}

thread_local! {
    /// Timestamps submitted on this thread and not collected yet.
    static PARKED: RefCell<Vec<Parked>> = const { RefCell::new(Vec::new()) };
}

/// At most this many timed submissions wait on a thread for its call to collect them.
const MAX_PARKED: usize = 64;

/// Parks `p` until this thread's call collects it. Dispatches recorded outside an
/// operation's call (none collects them) cannot pile up: past [`MAX_PARKED`], the oldest are
/// read into the context's totals alone and their buffers released.
pub(crate) fn park(p: Parked) {
    let overflow = PARKED.with(|v| {
        let mut v = v.borrow_mut();
        v.push(p);
        if v.len() > MAX_PARKED {
            let half = v.len() / 2;
            v.drain(..half).collect::<Vec<_>>()
        } else {
            Vec::new()
        }
    });
    for p in overflow {
        p.read();
    }
}

/// Every kernel time parked on this thread, read and summed.
pub(crate) fn collect() -> KernelTimes {
    let parked = PARKED.with(|v| std::mem::take(&mut *v.borrow_mut()));
    let mut total = KernelTimes::default();
    for p in parked {
        total.add(&p.read());
    }
    total
}
