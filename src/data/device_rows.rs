//! Reference rows resident on a device: embeddings split into pages that each fit one storage
//! binding, with their squared norms.
//!
//! The triplet miner uploads host references into one of these once per call; a
//! [`crate::MemoryBank`] owns one for its whole life, so mining against the bank re-uploads
//! nothing but labels. Rows are stored zero-padded to `vec4`s, as every kernel reads them.

use ndarray::{Array2, ArrayView2};

use crate::context::plan::DeviceCaps;
use crate::data::device_embeddings::DeviceEmbeddings;
use crate::error::{Error, Result};
use crate::kernels::distance_tile;
use crate::kernels::row_norms::{self, RowNorms};
use crate::runtime::device::{checked, GpuDevice};
use crate::runtime::memory::TrackedBuffer;
use crate::runtime::transfer::{self, f32s, uniform_size, Recorder, Staging};

/// One page: `rows` padded embeddings and their squared norms.
struct Page {
    embeddings: TrackedBuffer,
    norms: TrackedBuffer,
    rows: usize,
}

/// Rows `(capacity, dim)` on one device, in pages of `page_rows` rows.
pub(crate) struct DeviceRows {
    /// [`GpuDevice::serial`] of the device holding the pages.
    device: u64,
    dim: usize,
    dim4: usize,
    page_rows: usize,
    capacity: usize,
    pages: Vec<Page>,
}

impl std::fmt::Debug for DeviceRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceRows")
            .field("dim", &self.dim)
            .field("capacity", &self.capacity)
            .field("page_rows", &self.page_rows)
            .field("pages", &self.pages.len())
            .finish()
    }
}

/// Largest page for rows of `dim4` vec4s on `caps`: one storage binding and one buffer per
/// page, and the page's columns within one distance-tile dispatch.
///
/// # Errors
/// [`Error::DeviceLimit`] when not even one row fits a binding.
pub(crate) fn max_page_rows(op: &'static str, caps: &DeviceCaps, dim4: usize) -> Result<usize> {
    let row_bytes = 16 * dim4.max(1) as u64;
    let per_buffer = caps.max_storage_binding.min(caps.max_buffer_size);
    if row_bytes > per_buffer {
        return Err(Error::DeviceLimit {
            op,
            what: "max_storage_buffer_binding_size",
            requested: row_bytes,
            limit: per_buffer,
        });
    }
    let by_grid = distance_tile::BLOCK * u64::from(caps.max_workgroups_per_dimension);
    Ok((per_buffer / row_bytes)
        .min(by_grid)
        .min(u64::from(u32::MAX)) as usize)
}

/// Device bytes of `capacity` rows of `dim4` vec4s in pages of `page_rows`.
pub(crate) fn rows_bytes(capacity: usize, dim4: usize, page_rows: usize) -> u64 {
    let page_rows = page_rows.max(1);
    let full = capacity / page_rows;
    let last = capacity % page_rows;
    let page = |rows: usize| f32s(rows * dim4 * 4) + f32s(rows);
    full as u64 * page(page_rows) + if last > 0 { page(last) } else { 0 }
}

impl DeviceRows {
    /// Allocates `capacity` zeroed rows of `dim` floats in pages of `page_rows`.
    pub(crate) fn new(
        gpu: &GpuDevice,
        capacity: usize,
        dim: usize,
        page_rows: usize,
    ) -> Result<Self> {
        let dim4 = dim.div_ceil(4);
        let page_rows = page_rows.max(1);
        let usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC;
        let mut pages = Vec::with_capacity(capacity.div_ceil(page_rows));
        for start in (0..capacity).step_by(page_rows) {
            let rows = page_rows.min(capacity - start);
            pages.push(Page {
                embeddings: transfer::create_buffer(
                    gpu,
                    "device_rows::embeddings",
                    f32s(rows * dim4 * 4),
                    usage,
                )?,
                norms: transfer::create_buffer(gpu, "device_rows::norms", f32s(rows), usage)?,
                rows,
            });
        }
        Ok(Self {
            device: gpu.serial,
            dim,
            dim4,
            page_rows,
            capacity,
            pages,
        })
    }

