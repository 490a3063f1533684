//! Host loops compiled for the widest vectors the CPU has: [`widest`] wraps a function body
//! in copies built for AVX-512F + FMA and AVX2 + FMA, picked at run time by std's detection,
//! and a plain copy for every other CPU. The arithmetic is the body's own in each copy (Rust
//! contracts no multiply-add by itself), so the same bits come out on every CPU unless the
//! body's own reductions depend on the vector width.

/// Defines `fn name(args) -> ret { body }` (arguments as plain identifiers, no generics) so
/// that the body runs compiled for the widest vectors this CPU has: `avx512f,fma`, else
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
                use std::arch::is_x86_feature_detected as has;
                if has!("avx512f") && has!("fma") {
                    // SAFETY: the CPU (and the OS, which std's detection checks) supports
                    // AVX-512F and FMA.
                    return unsafe { avx512($($arg),*) };
                }
                if has!("avx2") && has!("fma") {
                    // SAFETY: the CPU supports AVX2 and FMA.
                    return unsafe { avx2($($arg),*) };
                }
            }
            plain($($arg),*)
        }
    };
}

pub(crate) use widest;
