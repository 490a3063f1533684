//! The wgpu path of [`super::knn`]: per query chunk, distance tiles against consecutive
//! reference ranges, each merged into the chunk's running best lists by `knn_select`.
//!
//! A query chunk is recorded as one submission (each range has its own parameter buffers, up
//! to [`PARAM_SLOTS`]; past that, and when streamed rows are rewritten, the recording is
//! flushed without waiting) and its lists are read while the next chunk runs: one host wait
//! per query chunk.
//!
//! References are read where they are: a memory bank's resident pages, host references
//! uploaded once when they fit the budget next to the tiles, or else streamed through one
//! chunk buffer per reference range (re-uploaded for every query chunk).

use ndarray::ArrayView2;

use super::{sort_rows, KnnConfig, Neighbours, OP};
use crate::context::oom_retry;
use crate::context::plan::{plan_tiles, DeviceCaps, Footprint, Plan, TilePlan};
use crate::context::Context;
use crate::data::device_output::DeviceArray;
use crate::data::device_rows::{max_page_rows, rows_bytes, DeviceRows};
use crate::data::inputs::{self, Embeddings, Rows};
use crate::error::{Error, Result};
use crate::hooks::Reporter;
use crate::kernels::distance::DistanceTile;
use crate::kernels::distance_tile::{self, TileBuffers};
use crate::kernels::knn_select::{self, KnnSelect, SelectBuffers, SLOT_BYTES};
use crate::kernels::knn_sort::{self, KnnSort, SortBuffers};
use crate::kernels::row_norms::{self, RowNorms};
use crate::runtime::device::GpuDevice;
use crate::runtime::memory::TrackedBuffer;
use crate::runtime::transfer::{
    self, f32s, uniform_size, Readback, Recorder, Staging, SENTINEL_BITS,
};

/// Most references per range: bounds the `(rows, cols)` distance block so that rows stay many.
const MAX_COLS: usize = 16_384;

