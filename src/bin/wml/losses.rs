//! The loss subcommands: read the batch (and references), run one loss (timed for
//! `--stats`), write the gradients and print the loss as JSON.

use std::path::Path;

use ndarray::Array2;
use wgpu_metric_learning::{
    multiple_negatives_ranking_loss, ntxent_loss, pair_loss, triplet_margin_loss, vicreg_loss,
    Angular, Circle, Contrastive, Distance, FastAp, GeneralizedLifted, Histogram, Hooks,
    InfoNceConfig, InfoNceLoss, Instance, IntraPairVariance, LiftedStructure, Margin, Matryoshka,
    MnrlConfig, MultiSimilarity, NPairs, Nca, PairLossConfig, PairLossRule, Pnp, PnpVariant,
    RankedList, SnrContrastive, SupCon, ThresholdConsistentMargin, TripletLossConfig, TripletRule,
    TripletType, TupletMargin, VicRegConfig,
};

use crate::commands::{context, distance_config, given, json_number, timed, Side};
use crate::loss_args::DynamicSoftMarginArgs;
use crate::loss_args::{
    AngularArgs, CircleArgs, ContrastiveArgs, FastApArgs, GeneralizedLiftedArgs, HistogramArgs,
    InstanceArgs, IntraPairVarianceArgs, LiftedArgs, LossInputs, MarginArgs, MatryoshkaArgs,
    MnrlArgs, MultiSimilarityArgs, NPairsArgs, NcaArgs, NtXentArgs, PnpArgs, PnpVariantArg,
    RankedListArgs, SnrContrastiveArgs, SupConArgs, TcmArgs, TripletLossArgs, TupletArgs,
    VicRegArgs,
};
use crate::npy;
use crate::{Common, Failure, TypeArg};
use wgpu_metric_learning::DynamicSoftMargin;

/// The inputs of a label-based loss, as read from disk.
struct LossSides {
    batch: Side,
    refs: Option<Side>,
}

impl LossSides {
    fn read(a: &LossInputs) -> Result<Self, String> {
        let batch = Side::read(&a.labels, Some(&a.embeddings))?;
        let refs = match (&a.ref_labels, &a.ref_embeddings) {
            (Some(l), Some(e)) => Some(Side::read(l, Some(e))?),
            _ => None,
        };
        Ok(Self { batch, refs })
    }

    fn files(a: &LossInputs) -> Vec<(&str, &Path)> {
        given(&[
            ("embeddings", Some(&a.embeddings)),
            ("labels", Some(&a.labels)),
            ("ref-embeddings", a.ref_embeddings.as_deref()),
            ("ref-labels", a.ref_labels.as_deref()),
        ])
    }
}

/// Writes the gradients a loss returned where the flags ask.
fn write_gradients(
    a: &LossInputs,
    query_grad: &Array2<f32>,
    ref_grad: Option<&Array2<f32>>,
) -> Result<(), Failure> {
    npy::write(&a.grad_out, query_grad)?;
    if let (Some(path), Some(g)) = (&a.ref_grad_out, ref_grad) {
        npy::write(path, g)?;
    }
    Ok(())
}

pub(crate) fn triplet_loss(a: &TripletLossArgs, hooks: &Hooks) -> Result<(), Failure> {
    let sides = LossSides::read(&a.inputs)?;
    let defaults = TripletLossConfig::default();
    let cfg = TripletLossConfig {
        margin: a.margin.unwrap_or(defaults.margin),
        triplets: match a.kind {
            None => TripletRule::AllValid,
            Some(kind) => TripletRule::Margin {
                kind: match kind {
                    TypeArg::All => TripletType::All,
                    TypeArg::Hard => TripletType::Hard,
                    TypeArg::Semihard => TripletType::Semihard,
                    TypeArg::Easy => TripletType::Easy,
                },
                margin: a.miner_margin.unwrap_or(0.2),
            },
        },
        distance: distance_config(&a.inputs.metric, Distance::Euclidean),
        smooth_loss: a.smooth_loss,
        swap: a.swap,
        ref_grad: a.inputs.ref_grad_out.is_some(),
        hooks: hooks.clone(),
        ..defaults
    };
    let ctx = context(&a.common)?;
    let (queries, refs) = (sides.batch.set(), sides.refs.as_ref().map(Side::set));
    let out = timed(
        "loss triplet-margin",
        &ctx,
        &a.common,
        &LossSides::files(&a.inputs),
        || triplet_margin_loss(&ctx, &queries, refs.as_ref(), &cfg),
    )?;
    write_gradients(&a.inputs, &out.query_grad, out.ref_grad.as_ref())?;
    println!(
        "{{\"loss\": {}, \"nonzero\": {}, \"triplets\": {}}}",
        json_number(f64::from(out.loss)),
        out.nonzero,
        out.triplets
    );
    Ok(())
}

