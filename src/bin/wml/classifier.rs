//! `wml loss arcface|cosface|…`: PML's losses with class weights, one subcommand per loss
//! sharing one set of options (those that do not apply to the chosen loss are refused).

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use wgpu_metric_learning::{
    classifier_loss, ClassifierKind, ClassifierLossConfig, Hooks, MarginGrad,
};

use crate::commands::{context, given, json_number, timed};
use crate::npy;
use crate::{Common, Failure};

/// Which loss a classifier subcommand runs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Which {
    ArcFace,
    SubCenterArcFace,
    CosFace,
    LargeMarginSoftmax,
    SphereFace,
    NormalizedSoftmax,
    ProxyNca,
    SoftTriple,
}

/// `--margin-grad`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum MarginGradArg {
    /// PML's: through acos.
    Pml,
    /// insightface's: straight through the margin.
    StraightThrough,
}

/// The options of the classifier losses.
#[derive(Args)]
pub(crate) struct ClassifierArgs {
    /// Embeddings of the batch, (b, d).
    #[arg(long)]
    pub(crate) embeddings: PathBuf,
    /// Class indices of the batch, (b,), in [0, classes).
    #[arg(long)]
    pub(crate) labels: PathBuf,
    /// The class weights in PML's layout: (d, classes · centres) for W and fc, (classes, d)
    /// for ProxyNCA's proxies.
    #[arg(long)]
    pub(crate) weights: PathBuf,
    /// The margin: degrees (arcface, sub-center-arcface; default 28.6), a cosine (cosface,
    /// default 0.35; soft-triple, default 0.01), or the angle's integer multiple
    /// (large-margin-softmax, sphereface; default 4).
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) margin: Option<f32>,
    /// The logits' scale: default 64 (arcface, sub-center-arcface, cosface), 1
    /// (large-margin-softmax, sphereface).
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) scale: Option<f32>,
    /// Whose gradient ArcFace's margin has. Default pml.
    #[arg(long, value_enum)]
    pub(crate) margin_grad: Option<MarginGradArg>,
    /// sub-center-arcface: centres per class. Default 3.
    #[arg(long)]
    pub(crate) sub_centers: Option<usize>,
    /// normalized-softmax: default 0.05.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) temperature: Option<f32>,
    /// proxy-nca: default 1.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) softmax_scale: Option<f32>,
    /// soft-triple: default 10.
    #[arg(long)]
    pub(crate) centers_per_class: Option<usize>,
    /// soft-triple: the logits' scale. Default 20.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) la: Option<f32>,
    /// soft-triple: the centres' softmax temperature. Default 0.1.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) gamma: Option<f32>,
    /// Output (b, d) float32 array: the gradient with respect to --embeddings.
    #[arg(long)]
    pub(crate) grad_out: PathBuf,
    /// Output float32 array in --weights' shape: the gradient with respect to the weights.
    #[arg(long)]
    pub(crate) weight_grad_out: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) common: Common,
}

