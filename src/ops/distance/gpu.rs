//! The wgpu path of pairwise distances: 2-D tiles of queries against host references, and
//! blocks of whole rows of queries against resident rows (a memory bank's pages, imported
//! device embeddings, or the triplet miner's uploaded references) through [`DistanceRows`].
//! Queries are host rows (uploaded per tile) or resident rows (copied per tile).

use ndarray::{s, Array2, ArrayView2};

use super::Job;
use crate::context::oom_retry::{self, RowSink};
use crate::context::plan::{plan_rows, plan_tiles, DeviceCaps, Footprint, TilePlan};
use crate::data::device_rows::{stage, RowsView};
use crate::data::inputs::Rows;
use crate::error::{Error, Result};
use crate::kernels::distance::DistanceTile;
use crate::kernels::distance_tile::{self, TileBuffers};
use crate::kernels::row_norms::{self, RowNorms};
use crate::metric::DistanceConfig;
use crate::runtime::device::GpuDevice;
use crate::runtime::memory::TrackedBuffer;
use crate::runtime::transfer::{self, f32s, uniform_size, Readback, Recorder, Staging};

/// Everything alive while one `(rows, cols)` tile runs with `stagings` readback buffers;
/// mirrors the allocations of [`tiles`].
pub(crate) fn tile_footprint(rows: usize, cols: usize, dim4: usize, stagings: usize) -> Footprint {
    let mut buffers = vec![
        uniform_size::<row_norms::Params>(),
        uniform_size::<row_norms::Params>(),
        uniform_size::<distance_tile::Params>(),
        f32s(rows * dim4 * 4),
        f32s(cols * dim4 * 4),
        f32s(rows),
        f32s(cols),
        f32s(rows * cols), // out
    ];
    buffers.extend(std::iter::repeat_n(f32s(rows * cols), stagings));
    let (x, y) = DistanceTile::workgroups(rows as u64, cols as u64);
    Footprint {
        bytes: buffers.iter().sum(),
        largest_buffer: buffers.iter().copied().max().unwrap_or(0),
        workgroups: x.max(y),
        workgroup_storage: distance_tile::WORKGROUP_STORAGE,
    }
}

/// A tile (or block) plan and the staging buffers it reads back through.
pub(crate) struct Staged {
    pub(crate) tile: TilePlan,
    pub(crate) stagings: usize,
}

/// Two staging buffers (a tile is read while the next one computes) when there is a next
/// tile and the budget allows tiles as large as with one; one when a single tile covers all
/// `(rows, cols)`, or when a second buffer would make tiles smaller (under a tight budget
/// larger tiles win more than overlap does). `plan(stagings)` plans the tiles.
fn staged(
    (rows, cols): (usize, usize),
    plan: impl Fn(usize) -> Result<TilePlan>,
) -> Result<Staged> {
    let single = plan(1)?;
    if single.rows >= rows && single.cols >= cols {
        return Ok(Staged {
            tile: single,
            stagings: 1,
        });
    }
    match plan(2) {
        Ok(double) if double.rows * double.cols >= single.rows * single.cols => Ok(Staged {
            tile: double,
            stagings: 2,
        }),
        _ => Ok(Staged {
            tile: single,
            stagings: 1,
        }),
    }
}

/// The tile for `(q, n, d)`, at most `max_rows` rows, on a device with `caps` and `budget`
/// bytes available.
pub(crate) fn tile_plan(
    op: &'static str,
    (q, n, d): (usize, usize, usize),
    max_rows: usize,
    budget: u64,
    caps: &DeviceCaps,
) -> Result<Staged> {
    let dim4 = d.div_ceil(4);
    let preferred = distance_tile::BLOCK as usize;
    let rows = q.min(max_rows.max(1));
    staged((q, n), |stagings| {
        plan_tiles(op, rows, n, preferred, budget, caps, |r, c| {
            tile_footprint(r, c, dim4, stagings)
        })
    })
}

/// Receives one tile `(r0, c0, values)` of the distance matrix.
type TileSink<'s> = dyn FnMut(usize, usize, ArrayView2<'_, f32>) -> Result<()> + 's;

