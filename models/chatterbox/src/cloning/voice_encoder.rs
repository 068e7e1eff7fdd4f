//! The VoiceEncoder: a 16 kHz recording → the speaker embedding T3 conditions
//! on (REF `voice_encoder/voice_encoder.py`, `embeds_from_wavs` with its
//! defaults).
//!
//! Host: leading and trailing silence trimmed ([`trim_silence`]), the power
//! mel (`features::voice_encoder_mel`), then overlapping partials of
//! [`PARTIAL_FRAMES`] frames every [`FRAME_STEP`] frames, the last one
//! zero-padded ([`partial_count`]). Graph ([`build`]): the LSTM stack over every
//! partial's frames at once, the last layer's final hidden state projected and
//! ReLU'd. Host: each partial's embedding L2-normalised, their mean
//! L2-normalised ([`speaker_embedding`]).

use super::features;
use crate::hparams::{T3Hparams, VoiceEncoderHparams};
use engine_core::model_kit::builder::compute_graph;
use engine_core::model_kit::{Builder, OpPolicy, Weights};
use ggml_sys::{Backend, ComputeGraph, GraphIo, GraphSlot, Result, Tensor, TYPE_F32};
use std::ops::Range;

pub const MELS: &str = "ve.mels";
pub const EMBEDDINGS: &str = "ve.embeddings";

/// Frames per partial utterance (`ve_partial_frames`).
pub const PARTIAL_FRAMES: usize = 160;
/// Frames between partials: `round((16000 / rate) / 160)` at the reference's
/// `rate = 1.3` partials per second.
pub const FRAME_STEP: usize = 77;
/// The last partial is kept when at least this share of it is real frames.
pub const MIN_COVERAGE: f64 = 0.8;
/// `librosa.effects.trim(top_db=20)`.
pub const TRIM_TOP_DB: f64 = 20.0;
/// `embeds_from_mels(batch_size=32)`: partials per run, which bounds the
/// graph whatever the recording's length.
pub const MAX_BATCH: usize = 32;

const TRIM_FRAME: usize = 2048;
const TRIM_HOP: usize = 512;

/// `librosa.effects.trim(wav, top_db)`: from the start of the first to the
/// end of the last RMS frame (2048 samples every 512, centred, zero-padded)
/// within `top_db` of the loudest frame, in samples. The loudest frame always
/// qualifies, so only an empty recording trims to an empty range; like
/// librosa, an all-zero one is a 0 dB plateau and keeps everything.
pub fn trim_silence(wav: &[f32], top_db: f64) -> Range<usize> {
    let frames = 1 + wav.len() / TRIM_HOP;
    let half = (TRIM_FRAME / 2) as isize;
    let rms: Vec<f64> = (0..frames)
        .map(|f| {
            let start = (f * TRIM_HOP) as isize - half;
            let lo = start.max(0) as usize;
            let hi = ((start + TRIM_FRAME as isize).max(0) as usize).min(wav.len());
            let energy: f64 = wav.get(lo..hi).unwrap_or(&[]).iter().map(|&x| (x as f64) * (x as f64)).sum();
            (energy / TRIM_FRAME as f64).sqrt()
        })
        .collect();
    // `amplitude_to_db(ref=np.max)`: powers floored at amin² = 1e-10.
    let db = |a: f64| 10.0 * (a * a).max(1e-10).log10();
    let reference = db(rms.iter().copied().fold(0.0, f64::max));
    let loud = |r: &f64| db(*r) - reference > -top_db;
    match (rms.iter().position(loud), rms.iter().rposition(loud)) {
        (Some(first), Some(last)) => first * TRIM_HOP..wav.len().min((last + 1) * TRIM_HOP),
        _ => 0..0,
    }
}

/// `get_num_wins`: how many partials a mel of `frames` frames gives, and the
/// frames they span (the mel is cut or zero-padded to that).
pub fn partial_count(frames: usize) -> (usize, usize) {
    let (win, step) = (PARTIAL_FRAMES, FRAME_STEP);
    let span = (frames + step).saturating_sub(win);
    let (mut n, remainder) = (span / step, span % step);
    if n == 0 || (remainder + win - step) as f64 / win as f64 >= MIN_COVERAGE {
        n += 1;
    }
    (n, win + step * (n - 1))
}

