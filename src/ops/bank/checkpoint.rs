//! Bank checkpoints: a memory bank written to one file atomically (temporary file, fsync,
//! rename, fsync of the directory) and read back whole or not at all.
//!
//! The format is little-endian and self-checking:
//!
//! | bytes | field |
//! | --- | --- |
//! | 8 | magic `WMLBANK\0` |
//! | 4 | format version (1) |
//! | 4 | label type, ASCII, NUL-padded (`i64\0`, `u32\0`, …) |
//! | 8 × 4 | capacity, dim, filled rows `len`, head |
//! | 8 | filled flag (0 or 1), then 7 zero bytes |
//! | `len` × label size | labels of slots `0 .. len` |
//! | `len` × dim × 4 | embeddings of slots `0 .. len`, f32 |
//! | 8 | FNV-1a 64 of every byte before it |
//!
//! A file is accepted only when its size is exactly what its header announces and its
//! checksum matches, so a truncated, extended or corrupted file is an error, never a bank.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use ndarray::{Array2, ArrayView2};

use crate::data::files::{io, write_atomic, Fnv, Sealed};
use crate::error::{Error, Result};

/// The first bytes of every checkpoint.
pub(super) const MAGIC: [u8; 8] = *b"WMLBANK\0";
/// The format this crate writes and reads.
pub(super) const VERSION: u32 = 1;
/// Bytes before the labels.
const HEADER: u64 = 8 + 4 + 4 + 4 * 8 + 8;
/// Bytes of the trailing checksum.
const TRAILER: u64 = 8;
/// Rows per buffered read or write of the embeddings.
const ROWS_PER_BLOCK: usize = 4096;

mod sealed {
    pub trait Sealed {}
}

/// Label types a [`crate::MemoryBank`] checkpoint can hold: the primitive integers. A
/// checkpoint records its label type, and loading it as another is an error.
///
/// # Example
/// ```
/// use wgpu_metric_learning::CheckpointLabel;
/// assert_eq!(<i64 as CheckpointLabel>::NAME, "i64");
/// ```
pub trait CheckpointLabel: sealed::Sealed + Copy {
    /// The type's name as written in the file (`"i64"`, `"u32"`, …).
    const NAME: &'static str;
    /// Bytes per label.
    #[doc(hidden)]
    const BYTES: usize;
    /// Appends the label's little-endian bytes.
    #[doc(hidden)]
    fn put(self, out: &mut Vec<u8>);
    /// The label from exactly [`Self::BYTES`] little-endian bytes.
    #[doc(hidden)]
    fn take(bytes: &[u8]) -> Self;
}

macro_rules! checkpoint_labels {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl CheckpointLabel for $t {
            const NAME: &'static str = stringify!($t);
            const BYTES: usize = std::mem::size_of::<$t>();
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn take(bytes: &[u8]) -> Self {
                let mut raw = [0u8; std::mem::size_of::<$t>()];
                raw.copy_from_slice(bytes);
                <$t>::from_le_bytes(raw)
            }
        }
    )*};
}
checkpoint_labels!(i8, i16, i32, i64, u8, u16, u32, u64);

/// The label type as stored: its name, NUL-padded to 4 bytes.
fn label_tag<L: CheckpointLabel>() -> [u8; 4] {
    let mut tag = [0u8; 4];
    for (t, b) in tag.iter_mut().zip(L::NAME.bytes()) {
        *t = b;
    }
    tag
}

/// What a checkpoint's header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Header {
    pub(super) capacity: usize,
    pub(super) dim: usize,
    pub(super) len: usize,
    pub(super) head: usize,
    pub(super) filled: bool,
}

impl Header {
    fn encode<L: CheckpointLabel>(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER as usize);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&label_tag::<L>());
        for v in [self.capacity, self.dim, self.len, self.head] {
            out.extend_from_slice(&(v as u64).to_le_bytes());
        }
        out.extend_from_slice(&[u8::from(self.filled), 0, 0, 0, 0, 0, 0, 0]);
        out
    }

    /// Bytes of the whole file this header announces (`None` past `u64`).
    fn file_bytes(&self, label_bytes: usize) -> Option<u64> {
        let len = self.len as u64;
        let labels = len.checked_mul(label_bytes as u64)?;
        let rows = len.checked_mul(self.dim as u64)?.checked_mul(4)?;
        HEADER
            .checked_add(labels)?
            .checked_add(rows)?
            .checked_add(TRAILER)
    }
}

