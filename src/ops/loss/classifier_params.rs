//! The losses of [`super::classifier`] with their parameters, and its scalar side: how each
//! loss turns a class's cosine into its logit, the logit's slope, and how a class's centres
//! make its cosine (one centre, the best of its sub-centres, or SoftTriple's softmax).
//!
//! Every logit has the form `z = scale · a · b · ψ(c) + bias`, with `c` the class's cosine,
//! `a` the row's norm or 1, `b` the class weight's norm or 1, and `ψ` the identity off the
//! target class and the loss's margin on it. The passes need `z` and `∂z/∂c`; the terms
//! through `a` and `b` (LargeMarginSoftmax and SphereFace) follow from `z` itself.

use super::matryoshka_row::exp_bounded;
use crate::error::{Error, Result};

/// Whose gradient ArcFace's margin has on the target class.
///
/// # Example
/// ```
/// assert_eq!(wgpu_metric_learning::MarginGrad::default(), wgpu_metric_learning::MarginGrad::Pml);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MarginGrad {
    /// PML's: through `acos`, `sin(θ + m) / sin θ` (`classifier_loss`'s docs for `|c| = 1`). The default.
    #[default]
    Pml,
    /// insightface's: the margin changes the value only, its slope is 1.
    StraightThrough,
}

/// Which loss [`classifier_loss`](crate::classifier_loss) computes, with PML's parameters (constructors give PML's
/// defaults). Weights are in PML's layout: `(d, classes · centres)` for `W` and `fc`,
/// `(classes, d)` for ProxyNCA's `proxies` ([`ClassifierKind::weight_shape`]).
///
/// # Example
/// ```
/// use wgpu_metric_learning::ClassifierKind;
/// assert_eq!(ClassifierKind::arc_face().weight_shape(10, 4), (4, 10));
/// assert_eq!(ClassifierKind::proxy_nca().weight_shape(10, 4), (10, 4));
/// assert_eq!(ClassifierKind::sub_center_arc_face().weight_shape(10, 4), (4, 30));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum ClassifierKind {
    /// `ArcFaceLoss(margin=28.6, scale=64)`.
    ArcFace {
        /// The angular margin in degrees.
        margin: f32,
        /// The logits' scale.
        scale: f32,
        /// Whose slope the margin has.
        margin_grad: MarginGrad,
    },
    /// `SubCenterArcFaceLoss(margin=28.6, scale=64, sub_centers=3)`: class `j`'s centres are
    /// columns `j·k … j·k + k − 1`; its cosine is their best.
    SubCenterArcFace {
        /// The angular margin in degrees.
        margin: f32,
        /// The logits' scale.
        scale: f32,
        /// Centres per class, at least 1.
        sub_centers: usize,
        /// Whose slope the margin has.
        margin_grad: MarginGrad,
    },
    /// `CosFaceLoss(margin=0.35, scale=64)`.
    CosFace {
        /// Subtracted from the target's cosine.
        margin: f32,
        /// The logits' scale.
        scale: f32,
    },
    /// `LargeMarginSoftmaxLoss(margin=4, scale=1)`: `cos(mθ)` on the target, logits times
    /// `‖x‖ ‖w‖`.
    LargeMarginSoftmax {
        /// The angle's multiple `m`, at least 1.
        margin: u32,
        /// The logits' scale.
        scale: f32,
    },
    /// `SphereFaceLoss(margin=4, scale=1)`: as LargeMarginSoftmax, logits times `‖x‖` only.
    SphereFace {
        /// The angle's multiple `m`, at least 1.
        margin: u32,
        /// The logits' scale.
        scale: f32,
    },
    /// `NormalizedSoftmaxLoss(temperature=0.05)`.
    NormalizedSoftmax {
        /// The logits are the cosines over it; nonzero.
        temperature: f32,
    },
    /// `ProxyNCALoss(softmax_scale=1)`: logits `−s ‖x̂ − p̂‖²`.
    ProxyNca {
        /// `s`.
        softmax_scale: f32,
    },
    /// `ProxyAnchorLoss(margin=0.1, alpha=32)`: per class a log-sum-exp over the batch
    /// (module docs of `classifier_anchor`), proxies `(classes, d)`.
    ProxyAnchor {
        /// `δ`.
        margin: f32,
        /// `α`.
        alpha: f32,
    },
    /// `SoftTripleLoss(centers_per_class=10, la=20, gamma=0.1, margin=0.01)`.
    SoftTriple {
        /// Centres per class, at least 1.
        centers_per_class: usize,
        /// The logits' scale `λ`.
        la: f32,
        /// The centres' softmax temperature; nonzero.
        gamma: f32,
        /// Subtracted from the target's similarity.
        margin: f32,
    },
}

