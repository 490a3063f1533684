//! The device side of a memory bank: staging a batch (host rows, or device rows imported and
//! checked) with its squared norms, and copying it into the ring of pages.

use ndarray::ArrayView2;

use crate::context::Context;
use crate::data::device_embeddings::DeviceEmbeddings;
use crate::data::device_rows::DeviceRows;
use crate::data::inputs::foreign_bank;
use crate::error::Result;
use crate::kernels::row_norms::{self, RowNorms};
use crate::runtime::device::GpuDevice;
use crate::runtime::memory::TrackedBuffer;
use crate::runtime::transfer::{self, f32s, Recorder};

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

/// Writes device embeddings `x` (validated; only rows `chosen` when given, in that order)
/// into the ring at its head: they are imported first (copied into the kernels' layout and
/// checked, one wait), so a non-finite row anywhere leaves the bank untouched; then copied
/// into the ring (one wait, after which the import is released).
pub(super) fn enqueue_device(
    gpu: &GpuDevice,
    ring: &Ring<'_>,
    x: &DeviceEmbeddings<'_>,
    chosen: Option<&[usize]>,
) -> Result<()> {
    let imported = DeviceRows::import(gpu, ENQUEUE, "embeddings", x)?;
    let rows: Vec<usize> = match chosen {
        Some(c) => c.to_vec(),
        None => (0..x.dim().0).collect(),
    };
    if rows.is_empty() {
        return Ok(());
    }
    let mut rec = Recorder::new(gpu, ENQUEUE);
    // Runs of consecutive rows, each split where the ring wraps and where pages end.
    let mut done = 0;
    while done < rows.len() {
        let start = rows[done];
        let mut run = 1;
        while done + run < rows.len() && rows[done + run] == start + run {
            run += 1;
        }
        let mut copied = 0;
        while copied < run {
            let src = start + copied;
            let (page, within) = (src / imported.page_rows(), src % imported.page_rows());
            let (page_rows, page_norms) = imported.page(page)?;
            let slot = (ring.head + done + copied) % ring.capacity;
            let n = (run - copied)
                .min(imported.page_rows() - within)
                .min(ring.capacity - slot);
            ring.rows
                .copy_in(&mut rec, page_rows, page_norms, within, slot, n);
            copied += n;
        }
        done += run;
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
}
