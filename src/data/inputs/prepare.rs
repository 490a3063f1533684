//! The checking pipeline every operation runs its inputs through: each side's shape and
//! finiteness, the labels, the self-exclusion rule, and device rows imported under the budget.

use std::collections::HashMap;
use std::hash::Hash;

use ndarray::{Array2, ArrayView1, ArrayView2, CowArray, Ix2};

use crate::context::oom_retry;
use crate::context::Context;
use crate::data::device_embeddings::DeviceEmbeddings;
pub(crate) use crate::data::device_rows::Rows;
use crate::data::device_rows::{DeviceRows, RowsView};
use crate::error::{Error, Result};
use crate::kernels::knn_select::EMPTY_INDEX;
use crate::runtime::device::GpuDevice;
use crate::runtime::memory::Transfers;
use crate::runtime::transfer;
use crate::validate;

use super::{BankRows, Embeddings, MiningSet, SelfExclusion};

/// Most rows of either side: indices are `u32`, and the kernels reserve the two largest
/// values as markers (no slot, empty list entry).
pub(crate) const MAX_ROWS: usize = EMPTY_INDEX as usize - 1;

/// Per-query value meaning "no reference is this query".
pub(crate) const NO_SLOT: u32 = u32::MAX;

/// Resolves `rule` for `q` queries against `m` references (`refs_are_queries`: the call was
/// given no references, so `m = q`): per query, the reference index it may not use, or
/// [`NO_SLOT`]. The one place where self-exclusion is checked.
pub(crate) fn self_slots(
    op: &'static str,
    rule: &SelfExclusion,
    q: usize,
    m: usize,
    refs_are_queries: bool,
) -> Result<Vec<u32>> {
    let rule = match rule {
        SelfExclusion::Auto if refs_are_queries => &SelfExclusion::SameIndex,
        SelfExclusion::Auto => &SelfExclusion::None,
        other => other,
    };
    match rule {
        SelfExclusion::Auto | SelfExclusion::None => Ok(vec![NO_SLOT; q]),
        SelfExclusion::SameIndex if m < q => Err(Error::Shape {
            op,
            what: "refs",
            expected: format!(
                "at least {q} rows: SelfExclusion::SameIndex makes reference i query i"
            ),
            got: vec![m],
        }),
        // Both sides are at most MAX_ROWS rows (checked first), so indices fit a u32.
        SelfExclusion::SameIndex => Ok((0..q as u32).collect()),
        SelfExclusion::QuerySlots(slots) if slots.len() != q => Err(Error::Shape {
            op,
            what: "self_exclusion",
            expected: format!("({q},): one slot per query"),
            got: vec![slots.len()],
        }),
        SelfExclusion::QuerySlots(slots) => match slots.iter().find(|&&s| s as usize >= m) {
            Some(bad) => Err(Error::InvalidParameter {
                op,
                what: "self_exclusion",
                value: bad.to_string(),
                rule: "every slot must index the references (below their number of rows)",
            }),
            None => Ok(slots.clone()),
        },
    }
}

/// Which side of a call an input is on; names the inputs in errors the same way everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Queries,
    References,
    /// A batch entering a memory bank: host rows, like queries.
    Batch,
    /// The points of an operation without references (k-means).
    Points,
}

impl Side {
    pub(crate) fn embeddings(self) -> &'static str {
        match self {
            Side::Queries => "queries",
            Side::References => "refs",
            Side::Batch => "embeddings",
            Side::Points => "points",
        }
    }

    fn labels(self) -> &'static str {
        match self {
            Side::Queries | Side::Batch | Side::Points => "labels",
            Side::References => "ref_labels",
        }
    }
}

