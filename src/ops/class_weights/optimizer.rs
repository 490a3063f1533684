//! torch's `SGD` and `AdamW` on class weights, element by element: the same update in the
//! same order of operations (f32 arithmetic on the arrays, scalars such as Adam's bias
//! corrections in f64 and then rounded, as torch's Python floats are), so that a step here and
//! a step of torch on the same arrays agree to f32 rounding. Each element's update reads only
//! its own values, so rows are split over the cores with the same bits on any count.

use ndarray::{Array2, ArrayView2, ArrayViewMut2, Axis, Zip};

use crate::context::plan::Plan;
use crate::context::{ComputePath, Context};
use crate::error::{Error, Result};
use crate::runtime::memory::HostReservation;
use crate::runtime::pool::threads;
use crate::validate;

const OP: &str = "weights_step";

/// An optimizer for class weights (a shard of them, or all): torch's `SGD` or `AdamW`
/// (PyTorch 2.x, `maximize=False`, AdamW without `amsgrad`), with their defaults. Default:
/// `AdamW(lr=1e-3)`.
///
/// # Example
/// ```
/// use wgpu_metric_learning::WeightOptimizer;
/// let sgd = WeightOptimizer::sgd(0.1, 0.9);
/// assert_eq!(sgd, WeightOptimizer::Sgd { lr: 0.1, momentum: 0.9, dampening: 0.0, weight_decay: 0.0, nesterov: false });
/// assert_eq!(WeightOptimizer::default(), WeightOptimizer::adamw(1e-3));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WeightOptimizer {
    /// `torch.optim.SGD`: `g = grad + weight_decay·w`; with momentum, the buffer is `g` at the
    /// first step and `momentum·buf + (1 − dampening)·g` after, and `g` becomes the buffer
    /// (or `g + momentum·buf` with `nesterov`); then `w −= lr·g`.
    Sgd {
        /// Learning rate (≥ 0).
        lr: f32,
        /// Momentum factor (≥ 0; 0 keeps no buffer).
        momentum: f32,
        /// Dampening of the momentum (torch's default 0).
        dampening: f32,
        /// L2 penalty added to the gradient (≥ 0).
        weight_decay: f32,
        /// Nesterov momentum (needs `momentum > 0` and `dampening = 0`).
        nesterov: bool,
    },
    /// `torch.optim.AdamW`: `w ·= 1 − lr·weight_decay`; `m` moves toward `grad` by
    /// `1 − beta1` (torch's `lerp`), `v = beta2·v + (1 − beta2)·grad²`; then
    /// `w −= lr / (1 − beta1ᵗ) · m / (√v / √(1 − beta2ᵗ) + eps)`.
    AdamW {
        /// Learning rate (≥ 0).
        lr: f32,
        /// The first moment's decay, in `[0, 1)` (torch's 0.9).
        beta1: f32,
        /// The second moment's decay, in `[0, 1)` (torch's 0.999).
        beta2: f32,
        /// Added to the denominator (≥ 0; torch's 1e-8).
        eps: f32,
        /// Decoupled weight decay (≥ 0; torch's 1e-2).
        weight_decay: f32,
    },
}

impl Default for WeightOptimizer {
    fn default() -> Self {
        Self::adamw(1e-3)
    }
}

impl WeightOptimizer {
    /// `torch.optim.SGD(lr=lr, momentum=momentum)`: no dampening, decay or Nesterov.
    pub fn sgd(lr: f32, momentum: f32) -> Self {
        Self::Sgd {
            lr,
            momentum,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        }
    }

    /// `torch.optim.AdamW(lr=lr)`: betas (0.9, 0.999), eps 1e-8, weight decay 1e-2.
    pub fn adamw(lr: f32) -> Self {
        Self::AdamW {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 1e-2,
        }
    }

    /// The arrays of state it keeps beside the weights, each of their shape: SGD's momentum
    /// buffer (none without momentum), AdamW's two moments.
    pub fn buffers(&self) -> usize {
        match *self {
            Self::Sgd { momentum, .. } => usize::from(momentum != 0.0),
            Self::AdamW { .. } => 2,
        }
    }

