//! Wrapper of `shaders/loss_backward.wgsl`: a loss's gradient with respect to the normalised
//! embeddings from one block's weights `U`, for the block's anchors and for every reference.

use crate::error::Result;
use crate::kernels::common::wgsl;
use crate::kernels::{fields, grid_2d, Binding, Entry, Layout, Pipeline, Spec, WgslKernel};
use crate::runtime::device::{GpuDevice, Kernel};
use crate::runtime::memory::TrackedBuffer;
use crate::runtime::transfer::Recorder;

/// Invocations per side of a workgroup, and the summed index's step; `TILE` in the shader,
/// set from here.
pub(crate) const TILE: u64 = 16;

/// Output rows per invocation (`RM` in the shader).
pub(crate) const ROWS_PER: u64 = 4;

/// Output `vec4` columns per invocation (`CN` in the shader).
pub(crate) const COLS_PER: u64 = 2;

/// Output rows of one workgroup.
pub(crate) const GROUP_ROWS: u64 = TILE * ROWS_PER;

/// Output `vec4` columns of one workgroup.
pub(crate) const GROUP_VEC4S: u64 = TILE * COLS_PER;

/// Invocations per workgroup of the gathers (`GATHER` in the shader), one output `vec4` each.
pub(crate) const GATHER_GROUP: u64 = 256;

/// Workgroups a split product aims at: enough to fill a large GPU (an H200 has 132
/// multiprocessors) several times over.
const SPLIT_TARGET: u64 = 1024;

/// The fewest steps of the summed index per chunk: four stages.
const MIN_CHUNK: u64 = 4 * TILE;

/// Workgroup memory: `TILE · ROWS_PER` rows of `TILE` weights, and `TILE` steps of
/// `TILE · COLS_PER` staged `vec4`s.
pub(crate) const WORKGROUP_STORAGE: u64 = TILE * ROWS_PER * TILE * 4 + TILE * TILE * COLS_PER * 16;

/// The kernel's uniform block, laid out as `Params` in the shader.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    pub(crate) rows: u32,
    pub(crate) refs: u32,
    pub(crate) dim4: u32,
    pub(crate) metric: u32,
    pub(crate) normalize: u32,
    /// `query_side`: the block's first row in the output.
    pub(crate) out_row0: u32,
    /// Steps of the summed index per chunk; set by [`LossBackward::encode`].
    pub(crate) chunk: u32,
    /// Chunks (1: no split); set by [`LossBackward::encode`].
    pub(crate) splits: u32,
}

const BINDINGS: &[(u32, Binding, u64)] = &[
    (0, Binding::Uniform, std::mem::size_of::<Params>() as u64),
    (1, Binding::ReadOnly, 4),
    (2, Binding::ReadOnly, 16),
    (3, Binding::ReadOnly, 4),
    (4, Binding::ReadOnly, 16),
    (5, Binding::ReadOnly, 4),
    (6, Binding::ReadWrite, 16),
    (7, Binding::ReadWrite, 16),
];

/// The gathers' bindings: the uniform, the output and the chunk sums.
const GATHER_BINDINGS: &[(u32, Binding, u64)] = &[
    (0, Binding::Uniform, std::mem::size_of::<Params>() as u64),
    (6, Binding::ReadWrite, 16),
    (7, Binding::ReadWrite, 16),
];

pub(crate) const SPEC: Spec = Spec {
    kernel: WgslKernel {
        stem: "loss_backward",
        source: wgsl!("loss_backward", "metric"),
        constants: &[("TILE", TILE as f64), ("GATHER", GATHER_GROUP as f64)],
    },
    entries: &[
        Entry {
            name: "query_side",
            workgroup_size: [TILE as u32, TILE as u32, 1],
            workgroup_bytes: WORKGROUP_STORAGE,
            bindings: BINDINGS,
        },
        Entry {
            name: "ref_side",
            workgroup_size: [TILE as u32, TILE as u32, 1],
            workgroup_bytes: WORKGROUP_STORAGE,
            bindings: BINDINGS,
        },
        Entry {
            name: "query_gather",
            workgroup_size: [GATHER_GROUP as u32, 1, 1],
            workgroup_bytes: 0,
            bindings: GATHER_BINDINGS,
        },
        Entry {
            name: "ref_gather",
            workgroup_size: [GATHER_GROUP as u32, 1, 1],
            workgroup_bytes: 0,
            bindings: GATHER_BINDINGS,
        },
    ],
    params: Layout {
        size: std::mem::size_of::<Params>(),
        fields: fields!(Params: rows, refs, dim4, metric, normalize, out_row0, chunk, splits),
    },
    codes: &[],
};