/// The error for a file that is not a whole checkpoint of the expected kind.
fn bad(path: &Path, what: &'static str, expected: impl ToString, found: impl ToString) -> Error {
    Error::Checkpoint {
        path: path.to_path_buf(),
        what,
        expected: expected.to_string(),
        found: found.to_string(),
    }
}

/// Writes a checkpoint of `header` with `labels` `(len,)` and `rows` `(len, dim)` to `path`
/// atomically; returns the bytes written.
pub(super) fn save<L: CheckpointLabel>(
    op: &'static str,
    path: &Path,
    header: &Header,
    labels: &[L],
    rows: ArrayView2<'_, f32>,
) -> Result<u64> {
    write_atomic(op, path, |out| {
        let mut sum = Fnv::new();
        let mut put = |out: &mut Sealed<'_>, chunk: &[u8]| -> Result<()> {
            sum.update(chunk);
            out.put(chunk)
        };
        put(out, &header.encode::<L>())?;
        let block_rows = ROWS_PER_BLOCK.min(header.len.max(1));
        let mut block = Vec::with_capacity(block_rows * L::BYTES.max(4 * rows.ncols()));
        for chunk in labels.chunks(ROWS_PER_BLOCK) {
            block.clear();
            for &l in chunk {
                l.put(&mut block);
            }
            put(out, &block)?;
        }
        for chunk in rows.axis_chunks_iter(ndarray::Axis(0), ROWS_PER_BLOCK) {
            block.clear();
            for v in chunk.iter() {
                block.extend_from_slice(&v.to_le_bytes());
            }
            put(out, &block)?;
        }
        out.put(&sum.0.to_le_bytes())?;
        Ok(out.bytes())
    })
}

/// A checkpoint read back whole: its header, labels and rows.
pub(super) struct Loaded<L> {
    pub(super) header: Header,
    pub(super) labels: Vec<L>,
    pub(super) rows: Array2<f32>,
}

/// Reads the checkpoint at `path` for labels of type `L`: the header first (magic, version,
/// label type, consistency, the file's exact size), then the body against its checksum.
/// `expect` is the `(capacity, dim)` the caller needs.
pub(super) fn load<L: CheckpointLabel>(
    op: &'static str,
    path: &Path,
    expect: (usize, usize),
) -> Result<Loaded<L>> {
    let file = File::open(path).map_err(io(op, path))?;
    let size = file.metadata().map_err(io(op, path))?.len();
    let mut input = BufReader::with_capacity(1 << 20, file);
    let mut sum = Fnv::new();
    let mut raw = [0u8; HEADER as usize];
    if size < HEADER {
        return Err(bad(
            path,
            "size",
            format!("at least {HEADER} bytes (a bank checkpoint's header)"),
            format!("{size} bytes"),
        ));
    }
    input.read_exact(&mut raw).map_err(io(op, path))?;
    sum.update(&raw);
    let header = parse_header::<L>(path, &raw)?;
    if (header.capacity, header.dim) != expect {
        return Err(bad(
            path,
            "shape",
            format!(
                "capacity {} and dim {} (the bank's config)",
                expect.0, expect.1
            ),
            format!("capacity {} and dim {}", header.capacity, header.dim),
        ));
    }
    let announced = header
        .file_bytes(L::BYTES)
        .ok_or_else(|| bad(path, "size", "a size that fits 64 bits", "an overflow"))?;
    if size != announced {
        return Err(bad(
            path,
            "size",
            format!("{announced} bytes, as its header announces"),
            format!("{size} bytes (truncated or extended)"),
        ));
    }
    // The size matches the header, so what is allocated below is what the file holds.
    let mut read = |buf: &mut [u8]| -> Result<()> {
        input.read_exact(buf).map_err(io(op, path))?;
        sum.update(buf);
        Ok(())
    };
    let block_rows = ROWS_PER_BLOCK.min(header.len.max(1));
    let mut block = vec![0u8; block_rows * L::BYTES.max(4 * header.dim)];
    let mut labels = Vec::with_capacity(header.len);
    for start in (0..header.len).step_by(ROWS_PER_BLOCK) {
        let n = ROWS_PER_BLOCK.min(header.len - start);
        let buf = &mut block[..n * L::BYTES];
        read(buf)?;
        labels.extend(buf.chunks_exact(L::BYTES).map(L::take));
    }
    let mut rows = Array2::<f32>::zeros((header.len, header.dim));
    let width = header.dim;
    for start in (0..header.len).step_by(ROWS_PER_BLOCK) {
        let n = ROWS_PER_BLOCK.min(header.len - start);
        let buf = &mut block[..n * width * 4];
        read(buf)?;
        for (i, row) in buf.chunks_exact(width * 4).enumerate() {
            for (o, v) in rows.row_mut(start + i).iter_mut().zip(row.chunks_exact(4)) {
                *o = f32::from_le_bytes([v[0], v[1], v[2], v[3]]);
            }
        }
    }
    let expected = sum.0;
    let mut stored = [0u8; TRAILER as usize];
    input.read_exact(&mut stored).map_err(io(op, path))?;
    let stored = u64::from_le_bytes(stored);
    if stored != expected {
        return Err(bad(
            path,
            "checksum",
            format!("{expected:#018x}, computed from its contents"),
            format!("{stored:#018x} (the file is damaged)"),
        ));
    }
    Ok(Loaded {
        header,
        labels,
        rows,
    })
}

