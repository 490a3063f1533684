//! What each thread of a loss keeps for its anchors and reads from the call: the sums
//! ([`Totals`]), the per-anchor scratch with its lists ([`Scratch`]), the reference pairs a
//! rule scores ([`RefPairs`]), the rows every block reads ([`Shared`]), and the weights of a
//! row turned into `U` ([`weights_to_u`]).

use ndarray::{s, Array2, ArrayView1, ArrayView2, ArrayViewMut1};

use super::backward::{pair_weight, query_side, ref_side_into};
use crate::data::inputs::Labelled;
use crate::metric::{Distance, DistanceConfig};
use crate::ops::distance::native::{distances_into, Norms};
use crate::runtime::simd::widest;

/// Sums over the anchors seen so far.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Totals {
    /// The sum of the losses that the mean is over.
    pub(super) loss: f64,
    /// The mean's divisor: the losses it averages (positive triplet losses, positive pairs).
    pub(super) count: u64,
    /// What the loss ran over (triplets, pairs), for the caller's information.
    pub(super) items: u64,
    /// A rule's own sum beside the loss (MarginLoss: `∂L/∂β` before the mean's division).
    pub(super) aux: f64,
}

impl Totals {
    pub(super) fn add(&mut self, other: Totals) {
        self.loss += other.loss;
        self.count += other.count;
        self.items += other.items;
        self.aux += other.aux;
    }

    /// The mean; 0 over nothing.
    pub(super) fn mean(&self) -> f32 {
        if self.count == 0 {
            0.0
        } else {
            (self.loss / self.count as f64) as f32
        }
    }
}

/// One thread's per-anchor scratch, reused from anchor to anchor; each loss uses what it needs.
pub(super) struct Scratch {
    pub(super) positives: Vec<u32>,
    pub(super) negatives: Vec<u32>,
    /// Negatives as (value, reference).
    pub(super) order: Vec<(f32, u32)>,
    pub(super) sorted: Vec<f32>,
    pub(super) prefix: Vec<f64>,
    pub(super) runs: Vec<i64>,
    /// `∂L/∂D` over the anchor's row (before the mean's division), which the loss fills.
    pub(super) weights: Vec<f64>,
    /// Pairs of references, for a rule that scores them too ([`super::driver::Job::ref_pairs`]).
    pub(super) pairs: Option<RefPairs>,
    /// The label whose lists `same` and `negatives` hold ([`Scratch::lists`]).
    listed: Option<u32>,
    /// Every reference of that label, the anchor's own slot included.
    same: Vec<u32>,
}

impl Scratch {
    /// Bytes for `m` references.
    pub(super) fn bytes(m: u64) -> u64 {
        // `prefix` and `runs` hold `m + 1`.
        m * (4 + 4 + 4 + 8 + 4 + 8 + 8 + 8) + 16
    }

    /// Anchor `a`'s ascending positives (same label, not its own slot) and negatives into
    /// `positives` and `negatives`, as [`Labelled::lists_of`] gives them. The negatives and
    /// the label's references are kept until an anchor of another label comes, so a run of
    /// anchors of one label (the driver hands each thread its rows by label) builds them
    /// once; the positives are the label's references less the anchor's slot.
    pub(super) fn lists(&mut self, set: &Labelled<'_>, a: usize) {
        let label = set.labels[a];
        if self.listed != Some(label) {
            set.label_lists(label, &mut self.same, &mut self.negatives);
            self.listed = Some(label);
        }
        let me = set.self_slots[a];
        self.positives.clear();
        (self.positives).extend(self.same.iter().copied().filter(|&r| r != me));
    }

    pub(super) fn new(m: usize, pairs: Option<RefPairs>) -> Self {
        Self {
            pairs,
            positives: Vec::with_capacity(m),
            negatives: Vec::with_capacity(m),
            order: Vec::with_capacity(m),
            sorted: Vec::with_capacity(m),
            prefix: Vec::with_capacity(m + 1),
            runs: Vec::with_capacity(m + 1),
            weights: vec![0.0; m],
            listed: None,
            same: Vec::with_capacity(m),
        }
    }
}

/// A loss's rule for one anchor: from its index and distance row `(m,)`, fill
/// [`Scratch::weights`] (zeroed before) and return its sums; the rows are there for
/// [`RefPairs`].
pub(super) type AnchorRule<'r> =
    dyn Fn(usize, ArrayView1<'_, f32>, &mut Scratch, &Shared<'_>) -> Totals + Sync + 'r;

/// References a [`RefPairs`] scores at once against every reference.
pub(super) const PAIR_ROWS: usize = 32;

