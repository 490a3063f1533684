//! Files written whole or not at all (a temporary file beside the target, fsync, rename,
//! fsync of the directory), and the checksum the checkpoints carry.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// FNV-1a, 64 bits: enough to tell a damaged file from a whole one (not an authenticator).
#[derive(Clone, Copy)]
pub(crate) struct Fnv(pub(crate) u64);

impl Fnv {
    pub(crate) fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    pub(crate) fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.word(u32::from(b));
        }
    }

    /// One step of FNV-1a over a whole 32-bit word (a checksum of in-memory values, four
    /// times fewer steps than their bytes; not the files' byte-wise sum).
    pub(crate) fn word(&mut self, w: u32) {
        self.0 ^= u64::from(w);
        self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
    }
}

/// The error for a failed file operation.
pub(crate) fn io<'p>(
    op: &'static str,
    path: &'p Path,
) -> impl FnOnce(std::io::Error) -> Error + 'p {
    move |source| Error::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// The prefix of the temporary files saves to `path` write before renaming them over it:
/// beside it, since a rename within one directory is atomic.
pub(crate) fn temporary_prefix(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!(".{name}.wml-partial-")
}

/// A temporary file of its own for one save (process id and a per-process counter), so that
/// two saves to one path never write into one file; a save killed half-way leaves it behind.
pub(crate) fn temporary_path(path: &Path) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let prefix = temporary_prefix(path);
    path.with_file_name(format!("{prefix}{}-{n}", std::process::id()))
}

/// Makes the rename durable: the directory entry is flushed too (POSIX; elsewhere the rename
/// itself is what the platform offers).
pub(crate) fn sync_directory(op: &'static str, path: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io(op, dir))?;
    }
    #[cfg(not(unix))]
    let _ = (op, path);
    Ok(())
}

/// The file a [`write_atomic`] writes: bytes go in through [`Sealed::put`], which counts them.
pub(crate) struct Sealed<'p> {
    op: &'static str,
    path: &'p Path,
    out: BufWriter<File>,
    bytes: u64,
}

impl Sealed<'_> {
    /// Appends `chunk`.
    pub(crate) fn put(&mut self, chunk: &[u8]) -> Result<()> {
        self.bytes += chunk.len() as u64;
        self.out.write_all(chunk).map_err(io(self.op, self.path))
    }

    /// Bytes written so far.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// Writes `path` whole or not at all: `write` fills a new temporary file beside it, which is
/// flushed to disk and renamed over `path` (the directory flushed too). On any error nothing
/// half-written stays behind under either name, and a file already at `path` is kept.
pub(crate) fn write_atomic<T>(
    op: &'static str,
    path: &Path,
    write: impl FnOnce(&mut Sealed<'_>) -> Result<T>,
) -> Result<T> {
    let tmp = temporary_path(path);
    let done = (|| {
        // A new file, never one already there (nor what a link there points to).
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(io(op, &tmp))?;
        let mut sealed = Sealed {
            op,
            path: &tmp,
            out: BufWriter::with_capacity(1 << 20, file),
            bytes: 0,
        };
        let value = write(&mut sealed)?;
        let file = sealed
            .out
            .into_inner()
            .map_err(|e| io(op, &tmp)(e.into_error()))?;
        file.sync_all().map_err(io(op, &tmp))?;
        std::fs::rename(&tmp, path).map_err(io(op, path))?;
        sync_directory(op, path)?;
        Ok(value)
    })();
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}