impl ClassifierKind {
    /// PML's `ArcFaceLoss()`.
    pub fn arc_face() -> Self {
        Self::ArcFace {
            margin: 28.6,
            scale: 64.0,
            margin_grad: MarginGrad::Pml,
        }
    }
    /// PML's `SubCenterArcFaceLoss()`.
    pub fn sub_center_arc_face() -> Self {
        let margin_grad = MarginGrad::Pml;
        Self::SubCenterArcFace {
            margin: 28.6,
            scale: 64.0,
            sub_centers: 3,
            margin_grad,
        }
    }
    /// PML's `CosFaceLoss()`.
    pub fn cos_face() -> Self {
        Self::CosFace {
            margin: 0.35,
            scale: 64.0,
        }
    }
    /// PML's `LargeMarginSoftmaxLoss()`.
    pub fn large_margin_softmax() -> Self {
        Self::LargeMarginSoftmax {
            margin: 4,
            scale: 1.0,
        }
    }
    /// PML's `SphereFaceLoss()`.
    pub fn sphere_face() -> Self {
        Self::SphereFace {
            margin: 4,
            scale: 1.0,
        }
    }
    /// PML's `NormalizedSoftmaxLoss()`.
    pub fn normalized_softmax() -> Self {
        Self::NormalizedSoftmax { temperature: 0.05 }
    }
    /// PML's `ProxyNCALoss()`.
    pub fn proxy_nca() -> Self {
        Self::ProxyNca { softmax_scale: 1.0 }
    }
    /// PML's `ProxyAnchorLoss()`.
    pub fn proxy_anchor() -> Self {
        Self::ProxyAnchor {
            margin: 0.1,
            alpha: 32.0,
        }
    }
    /// PML's `SoftTripleLoss()`.
    pub fn soft_triple() -> Self {
        Self::SoftTriple {
            centers_per_class: 10,
            la: 20.0,
            gamma: 0.1,
            margin: 0.01,
        }
    }

    /// Centres per class: `sub_centers`, `centers_per_class`, or 1.
    pub fn centres_per_class(&self) -> usize {
        Rule::of(self).centres.per_class()
    }

    /// Whether the weights hold one class (centre) per row, as ProxyNCA's `proxies`.
    pub fn classes_on_rows(&self) -> bool {
        matches!(self, Self::ProxyNca { .. } | Self::ProxyAnchor { .. })
    }

    /// The weights' shape in PML's layout for `classes` classes of dimension `d`.
    pub fn weight_shape(&self, classes: usize, d: usize) -> (usize, usize) {
        let centres = classes.saturating_mul(self.centres_per_class());
        if self.classes_on_rows() {
            (centres, d)
        } else {
            (d, centres)
        }
    }
}