/// Checks one side's embeddings: `d ≥ 1` and finite for host arrays; a bank only with the
/// context that holds it, and not as a batch to enqueue; a device buffer only on a wgpu
/// context, with its extent inside the buffer (its values are checked as it is imported); at
/// most [`MAX_ROWS`] rows. Returns `(n, d)`.
pub(crate) fn check_embeddings(
    op: &'static str,
    ctx: &Context,
    side: Side,
    x: &Embeddings<'_>,
) -> Result<(usize, usize)> {
    let what = side.embeddings();
    match (x, side) {
        (Embeddings::Host(x), _) => validate::embeddings(op, what, *x)?,
        (Embeddings::Bank(_), Side::Batch) => {
            return Err(Error::InvalidParameter {
                op,
                what,
                value: "Embeddings::Bank".into(),
                rule: "a memory bank's rows cannot be enqueued; pass host or device rows",
            })
        }
        // Bank rows were validated as they were enqueued.
        (Embeddings::Bank(bank), _) => match ctx.gpu() {
            Some(gpu) if bank.view.rows.is_on(gpu) => {}
            _ => return Err(foreign_bank(op, ctx.device_name())),
        },
        (Embeddings::Device(x), _) => check_device(op, ctx, what, x)?,
    }
    let (n, d) = x.dim();
    if n > MAX_ROWS {
        return Err(Error::InvalidParameter {
            op,
            what,
            value: n.to_string(),
            rule: "at most 4 294 967 293 rows (indices are u32)",
        });
    }
    Ok((n, d))
}

/// What can be checked of embeddings in a device buffer before touching the device.
fn check_device(
    op: &'static str,
    ctx: &Context,
    what: &'static str,
    x: &DeviceEmbeddings<'_>,
) -> Result<()> {
    let invalid = |rule: &'static str, value: String| Error::InvalidParameter {
        op,
        what,
        value,
        rule,
    };
    if ctx.gpu().is_none() {
        return Err(invalid(
            "embeddings in a wgpu::Buffer need a wgpu context on the buffer's device",
            format!("a buffer on {}", ctx.device_name()),
        ));
    }
    let (rows, cols) = x.dim();
    if cols == 0 {
        return Err(Error::Shape {
            op,
            what,
            expected: "(n, d) with d >= 1".into(),
            got: vec![rows, cols],
        });
    }
    if x.row_stride() < cols {
        return Err(invalid(
            "the row stride must be at least the number of columns",
            format!("row stride {} for {cols} columns", x.row_stride()),
        ));
    }
    if !x.offset().is_multiple_of(4) {
        return Err(invalid(
            "the offset must be a multiple of 4 bytes",
            format!("offset {}", x.offset()),
        ));
    }
    if !x.buffer().usage().contains(wgpu::BufferUsages::COPY_SRC) {
        return Err(invalid(
            "the buffer needs COPY_SRC usage",
            format!("{:?}", x.buffer().usage()),
        ));
    }
    let size = x.buffer().size();
    match x.extent().and_then(|e| e.checked_add(x.offset())) {
        Some(end) if end <= size => Ok(()),
        _ => Err(invalid(
            "the rows must lie inside the buffer",
            format!(
                "({rows}, {cols}) rows {} floats apart from byte {} of a {size}-byte buffer",
                x.row_stride(),
                x.offset()
            ),
        )),
    }
}

/// `e` (validated, imported) as the rows the kernels read.
fn rows_of<'a>(op: &'static str, e: Embeddings<'a>) -> Result<Rows<'a>> {
    match e {
        Embeddings::Host(x) => Ok(Rows::Host(x)),
        Embeddings::Bank(b) => Ok(Rows::Resident(b.view)),
        Embeddings::Device(_) => Err(unimported(op)),
    }
}

/// Validates the one side of an operation without references (k-means' points), runs the
/// operation's own rules on its row count (`check(n)`, before any device work), then imports a
/// device buffer into `imports`.
pub(crate) fn prepare_rows<'a>(
    op: &'static str,
    ctx: &Context,
    x: Embeddings<'a>,
    check: impl FnOnce(usize) -> Result<()>,
    imports: &'a mut Imports,
) -> Result<Rows<'a>> {
    let (n, _) = check_embeddings(op, ctx, Side::Points, &x)?;
    check(n)?;
    match imports.resolve(op, ctx, Some(x), None)? {
        (Some(x), _) => rows_of(op, x),
        (None, _) => Err(unimported(op)),
    }
}

