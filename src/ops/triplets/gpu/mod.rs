//! The wgpu path of triplet mining.
//!
//! Per chunk of anchors (sized by [`super::plan`] to the budget): the distance tile (margin rules),
//! then `triplet_lists` gives every anchor its ascending positive and negative references.
//! Every valid triplet is then `P_a × N_a`: the host reads the two lists back and expands
//! them, which moves `O(b·m)` bytes instead of the `O(b·m²)` triplets (one submission, one
//! wait). Margin rules count the kept triplets of each (anchor, positive) pair on the device
//! and read the counts back (one submission: distances, lists, grouping, counts; one wait),
//! prefix-sum them on the host as `u64`, and let the device write the kept negatives of each
//! pair at its offset, in windows of whole pairs that fit the output buffer (one submission
//! and one wait per window; one window unless the chunk's triplets outgrow the buffer); the
//! host adds `(a, p)` to each negative. The host knows each anchor's list sizes and positives
//! from the labels ([`LabelLists`]), so nothing waits for the lists themselves; their sizes
//! come back with the counts and are checked against the host's.
//! Counting and emitting either test every (pair, negative) (`triplet_select`) or first
//! group each anchor's negatives by the positives that keep them (`negative_buckets`), so
//! that a pair's kept negatives are one run found by binary search. Results left on the
//! device (`on_device.rs`) are expanded there into the caller's array.

mod on_device;

pub(super) use on_device::mine_on_device;

use std::ops::Range;
use std::sync::Arc;

use super::plan::{plan_call, Layout};
use super::{list_sizes, Problem, TripletRule, Writer, OP};
use crate::context::oom_retry;
use crate::context::plan::DeviceCaps;
use crate::context::Context;
use crate::data::device_output::DeviceArray;
use crate::data::device_rows::RowsView;
use crate::data::inputs::Resident;
use crate::error::{Error, Result};
use crate::hooks::Reporter;
use crate::kernels::negative_buckets::{self, BucketBuffers, NegativeBuckets, PairPass};
use crate::kernels::triplet_expand::TripletExpand;
use crate::kernels::triplet_lists::{self, ListBuffers, TripletLists};
use crate::kernels::triplet_select::{self, words, Pass, SelectBuffers, TripletSelect};
use crate::ops::distance::gpu::DistanceRows;
use crate::runtime::device::GpuDevice;
use crate::runtime::memory::TrackedBuffer;
use crate::runtime::transfer::{self, f32s, uniform_size, Readback, Recorder, Staging, Submitted};

/// Every device buffer of a mining call besides the resident reference rows.
struct Buffers {
    lists_params: TrackedBuffer,
    select_params: TrackedBuffer,
    bucket_params: TrackedBuffer,
    ref_labels: TrackedBuffer,
    anchor_labels: TrackedBuffer,
    self_slots: TrackedBuffer,
    /// Margin rules: the chunk's distances against the references.
    distance: Option<DistanceRows>,
    positives: TrackedBuffer,
    negatives: TrackedBuffer,
    pair_counts: TrackedBuffer,
    sorted: TrackedBuffer,
    buckets: TrackedBuffer,
    order: TrackedBuffer,
    scratch: TrackedBuffer,
    sort_params: Vec<TrackedBuffer>,
    staging: Staging,
    list_counts: TrackedBuffer,
    list_count_staging: Staging,
    pair_base: TrackedBuffer,
    offsets: TrackedBuffer,
    out: TrackedBuffer,
    out_staging: Staging,
    /// Device output: the expansion's parameters, a window's segments and its rows.
    expand_params: TrackedBuffer,
    starts: TrackedBuffer,
    heads: TrackedBuffer,
    sources: TrackedBuffer,
    expanded: TrackedBuffer,
}

