//! The one place that creates device buffers, moves bytes between host and device, submits and
//! waits. Every wgpu failure on that path becomes a variant of [`crate::Error`].

use std::time::Duration;

use bytemuck::Pod;

use crate::context::Context;
use crate::device::{scoped, GpuDevice};
use crate::error::{Error, Result};
use crate::memory::TrackedBuffer;

/// Bit pattern written into output buffers before a kernel runs when the context asks for
/// sentinels: a quiet NaN as `f32`, `u32::MAX`-like as an index; no kernel writes it.
pub(crate) const SENTINEL_BITS: u32 = 0xFFFF_FFFF;

/// The size a buffer of `bytes` bytes really gets: at least 4, a multiple of 4 (wgpu's copy
/// alignment). Footprints use it so that plans count exactly what is allocated.
pub(crate) fn buffer_size(bytes: u64) -> u64 {
    bytes.max(4).next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT)
}

/// Bytes of a buffer of `n` f32/u32 (as [`create_buffer`] rounds them).
pub(crate) fn f32s(n: usize) -> u64 {
    buffer_size(4 * n as u64)
}

/// Bytes of a uniform buffer holding one `T`.
pub(crate) fn uniform_size<T>() -> u64 {
    buffer_size(std::mem::size_of::<T>() as u64)
}

/// A command encoder labelled for the operation recording into it.
pub(crate) fn encoder(gpu: &GpuDevice, label: &'static str) -> wgpu::CommandEncoder {
    gpu.device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) })
}

/// Rows `start .. start + count` of `x` `(n, d)` as a row-major `(count, 4 * dim4)` f32 vector,
/// each row zero-padded from `d` to `4 * dim4` so kernels can read it as `vec4`s. Works for
/// any view layout (transposed, strided), copying element by element.
pub(crate) fn padded_rows(
    x: ndarray::ArrayView2<'_, f32>,
    start: usize,
    count: usize,
    dim4: usize,
) -> Vec<f32> {
    let width = 4 * dim4;
    let mut out = vec![0.0f32; count * width];
    let rows = x.slice(ndarray::s![start..start + count, ..]);
    for (dst, row) in out.chunks_exact_mut(width).zip(rows.rows()) {
        for (o, v) in dst.iter_mut().zip(row.iter()) {
            *o = *v;
        }
    }
    out
}

/// Creates a device buffer of `size` bytes (rounded up to 4) through the budget accounting.
///
/// Order matters: the bytes are reserved first (so an over-budget request never reaches the
/// driver), then checked against the device's buffer-size limit, then created inside error
/// scopes; on any failure the reservation is returned.
pub(crate) fn create_buffer(
    ctx: &Context,
    gpu: &GpuDevice,
    label: &'static str,
    size: u64,
    usage: wgpu::BufferUsages,
) -> Result<TrackedBuffer> {
    gpu.check_alive()?;
    let size = buffer_size(size);
    if size > gpu.limits.max_buffer_size {
        return Err(Error::DeviceLimit {
            op: label,
            what: "max_buffer_size",
            requested: size,
            limit: gpu.limits.max_buffer_size,
        });
    }
    let tracker = ctx.tracker();
    if let Some(device_bytes) = ctx.simulated_device_bytes() {
        if tracker.stats().current_bytes.saturating_add(size) > device_bytes {
            return Err(Error::OutOfMemory {
                label,
                requested: size,
                message: format!("simulated: the device holds {device_bytes} bytes"),
                source: None,
            });
        }
    }
    tracker.reserve(label, size)?;
    let created = scoped(gpu, label, size, || {
        gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage,
            mapped_at_creation: false,
        })
    });
    match created {
        Ok(buffer) => Ok(TrackedBuffer::new(buffer, size, tracker.clone())),
        Err(e) => {
            tracker.release(size);
            Err(e)
        }
    }
}

/// Writes `data` into `buffer` at byte `offset` (queued; ordered before the next submit).
pub(crate) fn write<T: Pod>(
    gpu: &GpuDevice,
    buffer: &TrackedBuffer,
    offset: u64,
    data: &[T],
) -> Result<()> {
    let bytes: &[u8] = bytemuck::cast_slice(data);
    if bytes.is_empty() {
        return Ok(());
    }
    // write_buffer needs a multiple of 4 bytes; every Pod we upload is 4-byte sized.
    scoped(gpu, "write_buffer", bytes.len() as u64, || {
        gpu.queue.write_buffer(buffer.buffer(), offset, bytes)
    })
}

/// A uniform buffer holding one `T`.
pub(crate) fn uniform<T: Pod>(
    ctx: &Context,
    gpu: &GpuDevice,
    label: &'static str,
    value: &T,
) -> Result<TrackedBuffer> {
    let buffer = create_buffer(
        ctx,
        gpu,
        label,
        std::mem::size_of::<T>() as u64,
        wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
    )?;
    write(gpu, &buffer, 0, std::slice::from_ref(value))?;
    Ok(buffer)
}

