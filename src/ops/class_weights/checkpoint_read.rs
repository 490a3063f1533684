//! Reading class-weight checkpoints (the format is in the module docs of `checkpoint`): the
//! manifest, any range of classes from the shards that hold it, and the whole weights
//! streamed into one `.npy`.

use std::fs::File;
use std::io::{BufReader, Read};
use std::ops::Range;
use std::path::Path;

use ndarray::Array2;

use super::checkpoint::{bad, read_manifest, Header, ShardRecord, HEADER, MANIFEST};
use super::optimizer::{OptimizerState, WeightOptimizer};
use crate::context::Context;
use crate::data::files::{io, write_atomic, Fnv, Sealed};
use crate::error::{Error, Result};
use crate::ops::loss::ClassifierKind;
use crate::runtime::memory::HostReservation;

/// Class weights loaded by [`load_weights`], with their optimizer and its state.
#[derive(Debug)]
#[non_exhaustive]
pub struct LoadedWeights {
    /// The classes asked for, in PML's layout.
    pub weights: Array2<f32>,
    /// Classes over the whole checkpoint.
    pub classes: usize,
    /// The optimizer saved with them.
    pub optimizer: WeightOptimizer,
    /// Its state for these classes (its buffers cut as the weights are).
    pub state: OptimizerState,
}

/// The classes of the checkpoint in `dir`, from its manifest.
///
/// # Errors
/// As [`load_weights`] reading the manifest.
pub(crate) fn checkpoint_classes(op: &'static str, dir: &Path) -> Result<usize> {
    read_manifest(op, dir).map(|(classes, _)| classes)
}

/// The number of classes of the class-weight checkpoint in `dir`, from its manifest alone
/// (no shard is read): what a process needs to pick its range for [`load_weights`].
///
/// # Errors
/// [`Error::Io`]; [`Error::Checkpoint`] for a damaged manifest.
///
/// # Example
/// See [`save_weights_shard`](crate::save_weights_shard): there,
/// `weights_checkpoint_classes(&dir)? == 3`.
pub fn weights_checkpoint_classes(dir: &Path) -> Result<usize> {
    checkpoint_classes("weights_checkpoint_classes", dir)
}

/// Loads classes `range` of the checkpoint in `dir` (saved for `kind`), with the optimizer
/// and its state cut to them: from whichever shards hold them, so a checkpoint saved by N
/// processes loads on any number. Each shard read is checked whole (its size, header and
/// checksum, against the manifest) before anything is returned. Cost: one pass over the shards
/// that overlap `range`; memory: the weights and buffers returned (the buffers counted in
/// `ctx` while the state lives) and a row of a shard.
///
/// # Errors
/// [`Error::Io`]; [`Error::Checkpoint`] for a manifest or shard that is damaged, truncated,
/// of another layout than `kind`'s, or disagrees with the others; [`Error::InvalidParameter`]
/// for a range past the checkpoint's classes; [`Error::BudgetExceeded`].
///
/// # Example
/// See [`save_weights_shard`](crate::save_weights_shard).
pub fn load_weights(
    ctx: &Context,
    dir: &Path,
    kind: &ClassifierKind,
    range: Range<usize>,
) -> Result<LoadedWeights> {
    const OP: &str = "load_weights";
    let (classes, shards) = read_manifest(OP, dir)?;
    if range.start > range.end || range.end > classes {
        return Err(Error::InvalidParameter {
            op: OP,
            what: "range",
            value: format!("{range:?}"),
            rule: "must lie within the checkpoint's classes",
        });
    }
    let on_columns = !kind.classes_on_rows();
    let centres = kind.centres_per_class().max(1);
    let mut found: Option<Header> = None;
    let mut arrays: Vec<Array2<f32>> = Vec::new();
    // The shards overlapping `range`; an empty range still reads the first shard, for the
    // optimizer and the dimension.
    let overlapping: Vec<&ShardRecord> = shards
        .iter()
        .filter(|s| {
            let end = s.first_class + s.classes;
            (s.first_class < range.end && range.start < end)
                || (range.is_empty() && s.first_class == 0)
        })
        .collect();
    let mut values = Vec::new();
    for record in overlapping {
        let path = dir.join(&record.file);
        let (mut shard, header) = ShardReader::open(
            OP,
            &path,
            record,
            (classes, on_columns, centres),
            READ_BUFFER,
        )?;
        // The first shard sets what every other must agree with, and sizes the output.
        match found {
            Some(seen) => {
                let agree = (seen.d, seen.steps, seen.optimizer, seen.buffers)
                    == (header.d, header.steps, header.optimizer, header.buffers);
                if !agree {
                    let expected = "those of the checkpoint's other shards";
                    return Err(bad(&path, "settings", expected, format!("{header:?}")));
                }
            }
            None => {
                let along = (range.end - range.start).saturating_mul(centres);
                let shape = if on_columns {
                    (header.d, along)
                } else {
                    (along, header.d)
                };
                let bytes = (shape.0 as u64)
                    .checked_mul(shape.1 as u64)
                    .and_then(|v| v.checked_mul(4 * (1 + header.buffers as u64)))
                    .unwrap_or(u64::MAX);
                // Checked before allocating (the weights are the caller's once returned; the
                // buffers are counted again by the state that keeps them).
                drop(HostReservation::new("class weights", bytes, ctx.tracker())?);
                arrays = (0..=header.buffers).map(|_| Array2::zeros(shape)).collect();
                found = Some(header);
            }
        }
        // This shard's part of `range`, in centres, and where it lands.
        // (Nothing for an empty range, whose one shard is read for its settings alone.)
        let lo = range.start.max(record.first_class);
        let hi = range.end.min(record.first_class + record.classes);
        let from = match lo < hi {
            true => (lo - record.first_class) * centres..(hi - record.first_class) * centres,
            false => 0..0,
        };
        let to = lo.saturating_sub(range.start) * centres;
        let rows = header.shape().0;
        for out in arrays.iter_mut() {
            for row in 0..rows {
                shard.row(&mut values)?;
                if on_columns {
                    let dst = out.row_mut(row).into_iter().skip(to);
                    dst.zip(&values[from.clone()]).for_each(|(o, v)| *o = *v);
                } else if from.contains(&row) {
                    let dst = out.row_mut(to + row - from.start).into_iter();
                    dst.zip(&values).for_each(|(o, v)| *o = *v);
                }
            }
        }
        shard.finish()?;
    }
    let header = found.ok_or_else(|| bad(&dir.join(MANIFEST), "shards", "at least one", 0))?;
    let weights = arrays.remove(0);
    let state = match header.steps {
        0 => OptimizerState::new(),
        steps => OptimizerState::restored(ctx, steps, arrays)?,
    };
    Ok(LoadedWeights {
        weights,
        classes,
        optimizer: header.optimizer,
        state,
    })
}

