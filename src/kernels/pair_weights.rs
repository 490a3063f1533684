//! Wrapper of `shaders/pair_weights.wgsl`: per anchor row of a block's distances, one of PML's
//! pair losses (its rule by code) as the anchor's words and the weights `U` of its gradient.

use crate::error::Result;
use crate::kernels::common::wgsl;
use crate::kernels::{fields, grid_2d, Binding, Entry, Layout, Pipeline, Spec, WgslKernel};
use crate::runtime::device::{GpuDevice, Kernel};
use crate::runtime::memory::TrackedBuffer;
use crate::runtime::transfer::Recorder;

/// Invocations per workgroup (one workgroup per anchor); `WORKGROUP_SIZE` in the shader, set
/// from here.
pub(crate) const WORKGROUP_SIZE: u64 = 256;

/// FastAP's most bins (`num_bins + 1`); `MAX_EDGES` in the shader.
pub(crate) const MAX_EDGES: u32 = 256;

/// Workgroup memory: the float and count reductions, FastAP's histograms, their shares and
/// its loss.
pub(crate) const WORKGROUP_STORAGE: u64 =
    WORKGROUP_SIZE * (16 + 16) + MAX_EDGES as u64 * (8 + 16) + 4;

/// Words per anchor in the totals: three f32, four counts, a zero (Histogram's first pass:
/// then its two histograms).
pub(crate) const WORDS: usize = 8;

/// The rules' codes (`PAIR_*` in the shader).
pub(crate) mod code {
    pub(crate) const CONTRASTIVE: u32 = 0;
    pub(crate) const MULTI_SIMILARITY: u32 = 1;
    pub(crate) const SUPCON: u32 = 2;
    pub(crate) const CIRCLE: u32 = 3;
    pub(crate) const NCA: u32 = 4;
    pub(crate) const GENERALIZED_LIFTED: u32 = 5;
    pub(crate) const MARGIN: u32 = 6;
    pub(crate) const FAST_AP: u32 = 7;
    pub(crate) const THRESHOLD_CONSISTENT: u32 = 8;
    pub(crate) const LIFTED: u32 = 9;
    pub(crate) const HISTOGRAM: u32 = 10;
    pub(crate) const RANKED_LIST: u32 = 11;
    pub(crate) const INTRA_PAIR_VARIANCE: u32 = 12;
    /// The losses with class weights' cross entropy (`ops::loss::classifier_device`).
    pub(crate) const SOFTMAX: u32 = 13;
}

/// The kernel's uniform block, laid out as `Params` in the shader.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    pub(crate) anchors: u32,
    pub(crate) refs: u32,
    pub(crate) dim4: u32,
    pub(crate) metric: u32,
    pub(crate) normalize: u32,
    pub(crate) near: f32,
    /// The block's first anchor in the totals.
    pub(crate) row0: u32,
    /// A [`code`].
    pub(crate) rule: u32,
    /// 1: the words only, `U` untouched.
    pub(crate) forward: u32,
    /// FastAP's bins, Histogram's nodes, IntraPairVariance's pass.
    pub(crate) edges: u32,
    /// Where the rule's state starts in the labels.
    pub(crate) state0: u32,
    /// Words per anchor in the totals ([`WORDS`], and Histogram's histograms).
    pub(crate) stride: u32,
    /// The rule's parameters (the shader's header names them).
    pub(crate) p0: f32,
    pub(crate) p1: f32,
    pub(crate) p2: f32,
    pub(crate) p3: f32,
    pub(crate) p4: f32,
    pub(crate) p5: f32,
    pub(crate) p6: f32,
    pub(crate) p7: f32,
}

pub(crate) const SPEC: Spec = Spec {
    kernel: WgslKernel {
        stem: "pair_weights",
        source: wgsl!("pair_weights", "math", "metric", "roles", "pair_weight"),
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
        fields: fields!(
            Params: anchors, refs, dim4, metric, normalize, near, row0, rule, forward, edges,
            state0, stride, p0, p1, p2, p3, p4, p5, p6, p7
        ),
    },
    codes: &[
        ("PAIR_CONTRASTIVE", code::CONTRASTIVE),
        ("PAIR_MULTI_SIMILARITY", code::MULTI_SIMILARITY),
        ("PAIR_SUPCON", code::SUPCON),
        ("PAIR_CIRCLE", code::CIRCLE),
        ("PAIR_NCA", code::NCA),
        ("PAIR_GENERALIZED_LIFTED", code::GENERALIZED_LIFTED),
        ("PAIR_MARGIN", code::MARGIN),
        ("PAIR_FAST_AP", code::FAST_AP),
        ("PAIR_THRESHOLD_CONSISTENT", code::THRESHOLD_CONSISTENT),
        ("PAIR_LIFTED", code::LIFTED),
        ("PAIR_HISTOGRAM", code::HISTOGRAM),
        ("PAIR_RANKED_LIST", code::RANKED_LIST),
        ("PAIR_INTRA_PAIR_VARIANCE", code::INTRA_PAIR_VARIANCE),
        ("PAIR_SOFTMAX", code::SOFTMAX),
        ("MAX_EDGES", MAX_EDGES),
    ],
};

pub(crate) struct PairWeights(Pipeline);

impl Kernel for PairWeights {
    fn build(gpu: &GpuDevice) -> Result<Self> {
        Pipeline::new(gpu, &SPEC, "main").map(Self)
    }
}

impl PairWeights {
    /// One workgroup per anchor, folded into 2-D past the per-dimension limit; `buffers` in
    /// binding order (parameters, distances, labels, queries, references, their squared
    /// norms, `U`, totals).
    pub(crate) fn encode(
        &self,
        rec: &mut Recorder<'_>,
        anchors: u64,
        buffers: &[&TrackedBuffer; 9],
    ) -> Result<()> {
        let groups = grid_2d(
            anchors,
            rec.gpu().limits.max_compute_workgroups_per_dimension,
        );
        self.0.dispatch(rec, buffers, [groups.0, groups.1, 1])
    }
}
