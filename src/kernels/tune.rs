//! The per-device autotuner of the GEMM family ([`super::gemm_tile`]).
//!
//! Tuning runs inside the operation that first meets a bucket, at its first tile of that
//! bucket, and times the candidates on that very tile: its buffers are the operation's own,
//! so tuning allocates nothing and an operation never holds more than its plan says (the
//! first version timed a tile of its own, which broke the plans' promise on hardware and
//! exceeded small binding limits). What the operation recorded so far is submitted first
//! (one more submission, once per bucket), so that every earlier command runs before the
//! candidates write the tile's output and the tile's own dispatch runs after them. A
//! cancellation is seen at the operation's next chunk; tuning costs one compilation of each
//! candidate (the larger part on a discrete GPU: about 0.2 s each on an H100) and six
//! dispatches of it, counted in the call's `Transfers::host.tune_ns`, never in its host
//! waits. Inside an operation each dispatch is timed by the wall clock of its own
//! submit-and-wait (timestamps would need buffers beyond the operation's plan; the
//! submission's fixed cost, tens of microseconds, is the same for every candidate).
//!
//! The choice is made per device and per shape bucket: rows, columns and `vec4`s of depth,
//! each rounded up to a power of two (rows 64–4096, columns 64–65536, depth 1–256 vec4s). For
//! a bucket it has not seen, the device's [`GemmTile`] looks in this process's memory, then
//! (with [`Tuning::Cached`]) in the cache file, then times every candidate that fits the
//! device: one warm-up and five timed dispatches each; the median wins. An explicit
//! [`crate::Context::tune_distance`] (and `wml tune`) has no operation's tile: it times a
//! tile of the bucket of its own, at most 2048 × 8192, halved until it takes at most half of
//! the budget's free room and each buffer fits one binding, and times them by timestamps
//! where the device has them.
//!
//! The cache is one tab-separated line per key (`key`, variant, seconds) in
//! `$WML_TUNE_CACHE`, else `$XDG_CACHE_HOME/wgpu-metric-learning/tune-v1.tsv`, else
//! `~/.cache/…` (`%LOCALAPPDATA%\…` on Windows). The key names the adapter (vendor and device
//! ids, name, driver, backend), the wgpu version, this crate's version, a hash of every
//! candidate's source and the bucket, so that an entry is only ever reused for the code and
//! device that measured it. Writes are atomic (a temporary file renamed over the cache); a
//! line that does not parse, or names a variant that is not a candidate or does not fit, is
//! ignored with a warning.
//!
//! Without tuning ([`Tuning::Off`], software adapters under [`Tuning::Cached`], or a tuning
//! run that failed) the default applies: `128x128x16_8x8` (16.5 KiB of workgroup memory, 256
//! invocations) where it fits the device's limits, else `64x64x16_4x4` (8.5 KiB), else the
//! first candidate that fits. Measured: the fastest on lavapipe (1.75× the hand-written
//! kernel at 2048 × 16384 × 128) and within 2 % of the tuned winner on an H200.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::kernels::distance_tile::{Params, TileBuffers};
use crate::kernels::gemm_tile::{Bucket, GemmTile, GemmVariant, GEMM_CANDIDATES};
use crate::runtime::device::{checked, GpuDevice, Tuning};
use crate::runtime::memory::TrackedBuffer;
use crate::runtime::transfer::{self, timing::PassTimes, Recorder};

/// What one tuning run found.
#[derive(Clone, Debug)]
pub(crate) struct Tuned {
    pub(crate) chosen: Option<GemmVariant>,
    /// Each candidate that ran, with its median seconds on the representative tile.
    pub(crate) timings: Vec<(GemmVariant, f64)>,
    /// The representative tile `(rows, cols, d)`.
    pub(crate) shape: (u64, u64, u64),
    pub(crate) by_timestamps: bool,
    pub(crate) from_cache: bool,
}

