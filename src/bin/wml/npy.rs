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
