//! The register-blocked distance GEMM family: `shaders/gemm_tile.wgsl` (bindings, uniform
//! block, metric epilogue) plus an entry point generated here for each [`GemmVariant`].
//!
//! A variant is a block tile `BM × BN` of outputs per workgroup, a depth step `BK`, a thread
//! tile `TM × TN` per invocation (held in named `vec4` accumulators: no dynamically indexed
//! arrays), and single or double-buffered workgroup staging (the next depth step is fetched
//! into registers while the current one is multiplied, with one barrier per step). Staging
//! loads 4 × 4 blocks (four rows, one `vec4` of depth) and stores them transposed as four
//! whole vectors, depth-major, each depth row padded by one `vec4` against bank conflicts. An
//! invocation's rows (and columns) are `vec4` groups `TY` (`TX`) apart, so that neighbouring
//! invocations read neighbouring vectors. The depth step and the thread tile are unrolled.
//!
//! Every variant computes each output as one fused multiply-add chain over the dimension,
//! ascending, from +0: the same bits as every other variant and as `distance_tile.wgsl`
//! (tested on every variant). The tuner (`kernels::tune`) picks a variant per device and shape.
//!
//! Modules are built trusted (no bounds checks, no loop bounding; see `GemmTile`'s `build`).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::kernels::common::wgsl;
use crate::kernels::distance_tile::{Params, TileBuffers, BINDINGS, PARAMS_LAYOUT};
use crate::kernels::{Entry, Pipeline, Spec, WgslKernel};
use crate::runtime::device::GpuDevice;
use crate::runtime::transfer::Recorder;

/// A shape bucket of the tuner's choices: powers of two of rows, columns and depth (`vec4`s).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Bucket {
    pub(crate) rows: u32,
    pub(crate) cols: u32,
    pub(crate) dim4: u32,
}

impl Bucket {
    pub(crate) fn of(rows: u64, cols: u64, dim4: u64) -> Self {
        let pow2 = |x: u64, lo: u64, hi: u64| x.clamp(lo, hi).next_power_of_two() as u32;
        Self {
            rows: pow2(rows, 64, 4096),
            cols: pow2(cols, 64, 65_536),
            dim4: pow2(dim4, 1, 256),
        }
    }

    pub(crate) fn label(&self) -> String {
        format!("{}x{}x{}", self.rows, self.cols, 4 * self.dim4)
    }
}

/// The family's shared WGSL (everything but the generated entry point).
const PRELUDE: &str = wgsl!("gemm_tile", "metric", "tile");

/// One member of the GEMM family: tile shape, depth step and staging.
///
/// `threads() = (bm / tm) · (bn / tn)` invocations per workgroup; valid when `tm` and `tn`
/// are 4 or 8, `bk` is 4–32 and a multiple of 4, `bm` and `bn` are multiples of `tm` and
/// `tn`, and the workgroup has 32–256 invocations ([`GemmVariant::is_valid`]).
///
/// # Example
/// ```
/// use wgpu_metric_learning::GemmVariant;
/// let v = GemmVariant::parse("128x128x16_8x8_db").expect("a name");
/// assert_eq!((v.threads(), v.double_buffer), (256, true));
/// assert_eq!(v.name(), "128x128x16_8x8_db");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GemmVariant {
    /// Output rows (queries) per workgroup.
    pub bm: u32,
    /// Output columns (references) per workgroup.
    pub bn: u32,
    /// Floats of depth staged per step.
    pub bk: u32,
    /// Output rows per invocation.
    pub tm: u32,
    /// Output columns per invocation.
    pub tn: u32,
    /// Two staging buffers (fetch the next step while multiplying this one).
    pub double_buffer: bool,
}