/// The untuned default of `gpu` (see the module docs).
pub(crate) fn default_variant(gpu: &GpuDevice) -> Option<GemmVariant> {
    ["128x128x16_8x8", "64x64x16_4x4"]
        .iter()
        .filter_map(|name| GemmVariant::parse(name))
        .chain(GEMM_CANDIDATES.iter().copied())
        .find(|v| v.fits(&gpu.limits))
}

/// The variant for the tile `p` (its buffers `b`) that `rec` is recording, tuning when the
/// setting asks and the bucket is new. Tuning then times the candidates on this very tile
/// (its buffers are the operation's own, so the operation holds no more than it planned),
/// after submitting what `rec` recorded so far: every earlier command then runs before the
/// candidates write the tile's output, and the tile's own dispatch after them. `None`: no
/// variant fits the device (the hand-written kernel runs).
pub(crate) fn choose(
    rec: &mut Recorder<'_>,
    family: &GemmTile,
    p: &Params,
    b: &TileBuffers<'_>,
) -> Result<Option<GemmVariant>> {
    let gpu = rec.gpu();
    let bucket = Bucket::of(u64::from(p.rows), u64::from(p.cols), u64::from(p.dim4));
    if let Some(&v) = family.choices().get(&bucket) {
        return Ok(v);
    }
    // One tuning run at a time on this device; another thread may have chosen meanwhile.
    let _tuning = family
        .tuning
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(&v) = family.choices().get(&bucket) {
        return Ok(v);
    }
    let software = gpu.info.device_type == wgpu::DeviceType::Cpu;
    let cached = match gpu.tuning {
        Tuning::Off => return Ok(remember(family, bucket, default_variant(gpu))),
        Tuning::Cached if software => return Ok(remember(family, bucket, default_variant(gpu))),
        Tuning::Cached => from_cache(gpu, bucket),
        Tuning::Eager => None,
    };
    if let Some(t) = cached {
        return Ok(remember(
            family,
            bucket,
            t.chosen.or_else(|| default_variant(gpu)),
        ));
    }
    // A cached winner costs no submission: only a tuning run submits what the operation
    // recorded so far (its commands then run before the candidates write the tile).
    rec.flush()?;
    // Timed by the wall clock: timestamps would need buffers of their own, beyond what the
    // operation planned to hold.
    match tune(gpu, family, bucket, (p, b, false)) {
        Ok(t) => Ok(remember(
            family,
            bucket,
            t.chosen.or_else(|| default_variant(gpu)),
        )),
        Err(e) => {
            // Not remembered: the next tile of this bucket tries again.
            log::warn!(
                "gemm_tile: tuning {} failed ({e}); using the default",
                bucket.label()
            );
            Ok(default_variant(gpu))
        }
    }
}

/// Makes `chosen` the device's choice for `bucket`, and returns it.
fn remember(family: &GemmTile, bucket: Bucket, chosen: Option<GemmVariant>) -> Option<GemmVariant> {
    family.choices().insert(bucket, chosen);
    chosen
}

/// Tunes the bucket of a `(rows, cols, dim4)` tile now (from the cache when `use_cache` and
/// it has the key) on a representative tile of its own, and makes the winner this device's
/// choice for the bucket.
pub(crate) fn tune_now(
    gpu: &GpuDevice,
    rows: u64,
    cols: u64,
    dim4: u64,
    use_cache: bool,
) -> Result<(String, Tuned)> {
    let family = gpu.kernel::<GemmTile>()?;
    let bucket = Bucket::of(rows, cols, dim4);
    let _tuning = family
        .tuning
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // A cached winner needs no tile: the buffers are made only to time.
    let tuned = match use_cache.then(|| from_cache(gpu, bucket)).flatten() {
        Some(tuned) => tuned,
        None => {
            let own = Buffers::new(gpu, bucket)?;
            tune(gpu, &family, bucket, (&own.p, &own.tile(), gpu.timestamps))?
        }
    };
    family
        .choices()
        .insert(bucket, tuned.chosen.or_else(|| default_variant(gpu)));
    Ok((bucket.label(), tuned))
}