/// Partials `first..first + count` of a frame-major mel (`dims` bins per
/// frame) as the graph's input: `[frame][partial][bin]`, frames past the
/// mel's end zero.
pub fn partial_batch(mel: &[f32], dims: usize, first: usize, count: usize) -> Vec<f32> {
    let frames = mel.len() / dims;
    let mut out = vec![0.0; PARTIAL_FRAMES * count * dims];
    for t in 0..PARTIAL_FRAMES {
        for p in 0..count {
            let src = (first + p) * FRAME_STEP + t;
            if src < frames {
                let dst = (t * count + p) * dims;
                out[dst..dst + dims].copy_from_slice(&mel[src * dims..(src + 1) * dims]);
            }
        }
    }
    out
}

/// Input `ve.mels` `[n_mels, partials, frames]`; output `ve.embeddings`
/// `[embedding, partials]`: `ReLU(proj(h))` of the last layer's final hidden
/// state, before normalisation.
///
/// The layers advance together frame by frame, so layer l reads layer l−1's
/// state of the same frame without the sequence ever being gathered; layer 0's
/// input products for every frame are one product up front.
pub fn build<'c>(b: &Builder<'c, '_>, hp: &VoiceEncoderHparams, partials: usize) -> Result<GraphIo<'c>> {
    let ctx = b.ctx;
    let (h, n, frames) = (hp.hidden as i64, partials as i64, PARTIAL_FRAMES as i64);
    let f = std::mem::size_of::<f32>();
    let mels = ctx.new_tensor(TYPE_F32, &[hp.n_mels as i64, n, frames])?.set_name(MELS);
    let layers = (0..hp.layers)
        .map(|l| {
            let w = |a: &str| b.w(&format!("ve.lstm.{l}.{a}"));
            Ok(LstmLayer { w_ih: w("weight_ih")?, w_hh: w("weight_hh")?, b_ih: w("bias_ih")?, b_hh: w("bias_hh")? })
        })
        .collect::<Result<Vec<_>>>()?;
    let first = &layers[0];
    let x0 = ctx.mul_mat(first.w_ih, ctx.reshape(mels, &[hp.n_mels as i64, n * frames])?)?;
    let x0 = ctx.add(ctx.add(x0, first.b_ih)?, first.b_hh)?;
    let gate_row = (4 * h * n) as usize * f;
    let mut state: Vec<Option<(Tensor<'c>, Tensor<'c>)>> = vec![None; layers.len()];
    for t in 0..frames as usize {
        let mut below: Option<Tensor<'c>> = None;
        for (l, layer) in layers.iter().enumerate() {
            let mut gates = match below {
                None => ctx.view(x0, &[4 * h, n], &[(4 * h) as usize * f], t * gate_row)?,
                Some(x) => ctx.add(ctx.add(ctx.mul_mat(layer.w_ih, x)?, layer.b_ih)?, layer.b_hh)?,
            };
            if let Some((h_prev, _)) = state[l] {
                gates = ctx.add(gates, ctx.mul_mat(layer.w_hh, h_prev)?)?;
            }
            let (h_new, c_new) = lstm_cell(b, gates, h, n, state[l].map(|(_, c)| c))?;
            state[l] = Some((h_new, c_new));
            below = Some(h_new);
        }
    }
    let (last, _) = state.last().copied().flatten().expect("at least one layer and one frame");
    let embeddings = ctx.relu(b.linear(last, "ve.proj")?)?.set_name(EMBEDDINGS);
    Ok(GraphIo { inputs: vec![(MELS, mels)], outputs: vec![(EMBEDDINGS, embeddings)] })
}

struct LstmLayer<'c> {
    w_ih: Tensor<'c>,
    w_hh: Tensor<'c>,
    b_ih: Tensor<'c>,
    b_hh: Tensor<'c>,
}

