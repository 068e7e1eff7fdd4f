//! What every model-family plugin needs alike, the way [`crate::backend_kit`]
//! serves backend plugins: a guard that keeps panics inside the plugin
//! ([`guard`]), a metadata reader that range-checks every hyper-parameter
//! ([`hparams`]), the tensor table a family declares and the loader checks
//! ([`tensors`]), the weights loaded from a checked file ([`weights`]), the
//! resolved policies as graphs obey them ([`policy`]), the graph builder whose
//! ops follow them ([`builder`]), stage timings ([`timings`]), text helpers
//! both front ends use ([`text`]), typed synthesis options ([`options`]),
//! the family side of streaming ([`stream`]),
//! `.npy` arrays ([`npy`]), input files opened by kind with a size cap
//! ([`files`]), finiteness checks of weights, voices and stage
//! outputs ([`finite`]), a restricted reader of PyTorch `.pt` checkpoints
//! that refuses any pickle global outside an allow-list ([`torch_pickle`]),
//! what native converters share: checkpoint readers, the streaming GGUF writer
//! and bit-exact encoders ([`convert`]),
//! and the one error type all of it returns ([`error`]).
//!
//! A model file is untrusted input: a family reads its hparams through
//! [`hparams::HparamReader`], builds its [`tensors::TensorTable`] from them and
//! loads [`weights::Weights`] against it, so no value from the file reaches a
//! ggml graph before it was checked (docs/reliability.md).

pub mod builder;
pub mod census;
pub mod convert;
pub mod error;
pub mod files;
pub mod finite;
pub mod guard;
pub mod hparams;
pub mod npy;
pub mod options;
pub mod policy;
pub mod stream;
pub mod tensors;
pub mod text;
pub mod timings;
pub mod torch_pickle;
pub mod weights;

pub use builder::Builder;
pub use error::{Error, Result};
pub use guard::guarded;
pub use hparams::HparamReader;
pub use options::OptionReader;
pub use policy::OpPolicy;
pub use stream::PieceSender;
pub use tensors::{Dim, Storage, TensorTable};
pub use timings::Timings;
pub use weights::{DerivedTensor, Weights};

/// `Ok` when `file`'s `general.architecture` is `arch`; else an error naming
/// the file, what it holds and what was expected (`what`: "a Chatterbox T3 model").
pub fn require_architecture(file: &ggml_sys::gguf::GgufFile, arch: &str, what: &str) -> Result<()> {
    let found = file.get_str("general.architecture")?;
    if found == arch {
        Ok(())
    } else {
        Err(Error::msg(format!("{}: architecture '{found}' is not {what} ('{arch}')", file.path().display())))
    }
}
