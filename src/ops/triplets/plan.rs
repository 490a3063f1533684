//! Planning a mining call on the device: the sizes of every buffer of an anchor chunk, the
//! chunk that fits the budget, and the cost model that picks how margin rules count. Pure
//! arithmetic on class sizes and adapter limits, unit-tested on the CPU.

use super::{list_sizes, CountMethod, Problem, TripletRule, OP};
use crate::context::plan::{plan_rows, DeviceCaps, Footprint, Plan};
use crate::data::device_rows::{max_page_rows, rows_bytes};
use crate::data::inputs::{self, Embeddings};
use crate::error::{Error, Result};
use crate::kernels::distance_tile;
use crate::kernels::negative_buckets;
use crate::kernels::triplet_expand;
use crate::kernels::triplet_lists;
use crate::kernels::triplet_select;
use crate::ops::distance::gpu::distance_rows_buffers;
use crate::runtime::transfer::{self, f32s, uniform_size};

/// Sizes of every buffer one anchor chunk uses; the plan's footprint and the allocations both
/// come from here, so the plan counts exactly what is allocated.
#[derive(Debug, Clone, Copy)]
pub(super) struct Layout {
    pub(super) anchors: usize,
    pub(super) refs: usize,
    /// `vec4`s per embedding row; 0 for label-only rules (no distances).
    pub(super) dim4: usize,
    /// Pages of resident reference rows (one distance tile each).
    pub(super) pages: usize,
    /// Margin rule: per-pair counts on the device.
    pub(super) counts: bool,
    /// Counts and emits through `negative_buckets` ([`groups_negatives`]): the call's most
    /// positives per anchor, else `None`.
    pub(super) grouped: Option<usize>,
    /// Negatives per output window of `emit`; 0 when the device emits nothing.
    pub(super) out: usize,
    /// Every valid triplet, collected or streamed: both lists are read back.
    pub(super) host_lists: bool,
    /// The triplets are written on the device (`triplet_expand`, `out` rows per window)
    /// into the call's result, not read back.
    pub(super) device: bool,
}

/// `size` if `used`, else a 4-byte placeholder (a binding must have a buffer behind it).
fn or_dummy(used: bool, size: u64) -> u64 {
    if used {
        size
    } else {
        f32s(0)
    }
}

impl Layout {
    pub(super) fn matrix(&self) -> u64 {
        f32s(self.anchors * self.refs)
    }
    pub(super) fn pair_counts(&self) -> u64 {
        or_dummy(self.counts, self.matrix())
    }
    /// Row length of the sorted positive values (0 when not grouping).
    pub(super) fn sort_width(&self) -> usize {
        self.grouped.map_or(0, negative_buckets::width)
    }
    pub(super) fn sorted(&self) -> u64 {
        or_dummy(
            self.grouped.is_some(),
            f32s(self.anchors * self.sort_width()),
        )
    }
    pub(super) fn buckets(&self) -> u64 {
        let stride = self.grouped.map_or(0, negative_buckets::stride);
        or_dummy(self.grouped.is_some(), f32s(self.anchors * stride))
    }
    pub(super) fn order(&self) -> u64 {
        or_dummy(self.grouped.is_some(), self.matrix())
    }
    /// Each negative's bucket while grouping, then the emit's per-pair bitmaps.
    pub(super) fn scratch(&self) -> u64 {
        self.order()
    }
    /// Pairs one emit dispatch may cover: as many bitmaps as `scratch` holds.
    pub(super) fn bitmap_pairs(&self) -> usize {
        self.anchors * self.refs / negative_buckets::bitmap_words(self.refs)
    }
    /// Uniform buffers of the grouping: one per bitonic pass of the positive sort.
    pub(super) fn sort_params(&self) -> usize {
        negative_buckets::passes(self.sort_width()).len()
    }
    /// Reads back the pair counts, the positives (when emitting), or both lists.
    pub(super) fn staging(&self) -> u64 {
        match (self.host_lists, self.counts) {
            (true, _) => 2 * self.matrix(),
            (false, true) => self.matrix(),
            (false, false) => f32s(0),
        }
    }
    pub(super) fn offsets(&self) -> u64 {
        // One `vec2<u32>` per pair and one past the last; at least one, since the shader's
        // element is 8 bytes.
        transfer::buffer_size(
            8 * if self.out > 0 && self.counts {
                self.anchors * self.refs + 1
            } else {
                1
            } as u64,
        )
    }
    /// The negatives a margin rule's emit writes per window.
    pub(super) fn out(&self) -> u64 {
        or_dummy(self.counts, f32s(self.out))
    }
    /// Reads the emitted negatives back (not when writing on the device).
    pub(super) fn out_staging(&self) -> u64 {
        or_dummy(!self.device, f32s(self.out))
    }
    /// Device output: a window's segment starts (one past the last too), heads
    /// (`(anchor, positive)`, 8 bytes) and sources; a window has at most `out` segments, since
    /// none is empty.
    pub(super) fn segments(&self) -> [u64; 3] {
        [
            or_dummy(self.device, f32s(self.out + 1)),
            or_dummy(self.device, f32s(2 * self.out)),
            or_dummy(self.device, f32s(self.out)),
        ]
    }
    /// Device output: the expansion's uniform block.
    pub(super) fn expand_params(&self) -> u64 {
        or_dummy(self.device, uniform_size::<triplet_expand::Params>())
    }
    /// Device output: a window's `(out, 3)` triplet rows before they are copied into the result.
    pub(super) fn expanded(&self) -> u64 {
        or_dummy(self.device, f32s(3 * self.out))
    }

