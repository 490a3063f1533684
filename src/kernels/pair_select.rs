//! Wrapper of `shaders/pair_select.wgsl`: the pair miners' choice per anchor row, counted or
//! written as `(anchor, reference)` rows on the device.

use crate::error::Result;
use crate::kernels::common::wgsl;
use crate::kernels::{fields, grid_2d, Binding, Entry, Layout, Pipeline, Spec, WgslKernel};
use crate::runtime::device::{GpuDevice, Kernel};
use crate::runtime::memory::TrackedBuffer;
use crate::runtime::transfer::Recorder;

/// Invocations per workgroup (one workgroup per anchor); `WORKGROUP_SIZE` in the shader, set
/// from here. A tile's kept count (at most this) must fit the 16 bits of a packed scan.
pub(crate) const WORKGROUP_SIZE: u64 = 256;

/// Workgroup memory: four `(value, reference)` pairs per invocation for the reductions, a
/// `u32` scan per invocation, and one shared segment length.
pub(crate) const WORKGROUP_STORAGE: u64 = WORKGROUP_SIZE * 4 * 8 + WORKGROUP_SIZE * 4 + 4;

/// The rules of the shader's `rule` field.
pub(crate) mod rule {
    /// Every positive and negative pair (labels only).
    pub(crate) const ALL_PAIRS: u32 = 0;
    /// `PairMarginMiner`.
    pub(crate) const PAIR_MARGIN: u32 = 1;
    /// `MultiSimilarityMiner` (epsilon in `pos_margin`).
    pub(crate) const MULTI_SIMILARITY: u32 = 2;
    /// `BatchEasyHardMiner`.
    pub(crate) const EASY_HARD: u32 = 3;
}

/// The strategies of the shader's `pos_strategy` and `neg_strategy` fields.
pub(crate) mod strategy {
    /// The hardest pair of the side.
    pub(crate) const HARD: u32 = 0;
    /// The hardest pair that is easier than the other side's hardest.
    pub(crate) const SEMIHARD: u32 = 1;
    /// The easiest pair of the side.
    pub(crate) const EASY: u32 = 2;
    /// Every pair of the side.
    pub(crate) const ALL: u32 = 3;
}

/// The kernel's uniform block, laid out as `Params` in the shader.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    /// Anchors of the dispatch.
    pub(crate) rows: u32,
    /// References per row.
    pub(crate) cols: u32,
    /// The dispatch's first anchor: its index into the labels, self slots and starts.
    pub(crate) anchor0: u32,
    /// The first anchor's row in the distances.
    pub(crate) row0: u32,
    /// 0: count into the starts, 1: write rows at the starts.
    pub(crate) emit: u32,
    /// One of [`rule`]'s codes.
    pub(crate) rule: u32,
    /// 1 when values are similarities (larger is closer).
    pub(crate) similarity: u32,
    /// Batch easy/hard: 0 hard, 1 semihard, 2 easy, 3 all.
    pub(crate) pos_strategy: u32,
    /// Pair margin: the positive margin; multi-similarity: epsilon.
    pub(crate) pos_margin: f32,
    /// Pair margin: the negative margin.
    pub(crate) neg_margin: f32,
    /// As `pos_strategy`, for negatives.
    pub(crate) neg_strategy: u32,
    /// Bit 0: positives must lie in `pos_range`; bit 1: negatives in `neg_range`.
    pub(crate) ranged: u32,
    /// `[lo, hi]` of admitted positive values (batch easy/hard).
    pub(crate) pos_range: [f32; 2],
    /// `[lo, hi]` of admitted negative values (batch easy/hard).
    pub(crate) neg_range: [f32; 2],
    /// The output row at the start of the positives' binding.
    pub(crate) pos_base: u32,
    /// The output row at the start of the negatives' binding.
    pub(crate) neg_base: u32,
    /// Padding.
    pub(crate) _pad: [u32; 2],
}

pub(crate) const SPEC: Spec = Spec {
    kernel: WgslKernel {
        stem: "pair_select",
        source: wgsl!("pair_select"),
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
            (3, Binding::ReadOnly, 4),
            (4, Binding::ReadOnly, 4),
            (5, Binding::ReadWrite, 8),
            (6, Binding::ReadWrite, 8),
            (7, Binding::ReadWrite, 8),
        ],
    }],
    params: Layout {
        size: std::mem::size_of::<Params>(),
        fields: fields!(Params: rows, cols, anchor0, row0, emit, rule, similarity,
            pos_strategy, pos_margin, neg_margin, neg_strategy, ranged, pos_range, neg_range,
            pos_base, neg_base, _pad),
    },
    codes: &[
        ("ALL_PAIRS", rule::ALL_PAIRS),
        ("PAIR_MARGIN", rule::PAIR_MARGIN),
        ("MULTI_SIMILARITY", rule::MULTI_SIMILARITY),
        ("EASY_HARD", rule::EASY_HARD),
        ("HARD", strategy::HARD),
        ("SEMIHARD", strategy::SEMIHARD),
        ("EASY", strategy::EASY),
        ("ALL", strategy::ALL),
    ],
};

/// A buffer bound whole, or the byte range `(offset, size)` of it.
pub(crate) type Window<'a> = (&'a TrackedBuffer, Option<(u64, u64)>);

/// Buffers in binding order after the uniform: the chunk's `(rows, cols)` distances (any
/// buffer for rule 0), the call's anchor labels and self slots, the reference labels, the
/// `(anchors + 1)` starts, and the two `(k, 2)` outputs (or windows of them).
pub(crate) struct SelectBuffers<'a> {
    pub(crate) params: &'a TrackedBuffer,
    pub(crate) distances: &'a TrackedBuffer,
    pub(crate) anchor_labels: &'a TrackedBuffer,
    pub(crate) self_slots: &'a TrackedBuffer,
    pub(crate) ref_labels: &'a TrackedBuffer,
    pub(crate) starts: &'a TrackedBuffer,
    pub(crate) positives: Window<'a>,
    pub(crate) negatives: Window<'a>,
}

pub(crate) struct PairSelect(Pipeline);

impl Kernel for PairSelect {
    fn build(gpu: &GpuDevice) -> Result<Self> {
        Pipeline::new(gpu, &SPEC, "main").map(Self)
    }
}

impl PairSelect {
    /// Records one dispatch over `rows` anchors (one workgroup each, folded into a 2-D grid).
    pub(crate) fn encode(
        &self,
        rec: &mut Recorder<'_>,
        rows: u64,
        b: &SelectBuffers<'_>,
    ) -> Result<()> {
        let (x, y) = grid_2d(rows, rec.gpu().limits.max_compute_workgroups_per_dimension);
        let buffers = [
            (b.params, None),
            (b.distances, None),
            (b.anchor_labels, None),
            (b.self_slots, None),
            (b.ref_labels, None),
            (b.starts, None),
            b.positives,
            b.negatives,
        ];
        self.0.dispatch_ranges(rec, &buffers, [x, y, 1])
    }
}
