//! Helpers shared by the benchmark examples: a seeded generator, the anchors' input
//! distribution, peak RSS and flag parsing. (Not an example itself: it has no `main.rs`.)
#![allow(dead_code, reason = "each example uses a different subset")]

use ndarray::{Array1, Array2};
use wgpu_metric_learning::{BackendChoice, Context, ContextConfig, KernelTimes, Transfers};

/// The host–device traffic of each of `ops` operations since `before` (the context's
/// counters), as JSON fields: `"host_waits": …, "submissions": …, "bytes_up": …,
/// "bytes_down": …, "host_s": {…}` (per operation; zero on the native path), then
/// `"kernels": {…}` ([`kernels_json`], per operation) where the context times kernels
/// (`--kernel-timing`).
pub(crate) fn traffic(ctx: &Context, before: Transfers, ops: usize) -> String {
    let t = ctx.transfers().since(&before);
    let n = ops.max(1) as f64;
    let per = |a: u64| a as f64 / n;
    let s = |ns: u64| ns as f64 * 1e-9 / n;
    let mut out = format!(
        "\"host_waits\": {:.1}, \"submissions\": {:.1}, \"bytes_up\": {:.0}, \"bytes_down\": {:.0}, \"host_s\": {{\"upload\": {:.6}, \"submit\": {:.6}, \"wait\": {:.6}, \"readback\": {:.6}}}",
        per(t.host_waits),
        per(t.submissions),
        per(t.bytes_up),
        per(t.bytes_down),
        s(t.host.upload_ns),
        s(t.host.submit_ns),
        s(t.host.wait_ns),
        s(t.host.readback_ns),
    );
    if ctx.kernel_timing() == Ok(true) {
        out.push_str(&format!(", \"kernels\": {}", kernels_json(&t.kernels, n)));
    }
    out
}

/// `kernels` as a JSON object, each stem's dispatches and GPU seconds divided by `ops`:
/// `{"gemm_tile": {"dispatches": 7.0, "gpu_seconds": 0.0103}, …}` (`wml --stats`' shape).
pub(crate) fn kernels_json(kernels: &KernelTimes, ops: f64) -> String {
    let lines: Vec<String> = kernels
        .iter()
        .map(|k| {
            format!(
                "\"{}\": {{\"dispatches\": {:.1}, \"gpu_seconds\": {:.6}}}",
                k.stem,
                k.dispatches as f64 / ops,
                k.gpu_seconds / ops
            )
        })
        .collect();
    format!("{{{}}}", lines.join(", "))
}

/// Whether `--kernel-timing` is on the command line (time every kernel by timestamps).
pub(crate) fn kernel_timing_flag() -> bool {
    std::env::args().any(|a| a == "--kernel-timing")
}

/// A small deterministic generator (SplitMix64), enough for benchmark inputs.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub(crate) fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub(crate) fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform().max(1e-300), self.uniform());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }
}

/// `rows` N(0, 1) vectors of `d` floats, L2-normalised (as the anchors' inputs).
pub(crate) fn embeddings(rng: &mut Rng, rows: usize, d: usize) -> Array2<f32> {
    let mut x = Array2::from_shape_simple_fn((rows, d), || rng.normal());
    normalize_rows(&mut x);
    x
}

/// Scales every row of `x` to unit L2 norm.
fn normalize_rows(x: &mut Array2<f32>) {
    for mut row in x.rows_mut() {
        let n = row.dot(&row).sqrt().max(1e-12);
        row /= n;
    }
}

/// A batch of `b` rows around the rows of `centres`, labels uniform over them, with
/// N(0, `noise`²) added, L2-normalised.
pub(crate) fn batch_around(
    rng: &mut Rng,
    centres: &Array2<f32>,
    b: usize,
    noise: f32,
) -> (Array2<f32>, Array1<u32>) {
    let classes = centres.nrows() as u64;
    let labels = Array1::from_shape_simple_fn(b, || (rng.next() % classes) as u32);
    let mut x = Array2::from_shape_fn((b, centres.ncols()), |(i, k)| {
        centres[[labels[i] as usize, k]] + noise * rng.normal()
    });
    normalize_rows(&mut x);
    (x, labels)
}

/// The context that `--backend auto|wgpu|cpu` asks for (default `auto`: the library's choice).
pub(crate) fn context_from_flags() -> Result<Context, Box<dyn std::error::Error>> {
    let backend = match flag("--backend", "auto").as_str() {
        "auto" => BackendChoice::Auto,
        "wgpu" => BackendChoice::Wgpu,
        "cpu" => BackendChoice::NativeCpu,
        other => return Err(format!("--backend auto|wgpu|cpu, not {other}").into()),
    };
    Ok(Context::new(&ContextConfig {
        backend,
        ..Default::default()
    })?)
}

/// Peak resident set size of this process, MiB.
pub(crate) fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The value after `flag` on the command line, or `default`.
pub(crate) fn flag(flag: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_string())
}

/// Sorted copies of `times`: (median, min, max).
pub(crate) fn summary(times: &mut [f64]) -> (f64, f64, f64) {
    times.sort_by(f64::total_cmp);
    match times {
        [] => (f64::NAN, f64::NAN, f64::NAN),
        _ => (times[times.len() / 2], times[0], times[times.len() - 1]),
    }
}
