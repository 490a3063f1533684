//! Normalised and adjusted mutual information between two labelings, as scikit-learn computes
//! them (`normalized_mutual_info_score`, `adjusted_mutual_info_score` with the arithmetic
//! mean): the clustering metrics of PML's `AccuracyCalculator`.
//!
//! The expressions, their order and their special cases follow scikit-learn 1.9 term for term
//! (sums pairwise as NumPy's), so that the values agree to the last few bits.

use std::collections::{BTreeMap, HashMap};

use ndarray::ArrayView1;

use crate::error::{Error, Result};

const OP: &str = "mutual_info";

/// NMI: `MI(U, V) / mean(H(U), H(V))`, scikit-learn's `normalized_mutual_info_score` with its
/// default arithmetic mean. 1 when both labelings have a single label (or none), 0 when the
/// mutual information is 0.
///
/// Labels are any ordered values, `(n,)` each; only which points share a label matters.
///
/// # Errors
/// [`Error::Shape`] if the two labelings differ in length.
///
/// # Example
/// ```
/// use wgpu_metric_learning::normalized_mutual_info;
/// let truth = ndarray::array![0u32, 0, 1, 1];
/// let renamed = ndarray::array![7i64, 7, 3, 3];
/// assert_eq!(normalized_mutual_info(&truth, &renamed)?, 1.0);
/// let unrelated = ndarray::array![0u8, 1, 0, 1];
/// assert_eq!(normalized_mutual_info(&truth, &unrelated)?, 0.0);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn normalized_mutual_info<'a, 'b, A, B>(
    labels_true: impl Into<ArrayView1<'a, A>>,
    labels_pred: impl Into<ArrayView1<'b, B>>,
) -> Result<f64>
where
    A: Copy + Ord + 'a,
    B: Copy + Ord + 'b,
{
    let Some(table) = Contingency::unless_trivial(labels_true.into(), labels_pred.into())? else {
        return Ok(1.0);
    };
    let mi = table.mutual_info();
    if mi == 0.0 {
        return Ok(0.0);
    }
    Ok(mi / table.mean_entropy())
}

/// AMI: `(MI − E[MI]) / (mean(H(U), H(V)) − E[MI])`, scikit-learn's
/// `adjusted_mutual_info_score` with its default arithmetic mean: 0 in expectation for random
/// labelings, 1 for equal ones (up to renaming). 1 when both labelings have a single label (or
/// none), 0 when only one of them does.
///
/// The expected mutual information sums, for every pair of a class and a cluster, over each
/// possible overlap (scikit-learn's loop): `O(classes · clusters · overlap)` terms.
///
/// # Errors
/// [`Error::Shape`] if the two labelings differ in length.
///
/// # Example
/// ```
/// use wgpu_metric_learning::adjusted_mutual_info;
/// let truth = ndarray::array![0u32, 0, 0, 1, 1, 1];
/// assert_eq!(adjusted_mutual_info(&truth, &ndarray::array![5u32, 5, 5, 2, 2, 2])?, 1.0);
/// let ami = adjusted_mutual_info(&truth, &ndarray::array![0u32, 0, 1, 1, 2, 2])?;
/// assert!(ami < 0.5);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn adjusted_mutual_info<'a, 'b, A, B>(
    labels_true: impl Into<ArrayView1<'a, A>>,
    labels_pred: impl Into<ArrayView1<'b, B>>,
) -> Result<f64>
where
    A: Copy + Ord + 'a,
    B: Copy + Ord + 'b,
{
    let Some(table) = Contingency::unless_trivial(labels_true.into(), labels_pred.into())? else {
        return Ok(1.0);
    };
    if table.rows.len() == 1 || table.cols.len() == 1 {
        return Ok(0.0);
    }
    let mi = table.mutual_info();
    let emi = table.expected_mutual_info();
    let eps = f64::EPSILON;
    // scikit-learn keeps the signs of both differences away from 0 (a perfect match has
    // `mean(H) = E[MI]` up to rounding).
    let away = |x: f64| if x < 0.0 { x.min(-eps) } else { x.max(eps) };
    Ok(away(mi - emi) / away(table.mean_entropy() - emi))
}

