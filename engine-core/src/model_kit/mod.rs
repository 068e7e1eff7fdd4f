//! What every model-family plugin needs alike, the way [`crate::backend_kit`]
//! serves backend plugins: a guard that keeps panics inside the plugin
//! ([`guard`]), a metadata reader that range-checks every hyper-parameter
//! ([`hparams`]), the tensor table a family declares and the loader checks
//! ([`tensors`]), and the weights loaded from a checked file ([`weights`]).
//!
//! A model file is untrusted input: a family reads its hparams through
//! [`hparams::HparamReader`], builds its [`tensors::TensorTable`] from them and
//! loads [`weights::Weights`] against it, so no value from the file reaches a
//! ggml graph before it was checked (docs/reliability.md).

pub mod guard;
pub mod hparams;
pub mod tensors;
pub mod weights;

pub use guard::guarded;
pub use hparams::HparamReader;
pub use tensors::{Dim, Storage, TensorTable};
pub use weights::Weights;
