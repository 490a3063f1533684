//! Large host outputs: zeroed by the kernel on first touch, in huge pages where Linux offers
//! them.

/// A zeroed vector of `len` `u32`, or `None` if the allocator refuses it (instead of the
/// abort that `vec!` would give). On Linux the allocation is advised into transparent huge
/// pages: filling gigabytes of triplets then faults once per 2 MiB instead of once per 4 KiB,
/// which was two thirds of the native path's time on 2·10⁸ triplets.
pub(crate) fn zeroed_u32(len: usize) -> Option<Vec<u32>> {
    // Probe first: `try_reserve_exact` reports a refusal, and the allocation it got is handed
    // back at once; `vec!` then allocates zeroed memory that the kernel zeroes on first touch
    // (unlike `resize`, which writes every zero itself).
    let mut probe: Vec<u32> = Vec::new();
    probe.try_reserve_exact(len).ok()?;
    drop(probe);
    let v = vec![0u32; len];
    advise_huge_pages(&v);
    Some(v)
}

/// [`zeroed_u32`] for `f32`: the large products and gradients of the classifier losses.
pub(crate) fn zeroed_f32(len: usize) -> Option<Vec<f32>> {
    let mut probe: Vec<f32> = Vec::new();
    probe.try_reserve_exact(len).ok()?;
    drop(probe);
    let v = vec![0.0f32; len];
    advise_huge_pages(&v);
    Some(v)
}

#[cfg(target_os = "linux")]
fn advise_huge_pages<T>(v: &[T]) {
    const HUGE: usize = 2 << 20;
    let bytes = std::mem::size_of_val(v);
    let start = v.as_ptr() as usize;
    let aligned = start.next_multiple_of(HUGE);
    let end = (start + bytes) / HUGE * HUGE;
    if end <= aligned {
        return;
    }
    // SAFETY: `aligned..end` lies inside the live allocation `v`; MADV_HUGEPAGE only advises
    // the kernel how to back those pages and changes neither their contents nor their
    // validity. A refusal (THP disabled) is harmless, so the result is ignored.
    unsafe {
        libc::madvise(
            aligned as *mut libc::c_void,
            end - aligned,
            libc::MADV_HUGEPAGE,
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages<T>(_: &[T]) {}
