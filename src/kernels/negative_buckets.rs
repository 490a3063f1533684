//! Wrapper of `shaders/negative_buckets.wgsl`: each anchor's negatives grouped by the
//! positives that keep them (its positive values sorted, then a counting sort of the
//! negatives), so that each (anchor, positive) pair counts and emits its kept negatives
//! without testing every one.

use crate::error::{Error, Result};
use crate::kernels::common::wgsl;
use crate::kernels::{fields, grid_2d, Binding, Entry, Layout, Pipeline, Spec, WgslKernel};
use crate::runtime::device::{GpuDevice, Kernel};
use crate::runtime::memory::TrackedBuffer;
use crate::runtime::transfer::Recorder;

/// Invocations per workgroup; `WORKGROUP_SIZE` in the shader, set from here.
pub(crate) const WORKGROUP_SIZE: u64 = 64;

/// The kernel's uniform block, laid out as `Params` in the shader.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    pub(crate) anchors: u32,
    pub(crate) refs: u32,
    /// Row length of the sorted positive values ([`width`]).
    pub(crate) width: u32,
    /// Row length of the bucket counters ([`stride`]).
    pub(crate) stride: u32,
    /// Negatives per anchor the per-negative passes cover.
    pub(crate) span: u32,
    /// Bitonic pass: sequence length and compare distance.
    pub(crate) k: u32,
    pub(crate) j: u32,
    pub(crate) mode: u32,
    pub(crate) inverted: u32,
    pub(crate) margin: f32,
    /// Pairs of a count or emit dispatch: `[pair_lo, pair_hi)`.
    pub(crate) pair_lo: u32,
    pub(crate) pair_hi: u32,
    /// Offset of the emit window's first triplet, (low, high) words of a u64.
    pub(crate) start: [u32; 2],
    /// Emit: words of one pair's bitmap ([`bitmap_words`]).
    pub(crate) bitmap_words: u32,
    pub(crate) _pad: u32,
}

/// Rows of sorted positive values up to this wide sort in workgroup memory, in one dispatch
/// (`LOCAL_WIDTH` in the shader, set from here); wider rows take one dispatch per bitonic
/// pass.
pub(crate) const LOCAL_WIDTH: usize = 2048;

/// Workgroup memory the kernel declares: one row of [`LOCAL_WIDTH`] values.
pub(crate) const WORKGROUP_STORAGE: u64 = LOCAL_WIDTH as u64 * 4;

/// Words of one pair's bitmap over `refs` references.
pub(crate) fn bitmap_words(refs: usize) -> usize {
    refs.div_ceil(32).max(1)
}

/// Row length of the sorted positive values for anchors with at most `positives`
/// positives: the next power of two (bitonic sorting needs one), at least 2.
pub(crate) fn width(positives: usize) -> usize {
    positives.next_power_of_two().max(2)
}

/// Row length of the bucket counters for anchors with at most `positives` positives: a
/// negative's bucket is in `0 ..= 2 · positives`.
pub(crate) fn stride(positives: usize) -> usize {
    2 * positives + 1
}

/// The bitonic passes `(k, j)` that sort rows of `width` values, in order, each its own
/// dispatch; none when the rows sort in workgroup memory ([`LOCAL_WIDTH`]).
pub(crate) fn passes(width: usize) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    if width <= LOCAL_WIDTH {
        return out;
    }
    let mut k = 2;
    while k <= width {
        let mut j = k / 2;
        while j >= 1 {
            out.push((k as u32, j as u32));
            j /= 2;
        }
        k *= 2;
    }
    out
}

