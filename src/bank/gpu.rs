//! The device side of a memory bank: staging a batch (from the host or a device buffer),
//! computing its squared norms, checking them, and copying it into the ring of pages.

use ndarray::ArrayView2;

use crate::context::Context;
use crate::device::{checked, GpuDevice};
use crate::device_rows::DeviceRows;
use crate::error::{Error, Result};
use crate::inputs::foreign_bank;
use crate::kernels::row_norms::{self, RowNorms};
use crate::memory::TrackedBuffer;
use crate::transfer::{self, encoder, f32s, Staging};

use super::ENQUEUE;

/// The bank's pages and where the next batch goes.
pub(super) struct Ring<'r> {
    pub(super) rows: &'r DeviceRows,
    pub(super) head: usize,
    pub(super) capacity: usize,
}

impl Ring<'_> {
    /// Records copies of scratch rows `0 .. n` (batch rows `c0 ..`) to slots `head + c0 ..`
    /// modulo the capacity: at most two runs.
    fn encode_copy(&self, enc: &mut wgpu::CommandEncoder, scratch: &Scratch, c0: usize, n: usize) {
        let head = (self.head + c0) % self.capacity;
        let first = n.min(self.capacity - head);
        self.rows
            .copy_in(enc, &scratch.rows, &scratch.norms, 0, head, first);
        self.rows
            .copy_in(enc, &scratch.rows, &scratch.norms, first, 0, n - first);
    }
}

/// The device of `ctx`, if it holds `rows`.
pub(super) fn gpu_of<'c>(
    ctx: &'c Context,
    op: &'static str,
    rows: &DeviceRows,
) -> Result<&'c GpuDevice> {
    match ctx.gpu() {
        Some(gpu) if rows.is_on(gpu) => Ok(gpu),
        _ => Err(foreign_bank(op, ctx.device_name())),
    }
}

/// Writes host `embeddings` `(b, dim)` (validated) into the ring at its head, staged a page
/// at a time so that the scratch always fits one binding.
pub(super) fn enqueue_host(
    ctx: &Context,
    gpu: &GpuDevice,
    ring: &Ring<'_>,
    embeddings: ArrayView2<'_, f32>,
) -> Result<()> {
    let b = embeddings.nrows();
    if b == 0 {
        return Ok(());
    }
    let dim4 = ring.rows.dim4();
    let chunk = ring.rows.page_rows().min(b);
    let scratch = Scratch::new(ctx, gpu, chunk, dim4)?;
    for c0 in (0..b).step_by(chunk) {
        let n = chunk.min(b - c0);
        let padded = transfer::padded_rows(embeddings, c0, n, dim4);
        transfer::write(gpu, &scratch.rows, 0, &padded)?;
        let mut enc = encoder(gpu, ENQUEUE);
        scratch.encode_norms(ctx, gpu, &mut enc, n)?;
        ring.encode_copy(&mut enc, &scratch, c0, n);
        transfer::submit_and_wait(gpu, enc)?;
    }
    Ok(())
}

/// Writes `b` rows of `dim` f32 from `source` at byte `offset` (checked by the caller) into
/// the ring at its head. Every chunk's squared norms are checked first, so a non-finite row
/// anywhere leaves the bank untouched.
pub(super) fn enqueue_buffer(
    ctx: &Context,
    gpu: &GpuDevice,
    ring: &Ring<'_>,
    source: &wgpu::Buffer,
    offset: u64,
    b: usize,
) -> Result<()> {
    if b == 0 {
        return Ok(());
    }
    let (rows, dim) = (ring.rows, ring.rows.dim());
    let dim4 = rows.dim4();
    let chunk = rows.page_rows().min(b);
    let scratch = Scratch::new(ctx, gpu, chunk, dim4)?;
    let (dense, padded) = (4 * dim as u64, 16 * dim4 as u64);
    // Source rows c0 .. c0 + n into scratch rows 0 .. n, and their norms.
    let stage = |enc: &mut wgpu::CommandEncoder, c0: usize, n: usize| -> Result<()> {
        let at = offset + c0 as u64 * dense;
        checked(gpu, ENQUEUE, || {
            if dense == padded {
                enc.copy_buffer_to_buffer(source, at, scratch.rows.buffer(), 0, n as u64 * dense);
            } else {
                // Scratch rows are zero-padded to vec4s: one copy per row.
                for i in 0..n as u64 {
                    let (from, to) = (at + i * dense, i * padded);
                    enc.copy_buffer_to_buffer(source, from, scratch.rows.buffer(), to, dense);
                }
            }
        })?;
        scratch.encode_norms(ctx, gpu, enc, n)
    };
    // First every chunk is checked, so a bad row anywhere leaves the bank untouched.
    let staging = Staging::new(ctx, gpu, "MemoryBank::enqueue::norms", f32s(chunk))?;
    for c0 in (0..b).step_by(chunk) {
        let n = chunk.min(b - c0);
        let mut enc = encoder(gpu, ENQUEUE);
        stage(&mut enc, c0, n)?;
        staging.copy_from(&mut enc, &scratch.norms, 0, 4 * n as u64);
        transfer::submit_and_wait(gpu, enc)?;
        let bad = staging.read::<f32, _>(gpu, n, |v| v.iter().position(|x| !x.is_finite()))?;
        if let Some(row) = bad {
            return Err(scratch.non_finite(ctx, gpu, row, c0 + row, dim)?);
        }
    }
    for c0 in (0..b).step_by(chunk) {
        let n = chunk.min(b - c0);
        let mut enc = encoder(gpu, ENQUEUE);
        // A single chunk is still staged from the check.
        if b > chunk {
            stage(&mut enc, c0, n)?;
        }
        ring.encode_copy(&mut enc, &scratch, c0, n);
        transfer::submit_and_wait(gpu, enc)?;
    }
    Ok(())
}