    /// Its name in torch and the front ends: `"sgd"` or `"adamw"`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Sgd { .. } => "sgd",
            Self::AdamW { .. } => "adamw",
        }
    }

    /// Its learning rate.
    pub fn lr(&self) -> f32 {
        match *self {
            Self::Sgd { lr, .. } | Self::AdamW { lr, .. } => lr,
        }
    }

    /// Its five settings, as checkpoints store them: SGD's lr, momentum, dampening, weight
    /// decay and Nesterov (0 or 1); AdamW's lr, beta1, beta2, eps and weight decay.
    pub fn settings(&self) -> [f32; 5] {
        self.stored().1
    }

    /// The optimizer [`name`](Self::name)d `name` with [`settings`](Self::settings); `None`
    /// for another name.
    ///
    /// # Example
    /// ```
    /// use wgpu_metric_learning::WeightOptimizer;
    /// let sgd = WeightOptimizer::sgd(0.1, 0.9);
    /// assert_eq!(WeightOptimizer::from_settings(sgd.name(), sgd.settings()), Some(sgd));
    /// ```
    pub fn from_settings(name: &str, settings: [f32; 5]) -> Option<Self> {
        let code = match name {
            "sgd" => 1,
            "adamw" => 2,
            _ => return None,
        };
        Self::from_stored(code, settings)
    }

    /// The settings as stored: a code (1 SGD, 2 AdamW) and five f32 (SGD: lr, momentum,
    /// dampening, weight decay, Nesterov as 0 or 1; AdamW: lr, beta1, beta2, eps, weight
    /// decay). [`WeightOptimizer::from_stored`] reads them back.
    pub(crate) fn stored(&self) -> (u32, [f32; 5]) {
        match *self {
            Self::Sgd {
                lr,
                momentum,
                dampening,
                weight_decay,
                nesterov,
            } => {
                let nesterov = f32::from(u8::from(nesterov));
                (1, [lr, momentum, dampening, weight_decay, nesterov])
            }
            Self::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => (2, [lr, beta1, beta2, eps, weight_decay]),
        }
    }

    /// The optimizer of [`WeightOptimizer::stored`]'s form; `None` for an unknown code.
    pub(crate) fn from_stored(code: u32, [a, b, c, d, e]: [f32; 5]) -> Option<Self> {
        match code {
            1 => Some(Self::Sgd {
                lr: a,
                momentum: b,
                dampening: c,
                weight_decay: d,
                nesterov: e != 0.0,
            }),
            2 => Some(Self::AdamW {
                lr: a,
                beta1: b,
                beta2: c,
                eps: d,
                weight_decay: e,
            }),
            _ => None,
        }
    }

    /// torch's checks of the settings.
    fn check(&self) -> Result<()> {
        let bad = |what, value: f32, rule| {
            Err(Error::InvalidParameter {
                op: OP,
                what,
                value: value.to_string(),
                rule,
            })
        };
        let at_least_0 = |what, v: f32| match v >= 0.0 && v.is_finite() {
            true => Ok(()),
            false => bad(what, v, "must be finite and at least 0"),
        };
        let unit = |what, v: f32| match (0.0..1.0).contains(&v) {
            true => Ok(()),
            false => bad(what, v, "must be in [0, 1)"),
        };
        match *self {
            Self::Sgd {
                lr,
                momentum,
                dampening,
                weight_decay,
                nesterov,
            } => {
                at_least_0("lr", lr)?;
                at_least_0("momentum", momentum)?;
                validate::finite_param(OP, "dampening", dampening)?;
                at_least_0("weight_decay", weight_decay)?;
                if nesterov && (momentum <= 0.0 || dampening != 0.0) {
                    let rule = "Nesterov momentum needs momentum > 0 and dampening 0";
                    return bad("momentum", momentum, rule);
                }
                Ok(())
            }
            Self::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => {
                at_least_0("lr", lr)?;
                unit("beta1", beta1)?;
                unit("beta2", beta2)?;
                at_least_0("eps", eps)?;
                at_least_0("weight_decay", weight_decay)
            }
        }
    }
}

/// The state of an optimizer for one weights array: the steps taken and its buffers (SGD's
/// `momentum_buffer`, AdamW's `exp_avg` and `exp_avg_sq`, each of the weights' shape), made
/// by the first step and counted in that step's context's budget for as long as they live.
///
/// # Example
/// ```
/// let state = wgpu_metric_learning::OptimizerState::new();
/// assert_eq!((state.steps(), state.buffers().len()), (0, 0));
/// ```
#[derive(Debug, Default)]
pub struct OptimizerState {
    steps: u64,
    buffers: Vec<Array2<f32>>,
    held: Option<HostReservation>,
}

impl OptimizerState {
    /// No step taken yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The buffers, in the order of [`WeightOptimizer`]'s docs (none before the first step).
    pub fn buffers(&self) -> &[Array2<f32>] {
        &self.buffers
    }

