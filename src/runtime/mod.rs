//! The floor everything stands on: the wgpu device and its error capture (`device`), devices
//! kept for reuse (`device_pool`), the lifecycle guard of drivers' unsafe moments (`guard`),
//! the byte accounting every device allocation goes through (`memory`), moving rows to and
//! from the device (`transfer`), the host thread pool of the native paths (`pool`) and their
//! GEMM (`gemm`), large host allocations (`host_alloc`) and host loops built for the CPU's
//! widest vectors (`simd`). Nothing here knows a kernel or an operation: `tests/modules.rs`
//! fails on an import from a folder above.

pub(crate) mod device;
pub(crate) mod device_pool;
pub(crate) mod gemm;
pub(crate) mod guard;
pub(crate) mod host_alloc;
pub(crate) mod memory;
pub(crate) mod pool;
pub(crate) mod simd;
pub(crate) mod transfer;