/// Computes the distance matrix of the job's queries against host `refs` tile by tile, row
/// tiles outermost, and hands each tile `(r0, c0, values)` to `on_tile`. Tiles are at most
/// `job.max_rows` rows; the refs stay resident when one column tile covers them (they are
/// re-uploaded per row tile otherwise). Checks for cancellation before each tile and reports
/// it when delivered.
pub(crate) fn tiles(
    job: &Job<'_>,
    gpu: &GpuDevice,
    refs: ArrayView2<'_, f32>,
    on_tile: &mut TileSink<'_>,
) -> Result<()> {
    let Job {
        op,
        ctx,
        queries,
        cfg,
        max_rows,
        report,
    } = *job;
    let (q, d) = queries.dim();
    let n = refs.nrows();
    let dim4 = d.div_ceil(4);
    let caps = DeviceCaps::from_limits(&gpu.limits);
    let Staged {
        tile: plan,
        stagings,
    } = tile_plan(
        op,
        (q, n, d),
        max_rows,
        oom_retry::planning_budget(ctx),
        &caps,
    )?;
    let norms = gpu.kernel::<RowNorms>()?;
    let tile = gpu.kernel::<DistanceTile>()?;

    let zero_norms = row_norms::Params {
        rows: 0,
        dim4: dim4 as u32,
        _pad: [0; 2],
    };
    let q_params = transfer::uniform(gpu, "pairwise_distances::query_norm_params", &zero_norms)?;
    let r_params = transfer::uniform(gpu, "pairwise_distances::ref_norm_params", &zero_norms)?;
    let tile_params = distance_tile::Params {
        rows: 0,
        cols: 0,
        dim4: dim4 as u32,
        metric: cfg.distance.code(),
        normalize: u32::from(cfg.normalizes()),
        out_stride: 0,
        out_col0: 0,
        ref_row0: 0,
    };
    let t_params = transfer::uniform(gpu, "pairwise_distances::tile_params", &tile_params)?;
    let input = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
    let q_buf = transfer::create_buffer(
        gpu,
        "pairwise_distances::queries",
        f32s(plan.rows * dim4 * 4),
        input,
    )?;
    let r_buf = transfer::create_buffer(
        gpu,
        "pairwise_distances::refs",
        f32s(plan.cols * dim4 * 4),
        input,
    )?;
    let q_norms = transfer::output(gpu, "pairwise_distances::query_norms", f32s(plan.rows))?;
    let r_norms = transfer::output(gpu, "pairwise_distances::ref_norms", f32s(plan.cols))?;
    let out_bytes = f32s(plan.rows * plan.cols);
    let out = transfer::output(gpu, "pairwise_distances::out", out_bytes)?;
    let staging = Staging::many(gpu, "pairwise_distances::staging", out_bytes, stagings)?;

    // Row tiles outermost; each tile is one submission, read while the next one runs.
    let refs_resident = plan.cols >= n;
    let tiles = (0..q).step_by(plan.rows).flat_map(|r0| {
        (0..n)
            .step_by(plan.cols)
            .map(move |c0| (r0, c0, plan.rows.min(q - r0), plan.cols.min(n - c0)))
    });
    let record = |&(r0, c0, rows, cols): &(usize, usize, usize, usize), st: &Staging| {
        report.check()?;
        let mut rec = Recorder::new(gpu, op);
        if c0 == 0 {
            stage(
                &mut rec,
                &norms,
                &q_params,
                queries,
                r0,
                rows,
                (&q_buf, &q_norms),
            )?;
        }
        // Norms are computed where their rows are uploaded; they stay valid as long as those.
        if r0 == 0 || !refs_resident {
            rec.upload(&r_buf, 0, &transfer::padded_rows(refs, c0, cols, dim4))?;
            let params = row_norms::Params {
                rows: cols as u32,
                ..zero_norms
            };
            rec.upload(&r_params, 0, &[params])?;
            rec.sentinel(&r_norms, f32s(cols))?;
            norms.encode(&mut rec, cols as u64, &r_params, &r_buf, &r_norms)?;
        }
        let params = distance_tile::Params {
            rows: rows as u32,
            cols: cols as u32,
            out_stride: cols as u32,
            ..tile_params
        };
        rec.upload(&t_params, 0, &[params])?;
        rec.sentinel(&out, f32s(rows * cols))?;
        let buffers = TileBuffers {
            params: &t_params,
            queries: &q_buf,
            refs: &r_buf,
            query_sq_norms: &q_norms,
            ref_sq_norms: &r_norms,
            out: &out,
        };
        tile.encode(&mut rec, &params, &buffers)?;
        let bytes = 4 * (rows * cols) as u64;
        rec.read_back(&out, 0, st, 0, bytes);
        Ok((rec.submit()?, bytes))
    };
    let deliver = |(r0, c0, rows, cols), readback: Readback<'_>| {
        readback.read::<f32, _>(gpu, rows * cols, |values| {
            on_tile(r0, c0, shaped(op, (rows, cols), values)?)
        })??;
        report.add((rows * cols) as u64);
        Ok(())
    };
    transfer::pipelined(gpu, &staging, tiles, record, deliver)
}

