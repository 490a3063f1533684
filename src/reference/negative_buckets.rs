//! Reference of `shaders/negative_buckets.wgsl`.

use ndarray::{Array2, ArrayView2};

use crate::ops::triplets::{TripletRule, TripletType};

/// The bucket of each negative of each anchor: with `values` `(b, m)` (distances, or
/// similarities when `similarity`), anchor `a`'s first `counts[2a]` positives and first
/// `counts[2a + 1]` negatives (reference indices in `positives` and `negatives`, both
/// `(b, m)`), entry `[a, j]` is the bucket of negative `j`; unused entries are `u32::MAX`.
///
/// A margin rule keeps `tm` in an interval `(low, high]`; with `c_x` the number of the
/// anchor's positives `p` with `tm(p, n) ≤ x`, the bucket is `c_low + c_high` over the bounds
/// the rule has, taken from `2 · n_pos` for distances, so that buckets rise with the
/// negative's value. Every positive then keeps all the negatives of a bucket or none, and
/// listing the negatives bucket by bucket puts each positive's kept negatives in one run.
/// [`TripletRule::AllValid`] keeps everything: one bucket, 0.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::reference::negative_buckets::negative_buckets;
/// use wgpu_metric_learning::{TripletRule, TripletType};
/// // One anchor; ref 0 is its positive at distance 1.0, refs 1 and 2 negatives at 1.1 and 2.0.
/// let values = array![[1.0f32, 1.1, 2.0]];
/// let rule = TripletRule::margin_miner(TripletType::Easy); // keeps tm = an - ap > 0.2
/// let b = negative_buckets(values.view(), array![[0u32, 0, 0]].view(),
///     array![[1u32, 2, 0]].view(), &[1, 2], &rule, false);
/// // Ref 2 is kept by the positive (bucket 2), ref 1 is not (bucket 1).
/// assert_eq!(b, array![[1u32, 2, u32::MAX]]);
/// ```
pub fn negative_buckets(
    values: ArrayView2<'_, f32>,
    positives: ArrayView2<'_, u32>,
    negatives: ArrayView2<'_, u32>,
    counts: &[u32],
    rule: &TripletRule,
    similarity: bool,
) -> Array2<u32> {
    let mut out = Array2::from_elem(values.dim(), u32::MAX);
    let (low, high) = match *rule {
        TripletRule::AllValid => (None, None),
        TripletRule::Margin { kind, margin } => match kind {
            TripletType::All => (None, Some(margin)),
            TripletType::Hard => (None, Some(margin.min(0.0))),
            TripletType::Semihard => (Some(0.0), Some(margin)),
            TripletType::Easy => (Some(margin), None),
        },
    };
    for a in 0..values.nrows() {
        let n_pos = counts[2 * a] as usize;
        let n_neg = counts[2 * a + 1] as usize;
        for j in 0..n_neg {
            let an = values[[a, negatives[[a, j]] as usize]];
            let mut c = 0u32;
            for bound in [low, high].into_iter().flatten() {
                for i in 0..n_pos {
                    let ap = values[[a, positives[[a, i]] as usize]];
                    let tm = if similarity { ap - an } else { an - ap };
                    c += u32::from(tm <= bound);
                }
            }
            let has_bounds = low.is_some() || high.is_some();
            out[[a, j]] = match (has_bounds, similarity) {
                (false, _) => 0,
                (true, true) => c,
                (true, false) => 2 * n_pos as u32 - c,
            };
        }
    }
    out
}
