//! The losses with their gradients: `triplet_margin_loss`, `ntxent_loss`,
//! `multiple_negatives_ranking_loss` and the pair losses (`contrastive_loss`,
//! `multi_similarity_loss`, `supcon_loss`, `circle_loss`, `nca_loss`,
//! `generalized_lifted_structure_loss`, `margin_loss`, `fast_ap_loss`).

use ndarray::Array2;
use numpy::{IntoPyArray, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use wgpu_metric_learning as wml;
use wml::{
    Angular, Circle, Contrastive, DynamicSoftMargin, DynamicSoftMarginConfig, FastAp,
    GeneralizedLifted, Histogram, InfoNceConfig, InfoNceLoss, Instance, IntraPairVariance,
    LiftedStructure, Margin, Matryoshka, MnrlConfig, MultiSimilarity, NPairs, Nca, PairLossConfig,
    PairLossRule, Pnp, PnpVariant, RankedList, SnrContrastive, SupCon, ThresholdConsistentMargin,
    TripletLossConfig, TupletMargin, VicRegConfig,
};

use crate::call::{distance_config, labelled, run, self_exclusion};
use crate::context::PyContext;
use crate::mining::triplet_rule;

/// A loss's value, its two counts and its gradients, as one tuple.
pub(crate) fn loss_tuple<'py>(
    py: Python<'py>,
    loss: f32,
    counts: (u64, u64),
    query_grad: Array2<f32>,
    ref_grad: Option<Array2<f32>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let ref_grad = match ref_grad {
        Some(g) => g.into_pyarray(py).into_any(),
        None => py.None().into_bound(py),
    };
    PyTuple::new(
        py,
        [
            loss.into_pyobject(py)?.into_any(),
            counts.0.into_pyobject(py)?.into_any(),
            counts.1.into_pyobject(py)?.into_any(),
            query_grad.into_pyarray(py).into_any(),
            ref_grad,
        ],
    )
}

/// PML's `TripletMarginLoss` and its gradient: `(loss, nonzero, triplets, grad (b, d),
/// ref_grad (m, d) or None)`.
#[pyfunction]
#[pyo3(signature = (ctx, embeddings, labels, refs = None, *, margin = 0.05, type_of_triplets = None, miner_margin = 0.2, distance = "euclidean", normalize = true, smooth_loss = false, swap = false, self_exclusion = None, ref_grad = false))]
#[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
pub(crate) fn triplet_margin_loss<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    embeddings: PyReadonlyArray2<'py, f32>,
    labels: PyReadonlyArray1<'py, i64>,
    refs: Option<&Bound<'py, PyAny>>,
    margin: f32,
    type_of_triplets: Option<&str>,
    miner_margin: f32,
    distance: &str,
    normalize: bool,
    smooth_loss: bool,
    swap: bool,
    self_exclusion: Option<&Bound<'py, PyAny>>,
    ref_grad: bool,
) -> PyResult<Bound<'py, PyTuple>> {
    let cfg = TripletLossConfig {
        margin,
        triplets: triplet_rule(type_of_triplets, miner_margin)?,
        distance: distance_config(distance, normalize)?,
        smooth_loss,
        swap,
        self_exclusion: self::self_exclusion(self_exclusion)?,
        ref_grad,
        ..Default::default()
    };
    let out = labelled(
        py,
        ctx,
        Some(&embeddings),
        &labels,
        refs,
        move |c, q, r, hooks| {
            wml::triplet_margin_loss(c, q, r, &TripletLossConfig { hooks, ..cfg })
        },
    )?;
    loss_tuple(
        py,
        out.loss,
        (out.nonzero, out.triplets),
        out.query_grad,
        out.ref_grad,
    )
}

/// Matryoshka widths from the keyword arguments (weights default to 1 each).
fn matryoshka(dims: Option<Vec<usize>>, weights: Option<Vec<f32>>) -> PyResult<Option<Matryoshka>> {
    match (dims, weights) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(pyo3::exceptions::PyValueError::new_err(
            "matryoshka_weights without matryoshka_dims",
        )),
        (Some(dims), Some(weights)) => Ok(Some(Matryoshka { dims, weights })),
        (Some(dims), None) => Ok(Some(Matryoshka::new(dims))),
    }
}

