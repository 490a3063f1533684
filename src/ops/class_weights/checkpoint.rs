//! Checkpoints of class weights and their optimizer's state: one file per shard (any
//! contiguous range of classes, as each process of a class-sharded loss holds) and a manifest
//! that names them, each written atomically (`data::files`), the manifest last. Loading takes
//! any range of classes from whatever shards cover it, so a checkpoint saved by N processes
//! loads on M; the full weights can be streamed into one `.npy` for inference.
//!
//! A shard file is little-endian and self-checking:
//!
//! | bytes | field |
//! | --- | --- |
//! | 8 | magic `WMLCLSW\0` |
//! | 4 | format version (1) |
//! | 4 | the class axis: 0 for classes on rows `(n·K, d)`, 1 on columns `(d, n·K)` |
//! | 8 × 6 | classes over every shard, first class, classes `n` here, centres per class `K`, `d`, steps |
//! | 4 × 2 | optimizer (1 SGD, 2 AdamW), buffers |
//! | 4 × 5 | the optimizer's settings as f32 (SGD: lr, momentum, dampening, weight decay, Nesterov as 0 or 1; AdamW: lr, beta1, beta2, eps, weight decay) |
//! | 4 | zero |
//! | (1 + buffers) × n·K·d × 4 | the weights, then each buffer, row-major in the layout above |
//! | 8 | FNV-1a 64 of every byte before it |
//!
//! The manifest (`manifest.txt`) is text: a line `wgpu-metric-learning class weights 1`, a line
//! `classes C`, then one line per shard in class order, `shard first n file bytes checksum`
//! (the checksum in hex). Shard files carry their steps and a save id of their own in their
//! names, so saving again into the same directory (at the same step too) writes new files and
//! the manifest moves to them at once; then the shard files the previous manifest named, and
//! the new one does not, are removed (files of a save that never got its manifest stay). Every
//! shard holds at least one class.

use std::path::Path;

use ndarray::ArrayView2;

use super::optimizer::{OptimizerState, WeightOptimizer};
use crate::data::files::{io, write_atomic, Fnv, Sealed};
use crate::error::{Error, Result};
use crate::ops::loss::ClassifierKind;

pub(super) const MAGIC: [u8; 8] = *b"WMLCLSW\0";
const VERSION: u32 = 1;
pub(super) const HEADER: usize = 8 + 4 + 4 + 8 * 6 + 4 * 2 + 4 * 5 + 4;
pub(super) const MANIFEST: &str = "manifest.txt";
pub(super) const MANIFEST_TITLE: &str = "wgpu-metric-learning class weights 1";

/// One process's shard of class weights to save with [`save_weights_shard`]: `weights` in
/// PML's layout for `kind` ([`ClassifierKind::weight_shape`]) holding classes
/// `first_class ..` of `classes`, and the optimizer with its state.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{ClassifierKind, OptimizerState, WeightOptimizer, WeightsShard};
/// let (kind, w) = (ClassifierKind::arc_face(), ndarray::Array2::<f32>::zeros((4, 10)));
/// let (optimizer, state) = (WeightOptimizer::sgd(0.1, 0.9), OptimizerState::new());
/// let shard = WeightsShard { kind: &kind, classes: 30, first_class: 10, weights: w.view(), optimizer: &optimizer, state: &state };
/// # let _ = shard;
/// ```
#[derive(Debug, Clone, Copy)]
pub struct WeightsShard<'a> {
    /// The loss the weights belong to: their layout and centres per class.
    pub kind: &'a ClassifierKind,
    /// Classes over every shard.
    pub classes: usize,
    /// The shard's first class.
    pub first_class: usize,
    /// The shard's weights.
    pub weights: ArrayView2<'a, f32>,
    /// The optimizer that keeps `state`.
    pub optimizer: &'a WeightOptimizer,
    /// Its state for these weights (no step yet: no buffers).
    pub state: &'a OptimizerState,
}