/// Tunes `bucket` on `gpu` by timing the candidates on `tile` (its parameters, its buffers,
/// and whether by timestamps), records the winner in the cache, and returns what it measured.
fn tune(
    gpu: &GpuDevice,
    family: &GemmTile,
    bucket: Bucket,
    tile: (&Params, &TileBuffers<'_>, bool),
) -> Result<Tuned> {
    let started = Instant::now();
    let key = cache_key(gpu, bucket);
    let result = measure(gpu, family, tile);
    transfer::count_tuning(gpu, started.elapsed());
    let tuned = result?;
    if let Some(v) = tuned.chosen {
        let seconds = tuned.timings.iter().find(|t| t.0 == v).map_or(0.0, |t| t.1);
        cache_put(&key, v, seconds);
    }
    Ok(tuned)
}

/// The cache's winner for `bucket` on `gpu`, if it has one that fits the device.
fn from_cache(gpu: &GpuDevice, bucket: Bucket) -> Option<Tuned> {
    let (v, seconds) = cache_get(&cache_key(gpu, bucket)).filter(|(v, _)| v.fits(&gpu.limits))?;
    Some(Tuned {
        chosen: Some(v),
        timings: vec![(v, seconds)],
        shape: (0, 0, 0),
        by_timestamps: false,
        from_cache: true,
    })
}

/// Times every candidate that fits the device on `tile`.
fn measure(
    gpu: &GpuDevice,
    family: &GemmTile,
    (p, b, by_timestamps): (&Params, &TileBuffers<'_>, bool),
) -> Result<Tuned> {
    let by_timestamps = by_timestamps && gpu.timestamps;
    let mut timings = Vec::new();
    for &v in GEMM_CANDIDATES.iter().filter(|v| v.fits(&gpu.limits)) {
        match time_variant(gpu, family, v, p, b, by_timestamps) {
            Ok(seconds) => timings.push((v, seconds)),
            Err(e) => log::warn!("gemm_tile: candidate {} failed ({e})", v.name()),
        }
    }
    let chosen = timings
        .iter()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|t| t.0);
    Ok(Tuned {
        chosen,
        timings,
        shape: (u64::from(p.rows), u64::from(p.cols), 4 * u64::from(p.dim4)),
        by_timestamps,
        from_cache: false,
    })
}

/// The representative tile's buffers (contents irrelevant to the time: a fixed pattern).
struct Buffers {
    params: TrackedBuffer,
    queries: TrackedBuffer,
    refs: TrackedBuffer,
    q_norms: TrackedBuffer,
    r_norms: TrackedBuffer,
    out: TrackedBuffer,
    p: Params,
}

impl Buffers {
    /// A tile of the bucket, at most 2048 × 8192, halved (columns first) until it takes at
    /// most half of the budget's free room and each buffer fits one binding.
    fn new(gpu: &GpuDevice, bucket: Bucket) -> Result<Self> {
        let dim4 = u64::from(bucket.dim4);
        let mut rows = u64::from(bucket.rows).min(2048);
        let mut cols = u64::from(bucket.cols).min(8192);
        let room = {
            let m = gpu.memory.stats();
            m.budget_bytes.saturating_sub(m.current_bytes)
        };
        let binding = gpu
            .limits
            .max_storage_buffer_binding_size
            .min(gpu.limits.max_buffer_size);
        let fits = |rows: u64, cols: u64| {
            let bytes = (rows + cols) * (dim4 * 16 + 4) + rows * cols * 4 + 256;
            bytes <= room / 2 && rows * cols * 4 <= binding && rows.max(cols) * dim4 * 16 <= binding
        };
        while !fits(rows, cols) && (rows > 1 || cols > 1) {
            if cols >= rows && cols > 1 {
                cols /= 2;
            } else {
                rows /= 2;
            }
        }
        let storage = |label, n: u64| transfer::output(gpu, label, 4 * n);
        let pattern =
            |n: u64| -> Vec<f32> { (0..n).map(|i| ((i % 97) as f32) * 0.01 - 0.4).collect() };
        let queries = storage("tune::queries", rows * dim4 * 4)?;
        let refs = storage("tune::refs", cols * dim4 * 4)?;
        let q_norms = storage("tune::query_norms", rows)?;
        let r_norms = storage("tune::ref_norms", cols)?;
        let out = storage("tune::out", rows * cols)?;
        // Written directly, not through `transfer::write`: the tuner's bytes are not the
        // calling operation's traffic.
        let write = |b: &TrackedBuffer, data: &[f32]| {
            checked(gpu, "tune::write", || {
                gpu.queue
                    .write_buffer(b.buffer(), 0, bytemuck::cast_slice(data))
            })
        };
        write(&queries, &pattern(rows * dim4 * 4))?;
        write(&refs, &pattern(cols * dim4 * 4))?;
        write(&q_norms, &vec![1.0f32; rows as usize])?;
        write(&r_norms, &vec![1.0f32; cols as usize])?;
        let p = Params {
            rows: rows as u32,
            cols: cols as u32,
            dim4: dim4 as u32,
            metric: 0,
            normalize: 0,
            out_stride: cols as u32,
            out_col0: 0,
            ref_row0: 0,
        };
        let params = transfer::create_buffer(
            gpu,
            "tune::params",
            std::mem::size_of::<Params>() as u64,
            wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        )?;
        checked(gpu, "tune::write", || {
            gpu.queue
                .write_buffer(params.buffer(), 0, bytemuck::bytes_of(&p))
        })?;
        Ok(Self {
            params,
            queries,
            refs,
            q_norms,
            r_norms,
            out,
            p,
        })
    }

    fn tile(&self) -> TileBuffers<'_> {
        TileBuffers {
            params: &self.params,
            queries: &self.queries,
            refs: &self.refs,
            query_sq_norms: &self.q_norms,
            ref_sq_norms: &self.r_norms,
            out: &self.out,
        }
    }
}