    pub(super) fn footprint(&self) -> Footprint {
        // The resident reference rows were allocated before planning; not counted here.
        let mut buffers = vec![
            uniform_size::<triplet_lists::Params>(),
            uniform_size::<triplet_select::Params>(),
            uniform_size::<negative_buckets::Params>(),
            f32s(self.refs),    // ref labels
            f32s(self.anchors), // anchor labels
            f32s(self.anchors), // self slots
            self.matrix(),      // positives
            self.matrix(),      // negatives
            self.pair_counts(),
            self.sorted(),
            self.buckets(),
            self.order(),
            self.scratch(),
            self.staging(),
            f32s(2 * self.anchors), // list counts
            f32s(2 * self.anchors), // list-count staging
            f32s(self.anchors + 1), // pair base
            self.offsets(),
            self.out(),
            self.out_staging(),
            self.expand_params(),
            self.expanded(),
        ];
        buffers.extend(self.segments());
        buffers.extend(std::iter::repeat_n(
            uniform_size::<negative_buckets::Params>(),
            self.sort_params(),
        ));
        if self.dim4 > 0 {
            buffers.extend(distance_rows_buffers(
                self.anchors,
                self.refs,
                self.dim4,
                self.pages,
            ));
        }
        Footprint {
            bytes: buffers.iter().sum(),
            largest_buffer: buffers.iter().copied().max().unwrap_or(0),
            // triplet_lists runs one workgroup per anchor (tiles need fewer); the grouping
            // folds anchors × (sort width or negatives) invocations into a 2-D grid, whose
            // side is the square root.
            workgroups: (self.anchors as u64).max(if self.grouped.is_some() {
                let groups = (self.anchors * self.sort_width().max(self.refs)) as u64;
                groups.div_ceil(negative_buckets::WORKGROUP_SIZE).isqrt() + 1
            } else {
                0
            }),
            workgroup_storage: distance_tile::WORKGROUP_STORAGE
                .max(triplet_select::WORKGROUP_STORAGE)
                .max(if self.grouped.is_some() {
                    negative_buckets::WORKGROUP_STORAGE
                } else {
                    0
                }),
        }
    }
}

/// Anchors per chunk and negatives per output window: windows as large as asked (halved down
/// to one pair's worst case, `m`, if needed), then as many anchors as fit beside them.
/// `refs`: `(dim4, pages)` of the resident reference rows, if the rule reads distances.
fn plan_layout(
    problem: &Problem<'_>,
    refs: Option<(usize, usize)>,
    emit: bool,
    device: bool,
    budget: u64,
    caps: &DeviceCaps,
) -> Result<Layout> {
    let (b, m) = (problem.set.labels.len(), problem.set.ref_labels.len());
    let margin = matches!(problem.rule, TripletRule::Margin { .. });
    let base = Layout {
        anchors: 1,
        refs: m,
        dim4: refs.map_or(0, |r| r.0),
        pages: refs.map_or(0, |r| r.1),
        counts: margin,
        // A call writing on the device counts with the kernel its writing pass uses (a count
        // by the other kernel could differ in rounding from what it then writes).
        grouped: groups_negatives(problem, emit || device),
        out: 0,
        host_lists: emit && !margin && !device,
        device: emit && device,
    };
    // Windows of output: a margin rule's emitted negatives, or the rows written on the
    // device; at least one pair's worst case, `m`.
    let windows = emit && (margin || device);
    let min_out = if windows { m } else { 0 };
    let mut out = if windows { problem.chunk } else { 0 };
    loop {
        let cost = |anchors| {
            Layout {
                anchors,
                out,
                ..base
            }
            .footprint()
        };
        match plan_rows(OP, b, m, budget, caps, cost) {
            Ok(p) => {
                return Ok(Layout {
                    anchors: p.rows,
                    out,
                    ..base
                })
            }
            Err(_) if out > min_out => out = (out / 2).max(min_out),
            Err(e) => return Err(e),
        }
    }
}

