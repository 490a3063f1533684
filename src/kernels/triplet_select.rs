//! Wrapper of `shaders/triplet_select.wgsl`: per-pair triplet counts, then the triplets.

use crate::context::{GpuDevice, Kernel};
use crate::error::{Error, Result};
use crate::kernels::{Binding, Pipeline};
use crate::memory::TrackedBuffer;

pub(crate) const SOURCE: &str = include_str!("../../shaders/triplet_select.wgsl");

/// Invocations per workgroup along the positives; `WORKGROUP_SIZE` in the shader.
pub(crate) const WORKGROUP_SIZE: u64 = 64;

/// The kernel's uniform block, laid out as `Params` in the shader.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    pub(crate) anchors: u32,
    pub(crate) refs: u32,
    pub(crate) anchor0: u32,
    pub(crate) mode: u32,
    pub(crate) inverted: u32,
    pub(crate) emit: u32,
    pub(crate) margin: f32,
    pub(crate) _pad: u32,
    /// Output window start, (low, high) words of a u64.
    pub(crate) start: [u32; 2],
    /// Output window end, (low, high) words of a u64.
    pub(crate) end: [u32; 2],
}

/// Splits a u64 into the shader's (low, high) words.
pub(crate) fn words(x: u64) -> [u32; 2] {
    [x as u32, (x >> 32) as u32]
}

/// Buffers in binding order after the uniform.
pub(crate) struct SelectBuffers<'a> {
    pub(crate) params: &'a TrackedBuffer,
    pub(crate) distances: &'a TrackedBuffer,
    pub(crate) positives: &'a TrackedBuffer,
    pub(crate) negatives: &'a TrackedBuffer,
    pub(crate) list_counts: &'a TrackedBuffer,
    pub(crate) pair_counts: &'a TrackedBuffer,
    pub(crate) offsets: &'a TrackedBuffer,
    pub(crate) out: &'a TrackedBuffer,
}

pub(crate) struct TripletSelect(Pipeline);

impl Kernel for TripletSelect {
    fn build(gpu: &GpuDevice) -> Result<Self> {
        use Binding::{ReadOnly, ReadWrite, Uniform};
        let bindings = [
            Uniform, ReadOnly, ReadOnly, ReadOnly, ReadOnly, ReadWrite, ReadOnly, ReadWrite,
        ];
        Pipeline::new(gpu, "triplet_select", SOURCE, &bindings).map(Self)
    }
}

impl TripletSelect {
    /// Workgroups `(x, y)`: x covers up to `max_positives` positives per anchor, y the anchors.
    pub(crate) fn workgroups(anchors: u64, max_positives: u64) -> (u64, u64) {
        (
            max_positives.div_ceil(WORKGROUP_SIZE).max(1),
            anchors.max(1),
        )
    }

    pub(crate) fn encode(
        &self,
        gpu: &GpuDevice,
        encoder: &mut wgpu::CommandEncoder,
        anchors: u64,
        max_positives: u64,
        b: &SelectBuffers<'_>,
    ) -> Result<()> {
        let (x, y) = Self::workgroups(anchors, max_positives);
        let limit = u64::from(gpu.limits.max_compute_workgroups_per_dimension);
        if x.max(y) > limit {
            return Err(Error::DeviceLimit {
                op: "triplet_select",
                what: "max_compute_workgroups_per_dimension",
                requested: x.max(y),
                limit,
            });
        }
        let buffers = [
            b.params.buffer(),
            b.distances.buffer(),
            b.positives.buffer(),
            b.negatives.buffer(),
            b.list_counts.buffer(),
            b.pair_counts.buffer(),
            b.offsets.buffer(),
            b.out.buffer(),
        ];
        self.0.dispatch(
            gpu,
            encoder,
            "triplet_select",
            &buffers,
            (x as u32, y as u32),
        )
    }
}
