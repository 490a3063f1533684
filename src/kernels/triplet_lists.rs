//! Wrapper of `shaders/triplet_lists.wgsl`: each anchor's ascending positive and negative lists.

use crate::error::Result;
use crate::kernels::common::wgsl;
use crate::kernels::{fields, grid_2d, Binding, Entry, Layout, Pipeline, Spec, WgslKernel};
use crate::runtime::device::{GpuDevice, Kernel};
use crate::runtime::memory::TrackedBuffer;
use crate::runtime::transfer::Recorder;

/// Invocations per workgroup (one workgroup per anchor); `WORKGROUP_SIZE` in the shader, set
/// from here.
pub(crate) const WORKGROUP_SIZE: u64 = 64;

/// The kernel's uniform block, laid out as `Params` in the shader.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    pub(crate) anchors: u32,
    pub(crate) refs: u32,
    pub(crate) _pad: [u32; 2],
}

pub(crate) const SPEC: Spec = Spec {
    kernel: WgslKernel {
        stem: "triplet_lists",
        source: wgsl!("triplet_lists"),
        constants: &[("WORKGROUP_SIZE", WORKGROUP_SIZE as f64)],
    },
    entries: &[Entry {
        name: "main",
        workgroup_size: [WORKGROUP_SIZE as u32, 1, 1],
        // The two scans of the segments' positive and negative counts.
        workgroup_bytes: 2 * WORKGROUP_SIZE * 4,
        bindings: &[
            (0, Binding::Uniform, std::mem::size_of::<Params>() as u64),
            (1, Binding::ReadOnly, 4),
            (2, Binding::ReadOnly, 4),
            (3, Binding::ReadOnly, 4),
            (4, Binding::ReadWrite, 4),
            (5, Binding::ReadWrite, 4),
            (6, Binding::ReadWrite, 4),
        ],
    }],
    params: Layout {
        size: std::mem::size_of::<Params>(),
        fields: fields!(Params: anchors, refs, _pad),
    },
    codes: &[],
};

/// Buffers in binding order after the uniform.
pub(crate) struct ListBuffers<'a> {
    pub(crate) params: &'a TrackedBuffer,
    pub(crate) anchor_labels: &'a TrackedBuffer,
    pub(crate) ref_labels: &'a TrackedBuffer,
    pub(crate) self_slots: &'a TrackedBuffer,
    pub(crate) positives: &'a TrackedBuffer,
    pub(crate) negatives: &'a TrackedBuffer,
    pub(crate) list_counts: &'a TrackedBuffer,
}

pub(crate) struct TripletLists(Pipeline);

impl Kernel for TripletLists {
    fn build(gpu: &GpuDevice) -> Result<Self> {
        Pipeline::new(gpu, &SPEC, "main").map(Self)
    }
}

impl TripletLists {
    /// One workgroup per anchor, folded into 2-D past the per-dimension limit.
    pub(crate) fn workgroups(anchors: u64, max_per_dim: u32) -> (u32, u32) {
        grid_2d(anchors, max_per_dim)
    }

    pub(crate) fn encode(
        &self,
        rec: &mut Recorder<'_>,
        anchors: u64,
        b: &ListBuffers<'_>,
    ) -> Result<()> {
        let groups = Self::workgroups(
            anchors,
            rec.gpu().limits.max_compute_workgroups_per_dimension,
        );
        let buffers = [
            b.params,
            b.anchor_labels,
            b.ref_labels,
            b.self_slots,
            b.positives,
            b.negatives,
            b.list_counts,
        ];
        self.0.dispatch(rec, &buffers, [groups.0, groups.1, 1])
    }
}