/// A saved shard, as the manifest names it ([`save_weights_manifest`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardRecord {
    /// The file's name in the checkpoint's directory.
    pub file: String,
    /// Its first class.
    pub first_class: usize,
    /// Its classes.
    pub classes: usize,
    /// Its size.
    pub bytes: u64,
    /// Its checksum (FNV-1a 64 of its bytes before the trailer).
    pub checksum: u64,
}

/// A shard's fixed header.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Header {
    pub(super) on_columns: bool,
    pub(super) classes: usize,
    pub(super) first: usize,
    pub(super) n: usize,
    pub(super) centres: usize,
    pub(super) d: usize,
    pub(super) steps: u64,
    pub(super) optimizer: WeightOptimizer,
    pub(super) buffers: usize,
}

impl Header {
    /// The shard's array shape `(rows, cols)`.
    pub(super) fn shape(&self) -> (usize, usize) {
        let centres = self.n * self.centres;
        match self.on_columns {
            true => (self.d, centres),
            false => (centres, self.d),
        }
    }

    pub(super) fn file_bytes(&self) -> Option<u64> {
        let (r, c) = self.shape();
        let floats = (r as u64)
            .checked_mul(c as u64)?
            .checked_mul(1 + self.buffers as u64)?;
        (HEADER as u64)
            .checked_add(floats.checked_mul(4)?)?
            .checked_add(8)
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&u32::from(self.on_columns).to_le_bytes());
        for v in [self.classes, self.first, self.n, self.centres, self.d] {
            out.extend_from_slice(&(v as u64).to_le_bytes());
        }
        out.extend_from_slice(&self.steps.to_le_bytes());
        let (code, params) = self.optimizer.stored();
        out.extend_from_slice(&code.to_le_bytes());
        out.extend_from_slice(&(self.buffers as u32).to_le_bytes());
        for p in params {
            out.extend_from_slice(&p.to_le_bytes());
        }
        out.extend_from_slice(&[0; 4]);
        out
    }

    pub(super) fn decode(path: &Path, raw: &[u8; HEADER]) -> Result<Self> {
        if raw[..8] != MAGIC {
            let found = String::from_utf8_lossy(&raw[..8])
                .escape_debug()
                .to_string();
            return Err(bad(
                path,
                "magic",
                "WMLCLSW (a class weights checkpoint)",
                found,
            ));
        }
        let u32_at =
            |at: usize| u32::from_le_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]]);
        let f32_at = |at: usize| f32::from_bits(u32_at(at));
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&raw[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let size = |what: &'static str, at: usize| {
            let v = u64_at(at);
            usize::try_from(v).map_err(|_| bad(path, what, "a size that fits this machine", v))
        };
        if u32_at(8) != VERSION {
            return Err(bad(path, "version", VERSION, u32_at(8)));
        }
        let on_columns = match u32_at(12) {
            0 => false,
            1 => true,
            other => return Err(bad(path, "class axis", "0 or 1", other)),
        };
        let p = [f32_at(72), f32_at(76), f32_at(80), f32_at(84), f32_at(88)];
        let optimizer = WeightOptimizer::from_stored(u32_at(64), p)
            .ok_or_else(|| bad(path, "optimizer", "1 (SGD) or 2 (AdamW)", u32_at(64)))?;
        let header = Self {
            on_columns,
            classes: size("classes", 16)?,
            first: size("first class", 24)?,
            n: size("shard classes", 32)?,
            centres: size("centres per class", 40)?,
            d: size("d", 48)?,
            steps: u64_at(56),
            optimizer,
            buffers: u32_at(68) as usize,
        };
        let announced = (header.n.checked_mul(header.centres)).and_then(|_| header.file_bytes());
        if header.n == 0 || header.centres == 0 || header.d == 0 || announced.is_none() {
            let found = format!(
                "{} classes of {} centres, d = {}",
                header.n, header.centres, header.d
            );
            return Err(bad(
                path,
                "shape",
                "at least one class and d ≥ 1, within 64 bits",
                found,
            ));
        }
        let kept = if header.steps == 0 {
            [0, optimizer.buffers()]
        } else {
            [optimizer.buffers(); 2]
        };
        if !kept.contains(&header.buffers) {
            let expected = format!("{} for its optimizer", optimizer.buffers());
            return Err(bad(path, "buffers", expected, header.buffers));
        }
        if raw[92..96] != [0; 4] {
            return Err(bad(
                path,
                "padding",
                "zero bytes",
                format!("{:?}", &raw[92..96]),
            ));
        }
        Ok(header)
    }
}

