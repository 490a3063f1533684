//! Results kept on the device: arrays the library computed, in buffers it allocated and counts
//! in the context's budget, for the next step of a training loop to read where they are.

use std::marker::PhantomData;

use ndarray::Array2;

use crate::context::Context;
use crate::data::device_rows::probe;
use crate::error::{Error, Result};
use crate::runtime::device::GpuDevice;
use crate::runtime::memory::TrackedBuffer;
use crate::runtime::transfer::{self, Recorder, Staging};

mod sealed {
    pub trait Sealed {}
    impl Sealed for u32 {}
    impl Sealed for f32 {}
}

/// An element type of a [`DeviceArray`]: `u32` (indices) or `f32` (scores). Sealed.
pub trait DeviceElement:
    sealed::Sealed + bytemuck::Pod + std::fmt::Debug + Send + Sync + 'static
{
}
impl DeviceElement for u32 {}
impl DeviceElement for f32 {}

/// `ctx`'s wgpu device, for an operation `op` whose result stays there.
pub(crate) fn output_device<'c>(op: &'static str, ctx: &'c Context) -> Result<&'c GpuDevice> {
    ctx.gpu().ok_or_else(|| Error::InvalidParameter {
        op,
        what: "ctx",
        value: ctx.device_name(),
        rule: "results on the device need a wgpu context",
    })
}

/// Most bytes one readback of [`DeviceArray::to_host`] maps at a time.
const READ_CHUNK: u64 = 16 << 20;

/// A `(rows, cols)` array of `T`, row-major and dense, in a `wgpu::Buffer` of its context's
/// device that the library allocated for a result ([`crate::knn_on_device`],
/// [`crate::mine_triplets_on_device`]). Its bytes count in the context's budget until it is
/// dropped, which frees the buffer.
///
/// Use it in place ([`DeviceArray::buffer`]: `STORAGE | COPY_SRC | COPY_DST`, the array at
/// offset 0; an empty array has a buffer of 4 bytes), copy it into a buffer of your own
/// on the device ([`DeviceArray::copy_to`]), or read it back ([`DeviceArray::to_host`]).
/// Work the library submitted to write it is queued before anything submitted afterwards on
/// the context's queue.
///
/// # Example
/// ```no_run
/// use wgpu_metric_learning::{knn_on_device, Context, ContextConfig, KnnConfig};
/// let ctx = Context::new(&ContextConfig::default())?;
/// let x = ndarray::Array2::<f32>::ones((100, 16));
/// let found = knn_on_device(&ctx, &x, &x, &KnnConfig::default())?;
/// assert_eq!(found.indices.dim(), (100, 10));
/// let bind_me: &wgpu::Buffer = found.indices.buffer(); // (100, 10) u32, row-major
/// # let _ = bind_me;
/// let host = found.scores.to_host(&ctx)?; // one readback, for inspection
/// assert_eq!(host.dim(), (100, 10));
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug)]
pub struct DeviceArray<T: DeviceElement> {
    buffer: TrackedBuffer,
    /// The device's serial ([`GpuDevice::serial`]).
    device: u64,
    rows: usize,
    cols: usize,
    _element: PhantomData<T>,
}

impl<T: DeviceElement> DeviceArray<T> {
    /// A new array `(rows, cols)` on `gpu`, its contents unspecified.
    pub(crate) fn new(
        gpu: &GpuDevice,
        label: &'static str,
        (rows, cols): (usize, usize),
    ) -> Result<Self> {
        let bytes = (rows as u64)
            .checked_mul(cols as u64)
            .and_then(|n| n.checked_mul(4))
            .ok_or(Error::DeviceLimit {
                op: label,
                what: "max_buffer_size",
                requested: u64::MAX,
                limit: gpu.limits.max_buffer_size,
            })?;
        Ok(Self {
            buffer: transfer::output(gpu, label, bytes)?,
            device: gpu.serial,
            rows,
            cols,
            _element: PhantomData,
        })
    }

    /// A new array on `gpu` holding `values` (one queued upload, counted in the transfers).
    pub(crate) fn from_host(
        gpu: &GpuDevice,
        label: &'static str,
        values: ndarray::ArrayView2<'_, T>,
    ) -> Result<Self> {
        let array = Self::new(gpu, label, values.dim())?;
        let rows = values.as_standard_layout();
        let flat = rows.as_slice().ok_or(Error::Internal {
            op: label,
            message: "a standard-layout array is not contiguous".into(),
        })?;
        transfer::write(gpu, &array.buffer, 0, flat)?;
        Ok(array)
    }

    /// The array's buffer (for the library's kernels).
    pub(crate) fn tracked(&self) -> &TrackedBuffer {
        &self.buffer
    }

    /// The buffer holding the array at offset 0.
    ///
    /// See the example of [`DeviceArray`].
    pub fn buffer(&self) -> &wgpu::Buffer {
        self.buffer.buffer()
    }

