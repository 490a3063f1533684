//! `wml loss arcface|cosface|…`: PML's losses with class weights, one subcommand per loss
//! sharing one set of options (those that do not apply to the chosen loss are refused).

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use wgpu_metric_learning::{
    classifier_loss, ClassSampling, ClassifierKind, ClassifierLossConfig, ClassifierOptions, Error,
    Hooks, MarginGrad,
};

use crate::commands::{context, given, json_number, timed};
use crate::npy;
use crate::{Common, Failure};

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
    /// for the proxies (proxy-nca, proxy-anchor).
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
    /// proxy-anchor: default 32 (its --margin: default 0.1).
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) alpha: Option<f32>,
    /// PartialFC's sampling: each class without a row in the batch takes part with this
    /// probability, in (0, 1]. Default 1 (every class). Not for proxy-anchor.
    #[arg(long)]
    pub(crate) sample_rate: Option<f32>,
    /// The sampling's seed (the same seed draws the same classes). Default 0.
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// Output (b, d) float32 array: the gradient with respect to --embeddings.
    #[arg(long)]
    pub(crate) grad_out: PathBuf,
    /// Output float32 array in --weights' shape: the gradient with respect to the weights.
    #[arg(long)]
    pub(crate) weight_grad_out: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) common: Common,
    #[cfg(feature = "mpi")]
    #[command(flatten)]
    pub(crate) distributed: crate::DistributedArgs,
}

/// The loss `name` (the subcommand's) with PML's defaults, overridden by the options given (one
/// that the loss does not take is an error).
pub(crate) fn kind(name: &str, a: &ClassifierArgs) -> Result<ClassifierKind, String> {
    // Each loss names its centres its own way.
    let (centres, other) = match name {
        "soft-triple" => (a.centers_per_class, ("--sub-centers", a.sub_centers)),
        _ => (a.sub_centers, ("--centers-per-class", a.centers_per_class)),
    };
    if other.1.is_some() {
        return Err(format!("{} does not apply to loss {}", other.0, name));
    }
    let options = ClassifierOptions {
        margin: a.margin,
        scale: a.scale,
        margin_grad: a.margin_grad.map(|g| match g {
            MarginGradArg::Pml => MarginGrad::Pml,
            MarginGradArg::StraightThrough => MarginGrad::StraightThrough,
        }),
        centres,
        temperature: a.temperature,
        softmax_scale: a.softmax_scale,
        la: a.la,
        gamma: a.gamma,
        alpha: a.alpha,
    };
    ClassifierKind::from_options(name, &options).map_err(|e| match e {
        Error::InvalidParameter { what, rule, .. } if rule.contains("does not take") => {
            let flag = if what == "centres" {
                "sub-centers".into()
            } else {
                what.replace('_', "-")
            };
            format!("--{flag} does not apply to loss {}", name)
        }
        e => e.to_string(),
    })
}

/// `--sample-rate` and `--seed` (a seed without a rate is an error: it would change nothing).
pub(crate) fn sampling(a: &ClassifierArgs) -> Result<ClassSampling, String> {
    match (a.sample_rate, a.seed) {
        (None, Some(_)) => Err("--seed needs --sample-rate".into()),
        (rate, seed) => Ok(ClassSampling {
            rate: rate.unwrap_or(1.0),
            seed: seed.unwrap_or(0),
        }),
    }
}

/// Runs the loss `name` (`arcface`, `cosface`, …: the subcommand's name): writes the
/// gradients, prints `{"loss", "count", "classes_used"}`.
pub(crate) fn run(name: &'static str, a: &ClassifierArgs, hooks: &Hooks) -> Result<(), Failure> {
    #[cfg(feature = "mpi")]
    if a.distributed.distributed {
        return crate::distributed::classifier(name, a, hooks);
    }
    let kind = kind(name, a)?;
    let sampling = sampling(a)?;
    let x = npy::read_embeddings(&a.embeddings)?;
    let labels = npy::read_labels(&a.labels)?;
    let w = npy::read_embeddings(&a.weights)?;
    let labels = labels.to_vec();
    let cfg = ClassifierLossConfig {
        kind,
        sampling,
        hooks: hooks.clone(),
    };
    let ctx = context(&a.common)?;
    let files = given(&[
        ("embeddings", Some(a.embeddings.as_path())),
        ("labels", Some(a.labels.as_path())),
        ("weights", Some(a.weights.as_path())),
    ]);
    let what = format!("loss {name}");
    let out = timed(&what, &ctx, &a.common, &files, || {
        classifier_loss(&ctx, x.view(), &labels, w.view(), &cfg)
    })?;
    npy::write(&a.grad_out, &out.grad)?;
    if let Some(path) = &a.weight_grad_out {
        npy::write(path, &out.weight_grad)?;
    }
    print_loss(out.loss, out.count, out.classes_used);
    Ok(())
}

/// Prints `{"loss", "count", "classes_used"}`.
pub(crate) fn print_loss(loss: f32, count: usize, classes_used: usize) {
    println!(
        "{{\"loss\": {}, \"count\": {}, \"classes_used\": {}}}",
        json_number(f64::from(loss)),
        count,
        classes_used
    );
}
