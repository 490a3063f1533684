//! The device side of a memory bank: staging a batch (from the host or a device buffer),
//! computing its squared norms, checking them, and copying it into the ring of pages.

use ndarray::ArrayView2;

use crate::context::Context;
use crate::device::GpuDevice;
use crate::device_rows::DeviceRows;
use crate::error::{Error, Result};
use crate::inputs::foreign_bank;
use crate::kernels::row_norms::{self, RowNorms};
use crate::memory::TrackedBuffer;
use crate::transfer::{self, f32s, Readback, Recorder, Staging};

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
    fn encode_copy(&self, rec: &mut Recorder<'_>, scratch: &Scratch, c0: usize, n: usize) {
        let head = (self.head + c0) % self.capacity;
        let first = n.min(self.capacity - head);
        self.rows
            .copy_in(rec, &scratch.rows, &scratch.norms, 0, head, first);
        self.rows
            .copy_in(rec, &scratch.rows, &scratch.norms, first, 0, n - first);
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
/// at a time so that the scratch always fits one binding. One recording (flushed, not
/// waited on, where the scratch is reused) and one wait at the end, so that the scratch is
/// released only once the device is done with it.
pub(super) fn enqueue_host(
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
    let scratch = Scratch::new(gpu, chunk, dim4)?;
    let mut rec = Recorder::new(gpu, ENQUEUE);
    for c0 in (0..b).step_by(chunk) {
        let n = chunk.min(b - c0);
        let padded = transfer::padded_rows(embeddings, c0, n, dim4);
        rec.upload(&scratch.rows, 0, &padded)?;
        scratch.encode_norms(&mut rec, n)?;
        ring.encode_copy(&mut rec, &scratch, c0, n);
    }
    rec.submit_and_wait()
}

/// Writes `b` rows of `dim` f32 from `source` at byte `offset` (checked by the caller) into
/// the ring at its head. Every chunk's squared norms are checked first, so a non-finite row
/// anywhere leaves the bank untouched: one wait per chunk for the check (each chunk's norms
/// read while the next is staged), and one for the copy.
pub(super) fn enqueue_buffer(
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
    let scratch = Scratch::new(gpu, chunk, dim4)?;
    let (dense, padded) = (4 * dim as u64, 16 * dim4 as u64);
    // Source rows c0 .. c0 + n into scratch rows 0 .. n, and their norms.
    let stage = |rec: &mut Recorder<'_>, c0: usize, n: usize| -> Result<()> {
        let at = offset + c0 as u64 * dense;
        if dense == padded {
            rec.copy_from_foreign(source, at, &scratch.rows, 0, n as u64 * dense);
        } else {
            // Scratch rows are zero-padded to vec4s: one copy per row.
            for i in 0..n as u64 {
                let (from, to) = (at + i * dense, i * padded);
                rec.copy_from_foreign(source, from, &scratch.rows, to, dense);
            }
        }
        scratch.encode_norms(rec, n)
    };
    let chunks = || (0..b).step_by(chunk).map(move |c0| (c0, chunk.min(b - c0)));
    // First every chunk is checked, so a bad row anywhere leaves the bank untouched.
    let staging = Staging::many(gpu, "MemoryBank::enqueue::norms", f32s(chunk), 2)?;
    let record = |&(c0, n): &(usize, usize), st: &Staging| {
        let mut rec = Recorder::new(gpu, ENQUEUE);
        stage(&mut rec, c0, n)?;
        let bytes = 4 * n as u64;
        rec.read_back(&scratch.norms, 0, st, 0, bytes);
        Ok((rec.submit()?, bytes))
    };
    let deliver = |(c0, n): (usize, usize), readback: Readback<'_>| {
        let bad = readback.read::<f32, _>(gpu, n, |v| v.iter().position(|x| !x.is_finite()))?;
        match bad {
            None => Ok(()),
            Some(row) => {
                // The next chunk may have been staged since: stage this one again.
                let mut rec = Recorder::new(gpu, ENQUEUE);
                stage(&mut rec, c0, n)?;
                Err(scratch.non_finite(rec, row, c0 + row, dim)?)
            }
        }
    };
    transfer::pipelined(gpu, &staging, chunks(), record, deliver)?;
    let mut rec = Recorder::new(gpu, ENQUEUE);
    for (c0, n) in chunks() {
        // A single chunk is still staged from the check.
        if b > chunk {
            stage(&mut rec, c0, n)?;
        }
        ring.encode_copy(&mut rec, &scratch, c0, n);
    }
    rec.submit_and_wait()
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
    fn new(gpu: &GpuDevice, capacity: usize, dim4: usize) -> Result<Self> {
        let usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC;
        let uniform = wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST;
        Ok(Self {
            params: transfer::create_buffer(gpu, "MemoryBank::enqueue::params", f32s(4), uniform)?,
            // Fresh buffers are zeroed by wgpu, which the vec4 padding relies on.
            rows: transfer::create_buffer(
                gpu,
                "MemoryBank::enqueue::rows",
                f32s(capacity * dim4 * 4),
                usage,
            )?,
            norms: transfer::output(gpu, "MemoryBank::enqueue::norms", f32s(capacity))?,
            dim4,
        })
    }

    /// Records the squared norms of scratch rows `0 .. n` (sentinel-filled first when the
    /// context asks, as every kernel output).
    fn encode_norms(&self, rec: &mut Recorder<'_>, n: usize) -> Result<()> {
        rec.sentinel(&self.norms, f32s(n))?;
        let params = row_norms::Params {
            rows: n as u32,
            dim4: self.dim4 as u32,
            _pad: [0; 2],
        };
        rec.upload(&self.params, 0, &[params])?;
        let kernel = rec.gpu().kernel::<RowNorms>()?;
        kernel.encode(rec, n as u64, &self.params, &self.rows, &self.norms)
    }

    /// The error for scratch row `row` (batch row `batch_row`), whose squared norm is not
    /// finite, naming its first non-finite value (or the norm, when every value is finite).
    /// `rec` has staged the row's chunk.
    fn non_finite(
        &self,
        mut rec: Recorder<'_>,
        row: usize,
        batch_row: usize,
        dim: usize,
    ) -> Result<Error> {
        let gpu = rec.gpu();
        let width = 4 * self.dim4;
        let staging = Staging::new(gpu, "MemoryBank::enqueue::row", f32s(width))?;
        let bytes = 4 * width as u64;
        rec.read_back(&self.rows, row as u64 * bytes, &staging, 0, bytes);
        let done = rec.submit()?;
        let found = staging
            .map(&done, bytes)
            .read::<f32, _>(gpu, width, |values| {
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