/// Samples per candidate after one warm-up.
const SAMPLES: usize = 5;

/// The median seconds of `v` on `b`.
fn time_variant(
    gpu: &GpuDevice,
    family: &GemmTile,
    v: GemmVariant,
    p: &Params,
    b: &TileBuffers<'_>,
    by_timestamps: bool,
) -> Result<f64> {
    // Compile (and warm) outside the timed part.
    family.pipeline(gpu, v)?;
    let mut samples = Vec::with_capacity(SAMPLES);
    if by_timestamps {
        let mut times = PassTimes::new(gpu, SAMPLES as u32 + 1)?;
        let mut encoder = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("tune"),
            });
        for _ in 0..=SAMPLES {
            family.record_timed(gpu, &mut encoder, v, p, b, times.next("gemm_tile"))?;
        }
        times.resolve(&mut encoder);
        let index = crate::runtime::device::submit(&gpu.queue, [encoder.finish()]);
        let (tx, rx) = std::sync::mpsc::channel();
        times
            .read_buffer()
            .slice(..16 * (SAMPLES as u64 + 1))
            .map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
        wait_uncounted(gpu, index)?;
        if !matches!(rx.recv_timeout(Duration::from_secs(5)), Ok(Ok(()))) {
            return Err(crate::error::Error::Internal {
                op: "tune",
                message: "timestamps were not mapped".into(),
            });
        }
        let ns = times.read_now(f64::from(gpu.queue.get_timestamp_period()))?;
        samples.extend(ns.iter().skip(1).map(|&n| n as f64 * 1e-9));
    } else {
        for i in 0..=SAMPLES {
            let mut encoder = gpu
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("tune"),
                });
            family.record_timed(gpu, &mut encoder, v, p, b, None)?;
            let t0 = Instant::now();
            let index = crate::runtime::device::submit(&gpu.queue, [encoder.finish()]);
            wait_uncounted(gpu, index)?;
            if i > 0 {
                samples.push(t0.elapsed().as_secs_f64());
            }
        }
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