impl Buffers {
    fn new(gpu: &GpuDevice, l: &Layout, refs: Option<RowsView<'_>>) -> Result<Self> {
        let input = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
        let make = |label, size| transfer::create_buffer(gpu, label, size, input);
        let output = |label, size| transfer::output(gpu, label, size);
        let staging = |label, size| Staging::new(gpu, label, size);
        let uniform = |label, size| {
            let usage = wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST;
            transfer::create_buffer(gpu, label, size, usage)
        };
        Ok(Self {
            lists_params: uniform(
                "mine_triplets::lists_params",
                uniform_size::<triplet_lists::Params>(),
            )?,
            select_params: uniform(
                "mine_triplets::select_params",
                uniform_size::<triplet_select::Params>(),
            )?,
            bucket_params: uniform(
                "mine_triplets::bucket_params",
                uniform_size::<negative_buckets::Params>(),
            )?,
            ref_labels: make("mine_triplets::ref_labels", f32s(l.refs))?,
            anchor_labels: make("mine_triplets::anchor_labels", f32s(l.anchors))?,
            self_slots: make("mine_triplets::self_slots", f32s(l.anchors))?,
            distance: match refs {
                Some(view) => Some(DistanceRows::new(gpu, l.anchors, view)?),
                None => None,
            },
            positives: output("mine_triplets::positives", l.matrix())?,
            negatives: output("mine_triplets::negatives", l.matrix())?,
            pair_counts: output("mine_triplets::pair_counts", l.pair_counts())?,
            sorted: output("mine_triplets::sorted", l.sorted())?,
            buckets: output("mine_triplets::buckets", l.buckets())?,
            order: output("mine_triplets::order", l.order())?,
            scratch: output("mine_triplets::scratch", l.scratch())?,
            sort_params: (0..l.sort_params())
                .map(|_| {
                    uniform(
                        "mine_triplets::sort_params",
                        uniform_size::<negative_buckets::Params>(),
                    )
                })
                .collect::<Result<_>>()?,
            staging: staging("mine_triplets::staging", l.staging())?,
            list_counts: output("mine_triplets::list_counts", f32s(2 * l.anchors))?,
            list_count_staging: staging("mine_triplets::list_count_staging", f32s(2 * l.anchors))?,
            pair_base: make("mine_triplets::pair_base", f32s(l.anchors + 1))?,
            offsets: make("mine_triplets::offsets", l.offsets())?,
            out: output("mine_triplets::out", l.out())?,
            out_staging: staging("mine_triplets::out_staging", l.out_staging())?,
            expand_params: uniform("mine_triplets::expand_params", l.expand_params())?,
            starts: make("mine_triplets::starts", l.segments()[0])?,
            heads: make("mine_triplets::heads", l.segments()[1])?,
            sources: make("mine_triplets::sources", l.segments()[2])?,
            expanded: output("mine_triplets::expanded", l.expanded())?,
        })
    }

    /// The chunk's distances; only margin rules select, and they always have them.
    fn distances(&self) -> Result<&TrackedBuffer> {
        let distance = self.distance.as_ref().ok_or_else(|| Error::Internal {
            op: OP,
            message: "a margin rule without distances passed validation".into(),
        })?;
        Ok(&distance.distances)
    }

    /// The select kernel's buffers.
    fn select(&self) -> Result<SelectBuffers<'_>> {
        Ok(SelectBuffers {
            params: &self.select_params,
            distances: self.distances()?,
            positives: &self.positives,
            negatives: &self.negatives,
            list_counts: &self.list_counts,
            pair_base: &self.pair_base,
            pair_counts: &self.pair_counts,
            offsets: &self.offsets,
            out: &self.out,
        })
    }

    /// The grouping kernel's buffers.
    fn buckets(&self) -> Result<BucketBuffers<'_>> {
        Ok(BucketBuffers {
            params: &self.bucket_params,
            sort_params: &self.sort_params,
            distances: self.distances()?,
            positives: &self.positives,
            negatives: &self.negatives,
            list_counts: &self.list_counts,
            pair_base: &self.pair_base,
            sorted: &self.sorted,
            buckets: &self.buckets,
            order: &self.order,
            pair_counts: &self.pair_counts,
            offsets: &self.offsets,
            out: &self.out,
            scratch: &self.scratch,
        })
    }
}

