//! Recording a chunk of device work, submitting it, and reading its results back.

use std::collections::{HashSet, VecDeque};
use std::sync::mpsc;

use bytemuck::Pod;

use super::timing::{self, PassTimes};
use super::{count, create_buffer, wait, SENTINEL_BITS};
use crate::error::{Error, Result};
use crate::runtime::device::{scoped, GpuDevice};
use crate::runtime::memory::{HostTimes, TrackedBuffer, Transfers};

/// A command encoder labelled for the operation recording into it: the recorder is the only
/// owner of encoders.
fn encoder(gpu: &GpuDevice, label: &'static str) -> wgpu::CommandEncoder {
    gpu.device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) })
}

/// One chunk's work, recorded into one command encoder and submitted once.
///
/// Uploads (`queue.write_buffer`) land before the submission that follows them runs, not at
/// their place among the commands; so a buffer that this recording already wrote or bound is
/// rewritten only after what was recorded so far has been submitted (a flush, no wait). A
/// chunk whose uniforms change between dispatches thus takes a few submissions; one that
/// writes each buffer once takes one.
pub(crate) struct Recorder<'a> {
    gpu: &'a GpuDevice,
    label: &'static str,
    encoder: wgpu::CommandEncoder,
    /// Commands recorded since the last submission.
    commands: usize,
    /// Buffers written or bound since the last submission.
    touched: HashSet<u64>,
    last: Option<wgpu::SubmissionIndex>,
    /// Timestamps of this submission's passes, when the context times kernels.
    times: Option<PassTimes>,
}

impl<'a> Recorder<'a> {
    pub(crate) fn new(gpu: &'a GpuDevice, label: &'static str) -> Self {
        Self {
            gpu,
            label,
            encoder: encoder(gpu, label),
            commands: 0,
            touched: HashSet::new(),
            last: None,
            times: None,
        }
    }