    /// Uploads `x` `(n, d)` (validated) into pages as large as the device allows, and computes
    /// the squared norms of every page: one submission, no wait (later work on the queue runs
    /// after it).
    pub(crate) fn upload(gpu: &GpuDevice, x: ArrayView2<'_, f32>) -> Result<Self> {
        let (n, dim) = x.dim();
        let dim4 = dim.div_ceil(4);
        let caps = DeviceCaps::from_limits(&gpu.limits);
        let rows = Self::new(gpu, n, dim, max_page_rows("upload", &caps, dim4)?)?;
        let norms = gpu.kernel::<RowNorms>()?;
        let mut rec = Recorder::new(gpu, "device_rows::upload");
        let mut params = Vec::with_capacity(rows.pages.len());
        for (p, page) in rows.pages.iter().enumerate() {
            let start = p * rows.page_rows;
            let padded = transfer::padded_rows(x, start, page.rows, dim4);
            rec.upload(&page.embeddings, 0, &padded)?;
            params.push(transfer::uniform(
                gpu,
                "device_rows::norm_params",
                &row_norms::Params {
                    rows: page.rows as u32,
                    dim4: dim4 as u32,
                    _pad: [0; 2],
                },
            )?);
        }
        for (page, params) in rows.pages.iter().zip(&params) {
            rec.sentinel(&page.norms, f32s(page.rows))?;
            norms.encode(
                &mut rec,
                page.rows as u64,
                params,
                &page.embeddings,
                &page.norms,
            )?;
        }
        rec.submit()?;
        Ok(rows)
    }

    /// Floats per row (before padding).
    pub(crate) fn dim(&self) -> usize {
        self.dim
    }

    /// `vec4`s per stored row.
    pub(crate) fn dim4(&self) -> usize {
        self.dim4
    }

    /// Rows per page (the last page may hold fewer).
    pub(crate) fn page_rows(&self) -> usize {
        self.page_rows
    }

    /// Pages holding the first `len` rows.
    pub(crate) fn pages_for(&self, len: usize) -> usize {
        len.min(self.capacity).div_ceil(self.page_rows)
    }

    /// Page `p`'s embeddings and squared norms, for binding.
    pub(crate) fn page(&self, p: usize) -> Result<(&TrackedBuffer, &TrackedBuffer)> {
        let page = self.pages.get(p).ok_or_else(|| Error::Internal {
            op: "device_rows",
            message: format!("page {p} of {}", self.pages.len()),
        })?;
        Ok((&page.embeddings, &page.norms))
    }