/// The variants the tuner times, smallest first (the untuned default is
/// `128x128x16_8x8`, else `64x64x16_4x4`: see [`crate::Tuning::Off`]).
pub const GEMM_CANDIDATES: &[GemmVariant] = &[
    v(64, 64, 16, 4, 4, true),
    v(64, 64, 16, 4, 4, false),
    v(64, 64, 32, 4, 4, true),
    v(128, 64, 16, 8, 4, true),
    // Two staging slots per invocation, the second half-used: the generator's partial-slot
    // path, small enough (25.6 KiB) for lavapipe's tests.
    v(128, 64, 32, 8, 4, false),
    v(64, 128, 16, 4, 8, true),
    v(128, 128, 8, 8, 8, true),
    v(128, 128, 16, 8, 8, true),
    v(128, 128, 16, 8, 8, false),
    v(128, 128, 32, 8, 8, false),
];

const fn v(bm: u32, bn: u32, bk: u32, tm: u32, tn: u32, double_buffer: bool) -> GemmVariant {
    GemmVariant {
        bm,
        bn,
        bk,
        tm,
        tn,
        double_buffer,
    }
}

impl GemmVariant {
    /// Invocations per workgroup.
    ///
    /// See the example of [`GemmVariant`].
    pub const fn threads(&self) -> u32 {
        (self.bm / self.tm) * (self.bn / self.tn)
    }

    /// Whether the generator supports this shape (see [`GemmVariant`]).
    ///
    /// # Example
    /// ```
    /// use wgpu_metric_learning::GemmVariant;
    /// assert!(GemmVariant::parse("64x64x16_4x4").is_some_and(|v| v.is_valid()));
    /// assert!(GemmVariant::parse("64x64x6_4x4").is_none()); // bk not a multiple of 4
    /// ```
    pub fn is_valid(&self) -> bool {
        matches!(self.tm, 4 | 8)
            && matches!(self.tn, 4 | 8)
            && self.bk.is_multiple_of(4)
            && (4..=32).contains(&self.bk)
            && self.bm.is_multiple_of(self.tm)
            && self.bn.is_multiple_of(self.tn)
            && (32..=256).contains(&self.threads())
    }

    /// Bytes of workgroup memory it uses.
    ///
    /// # Example
    /// ```
    /// use wgpu_metric_learning::GemmVariant;
    /// let v = GemmVariant::parse("128x128x16_8x8_db").expect("a name");
    /// assert_eq!(v.workgroup_bytes(), 2 * 16 * (33 + 33) * 16);
    /// ```
    pub fn workgroup_bytes(&self) -> u64 {
        let stages = if self.double_buffer { 2 } else { 1 };
        u64::from(stages * self.bk * (self.bm / 4 + 1 + self.bn / 4 + 1)) * 16
    }

    /// Its name, `BMxBNxBK_TMxTN` with `_db` when double-buffered.
    ///
    /// See the example of [`GemmVariant`].
    pub fn name(&self) -> String {
        format!(
            "{}x{}x{}_{}x{}{}",
            self.bm,
            self.bn,
            self.bk,
            self.tm,
            self.tn,
            if self.double_buffer { "_db" } else { "" }
        )
    }

    /// The variant a name from [`GemmVariant::name`] stands for, if it is valid.
    ///
    /// See the example of [`GemmVariant`].
    pub fn parse(name: &str) -> Option<Self> {
        let (body, double_buffer) = match name.strip_suffix("_db") {
            Some(b) => (b, true),
            None => (name, false),
        };
        let (block, thread) = body.split_once('_')?;
        let b: Vec<u32> = block
            .split('x')
            .map(str::parse)
            .collect::<std::result::Result<_, _>>()
            .ok()?;
        let t: Vec<u32> = thread
            .split('x')
            .map(str::parse)
            .collect::<std::result::Result<_, _>>()
            .ok()?;
        let variant = match (b.as_slice(), t.as_slice()) {
            (&[bm, bn, bk], &[tm, tn]) => v(bm, bn, bk, tm, tn, double_buffer),
            _ => return None,
        };
        variant.is_valid().then_some(variant)
    }

