//! burn tensors in and out of [`wgpu_metric_learning`] on one shared wgpu device, for metric
//! learning inside a burn training step.
//!
//! - [`shared_wgpu`] lets burn set up its wgpu device and wraps the same device and queue in a
//!   library [`Context`]: burn's tensors and the library's buffers then live side by side.
//! - [`DeviceTensor::of`] hands a burn `(n, d)` float tensor to the library as
//!   [`DeviceEmbeddings`] without copying it: its own buffer, offset and row stride.
//! - [`index_columns`] turns mined triplets (or pairs) into burn `Int` index tensors, for a loss
//!   computed in burn with `select`; [`index_columns_on_device`] does the same, on the device,
//!   for triplets or neighbours the library left there.
//!
//! On a machine without a GPU the same loop runs with burn's CPU backend and the library's
//! native path: [`to_array`] and [`from_array`] convert there (see the `triplet_training`
//! example).
//!
//! Built on burn 0.22.1 without its fusion feature: a tensor's primitive is then the buffer
//! its kernels wrote (with fusion on, pending fused work would have to be resolved first).

use burn::backend::wgpu::CubeTensor;
use burn::backend::Cube;
use burn::tensor::{DType, Device, Int, Tensor, TensorCreationOptions, TensorData};
use cubecl_wgpu::{AutoCompiler, WgpuServer};
use ndarray::{Array2, ArrayView2};
use wgpu_metric_learning::{Context, ContextConfig, DeviceArray, DeviceEmbeddings};

/// Everything that can go wrong between burn and the library.
///
/// # Example
/// ```
/// let e = wgpu_metric_learning_burn::Error::NotWgpu("a CPU tensor".into());
/// assert!(e.to_string().contains("CPU"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// burn could not set up a wgpu device.
    #[error("burn could not set up its wgpu device: {0}")]
    Init(String),
    /// The library refused (its error says why).
    #[error(transparent)]
    Library(#[from] wgpu_metric_learning::Error),
    /// The tensor is not on a wgpu (CubeCL) device.
    #[error("the tensor is not on a wgpu device: {0}")]
    NotWgpu(String),
    /// The tensor's element type is not `f32`.
    #[error("expected an f32 tensor, got {0}")]
    DType(String),
    /// The tensor's rows are not contiguous floats (a transposed or tiled view), or index rows
    /// are not as wide as asked.
    #[error("unexpected layout: shape {shape:?}, strides {strides:?}")]
    Layout {
        /// Its shape.
        shape: Vec<usize>,
        /// Its strides, in elements.
        strides: Vec<usize>,
    },
    /// burn failed to read a tensor or to reach its buffer.
    #[error("burn: {0}")]
    Burn(String),
}

/// Shorthand for `Result<T, wgpu_metric_learning_burn::Error>`.
pub type Result<T> = std::result::Result<T, Error>;

/// A burn device and a library context on the same wgpu device and queue.
pub struct Shared {
    /// burn's device (without autodiff: call `.autodiff()` for training).
    pub device: Device,
    /// The library's context on the same wgpu device.
    pub ctx: Context,
}

/// Lets burn pick and set up its wgpu device (its best adapter, the adapter's limits and
/// features), then wraps that device and queue in a library context with `cfg`'s budget.
/// Call it before any burn tensor exists (burn sets a device up once).
///
/// # Errors
/// [`Error::Init`] when burn finds no usable adapter; [`Error::Library`] when the device falls
/// short of the library's kernels.
///
/// # Example
/// ```no_run
/// use wgpu_metric_learning::ContextConfig;
/// let shared = wgpu_metric_learning_burn::shared_wgpu(&ContextConfig::default())?;
/// println!("burn and the library on {}", shared.ctx.device_name());
/// # Ok::<(), wgpu_metric_learning_burn::Error>(())
/// ```
pub fn shared_wgpu(cfg: &ContextConfig) -> Result<Shared> {
    let (device, setup) = Device::wgpu_options()
        .init_with_setup()
        .map_err(|e| Error::Init(format!("{e:?}")))?;
    let info = setup.adapter.get_info();
    let ctx = Context::from_wgpu(setup.device.clone(), setup.queue.clone(), info, cfg)?;
    Ok(Shared { device, ctx })
}

/// A burn `(n, d)` f32 tensor's rows in place on the device, for the library: the tensor's
/// buffer, offset and row stride, kept alive (not freed, reused or moved by burn) while this
/// lives. Made by [`DeviceTensor::of`].
pub struct DeviceTensor {
    buffer: wgpu::Buffer,
    offset: u64,
    rows: usize,
    cols: usize,
    row_stride: usize,
    /// burn's hold on the allocation, and the tensor itself.
    _keep: Box<dyn std::any::Any>,
}