/// The contingency table of two labelings: labels in ascending order on each side, the
/// non-zero cells row by row (`sp.find` of scikit-learn's sparse table).
struct Contingency {
    /// Points per class (row sums).
    rows: Vec<u64>,
    /// Points per cluster (column sums).
    cols: Vec<u64>,
    /// `(row, column, count)`, non-zero, sorted.
    cells: Vec<(usize, usize, u64)>,
    n: u64,
}

impl Contingency {
    fn new<A: Copy + Ord, B: Copy + Ord>(
        a: ArrayView1<'_, A>,
        b: ArrayView1<'_, B>,
    ) -> Result<Self> {
        if a.len() != b.len() {
            return Err(Error::Shape {
                op: OP,
                what: "labels_pred",
                expected: format!("({},) as labels_true", a.len()),
                got: vec![b.len()],
            });
        }
        let ids_a = sorted_ids(a.iter().copied());
        let ids_b = sorted_ids(b.iter().copied());
        let (mut rows, mut cols) = (vec![0u64; ids_a.len()], vec![0u64; ids_b.len()]);
        let mut cells: HashMap<(usize, usize), u64> = HashMap::new();
        for (x, y) in a.iter().zip(b.iter()) {
            let (i, j) = (ids_a[x], ids_b[y]);
            rows[i] += 1;
            cols[j] += 1;
            *cells.entry((i, j)).or_insert(0) += 1;
        }
        let mut cells: Vec<(usize, usize, u64)> =
            cells.into_iter().map(|((i, j), v)| (i, j, v)).collect();
        cells.sort_unstable();
        Ok(Self {
            rows,
            cols,
            cells,
            n: a.len() as u64,
        })
    }

    /// The table, or `None` where scikit-learn answers 1 before building one: both labelings
    /// with a single label, or both empty.
    fn unless_trivial<A: Copy + Ord, B: Copy + Ord>(
        a: ArrayView1<'_, A>,
        b: ArrayView1<'_, B>,
    ) -> Result<Option<Self>> {
        let table = Self::new(a, b)?;
        let (r, c) = (table.rows.len(), table.cols.len());
        let trivial = (r == 1 && c == 1) || (r == 0 && c == 0);
        Ok((!trivial).then_some(table))
    }

    /// scikit-learn's `mutual_info_score` from the table.
    fn mutual_info(&self) -> f64 {
        if self.rows.len() == 1 || self.cols.len() == 1 {
            return 0.0;
        }
        let total = self.n as f64;
        let (log_total, log_rows, log_cols) = (total.ln(), total.ln(), total.ln());
        let terms: Vec<f64> = self
            .cells
            .iter()
            .map(|&(i, j, v)| {
                let v = v as f64;
                let outer = (self.rows[i] * self.cols[j]) as f64;
                let log_outer = -outer.ln() + log_rows + log_cols;
                let share = v / total;
                let mi = share * (v.ln() - log_total) + share * log_outer;
                if mi.abs() < f64::EPSILON {
                    0.0
                } else {
                    mi
                }
            })
            .collect();
        pairwise_sum(&terms).max(0.0)
    }

    /// `mean(H(U), H(V))`, scikit-learn's arithmetic `_generalized_average` of the entropies.
    fn mean_entropy(&self) -> f64 {
        (entropy(&self.rows) + entropy(&self.cols)) / 2.0
    }

    /// scikit-learn's `expected_mutual_information` (its Cython loop, term for term).
    fn expected_mutual_info(&self) -> f64 {
        let (a, b, n) = (&self.rows, &self.cols, self.n);
        if a.len() == 1 || b.len() == 1 {
            return 0.0;
        }
        let nf = n as f64;
        // ln(x!) for every count that occurs: lgamma(x + 1), as scipy's gammaln and C's lgamma.
        let ln_fact: Vec<f64> = (0..=n).map(|x| libm::lgamma(x as f64 + 1.0)).collect();
        let top = a.iter().chain(b).copied().max().unwrap_or(0) as usize;
        let term1: Vec<f64> = (0..=top).map(|x| x.max(1) as f64 / nf).collect();
        let log_n_nij: Vec<f64> = (0..=top)
            .map(|x| nf.ln() + (x.max(1) as f64).ln())
            .collect();
        let gln_n_nij: Vec<f64> = (0..=top)
            .map(|x| ln_fact[x.max(1)] + ln_fact[n as usize])
            .collect();
        let mut emi = 0.0;
        for &ai in a {
            let (log_a, gln_a, gln_na) = (
                (ai as f64).ln(),
                ln_fact[ai as usize],
                ln_fact[(n - ai) as usize],
            );
            for &bj in b {
                let (log_b, gln_b, gln_nb) = (
                    (bj as f64).ln(),
                    ln_fact[bj as usize],
                    ln_fact[(n - bj) as usize],
                );
                let start = (ai + bj).saturating_sub(n).max(1);
                let end = ai.min(bj);
                for nij in start..=end {
                    let k = nij as usize;
                    let term2 = log_n_nij[k] - log_a - log_b;
                    let gln = gln_a + gln_b + gln_na + gln_nb
                        - gln_n_nij[k]
                        - ln_fact[(ai - nij) as usize]
                        - ln_fact[(bj - nij) as usize]
                        - ln_fact[(n + nij - ai - bj) as usize];
                    emi += term1[k] * term2 * gln.exp();
                }
            }
        }
        emi
    }
}