pub(crate) fn ntxent(a: &NtXentArgs, hooks: &Hooks) -> Result<(), Failure> {
    let sides = LossSides::read(&a.inputs)?;
    let defaults = InfoNceConfig::default();
    let cfg = InfoNceConfig {
        temperature: a.temperature.unwrap_or(defaults.temperature),
        distance: distance_config(&a.inputs.metric, Distance::Cosine),
        ref_grad: a.inputs.ref_grad_out.is_some(),
        hooks: hooks.clone(),
        matryoshka: matryoshka(&a.matryoshka),
        ..defaults
    };
    let ctx = context(&a.common)?;
    let (queries, refs) = (sides.batch.set(), sides.refs.as_ref().map(Side::set));
    let out = timed(
        "loss ntxent",
        &ctx,
        &a.common,
        &LossSides::files(&a.inputs),
        || ntxent_loss(&ctx, &queries, refs.as_ref(), &cfg),
    )?;
    write_gradients(&a.inputs, &out.query_grad, out.ref_grad.as_ref())?;
    print_info_nce(&out);
    Ok(())
}

pub(crate) fn mnrl(a: &MnrlArgs, hooks: &Hooks) -> Result<(), Failure> {
    let anchors = npy::read_embeddings(&a.anchors)?;
    let candidates = npy::read_embeddings(&a.candidates)?;
    let cfg = MnrlConfig {
        scale: a.scale.unwrap_or(MnrlConfig::default().scale),
        matryoshka: matryoshka(&a.matryoshka),
        hooks: hooks.clone(),
    };
    let ctx = context(&a.common)?;
    let files = given(&[
        ("anchors", Some(&a.anchors)),
        ("candidates", Some(&a.candidates)),
    ]);
    let out = timed("loss mnrl", &ctx, &a.common, &files, || {
        multiple_negatives_ranking_loss(&ctx, &anchors, &candidates, &cfg)
    })?;
    npy::write(&a.grad_out, &out.query_grad)?;
    if let (Some(path), Some(g)) = (&a.candidates_grad_out, &out.ref_grad) {
        npy::write(path, g)?;
    }
    print_info_nce(&out);
    Ok(())
}

pub(crate) fn contrastive(a: &ContrastiveArgs, hooks: &Hooks) -> Result<(), Failure> {
    let d = Contrastive::default();
    let rule = Contrastive {
        pos_margin: a.pos_margin.unwrap_or(d.pos_margin),
        neg_margin: a.neg_margin.unwrap_or(d.neg_margin),
    };
    pair("loss contrastive", (&a.inputs, &a.common), rule, hooks)
}

pub(crate) fn multi_similarity(a: &MultiSimilarityArgs, hooks: &Hooks) -> Result<(), Failure> {
    let d = MultiSimilarity::default();
    let rule = MultiSimilarity {
        alpha: a.alpha.unwrap_or(d.alpha),
        beta: a.beta.unwrap_or(d.beta),
        base: a.base.unwrap_or(d.base),
    };
    pair("loss multi-similarity", (&a.inputs, &a.common), rule, hooks)
}

