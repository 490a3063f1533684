//! Pairwise distances between query and reference embeddings, tiled under the budget.

use ndarray::{s, Array2, ArrayView2};

use crate::context::{ComputePath, Context, GpuDevice};
use crate::error::Result;
use crate::kernels::distance_tile::{self, DistanceTile, TileBuffers};
use crate::kernels::row_norms::{self, RowNorms};
use crate::oom_retry::{self, RowSink};
use crate::plan::{plan_tiles, DeviceCaps, Footprint, TilePlan};
use crate::transfer::{self, Staging};
use crate::{native, validate};

/// How two embeddings are compared, with PML's names and sign conventions.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{pairwise_distances, Context, Distance, DistanceConfig};
/// let (q, r) = (ndarray::array![[3.0f32, 0.0]], ndarray::array![[0.0f32, 4.0]]);
/// let raw = |distance| DistanceConfig { distance, normalize: false };
/// let ctx = Context::native_cpu(None);
/// let d = |distance| pairwise_distances(&ctx, q.view(), r.view(), &raw(distance)).map(|d| d.values[[0, 0]]);
/// assert_eq!(d(Distance::Euclidean)?, 5.0);
/// assert_eq!(d(Distance::SquaredEuclidean)?, 25.0);
/// assert_eq!(d(Distance::DotProduct)?, 0.0);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Distance {
    /// `|q − r|₂` (PML `LpDistance()`); small = close.
    #[default]
    Euclidean,
    /// `|q − r|₂²` (PML `LpDistance(power=2)`, Faiss `IndexFlatL2`); small = close.
    SquaredEuclidean,
    /// `q·r / (|q| |r|)` (PML `CosineSimilarity()`); large = close. Always normalised.
    Cosine,
    /// `q·r` (PML `DotProductSimilarity()`, Faiss `IndexFlatIP`); large = close.
    DotProduct,
}

impl Distance {
    /// Whether large values mean close (PML's `is_inverted`): true for cosine and dot product.
    ///
    /// # Example
    /// ```
    /// assert!(wgpu_metric_learning::Distance::Cosine.is_similarity());
    /// ```
    pub fn is_similarity(self) -> bool {
        matches!(self, Distance::Cosine | Distance::DotProduct)
    }

    /// The shader's `metric` code.
    pub(crate) fn code(self) -> u32 {
        match self {
            Distance::Euclidean => 0,
            Distance::SquaredEuclidean => 1,
            Distance::Cosine => 2,
            Distance::DotProduct => 3,
        }
    }
}

/// Which distance, on normalised or raw embeddings.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{Distance, DistanceConfig};
/// let faiss_l2 = DistanceConfig { distance: Distance::SquaredEuclidean, normalize: false };
/// assert_eq!(DistanceConfig::default().distance, Distance::Euclidean);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DistanceConfig {
    /// The distance. Default: [`Distance::Euclidean`] (PML's default).
    pub distance: Distance,
    /// L2-normalise every embedding first (`x / max(|x|, 1e-12)`). Default `true`, as in PML,
    /// whose distances all normalise by default; `false` is Faiss's convention. Cosine
    /// always normalises.
    pub normalize: bool,
}

impl DistanceConfig {
    /// Whether embeddings are L2-normalised first: as configured, and always for cosine.
    pub(crate) fn normalizes(&self) -> bool {
        self.normalize || self.distance == Distance::Cosine
    }
}

impl Default for DistanceConfig {
    fn default() -> Self {
        Self {
            distance: Distance::Euclidean,
            normalize: true,
        }
    }
}

/// The result of [`pairwise_distances`].
///
/// # Example
/// ```
/// use wgpu_metric_learning::{pairwise_distances, Context, DistanceConfig};
/// let x = ndarray::array![[1.0f32, 0.0], [0.0, 1.0], [1.0, 1.0]];
/// let d = pairwise_distances(&Context::native_cpu(None), x.view(), x.view(), &DistanceConfig::default())?;
/// assert_eq!(d.values.dim(), (3, 3));
/// assert!(d.values[[0, 0]].abs() < 1e-6);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct PairwiseDistances {
    /// `(q, n)`: `values[[i, j]]` compares query `i` with reference `j`.
    pub values: Array2<f32>,
    /// Where it was computed.
    pub path: ComputePath,
}

