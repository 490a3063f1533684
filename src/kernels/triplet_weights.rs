//! Wrapper of `shaders/triplet_weights.wgsl`: per anchor row of a block's distances, the
//! triplet loss's sums and the weights `U` of its gradient.

use crate::error::Result;
use crate::kernels::common::wgsl;
use crate::kernels::{fields, grid_2d, Binding, Entry, Layout, Pipeline, Spec, WgslKernel};
use crate::runtime::device::{GpuDevice, Kernel};
use crate::runtime::memory::TrackedBuffer;
use crate::runtime::transfer::Recorder;

/// Invocations per workgroup (one workgroup per anchor, one column per invocation at a
/// time); `WORKGROUP_SIZE` in the shader, set from here.
pub(crate) const WORKGROUP_SIZE: u64 = 256;

/// `u32` words of one anchor's totals: the loss sum's f32 bits, the positive losses and the
/// kept triplets as 64-bit counts, three words of padding.
pub(crate) const TOTAL_WORDS: usize = 8;

/// Workgroup memory of `split` (its scan of two flags), `main` (a staged block of values,
/// the row's two counts and the three reductions) and `reduce` (the reductions).
pub(crate) const SPLIT_STORAGE: u64 = WORKGROUP_SIZE * 8;
pub(crate) const MAIN_STORAGE: u64 = WORKGROUP_SIZE * (4 + 4 + 8 + 8) + 8;
pub(crate) const REDUCE_STORAGE: u64 = WORKGROUP_SIZE * (4 + 8 + 8);

/// The most workgroup memory of its entry points.
pub(crate) const WORKGROUP_STORAGE: u64 = MAIN_STORAGE;

/// The kernel's uniform block, laid out as `Params` in the shader.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    pub(crate) anchors: u32,
    pub(crate) refs: u32,
    pub(crate) dim4: u32,
    pub(crate) metric: u32,
    pub(crate) normalize: u32,
    pub(crate) mode: u32,
    pub(crate) miner_margin: f32,
    pub(crate) margin: f32,
    pub(crate) softplus: u32,
    pub(crate) near: f32,
    /// The block's first anchor in the totals.
    pub(crate) row0: u32,
    /// [`softplus_floor`].
    pub(crate) softplus_floor: f32,
}