    /// Whether a device granted `limits` can run it.
    pub(crate) fn fits(&self, limits: &wgpu::Limits) -> bool {
        self.is_valid()
            && self.workgroup_bytes() <= u64::from(limits.max_compute_workgroup_storage_size)
            && self.threads() <= limits.max_compute_invocations_per_workgroup
            && self.threads() <= limits.max_compute_workgroup_size_x
    }

    /// Workgroups `(x, y)` for a tile of `rows` queries × `cols` refs.
    pub(crate) fn workgroups(&self, rows: u64, cols: u64) -> (u64, u64) {
        (
            cols.div_ceil(u64::from(self.bn)).max(1),
            rows.div_ceil(u64::from(self.bm)).max(1),
        )
    }

    /// The complete WGSL: the prelude and this variant's generated entry point.
    ///
    /// # Example
    /// ```
    /// use wgpu_metric_learning::GEMM_CANDIDATES;
    /// let wgsl = GEMM_CANDIDATES[0].source();
    /// assert!(wgsl.contains("fn main("));
    /// ```
    pub fn source(&self) -> String {
        let mut s = String::with_capacity(PRELUDE.len() + (16 << 10));
        s.push_str(PRELUDE);
        generate(self, &mut s);
        s
    }
}

/// Appends `v`'s constants, workgroup memory and entry point to `s`.
fn generate(v: &GemmVariant, s: &mut String) {
    let (tx, ty) = (v.bn / v.tn, v.bm / v.tm);
    let (bm4, bn4, bk4) = (v.bm / 4, v.bn / 4, v.bk / 4);
    let (stride_a, stride_b) = (bm4 + 1, bn4 + 1);
    let stages = if v.double_buffer { 2 } else { 1 };
    let (stage_a, stage_b) = (v.bk * stride_a, v.bk * stride_b);
    let threads = v.threads();
    let a_blocks = bm4 * bk4;
    let total_blocks = (bm4 + bn4) * bk4;
    let slots = total_blocks.div_ceil(threads);
    let (sa, sb) = (v.tm / 4, v.tn / 4);
    // `writeln!` into a String cannot fail.
    macro_rules! w {
        ($($arg:tt)*) => { let _ = writeln!(s, $($arg)*); };
    }
    w!("\n// ---- generated: variant {} ----", v.name());
    w!(
        "var<workgroup> a_tile: array<vec4<f32>, {}>;",
        stages * stage_a
    );
    w!(
        "var<workgroup> b_tile: array<vec4<f32>, {}>;",
        stages * stage_b
    );
    w!("");
    w!("@compute @workgroup_size({threads}, 1, 1)");
    w!("fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{");
    w!("    let tx = tid % {tx}u;");
    w!("    let ty = tid / {tx}u;");
    w!("    let base_row = wid.y * {}u;", v.bm);
    w!("    let base_col = wid.x * {}u;", v.bn);
    w!("    let ktiles = (params.dim4 + {}u) / {bk4}u;", bk4 - 1);
    // Staging slots: block `slot * threads + tid` of the (A blocks, then B blocks) list; a
    // block is 4 rows (group g) at vec4 kq of the depth step, kq varying fastest so that a
    // row's BK floats are read by neighbouring invocations.
    for p in 0..slots {
        w!("    let id{p} = {}u + tid;", p * threads);
        w!("    let on{p} = id{p} < {total_blocks}u;");
        w!("    let a{p} = id{p} < {a_blocks}u;");
        w!("    let ix{p} = select(id{p} - {a_blocks}u, id{p}, a{p});");
        w!("    let g{p} = ix{p} / {bk4}u;");
        w!("    let kq{p} = ix{p} % {bk4}u;");
        w!("    let first{p} = select(base_col, base_row, a{p}) + 4u * g{p};");
        w!("    let side{p} = select(1u, 0u, a{p});");
        for r in 0..4 {
            w!("    var p{p}_{r} = vec4<f32>(0.0);");
        }
    }
    for i in 0..v.tm {
        for t in 0..sb {
            w!("    var c{i}_{t} = vec4<f32>(0.0);");
        }
    }
    let fetch = |s: &mut String, kt: &str| {
        for p in 0..slots {
            let _ = writeln!(s, "    if (on{p}) {{");
            for r in 0..4 {
                let _ = writeln!(
                    s,
                    "        p{p}_{r} = load(side{p}, first{p} + {r}u, {kt} * {bk4}u + kq{p});"
                );
            }
            let _ = writeln!(s, "    }}");
        }
    };
    // The 4 x 4 block transposed into four depth rows; index bounds: g < BM/4 (A) or BN/4
    // (B), 4 kq + 3 < BK, stage < stages.
    let store = |s: &mut String, stage: &str| {
        for p in 0..slots {
            let _ = writeln!(s, "    if (on{p}) {{");
            let comps = ["x", "y", "z", "w"];
            for (c, comp) in comps.iter().enumerate() {
                let _ = writeln!(
                    s,
                    "        let t{c} = vec4<f32>(p{p}_0.{comp}, p{p}_1.{comp}, p{p}_2.{comp}, p{p}_3.{comp});"
                );
            }
            let _ = writeln!(s, "        if (a{p}) {{");
            for c in 0..4 {
                let _ = writeln!(
                    s,
                    "            a_tile[{stage} * {stage_a}u + (4u * kq{p} + {c}u) * {stride_a}u + g{p}] = t{c};"
                );
            }
            let _ = writeln!(s, "        }} else {{");
            for c in 0..4 {
                let _ = writeln!(
                    s,
                    "            b_tile[{stage} * {stage_b}u + (4u * kq{p} + {c}u) * {stride_b}u + g{p}] = t{c};"
                );
            }
            let _ = writeln!(s, "        }}");
            let _ = writeln!(s, "    }}");
        }
    };
    let compute = |s: &mut String, stage: &str| {
        let comps = ["x", "y", "z", "w"];
        for k in 0..v.bk {
            let _ = writeln!(s, "        {{");
            for i in 0..sa {
                let _ = writeln!(
                    s,
                    "            let a{i} = a_tile[{stage} * {stage_a}u + {}u + ty + {}u];",
                    k * stride_a,
                    i * ty
                );
            }
            for t in 0..sb {
                let _ = writeln!(
                    s,
                    "            let b{t} = b_tile[{stage} * {stage_b}u + {}u + tx + {}u];",
                    k * stride_b,
                    t * tx
                );
            }
            for i in 0..sa {
                for (e, comp) in comps.iter().enumerate() {
                    let row = 4 * i + e as u32;
                    for t in 0..sb {
                        let _ = writeln!(
                            s,
                            "            c{row}_{t} = fma(vec4<f32>(a{i}.{comp}), b{t}, c{row}_{t});"
                        );
                    }
                }
            }
            let _ = writeln!(s, "        }}");
        }
    };
    if v.double_buffer {
        w!("    if (ktiles > 0u) {{");
        fetch(s, "0u");
        store(s, "0u");
        w!("    }}");
        w!("    workgroupBarrier();");
        w!("    for (var kt = 0u; kt < ktiles; kt++) {{");
        w!("        let cur = kt & 1u;");
        w!("        let more = kt + 1u < ktiles;");
        w!("        if (more) {{");
        fetch(s, "(kt + 1u)");
        w!("        }}");
        compute(s, "cur");
        w!("        if (more) {{");
        store(s, "(cur ^ 1u)");
        w!("        }}");
        w!("        workgroupBarrier();");
        w!("    }}");
    } else {
        w!("    for (var kt = 0u; kt < ktiles; kt++) {{");
        fetch(s, "kt");
        store(s, "0u");
        w!("        workgroupBarrier();");
        compute(s, "0u");
        w!("        workgroupBarrier();");
        w!("    }}");
    }
    // Epilogue: each row's and column's terms once, then every output in range.
    for i in 0..sa {
        for e in 0..4 {
            let row = 4 * i + e;
            w!(
                "    let row{row} = base_row + 4u * (ty + {}u) + {e}u;",
                i * ty
            );
            w!("    let q{row} = query_terms(row{row});");
        }
    }
    for t in 0..sb {
        for f in 0..4 {
            let col = 4 * t + f;
            w!(
                "    let col{col} = base_col + 4u * (tx + {}u) + {f}u;",
                t * tx
            );
            w!("    let r{col} = ref_terms(col{col});");
        }
    }
    let comps = ["x", "y", "z", "w"];
    for row in 0..v.tm {
        w!("    if (row{row} < params.rows) {{");
        for t in 0..sb {
            for (f, comp) in comps.iter().enumerate() {
                let col = 4 * t + f as u32;
                w!("        if (col{col} < params.cols) {{");
                w!("            store(row{row}, col{col}, metric(c{row}_{t}.{comp}, q{row}, r{col}));");
                w!("        }}");
            }
        }
        w!("    }}");
    }
    w!("}}");
}

