//! One module per operation family, through the public API on both paths.

mod accuracy;
mod angular_loss;
mod checkpoint;
mod class_weights;
mod classifier_loss;
mod device_inputs;
mod dynamic_soft_margin;
mod instance_loss;
mod kmeans;
mod matryoshka;
mod memory_bank;
mod miners;
pub(crate) mod ntxent_loss;
pub(crate) mod pair_loss;
mod pair_loss_tuples;
mod sampling_miners;
mod snr_contrastive;
mod triplet_margin_loss;
mod vicreg_loss;