/// Rows as [`Embeddings`] again (for code written for the reference side).
pub(crate) fn embeddings_of(rows: Rows<'_>) -> Embeddings<'_> {
    match rows {
        Rows::Host(x) => Embeddings::Host(x),
        Rows::Resident(view) => Embeddings::Bank(BankRows { view }),
    }
}

/// The error for device-buffer embeddings that reached the kernels without being imported.
pub(crate) fn unimported(op: &'static str) -> Error {
    Error::Internal {
        op,
        message: "device-buffer embeddings were not imported".into(),
    }
}

/// `rows` as a host array: host rows as they are, rows resident on the context's device (a
/// bank's, or imported from a buffer) read back (the losses and k-means compute on the host).
pub(crate) fn host_rows<'a>(
    op: &'static str,
    ctx: &Context,
    rows: Rows<'a>,
) -> Result<CowArray<'a, f32, Ix2>> {
    match rows {
        Rows::Host(x) => Ok(CowArray::from(x)),
        Rows::Resident(view) => read_resident(op, ctx, view).map(CowArray::from),
    }
}

/// The reference side as a host array, as [`host_rows`].
pub(crate) fn host_refs<'a>(
    op: &'static str,
    ctx: &Context,
    refs: Embeddings<'a>,
) -> Result<CowArray<'a, f32, Ix2>> {
    match refs {
        Embeddings::Host(x) => Ok(CowArray::from(x)),
        Embeddings::Bank(bank) => read_resident(op, ctx, bank.view).map(CowArray::from),
        Embeddings::Device(_) => Err(unimported(op)),
    }
}

fn read_resident(op: &'static str, ctx: &Context, view: RowsView<'_>) -> Result<Array2<f32>> {
    let gpu = ctx.gpu().ok_or_else(|| Error::Internal {
        op,
        message: "device-resident rows with a native context".into(),
    })?;
    gpu.settled(view.rows.read(gpu, view.len))
}

/// Device-buffer embeddings imported for one call: their rows in the kernels' layout, alive
/// as long as the call. For a plan, the same rows unallocated (their shape only), with the
/// planning budget lowered by the bytes the import would take.
pub(crate) struct Imports {
    plan: bool,
    queries: Option<DeviceRows>,
    refs: Option<DeviceRows>,
    /// Bytes the imported rows hold for the call (or would, for a plan).
    bytes: u64,
    /// Most bytes held while importing (rows imported before included).
    transient: u64,
    _cap: Option<oom_retry::CapGuard>,
}

impl Imports {
    /// For a call: device buffers are imported.
    pub(crate) fn call() -> Self {
        Self {
            plan: false,
            queries: None,
            refs: None,
            bytes: 0,
            transient: 0,
            _cap: None,
        }
    }

    /// For a plan: nothing is allocated.
    pub(crate) fn plan() -> Self {
        Self {
            plan: true,
            ..Self::call()
        }
    }

    /// `(held, transient)` bytes: see [`crate::context::plan::Plan::with_imports`].
    pub(crate) fn footprint(&self) -> (u64, u64) {
        (self.bytes, self.transient)
    }

    /// Imports (or, for a plan, sizes) the device-buffer sides among `queries` and `refs`
    /// (validated) and returns both sides with those as resident rows.
    fn resolve<'a>(
        &'a mut self,
        op: &'static str,
        ctx: &Context,
        queries: Option<Embeddings<'a>>,
        refs: Option<Embeddings<'a>>,
    ) -> Result<(Option<Embeddings<'a>>, Option<Embeddings<'a>>)> {
        // The same rows on both sides (`knn(x, x)`) are imported once.
        let shared = matches!((&queries, &refs),
            (Some(Embeddings::Device(q)), Some(Embeddings::Device(r))) if q == r);
        let sides = [(queries, Side::Queries), (refs, Side::References)];
        for (e, side) in sides.iter().take(if shared { 1 } else { 2 }) {
            let (Some(Embeddings::Device(x)), Some(gpu)) = (e, ctx.gpu()) else {
                continue;
            };
            let rows = if self.plan {
                DeviceRows::unallocated(op, gpu, x.dim())?
            } else {
                DeviceRows::import(gpu, op, side.embeddings(), x)?
            };
            let (held, transient) = rows.import_bytes();
            self.transient = self.transient.max(self.bytes + held + transient);
            self.bytes += held;
            match side {
                Side::Queries => self.queries = Some(rows),
                _ => self.refs = Some(rows),
            }
        }
        if self.plan && self.bytes > 0 {
            // The call plans its tiles with the imported rows allocated; so does the plan.
            let available = oom_retry::planning_budget(ctx);
            let needed = self.transient.max(self.bytes);
            let Some(left) = available
                .checked_sub(self.bytes)
                .filter(|_| needed <= available)
            else {
                return Err(Error::BudgetExceeded {
                    label: "device embeddings (imported)",
                    requested: needed,
                    in_use: ctx.memory().current_bytes,
                    budget: ctx.memory().budget_bytes,
                });
            };
            self._cap = Some(oom_retry::CapGuard::new(left));
        }
        let this: &'a Imports = self;
        let resident = |e: Option<Embeddings<'a>>, slot: &'a Option<DeviceRows>| match (e, slot) {
            (Some(Embeddings::Device(x)), Some(rows)) => Some(Embeddings::Bank(BankRows {
                view: RowsView {
                    rows,
                    len: x.dim().0,
                },
            })),
            (e, _) => e,
        };
        let [(queries, _), (refs, _)] = sides;
        let ref_rows = if shared { &this.queries } else { &this.refs };
        Ok((resident(queries, &this.queries), resident(refs, ref_rows)))
    }
}

