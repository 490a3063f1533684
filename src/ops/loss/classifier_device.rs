//! The device path of the softmax losses with class weights on one process: CosFace,
//! NormalizedSoftmax, ArcFace and ProxyNCA. The class centres are the references of the pair
//! losses' device loop ([`super::gpu`]), one per class and labelled by it, so that a row's
//! class is its one positive: per block of rows the distance tiles (cosines, or ProxyNCA's
//! squared distances of the normalised rows), `pair_weights` with its `SOFTMAX` rule (NCA's
//! for ProxyNCA) taking each row's log-sum-exp over every class in one workgroup, and the two
//! gradient products; the normalisation's backward on the host.
//!
//! Everything else runs natively: SubCenterArcFace and SoftTriple (a reduction over each
//! class's centres), LargeMarginSoftmax and SphereFace (norms in the logit), ProxyAnchor, the
//! class-sharded calls, and calls the device loop does not take (the centres past one storage
//! binding, or buffers past the budget). The device sums in f32 where the native path sums
//! each row in f64.

use ndarray::{Array1, Array2, ArrayView2};

use super::driver::Job;
use super::gpu::{self, PairRule, Rule};
use super::pair_device::{mean_of, pad};
use crate::context::plan::{DeviceCaps, Plan};
use crate::context::Context;
use crate::data::device_rows::max_page_rows;
use crate::data::inputs::{self, Imports, MiningSet, SelfExclusion};
use crate::error::Result;
use crate::hooks::Hooks;
use crate::kernels::pair_weights::{code, WORDS};
use crate::metric::{Distance, DistanceConfig};
use crate::runtime::device::GpuDevice;
use crate::runtime::memory::HostReservation;
use crate::{ClassifierKind, MarginGrad};

/// What the device gives: the mean loss, the rows in it, the rows' gradient `(b, d)` and the
/// centres' `(centres, d)`.
pub(super) type Found = (f64, usize, Array2<f32>, Array2<f32>);

/// The rule and the distance of `kind` on the device, or `None` where it runs natively.
fn rule(kind: &ClassifierKind) -> Option<(PairRule, Distance)> {
    let cosine = Distance::Cosine;
    let (code, params, distance) = match *kind {
        ClassifierKind::CosFace { margin, scale } => (code::SOFTMAX, pad(&[scale, margin]), cosine),
        ClassifierKind::NormalizedSoftmax { temperature } => {
            let scale = (1.0 / f64::from(temperature)) as f32;
            (code::SOFTMAX, pad(&[scale]), cosine)
        }
        ClassifierKind::ArcFace {
            margin,
            scale,
            margin_grad,
        } => {
            // As the native path's `Target::Arc`: the margin in radians; θ ≤ π − m from
            // the threshold up.
            let m = f64::from(margin).to_radians();
            let exact = f32::from(u8::from(margin_grad == MarginGrad::Pml));
            let (cos_m, sin_m) = (m.cos() as f32, m.sin() as f32);
            let arc = [
                scale,
                0.0,
                m as f32,
                arc_threshold(m),
                exact,
                1.0,
                cos_m,
                sin_m,
            ];
            (code::SOFTMAX, arc, cosine)
        }
        ClassifierKind::ProxyNca { softmax_scale } => {
            (code::NCA, pad(&[softmax_scale]), Distance::SquaredEuclidean)
        }
        _ => return None,
    };
    let rule = PairRule {
        code,
        params,
        edges: 0,
        forward: false,
        state: Vec::new(),
        stride: WORDS,
    };
    Some((rule, distance))
}

/// The least f32 cosine `c` whose angle the native path takes as `θ ≤ π − m`
/// (`acos(c) as f32 <= (π − m) as f32`, `Target::Arc`), so that the device branches at the
/// same cosines (`acos` falls as `c` grows: the test holds from there up).
fn arc_threshold(m: f64) -> f32 {
    let limit = (std::f64::consts::PI - m) as f32;
    let taken = |c: f32| (f64::from(c).acos() as f32) <= limit;
    let mut c = (-m.cos()) as f32;
    // A few ulps either way at most; bounded all the same.
    for _ in 0..64 {
        if c > -1.0 && taken(c.next_down()) {
            c = c.next_down();
        } else if !taken(c) && c < 1.0 {
            c = c.next_up();
        } else {
            break;
        }
    }
    c
}

