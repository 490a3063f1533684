//! Wrapper of `shaders/knn_sort.wgsl`: per row of best lists, an in-place sort by
//! `(key, index)` and the row's indices and scores written out, so that a search's answer
//! stays on the device.

use crate::error::Result;
use crate::kernels::common::wgsl;
use crate::kernels::knn_select::{EMPTY_INDEX, SLOT_BYTES};
use crate::kernels::{fields, grid_2d, Binding, Entry, Layout, Pipeline, Spec, WgslKernel};
use crate::runtime::device::{GpuDevice, Kernel};
use crate::runtime::memory::TrackedBuffer;
use crate::runtime::transfer::Recorder;

/// Invocations per workgroup (one workgroup per row); `WORKGROUP_SIZE` in the shader, set
/// from here.
pub(crate) const WORKGROUP_SIZE: u64 = 256;

/// The kernel's uniform block, laid out as `Params` in the shader.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    pub(crate) rows: u32,
    pub(crate) k: u32,
    /// 1 when larger scores are better.
    pub(crate) largest: u32,
    pub(crate) _pad: u32,
}

pub(crate) const SPEC: Spec = Spec {
    kernel: WgslKernel {
        stem: "knn_sort",
        source: wgsl!("knn_sort"),
        constants: &[
            ("WORKGROUP_SIZE", WORKGROUP_SIZE as f64),
            ("EMPTY_INDEX", EMPTY_INDEX as f64),
        ],
    },
    entries: &[Entry {
        name: "main",
        workgroup_size: [WORKGROUP_SIZE as u32, 1, 1],
        workgroup_bytes: 0,
        bindings: &[
            (0, Binding::Uniform, std::mem::size_of::<Params>() as u64),
            (1, Binding::ReadWrite, SLOT_BYTES),
            (2, Binding::ReadWrite, 4),
            (3, Binding::ReadWrite, 4),
        ],
    }],
    params: Layout {
        size: std::mem::size_of::<Params>(),
        fields: fields!(Params: rows, k, largest, _pad),
    },
    codes: &[],
};

/// Buffers in binding order after the uniform: the lists `(rows, k)` of `(key, index)`
/// slots (sorted in place), and the `(rows, k)` indices and scores written from them.
pub(crate) struct SortBuffers<'a> {
    pub(crate) params: &'a TrackedBuffer,
    pub(crate) lists: &'a TrackedBuffer,
    pub(crate) indices: &'a TrackedBuffer,
    pub(crate) scores: &'a TrackedBuffer,
}

pub(crate) struct KnnSort(Pipeline);

impl Kernel for KnnSort {
    fn build(gpu: &GpuDevice) -> Result<Self> {
        Pipeline::new(gpu, &SPEC, "main").map(Self)
    }
}

impl KnnSort {
    /// Records the sort of `rows` rows (one workgroup each, folded into a 2-D grid).
    pub(crate) fn encode(
        &self,
        rec: &mut Recorder<'_>,
        rows: u64,
        b: &SortBuffers<'_>,
    ) -> Result<()> {
        let (x, y) = grid_2d(rows, rec.gpu().limits.max_compute_workgroups_per_dimension);
        let buffers = [b.params, b.lists, b.indices, b.scores];
        self.0.dispatch(rec, &buffers, [x, y, 1])
    }
}
