//! Input checks shared by every operation: run before any device work, so a bad input costs
//! nothing and leaves no state behind.

use ndarray::ArrayView2;

use crate::error::{Error, Result};

/// Embeddings `(n, d)`: `d ≥ 1` (any `n`, including 0) and every value finite.
pub(crate) fn embeddings(
    op: &'static str,
    what: &'static str,
    x: ArrayView2<'_, f32>,
) -> Result<()> {
    if x.ncols() == 0 {
        return Err(Error::Shape {
            op,
            what,
            expected: "(n, d) with d >= 1".into(),
            got: x.shape().to_vec(),
        });
    }
    finite(op, what, x)
}

/// The first NaN or infinity of `x`, as an error naming its position.
pub(crate) fn finite(op: &'static str, what: &'static str, x: ArrayView2<'_, f32>) -> Result<()> {
    match x.indexed_iter().find(|(_, v)| !v.is_finite()) {
        Some(((row, col), &value)) => Err(Error::NonFinite {
            op,
            what,
            row,
            col,
            value,
        }),
        None => Ok(()),
    }
}

/// `refs` must have as many columns as `queries`.
pub(crate) fn same_dim(
    op: &'static str,
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
) -> Result<()> {
    if refs.ncols() != queries.ncols() {
        return Err(Error::Shape {
            op,
            what: "refs",
            expected: format!("(n, {}) to match queries", queries.ncols()),
            got: refs.shape().to_vec(),
        });
    }
    Ok(())
}

/// A scalar parameter (margin, epsilon) must be finite.
pub(crate) fn finite_param(op: &'static str, what: &'static str, value: f32) -> Result<()> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(Error::InvalidParameter {
            op,
            what,
            value: value.to_string(),
            rule: "must be finite",
        })
    }
}