    /// Every page in order: `(first row, rows, embeddings, squared norms)`.
    pub(crate) fn pages(
        &self,
    ) -> impl Iterator<Item = (usize, usize, &TrackedBuffer, &TrackedBuffer)> + '_ {
        self.pages
            .iter()
            .enumerate()
            .map(|(p, page)| (p * self.page_rows, page.rows, &page.embeddings, &page.norms))
    }

    /// Writes rows `x[start .. start + count]` into rows `0 .. count` of the first page with
    /// their squared norms: host rows are uploaded and their norms recorded into `rec`
    /// (`params` is the norm kernel's uniform buffer, rewritten here); resident rows are
    /// copied on the device, norms included.
    pub(crate) fn fill(
        &self,
        rec: &mut Recorder<'_>,
        norms: &RowNorms,
        params: &TrackedBuffer,
        x: Rows<'_>,
        start: usize,
        count: usize,
    ) -> Result<()> {
        let (embeddings, page_norms) = self.page(0)?;
        stage(
            rec,
            norms,
            params,
            x,
            start,
            count,
            (embeddings, page_norms),
        )
    }

    /// Whether these rows live on `gpu`'s device (binding them elsewhere is a wgpu fault).
    pub(crate) fn is_on(&self, gpu: &GpuDevice) -> bool {
        self.device == gpu.serial
    }

    /// Records copies of `count` padded rows (and their norms) from `src` / `src_norms`, row
    /// `src_row` on, into rows `dst_row ..` (which must not pass the capacity), split at pages.
    pub(crate) fn copy_in(
        &self,
        rec: &mut Recorder<'_>,
        src: &TrackedBuffer,
        src_norms: &TrackedBuffer,
        src_row: usize,
        dst_row: usize,
        count: usize,
    ) {
        let row_bytes = 16 * self.dim4 as u64;
        let mut done = 0;
        while done < count {
            let row = dst_row + done;
            let (p, within) = (row / self.page_rows, row % self.page_rows);
            let Some(page) = self.pages.get(p) else {
                return;
            };
            let n = (page.rows - within).min(count - done);
            let from = (src_row + done) as u64;
            rec.copy(
                src,
                from * row_bytes,
                &page.embeddings,
                within as u64 * row_bytes,
                n as u64 * row_bytes,
            );
            rec.copy(
                src_norms,
                from * 4,
                &page.norms,
                within as u64 * 4,
                n as u64 * 4,
            );
            done += n;
        }
    }

    /// Records copies of rows `src_row .. src_row + count` (and their norms), split at pages,
    /// into rows `0 .. count` of `dst` / `dst_norms` (laid out as these rows).
    pub(crate) fn copy_out(
        &self,
        rec: &mut Recorder<'_>,
        src_row: usize,
        count: usize,
        dst: &TrackedBuffer,
        dst_norms: &TrackedBuffer,
    ) -> Result<()> {
        let row_bytes = 16 * self.dim4 as u64;
        let mut done = 0;
        while done < count {
            let row = src_row + done;
            let (p, within) = (row / self.page_rows, row % self.page_rows);
            let page = self.pages.get(p).ok_or_else(|| Error::Internal {
                op: "device_rows::copy_out",
                message: format!("row {row} past {} pages", self.pages.len()),
            })?;
            let n = (page.rows - within).min(count - done);
            let to = done as u64;
            rec.copy(
                &page.embeddings,
                within as u64 * row_bytes,
                dst,
                to * row_bytes,
                n as u64 * row_bytes,
            );
            rec.copy(
                &page.norms,
                within as u64 * 4,
                dst_norms,
                to * 4,
                n as u64 * 4,
            );
            done += n;
        }
        Ok(())
    }

    /// `(n, d)` rows sized as [`Self::import`] would make them, with nothing allocated: for
    /// plans, which read only their shape.
    pub(crate) fn unallocated(
        op: &'static str,
        gpu: &GpuDevice,
        (n, dim): (usize, usize),
    ) -> Result<Self> {
        let dim4 = dim.div_ceil(4);
        let caps = DeviceCaps::from_limits(&gpu.limits);
        Ok(Self {
            device: gpu.serial,
            dim,
            dim4,
            page_rows: max_page_rows(op, &caps, dim4)?,
            capacity: n,
            pages: Vec::new(),
        })
    }

    /// Device bytes of an import of these rows: `(held, transient)`, the pages (held for the
    /// call) and, only while importing, the norm parameters of every page and the staging
    /// buffer the norms are checked through.
    pub(crate) fn import_bytes(&self) -> (u64, u64) {
        let pages = self.capacity.div_ceil(self.page_rows) as u64;
        (
            rows_bytes(self.capacity, self.dim4, self.page_rows),
            pages * uniform_size::<row_norms::Params>() + f32s(self.capacity),
        )
    }

    /// Copies embeddings `x` (validated) from their buffer into rows of the kernels' layout
    /// (pages of zero-padded `vec4` rows) and computes their squared norms, all on the device;
    /// then reads the norms back (4 bytes per row, one wait) to reject a non-finite row before
    /// any work uses it.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] when `x`'s buffer is not usable on this device (another
    /// device's, or destroyed); [`Error::NonFinite`] naming the first non-finite value (or
    /// [`Error::InvalidParameter`] for a row whose squared norm overflows); budget and device
    /// errors.
    pub(crate) fn import(
        gpu: &GpuDevice,
        op: &'static str,
        what: &'static str,
        x: &DeviceEmbeddings<'_>,
    ) -> Result<Self> {
        let (n, dim) = x.dim();
        let dim4 = dim.div_ceil(4);
        let caps = DeviceCaps::from_limits(&gpu.limits);
        let rows = Self::new(gpu, n, dim, max_page_rows(op, &caps, dim4)?)?;
        let Some(first) = rows.pages.first() else {
            return Ok(rows);
        };
        let foreign = (x.buffer(), x.offset());
        let into = (first.embeddings.buffer(), 0);
        probe(gpu, (op, what), foreign, into, x.buffer())?;
        let norms = gpu.kernel::<RowNorms>()?;
        let staging = Staging::new(gpu, "device_rows::import_norms", f32s(n))?;
        let stride = 4 * x.row_stride() as u64;
        let (dense, padded) = (4 * dim as u64, 16 * dim4 as u64);
        let contiguous = stride == dense && dense == padded;
        let mut rec = Recorder::new(gpu, op);
        let mut params = Vec::with_capacity(rows.pages.len());
        for (start, count, embeddings, page_norms) in rows.pages() {
            let from = x.offset() + start as u64 * stride;
            if contiguous {
                rec.copy_from_foreign(x.buffer(), from, embeddings, 0, count as u64 * dense);
            } else {
                // Rows are zero-padded to vec4s (fresh buffers are zeroed): one copy per row.
                for i in 0..count as u64 {
                    rec.copy_from_foreign(
                        x.buffer(),
                        from + i * stride,
                        embeddings,
                        i * padded,
                        dense,
                    );
                }
            }
            params.push(transfer::uniform(
                gpu,
                "device_rows::import_params",
                &row_norms::Params {
                    rows: count as u32,
                    dim4: dim4 as u32,
                    _pad: [0; 2],
                },
            )?);
            let page_params = params.last().ok_or_else(|| Error::Internal {
                op,
                message: "no parameters for a page".into(),
            })?;
            rec.sentinel(page_norms, f32s(count))?;
            norms.encode(&mut rec, count as u64, page_params, embeddings, page_norms)?;
            rec.read_back(page_norms, 0, &staging, 4 * start as u64, 4 * count as u64);
        }
        let done = rec.submit()?;
        let bad = staging
            .map(&done, f32s(n).min(4 * n as u64))
            .read::<f32, _>(gpu, n, |v| v.iter().position(|s| !s.is_finite()))?;
        match bad {
            None => Ok(rows),
            Some(row) => Err(rows.non_finite(gpu, op, what, row)?),
        }
    }

    /// The error for row `row`, whose squared norm is not finite: its first non-finite value,
    /// or the overflowing norm when every value is finite.
    fn non_finite(
        &self,
        gpu: &GpuDevice,
        op: &'static str,
        what: &'static str,
        row: usize,
    ) -> Result<Error> {
        let (p, within) = (row / self.page_rows, row % self.page_rows);
        let (embeddings, _) = self.page(p)?;
        let width = 4 * self.dim4;
        let bytes = 4 * width as u64;
        let staging = Staging::new(gpu, "device_rows::import_row", bytes)?;
        let mut rec = Recorder::new(gpu, op);
        rec.read_back(embeddings, within as u64 * bytes, &staging, 0, bytes);
        let done = rec.submit()?;
        let dim = self.dim;
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
                op,
                what,
                row,
                col,
                value,
            },
            None => Error::InvalidParameter {
                op,
                what,
                value: format!("row {row}"),
                rule: "its squared norm must be finite (every value below ~1.8e19)",
            },
        })
    }

    /// The first `len` rows `(len, dim)` read back to the host, page by page through one
    /// staging buffer of at most one page (one wait per page).
    pub(crate) fn read(&self, gpu: &GpuDevice, len: usize) -> Result<Array2<f32>> {
        let width = 4 * self.dim4;
        let mut out = Array2::zeros((len, self.dim));
        let used = self.pages_for(len);
        if used == 0 {
            return Ok(out);
        }
        let staging = Staging::new(
            gpu,
            "device_rows::read",
            f32s(self.page_rows.min(len) * width),
        )?;
        for (p, page) in self.pages[..used].iter().enumerate() {
            let start = p * self.page_rows;
            let rows = page.rows.min(len - start);
            let bytes = 4 * (rows * width) as u64;
            let mut rec = Recorder::new(gpu, "device_rows::read");
            rec.read_back(&page.embeddings, 0, &staging, 0, bytes);
            let done = rec.submit()?;
            staging
                .map(&done, bytes)
                .read::<f32, _>(gpu, rows * width, |values| {
                    let rows = out.slice_mut(ndarray::s![start..start + rows, ..]);
                    transfer::unpad_rows_into(values, self.dim4, rows);
                })?;
        }
        Ok(out)
    }
}

