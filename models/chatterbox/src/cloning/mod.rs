//! Voice cloning: a reference recording becomes the conditionals a voice
//! needs (speaker embedding, x-vector, prompt tokens, prompt mel). This module
//! holds the stages one per file; `features` are the spectral front ends.

pub mod campplus;
pub mod features;
pub mod s3tokenizer;
pub mod voice_encoder;
