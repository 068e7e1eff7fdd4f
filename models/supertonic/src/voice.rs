//! Voice styles: the embedded ones (GGUF tensors `voice.<name>.style_ttl` /
//! `.style_dp`) or an official voice-style JSON file.

use engine_core::model_kit::Result;
use serde::Deserialize;
use std::path::Path;

/// One voice, values in row-major order of the official shapes.
#[derive(Debug, Clone, PartialEq)]
pub struct Voice {
    /// `[style_tokens, style_dim]`.
    pub style_ttl: Vec<f32>,
    /// `[dp_style_tokens, dp_style_dim]`.
    pub style_dp: Vec<f32>,
}

#[derive(Deserialize)]
struct StyleJson {
    style_ttl: ArrayJson,
    style_dp: ArrayJson,
}

#[derive(Deserialize)]
struct ArrayJson {
    dims: Vec<usize>,
    data: serde_json::Value,
}

fn flatten(v: &serde_json::Value, out: &mut Vec<f32>) -> Result<()> {
    match v {
        serde_json::Value::Array(items) => items.iter().try_for_each(|i| flatten(i, out)),
        serde_json::Value::Number(n) => {
            out.push(n.as_f64().ok_or("a value is not a number")? as f32);
            Ok(())
        }
        other => Err(format!("unexpected value {other} in style data").into()),
    }
}

impl ArrayJson {
    /// The values, checked against `dims` and the model's `[1, tokens, dim]`.
    fn values(&self, what: &str, tokens: usize, dim: usize) -> Result<Vec<f32>> {
        if self.dims != [1, tokens, dim] {
            return Err(format!("{what} has dims {:?}, this model needs [1, {tokens}, {dim}]", self.dims).into());
        }
        let mut out = Vec::with_capacity(tokens * dim);
        flatten(&self.data, &mut out)?;
        if out.len() != tokens * dim {
            return Err(format!("{what} holds {} values, dims say {}", out.len(), tokens * dim).into());
        }
        // A value beyond f32 (1e39) reads as infinity, and a finite but huge
        // one (1e30) drives the graphs to NaN or to a zero duration; either
        // came out as a silent or empty WAV.
        if let Some((i, v)) = out.iter().enumerate().find(|(_, v)| !(-MAX_STYLE_VALUE..=MAX_STYLE_VALUE).contains(*v)) {
            let shown = if v.is_finite() { format!("{v:e}") } else { "beyond f32's range".to_string() };
            return Err(format!("{what} value {i} is {shown} (allowed: magnitudes up to {MAX_STYLE_VALUE:e})").into());
        }
        Ok(out)
    }
}

/// The largest magnitude a voice-style value may have: far beyond what a
/// trained style holds, and small enough that no stage overflows on it.
pub const MAX_STYLE_VALUE: f32 = 1e4;

/// Shapes the model expects of a voice.
pub struct VoiceShape {
    pub ttl: (usize, usize),
    pub dp: (usize, usize),
}

impl Voice {
    pub fn from_json_file(path: &Path, shape: &VoiceShape) -> Result<Voice> {
        let bytes = engine_core::model_kit::files::read_regular(path, "voice file", engine_core::model_kit::files::caps::VOICE_JSON)?;
        Self::from_json_bytes(&bytes, &path.display().to_string(), shape)
    }

    /// Parses and checks a voice-style JSON file's bytes (`shown` names the
    /// file in errors); no file system access, so the fuzz target drives it.
    pub fn from_json_bytes(bytes: &[u8], shown: &str, shape: &VoiceShape) -> Result<Voice> {
        if bytes.starts_with(b"GGUF") {
            return Err(format!("voice file {shown}: a GGUF voice of another model family (Chatterbox); Supertonic takes a voice style JSON").into());
        }
        let text = std::str::from_utf8(bytes).map_err(|_| format!("voice file {shown}: not a voice style JSON (not UTF-8 text)"))?;
        let parsed: StyleJson = serde_json::from_str(text).map_err(|e| format!("voice file {shown}: not a voice style JSON ({e})"))?;
        let style_ttl = parsed.style_ttl.values("style_ttl", shape.ttl.0, shape.ttl.1).map_err(|e| format!("voice file {shown}: {e}"))?;
        let style_dp = parsed.style_dp.values("style_dp", shape.dp.0, shape.dp.1).map_err(|e| format!("voice file {shown}: {e}"))?;
        Ok(Voice { style_ttl, style_dp })
    }
}
