//! `.npy` files in and out, with messages that name the file and the problem.

use std::path::Path;

use ndarray::{Array1, Array2, ArrayBase, Data, Dimension};
use ndarray_npy::{read_npy, write_npy, ReadNpyError, ReadableElement, WritableElement};

/// A one-line message naming `path` and what is wrong with it.
pub(crate) fn problem(path: &Path, what: impl std::fmt::Display) -> String {
    format!("{}: {what}", path.display())
}

/// Reads `path` as an array of element `A` and dimension `D`; `Ok(None)` when the file's
/// dtype is another one (so the caller can try the next accepted dtype).
fn read_as<A: ReadableElement, D: Dimension>(
    path: &Path,
    what: &str,
) -> Result<Option<ndarray::Array<A, D>>, String> {
    match read_npy(path) {
        Ok(a) => Ok(Some(a)),
        Err(ReadNpyError::WrongDescriptor(_)) => Ok(None),
        Err(ReadNpyError::WrongNdim(want, got)) => Err(problem(
            path,
            format!(
                "{what} must have {} dimension(s), the file has {got}",
                want.map_or("a fixed number of".into(), |w| w.to_string())
            ),
        )),
        Err(ReadNpyError::Io(e)) => Err(problem(path, format!("cannot read it: {e}"))),
        Err(e) => Err(problem(path, format!("not a readable .npy file: {e}"))),
    }
}

/// The dtype named in `path`'s header, for messages about an unaccepted one.
fn dtype_of(path: &Path) -> String {
    let Ok(bytes) = std::fs::read(path) else {
        return "unknown".into();
    };
    let header = String::from_utf8_lossy(&bytes[..bytes.len().min(256)]).into_owned();
    header
        .split("'descr':")
        .nth(1)
        .and_then(|rest| rest.split('\'').nth(1))
        .map_or_else(|| "unknown".into(), str::to_owned)
}

/// Embeddings `(n, d)`: float32, or float64 converted (numpy's default dtype).
pub(crate) fn read_embeddings(path: &Path) -> Result<Array2<f32>, String> {
    let what = "embeddings";
    if let Some(a) = read_as::<f32, ndarray::Ix2>(path, what)? {
        return Ok(a.as_standard_layout().into_owned());
    }
    if let Some(a) = read_as::<f64, ndarray::Ix2>(path, what)? {
        return Ok(a.mapv(|v| v as f32));
    }
    Err(problem(
        path,
        format!(
            "embeddings must be float32 or float64, the file holds dtype {}",
            dtype_of(path)
        ),
    ))
}

/// Labels `(n,)`: int32, int64 or uint32, as `i64`.
pub(crate) fn read_labels(path: &Path) -> Result<Array1<i64>, String> {
    let what = "labels";
    if let Some(a) = read_as::<i64, ndarray::Ix1>(path, what)? {
        return Ok(a);
    }
    if let Some(a) = read_as::<i32, ndarray::Ix1>(path, what)? {
        return Ok(a.mapv(i64::from));
    }
    if let Some(a) = read_as::<u32, ndarray::Ix1>(path, what)? {
        return Ok(a.mapv(i64::from));
    }
    Err(problem(
        path,
        format!(
            "labels must be int32, int64 or uint32, the file holds dtype {}",
            dtype_of(path)
        ),
    ))
}

/// Writes `array` to `path`.
pub(crate) fn write<A, S, D>(path: &Path, array: &ArrayBase<S, D>) -> Result<(), String>
where
    A: WritableElement,
    S: Data<Elem = A>,
    D: Dimension,
{
    write_npy(path, array).map_err(|e| problem(path, format!("cannot write it: {e}")))
}

/// `u32` indices as numpy/PML's `int64`.
pub(crate) fn indices(a: &Array2<u32>) -> Array2<i64> {
    a.mapv(i64::from)
}
