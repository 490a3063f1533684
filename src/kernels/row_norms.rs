//! Wrapper of `shaders/row_norms.wgsl`: squared L2 norm of every row of a padded matrix.

use crate::context::{GpuDevice, Kernel};
use crate::error::Result;
use crate::kernels::{grid_2d, Binding, Pipeline};
use crate::memory::TrackedBuffer;

pub(crate) const SOURCE: &str = include_str!("../../shaders/row_norms.wgsl");

/// Invocations per workgroup; `WORKGROUP_SIZE` in the shader.
pub(crate) const WORKGROUP_SIZE: u64 = 256;

/// The kernel's uniform block, laid out as `Params` in the shader.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    pub(crate) rows: u32,
    pub(crate) dim4: u32,
    pub(crate) _pad: [u32; 2],
}

pub(crate) struct RowNorms(Pipeline);

impl Kernel for RowNorms {
    fn build(gpu: &GpuDevice) -> Result<Self> {
        use Binding::{ReadOnly, ReadWrite, Uniform};
        Pipeline::new(
            gpu,
            "row_norms",
            SOURCE,
            "main",
            &[Uniform, ReadOnly, ReadWrite],
        )
        .map(Self)
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
        gpu: &GpuDevice,
        encoder: &mut wgpu::CommandEncoder,
        rows: u64,
        params: &TrackedBuffer,
        matrix: &TrackedBuffer,
        sq_norms: &TrackedBuffer,
    ) -> Result<()> {
        let groups = Self::workgroups(rows, gpu.limits.max_compute_workgroups_per_dimension);
        self.0.dispatch(
            gpu,
            encoder,
            "row_norms",
            &[params.buffer(), matrix.buffer(), sq_norms.buffer()],
            [groups.0, groups.1, 1],
        )
    }
}