/// The whole matrix `(q, n)` of the job's queries against host references.
pub(crate) fn matrix(
    job: &Job<'_>,
    gpu: &GpuDevice,
    refs: ArrayView2<'_, f32>,
) -> Result<Array2<f32>> {
    let mut values = Array2::zeros((job.queries.nrows(), refs.nrows()));
    let mut on_tile = |r0: usize, c0: usize, tile: ArrayView2<'_, f32>| {
        let (rows, cols) = tile.dim();
        values
            .slice_mut(s![r0..r0 + rows, c0..c0 + cols])
            .assign(&tile);
        Ok(())
    };
    tiles(job, gpu, refs, &mut on_tile)?;
    Ok(values)
}

/// `values` as a `(rows, cols)` view; they were read back with exactly that many elements.
pub(crate) fn shaped<'v>(
    op: &'static str,
    (rows, cols): (usize, usize),
    values: &'v [f32],
) -> Result<ArrayView2<'v, f32>> {
    ArrayView2::from_shape((rows, cols), values).map_err(|e| Error::Internal {
        op,
        message: format!(
            "{} values read back for a ({rows}, {cols}) block: {e}",
            values.len()
        ),
    })
}

/// Host references as row blocks of the whole matrix: tiles come row tile by row tile, and a
/// block is complete at its last column tile.
pub(crate) fn host_row_blocks(
    job: &Job<'_>,
    gpu: &GpuDevice,
    refs: ArrayView2<'_, f32>,
    on_block: &mut RowSink<'_>,
) -> Result<()> {
    let n = refs.nrows();
    let mut block = Array2::zeros((0, n));
    let mut on_tile = |r0: usize, c0: usize, tile: ArrayView2<'_, f32>| {
        let (rows, cols) = tile.dim();
        if c0 == 0 {
            block = Array2::zeros((rows, n));
        }
        block.slice_mut(s![.., c0..c0 + cols]).assign(&tile);
        if c0 + cols == n {
            on_block(r0, block.view())?;
        }
        Ok(())
    };
    tiles(job, gpu, refs, &mut on_tile)
}

/// Buffers of [`DistanceRows`] for up to `rows` queries against `refs` rows in `pages` pages;
/// the plans of its users count exactly these.
pub(crate) fn distance_rows_buffers(
    rows: usize,
    refs: usize,
    dim4: usize,
    pages: usize,
) -> Vec<u64> {
    let mut sizes = vec![
        uniform_size::<row_norms::Params>(),
        f32s(rows * dim4 * 4), // queries
        f32s(rows),            // query norms
        f32s(rows * refs),     // distances
    ];
    sizes.extend(std::iter::repeat_n(
        uniform_size::<distance_tile::Params>(),
        pages,
    ));
    sizes
}

/// The distances of a chunk of query rows against resident reference rows, as a row-major
/// `(rows, refs)` device matrix: one distance tile per page, each writing its column block.
pub(crate) struct DistanceRows {
    norm_params: TrackedBuffer,
    /// The last encoded chunk's rows (zero-padded `vec4`s) and their squared norms.
    pub(crate) queries: TrackedBuffer,
    pub(crate) query_norms: TrackedBuffer,
    tile_params: Vec<TrackedBuffer>,
    /// `(rows, refs)` distances of the last encoded chunk.
    pub(crate) distances: TrackedBuffer,
    norms: std::sync::Arc<RowNorms>,
    tile: std::sync::Arc<DistanceTile>,
}

impl DistanceRows {
    /// Buffers for chunks of up to `rows` queries against `refs`.
    pub(crate) fn new(gpu: &GpuDevice, rows: usize, refs: RowsView<'_>) -> Result<Self> {
        let dim4 = refs.rows.dim4();
        let uniform = |label, size| {
            let usage = wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST;
            transfer::create_buffer(gpu, label, size, usage)
        };
        let input = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
        let pages = refs.rows.pages_for(refs.len);
        let mut tile_params = Vec::with_capacity(pages);
        for _ in 0..pages {
            tile_params.push(uniform(
                "distance_rows::tile_params",
                uniform_size::<distance_tile::Params>(),
            )?);
        }
        Ok(Self {
            norm_params: uniform(
                "distance_rows::norm_params",
                uniform_size::<row_norms::Params>(),
            )?,
            queries: transfer::create_buffer(
                gpu,
                "distance_rows::queries",
                f32s(rows * dim4 * 4),
                input,
            )?,
            query_norms: transfer::output(gpu, "distance_rows::query_norms", f32s(rows))?,
            tile_params,
            distances: transfer::output(gpu, "distance_rows::distances", f32s(rows * refs.len))?,
            norms: gpu.kernel::<RowNorms>()?,
            tile: gpu.kernel::<DistanceTile>()?,
        })
    }

