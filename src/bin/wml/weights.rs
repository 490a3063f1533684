//! `wml weights step|export`: the class weights of `wml loss arcface|cosface|…` trained and
//! kept between runs, in the library's checkpoints (one process's here; a checkpoint saved
//! by any number of processes loads whole).

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand, ValueEnum};
use wgpu_metric_learning::{
    export_weights_npy, load_weights, save_weights, weights_checkpoint_classes, weights_step,
    ClassifierKind, ClassifierOptions, OptimizerState, WeightOptimizer, WeightsShard,
};

use crate::commands::{context, given, timed};
use crate::npy;
use crate::{Common, Failure};

#[derive(Subcommand)]
pub(crate) enum WeightsCommand {
    /// One optimizer step (torch's SGD or AdamW) on class weights, from --weights (no state
    /// yet) or from the checkpoint --checkpoint (its weights, optimizer and state), with the
    /// gradient --grad (what `wml loss <name> --weight-grad-out` writes). Saves the weights,
    /// the optimizer and its state as the checkpoint --out (atomically: until it is whole, a
    /// load finds the one before) and prints {"steps", "classes", "optimizer", "lr"}.
    Step(StepArgs),
    /// Streams the whole weights of the checkpoint --checkpoint into one float32 .npy in
    /// PML's layout, for inference (every shard checked as it is read; a damaged one leaves
    /// nothing at --out), and prints {"bytes"}.
    Export(ExportArgs),
}

/// The loss whose weights a checkpoint holds.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum LossName {
    Arcface,
    SubCenterArcface,
    Cosface,
    LargeMarginSoftmax,
    Sphereface,
    NormalizedSoftmax,
    ProxyNca,
    ProxyAnchor,
    SoftTriple,
}

/// The weights' layout: the loss, and its centres per class.
#[derive(Args)]
pub(crate) struct Layout {
    /// The loss the weights belong to: (d, classes · centres) for W and fc, (classes, d) for
    /// the proxies (proxy-nca, proxy-anchor).
    #[arg(long, value_enum)]
    loss: LossName,
    /// sub-center-arcface: centres per class. Default 3.
    #[arg(long)]
    sub_centers: Option<usize>,
    /// soft-triple: centres per class. Default 10.
    #[arg(long)]
    centers_per_class: Option<usize>,
}

/// `--optimizer`.
#[derive(Debug, Clone, Copy, PartialEq, ValueEnum)]
pub(crate) enum OptimizerArg {
    /// torch.optim.SGD (defaults: momentum 0, dampening 0, weight decay 0, no Nesterov).
    Sgd,
    /// torch.optim.AdamW (defaults: betas 0.9, 0.999, eps 1e-8, weight decay 1e-2).
    Adamw,
}

#[derive(Args)]
pub(crate) struct StepArgs {
    #[command(flatten)]
    layout: Layout,
    /// The weights' gradient: float32 or float64, in the weights' shape.
    #[arg(long)]
    grad: PathBuf,
    /// Start from these weights (PML's layout), with no optimizer state yet; needs
    /// --optimizer and --lr.
    #[arg(
        long,
        conflicts_with = "checkpoint",
        required_unless_present = "checkpoint"
    )]
    weights: Option<PathBuf>,
    /// Start from this checkpoint: its weights, optimizer and state.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// The checkpoint written (a directory, made if missing; --checkpoint's own is fine).
    #[arg(long)]
    out: PathBuf,
    /// The optimizer. With --checkpoint, default the saved one, whose settings the options
    /// below then change (a learning-rate schedule); naming the other one is refused where
    /// the checkpoint holds a state, which would not fit it.
    #[arg(long, value_enum)]
    optimizer: Option<OptimizerArg>,
    /// Learning rate (≥ 0).
    #[arg(long)]
    lr: Option<f32>,
    /// sgd: momentum factor (≥ 0).
    #[arg(long)]
    momentum: Option<f32>,
    /// sgd: dampening of the momentum.
    #[arg(long)]
    dampening: Option<f32>,
    /// sgd: Nesterov momentum, true or false (needs momentum > 0 and no dampening).
    #[arg(long)]
    nesterov: Option<bool>,
    /// adamw: the moments' decays B1,B2, each in [0, 1).
    #[arg(long, value_parser = crate::parse_range)]
    betas: Option<(f32, f32)>,
    /// adamw: added to the denominator (≥ 0).
    #[arg(long)]
    eps: Option<f32>,
    /// L2 penalty (sgd) or decoupled weight decay (adamw), ≥ 0.
    #[arg(long)]
    weight_decay: Option<f32>,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Args)]