/// Each anchor's positives as the labels give them: what `triplet_lists` computes on the
/// device (same rule as its reference), known on the host, so that emitted negatives are
/// paired with their positives without reading the lists back.
struct LabelLists {
    /// Per label, its ascending reference slots.
    members: Vec<Vec<u32>>,
}

impl LabelLists {
    fn new(ref_labels: &[u32]) -> Self {
        let classes = ref_labels.iter().max().map_or(0, |&l| l as usize + 1);
        let mut members = vec![Vec::new(); classes];
        for (r, &l) in ref_labels.iter().enumerate() {
            members[l as usize].push(r as u32);
        }
        Self { members }
    }

    /// The `i`-th positive of an anchor with `label` whose own slot is `me` (skipped).
    fn positive(&self, label: u32, me: u32, i: usize) -> u32 {
        let members = self
            .members
            .get(label as usize)
            .map_or(&[][..], Vec::as_slice);
        let skip = members.binary_search(&me).is_ok_and(|j| j <= i);
        members[i + usize::from(skip)]
    }
}

/// A per-pair entry point of either kernel.
#[derive(Clone, Copy)]
enum PairKernel {
    Select(Pass),
    Buckets(PairPass),
}

/// The kernels, buffers and plan of one mining call.
struct Miner<'p, 'd> {
    gpu: &'p GpuDevice,
    problem: &'p Problem<'d>,
    layout: Layout,
    refs: Option<Resident<'d>>,
    buf: Buffers,
    labels: LabelLists,
    /// `[n_pos, n_neg]` per anchor of the call, from the class sizes ([`list_sizes`]).
    sizes: Vec<u32>,
    lists: Arc<TripletLists>,
    select: Arc<TripletSelect>,
    buckets: Arc<NegativeBuckets>,
    /// Device output only.
    expand: Option<Arc<TripletExpand>>,
    select_params: triplet_select::Params,
    bucket_params: negative_buckets::Params,
}

impl<'p, 'd> Miner<'p, 'd> {
    fn new(
        ctx: &'p Context,
        gpu: &'p GpuDevice,
        problem: &'p Problem<'d>,
        emit: bool,
        device: bool,
    ) -> Result<Self> {
        let m = problem.set.ref_labels.len();
        let caps = DeviceCaps::from_limits(&gpu.limits);
        let budget = oom_retry::planning_budget(ctx);
        let layout = plan_call(problem, emit, device, budget, &caps)?.layout;
        let refs = match problem.set.refs {
            None => None,
            Some(refs) => Some(Resident::of(OP, gpu, refs)?),
        };
        let view = refs.as_ref().map(|r| RowsView {
            rows: r.rows(),
            len: m,
        });
        let buf = Buffers::new(gpu, &layout, view)?;
        transfer::write(gpu, &buf.ref_labels, 0, &problem.set.ref_labels)?;
        let select_params = triplet_select::Params {
            anchors: 0,
            refs: m as u32,
            mode: problem.rule.mode(),
            inverted: u32::from(problem.distance.distance.is_similarity()),
            margin: problem.rule.margin(),
            pair_lo: 0,
            pair_hi: 0,
            _pad0: 0,
            start: [0; 2],
            _pad: [0; 2],
        };
        Ok(Self {
            gpu,
            problem,
            layout,
            refs,
            buf,
            labels: LabelLists::new(&problem.set.ref_labels),
            // Each at most `m`, which fits a u32.
            sizes: list_sizes(&problem.set)
                .flat_map(|(p, n)| [p as u32, n as u32])
                .collect(),
            lists: gpu.kernel::<TripletLists>()?,
            select: gpu.kernel::<TripletSelect>()?,
            buckets: gpu.kernel::<NegativeBuckets>()?,
            expand: if device {
                Some(gpu.kernel::<TripletExpand>()?)
            } else {
                None
            },
            bucket_params: negative_buckets::Params {
                refs: m as u32,
                bitmap_words: negative_buckets::bitmap_words(m) as u32,
                mode: select_params.mode,
                inverted: select_params.inverted,
                margin: select_params.margin,
                ..Default::default()
            },
            select_params,
        })
    }

