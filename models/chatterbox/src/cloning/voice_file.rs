//! Saved voices (`tts voice save`, `--set voice=NAME.voice`): the
//! conditionals cloning computed, written once and reused without the
//! encoders. A small GGUF file (docs/gguf.md, "Chatterbox voice"):
//!
//! - `general.architecture` = `chatterbox-voice`;
//! - `chatterbox-voice.format_version` (u32): [`FORMAT_VERSION`]; a reader
//!   refuses a newer one;
//! - `chatterbox-voice.variant` (str): the model variant that computed it
//!   (turbo, nano, mtl); a model of another variant refuses it, since each
//!   variant's encoders and prompt lengths are its own;
//! - `chatterbox-voice.prompt_speech_tokens` (u32): T3's prompt length (0: no
//!   prompt tensor);
//! - tensors `voice.speaker_emb`, `voice.prompt_speech_tokens`,
//!   `voice.prompt_token`, `voice.prompt_feat`, `voice.embedding` (the table in
//!   `tensors::voice_table`).
//!
//! Reading checks everything a built-in voice is checked for: shapes against
//! the loaded model, token ids inside their vocabularies, finite values.

use super::Voice;
use crate::hparams::{S3GenHparams, T3Hparams};
use crate::s3gen::S3GenConditioning;
use crate::t3::T3Conditioning;
use crate::tensors::{self, PROMPT_FRAMES, PROMPT_TOKENS};
use engine_core::model_kit::{files, Result};
use ggml_sys::gguf::{GgufTensors, GgufWriter};
use std::path::Path;

pub const ARCH: &str = "chatterbox-voice";
pub const FORMAT_VERSION: u32 = 1;
const KEY_VERSION: &str = "chatterbox-voice.format_version";
const KEY_VARIANT: &str = "chatterbox-voice.variant";
const KEY_PROMPT_TOKENS: &str = "chatterbox-voice.prompt_speech_tokens";

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `voice` as a voice file's bytes, for a model of `variant` with `mel_channels` mel bins.
pub fn to_bytes(voice: &Voice, variant: &str, mel_channels: usize) -> Result<Vec<u8>> {
    let (t3, s3) = (&voice.t3, &voice.s3gen);
    if mel_channels == 0 || s3.prompt_feat.is_empty() || !s3.prompt_feat.len().is_multiple_of(mel_channels) || s3.prompt_token.is_empty() {
        return Err("the voice has no S3Gen prompt to save".into());
    }
    let frames = (s3.prompt_feat.len() / mel_channels) as i64;
    let mut w = GgufWriter::new();
    w.set_str("general.architecture", ARCH)
        .set_u32(KEY_VERSION, FORMAT_VERSION)
        .set_str(KEY_VARIANT, variant)
        .set_u32(KEY_PROMPT_TOKENS, t3.prompt_speech_tokens.len() as u32);
    w.add_tensor(tensors::VOICE_SPEAKER_EMB, ggml_sys::TYPE_F32, &[t3.speaker_emb.len() as i64], f32_bytes(&t3.speaker_emb))?;
    if !t3.prompt_speech_tokens.is_empty() {
        w.add_tensor(tensors::VOICE_PROMPT_SPEECH_TOKENS, ggml_sys::TYPE_I32, &[t3.prompt_speech_tokens.len() as i64], i32_bytes(&t3.prompt_speech_tokens))?;
    }
    w.add_tensor(tensors::VOICE_PROMPT_TOKEN, ggml_sys::TYPE_I32, &[s3.prompt_token.len() as i64], i32_bytes(&s3.prompt_token))?;
    w.add_tensor(tensors::VOICE_PROMPT_FEAT, ggml_sys::TYPE_F32, &[mel_channels as i64, frames], f32_bytes(&s3.prompt_feat))?;
    w.add_tensor(tensors::VOICE_EMBEDDING, ggml_sys::TYPE_F32, &[s3.embedding.len() as i64], f32_bytes(&s3.embedding))?;
    Ok(w.to_bytes()?)
}