/// `kind` of `x` `(b, d)` with class indices `labels` against the centres `w` `(d, centres)`
/// (one per class) on `gpu`, or `None` where the native path runs (module docs).
///
/// # Errors
/// As the pair losses' device loop; `Cancelled`.
pub(super) fn run(
    (ctx, gpu): (&Context, &GpuDevice),
    (x, labels): (ArrayView2<'_, f32>, &[usize]),
    w: ArrayView2<'_, f32>,
    kind: &ClassifierKind,
    hooks: &Hooks,
) -> Result<Option<Found>> {
    let (d, centres) = w.dim();
    let call = |job: &Job<'_>, rule| {
        let Some(raw) = gpu::run_raw(ctx, gpu, job, &Rule::Pair(rule))? else {
            return Ok(None);
        };
        // The mean over the rows the rule keeps (every row but ProxyNCA's that underflow).
        let (loss, _, out) = mean_of(ctx, job, raw)?;
        let count = out.totals.count as usize;
        let ref_grad = out.ref_grad.unwrap_or_else(|| Array2::zeros((centres, d)));
        Ok(Some((loss, count, out.query_grad, ref_grad)))
    };
    with_job(
        (ctx, gpu),
        (x, labels),
        w,
        (kind, hooks),
        Imports::call(),
        call,
    )
}

/// The [`Plan`] of [`run`], or `None` where the native path would run.
///
/// # Errors
/// As [`run`]'s checks.
pub(super) fn plan(
    (ctx, gpu): (&Context, &GpuDevice),
    (x, labels): (ArrayView2<'_, f32>, &[usize]),
    w: ArrayView2<'_, f32>,
    kind: &ClassifierKind,
) -> Result<Option<Plan>> {
    let hooks = Hooks::default();
    let call = |job: &Job<'_>, rule| {
        let plan = gpu::plan(ctx, gpu, job, &Rule::Pair(rule))?;
        Ok(plan.map(|mut p| {
            p.bytes += label_bytes(x.nrows(), w.ncols());
            p
        }))
    };
    with_job(
        (ctx, gpu),
        (x, labels),
        w,
        (kind, &hooks),
        Imports::plan(),
        call,
    )
}

const OP: &str = "classifier_loss";

/// Bytes the call holds on the host besides the device loop's: every row's and every
/// centre's label (the centres themselves are read in place, as the references' rows).
fn label_bytes(b: usize, centres: usize) -> u64 {
    4 * (b as u64 + centres as u64)
}

/// The pair losses' job of the call (the centres as references labelled by their class), and
/// `kind`'s rule, handed to `f`; `None` where `kind` has no device rule, or its centres do not
/// fit one storage binding, or their labels the budget (decided before anything is made for
/// them).
fn with_job<T>(
    (ctx, gpu): (&Context, &GpuDevice),
    (x, labels): (ArrayView2<'_, f32>, &[usize]),
    w: ArrayView2<'_, f32>,
    (kind, hooks): (&ClassifierKind, &Hooks),
    mut imports: Imports,
    f: impl FnOnce(&Job<'_>, PairRule) -> Result<Option<T>>,
) -> Result<Option<T>> {
    let Some((rule, distance)) = rule(kind) else {
        return Ok(None);
    };
    let (d, centres) = w.dim();
    let caps = DeviceCaps::from_limits(&gpu.limits);
    let one_page = max_page_rows(OP, &caps, d.div_ceil(4)).is_ok_and(|rows| centres <= rows);
    let (Ok(class_count), true) = (u32::try_from(centres), one_page) else {
        return Ok(None);
    };
    let held = HostReservation::new(
        "classifier loss labels",
        label_bytes(labels.len(), centres),
        ctx.tracker(),
    );
    let Ok(_held) = held else {
        return Ok(None);
    };
    // Class indices are below `centres`, itself below 2^32 here.
    let row_labels: Array1<u32> = labels.iter().map(|&y| y as u32).collect();
    let classes: Array1<u32> = (0..class_count).collect();
    let queries = MiningSet::new(x, row_labels.view());
    // The centres in place: `w.t()`'s rows are the references, read as they are uploaded.
    let refs = MiningSet::new(w.t(), classes.view());
    let set = inputs::prepare(
        OP,
        ctx,
        &queries,
        Some(&refs),
        &SelfExclusion::None,
        true,
        |_| Ok(true),
        &mut imports,
    )?;
    let job = Job {
        op: OP,
        label: "classifier loss working memory",
        set: &set,
        refs_are_queries: false,
        distance: DistanceConfig {
            distance,
            normalize: true,
        },
        ref_grad: true,
        ref_pairs: false,
        snr: None,
        hooks,
    };
    f(&job, rule)
}