    /// `[n_pos, n_neg]` per anchor of `a0 .. a0 + rows`.
    fn sizes(&self, a0: usize, rows: usize) -> &[u32] {
        &self.sizes[2 * a0..2 * (a0 + rows)]
    }

    /// The `i`-th positive of anchor `a`.
    fn positive(&self, a: usize, i: usize) -> u32 {
        let set = &self.problem.set;
        self.labels.positive(set.labels[a], set.self_slots[a], i)
    }

    /// Records the distances (margin rules) and lists of anchors `a0 .. a0 + rows`, and the
    /// copy of their sizes into the list-count staging.
    fn record_lists(&self, rec: &mut Recorder<'_>, a0: usize, rows: usize) -> Result<()> {
        let (buf, m) = (&self.buf, self.layout.refs);
        let set = &self.problem.set;
        let span = a0..a0 + rows;
        rec.upload(&buf.anchor_labels, 0, &set.labels[span.clone()])?;
        rec.upload(&buf.self_slots, 0, &set.self_slots[span])?;
        let params = triplet_lists::Params {
            anchors: rows as u32,
            refs: m as u32,
            _pad: [0; 2],
        };
        rec.upload(&buf.lists_params, 0, &[params])?;
        rec.sentinel(&buf.positives, f32s(rows * m))?;
        rec.sentinel(&buf.negatives, f32s(rows * m))?;
        rec.sentinel(&buf.list_counts, f32s(2 * rows))?;
        if let (Some(distance), Some(queries), Some(refs)) =
            (&buf.distance, set.queries, &self.refs)
        {
            let view = RowsView {
                rows: refs.rows(),
                len: m,
            };
            distance.encode(rec, queries, a0, rows, view, &self.problem.distance)?;
        }
        let lb = ListBuffers {
            params: &buf.lists_params,
            anchor_labels: &buf.anchor_labels,
            ref_labels: &buf.ref_labels,
            self_slots: &buf.self_slots,
            positives: &buf.positives,
            negatives: &buf.negatives,
            list_counts: &buf.list_counts,
        };
        self.lists.encode(rec, rows as u64, &lb)?;
        rec.read_back(
            &buf.list_counts,
            0,
            &buf.list_count_staging,
            0,
            8 * rows as u64,
        );
        Ok(())
    }