/// Buffers of the kernel, named as in the shader.
pub(crate) struct BucketBuffers<'a> {
    /// Gather, bucket, starts, scatter, count and emit read `params`; sort pass `i` reads
    /// `sort_params[i]`.
    pub(crate) params: &'a TrackedBuffer,
    pub(crate) sort_params: &'a [TrackedBuffer],
    pub(crate) distances: &'a TrackedBuffer,
    pub(crate) positives: &'a TrackedBuffer,
    pub(crate) negatives: &'a TrackedBuffer,
    pub(crate) list_counts: &'a TrackedBuffer,
    pub(crate) pair_base: &'a TrackedBuffer,
    pub(crate) sorted: &'a TrackedBuffer,
    pub(crate) buckets: &'a TrackedBuffer,
    pub(crate) order: &'a TrackedBuffer,
    pub(crate) pair_counts: &'a TrackedBuffer,
    pub(crate) offsets: &'a TrackedBuffer,
    pub(crate) out: &'a TrackedBuffer,
    pub(crate) scratch: &'a TrackedBuffer,
}

/// A per-pair entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PairPass {
    Count,
    Emit,
}

pub(crate) struct NegativeBuckets {
    gather: Pipeline,
    sort_local: Pipeline,
    step: Pipeline,
    bucket: Pipeline,
    starts: Pipeline,
    scatter: Pipeline,
    count: Pipeline,
    emit: Pipeline,
}

/// Binding numbers of the shader's buffers.
mod slot {
    pub(super) const PARAMS: u32 = 0;
    pub(super) const DISTANCES: u32 = 1;
    pub(super) const POSITIVES: u32 = 2;
    pub(super) const NEGATIVES: u32 = 3;
    pub(super) const LIST_COUNTS: u32 = 4;
    pub(super) const PAIR_BASE: u32 = 5;
    pub(super) const SORTED: u32 = 6;
    pub(super) const BUCKETS: u32 = 7;
    pub(super) const ORDER: u32 = 8;
    pub(super) const PAIR_COUNTS: u32 = 9;
    pub(super) const OFFSETS: u32 = 10;
    pub(super) const OUT: u32 = 11;
    pub(super) const BUCKET_WORDS: u32 = 12;
    pub(super) const SCRATCH: u32 = 13;
}

/// `(binding, kind, element bytes)` of each of the shader's buffers.
const PARAMS: (u32, Binding, u64) = (
    slot::PARAMS,
    Binding::Uniform,
    std::mem::size_of::<Params>() as u64,
);
const DISTANCES: (u32, Binding, u64) = (slot::DISTANCES, Binding::ReadOnly, 4);
const POSITIVES: (u32, Binding, u64) = (slot::POSITIVES, Binding::ReadOnly, 4);
const NEGATIVES: (u32, Binding, u64) = (slot::NEGATIVES, Binding::ReadOnly, 4);
const LIST_COUNTS: (u32, Binding, u64) = (slot::LIST_COUNTS, Binding::ReadOnly, 4);
const PAIR_BASE: (u32, Binding, u64) = (slot::PAIR_BASE, Binding::ReadOnly, 4);
const SORTED: (u32, Binding, u64) = (slot::SORTED, Binding::ReadWrite, 4);
const BUCKETS: (u32, Binding, u64) = (slot::BUCKETS, Binding::ReadWrite, 4);
const ORDER: (u32, Binding, u64) = (slot::ORDER, Binding::ReadWrite, 4);
const PAIR_COUNTS: (u32, Binding, u64) = (slot::PAIR_COUNTS, Binding::ReadWrite, 4);
const OFFSETS: (u32, Binding, u64) = (slot::OFFSETS, Binding::ReadOnly, 8);
const OUT: (u32, Binding, u64) = (slot::OUT, Binding::ReadWrite, 4);
const BUCKET_WORDS: (u32, Binding, u64) = (slot::BUCKET_WORDS, Binding::ReadWrite, 4);
const SCRATCH: (u32, Binding, u64) = (slot::SCRATCH, Binding::ReadWrite, 4);

/// An entry point of 64-wide workgroups without workgroup memory.
const fn entry(name: &'static str, bindings: &'static [(u32, Binding, u64)]) -> Entry {
    Entry {
        name,
        workgroup_size: [WORKGROUP_SIZE as u32, 1, 1],
        workgroup_bytes: 0,
        bindings,
    }
}