/// Costs in scan checks (one (pair, negative) test of `triplet_select`), measured on lavapipe
/// at (128, 4096) and (1000, 1000), 100 classes: a scan pair also pays its workgroup's
/// reduction (`SCAN_PAIR`); grouping pays per compare-exchange of the positive sort
/// (`SORT_OP`), per negative (`NEGATIVE`, plus two binary-search steps per doubling of the
/// positives), and about a dozen dispatches per chunk (`GROUPING_DISPATCHES`, ~50 µs each).
const SCAN_PAIR: u64 = 600;
const SORT_OP: u64 = 7;
const NEGATIVE: u64 = 4;
const GROUPING_DISPATCHES: u64 = 12 * 8_000;

/// The call's most positives per anchor if a margin rule groups the negatives
/// (`negative_buckets`) rather than testing every (pair, negative): decided once per call
/// from the class sizes by the cost model above, counting the emit's second scan (or its
/// bitmap pass) when `emit`. Anything but one or two positives per anchor favours grouping.
pub(super) fn groups_negatives(problem: &Problem<'_>, emit: bool) -> Option<usize> {
    if !matches!(problem.rule, TripletRule::Margin { .. }) {
        return None;
    }
    let (mut scan, mut pairs, mut negatives, mut bitmaps) = (0, 0, 0, 0);
    let (mut most_pos, mut most_neg) = (0, 0);
    for (p, n) in list_sizes(&problem.set) {
        scan += p * (n + SCAN_PAIR) + if emit { p * n } else { 0 };
        pairs += p;
        negatives += n;
        bitmaps += if emit { p * n.div_ceil(32) * 2 } else { 0 };
        most_pos = most_pos.max(p);
        most_neg = most_neg.max(n);
    }
    let grouped = match problem.count_method {
        CountMethod::Scan => false,
        CountMethod::Sorted => true,
        CountMethod::Auto => {
            let width = negative_buckets::width(most_pos as usize) as u64;
            let log = |x: u64| u64::from(x.max(2).ilog2()) + 1;
            let anchors = problem.set.labels.len() as u64;
            let sort = anchors * width / 2 * (log(width) * (log(width) - 1) / 2) * SORT_OP;
            let per_negative = negatives * (NEGATIVE + 2 * log(width));
            let per_pair = pairs * 4 * log(most_neg);
            sort + per_negative + per_pair + bitmaps + GROUPING_DISPATCHES <= scan
        }
    };
    grouped.then_some(most_pos as usize)
}

/// The device plan of one mining call: the chunk layout and the bytes of the host references
/// uploaded for the call (resident beside the chunks).
pub(super) struct CallPlan {
    pub(super) layout: Layout,
    pub(super) upload: u64,
    /// Bytes of the smallest chunk (one anchor), with the upload.
    pub(super) min_bytes: u64,
}

impl CallPlan {
    pub(super) fn public(&self, b: usize) -> Plan {
        Plan {
            path: crate::context::ComputePath::Wgpu,
            rows: self.layout.anchors,
            cols: self.layout.refs,
            chunks: b.div_ceil(self.layout.anchors.max(1)),
            bytes: self.layout.footprint().bytes + self.upload,
            min_bytes: self.min_bytes,
        }
    }
}

