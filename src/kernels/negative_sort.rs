//! Wrapper of `shaders/negative_sort.wgsl`: each anchor's negative values, sorted ascending,
//! for the binary-search count of `triplet_select`.

use crate::context::{GpuDevice, Kernel};
use crate::error::{Error, Result};
use crate::kernels::{grid_2d, Binding, Pipeline};
use crate::memory::TrackedBuffer;

pub(crate) const SOURCE: &str = include_str!("../../shaders/negative_sort.wgsl");

/// Invocations per workgroup; `WORKGROUP_SIZE` in the shader.
pub(crate) const WORKGROUP_SIZE: u64 = 64;

/// The kernel's uniform block, laid out as `Params` in the shader.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    pub(crate) anchors: u32,
    pub(crate) refs: u32,
    pub(crate) width: u32,
    pub(crate) k: u32,
    pub(crate) j: u32,
    pub(crate) _pad: [u32; 3],
}

/// Row length of the sorted values for anchors with at most `negatives` negatives: the next
/// power of two (bitonic sorting needs one), at least 2.
pub(crate) fn width(negatives: usize) -> usize {
    negatives.next_power_of_two().max(2)
}

/// The bitonic passes `(k, j)` that sort rows of `width` values, in order.
pub(crate) fn passes(width: usize) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
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

/// Buffers in binding order; `params[0]` serves `gather`, `params[1 + i]` pass `i`.
pub(crate) struct SortBuffers<'a> {
    pub(crate) params: &'a [TrackedBuffer],
    pub(crate) distances: &'a TrackedBuffer,
    pub(crate) negatives: &'a TrackedBuffer,
    pub(crate) list_counts: &'a TrackedBuffer,
    pub(crate) sorted: &'a TrackedBuffer,
}

pub(crate) struct NegativeSort {
    gather: Pipeline,
    step: Pipeline,
}

impl Kernel for NegativeSort {
    fn build(gpu: &GpuDevice) -> Result<Self> {
        use Binding::{ReadOnly, ReadWrite, Uniform};
        let bindings = [Uniform, ReadOnly, ReadOnly, ReadOnly, ReadWrite];
        Ok(Self {
            gather: Pipeline::new(gpu, "negative_sort::gather", SOURCE, "gather", &bindings)?,
            step: Pipeline::new(gpu, "negative_sort::step", SOURCE, "step", &bindings)?,
        })
    }
}

impl NegativeSort {
    /// Records the gather and every pass for `anchors` rows of `width` values. The params
    /// buffers must already hold [`Params`] with `k, j` of [`passes`] (gather: any).
    pub(crate) fn encode(
        &self,
        gpu: &GpuDevice,
        encoder: &mut wgpu::CommandEncoder,
        anchors: u64,
        width: u64,
        b: &SortBuffers<'_>,
    ) -> Result<()> {
        let limit = gpu.limits.max_compute_workgroups_per_dimension;
        let grid = |invocations: u64| -> Result<[u32; 3]> {
            let (x, y) = grid_2d(invocations.div_ceil(WORKGROUP_SIZE), limit);
            if y > limit {
                return Err(Error::DeviceLimit {
                    op: "negative_sort",
                    what: "max_compute_workgroups_per_dimension",
                    requested: u64::from(y),
                    limit: u64::from(limit),
                });
            }
            Ok([x, y, 1])
        };
        let passes = passes(width as usize).len();
        if b.params.len() < passes + 1 {
            return Err(Error::InvalidParameter {
                op: "negative_sort",
                what: "params buffers",
                value: b.params.len().to_string(),
                rule: "one for gather and one per bitonic pass",
            });
        }
        for (i, params) in b.params[..=passes].iter().enumerate() {
            let buffers = [
                params.buffer(),
                b.distances.buffer(),
                b.negatives.buffer(),
                b.list_counts.buffer(),
                b.sorted.buffer(),
            ];
            let (pipeline, label, invocations) = match i {
                0 => (&self.gather, "negative_sort::gather", anchors * width),
                _ => (&self.step, "negative_sort::step", anchors * width / 2),
            };
            pipeline.dispatch(gpu, encoder, label, &buffers, grid(invocations)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_are_the_bitonic_network() {
        assert_eq!(passes(2), vec![(2, 1)]);
        assert_eq!(
            passes(8),
            vec![(2, 1), (4, 2), (4, 1), (8, 4), (8, 2), (8, 1)]
        );
        assert_eq!(passes(1 << 12).len(), 12 * 13 / 2);
        assert_eq!((width(0), width(2), width(3), width(4096)), (2, 2, 4, 4096));
    }
}