/// The options of [`ClassifierKind::from_options`], as the front ends name them: each `None`
/// is PML's default; `centres` is `sub_centers` or `centers_per_class`.
///
/// # Example
/// ```
/// let o = wgpu_metric_learning::ClassifierOptions { scale: Some(30.0), ..Default::default() };
/// assert_eq!(o.margin, None);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ClassifierOptions {
    /// Degrees (ArcFace), a cosine (CosFace, SoftTriple) or an integer multiple
    /// (LargeMarginSoftmax, SphereFace).
    pub margin: Option<f32>,
    /// The logits' scale (ArcFace, SubCenterArcFace, CosFace, LargeMarginSoftmax, SphereFace).
    pub scale: Option<f32>,
    /// ArcFace's and SubCenterArcFace's margin gradient.
    pub margin_grad: Option<MarginGrad>,
    /// SubCenterArcFace's `sub_centers`, SoftTriple's `centers_per_class`.
    pub centres: Option<usize>,
    /// NormalizedSoftmax's temperature.
    pub temperature: Option<f32>,
    /// ProxyNCA's `softmax_scale`.
    pub softmax_scale: Option<f32>,
    /// SoftTriple's `la`.
    pub la: Option<f32>,
    /// SoftTriple's `gamma`.
    pub gamma: Option<f32>,
    /// ProxyAnchor's `alpha`.
    pub alpha: Option<f32>,
}

impl ClassifierKind {
    /// The loss named `name` (`arcface`, `sub-center-arcface`, `cosface`,
    /// `large-margin-softmax`, `sphereface`, `normalized-softmax`, `proxy-nca`,
    /// `proxy-anchor`, `soft-triple`;
    /// `_` for `-` too) with PML's defaults, overridden by `options`.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for an unknown name, an option the loss does not take, or a
    /// LargeMarginSoftmax/SphereFace margin that is not a whole number of at least 1.
    ///
    /// # Example
    /// ```
    /// use wgpu_metric_learning::{ClassifierKind, ClassifierOptions};
    /// let o = ClassifierOptions { scale: Some(30.0), ..Default::default() };
    /// let kind = ClassifierKind::from_options("cosface", &o)?;
    /// assert_eq!(kind, ClassifierKind::CosFace { margin: 0.35, scale: 30.0 });
    /// # Ok::<(), wgpu_metric_learning::Error>(())
    /// ```
    pub fn from_options(name: &str, o: &ClassifierOptions) -> Result<Self> {
        let bad = |what: &'static str, value: String, rule: &'static str| Error::InvalidParameter {
            op: "classifier_loss",
            what,
            value,
            rule,
        };
        let kind = match name.replace('_', "-").as_str() {
            "arcface" => Self::arc_face(),
            "sub-center-arcface" => Self::sub_center_arc_face(),
            "cosface" => Self::cos_face(),
            "large-margin-softmax" => Self::large_margin_softmax(),
            "sphereface" => Self::sphere_face(),
            "normalized-softmax" => Self::normalized_softmax(),
            "proxy-nca" => Self::proxy_nca(),
            "soft-triple" => Self::soft_triple(),
            "proxy-anchor" => Self::proxy_anchor(),
            _ => return Err(bad("loss", name.into(), "a classifier loss's name")),
        };
        let given = [
            ("margin", o.margin.is_some()),
            ("scale", o.scale.is_some()),
            ("margin_grad", o.margin_grad.is_some()),
            ("centres", o.centres.is_some()),
            ("temperature", o.temperature.is_some()),
            ("softmax_scale", o.softmax_scale.is_some()),
            ("la", o.la.is_some()),
            ("gamma", o.gamma.is_some()),
            ("alpha", o.alpha.is_some()),
        ];
        let takes: &[&str] = match kind {
            Self::ArcFace { .. } => &["margin", "scale", "margin_grad"],
            Self::SubCenterArcFace { .. } => &["margin", "scale", "margin_grad", "centres"],
            Self::CosFace { .. } | Self::LargeMarginSoftmax { .. } | Self::SphereFace { .. } => {
                &["margin", "scale"]
            }
            Self::NormalizedSoftmax { .. } => &["temperature"],
            Self::ProxyNca { .. } => &["softmax_scale"],
            Self::SoftTriple { .. } => &["margin", "centres", "la", "gamma"],
            Self::ProxyAnchor { .. } => &["margin", "alpha"],
        };
        if let Some((what, _)) = given.iter().find(|(w, set)| *set && !takes.contains(w)) {
            return Err(bad(what, name.into(), "an option this loss does not take"));
        }
        let multiple = |m: u32| match o.margin {
            None => Ok(m),
            Some(v) if v >= 1.0 && v.fract() == 0.0 && v <= u32::MAX as f32 => Ok(v as u32),
            Some(v) => Err(bad("margin", v.to_string(), "a whole number of at least 1")),
        };
        Ok(match kind {
            Self::ArcFace {
                margin,
                scale,
                margin_grad,
            } => Self::ArcFace {
                margin: o.margin.unwrap_or(margin),
                scale: o.scale.unwrap_or(scale),
                margin_grad: o.margin_grad.unwrap_or(margin_grad),
            },
            Self::SubCenterArcFace {
                margin,
                scale,
                sub_centers,
                margin_grad,
            } => Self::SubCenterArcFace {
                margin: o.margin.unwrap_or(margin),
                scale: o.scale.unwrap_or(scale),
                sub_centers: o.centres.unwrap_or(sub_centers),
                margin_grad: o.margin_grad.unwrap_or(margin_grad),
            },
            Self::CosFace { margin, scale } => Self::CosFace {
                margin: o.margin.unwrap_or(margin),
                scale: o.scale.unwrap_or(scale),
            },
            Self::LargeMarginSoftmax { margin, scale } => Self::LargeMarginSoftmax {
                margin: multiple(margin)?,
                scale: o.scale.unwrap_or(scale),
            },
            Self::SphereFace { margin, scale } => Self::SphereFace {
                margin: multiple(margin)?,
                scale: o.scale.unwrap_or(scale),
            },
            Self::NormalizedSoftmax { temperature } => Self::NormalizedSoftmax {
                temperature: o.temperature.unwrap_or(temperature),
            },
            Self::ProxyNca { softmax_scale } => Self::ProxyNca {
                softmax_scale: o.softmax_scale.unwrap_or(softmax_scale),
            },
            Self::SoftTriple {
                centers_per_class,
                la,
                gamma,
                margin,
            } => Self::SoftTriple {
                centers_per_class: o.centres.unwrap_or(centers_per_class),
                la: o.la.unwrap_or(la),
                gamma: o.gamma.unwrap_or(gamma),
                margin: o.margin.unwrap_or(margin),
            },
            Self::ProxyAnchor { margin, alpha } => Self::ProxyAnchor {
                margin: o.margin.unwrap_or(margin),
                alpha: o.alpha.unwrap_or(alpha),
            },
        })
    }
}