/// The error for a memory bank used with another context than its own.
pub(crate) fn foreign_bank(op: &'static str, device: String) -> Error {
    Error::InvalidParameter {
        op,
        what: "context",
        value: device,
        rule: "a memory bank can only be used with the context that created it",
    }
}

/// `refs` must have the queries' `d`.
fn same_dim(op: &'static str, d: usize, (m, rd): (usize, usize)) -> Result<()> {
    if rd != d {
        return Err(Error::Shape {
            op,
            what: "refs",
            expected: format!("(m, {d}) to match the queries"),
            got: vec![m, rd],
        });
    }
    Ok(())
}

/// Validated inputs of an unlabelled operation (kNN, distances): queries and references where
/// the kernels read them, and each query's excluded reference ([`NO_SLOT`]: none).
pub(crate) struct Pair<'a> {
    pub(crate) queries: Rows<'a>,
    /// Host rows or resident rows ([`Embeddings::Bank`]), never a device buffer.
    pub(crate) refs: Embeddings<'a>,
    pub(crate) excluded: Vec<u32>,
}

/// Validates an unlabelled call: both sides' embeddings, equal `d`, `self_exclusion` (`None`
/// for operations without one), then the operation's own rules (`check(n, excluded)`, before
/// any device work); then imports device-buffer sides into `imports`.
pub(crate) fn prepare_pair<'a>(
    op: &'static str,
    ctx: &Context,
    (queries, refs): (Embeddings<'a>, Embeddings<'a>),
    self_exclusion: Option<&SelfExclusion>,
    check: impl FnOnce(usize, &[u32]) -> Result<()>,
    imports: &'a mut Imports,
) -> Result<Pair<'a>> {
    let (q, d) = check_embeddings(op, ctx, Side::Queries, &queries)?;
    let shape = check_embeddings(op, ctx, Side::References, &refs)?;
    same_dim(op, d, shape)?;
    let excluded = match self_exclusion {
        Some(rule) => self_slots(op, rule, q, shape.0, false)?,
        None => vec![NO_SLOT; q],
    };
    check(shape.0, &excluded)?;
    let (Some(queries), Some(refs)) = imports.resolve(op, ctx, Some(queries), Some(refs))? else {
        return Err(unimported(op));
    };
    Ok(Pair {
        queries: rows_of(op, queries)?,
        refs,
        excluded,
    })
}

/// Validated inputs of a label-based operation: labels as dense `u32` ids, self-exclusion as
/// explicit slots, and the embeddings when the operation needs them.
pub(crate) struct Labelled<'a> {
    pub(crate) labels: Vec<u32>,
    pub(crate) ref_labels: Vec<u32>,
    /// Per query, the reference slot never to use as its positive or neighbour ([`NO_SLOT`]:
    /// none).
    pub(crate) self_slots: Vec<u32>,
    /// Query embeddings, when the operation needs them.
    pub(crate) queries: Option<Rows<'a>>,
    /// Reference embeddings, when the operation needs them: host or resident rows
    /// ([`Embeddings::Bank`]), never a device buffer.
    pub(crate) refs: Option<Embeddings<'a>>,
    /// Host–device traffic of importing device-buffer embeddings (part of the call's).
    pub(crate) imported: Transfers,
}

