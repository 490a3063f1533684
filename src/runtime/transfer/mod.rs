//! The one place that creates device buffers, moves bytes between host and device, submits and
//! waits. Every wgpu failure on that path becomes a variant of [`crate::Error`].
//!
//! Work is recorded with a [`Recorder`]: one chunk's uploads, dispatches and copies go into
//! one command buffer and one submission (more only where a buffer must be rewritten between
//! two of its commands), and results come back through [`Readback`]s, one blocking wait per
//! submission read, so that a chunk can compute while the previous one is read. Every
//! blocking wait and every byte moved is counted ([`Transfers`]).

mod recorder;
pub(crate) mod timing;

use std::cell::Cell;
use std::time::Duration;

use bytemuck::Pod;

pub(crate) use recorder::{pipelined, Readback, Recorder, Staging, Submitted};

use crate::error::{Error, Result};
use crate::runtime::device::{scoped, GpuDevice};
use crate::runtime::memory::{HostTimes, TrackedBuffer, Transfers};

thread_local! {
    /// The traffic of the call running on this thread ([`measure`]).
    static CALL: Cell<Transfers> = const {
        Cell::new(Transfers::ZERO)
    };
}

/// Counts traffic for the device's context and for the call running on this thread.
fn count(gpu: &GpuDevice, t: Transfers) {
    gpu.transfers.add(t);
    CALL.with(|call| {
        let mut now = call.get();
        now.add(t);
        call.set(now);
    });
}

/// Runs `f` and returns its result with the traffic it caused on this thread. Calls nest (an
/// accuracy call's kNN is part of the accuracy call's traffic).
pub(crate) fn measure<T>(f: impl FnOnce() -> T) -> (T, Transfers) {
    /// Gives the enclosing call its count back, with this one's added, also when `f` panics.
    struct Enclosing(Transfers);
    impl Drop for Enclosing {
        fn drop(&mut self) {
            let mut total = self.0;
            total.add(CALL.with(Cell::get));
            CALL.with(|c| c.set(total));
        }
    }
    let enclosing = Enclosing(CALL.with(|c| c.replace(Transfers::default())));
    let out = f();
    // The call's timed dispatches: its waits have covered their submissions.
    let kernels = timing::collect();
    CALL.with(|c| {
        let mut now = c.get();
        now.kernels.add(&kernels);
        c.set(now);
    });
    let inner = CALL.with(Cell::get);
    drop(enclosing);
    (out, inner)
}

/// Counts `elapsed` of tuning kernels on the device for the context and the running call.
pub(crate) fn count_tuning(gpu: &GpuDevice, elapsed: Duration) {
    count(
        gpu,
        Transfers {
            host: HostTimes {
                tune_ns: elapsed.as_nanos() as u64,
                ..HostTimes::default()
            },
            ..Transfers::default()
        },
    );
}

/// Adds traffic measured on another thread (a shard's) to the call running on this one.
pub(crate) fn absorb(t: Transfers) {
    CALL.with(|call| {
        let mut now = call.get();
        now.add(t);
        call.set(now);
    });
}

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

