//! Voice cloning: a reference recording becomes the conditionals a voice
//! needs (speaker embedding, x-vector, prompt tokens, prompt mel). One stage
//! per file: `features` are the spectral front ends, `voice_encoder`,
//! `campplus` and `s3tokenizer` the networks; this module strings them
//! together as the reference's `prepare_conditionals` does.

pub mod campplus;
pub mod features;
pub mod reference;
pub mod s3tokenizer;
pub mod voice_encoder;
pub mod voice_file;

use crate::s3gen::{S3Gen, S3GenConditioning};
use crate::t3::T3Conditioning;
use engine_core::audio::resample;
use engine_core::model_kit::{Result, Timings};
use voice_encoder::VoiceEncoding;

/// The rate the voice encoder, CAMPPlus and the S3Tokenizer take.
pub const ENCODER_RATE: u32 = 16_000;
/// Speech tokens per second of 16 kHz audio (hop 160, four frames per token).
const TOKEN_SAMPLES: usize = 640;
/// `DEC_COND_LEN`: seconds of the reference S3Gen's prompt takes (both variants).
pub const S3GEN_PROMPT_SECONDS: usize = 10;

/// The most S3Gen prompt mel frames cloning makes for a model at `rate` Hz:
/// those of [`S3GEN_PROMPT_SECONDS`] of audio, the most of a reference it
/// reads (500 at 24 kHz). A voice file may hold no more (`voice_file`).
pub fn max_prompt_frames(rate: u32) -> usize {
    features::s3gen_mel_frames(S3GEN_PROMPT_SECONDS * rate as usize)
}

/// What a voice is to the two models: T3's conditioning and S3Gen's.
#[derive(Debug, Clone, PartialEq)]
pub struct Voice {
    pub t3: T3Conditioning,
    pub s3gen: S3GenConditioning,
}

/// The S3Tokenizer's tokens for a log mel: the graph's projection, quantized on the host.
pub fn speech_tokens(s3: &mut S3Gen, mel: &features::Features) -> Result<Vec<i32>> {
    Ok(s3tokenizer::quantize(&s3.speech_token_projection(mel)?, &s3.hp.tokenizer))
}

/// `embed_ref(wav24k[:10 s])`: S3Gen's prompt mel, x-vector and prompt
/// tokens. The 16 kHz copy goes through torchaudio's resampler, as there;
/// tokens are cut to half the mel frames when the two disagree.
pub fn s3gen_conditioning(s3: &mut S3Gen, wav: &[f32], timings: &mut Timings) -> Result<S3GenConditioning> {
    let rate = s3.hp.hift.sample_rate;
    let wav = &wav[..wav.len().min(S3GEN_PROMPT_SECONDS * rate as usize)];
    let (prompt_feat, wav16) =
        timings.time("clone.prompt", || -> Result<_> { Ok((features::s3gen_mel(wav)?, resample::windowed_sinc(wav, rate, ENCODER_RATE)?)) })?;
    let embedding = timings.time("clone.campplus", || s3.xvector(&features::campplus_fbank(&wav16)?))?;
    let mut prompt_token = timings.time("clone.s3tokenizer", || speech_tokens(s3, &features::s3tokenizer_log_mel(&wav16)?))?;
    prompt_token.truncate(prompt_feat.frames / 2);
    Ok(S3GenConditioning { prompt_token, prompt_feat: prompt_feat.data, embedding })
}

/// T3's conditioning from the reference at 16 kHz: prompt tokens of its
/// first `cond_prompt_len` tokens' worth (15 s for Turbo, 6 s for
/// Multilingual), and the voice encoder's embedding of the whole clip.
pub fn t3_conditioning(t3: &mut impl VoiceEncoding, s3: &mut S3Gen, wav16k: &[f32], timings: &mut Timings) -> Result<T3Conditioning> {
    let tokens = t3.hp().cond_prompt_len;
    // The reference tokenizes no prompt for a T3 without one.
    let prompt_speech_tokens = if tokens == 0 {
        Vec::new()
    } else {
        timings.time("clone.s3tokenizer", || {
            let mut mel = features::s3tokenizer_log_mel(&wav16k[..wav16k.len().min(tokens * TOKEN_SAMPLES)])?;
            mel.truncate(tokens * s3tokenizer::FRAMES_PER_TOKEN);
            speech_tokens(s3, &mel)
        })?
    };
    let speaker_emb = timings.time("clone.voice_encoder", || voice_encoder::embed(t3, wav16k))?;
    Ok(T3Conditioning { speaker_emb, prompt_speech_tokens })
}

/// Both conditionings from a reference at S3Gen's rate (24 kHz), after any
/// loudness step: `prepare_conditionals` from its `librosa.load` on. The
/// 16 kHz copy for T3 is `librosa.resample`'s, through libsoxr as there
/// (`tts_soxr`): its speech tokens round as the reference's do.
pub fn conditionals(t3: &mut impl VoiceEncoding, s3: &mut S3Gen, wav: &[f32], timings: &mut Timings) -> Result<Voice> {
    let wav16k = timings.time("clone.resample", || tts_soxr::librosa_resample(wav, s3.hp.hift.sample_rate, ENCODER_RATE))?;
    let s3gen = s3gen_conditioning(s3, wav, timings)?;
    Ok(Voice { t3: t3_conditioning(t3, s3, &wav16k, timings)?, s3gen })
}
