//! Wrapper of `shaders/triplet_select.wgsl`: per-pair triplet counts (`count_scan`, a
//! workgroup per pair scanning the negatives), then the triplets themselves (`emit`, an
//! invocation per pair).

use crate::context::{GpuDevice, Kernel};
use crate::error::{Error, Result};
use crate::kernels::{grid_2d, Binding, Pipeline};
use crate::memory::TrackedBuffer;

pub(crate) const SOURCE: &str = include_str!("../../shaders/triplet_select.wgsl");

/// Invocations per workgroup; `WORKGROUP_SIZE` in the shader.
pub(crate) const WORKGROUP_SIZE: u64 = 64;

/// Workgroup memory the kernel declares: a 64-entry u32 reduction.
pub(crate) const WORKGROUP_STORAGE: u64 = 64 * 4;

/// The kernel's uniform block, laid out as `Params` in the shader.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    pub(crate) anchors: u32,
    pub(crate) refs: u32,
    pub(crate) mode: u32,
    pub(crate) inverted: u32,
    pub(crate) margin: f32,
    /// First pair of the dispatch.
    pub(crate) pair_lo: u32,
    /// One past the last pair of the dispatch.
    pub(crate) pair_hi: u32,
    pub(crate) _pad0: u32,
    /// Offset of the window's first triplet, (low, high) words of a u64.
    pub(crate) start: [u32; 2],
    pub(crate) _pad: [u32; 2],
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
    pub(crate) pair_base: &'a TrackedBuffer,
    pub(crate) pair_counts: &'a TrackedBuffer,
    pub(crate) offsets: &'a TrackedBuffer,
    pub(crate) out: &'a TrackedBuffer,
}

/// Which entry point runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    /// `count_scan`: a workgroup per pair.
    CountScan,
    /// `emit`: an invocation per pair.
    Emit,
}

impl Pass {
    /// Pairs one workgroup covers.
    pub(crate) fn pairs_per_workgroup(self) -> u64 {
        match self {
            Pass::CountScan => 1,
            Pass::Emit => WORKGROUP_SIZE,
        }
    }
}

pub(crate) struct TripletSelect {
    count_scan: Pipeline,
    emit: Pipeline,
}

impl Kernel for TripletSelect {
    fn build(gpu: &GpuDevice) -> Result<Self> {
        use Binding::{ReadOnly, ReadWrite, Uniform};
        let bindings = [
            Uniform, ReadOnly, ReadOnly, ReadOnly, ReadOnly, ReadOnly, ReadWrite, ReadOnly,
            ReadWrite,
        ];
        Ok(Self {
            count_scan: Pipeline::new(
                gpu,
                "triplet_select::count_scan",
                SOURCE,
                "count_scan",
                &bindings,
            )?,
            emit: Pipeline::new(gpu, "triplet_select::emit", SOURCE, "emit", &bindings)?,
        })
    }
}

impl TripletSelect {
    /// Workgroups for `pass` over `pairs` pairs, as a 2-D grid with `x` at most `max_per_dim`.
    pub(crate) fn workgroups(pass: Pass, pairs: u64, max_per_dim: u32) -> (u32, u32) {
        grid_2d(pairs.div_ceil(pass.pairs_per_workgroup()), max_per_dim)
    }

    /// Records `pass` over the pairs `[params.pair_lo, params.pair_hi)`, `pairs` of them.
    pub(crate) fn encode(
        &self,
        gpu: &GpuDevice,
        encoder: &mut wgpu::CommandEncoder,
        pass: Pass,
        pairs: u64,
        b: &SelectBuffers<'_>,
    ) -> Result<()> {
        let limit = gpu.limits.max_compute_workgroups_per_dimension;
        let (x, y) = Self::workgroups(pass, pairs, limit);
        if y > limit {
            return Err(Error::DeviceLimit {
                op: "triplet_select",
                what: "max_compute_workgroups_per_dimension",
                requested: u64::from(y),
                limit: u64::from(limit),
            });
        }
        let buffers = [
            b.params.buffer(),
            b.distances.buffer(),
            b.positives.buffer(),
            b.negatives.buffer(),
            b.list_counts.buffer(),
            b.pair_base.buffer(),
            b.pair_counts.buffer(),
            b.offsets.buffer(),
            b.out.buffer(),
        ];
        let (pipeline, label) = match pass {
            Pass::CountScan => (&self.count_scan, "triplet_select::count_scan"),
            Pass::Emit => (&self.emit, "triplet_select::emit"),
        };
        pipeline.dispatch(gpu, encoder, label, &buffers, [x, y, 1])
    }
}
