//! Losses with their gradients, computed without materialising triplets or the full
//! similarity matrix.
//!
//! Every loss here is a function of the distance matrix `D` `(b, m)` between queries and
//! references. Its gradient is first gathered into a weight matrix `W = ∂L/∂D`, anchor block by
//! anchor block (`W` rows overwrite the block's distance rows, so one `(rows, m)` block is all
//! the per-pair memory there is), and then taken through the distance and the L2
//! normalisation by two products with the embeddings ([`backward`]).

mod backward;
mod driver;
mod gpu;
mod info_nce;
mod plan;
mod triplet;

pub use info_nce::{
    multiple_negatives_ranking_loss, multiple_negatives_ranking_loss_plan, ntxent_loss,
    ntxent_loss_plan, InfoNceConfig, InfoNceLoss, MnrlConfig,
};
pub use triplet::{triplet_margin_loss, triplet_margin_loss_plan, TripletLoss, TripletLossConfig};

use ndarray::{Array2, ArrayView2};

use crate::data::inputs::{host_refs, host_rows};

/// `x` `(n, d)` with each row multiplied by its scale: the normalised embeddings that the
/// gradient products use (the distances themselves are computed from the raw rows and the
/// scales, as the miners compute them).
fn scaled(x: ArrayView2<'_, f32>, scale: &[f32]) -> Array2<f32> {
    let mut out = x.to_owned();
    for (mut row, &s) in out.rows_mut().into_iter().zip(scale) {
        row *= s;
    }
    out
}