/// The read buffer of a shard read alone.
const READ_BUFFER: usize = 1 << 20;
/// The read buffer of each shard of an export of classes on columns, which reads them all at
/// once.
const COLUMN_BUFFER: usize = 64 << 10;

/// A shard file read row by row, its checksum taken as it goes: opened only when its size,
/// header and layout agree with the manifest's record and the loss's layout.
struct ShardReader<'p> {
    op: &'static str,
    path: &'p Path,
    input: BufReader<File>,
    sum: Fnv,
    cols: usize,
    raw: Vec<u8>,
    expect: u64,
}

impl<'p> ShardReader<'p> {
    fn open(
        op: &'static str,
        path: &'p Path,
        record: &ShardRecord,
        (classes, on_columns, centres): (usize, bool, usize),
        buffer: usize,
    ) -> Result<(Self, Header)> {
        let file = File::open(path).map_err(io(op, path))?;
        let size = file.metadata().map_err(io(op, path))?.len();
        if size != record.bytes || size < HEADER as u64 + 8 {
            let expected = format!("{} bytes, as the manifest records", record.bytes);
            return Err(bad(path, "size", expected, format!("{size} bytes")));
        }
        let mut input = BufReader::with_capacity(buffer, file);
        let mut raw = [0u8; HEADER];
        input.read_exact(&mut raw).map_err(io(op, path))?;
        let header = Header::decode(path, &raw)?;
        let ours = (header.classes, header.first, header.n);
        if ours != (classes, record.first_class, record.classes) {
            let expected = format!(
                "classes {}.. of {classes} (the manifest)",
                record.first_class
            );
            let found = format!(
                "{} classes from {} of {}",
                header.n, header.first, header.classes
            );
            return Err(bad(path, "classes", expected, found));
        }
        if (header.on_columns, header.centres) != (on_columns, centres) {
            let expected = format!(
                "the loss's: {centres} centres per class on {}",
                if on_columns { "columns" } else { "rows" }
            );
            let found = format!(
                "{} centres per class on {}",
                header.centres,
                if header.on_columns { "columns" } else { "rows" }
            );
            return Err(bad(path, "layout", expected, found));
        }
        if header.file_bytes() != Some(size) {
            return Err(bad(
                path,
                "size",
                format!("{:?} bytes, as its header announces", header.file_bytes()),
                size,
            ));
        }
        let mut sum = Fnv::new();
        sum.update(&raw);
        let cols = header.shape().1;
        let reader = Self {
            op,
            path,
            input,
            sum,
            cols,
            raw: vec![0; 4 * cols],
            expect: record.checksum,
        };
        Ok((reader, header))
    }

