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
    // The common case, contiguous and all finite, in one vectorisable pass (a branch-free
    // fold per block); the element-wise search below only runs to name the culprit.
    if let Some(all) = x.as_slice() {
        let clean = all
            .chunks(4096)
            .all(|block| block.iter().fold(true, |ok, v| ok & v.is_finite()));
        if clean {
            return Ok(());
        }
    }
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