/// The error for a file that is not a usable checkpoint.
pub(super) fn bad(
    path: &Path,
    what: &'static str,
    expected: impl ToString,
    found: impl ToString,
) -> Error {
    Error::Checkpoint {
        path: path.to_path_buf(),
        what,
        expected: expected.to_string(),
        found: found.to_string(),
    }
}

/// Saves one shard of class weights with its optimizer state into `dir` (which must exist),
/// atomically, as `classes-<first>-<end>-step-<steps>-<save id>.wmlc`; returns the record the manifest
/// needs. Every process of a class-sharded loss saves its own; then one writes the manifest
/// from all the records ([`save_weights_manifest`]). Cost: one pass over the shard and its
/// buffers; no memory beyond a write buffer.
///
/// # Errors
/// [`Error::Shape`] for weights that are not `kind`'s layout of whole classes, a range past
/// `classes`, or buffers of another shape; [`Error::Io`] (nothing is left half-written).
///
/// # Example
/// ```
/// use wgpu_metric_learning::*;
/// let dir = std::env::temp_dir().join(format!("wml-doc-shard-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let (kind, w, opt, state) = (ClassifierKind::arc_face(), ndarray::Array2::<f32>::ones((4, 3)), WeightOptimizer::default(), OptimizerState::new());
/// let shard = WeightsShard { kind: &kind, classes: 3, first_class: 0, weights: w.view(), optimizer: &opt, state: &state };
/// let record = save_weights_shard(&dir, &shard)?;
/// save_weights_manifest(&dir, 3, &[record])?;
/// let back = load_weights(&Context::native_cpu(None), &dir, &kind, 0..3)?;
/// assert_eq!(back.weights, w);
/// # std::fs::remove_dir_all(&dir).ok(); Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn save_weights_shard(dir: &Path, shard: &WeightsShard<'_>) -> Result<ShardRecord> {
    save_shard(dir, shard, save_id())
}

/// [`save_weights_shard`] with the save's id (`save_id`) given.
pub(crate) fn save_shard(dir: &Path, shard: &WeightsShard<'_>, id: u64) -> Result<ShardRecord> {
    const OP: &str = "save_weights_shard";
    let header = shard_header(OP, shard)?;
    let file = shard_file(header.first, header.n, header.steps, id);
    let path = dir.join(&file);
    let (bytes, checksum) = write_atomic(OP, &path, |out| {
        let mut sum = Fnv::new();
        let mut put = |out: &mut Sealed<'_>, chunk: &[u8]| -> Result<()> {
            sum.update(chunk);
            out.put(chunk)
        };
        put(out, &header.encode())?;
        let arrays =
            std::iter::once(shard.weights).chain(shard.state.buffers().iter().map(|b| b.view()));
        let mut block = Vec::new();
        for array in arrays {
            for row in array.rows() {
                block.clear();
                for v in row {
                    block.extend_from_slice(&v.to_le_bytes());
                }
                put(out, &block)?;
            }
        }
        let checksum = sum.0;
        out.put(&checksum.to_le_bytes())?;
        Ok((out.bytes(), checksum))
    })?;
    Ok(ShardRecord {
        file,
        first_class: header.first,
        classes: header.n,
        bytes,
        checksum,
    })
}

/// The name of the shard file of classes `first .. first + n` after `steps`, saved by save
/// `id`: a new name for every save, so that a save never writes over a file the current
/// manifest names (saving twice at one step included).
pub(crate) fn shard_file(first: usize, n: usize, steps: u64, id: u64) -> String {
    format!("classes-{first}-{}-step-{steps}-{id:016x}.wmlc", first + n)
}