/// The `'static` spec of `v` (its generated source, entry and bindings), made once per
/// variant per process: the pipeline machinery and the reflection tests take specs.
pub(crate) fn spec(v: GemmVariant) -> &'static Spec {
    static SPECS: OnceLock<Mutex<HashMap<GemmVariant, &'static Spec>>> = OnceLock::new();
    let map = SPECS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = map
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    map.entry(v).or_insert_with(|| {
        // Leaked on purpose: one small spec per variant, for the process's life.
        let source: &'static str = Box::leak(v.source().into_boxed_str());
        let entries: &'static [Entry] = Box::leak(Box::new([Entry {
            name: "main",
            workgroup_size: [v.threads(), 1, 1],
            workgroup_bytes: v.workgroup_bytes(),
            bindings: BINDINGS,
        }]));
        Box::leak(Box::new(Spec {
            kernel: WgslKernel {
                stem: "gemm_tile",
                source,
                constants: &[],
            },
            entries,
            params: PARAMS_LAYOUT,
            codes: &[],
        }))
    })
}

/// Every candidate's WGSL as a [`WgslKernel`] (stem `gemm_tile`), for offline validation, like
/// [`crate::WGSL_KERNELS`]; the sources are generated on first call.
///
/// # Example
/// ```
/// let kernels = wgpu_metric_learning::gemm_kernels();
/// assert_eq!(kernels.len(), wgpu_metric_learning::GEMM_CANDIDATES.len());
/// assert!(kernels.iter().all(|k| k.stem == "gemm_tile" && k.constants.is_empty()));
/// ```
pub fn gemm_kernels() -> Vec<WgslKernel> {
    GEMM_CANDIDATES.iter().map(|&v| spec(v).kernel).collect()
}

