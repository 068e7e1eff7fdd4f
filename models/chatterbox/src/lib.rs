//! Chatterbox model-family plugin (`libtts_model_chatterbox.so`): Turbo and
//! Nano (GPT-2 T3), with Multilingual (Llama T3) planned on the same layout.
//!
//! Layout: [`hparams`] (GGUF metadata), [`weights`], [`text`] (normalisation,
//! sentence split, tokenizer), [`t3`] (speech-token generator: graph builder,
//! static K/V cache, generation loop), [`sampler`], [`graph`] (shared builder
//! helpers).

pub mod graph;
pub mod hparams;
pub mod model;
pub mod s3gen;
pub mod sampler;
pub mod t3;
pub mod text;
pub mod weights;
