//! Which native kNN kernel runs for `k ≤ 128` with [`NativeKnnKernel::Auto`]: the one measured
//! faster on this CPU. Since its epilogue was vectorised the fused kernel (`native_fused`)
//! runs 1.1–1.2× GEMM blocks and a selection pass on an AVX2-only EPYC at 100 000
//! references, but the blocks won before on some CPU kinds (1.25× at `k = 10` on that EPYC,
//! 1.07–1.11× on a Zen 4), and a CPU kind not measured may differ, so the
//! choice is made by timing both on the running CPU the first time a shape bucket is met, and
//! kept in the tuning cache beside the GPU tuner's entries ([`crate::kernels::tune`]): one line
//! per CPU model, instruction sets, threads, library version and bucket.
//!
//! Buckets: `k` as 1, 2–16 or 17–128 (timed at 1, 10 and 100), `d` rounded up to a power of
//! two (timed at it, at most 512). The timing searches two 2 048-query blocks per thread
//! (so that neither kernel shards the references, as in a search of many queries) against
//! enough references for 16 GFLOP per thread (15 258 at `d = 128`: a search against a few
//! thousand, as before, favoured the blocks where a search of 100 000 favours the fused
//! kernel by 10–15 %), cosine, both kernels in turn, a warm-up round and three timed (the
//! fastest of each kernel's three counts, as one count on a busy machine can be 15 % off;
//! the blocks win only by more than 5 %): about 3 s on 2 cores, once per machine and
//! bucket. Searches too small for the choice to matter (`2·q·n·d` under 10⁹) take the
//! static default without timing anything, as does [`Tuning::Off`]: the fused kernel, as
//! before this existed. Both kernels give the same neighbours and the same bits
//! (tests/knn_select.rs), so the choice changes only the time.
//! The timing runs on contexts of its own: its rows (12 MB at `d = 128` on 2 threads; at most
//! 32 768 queries, 130 MB at `d = 512` on 64 threads) and scratch are not the calling
//! context's, and are freed when it ends.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use ndarray::Array2;

use crate::context::{BackendChoice, Context, ContextConfig, NativeKnnKernel};
use crate::kernels::tune;
use crate::runtime::device::Tuning;

use super::KnnConfig;

/// Searches below this many multiply-adds (times 2) take the static default.
const WORTH_TIMING_FLOPS: f64 = 1e9;
/// How much faster (as a fraction) the blocks must time than the fused kernel to be chosen.
const MARGIN: f64 = 0.05;
/// The largest dimension the timing runs at.
const MAX_DIM: usize = 512;
/// Flops of one timed search per thread (0.3–0.45 s on a 2-core AVX2 EPYC).
const FLOPS_PER_THREAD: f64 = 16e9;

/// The timed search's queries and references at dimension `d` on `threads` threads: two
/// fused-kernel blocks of queries per thread (so that neither kernel splits the references
/// into shards, as in a search of many queries), and references for about
/// [`FLOPS_PER_THREAD`] per thread. Past 8 threads the 32 768 queries make fewer blocks than
/// that, and the fused kernel's search shards its references.
pub(super) fn timed_shape(d: usize, threads: usize) -> (usize, usize) {
    let queries = (2 * super::native_fused::QUERY_BLOCK * threads).min(1 << 15);
    let flops = FLOPS_PER_THREAD * threads as f64;
    let refs = (flops / (2.0 * queries as f64 * d.max(1) as f64)) as usize;
    (queries, refs.clamp(2048, 1 << 16))
}

/// A shape bucket of the choice: `k` and `d` as timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Bucket {
    k: usize,
    d: usize,
}

impl Bucket {
    pub(super) fn of(k: usize, d: usize) -> Self {
        let k = match k {
            0 | 1 => 1,
            2..=16 => 10,
            _ => 100,
        };
        Self {
            k,
            d: d.clamp(1, MAX_DIM).next_power_of_two().min(MAX_DIM),
        }
    }
}

/// Whether a search of `(q, n, d)` at `k` on `ctx` runs the fused kernel first (where its
/// scratch fits): by the context's setting, else by the bucket's measured choice.
pub(super) fn fused_first(ctx: &Context, (q, n, d): (usize, usize, usize), k: usize) -> bool {
    match ctx.native_knn_kernel() {
        NativeKnnKernel::Fused => true,
        NativeKnnKernel::Blocks => false,
        NativeKnnKernel::Auto => {
            let flops = 2.0 * q as f64 * n as f64 * d as f64;
            if ctx.tuning() == Tuning::Off || flops < WORTH_TIMING_FLOPS {
                return true;
            }
            choose(Bucket::of(k, d), ctx.tuning() == Tuning::Eager).unwrap_or(true)
        }
    }
}

/// The bucket's choice: this process's, else the cache's (unless `eager`), else timed now
/// and remembered. `None` (nothing remembered) when the timing fails.
pub(super) fn choose(bucket: Bucket, eager: bool) -> Option<bool> {
    static CHOICES: OnceLock<Mutex<HashMap<Bucket, bool>>> = OnceLock::new();
    // Held while timing: one timing at a time, and a second caller takes its result.
    let mut choices = CHOICES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(&fused) = choices.get(&bucket) {
        return Some(fused);
    }
    let key = cache_key(bucket);
    let cached = (!eager)
        .then(|| tune::cached(&key))
        .flatten()
        .and_then(|(value, _)| match value.as_str() {
            "fused" => Some(true),
            "blocks" => Some(false),
            _ => None,
        });
    let fused = match cached {
        Some(fused) => fused,
        None => {
            let (fused, seconds) = time_both(bucket)?;
            tune::cache_store(&key, if fused { "fused" } else { "blocks" }, seconds);
            fused
        }
    };
    choices.insert(bucket, fused);
    Some(fused)
}

