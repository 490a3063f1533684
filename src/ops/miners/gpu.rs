//! The pair miners with their pairs left on the device (`shaders/pair_select.wgsl`): a first
//! pass counts each anchor's kept positives and negatives (8 bytes per anchor come back), the
//! host turns the counts into offsets and sizes the two arrays exactly, and a second pass
//! writes the rows there, in the host miners' order. Distances are computed on the device
//! in chunks of whole anchor rows under the budget and never leave it; when every anchor fits
//! one chunk and the arrays fit beside it, the second pass reuses the first pass's distances.

use std::sync::Arc;

use crate::context::oom_retry;
use crate::context::plan::{plan_rows, DeviceCaps, Footprint};
use crate::context::Context;
use crate::data::device_output::DeviceArray;
use crate::data::device_rows::{Rows, RowsView};
use crate::data::inputs::{Labelled, Resident};
use crate::error::{Error, Result};
use crate::hooks::Reporter;
use crate::kernels::distance_tile;
use crate::kernels::pair_select::{self, PairSelect, Params, SelectBuffers, Window};
use crate::metric::DistanceConfig;
use crate::ops::distance::gpu::{row_block_cost, DistanceRows};
use crate::runtime::device::GpuDevice;
use crate::runtime::memory::TrackedBuffer;
use crate::runtime::transfer::{self, uniform_size, Recorder, Staging};

/// The name of the device pair miners in errors.
pub(super) const DEVICE_OP: &str = "mine_on_device";

/// Bytes of one output row `(anchor, reference)`.
const ROW_BYTES: u64 = 8;

/// A dispatch's anchors `[start, end)` and, per side, its binding window of the output array:
/// `(first row bound, bytes)`, or `None` when it writes no row of that side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dispatch {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) windows: [Option<(u64, u64)>; 2],
}

