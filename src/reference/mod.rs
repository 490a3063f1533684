//! Plain, readable CPU references: the oracle every property test compares the kernels with.
//!
//! Each function has the stem of the kernel it mirrors (`shaders/<stem>.wgsl`) and keeps that
//! kernel's loop structure and accumulation order, so differences come only from rounding that
//! the tests bound with a stated tolerance. They are written for clarity, not speed; the fast
//! CPU implementation is the native path of [`crate::Context`]. The losses also have a
//! reference under the operation's name that materialises every triplet or pair.

pub mod classifier_loss;
pub mod distance_tile;
pub mod dynamic_soft_margin;
pub mod gemm_tile;
pub mod info_nce_weights;
pub mod kmeans;
pub mod knn_select;
pub mod knn_sort;
pub mod loss_backward;
pub mod matryoshka;
pub mod negative_buckets;
pub mod ntxent_loss;
mod pair_gradient;
pub mod pair_loss;
mod pair_loss_tuples;
pub mod pair_select;
pub mod pair_weights;
pub mod row_norms;
pub mod triplet_expand;
pub mod triplet_lists;
pub mod triplet_margin_loss;
pub mod triplet_select;
pub mod triplet_weights;
pub mod vicreg_loss;
pub mod weights_step;