    /// Starts reading back the list sizes of a chunk of `rows` anchors after `done`.
    fn map_list_sizes(&self, done: &Submitted, rows: usize) -> Readback<'_> {
        self.buf.list_count_staging.map(done, 8 * rows as u64)
    }

    /// Checks the list sizes the device found against the labels'.
    fn check_list_sizes(&self, sizes: Readback<'_>, a0: usize, expected: &[u32]) -> Result<()> {
        let found = sizes.read::<u32, _>(self.gpu, expected.len(), |v| v == expected)?;
        if found {
            Ok(())
        } else {
            Err(Error::Internal {
                op: OP,
                message: format!(
                    "the device's list sizes of anchors {a0}.. differ from the labels'"
                ),
            })
        }
    }

    /// All-valid rules: both lists of anchors `a0 .. a0 + rows`, `(anchors, m)` each, read back
    /// for the host to expand (one submission, one wait).
    fn all_valid_lists(&self, a0: usize, rows: usize) -> Result<(Vec<u32>, Vec<u32>)> {
        let (gpu, buf, m) = (self.gpu, &self.buf, self.layout.refs);
        let mut rec = Recorder::new(gpu, "mine_triplets::lists");
        self.record_lists(&mut rec, a0, rows)?;
        let list_bytes = 4 * (rows * m) as u64;
        rec.read_back(&buf.positives, 0, &buf.staging, 0, list_bytes);
        rec.read_back(&buf.negatives, 0, &buf.staging, list_bytes, list_bytes);
        let done = rec.submit()?;
        // Both readbacks are mapped before either is read: one wait serves both.
        let sizes = self.map_list_sizes(&done, rows);
        let lists =
            buf.staging
                .map(&done, 2 * list_bytes)
                .read::<u32, _>(gpu, 2 * rows * m, |both| {
                    let (p, n) = both.split_at(rows * m);
                    (p.to_vec(), n.to_vec())
                })?;
        self.check_list_sizes(sizes, a0, self.sizes(a0, rows))?;
        Ok(lists)
    }

    /// Records `pass` over `pairs`, split into dispatches that fit a 2-D grid of the device
    /// (`limit²` workgroups), each with its own `[pair_lo, pair_hi)` in the uniform block (a
    /// rewrite the recorder orders with a flush, not a wait).
    fn record_pairs(
        &mut self,
        rec: &mut Recorder<'_>,
        pass: PairKernel,
        pairs: Range<u32>,
    ) -> Result<()> {
        let limit = u64::from(self.gpu.limits.max_compute_workgroups_per_dimension);
        let per_workgroup = match pass {
            PairKernel::Select(p) => p.pairs_per_workgroup(),
            PairKernel::Buckets(_) => negative_buckets::WORKGROUP_SIZE,
        };
        let mut step = (limit * limit * per_workgroup).min(u64::from(u32::MAX)) as u32;
        if let PairKernel::Buckets(PairPass::Emit) = pass {
            // Each pair of an emit dispatch has its own bitmap in `scratch`.
            step = step.min(self.layout.bitmap_pairs().max(1) as u32);
        }
        let mut lo = pairs.start;
        while lo < pairs.end {
            let hi = lo.saturating_add(step).min(pairs.end);
            let n = u64::from(hi - lo);
            match pass {
                PairKernel::Select(p) => {
                    self.select_params.pair_lo = lo;
                    self.select_params.pair_hi = hi;
                    rec.upload(&self.buf.select_params, 0, &[self.select_params])?;
                    self.select.encode(rec, p, n, &self.buf.select()?)?;
                }
                PairKernel::Buckets(p) => {
                    self.bucket_params.pair_lo = lo;
                    self.bucket_params.pair_hi = hi;
                    rec.upload(&self.buf.bucket_params, 0, &[self.bucket_params])?;
                    self.buckets.encode_pairs(rec, p, n, &self.buf.buckets()?)?;
                }
            }
            lo = hi;
        }
        Ok(())
    }

    /// Records the grouping of each anchor's negatives by the positives that keep them
    /// (`negative_buckets`: the positive values sorted in rows of the call's width, then a
    /// counting sort of the negatives into `order`).
    fn record_grouping(
        &mut self,
        rec: &mut Recorder<'_>,
        (a0, rows): (usize, usize),
        most_pos: usize,
    ) -> Result<()> {
        let sizes = self.sizes(a0, rows);
        let most_neg = sizes.iter().skip(1).step_by(2).copied().max().unwrap_or(0);
        let width = negative_buckets::width(most_pos);
        let stride = negative_buckets::stride(most_pos);
        self.bucket_params = negative_buckets::Params {
            anchors: rows as u32,
            width: width as u32,
            stride: stride as u32,
            span: most_neg,
            ..self.bucket_params
        };
        rec.upload(&self.buf.bucket_params, 0, &[self.bucket_params])?;
        let passes = negative_buckets::passes(width);
        for (buffer, &(k, j)) in self.buf.sort_params.iter().zip(&passes) {
            let pass = negative_buckets::Params {
                k,
                j,
                ..self.bucket_params
            };
            rec.upload(buffer, 0, &[pass])?;
        }
        rec.sentinel(&self.buf.sorted, f32s(rows * width))?;
        rec.sentinel(&self.buf.order, f32s(rows * self.layout.refs))?;
        // The counters must start at zero (the sentinel would be a wrong count).
        rec.clear(&self.buf.buckets, f32s(rows * stride));
        self.buckets.encode_grouping(
            rec,
            (rows as u64, width as u64, u64::from(most_neg)),
            &self.buf.buckets()?,
        )
    }

    /// Margin rules: kept triplets of every pair of anchors `a0 .. a0 + rows`, in pair order,
    /// and the pairs' first indices per anchor. Distances, lists, grouping and counts are one
    /// recording; the counts come back with the one wait.
    fn pair_counts(&mut self, a0: usize, rows: usize) -> Result<(Vec<u32>, Vec<u32>)> {
        let mut pair_base = Vec::with_capacity(rows + 1);
        let mut pairs = 0u32;
        for &p in self.sizes(a0, rows).iter().step_by(2) {
            pair_base.push(pairs);
            pairs += p;
        }
        pair_base.push(pairs);
        if pairs == 0 {
            // No pair, no triplet: nothing to run.
            return Ok((pair_base, Vec::new()));
        }
        let gpu = self.gpu;
        let mut rec = Recorder::new(gpu, "mine_triplets::count");
        self.record_lists(&mut rec, a0, rows)?;
        rec.upload(&self.buf.pair_base, 0, &pair_base)?;
        self.select_params.anchors = rows as u32;
        let pass = match self.layout.grouped {
            Some(most_pos) => {
                self.record_grouping(&mut rec, (a0, rows), most_pos)?;
                PairKernel::Buckets(PairPass::Count)
            }
            None => PairKernel::Select(Pass::CountScan),
        };
        rec.sentinel(&self.buf.pair_counts, f32s(pairs as usize))?;
        self.record_pairs(&mut rec, pass, 0..pairs)?;
        let bytes = 4 * u64::from(pairs);
        rec.read_back(&self.buf.pair_counts, 0, &self.buf.staging, 0, bytes);
        let done = rec.submit()?;
        let sizes = self.map_list_sizes(&done, rows);
        let counts = self.buf.staging.map(&done, bytes).read::<u32, _>(
            gpu,
            pairs as usize,
            <[u32]>::to_vec,
        )?;
        self.check_list_sizes(sizes, a0, self.sizes(a0, rows))?;
        Ok((pair_base, counts))
    }

    /// Where a margin rule's emit puts each pair's kept negatives: exclusive prefix sums of the
    /// counts (`u64`, as two words, one past the last pair too) and windows of whole pairs,
    /// each at most `layout.out` negatives, that cut the output to the buffer.
    fn windows(&self, counts: &[u32]) -> (Vec<[u32; 2]>, Vec<Window>) {
        let mut offsets = Vec::with_capacity(counts.len() + 1);
        let mut windows: Vec<Window> = Vec::new();
        let mut at = 0u64;
        for (pair, &c) in counts.iter().enumerate() {
            offsets.push(words(at));
            let (pair, c) = (pair as u32, u64::from(c));
            match windows.last_mut() {
                Some((pairs, span)) if at + c - span.start <= self.layout.out as u64 => {
                    pairs.end = pair + 1;
                    span.end = at + c;
                }
                _ => windows.push((pair..pair + 1, at..at + c)),
            }
            at += c;
        }
        // One past the last pair: `negative_buckets` reads each pair's count as the difference.
        offsets.push(words(at));
        windows.retain(|(_, span)| !span.is_empty());
        (offsets, windows)
    }

    /// `(anchor, positive)` of each pair of `pairs` (anchors of the chunk from `a0`, whose
    /// first pairs are `pair_base`).
    fn pair_heads(&self, a0: usize, pair_base: &[u32], pairs: Range<u32>) -> Vec<[u32; 2]> {
        let mut a = pair_base
            .partition_point(|&b| b <= pairs.start)
            .saturating_sub(1);
        pairs
            .map(|pair| {
                while pair_base.get(a + 1).is_some_and(|&next| next <= pair) {
                    a += 1;
                }
                let i = (pair - pair_base[a]) as usize;
                [(a0 + a) as u32, self.positive(a0 + a, i)]
            })
            .collect()
    }

    /// Records a margin rule's emit of window `pairs` (negatives `span` of the chunk) into
    /// `out`, after uploading the pairs' offsets when `first`.
    fn record_emit(
        &mut self,
        rec: &mut Recorder<'_>,
        (pairs, span): &Window,
        offsets: &[[u32; 2]],
        first: bool,
    ) -> Result<()> {
        self.select_params.start = words(span.start);
        self.bucket_params.start = words(span.start);
        if first {
            rec.upload(&self.buf.offsets, 0, offsets)?;
        }
        rec.sentinel(&self.buf.out, f32s((span.end - span.start) as usize))?;
        let pass = match self.layout.grouped {
            Some(_) => PairKernel::Buckets(PairPass::Emit),
            None => PairKernel::Select(Pass::Emit),
        };
        self.record_pairs(rec, pass, pairs.clone())
    }

    /// Emits the kept triplets of the chunk's pairs into `writer`, window by window (one
    /// submission and one wait each).
    fn emit(
        &mut self,
        a0: usize,
        pair_base: &[u32],
        counts: &[u32],
        writer: &mut Writer<'_>,
    ) -> Result<()> {
        let gpu = self.gpu;
        let (offsets, windows) = self.windows(counts);
        writer.reserve(counts.iter().map(|&c| u64::from(c)).sum());
        for (i, window) in windows.iter().enumerate() {
            writer.check()?;
            let len = (window.1.end - window.1.start) as usize;
            let mut rec = Recorder::new(gpu, "mine_triplets::emit");
            self.record_emit(&mut rec, window, &offsets, i == 0)?;
            let bytes = 4 * len as u64;
            rec.read_back(&self.buf.out, 0, &self.buf.out_staging, 0, bytes);
            let done = rec.submit()?;
            let heads = self.pair_heads(a0, pair_base, window.0.clone());
            let readback = self.buf.out_staging.map(&done, bytes);
            readback.read::<u32, _>(gpu, len, |negatives| {
                // Pair k of the window owns the next counts[k] negatives.
                let mut rest = negatives;
                for (pair, [a, p]) in window.0.clone().zip(heads) {
                    let c = counts[pair as usize] as usize;
                    let (head, tail) = rest.split_at(c.min(rest.len()));
                    rest = tail;
                    writer.block(a, p, head);
                }
            })?;
            if writer.stopped() {
                break;
            }
        }
        Ok(())
    }
}