pub(crate) fn supcon(a: &SupConArgs, hooks: &Hooks) -> Result<(), Failure> {
    let temperature = a.temperature.unwrap_or(SupCon::default().temperature);
    pair(
        "loss supcon",
        (&a.inputs, &a.common),
        SupCon { temperature },
        hooks,
    )
}

pub(crate) fn circle(a: &CircleArgs, hooks: &Hooks) -> Result<(), Failure> {
    let d = Circle::default();
    let rule = Circle {
        m: a.m.unwrap_or(d.m),
        gamma: a.gamma.unwrap_or(d.gamma),
    };
    pair("loss circle", (&a.inputs, &a.common), rule, hooks)
}

pub(crate) fn nca(a: &NcaArgs, hooks: &Hooks) -> Result<(), Failure> {
    let softmax_scale = a.softmax_scale.unwrap_or(Nca::default().softmax_scale);
    pair(
        "loss nca",
        (&a.inputs, &a.common),
        Nca { softmax_scale },
        hooks,
    )
}

pub(crate) fn generalized_lifted(a: &GeneralizedLiftedArgs, hooks: &Hooks) -> Result<(), Failure> {
    let d = GeneralizedLifted::default();
    let rule = GeneralizedLifted {
        pos_margin: a.pos_margin.unwrap_or(d.pos_margin),
        neg_margin: a.neg_margin.unwrap_or(d.neg_margin),
    };
    pair(
        "loss generalized-lifted",
        (&a.inputs, &a.common),
        rule,
        hooks,
    )
}

pub(crate) fn margin(a: &MarginArgs, hooks: &Hooks) -> Result<(), Failure> {
    let d = Margin::default();
    let rule = Margin {
        margin: a.margin.unwrap_or(d.margin),
        nu: a.nu.unwrap_or(d.nu),
        beta: a.beta.unwrap_or(d.beta),
        learn_beta: a.learn_beta,
    };
    pair("loss margin", (&a.inputs, &a.common), rule, hooks)
}

pub(crate) fn fast_ap(a: &FastApArgs, hooks: &Hooks) -> Result<(), Failure> {
    let num_bins = a.num_bins.unwrap_or(FastAp::default().num_bins);
    pair(
        "loss fast-ap",
        (&a.inputs, &a.common),
        FastAp { num_bins },
        hooks,
    )
}

pub(crate) fn lifted(a: &LiftedArgs, hooks: &Hooks) -> Result<(), Failure> {
    let d = LiftedStructure::default();
    let rule = LiftedStructure {
        pos_margin: a.pos_margin.unwrap_or(d.pos_margin),
        neg_margin: a.neg_margin.unwrap_or(d.neg_margin),
    };
    pair("loss lifted-structure", (&a.inputs, &a.common), rule, hooks)
}

pub(crate) fn histogram(a: &HistogramArgs, hooks: &Hooks) -> Result<(), Failure> {
    let n_bins = a.n_bins.unwrap_or(Histogram::default().n_bins);
    let rule = Histogram { n_bins };
    pair("loss histogram", (&a.inputs, &a.common), rule, hooks)
}

pub(crate) fn tuplet(a: &TupletArgs, hooks: &Hooks) -> Result<(), Failure> {
    let d = TupletMargin::default();
    let rule = TupletMargin {
        margin: a.margin.unwrap_or(d.margin),
        scale: a.scale.unwrap_or(d.scale),
    };
    pair("loss tuplet-margin", (&a.inputs, &a.common), rule, hooks)
}

pub(crate) fn intra_pair_variance(a: &IntraPairVarianceArgs, hooks: &Hooks) -> Result<(), Failure> {
    let d = IntraPairVariance::default();
    let rule = IntraPairVariance {
        pos_eps: a.pos_eps.unwrap_or(d.pos_eps),
        neg_eps: a.neg_eps.unwrap_or(d.neg_eps),
    };
    pair(
        "loss intra-pair-variance",
        (&a.inputs, &a.common),
        rule,
        hooks,
    )
}

