//! Wrapper of `shaders/knn_select.wgsl`: per query row, the k best of its running list and one
//! block of scores, by radix selection.

use crate::error::Result;
use crate::kernels::common::wgsl;
use crate::kernels::{fields, grid_2d, Binding, Entry, Layout, Pipeline, Spec, WgslKernel};
use crate::runtime::device::{GpuDevice, Kernel};
use crate::runtime::memory::TrackedBuffer;
use crate::runtime::transfer::Recorder;

/// Invocations per workgroup (one workgroup per row); `WORKGROUP_SIZE` in the shader, set
/// from here.
pub(crate) const WORKGROUP_SIZE: u64 = 64;

/// Index of an unfilled slot of a best list; `EMPTY_INDEX` in the shader. Sentinel-filled
/// output (`u32::MAX`) is distinct from it, so an unwritten slot is still detectable.
pub(crate) const EMPTY_INDEX: u32 = 0xFFFF_FFFE;

/// Bytes of one `(key, index)` slot of a best list.
pub(crate) const SLOT_BYTES: u64 = 8;

/// Workgroup memory the kernel declares: a 256-bin histogram, 256 slots for the scan of its
/// slice sums, and nine `u32` of selection state (three counters, six values written between
/// passes).
pub(crate) const WORKGROUP_STORAGE: u64 = 256 * 4 + 256 * 4 + 9 * 4;

// Each invocation sums an equal slice of the 256 bins, and the scan holds one slot per
// invocation.
const _: () = assert!(WORKGROUP_SIZE <= 256 && 256 % WORKGROUP_SIZE == 0);

/// The kernel's uniform block, laid out as `Params` in the shader.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    pub(crate) rows: u32,
    pub(crate) cols: u32,
    pub(crate) block_stride: u32,
    pub(crate) k: u32,
    /// 0 for the first block of a row (no running list yet), else `k`.
    pub(crate) best_len: u32,
    /// Global reference index of block column 0.
    pub(crate) col_base: u32,
    /// 1 when larger scores are better.
    pub(crate) largest: u32,
    pub(crate) _pad: u32,
}

pub(crate) const SPEC: Spec = Spec {
    kernel: WgslKernel {
        stem: "knn_select",
        source: wgsl!("knn_select"),
        constants: &[
            ("WORKGROUP_SIZE", WORKGROUP_SIZE as f64),
            ("EMPTY_INDEX", EMPTY_INDEX as f64),
        ],
    },
    entries: &[Entry {
        name: "main",
        workgroup_size: [WORKGROUP_SIZE as u32, 1, 1],
        workgroup_bytes: WORKGROUP_STORAGE,
        bindings: &[
            (0, Binding::Uniform, std::mem::size_of::<Params>() as u64),
            (1, Binding::ReadOnly, 4),
            (2, Binding::ReadOnly, SLOT_BYTES),
            (3, Binding::ReadOnly, 4),
            (4, Binding::ReadWrite, SLOT_BYTES),
        ],
    }],
    params: Layout {
        size: std::mem::size_of::<Params>(),
        fields: fields!(Params: rows, cols, block_stride, k, best_len, col_base, largest, _pad),
    },
    codes: &[],
};

/// The order key of a score: unsigned order is "better first" (smaller distance or, with
/// `largest`, larger similarity); `-0` and `+0` share a key. The shader's `key_of`.
pub(crate) fn key_of(score: f32, largest: bool) -> u32 {
    let s = if largest { -score } else { score };
    let bits = match s.to_bits() {
        0x8000_0000 => 0,
        b => b,
    };
    if bits & 0x8000_0000 != 0 {
        !bits
    } else {
        bits | 0x8000_0000
    }
}

/// The score a key came from (`-0` comes back as `+0`).
pub(crate) fn score_of(key: u32, largest: bool) -> f32 {
    let bits = if key & 0x8000_0000 != 0 {
        key & 0x7FFF_FFFF
    } else {
        !key
    };
    let s = f32::from_bits(bits);
    // `0.0 - s`, not `-s`: a zero similarity comes back as +0.
    if largest {
        0.0 - s
    } else {
        s
    }
}

/// Buffers in binding order after the uniform.
pub(crate) struct SelectBuffers<'a> {
    pub(crate) params: &'a TrackedBuffer,
    pub(crate) block: &'a TrackedBuffer,
    pub(crate) best_in: &'a TrackedBuffer,
    pub(crate) excluded: &'a TrackedBuffer,
    pub(crate) best_out: &'a TrackedBuffer,
}

pub(crate) struct KnnSelect(Pipeline);

impl Kernel for KnnSelect {
    fn build(gpu: &GpuDevice) -> Result<Self> {
        Pipeline::new(gpu, &SPEC, "main").map(Self)
    }
}

impl KnnSelect {
    /// Records the selection for `rows` rows (one workgroup each, folded into a 2-D grid).
    pub(crate) fn encode(
        &self,
        rec: &mut Recorder<'_>,
        rows: u64,
        b: &SelectBuffers<'_>,
    ) -> Result<()> {
        let (x, y) = grid_2d(rows, rec.gpu().limits.max_compute_workgroups_per_dimension);
        let buffers = [b.params, b.block, b.best_in, b.excluded, b.best_out];
        self.0.dispatch(rec, &buffers, [x, y, 1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_order_scores_better_first_and_invert() {
        let scores = [
            f32::NEG_INFINITY,
            -2.5,
            -1e-30,
            0.0,
            1e-30,
            3.0,
            f32::INFINITY,
        ];
        for largest in [false, true] {
            let keys: Vec<u32> = scores.iter().map(|&s| key_of(s, largest)).collect();
            let mut sorted = keys.clone();
            sorted.sort_unstable();
            if largest {
                sorted.reverse();
            }
            assert_eq!(
                keys, sorted,
                "keys follow the score order (largest = {largest})"
            );
            for &s in &scores {
                assert_eq!(
                    score_of(key_of(s, largest), largest),
                    s,
                    "round trip of {s}"
                );
            }
            assert_eq!(
                key_of(-0.0, largest),
                key_of(0.0, largest),
                "-0 ties with +0"
            );
        }
    }
}