/// The smallest `sin θ` of an f32 cosine below 1 (`c = 1 − 2⁻²⁴`): ArcFace's slope
/// `sin(θ + m) / sin θ` takes its value there at `|c| = 1` exactly, where PML's is infinite.
pub(super) const SIN_FLOOR: f64 = 3.452_669_6e-4;

/// What the target class's cosine becomes.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// `ψ(c) = c`.
    Plain,
    /// `ψ(c) = c − δ` (CosFace, SoftTriple).
    Shift(f64),
    /// ArcFace: `cos(θ + m)` while `θ ≤ π − m`, else `c − m sin m`.
    Arc {
        m: f64,
        /// `π − m` as PML compares it: in f32.
        limit: f32,
        exact: bool,
    },
    /// LargeMarginSoftmax: `(−1)^k cos(mθ) − 2k`, `k = ⌊θ m / π⌋`.
    Multiple(u32),
}

/// How a class's centres make its cosine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Centres {
    /// One centre per class.
    One,
    /// The best of `k` (SubCenterArcFace).
    Max(usize),
    /// `Σ softmax_k(γ c_k) c_k` over `k` (SoftTriple), `γ` = 1 / PML's `gamma`.
    Soft(usize, f64),
}

impl Centres {
    /// Centres per class.
    pub(super) fn per_class(self) -> usize {
        match self {
            Self::One => 1,
            Self::Max(k) | Self::Soft(k, _) => k,
        }
    }