/// Reads and checks a voice file for the loaded model (`t3`, `s3`).
pub fn read(path: &Path, t3: &T3Hparams, s3: &S3GenHparams) -> Result<Voice> {
    let shown = path.display();
    // By kind and size first: a FIFO would block, a device never end.
    let bytes = files::read_regular(path, "voice file", files::caps::VOICE_FILE)?;
    if bytes.len() >= 4 && !bytes.starts_with(b"GGUF") {
        return Err(format!("{shown}: not a Chatterbox voice file (those are GGUF files saved by `tts voice save`)").into());
    }
    let gguf = GgufTensors::from_bytes(&bytes, &shown.to_string()).map_err(|e| format!("voice file: {e}"))?;
    check(&gguf, &shown.to_string(), t3, s3)
}

/// The checks of [`read`] on an opened voice file, `shown` naming it in errors
/// (the `voice_file` fuzz target drives them on file images in memory).
pub fn check(gguf: &GgufTensors, shown: &str, t3: &T3Hparams, s3: &S3GenHparams) -> Result<Voice> {
    let file = &gguf.file;
    let arch = file.get_str("general.architecture").map_err(|_| format!("{shown}: not a voice file (no general.architecture)"))?;
    if arch != ARCH {
        return Err(format!("{shown}: not a Chatterbox voice file (architecture '{arch}'; a voice saved by `tts voice save` has '{ARCH}')").into());
    }
    let version = file.get_u32(KEY_VERSION)?;
    if version > FORMAT_VERSION {
        return Err(format!("{shown}: voice format version {version} comes from a newer tts; this one reads version {FORMAT_VERSION} and older").into());
    }
    if version == 0 {
        return Err(format!("{shown}: voice format version 0 does not exist").into());
    }
    let variant = file.get_str(KEY_VARIANT)?;
    if variant != t3.variant {
        return Err(
            format!("{shown}: the voice was saved with Chatterbox {variant}; this model is {} (save the voice again with this model)", t3.variant).into()
        );
    }
    let prompt_tokens = file.get_u32(KEY_PROMPT_TOKENS)? as usize;
    if prompt_tokens > t3.cond_prompt_len {
        return Err(format!("{shown}: {prompt_tokens} T3 prompt tokens; this model takes at most {}", t3.cond_prompt_len).into());
    }
    let mut table = tensors::voice_table(t3, s3, prompt_tokens);
    table.check(gguf)?;
    let f32s = |name: &str| -> Result<Vec<f32>> {
        let v: Vec<f32> = gguf.read_bytes(name)?.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        match v.iter().position(|x| !x.is_finite()) {
            Some(i) => Err(format!("{shown}: {name}[{i}] is not a finite number").into()),
            None => Ok(v),
        }
    };
    let tokens = |name: &str, vocab: usize| crate::t3::read_tokens(gguf, name, vocab);
    let (frames, s3_tokens) = (table.dim(PROMPT_FRAMES).unwrap_or(0), table.dim(PROMPT_TOKENS).unwrap_or(0));
    if s3_tokens > frames / 2 {
        return Err(format!("{shown}: {s3_tokens} S3Gen prompt tokens for {frames} mel frames (at most one token per two frames)").into());
    }
    let t3c = T3Conditioning {
        speaker_emb: f32s(tensors::VOICE_SPEAKER_EMB)?,
        prompt_speech_tokens: if prompt_tokens > 0 { tokens(tensors::VOICE_PROMPT_SPEECH_TOKENS, t3.speech_vocab)? } else { Vec::new() },
    };
    let s3c = S3GenConditioning {
        prompt_token: tokens(tensors::VOICE_PROMPT_TOKEN, s3.speech_vocab)?,
        prompt_feat: f32s(tensors::VOICE_PROMPT_FEAT)?,
        embedding: f32s(tensors::VOICE_EMBEDDING)?,
    };
    Ok(Voice { t3: t3c, s3gen: s3c })
}