/// A read-write storage buffer for kernel output, pre-filled with [`SENTINEL_BITS`] when the
/// context asks for it.
pub(crate) fn output(
    ctx: &Context,
    gpu: &GpuDevice,
    label: &'static str,
    size: u64,
) -> Result<TrackedBuffer> {
    let buffer = create_buffer(
        ctx,
        gpu,
        label,
        size,
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
    )?;
    Ok(buffer)
}

/// Fills `bytes` bytes of `buffer` with the sentinel if the context asks for sentinels.
pub(crate) fn fill_sentinel(
    ctx: &Context,
    gpu: &GpuDevice,
    buffer: &TrackedBuffer,
    bytes: u64,
) -> Result<()> {
    if !ctx.fills_sentinel() || bytes == 0 {
        return Ok(());
    }
    let words = vec![SENTINEL_BITS; bytes.div_ceil(4) as usize];
    write(gpu, buffer, 0, &words)
}

/// Submits `encoder` without waiting: later queue writes apply after its commands.
pub(crate) fn submit(gpu: &GpuDevice, encoder: wgpu::CommandEncoder) -> Result<()> {
    scoped(gpu, "submit", 0, || gpu.queue.submit([encoder.finish()])).map(|_| ())
}

/// Submits `encoder` and blocks until the device has finished it.
pub(crate) fn submit_and_wait(gpu: &GpuDevice, encoder: wgpu::CommandEncoder) -> Result<()> {
    let index = scoped(gpu, "submit", 0, || gpu.queue.submit([encoder.finish()]))?;
    wait(gpu, index)
}

fn wait(gpu: &GpuDevice, index: wgpu::SubmissionIndex) -> Result<()> {
    // Generous: lavapipe is ~1000× slower than a GPU, but a lost device must not hang us forever.
    const TIMEOUT: Duration = Duration::from_secs(600);
    gpu.device
        .poll(wgpu::PollType::Wait {
            submission_index: Some(index),
            timeout: Some(TIMEOUT),
        })
        .map_err(|source| match gpu.check_lost_after_error() {
            Err(lost) => lost,
            Ok(()) => Error::Poll { op: "wait", source },
        })?;
    gpu.check_alive()
}

/// A reusable MAP_READ buffer: copying into one long-lived staging buffer is several times
/// faster than making a new one per readback (see `shared/anchors/LIMITS.md`, 64 MiB: 11 ms
/// reused vs 65–82 ms new on lavapipe).
pub(crate) struct Staging {
    buffer: TrackedBuffer,
    label: &'static str,
}

impl Staging {
    pub(crate) fn new(
        ctx: &Context,
        gpu: &GpuDevice,
        label: &'static str,
        size: u64,
    ) -> Result<Self> {
        let buffer = create_buffer(
            ctx,
            gpu,
            label,
            size,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        Ok(Self { buffer, label })
    }

    /// Records a copy of the first `bytes` bytes of `src` into this staging buffer at byte
    /// `offset`.
    pub(crate) fn copy_from(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        src: &TrackedBuffer,
        offset: u64,
        bytes: u64,
    ) {
        let bytes = bytes.next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
        encoder.copy_buffer_to_buffer(src.buffer(), 0, self.buffer.buffer(), offset, bytes);
    }

    /// Records a copy of `bytes` bytes of `src` from byte `src_offset` to the start of this
    /// staging buffer.
    pub(crate) fn copy_range(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        src: &TrackedBuffer,
        src_offset: u64,
        bytes: u64,
    ) {
        let bytes = bytes.next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
        encoder.copy_buffer_to_buffer(src.buffer(), src_offset, self.buffer.buffer(), 0, bytes);
    }

    /// Maps the buffer (after the copy was submitted and waited for) and calls `f` with its
    /// first `len` elements.
    pub(crate) fn read<T: Pod, R>(
        &self,
        gpu: &GpuDevice,
        len: usize,
        f: impl FnOnce(&[T]) -> R,
    ) -> Result<R> {
        let bytes = (len * std::mem::size_of::<T>()) as u64;
        if bytes == 0 {
            return Ok(f(&[]));
        }
        let mapped_len = bytes
            .next_multiple_of(wgpu::MAP_ALIGNMENT)
            .min(self.buffer.size());
        let slice = self.buffer.buffer().slice(..mapped_len);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            // The receiver outlives this callback unless we already returned with an error.
            let _ = tx.send(r);
        });
        gpu.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|source| Error::Poll {
                op: self.label,
                source,
            })?;
        gpu.check_alive()?;
        let mapped = rx.recv().map_err(|_| Error::Internal {
            op: self.label,
            message: "the map callback never ran after a wait".into(),
        })?;
        mapped.map_err(|e| Error::Readback {
            label: self.label,
            source: Box::new(e),
        })?;
        let result = {
            let view = slice.get_mapped_range().map_err(|e| Error::Readback {
                label: self.label,
                source: Box::new(e),
            })?;
            let all: &[T] = bytemuck::cast_slice(&view[..]);
            f(&all[..len])
        };
        self.buffer.buffer().unmap();
        Ok(result)
    }
}