/// The dispatches of anchors `anchors` whose output rows start at `offsets` (per anchor,
/// `[positives, negatives]`, one entry past the last anchor included), such that each binds
/// at most `max_binding` bytes of either array, from a row whose byte offset is a multiple of
/// `align`. Pure planning: the emit pass records these.
///
/// # Errors
/// [`Error::DeviceLimit`] when one anchor's rows alone do not fit one binding.
pub(crate) fn dispatches(
    offsets: &[[u64; 2]],
    anchors: std::ops::Range<usize>,
    align: u64,
    max_binding: u64,
) -> Result<Vec<Dispatch>> {
    let align_rows = (align / ROW_BYTES).max(1);
    let window = |s: usize, e: usize| -> [Option<(u64, u64)>; 2] {
        [0, 1].map(|side| {
            let (first, last) = (offsets[s][side], offsets[e][side]);
            let base = first - first % align_rows;
            (last > first).then_some((base, (last - base) * ROW_BYTES))
        })
    };
    let fits = |w: [Option<(u64, u64)>; 2]| w.iter().flatten().all(|&(_, b)| b <= max_binding);
    let mut out = Vec::new();
    let mut start = anchors.start;
    while start < anchors.end {
        if !fits(window(start, start + 1)) {
            let bytes = window(start, start + 1).iter().flatten().map(|w| w.1).max();
            return Err(Error::DeviceLimit {
                op: DEVICE_OP,
                what: "max_storage_buffer_binding_size",
                requested: bytes.unwrap_or(0),
                limit: max_binding,
            });
        }
        // The longest run of anchors from `start` whose windows fit (offsets ascend).
        let (mut lo, mut hi) = (start + 1, anchors.end);
        while lo < hi {
            let mid = hi - (hi - lo) / 2;
            if fits(window(start, mid)) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        out.push(Dispatch {
            start,
            end: lo,
            windows: window(start, lo),
        });
        start = lo;
    }
    Ok(out)
}

#[cfg(test)]
thread_local! {
    /// A smaller binding size for this thread's calls, so that tests reach several windows.
    static MAX_BINDING: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// The most bytes of an output array one dispatch binds.
fn max_binding(caps: &DeviceCaps) -> u64 {
    #[cfg(test)]
    if let Some(bytes) = MAX_BINDING.with(std::cell::Cell::get) {
        return bytes.min(caps.max_storage_binding);
    }
    caps.max_storage_binding
}

/// The buffers of one call, besides the distances and the output arrays.
struct Buffers {
    params: TrackedBuffer,
    anchor_labels: TrackedBuffer,
    self_slots: TrackedBuffer,
    ref_labels: TrackedBuffer,
    /// `(b + 1, 2)`: counts, then offsets.
    starts: TrackedBuffer,
    /// Bound for an output no row of a dispatch goes to (a binding cannot be empty).
    spare: [TrackedBuffer; 2],
}

impl Buffers {
    fn new(gpu: &GpuDevice, set: &Labelled<'_>) -> Result<Self> {
        let b = set.labels.len();
        let input = |label, data: &[u32]| -> Result<TrackedBuffer> {
            let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
            let buffer = transfer::create_buffer(gpu, label, 4 * data.len().max(1) as u64, usage)?;
            transfer::write(gpu, &buffer, 0, data)?;
            Ok(buffer)
        };
        let usage = wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST;
        Ok(Self {
            params: transfer::create_buffer(
                gpu,
                "pair_select::params",
                uniform_size::<Params>(),
                usage,
            )?,
            anchor_labels: input("pair_select::anchor_labels", &set.labels)?,
            self_slots: input("pair_select::self_slots", &set.self_slots)?,
            ref_labels: input("pair_select::ref_labels", &set.ref_labels)?,
            starts: transfer::output(gpu, "pair_select::starts", ROW_BYTES * (b as u64 + 1))?,
            spare: [
                transfer::output(gpu, "pair_select::spare", ROW_BYTES)?,
                transfer::output(gpu, "pair_select::spare", ROW_BYTES)?,
            ],
        })
    }
}

/// The distance rows of a call (none for a miner of labels only).
struct Distances<'a> {
    queries: Rows<'a>,
    refs: Resident<'a>,
    cfg: &'a DistanceConfig,
}

impl Distances<'_> {
    fn view(&self, m: usize) -> RowsView<'_> {
        RowsView {
            rows: self.refs.rows(),
            len: m,
        }
    }
}

/// Anchors per chunk: as many whole distance rows as the budget left allows (all of them for
/// a miner of labels only).
fn chunk_rows(
    ctx: &Context,
    gpu: &GpuDevice,
    b: usize,
    m: usize,
    distances: Option<&Distances<'_>>,
) -> Result<usize> {
    let Some(d) = distances else { return Ok(b) };
    let caps = DeviceCaps::from_limits(&gpu.limits);
    let budget = oom_retry::planning_budget(ctx);
    let cost = |rows: usize| Footprint {
        workgroup_storage: distance_tile::WORKGROUP_STORAGE.max(pair_select::WORKGROUP_STORAGE),
        ..row_block_cost(rows, d.view(m), 0)
    };
    Ok(plan_rows(DEVICE_OP, b, m, budget, &caps, cost)?.rows)
}

/// What a writing dispatch binds: per side, its window of the output array (see
/// [`Dispatch::windows`]) and the array.
type Emit<'a> = ([Option<(u64, u64)>; 2], [&'a TrackedBuffer; 2]);

/// The kernel and the buffers every dispatch of a call binds.
struct Select<'a> {
    kernel: Arc<PairSelect>,
    buf: &'a Buffers,
    template: Params,
}