impl DeviceTensor {
    /// The rows of `t` `(n, d)` (detached from autodiff: the library reads values only) where
    /// burn keeps them. burn's queued work is submitted first, so that work the library
    /// submits on the shared queue afterwards sees the values.
    ///
    /// # Errors
    /// [`Error::NotWgpu`] for a tensor of another backend; [`Error::DType`] for other than
    /// f32; [`Error::Layout`] when its rows are not contiguous floats; [`Error::Burn`] when
    /// burn cannot reach or submit its buffer.
    ///
    /// # Example
    /// ```no_run
    /// use burn::tensor::{Distribution, Tensor};
    /// use wgpu_metric_learning::{knn, ContextConfig, KnnConfig};
    /// use wgpu_metric_learning_burn::{shared_wgpu, DeviceTensor};
    /// let shared = shared_wgpu(&ContextConfig::default())?;
    /// let x = Tensor::<2>::random([100, 16], Distribution::Default, &shared.device);
    /// let rows = DeviceTensor::of(&x)?;
    /// let found = knn(&shared.ctx, rows.embeddings(), rows.embeddings(), &KnnConfig::default())?;
    /// assert_eq!(found.indices.nrows(), 100);
    /// # Ok::<(), wgpu_metric_learning_burn::Error>(())
    /// ```
    pub fn of(t: &Tensor<2>) -> Result<Self> {
        let cube: CubeTensor = t
            .clone()
            .without_autodiff()
            .try_into_primitive::<Cube>()
            .map_err(|e| Error::NotWgpu(format!("{e:?}")))?;
        if cube.dtype != DType::F32 {
            return Err(Error::DType(format!("{:?}", cube.dtype)));
        }
        let shape: Vec<usize> = cube.meta.shape().to_vec();
        let strides: Vec<usize> = cube.meta.strides().to_vec();
        let (rows, cols) = match shape[..] {
            [rows, cols] => (rows, cols),
            _ => return Err(Error::Layout { shape, strides }),
        };
        let unit_columns = cols <= 1 || strides[1] == 1;
        let row_stride = if rows <= 1 { cols } else { strides[0] };
        if cube.meta.is_tiled() || !unit_columns || row_stride < cols {
            return Err(Error::Layout { shape, strides });
        }
        let (buffer, offset, keep) = resource(cube)?;
        Ok(Self {
            buffer,
            offset,
            rows,
            cols,
            row_stride,
            _keep: keep,
        })
    }

    /// The rows as the library's input (valid while `self` lives).
    ///
    /// See the example of [`DeviceTensor::of`].
    pub fn embeddings(&self) -> DeviceEmbeddings<'_> {
        DeviceEmbeddings::new(&self.buffer, self.offset, (self.rows, self.cols))
            .with_row_stride(self.row_stride)
    }
}

/// A burn tensor's buffer and byte offset on the wgpu device, with what keeps them (burn's
/// hold on the allocation and the tensor). burn's queued work is submitted first, so that
/// work submitted on the shared queue afterwards comes after it.
fn resource(cube: CubeTensor) -> Result<(wgpu::Buffer, u64, Box<dyn std::any::Any>)> {
    let managed = cube
        .client
        .get_resource::<WgpuServer<AutoCompiler>>(cube.handle.clone())
        .map_err(|e| Error::Burn(format!("{e:?}")))?;
    // The kernels that wrote the tensor (or last used its memory) may still sit in burn's
    // encoder: submit them, on this thread's stream and on the tensor's own.
    cube.client
        .flush()
        .map_err(|e| Error::Burn(format!("{e:?}")))?;
    let stream = cube.handle.stream;
    stream
        .executes(|| cube.client.flush())
        .map_err(|e| Error::Burn(format!("{e:?}")))?;
    let res = managed.resource();
    let (buffer, offset) = (res.buffer.clone(), res.offset);
    Ok((buffer, offset, Box::new((managed, cube))))
}

