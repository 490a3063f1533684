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
mod info_nce;
mod triplet;

pub use info_nce::{
    multiple_negatives_ranking_loss, ntxent_loss, InfoNceConfig, InfoNceLoss, MnrlConfig,
};
pub use triplet::{triplet_margin_loss, TripletLoss, TripletLossConfig};

use ndarray::{Array2, ArrayView2, CowArray, Ix2};

use crate::context::Context;
use crate::device_rows::{Rows, RowsView};
use crate::error::{Error, Result};
use crate::inputs::{unimported, Embeddings};

/// `rows` as a host array: host rows as they are, rows resident on the context's device (a
/// bank's, or imported from a buffer) read back. The losses run on the native path.
fn host_rows<'a>(
    op: &'static str,
    ctx: &Context,
    rows: Rows<'a>,
) -> Result<CowArray<'a, f32, Ix2>> {
    match rows {
        Rows::Host(x) => Ok(CowArray::from(x)),
        Rows::Resident(view) => read_resident(op, ctx, view).map(CowArray::from),
    }
}

/// The reference side as a host array, as [`host_rows`].
fn host_refs<'a>(
    op: &'static str,
    ctx: &Context,
    refs: Embeddings<'a>,
) -> Result<CowArray<'a, f32, Ix2>> {
    match refs {
        Embeddings::Host(x) => Ok(CowArray::from(x)),
        Embeddings::Bank(bank) => read_resident(op, ctx, bank.view).map(CowArray::from),
        Embeddings::Device(_) => Err(unimported(op)),
    }
}

fn read_resident(op: &'static str, ctx: &Context, view: RowsView<'_>) -> Result<Array2<f32>> {
    let gpu = ctx.gpu().ok_or_else(|| Error::Internal {
        op,
        message: "device-resident rows with a native context".into(),
    })?;
    gpu.settled(view.rows.read(gpu, view.len))
}

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