    /// `(rows, cols)`.
    ///
    /// See the example of [`DeviceArray`].
    pub fn dim(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// Bytes of the array itself: `4 · rows · cols`.
    ///
    /// # Example
    /// See [`DeviceArray::copy_to`].
    pub fn bytes(&self) -> u64 {
        4 * self.rows as u64 * self.cols as u64
    }

    /// This array's device, if it is `ctx`'s.
    fn gpu<'c>(&self, op: &'static str, ctx: &'c Context) -> Result<&'c GpuDevice> {
        match ctx.gpu() {
            Some(gpu) if gpu.serial == self.device => Ok(gpu),
            _ => Err(Error::InvalidParameter {
                op,
                what: "ctx",
                value: ctx.device_name(),
                rule: "a device array is read with the context that made it",
            }),
        }
    }

    /// The array read back to the host through one staging buffer of at most 16 MiB (less
    /// when the budget has less left): one host wait per staging buffer's worth.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for a context other than the one that made the array;
    /// device errors; [`Error::BudgetExceeded`] when the staging buffer does not fit.
    ///
    /// See the example of [`DeviceArray`].
    pub fn to_host(&self, ctx: &Context) -> Result<Array2<T>> {
        const OP: &str = "DeviceArray::to_host";
        let gpu = self.gpu(OP, ctx)?;
        let bytes = self.bytes();
        let mut out = Vec::with_capacity(self.rows * self.cols);
        if bytes > 0 {
            // Chunks of what the budget has left, up to 16 MiB (at least one element).
            let chunk = bytes.min(READ_CHUNK).min(gpu.memory.available()) / 4 * 4;
            let chunk = chunk.max(4);
            let staging = Staging::new(gpu, OP, chunk)?;
            let mut at = 0;
            while at < bytes {
                let len = (bytes - at).min(chunk);
                let mut rec = Recorder::new(gpu, OP);
                rec.read_back(&self.buffer, at, &staging, 0, len);
                let done = rec.submit()?;
                staging
                    .map(&done, len)
                    .read::<T, _>(gpu, (len / 4) as usize, |v| out.extend_from_slice(v))?;
                at += len;
            }
        }
        Array2::from_shape_vec((self.rows, self.cols), out).map_err(|e| Error::Internal {
            op: OP,
            message: e.to_string(),
        })
    }

    /// Copies the array on the device into `target` at byte `offset` (a buffer of your own on
    /// the context's device, with `COPY_DST` usage: a framework's tensor, say), queued on the
    /// context's queue without waiting. Nothing crosses to the host.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for a context other than the one that made the array, the
    /// array's own buffer, an offset that is not a multiple of 4, a target without `COPY_DST`,
    /// too small for the array at `offset`, or of another device (or destroyed); device errors.
    ///
    /// # Example
    /// ```no_run
    /// use wgpu_metric_learning::{knn_on_device, Context, ContextConfig, KnnConfig};
    /// let ctx = Context::new(&ContextConfig::default())?;
    /// let x = ndarray::Array2::<f32>::ones((100, 16));
    /// let found = knn_on_device(&ctx, &x, &x, &KnnConfig::default())?;
    /// let (device, _) = ctx.wgpu_device().expect("a wgpu context");
    /// let mine = device.create_buffer(&wgpu::BufferDescriptor {
    ///     label: Some("neighbours"), size: found.indices.bytes(), mapped_at_creation: false,
    ///     usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
    /// });
    /// found.indices.copy_to(&ctx, &mine, 0)?;
    /// # Ok::<(), wgpu_metric_learning::Error>(())
    /// ```
    pub fn copy_to(&self, ctx: &Context, target: &wgpu::Buffer, offset: u64) -> Result<()> {
        const OP: &str = "DeviceArray::copy_to";
        let gpu = self.gpu(OP, ctx)?;
        let invalid = |rule, value| Error::InvalidParameter {
            op: OP,
            what: "target",
            value,
            rule,
        };
        if target == self.buffer.buffer() {
            return Err(invalid(
                "the target must be another buffer than the array's own",
                format!("{target:?}"),
            ));
        }
        if !offset.is_multiple_of(4) {
            return Err(invalid(
                "the offset must be a multiple of 4 bytes",
                format!("offset {offset}"),
            ));
        }
        if !target.usage().contains(wgpu::BufferUsages::COPY_DST) {
            return Err(invalid(
                "the buffer needs COPY_DST usage",
                format!("{:?}", target.usage()),
            ));
        }
        let bytes = self.bytes();
        if offset
            .checked_add(bytes)
            .is_none_or(|end| end > target.size())
        {
            return Err(invalid(
                "the array must fit the buffer from the offset",
                format!(
                    "{bytes} bytes at byte {offset} of a {}-byte buffer",
                    target.size()
                ),
            ));
        }
        if bytes == 0 {
            return Ok(());
        }
        let own = (self.buffer.buffer(), 0);
        probe(gpu, (OP, "target"), own, (target, offset), target)?;
        let mut rec = Recorder::new(gpu, OP);
        rec.copy_to_foreign(&self.buffer, 0, target, offset, bytes);
        rec.submit().map(|_| ())
    }
}