/// A window of a margin rule's emit: its pairs and the chunk's negatives they own.
type Window = (Range<u32>, Range<u64>);

/// Device output: `rows` triplet rows `(head.0, head.1, negative)`, their negatives from
/// element `source` of the window's negatives on.
struct Segment {
    head: [u32; 2],
    source: u32,
    rows: u32,
}

/// A device array for `count` triplet rows `(count, 3)`.
pub(super) fn triplet_array(gpu: &GpuDevice, count: u64) -> Result<DeviceArray<u32>> {
    let rows = usize::try_from(count).map_err(|_| Error::DeviceLimit {
        op: OP,
        what: "max_buffer_size",
        requested: count.saturating_mul(12),
        limit: gpu.limits.max_buffer_size,
    })?;
    DeviceArray::new(gpu, "mine_triplets::triplets", (rows, 3))
}

/// What [`mine_in_one_chunk`] got to.
pub(super) enum OneChunk {
    /// Every triplet, written.
    Mined(DeviceArray<u32>),
    /// The count only: the array did not fit beside the chunk's buffers.
    Counted(u64),
    /// The anchors need more than one chunk: nothing was done.
    Chunked,
}

/// Device output of a margin rule in one pass when every anchor fits one chunk: the pairs'
/// counts, then the array sized by them, then the rows, with the chunk's lists, grouping and
/// offsets still on the device. When the array does not fit the budget beside the chunk's
/// buffers, only the count comes back (the caller sizes the array with those freed and mines
/// in chunks); when the anchors need several chunks, nothing is done.
pub(super) fn mine_in_one_chunk(
    ctx: &Context,
    gpu: &GpuDevice,
    problem: &Problem<'_>,
    report: &Reporter<'_>,
) -> Result<OneChunk> {
    let (b, m) = (problem.set.labels.len(), problem.set.ref_labels.len());
    // Planned first: nothing is allocated or uploaded for a call that needs several chunks.
    let caps = DeviceCaps::from_limits(&gpu.limits);
    let planned = plan_call(problem, true, true, oom_retry::planning_budget(ctx), &caps)?;
    if planned.layout.anchors < b {
        return Ok(OneChunk::Chunked);
    }
    // It plans the same layout; checked again because the chunk's buffers bound what the
    // count and emit below write.
    let mut miner = Miner::new(ctx, gpu, problem, true, true)?;
    if miner.layout.anchors < b {
        return Ok(OneChunk::Chunked);
    }
    report.check()?;
    let (pair_base, counts) = miner.pair_counts(0, b)?;
    let count: u64 = counts.iter().map(|&c| u64::from(c)).sum();
    let dst = match triplet_array(gpu, count) {
        Ok(dst) => dst,
        Err(Error::BudgetExceeded { .. }) => return Ok(OneChunk::Counted(count)),
        Err(e) => return Err(e),
    };
    let mut row = 0u64;
    miner.emit_on_device((0, &pair_base), &counts, &dst, &mut row, report)?;
    if row != count {
        return Err(Error::Internal {
            op: OP,
            message: format!("{row} triplets written of {count} counted"),
        });
    }
    report.add((b * m) as u64);
    transfer::wait_all(gpu)?;
    Ok(OneChunk::Mined(dst))
}

