//! Wrapper of `shaders/triplet_expand.wgsl`: triplet rows written on the device from
//! `(anchor, positive)` segments and their runs of negatives.

use crate::error::Result;
use crate::kernels::common::wgsl;
use crate::kernels::{fields, grid_2d, Binding, Entry, Layout, Pipeline, Spec, WgslKernel};
use crate::runtime::device::{GpuDevice, Kernel};
use crate::runtime::memory::TrackedBuffer;
use crate::runtime::transfer::Recorder;

/// Invocations per workgroup (one per output row); `WORKGROUP_SIZE` in the shader, set from
/// here.
pub(crate) const WORKGROUP_SIZE: u64 = 256;

/// The kernel's uniform block, laid out as `Params` in the shader.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    /// Segments of the dispatch (at least 1).
    pub(crate) segments: u32,
    /// Output rows they own.
    pub(crate) rows: u32,
    pub(crate) _pad: [u32; 2],
}

pub(crate) const SPEC: Spec = Spec {
    kernel: WgslKernel {
        stem: "triplet_expand",
        source: wgsl!("triplet_expand"),
        constants: &[("WORKGROUP_SIZE", WORKGROUP_SIZE as f64)],
    },
    entries: &[Entry {
        name: "main",
        workgroup_size: [WORKGROUP_SIZE as u32, 1, 1],
        workgroup_bytes: 0,
        bindings: &[
            (0, Binding::Uniform, std::mem::size_of::<Params>() as u64),
            (1, Binding::ReadOnly, 4),
            (2, Binding::ReadOnly, 8),
            (3, Binding::ReadOnly, 4),
            (4, Binding::ReadOnly, 4),
            (5, Binding::ReadWrite, 4),
        ],
    }],
    params: Layout {
        size: std::mem::size_of::<Params>(),
        fields: fields!(Params: segments, rows, _pad),
    },
    codes: &[],
};

/// Buffers in binding order after the uniform: `starts` (segments + 1), `heads` (one
/// `(anchor, positive)` per segment), `sources` (one per segment), the negatives `source`,
/// and the `(rows, 3)` output.
pub(crate) struct ExpandBuffers<'a> {
    pub(crate) params: &'a TrackedBuffer,
    pub(crate) starts: &'a TrackedBuffer,
    pub(crate) heads: &'a TrackedBuffer,
    pub(crate) sources: &'a TrackedBuffer,
    pub(crate) source: &'a TrackedBuffer,
    pub(crate) out: &'a TrackedBuffer,
}

pub(crate) struct TripletExpand(Pipeline);

impl Kernel for TripletExpand {
    fn build(gpu: &GpuDevice) -> Result<Self> {
        Pipeline::new(gpu, &SPEC, "main").map(Self)
    }
}

impl TripletExpand {
    /// Records the expansion of `rows` output rows (one invocation each).
    pub(crate) fn encode(
        &self,
        rec: &mut Recorder<'_>,
        rows: u64,
        b: &ExpandBuffers<'_>,
    ) -> Result<()> {
        let (x, y) = grid_2d(
            rows.div_ceil(WORKGROUP_SIZE),
            rec.gpu().limits.max_compute_workgroups_per_dimension,
        );
        let buffers = [b.params, b.starts, b.heads, b.sources, b.source, b.out];
        self.0.dispatch(rec, &buffers, [x, y, 1])
    }
}