const OP: &str = "pairwise_distances";

/// Distances between every query `(q, d)` and every reference `(n, d)` → `(q, n)`.
///
/// On the wgpu path the matrix is computed in tiles whose working set (inputs, norms, output
/// and readback staging) fits the context's remaining budget and the device's limits; each
/// tile is one dispatch of `shaders/distance_tile.wgsl`. Any array layout is accepted.
///
/// # Errors
/// [`crate::Error::Shape`] if `d = 0` or the two `d` differ; [`crate::Error::NonFinite`] for a
/// NaN or infinity; [`crate::Error::OverBudget`] / [`crate::Error::DeviceLimit`] if not even a
/// 1 × 1 tile fits; device errors as [`crate::Error`] variants.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{pairwise_distances, Context, Distance, DistanceConfig};
/// let ctx = Context::native_cpu(None);
/// let q = array![[1.0f32, 0.0], [0.0, 2.0]];
/// let cfg = DistanceConfig { distance: Distance::Cosine, ..Default::default() };
/// let d = pairwise_distances(&ctx, q.view(), q.view(), &cfg)?;
/// assert!((d.values[[0, 0]] - 1.0).abs() < 1e-6 && d.values[[0, 1]].abs() < 1e-6);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn pairwise_distances(
    ctx: &Context,
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
    cfg: &DistanceConfig,
) -> Result<PairwiseDistances> {
    validate::embeddings(OP, "queries", queries)?;
    validate::embeddings(OP, "refs", refs)?;
    validate::same_dim(OP, queries, refs)?;
    let values = match ctx.gpu() {
        None => native::pairwise_distances(queries, refs, cfg),
        Some(_) if queries.nrows() == 0 || refs.nrows() == 0 => {
            Array2::zeros((queries.nrows(), refs.nrows()))
        }
        Some(gpu) => oom_retry::retry(ctx, || on_gpu(ctx, gpu, queries, refs, cfg))?,
    };
    Ok(PairwiseDistances {
        values,
        path: ctx.path(),
    })
}

/// Bytes of a storage buffer holding `n` f32 (as [`transfer::create_buffer`] rounds them).
fn f32s(n: usize) -> u64 {
    transfer::buffer_size(4 * n as u64)
}

/// Everything alive while one `(rows, cols)` tile runs; mirrors the allocations of [`on_gpu`].
fn tile_footprint(rows: usize, cols: usize, dim4: usize) -> Footprint {
    let buffers = [
        transfer::buffer_size(std::mem::size_of::<row_norms::Params>() as u64),
        transfer::buffer_size(std::mem::size_of::<row_norms::Params>() as u64),
        transfer::buffer_size(std::mem::size_of::<distance_tile::Params>() as u64),
        f32s(rows * dim4 * 4),
        f32s(cols * dim4 * 4),
        f32s(rows),
        f32s(cols),
        f32s(rows * cols),
        f32s(rows * cols),
    ];
    let (x, y) = DistanceTile::workgroups(rows as u64, cols as u64);
    Footprint {
        bytes: buffers.iter().sum(),
        largest_buffer: buffers.iter().copied().max().unwrap_or(0),
        workgroups: x.max(y),
        workgroup_storage: distance_tile::WORKGROUP_STORAGE,
    }
}

/// The tile plan [`pairwise_distances`] would use for `(q, n, d)` on a device with `caps` and
/// `budget` bytes available.
///
/// # Errors
/// As [`plan_tiles`]: when not even a 1 × 1 tile fits.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{pairwise_distances_plan, DeviceCaps};
/// let plan = pairwise_distances_plan(10_000, 100_000, 128, 1 << 20, &DeviceCaps::from_limits(&wgpu::Limits::default()))?;
/// assert!(plan.footprint.bytes <= 1 << 20);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn pairwise_distances_plan(
    q: usize,
    n: usize,
    d: usize,
    budget: u64,
    caps: &DeviceCaps,
) -> Result<TilePlan> {
    let dim4 = d.div_ceil(4);
    let preferred = distance_tile::BLOCK as usize;
    plan_tiles(OP, q, n, preferred, budget, caps, |r, c| {
        tile_footprint(r, c, dim4)
    })
}