/// An InfoNCE loss's tuple, each Matryoshka width's loss appended when there were widths.
fn info_nce_tuple<'py>(
    py: Python<'py>,
    out: InfoNceLoss,
    widths: bool,
) -> PyResult<Bound<'py, PyTuple>> {
    let counts = (out.positive_pairs, out.negative_pairs);
    let losses = out.matryoshka_losses;
    let tuple = loss_tuple(py, out.loss, counts, out.query_grad, out.ref_grad)?;
    if !widths {
        return Ok(tuple);
    }
    let mut items: Vec<Bound<'py, PyAny>> = tuple.iter().collect();
    items.push(losses.into_pyobject(py)?.into_any());
    PyTuple::new(py, items)
}

/// PML's `NTXentLoss` and its gradient: `(loss, positive_pairs, negative_pairs, grad (b, d),
/// ref_grad (m, d) or None)`, then each Matryoshka width's loss when `matryoshka_dims` is
/// given (`loss` is then their weighted sum).
#[pyfunction]
#[pyo3(signature = (ctx, embeddings, labels, refs = None, *, temperature = 0.07, distance = "cosine", normalize = true, self_exclusion = None, ref_grad = false, matryoshka_dims = None, matryoshka_weights = None))]
#[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
pub(crate) fn ntxent_loss<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    embeddings: PyReadonlyArray2<'py, f32>,
    labels: PyReadonlyArray1<'py, i64>,
    refs: Option<&Bound<'py, PyAny>>,
    temperature: f32,
    distance: &str,
    normalize: bool,
    self_exclusion: Option<&Bound<'py, PyAny>>,
    ref_grad: bool,
    matryoshka_dims: Option<Vec<usize>>,
    matryoshka_weights: Option<Vec<f32>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let widths = matryoshka_dims.is_some();
    let cfg = InfoNceConfig {
        temperature,
        distance: distance_config(distance, normalize)?,
        self_exclusion: self::self_exclusion(self_exclusion)?,
        ref_grad,
        matryoshka: matryoshka(matryoshka_dims, matryoshka_weights)?,
        ..Default::default()
    };
    let out = labelled(
        py,
        ctx,
        Some(&embeddings),
        &labels,
        refs,
        move |c, q, r, hooks| wml::ntxent_loss(c, q, r, &InfoNceConfig { hooks, ..cfg }),
    )?;
    info_nce_tuple(py, out, widths)
}

/// sentence-transformers' `MultipleNegativesRankingLoss` and its gradients: `(loss,
/// positive_pairs, negative_pairs, anchor_grad (b, d), candidate_grad (c, d))`, then each
/// Matryoshka width's loss when `matryoshka_dims` is given (`loss` is then their weighted
/// sum, as `MatryoshkaLoss` takes it).
#[pyfunction]
#[pyo3(signature = (ctx, anchors, candidates, *, scale = 20.0, matryoshka_dims = None, matryoshka_weights = None))]
pub(crate) fn multiple_negatives_ranking_loss<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    anchors: PyReadonlyArray2<'py, f32>,
    candidates: PyReadonlyArray2<'py, f32>,
    scale: f32,
    matryoshka_dims: Option<Vec<usize>>,
    matryoshka_weights: Option<Vec<f32>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let (a, c) = (anchors.as_array(), candidates.as_array());
    let inner = &ctx.inner;
    let widths = matryoshka_dims.is_some();
    let matryoshka = matryoshka(matryoshka_dims, matryoshka_weights)?;
    let out = run(py, move |hooks| {
        let cfg = MnrlConfig {
            scale,
            matryoshka,
            hooks,
        };
        wml::multiple_negatives_ranking_loss(inner, a, c, &cfg)
    })?;
    info_nce_tuple(py, out, widths)
}