    /// SoftTriple's classes of a whole row at once, in f32 (as PML's): each class's value
    /// `Σ softmax_k(γ c_k) c_k` into `values` and each centre's slope `∂S/∂c_k` into `slopes`.
    /// For `Soft` only (the others leave both untouched).
    pub(super) fn soft_row(self, cs: &[f32], values: &mut [f32], slopes: &mut [f32]) {
        let Self::Soft(per, gamma) = self else {
            return;
        };
        let gamma = gamma as f32;
        let classes = cs.chunks_exact(per).zip(slopes.chunks_exact_mut(per));
        for (v, (c, s)) in values.iter_mut().zip(classes) {
            let top = c
                .iter()
                .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
            let mut sum = 0.0f32;
            for (s, &x) in s.iter_mut().zip(c) {
                *s = exp_bounded(gamma * (x - top));
                sum += *s;
            }
            let inv = 1.0 / sum;
            let mut class = 0.0f32;
            for (s, &x) in s.iter_mut().zip(c) {
                *s *= inv;
                class += *s * x;
            }
            for (s, &x) in s.iter_mut().zip(c) {
                *s *= 1.0 + gamma * (x - class);
            }
            *v = class;
        }
    }

    /// Overwrites the centres' cosines `cs` with `g ∂c/∂c_k`: `g` times the class cosine's
    /// slope in each (SoftTriple's, `soft`, from [`Centres::soft_row`]).
    #[inline]
    pub(super) fn spread(self, cs: &mut [f32], g: f64, soft: &[f32]) {
        match self {
            Self::One => cs[0] = g as f32,
            Self::Max(_) => {
                let best = first_best(cs);
                for (k, c) in cs.iter_mut().enumerate() {
                    *c = if k == best { g as f32 } else { 0.0 };
                }
            }
            Self::Soft(..) => {
                for (c, &s) in cs.iter_mut().zip(soft) {
                    *c = (g * f64::from(s)) as f32;
                }
            }
        }
    }

    /// The class's cosine from its centres' `cs`; writes `∂c/∂c_k` to `slopes`.
    pub(super) fn reduce(self, cs: &[f32], slopes: &mut [f64]) -> f64 {
        match self {
            Self::One => {
                slopes[0] = 1.0;
                f64::from(cs[0])
            }
            Self::Max(_) => {
                let best = first_best(cs);
                slopes.fill(0.0);
                slopes[best] = 1.0;
                f64::from(cs[best])
            }
            Self::Soft(_, gamma) => {
                let top = cs
                    .iter()
                    .fold(f64::NEG_INFINITY, |t, &c| t.max(f64::from(c)));
                let mut sum = 0.0;
                for (s, &c) in slopes.iter_mut().zip(cs) {
                    // In f32, as PML's softmax (its argument is at most 0).
                    *s = f64::from(exp_bounded((gamma * (f64::from(c) - top)) as f32));
                    sum += *s;
                }
                let mut class = 0.0;
                for (s, &c) in slopes.iter_mut().zip(cs) {
                    *s /= sum;
                    class += *s * f64::from(c);
                }
                // ∂S/∂c_k = p_k (1 + γ (c_k − S)).
                for (s, &c) in slopes.iter_mut().zip(cs) {
                    *s *= 1.0 + gamma * (f64::from(c) - class);
                }
                class
            }
        }
    }
}

/// The first of the best of `cs`, as torch's `max` picks it on the CPU.
#[inline]
fn first_best(cs: &[f32]) -> usize {
    let mut best = 0;
    for (k, &c) in cs.iter().enumerate() {
        if c > cs[best] {
            best = k;
        }
    }
    best
}