/// One thread's scratch for a rule that also scores pairs of references (the triplet loss's
/// swap, `d(r_p, r_n)`): the distances from up to [`PAIR_ROWS`] references to every
/// reference (computed as the anchors' rows are), the rule's weights `∂L/∂D` for them, and the
/// thread's gradient with respect to the normalised references from those pairs.
pub(super) struct RefPairs {
    /// The loaded references.
    rows: Vec<u32>,
    /// `(PAIR_ROWS, dim)` rows as the distances read them (normalised where they normalise).
    raw: Array2<f32>,
    /// `(PAIR_ROWS, m)` distances, then `U`.
    distances: Array2<f32>,
    /// With the gradient only: the rows normalised and their own gradient `(PAIR_ROWS, dim)`,
    /// and the `PAIR_ROWS · m` weights `∂L/∂D` (without, empty: nothing to take back).
    hat: Array2<f32>,
    own: Array2<f32>,
    weights: Vec<f64>,
    /// `(m, dim)`, when a gradient goes to the references.
    pub(super) grad: Option<Array2<f32>>,
    near: Vec<NearPair>,
}

impl RefPairs {
    /// Bytes for `m` references of `dim` floats, with the gradient when `grad`.
    pub(super) fn bytes(m: u64, dim: u64, grad: bool) -> u64 {
        let rows = PAIR_ROWS as u64;
        let gradient = 2 * rows * dim * 4 + rows * m * (8 + NEAR_PAIR_BYTES) + m * dim * 4;
        rows * 4 + rows * dim * 4 + rows * m * 4 + if grad { gradient } else { 0 }
    }

    pub(super) fn new(m: usize, dim: usize, grad: bool) -> Self {
        let with_grad = if grad { PAIR_ROWS } else { 0 };
        Self {
            rows: Vec::with_capacity(PAIR_ROWS),
            raw: Array2::zeros((PAIR_ROWS, dim)),
            distances: Array2::zeros((PAIR_ROWS, m)),
            hat: Array2::zeros((with_grad, dim)),
            own: Array2::zeros((with_grad, dim)),
            weights: vec![0.0; with_grad * m],
            grad: grad.then(|| Array2::zeros((m, dim))),
            near: Vec::new(),
        }
    }

    /// Loads `rows` (at most [`PAIR_ROWS`] references): their distances to every reference,
    /// with zero weights.
    pub(super) fn load(&mut self, shared: &Shared<'_>, rows: &[u32]) {
        let (k, m) = (rows.len(), shared.r_hat.nrows());
        self.rows.clear();
        self.rows.extend_from_slice(rows);
        for (mut raw, &j) in self.raw.rows_mut().into_iter().zip(rows) {
            raw.assign(&shared.r_hat.row(j as usize));
        }
        distances_into(
            self.raw.slice(s![..k, ..]),
            shared.r_hat,
            shared.r_norms,
            &shared.distance,
            self.distances.slice_mut(s![..k, ..]),
        );
        if let Some(weights) = self.weights.get_mut(..k * m) {
            weights.fill(0.0);
        }
    }

    /// `D(r_{rows[i]}, r_j)` of the loaded rows.
    pub(super) fn distance(&self, i: usize, j: usize) -> f32 {
        self.distances[[i, j]]
    }

    /// Adds `w` to `∂L/∂D(r_{rows[i]}, r_j)` (nothing without the gradient).
    pub(super) fn add_weight(&mut self, i: usize, j: usize, w: f64) {
        let m = self.distances.ncols();
        if let Some(weight) = self.weights.get_mut(i * m + j) {
            *weight += w;
        }
    }

    /// Takes the loaded rows' weights through the distance into the thread's gradient (as
    /// the anchors' rows are: [`weights_to_u`], then both sides' products); nothing when no
    /// gradient goes to the references or every weight is 0.
    pub(super) fn flush(&mut self, shared: &Shared<'_>) {
        let (k, m) = (self.rows.len(), shared.r_hat.nrows());
        let Some(grad) = self.grad.as_mut() else {
            return;
        };
        if self.weights[..k * m].iter().all(|&w| w == 0.0) {
            return;
        }
        for (i, &p) in self.rows.iter().enumerate() {
            let p = p as usize;
            self.hat.row_mut(i).assign(&shared.r_hat.row(p));
            let weights = &self.weights[i * m..(i + 1) * m];
            let x = (p, shared.r_hat.row(p), shared.r_norms.sq[p]);
            let near = (&mut self.near, k * m);
            weights_to_u(shared, x, self.distances.row_mut(i), weights, near);
        }
        let distance = shared.distance.distance;
        let (u, hat) = (
            self.distances.slice(s![..k, ..]),
            self.hat.slice(s![..k, ..]),
        );
        ref_side_into(distance, u, hat, shared.r_hat, grad.view_mut());
        query_side(
            distance,
            u,
            hat,
            shared.r_hat,
            self.own.slice_mut(s![..k, ..]),
        );
        for (own, &p) in self.own.rows().into_iter().zip(&self.rows) {
            let mut g = grad.row_mut(p as usize);
            g += &own;
        }
        for &(p, j, w) in &self.near {
            let diff = &shared.r_hat.row(p) - &shared.r_hat.row(j as usize);
            grad.row_mut(p).scaled_add(w, &diff);
            grad.row_mut(j as usize).scaled_add(-w, &diff);
        }
        self.near.clear();
    }
}

