//! Reference of `shaders/pair_select.wgsl`: each anchor's kept positives and negatives, by
//! plain loops over its row.

use ndarray::{Array2, ArrayView2};

use crate::ops::miners::{PairRule, Strategy};

/// The pairs a rule keeps, as `(positives, negatives)`, each `(k, 2)` of
/// `(anchor, reference)` rows in anchor order.
///
/// Reference `r` is a positive of anchor `a` when `ref_labels[r] = labels[a]` and
/// `r ≠ self_slots[a]`, a negative when the labels differ. `distances` `(b, m)` gives the
/// values (similarities when `similarity`); [`PairRule::AllPairs`] ignores it. Each anchor's
/// rows are in ascending reference order, except for [`PairRule::MultiSimilarity`], whose
/// rows are in ascending order of value (`f32::total_cmp`), ties by reference.
///
/// # Panics
/// When a rule other than [`PairRule::AllPairs`] is given no distances, or shapes disagree.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{reference::pair_select::pair_select, PairRule};
/// let d = ndarray::array![[0.0f32, 0.5, 0.1], [0.5, 0.0, 0.9], [0.1, 0.9, 0.0]];
/// let rule = PairRule::PairMargin { pos_margin: 0.2, neg_margin: 0.8 };
/// let (pos, neg) = pair_select(&[0, 0, 1], &[0, 0, 1], &[0, 1, 2], Some(d.view()), &rule, false);
/// assert_eq!(pos, ndarray::array![[0u32, 1], [1, 0]]);
/// assert_eq!(neg, ndarray::array![[0u32, 2], [2, 0]]);
/// ```
pub fn pair_select(
    labels: &[u32],
    ref_labels: &[u32],
    self_slots: &[u32],
    distances: Option<ArrayView2<'_, f32>>,
    rule: &PairRule,
    similarity: bool,
) -> (Array2<u32>, Array2<u32>) {
    let (mut pos, mut neg) = (Vec::new(), Vec::new());
    // `closer(x, y)`: value x is closer than y.
    let closer = |x: f32, y: f32| if similarity { x > y } else { x < y };
    for (a, &label) in labels.iter().enumerate() {
        let value = |r: u32| distances.map_or(0.0, |d| d[[a, r as usize]]);
        let positives: Vec<u32> = (0..ref_labels.len() as u32)
            .filter(|&r| ref_labels[r as usize] == label && r != self_slots[a])
            .collect();
        let negatives: Vec<u32> = (0..ref_labels.len() as u32)
            .filter(|&r| ref_labels[r as usize] != label)
            .collect();
        let (kept_pos, kept_neg): (Vec<u32>, Vec<u32>) = match *rule {
            PairRule::AllPairs => (positives, negatives),
            PairRule::PairMargin {
                pos_margin,
                neg_margin,
            } => (
                positives
                    .into_iter()
                    .filter(|&p| closer(pos_margin, value(p)))
                    .collect(),
                negatives
                    .into_iter()
                    .filter(|&n| closer(value(n), neg_margin))
                    .collect(),
            ),
            PairRule::MultiSimilarity { epsilon } => {
                if positives.is_empty() || negatives.is_empty() {
                    (Vec::new(), Vec::new())
                } else {
                    let values = |s: &[u32]| s.iter().map(|&r| value(r)).collect::<Vec<f32>>();
                    let (pv, nv) = (values(&positives), values(&negatives));
                    let min = |v: &[f32]| v.iter().copied().fold(f32::INFINITY, f32::min);
                    let max = |v: &[f32]| v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let (min_pos, max_pos, min_neg, max_neg) =
                        (min(&pv), max(&pv), min(&nv), max(&nv));
                    let keep_pos = |v: f32| {
                        if similarity {
                            v - epsilon < max_neg
                        } else {
                            v + epsilon > min_neg
                        }
                    };
                    let keep_neg = |v: f32| {
                        if similarity {
                            v + epsilon > min_pos
                        } else {
                            v - epsilon < max_pos
                        }
                    };
                    let sorted = |mut s: Vec<u32>| {
                        s.sort_by(|&x, &y| value(x).total_cmp(&value(y)).then(x.cmp(&y)));
                        s
                    };
                    (
                        sorted(
                            positives
                                .into_iter()
                                .filter(|&p| keep_pos(value(p)))
                                .collect(),
                        ),
                        sorted(
                            negatives
                                .into_iter()
                                .filter(|&n| keep_neg(value(n)))
                                .collect(),
                        ),
                    )
                }
            }
            PairRule::EasyHard {
                pos: ps,
                neg: ns,
                pos_range,
                neg_range,
            } => {
                let in_range = |range: Option<(f32, f32)>, v: f32| {
                    range.is_none_or(|(lo, hi)| v >= lo && v <= hi)
                };
                // The candidate of `side` with the largest (`max`) or smallest value among
                // those `admit` lets through, the lowest reference on a tie.
                let pick = |side: &[u32], max: bool, admit: &dyn Fn(f32) -> bool| {
                    let mut best: Option<u32> = None;
                    for &r in side {
                        let v = value(r);
                        if !admit(v) {
                            continue;
                        }
                        let better = best.is_none_or(|b| {
                            let bv = value(b);
                            if max {
                                v > bv
                            } else {
                                v < bv
                            }
                        });
                        if better {
                            best = Some(r);
                        }
                    }
                    best
                };
                // The hardest positive is the least close; the hardest negative the closest.
                let pos_max = |s: Strategy| (s == Strategy::Easy) == similarity;
                let neg_max = |s: Strategy| (s == Strategy::Easy) != similarity;
                let pick_pos = |bound: Option<f32>| {
                    pick(&positives, pos_max(ps), &|v| {
                        in_range(pos_range, v) && bound.is_none_or(|n| closer(v, n))
                    })
                };
                let pick_neg = |bound: Option<f32>| {
                    pick(&negatives, neg_max(ns), &|v| {
                        in_range(neg_range, v) && bound.is_none_or(|p| closer(p, v))
                    })
                };
                let one = |r: Option<u32>| r.into_iter().collect::<Vec<u32>>();
                match (ps, ns) {
                    (Strategy::All, Strategy::All) => (positives.clone(), negatives.clone()),
                    (Strategy::All, _) => (positives.clone(), one(pick_neg(None))),
                    (_, Strategy::All) => (one(pick_pos(None)), negatives.clone()),
                    _ => {
                        let (p, n) = if ps == Strategy::Semihard {
                            let n = pick_neg(None);
                            (n.and_then(|n| pick_pos(Some(value(n)))), n)
                        } else if ns == Strategy::Semihard {
                            let p = pick_pos(None);
                            (p, p.and_then(|p| pick_neg(Some(value(p)))))
                        } else {
                            (pick_pos(None), pick_neg(None))
                        };
                        match (p, n) {
                            (Some(p), Some(n)) => (vec![p], vec![n]),
                            _ => (Vec::new(), Vec::new()),
                        }
                    }
                }
            }
        };
        pos.extend(kept_pos.iter().flat_map(|&p| [a as u32, p]));
        neg.extend(kept_neg.iter().flat_map(|&n| [a as u32, n]));
    }
    let shape = |flat: Vec<u32>| {
        Array2::from_shape_vec((flat.len() / 2, 2), flat).expect("whole (a, r) rows")
    };
    (shape(pos), shape(neg))
}
