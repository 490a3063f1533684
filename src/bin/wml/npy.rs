//! `.npy` files in and out, with messages that name the file and the problem.

use std::path::Path;

use ndarray::{Array1, Array2, ArrayBase, Data, Dimension};
use ndarray_npy::npy::header::Header;
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
    check_size(path)?;
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

/// Refuses a header whose shape claims more elements than the file has bytes: the reader
/// allocates the whole array before reading it, so a corrupt or hostile header could
/// otherwise ask for terabytes and abort the process. Every accepted dtype has at least 4
/// bytes per element, so what passes allocates at most twice the file's size.
fn check_size(path: &Path) -> Result<(), String> {
    let file =
        std::fs::File::open(path).map_err(|e| problem(path, format!("cannot read it: {e}")))?;
    let bytes = file.metadata().map_or(0, |m| m.len());
    let header = Header::from_reader(&mut std::io::BufReader::new(file))
        .map_err(|e| problem(path, format!("not a readable .npy file: {e}")))?;
    let elements = header
        .shape
        .iter()
        .try_fold(1u64, |n, &s| n.checked_mul(s as u64));
    match elements {
        Some(n) if n <= bytes => Ok(()),
        _ => Err(problem(
            path,
            format!(
                "the header's shape {:?} needs more data than the file's {bytes} bytes",
                header.shape
            ),
        )),
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

/// A C-order array's header, and where its data starts, read without the data.
#[cfg(feature = "mpi")]
struct Layout {
    shape: Vec<usize>,
    /// numpy's dtype string (`<f4`, `<i8`, …).
    descr: String,
    data_start: u64,
}

#[cfg(feature = "mpi")]
fn layout(path: &Path, ndim: usize, what: &str) -> Result<Layout, String> {
    use std::io::Seek;
    let mut file =
        std::fs::File::open(path).map_err(|e| problem(path, format!("cannot read it: {e}")))?;
    let bytes = file.metadata().map_or(0, |m| m.len());
    let header = Header::from_reader(&mut file)
        .map_err(|e| problem(path, format!("not a readable .npy file: {e}")))?;
    let data_start = file
        .stream_position()
        .map_err(|e| problem(path, format!("cannot read it: {e}")))?;
    if header.shape.len() != ndim {
        return Err(problem(
            path,
            format!(
                "{what} must have {ndim} dimension(s), the file has {}",
                header.shape.len()
            ),
        ));
    }
    if header.layout.is_fortran() && ndim > 1 {
        return Err(problem(
            path,
            format!(
                "{what} in Fortran order cannot be read by row ranges: save it in C order \
                 (numpy.ascontiguousarray)"
            ),
        ));
    }
    let descr = header
        .type_descriptor
        .to_string()
        .trim_matches('\'')
        .to_owned();
    let width = element_bytes(&descr).unwrap_or(1);
    let needed = header
        .shape
        .iter()
        .try_fold(width as u64, |n, &s| n.checked_mul(s as u64))
        .and_then(|n| n.checked_add(data_start));
    if needed.is_none_or(|n| n > bytes) {
        return Err(problem(
            path,
            format!(
                "the header's shape {:?} needs more data than the file's {bytes} bytes",
                header.shape
            ),
        ));
    }
    Ok(Layout {
        shape: header.shape,
        descr,
        data_start,
    })
}

/// Bytes per element of the dtypes read by row ranges (little-endian only).
#[cfg(feature = "mpi")]
fn element_bytes(descr: &str) -> Option<usize> {
    match descr {
        "<f4" | "<i4" | "<u4" => Some(4),
        "<f8" | "<i8" => Some(8),
        _ => None,
    }
}

/// The shape of `path`'s array, from its header alone.
#[cfg(feature = "mpi")]
pub(crate) fn shape_of(path: &Path, ndim: usize, what: &str) -> Result<Vec<usize>, String> {
    Ok(layout(path, ndim, what)?.shape)
}

/// The rows of `path`'s array (its first dimension), from its header alone.
#[cfg(feature = "mpi")]
pub(crate) fn rows_of(path: &Path, ndim: usize, what: &str) -> Result<usize, String> {
    Ok(layout(path, ndim, what)?.shape[0])
}

/// The bytes of rows `rows` of a C-order array whose rows hold `per_row` elements.
#[cfg(feature = "mpi")]
fn read_range(
    path: &Path,
    layout: &Layout,
    rows: std::ops::Range<usize>,
    per_row: usize,
) -> Result<Vec<u8>, String> {
    use std::io::{Read, Seek, SeekFrom};
    let width = element_bytes(&layout.descr).unwrap_or(1) as u64;
    let row_bytes = per_row as u64 * width;
    let mut file =
        std::fs::File::open(path).map_err(|e| problem(path, format!("cannot read it: {e}")))?;
    let mut bytes = vec![0u8; rows.len() * row_bytes as usize];
    file.seek(SeekFrom::Start(
        layout.data_start + rows.start as u64 * row_bytes,
    ))
    .and_then(|_| file.read_exact(&mut bytes))
    .map_err(|e| problem(path, format!("cannot read rows {rows:?}: {e}")))?;
    Ok(bytes)
}

/// Rows `rows` of embeddings `(n, d)` (float32 or float64, little-endian, C order), read
/// alone: the rest of the file is never read.
#[cfg(feature = "mpi")]
pub(crate) fn read_embedding_rows(
    path: &Path,
    rows: std::ops::Range<usize>,
) -> Result<Array2<f32>, String> {
    let layout = layout(path, 2, "embeddings")?;
    let d = layout.shape[1];
    let bytes = read_range(path, &layout, rows.clone(), d)?;
    let values = floats(path, &layout.descr, &bytes)?;
    Array2::from_shape_vec((rows.len(), d), values).map_err(|e| problem(path, e))
}

/// Columns `cols` of a `(n, m)` float32 or float64 array (little-endian, C order), each row's
/// part read alone: `n` reads, the rest of the file never read.
#[cfg(feature = "mpi")]
pub(crate) fn read_columns(
    path: &Path,
    cols: std::ops::Range<usize>,
) -> Result<Array2<f32>, String> {
    use std::io::{Read, Seek, SeekFrom};
    let layout = layout(path, 2, "weights")?;
    let (n, m) = (layout.shape[0], layout.shape[1]);
    if cols.end > m {
        return Err(problem(path, format!("columns {cols:?} of {m}")));
    }
    let width = element_bytes(&layout.descr).unwrap_or(1) as u64;
    let mut file =
        std::fs::File::open(path).map_err(|e| problem(path, format!("cannot read it: {e}")))?;
    let mut bytes = vec![0u8; n * cols.len() * width as usize];
    for (i, part) in bytes
        .chunks_exact_mut(cols.len() * width as usize)
        .enumerate()
    {
        let at = layout.data_start + (i as u64 * m as u64 + cols.start as u64) * width;
        file.seek(SeekFrom::Start(at))
            .and_then(|_| file.read_exact(part))
            .map_err(|e| problem(path, format!("cannot read row {i}'s columns {cols:?}: {e}")))?;
    }
    let values = floats(path, &layout.descr, &bytes)?;
    Array2::from_shape_vec((n, cols.len()), values).map_err(|e| problem(path, e))
}

/// Little-endian float32 or float64 bytes as `f32`.
#[cfg(feature = "mpi")]
fn floats(path: &Path, descr: &str, bytes: &[u8]) -> Result<Vec<f32>, String> {
    match descr {
        "<f4" => Ok(bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()),
        "<f8" => Ok(bytes
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32)
            .collect()),
        other => Err(problem(
            path,
            format!("arrays read in parts must be float32 or float64 (little-endian), the file holds dtype {other}"),
        )),
    }
}

/// Rows `rows` of labels `(n,)` (int32, int64 or uint32, little-endian) as `i64`, read alone.
#[cfg(feature = "mpi")]
pub(crate) fn read_label_rows(
    path: &Path,
    rows: std::ops::Range<usize>,
) -> Result<Array1<i64>, String> {
    let layout = layout(path, 1, "labels")?;
    let bytes = read_range(path, &layout, rows, 1)?;
    let values: Vec<i64> = match layout.descr.as_str() {
        "<i8" => bytes
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .collect(),
        "<i4" => bytes
            .chunks_exact(4)
            .map(|b| i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .collect(),
        "<u4" => bytes
            .chunks_exact(4)
            .map(|b| i64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .collect(),
        other => {
            return Err(problem(
                path,
                format!("labels read by rows must be int32, int64 or uint32 (little-endian), the file holds dtype {other}"),
            ))
        }
    };
    Ok(Array1::from(values))
}

/// Writes `array` to `path` atomically: into a temporary file beside it, flushed to disk,
/// then renamed over it, so that an interrupted run never leaves a half-written output.
pub(crate) fn write<A, S, D>(path: &Path, array: &ArrayBase<S, D>) -> Result<(), String>
where
    A: WritableElement,
    S: Data<Elem = A>,
    D: Dimension,
{
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.wml-partial"));
    let written = write_npy(&tmp, array)
        .map_err(|e| e.to_string())
        .and_then(|()| {
            std::fs::File::open(&tmp)
                .and_then(|f| f.sync_all())
                .map_err(|e| e.to_string())
        })
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| e.to_string()));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(problem(path, format!("cannot write it: {e}")));
    }
    Ok(())
}