/// Where the references come from.
enum Source<'a> {
    /// Resident pages (a bank's, or host references uploaded for this call), `len` rows.
    Resident { rows: &'a DeviceRows, len: usize },
    /// Host rows streamed through a chunk buffer.
    Streamed(ArrayView2<'a, f32>),
}

/// Parameter buffers per kind (tile, select) that one chunk's ranges cycle through: a chunk
/// of up to this many ranges is one submission.
const PARAM_SLOTS: usize = 64;

/// Sizes of every buffer one query chunk uses; the plan and the allocations both come from it.
#[derive(Clone, Copy)]
struct Layout {
    rows: usize,
    cols: usize,
    dim4: usize,
    k: usize,
    streamed: bool,
    /// The lists are sorted into device outputs (two `(rows, k)` arrays copied into the
    /// call's result) instead of read back through two staging buffers of the same bytes.
    on_device: bool,
    /// References, and the pages they lie in (ranges never cross a page).
    refs: usize,
    pages: usize,
}

impl Layout {
    /// Parameter slots: one per range of a chunk, at most [`PARAM_SLOTS`]. Ranges of `cols`
    /// over `pages` pages number at most `ceil(refs / cols) + pages - 1`.
    fn slots(&self) -> usize {
        (self.refs.div_ceil(self.cols.max(1)) + self.pages.saturating_sub(1)).clamp(1, PARAM_SLOTS)
    }

    fn buffers(&self) -> Vec<u64> {
        let (r, c, k) = (self.rows, self.cols, self.k);
        let best = transfer::buffer_size(r as u64 * k as u64 * SLOT_BYTES);
        let mut sizes: Vec<u64> = vec![
            uniform_size::<row_norms::Params>(),
            f32s(r * self.dim4 * 4), // queries
            f32s(r),                 // query norms
            f32s(r),                 // excluded
            f32s(r * c),             // distance block
            best,                    // running lists, ping
            best,                    // and pong
        ];
        if self.on_device {
            // The sorted indices and scores, before they are copied into the result.
            sizes.extend([f32s(r * k), f32s(r * k)]);
            sizes.push(uniform_size::<knn_sort::Params>());
        } else {
            // Staging, twice: a chunk is read while the next runs.
            sizes.extend([best, best]);
        }
        for _ in 0..self.slots() {
            sizes.extend([
                uniform_size::<distance_tile::Params>(),
                uniform_size::<knn_select::Params>(),
            ]);
        }
        if self.streamed {
            sizes.push(uniform_size::<row_norms::Params>());
            sizes.extend([f32s(c * self.dim4 * 4), f32s(c)]);
        }
        sizes
    }

    fn footprint(&self) -> Footprint {
        let sizes = self.buffers();
        Footprint {
            bytes: sizes.iter().sum(),
            largest_buffer: sizes.iter().copied().max().unwrap_or(0),
            workgroups: (self.rows as u64)
                .div_ceil(distance_tile::BLOCK)
                .max((self.cols as u64).div_ceil(distance_tile::BLOCK)),
            workgroup_storage: distance_tile::WORKGROUP_STORAGE.max(knn_select::WORKGROUP_STORAGE),
        }
    }
}

/// The chunk: as many references per range as fit next to 64 query rows (a distance tile's
/// side), then as many rows as fit; when not even one range of 64 references fits 64 rows
/// (large `k`), rows give way first so that ranges stay at least 64 wide.
fn chunk(
    q: usize,
    cols: usize,
    layout: &Layout,
    budget: u64,
    caps: &DeviceCaps,
) -> Result<TilePlan> {
    let cost = |rows, cols| {
        Layout {
            rows,
            cols,
            ..*layout
        }
        .footprint()
    };
    let side = distance_tile::BLOCK as usize;
    let balanced = plan_tiles(OP, q, cols, side, budget, caps, cost)?;
    if balanced.cols >= side.min(cols) {
        return Ok(balanced);
    }
    let wide = plan_tiles(OP, q, cols, 1, budget, caps, cost)?;
    Ok(if wide.cols > balanced.cols {
        wide
    } else {
        balanced
    })
}

/// What a search on the device does: its chunk, and whether host references are uploaded
/// once (`resident`: the bytes of their pages) or streamed through a chunk buffer.
pub(super) struct GpuPlan {
    tile: TilePlan,
    /// The layout the chunk was planned with (rows and columns are the tile's).
    layout: Layout,
    streamed: bool,
    resident: u64,
    /// Bytes of the smallest search: one query row against one streamed reference.
    min_bytes: u64,
}

impl GpuPlan {
    pub(super) fn public(&self, q: usize, n: usize) -> Plan {
        let mut plan = self.tile.public(q, n, self.min_bytes);
        plan.bytes += self.resident;
        plan
    }
}

/// Plans a search of `q` queries of `d` floats against `refs`, for `k` neighbours, under the
/// budget available now, its lists read back or (`on_device`) sorted on the device. Host
/// references stay resident when they and a chunk of at least 64 rows (or all queries) fit;
/// otherwise streaming keeps the budget for the tiles.
pub(super) fn plan(
    ctx: &Context,
    gpu: &GpuDevice,
    (q, d): (usize, usize),
    refs: &Embeddings<'_>,
    k: usize,
    on_device: bool,
) -> Result<GpuPlan> {
    let dim4 = d.div_ceil(4);
    let caps = DeviceCaps::from_limits(&gpu.limits);
    let available = oom_retry::planning_budget(ctx);
    let layout = |streamed, refs, pages| Layout {
        rows: 1,
        cols: 1,
        dim4,
        k,
        streamed,
        on_device,
        refs,
        pages,
    };
    let planned = |tile: TilePlan, layout: Layout| Layout {
        rows: tile.rows,
        cols: tile.cols,
        ..layout
    };
    match refs {
        Embeddings::Bank(bank) => {
            let rows = bank.view.rows;
            let n = bank.view.len;
            let cols = n.min(rows.page_rows()).min(MAX_COLS);
            let base = layout(false, n, rows.pages_for(n));
            let tile = chunk(q, cols, &base, available, &caps)?;
            Ok(GpuPlan {
                tile,
                layout: planned(tile, base),
                streamed: false,
                resident: 0,
                min_bytes: base.footprint().bytes,
            })
        }
        Embeddings::Host(x) => {
            let n = x.nrows();
            let page_rows = max_page_rows(OP, &caps, dim4)?;
            let streamed = layout(true, n, 1);
            let min_bytes = streamed.footprint().bytes;
            // The pages, and the norm kernel's parameters that the upload holds per page.
            let pages = n.div_ceil(page_rows);
            let resident =
                rows_bytes(n, dim4, page_rows) + pages as u64 * uniform_size::<row_norms::Params>();
            let cols = n.min(page_rows).min(MAX_COLS);
            if let Some(left) = available.checked_sub(resident) {
                let base = layout(false, n, pages);
                if let Ok(tile) = chunk(q, cols, &base, left, &caps) {
                    if tile.rows >= q.min(distance_tile::BLOCK as usize) {
                        return Ok(GpuPlan {
                            tile,
                            layout: planned(tile, base),
                            streamed: false,
                            resident,
                            min_bytes,
                        });
                    }
                }
            }
            let tile = chunk(q, cols, &streamed, available, &caps)?;
            Ok(GpuPlan {
                tile,
                layout: planned(tile, streamed),
                streamed: true,
                resident: 0,
                min_bytes,
            })
        }
        Embeddings::Device(_) => Err(inputs::unimported(OP)),
    }
}

/// See the module documentation; inputs are validated, `q ≥ 1`, `k ≥ 1`. The lists come back
/// to the host (`Output::Host`, returned) or are sorted into device arrays.
pub(super) fn search(
    ctx: &Context,
    gpu: &GpuDevice,
    queries: Rows<'_>,
    refs: Embeddings<'_>,
    job: Job<'_>,
) -> Result<Neighbours> {
    let cfg = job.cfg;
    let on_device = matches!(job.output, Output::Device { .. });
    let plan = plan(ctx, gpu, queries.dim(), &refs, cfg.k, on_device)?;
    match refs {
        Embeddings::Bank(bank) => {
            let source = Source::Resident {
                rows: bank.view.rows,
                len: bank.view.len,
            };
            run(gpu, queries, &source, &plan.layout, &job)
        }
        Embeddings::Host(x) if !plan.streamed => {
            let rows = DeviceRows::upload(gpu, x)?;
            let source = Source::Resident {
                rows: &rows,
                len: x.nrows(),
            };
            run(gpu, queries, &source, &plan.layout, &job)
        }
        Embeddings::Host(x) => run(gpu, queries, &Source::Streamed(x), &plan.layout, &job),
        Embeddings::Device(_) => Err(inputs::unimported(OP)),
    }
}

/// The buffers of one search, allocated once and reused by every query chunk.
struct Buffers {
    norm_params: TrackedBuffer,
    /// Per range slot: the distance tile's and the selection's parameters.
    params: Vec<(TrackedBuffer, TrackedBuffer)>,
    /// The chunk's query rows and their norms (one page).
    queries: DeviceRows,
    excluded: TrackedBuffer,
    block: TrackedBuffer,
    best: [TrackedBuffer; 2],
    /// Host output: two staging buffers (a chunk is read while the next runs).
    staging: Vec<Staging>,
    /// Device output: the sort's parameters and the chunk's sorted indices and scores.
    sorted: Option<(TrackedBuffer, TrackedBuffer, TrackedBuffer)>,
    /// Streaming only: the chunk's rows (one page) and its norm parameters.
    stream: Option<(DeviceRows, TrackedBuffer)>,
}

impl Buffers {
    fn new(gpu: &GpuDevice, layout: &Layout, d: usize) -> Result<Self> {
        let (r, c, k) = (layout.rows, layout.cols, layout.k);
        let uniform = |label, size| {
            let usage = wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST;
            transfer::create_buffer(gpu, label, size, usage)
        };
        let input = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
        let best_bytes = r as u64 * k as u64 * SLOT_BYTES;
        let stream = if layout.streamed {
            Some((
                DeviceRows::new(gpu, c, d, c)?,
                uniform(
                    "knn::stream_norm_params",
                    uniform_size::<row_norms::Params>(),
                )?,
            ))
        } else {
            None
        };
        let mut params = Vec::with_capacity(layout.slots());
        for _ in 0..layout.slots() {
            params.push((
                uniform("knn::tile_params", uniform_size::<distance_tile::Params>())?,
                uniform("knn::select_params", uniform_size::<knn_select::Params>())?,
            ));
        }
        Ok(Self {
            norm_params: uniform("knn::norm_params", uniform_size::<row_norms::Params>())?,
            params,
            queries: DeviceRows::new(gpu, r, d, r)?,
            excluded: transfer::create_buffer(gpu, "knn::excluded", f32s(r), input)?,
            block: transfer::output(gpu, "knn::block", f32s(r * c))?,
            best: [
                transfer::output(gpu, "knn::best", best_bytes)?,
                transfer::output(gpu, "knn::best", best_bytes)?,
            ],
            staging: if layout.on_device {
                Vec::new()
            } else {
                Staging::many(gpu, "knn::staging", best_bytes, 2)?
            },
            sorted: if layout.on_device {
                Some((
                    uniform("knn::sort_params", uniform_size::<knn_sort::Params>())?,
                    transfer::output(gpu, "knn::sorted_indices", f32s(r * k))?,
                    transfer::output(gpu, "knn::sorted_scores", f32s(r * k))?,
                ))
            } else {
                None
            },
            stream,
        })
    }
}

/// Where a search's sorted lists go.
#[derive(Clone, Copy)]
pub(super) enum Output<'a> {
    /// Read back and sorted on the host.
    Host,
    /// Sorted on the device (`knn_sort`) into these `(q, k)` arrays.
    Device {
        indices: &'a DeviceArray<u32>,
        scores: &'a DeviceArray<f32>,
    },
}

