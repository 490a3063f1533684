//! WGSL kernels: one file in `shaders/` and one wrapper here per kernel, with the same stem.
//!
//! A wrapper owns its pipelines, their bind-group layouts and its dispatch arithmetic, nothing
//! else, and declares them as data, a [`Spec`]: the entry points with their workgroup size,
//! workgroup memory and bindings, the uniform block's layout, and the values of the shader's
//! `override` constants (its tunables: workgroup sizes, tile sides, shared markers), which
//! are set from Rust when the pipelines are built. A unit test (`reflect` below) reflects every
//! shader with naga and compares it with its spec, so the two cannot drift apart.

pub(crate) mod common;
pub(crate) mod distance;
pub(crate) mod distance_tile;
pub(crate) mod gemm_tile;
pub(crate) mod info_nce_weights;
pub(crate) mod knn_select;
pub(crate) mod knn_sort;
pub(crate) mod loss_backward;
pub(crate) mod negative_buckets;
pub(crate) mod pair_select;
pub(crate) mod row_norms;
pub(crate) mod triplet_expand;
pub(crate) mod triplet_lists;
pub(crate) mod triplet_select;
pub(crate) mod triplet_weights;
pub(crate) mod tune;

use crate::error::{Error, Result};
use crate::runtime::device::{checked, GpuDevice};
use crate::runtime::memory::TrackedBuffer;
use crate::runtime::transfer::Recorder;

/// A WGSL kernel the crate ships: its stem (`shaders/<stem>.wgsl`), its source, and the values
/// of its pipeline-overridable constants (WGSL `override`s without a default), which the
/// crate sets when it builds the pipelines; a translation of the source needs them too.
///
/// Useful for validating the kernels offline (the crate's own tests translate each one to
/// SPIR-V, MSL, HLSL and GLSL with naga).
///
/// # Example
/// ```
/// use wgpu_metric_learning::WGSL_KERNELS;
/// let tile = WGSL_KERNELS.iter().find(|k| k.stem == "distance_tile").expect("shipped");
/// assert!(tile.source.contains("override BLOCK"));
/// assert_eq!(tile.constants, &[("BLOCK", 64.0)]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WgslKernel {
    /// The file stem: the kernel is `shaders/<stem>.wgsl`.
    pub stem: &'static str,
    /// The WGSL source.
    pub source: &'static str,
    /// `(name, value)` of every `override` the source declares without a default.
    pub constants: &'static [(&'static str, f64)],
}

/// Every WGSL kernel the crate ships, in stem order.
///
/// See the example of [`WgslKernel`].
pub const WGSL_KERNELS: &[WgslKernel] = &[
    distance_tile::SPEC.kernel,
    info_nce_weights::SPEC.kernel,
    knn_select::SPEC.kernel,
    knn_sort::SPEC.kernel,
    loss_backward::SPEC.kernel,
    negative_buckets::SPEC.kernel,
    pair_select::SPEC.kernel,
    row_norms::SPEC.kernel,
    triplet_expand::SPEC.kernel,
    triplet_lists::SPEC.kernel,
    triplet_select::SPEC.kernel,
    triplet_weights::SPEC.kernel,
];

/// Every wrapper's spec, in the order of [`WGSL_KERNELS`].
pub(crate) const SPECS: &[&Spec] = &[
    &distance_tile::SPEC,
    &info_nce_weights::SPEC,
    &knn_select::SPEC,
    &knn_sort::SPEC,
    &loss_backward::SPEC,
    &negative_buckets::SPEC,
    &pair_select::SPEC,
    &row_norms::SPEC,
    &triplet_expand::SPEC,
    &triplet_lists::SPEC,
    &triplet_select::SPEC,
    &triplet_weights::SPEC,
];