/// PML's `VICRegLoss` and its gradients: `(loss, invariance, variance, covariance, grad (n,
/// d), ref_grad (n, d) or None)`; `ref_emb` `None` is the embeddings themselves.
#[pyfunction]
#[pyo3(signature = (ctx, embeddings, ref_emb = None, *, invariance_lambda = 25.0, variance_mu = 25.0, covariance_v = 1.0, eps = 1e-4))]
#[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
pub(crate) fn vicreg_loss<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    embeddings: PyReadonlyArray2<'py, f32>,
    ref_emb: Option<PyReadonlyArray2<'py, f32>>,
    invariance_lambda: f32,
    variance_mu: f32,
    covariance_v: f32,
    eps: f32,
) -> PyResult<Bound<'py, PyTuple>> {
    let z = embeddings.as_array();
    let z2 = ref_emb.as_ref().map(|r| r.as_array());
    let inner = &ctx.inner;
    let out = run(py, move |hooks| {
        let cfg = VicRegConfig {
            invariance_lambda,
            variance_mu,
            covariance_v,
            eps,
            hooks,
        };
        wml::vicreg_loss(inner, z, z2, &cfg)
    })?;
    let ref_grad = match out.ref_grad {
        Some(g) => g.into_pyarray(py).into_any(),
        None => py.None().into_bound(py),
    };
    PyTuple::new(
        py,
        [
            out.loss.into_pyobject(py)?.into_any(),
            out.invariance.into_pyobject(py)?.into_any(),
            out.variance.into_pyobject(py)?.into_any(),
            out.covariance.into_pyobject(py)?.into_any(),
            out.grad.into_pyarray(py).into_any(),
            ref_grad,
        ],
    )
}

/// PML's `DynamicSoftMarginLoss` and its gradient, with the histogram PML carries: as
/// [`contrastive_loss`] (`nonzero` the triplets), then the updated histogram; `histogram`
/// is the previous call's (`None`: a fresh loss).
#[pyfunction]
#[pyo3(signature = (ctx, embeddings, labels, refs = None, *, min_val = -2.0, num_bins = 10, momentum = 0.01, histogram = None, distance = "euclidean", normalize = true, self_exclusion = None, ref_grad = false))]
#[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
pub(crate) fn dynamic_soft_margin_loss<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    embeddings: PyReadonlyArray2<'py, f32>,
    labels: PyReadonlyArray1<'py, i64>,
    refs: Option<&Bound<'py, PyAny>>,
    min_val: f32,
    num_bins: u32,
    momentum: f32,
    histogram: Option<Vec<f32>>,
    distance: &str,
    normalize: bool,
    self_exclusion: Option<&Bound<'py, PyAny>>,
    ref_grad: bool,
) -> PyResult<Bound<'py, PyTuple>> {
    let loss = PairLossConfig {
        rule: DynamicSoftMargin {
            min_val,
            num_bins,
            momentum,
        },
        distance: distance_config(distance, normalize)?,
        self_exclusion: self::self_exclusion(self_exclusion)?,
        ref_grad,
        ..Default::default()
    };
    let histogram = histogram.unwrap_or_default();
    let out = labelled(
        py,
        ctx,
        Some(&embeddings),
        &labels,
        refs,
        move |c, q, r, hooks| {
            let cfg = DynamicSoftMarginConfig {
                loss: PairLossConfig { hooks, ..loss },
                histogram,
            };
            wml::dynamic_soft_margin_loss(c, q, r, &cfg)
        },
    )?;
    let l = out.loss;
    let counts = (l.nonzero, l.positive_pairs + l.negative_pairs);
    let tuple = loss_tuple(py, l.loss, counts, l.query_grad, l.ref_grad)?;
    let mut items: Vec<Bound<'py, PyAny>> = tuple.iter().collect();
    items.push(out.histogram.into_pyobject(py)?.into_any());
    PyTuple::new(py, items)
}

/// The sides and options every pair loss takes.
struct PairCall<'a, 'py> {
    embeddings: PyReadonlyArray2<'py, f32>,
    labels: PyReadonlyArray1<'py, i64>,
    refs: Option<&'a Bound<'py, PyAny>>,
    distance: &'a str,
    normalize: bool,
    self_exclusion: Option<&'a Bound<'py, PyAny>>,
    ref_grad: bool,
}

/// A pair loss with `rule`: `(loss, nonzero, pairs, grad (b, d), ref_grad (m, d) or None)`,
/// `pairs` the positive and negative pairs together, and `beta_grad` last for a learnt β.
fn pair<'py, R: PairLossRule + Send + Sync>(
    py: Python<'py>,
    ctx: &PyContext,
    rule: R,
    call: PairCall<'_, 'py>,
) -> PyResult<Bound<'py, PyTuple>> {
    let cfg = PairLossConfig {
        rule,
        distance: distance_config(call.distance, call.normalize)?,
        self_exclusion: self::self_exclusion(call.self_exclusion)?,
        ref_grad: call.ref_grad,
        ..Default::default()
    };
    let out = labelled(
        py,
        ctx,
        Some(&call.embeddings),
        &call.labels,
        call.refs,
        move |c, q, r, hooks| wml::pair_loss(c, q, r, &PairLossConfig { hooks, ..cfg }),
    )?;
    let counts = (out.nonzero, out.positive_pairs + out.negative_pairs);
    let tuple = loss_tuple(py, out.loss, counts, out.query_grad, out.ref_grad)?;
    match out.beta_grad {
        None => Ok(tuple),
        Some(g) => {
            let mut items: Vec<Bound<'py, PyAny>> = tuple.iter().collect();
            items.push(g.into_pyobject(py)?.into_any());
            PyTuple::new(py, items)
        }
    }
}