impl<'a> Labelled<'a> {
    /// The reference embeddings as a host array. Bank rows only exist on a device, and
    /// [`prepare`] lets them through only for a context on that device, so the host paths
    /// never see them; this is the typed error if one ever did.
    pub(crate) fn host_refs(&self, op: &'static str) -> Result<Option<ArrayView2<'a, f32>>> {
        match self.refs {
            None => Ok(None),
            Some(Embeddings::Host(r)) => Ok(Some(r)),
            Some(Embeddings::Bank(_) | Embeddings::Device(_)) => Err(Error::Internal {
                op,
                message: "device-resident rows reached the native path".into(),
            }),
        }
    }

    /// The references labelled `label` and those labelled otherwise, ascending, into the given
    /// vectors (cleared first): an anchor's lists before its own slot is left out, which
    /// anchors of one label share.
    pub(crate) fn label_lists(&self, label: u32, same: &mut Vec<u32>, others: &mut Vec<u32>) {
        same.clear();
        others.clear();
        for (r, &other) in self.ref_labels.iter().enumerate() {
            match other == label {
                true => same.push(r as u32),
                false => others.push(r as u32),
            }
        }
    }

    /// Anchor `a`'s ascending positive references (same label, not its own slot) and negative
    /// references (other label), into the given vectors (cleared first, reused by callers).
    /// The host twin of `shaders/triplet_lists.wgsl`, shared by the native path and the miners.
    pub(crate) fn lists_of(&self, a: usize, positives: &mut Vec<u32>, negatives: &mut Vec<u32>) {
        let me = self.self_slots[a];
        self.label_lists(self.labels[a], positives, negatives);
        positives.retain(|&r| r != me);
    }
}

/// Dense `u32` ids of both sides' labels, in order of first appearance.
fn dense_labels<L: Hash + Eq + Copy>(
    labels: ArrayView1<'_, L>,
    refs: ArrayView1<'_, L>,
) -> (Vec<u32>, Vec<u32>) {
    let mut ids: HashMap<L, u32> = HashMap::new();
    let mut id = |l: &L| {
        let next = ids.len() as u32;
        *ids.entry(*l).or_insert(next)
    };
    let a: Vec<u32> = labels.iter().map(&mut id).collect();
    let r: Vec<u32> = refs.iter().map(&mut id).collect();
    (a, r)
}

/// Checks one labelled side: its embeddings (when present) and one label per row.
fn check_set<L>(
    op: &'static str,
    ctx: &Context,
    side: Side,
    set: &MiningSet<'_, L>,
) -> Result<Option<(usize, usize)>> {
    let shape = match &set.embeddings {
        None => None,
        Some(e) => Some(check_embeddings(op, ctx, side, e)?),
    };
    let rows = shape.map_or(set.labels.len(), |s| s.0);
    if set.labels.len() != rows {
        return Err(Error::Shape {
            op,
            what: side.labels(),
            expected: format!("({rows},) to match {}", side.embeddings()),
            got: set.labels.shape().to_vec(),
        });
    }
    if rows > MAX_ROWS {
        return Err(Error::InvalidParameter {
            op,
            what: side.labels(),
            value: rows.to_string(),
            rule: "at most 4 294 967 293 rows (indices are u32)",
        });
    }
    Ok(shape)
}

/// Validates a label-based call: both sides, equal `d`, embeddings where `needs_embeddings`,
/// `self_exclusion`, then the operation's own rules on the labels (`check`, before any device
/// work, which returns whether the call needs its embeddings after all); then imports
/// device-buffer sides into `imports`. Without `refs` the references are the queries.
#[allow(
    clippy::too_many_arguments,
    reason = "one validation for every label-based operation; the arguments are its inputs"
)]
pub(crate) fn prepare<'s, L: Hash + Eq + Copy>(
    op: &'static str,
    ctx: &Context,
    queries: &'s MiningSet<'_, L>,
    refs: Option<&'s MiningSet<'_, L>>,
    self_exclusion: &SelfExclusion,
    needs_embeddings: bool,
    check: impl FnOnce(&Labelled<'_>) -> Result<bool>,
    imports: &'s mut Imports,
) -> Result<Labelled<'s>> {
    // One lifetime for both sides from here on (array views are invariant in theirs).
    let queries = queries.reborrow();
    let refs = refs.map(MiningSet::reborrow);
    let query_shape = check_set(op, ctx, Side::Queries, &queries)?;
    let ref_shape = match &refs {
        Some(r) => check_set(op, ctx, Side::References, r)?,
        None => query_shape,
    };
    let ref_set = refs.as_ref().unwrap_or(&queries);
    if needs_embeddings {
        let missing = if query_shape.is_none() {
            Some(Side::Queries)
        } else if ref_shape.is_none() {
            Some(Side::References)
        } else {
            None
        };
        if let Some(side) = missing {
            return Err(Error::InvalidParameter {
                op,
                what: side.embeddings(),
                value: "None".into(),
                rule: "this operation compares distances and needs embeddings",
            });
        }
    }
    if let (Some((_, d)), Some(shape)) = (query_shape, ref_shape) {
        same_dim(op, d, shape)?;
    }
    let (b, m) = (queries.labels.len(), ref_set.labels.len());
    let self_slots = self_slots(op, self_exclusion, b, m, refs.is_none())?;
    let (labels, ref_labels) = dense_labels(queries.labels, ref_set.labels);
    let mut set = Labelled {
        labels,
        ref_labels,
        self_slots,
        queries: None,
        refs: None,
        imported: Transfers::default(),
    };
    if !check(&set)? || !needs_embeddings {
        return Ok(set);
    }
    // The references are the queries when not given: one import serves both.
    let (resolved, imported) = transfer::measure(|| match refs {
        Some(r) => imports.resolve(op, ctx, queries.embeddings, r.embeddings),
        None => {
            let (q, _) = imports.resolve(op, ctx, queries.embeddings, None)?;
            Ok((q, q))
        }
    });
    let (query_rows, ref_rows) = resolved?;
    set.queries = query_rows.map(|q| rows_of(op, q)).transpose()?;
    set.refs = ref_rows;
    set.imported = imported;
    Ok(set)
}

