//! Embeddings in a `wgpu::Buffer` of the context's device: where they lie, checked and
//! imported by [`crate::data::inputs`] and [`crate::data::device_rows`].
//!
//! Operations copy the rows on the device into their own zero-padded layout (counted in the
//! budget) and check there that every value is finite: one host wait and 4 bytes per row of
//! squared norms read back, none of the embeddings' bytes. Labels stay on the host.
//!
//! A buffer of another device is refused when both devices were made by this crate on
//! Vulkan, Metal or DX12 (their contexts share one wgpu instance) or share the application's
//! instance ([`crate::Context::from_wgpu`]). wgpu cannot tell buffers of different instances
//! apart (GL contexts each have their own): never pass one.

/// Embeddings `(rows, cols)` of `f32`, row-major in a `wgpu::Buffer` of the context's device
/// (usage `COPY_SRC`): row `i` starts `offset + 4 · i · row_stride` bytes in. Operations copy
/// and check them on the device (one wait, 4 bytes per row read back).
///
/// # Errors
/// An operation given them fails with [`crate::Error::InvalidParameter`] on a native context,
/// for an offset not a multiple of 4, a row stride below the columns, a buffer without
/// `COPY_SRC`, rows past its end or a buffer of another device; [`crate::Error::Shape`] for 0
/// columns; [`crate::Error::NonFinite`] for a NaN or infinity (`InvalidParameter` for a row
/// whose squared norm overflows f32); [`crate::Error::BudgetExceeded`] when the copy does not
/// fit the budget.
///
/// # Example
/// ```no_run
/// use wgpu_metric_learning::{knn, Context, ContextConfig, DeviceEmbeddings, KnnConfig};
/// let ctx = Context::new(&ContextConfig::default())?;
/// let (device, _) = ctx.wgpu_device().expect("a wgpu context");
/// // 100 rows of 32 floats, in a buffer your model wrote.
/// let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC;
/// let buffer = device.create_buffer(&wgpu::BufferDescriptor { label: None, size: 100 * 32 * 4, usage, mapped_at_creation: false });
/// let x = DeviceEmbeddings::new(&buffer, 0, (100, 32));
/// let found = knn(&ctx, x, x, &KnnConfig { k: 5, ..Default::default() })?;
/// assert_eq!(found.indices.dim(), (100, 5));
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceEmbeddings<'a> {
    buffer: &'a wgpu::Buffer,
    offset: u64,
    rows: usize,
    cols: usize,
    row_stride: usize,
}

impl<'a> DeviceEmbeddings<'a> {
    /// Dense rows `(rows, cols)` at byte `offset` of `buffer` (a row stride of `cols`).
    ///
    /// See the example of [`DeviceEmbeddings`].
    pub fn new(buffer: &'a wgpu::Buffer, offset: u64, (rows, cols): (usize, usize)) -> Self {
        Self {
            buffer,
            offset,
            rows,
            cols,
            row_stride: cols,
        }
    }

    /// The same rows, `row_stride` floats apart (at least `cols`): a column slice of a wider
    /// matrix, or rows padded by the producer.
    ///
    /// # Example
    /// ```no_run
    /// # let buffer: wgpu::Buffer = unimplemented!();
    /// use wgpu_metric_learning::DeviceEmbeddings;
    /// // The first 64 columns of a (1000, 80) matrix.
    /// let x = DeviceEmbeddings::new(&buffer, 0, (1000, 64)).with_row_stride(80);
    /// assert_eq!((x.dim(), x.row_stride()), ((1000, 64), 80));
    /// ```
    pub fn with_row_stride(self, row_stride: usize) -> Self {
        Self { row_stride, ..self }
    }

    /// The buffer holding the rows.
    ///
    /// See the example of [`DeviceEmbeddings`].
    pub fn buffer(&self) -> &'a wgpu::Buffer {
        self.buffer
    }

    /// Byte offset of row 0 in [`Self::buffer`].
    ///
    /// See the example of [`DeviceEmbeddings`].
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Floats from one row's start to the next one's.
    ///
    /// See the example of [`DeviceEmbeddings::with_row_stride`].
    pub fn row_stride(&self) -> usize {
        self.row_stride
    }

    /// `(rows, cols)`.
    ///
    /// See the example of [`DeviceEmbeddings::with_row_stride`].
    pub fn dim(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// Bytes from [`Self::offset`] to the end of the last row (`None` past `u64`).
    pub(crate) fn extent(&self) -> Option<u64> {
        if self.rows == 0 {
            return Some(0);
        }
        let last = (self.rows as u64 - 1).checked_mul(self.row_stride as u64)?;
        last.checked_add(self.cols as u64)?.checked_mul(4)
    }
}
