//! WGSL kernels: one file in `shaders/` and one wrapper here per kernel, with the same stem.
//!
//! A wrapper owns its pipeline, its bind-group layout and its dispatch arithmetic, nothing
//! else; buffers come from the crate's `transfer` module and tile sizes from [`crate::plan_tiles`].

pub(crate) mod distance_tile;
pub(crate) mod knn_select;
pub(crate) mod negative_buckets;
pub(crate) mod row_norms;
pub(crate) mod triplet_lists;
pub(crate) mod triplet_select;

use crate::context::GpuDevice;
use crate::error::Result;
use crate::transfer::checked;

/// Every WGSL kernel the crate ships, as `(stem, source)`; the stem names `shaders/<stem>.wgsl`.
///
/// Useful for validating the kernels offline (the crate's own tests translate each one to
/// SPIR-V, MSL, HLSL and GLSL with naga).
///
/// # Example
/// ```
/// let stems: Vec<_> = wgpu_metric_learning::WGSL_SOURCES.iter().map(|(s, _)| *s).collect();
/// assert!(stems.contains(&"distance_tile"));
/// ```
pub const WGSL_SOURCES: &[(&str, &str)] = &[
    ("distance_tile", distance_tile::SOURCE),
    ("knn_select", knn_select::SOURCE),
    ("negative_buckets", negative_buckets::SOURCE),
    ("row_norms", row_norms::SOURCE),
    ("triplet_lists", triplet_lists::SOURCE),
    ("triplet_select", triplet_select::SOURCE),
];

/// How a kernel sees one binding.
#[derive(Clone, Copy)]
pub(crate) enum Binding {
    Uniform,
    ReadOnly,
    ReadWrite,
}

/// A compute pipeline with an explicit bind-group layout (auto layouts are slow to query and
/// hide mismatches between the WGSL and the Rust side).
pub(crate) struct Pipeline {
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) layout: wgpu::BindGroupLayout,
    /// The `@binding` number of each buffer [`Pipeline::dispatch`] is given, in order.
    slots: Vec<u32>,
}

impl Pipeline {
    /// Compiles `entry` of `source` with `bindings` at group 0, bindings 0.., under an error
    /// scope so that a bad shader is an `Error::Wgpu` naming the kernel, not a panic.
    pub(crate) fn new(
        gpu: &GpuDevice,
        label: &'static str,
        source: &'static str,
        entry: &'static str,
        bindings: &[Binding],
    ) -> Result<Self> {
        let slots: Vec<(u32, Binding)> = (0u32..).zip(bindings.iter().copied()).collect();
        Self::with_slots(gpu, label, source, entry, &slots)
    }

    /// As [`Pipeline::new`], for an entry point that uses only some of its module's bindings:
    /// `(binding number, kind)` of each, in the order `dispatch` gets the buffers. A module
    /// whose entry points together bind more storage buffers than a stage may (8 by
    /// default) gives each entry point only its own.
    pub(crate) fn with_slots(
        gpu: &GpuDevice,
        label: &'static str,
        source: &'static str,
        entry: &'static str,
        bindings: &[(u32, Binding)],
    ) -> Result<Self> {
        let entries: Vec<wgpu::BindGroupLayoutEntry> = bindings
            .iter()
            .map(|&(slot, b)| wgpu::BindGroupLayoutEntry {
                binding: slot,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: match b {
                        Binding::Uniform => wgpu::BufferBindingType::Uniform,
                        Binding::ReadOnly => wgpu::BufferBindingType::Storage { read_only: true },
                        Binding::ReadWrite => wgpu::BufferBindingType::Storage { read_only: false },
                    },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            })
            .collect();
        checked(gpu, label, || {
            let module = gpu
                .device
                .create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some(label),
                    source: wgpu::ShaderSource::Wgsl(source.into()),
                });
            let layout = gpu
                .device
                .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                    label: Some(label),
                    entries: &entries,
                });
            let pipeline_layout =
                gpu.device
                    .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                        label: Some(label),
                        bind_group_layouts: &[Some(&layout)],
                        immediate_size: 0,
                    });
            let pipeline = gpu
                .device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(label),
                    layout: Some(&pipeline_layout),
                    module: &module,
                    entry_point: Some(entry),
                    compilation_options: wgpu::PipelineCompilationOptions {
                        // Every kernel stages before it reads its workgroup memory.
                        zero_initialize_workgroup_memory: false,
                        ..Default::default()
                    },
                    cache: None,
                });
            Self {
                pipeline,
                layout,
                slots: bindings.iter().map(|&(slot, _)| slot).collect(),
            }
        })
    }

    /// Records one dispatch of this pipeline over `buffers` (bound in order) into `encoder`.
    pub(crate) fn dispatch(
        &self,
        gpu: &GpuDevice,
        encoder: &mut wgpu::CommandEncoder,
        label: &'static str,
        buffers: &[&wgpu::Buffer],
        workgroups: [u32; 3],
    ) -> Result<()> {
        let entries: Vec<wgpu::BindGroupEntry> = buffers
            .iter()
            .zip(&self.slots)
            .map(|(b, &slot)| wgpu::BindGroupEntry {
                binding: slot,
                resource: b.as_entire_binding(),
            })
            .collect();
        checked(gpu, label, || {
            let group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(label),
                layout: &self.layout,
                entries: &entries,
            });
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(label),
                timestamp_writes: None,
            });
            pass.set_pipeline(&self.pipeline);
            pass.set_bind_group(0, &group, &[]);
            pass.dispatch_workgroups(workgroups[0], workgroups[1], workgroups[2]);
        })
    }
}

/// Splits `groups` workgroups into an `(x, y)` grid with `x` at most `max_per_dim`, for
/// kernels that fold `y` into a linear index.
pub(crate) fn grid_2d(groups: u64, max_per_dim: u32) -> (u32, u32) {
    let max = u64::from(max_per_dim.max(1));
    let x = groups.clamp(1, max);
    let y = groups.div_ceil(x).max(1);
    (x as u32, y.min(u64::from(u32::MAX)) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_2d_covers_every_group_within_the_limit() {
        for (groups, max) in [(1, 65_535), (65_535, 65_535), (65_536, 65_535), (10, 3)] {
            let (x, y) = grid_2d(groups, max);
            assert!(x <= max, "x within the limit");
            assert!(
                u64::from(x) * u64::from(y) >= groups,
                "grid covers {groups}"
            );
            assert!(
                u64::from(x) * u64::from(y - 1) < groups,
                "no fully idle row of workgroups"
            );
        }
    }
}
