//! The plans of the losses: the device path's where the call would take it, else the native
//! path's.

use super::driver::{Job, Sizing};
use super::gpu::{self, Rule};
use crate::context::plan::Plan;
use crate::context::Context;
use crate::error::Result;

/// The plan of `job`, run on the device with `rule` where there is one and the call fits it
/// (`None`: the loss has no device path for this call). `min_bytes` is the smaller of the two
/// paths' least budgets: a device call that does not fit falls back to the native path.
///
/// # Errors
/// [`crate::Error::OverBudget`] when neither path fits the budget.
pub(super) fn plan(ctx: &Context, job: &Job<'_>, rule: Option<&Rule>) -> Result<Plan> {
    let (b, m) = (job.set.labels.len(), job.set.ref_labels.len());
    plan_beside(ctx, job, rule, Sizing::new(ctx, job).map(|s| s.plan(b, m)))
}

/// [`plan`] with the native path's own plan `native` (a loss whose native path is not the
/// driver's).
///
/// # Errors
/// As [`plan`].
pub(super) fn plan_beside(
    ctx: &Context,
    job: &Job<'_>,
    rule: Option<&Rule>,
    native: Result<Plan>,
) -> Result<Plan> {
    if let (Some(gpu), Some(rule)) = (ctx.gpu(), rule) {
        if let Some(mut plan) = gpu::plan(ctx, gpu, job, rule)? {
            if let Ok(native) = &native {
                plan.min_bytes = plan.min_bytes.min(native.min_bytes);
            }
            return Ok(plan);
        }
    }
    native
}