/// The largest `v` whose softplus `ln_1p(exp(v))` is 0 in f32 (subnormals kept, as on the
/// host): the kernel counts a softplus loss as positive exactly above it, since a device may
/// flush the subnormal values between it and `ln(f32::MIN_POSITIVE)` to 0.
pub(crate) fn softplus_floor() -> f32 {
    // exp(-200) is 0 and exp(-80) is not; bisect between them.
    let (mut lo, mut hi) = (-200.0f32, -80.0f32);
    loop {
        let mid = lo + (hi - lo) / 2.0;
        if mid == lo || mid == hi {
            return lo;
        }
        if mid.exp() == 0.0 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
}

const PARAMS: (u32, Binding, u64) = (0, Binding::Uniform, std::mem::size_of::<Params>() as u64);

pub(crate) const SPEC: Spec = Spec {
    kernel: WgslKernel {
        stem: "triplet_weights",
        source: wgsl!("triplet_weights", "math", "metric", "margin", "pair_weight"),
        constants: &[("WORKGROUP_SIZE", WORKGROUP_SIZE as f64)],
    },
    entries: &[
        Entry {
            name: "split",
            workgroup_size: [WORKGROUP_SIZE as u32, 1, 1],
            workgroup_bytes: SPLIT_STORAGE,
            bindings: &[
                PARAMS,
                (2, Binding::ReadWrite, 4),
                (10, Binding::ReadOnly, 4),
            ],
        },
        Entry {
            name: "main",
            workgroup_size: [WORKGROUP_SIZE as u32, 1, 1],
            workgroup_bytes: MAIN_STORAGE,
            bindings: &[
                PARAMS,
                (1, Binding::ReadOnly, 4),
                (2, Binding::ReadWrite, 4),
                (3, Binding::ReadOnly, 16),
                (4, Binding::ReadOnly, 16),
                (5, Binding::ReadOnly, 4),
                (6, Binding::ReadOnly, 4),
                (7, Binding::ReadWrite, 4),
                (8, Binding::ReadWrite, 4),
            ],
        },
        Entry {
            name: "reduce",
            workgroup_size: [WORKGROUP_SIZE as u32, 1, 1],
            workgroup_bytes: REDUCE_STORAGE,
            bindings: &[
                PARAMS,
                (8, Binding::ReadWrite, 4),
                (9, Binding::ReadWrite, 4),
            ],
        },
    ],
    params: Layout {
        size: std::mem::size_of::<Params>(),
        fields: fields!(Params: anchors, refs, dim4, metric, normalize, mode, miner_margin, margin, softplus, near, row0, softplus_floor),
    },
    codes: &[],
};

/// Blocks of [`WORKGROUP_SIZE`] slots in a row of `refs` (`main`'s workgroups per anchor).
pub(crate) fn blocks(refs: u64) -> u64 {
    refs.div_ceil(WORKGROUP_SIZE)
}

/// `u32` words of the `lists` buffer for `anchors` rows of `refs`.
pub(crate) fn list_words(anchors: u64, refs: u64) -> u64 {
    anchors * (refs + 2)
}

/// `u32` words of the `partials` buffer for `anchors` rows of `refs`.
pub(crate) fn partial_words(anchors: u64, refs: u64) -> u64 {
    anchors * blocks(refs) * TOTAL_WORDS as u64
}

/// The buffers, by binding.
pub(crate) struct WeightBuffers<'a> {
    pub(crate) params: &'a TrackedBuffer,
    /// `(anchors, refs)` distances.
    pub(crate) distances: &'a TrackedBuffer,
    /// [`list_words`]: each anchor's columns by role.
    pub(crate) lists: &'a TrackedBuffer,
    pub(crate) queries: &'a TrackedBuffer,
    pub(crate) refs: &'a TrackedBuffer,
    pub(crate) query_sq_norms: &'a TrackedBuffer,
    pub(crate) ref_sq_norms: &'a TrackedBuffer,
    /// `(anchors, refs)` weights `U`.
    pub(crate) u: &'a TrackedBuffer,
    /// [`partial_words`]: `main`'s sums per block of a row.
    pub(crate) partials: &'a TrackedBuffer,
    /// [`TOTAL_WORDS`] per anchor of the call.
    pub(crate) totals: &'a TrackedBuffer,
    /// The references' labels, then per anchor its label and own slot.
    pub(crate) labels: &'a TrackedBuffer,
}

pub(crate) struct TripletWeights {
    split: Pipeline,
    main: Pipeline,
    reduce: Pipeline,
}

impl Kernel for TripletWeights {
    fn build(gpu: &GpuDevice) -> Result<Self> {
        Ok(Self {
            split: Pipeline::new(gpu, &SPEC, "split")?,
            main: Pipeline::new(gpu, &SPEC, "main")?,
            reduce: Pipeline::new(gpu, &SPEC, "reduce")?,
        })
    }
}

impl TripletWeights {
    /// `split` and `reduce`: one workgroup per anchor; `main`: one per anchor and block of
    /// its row; each folded into 2-D past the per-dimension limit.
    pub(crate) fn encode(
        &self,
        rec: &mut Recorder<'_>,
        (anchors, refs): (u64, u64),
        b: &WeightBuffers<'_>,
    ) -> Result<()> {
        let max = rec.gpu().limits.max_compute_workgroups_per_dimension;
        let per_anchor = grid_2d(anchors, max);
        let per_block = grid_2d(anchors * blocks(refs), max);
        self.split.dispatch(
            rec,
            &[b.params, b.lists, b.labels],
            [per_anchor.0, per_anchor.1, 1],
        )?;
        let main = [
            b.params,
            b.distances,
            b.lists,
            b.queries,
            b.refs,
            b.query_sq_norms,
            b.ref_sq_norms,
            b.u,
            b.partials,
        ];
        self.main
            .dispatch(rec, &main, [per_block.0, per_block.1, 1])?;
        self.reduce.dispatch(
            rec,
            &[b.params, b.partials, b.totals],
            [per_anchor.0, per_anchor.1, 1],
        )
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_softplus_floor_is_where_exp_reaches_zero() {
        let floor = super::softplus_floor();
        assert_eq!(floor.exp(), 0.0);
        let above = f32::from_bits(floor.to_bits() - 1); // negative: one step towards 0
        assert!(above > floor && above.exp() > 0.0 && above.exp().ln_1p() > 0.0);
    }
}