/// The bindings each entry point uses: no entry point binds more than 8 storage buffers.
const SORT: &[(u32, Binding, u64)] = &[PARAMS, SORTED];

pub(crate) const SPEC: Spec = Spec {
    kernel: WgslKernel {
        stem: "negative_buckets",
        source: wgsl!("negative_buckets", "margin", "pairs"),
        constants: &[
            ("WORKGROUP_SIZE", WORKGROUP_SIZE as f64),
            ("LOCAL_WIDTH", LOCAL_WIDTH as f64),
        ],
    },
    entries: &[
        entry(
            "gather",
            &[PARAMS, DISTANCES, POSITIVES, LIST_COUNTS, SORTED],
        ),
        Entry {
            name: "sort_local",
            workgroup_size: [WORKGROUP_SIZE as u32, 1, 1],
            workgroup_bytes: WORKGROUP_STORAGE,
            bindings: SORT,
        },
        entry("step", SORT),
        entry(
            "bucket",
            &[
                PARAMS,
                DISTANCES,
                NEGATIVES,
                LIST_COUNTS,
                SORTED,
                BUCKETS,
                SCRATCH,
            ],
        ),
        entry("starts", &[PARAMS, LIST_COUNTS, BUCKET_WORDS]),
        entry(
            "scatter",
            &[PARAMS, NEGATIVES, LIST_COUNTS, BUCKETS, ORDER, SCRATCH],
        ),
        entry(
            "count",
            &[
                PARAMS,
                DISTANCES,
                POSITIVES,
                LIST_COUNTS,
                PAIR_BASE,
                ORDER,
                PAIR_COUNTS,
            ],
        ),
        entry(
            "emit",
            &[
                PARAMS,
                DISTANCES,
                POSITIVES,
                LIST_COUNTS,
                PAIR_BASE,
                ORDER,
                OFFSETS,
                OUT,
                SCRATCH,
            ],
        ),
    ],
    params: Layout {
        size: std::mem::size_of::<Params>(),
        fields: fields!(Params: anchors, refs, width, stride, span, k, j, mode, inverted, margin, pair_lo, pair_hi, start, bitmap_words, _pad),
    },
    codes: &[],
};

/// The bindings of entry point `name`.
fn bindings_of(name: &str) -> &'static [(u32, Binding, u64)] {
    SPEC.entries
        .iter()
        .find(|e| e.name == name)
        .map_or(&[], |e| e.bindings)
}

impl Kernel for NegativeBuckets {
    fn build(gpu: &GpuDevice) -> Result<Self> {
        let pipeline = |entry| Pipeline::new(gpu, &SPEC, entry);
        Ok(Self {
            gather: pipeline("gather")?,
            sort_local: pipeline("sort_local")?,
            step: pipeline("step")?,
            bucket: pipeline("bucket")?,
            starts: pipeline("starts")?,
            scatter: pipeline("scatter")?,
            count: pipeline("count")?,
            emit: pipeline("emit")?,
        })
    }
}

impl BucketBuffers<'_> {
    /// The buffers entry point `entry` binds, in order, with `params` as the uniform block.
    fn bind<'b>(&'b self, params: &'b TrackedBuffer, entry: &str) -> Vec<&'b TrackedBuffer> {
        bindings_of(entry)
            .iter()
            .map(|&(s, _, _)| match s {
                slot::PARAMS => params,
                slot::DISTANCES => self.distances,
                slot::POSITIVES => self.positives,
                slot::NEGATIVES => self.negatives,
                slot::LIST_COUNTS => self.list_counts,
                slot::PAIR_BASE => self.pair_base,
                slot::SORTED => self.sorted,
                slot::ORDER => self.order,
                slot::PAIR_COUNTS => self.pair_counts,
                slot::OFFSETS => self.offsets,
                slot::BUCKETS | slot::BUCKET_WORDS => self.buckets,
                slot::SCRATCH => self.scratch,
                _ => self.out,
            })
            .collect()
    }
}