/// Plans a call under `available` bytes, its triplets read back or (`device`) written on the
/// device: host references are uploaded once, before the chunks, which get what is left; the
/// plan is checked first, so a budget too small for both allocates nothing.
pub(super) fn plan_call(
    problem: &Problem<'_>,
    emit: bool,
    device: bool,
    available: u64,
    caps: &DeviceCaps,
) -> Result<CallPlan> {
    let m = problem.set.ref_labels.len();
    let (refs, upload) = match problem.set.refs {
        None => (None, 0),
        Some(Embeddings::Host(r)) => {
            let dim4 = r.ncols().div_ceil(4);
            let page_rows = max_page_rows(OP, caps, dim4)?;
            (
                Some((dim4, m.div_ceil(page_rows))),
                rows_bytes(m, dim4, page_rows),
            )
        }
        Some(Embeddings::Bank(bank)) => {
            let rows = bank.view.rows;
            (Some((rows.dim4(), rows.pages_for(m))), 0)
        }
        Some(Embeddings::Device(_)) => return Err(inputs::unimported(OP)),
    };
    let layout = plan_layout(
        problem,
        refs,
        emit,
        device,
        available.saturating_sub(upload),
        caps,
    )
    .map_err(|e| match e {
        Error::OverBudget { op, required, .. } if upload > 0 => Error::OverBudget {
            op,
            required: required + upload,
            budget: available,
        },
        other => other,
    })?;
    let smallest = Layout {
        anchors: 1,
        out: if emit && (layout.counts || layout.device) {
            m
        } else {
            0
        },
        ..layout
    };
    Ok(CallPlan {
        layout,
        upload,
        min_bytes: smallest.footprint().bytes + upload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::inputs::{Labelled, NO_SLOT};
    use crate::metric::DistanceConfig;

    /// A label-only problem: `b` anchors and `m` references in `classes` classes.
    fn problem(
        b: usize,
        m: usize,
        classes: u32,
        rule: TripletRule,
        method: CountMethod,
    ) -> Problem<'static> {
        Problem {
            set: Labelled {
                labels: (0..b as u32).map(|i| i % classes).collect(),
                ref_labels: (0..m as u32).map(|i| i % classes).collect(),
                self_slots: vec![NO_SLOT; b],
                queries: None,
                refs: None,
                imported: Default::default(),
            },
            rule,
            distance: DistanceConfig::default(),
            chunk: 1 << 22,
            count_method: method,
        }
    }

    fn caps() -> DeviceCaps {
        DeviceCaps::from_limits(&wgpu::Limits::default())
    }

    #[test]
    fn the_chunk_fits_the_budget_and_is_maximal() {
        let p = problem(1000, 1000, 10, TripletRule::AllValid, CountMethod::Auto);
        let budget = 8 << 20;
        let plan = plan_call(&p, true, false, budget, &caps()).expect("fits");
        let l = plan.layout;
        assert!(
            l.footprint().bytes <= budget,
            "within the budget: {}",
            l.footprint().bytes
        );
        let bigger = Layout {
            anchors: l.anchors + 1,
            ..l
        };
        assert!(
            bigger.footprint().bytes > budget,
            "one more anchor would not fit"
        );
        assert!(plan.min_bytes <= l.footprint().bytes);
    }

    #[test]
    fn a_budget_below_one_anchor_is_over_budget_naming_its_bytes() {
        let p = problem(100, 100_000, 10, TripletRule::AllValid, CountMethod::Auto);
        match plan_call(&p, true, false, 1 << 10, &caps()) {
            Err(Error::OverBudget {
                required, budget, ..
            }) => {
                assert_eq!(budget, 1 << 10);
                assert!(required > 1 << 10, "{required}");
            }
            other => panic!(
                "expected OverBudget, got {:?}",
                other.map(|p| p.layout.anchors)
            ),
        }
    }

    #[test]
    fn grouping_is_chosen_unless_anchors_have_one_or_two_positives() {
        let margin = TripletRule::margin_miner(super::super::TripletType::Semihard);
        // 1000 references in 10 classes: ~100 positives per anchor.
        let many = problem(128, 1000, 10, margin, CountMethod::Auto);
        assert!(
            groups_negatives(&many, true).is_some(),
            "many positives: group"
        );
        // Every class has two members: one positive per anchor.
        let pairs = problem(128, 256, 128, margin, CountMethod::Auto);
        assert!(
            groups_negatives(&pairs, true).is_none(),
            "one positive: scan"
        );
        let forced = problem(128, 256, 128, margin, CountMethod::Sorted);
        assert!(
            groups_negatives(&forced, true).is_some(),
            "Sorted forces grouping"
        );
        let all = problem(128, 1000, 10, TripletRule::AllValid, CountMethod::Sorted);
        assert!(
            groups_negatives(&all, true).is_none(),
            "label-only rules never group"
        );
    }
}
