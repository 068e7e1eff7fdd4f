//! ggml graph builders, one module per ONNX stage. Activations use the layout
//! `[channels, time, batch]` (ne0 = channels), so pointwise convolutions and
//! attention projections are plain matrix products and LayerNorm runs along ne0.
//!
//! Batch 1 inference has all-ones text and latent masks (the official pipeline
//! synthesises one chunk at a time), so the builders apply no masks.

pub mod blocks;
pub mod duration;
pub mod text_encoder;
pub mod vector_estimator;
pub mod vocoder;

pub use blocks::Builder;
