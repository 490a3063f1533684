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
    pub(crate) _pad: [u32; 2],
}

const BINDINGS: &[(u32, Binding, u64)] = &[
    (0, Binding::Uniform, std::mem::size_of::<Params>() as u64),
    (1, Binding::ReadOnly, 4),
    (2, Binding::ReadOnly, 16),
    (3, Binding::ReadOnly, 4),
    (4, Binding::ReadOnly, 16),
    (5, Binding::ReadOnly, 4),
    (6, Binding::ReadWrite, 16),
];

pub(crate) const SPEC: Spec = Spec {
    kernel: WgslKernel {
        stem: "loss_backward",
        source: wgsl!("loss_backward", "metric"),
        constants: &[("TILE", TILE as f64)],
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
    ],
    params: Layout {
        size: std::mem::size_of::<Params>(),
        fields: fields!(Params: rows, refs, dim4, metric, normalize, out_row0, _pad),
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
}

/// Which product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// The block's anchors' gradient rows.
    Query,
    /// Every reference's gradient row, added to.
    Ref,
}

pub(crate) struct LossBackward {
    query: Pipeline,
    reference: Pipeline,
}

impl Kernel for LossBackward {
    fn build(gpu: &GpuDevice) -> Result<Self> {
        Ok(Self {
            query: Pipeline::new(gpu, &SPEC, "query_side")?,
            reference: Pipeline::new(gpu, &SPEC, "ref_side")?,
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

    pub(crate) fn encode(
        &self,
        rec: &mut Recorder<'_>,
        side: Side,
        shape: (u64, u64, u64),
        b: &BackwardBuffers<'_>,
    ) -> Result<()> {
        let groups = Self::workgroups(
            side,
            shape,
            rec.gpu().limits.max_compute_workgroups_per_dimension,
        );
        let pipeline = match side {
            Side::Query => &self.query,
            Side::Ref => &self.reference,
        };
        let buffers = [
            b.params,
            b.u,
            b.queries,
            b.query_sq_norms,
            b.refs,
            b.ref_sq_norms,
            b.out,
        ];
        pipeline.dispatch(rec, &buffers, groups)
    }
}