/// Records rows `x[start .. start + count]` into rows `0 .. count` of `to` with their squared
/// norms into `to_norms` (laid out as device rows: zero-padded `vec4`s): host rows are uploaded
/// and their norms computed (`params`: the norm kernel's uniform buffer, rewritten here);
/// resident rows are copied on the device, norms included.
pub(crate) fn stage(
    rec: &mut Recorder<'_>,
    norms: &RowNorms,
    params: &TrackedBuffer,
    x: Rows<'_>,
    start: usize,
    count: usize,
    (to, to_norms): (&TrackedBuffer, &TrackedBuffer),
) -> Result<()> {
    let x = match x {
        Rows::Resident(src) => return src.rows.copy_out(rec, start, count, to, to_norms),
        Rows::Host(x) => x,
    };
    let dim4 = x.ncols().div_ceil(4);
    rec.upload(to, 0, &transfer::padded_rows(x, start, count, dim4))?;
    let p = row_norms::Params {
        rows: count as u32,
        dim4: dim4 as u32,
        _pad: [0; 2],
    };
    rec.upload(params, 0, &[p])?;
    rec.sentinel(to_norms, f32s(count))?;
    norms.encode(rec, count as u64, params, to, to_norms)
}

/// Checks, without submitting anything, that a copy of one word from `src` at `src_offset` to
/// `dst` at `dst_offset` is valid on `gpu`'s device: it is recorded under a validation scope
/// and dropped. A buffer of another device (or destroyed) is `InvalidParameter` naming `what`
/// and the application's buffer `shown`, not a failed submission.
pub(crate) fn probe(
    gpu: &GpuDevice,
    (op, what): (&'static str, &'static str),
    (src, src_offset): (&wgpu::Buffer, u64),
    (dst, dst_offset): (&wgpu::Buffer, u64),
    shown: &wgpu::Buffer,
) -> Result<()> {
    let recorded = checked(gpu, op, || {
        let mut encoder = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(op) });
        encoder.copy_buffer_to_buffer(src, src_offset, dst, dst_offset, 4);
        encoder.finish()
    });
    match recorded {
        Ok(_) => Ok(()),
        Err(Error::Wgpu { source, .. }) => {
            log::debug!("{op}: {what} unusable on {}: {source}", gpu.info.name);
            Err(Error::InvalidParameter {
                op,
                what,
                value: format!("{shown:?}"),
                rule: "the buffer must belong to the context's device (and not be destroyed)",
            })
        }
        Err(e) => Err(e),
    }
}

