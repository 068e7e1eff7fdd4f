//! Text to speech tokens, per variant: the tokenizer a T3 file embeds, T3's
//! generation loop with its sampling chain, and the filter that keeps what
//! S3Gen can read of T3's output.

use crate::hparams::T3Hparams;
use crate::model::SynthesisParams;
use crate::sampler::UniformSource;
use crate::t3::guided::{self, GuidedChoice, GuidedT3};
use crate::t3::{self, T3Conditioning, TokenChoice, T3};
use crate::text::multilingual::{self, MultilingualTokenizer};
use crate::text::{self, TextTokenizer};
use engine_core::model_kit::{Result, Timings};

/// The speech-token generator a T3 file holds, with its text front end.
pub enum SpeechGenerator {
    /// Turbo and Nano: GPT-2 backbone, English BPE.
    Gpt2 { t3: T3, tokenizer: TextTokenizer },
    /// Multilingual: guided Llama backbone, grapheme tokenizer with language tags.
    Llama { t3: GuidedT3, tokenizer: MultilingualTokenizer },
}

impl crate::cloning::voice_encoder::VoiceEncoding for SpeechGenerator {
    fn hp(&self) -> &T3Hparams {
        SpeechGenerator::hp(self)
    }

    fn voice_encoder_partials(&mut self, batch: &[f32], partials: usize) -> Result<Vec<f32>> {
        match self {
            SpeechGenerator::Gpt2 { t3, .. } => t3.voice_encoder_partials(batch, partials),
            SpeechGenerator::Llama { t3, .. } => t3.voice_encoder_partials(batch, partials),
        }
    }
}

impl SpeechGenerator {
    pub fn hp(&self) -> &T3Hparams {
        match self {
            SpeechGenerator::Gpt2 { t3, .. } => &t3.hp,
            SpeechGenerator::Llama { t3, .. } => &t3.hp,
        }
    }

    pub fn attention(&self) -> t3::AttentionConfig {
        match self {
            SpeechGenerator::Gpt2 { t3, .. } => t3.attention(),
            SpeechGenerator::Llama { t3, .. } => t3.attention(),
        }
    }

    /// The graphs built so far, by stage (census tests).
    /// T3's weight and K/V cache bytes on the device.
    pub fn resident_bytes(&self) -> (usize, usize) {
        match self {
            SpeechGenerator::Gpt2 { t3, .. } => t3.resident_bytes(),
            SpeechGenerator::Llama { t3, .. } => t3.resident_bytes(),
        }
    }

    pub fn graphs(&self) -> Vec<(&'static str, &ggml_sys::ComputeGraph)> {
        match self {
            SpeechGenerator::Gpt2 { t3, .. } => t3.graphs(),
            SpeechGenerator::Llama { t3, .. } => t3.graphs(),
        }
    }

    pub(crate) fn builtin_voice(&self) -> Result<T3Conditioning> {
        match self {
            SpeechGenerator::Gpt2 { t3, .. } => t3.builtin_voice(),
            SpeechGenerator::Llama { t3, .. } => t3.builtin_voice(),
        }
    }

    /// Text ids of one chunk, and a check that they fit with the wanted tokens.
    pub(crate) fn encode(&self, chunk: &str, params: &SynthesisParams, voice: &T3Conditioning) -> Result<Vec<i32>> {
        match self {
            SpeechGenerator::Gpt2 { t3, tokenizer } => {
                let ids = tokenizer.encode(&text::normalize_punctuation(chunk))?;
                t3.new_token_budget(2 + voice.prompt_speech_tokens.len() + ids.len(), params.max_new_tokens)?;
                Ok(ids)
            }
            SpeechGenerator::Llama { t3, tokenizer } => {
                let ids = tokenizer.encode_for_t3(&multilingual::normalize_punctuation(chunk), &params.language)?;
                t3.new_token_budget(ids.len(), params.max_new_tokens)?;
                Ok(ids)
            }
        }
    }