    /// The next row of the file's arrays into `values`.
    fn row(&mut self, values: &mut Vec<f32>) -> Result<()> {
        self.input
            .read_exact(&mut self.raw)
            .map_err(io(self.op, self.path))?;
        self.sum.update(&self.raw);
        values.clear();
        values.extend(
            self.raw
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
        debug_assert_eq!(values.len(), self.cols);
        Ok(())
    }

    /// Reads through the optimizer's buffers after the weights (for the checksum), then
    /// [`ShardReader::finish`].
    fn skip_buffers(mut self, header: &Header) -> Result<()> {
        let mut values = Vec::new();
        for _ in 0..header.shape().0 * header.buffers {
            self.row(&mut values)?;
        }
        self.finish()
    }

    /// Every row read: the trailer must hold the checksum, as the manifest does.
    fn finish(mut self) -> Result<()> {
        let mut stored = [0u8; 8];
        self.input
            .read_exact(&mut stored)
            .map_err(io(self.op, self.path))?;
        let (stored, computed) = (u64::from_le_bytes(stored), self.sum.0);
        if stored != computed || computed != self.expect {
            let expected = format!(
                "{computed:#018x} (computed) = {:#018x} (the manifest)",
                self.expect
            );
            return Err(bad(
                self.path,
                "checksum",
                expected,
                format!("{stored:#018x} (the file is damaged)"),
            ));
        }
        Ok(())
    }
}

/// Streams the whole weights of the checkpoint in `dir` (saved for `kind`) into one `.npy` at
/// `out`, in PML's layout (`(d, classes·K)` or `(classes·K, d)`, `<f4`), atomically, for
/// inference; returns the bytes written. Every shard is checked whole as it is read; a
/// damaged one leaves nothing at `out`. Cost: one pass over the weights; memory: a row and a
/// read buffer (64 KiB each when classes are on columns, since every shard is then open at
/// once: one file descriptor per shard).
///
/// # Errors
/// As [`load_weights`]; [`Error::Io`] writing `out`.
///
/// # Example
/// ```no_run
/// use wgpu_metric_learning::{export_weights_npy, ClassifierKind};
/// let bytes = export_weights_npy("ckpt".as_ref(), &ClassifierKind::arc_face(), "W.npy".as_ref())?;
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn export_weights_npy(dir: &Path, kind: &ClassifierKind, out: &Path) -> Result<u64> {
    const OP: &str = "export_weights_npy";
    let (classes, shards) = read_manifest(OP, dir)?;
    let on_columns = !kind.classes_on_rows();
    let centres = kind.centres_per_class().max(1);
    let layout = (classes, on_columns, centres);
    let paths: Vec<_> = shards.iter().map(|s| dir.join(&s.file)).collect();
    let open =
        |i: usize, buffer: usize| ShardReader::open(OP, &paths[i], &shards[i], layout, buffer);
    // Every shard's `d` must be the first's (checked as each is opened).
    let same_d = |d: usize, i: usize, header: &Header| match header.d == d {
        true => Ok(()),
        false => Err(bad(
            &paths[i],
            "d",
            format!("{d}, as the first shard"),
            header.d,
        )),
    };
    let first = open(0, READ_BUFFER)?;
    let d = first.1.d;
    let along = classes.checked_mul(centres).ok_or_else(|| {
        bad(
            &dir.join(MANIFEST),
            "classes",
            "a count within 64 bits",
            classes,
        )
    })?;
    let shape = if on_columns { (d, along) } else { (along, d) };
    write_atomic(OP, out, |file| {
        file.put(&npy_header(shape))?;
        let mut values = Vec::new();
        let mut put = |file: &mut Sealed<'_>, reader: &mut ShardReader<'_>| {
            reader.row(&mut values)?;
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            file.put(&bytes)
        };
        if on_columns {
            // Row r of the whole is row r of every shard, in class order: every shard open at
            // once, each with a small buffer.
            let mut readers = vec![first];
            for i in 1..shards.len() {
                let (reader, header) = open(i, COLUMN_BUFFER)?;
                same_d(d, i, &header)?;
                readers.push((reader, header));
            }
            for _ in 0..d {
                for (reader, _) in readers.iter_mut() {
                    put(file, reader)?;
                }
            }
            readers
                .into_iter()
                .try_for_each(|(r, h)| r.skip_buffers(&h))
        } else {
            // The whole is every shard's rows in class order: one shard open at a time.
            let mut next = Some(first);
            for i in 0..shards.len() {
                let (mut reader, header) = match next.take() {
                    Some(opened) => opened,
                    None => open(i, READ_BUFFER)?,
                };
                same_d(d, i, &header)?;
                for _ in 0..header.shape().0 {
                    put(file, &mut reader)?;
                }
                reader.skip_buffers(&header)?;
            }
            Ok(())
        }?;
        Ok(file.bytes())
    })
}

/// A `.npy` version 1.0 header for a C-order `<f4` array of `shape`, padded to 64 bytes.
fn npy_header((rows, cols): (usize, usize)) -> Vec<u8> {
    let dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
    // Magic (6) + version (2) + length (2) + dict + padding + newline, a multiple of 64.
    let unpadded = 10 + dict.len() + 1;
    let len = dict.len() + 1 + (64 - unpadded % 64) % 64;
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(len as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.resize(10 + len - 1, b' ');
    out.push(b'\n');
    out
}