/// The first `len` rows of a [`DeviceRows`], as mining sees them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowsView<'a> {
    pub(crate) rows: &'a DeviceRows,
    pub(crate) len: usize,
}

/// One side's rows after validation, where the kernels read them: a host array (uploaded
/// chunk by chunk) or rows resident on the device (a bank's, or imported from a buffer).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Rows<'a> {
    Host(ArrayView2<'a, f32>),
    Resident(RowsView<'a>),
}

impl<'a> Rows<'a> {
    /// `(n, d)`.
    pub(crate) fn dim(&self) -> (usize, usize) {
        match self {
            Rows::Host(x) => x.dim(),
            Rows::Resident(v) => (v.len, v.rows.dim()),
        }
    }

    /// The same rows for a shorter lifetime (array views are invariant in theirs).
    pub(crate) fn reborrow(&self) -> Rows<'_> {
        match self {
            Rows::Host(x) => Rows::Host(x.view()),
            Rows::Resident(v) => Rows::Resident(*v),
        }
    }

    /// Rows.
    pub(crate) fn nrows(&self) -> usize {
        self.dim().0
    }

    /// The host array: resident rows only exist on a device, whose context never takes a
    /// host-only path; this is the typed error if one ever did.
    pub(crate) fn host(&self, op: &'static str) -> Result<ArrayView2<'a, f32>> {
        match self {
            Rows::Host(x) => Ok(*x),
            Rows::Resident(_) => Err(Error::Internal {
                op,
                message: "device-resident rows reached a host-only path".into(),
            }),
        }
    }
}
