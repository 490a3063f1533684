//! Tile planning: pure arithmetic that picks an operation's chunk sizes before any device call.
//!
//! An operation describes its working set as a function of its tile `(rows, cols)` (a
//! [`Footprint`]); [`plan_tiles`] finds the largest tile whose footprint fits the budget that is
//! still available AND the adapter's limits, or says why even the smallest cannot. What a user
//! sees of a plan is a [`Plan`], from the operations' `*_plan` functions.

use crate::context::ComputePath;
use crate::error::{Error, Result};

/// How an operation would run on a context, from its `*_plan` function
/// ([`crate::pairwise_distances_plan`], [`crate::knn_plan`], [`crate::accuracy_plan`],
/// [`crate::mine_triplets_plan`], [`crate::mine_plan`]): the chunks it takes and the memory
/// they hold. A plan takes the operation's own arguments, does no work and allocates nothing;
/// it is planned for the budget the context has available now, as the call would be.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{knn_plan, Context, KnnConfig};
/// let ctx = Context::native_cpu(Some(64 << 20));
/// let x = ndarray::Array2::<f32>::zeros((10_000, 128));
/// let plan = knn_plan(&ctx, &x, &x, &KnnConfig::default())?;
/// assert!(plan.min_bytes <= plan.bytes && plan.bytes <= 64 << 20);
/// println!("{} chunks of {} queries, {} bytes", plan.chunks, plan.rows, plan.bytes);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Plan {
    /// Where the operation runs.
    pub path: ComputePath,
    /// Queries (anchors) per chunk.
    pub rows: usize,
    /// References per chunk (all of them when they stay resident).
    pub cols: usize,
    /// Chunks in all (query chunks × reference ranges).
    pub chunks: usize,
    /// Bytes the call holds at once with this plan: device memory on the wgpu path (inputs,
    /// tiles, outputs, staging), scratch on the native path; outputs returned to the caller
    /// are not counted. Within the budget available.
    pub bytes: u64,
    /// Bytes of the smallest plan: the least budget under which the call runs at all.
    pub min_bytes: u64,
}

/// The largest buffer the crate binds: 2³¹ − 1 bytes. The kernels index their buffers with
/// `u32` arithmetic (`row * stride + column` and the like), which every in-bounds element of a
/// buffer this size keeps below 2³¹: no product wraps, even where a backend indexes with
/// signed 32-bit integers (HLSL, GLSL). Metal reports `maxBufferLength` (many GiB) as its
/// binding limit, so without this cap a chunk could grow past what `u32` indices reach.
pub(crate) const MAX_BINDING_BYTES: u64 = (1 << 31) - 1;

/// The device limits that bound a tile; a copy of the relevant fields of `wgpu::Limits`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeviceCaps {
    /// Largest buffer the device can create, in bytes.
    pub(crate) max_buffer_size: u64,
    /// Largest range that can be bound as one storage buffer, in bytes.
    pub(crate) max_storage_binding: u64,
    /// Most workgroups one dispatch may have in any dimension.
    pub(crate) max_workgroups_per_dimension: u32,
    /// Workgroup (shared) memory per workgroup, in bytes.
    pub(crate) max_workgroup_storage: u32,
}

impl Plan {
    /// The plan of a call that allocates nothing (it returns before any work), on `path`
    /// against `cols` references.
    pub(crate) fn nothing(path: ComputePath, cols: usize) -> Self {
        Self {
            path,
            rows: 0,
            cols,
            chunks: 0,
            bytes: 0,
            min_bytes: 0,
        }
    }

    /// The plan of a call that first imports device embeddings: `held` bytes for the whole
    /// call, and at most `transient` bytes (rows imported so far included) while importing,
    /// before any tile exists.
    pub(crate) fn with_imports(self, (held, transient): (u64, u64)) -> Self {
        Self {
            bytes: (self.bytes + held).max(transient),
            min_bytes: (self.min_bytes + held).max(transient),
            ..self
        }
    }
}

impl DeviceCaps {
    /// The caps of a device granted `limits`, with buffers and bindings capped at
    /// [`MAX_BINDING_BYTES`].
    pub(crate) fn from_limits(limits: &wgpu::Limits) -> Self {
        Self {
            max_buffer_size: limits.max_buffer_size.min(MAX_BINDING_BYTES),
            max_storage_binding: limits
                .max_storage_buffer_binding_size
                .min(MAX_BINDING_BYTES),
            max_workgroups_per_dimension: limits.max_compute_workgroups_per_dimension,
            max_workgroup_storage: limits.max_compute_workgroup_storage_size,
        }
    }

    /// Caps with no device limit at all: the native CPU path, bounded by the budget alone.
    #[cfg(test)]
    pub(crate) fn unlimited() -> Self {
        Self {
            max_buffer_size: u64::MAX,
            max_storage_binding: u64::MAX,
            max_workgroups_per_dimension: u32::MAX,
            max_workgroup_storage: u32::MAX,
        }
    }
}