/// `Err(DeviceLimit)` naming the first limit of a device granted `limits` that one of the
/// shipped kernels' entry points exceeds: storage buffers per stage, invocations per
/// workgroup, workgroup size per dimension, workgroup memory. A GLES 3.1 device may offer 4
/// storage buffers and 128 invocations where the kernels use up to 8 and 256: better one
/// error naming the limit when the context is made than a validation error at the first call.
pub(crate) fn check_limits(op: &'static str, limits: &wgpu::Limits) -> Result<()> {
    // The most any entry point needs of each limit.
    let mut need = [0u64; 7];
    for e in SPECS.iter().flat_map(|spec| spec.entries) {
        let storage = e
            .bindings
            .iter()
            .filter(|b| b.1 != Binding::Uniform)
            .count() as u64;
        let uniforms = e.bindings.len() as u64 - storage;
        let [x, y, z] = e.workgroup_size.map(u64::from);
        let this = [storage, uniforms, x * y * z, x, y, z, e.workgroup_bytes];
        for (n, t) in need.iter_mut().zip(this) {
            *n = (*n).max(t);
        }
    }
    let limit = [
        (
            "max_storage_buffers_per_shader_stage",
            limits.max_storage_buffers_per_shader_stage,
        ),
        (
            "max_uniform_buffers_per_shader_stage",
            limits.max_uniform_buffers_per_shader_stage,
        ),
        (
            "max_compute_invocations_per_workgroup",
            limits.max_compute_invocations_per_workgroup,
        ),
        (
            "max_compute_workgroup_size_x",
            limits.max_compute_workgroup_size_x,
        ),
        (
            "max_compute_workgroup_size_y",
            limits.max_compute_workgroup_size_y,
        ),
        (
            "max_compute_workgroup_size_z",
            limits.max_compute_workgroup_size_z,
        ),
        (
            "max_compute_workgroup_storage_size",
            limits.max_compute_workgroup_storage_size,
        ),
    ];
    match need
        .into_iter()
        .zip(limit)
        .find(|&(n, (_, l))| n > u64::from(l))
    {
        Some((requested, (what, l))) => Err(Error::DeviceLimit {
            op,
            what,
            requested,
            limit: u64::from(l),
        }),
        None => Ok(()),
    }
}

/// How a kernel sees one binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Binding {
    Uniform,
    ReadOnly,
    ReadWrite,
}

/// What a wrapper expects of its shader; pipelines are built from it.
#[derive(Debug)]
pub(crate) struct Spec {
    pub(crate) kernel: WgslKernel,
    pub(crate) entries: &'static [Entry],
    /// The uniform block, `struct Params` in the shader.
    #[cfg_attr(not(test), allow(dead_code, reason = "read by the reflection test"))]
    pub(crate) params: Layout,
    /// `(name, value)` of the kernel's own WGSL `const` codes that Rust sets in its `Params`
    /// (checked by reflection; the common parts' codes are in [`common::codes`]).
    #[cfg_attr(not(test), allow(dead_code, reason = "read by the reflection test"))]
    pub(crate) codes: &'static [(&'static str, u32)],
}

/// One compute entry point.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) name: &'static str,
    pub(crate) workgroup_size: [u32; 3],
    /// Bytes of workgroup memory the entry point uses.
    pub(crate) workgroup_bytes: u64,
    /// `(@binding, kind, bytes per element)` of every buffer it uses (group 0), in the order
    /// `dispatch` takes them; a uniform's element is the whole block.
    pub(crate) bindings: &'static [(u32, Binding, u64)],
}

/// A `#[repr(C)]` uniform block: its size and `(field, byte offset)`; fields named `_pad…`
/// are padding, absent from the shader.
#[derive(Debug)]
#[cfg_attr(not(test), allow(dead_code, reason = "read by the reflection test"))]
pub(crate) struct Layout {
    pub(crate) size: usize,
    pub(crate) fields: &'static [(&'static str, usize)],
}

/// `(field, offset)` pairs of a `#[repr(C)]` struct, for a [`Layout`].
macro_rules! fields {
    ($ty:ty: $($field:ident),* $(,)?) => {
        &[$((stringify!($field), std::mem::offset_of!($ty, $field))),*]
    };
}
pub(crate) use fields;

impl Spec {
    fn entry(&self, name: &str) -> Result<&Entry> {
        self.entries
            .iter()
            .find(|e| e.name == name)
            .ok_or_else(|| Error::Internal {
                op: self.kernel.stem,
                message: format!("no entry point {name} in its spec"),
            })
    }
}

