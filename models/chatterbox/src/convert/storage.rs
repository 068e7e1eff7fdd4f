//! Which ggml type each tensor is stored in: the rules of
//! `tools/chatterbox/convert.py`'s `write()`, in the same order.
//!
//! - Integer tensors (the built-in voice's tokens) are I32.
//! - The CFM estimator's matrices and convolution kernels (`cfm.*.weight`,
//!   2-D or 3-D, not matched by [`keep_f32`]) all take the decoder storage
//!   (`decoder_weights`): its products are compute-bound, so block formats
//!   would only slow them down.
//! - Otherwise a "big" matrix (2-D, at least 1024 values, rows a multiple of
//!   32 so Q8_0/Q4_0 blocks tile them) not matched by [`keep_f32`] takes
//!   `weights`; with `q4_0` the speech head keeps 8 bits, as llama.cpp keeps
//!   its output layer.
//! - Everything else stays F32.

use engine_core::model_kit::convert::GgmlType;
use engine_core::model_kit::{Error, Result};
use regex::Regex;
use std::sync::LazyLock;

/// Never quantised: what is read by row (embeddings, position tables), small,
/// or numerically fragile (norms, the voice encoder, CAMPPlus, the speech
/// tokenizer, the built-in voice). The same pattern as convert.py's `KEEP_F32`,
/// searched anywhere in the name.
static KEEP_F32: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(emb|wpe|_pos$|bias|\.ln|norm|\.bn|builtin|alpha|beta|gamma|^ve\.|campplus|s3tok|mel_fb|pos_bias|query)").expect("KEEP_F32 is a valid pattern")
});

pub fn keep_f32(name: &str) -> bool {
    KEEP_F32.is_match(name)
}

/// `weights`: the storage of the large matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weights {
    F32,
    F16,
    Q8_0,
    Q4_0,
}

impl Weights {
    pub const NAMES: &'static str = "f32, f16, q8_0, q4_0";

    pub fn parse(s: &str) -> Result<Weights> {
        Ok(match s {
            "f32" => Weights::F32,
            "f16" => Weights::F16,
            "q8_0" => Weights::Q8_0,
            "q4_0" => Weights::Q4_0,
            other => return Err(Error::msg(format!("weights must be one of {}, got '{other}'", Self::NAMES))),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Weights::F32 => "f32",
            Weights::F16 => "f16",
            Weights::Q8_0 => "q8_0",
            Weights::Q4_0 => "q4_0",
        }
    }

    /// The quantised type, `None` for F32 (kept as is).
    fn quant(self) -> Option<GgmlType> {
        match self {
            Weights::F32 => None,
            Weights::F16 => Some(GgmlType::F16),
            Weights::Q8_0 => Some(GgmlType::Q8_0),
            Weights::Q4_0 => Some(GgmlType::Q4_0),
        }
    }
}

/// `decoder_weights`: the CFM estimator's storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecoderWeights {
    Auto,
    F32,
    F16,
    BF16,
}

impl DecoderWeights {
    pub const NAMES: &'static str = "auto, f32, f16, bf16";

    pub fn parse(s: &str) -> Result<DecoderWeights> {
        Ok(match s {
            "auto" => DecoderWeights::Auto,
            "f32" => DecoderWeights::F32,
            "f16" => DecoderWeights::F16,
            "bf16" => DecoderWeights::BF16,
            other => return Err(Error::msg(format!("decoder_weights must be one of {}, got '{other}'", Self::NAMES))),
        })
    }

    /// `auto` resolved: F16 with `weights` F16, else F32 (never `Auto`).
    pub fn resolve(self, weights: Weights) -> DecoderWeights {
        match self {
            DecoderWeights::Auto if weights == Weights::F16 => DecoderWeights::F16,
            DecoderWeights::Auto => DecoderWeights::F32,
            other => other,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DecoderWeights::Auto => "auto",
            DecoderWeights::F32 => "f32",
            DecoderWeights::F16 => "f16",
            DecoderWeights::BF16 => "bf16",
        }
    }

    fn float(self) -> Option<GgmlType> {
        match self {
            DecoderWeights::F16 => Some(GgmlType::F16),
            DecoderWeights::BF16 => Some(GgmlType::BF16),
            DecoderWeights::Auto | DecoderWeights::F32 => None,
        }
    }
}

/// The storage of tensor `name` of `shape` (numpy order); `integer` for
/// integer tensors. `decoder` must be resolved. The second value says
/// whether the tensor is narrowed (counted in the converter's summary).
pub fn storage_for(name: &str, shape: &[usize], integer: bool, weights: Weights, decoder: DecoderWeights) -> (GgmlType, bool) {
    if integer {
        return (GgmlType::I32, false);
    }
    if name.starts_with("cfm.") && name.ends_with(".weight") && matches!(shape.len(), 2 | 3) && !keep_f32(name) {
        return match decoder.float() {
            Some(t) => (t, true),
            None => (GgmlType::F32, false),
        };
    }
    let mut quant = weights.quant();
    if weights == Weights::Q4_0 && name.starts_with("t3.speech_head") {
        quant = Some(GgmlType::Q8_0);
    }
    let size: usize = shape.iter().product();
    let big = shape.len() == 2 && size >= 1024 && shape[1].is_multiple_of(32);
    match quant {
        Some(t) if big && !keep_f32(name) => (t, true),
        _ => (GgmlType::F32, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_of_convert_py() {
        let (w, d) = (Weights::Q4_0, DecoderWeights::BF16);
        assert_eq!(storage_for("voice.builtin.prompt_token", &[5], true, w, d), (GgmlType::I32, false));
        assert_eq!(storage_for("cfm.down_blocks.0.0.block1.block.0.weight", &[8, 4, 3], false, w, d), (GgmlType::BF16, true));
        assert_eq!(storage_for("cfm.down_blocks.0.1.0.norm1.weight", &[8, 4], false, w, d), (GgmlType::F32, false));
        assert_eq!(storage_for("cfm.time_mlp.linear_1.weight", &[64, 32], false, w, DecoderWeights::F32), (GgmlType::F32, false));
        assert_eq!(storage_for("t3.speech_head.weight", &[64, 32], false, w, d), (GgmlType::Q8_0, true));
        assert_eq!(storage_for("t3.blk.0.attn.qkv.weight", &[64, 32], false, w, d), (GgmlType::Q4_0, true));
        // Too small, rows not a multiple of 32, 3-D, or kept by name.
        assert_eq!(storage_for("t3.blk.0.attn.qkv.weight", &[31, 32], false, w, d), (GgmlType::F32, false));
        assert_eq!(storage_for("t3.blk.0.attn.qkv.weight", &[64, 48], false, w, d), (GgmlType::F32, false));
        assert_eq!(storage_for("hift.conv_pre.weight", &[64, 32, 7], false, w, d), (GgmlType::F32, false));
        assert_eq!(storage_for("t3.text_emb", &[64, 32], false, w, d), (GgmlType::F32, false));
        assert_eq!(storage_for("ve.proj.weight", &[64, 32], false, w, d), (GgmlType::F32, false));
        assert_eq!(storage_for("t3.text_pos", &[64, 32], false, w, d), (GgmlType::F32, false));
        assert_eq!(DecoderWeights::Auto.resolve(Weights::F16), DecoderWeights::F16);
        assert_eq!(DecoderWeights::Auto.resolve(Weights::Q8_0), DecoderWeights::F32);
        assert_eq!(Weights::parse("q5").unwrap_err().as_str(), "weights must be one of f32, f16, q8_0, q4_0, got 'q5'");
    }
}