pub(crate) fn ranked_list(a: &RankedListArgs, hooks: &Hooks) -> Result<(), Failure> {
    let d = RankedList::default();
    let rule = RankedList {
        margin: a.margin,
        tn: a.tn,
        imbalance: a.imbalance.unwrap_or(d.imbalance),
        alpha: a.alpha,
        tp: a.tp.unwrap_or(d.tp),
    };
    pair("loss ranked-list", (&a.inputs, &a.common), rule, hooks)
}

pub(crate) fn tcm(a: &TcmArgs, hooks: &Hooks) -> Result<(), Failure> {
    let d = ThresholdConsistentMargin::default();
    let rule = ThresholdConsistentMargin {
        lambda_plus: a.lambda_plus.unwrap_or(d.lambda_plus),
        lambda_minus: a.lambda_minus.unwrap_or(d.lambda_minus),
        margin_plus: a.margin_plus.unwrap_or(d.margin_plus),
        margin_minus: a.margin_minus.unwrap_or(d.margin_minus),
    };
    pair("loss tcm", (&a.inputs, &a.common), rule, hooks)
}

pub(crate) fn pnp(a: &PnpArgs, hooks: &Hooks) -> Result<(), Failure> {
    let d = Pnp::default();
    let variant = match a.variant {
        None => d.variant,
        Some(PnpVariantArg::Ds) => PnpVariant::Ds,
        Some(PnpVariantArg::Dq) => PnpVariant::Dq,
        Some(PnpVariantArg::Iu) => PnpVariant::Iu,
        Some(PnpVariantArg::Ib) => PnpVariant::Ib,
        Some(PnpVariantArg::O) => PnpVariant::O,
    };
    let rule = Pnp {
        b: a.b.unwrap_or(d.b),
        alpha: a.alpha.unwrap_or(d.alpha),
        anneal: a.anneal.unwrap_or(d.anneal),
        variant,
    };
    pair("loss pnp", (&a.inputs, &a.common), rule, hooks)
}

pub(crate) fn n_pairs(a: &NPairsArgs, hooks: &Hooks) -> Result<(), Failure> {
    pair("loss n-pairs", (&a.inputs, &a.common), NPairs, hooks)
}

pub(crate) fn instance(a: &InstanceArgs, hooks: &Hooks) -> Result<(), Failure> {
    let gamma = a.gamma.unwrap_or(Instance::default().gamma);
    pair(
        "loss instance",
        (&a.inputs, &a.common),
        Instance { gamma },
        hooks,
    )
}

pub(crate) fn angular(a: &AngularArgs, hooks: &Hooks) -> Result<(), Failure> {
    let alpha = a.alpha.unwrap_or(Angular::default().alpha);
    pair(
        "loss angular",
        (&a.inputs, &a.common),
        Angular { alpha },
        hooks,
    )
}

pub(crate) fn snr_contrastive(a: &SnrContrastiveArgs, hooks: &Hooks) -> Result<(), Failure> {
    let d = SnrContrastive::default();
    let rule = SnrContrastive {
        pos_margin: a.pos_margin.unwrap_or(d.pos_margin),
        neg_margin: a.neg_margin.unwrap_or(d.neg_margin),
    };
    pair("loss snr-contrastive", (&a.inputs, &a.common), rule, hooks)
}

pub(crate) fn dynamic_soft_margin(a: &DynamicSoftMarginArgs, hooks: &Hooks) -> Result<(), Failure> {
    let d = DynamicSoftMargin::default();
    let rule = DynamicSoftMargin {
        min_val: a.min_val.unwrap_or(d.min_val),
        num_bins: a.num_bins.unwrap_or(d.num_bins),
        momentum: a.momentum.unwrap_or(d.momentum),
    };
    pair(
        "loss dynamic-soft-margin",
        (&a.inputs, &a.common),
        rule,
        hooks,
    )
}