/// What one search asks for, whom it tells how far it got, and where its lists go.
pub(super) struct Job<'a> {
    pub(super) cfg: &'a KnnConfig,
    /// Per query, the reference it must not find (itself), or `u32::MAX`.
    pub(super) excluded: &'a [u32],
    pub(super) report: &'a Reporter<'a>,
    pub(super) output: Output<'a>,
}

/// One reference range: global first index, rows, and where its rows lie (a page of the
/// resident rows, at `row0`; streamed ranges are filled into page 0 of the chunk buffer).
#[derive(Clone, Copy)]
struct Range {
    start: usize,
    cols: usize,
    page: usize,
    row0: usize,
}

/// The ranges of `n` references at most `cols` wide, split where `source`'s pages end; the
/// same for every query chunk.
fn ranges(source: &Source<'_>, n: usize, cols: usize) -> Vec<Range> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < n {
        let range = match source {
            Source::Resident { rows: store, .. } => {
                let (page, row0) = (start / store.page_rows(), start % store.page_rows());
                let in_page = store.page_rows() - row0;
                Range {
                    start,
                    cols: cols.min(n - start).min(in_page),
                    page,
                    row0,
                }
            }
            Source::Streamed(_) => Range {
                start,
                cols: cols.min(n - start),
                page: 0,
                row0: 0,
            },
        };
        out.push(range);
        start += range.cols.max(1);
    }
    out
}