/// Waits for `index` without counting it as the calling operation's host wait (tuning is
/// not the operation's traffic; its time is counted as `tune_ns`).
fn wait_uncounted(gpu: &GpuDevice, index: wgpu::SubmissionIndex) -> Result<()> {
    crate::runtime::device::poll(
        &gpu.device,
        wgpu::PollType::Wait {
            submission_index: Some(index),
            timeout: Some(Duration::from_secs(60)),
        },
    )
    .map_err(|source| crate::error::Error::Poll { op: "tune", source })?;
    gpu.check_alive()
}

/// FNV-1a over every candidate's name and source: a new kernel or template is a new key.
fn source_hash() -> u64 {
    static HASH: OnceLock<u64> = OnceLock::new();
    *HASH.get_or_init(|| {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for v in GEMM_CANDIDATES {
            for b in v.name().bytes().chain(v.source().bytes()) {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
        h
    })
}

fn cache_key(gpu: &GpuDevice, bucket: Bucket) -> String {
    let i = &gpu.info;
    let clean = |s: &str| s.replace(['\t', '\n'], " ");
    format!(
        "{:04x}:{:04x}|{}|{} {}|{:?}|wgpu-30|wml-{}|{:016x}|{}",
        i.vendor,
        i.device,
        clean(&i.name),
        clean(&i.driver),
        clean(&i.driver_info),
        i.backend,
        env!("CARGO_PKG_VERSION"),
        source_hash(),
        bucket.label()
    )
}

/// The cache file (see the module docs); `None` when no directory is known.
pub(crate) fn cache_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("WML_TUNE_CACHE").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            if cfg!(windows) {
                std::env::var_os("LOCALAPPDATA").map(PathBuf::from)
            } else {
                std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache"))
            }
        })?;
    Some(base.join("wgpu-metric-learning").join("tune-v1.tsv"))
}

/// Serialises the cache's read-modify-write within this process.
static CACHE_LOCK: Mutex<()> = Mutex::new(());

/// The entries of the cache at `path` (key → value, seconds), a line that is not three
/// tab-separated fields ending in a number ignored with a warning.
fn cache_read(path: &Path) -> HashMap<String, (String, f64)> {
    let mut map = HashMap::new();
    let Ok(text) = std::fs::read_to_string(path) else {
        return map;
    };
    for (n, line) in text.lines().enumerate() {
        let mut parts = line.split('\t');
        let parsed = match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(key), Some(value), Some(seconds), None) if !value.is_empty() => seconds
                .parse::<f64>()
                .ok()
                .map(|s| (key.to_string(), (value.to_string(), s))),
            _ => None,
        };
        match parsed {
            Some((key, entry)) => {
                map.insert(key, entry);
            }
            None => log::warn!("{}:{}: not a tuning entry, ignored", path.display(), n + 1),
        }
    }
    map
}

/// The cached value and seconds of `key` (any tuner's: the GEMM variants', the native kNN
/// kernel's), if the cache has it.
pub(crate) fn cached(key: &str) -> Option<(String, f64)> {
    let _guard = CACHE_LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    cache_read(&cache_path()?).remove(key)
}

/// Adds (or replaces) `key` in the cache; a failure is a warning.
pub(crate) fn cache_store(key: &str, value: &str, seconds: f64) {
    let _guard = CACHE_LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(path) = cache_path() {
        cache_put_at(&path, key, value, seconds);
    }
}

/// The cached GEMM variant of `key`: an entry that names no candidate is ignored (warned).
fn cache_get(key: &str) -> Option<(GemmVariant, f64)> {
    let (value, seconds) = cached(key)?;
    let v = variant_of(&value);
    if v.is_none() {
        log::warn!("tuning cache: {value:?} is not a GEMM candidate, ignored");
    }
    v.map(|v| (v, seconds))
}