/// What one tile of an operation needs from the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Footprint {
    /// Total bytes of all buffers alive at once while the tile runs.
    pub(crate) bytes: u64,
    /// The largest single buffer, which is also bound whole as one storage binding.
    pub(crate) largest_buffer: u64,
    /// The largest workgroup count of any dispatch in any dimension.
    pub(crate) workgroups: u64,
    /// Workgroup memory one workgroup uses.
    pub(crate) workgroup_storage: u64,
}

/// A chosen tile: `rows` × `cols` items per step, and what it costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TilePlan {
    /// Rows (queries, anchors) per tile.
    pub(crate) rows: usize,
    /// Columns (references) per tile.
    pub(crate) cols: usize,
    /// The tile's footprint.
    pub(crate) footprint: Footprint,
}

impl TilePlan {
    /// The public view of this tile plan over `total_rows` × `total_cols` items, whose
    /// smallest plan needs `min_bytes`.
    pub(crate) fn public(&self, total_rows: usize, total_cols: usize, min_bytes: u64) -> Plan {
        Plan {
            path: ComputePath::Wgpu,
            rows: self.rows,
            cols: self.cols,
            chunks: total_rows.div_ceil(self.rows.max(1)) * total_cols.div_ceil(self.cols.max(1)),
            bytes: self.footprint.bytes,
            min_bytes,
        }
    }
}

/// The first limit that `f` breaks, as an error, or `None` if `f` fits.
fn violation(op: &'static str, f: &Footprint, caps: &DeviceCaps, budget: u64) -> Option<Error> {
    let limit = |what, requested, limit| Error::DeviceLimit {
        op,
        what,
        requested,
        limit,
    };
    if f.largest_buffer > caps.max_buffer_size {
        return Some(limit(
            "max_buffer_size",
            f.largest_buffer,
            caps.max_buffer_size,
        ));
    }
    if f.largest_buffer > caps.max_storage_binding {
        return Some(limit(
            "max_storage_buffer_binding_size",
            f.largest_buffer,
            caps.max_storage_binding,
        ));
    }
    if f.workgroups > u64::from(caps.max_workgroups_per_dimension) {
        return Some(limit(
            "max_compute_workgroups_per_dimension",
            f.workgroups,
            u64::from(caps.max_workgroups_per_dimension),
        ));
    }
    if f.workgroup_storage > u64::from(caps.max_workgroup_storage) {
        return Some(limit(
            "max_compute_workgroup_storage_size",
            f.workgroup_storage,
            u64::from(caps.max_workgroup_storage),
        ));
    }
    if f.bytes > budget {
        return Some(Error::OverBudget {
            op,
            required: f.bytes,
            budget,
        });
    }
    None
}

/// The largest `rows` in `lo..=hi` with `fits(rows)`, given `fits(lo)`; footprints grow with rows.
fn largest_fitting(lo: usize, hi: usize, fits: impl Fn(usize) -> bool) -> usize {
    let (mut good, mut bad) = (lo, hi + 1);
    if fits(hi) {
        return hi;
    }
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        if fits(mid) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    good
}

/// Picks the tile for an operation over `total_rows` × `total_cols` items.
///
/// Columns are preferred whole (a reference set resident on the device is read once), then
/// halved until at least `preferred_rows` rows fit beside them; rows are then as many as fit.
/// `budget` is what the operation may still allocate. The footprint must grow with both
/// dimensions.
///
/// # Errors
/// If even a 1 × 1 tile does not fit: [`Error::OverBudget`] naming the bytes that tile needs
/// and the budget, or [`Error::DeviceLimit`] naming the limit it breaks.
///
pub(crate) fn plan_tiles(
    op: &'static str,
    total_rows: usize,
    total_cols: usize,
    preferred_rows: usize,
    budget: u64,
    caps: &DeviceCaps,
    cost: impl Fn(usize, usize) -> Footprint,
) -> Result<TilePlan> {
    let (total_rows, total_cols) = (total_rows.max(1), total_cols.max(1));
    let fits = |r: usize, c: usize| violation(op, &cost(r, c), caps, budget).is_none();
    if let Some(e) = violation(op, &cost(1, 1), caps, budget) {
        return Err(e);
    }
    let want_rows = preferred_rows.clamp(1, total_rows);
    let mut cols = total_cols;
    // Halve the columns until the preferred rows fit (or one column is left).
    while cols > 1 && !fits(want_rows, cols) {
        cols = cols.div_ceil(2);
    }
    if !fits(1, cols) {
        cols = largest_fitting(1, cols, |c| fits(1, c));
    }
    let rows = largest_fitting(1, total_rows, |r| fits(r, cols));
    Ok(TilePlan {
        rows,
        cols,
        footprint: cost(rows, cols),
    })
}