/// The `C` columns of `(t, C)` index rows that the library left on the device (triplets of
/// [`wgpu_metric_learning::mine_triplets_on_device`], neighbours of
/// [`wgpu_metric_learning::knn_on_device`]) as burn `Int` tensors `(t,)` on `device`, for
/// `select`, without a trip to the host: the rows are copied on the device into a new
/// `(t, C)` `i32` tensor of burn's, whose columns burn then slices. Indices must stay below
/// 2³¹ (references of up to two billion rows).
///
/// `device` must be the wgpu device `ctx` shares with burn ([`shared_wgpu`]), with or without
/// autodiff.
///
/// # Errors
/// [`Error::Layout`] when `indices` does not have `C` columns; [`Error::NotWgpu`] when
/// `device` is not a wgpu device; [`Error::Library`] when the copy is refused (another
/// device); [`Error::Burn`] when burn cannot reach or submit its buffer.
///
/// # Example
/// ```no_run
/// use wgpu_metric_learning::{mine_triplets_on_device, ContextConfig, MiningSet, TripletConfig};
/// use wgpu_metric_learning_burn::{index_columns_on_device, shared_wgpu};
/// let shared = shared_wgpu(&ContextConfig::default())?;
/// let labels = ndarray::Array1::from_shape_fn(64, |i| i % 4);
/// let mined = mine_triplets_on_device(&shared.ctx, &MiningSet::from_labels(&labels), None, &TripletConfig::default())?;
/// let [a, p, n] = index_columns_on_device::<3>(&shared.ctx, &mined.triplets, &shared.device)?;
/// assert_eq!(a.dims(), [mined.len()]);
/// # let _ = (p, n);
/// # Ok::<(), wgpu_metric_learning_burn::Error>(())
/// ```
pub fn index_columns_on_device<const C: usize>(
    ctx: &Context,
    indices: &DeviceArray<u32>,
    device: &Device,
) -> Result<[Tensor<1, Int>; C]> {
    let (t, cols) = indices.dim();
    if cols != C {
        return Err(Error::Layout {
            shape: vec![t, cols],
            strides: vec![cols, 1],
        });
    }
    if t == 0 {
        return Ok(std::array::from_fn(|_| {
            Tensor::<1, Int>::from_data(TensorData::new(Vec::<i64>::new(), [0]), device)
        }));
    }
    let options = TensorCreationOptions::new(device.clone()).with_dtype(DType::I32);
    let rows = Tensor::<2, Int>::empty([t, C], options);
    // An autodiff device's Int tensors are the inner backend's: the same buffer.
    let cube: CubeTensor = rows
        .clone()
        .without_autodiff()
        .try_into_primitive::<Cube>()
        .map_err(|e| Error::NotWgpu(format!("{e:?}")))?;
    let (buffer, offset, keep) = resource(cube)?;
    indices.copy_to(ctx, &buffer, offset)?;
    drop(keep);
    Ok(std::array::from_fn(|c| {
        rows.clone().slice([0..t, c..c + 1]).reshape([t])
    }))
}

/// The `C` columns of `(t, C)` index rows (triplets `(a, p, n)`, pairs `(a, b)`) as burn
/// `Int` tensors `(t,)` on `device`, for `select`: one upload of `8 · t · C` bytes.
///
/// # Errors
/// [`Error::Layout`] when `indices` does not have `C` columns.
///
/// # Example
/// ```
/// let t = ndarray::array![[0u32, 1, 2], [3, 4, 5]];
/// let [a, p, n] = wgpu_metric_learning_burn::index_columns::<3>(t.view(), &burn::tensor::Device::flex())?;
/// assert_eq!(p.try_to_vec_as::<i64>().ok(), Some(vec![1, 4]));
/// # let _ = (a, n);
/// # Ok::<(), wgpu_metric_learning_burn::Error>(())
/// ```
pub fn index_columns<const C: usize>(
    indices: ArrayView2<'_, u32>,
    device: &Device,
) -> Result<[Tensor<1, Int>; C]> {
    if indices.ncols() != C {
        return Err(Error::Layout {
            shape: indices.shape().to_vec(),
            strides: indices
                .strides()
                .iter()
                .map(|&s| s.unsigned_abs())
                .collect(),
        });
    }
    Ok(std::array::from_fn(|c| {
        let column: Vec<i64> = indices.column(c).iter().map(|&i| i64::from(i)).collect();
        let n = column.len();
        Tensor::<1, Int>::from_data(TensorData::new(column, [n]), device)
    }))
}

/// A burn `(n, d)` float tensor copied to a host array (the CPU path, where the library reads
/// host rows).
///
/// # Errors
/// [`Error::Burn`] when burn cannot read it back as f32.
///
/// # Example
/// ```
/// use burn::tensor::{Device, Tensor};
/// let t = Tensor::<2>::from_floats([[1.0, 2.0], [3.0, 4.0]], &Device::flex());
/// let a = wgpu_metric_learning_burn::to_array(&t)?;
/// assert_eq!(a, ndarray::array![[1.0f32, 2.0], [3.0, 4.0]]);
/// # Ok::<(), wgpu_metric_learning_burn::Error>(())
/// ```
pub fn to_array(t: &Tensor<2>) -> Result<Array2<f32>> {
    let [rows, cols] = t.dims();
    let values = t
        .to_data()
        .try_to_vec_as::<f32>()
        .map_err(|e| Error::Burn(format!("{e:?}")))?;
    Array2::from_shape_vec((rows, cols), values).map_err(|e| Error::Burn(e.to_string()))
}

/// A host array `(n, d)` as a burn tensor on `device` (no autodiff).
///
/// # Example
/// ```
/// let a = ndarray::array![[1.0f32, 2.0]];
/// let t = wgpu_metric_learning_burn::from_array(a.view(), &burn::tensor::Device::flex());
/// assert_eq!(t.dims(), [1, 2]);
/// ```
pub fn from_array(a: ArrayView2<'_, f32>, device: &Device) -> Tensor<2> {
    let (rows, cols) = a.dim();
    let values: Vec<f32> = a.iter().copied().collect();
    Tensor::<2>::from_data(TensorData::new(values, [rows, cols]), device)
}