/// Whether `file` is a plain name (a manifest cannot point outside its directory) of a shard
/// ([`shard_file`]'s form): what a manifest may name, and so all that a save ever removes.
fn is_shard_name(file: &str) -> bool {
    let plain = Path::new(file).file_name().is_some_and(|f| *f == *file);
    plain && file.starts_with("classes-") && file.ends_with(".wmlc") && file != MANIFEST
}

/// A number of this save's own: the clock's nanoseconds, the process and a per-process count.
pub(crate) fn save_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let count = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |t| t.as_nanos() as u64);
    let mut id = Fnv::new();
    for part in [nanos, u64::from(std::process::id()), count] {
        id.update(&part.to_le_bytes());
    }
    id.0
}

/// The header of `shard`, checked.
fn shard_header(op: &'static str, shard: &WeightsShard<'_>) -> Result<Header> {
    let kind = shard.kind;
    let on_columns = !kind.classes_on_rows();
    let centres = kind.centres_per_class().max(1);
    let (rows, cols) = shard.weights.dim();
    let (along, d) = if on_columns {
        (cols, rows)
    } else {
        (rows, cols)
    };
    let n = along / centres;
    let fits = shard
        .first_class
        .checked_add(n)
        .is_some_and(|end| end <= shard.classes);
    if along % centres != 0 || !fits || n == 0 || d == 0 {
        return Err(Error::Shape {
            op,
            what: "weights",
            expected: format!(
                "d ≥ 1 and at least one whole class of {centres} centres from class {} within {} classes, in {}",
                shard.first_class,
                shard.classes,
                if on_columns { "columns" } else { "rows" }
            ),
            got: vec![rows, cols],
        });
    }
    if let Some(b) = shard
        .state
        .buffers()
        .iter()
        .find(|b| b.dim() != (rows, cols))
    {
        return Err(Error::Shape {
            op,
            what: "optimizer state",
            expected: format!("the weights' shape ({rows}, {cols})"),
            got: b.shape().to_vec(),
        });
    }
    let (kept, steps) = (shard.state.buffers().len(), shard.state.steps());
    let wanted = if steps == 0 {
        0
    } else {
        shard.optimizer.buffers()
    };
    if kept != wanted {
        return Err(Error::InvalidParameter {
            op,
            what: "optimizer state",
            value: format!("{kept} buffers after {steps} steps"),
            rule: "must be kept by the optimizer saved with it",
        });
    }
    Ok(Header {
        on_columns,
        classes: shard.classes,
        first: shard.first_class,
        n,
        centres,
        d,
        steps: shard.state.steps(),
        optimizer: *shard.optimizer,
        buffers: shard.state.buffers().len(),
    })
}

/// Reads the manifest of the checkpoint in `dir`: its classes and shards in class order.
pub(super) fn read_manifest(op: &'static str, dir: &Path) -> Result<(usize, Vec<ShardRecord>)> {
    let path = dir.join(MANIFEST);
    let text = std::fs::read_to_string(&path).map_err(io(op, &path))?;
    let broken = |line: &str| {
        bad(
            &path,
            "manifest",
            "the lines save_weights_manifest writes",
            line.escape_debug(),
        )
    };
    let mut lines = text.lines();
    if lines.next() != Some(MANIFEST_TITLE) {
        return Err(bad(
            &path,
            "title",
            MANIFEST_TITLE,
            text.lines().next().unwrap_or("").escape_debug(),
        ));
    }
    let classes_line = lines.next().unwrap_or("");
    let classes = classes_line
        .strip_prefix("classes ")
        .and_then(|c| c.parse::<usize>().ok())
        .ok_or_else(|| broken(classes_line))?;
    let mut shards = Vec::new();
    let mut next = 0usize;
    for line in lines {
        let f: Vec<&str> = line.split(' ').collect();
        let record = match f.as_slice() {
            ["shard", first, n, file, bytes, sum] => (|| {
                Some(ShardRecord {
                    first_class: first.parse().ok()?,
                    classes: n.parse().ok()?,
                    file: (*file).to_string(),
                    bytes: bytes.parse().ok()?,
                    checksum: u64::from_str_radix(sum, 16).ok()?,
                })
            })(),
            _ => None,
        };
        let record = record.ok_or_else(|| broken(line))?;
        // Names only: a manifest cannot point outside its directory.
        if record.first_class != next || record.classes == 0 || !is_shard_name(&record.file) {
            return Err(broken(line));
        }
        next = next
            .checked_add(record.classes)
            .ok_or_else(|| broken(line))?;
        shards.push(record);
    }
    if next != classes {
        return Err(bad(
            &path,
            "shards",
            format!("{classes} classes covered"),
            format!("{next}"),
        ));
    }
    Ok((classes, shards))
}