/// Receives one tile `(r0, c0, values)` of the distance matrix.
type TileSink<'s> = dyn FnMut(usize, usize, ArrayView2<'_, f32>) -> Result<()> + 's;

/// Computes the distance matrix tile by tile, row tiles outermost, and hands each tile
/// `(r0, c0, values)` to `on_tile`. Tiles are at most `max_rows` rows; the refs stay resident
/// when one column tile covers them (they are re-uploaded per row tile otherwise).
fn gpu_tiles(
    ctx: &Context,
    gpu: &GpuDevice,
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
    cfg: &DistanceConfig,
    max_rows: usize,
    on_tile: &mut TileSink<'_>,
) -> Result<()> {
    let (q, n, d) = (queries.nrows(), refs.nrows(), queries.ncols());
    let dim4 = d.div_ceil(4);
    let caps = DeviceCaps::from_limits(&gpu.limits);
    let plan = pairwise_distances_plan(
        q.min(max_rows.max(1)),
        n,
        d,
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
    let q_params = transfer::uniform(
        ctx,
        gpu,
        "pairwise_distances::query_norm_params",
        &zero_norms,
    )?;
    let r_params = transfer::uniform(ctx, gpu, "pairwise_distances::ref_norm_params", &zero_norms)?;
    let mut tile_params = distance_tile::Params {
        rows: 0,
        cols: 0,
        dim4: dim4 as u32,
        metric: cfg.distance.code(),
        normalize: u32::from(cfg.normalizes()),
        out_stride: 0,
        out_col0: 0,
        ref_row0: 0,
    };
    let t_params = transfer::uniform(ctx, gpu, "pairwise_distances::tile_params", &tile_params)?;
    let input = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
    let q_buf = transfer::create_buffer(
        ctx,
        gpu,
        "pairwise_distances::queries",
        f32s(plan.rows * dim4 * 4),
        input,
    )?;
    let r_buf = transfer::create_buffer(
        ctx,
        gpu,
        "pairwise_distances::refs",
        f32s(plan.cols * dim4 * 4),
        input,
    )?;
    let q_norms = transfer::output(ctx, gpu, "pairwise_distances::query_norms", f32s(plan.rows))?;
    let r_norms = transfer::output(ctx, gpu, "pairwise_distances::ref_norms", f32s(plan.cols))?;
    let out_bytes = f32s(plan.rows * plan.cols);
    let out = transfer::output(ctx, gpu, "pairwise_distances::out", out_bytes)?;
    let staging = Staging::new(ctx, gpu, "pairwise_distances::staging", out_bytes)?;

    let refs_resident = plan.cols >= n;
    for r0 in (0..q).step_by(plan.rows) {
        let rows = plan.rows.min(q - r0);
        transfer::write(
            gpu,
            &q_buf,
            0,
            &transfer::padded_rows(queries, r0, rows, dim4),
        )?;
        let params = row_norms::Params {
            rows: rows as u32,
            ..zero_norms
        };
        transfer::write(gpu, &q_params, 0, &[params])?;
        for c0 in (0..n).step_by(plan.cols) {
            let cols = plan.cols.min(n - c0);
            if r0 == 0 || !refs_resident {
                transfer::write(gpu, &r_buf, 0, &transfer::padded_rows(refs, c0, cols, dim4))?;
                let params = row_norms::Params {
                    rows: cols as u32,
                    ..zero_norms
                };
                transfer::write(gpu, &r_params, 0, &[params])?;
            }
            tile_params.rows = rows as u32;
            tile_params.cols = cols as u32;
            tile_params.out_stride = cols as u32;
            transfer::write(gpu, &t_params, 0, &[tile_params])?;
            for (buffer, bytes) in [(&q_norms, f32s(rows)), (&r_norms, f32s(cols))] {
                transfer::fill_sentinel(ctx, gpu, buffer, bytes)?;
            }
            transfer::fill_sentinel(ctx, gpu, &out, f32s(rows * cols))?;

            let mut encoder = gpu
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("pairwise_distances"),
                });
            norms.encode(gpu, &mut encoder, rows as u64, &q_params, &q_buf, &q_norms)?;
            norms.encode(gpu, &mut encoder, cols as u64, &r_params, &r_buf, &r_norms)?;
            let buffers = TileBuffers {
                params: &t_params,
                queries: &q_buf,
                refs: &r_buf,
                query_sq_norms: &q_norms,
                ref_sq_norms: &r_norms,
                out: &out,
            };
            tile.encode(gpu, &mut encoder, rows as u64, cols as u64, &buffers)?;
            staging.copy_from(&mut encoder, &out, 0, 4 * (rows * cols) as u64);
            transfer::submit_and_wait(gpu, encoder)?;
            staging.read::<f32, _>(gpu, rows * cols, |values| {
                let view = ArrayView2::from_shape((rows, cols), values).map_err(|e| {
                    crate::Error::Readback {
                        label: "pairwise_distances::staging",
                        message: e.to_string(),
                    }
                })?;
                on_tile(r0, c0, view)
            })??;
        }
    }
    Ok(())
}