    pub(crate) fn gpu(&self) -> &'a GpuDevice {
        self.gpu
    }

    /// Queues `data` for `buffer` at byte `offset`, after submitting what was recorded if the
    /// buffer was already written or bound in it.
    pub(crate) fn upload<T: Pod>(
        &mut self,
        buffer: &TrackedBuffer,
        offset: u64,
        data: &[T],
    ) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        if self.touched.contains(&buffer.id()) {
            self.flush()?;
        }
        self.touched.insert(buffer.id());
        super::write(self.gpu, buffer, offset, data)
    }

    /// Fills the first `bytes` bytes of `buffer` with the sentinel if the context asks for
    /// sentinels (so that output a kernel failed to write cannot pass as a value).
    pub(crate) fn sentinel(&mut self, buffer: &TrackedBuffer, bytes: u64) -> Result<()> {
        if !self.gpu.fill_sentinel || bytes == 0 {
            return Ok(());
        }
        let words = vec![SENTINEL_BITS; bytes.div_ceil(4) as usize];
        self.upload(buffer, 0, &words)
    }

    fn touch(&mut self, buffer: &TrackedBuffer) {
        self.touched.insert(buffer.id());
        self.commands += 1;
    }

    /// Records one dispatch of `pipeline` (kernel `stem`) with `group` (which binds
    /// `buffers`), in a compute pass of its own, timed when the context times kernels.
    pub(crate) fn dispatch(
        &mut self,
        label: &str,
        stem: &'static str,
        pipeline: &wgpu::ComputePipeline,
        group: &wgpu::BindGroup,
        buffers: &[&TrackedBuffer],
        workgroups: [u32; 3],
    ) -> Result<()> {
        if self.gpu.kernel_timing {
            if self.times.as_ref().is_some_and(PassTimes::is_full) {
                self.flush()?;
            }
            if self.times.is_none() {
                self.times = Some(PassTimes::new(self.gpu, timing::PASSES)?);
            }
        }
        for b in buffers {
            self.touch(b);
        }
        let timestamp_writes = self.times.as_mut().and_then(|t| t.next(stem));
        let mut pass = self
            .encoder
            .begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(label),
                timestamp_writes,
            });
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, group, &[]);
        pass.dispatch_workgroups(workgroups[0], workgroups[1], workgroups[2]);
        Ok(())
    }

    /// Records a copy of `bytes` bytes (rounded up to 4) from `src` at `src_offset` to `dst`
    /// at `dst_offset`.
    pub(crate) fn copy(
        &mut self,
        src: &TrackedBuffer,
        src_offset: u64,
        dst: &TrackedBuffer,
        dst_offset: u64,
        bytes: u64,
    ) {
        if bytes == 0 {
            return;
        }
        let bytes = bytes.next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
        self.touch(src);
        self.touch(dst);
        self.encoder.copy_buffer_to_buffer(
            src.buffer(),
            src_offset,
            dst.buffer(),
            dst_offset,
            bytes,
        );
    }

    /// Records a copy from an application's buffer (a device input) to `dst`.
    pub(crate) fn copy_from_foreign(
        &mut self,
        src: &wgpu::Buffer,
        src_offset: u64,
        dst: &TrackedBuffer,
        dst_offset: u64,
        bytes: u64,
    ) {
        self.touch(dst);
        self.encoder
            .copy_buffer_to_buffer(src, src_offset, dst.buffer(), dst_offset, bytes);
    }

    /// Records a copy from `src` to an application's buffer (a device output).
    pub(crate) fn copy_to_foreign(
        &mut self,
        src: &TrackedBuffer,
        src_offset: u64,
        dst: &wgpu::Buffer,
        dst_offset: u64,
        bytes: u64,
    ) {
        self.touch(src);
        self.encoder
            .copy_buffer_to_buffer(src.buffer(), src_offset, dst, dst_offset, bytes);
    }

    /// Records zeroing the first `bytes` bytes of `buffer`.
    pub(crate) fn clear(&mut self, buffer: &TrackedBuffer, bytes: u64) {
        self.touch(buffer);
        self.encoder.clear_buffer(buffer.buffer(), 0, Some(bytes));
    }

    /// Records a copy of `bytes` bytes of `src` from `src_offset` into `staging` at
    /// `dst_offset`, to read once this recording is submitted.
    pub(crate) fn read_back(
        &mut self,
        src: &TrackedBuffer,
        src_offset: u64,
        staging: &Staging,
        dst_offset: u64,
        bytes: u64,
    ) {
        self.copy(src, src_offset, &staging.buffer, dst_offset, bytes);
    }

    /// Submits what was recorded, without waiting; later uploads land after it.
    pub(crate) fn flush(&mut self) -> Result<()> {
        if self.commands == 0 {
            self.touched.clear();
            return Ok(());
        }
        let mut encoder = std::mem::replace(&mut self.encoder, encoder(self.gpu, self.label));
        let times = self.times.take().filter(|t| !t.is_empty());
        if let Some(t) = &times {
            t.resolve(&mut encoder);
        }
        let gpu = self.gpu;
        let started = std::time::Instant::now();
        let index = scoped(gpu, self.label, 0, || {
            crate::runtime::device::submit(&gpu.queue, [encoder.finish()])
        })?;
        let submit_ns = started.elapsed().as_nanos() as u64;
        if let Some(t) = times {
            timing::park(t.map(gpu, index.clone()));
        }
        count(
            self.gpu,
            Transfers {
                submissions: 1,
                host: HostTimes {
                    submit_ns,
                    ..HostTimes::default()
                },
                ..Transfers::default()
            },
        );
        self.last = Some(index);
        self.commands = 0;
        self.touched.clear();
        Ok(())
    }

    /// Submits what was recorded and returns the last submission (none when nothing was ever
    /// recorded), for the readbacks to wait on.
    pub(crate) fn submit(mut self) -> Result<Submitted> {
        self.flush()?;
        Ok(Submitted { index: self.last })
    }

    /// Submits and waits for the device to finish (one host wait): for work whose results
    /// the host does not read but must see done (nothing left in flight).
    pub(crate) fn submit_and_wait(self) -> Result<()> {
        let gpu = self.gpu;
        match self.submit()?.index {
            Some(index) => wait(gpu, index),
            None => Ok(()),
        }
    }
}

/// A submission made by a [`Recorder`].
#[derive(Debug, Clone)]
pub(crate) struct Submitted {
    index: Option<wgpu::SubmissionIndex>,
}

/// A reusable MAP_READ buffer: copying into one long-lived staging buffer is several times
/// faster than making a new one per readback (see `shared/anchors/LIMITS.md`, 64 MiB: 11 ms
/// reused vs 65–82 ms new on lavapipe).
pub(crate) struct Staging {
    buffer: TrackedBuffer,
    label: &'static str,
}

impl Staging {
    pub(crate) fn new(gpu: &GpuDevice, label: &'static str, size: u64) -> Result<Self> {
        let buffer = create_buffer(
            gpu,
            label,
            size,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        Ok(Self { buffer, label })
    }

    /// `count` staging buffers of `size` bytes, for [`pipelined`] readbacks.
    pub(crate) fn many(
        gpu: &GpuDevice,
        label: &'static str,
        size: u64,
        count: usize,
    ) -> Result<Vec<Self>> {
        (0..count).map(|_| Self::new(gpu, label, size)).collect()
    }

    /// Starts mapping the first `bytes` bytes, to be read when `after` is done: a readback in
    /// flight. Several readbacks of one submission share its one wait.
    pub(crate) fn map<'s>(&'s self, after: &Submitted, bytes: u64) -> Readback<'s> {
        let len = bytes
            .next_multiple_of(wgpu::MAP_ALIGNMENT)
            .min(self.buffer.size());
        let (tx, rx) = mpsc::channel();
        if len > 0 && after.index.is_some() {
            self.buffer
                .buffer()
                .slice(..len)
                .map_async(wgpu::MapMode::Read, move |r| {
                    // The receiver outlives this callback unless the readback was dropped.
                    let _ = tx.send(r);
                });
        }
        Readback {
            staging: self,
            bytes,
            len,
            index: after.index.clone(),
            done: rx,
        }
    }
}

