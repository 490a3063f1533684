//! Wrapper of `shaders/triplet_select.wgsl`: per-pair triplet counts (`count_scan`, a
//! workgroup per pair scanning the negatives), then the triplets themselves (`emit`, an
//! invocation per pair).

use crate::error::Result;
use crate::kernels::common::wgsl;
use crate::kernels::{fields, grid_2d, Binding, Entry, Layout, Pipeline, Spec, WgslKernel};
use crate::runtime::device::{GpuDevice, Kernel};
use crate::runtime::memory::TrackedBuffer;
use crate::runtime::transfer::Recorder;

/// Invocations per workgroup; `WORKGROUP_SIZE` in the shader, set from here.
pub(crate) const WORKGROUP_SIZE: u64 = 64;

/// Workgroup memory of `count_scan`: a `WORKGROUP_SIZE`-entry u32 reduction.
pub(crate) const WORKGROUP_STORAGE: u64 = WORKGROUP_SIZE * 4;

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

const PARAMS: (u32, Binding, u64) = (0, Binding::Uniform, std::mem::size_of::<Params>() as u64);
const DISTANCES: (u32, Binding, u64) = (1, Binding::ReadOnly, 4);
const POSITIVES: (u32, Binding, u64) = (2, Binding::ReadOnly, 4);
const NEGATIVES: (u32, Binding, u64) = (3, Binding::ReadOnly, 4);
const LIST_COUNTS: (u32, Binding, u64) = (4, Binding::ReadOnly, 4);
const PAIR_BASE: (u32, Binding, u64) = (5, Binding::ReadOnly, 4);
const PAIR_COUNTS: (u32, Binding, u64) = (6, Binding::ReadWrite, 4);
const OFFSETS: (u32, Binding, u64) = (7, Binding::ReadOnly, 8);
const OUT: (u32, Binding, u64) = (8, Binding::ReadWrite, 4);

pub(crate) const SPEC: Spec = Spec {
    kernel: WgslKernel {
        stem: "triplet_select",
        source: wgsl!("triplet_select", "margin", "pairs"),
        constants: &[("WORKGROUP_SIZE", WORKGROUP_SIZE as f64)],
    },
    entries: &[
        Entry {
            name: "count_scan",
            workgroup_size: [WORKGROUP_SIZE as u32, 1, 1],
            workgroup_bytes: WORKGROUP_STORAGE,
            bindings: &[
                PARAMS,
                DISTANCES,
                POSITIVES,
                NEGATIVES,
                LIST_COUNTS,
                PAIR_BASE,
                PAIR_COUNTS,
            ],
        },
        Entry {
            name: "emit",
            workgroup_size: [WORKGROUP_SIZE as u32, 1, 1],
            workgroup_bytes: 0,
            bindings: &[
                PARAMS,
                DISTANCES,
                POSITIVES,
                NEGATIVES,
                LIST_COUNTS,
                PAIR_BASE,
                OFFSETS,
                OUT,
            ],
        },
    ],
    params: Layout {
        size: std::mem::size_of::<Params>(),
        fields: fields!(Params: anchors, refs, mode, inverted, margin, pair_lo, pair_hi, _pad0, start, _pad),
    },
    codes: &[],
};

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
        Ok(Self {
            count_scan: Pipeline::new(gpu, &SPEC, "count_scan")?,
            emit: Pipeline::new(gpu, &SPEC, "emit")?,
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
        rec: &mut Recorder<'_>,
        pass: Pass,
        pairs: u64,
        b: &SelectBuffers<'_>,
    ) -> Result<()> {
        let limit = rec.gpu().limits.max_compute_workgroups_per_dimension;
        let (x, y) = Self::workgroups(pass, pairs, limit);
        super::within_dispatch_limit(rec.gpu(), "triplet_select", &[u64::from(y)])?;
        let mut buffers = vec![
            b.params,
            b.distances,
            b.positives,
            b.negatives,
            b.list_counts,
            b.pair_base,
        ];
        let pipeline = match pass {
            Pass::CountScan => {
                buffers.push(b.pair_counts);
                &self.count_scan
            }
            Pass::Emit => {
                // Each pair's slice of `out` comes from the offsets, its own bound.
                buffers.extend([b.offsets, b.out]);
                &self.emit
            }
        };
        pipeline.dispatch(rec, &buffers, [x, y, 1])
    }
}