/// `u32` indices as numpy/PML's `int64`.
pub(crate) fn indices(a: &Array2<u32>) -> Array2<i64> {
    a.mapv(i64::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A fresh path in the temporary directory, unique per call.
    fn scratch(name: &str) -> std::path::PathBuf {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::env::temp_dir().join(format!("wml-npy-{}-{n}-{name}.npy", std::process::id()))
    }

    #[test]
    fn a_failed_write_keeps_the_old_file_and_leaves_nothing_half_written() {
        let path = scratch("atomic");
        write(&path, &ndarray::Array1::<i64>::from_elem(3, 1)).expect("first write");
        let before = std::fs::read(&path).expect("read");
        // A directory where the temporary file goes: the write fails before the rename.
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let blocker = path.with_file_name(format!(".{name}.wml-partial"));
        std::fs::create_dir_all(blocker.join("inside")).expect("blocker");
        let failed = write(&path, &ndarray::Array1::<i64>::from_elem(9, 2));
        assert!(failed.is_err());
        assert_eq!(
            std::fs::read(&path).expect("read"),
            before,
            "the old file stays whole"
        );
        let _ = std::fs::remove_dir_all(&blocker);
        let _ = std::fs::remove_file(&path);
    }

    /// Valid `.npy` bytes of every dtype the CLI reads (and one it does not).
    fn valid_files() -> Vec<Vec<u8>> {
        let path = scratch("valid");
        let mut files = Vec::new();
        let mut keep = |r: Result<(), String>| {
            r.expect("write");
            files.push(std::fs::read(&path).expect("read back"));
        };
        keep(write(
            &path,
            &ndarray::Array2::<f32>::from_elem((3, 4), 1.5),
        ));
        keep(write(
            &path,
            &ndarray::Array2::<f64>::from_elem((2, 2), -2.0),
        ));
        keep(write(&path, &ndarray::Array1::<i64>::from_elem(5, 7)));
        keep(write(&path, &ndarray::Array1::<i32>::from_elem(4, 3)));
        keep(write(&path, &ndarray::Array1::<u32>::from_elem(3, 9)));
        keep(write(&path, &ndarray::Array1::<u8>::from_elem(6, 1)));
        let _ = std::fs::remove_file(&path);
        files
    }

    /// Reads `bytes` as embeddings and as labels: an error or an array, never a panic.
    fn read_both(bytes: &[u8]) {
        let path = scratch("fuzz");
        std::fs::write(&path, bytes).expect("write");
        let _ = read_embeddings(&path);
        let _ = read_labels(&path);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_header_claiming_a_huge_array_is_an_error_not_an_allocation() {
        let bytes = valid_files().swap_remove(0);
        let (old, new): (&[u8], &[u8]) = (b"(3, 4)", b"(999999999, 999999)");
        let at = bytes
            .windows(old.len())
            .position(|w| w == old)
            .expect("shape in the header");
        // The header keeps its declared length: the longer shape takes the place of padding.
        let newline = bytes.iter().position(|&b| b == b'\n').expect("header end");
        let mut forged = bytes[..at].to_vec();
        forged.extend_from_slice(new);
        forged.extend_from_slice(&bytes[at + old.len()..newline - (new.len() - old.len())]);
        forged.extend_from_slice(&bytes[newline..]);
        assert_eq!(forged.len(), bytes.len());
        let path = scratch("huge");
        std::fs::write(&path, &forged).expect("write");
        let got = read_embeddings(&path);
        let _ = std::fs::remove_file(&path);
        let message = got.expect_err("a 10¹⁵-element claim is refused");
        assert!(message.contains("needs more data"), "{message}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(
            std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(300)
        ))]

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            read_both(&bytes);
        }

        #[test]
        fn mutated_valid_files_never_panic(
            file in 0usize..6,
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
            cut in any::<prop::sample::Index>(),
            truncate in any::<bool>(),
        ) {
            let mut bytes = valid_files().swap_remove(file);
            for (at, value) in flips {
                let i = at.index(bytes.len());
                bytes[i] = value;
            }
            if truncate {
                let len = cut.index(bytes.len());
                bytes.truncate(len);
            }
            read_both(&bytes);
        }
    }
}
