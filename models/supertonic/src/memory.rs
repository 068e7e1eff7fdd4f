//! What one synthesis needs in a device's memory, sized from the model file
//! alone: the weights as the policy stores them, and each stage graph's
//! intermediates at given lengths, measured by ggml's allocator without
//! allocating or reading a weight. The graphs are built by the same builders
//! the pipeline uses (`model.rs`), so the sizes are the ones a synthesis at
//! those lengths allocates.

use crate::graph::vector_estimator::{self, StepShape};
use crate::graph::{duration, text_encoder, vocoder, Builder};
use crate::hparams::Hparams;
use crate::model::{check_file, is_matmul_weight, CheckedFile, MAX_CHUNK_SECONDS, MAX_NODES};
use crate::text::MAX_NORMALIZED_CHARS;
use engine_core::abi::{MemoryItem, MemoryPlan};
use engine_core::model_kit::builder::measure_graph;
use engine_core::model_kit::{OpPolicy, Result, Weights};
use ggml_sys::gguf::GgufTensors;
use ggml_sys::{Backend, GraphIo, Result as GgmlResult};
use std::path::Path;

/// The lengths one chunk's graphs are sized at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lengths {
    /// Text ids of the chunk (duration predictor, text encoder).
    pub text_ids: usize,
    /// Latent frames of the chunk's audio (vector estimator, vocoder).
    pub latent_frames: usize,
}

/// The longest chunk the pipeline makes of any text: normalised text of
/// [`MAX_NORMALIZED_CHARS`] characters (the chunker cuts any chunk that
/// normalisation would lengthen beyond it) in the longest language tags; and
/// [`MAX_CHUNK_SECONDS`] of audio, the most the pipeline accepts from the
/// duration predictor (after the speed factor).
pub fn longest_chunk(hp: &Hparams) -> Lengths {
    let tag = hp.text.languages.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    let wrap = if hp.text.wrap_open_close { 2 * tag + 5 } else { 0 };
    let wav_len = (MAX_CHUNK_SECONDS * hp.sample_rate as f32) as usize;
    Lengths { text_ids: MAX_NORMALIZED_CHARS + wrap, latent_frames: wav_len.div_ceil(hp.samples_per_frame()) }
}

/// Sizes the model at `path` on `backend`'s device under `policy` for one
/// chunk of `lengths` (`None`: [`longest_chunk`]): the weights, then the
/// duration predictor, text encoder, vector estimator and vocoder graphs, in
/// bytes by item in pipeline order.
/// Chunks run one after another, so one chunk's graphs are what a synthesis
/// of any length holds at once.
pub fn plan(path: &Path, backend: &Backend, policy: &OpPolicy, lengths: Option<Lengths>) -> Result<(MemoryPlan, Lengths)> {
    let gguf = GgufTensors::open(path)?;
    let CheckedFile { hp, table, .. } = check_file(&gguf)?;
    let lengths = lengths.unwrap_or_else(|| longest_chunk(&hp));
    let weights = Weights::for_measuring(gguf, table, policy.matmul_weights)?;
    let buft = backend.buffer_type();
    let measure = |f: &dyn for<'c> Fn(&Builder<'c, '_>) -> GgmlResult<GraphIo<'c>>| {
        measure_graph(buft, backend.device(), &weights, policy, MAX_NODES, |kit| f(&Builder::new(kit, hp.layer_norm_eps)))
    };
    let Lengths { text_ids, latent_frames } = lengths;
    // The PReLU slopes are host scalars baked into the graphs; their values
    // do not change a graph's shape.
    let dims =
        vector_estimator::Dims { latent_channels: hp.latent_channels(), text_dim: hp.te.char_dim, style_dim: hp.style_dim, style_tokens: hp.style_tokens };
    let step = StepShape { latent_len: latent_frames, text_len: text_ids, total_steps: hp.default_steps as usize };
    let items = [
        ("weights", weights.size_on(backend, is_matmul_weight)),
        ("duration", measure(&|b| duration::build(b, &hp.dp, 0.0, text_ids))?),
        ("text_encoder", measure(&|b| text_encoder::build(b, &hp.te, hp.style_dim, hp.style_tokens, text_ids))?),
        ("vector_estimator", measure(&|b| vector_estimator::build(b, &hp.ve, &dims, step))?),
        ("vocoder", measure(&|b| vocoder::build(b, &hp, 0.0, latent_frames))?),
    ];
    let sized_for =
        format!("the longest chunk the pipeline makes: {} text ids, {} latent frames ({MAX_CHUNK_SECONDS} s)", lengths.text_ids, lengths.latent_frames);
    let items = items.into_iter().map(|(what, bytes)| MemoryItem { what: what.into(), bytes: bytes as u64 }).collect();
    Ok((MemoryPlan { items, sized_for: sized_for.into() }, lengths))
}
