//! What operations take and give back: the public input types and their checks (`inputs`),
//! rows already on the device (`device_rows`, `device_embeddings`) and results left on the
//! device (`device_output`). Above the context and the kernels, below the operations.

pub(crate) mod device_embeddings;
pub(crate) mod device_output;
pub(crate) mod device_rows;
pub(crate) mod files;
pub(crate) mod inputs;