/// The reference rows a call works against on the device: uploaded for this call (host
/// rows), or a bank's resident rows.
pub(crate) enum Resident<'d> {
    Uploaded(DeviceRows),
    Bank(&'d DeviceRows),
}

impl<'d> Resident<'d> {
    /// `refs` on `gpu`: host rows uploaded, a bank's rows as they are; device-buffer rows
    /// must have been imported by then (an internal error otherwise).
    pub(crate) fn of(op: &'static str, gpu: &GpuDevice, refs: Embeddings<'d>) -> Result<Self> {
        match refs {
            Embeddings::Host(r) => Ok(Resident::Uploaded(DeviceRows::upload(gpu, r)?)),
            Embeddings::Bank(bank) => Ok(Resident::Bank(bank.view.rows)),
            Embeddings::Device(_) => Err(unimported(op)),
        }
    }

    pub(crate) fn rows(&self) -> &DeviceRows {
        match self {
            Resident::Uploaded(rows) => rows,
            Resident::Bank(rows) => rows,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_excludes_only_when_the_references_are_the_queries() {
        let slots = |rule, refs_are_queries| self_slots("t", rule, 3, 3, refs_are_queries);
        assert_eq!(slots(&SelfExclusion::Auto, true).ok(), Some(vec![0, 1, 2]));
        assert_eq!(
            slots(&SelfExclusion::Auto, false).ok(),
            Some(vec![NO_SLOT; 3])
        );
        assert_eq!(
            slots(&SelfExclusion::None, true).ok(),
            Some(vec![NO_SLOT; 3])
        );
    }

    #[test]
    fn one_rule_for_bad_slots() {
        let same_index = self_slots("t", &SelfExclusion::SameIndex, 4, 3, false);
        assert!(
            matches!(same_index, Err(Error::Shape { what: "refs", .. })),
            "SameIndex needs m >= q: {same_index:?}"
        );
        let short = self_slots("t", &SelfExclusion::QuerySlots(vec![0]), 2, 5, false);
        assert!(
            matches!(
                short,
                Err(Error::Shape {
                    what: "self_exclusion",
                    ..
                })
            ),
            "{short:?}"
        );
        let past = self_slots("t", &SelfExclusion::QuerySlots(vec![0, 5]), 2, 5, false);
        assert!(
            matches!(past, Err(Error::InvalidParameter { what: "self_exclusion", ref value, .. }) if value == "5"),
            "{past:?}"
        );
        // SameIndex with more references than queries is PML's ref_includes_query.
        assert_eq!(
            self_slots("t", &SelfExclusion::SameIndex, 2, 5, false).ok(),
            Some(vec![0, 1])
        );
    }
}