/// Buffers in binding order after the uniform.
pub(crate) struct BackwardBuffers<'a> {
    pub(crate) params: &'a TrackedBuffer,
    /// `(rows, refs)` weights.
    pub(crate) u: &'a TrackedBuffer,
    pub(crate) queries: &'a TrackedBuffer,
    pub(crate) query_sq_norms: &'a TrackedBuffer,
    pub(crate) refs: &'a TrackedBuffer,
    pub(crate) ref_sq_norms: &'a TrackedBuffer,
    /// `query_side`: `(b, dim4)` `vec4`s; `ref_side`: `(refs, dim4)`, added to.
    pub(crate) out: &'a TrackedBuffer,
    /// The chunk sums of a split product: at least 16 bytes; its size bounds the split
    /// ([`partial_bytes`] for the largest call).
    pub(crate) partial: &'a TrackedBuffer,
}

/// Which product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// The block's anchors' gradient rows.
    Query,
    /// Every reference's gradient row, added to.
    Ref,
}

/// Chunks wanted of the summed index for a product with `tiles` output tiles summing over
/// `summed` steps, within `partial` bytes of chunk sums for `out_vec4s` output `vec4`s:
/// enough for [`SPLIT_TARGET`] workgroups, each chunk at least [`MIN_CHUNK`] steps; 1 when
/// the tiles alone fill the GPU. [`chunks`] rounds them to whole stages.
fn split(tiles: u64, summed: u64, out_vec4s: u64, partial: u64) -> u64 {
    if tiles * 2 >= SPLIT_TARGET || out_vec4s == 0 {
        return 1;
    }
    SPLIT_TARGET
        .div_ceil(tiles)
        .min(summed / MIN_CHUNK)
        .min(partial / (out_vec4s * 16))
        .max(1)
}

/// `summed` steps in at most `splits` chunks of a multiple of `TILE` steps: `(chunk,
/// splits)`, `(summed, 1)` when not split.
fn chunks(summed: u64, splits: u64) -> (u64, u64) {
    if splits <= 1 {
        return (summed.max(1), 1);
    }
    let chunk = summed.div_ceil(splits).next_multiple_of(TILE);
    (chunk, summed.div_ceil(chunk))
}

/// Bytes of chunk sums the products of a block of `rows` anchors against `m` references of
/// `dim4` `vec4`s may use: what [`split`] would take for either side, at most the size of the
/// block's weights (so a split never more than doubles what the weights hold), at least 16.
pub(crate) fn partial_bytes(rows: u64, m: u64, dim4: u64) -> u64 {
    let side = |out_rows: u64, summed: u64| {
        let tiles = out_rows.div_ceil(GROUP_ROWS) * dim4.div_ceil(GROUP_VEC4S);
        let (_, splits) = chunks(summed, split(tiles, summed, out_rows * dim4, u64::MAX));
        if splits > 1 {
            splits * out_rows * dim4 * 16
        } else {
            0
        }
    };
    side(rows, m).max(side(m, rows)).min(4 * rows * m).max(16)
}

pub(crate) struct LossBackward {
    query: Pipeline,
    reference: Pipeline,
    query_gather: Pipeline,
    ref_gather: Pipeline,
}

impl Kernel for LossBackward {
    fn build(gpu: &GpuDevice) -> Result<Self> {
        Ok(Self {
            query: Pipeline::new(gpu, &SPEC, "query_side")?,
            reference: Pipeline::new(gpu, &SPEC, "ref_side")?,
            query_gather: Pipeline::new(gpu, &SPEC, "query_gather")?,
            ref_gather: Pipeline::new(gpu, &SPEC, "ref_gather")?,
        })
    }
}