pub(crate) struct ExportArgs {
    #[command(flatten)]
    layout: Layout,
    /// The checkpoint's directory.
    #[arg(long)]
    checkpoint: PathBuf,
    /// Output float32 .npy: every class's weights in PML's layout.
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    pub(crate) common: Common,
}

/// The kind with PML's defaults and the layout's centres (only the layout matters here).
fn kind(layout: &Layout) -> Result<ClassifierKind, String> {
    let name = match layout.loss.to_possible_value() {
        Some(v) => v.get_name().to_string(),
        None => return Err("--loss: no such loss".into()),
    };
    let centres = match layout.loss {
        LossName::SubCenterArcface => layout.sub_centers,
        LossName::SoftTriple => layout.centers_per_class,
        _ => None,
    };
    let stray = match layout.loss {
        LossName::SubCenterArcface => layout.centers_per_class.map(|_| "--centers-per-class"),
        LossName::SoftTriple => layout.sub_centers.map(|_| "--sub-centers"),
        _ => match (layout.sub_centers, layout.centers_per_class) {
            (Some(_), _) => Some("--sub-centers"),
            (None, Some(_)) => Some("--centers-per-class"),
            (None, None) => None,
        },
    };
    if let Some(flag) = stray {
        return Err(format!("{flag} does not apply to loss {name}"));
    }
    let options = ClassifierOptions {
        centres,
        ..Default::default()
    };
    ClassifierKind::from_options(&name, &options).map_err(|e| format!("--loss {name}: {e}"))
}

/// What a checkpoint's optimizer state holds: any state at all, and its buffers.
#[derive(Debug, Clone, Copy, Default)]
struct Kept {
    any: bool,
    buffers: usize,
}

/// The optimizer: the checkpoint's (`saved`, with whether it holds a state) or, named by
/// `--optimizer`, torch's defaults, with the settings given; a setting the optimizer does not
/// take, or a change its saved state would not fit, is an error.
fn optimizer(
    a: &StepArgs,
    saved: Option<(WeightOptimizer, Kept)>,
) -> Result<WeightOptimizer, String> {
    let named = a.optimizer.map(|o| match o {
        OptimizerArg::Sgd => WeightOptimizer::sgd(0.0, 0.0),
        OptimizerArg::Adamw => WeightOptimizer::adamw(0.0),
    });
    let kept = saved.map_or(Kept::default(), |s| s.1);
    let base = match (named, saved) {
        (Some(named), Some((saved, kept)))
            if kept.any && std::mem::discriminant(&named) != std::mem::discriminant(&saved) =>
        {
            return Err(format!(
                "--optimizer: the checkpoint holds {}'s state, which another does not fit",
                saved.name()
            ));
        }
        // Naming the checkpoint's own optimizer keeps its settings.
        (Some(named), Some((saved, _)))
            if std::mem::discriminant(&named) == std::mem::discriminant(&saved) =>
        {
            saved
        }
        (Some(named), _) => named,
        (None, Some((saved, _))) => saved,
        (None, None) => return Err("--weights needs --optimizer and --lr".into()),
    };
    let refuse = |flag: &str| Err(format!("{flag} does not apply to {}", base.name()));
    let mut opt = base;
    let set = |field: &mut f32, given: Option<f32>| *field = given.unwrap_or(*field);
    match &mut opt {
        WeightOptimizer::Sgd {
            lr,
            momentum,
            dampening,
            weight_decay,
            nesterov,
        } => {
            if a.betas.is_some() {
                return refuse("--betas");
            }
            if a.eps.is_some() {
                return refuse("--eps");
            }
            set(lr, a.lr);
            set(momentum, a.momentum);
            set(dampening, a.dampening);
            set(weight_decay, a.weight_decay);
            *nesterov = a.nesterov.unwrap_or(*nesterov);
        }
        WeightOptimizer::AdamW {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } => {
            for (flag, given) in [
                ("--momentum", a.momentum.is_some()),
                ("--dampening", a.dampening.is_some()),
                ("--nesterov", a.nesterov.is_some()),
            ] {
                if given {
                    return refuse(flag);
                }
            }
            set(lr, a.lr);
            set(beta1, a.betas.map(|b| b.0));
            set(beta2, a.betas.map(|b| b.1));
            set(eps, a.eps);
            set(weight_decay, a.weight_decay);
        }
    }
    let lr = opt.lr();
    let fresh = named.is_some_and(|n| {
        saved.is_none_or(|(s, _)| std::mem::discriminant(&n) != std::mem::discriminant(&s))
    });
    if a.lr.is_none() && (lr == 0.0 || fresh) {
        // A fresh optimizer, or a checkpoint saved without one (Python's weights alone).
        return Err("give --lr: the optimizer has no learning rate yet".into());
    }
    if kept.any && opt.buffers() != kept.buffers {
        return Err(format!(
            "--momentum: the checkpoint's state holds {} buffer(s), and SGD keeps one only with \
             momentum > 0: it cannot be turned on or off once there is a state",
            kept.buffers
        ));
    }
    Ok(opt)
}