/// Below this share of `|q̂|² + |r̂|²`, a squared Euclidean distance computed as
/// `|q̂|² + |r̂|² − 2 q̂·r̂` has lost most of its digits to cancellation (identical rows give
/// ~3e-4, not 0). Its pair's gradient `w (q̂ − r̂) / D` is then taken from the difference
/// itself, outside the matrix products, so that near-duplicates get the exact derivative (as
/// torch's `cdist` backward gives for small inputs; its matrix-product form, used past 25
/// rows, is as noisy there as the distance).
pub(super) const NEAR: f32 = 1e-3;

/// A pair whose gradient is taken directly: anchor, reference, and `w / |q̂ − r̂|`.
pub(super) type NearPair = (usize, u32, f32);

/// Bytes of one [`NearPair`], counted per possible pair of a block (collapsed embeddings
/// make every pair near).
pub(super) const NEAR_PAIR_BYTES: u64 = std::mem::size_of::<NearPair>() as u64;

/// The rows every block reads, normalised as torch normalises them where the distance
/// normalises ([`crate::ops::distance::native`]), and their norms.
pub(super) struct Shared<'a> {
    pub(super) distance: DistanceConfig,
    /// [`super::driver::Job::snr`]: each query row's distances divided by its squared norm.
    pub(super) snr: bool,
    pub(super) q_hat: ArrayView2<'a, f32>,
    pub(super) r_hat: ArrayView2<'a, f32>,
    pub(super) q_norms: &'a Norms,
    pub(super) r_norms: &'a Norms,
    /// The queries' labels: each thread takes its anchors by label ([`Scratch::lists`]).
    pub(super) labels: &'a [u32],
}

/// The weights of row `a` (an anchor, or a reference of [`RefPairs`]), whose normalised row
/// is `x_hat` and squared norm `x2`, turned into `U` ([`pair_weight`]) in place of its
/// distances `row`; Euclidean pairs closer than [`NEAR`] go to `near` instead (their `U` is 0),
/// a list of at most `most` pairs, the worst case the budget counts.
pub(super) fn weights_to_u(
    shared: &Shared<'_>,
    (a, x_hat, x2): (usize, ArrayView1<'_, f32>, f32),
    mut row: ArrayViewMut1<'_, f32>,
    weights: &[f64],
    (near, most): (&mut Vec<NearPair>, usize),
) {
    let distance = shared.distance.distance;
    let euclidean = distance == Distance::Euclidean;
    if let Some(row) = row.as_slice_mut() {
        if !u_row(row, weights, (x2, &shared.r_norms.sq), distance) {
            return;
        }
    }
    for (j, (d, &w)) in row.iter_mut().zip(weights).enumerate() {
        if euclidean && w != 0.0 && *d * *d < NEAR * (x2 + shared.r_norms.sq[j]) {
            let diff = &x_hat - &shared.r_hat.row(j);
            let exact = diff.dot(&diff).sqrt();
            if exact > 0.0 {
                if near.len() == near.capacity() {
                    // Doubling, but never past the worst case the budget counts.
                    let room = most.saturating_sub(near.len()).max(1);
                    near.reserve_exact(near.capacity().max(16).min(room));
                }
                near.push((a, j as u32, (w / exact as f64) as f32));
            }
            *d = 0.0;
        } else {
            *d = pair_weight(distance, w, *d);
        }
    }
}

widest! {
    /// [`weights_to_u`]'s common case over one contiguous row, vectorised: `U` from the
    /// weights in place of the distances, unless a Euclidean pair with a weight is near
    /// ([`NEAR`], the anchor's squared norm `x2` and the references' `r2`). Returns whether
    /// one is, and then writes nothing: the caller takes the row pair by pair.
    fn u_row(row: &mut [f32], weights: &[f64], norms: (f32, &[f32]), distance: Distance) -> bool {
        let (x2, r2) = norms;
        if distance == Distance::Euclidean {
            let near = (row.iter().zip(weights).zip(r2))
                .fold(false, |any, ((&d, &w), &r2)| any | (w != 0.0 && d * d < NEAR * (x2 + r2)));
            if near {
                return true;
            }
        }
        let pairs = row.iter_mut().zip(weights);
        match distance {
            Distance::Euclidean => {
                pairs.for_each(|(d, &w)| *d = pair_weight(Distance::Euclidean, w, *d));
            }
            Distance::SquaredEuclidean => {
                pairs.for_each(|(d, &w)| *d = pair_weight(Distance::SquaredEuclidean, w, *d));
            }
            Distance::Cosine | Distance::DotProduct => {
                pairs.for_each(|(d, &w)| *d = pair_weight(Distance::DotProduct, w, *d));
            }
        }
        false
    }
}