/// The GEMM family's pipelines on one device, built on first use of each variant, and the
/// tuner's choices per shape bucket.
pub(crate) struct GemmTile {
    pipelines: Mutex<HashMap<GemmVariant, Arc<Pipeline>>>,
    choices: Mutex<HashMap<Bucket, Option<GemmVariant>>>,
    /// Held while tuning: one tuning run at a time per device (two would time each other).
    pub(crate) tuning: Mutex<()>,
}

impl crate::runtime::device::Kernel for GemmTile {
    fn build(_gpu: &GpuDevice) -> Result<Self> {
        Ok(Self {
            pipelines: Mutex::new(HashMap::new()),
            choices: Mutex::new(HashMap::new()),
            tuning: Mutex::new(()),
        })
    }
}

impl GemmTile {
    /// The variant chosen per shape bucket on this device (`None`: none fits).
    pub(crate) fn choices(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<Bucket, Option<GemmVariant>>> {
        self.choices
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records one dispatch of `v` straight into `encoder`, with `timestamps` on its pass:
    /// the tuner's timed runs, outside any operation's recording. The same checks as
    /// [`Self::encode`].
    pub(crate) fn record_timed(
        &self,
        gpu: &GpuDevice,
        encoder: &mut wgpu::CommandEncoder,
        v: GemmVariant,
        p: &Params,
        b: &TileBuffers<'_>,
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) -> Result<()> {
        let (x, y) = check(gpu, v, p, b)?;
        let pipeline = self.pipeline(gpu, v)?;
        let group = pipeline.bind(gpu, &b.in_order())?;
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("gemm_tile::tune"),
            timestamp_writes: timestamps,
        });
        pass.set_pipeline(&pipeline.pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(x, y, 1);
        Ok(())
    }

    /// The pipeline of `v`, compiled on first use. Trusted (no bounds checks, no loop
    /// bounding) unless the context asks for checked modules: every global index is guarded
    /// by `rows`, `cols` and `dim4` and checked against the buffers' sizes in [`Self::encode`],
    /// every workgroup index is bounded by the variant's constants, and the one loop runs
    /// `ceil(dim4 / (BK / 4))` times.
    pub(crate) fn pipeline(&self, gpu: &GpuDevice, v: GemmVariant) -> Result<Arc<Pipeline>> {
        if !v.fits(&gpu.limits) {
            return Err(Error::Internal {
                op: "gemm_tile",
                message: format!("variant {} does not fit the device's limits", v.name()),
            });
        }
        if let Some(p) = self.lock().get(&v) {
            return Ok(Arc::clone(p));
        }
        let built = Arc::new(Pipeline::new_trusted(gpu, spec(v), "main")?);
        Ok(Arc::clone(self.lock().entry(v).or_insert(built)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<GemmVariant, Arc<Pipeline>>> {
        self.pipelines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records the tile `out[r * out_stride + out_col0 + c] = metric(queries[r], refs[c])`
    /// with variant `v`, after checking that every index the kernel can form lies in its
    /// buffer (the trusted module has no bounds checks of its own).
    pub(crate) fn encode(
        &self,
        rec: &mut Recorder<'_>,
        v: GemmVariant,
        p: &Params,
        b: &TileBuffers<'_>,
    ) -> Result<()> {
        let (x, y) = check(rec.gpu(), v, p, b)?;
        let pipeline = self.pipeline(rec.gpu(), v)?;
        pipeline.dispatch(rec, &b.in_order(), [x, y, 1])
    }
}

/// Workgroups `(x, y)` of `v` for the tile `p`, after checking that every index the kernel
/// can form lies in its buffer (the trusted module has no bounds checks of its own) and that
/// the grid fits the device.
fn check(gpu: &GpuDevice, v: GemmVariant, p: &Params, b: &TileBuffers<'_>) -> Result<(u32, u32)> {
    {
        let (rows, cols, dim4) = (u64::from(p.rows), u64::from(p.cols), u64::from(p.dim4));
        let need = [
            (b.queries, rows * dim4 * 16),
            (b.refs, (u64::from(p.ref_row0) + cols) * dim4 * 16),
            (b.query_sq_norms, rows * 4),
            (b.ref_sq_norms, (u64::from(p.ref_row0) + cols) * 4),
            (
                b.out,
                if rows == 0 || cols == 0 {
                    0
                } else {
                    ((rows - 1) * u64::from(p.out_stride) + u64::from(p.out_col0) + cols) * 4
                },
            ),
        ];
        if let Some((buffer, bytes)) = need.iter().find(|(b, n)| b.buffer().size() < *n) {
            return Err(Error::Internal {
                op: "gemm_tile",
                message: format!(
                    "a buffer of {} bytes where the tile reads or writes {bytes}",
                    buffer.buffer().size()
                ),
            });
        }
        let (x, y) = v.workgroups(rows, cols);
        super::within_dispatch_limit(gpu, "gemm_tile", &[x, y])?;
        Ok((x as u32, y as u32))
    }
}