/// `wml weights step`.
pub(crate) fn step(a: &StepArgs) -> Result<(), Failure> {
    let kind = kind(&a.layout)?;
    let ctx = context(&a.common)?;
    let grad = npy::read_embeddings(&a.grad)?;
    let (mut weights, saved, mut state, classes) = match (&a.weights, &a.checkpoint) {
        (Some(path), _) => {
            let w = npy::read_embeddings(path)?;
            let classes = classes_of(&kind, w.dim(), path)?;
            (w, None, OptimizerState::new(), classes)
        }
        (None, Some(dir)) => {
            let loaded = load_all(&ctx, &a.common, dir, &kind)?;
            let buffers = loaded.state.buffers().len();
            let kept = Kept {
                any: buffers > 0 || loaded.state.steps() > 0,
                buffers,
            };
            let classes = loaded.classes;
            (
                loaded.weights,
                Some((loaded.optimizer, kept)),
                loaded.state,
                classes,
            )
        }
        (None, None) => return Err("give --weights or --checkpoint".into()),
    };
    let opt = optimizer(a, saved)?;
    let files = given(&[
        ("grad", Some(a.grad.as_path())),
        ("weights", a.weights.as_deref()),
        ("checkpoint", a.checkpoint.as_deref()),
    ]);
    timed("weights step", &ctx, &a.common, &files, || {
        weights_step(&ctx, weights.view_mut(), grad.view(), &mut state, &opt)
    })?;
    std::fs::create_dir_all(&a.out)
        .map_err(|e| format!("--out {}: cannot make the directory: {e}", a.out.display()))?;
    let shard = WeightsShard {
        kind: &kind,
        classes,
        first_class: 0,
        weights: weights.view(),
        optimizer: &opt,
        state: &state,
    };
    let out = [("out", a.out.as_path())];
    timed("weights save", &ctx, &a.common, &out, || {
        save_weights(&a.out, &shard)
    })?;
    let lr = opt.lr();
    println!(
        "{{\"steps\": {}, \"classes\": {classes}, \"optimizer\": \"{}\", \"lr\": {}}}",
        state.steps(),
        opt.name(),
        crate::commands::json_number(f64::from(lr))
    );
    Ok(())
}

/// The classes of weights of shape `dim` for `kind` (whole classes of its centres).
fn classes_of(kind: &ClassifierKind, dim: (usize, usize), path: &Path) -> Result<usize, String> {
    let columns = if kind.classes_on_rows() { dim.0 } else { dim.1 };
    let centres = kind.centres_per_class().max(1);
    if columns % centres != 0 {
        return Err(npy::problem(
            path,
            format!("{columns} centres are not whole classes of {centres}"),
        ));
    }
    Ok(columns / centres)
}

/// Every class of the checkpoint in `dir`, its class count read from its manifest first.
fn load_all(
    ctx: &wgpu_metric_learning::Context,
    common: &Common,
    dir: &Path,
    kind: &ClassifierKind,
) -> Result<wgpu_metric_learning::LoadedWeights, Failure> {
    let files = [("checkpoint", dir)];
    timed("weights load", ctx, common, &files, || {
        let classes = weights_checkpoint_classes(dir)?;
        load_weights(ctx, dir, kind, 0..classes)
    })
}

/// `wml weights export`.
pub(crate) fn export(a: &ExportArgs) -> Result<(), Failure> {
    let kind = kind(&a.layout)?;
    let ctx = context(&a.common)?;
    let files = [("checkpoint", a.checkpoint.as_path())];
    let bytes = timed("weights export", &ctx, &a.common, &files, || {
        export_weights_npy(&a.checkpoint, &kind, &a.out)
    })?;
    println!("{{\"bytes\": {bytes}}}");
    Ok(())
}
