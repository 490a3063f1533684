//! Reference of [`crate::triplet_margin_loss`]: every triplet materialised, its loss evaluated
//! as PML does (in f32), and its gradient taken triplet by triplet in f64, through the
//! distance and the normalisation, with no weight matrix and no matrix product.

use ndarray::{Array2, ArrayView2};

use super::pair_gradient::{pair_distance, pair_gradient};
use crate::TripletLossConfig;

/// The loss sums and gradients of [`triplet_margin_loss`], in f64.
#[derive(Debug, Clone)]
pub struct ReferenceTripletLoss {
    /// The mean over the positive losses (0 without any).
    pub loss: f64,
    /// Triplets with a positive loss.
    pub nonzero: u64,
    /// Triplets the loss ran over.
    pub triplets: u64,
    /// `∂loss/∂queries` `(b, d)` through the queries' role as anchors only.
    pub query_grad: Array2<f64>,
    /// `∂loss/∂refs` `(m, d)` through the references' role as positives and negatives.
    pub ref_grad: Array2<f64>,
}

/// PML's `TripletMarginLoss` (`AvgNonZeroReducer`) of every triplet in `lists` (per anchor, its
/// positive and negative references, as [`super::triplet_lists::triplet_lists`] gives them),
/// kept by `cfg.triplets` and scored with `distances` `(b, m)` (which decide ties and hinges,
/// so that a path's own distances can be passed); the gradients are taken analytically from
/// `queries` `(b, d)` and `refs` `(m, d)` in f64.
///
/// With `cfg.swap`, a triplet's negative distance is the smaller of `d(a, n)` and
/// `d(r_p, r_n)` (the larger similarity), read from `ref_distances` `(m, m)` (a path's own),
/// else computed here in f64; on a tie each gets half the gradient, as torch's `minimum`
/// gives it.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::reference::triplet_margin_loss::triplet_margin_loss;
/// use wgpu_metric_learning::TripletLossConfig;
/// let (q, r) = (array![[0.0f32, 1.0]], array![[0.0f32, 1.0], [1.0, 0.0]]);
/// let d = array![[0.0f32, 2f32.sqrt()]];
/// let lists = vec![(vec![0u32], vec![1u32])];
/// let out = triplet_margin_loss(q.view(), r.view(), d.view(), None, &lists, &TripletLossConfig::default());
/// assert_eq!((out.triplets, out.nonzero, out.loss), (1, 0, 0.0)); // far beyond the margin
/// ```
pub fn triplet_margin_loss(
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
    distances: ArrayView2<'_, f32>,
    ref_distances: Option<ArrayView2<'_, f32>>,
    lists: &[(Vec<u32>, Vec<u32>)],
    cfg: &TripletLossConfig,
) -> ReferenceTripletLoss {
    let pn = |p: usize, n: usize| match ref_distances {
        Some(d) => d[[p, n]],
        None => pair_distance(cfg.distance, refs.row(p), refs.row(n)) as f32,
    };
    let distance = cfg.distance.distance;
    let similarity = distance.is_similarity();
    let mut out = ReferenceTripletLoss {
        loss: 0.0,
        nonzero: 0,
        triplets: 0,
        query_grad: Array2::zeros(queries.dim()),
        ref_grad: Array2::zeros(refs.dim()),
    };
    let mut sum = 0.0f64;
    for (a, (positives, negatives)) in lists.iter().enumerate() {
        for &p in positives {
            let p = p as usize;
            for &n in negatives {
                let n = n as usize;
                let (ap, an) = (distances[[a, p]], distances[[a, n]]);
                if !cfg.triplets.keeps(ap, an, similarity) {
                    continue;
                }
                out.triplets += 1;
                // The negative's share of the gradient through d(a, n); the rest goes
                // through d(r_p, r_n).
                let (an, via_an) = if cfg.swap {
                    let pn = pn(p, n);
                    let an_wins = if similarity { an > pn } else { an < pn };
                    match (an == pn, an_wins) {
                        (true, _) => (an, 0.5),
                        (false, true) => (an, 1.0),
                        (false, false) => (pn, 0.0),
                    }
                } else {
                    (an, 1.0)
                };
                let v = if similarity {
                    (an - ap) + cfg.margin
                } else {
                    (ap - an) + cfg.margin
                };
                // PML's loss and torch's derivative of relu / softplus (threshold 20).
                let (loss, slope) = if cfg.smooth_loss {
                    if v > 20.0 {
                        (v, 1.0)
                    } else {
                        let z = v.exp();
                        (z.ln_1p(), z / (z + 1.0))
                    }
                } else if v > 0.0 {
                    (v, 1.0)
                } else {
                    (0.0, 0.0)
                };
                if loss <= 0.0 {
                    continue;
                }
                out.nonzero += 1;
                sum += loss as f64;
                // ∂v/∂d(a, p) = +1, ∂v/∂d(a, n) = −1 for distances; flipped for similarities.
                let sign = if similarity { -1.0 } else { 1.0 };
                let g = slope as f64 * sign;
                for (r, w) in [(p, g), (n, -g * via_an)] {
                    let (dq, dr) = pair_gradient(cfg.distance, queries.row(a), refs.row(r), w);
                    let mut qa = out.query_grad.row_mut(a);
                    qa += &dq;
                    let mut rr = out.ref_grad.row_mut(r);
                    rr += &dr;
                }
                if via_an < 1.0 {
                    let w = -g * (1.0 - via_an);
                    let (dp, dn) = pair_gradient(cfg.distance, refs.row(p), refs.row(n), w);
                    let mut rp = out.ref_grad.row_mut(p);
                    rp += &dp;
                    let mut rn = out.ref_grad.row_mut(n);
                    rn += &dn;
                }
            }
        }
    }
    if out.nonzero > 0 {
        let k = out.nonzero as f64;
        out.loss = sum / k;
        out.query_grad /= k;
        out.ref_grad /= k;
    }
    out
}