/// PyTorch's LSTM cell on pre-activations `[4h, n]` (rows: input, forget,
/// cell, output gates): `c = σ(f)·c_prev + σ(i)·tanh(g)`, `h = σ(o)·tanh(c)`.
/// Returns `(h, c)`. Both nonlinearities run over the whole block, so every
/// unary op reads a contiguous tensor (what every backend runs); the gates are
/// views into them.
fn lstm_cell<'c>(b: &Builder<'c, '_>, gates: Tensor<'c>, h: i64, n: i64, c_prev: Option<Tensor<'c>>) -> Result<(Tensor<'c>, Tensor<'c>)> {
    let ctx = b.ctx;
    let f = std::mem::size_of::<f32>();
    let (sig, tanh) = (ctx.sigmoid(gates)?, ctx.tanh(gates)?);
    let gate = |src: Tensor<'c>, k: usize| ctx.view(src, &[h, n], &[(4 * h) as usize * f], k * h as usize * f);
    let input_cell = ctx.mul(gate(sig, 0)?, gate(tanh, 2)?)?;
    let c = match c_prev {
        Some(c_prev) => ctx.add(ctx.mul(gate(sig, 1)?, c_prev)?, input_cell)?,
        None => input_cell,
    };
    let h_new = ctx.mul(gate(sig, 3)?, ctx.tanh(c)?)?;
    Ok((h_new, c))
}

/// A T3 file's voice encoder, whichever backbone the file holds.
pub trait VoiceEncoding {
    fn hp(&self) -> &T3Hparams;
    /// The voice encoder over one batch of `partials` partial mels laid out
    /// as [`partial_batch`] lays them: their raw embeddings,
    /// `[partial][embedding]` flattened.
    fn voice_encoder_partials(&mut self, batch: &[f32], partials: usize) -> engine_core::model_kit::Result<Vec<f32>>;
}

/// The voice encoder's graphs, by partials per batch (a full batch and the
/// rest), built on the weights of the T3 that owns them.
pub struct VoiceEncoderGraphs {
    slot: GraphSlot<usize>,
}

impl Default for VoiceEncoderGraphs {
    fn default() -> Self {
        VoiceEncoderGraphs { slot: GraphSlot::with_capacity(2) }
    }
}

impl VoiceEncoderGraphs {
    pub fn graph(&self) -> Option<&ComputeGraph> {
        self.slot.graph()
    }

    pub fn run(
        &mut self,
        backend: &Backend,
        weights: &Weights,
        policy: &OpPolicy,
        hp: &VoiceEncoderHparams,
        batch: &[f32],
        partials: usize,
    ) -> engine_core::model_kit::Result<Vec<f32>> {
        if partials == 0 || batch.len() != partials * PARTIAL_FRAMES * hp.n_mels {
            return Err(format!("the voice encoder got {} values for {partials} partials of {PARTIAL_FRAMES} frames x {} bins", batch.len(), hp.n_mels).into());
        }
        let graph =
            self.slot.get_or_build(partials, || compute_graph(backend, weights, policy, max_nodes(hp), "the voice encoder", |b| build(&b, hp, partials)))?;
        graph.set_f32(MELS, batch)?;
        engine_core::model_kit::finite::check_stage("the voice encoder", graph.compute_and_get_f32(backend, EMBEDDINGS)?)
    }
}

/// `VoiceEncoder.embeds_from_wavs([wav16k], 16000)`: the speaker embedding
/// of a 16 kHz recording, computed by `t3`'s voice encoder.
pub fn embed(t3: &mut impl VoiceEncoding, wav16k: &[f32]) -> engine_core::model_kit::Result<Vec<f32>> {
    let hp = t3.hp().voice_encoder;
    let span = trim_silence(wav16k, TRIM_TOP_DB);
    let speech = &wav16k[span.clone()];
    if speech.len() < MIN_SAMPLES {
        return Err(format!(
            "the reference has {} ms of sound above its silence (-{TRIM_TOP_DB} dB of its peak); the voice encoder needs at least {} ms",
            speech.len() / 16,
            MIN_SAMPLES / 16
        )
        .into());
    }
    let mel = features::voice_encoder_mel(speech, hp.n_mels)?;
    let (partials, _) = partial_count(mel.frames);
    // `torch.chunk` into ceil(n / 32) near-equal batches.
    let batches = partials.div_ceil(MAX_BATCH);
    let per_batch = partials.div_ceil(batches);
    let mut raw = Vec::with_capacity(partials * hp.embedding);
    for first in (0..partials).step_by(per_batch) {
        let count = per_batch.min(partials - first);
        raw.extend(t3.voice_encoder_partials(&partial_batch(&mel.data, mel.dims, first, count), count)?);
    }
    Ok(speaker_embedding(&raw, hp.embedding))
}

