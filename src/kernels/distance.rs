//! The distance tile as the operations ask for it: the context's [`DistanceKernel`] setting
//! picks a GEMM variant (`gemm_tile`, tuned per device and shape by `tune`) or the hand-written
//! kernel (`distance_tile`). Above both stems and the tuner, so that none of them imports
//! another in a circle.

use std::sync::OnceLock;

use crate::error::Result;
use crate::kernels::distance_tile::{self, Params, TileBuffers};
use crate::kernels::gemm_tile::{GemmTile, GemmVariant};
use crate::kernels::{self, tune, Pipeline};
use crate::runtime::device::{GpuDevice, Kernel};
use crate::runtime::transfer::Recorder;

/// Which kernel computes distance tiles: the tuned GEMM family, one variant of it, or the
/// hand-written 64 × 64 kernel (`shaders/distance_tile.wgsl`). All give the same bits; this is
/// for benchmarks and tests.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{ContextConfig, DistanceKernel, GemmVariant};
/// let v = GemmVariant::parse("64x64x16_4x4_db").expect("a variant");
/// let cfg = ContextConfig { distance_kernel: DistanceKernel::Variant(v), ..Default::default() };
/// assert_eq!(DistanceKernel::default(), DistanceKernel::Tuned);
/// # let _ = cfg;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DistanceKernel {
    /// The GEMM variant [`Tuning`](crate::Tuning) picks per shape (the hand-written kernel where none fits).
    #[default]
    Tuned,
    /// This GEMM variant wherever it fits the device (the tuned choice where it does not).
    Variant(GemmVariant),
    /// The hand-written kernel.
    HandWritten,
}

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
        let built = Pipeline::new(gpu, &distance_tile::SPEC, "main")?;
        // Two threads racing here merely build it twice.
        Ok(self.hand_written.get_or_init(|| built))
    }
}

impl DistanceTile {
    /// Workgroups `(x, y)` for a tile of `rows` queries × `cols` refs.
    pub(crate) fn workgroups(rows: u64, cols: u64) -> (u64, u64) {
        (
            cols.div_ceil(distance_tile::BLOCK).max(1),
            rows.div_ceil(distance_tile::BLOCK).max(1),
        )
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
        kernels::within_dispatch_limit(gpu, "distance_tile", &[x, y])?;
        self.hand_written(gpu)?
            .dispatch(rec, &b.in_order(), [x as u32, y as u32, 1])
    }
}