/// One pair loss's Python function: its rule's parameters (keywords with PML's defaults),
/// PML's default distance, then the sides and options every pair loss takes.
macro_rules! pair_loss_fn {
    ($(#[doc = $doc:literal])* $name:ident, $rule:ident { $($param:ident: $ty:ty = $default:tt),* }, $distance:tt) => {
        $(#[doc = $doc])*
        #[pyfunction]
        #[pyo3(signature = (ctx, embeddings, labels, refs = None, *, $($param = $default,)* distance = $distance, normalize = true, self_exclusion = None, ref_grad = false))]
        #[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
        pub(crate) fn $name<'py>(
            py: Python<'py>,
            ctx: &PyContext,
            embeddings: PyReadonlyArray2<'py, f32>,
            labels: PyReadonlyArray1<'py, i64>,
            refs: Option<&Bound<'py, PyAny>>,
            $($param: $ty,)*
            distance: &str,
            normalize: bool,
            self_exclusion: Option<&Bound<'py, PyAny>>,
            ref_grad: bool,
        ) -> PyResult<Bound<'py, PyTuple>> {
            let call = PairCall {
                embeddings,
                labels,
                refs,
                distance,
                normalize,
                self_exclusion,
                ref_grad,
            };
            pair(py, ctx, $rule { $($param),* }, call)
        }
    };
}

pair_loss_fn!(
    /// PML's `ContrastiveLoss` and its gradient: `(loss, nonzero, pairs, grad, ref_grad or
    /// None)`.
    contrastive_loss,
    Contrastive { pos_margin: f32 = 0.0, neg_margin: f32 = 1.0 },
    "euclidean"
);
pair_loss_fn!(
    /// PML's `MultiSimilarityLoss` and its gradient: as [`contrastive_loss`].
    multi_similarity_loss,
    MultiSimilarity { alpha: f32 = 2.0, beta: f32 = 50.0, base: f32 = 0.5 },
    "cosine"
);
pair_loss_fn!(
    /// PML's `SupConLoss` and its gradient: as [`contrastive_loss`].
    supcon_loss,
    SupCon { temperature: f32 = 0.1 },
    "cosine"
);
pair_loss_fn!(
    /// PML's `CircleLoss` (cosine only) and its gradient: as [`contrastive_loss`].
    circle_loss,
    Circle { m: f32 = 0.4, gamma: f32 = 80.0 },
    "cosine"
);
pair_loss_fn!(
    /// PML's `NCALoss` and its gradient: as [`contrastive_loss`].
    nca_loss,
    Nca { softmax_scale: f32 = 1.0 },
    "squared_euclidean"
);
pair_loss_fn!(
    /// PML's `GeneralizedLiftedStructureLoss` and its gradient: as [`contrastive_loss`].
    generalized_lifted_structure_loss,
    GeneralizedLifted { pos_margin: f32 = 0.0, neg_margin: f32 = 1.0 },
    "euclidean"
);
pair_loss_fn!(
    /// PML's `FastAPLoss` and its gradient: as [`contrastive_loss`].
    fast_ap_loss,
    FastAp { num_bins: u32 = 10 },
    "squared_euclidean"
);
pair_loss_fn!(
    /// PML's `MarginLoss` (one β) and its gradient: as [`contrastive_loss`], with
    /// `beta_grad` last when `learn_beta`.
    margin_loss,
    Margin { margin: f32 = 0.2, nu: f32 = 0.0, beta: f32 = 1.2, learn_beta: bool = false },
    "euclidean"
);
pair_loss_fn!(
    /// PML's `LiftedStructureLoss` and its gradient: as [`contrastive_loss`].
    lifted_structure_loss,
    LiftedStructure { neg_margin: f32 = 1.0, pos_margin: f32 = 0.0 },
    "euclidean"
);
pair_loss_fn!(
    /// PML's `HistogramLoss` (cosine, no references) and its gradient: as
    /// [`contrastive_loss`].
    histogram_loss,
    Histogram { n_bins: u32 = 100 },
    "cosine"
);
pair_loss_fn!(
    /// PML's `TupletMarginLoss` (cosine) and its gradient: as [`contrastive_loss`].
    tuplet_margin_loss,
    TupletMargin { margin: f32 = 5.73, scale: f32 = 64.0 },
    "cosine"
);
pair_loss_fn!(
    /// PML's `IntraPairVarianceLoss` and its gradient: as [`contrastive_loss`].
    intra_pair_variance_loss,
    IntraPairVariance { pos_eps: f32 = 0.01, neg_eps: f32 = 0.01 },
    "cosine"
);
pair_loss_fn!(
    /// PML's `RankedListLoss` and its gradient: as [`contrastive_loss`].
    ranked_list_loss,
    RankedList { margin: f32 = 0.4, tn: f32 = 1.0, imbalance: f32 = 0.5, alpha: Option<f32> = None, tp: f32 = 0.0 },
    "euclidean"
);
pair_loss_fn!(
    /// PML's `ThresholdConsistentMarginLoss` (cosine) and its gradient: as
    /// [`contrastive_loss`].
    threshold_consistent_margin_loss,
    ThresholdConsistentMargin { lambda_plus: f32 = 1.0, lambda_minus: f32 = 1.0, margin_plus: f32 = 0.9, margin_minus: f32 = 0.5 },
    "cosine"
);