/// A staging buffer being mapped after a submission: [`Readback::read`] waits for that
/// submission (once, and only if it has not finished) and hands over the bytes.
pub(crate) struct Readback<'s> {
    staging: &'s Staging,
    bytes: u64,
    len: u64,
    index: Option<wgpu::SubmissionIndex>,
    done: mpsc::Receiver<std::result::Result<(), wgpu::BufferAsyncError>>,
}

impl Readback<'_> {
    /// Calls `f` with the first `elements` values read back, then unmaps.
    pub(crate) fn read<T: Pod, R>(
        self,
        gpu: &GpuDevice,
        elements: usize,
        f: impl FnOnce(&[T]) -> R,
    ) -> Result<R> {
        let label = self.staging.label;
        let want = (elements * std::mem::size_of::<T>()) as u64;
        // `len` is what was mapped: the bytes asked for, rounded up, within the buffer.
        if want > self.bytes.min(self.len) {
            return Err(Error::Internal {
                op: label,
                message: format!("{want} bytes read of a {}-byte readback", self.bytes),
            });
        }
        let Some(index) = self.index.clone().filter(|_| self.len > 0) else {
            if elements > 0 {
                return Err(Error::Internal {
                    op: label,
                    message: format!("{elements} elements read back after no copy"),
                });
            }
            return Ok(f(&[]));
        };
        let mapped = match self.done.try_recv() {
            Ok(r) => r,
            Err(_) => {
                // Not finished yet: wait for this submission only (later ones run on).
                wait(gpu, index)?;
                self.done.recv().map_err(|_| Error::Internal {
                    op: label,
                    message: "the map callback never ran after a wait".into(),
                })?
            }
        };
        mapped.map_err(|e| Error::Readback {
            label,
            source: Box::new(e),
        })?;
        let buffer = self.staging.buffer.buffer();
        let copying = std::time::Instant::now();
        let result = {
            let view =
                buffer
                    .slice(..self.len)
                    .get_mapped_range()
                    .map_err(|e| Error::Readback {
                        label,
                        source: Box::new(e),
                    })?;
            let all: &[T] = bytemuck::cast_slice(&view[..]);
            f(&all[..elements])
        };
        buffer.unmap();
        count(
            gpu,
            Transfers {
                bytes_down: want,
                host: HostTimes {
                    readback_ns: copying.elapsed().as_nanos() as u64,
                    ..HostTimes::default()
                },
                ..Transfers::default()
            },
        );
        Ok(result)
    }
}

/// Runs `chunks` through the staging buffers `staging` (one or more) so that, with two, the
/// device computes chunk `i` while the host reads chunk `i - 1`: `record` records and submits
/// a chunk, copying its results into the staging buffer it is given, and returns the
/// submission and the bytes copied; `deliver` reads them. At most one host wait per chunk.
/// On an error (a cancellation included) it waits for what was submitted before returning,
/// so that the caller's buffers are released only once the device is done with them.
pub(crate) fn pipelined<C>(
    gpu: &GpuDevice,
    staging: &[Staging],
    chunks: impl IntoIterator<Item = C>,
    record: impl FnMut(&C, &Staging) -> Result<(Submitted, u64)>,
    deliver: impl FnMut(C, Readback<'_>) -> Result<()>,
) -> Result<()> {
    let result = run_pipelined(staging, chunks, record, deliver);
    if result.is_err() {
        gpu.settle();
    }
    result
}

fn run_pipelined<C>(
    staging: &[Staging],
    chunks: impl IntoIterator<Item = C>,
    mut record: impl FnMut(&C, &Staging) -> Result<(Submitted, u64)>,
    mut deliver: impl FnMut(C, Readback<'_>) -> Result<()>,
) -> Result<()> {
    let depth = staging.len();
    if depth == 0 {
        return Err(Error::Internal {
            op: "pipelined",
            message: "no staging buffer".into(),
        });
    }
    let mut pending: VecDeque<(C, Readback<'_>)> = VecDeque::with_capacity(depth);
    for (i, chunk) in chunks.into_iter().enumerate() {
        // Staging `i % depth` was last read by chunk `i - depth`, delivered in an earlier round.
        let st = &staging[i % depth];
        let (done, bytes) = record(&chunk, st)?;
        let readback = st.map(&done, bytes);
        pending.push_back((chunk, readback));
        if pending.len() == depth {
            if let Some((c, r)) = pending.pop_front() {
                deliver(c, r)?;
            }
        }
    }
    while let Some((c, r)) = pending.pop_front() {
        deliver(c, r)?;
    }
    Ok(())
}
