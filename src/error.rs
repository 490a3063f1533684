//! The crate's single error type.
//!
//! Every fallible public function returns [`Result<T>`]. Variants carry the offending values so
//! that a message names what was wrong, not just that something was. The split between
//! [`Error::OverBudget`] (the request can never fit the configured budget as planned),
//! [`Error::BudgetExceeded`] (it does not fit *now*, given what is already allocated) and
//! [`Error::OutOfMemory`] (the driver refused) tells a caller whether shrinking, waiting or
//! freeing is the right reaction.
//!
//! An error caused by wgpu keeps wgpu's error as its [`source`](std::error::Error::source),
//! and its message does not repeat it: print the chain (as `wml` does) to see both.

/// Shorthand for `std::result::Result<T, wgpu_metric_learning::Error>`.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{Context, MemoryBank, BankConfig, Result};
/// fn bank(ctx: &Context) -> Result<MemoryBank<u32>> {
///     MemoryBank::new(ctx, &BankConfig::new(1024, 128))
/// }
/// assert_eq!(bank(&Context::native_cpu(None))?.capacity(), 1024);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in this crate.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{knn, Context, Error, KnnConfig};
/// let x = ndarray::array![[0.0f32, f32::NAN]];
/// match knn(&Context::native_cpu(None), &x, &x, &KnnConfig { k: 1, ..Default::default() }) {
///     Err(Error::NonFinite { what, row, col, .. }) => assert_eq!((what, row, col), ("queries", 0, 1)),
///     other => panic!("expected NonFinite, got {other:?}"),
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An input array has the wrong shape for the operation.
    #[error("{op}: {what} must be {expected}, got shape {got:?}")]
    Shape {
        /// The operation that rejected the input.
        op: &'static str,
        /// Which input (e.g. `"refs"`).
        what: &'static str,
        /// What was expected, in words (e.g. `"(n, 16) to match queries"`).
        expected: String,
        /// The shape that was given.
        got: Vec<usize>,
    },
    /// An input holds a NaN or an infinity.
    #[error("{op}: {what} holds a non-finite value {value} at row {row}, column {col}")]
    NonFinite {
        /// The operation that rejected the input.
        op: &'static str,
        /// Which input.
        what: &'static str,
        /// Row of the first non-finite value.
        row: usize,
        /// Column of the first non-finite value.
        col: usize,
        /// The value itself (NaN, inf or -inf).
        value: f32,
    },
    /// A scalar parameter is out of its allowed range.
    #[error("{op}: {what} = {value} is invalid: {rule}")]
    InvalidParameter {
        /// The operation that rejected the parameter.
        op: &'static str,
        /// The parameter's name.
        what: &'static str,
        /// Its value, formatted.
        value: String,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// Even the smallest tile of an operation needs more device memory than the budget allows.
    #[error("{op}: the smallest tile needs {required} bytes of device memory, the budget is {budget} bytes")]
    OverBudget {
        /// The operation.
        op: &'static str,
        /// Bytes that the smallest possible working set needs.
        required: u64,
        /// The configured budget in bytes.
        budget: u64,
    },
    /// An allocation would take the tracked device memory past the budget.
    #[error("allocating {requested} bytes for {label} would exceed the budget: {in_use} bytes in use of {budget}")]
    BudgetExceeded {
        /// Label of the buffer that was requested.
        label: &'static str,
        /// Size of the request in bytes.
        requested: u64,
        /// Bytes tracked as in use at the time of the request.
        in_use: u64,
        /// The configured budget in bytes.
        budget: u64,
    },
    /// A request exceeds a hard limit of the device (buffer size, binding size, workgroups).
    #[error("{op}: {what} = {requested} exceeds the device limit {limit}")]
    DeviceLimit {
        /// The operation.
        op: &'static str,
        /// Which limit (e.g. `"max_buffer_size"`).
        what: &'static str,
        /// The requested value.
        requested: u64,
        /// The device's limit.
        limit: u64,
    },
    /// The driver reported out-of-memory while creating a resource, and the operation still
    /// failed after retrying with smaller tiles down to its smallest (a memory bank's storage,
    /// allocated once at its full size, is not retried). The context stays usable.
    #[error("the device is out of memory allocating {requested} bytes for {label}: {message}")]
    OutOfMemory {
        /// Label of the resource being created.
        label: &'static str,
        /// Size of the request in bytes.
        requested: u64,
        /// What refused: the driver (its error is the source), the host, a simulated device.
        message: String,
        /// wgpu's error, when wgpu refused.
        #[source]
        source: Option<wgpu::Error>,
    },
    /// wgpu reported a validation or internal error inside an operation of this crate.
    #[error("wgpu error during {op}")]
    Wgpu {
        /// The operation or object that failed.
        op: &'static str,
        /// wgpu's error.
        #[source]
        source: wgpu::Error,
    },
    /// Waiting for the device to finish a submission failed (timed out, or a wrong
    /// submission index).
    #[error("waiting for the device during {op} failed")]
    Poll {
        /// The operation that waited.
        op: &'static str,
        /// wgpu's error.
        #[source]
        source: wgpu::PollError,
    },
    /// The device was lost (driver reset, `Device::destroy`, removal); make a new context.
    #[error("the GPU device was lost ({reason:?}): {message}")]
    DeviceLost {
        /// wgpu's reason.
        reason: wgpu::DeviceLostReason,
        /// wgpu's message.
        message: String,
    },
    /// Reading a buffer back to the host failed.
    #[error("reading back {label} failed")]
    Readback {
        /// Label of the buffer being read.
        label: &'static str,
        /// What failed: mapping the buffer or viewing its mapped range.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// No usable adapter was found (or none matched the requested name or index).
    #[error("no usable GPU adapter: {0}")]
    NoAdapter(String),
    /// The adapter refused to create a device.
    #[error("could not create a device on adapter {adapter}")]
    RequestDevice {
        /// The adapter's name.
        adapter: String,
        /// wgpu's error.
        #[source]
        source: wgpu::RequestDeviceError,
    },
    /// The operation needs the wgpu path but the context runs on the native CPU backend.
    #[error("{op} needs a wgpu device, but this context runs on the native CPU backend")]
    NoDevice {
        /// The operation.
        op: &'static str,
    },
    /// The call's [`CancelToken`](crate::CancelToken) was cancelled; it stopped at a chunk
    /// boundary and released everything it had allocated.
    #[error("{op} was cancelled")]
    Cancelled {
        /// The operation.
        op: &'static str,
    },
    /// Reading or writing a file failed (a checkpoint).
    #[error("{op}: {path:?}")]
    Io {
        /// The operation.
        op: &'static str,
        /// The file or directory.
        path: std::path::PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// A file is not a whole checkpoint of the kind asked for: foreign, truncated, damaged,
    /// or of another shape or label type. Nothing was loaded.
    #[error("{path:?} is not a usable checkpoint: its {what} should be {expected}, found {found}")]
    Checkpoint {
        /// The file.
        path: std::path::PathBuf,
        /// What does not match (`"magic"`, `"size"`, `"checksum"`, `"label type"`, `"shape"`, …).
        what: &'static str,
        /// What was expected.
        expected: String,
        /// What the file holds.
        found: String,
    },
    /// Another rank of a distributed operation (feature `mpi`) failed: every rank returns an
    /// error, the failing one its own, the others this one naming it and carrying its message.
    #[error("{op}: rank {rank} failed: {message}")]
    RankFailed {
        /// The operation.
        op: &'static str,
        /// The lowest failing rank.
        rank: usize,
        /// Its error, as its message.
        message: String,
    },
    /// A distributed operation (feature `mpi`) waited longer than its group's timeout for the
    /// other ranks to arrive at a collective step: one of them is stuck, dead or not calling
    /// the same operation. The group's collectives are out of step from then on, so it
    /// refuses every later operation with this error.
    #[error("{op}: rank {rank} waited {waited:?} for the other ranks; the group is unusable from here on")]
    Timeout {
        /// The operation.
        op: &'static str,
        /// The rank that gave up.
        rank: usize,
        /// How long it waited.
        waited: std::time::Duration,
    },
    /// An invariant of this crate does not hold: a bug. The message says which; please report
    /// it.
    #[error("internal error in {op}: {message} (a bug in wgpu-metric-learning)")]
    Internal {
        /// The operation.
        op: &'static str,
        /// What went wrong.
        message: String,
    },
}