/// Rows `start .. start + count` of `x` `(n, d)` as a row-major `(count, 4 * dim4)` f32 slice,
/// each row zero-padded from `d` to `4 * dim4` so kernels can read it as `vec4`s. Borrowed
/// from `x` when its rows are already that (standard layout, `d` a multiple of 4): no copy of
/// what is only uploaded. Otherwise copied, row by row where rows are contiguous, element by
/// element for any other layout (transposed, strided).
pub(crate) fn padded_rows(
    x: ndarray::ArrayView2<'_, f32>,
    start: usize,
    count: usize,
    dim4: usize,
) -> std::borrow::Cow<'_, [f32]> {
    let width = 4 * dim4;
    let rows = x.slice_move(ndarray::s![start..start + count, ..]);
    if rows.ncols() == width {
        if let Some(slice) = rows.to_slice() {
            return std::borrow::Cow::Borrowed(slice);
        }
    }
    let mut out = vec![0.0f32; count * width];
    for (dst, row) in out.chunks_exact_mut(width).zip(rows.rows()) {
        match row.as_slice() {
            Some(src) => dst[..src.len()].copy_from_slice(src),
            None => {
                for (o, v) in dst.iter_mut().zip(row.iter()) {
                    *o = *v;
                }
            }
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The inverse of [`padded_rows`]: the first `out.ncols()` values of each `4 * dim4`-wide
/// row of `values` into the rows of `out`, as many as both have. On every core when large:
/// `values` is often mapped device memory, which one core reads at a fraction of the
/// memory's bandwidth.
pub(crate) fn unpad_rows_into(values: &[f32], dim4: usize, out: ndarray::ArrayViewMut2<'_, f32>) {
    let width = 4 * dim4;
    if width == 0 {
        return;
    }
    let rows = out.nrows().min(values.len() / width);
    let out = out.slice_move(ndarray::s![..rows, ..]);
    crate::runtime::pool::par_rows(
        out,
        || (),
        |row0, mut chunk, _| {
            let from = &values[row0 * width..];
            for (mut dst, row) in chunk.rows_mut().into_iter().zip(from.chunks_exact(width)) {
                for (o, v) in dst.iter_mut().zip(row) {
                    *o = *v;
                }
            }
        },
    );
}

/// Creates a device buffer of `size` bytes (rounded up to 4) through the budget accounting.
///
/// Order matters: the bytes are reserved first (so an over-budget request never reaches the
/// driver), then checked against the device's buffer-size limit, then created inside error
/// scopes; on any failure the reservation is returned.
pub(crate) fn create_buffer(
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
    let tracker = &gpu.memory;
    if let Some(device_bytes) = gpu.simulated_device_bytes {
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

/// Writes `data` into `buffer` at byte `offset`, queued: it lands before the next submission
/// runs. Directly only outside a recording (setup); a [`Recorder`] orders its own uploads
/// and writes through here.
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
    let started = std::time::Instant::now();
    scoped(gpu, "write_buffer", bytes.len() as u64, || {
        gpu.queue.write_buffer(buffer.buffer(), offset, bytes)
    })?;
    count(
        gpu,
        Transfers {
            bytes_up: bytes.len() as u64,
            host: HostTimes {
                upload_ns: started.elapsed().as_nanos() as u64,
                ..HostTimes::default()
            },
            ..Transfers::default()
        },
    );
    Ok(())
}

/// A uniform buffer holding one `T`.
pub(crate) fn uniform<T: Pod>(
    gpu: &GpuDevice,
    label: &'static str,
    value: &T,
) -> Result<TrackedBuffer> {
    let buffer = create_buffer(
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
pub(crate) fn output(gpu: &GpuDevice, label: &'static str, size: u64) -> Result<TrackedBuffer> {
    let buffer = create_buffer(
        gpu,
        label,
        size,
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
    )?;
    Ok(buffer)
}

/// Blocks until the device has finished submission `index` (one host wait). Generous
/// timeout: lavapipe is ~1000× slower than a GPU, but a lost device must not hang us forever.
fn wait(gpu: &GpuDevice, index: wgpu::SubmissionIndex) -> Result<()> {
    wait_for(gpu, Some(index))
}

/// Blocks until the device has finished everything submitted so far (one host wait): for a
/// call that reads nothing back but frees its buffers when it returns.
pub(crate) fn wait_all(gpu: &GpuDevice) -> Result<()> {
    wait_for(gpu, None)
}

fn wait_for(gpu: &GpuDevice, index: Option<wgpu::SubmissionIndex>) -> Result<()> {
    const TIMEOUT: Duration = Duration::from_secs(600);
    let started = std::time::Instant::now();
    let polled = crate::runtime::device::poll(
        &gpu.device,
        wgpu::PollType::Wait {
            submission_index: index,
            timeout: Some(TIMEOUT),
        },
    );
    count(
        gpu,
        Transfers {
            host_waits: 1,
            host: HostTimes {
                wait_ns: started.elapsed().as_nanos() as u64,
                ..HostTimes::default()
            },
            ..Transfers::default()
        },
    );
    polled.map_err(|source| match gpu.check_lost_after_error() {
        Err(lost) => lost,
        Ok(()) => Error::Poll { op: "wait", source },
    })?;
    gpu.check_alive()
}

/// For the crate's kernel tests: a storage buffer holding `data`.
#[cfg(test)]
pub(crate) fn test_input(gpu: &GpuDevice, data: &[u32]) -> TrackedBuffer {
    let buffer = output(gpu, "test::input", f32s(data.len())).expect("test buffer");
    write(gpu, &buffer, 0, data).expect("test upload");
    buffer
}

/// For the crate's kernel tests: submits `rec` with a readback of the first `words` `u32` of
/// each buffer of `outputs`, and returns them.
#[cfg(test)]
pub(crate) fn test_read(
    gpu: &GpuDevice,
    mut rec: Recorder<'_>,
    outputs: &[(&TrackedBuffer, usize)],
) -> Vec<Vec<u32>> {
    let total: usize = outputs.iter().map(|o| o.1).sum();
    let staging = Staging::new(gpu, "test::staging", f32s(total)).expect("test staging");
    let mut at = 0;
    for &(buffer, words) in outputs {
        rec.read_back(buffer, 0, &staging, 4 * at as u64, 4 * words as u64);
        at += words;
    }
    let done = rec.submit().expect("test submit");
    let all = staging
        .map(&done, 4 * total as u64)
        .read::<u32, _>(gpu, total, <[u32]>::to_vec)
        .expect("test read");
    let mut rest = all.as_slice();
    outputs
        .iter()
        .map(|&(_, words)| {
            let (head, tail) = rest.split_at(words);
            rest = tail;
            head.to_vec()
        })
        .collect()
}
