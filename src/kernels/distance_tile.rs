//! Wrapper of `shaders/distance_tile.wgsl`: one `(rows, cols)` tile of a distance matrix.

//! Its bindings and `Params` are shared by the generated GEMM family (`gemm_tile`); which of
//! them computes a tile is `kernels::distance`'s choice.

use crate::kernels::common::wgsl;
use crate::kernels::{fields, Binding, Entry, Layout, Spec, WgslKernel};
use crate::runtime::memory::TrackedBuffer;

/// Rows and columns of the tile one workgroup computes; `BLOCK` in the shader, set from here.
pub(crate) const BLOCK: u64 = 64;

/// Invocations per side of a workgroup: each computes a 4 × 4 block.
const THREADS: u32 = (BLOCK / 4) as u32;

// The shader stages each slab with 4 · THREADS invocations per side: the workgroup
// (THREADS² invocations) must hold both sides' stagers, and BLOCK must split into 4 × 4 blocks.
const _: () = assert!(
    BLOCK.is_multiple_of(4) && THREADS >= 8,
    "BLOCK: a multiple of 4, at least 32"
);

/// Workgroup memory: two slabs of 16 depths × `THREADS` `vec4<f32>`.
pub(crate) const WORKGROUP_STORAGE: u64 = 2 * 16 * THREADS as u64 * 16;

/// The kernel's uniform block, laid out as `Params` in the shader.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    pub(crate) rows: u32,
    pub(crate) cols: u32,
    pub(crate) dim4: u32,
    pub(crate) metric: u32,
    pub(crate) normalize: u32,
    /// Row length of the output matrix (`cols` for a standalone tile).
    pub(crate) out_stride: u32,
    /// First output column of the tile (0 for a standalone tile).
    pub(crate) out_col0: u32,
    /// Row of the refs buffer holding reference 0 of the tile.
    pub(crate) ref_row0: u32,
}

/// The tile's bindings, in `dispatch` order ([`TileBuffers::in_order`]): shared by the
/// generated GEMM family, which takes the same `Params` and buffers.
pub(crate) const BINDINGS: &[(u32, Binding, u64)] = &[
    (0, Binding::Uniform, std::mem::size_of::<Params>() as u64),
    (1, Binding::ReadOnly, 16),
    (2, Binding::ReadOnly, 16),
    (3, Binding::ReadOnly, 4),
    (4, Binding::ReadOnly, 4),
    (5, Binding::ReadWrite, 4),
];

/// `Params`' layout, as the shaders of the tile and of the GEMM family declare it.
pub(crate) const PARAMS_LAYOUT: Layout = Layout {
    size: std::mem::size_of::<Params>(),
    fields: fields!(Params: rows, cols, dim4, metric, normalize, out_stride, out_col0, ref_row0),
};

pub(crate) const SPEC: Spec = Spec {
    kernel: WgslKernel {
        stem: "distance_tile",
        source: wgsl!("distance_tile", "metric", "tile"),
        constants: &[("BLOCK", BLOCK as f64)],
    },
    entries: &[Entry {
        name: "main",
        workgroup_size: [THREADS, THREADS, 1],
        workgroup_bytes: WORKGROUP_STORAGE,
        bindings: BINDINGS,
    }],
    params: PARAMS_LAYOUT,
    codes: &[],
};

/// Buffers of one tile, in binding order after the uniform.
pub(crate) struct TileBuffers<'a> {
    pub(crate) params: &'a TrackedBuffer,
    pub(crate) queries: &'a TrackedBuffer,
    pub(crate) refs: &'a TrackedBuffer,
    pub(crate) query_sq_norms: &'a TrackedBuffer,
    pub(crate) ref_sq_norms: &'a TrackedBuffer,
    pub(crate) out: &'a TrackedBuffer,
}

impl<'a> TileBuffers<'a> {
    /// The buffers in the order of [`BINDINGS`].
    pub(crate) fn in_order(&self) -> [&'a TrackedBuffer; 6] {
        [
            self.params,
            self.queries,
            self.refs,
            self.query_sq_norms,
            self.ref_sq_norms,
            self.out,
        ]
    }
}