impl Select<'_> {
    /// Records one dispatch over anchors `[start, end)`, whose distance rows start at row
    /// `row0` of `distances` (any buffer for a miner of labels only).
    fn record(
        &self,
        rec: &mut Recorder<'_>,
        (start, end, row0): (usize, usize, usize),
        distances: &TrackedBuffer,
        emit: Option<Emit<'_>>,
    ) -> Result<()> {
        let buf = self.buf;
        let mut params = Params {
            rows: (end - start) as u32,
            anchor0: start as u32,
            row0: row0 as u32,
            emit: u32::from(emit.is_some()),
            ..self.template
        };
        let mut outputs: [Window<'_>; 2] = [(&buf.spare[0], None), (&buf.spare[1], None)];
        if let Some((windows, arrays)) = emit {
            for (side, window) in windows.into_iter().enumerate() {
                if let Some((base, bytes)) = window {
                    outputs[side] = (arrays[side], Some((base * ROW_BYTES, bytes)));
                    let base = base as u32;
                    match side {
                        0 => params.pos_base = base,
                        _ => params.neg_base = base,
                    }
                }
            }
        }
        rec.upload(&buf.params, 0, &[params])?;
        let buffers = SelectBuffers {
            params: &buf.params,
            distances,
            anchor_labels: &buf.anchor_labels,
            self_slots: &buf.self_slots,
            ref_labels: &buf.ref_labels,
            starts: &buf.starts,
            positives: outputs[0],
            negatives: outputs[1],
        };
        self.kernel.encode(rec, (end - start) as u64, &buffers)
    }
}