    /// A state of `steps` steps taken with `buffers` kept (in the order of
    /// [`WeightOptimizer`]'s docs, each of the weights' shape), counted in `ctx`'s budget
    /// while it lives: one loaded from a checkpoint, or another framework's (torch's
    /// `momentum_buffer`, or `exp_avg` and `exp_avg_sq` with `step`) to save with
    /// [`save_weights_shard`](crate::save_weights_shard). [`weights_step`] checks the
    /// buffers against the optimizer and the weights.
    ///
    /// # Errors
    /// [`Error::BudgetExceeded`] when the buffers do not fit what `ctx` has left.
    ///
    /// # Example
    /// ```
    /// use wgpu_metric_learning::{Context, OptimizerState};
    /// let momentum = ndarray::Array2::<f32>::zeros((4, 10));
    /// let state = OptimizerState::restored(&Context::native_cpu(None), 3, vec![momentum])?;
    /// assert_eq!((state.steps(), state.buffers().len()), (3, 1));
    /// # Ok::<(), wgpu_metric_learning::Error>(())
    /// ```
    pub fn restored(ctx: &Context, steps: u64, buffers: Vec<Array2<f32>>) -> Result<Self> {
        let bytes = buffers.iter().map(|b| 4 * b.len() as u64).sum();
        let held = HostReservation::new("optimizer state", bytes, ctx.tracker())?;
        Ok(Self {
            steps,
            buffers,
            held: Some(held),
        })
    }
}

/// The plan of [`weights_step`] on weights of `shape` `(r, c)`: the native path, in one
/// chunk; `bytes` and `min_bytes` are the state its first step makes (SGD's momentum buffer,
/// AdamW's two moments, each of the weights' size; none for plain SGD), held while the state
/// lives.
///
/// # Errors
/// [`Error::InvalidParameter`] for settings torch refuses; [`Error::OverBudget`] when the
/// state does not fit what `ctx` has left.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{weights_step_plan, Context, WeightOptimizer};
/// let plan = weights_step_plan(&Context::native_cpu(None), (128, 1000), &WeightOptimizer::adamw(1e-3))?;
/// assert_eq!(plan.bytes, 2 * 4 * 128 * 1000);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn weights_step_plan(
    ctx: &Context,
    shape: (usize, usize),
    opt: &WeightOptimizer,
) -> Result<Plan> {
    opt.check()?;
    let bytes = state_bytes(shape, opt);
    let tracker = ctx.tracker();
    if bytes > tracker.available() {
        return Err(Error::OverBudget {
            op: OP,
            required: bytes,
            budget: tracker.stats().budget_bytes,
        });
    }
    Ok(Plan {
        path: ComputePath::NativeCpu,
        rows: shape.0,
        cols: shape.1,
        chunks: 1,
        bytes,
        min_bytes: bytes,
    })
}

/// Bytes of the state of `opt` for weights of `shape`.
fn state_bytes(shape: (usize, usize), opt: &WeightOptimizer) -> u64 {
    4 * (shape.0 as u64) * (shape.1 as u64) * opt.buffers() as u64
}

