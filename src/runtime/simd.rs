//! Host loops compiled for the widest vectors the CPU has: [`widest`] wraps a function body
//! in copies built for AVX-512F + FMA and AVX2 + FMA, picked at run time by [`isa`], and a
//! plain copy for every other CPU. The arithmetic is the body's own in each copy (Rust
//! contracts no multiply-add by itself), so the same bits come out on every CPU unless the
//! body's own reductions depend on the vector width.
//!
//! `WML_NATIVE_ISA` (`avx512`, `avx2` or `baseline`) caps the choice below what the CPU
//! has, so that one machine can run and time the narrower copies (the kNN kernels' AVX2
//! tiles on an AVX-512 server, or the baseline in a test). It is read once per process, and
//! the native kNN's tuning cache keys on it. The native GEMM (`gemm`) picks its tile by it
//! too, and keeps fused multiply-adds under every cap where the CPU has FMA.

use std::sync::OnceLock;

/// The vector instruction sets the native loops choose between, narrowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Isa {
    /// The target's baseline (SSE2 on x86-64, NEON on AArch64).
    Baseline,
    /// AVX2 with FMA.
    Avx2,
    /// AVX-512F with FMA.
    Avx512,
}

impl Isa {
    /// The name `WML_NATIVE_ISA` takes.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Isa::Baseline => "baseline",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [Isa::Baseline, Isa::Avx2, Isa::Avx512]
            .into_iter()
            .find(|isa| isa.name().eq_ignore_ascii_case(s.trim()))
    }
}

/// The vector instruction set the native CPU path's loops run with: `"avx512"` (AVX-512F
/// with FMA), `"avx2"` (AVX2 with FMA) or `"baseline"`, the widest this CPU has, capped by the
/// environment variable `WML_NATIVE_ISA` (read once per process; an unknown value is named on
/// stderr and ignored). Every choice gives the same bits: the cap exists to time or test the
/// narrower loops on a wider CPU. So that their sums stay the same, the native GEMM's and
/// the kNN kernel's `baseline` copies keep fused multiply-adds on a CPU that has them.
///
/// # Example
/// ```
/// assert!(["avx512", "avx2", "baseline"].contains(&wgpu_metric_learning::native_isa()));
/// ```
pub fn native_isa() -> &'static str {
    isa().name()
}

/// The widest set this CPU (and its OS) runs, whatever `WML_NATIVE_ISA` says.
pub(crate) fn detected() -> Isa {
    #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
    {
        use std::arch::is_x86_feature_detected as has;
        // Every AVX-512 CPU has AVX2 and FMA; a virtual CPU that hides either gets less.
        if has!("avx512f") && has!("avx2") && has!("fma") {
            return Isa::Avx512;
        }
        if has!("avx2") && has!("fma") {
            return Isa::Avx2;
        }
    }
    Isa::Baseline
}

/// The set the native loops use: the widest detected, capped by `WML_NATIVE_ISA` (module
/// docs). An unknown value is reported once on stderr and ignored: a tuning knob must not
/// stop a training run.
pub(crate) fn isa() -> Isa {
    static CHOSEN: OnceLock<Isa> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let found = detected();
        match std::env::var("WML_NATIVE_ISA") {
            Ok(cap) if !cap.trim().is_empty() => match Isa::parse(&cap) {
                Some(cap) => found.min(cap),
                None => {
                    use std::io::Write;
                    // Not `eprintln!`: a closed stderr must not panic inside a kernel.
                    let _ = writeln!(
                        std::io::stderr(),
                        "wgpu-metric-learning: WML_NATIVE_ISA={cap:?} is not one of avx512, \
                         avx2, baseline: ignored"
                    );
                    found
                }
            },
            _ => found,
        }
    })
}

/// Defines `fn name(args) -> ret { body }` (arguments as plain identifiers, no generics) so
/// that the body runs compiled for the widest vectors [`isa`] allows: `avx512f,fma`, else
/// `avx2,fma`, else the target's baseline. Write the body as loops without branches over
/// slices: the compiler vectorises those.
macro_rules! widest {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?)
        $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn plain($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
            {
                #[target_feature(enable = "avx512f,fma")]
                fn avx512($($arg: $ty),*) $(-> $ret)? {
                    plain($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) $(-> $ret)? {
                    plain($($arg),*)
                }
                match $crate::runtime::simd::isa() {
                    // SAFETY: `isa` names a set only where the CPU (and the OS, which std's
                    // detection checks) supports it: here AVX-512F and FMA.
                    $crate::runtime::simd::Isa::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: as above, AVX2 and FMA.
                    $crate::runtime::simd::Isa::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::runtime::simd::Isa::Baseline => {}
                }
            }
            plain($($arg),*)
        }
    };
}

pub(crate) use widest;
