//! One module per kernel stem: each kernel against its plain ndarray reference
//! (`src/reference/<stem>.rs`) on random shapes and edge cases.

mod distance_tile;
mod gemm_tile;
mod info_nce_weights;
mod knn_select;
mod knn_sort;
mod loss_backward;
mod negative_buckets;
mod pair_select;
mod pair_weights;
mod row_norms;
mod triplet_expand;
mod triplet_lists;
mod triplet_select;
pub(crate) mod triplet_weights;