/// Each distinct label's rank among the distinct labels (ascending): `np.unique`'s inverse.
fn sorted_ids<T: Copy + Ord>(labels: impl Iterator<Item = T>) -> BTreeMap<T, usize> {
    let mut ids: BTreeMap<T, usize> = labels.map(|l| (l, 0)).collect();
    for (rank, id) in ids.values_mut().enumerate() {
        *id = rank;
    }
    ids
}

/// scikit-learn's entropy of a labeling from its label counts (all positive).
fn entropy(counts: &[u64]) -> f64 {
    match counts.len() {
        0 => return 1.0,
        1 => return 0.0,
        _ => {}
    }
    let pi: Vec<f64> = counts.iter().map(|&c| c as f64).collect();
    let total = pairwise_sum(&pi);
    let log_total = total.ln();
    let terms: Vec<f64> = pi
        .iter()
        .map(|&p| (p / total) * (p.ln() - log_total))
        .collect();
    -pairwise_sum(&terms)
}

/// NumPy's pairwise summation of `float64` (`pairwise_sum` in its loops): sequential below 8
/// terms, eight interleaved partial sums up to 128, halves (at a multiple of 8) above.
fn pairwise_sum(x: &[f64]) -> f64 {
    let n = x.len();
    if n < 8 {
        return x.iter().fold(-0.0, |s, &v| s + v);
    }
    if n <= 128 {
        let mut r = [0.0f64; 8];
        r.copy_from_slice(&x[..8]);
        let mut i = 8;
        while i < n - n % 8 {
            for (acc, &v) in r.iter_mut().zip(&x[i..i + 8]) {
                *acc += v;
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for &v in &x[i..] {
            res += v;
        }
        return res;
    }
    let mut half = n / 2;
    half -= half % 8;
    pairwise_sum(&x[..half]) + pairwise_sum(&x[half..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairwise_sum_matches_a_plain_sum_on_exact_values() {
        for n in [0usize, 1, 7, 8, 9, 127, 128, 129, 1000] {
            let x: Vec<f64> = (0..n).map(|i| i as f64).collect();
            assert_eq!(
                pairwise_sum(&x),
                (n * n.saturating_sub(1) / 2) as f64,
                "{n}"
            );
        }
    }

    #[test]
    fn hand_computed_table() {
        // Classes [0, 0, 1, 1], clusters [0, 0, 0, 1]: MI = ln2 − (3/4) ln 3 + ½ ln 2 … by hand:
        // p(u, v): (0,0) ½, (1,0) ¼, (1,1) ¼; p(u) ½ ½; p(v) ¾ ¼.
        let mi: f64 = 0.5 * (0.5f64 / (0.5 * 0.75)).ln()
            + 0.25 * (0.25f64 / (0.5 * 0.75)).ln()
            + 0.25 * (0.25f64 / (0.5 * 0.25)).ln();
        let h_u = 2f64.ln();
        let h_v = -(0.75 * 0.75f64.ln() + 0.25 * 0.25f64.ln());
        let nmi = normalized_mutual_info(&[0u8, 0, 1, 1][..], &[0u8, 0, 0, 1][..]).expect("nmi");
        assert!((nmi - mi / ((h_u + h_v) / 2.0)).abs() < 1e-15, "{nmi}");
    }
}