/// The shortest trimmed recording [`embed`] takes: one STFT frame's worth
/// (the mel's reflection padding needs more samples than half a frame).
pub const MIN_SAMPLES: usize = 201;

/// Nodes of a [`build`] graph, bounded: each layer's cell is under 24 nodes per frame.
pub fn max_nodes(hp: &VoiceEncoderHparams) -> usize {
    24 * hp.layers * PARTIAL_FRAMES + 64
}

/// The speaker embedding from the partials' raw embeddings
/// (`[partial][embedding]`, flattened): each L2-normalised, then their mean
/// L2-normalised. A zero vector stays zero rather than dividing by zero.
pub fn speaker_embedding(raw: &[f32], dims: usize) -> Vec<f32> {
    let normalised = |v: &[f64]| -> Vec<f64> {
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        v.iter().map(|x| if norm > 0.0 { x / norm } else { 0.0 }).collect()
    };
    let partials = raw.len() / dims;
    let mut mean = vec![0.0f64; dims];
    for p in raw.chunks_exact(dims) {
        let unit = normalised(&p.iter().map(|&x| x as f64).collect::<Vec<_>>());
        mean.iter_mut().zip(unit).for_each(|(m, u)| *m += u / partials as f64);
    }
    normalised(&mean).into_iter().map(|x| x as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_counts_follow_the_reference_coverage_rule() {
        // Shorter than one partial: one, zero-padded.
        assert_eq!(partial_count(1), (1, 160));
        assert_eq!(partial_count(160), (1, 160));
        // 160 + 77 = 237 frames make two; the third needs 0.8·160 = 128 real frames.
        assert_eq!(partial_count(237), (2, 237));
        assert_eq!(partial_count(237 + 77 - 33), (2, 237));
        assert_eq!(partial_count(237 + 77 - 32), (3, 314));
        // 10 s at 100 frames per second.
        assert_eq!(partial_count(1001), (12, 1007));
    }

    #[test]
    fn trimming_keeps_the_loud_span_in_whole_hops() {
        let mut wav = vec![0.0f32; 16000];
        wav[5000..9000].iter_mut().enumerate().for_each(|(i, x)| *x = 0.5 * (i as f32 * 0.3).sin());
        let span = trim_silence(&wav, TRIM_TOP_DB);
        assert_eq!(span.start % TRIM_HOP, 0);
        assert!(span.start <= 5000 && span.start + TRIM_FRAME >= 5000, "{span:?}");
        assert!(span.end >= 9000 && span.end <= 9000 + TRIM_FRAME, "{span:?}");
        // librosa: all zeros is a 0 dB plateau, kept whole.
        assert_eq!(trim_silence(&[0.0; 3000], TRIM_TOP_DB), 0..3000);
    }

    #[test]
    fn partial_batches_are_frame_major_and_zero_past_the_mel() {
        let dims = 2;
        let mel: Vec<f32> = (0..200 * dims).map(|i| i as f32).collect();
        let batch = partial_batch(&mel, dims, 0, 2);
        // Frame 0 of partial 1 is mel frame 77.
        assert_eq!(&batch[dims..2 * dims], &mel[77 * dims..78 * dims]);
        // Partial 1 reaches frame 77 + 159 = 236 > 199: its tail is zero.
        let t = 130; // mel frame 207
        assert_eq!(&batch[(t * 2 + 1) * dims..(t * 2 + 2) * dims], &[0.0, 0.0]);
    }

    #[test]
    fn the_speaker_embedding_is_the_normalised_mean_of_unit_partials() {
        let e = speaker_embedding(&[3.0, 4.0, 0.0, 2.0], 2);
        let expected: [f64; 2] = [0.6 / 2.0, (0.8 + 1.0) / 2.0];
        let norm = (expected[0] * expected[0] + expected[1] * expected[1]).sqrt();
        assert!((e[0] as f64 - expected[0] / norm).abs() < 1e-7 && (e[1] as f64 - expected[1] / norm).abs() < 1e-7, "{e:?}");
    }
}