/// Times both kernels on the bucket's search: whether the fused one is chosen (not more than
/// [`MARGIN`] slower), and the chosen one's seconds.
fn time_both(bucket: Bucket) -> Option<(bool, f64)> {
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let mut rows = |n: usize| {
        Array2::from_shape_simple_fn((n, bucket.d), || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
    };
    let (q, n) = timed_shape(bucket.d, crate::runtime::pool::threads());
    let (queries, refs) = (rows(q), rows(n));
    let cfg = KnnConfig {
        k: bucket.k,
        ..Default::default()
    };
    let context = |kernel| {
        Context::new(&ContextConfig {
            backend: BackendChoice::NativeCpu,
            native_knn_kernel: kernel,
            ..Default::default()
        })
        .ok()
    };
    let kernels = [
        context(NativeKnnKernel::Fused)?,
        context(NativeKnnKernel::Blocks)?,
    ];
    // Alternating, a warm-up round then three timed: drift on a busy machine hits both.
    let mut best = [f64::INFINITY; 2];
    for round in 0..4 {
        for (ctx, best) in kernels.iter().zip(best.iter_mut()) {
            let started = Instant::now();
            super::knn(ctx, queries.view(), refs.view(), &cfg).ok()?;
            if round > 0 {
                *best = best.min(started.elapsed().as_secs_f64());
            }
        }
    }
    // The blocks only when clearly faster: within `MARGIN` the counts cannot tell the two
    // apart on a busy machine, and the fused kernel gains on searches bigger than this one.
    let fused = best[0] <= best[1] * (1.0 + MARGIN);
    Some((fused, if fused { best[0] } else { best[1] }))
}

/// The cache key of `bucket` on this machine: CPU model, instruction sets, threads, library
/// version and the bucket.
fn cache_key(bucket: Bucket) -> String {
    format!(
        "cpu|{}|{}|threads {}|wml-{}|native-knn-v2|k{}|d{}",
        cpu_model().replace(['\t', '\n'], " "),
        instruction_sets(),
        crate::runtime::pool::threads(),
        env!("CARGO_PKG_VERSION"),
        bucket.k,
        bucket.d
    )
}

/// The CPU's model name (Linux: `/proc/cpuinfo`), else the architecture.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name") || l.starts_with("Model"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// The instruction sets the native kernels choose between on this CPU, and the one they use
/// (`WML_NATIVE_ISA` may cap it: the timings differ).
fn instruction_sets() -> String {
    let using = crate::runtime::simd::isa().name();
    #[cfg(target_arch = "x86_64")]
    {
        let mut sets = vec!["x86_64"];
        if std::arch::is_x86_feature_detected!("avx512f") {
            sets.push("avx512f");
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            sets.push("avx2");
        }
        if std::arch::is_x86_feature_detected!("fma") {
            sets.push("fma");
        }
        format!("{} using {using}", sets.join(" "))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        format!("{} using {using}", std::env::consts::ARCH)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timed_search_keeps_every_thread_on_whole_blocks() {
        assert_eq!(timed_shape(128, 2), (8192, 15_258));
        assert_eq!(timed_shape(8, 2), (8192, 1 << 16));
        assert_eq!(timed_shape(1, 1), (4096, 1 << 16));
        assert_eq!(timed_shape(512, 64).0, 1 << 15);
    }

    #[test]
    fn buckets_group_k_and_round_d_up() {
        assert_eq!(Bucket::of(1, 128), Bucket { k: 1, d: 128 });
        assert_eq!(Bucket::of(10, 100), Bucket { k: 10, d: 128 });
        assert_eq!(Bucket::of(17, 3), Bucket { k: 100, d: 4 });
        assert_eq!(Bucket::of(128, 4096), Bucket { k: 100, d: 512 });
        assert_eq!(Bucket::of(0, 0), Bucket { k: 1, d: 1 });
    }

    #[test]
    fn a_bucket_is_timed_once_and_remembered() {
        let bucket = Bucket::of(10, 8);
        let first = choose(bucket, true).expect("both kernels run");
        // Remembered in this process (and in the cache file): the same answer, at once.
        let started = Instant::now();
        assert_eq!(choose(bucket, false), Some(first));
        assert!(started.elapsed().as_secs_f64() < 0.05);
        let key = cache_key(bucket);
        assert!(key.contains("native-knn-v2|k10|d8"), "{key}");
    }

    #[test]
    fn small_searches_and_fixed_settings_time_nothing() {
        let fixed = |kernel| {
            Context::new(&ContextConfig {
                backend: BackendChoice::NativeCpu,
                native_knn_kernel: kernel,
                ..Default::default()
            })
            .expect("a native context")
        };
        assert!(fused_first(
            &fixed(NativeKnnKernel::Fused),
            (1 << 20, 1 << 20, 512),
            10
        ));
        assert!(!fused_first(
            &fixed(NativeKnnKernel::Blocks),
            (1 << 20, 1 << 20, 512),
            10
        ));
        let started = Instant::now();
        assert!(fused_first(
            &fixed(NativeKnnKernel::Auto),
            (100, 100, 100),
            10
        ));
        assert!(started.elapsed().as_secs_f64() < 0.05, "nothing timed");
    }
}
