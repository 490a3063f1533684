//! Reference of `shaders/triplet_select.wgsl`: the plain triple loop that defines the output.

use ndarray::{Array2, ArrayView2};

use crate::ops::triplets::{TripletRule, TripletType};

/// Every kept triplet `(a, p, n)`, in lexicographic order, as a `(t, 3)` array.
///
/// A triplet is valid when `labels[a] = ref_labels[p] ≠ ref_labels[n]` and `p ≠ self_slots[a]`
/// (`u32::MAX`: no exclusion). [`TripletRule::Margin`] then keeps it by `tm`, computed from
/// `distances` `(b, m)` as `d(a,n) − d(a,p)`, or `s(a,p) − s(a,n)` when `similarity`, with PML's
/// boundaries. [`TripletRule::AllValid`] keeps every valid triplet and ignores `distances`.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{reference::triplet_select::triplet_select, TripletRule};
/// let t = triplet_select(&[0, 0, 1], &[0, 0, 1], &[0, 1, 2], None, &TripletRule::AllValid, false);
/// assert_eq!(t, ndarray::array![[0u32, 1, 2], [1, 0, 2]]);
/// ```
pub fn triplet_select(
    labels: &[u32],
    ref_labels: &[u32],
    self_slots: &[u32],
    distances: Option<ArrayView2<'_, f32>>,
    rule: &TripletRule,
    similarity: bool,
) -> Array2<u32> {
    let mut flat = Vec::new();
    for (a, &la) in labels.iter().enumerate() {
        for (p, &lp) in ref_labels.iter().enumerate() {
            if lp != la || p as u32 == self_slots[a] {
                continue;
            }
            for (n, &ln) in ref_labels.iter().enumerate() {
                if ln == la {
                    continue;
                }
                let keep = match (*rule, distances) {
                    (TripletRule::AllValid, _) => true,
                    (TripletRule::Margin { .. }, None) => false,
                    (TripletRule::Margin { kind, margin }, Some(d)) => {
                        let (ap, an) = (d[[a, p]], d[[a, n]]);
                        let tm = if similarity { ap - an } else { an - ap };
                        match kind {
                            TripletType::All => tm <= margin,
                            TripletType::Hard => tm <= margin && tm <= 0.0,
                            TripletType::Semihard => tm <= margin && tm > 0.0,
                            TripletType::Easy => tm > margin,
                        }
                    }
                };
                if keep {
                    flat.extend([a as u32, p as u32, n as u32]);
                }
            }
        }
    }
    let rows = flat.len() / 3;
    Array2::from_shape_vec((rows, 3), flat).unwrap_or_else(|_| Array2::zeros((0, 3)))
}