/// A batch on its way into the bank, up to `capacity` rows at a time: padded rows and their
/// squared norms.
struct Scratch {
    params: TrackedBuffer,
    rows: TrackedBuffer,
    norms: TrackedBuffer,
    dim4: usize,
}

impl Scratch {
    fn new(ctx: &Context, gpu: &GpuDevice, capacity: usize, dim4: usize) -> Result<Self> {
        let usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC;
        let uniform = wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST;
        Ok(Self {
            params: transfer::create_buffer(
                ctx,
                gpu,
                "MemoryBank::enqueue::params",
                f32s(4),
                uniform,
            )?,
            // Fresh buffers are zeroed by wgpu, which the vec4 padding relies on.
            rows: transfer::create_buffer(
                ctx,
                gpu,
                "MemoryBank::enqueue::rows",
                f32s(capacity * dim4 * 4),
                usage,
            )?,
            norms: transfer::output(ctx, gpu, "MemoryBank::enqueue::norms", f32s(capacity))?,
            dim4,
        })
    }

    /// Records the squared norms of scratch rows `0 .. n` (sentinel-filled first when the
    /// context asks, as every kernel output).
    fn encode_norms(
        &self,
        ctx: &Context,
        gpu: &GpuDevice,
        enc: &mut wgpu::CommandEncoder,
        n: usize,
    ) -> Result<()> {
        transfer::fill_sentinel(ctx, gpu, &self.norms, f32s(n))?;
        let params = row_norms::Params {
            rows: n as u32,
            dim4: self.dim4 as u32,
            _pad: [0; 2],
        };
        transfer::write(gpu, &self.params, 0, &[params])?;
        let kernel = gpu.kernel::<RowNorms>()?;
        kernel.encode(gpu, enc, n as u64, &self.params, &self.rows, &self.norms)
    }

    /// The error for scratch row `row` (batch row `batch_row`), whose squared norm is not
    /// finite, naming its first non-finite value (or the norm, when every value is finite).
    fn non_finite(
        &self,
        ctx: &Context,
        gpu: &GpuDevice,
        row: usize,
        batch_row: usize,
        dim: usize,
    ) -> Result<Error> {
        let width = 4 * self.dim4;
        let staging = Staging::new(ctx, gpu, "MemoryBank::enqueue::row", f32s(width))?;
        let mut enc = encoder(gpu, ENQUEUE);
        let bytes = 4 * width as u64;
        staging.copy_range(&mut enc, &self.rows, row as u64 * bytes, bytes);
        transfer::submit_and_wait(gpu, enc)?;
        let found = staging.read::<f32, _>(gpu, width, |values| {
            values[..dim]
                .iter()
                .enumerate()
                .find(|(_, v)| !v.is_finite())
                .map(|(col, &v)| (col, v))
        })?;
        Ok(match found {
            Some((col, value)) => Error::NonFinite {
                op: ENQUEUE,
                what: "embeddings",
                row: batch_row,
                col,
                value,
            },
            None => Error::InvalidParameter {
                op: ENQUEUE,
                what: "embeddings",
                value: format!("row {batch_row}"),
                rule: "its squared norm must be finite (every value below ~1.8e19)",
            },
        })
    }
}