/// One loss's logit: `scale · a · b · ψ(c) + bias`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rule {
    pub(super) scale: f64,
    pub(super) bias: f64,
    /// `a` is the row's norm (LargeMarginSoftmax, SphereFace).
    pub(super) row_norm: bool,
    /// `b` is the class weight's norm (LargeMarginSoftmax).
    pub(super) col_norm: bool,
    pub(super) centres: Centres,
    target: Target,
}

impl Rule {
    pub(super) fn of(kind: &ClassifierKind) -> Self {
        let plain = |scale: f64, target| Self {
            scale,
            bias: 0.0,
            row_norm: false,
            col_norm: false,
            centres: Centres::One,
            target,
        };
        let arc = |m: f32, grad| {
            let m = f64::from(m).to_radians();
            Target::Arc {
                m,
                limit: (std::f64::consts::PI - m) as f32,
                exact: grad == MarginGrad::Pml,
            }
        };
        match *kind {
            ClassifierKind::ArcFace {
                margin,
                scale,
                margin_grad,
            } => plain(f64::from(scale), arc(margin, margin_grad)),
            ClassifierKind::SubCenterArcFace {
                margin,
                scale,
                sub_centers,
                margin_grad,
            } => Self {
                centres: Centres::Max(sub_centers),
                ..plain(f64::from(scale), arc(margin, margin_grad))
            },
            ClassifierKind::CosFace { margin, scale } => {
                plain(f64::from(scale), Target::Shift(f64::from(margin)))
            }
            ClassifierKind::LargeMarginSoftmax { margin, scale } => Self {
                row_norm: true,
                col_norm: true,
                ..plain(f64::from(scale), Target::Multiple(margin))
            },
            ClassifierKind::SphereFace { margin, scale } => Self {
                row_norm: true,
                ..plain(f64::from(scale), Target::Multiple(margin))
            },
            ClassifierKind::NormalizedSoftmax { temperature } => {
                plain(1.0 / f64::from(temperature), Target::Plain)
            }
            // −s ‖x̂ − p̂‖² = 2s c − 2s.
            ClassifierKind::ProxyNca { softmax_scale } => Self {
                bias: -2.0 * f64::from(softmax_scale),
                ..plain(2.0 * f64::from(softmax_scale), Target::Plain)
            },
            // Not a logit: its own pass (`classifier_anchor`) reads only the centres.
            ClassifierKind::ProxyAnchor { alpha, .. } => plain(f64::from(alpha), Target::Plain),
            ClassifierKind::SoftTriple {
                centers_per_class,
                la,
                gamma,
                margin,
            } => Self {
                centres: Centres::Soft(centers_per_class, 1.0 / f64::from(gamma)),
                ..plain(f64::from(la), Target::Shift(f64::from(margin)))
            },
        }
    }

    /// The target class's logit and its slope `∂z/∂c`, for `c`, `a` and `b`.
    pub(super) fn target(&self, c: f64, a: f64, b: f64) -> (f64, f64) {
        let (psi, slope) = margin(self.target, c);
        let k = self.scale * a * b;
        (k * psi + self.bias, k * slope)
    }
}

/// `ψ(c)` and `ψ'(c)` of a target.
fn margin(target: Target, c: f64) -> (f64, f64) {
    match target {
        Target::Plain => (c, 1.0),
        Target::Shift(delta) => (c - delta, 1.0),
        Target::Arc { m, limit, exact } => {
            // PML: θ = acos(clamp(c, −1, 1)), whose gradient vanishes past ±1.
            let inside = c.abs() <= 1.0;
            let theta = c.clamp(-1.0, 1.0).acos();
            if theta as f32 <= limit {
                let slope = if !exact {
                    1.0
                } else if inside {
                    (theta + m).sin() / (1.0 - c * c).sqrt().max(SIN_FLOOR)
                } else {
                    0.0
                };
                ((theta + m).cos(), slope)
            } else {
                let slope = if inside || !exact { 1.0 } else { 0.0 };
                (theta.cos() - m * m.sin(), slope)
            }
        }
        Target::Multiple(m) => {
            let theta = c.clamp(-1.0, 1.0).acos() as f32;
            // PML: floor(angle / (π / m)) in f32.
            let k = (theta / (std::f32::consts::PI / m as f32)).floor();
            let sign = if k as i64 % 2 == 0 { 1.0 } else { -1.0 };
            let (cos_m, slope) = cos_multiple(m, c);
            (sign * cos_m - 2.0 * f64::from(k), sign * slope)
        }
    }
}