fn on_gpu(
    ctx: &Context,
    gpu: &GpuDevice,
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
    cfg: &DistanceConfig,
) -> Result<Array2<f32>> {
    let mut values = Array2::zeros((queries.nrows(), refs.nrows()));
    gpu_tiles(
        ctx,
        gpu,
        queries,
        refs,
        cfg,
        usize::MAX,
        &mut |r0, c0, tile| {
            let (rows, cols) = tile.dim();
            values
                .slice_mut(s![r0..r0 + rows, c0..c0 + cols])
                .assign(&tile);
            Ok(())
        },
    )?;
    Ok(values)
}

/// Hands the distance matrix to `on_block` in consecutive blocks of whole rows
/// `(row0, (rows, n))`, each at most `max_rows` rows, on whichever path `ctx` runs; host
/// memory stays bounded by one block whatever `q`. Inputs must already be validated.
pub(crate) fn for_each_row_block(
    ctx: &Context,
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
    cfg: &DistanceConfig,
    max_rows: usize,
    on_block: &mut RowSink<'_>,
) -> Result<()> {
    let (q, n) = (queries.nrows(), refs.nrows());
    let max_rows = max_rows.max(1);
    match ctx.gpu() {
        None => {
            for r0 in (0..q).step_by(max_rows) {
                let rows = max_rows.min(q - r0);
                let block =
                    native::pairwise_distances(queries.slice(s![r0..r0 + rows, ..]), refs, cfg);
                on_block(r0, block.view())?;
            }
            Ok(())
        }
        Some(_) if q == 0 => Ok(()),
        Some(_) if n == 0 => {
            for r0 in (0..q).step_by(max_rows) {
                on_block(r0, Array2::zeros((max_rows.min(q - r0), 0)).view())?;
            }
            Ok(())
        }
        Some(gpu) => oom_retry::retry_rows(ctx, on_block, |on_block| {
            // Tiles come row tile by row tile; a block is complete at its last column tile.
            let mut block = Array2::zeros((0, n));
            gpu_tiles(
                ctx,
                gpu,
                queries,
                refs,
                cfg,
                max_rows,
                &mut |r0, c0, tile| {
                    let (rows, cols) = tile.dim();
                    if c0 == 0 {
                        block = Array2::zeros((rows, n));
                    }
                    block.slice_mut(s![.., c0..c0 + cols]).assign(&tile);
                    if c0 + cols == n {
                        on_block(r0, block.view())?;
                    }
                    Ok(())
                },
            )
        }),
    }
}