/// One step of `opt` on `weights` `(r, c)` (any layout: a process's shard of class weights,
/// or all of them) with their gradient `grad` `(r, c)`, updating `state` (made at the first
/// step, [`weights_step_plan`]'s bytes counted in `ctx`'s budget while it lives). Cost: a pass over
/// the weights on every core; no other memory.
///
/// # Errors
/// [`Error::Shape`] for a gradient or state of another shape; [`Error::NonFinite`] for a
/// gradient that is not finite (nothing is changed); [`Error::InvalidParameter`] for settings
/// torch refuses, or a state kept by an optimizer with other buffers;
/// [`Error::BudgetExceeded`] when the first step's buffers do not fit.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{weights_step, Context, OptimizerState, WeightOptimizer};
/// let ctx = Context::native_cpu(None);
/// let (mut w, g) = (ndarray::array![[1.0f32, 2.0]], ndarray::array![[0.5f32, -0.5]]);
/// let mut state = OptimizerState::new();
/// weights_step(&ctx, w.view_mut(), g.view(), &mut state, &WeightOptimizer::sgd(0.1, 0.9))?;
/// assert_eq!((w, state.steps()), (ndarray::array![[0.95f32, 2.05]], 1));
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn weights_step(
    ctx: &Context,
    mut weights: ArrayViewMut2<'_, f32>,
    grad: ArrayView2<'_, f32>,
    state: &mut OptimizerState,
    opt: &WeightOptimizer,
) -> Result<()> {
    opt.check()?;
    let shape = weights.dim();
    if grad.dim() != shape {
        return Err(Error::Shape {
            op: OP,
            what: "grad",
            expected: format!("the weights' shape {shape:?}"),
            got: grad.shape().to_vec(),
        });
    }
    validate::finite(OP, "grad", grad)?;
    if state.steps > 0 || !state.buffers.is_empty() {
        if state.buffers.len() != opt.buffers() {
            return Err(Error::InvalidParameter {
                op: OP,
                what: "state",
                value: format!("{} buffers", state.buffers.len()),
                rule: "must be kept by the same optimizer (SGD with momentum: 1, AdamW: 2)",
            });
        }
        if let Some(b) = state.buffers.iter().find(|b| b.dim() != shape) {
            return Err(Error::Shape {
                op: OP,
                what: "state",
                expected: format!("the weights' shape {shape:?}"),
                got: b.shape().to_vec(),
            });
        }
    }
    if state.buffers.is_empty() && opt.buffers() > 0 {
        let bytes = state_bytes(shape, opt);
        let held = HostReservation::new("optimizer state", bytes, ctx.tracker())?;
        state.buffers = (0..opt.buffers()).map(|_| Array2::zeros(shape)).collect();
        state.held = Some(held);
    }
    let first = state.steps == 0;
    state.steps += 1;
    let step = state.steps;
    let rows = shape.0.div_ceil(threads()).max(1);
    let mut parts: Vec<Vec<ArrayViewMut2<'_, f32>>> = Vec::new();
    for b in &mut state.buffers {
        parts.push(b.axis_chunks_iter_mut(Axis(0), rows).collect());
    }
    let mut chunks: Vec<_> = weights
        .axis_chunks_iter_mut(Axis(0), rows)
        .zip(grad.axis_chunks_iter(Axis(0), rows))
        .map(|(w, g)| (w, g, Vec::new()))
        .collect();
    for part in parts {
        for (chunk, b) in chunks.iter_mut().zip(part) {
            chunk.2.push(b);
        }
    }
    std::thread::scope(|scope| {
        let workers: Vec<_> = chunks
            .into_iter()
            .map(|(w, g, bufs)| scope.spawn(move || update(opt, (first, step), w, g, bufs)))
            .collect();
        for w in workers {
            if let Err(panic) = w.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
    Ok(())
}

/// The update of one block of rows.
fn update(
    opt: &WeightOptimizer,
    (first, step): (bool, u64),
    w: ArrayViewMut2<'_, f32>,
    g: ArrayView2<'_, f32>,
    mut bufs: Vec<ArrayViewMut2<'_, f32>>,
) {
    match *opt {
        WeightOptimizer::Sgd {
            lr,
            momentum,
            dampening,
            weight_decay,
            nesterov,
        } => {
            let decayed = |w: f32, g: f32| {
                if weight_decay != 0.0 {
                    g + weight_decay * w
                } else {
                    g
                }
            };
            match bufs.pop() {
                None => Zip::from(w)
                    .and(g)
                    .for_each(|w, &g| *w -= lr * decayed(*w, g)),
                Some(buf) => Zip::from(w).and(g).and(buf).for_each(|w, &g, b| {
                    let g = decayed(*w, g);
                    *b = if first {
                        g
                    } else {
                        momentum * *b + (1.0 - dampening) * g
                    };
                    let g = if nesterov { g + momentum * *b } else { *b };
                    *w -= lr * g;
                }),
            }
        }
        WeightOptimizer::AdamW {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } => {
            let t = step as i32;
            let correction1 = 1.0 - f64::from(beta1).powi(t);
            let correction2 = 1.0 - f64::from(beta2).powi(t);
            let step_size = (f64::from(lr) / correction1) as f32;
            let root2 = correction2.sqrt() as f32;
            // torch takes these in Python floats (f64) and rounds them onto the f32 arrays.
            let keep = (1.0 - f64::from(lr) * f64::from(weight_decay)) as f32;
            let toward = (1.0 - f64::from(beta1)) as f32;
            let fresh = (1.0 - f64::from(beta2)) as f32;
            let (Some(v), Some(m)) = (bufs.pop(), bufs.pop()) else {
                return;
            };
            let (low, rest) = (toward < 0.5, (1.0 - f64::from(toward)) as f32);
            Zip::from(w).and(g).and(m).and(v).for_each(|w, &g, m, v| {
                *w *= keep;
                // torch's `lerp`, in its two forms by the weight's side of 0.5.
                *m = if low {
                    *m + toward * (g - *m)
                } else {
                    g - (g - *m) * rest
                };
                *v = *v * beta2 + fresh * g * g;
                let denom = v.sqrt() / root2 + eps;
                // torch's `addcdiv`: `w + (value · m) / denom`.
                *w += (-step_size * *m) / denom;
            });
        }
    }
}