impl LossBackward {
    /// Workgroups of `side` for `rows` anchors against `refs` references of `dim4` `vec4`s:
    /// tiles of `TILE · ROWS_PER` output rows (folded into 2-D past `max_per_dim`) by tiles of
    /// `TILE · COLS_PER` `vec4`s of the dimension.
    pub(crate) fn workgroups(
        side: Side,
        (rows, refs, dim4): (u64, u64, u64),
        max_per_dim: u32,
    ) -> [u32; 3] {
        let out_rows = match side {
            Side::Query => rows,
            Side::Ref => refs,
        };
        let (x, y) = grid_2d(out_rows.div_ceil(GROUP_ROWS), max_per_dim);
        [x, y, dim4.div_ceil(GROUP_VEC4S).max(1) as u32]
    }

    /// Encodes `side`'s product of the block `shape = (rows, refs, dim4)`, uploading
    /// `params` with the split it chose (then the gather after it).
    pub(crate) fn encode(
        &self,
        rec: &mut Recorder<'_>,
        side: Side,
        shape: (u64, u64, u64),
        params: Params,
        b: &BackwardBuffers<'_>,
    ) -> Result<()> {
        let max_per_dim = rec.gpu().limits.max_compute_workgroups_per_dimension;
        let mut groups = Self::workgroups(side, shape, max_per_dim);
        let (rows, refs, dim4) = shape;
        let (out_rows, summed) = match side {
            Side::Query => (rows, refs),
            Side::Ref => (refs, rows),
        };
        let tiles = u64::from(groups[0]) * u64::from(groups[1]) * u64::from(groups[2]);
        let wanted = split(tiles, summed, out_rows * dim4, b.partial.size());
        // The chunks go in z after the dimension's tiles: within the dispatch limit.
        let most = u64::from(max_per_dim) / u64::from(groups[2]).max(1);
        let (chunk, splits) = chunks(summed, wanted.min(most));
        groups[2] *= splits as u32;
        let params = Params {
            chunk: chunk as u32,
            splits: splits as u32,
            ..params
        };
        rec.upload(b.params, 0, &[params])?;
        let (product, gather) = match side {
            Side::Query => (&self.query, &self.query_gather),
            Side::Ref => (&self.reference, &self.ref_gather),
        };
        let buffers = [
            b.params,
            b.u,
            b.queries,
            b.query_sq_norms,
            b.refs,
            b.ref_sq_norms,
            b.out,
            b.partial,
        ];
        product.dispatch(rec, &buffers, groups)?;
        if splits > 1 {
            let (x, y) = grid_2d((out_rows * dim4).div_ceil(GATHER_GROUP), max_per_dim);
            gather.dispatch(rec, &[b.params, b.out, b.partial], [x, y, 1])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_fills_the_gpu_within_its_room_and_covers_every_step() {
        // 4 tiles of 256 anchors summing over 4 096 references: split, chunks of whole stages
        // that cover the summed index exactly once.
        let (chunk, splits) = chunks(4096, split(4, 4096, 256 * 32, u64::MAX));
        assert!(splits > 1 && chunk % TILE == 0 && chunk >= MIN_CHUNK);
        assert!(chunk * splits >= 4096 && chunk * (splits - 1) < 4096);
        assert!(4 * splits <= SPLIT_TARGET);
        // Tiles enough: no split. A short summed index: no split.
        assert_eq!(split(SPLIT_TARGET, 4096, 256 * 32, u64::MAX), 1);
        assert_eq!(split(4, MIN_CHUNK, 256 * 32, u64::MAX), 1);
        assert_eq!(chunks(4096, 1), (4096, 1));
        // The room for chunk sums bounds the chunks, and rounding never adds one.
        let room = 3 * 256 * 32 * 16;
        assert_eq!(split(4, 4096, 256 * 32, room), 3);
        assert_eq!(split(4, 4096, 256 * 32, room - 1), 2);
        for wanted in 2..=64 {
            assert!(chunks(4096, wanted).1 <= wanted);
            assert!(chunks(150, wanted).1 <= wanted);
        }
        // What the call plans holds what it uses, and never more than the weights.
        for (rows, m, dim4) in [(256, 4096, 32), (4096, 4096, 192), (7, 150, 35), (1, 1, 1)] {
            let bytes = partial_bytes(rows, m, dim4);
            assert!(bytes >= 16 && bytes <= (4 * rows * m).max(16));
        }
    }
}