/// Writes the manifest of a checkpoint of `classes` classes into `dir`, atomically, naming
/// the shards of `records` (any order; they must cover `0 .. classes` once each). Written
/// last, after every shard: until it is, a load finds the previous checkpoint or none. Then
/// the shard files the previous manifest named, and this one does not, are removed, so a
/// directory saved into at every step holds one checkpoint (a load of the previous one still
/// running may then fail).
///
/// # Errors
/// [`Error::InvalidParameter`] for records that leave a class out or hold one twice;
/// [`Error::Io`].
///
/// # Example
/// See [`save_weights_shard`].
pub fn save_weights_manifest(dir: &Path, classes: usize, records: &[ShardRecord]) -> Result<()> {
    const OP: &str = "save_weights_manifest";
    let mut sorted: Vec<&ShardRecord> = records.iter().collect();
    sorted.sort_by_key(|r| r.first_class);
    let mut next = 0;
    for r in &sorted {
        if r.first_class != next
            || r.classes == 0
            || r.file.contains(char::is_whitespace)
            || !is_shard_name(&r.file)
        {
            return Err(Error::InvalidParameter {
                op: OP,
                what: "records",
                value: format!(
                    "a shard of classes {}..{} after class {next}",
                    r.first_class,
                    r.first_class.saturating_add(r.classes)
                ),
                rule: "must cover every class once, at least one each, in shard files named \
                       without spaces or directories",
            });
        }
        next = next.checked_add(r.classes).ok_or(Error::InvalidParameter {
            op: OP,
            what: "records",
            value: format!("{} classes after class {next}", r.classes),
            rule: "must add up to a number of classes",
        })?;
    }
    if next != classes {
        return Err(Error::InvalidParameter {
            op: OP,
            what: "records",
            value: format!("shards covering {next} classes"),
            rule: "must cover every class of the checkpoint",
        });
    }
    // The shards of the checkpoint this one replaces (none, or a damaged manifest: nothing to
    // remove), removed once the new manifest names its own.
    let previous = read_manifest(OP, dir).map_or_else(|_| Vec::new(), |m| m.1);
    let mut text = format!("{MANIFEST_TITLE}\nclasses {classes}\n");
    for r in &sorted {
        let (first, n, file, bytes) = (r.first_class, r.classes, &r.file, r.bytes);
        text.push_str(&format!(
            "shard {first} {n} {file} {bytes} {:016x}\n",
            r.checksum
        ));
    }
    write_atomic(OP, &dir.join(MANIFEST), |out| out.put(text.as_bytes()))?;
    for old in previous {
        if !sorted.iter().any(|r| r.file == old.file) {
            // Best effort: a file already gone, or one a reader still holds open on a
            // platform that refuses, costs only disk.
            let _ = std::fs::remove_file(dir.join(&old.file));
        }
    }
    Ok(())
}

/// [`save_weights_shard`] and [`save_weights_manifest`] for one process holding every class.
///
/// # Errors
/// As theirs; [`Error::Shape`] for a shard that does not start at class 0 and hold them all.
///
/// # Example
/// See [`save_weights_shard`].
pub fn save_weights(dir: &Path, weights: &WeightsShard<'_>) -> Result<()> {
    let header = shard_header("save_weights", weights)?;
    if (header.first, header.n) != (0, header.classes) {
        return Err(Error::Shape {
            op: "save_weights",
            what: "weights",
            expected: format!("every class, 0..{}", header.classes),
            got: weights.weights.shape().to_vec(),
        });
    }
    let record = save_weights_shard(dir, weights)?;
    save_weights_manifest(dir, weights.classes, &[record])
}