/// Picks how many rows an operation processes per step when its columns are fixed (e.g. all
/// references stay resident): the most rows, up to `total_rows`, whose footprint fits.
///
/// # Errors
/// As [`plan_tiles`], when a single row does not fit.
///
pub(crate) fn plan_rows(
    op: &'static str,
    total_rows: usize,
    cols: usize,
    budget: u64,
    caps: &DeviceCaps,
    cost: impl Fn(usize) -> Footprint,
) -> Result<TilePlan> {
    if let Some(e) = violation(op, &cost(1), caps, budget) {
        return Err(e);
    }
    let rows = largest_fitting(1, total_rows.max(1), |r| {
        violation(op, &cost(r), caps, budget).is_none()
    });
    Ok(TilePlan {
        rows,
        cols,
        footprint: cost(rows),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix_cost(r: usize, c: usize) -> Footprint {
        let (r, c) = (r as u64, c as u64);
        Footprint {
            bytes: 4 * (r * c + 8 * r + 8 * c),
            largest_buffer: 4 * r * c,
            workgroups: r.div_ceil(64).max(c.div_ceil(64)),
            workgroup_storage: 8192,
        }
    }

    #[test]
    fn bindings_are_capped_where_u32_indices_stay_exact() {
        let metal_like = wgpu::Limits {
            max_buffer_size: 64 << 30,
            max_storage_buffer_binding_size: 64 << 30,
            ..wgpu::Limits::default()
        };
        let caps = DeviceCaps::from_limits(&metal_like);
        assert_eq!(
            caps.max_storage_binding, MAX_BINDING_BYTES,
            "binding capped"
        );
        assert_eq!(caps.max_buffer_size, MAX_BINDING_BYTES, "buffer capped");
        // Every f32 element index of such a binding fits an i32.
        assert!(MAX_BINDING_BYTES / 4 <= i32::MAX as u64);
        let small = DeviceCaps::from_limits(&wgpu::Limits::default());
        assert_eq!(small.max_storage_binding, 128 << 20, "smaller limits kept");
    }

    #[test]
    fn everything_fits_in_one_tile_when_the_budget_allows() {
        let plan = plan_tiles(
            "t",
            100,
            300,
            64,
            1 << 30,
            &DeviceCaps::unlimited(),
            matrix_cost,
        )
        .expect("fits");
        assert_eq!(
            (plan.rows, plan.cols),
            (100, 300),
            "one tile covers the whole problem"
        );
    }

    #[test]
    fn tight_budget_shrinks_columns_then_rows() {
        let budget = 64 * 1024;
        let plan = plan_tiles(
            "t",
            10_000,
            100_000,
            64,
            budget,
            &DeviceCaps::unlimited(),
            matrix_cost,
        )
        .expect("fits");
        assert!(plan.footprint.bytes <= budget, "plan within budget");
        assert!(plan.rows >= 64, "preferred rows kept: {plan:?}");
        assert!(
            matrix_cost(plan.rows + 1, plan.cols).bytes > budget,
            "rows are maximal"
        );
    }

    #[test]
    fn workgroup_and_binding_limits_bound_the_tile() {
        let caps = DeviceCaps {
            max_buffer_size: 1 << 20,
            max_storage_binding: 4096,
            max_workgroups_per_dimension: 2,
            max_workgroup_storage: 1 << 15,
        };
        let plan = plan_tiles("t", 1000, 1000, 64, u64::MAX, &caps, matrix_cost).expect("fits");
        let f = plan.footprint;
        assert!(f.largest_buffer <= 4096, "binding limit respected: {f:?}");
        assert!(f.workgroups <= 2, "workgroup limit respected: {f:?}");
    }

    #[test]
    fn smallest_tile_over_budget_names_bytes_and_budget() {
        match plan_tiles("t", 10, 10, 1, 50, &DeviceCaps::unlimited(), matrix_cost) {
            Err(Error::OverBudget {
                op,
                required,
                budget,
            }) => {
                assert_eq!(op, "t");
                assert_eq!(
                    required,
                    matrix_cost(1, 1).bytes,
                    "names the 1×1 tile's bytes"
                );
                assert_eq!(budget, 50, "names the budget");
            }
            other => panic!("expected OverBudget, got {other:?}"),
        }
    }

    #[test]
    fn workgroup_storage_over_the_limit_is_a_device_limit_error() {
        let caps = DeviceCaps {
            max_workgroup_storage: 4096,
            ..DeviceCaps::unlimited()
        };
        let err = plan_tiles("t", 10, 10, 1, u64::MAX, &caps, matrix_cost).expect_err("too big");
        assert!(
            matches!(
                err,
                Error::DeviceLimit {
                    what: "max_compute_workgroup_storage_size",
                    requested: 8192,
                    limit: 4096,
                    ..
                }
            ),
            "got {err:?}"
        );
    }
}
