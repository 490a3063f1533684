//! WGSL kernels: one file in `shaders/` and one wrapper here per kernel, with the same stem.
//!
//! A wrapper owns its pipelines, their bind-group layouts and its dispatch arithmetic, nothing
//! else, and declares them as data, a [`Spec`]: the entry points with their workgroup size,
//! workgroup memory and bindings, the uniform block's layout, and the values of the shader's
//! `override` constants (its tunables: workgroup sizes, tile sides, shared markers), which
//! are set from Rust when the pipelines are built (`pipeline.rs`). A unit test (`reflect`
//! below) reflects every shader with naga and compares it with its spec, so the two cannot
//! drift apart. This file is the catalogue: every shipped kernel and the device limits they
//! need.

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
pub(crate) mod pair_weights;
mod pipeline;
pub(crate) mod row_norms;
pub(crate) mod triplet_expand;
pub(crate) mod triplet_lists;
pub(crate) mod triplet_select;
pub(crate) mod triplet_weights;
pub(crate) mod tune;

use crate::error::{Error, Result};

pub(crate) use pipeline::{
    fields, grid_2d, within_dispatch_limit, Binding, Entry, Layout, Pipeline, Spec,
};

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
    pair_weights::SPEC.kernel,
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
    &pair_weights::SPEC,
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