pub(crate) fn vicreg(a: &VicRegArgs, hooks: &Hooks) -> Result<(), Failure> {
    let z = npy::read_embeddings(&a.embeddings)?;
    let z2 = match &a.ref_embeddings {
        Some(path) => Some(npy::read_embeddings(path)?),
        None => None,
    };
    let d = VicRegConfig::default();
    let cfg = VicRegConfig {
        invariance_lambda: a.invariance_lambda.unwrap_or(d.invariance_lambda),
        variance_mu: a.variance_mu.unwrap_or(d.variance_mu),
        covariance_v: a.covariance_v.unwrap_or(d.covariance_v),
        eps: a.eps.unwrap_or(d.eps),
        hooks: hooks.clone(),
    };
    let ctx = context(&a.common)?;
    let files = given(&[
        ("embeddings", Some(a.embeddings.as_path())),
        ("ref-embeddings", a.ref_embeddings.as_deref()),
    ]);
    let out = timed("loss vicreg", &ctx, &a.common, &files, || {
        vicreg_loss(&ctx, z.view(), z2.as_ref().map(|z| z.view()), &cfg)
    })?;
    npy::write(&a.grad_out, &out.grad)?;
    if let (Some(path), Some(g)) = (&a.ref_grad_out, &out.ref_grad) {
        npy::write(path, g)?;
    }
    println!(
        "{{\"loss\": {}, \"invariance\": {}, \"variance\": {}, \"covariance\": {}}}",
        json_number(f64::from(out.loss)),
        json_number(f64::from(out.invariance)),
        json_number(f64::from(out.variance)),
        json_number(f64::from(out.covariance))
    );
    Ok(())
}

/// A pair loss with `rule` on the inputs; the distance defaults to the rule's PML default.
fn pair<R: PairLossRule>(
    what: &'static str,
    (inputs, common): (&LossInputs, &Common),
    rule: R,
    hooks: &Hooks,
) -> Result<(), Failure> {
    let sides = LossSides::read(inputs)?;
    let defaults = PairLossConfig::<R>::default();
    let cfg = PairLossConfig {
        rule,
        distance: distance_config(&inputs.metric, defaults.distance.distance),
        ref_grad: inputs.ref_grad_out.is_some(),
        hooks: hooks.clone(),
        ..defaults
    };
    let ctx = context(common)?;
    let (queries, refs) = (sides.batch.set(), sides.refs.as_ref().map(Side::set));
    let out = timed(what, &ctx, common, &LossSides::files(inputs), || {
        pair_loss(&ctx, &queries, refs.as_ref(), &cfg)
    })?;
    write_gradients(inputs, &out.query_grad, out.ref_grad.as_ref())?;
    let beta_grad = out.beta_grad.map_or(String::new(), |g| {
        format!(", \"beta_grad\": {}", json_number(f64::from(g)))
    });
    println!(
        "{{\"loss\": {}, \"nonzero\": {}, \"positive_pairs\": {}, \"negative_pairs\": {}{beta_grad}}}",
        json_number(f64::from(out.loss)),
        out.nonzero,
        out.positive_pairs,
        out.negative_pairs
    );
    Ok(())
}

fn print_info_nce(out: &InfoNceLoss) {
    let widths = match out.matryoshka_losses.is_empty() {
        true => String::new(),
        false => {
            let each: Vec<String> = out
                .matryoshka_losses
                .iter()
                .map(|&l| json_number(f64::from(l)))
                .collect();
            format!(", \"matryoshka_losses\": [{}]", each.join(", "))
        }
    };
    println!(
        "{{\"loss\": {}, \"positive_pairs\": {}, \"negative_pairs\": {}{widths}}}",
        json_number(f64::from(out.loss)),
        out.positive_pairs,
        out.negative_pairs
    );
}

/// The Matryoshka widths asked for (weights default to 1 each; a count that differs is the
/// library's typed error).
fn matryoshka(a: &MatryoshkaArgs) -> Option<Matryoshka> {
    let dims = a.matryoshka_dims.clone()?;
    Some(match a.matryoshka_weights.clone() {
        Some(weights) => Matryoshka { dims, weights },
        None => Matryoshka::new(dims),
    })
}