/// `cos(mθ)` as PML writes it, `Σₙ (−1)ⁿ C(m, 2n) c^{m−2n} (1 − c²)ⁿ` for `n ≤ m/2` (at any `c`,
/// not only `|c| ≤ 1`), and its derivative in `c`.
pub(super) fn cos_multiple(m: u32, c: f64) -> (f64, f64) {
    let s = 1.0 - c * c;
    let (mut value, mut slope) = (0.0, 0.0);
    let mut binom = 1.0; // C(m, 2n)
    for n in 0..=m / 2 {
        if n > 0 {
            let (top, k) = (f64::from(m), f64::from(2 * n));
            binom *= (top - k + 2.0) * (top - k + 1.0) / ((k - 1.0) * k);
        }
        let sign = if n % 2 == 0 { 1.0 } else { -1.0 };
        let p = m - 2 * n;
        let (cp, sn) = (c.powi(p as i32), s.powi(n as i32));
        value += sign * binom * cp * sn;
        if p > 0 {
            slope += sign * binom * f64::from(p) * c.powi(p as i32 - 1) * sn;
        }
        if n > 0 {
            slope -= sign * binom * 2.0 * f64::from(n) * cp * c * s.powi(n as i32 - 1);
        }
    }
    (value, slope)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cos_multiple_is_cos_m_theta_and_its_slope() {
        for m in 1..6 {
            for c in [-0.9f64, -0.3, 0.0, 0.41, 0.97] {
                let (v, s) = cos_multiple(m, c);
                let theta = c.acos();
                assert!((v - (f64::from(m) * theta).cos()).abs() < 1e-12);
                // d cos(mθ)/dc = m sin(mθ) / sin θ.
                let want = f64::from(m) * (f64::from(m) * theta).sin() / theta.sin();
                assert!((s - want).abs() < 1e-9, "m {m} c {c}: {s} vs {want}");
            }
        }
    }

    #[test]
    fn arc_margin_matches_its_branches_and_floor() {
        let t = Target::Arc {
            m: 0.5,
            limit: (std::f64::consts::PI - 0.5) as f32,
            exact: true,
        };
        let (psi, slope) = margin(t, 0.6);
        let theta = 0.6f64.acos();
        assert!((psi - (theta + 0.5).cos()).abs() < 1e-12);
        assert!((slope - (theta + 0.5).sin() / theta.sin()).abs() < 1e-12);
        // The else branch near c = −1: c − m sin m, slope 1.
        let (psi, slope) = margin(t, -0.99);
        assert!((psi - (-0.99 - 0.5 * 0.5f64.sin())).abs() < 1e-12 && slope == 1.0);
        // |c| = 1: the floor; past it, the clamp's zero.
        assert!((margin(t, 1.0).1 - 0.5f64.sin() / SIN_FLOOR).abs() < 1e-6);
        assert_eq!(margin(t, 1.0 + 1e-7).1, 0.0);
    }

    #[test]
    fn soft_centres_slope_is_the_derivative() {
        let cs = [0.3f32, -0.2, 0.7];
        let centres = Centres::Soft(3, 10.0);
        let mut slopes = [0.0; 3];
        let s = centres.reduce(&cs, &mut slopes);
        for k in 0..3 {
            let mut up = cs;
            up[k] += 1e-3;
            let mut ignore = [0.0; 3];
            let numeric = (centres.reduce(&up, &mut ignore) - s) / 1e-3;
            assert!(
                (numeric - slopes[k]).abs() < 1e-2,
                "{k}: {numeric} vs {}",
                slopes[k]
            );
        }
    }
}
