//! Wrapper of `shaders/distance_tile.wgsl`: one `(rows, cols)` tile of a distance matrix.

use std::sync::OnceLock;

use crate::device::{GpuDevice, Kernel};
use crate::error::Result;
use crate::kernels::gemm_tile::{DistanceKernel, GemmTile};
use crate::kernels::tune;
use crate::kernels::{fields, Binding, Entry, Layout, Pipeline, Spec, WgslKernel};
use crate::memory::TrackedBuffer;
use crate::transfer::Recorder;

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
        source: include_str!("../../shaders/distance_tile.wgsl"),
        constants: &[("BLOCK", BLOCK as f64)],
    },
    entries: &[Entry {
        name: "main",
        workgroup_size: [THREADS, THREADS, 1],
        workgroup_bytes: WORKGROUP_STORAGE,
        bindings: BINDINGS,
    }],
    params: PARAMS_LAYOUT,
};

/// The distance tile: which kernel computes it (the context's setting) and the hand-written
/// kernel's pipeline, compiled on first use.
pub(crate) struct DistanceTile {
    setting: DistanceKernel,
    hand_written: OnceLock<Pipeline>,
}

impl Kernel for DistanceTile {
    fn build(_gpu: &GpuDevice) -> Result<Self> {
        Ok(Self::with_setting(DistanceKernel::Tuned))
    }
}

impl DistanceTile {
    /// The tile as `setting` asks (installed on each device when its context is made).
    pub(crate) fn with_setting(setting: DistanceKernel) -> Self {
        Self {
            setting,
            hand_written: OnceLock::new(),
        }
    }

    fn hand_written(&self, gpu: &GpuDevice) -> Result<&Pipeline> {
        if let Some(p) = self.hand_written.get() {
            return Ok(p);
        }
        let built = Pipeline::new(gpu, &SPEC, "main")?;
        // Two threads racing here merely build it twice.
        Ok(self.hand_written.get_or_init(|| built))
    }
}

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

impl DistanceTile {
    /// Workgroups `(x, y)` for a tile of `rows` queries × `cols` refs.
    pub(crate) fn workgroups(rows: u64, cols: u64) -> (u64, u64) {
        (cols.div_ceil(BLOCK).max(1), rows.div_ceil(BLOCK).max(1))
    }

    /// Records the tile `out[r * out_stride + out_col0 + c] = metric(queries[r], refs[c])`
    /// described by `p` (which the caller uploads to `b.params`): by the GEMM variant the
    /// context's [`DistanceKernel`] setting picks for this shape, or by this hand-written
    /// kernel where none fits the device. Every choice gives the same bits.
    pub(crate) fn encode(
        &self,
        rec: &mut Recorder<'_>,
        p: &Params,
        b: &TileBuffers<'_>,
    ) -> Result<()> {
        let gpu = rec.gpu();
        let (rows, cols) = (u64::from(p.rows), u64::from(p.cols));
        if self.setting != DistanceKernel::HandWritten {
            let family = gpu.kernel::<GemmTile>()?;
            let variant = match self.setting {
                DistanceKernel::Variant(v) if v.fits(&gpu.limits) => Some(v),
                _ => tune::choose(rec, &family, p, b)?,
            };
            if let Some(v) = variant {
                return family.encode(rec, v, p, b);
            }
        }
        let (x, y) = Self::workgroups(rows, cols);
        super::within_dispatch_limit(gpu, "distance_tile", &[x, y])?;
        self.hand_written(gpu)?
            .dispatch(rec, &b.in_order(), [x as u32, y as u32, 1])
    }
}