impl Which {
    fn name(self) -> &'static str {
        match self {
            Self::ArcFace => "arcface",
            Self::SubCenterArcFace => "sub-center-arcface",
            Self::CosFace => "cosface",
            Self::LargeMarginSoftmax => "large-margin-softmax",
            Self::SphereFace => "sphereface",
            Self::NormalizedSoftmax => "normalized-softmax",
            Self::ProxyNca => "proxy-nca",
            Self::SoftTriple => "soft-triple",
        }
    }

    /// The loss with PML's defaults, overridden by the options that apply; an option that
    /// does not apply is an error.
    fn kind(self, a: &ClassifierArgs) -> Result<ClassifierKind, String> {
        let given = [
            ("--margin", a.margin.is_some()),
            ("--scale", a.scale.is_some()),
            ("--margin-grad", a.margin_grad.is_some()),
            ("--sub-centers", a.sub_centers.is_some()),
            ("--temperature", a.temperature.is_some()),
            ("--softmax-scale", a.softmax_scale.is_some()),
            ("--centers-per-class", a.centers_per_class.is_some()),
            ("--la", a.la.is_some()),
            ("--gamma", a.gamma.is_some()),
        ];
        let applies: &[&str] = match self {
            Self::ArcFace => &["--margin", "--scale", "--margin-grad"],
            Self::SubCenterArcFace => &["--margin", "--scale", "--margin-grad", "--sub-centers"],
            Self::CosFace | Self::LargeMarginSoftmax | Self::SphereFace => &["--margin", "--scale"],
            Self::NormalizedSoftmax => &["--temperature"],
            Self::ProxyNca => &["--softmax-scale"],
            Self::SoftTriple => &["--margin", "--centers-per-class", "--la", "--gamma"],
        };
        if let Some((flag, _)) = given.iter().find(|(f, set)| *set && !applies.contains(f)) {
            return Err(format!("{flag} does not apply to loss {}", self.name()));
        }
        let grad = match a.margin_grad {
            Some(MarginGradArg::StraightThrough) => MarginGrad::StraightThrough,
            _ => MarginGrad::Pml,
        };
        let multiple = |d: u32| match a.margin {
            None => Ok(d),
            Some(m) if m >= 1.0 && m.fract() == 0.0 && m <= u32::MAX as f32 => Ok(m as u32),
            Some(m) => Err(format!(
                "--margin {m}: {} takes an integer of at least 1",
                self.name()
            )),
        };
        Ok(match self {
            Self::ArcFace => ClassifierKind::ArcFace {
                margin: a.margin.unwrap_or(28.6),
                scale: a.scale.unwrap_or(64.0),
                margin_grad: grad,
            },
            Self::SubCenterArcFace => ClassifierKind::SubCenterArcFace {
                margin: a.margin.unwrap_or(28.6),
                scale: a.scale.unwrap_or(64.0),
                sub_centers: a.sub_centers.unwrap_or(3),
                margin_grad: grad,
            },
            Self::CosFace => ClassifierKind::CosFace {
                margin: a.margin.unwrap_or(0.35),
                scale: a.scale.unwrap_or(64.0),
            },
            Self::LargeMarginSoftmax => ClassifierKind::LargeMarginSoftmax {
                margin: multiple(4)?,
                scale: a.scale.unwrap_or(1.0),
            },
            Self::SphereFace => ClassifierKind::SphereFace {
                margin: multiple(4)?,
                scale: a.scale.unwrap_or(1.0),
            },
            Self::NormalizedSoftmax => ClassifierKind::NormalizedSoftmax {
                temperature: a.temperature.unwrap_or(0.05),
            },
            Self::ProxyNca => ClassifierKind::ProxyNca {
                softmax_scale: a.softmax_scale.unwrap_or(1.0),
            },
            Self::SoftTriple => ClassifierKind::SoftTriple {
                centers_per_class: a.centers_per_class.unwrap_or(10),
                la: a.la.unwrap_or(20.0),
                gamma: a.gamma.unwrap_or(0.1),
                margin: a.margin.unwrap_or(0.01),
            },
        })
    }
}

/// Runs the loss `which`: writes the gradients, prints `{"loss", "count"}`.
pub(crate) fn run(which: Which, a: &ClassifierArgs, hooks: &Hooks) -> Result<(), Failure> {
    let kind = which.kind(a)?;
    let x = npy::read_embeddings(&a.embeddings)?;
    let labels = npy::read_labels(&a.labels)?;
    let w = npy::read_embeddings(&a.weights)?;
    let labels = labels.to_vec();
    let cfg = ClassifierLossConfig {
        kind,
        hooks: hooks.clone(),
    };
    let ctx = context(&a.common)?;
    let files = given(&[
        ("embeddings", Some(a.embeddings.as_path())),
        ("labels", Some(a.labels.as_path())),
        ("weights", Some(a.weights.as_path())),
    ]);
    let name = format!("loss {}", which.name());
    let out = timed(&name, &ctx, &a.common, &files, || {
        classifier_loss(&ctx, x.view(), &labels, w.view(), &cfg)
    })?;
    npy::write(&a.grad_out, &out.grad)?;
    if let Some(path) = &a.weight_grad_out {
        npy::write(path, &out.weight_grad)?;
    }
    println!(
        "{{\"loss\": {}, \"count\": {}}}",
        json_number(f64::from(out.loss)),
        out.count
    );
    Ok(())
}