/// A 2-D grid of 64-wide workgroups covering `invocations` (flattened by the shader).
fn grid(gpu: &GpuDevice, invocations: u64) -> Result<[u32; 3]> {
    let limit = gpu.limits.max_compute_workgroups_per_dimension;
    let (x, y) = grid_2d(invocations.div_ceil(WORKGROUP_SIZE), limit);
    super::within_dispatch_limit(gpu, "negative_buckets", &[u64::from(y)])?;
    Ok([x, y, 1])
}

impl NegativeBuckets {
    /// Records the grouping of `anchors` anchors' negatives: the positive sort over rows of
    /// `width` (in workgroup memory, or pass by pass), then bucket, starts and scatter over
    /// `span` negatives per anchor. The bucket counters must be zero; the params buffers must
    /// already hold [`Params`] (sort pass `i`: `k, j` of [`passes`]).
    pub(crate) fn encode_grouping(
        &self,
        rec: &mut Recorder<'_>,
        (anchors, width, span): (u64, u64, u64),
        b: &BucketBuffers<'_>,
    ) -> Result<()> {
        let passes = passes(width as usize).len();
        let Some(sort_params) = b.sort_params.get(..passes) else {
            return Err(Error::Internal {
                op: "negative_buckets",
                message: format!(
                    "{} sort params buffers for {passes} bitonic passes",
                    b.sort_params.len()
                ),
            });
        };
        let buffers = b.bind(b.params, "gather");
        let groups = grid(rec.gpu(), anchors * width)?;
        self.gather.dispatch(rec, &buffers, groups)?;
        if width as usize <= LOCAL_WIDTH {
            let buffers = b.bind(b.params, "sort_local");
            let limit = rec.gpu().limits.max_compute_workgroups_per_dimension;
            let (x, y) = grid_2d(anchors, limit);
            self.sort_local.dispatch(rec, &buffers, [x, y, 1])?;
        }
        for params in sort_params {
            let buffers = b.bind(params, "step");
            let groups = grid(rec.gpu(), anchors * width / 2)?;
            self.step.dispatch(rec, &buffers, groups)?;
        }
        let per_negative = anchors * span;
        for (pipeline, entry, invocations) in [
            (&self.bucket, "bucket", per_negative),
            (&self.starts, "starts", anchors),
            (&self.scatter, "scatter", per_negative),
        ] {
            let buffers = b.bind(b.params, entry);
            pipeline.dispatch(rec, &buffers, grid(rec.gpu(), invocations)?)?;
        }
        Ok(())
    }

    /// Records `pass` over the pairs `[params.pair_lo, params.pair_hi)`, `pairs` of them.
    pub(crate) fn encode_pairs(
        &self,
        rec: &mut Recorder<'_>,
        pass: PairPass,
        pairs: u64,
        b: &BucketBuffers<'_>,
    ) -> Result<()> {
        let (pipeline, entry) = match pass {
            PairPass::Count => (&self.count, "count"),
            PairPass::Emit => (&self.emit, "emit"),
        };
        let buffers = b.bind(b.params, entry);
        pipeline.dispatch(rec, &buffers, grid(rec.gpu(), pairs)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_are_the_bitonic_network() {
        assert!(passes(LOCAL_WIDTH).is_empty());
        let wide = passes(2 * LOCAL_WIDTH);
        assert_eq!(wide.len(), 12 * 13 / 2);
        assert_eq!(&wide[..3], &[(2, 1), (4, 2), (4, 1)]);
        assert_eq!(wide.last(), Some(&(4096, 1)));
        assert_eq!((width(0), width(2), width(3), width(4096)), (2, 2, 4, 4096));
        assert_eq!((stride(0), stride(41)), (1, 83));
    }

    #[test]
    fn no_entry_point_binds_more_than_eight_storage_buffers() {
        for e in SPEC.entries {
            let storage = e
                .bindings
                .iter()
                .filter(|b| b.1 != Binding::Uniform)
                .count();
            assert!(storage <= 8, "{}: {storage}", e.name);
        }
    }
}