fn run(
    gpu: &GpuDevice,
    queries: Rows<'_>,
    source: &Source<'_>,
    layout: &Layout,
    job: &Job<'_>,
) -> Result<Neighbours> {
    let (cfg, excluded) = (job.cfg, job.excluded);
    let (q, d) = queries.dim();
    let (k, dim4) = (cfg.k, d.div_ceil(4));
    let largest = cfg.distance.distance.is_similarity();
    let b = Buffers::new(gpu, layout, d)?;
    let norms = gpu.kernel::<RowNorms>()?;
    let tile = gpu.kernel::<DistanceTile>()?;
    let select = gpu.kernel::<KnnSelect>()?;
    let n = match source {
        Source::Resident { len, .. } => *len,
        Source::Streamed(x) => x.nrows(),
    };
    let ranges = ranges(source, n, layout.cols);
    let mut out = match job.output {
        Output::Host => Neighbours::empty(q, k),
        Output::Device { .. } => Neighbours::empty(0, k),
    };
    let chunks = (0..q)
        .step_by(layout.rows)
        .map(|r0| (r0, layout.rows.min(q - r0)));
    // Records a chunk's search into `rec`; returns which running list holds its result.
    let search = |rec: &mut Recorder<'_>, (r0, rows): (usize, usize)| -> Result<usize> {
        job.report.check()?;
        rec.upload(&b.excluded, 0, &excluded[r0..r0 + rows])?;
        b.queries
            .fill(rec, &norms, &b.norm_params, queries, r0, rows)?;
        let (query_rows, query_norms) = b.queries.page(0)?;
        let best_bytes = rows as u64 * k as u64 * SLOT_BYTES;
        let mut current = 0;
        for (i, range) in ranges.iter().enumerate() {
            let (page_rows, page_norms) = match source {
                Source::Resident { rows: store, .. } => store.page(range.page)?,
                Source::Streamed(x) => {
                    let Some((store, params)) = &b.stream else {
                        return Err(Error::Internal {
                            op: OP,
                            message: "streamed references without a chunk buffer".into(),
                        });
                    };
                    store.fill(rec, &norms, params, Rows::Host(*x), range.start, range.cols)?;
                    store.page(0)?
                }
            };
            let (tile_params, select_params) = &b.params[i % b.params.len()];
            let params = distance_tile::Params {
                rows: rows as u32,
                cols: range.cols as u32,
                dim4: dim4 as u32,
                metric: cfg.distance.distance.code(),
                normalize: u32::from(cfg.distance.normalizes()),
                out_stride: range.cols as u32,
                out_col0: 0,
                ref_row0: range.row0 as u32,
            };
            rec.upload(tile_params, 0, &[params])?;
            rec.sentinel(&b.block, f32s(rows * range.cols))?;
            tile.encode(
                rec,
                &params,
                &TileBuffers {
                    params: tile_params,
                    queries: query_rows,
                    refs: page_rows,
                    query_sq_norms: query_norms,
                    ref_sq_norms: page_norms,
                    out: &b.block,
                },
            )?;
            let params = knn_select::Params {
                rows: rows as u32,
                cols: range.cols as u32,
                block_stride: range.cols as u32,
                k: k as u32,
                best_len: if i == 0 { 0 } else { k as u32 },
                col_base: range.start as u32,
                largest: u32::from(largest),
                _pad: 0,
            };
            rec.upload(select_params, 0, &[params])?;
            rec.sentinel(&b.best[1 - current], best_bytes)?;
            select.encode(
                rec,
                rows as u64,
                &SelectBuffers {
                    params: select_params,
                    block: &b.block,
                    best_in: &b.best[current],
                    excluded: &b.excluded,
                    best_out: &b.best[1 - current],
                },
            )?;
            current = 1 - current;
        }
        Ok(current)
    };
    let deliver = |(r0, rows): (usize, usize), readback: Readback<'_>| {
        let mut pairs: Vec<[u32; 2]> = readback.read::<u32, _>(gpu, 2 * rows * k, |v| {
            v.chunks_exact(2).map(|p| [p[0], p[1]]).collect()
        })?;
        if let Some(bad) = pairs.iter().position(|p| p[1] == SENTINEL_BITS) {
            return Err(Error::Internal {
                op: OP,
                message: format!("slot {bad} of query chunk {r0} was never written"),
            });
        }
        sort_rows(&mut pairs, k, largest, &mut out, r0);
        job.report.add(rows as u64 * n as u64);
        Ok(())
    };
    match job.output {
        Output::Host => {
            let record = |&chunk: &(usize, usize), st: &Staging| {
                let mut rec = Recorder::new(gpu, OP);
                let current = search(&mut rec, chunk)?;
                let best_bytes = chunk.1 as u64 * k as u64 * SLOT_BYTES;
                rec.read_back(&b.best[current], 0, st, 0, best_bytes);
                Ok((rec.submit()?, best_bytes))
            };
            transfer::pipelined(gpu, &b.staging, chunks, record, deliver)?;
        }
        Output::Device { indices, scores } => {
            let (params, sorted_indices, sorted_scores) =
                b.sorted.as_ref().ok_or_else(|| Error::Internal {
                    op: OP,
                    message: "device output without sort buffers".into(),
                })?;
            let sort = gpu.kernel::<KnnSort>()?;
            let chunks: Vec<(usize, usize)> = chunks.collect();
            for (i, &(r0, rows)) in chunks.iter().enumerate() {
                let mut rec = Recorder::new(gpu, OP);
                let current = search(&mut rec, (r0, rows))?;
                let p = knn_sort::Params {
                    rows: rows as u32,
                    k: k as u32,
                    largest: u32::from(largest),
                    _pad: 0,
                };
                rec.upload(params, 0, &[p])?;
                let bytes = f32s(rows * k);
                rec.sentinel(sorted_indices, bytes)?;
                rec.sentinel(sorted_scores, bytes)?;
                sort.encode(
                    &mut rec,
                    rows as u64,
                    &SortBuffers {
                        params,
                        lists: &b.best[current],
                        indices: sorted_indices,
                        scores: sorted_scores,
                    },
                )?;
                let (at, bytes) = (4 * (r0 * k) as u64, 4 * (rows * k) as u64);
                rec.copy(sorted_indices, 0, indices.tracked(), at, bytes);
                rec.copy(sorted_scores, 0, scores.tracked(), at, bytes);
                // Submitted before the next chunk's uploads are queued (they land before the
                // next submission). The last one is waited for, reading nothing: the call's
                // buffers are idle when it returns and frees them, and a lost device is this
                // call's error.
                if i + 1 == chunks.len() {
                    rec.submit_and_wait()?;
                } else {
                    rec.submit()?;
                }
                job.report.add(rows as u64 * n as u64);
            }
        }
    }
    Ok(out)
}