/// A compute pipeline with an explicit bind-group layout (auto layouts are slow to query and
/// hide mismatches between the WGSL and the Rust side).
pub(crate) struct Pipeline {
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) layout: wgpu::BindGroupLayout,
    /// `"<stem>::<entry>"`, for labels and errors.
    label: String,
    /// The kernel's stem, for its timings.
    stem: &'static str,
    /// The `@binding` number of each buffer [`Pipeline::dispatch`] is given, in order.
    slots: Vec<u32>,
}

impl Pipeline {
    /// Compiles `entry` of `spec`'s kernel with its spec's bindings at group 0 and the spec's
    /// override constants, under an error scope so that a bad shader is an `Error::Wgpu`
    /// naming the kernel, not a panic.
    pub(crate) fn new(gpu: &GpuDevice, spec: &'static Spec, entry: &'static str) -> Result<Self> {
        Self::build(gpu, spec, entry, false)
    }

    /// [`Pipeline::new`] for a kernel whose every index is bounded by construction: the
    /// module is built without naga's bounds checks and loop bounding (trusted), unless the
    /// context asks for checked modules ([`crate::ShaderChecks`]). The kernel's wrapper says
    /// why it is safe.
    pub(crate) fn new_trusted(
        gpu: &GpuDevice,
        spec: &'static Spec,
        entry: &'static str,
    ) -> Result<Self> {
        Self::build(gpu, spec, entry, !gpu.checked_shaders)
    }

    fn build(
        gpu: &GpuDevice,
        spec: &'static Spec,
        entry: &'static str,
        trusted: bool,
    ) -> Result<Self> {
        let e = spec.entry(entry)?;
        let label = format!("{}::{}", spec.kernel.stem, entry);
        let entries: Vec<wgpu::BindGroupLayoutEntry> = e
            .bindings
            .iter()
            .map(|&(slot, b, _)| wgpu::BindGroupLayoutEntry {
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
        checked(gpu, spec.kernel.stem, || {
            let _guard = crate::runtime::device::lifecycle_lock();
            let desc = wgpu::ShaderModuleDescriptor {
                label: Some(&label),
                source: wgpu::ShaderSource::Wgsl(spec.kernel.source.into()),
            };
            let module = if trusted {
                // SAFETY: only kernels whose every index is bounded by construction (their
                // wrapper says how) and whose loops all terminate are built trusted.
                unsafe {
                    gpu.device
                        .create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked())
                }
            } else {
                gpu.device.create_shader_module(desc)
            };
            let layout = gpu
                .device
                .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                    label: Some(&label),
                    entries: &entries,
                });
            let pipeline_layout =
                gpu.device
                    .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                        label: Some(&label),
                        bind_group_layouts: &[Some(&layout)],
                        immediate_size: 0,
                    });
            let pipeline = gpu
                .device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(&label),
                    layout: Some(&pipeline_layout),
                    module: &module,
                    entry_point: Some(entry),
                    compilation_options: wgpu::PipelineCompilationOptions {
                        constants: spec.kernel.constants,
                        // Every kernel stages before it reads its workgroup memory.
                        zero_initialize_workgroup_memory: false,
                    },
                    cache: None,
                });
            Self {
                pipeline,
                layout,
                slots: e.bindings.iter().map(|&(slot, _, _)| slot).collect(),
                label: label.clone(),
                stem: spec.kernel.stem,
            }
        })
    }

    /// Records one dispatch of this pipeline over `buffers` (bound in the order of its
    /// entry's bindings) into `rec`.
    pub(crate) fn dispatch(
        &self,
        rec: &mut Recorder<'_>,
        buffers: &[&TrackedBuffer],
        workgroups: [u32; 3],
    ) -> Result<()> {
        let whole: Vec<_> = buffers.iter().map(|&b| (b, None)).collect();
        self.dispatch_ranges(rec, &whole, workgroups)
    }

    /// [`Pipeline::dispatch`] with some buffers bound as a byte range `(offset, size)` of
    /// themselves (a window of an array larger than one binding may be).
    pub(crate) fn dispatch_ranges(
        &self,
        rec: &mut Recorder<'_>,
        buffers: &[(&TrackedBuffer, Option<(u64, u64)>)],
        workgroups: [u32; 3],
    ) -> Result<()> {
        let group = self.bind_ranges(rec.gpu(), buffers)?;
        let tracked: Vec<&TrackedBuffer> = buffers.iter().map(|b| b.0).collect();
        rec.dispatch(
            &self.label,
            self.stem,
            &self.pipeline,
            &group,
            &tracked,
            workgroups,
        )
    }

    /// A bind group of `buffers` (whole) for this pipeline, in its bindings' order.
    pub(crate) fn bind(
        &self,
        gpu: &GpuDevice,
        buffers: &[&TrackedBuffer],
    ) -> Result<wgpu::BindGroup> {
        let whole: Vec<_> = buffers.iter().map(|&b| (b, None)).collect();
        self.bind_ranges(gpu, &whole)
    }

    fn bind_ranges(
        &self,
        gpu: &GpuDevice,
        buffers: &[(&TrackedBuffer, Option<(u64, u64)>)],
    ) -> Result<wgpu::BindGroup> {
        if let Some((b, _)) = buffers
            .iter()
            .find(|b| b.1.is_some_and(|(_, size)| size == 0))
        {
            // A zero size would bind the rest of the buffer.
            return Err(Error::Internal {
                op: "dispatch",
                message: format!("{}: an empty range of {}", self.label, b.buffer().size()),
            });
        }
        if buffers.len() != self.slots.len() {
            return Err(Error::Internal {
                op: "dispatch",
                message: format!(
                    "{}: {} buffers for {} bindings",
                    self.label,
                    buffers.len(),
                    self.slots.len()
                ),
            });
        }
        let entries: Vec<wgpu::BindGroupEntry> = buffers
            .iter()
            .zip(&self.slots)
            .map(|(&(b, range), &slot)| wgpu::BindGroupEntry {
                binding: slot,
                resource: match range {
                    None => b.buffer().as_entire_binding(),
                    Some((offset, size)) => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: b.buffer(),
                        offset,
                        size: wgpu::BufferSize::new(size),
                    }),
                },
            })
            .collect();
        checked(gpu, "bind group", || {
            gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&self.label),
                layout: &self.layout,
                entries: &entries,
            })
        })
    }
}

