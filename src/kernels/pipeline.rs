//! Building and dispatching a kernel's pipelines from its [`Spec`]: explicit bind-group
//! layouts, one pipeline per entry point, and the dispatch limits.

use crate::error::{Error, Result};
use crate::runtime::device::{checked, GpuDevice};
use crate::runtime::memory::TrackedBuffer;
use crate::runtime::transfer::Recorder;

use super::WgslKernel;

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
    /// (checked by reflection; the common parts' codes are in `common::codes`).
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