    /// T3's speech tokens for one chunk's ids (the stop token dropped).
    pub(crate) fn generate(
        &mut self,
        ids: &[i32],
        voice: &T3Conditioning,
        params: &SynthesisParams,
        uniforms: UniformSource,
        timings: &mut Timings,
        on_token: &mut t3::OnToken<'_>,
    ) -> Result<Vec<u32>> {
        let greedy = params.temperature == 0.0;
        let (tokens, prefill_ms, steps_ms) = match self {
            SpeechGenerator::Gpt2 { t3, .. } => {
                let mut choice = if greedy { TokenChoice::Greedy } else { TokenChoice::Sample(params.turbo_sampling(), uniforms) };
                let (tokens, stats) = t3::generate_streaming(t3, voice, ids, &mut choice, params.token_limits(), on_token)?;
                (tokens, stats.prefill_ms, stats.steps_ms)
            }
            SpeechGenerator::Llama { t3, .. } => {
                let mut choice = if greedy { GuidedChoice::Greedy } else { GuidedChoice::Sample(uniforms) };
                let sampling = params.guided_sampling()?;
                t3.mode = params.guidance;
                let (tokens, stats) = guided::generate_streaming(t3, voice, params.exaggeration, ids, &sampling, &mut choice, params.token_limits(), on_token)?;
                (tokens, stats.prefill_ms, stats.steps_ms)
            }
        };
        timings.add("t3.prefill", prefill_ms);
        timings.add("t3.decode", steps_ms);
        Ok(tokens)
    }

    /// What S3Gen reads of T3's tokens. Turbo/Nano, as `ChatterboxTurboTTS`:
    /// speech codes only, then three silence tokens so the end is not cut.
    /// Multilingual: the reference's `drop_invalid_tokens` (what lies after a
    /// start token and before a stop token), then codes outside S3Gen's
    /// vocabulary dropped, which the reference omits and which its flow
    /// embedding cannot take.
    pub fn speech_codes(&self, tokens: &[u32], vocab: u32) -> Vec<i32> {
        self.code_reader(vocab).read(tokens, true)
    }

    /// [`Self::speech_codes`] as a value that needs no borrow of the
    /// generator (streaming reads codes while T3 is still generating).
    pub(crate) fn code_reader(&self, vocab: u32) -> CodeReader {
        let hp = self.hp();
        let silence = match self {
            SpeechGenerator::Gpt2 { .. } => Some(hp.silence_token as i32),
            SpeechGenerator::Llama { .. } => None,
        };
        CodeReader { silence, start: hp.start_speech_token, stop: hp.stop_speech_token, vocab }
    }
}

/// Turbo's and Nano's silence codes after the generated ones (the reference's `S3GEN_SIL` × 3).
pub const SILENCE_CODES: usize = 3;

/// What S3Gen reads of T3's tokens (see [`SpeechGenerator::speech_codes`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CodeReader {
    /// Turbo/Nano: the silence token appended [`SILENCE_CODES`] times at the end.
    silence: Option<i32>,
    start: u32,
    stop: u32,
    vocab: u32,
}

impl CodeReader {
    /// The codes of `tokens`; the end's silence only once they are `complete`.
    pub(crate) fn read(&self, tokens: &[u32], complete: bool) -> Vec<i32> {
        match self.silence {
            Some(silence) => {
                let mut speech = codes_below(tokens, self.vocab);
                if complete {
                    speech.extend([silence; SILENCE_CODES]);
                }
                speech
            }
            None => codes_between(tokens, self.start, self.stop, self.vocab),
        }
    }
}

/// The tokens below `vocab`, as S3Gen's ids.
fn codes_below(tokens: &[u32], vocab: u32) -> Vec<i32> {
    tokens.iter().filter(|&&t| t < vocab).map(|&t| t as i32).collect()
}

/// `drop_invalid_tokens`: what lies after the first `start` (or from the
/// beginning) and before the first `stop` (or to the end), then [`codes_below`].
fn codes_between(tokens: &[u32], start: u32, stop: u32, vocab: u32) -> Vec<i32> {
    let from = tokens.iter().position(|&t| t == start).map_or(0, |i| i + 1);
    let to = tokens[from..].iter().position(|&t| t == stop).map_or(tokens.len(), |i| from + i);
    codes_below(&tokens[from..to], vocab)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multilingual_codes_are_sliced_between_start_and_stop_then_filtered() {
        let (start, stop, vocab) = (6561, 6562, 6561);
        assert_eq!(codes_between(&[5, 7000, 9], start, stop, vocab), [5, 9]);
        assert_eq!(codes_between(&[5, start, 8, 9], start, stop, vocab), [8, 9]);
        assert_eq!(codes_between(&[5, 6, stop, 9], start, stop, vocab), [5, 6]);
        assert_eq!(codes_between(&[1, start, 2, 8193, stop, 3], start, stop, vocab), [2]);
        assert!(codes_between(&[start], start, stop, vocab).is_empty());
    }
}