/// `Ok` when no dimension of a grid of `groups` workgroups exceeds the device's
/// `max_compute_workgroups_per_dimension`; else [`Error::DeviceLimit`] naming `op` and the
/// largest dimension.
pub(crate) fn within_dispatch_limit(
    gpu: &GpuDevice,
    op: &'static str,
    groups: &[u64],
) -> Result<()> {
    let limit = u64::from(gpu.limits.max_compute_workgroups_per_dimension);
    let requested = groups.iter().copied().max().unwrap_or(0);
    if requested > limit {
        return Err(Error::DeviceLimit {
            op,
            what: "max_compute_workgroups_per_dimension",
            requested,
            limit,
        });
    }
    Ok(())
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
mod reflect;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_fit_webgpu_default_limits_but_not_gles_downlevel_ones() {
        assert!(
            check_limits("t", &wgpu::Limits::default()).is_ok(),
            "WebGPU defaults"
        );
        let gles = wgpu::Limits::downlevel_defaults();
        match check_limits("t", &gles) {
            Err(Error::DeviceLimit {
                what,
                requested,
                limit,
                ..
            }) => {
                assert!(requested > limit, "{what}: {requested} > {limit}");
            }
            other => panic!("GLES 3.1 downlevel limits: {other:?}"),
        }
        let four = wgpu::Limits {
            max_storage_buffers_per_shader_stage: 4,
            ..wgpu::Limits::default()
        };
        assert!(matches!(
            check_limits("t", &four),
            Err(Error::DeviceLimit {
                what: "max_storage_buffers_per_shader_stage",
                requested: 8,
                limit: 4,
                ..
            })
        ));
    }

    #[test]
    fn kernel_times_have_a_slot_for_every_kernel() {
        let mut stems: Vec<&str> = WGSL_KERNELS.iter().map(|k| k.stem).collect();
        stems.push("gemm_tile");
        stems.sort_unstable();
        assert_eq!(
            stems,
            crate::runtime::memory::KERNEL_STEMS,
            "memory::KERNEL_STEMS"
        );
    }

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