/// The candidate named `value`, if any.
fn variant_of(value: &str) -> Option<GemmVariant> {
    GemmVariant::parse(value).filter(|v| GEMM_CANDIDATES.contains(v))
}

fn cache_put(key: &str, v: GemmVariant, seconds: f64) {
    cache_store(key, &v.name(), seconds);
}

/// Adds (or replaces) `key` in the cache at `path`: the whole file written to a temporary
/// beside it and renamed over it, so that a reader never sees half of it.
fn cache_put_at(path: &Path, key: &str, value: &str, seconds: f64) {
    let mut map = cache_read(path);
    map.insert(key.to_string(), (value.to_string(), seconds));
    let mut lines: Vec<String> = map
        .iter()
        .map(|(k, (v, s))| format!("{k}\t{v}\t{s:e}"))
        .collect();
    lines.sort();
    let write = || -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, lines.join("\n") + "\n")?;
        std::fs::rename(&tmp, path).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    };
    if let Err(e) = write() {
        log::warn!("tuning cache {}: {e}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_cache(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("wml-tune-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir.join("nested").join("tune-v1.tsv")
    }

    #[test]
    fn the_cache_round_trips_and_replaces_a_key_atomically() {
        let path = temp_cache("round-trip");
        let a = GEMM_CANDIDATES[0];
        let b = GEMM_CANDIDATES[1];
        cache_put_at(&path, "key one", &a.name(), 1e-3);
        cache_put_at(&path, "key two", &b.name(), 2e-3);
        cache_put_at(&path, "key one", &b.name(), 5e-4);
        let map = cache_read(&path);
        assert_eq!(map.get("key one"), Some(&(b.name(), 5e-4)), "replaced");
        assert_eq!(map.get("key two"), Some(&(b.name(), 2e-3)));
        let dir = path.parent().expect("a directory");
        let names: Vec<_> = std::fs::read_dir(dir)
            .expect("the directory")
            .map(|e| e.expect("an entry").file_name())
            .collect();
        assert_eq!(
            names,
            vec![std::ffi::OsString::from("tune-v1.tsv")],
            "no temporary left"
        );
    }

    #[test]
    fn corrupt_and_stale_lines_are_ignored_and_the_rest_kept() {
        let path = temp_cache("corrupt");
        let good = GEMM_CANDIDATES[2];
        std::fs::create_dir_all(path.parent().expect("a directory")).expect("mkdir");
        let name = good.name();
        std::fs::write(
            &path,
            format!(
                "garbage\nk1\t{name}\t1e-3\nk2\t999x1x4_4x4\t1e-3\nk3\t{name}\tnot-a-number\nk4\t{name}\t1\textra\n"
            ),
        )
        .expect("write");
        let map = cache_read(&path);
        assert_eq!(map.len(), 2, "{map:?}");
        assert_eq!(map.get("k1"), Some(&(name.clone(), 1e-3)));
        // A well-formed line naming no GEMM candidate is kept, but never taken as a variant.
        assert_eq!(map.get("k2").and_then(|e| variant_of(&e.0)), None);
        assert_eq!(variant_of(&map["k1"].0), Some(good));
        // Writing keeps the well-formed entries and drops the rest.
        cache_put_at(&path, "k5", &name, 2e-3);
        assert_eq!(cache_read(&path).len(), 3);
        assert!(
            cache_read(&temp_cache("missing")).is_empty(),
            "no file, no entries"
        );
    }

    #[test]
    fn buckets_round_up_to_powers_of_two_within_their_ranges() {
        assert_eq!(
            Bucket::of(10_000, 100_000, 32),
            Bucket {
                rows: 4096,
                cols: 65_536,
                dim4: 32
            }
        );
        assert_eq!(
            Bucket::of(1, 1, 0),
            Bucket {
                rows: 64,
                cols: 64,
                dim4: 1
            }
        );
        assert_eq!(Bucket::of(65, 65, 33).label(), "128x128x256");
    }
}