/// Mines `problem` on `gpu`, into `writer` (returning 0) or only counting (returning the
/// count; `for_device`: with the kernel [`mine_on_device`] writes with, so that the count sizes
/// its array exactly); reports each anchor chunk's `rows × m` pairs and checks for
/// cancellation before each.
pub(super) fn mine(
    ctx: &Context,
    gpu: &GpuDevice,
    problem: &Problem<'_>,
    (mut writer, for_device): (Option<&mut Writer<'_>>, bool),
    report: &Reporter<'_>,
) -> Result<u64> {
    let b = problem.set.labels.len();
    let m = problem.set.ref_labels.len();
    // Counting for a device-output call uses the kernel its writing pass will use.
    let mut miner = Miner::new(ctx, gpu, problem, writer.is_some(), for_device)?;
    let mut counted = 0u64;
    for a0 in (0..b).step_by(miner.layout.anchors) {
        report.check()?;
        let rows = miner.layout.anchors.min(b - a0);
        match (problem.rule, writer.as_mut()) {
            (TripletRule::AllValid, Some(w)) => {
                // Every valid triplet is P_a × N_a: expand the lists on the host.
                let (positives, negatives) = miner.all_valid_lists(a0, rows)?;
                for (a, size) in miner.sizes(a0, rows).chunks_exact(2).enumerate() {
                    let row = a * m;
                    let negatives = &negatives[row..row + size[1] as usize];
                    for &p in &positives[row..row + size[0] as usize] {
                        w.block((a0 + a) as u32, p, negatives);
                    }
                }
            }
            (TripletRule::AllValid, None) => {
                // Label arithmetic (the caller counts without a device; kept for completeness).
                let sizes = miner.sizes(a0, rows);
                counted += sizes
                    .chunks_exact(2)
                    .map(|s| u64::from(s[0]) * u64::from(s[1]))
                    .sum::<u64>();
            }
            (_, w) => {
                let (pair_base, counts) = miner.pair_counts(a0, rows)?;
                match w {
                    Some(w) => miner.emit(a0, &pair_base, &counts, w)?,
                    None => counted += counts.iter().map(|&c| u64::from(c)).sum::<u64>(),
                }
            }
        }
        report.add((rows * m) as u64);
        if writer.as_ref().is_some_and(|w| w.stopped()) {
            break;
        }
    }
    Ok(counted)
}