pair_loss_fn!(
    /// PML's `NPairsLoss` (no references) and its gradient: as [`contrastive_loss`].
    n_pairs_loss,
    NPairs {},
    "dot"
);
pair_loss_fn!(
    /// PML's `InstanceLoss` (cosine, no references) and its gradient: as
    /// [`contrastive_loss`].
    instance_loss,
    Instance { gamma: f32 = 64.0 },
    "cosine"
);
pair_loss_fn!(
    /// PML's `SignalToNoiseRatioContrastiveLoss` and its gradient: as [`contrastive_loss`];
    /// `distance` stands for the SNR distance (squared Euclidean only), `normalize` is
    /// `SNRDistance`'s `normalize_embeddings`.
    snr_contrastive_loss,
    SnrContrastive { pos_margin: f32 = 0.0, neg_margin: f32 = 1.0 },
    "squared_euclidean"
);
pair_loss_fn!(
    /// PML's `AngularLoss` (Euclidean on normalised rows) and its gradient: as
    /// [`contrastive_loss`]; `alpha` in degrees.
    angular_loss,
    Angular { alpha: f32 = 40.0 },
    "euclidean"
);

/// PML's `PNPLoss` (cosine, no references) and its gradient: as [`contrastive_loss`];
/// `variant` one of PML's `"Ds"`, `"Dq"`, `"Iu"`, `"Ib"`, `"O"`.
#[pyfunction]
#[pyo3(signature = (ctx, embeddings, labels, refs = None, *, b = 2.0, alpha = 1.0, anneal = 0.01, variant = "O", distance = "cosine", normalize = true, self_exclusion = None, ref_grad = false))]
#[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
pub(crate) fn pnp_loss<'py>(
    py: Python<'py>,
    ctx: &PyContext,
    embeddings: PyReadonlyArray2<'py, f32>,
    labels: PyReadonlyArray1<'py, i64>,
    refs: Option<&Bound<'py, PyAny>>,
    b: f32,
    alpha: f32,
    anneal: f32,
    variant: &str,
    distance: &str,
    normalize: bool,
    self_exclusion: Option<&Bound<'py, PyAny>>,
    ref_grad: bool,
) -> PyResult<Bound<'py, PyTuple>> {
    let variant = match variant {
        "Ds" => PnpVariant::Ds,
        "Dq" => PnpVariant::Dq,
        "Iu" => PnpVariant::Iu,
        "Ib" => PnpVariant::Ib,
        "O" => PnpVariant::O,
        other => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "variant={other:?} but must be one of Ds, Dq, Iu, Ib, O"
            )))
        }
    };
    let call = PairCall {
        embeddings,
        labels,
        refs,
        distance,
        normalize,
        self_exclusion,
        ref_grad,
    };
    let rule = Pnp {
        b,
        alpha,
        anneal,
        variant,
    };
    pair(py, ctx, rule, call)
}