/// Mines `set` on `gpu` with the kernel's `template` (its rule and settings) into two exact
/// `(k, 2)` arrays, positives and negatives. Reports `b · m` pairs per pass and checks for
/// cancellation before every chunk; waits for the counts, and once at its end.
pub(super) fn mine_pairs<'a>(
    ctx: &Context,
    gpu: &GpuDevice,
    set: &Labelled<'a>,
    distance: Option<&'a DistanceConfig>,
    template: Params,
    report: &Reporter<'_>,
) -> Result<[DeviceArray<u32>; 2]> {
    const OP: &str = DEVICE_OP;
    let (b, m) = (set.labels.len(), set.ref_labels.len());
    let empty = || DeviceArray::<u32>::new(gpu, "mine_on_device::pairs", (0, 2));
    if b == 0 || m == 0 {
        report.add(2 * (b * m) as u64);
        return Ok([empty()?, empty()?]);
    }
    let distances = match (distance, set.queries, set.refs) {
        (Some(cfg), Some(queries), Some(refs)) => Some(Distances {
            queries,
            refs: Resident::of(OP, gpu, refs)?,
            cfg,
        }),
        (None, ..) => None,
        _ => {
            return Err(Error::Internal {
                op: OP,
                message: "a miner of distances without embeddings".into(),
            })
        }
    };
    let buf = Buffers::new(gpu, set)?;
    let select = Select {
        kernel: gpu.kernel::<PairSelect>()?,
        buf: &buf,
        template: Params {
            cols: m as u32,
            ..template
        },
    };
    // The counts' staging exists before the chunks are planned, in what it leaves.
    let staging = Staging::new(gpu, "pair_select::counts", ROW_BYTES * b as u64)?;
    let rows = chunk_rows(ctx, gpu, b, m, distances.as_ref())?;
    let mut chunk = match &distances {
        Some(d) => Some(DistanceRows::new(gpu, rows, d.view(m))?),
        None => None,
    };
    let encode = |rec: &mut Recorder<'_>, chunk: &Option<DistanceRows>, a0, n| -> Result<()> {
        match (chunk, &distances) {
            (Some(c), Some(d)) => c.encode(rec, d.queries, a0, n, d.view(m), d.cfg),
            _ => Ok(()),
        }
    };

    // Count.
    let mut rec = Recorder::new(gpu, OP);
    rec.sentinel(&buf.starts, ROW_BYTES * b as u64)?;
    for a0 in (0..b).step_by(rows) {
        report.check()?;
        let n = rows.min(b - a0);
        encode(&mut rec, &chunk, a0, n)?;
        let distances = chunk.as_ref().map_or(&buf.ref_labels, |c| &c.distances);
        select.record(&mut rec, (a0, a0 + n, 0), distances, None)?;
        report.add((n * m) as u64);
    }
    rec.read_back(&buf.starts, 0, &staging, 0, ROW_BYTES * b as u64);
    let done = rec.submit()?;
    let counts =
        staging
            .map(&done, ROW_BYTES * b as u64)
            .read::<u32, _>(gpu, 2 * b, <[u32]>::to_vec)?;
    drop(staging);
    let mut offsets = Vec::with_capacity(b + 1);
    let mut next = [0u64; 2];
    for c in counts.chunks_exact(2) {
        offsets.push(next);
        if c[0] as usize > m || c[1] as usize > m {
            return Err(Error::Internal {
                op: OP,
                message: format!(
                    "an anchor kept {} positives and {} negatives of {m}",
                    c[0], c[1]
                ),
            });
        }
        next = [next[0] + u64::from(c[0]), next[1] + u64::from(c[1])];
    }
    offsets.push(next);

    // Size the arrays; keep the distances when one chunk held them all and the arrays fit
    // beside them, else plan the chunks again in what the arrays leave.
    let array_bytes: u64 = next
        .iter()
        .map(|&rows| transfer::buffer_size(ROW_BYTES * rows))
        .sum();
    let reuse = rows >= b && chunk.is_some() && ctx.tracker().available() >= array_bytes;
    if !reuse {
        chunk = None;
    }
    // The kernel addresses rows with 32-bit offsets.
    if let Some(&rows) = next.iter().find(|&&n| n > u64::from(u32::MAX)) {
        return Err(Error::DeviceLimit {
            op: OP,
            what: "pairs of one array (32-bit row offsets)",
            requested: rows,
            limit: u64::from(u32::MAX),
        });
    }
    let arrays = [0, 1].map(|side| {
        DeviceArray::<u32>::new(gpu, "mine_on_device::pairs", (next[side] as usize, 2))
    });
    let [positives, negatives] = arrays;
    let arrays = [positives?, negatives?];
    if next[0] + next[1] == 0 {
        report.add((b * m) as u64);
        return Ok(arrays);
    }
    let words: Vec<u32> = offsets.iter().flat_map(|o| o.map(|x| x as u32)).collect();
    transfer::write(gpu, &buf.starts, 0, &words)?;
    let (rows, chunk) = if reuse || distances.is_none() {
        (rows, chunk)
    } else {
        let rows = chunk_rows(ctx, gpu, b, m, distances.as_ref())?;
        let d = distances
            .as_ref()
            .map(|d| DistanceRows::new(gpu, rows, d.view(m)));
        (rows, d.transpose()?)
    };
    let caps = DeviceCaps::from_limits(&gpu.limits);
    let align = u64::from(gpu.limits.min_storage_buffer_offset_alignment);
    let targets = [arrays[0].tracked(), arrays[1].tracked()];

    // Write.
    let mut rec = Recorder::new(gpu, OP);
    for array in &arrays {
        rec.sentinel(array.tracked(), array.bytes())?;
    }
    for a0 in (0..b).step_by(rows) {
        report.check()?;
        let n = rows.min(b - a0);
        if !reuse {
            encode(&mut rec, &chunk, a0, n)?;
        }
        let distances = chunk.as_ref().map_or(&buf.ref_labels, |c| &c.distances);
        for d in dispatches(&offsets, a0..a0 + n, align, max_binding(&caps))? {
            let span = (d.start, d.end, d.start - a0);
            select.record(&mut rec, span, distances, Some((d.windows, targets)))?;
        }
        report.add((n * m) as u64);
    }
    rec.submit()?;
    // Nothing to read: wait so that the call's buffers are idle when it frees them, and a lost
    // device is this call's error.
    transfer::wait_all(gpu)?;
    Ok(arrays)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(counts: &[[u64; 2]]) -> Vec<[u64; 2]> {
        let mut next = [0u64; 2];
        let mut out = vec![next];
        for c in counts {
            next = [next[0] + c[0], next[1] + c[1]];
            out.push(next);
        }
        out
    }

    #[test]
    fn dispatches_cover_the_anchors_in_windows_within_the_binding() {
        let counts: Vec<[u64; 2]> = (0..40u64).map(|i| [i % 7, (i * 5) % 11]).collect();
        let off = offsets(&counts);
        for max in [120u64, 200, 1000, 1 << 20] {
            let plan = dispatches(&off, 3..37, 32, max).expect("fits");
            assert_eq!(plan.first().map(|d| d.start), Some(3));
            assert_eq!(plan.last().map(|d| d.end), Some(37));
            for pair in plan.windows(2) {
                assert_eq!(pair[0].end, pair[1].start, "consecutive");
            }
            for d in &plan {
                assert!(d.end > d.start);
                for (side, window) in d.windows.iter().enumerate() {
                    let (first, last) = (off[d.start][side], off[d.end][side]);
                    match *window {
                        None => assert_eq!(first, last),
                        Some((base, bytes)) => {
                            assert_eq!((base * ROW_BYTES) % 32, 0, "aligned");
                            assert!(base <= first && base + bytes / ROW_BYTES == last);
                            assert!(bytes <= max, "{bytes} > {max}");
                        }
                    }
                }
            }
            if max == 1 << 20 {
                assert_eq!(plan.len(), 1, "one dispatch when everything fits");
            }
        }
    }

    #[test]
    fn windows_of_the_arrays_give_the_host_miners_rows() {
        use crate::context::test_gpu_context;
        use crate::ops::miners::{
            mine_on_device, multi_similarity_pairs, pair_margin_pairs, MultiSimilarityConfig,
            PairMarginConfig,
        };
        use crate::MiningSet;
        let Some(ctx) = test_gpu_context() else {
            return;
        };
        let x = ndarray::Array2::from_shape_fn((300, 6), |(i, j)| ((i * 7 + j * 3) % 5) as f32);
        let y = ndarray::Array1::from_shape_fn(300, |i| (i * 13 % 4) as u32);
        let (queries, refs) = (
            MiningSet::new(x.slice(ndarray::s![..60, ..]), y.slice(ndarray::s![..60])),
            MiningSet::new(&x, &y),
        );
        // 4 KiB windows: 512 rows, while each side holds thousands.
        MAX_BINDING.with(|m| m.set(Some(4096)));
        let multi = MultiSimilarityConfig::default();
        let got = mine_on_device(&ctx, &queries, Some(&refs), &multi);
        let margin = PairMarginConfig::default();
        let got_margin = mine_on_device(&ctx, &queries, Some(&refs), &margin);
        MAX_BINDING.with(|m| m.set(None));
        let (got, got_margin) = (got.expect("multi"), got_margin.expect("margin"));
        let want = multi_similarity_pairs(&ctx, &queries, Some(&refs), &multi).expect("host");
        assert!(want.positives.nrows() > 2 * 512 && want.negatives.nrows() > 2 * 512);
        assert_eq!(got.positives.to_host(&ctx).expect("read"), want.positives);
        assert_eq!(got.negatives.to_host(&ctx).expect("read"), want.negatives);
        let want = pair_margin_pairs(&ctx, &queries, Some(&refs), &margin).expect("host");
        assert!(want.negatives.nrows() > 2 * 512);
        assert_eq!(
            got_margin.positives.to_host(&ctx).expect("read"),
            want.positives
        );
        assert_eq!(
            got_margin.negatives.to_host(&ctx).expect("read"),
            want.negatives
        );
    }

    #[test]
    fn an_anchor_larger_than_a_binding_is_a_device_limit() {
        let off = offsets(&[[1, 1], [100, 0], [1, 1]]);
        match dispatches(&off, 0..3, 8, 400) {
            Err(Error::DeviceLimit {
                what, requested, ..
            }) => {
                assert_eq!(what, "max_storage_buffer_binding_size");
                assert!(requested > 400);
            }
            other => panic!("{other:?}"),
        }
    }
}
