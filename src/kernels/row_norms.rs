//! Wrapper of `shaders/row_norms.wgsl`: squared L2 norm of every row of a padded matrix.

use crate::error::Result;
use crate::kernels::common::wgsl;
use crate::kernels::{fields, grid_2d, Binding, Entry, Layout, Pipeline, Spec, WgslKernel};
use crate::runtime::device::{GpuDevice, Kernel};
use crate::runtime::memory::TrackedBuffer;
use crate::runtime::transfer::Recorder;

/// Invocations per workgroup; `WORKGROUP_SIZE` in the shader, set from here.
pub(crate) const WORKGROUP_SIZE: u64 = 256;

/// The kernel's uniform block, laid out as `Params` in the shader.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    pub(crate) rows: u32,
    pub(crate) dim4: u32,
    pub(crate) _pad: [u32; 2],
}

pub(crate) const SPEC: Spec = Spec {
    kernel: WgslKernel {
        stem: "row_norms",
        source: wgsl!("row_norms"),
        constants: &[("WORKGROUP_SIZE", WORKGROUP_SIZE as f64)],
    },
    entries: &[Entry {
        name: "main",
        workgroup_size: [WORKGROUP_SIZE as u32, 1, 1],
        workgroup_bytes: 0,
        bindings: &[
            (0, Binding::Uniform, std::mem::size_of::<Params>() as u64),
            (1, Binding::ReadOnly, 16),
            (2, Binding::ReadWrite, 4),
        ],
    }],
    params: Layout {
        size: std::mem::size_of::<Params>(),
        fields: fields!(Params: rows, dim4, _pad),
    },
    codes: &[],
};

pub(crate) struct RowNorms(Pipeline);

impl Kernel for RowNorms {
    fn build(gpu: &GpuDevice) -> Result<Self> {
        Pipeline::new(gpu, &SPEC, "main").map(Self)
    }
}

impl RowNorms {
    /// Workgroups for `rows` rows: one invocation per row, folded into 2-D past the limit.
    pub(crate) fn workgroups(rows: u64, max_per_dim: u32) -> (u32, u32) {
        grid_2d(rows.div_ceil(WORKGROUP_SIZE), max_per_dim)
    }

    /// Records `sq_norms[r] = |matrix[r]|^2` for the `rows` rows named in `params`.
    pub(crate) fn encode(
        &self,
        rec: &mut Recorder<'_>,
        rows: u64,
        params: &TrackedBuffer,
        matrix: &TrackedBuffer,
        sq_norms: &TrackedBuffer,
    ) -> Result<()> {
        let groups = Self::workgroups(rows, rec.gpu().limits.max_compute_workgroups_per_dimension);
        self.0
            .dispatch(rec, &[params, matrix, sq_norms], [groups.0, groups.1, 1])
    }
}
