//! Hyper-parameters of a converted Chatterbox model, read from GGUF metadata
//! (written by `tools/chatterbox/convert.py`; see docs/gguf.md). Nothing has a
//! default: a key the converter did not write is an error naming the key.

use ggml_sys::gguf::{GgufFile, Metadata};

/// `general.architecture` of the T3 file.
pub const T3_ARCH: &str = "chatterbox";
/// `general.architecture` of the S3Gen (+ HiFT) file.
pub const S3GEN_ARCH: &str = "chatterbox-s3gen";

/// The transformer under T3. Turbo and Nano are GPT-2; Multilingual (Llama)
/// gets its own variant and graph builder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backbone {
    Gpt2,
}

#[derive(Debug, Clone, PartialEq)]
pub struct T3Hparams {
    /// `turbo` or `nano`.
    pub variant: String,
    pub backbone: Backbone,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    /// Positions of the learned position table (`wpe` rows): the context limit.
    pub n_ctx: usize,
    pub n_ff: usize,
    pub text_vocab: usize,
    pub speech_vocab: usize,
    /// Width of the speaker embedding that `cond.spkr` projects.
    pub speaker_dim: usize,
    pub layer_norm_eps: f32,
    pub start_speech_token: u32,
    pub stop_speech_token: u32,
    /// Appended three times before S3Gen so the last word is not cut off.
    pub silence_token: u32,
    /// Speech-token prompt length of the built-in voice.
    pub cond_prompt_len: usize,
}

impl T3Hparams {
    pub fn load(file: &GgufFile) -> Result<Self, String> {
        let m = Metadata::new(file, T3_ARCH);
        let backbone = match m.str("backbone")?.as_str() {
            "gpt2" => Backbone::Gpt2,
            other => {
                return Err(format!(
                    "{}: T3 backbone '{other}' is not supported by this plugin version",
                    file.path().display()
                ))
            }
        };
        let hp = T3Hparams {
            variant: m.str("variant")?,
            backbone,
            n_layer: m.usize("n_layer")?,
            n_embd: m.usize("n_embd")?,
            n_head: m.usize("n_head")?,
            n_ctx: m.usize("n_ctx")?,
            n_ff: m.usize("n_ff")?,
            text_vocab: m.usize("text_vocab")?,
            speech_vocab: m.usize("speech_vocab")?,
            speaker_dim: m.usize("speaker_dim")?,
            layer_norm_eps: m.f32("layer_norm_eps")?,
            start_speech_token: m.u32("start_speech_token")?,
            stop_speech_token: m.u32("stop_speech_token")?,
            silence_token: m.u32("silence_token")?,
            cond_prompt_len: m.usize("cond_prompt_len")?,
        };
        if hp.n_head == 0 || !hp.n_embd.is_multiple_of(hp.n_head) {
            return Err(format!(
                "{}: n_embd {} does not split into {} heads",
                file.path().display(),
                hp.n_embd,
                hp.n_head
            ));
        }
        for (name, token) in [
            ("start", hp.start_speech_token),
            ("stop", hp.stop_speech_token),
            ("silence", hp.silence_token),
        ] {
            if token as usize >= hp.speech_vocab {
                return Err(format!(
                    "{}: {name} speech token {token} is outside the speech vocabulary ({})",
                    file.path().display(),
                    hp.speech_vocab
                ));
            }
        }
        Ok(hp)
    }

    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head
    }
}