    /// Stages query rows `r0 .. r0 + rows` and records their distances to every row of
    /// `refs` into [`Self::distances`].
    pub(crate) fn encode(
        &self,
        rec: &mut Recorder<'_>,
        queries: Rows<'_>,
        r0: usize,
        rows: usize,
        refs: RowsView<'_>,
        cfg: &DistanceConfig,
    ) -> Result<()> {
        let store = refs.rows;
        let (m, dim4) = (refs.len, store.dim4());
        stage(
            rec,
            &self.norms,
            &self.norm_params,
            queries,
            r0,
            rows,
            (&self.queries, &self.query_norms),
        )?;
        rec.sentinel(&self.distances, f32s(rows * m))?;
        for ((c0, page_rows, embeddings, norms), params) in store.pages().zip(&self.tile_params) {
            if c0 >= m {
                break;
            }
            let cols = page_rows.min(m - c0);
            let tile_params = distance_tile::Params {
                rows: rows as u32,
                cols: cols as u32,
                dim4: dim4 as u32,
                metric: cfg.distance.code(),
                normalize: u32::from(cfg.normalizes()),
                out_stride: m as u32,
                out_col0: c0 as u32,
                ref_row0: 0,
            };
            rec.upload(params, 0, &[tile_params])?;
            let buffers = TileBuffers {
                params,
                queries: &self.queries,
                refs: embeddings,
                query_sq_norms: &self.query_norms,
                ref_sq_norms: norms,
                out: &self.distances,
            };
            self.tile.encode(rec, &tile_params, &buffers)?;
        }
        Ok(())
    }
}

/// What one block of `rows` query rows against `refs` holds: [`DistanceRows`] and its
/// `stagings` readback buffers.
pub(crate) fn row_block_cost(rows: usize, refs: RowsView<'_>, stagings: usize) -> Footprint {
    let m = refs.len;
    let pages = refs.rows.pages_for(m);
    let mut buffers = distance_rows_buffers(rows, m, refs.rows.dim4(), pages);
    buffers.extend(std::iter::repeat_n(f32s(rows * m), stagings));
    Footprint {
        bytes: buffers.iter().sum(),
        largest_buffer: buffers.iter().copied().max().unwrap_or(0),
        workgroups: (rows as u64).div_ceil(distance_tile::BLOCK),
        workgroup_storage: distance_tile::WORKGROUP_STORAGE,
    }
}

/// Rows per block of `q` query rows (at most `max_rows`) against resident `refs`, and the
/// bytes of the smallest block (one row, one staging buffer).
pub(crate) fn row_block_plan(
    op: &'static str,
    (q, max_rows): (usize, usize),
    refs: RowsView<'_>,
    budget: u64,
    caps: &DeviceCaps,
) -> Result<(Staged, u64)> {
    let plan = staged((q, refs.len), |stagings| {
        let cost = |rows: usize| row_block_cost(rows, refs, stagings);
        plan_rows(op, q.min(max_rows.max(1)), refs.len, budget, caps, cost)
    })?;
    Ok((plan, row_block_cost(1, refs, 1).bytes))
}

/// The distances of the job's queries `(q, d)` against resident `refs`, handed to `on_block`
/// in consecutive blocks of whole rows `(row0, (rows, m))`, each at most `job.max_rows` rows
/// and as many as the budget allows. One attempt: the caller retries after an out-of-memory.
pub(crate) fn row_blocks(
    job: &Job<'_>,
    gpu: &GpuDevice,
    refs: RowsView<'_>,
    on_block: &mut RowSink<'_>,
) -> Result<()> {
    let Job {
        op,
        ctx,
        queries,
        cfg,
        max_rows,
        report,
    } = *job;
    let (q, m) = (queries.nrows(), refs.len);
    if q == 0 {
        return Ok(());
    }
    let caps = DeviceCaps::from_limits(&gpu.limits);
    let budget = oom_retry::planning_budget(ctx);
    let (
        Staged {
            tile: plan,
            stagings,
        },
        _,
    ) = row_block_plan(op, (q, max_rows), refs, budget, &caps)?;
    let chunk = DistanceRows::new(gpu, plan.rows, refs)?;
    let staging = Staging::many(gpu, "distance_rows::staging", f32s(plan.rows * m), stagings)?;
    let blocks = (0..q)
        .step_by(plan.rows)
        .map(|r0| (r0, plan.rows.min(q - r0)));
    let record = |&(r0, rows): &(usize, usize), st: &Staging| {
        report.check()?;
        let mut rec = Recorder::new(gpu, op);
        chunk.encode(&mut rec, queries, r0, rows, refs, cfg)?;
        let bytes = 4 * (rows * m) as u64;
        rec.read_back(&chunk.distances, 0, st, 0, bytes);
        Ok((rec.submit()?, bytes))
    };
    let deliver = |(r0, rows), readback: Readback<'_>| {
        readback.read::<f32, _>(gpu, rows * m, |values| {
            on_block(r0, shaped(op, (rows, m), values)?)
        })??;
        report.add((rows * m) as u64);
        Ok(())
    };
    transfer::pipelined(gpu, &staging, blocks, record, deliver)
}