/// Checks and decodes the fixed header.
fn parse_header<L: CheckpointLabel>(path: &Path, raw: &[u8; HEADER as usize]) -> Result<Header> {
    if raw[..8] != MAGIC {
        return Err(bad(
            path,
            "magic",
            "WMLBANK (a wgpu-metric-learning bank checkpoint)",
            String::from_utf8_lossy(&raw[..8]).escape_debug(),
        ));
    }
    let u32_at = |at: usize| u32::from_le_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]]);
    let u64_at = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&raw[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let version = u32_at(8);
    if version != VERSION {
        return Err(bad(path, "version", VERSION, version));
    }
    if raw[12..16] != label_tag::<L>() {
        let found = String::from_utf8_lossy(&raw[12..16]);
        return Err(bad(
            path,
            "label type",
            L::NAME,
            found.trim_end_matches('\0').escape_debug(),
        ));
    }
    let as_usize = |what: &'static str, v: u64| {
        usize::try_from(v).map_err(|_| bad(path, what, "a value that fits this machine", v))
    };
    let header = Header {
        capacity: as_usize("capacity", u64_at(16))?,
        dim: as_usize("dim", u64_at(24))?,
        len: as_usize("len", u64_at(32))?,
        head: as_usize("head", u64_at(40))?,
        filled: match raw[48] {
            0 => false,
            1 => true,
            other => return Err(bad(path, "filled", "0 or 1", other)),
        },
    };
    if raw[49..56].iter().any(|&b| b != 0) {
        return Err(bad(
            path,
            "padding",
            "zero bytes",
            format!("{:?}", &raw[49..56]),
        ));
    }
    // A ring that was never filled holds slots 0 .. head; a filled one, every slot.
    if header.capacity == 0 || header.dim == 0 {
        return Err(bad(
            path,
            "shape",
            "a capacity and dim of at least 1",
            format!("capacity {} and dim {}", header.capacity, header.dim),
        ));
    }
    let consistent = header.head < header.capacity
        && if header.filled {
            header.len == header.capacity
        } else {
            header.len == header.head
        };
    if !consistent {
        return Err(bad(
            path,
            "ring",
            "head < capacity, and len = capacity when filled, len = head otherwise",
            format!(
                "capacity {}, len {}, head {}, filled {}",
                header.capacity, header.len, header.head, header.filled
            ),
        ));
    }
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::files::temporary_prefix;
    use std::path::PathBuf;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("wml-ckpt-unit-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        dir.join(name)
    }

    #[test]
    fn the_header_round_trips_and_is_fixed_size() {
        let h = Header {
            capacity: 5,
            dim: 3,
            len: 5,
            head: 2,
            filled: true,
        };
        let raw = h.encode::<i64>();
        assert_eq!(raw.len() as u64, HEADER);
        let fixed: [u8; HEADER as usize] = raw.try_into().expect("fixed size");
        let back = parse_header::<i64>(Path::new("x"), &fixed);
        assert_eq!(back.ok(), Some(h));
    }

    #[test]
    fn a_failed_save_leaves_nothing_behind() {
        // A directory where the file should go: the rename fails after the write.
        let path = scratch("is-a-directory");
        std::fs::create_dir_all(&path).expect("dir");
        let h = Header {
            capacity: 2,
            dim: 1,
            len: 1,
            head: 1,
            filled: false,
        };
        let rows = Array2::<f32>::zeros((1, 1));
        let saved = save("t", &path, &h, &[3u8], rows.view());
        assert!(matches!(saved, Err(Error::Io { .. })), "{saved:?}");
        let prefix = temporary_prefix(&path);
        let dir = path.parent().expect("a directory");
        let left = std::fs::read_dir(dir)
            .expect("dir")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .count();
        assert_eq!(left, 0);
    }
}
