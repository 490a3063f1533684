//! Wrapper of `shaders/info_nce_weights.wgsl`: per anchor row of a block's distances, the
//! InfoNCE loss's sums and the weights `U` of its gradient.

use crate::error::Result;
use crate::kernels::common::wgsl;
use crate::kernels::{fields, grid_2d, Binding, Entry, Layout, Pipeline, Spec, WgslKernel};
use crate::runtime::device::{GpuDevice, Kernel};
use crate::runtime::transfer::Recorder;

/// Invocations per workgroup (one workgroup per anchor); `WORKGROUP_SIZE` in the shader, set
/// from here.
pub(crate) const WORKGROUP_SIZE: u64 = 256;

/// Workgroup memory: a reduction of floats and one of two counts.
pub(crate) const WORKGROUP_STORAGE: u64 = WORKGROUP_SIZE * (4 + 8);

/// The kernel's uniform block, laid out as `Params` in the shader.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    pub(crate) anchors: u32,
    pub(crate) refs: u32,
    pub(crate) dim4: u32,
    pub(crate) metric: u32,
    pub(crate) normalize: u32,
    /// `∂z/∂D`: `1/τ` for similarities, `−1/τ` for distances.
    pub(crate) dz: f32,
    pub(crate) near: f32,
    /// The block's first anchor in the totals.
    pub(crate) row0: u32,
}

pub(crate) const SPEC: Spec = Spec {
    kernel: WgslKernel {
        stem: "info_nce_weights",
        source: wgsl!("info_nce_weights", "math", "metric", "roles", "pair_weight"),
        constants: &[("WORKGROUP_SIZE", WORKGROUP_SIZE as f64)],
    },
    entries: &[Entry {
        name: "main",
        workgroup_size: [WORKGROUP_SIZE as u32, 1, 1],
        workgroup_bytes: WORKGROUP_STORAGE,
        bindings: &[
            (0, Binding::Uniform, std::mem::size_of::<Params>() as u64),
            (1, Binding::ReadOnly, 4),
            (2, Binding::ReadOnly, 4),
            (3, Binding::ReadOnly, 16),
            (4, Binding::ReadOnly, 16),
            (5, Binding::ReadOnly, 4),
            (6, Binding::ReadOnly, 4),
            (7, Binding::ReadWrite, 4),
            (8, Binding::ReadWrite, 4),
        ],
    }],
    params: Layout {
        size: std::mem::size_of::<Params>(),
        fields: fields!(Params: anchors, refs, dim4, metric, normalize, dz, near, row0),
    },
    codes: &[],
};

pub(crate) struct InfoNceWeights(Pipeline);

impl Kernel for InfoNceWeights {
    fn build(gpu: &GpuDevice) -> Result<Self> {
        Pipeline::new(gpu, &SPEC, "main").map(Self)
    }
}

impl InfoNceWeights {
    /// One workgroup per anchor, folded into 2-D past the per-dimension limit; `buffers` in
    /// binding order (parameters, distances, labels, queries, references, their squared
    /// norms, `U`, totals).
    pub(crate) fn encode(
        &self,
        rec: &mut Recorder<'_>,
        anchors: u64,
        buffers: &[&crate::runtime::memory::TrackedBuffer; 9],
    ) -> Result<()> {
        let groups = grid_2d(
            anchors,
            rec.gpu().limits.max_compute_workgroups_per_dimension,
        );
        self.0.dispatch(rec, buffers, [groups.0, groups.1, 1])
    }
}
