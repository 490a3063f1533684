//! The extension module behind the `wgpu_metric_learning` Python package
//! (`wgpu_metric_learning._native`).
//!
//! Thin on purpose: arguments arrive already converted by the package's Python layer (`float32`
//! matrices, `int64` labels, strings for enums), every call runs the library with the GIL
//! released on a worker thread while the calling thread watches for Ctrl-C (a pending
//! `KeyboardInterrupt` cancels the call through the library's [`CancelToken`]), and every
//! library [`Error`] becomes a Python exception carrying its whole message: bad input is a
//! `ValueError`, a budget or out-of-memory failure a `MemoryError`, a cancelled call a
//! `KeyboardInterrupt`, a file error an `OSError`, anything from the device a `RuntimeError`.
//! Inputs are borrowed from NumPy without copying (any strides); outputs are the library's own
//! arrays handed to NumPy without copying.

mod bank;
mod call;
mod class_weights;
mod classifier;
mod context;
mod eval;
mod losses;
mod mining;

use pyo3::prelude::*;

use bank::PyMemoryBank;
use context::{list_adapters, PyContext};
use eval::{
    accuracy, adjusted_mutual_info, kmeans, knn, normalized_mutual_info, pairwise_distances,
};
use losses::{
    angular_loss, circle_loss, contrastive_loss, dynamic_soft_margin_loss, fast_ap_loss,
    generalized_lifted_structure_loss, histogram_loss, instance_loss, intra_pair_variance_loss,
    lifted_structure_loss, margin_loss, multi_similarity_loss, multiple_negatives_ranking_loss,
    n_pairs_loss, nca_loss, ntxent_loss, pnp_loss, ranked_list_loss, snr_contrastive_loss,
    supcon_loss, threshold_consistent_margin_loss, triplet_margin_loss, tuplet_margin_loss,
    vicreg_loss,
};
use mining::{
    all_pairs, angular_triplets, batch_easy_hard_pairs, batch_hard_triplets, count_triplets,
    distance_weighted_triplets, hdc_pairs, mine_triplets, multi_similarity_pairs,
    pair_margin_pairs, uniform_histogram_pairs, TripletChunks,
};

/// The extension module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The crate's version: the Python package's is the same (pyproject.toml reads it).
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<PyContext>()?;
    m.add_class::<PyMemoryBank>()?;
    m.add_class::<TripletChunks>()?;
    m.add_function(wrap_pyfunction!(list_adapters, m)?)?;
    m.add_function(wrap_pyfunction!(pairwise_distances, m)?)?;
    m.add_function(wrap_pyfunction!(knn, m)?)?;
    m.add_function(wrap_pyfunction!(classifier::classifier_loss, m)?)?;
    m.add_function(wrap_pyfunction!(classifier::classifier_loss_sharded, m)?)?;
    m.add_function(wrap_pyfunction!(classifier::sampled_classes, m)?)?;
    m.add_function(wrap_pyfunction!(class_weights::save_weights_shard, m)?)?;
    m.add_function(wrap_pyfunction!(class_weights::save_weights_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(class_weights::load_weights, m)?)?;
    m.add_function(wrap_pyfunction!(class_weights::checkpoint_classes, m)?)?;
    m.add_function(wrap_pyfunction!(mine_triplets, m)?)?;
    m.add_function(wrap_pyfunction!(count_triplets, m)?)?;
    m.add_function(wrap_pyfunction!(all_pairs, m)?)?;
    m.add_function(wrap_pyfunction!(pair_margin_pairs, m)?)?;
    m.add_function(wrap_pyfunction!(multi_similarity_pairs, m)?)?;
    m.add_function(wrap_pyfunction!(batch_easy_hard_pairs, m)?)?;
    m.add_function(wrap_pyfunction!(batch_hard_triplets, m)?)?;
    m.add_function(wrap_pyfunction!(angular_triplets, m)?)?;
    m.add_function(wrap_pyfunction!(distance_weighted_triplets, m)?)?;
    m.add_function(wrap_pyfunction!(hdc_pairs, m)?)?;
    m.add_function(wrap_pyfunction!(uniform_histogram_pairs, m)?)?;
    m.add_function(wrap_pyfunction!(accuracy, m)?)?;
    m.add_function(wrap_pyfunction!(kmeans, m)?)?;
    m.add_function(wrap_pyfunction!(normalized_mutual_info, m)?)?;
    m.add_function(wrap_pyfunction!(adjusted_mutual_info, m)?)?;
    m.add_function(wrap_pyfunction!(triplet_margin_loss, m)?)?;
    m.add_function(wrap_pyfunction!(ntxent_loss, m)?)?;
    m.add_function(wrap_pyfunction!(multiple_negatives_ranking_loss, m)?)?;
    m.add_function(wrap_pyfunction!(contrastive_loss, m)?)?;
    m.add_function(wrap_pyfunction!(multi_similarity_loss, m)?)?;
    m.add_function(wrap_pyfunction!(supcon_loss, m)?)?;
    m.add_function(wrap_pyfunction!(circle_loss, m)?)?;
    m.add_function(wrap_pyfunction!(nca_loss, m)?)?;
    m.add_function(wrap_pyfunction!(generalized_lifted_structure_loss, m)?)?;
    m.add_function(wrap_pyfunction!(margin_loss, m)?)?;
    m.add_function(wrap_pyfunction!(fast_ap_loss, m)?)?;
    m.add_function(wrap_pyfunction!(lifted_structure_loss, m)?)?;
    m.add_function(wrap_pyfunction!(histogram_loss, m)?)?;
    m.add_function(wrap_pyfunction!(tuplet_margin_loss, m)?)?;
    m.add_function(wrap_pyfunction!(intra_pair_variance_loss, m)?)?;
    m.add_function(wrap_pyfunction!(ranked_list_loss, m)?)?;
    m.add_function(wrap_pyfunction!(threshold_consistent_margin_loss, m)?)?;
    m.add_function(wrap_pyfunction!(pnp_loss, m)?)?;
    m.add_function(wrap_pyfunction!(n_pairs_loss, m)?)?;
    m.add_function(wrap_pyfunction!(instance_loss, m)?)?;
    m.add_function(wrap_pyfunction!(angular_loss, m)?)?;
    m.add_function(wrap_pyfunction!(vicreg_loss, m)?)?;
    m.add_function(wrap_pyfunction!(snr_contrastive_loss, m)?)?;
    m.add_function(wrap_pyfunction!(dynamic_soft_margin_loss, m)?)?;
    Ok(())
}
