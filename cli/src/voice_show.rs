//! `tts voice show FILE`: what a voice file holds, read from the file alone
//! (no profile, no model). A Chatterbox voice (GGUF, `chatterbox-voice`;
//! docs/gguf.md): its variant, every tensor's name, shape and type, the token
//! ids in full and a statistics line for the float tensors. A Supertonic
//! voice style (JSON): each array's dims and statistics.
//!
//! The file is untrusted: read by kind and no further than the voice-file
//! caps, parsed by the same GGUF checks the engine applies (a truncated or
//! corrupt file is one line naming what is wrong), never indexed past what
//! was read.

use engine_core::model_kit::files;
use serde::Serialize;
use std::path::Path;

/// The GGUF architecture of a Chatterbox voice file.
const CHATTERBOX_VOICE: &str = "chatterbox-voice";

#[derive(Serialize)]
pub struct VoiceSummary {
    pub file: String,
    /// `chatterbox-voice` or `supertonic-voice-style`.
    pub format: String,
    /// The model variant that saved it (Chatterbox: turbo, nano, mtl).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format_version: Option<u32>,
    pub tensors: Vec<TensorSummary>,
}

#[derive(Serialize)]
pub struct TensorSummary {
    pub name: String,
    /// What the tensor is, where the format names it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// `f32`, `i32`, ... (ggml's type names).
    pub dtype: String,
    /// GGUF tensors: ggml order (fastest-varying first, as docs/gguf.md
    /// writes them); JSON arrays: the file's `dims`.
    pub shape: Vec<u64>,
    /// Float tensors: over the finite values.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats: Option<Stats>,
    /// Integer tensors (token ids): every value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub values: Option<Vec<i64>>,
}

#[derive(Serialize)]
pub struct Stats {
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    pub rms: f64,
    /// NaN and infinite values, left out of the figures above.
    pub non_finite: usize,
}

fn stats(values: &[f32]) -> Option<Stats> {
    let finite: Vec<f64> = values.iter().filter(|v| v.is_finite()).map(|&v| v as f64).collect();
    if finite.is_empty() {
        return None;
    }
    let n = finite.len() as f64;
    Some(Stats {
        min: finite.iter().copied().fold(f64::INFINITY, f64::min),
        max: finite.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        mean: finite.iter().sum::<f64>() / n,
        rms: (finite.iter().map(|v| v * v).sum::<f64>() / n).sqrt(),
        non_finite: values.len() - finite.len(),
    })
}

/// Reads `path` as a voice file of either family.
pub fn read(path: &Path) -> Result<VoiceSummary, String> {
    let shown = path.display().to_string();
    // The larger of the two caps: which family the file is for is not known yet.
    let bytes = files::read_regular(path, "voice file", files::caps::VOICE_FILE.max(files::caps::VOICE_JSON))?;
    if bytes.starts_with(b"GGUF") {
        return chatterbox(&bytes, &shown);
    }
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') {
        return supertonic(&bytes, &shown);
    }
    Err(format!("voice file {shown}: not a voice file (neither a Chatterbox voice, GGUF, nor a Supertonic voice style, JSON)"))
}

fn role(name: &str) -> Option<&'static str> {
    Some(match name {
        "voice.speaker_emb" => "T3 speaker embedding (voice encoder)",
        "voice.prompt_speech_tokens" => "T3 prompt speech tokens",
        "voice.prompt_token" => "S3Gen prompt tokens",
        "voice.prompt_feat" => "S3Gen prompt mel",
        "voice.embedding" => "S3Gen speaker embedding (CAMPPlus x-vector)",
        _ => return None,
    })
}

fn chatterbox(bytes: &[u8], shown: &str) -> Result<VoiceSummary, String> {
    let gguf = ggml_sys::gguf::GgufTensors::from_bytes(bytes, shown).map_err(|e| format!("voice file {e}"))?;
    let arch = gguf.file.get_str("general.architecture").map_err(|_| format!("voice file {shown}: not a voice file (no general.architecture)"))?;
    if arch != CHATTERBOX_VOICE {
        return Err(format!("voice file {shown}: a GGUF file of architecture '{arch}', not a voice (a Chatterbox voice has '{CHATTERBOX_VOICE}')"));
    }
    let variant = gguf.file.get_str("chatterbox-voice.variant").map_err(|e| e.to_string())?;
    let version = gguf.file.get_u32("chatterbox-voice.format_version").map_err(|e| e.to_string())?;
    let mut tensors = Vec::new();
    for t in gguf.ctx.tensors() {
        let name = t.name();
        let ne = t.ne();
        // ggml pads shapes to four dimensions with ones; show the used ones.
        let dims = ne.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1);
        let shape: Vec<u64> = ne[..dims].iter().map(|&d| d.max(0) as u64).collect();
        let ty = t.ty();
        let data = || gguf.read_bytes(&name).map_err(|e| e.to_string());
        let (stats, values) = match ty {
            ggml_sys::TYPE_F32 => (self::stats(&data()?.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<_>>()), None),
            ggml_sys::TYPE_I32 => (None, Some(data()?.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64).collect())),
            // Not a type `tts voice save` writes: its shape and type say enough.
            _ => (None, None),
        };
        tensors.push(TensorSummary { role: role(&name), name, dtype: ggml_sys::type_name(ty).to_string(), shape, stats, values });
    }
    Ok(VoiceSummary { file: shown.to_string(), format: CHATTERBOX_VOICE.into(), variant: Some(variant), format_version: Some(version), tensors })
}

/// A Supertonic voice style: `{"style_ttl": {"dims": [...], "data": [...]}, "style_dp": ...}`.
fn supertonic(bytes: &[u8], shown: &str) -> Result<VoiceSummary, String> {
    let bad = |why: String| format!("voice file {shown}: not a voice style JSON ({why})");
    let text = std::str::from_utf8(bytes).map_err(|_| bad("not UTF-8 text".into()))?;
    // serde_json bounds the nesting depth, so the walk below is bounded too.
    let parsed: serde_json::Map<String, serde_json::Value> = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    let mut tensors = Vec::new();
    for (name, value) in &parsed {
        let Some(array) = value.as_object() else { continue };
        let (Some(dims), Some(data)) = (array.get("dims"), array.get("data")) else { continue };
        let shape: Vec<u64> =
            dims.as_array().and_then(|d| d.iter().map(|v| v.as_u64()).collect()).ok_or_else(|| bad(format!("{name}.dims is not a list of sizes")))?;
        let mut values = Vec::new();
        flatten(data, &mut values).map_err(|why| bad(format!("{name}.data: {why}")))?;
        let expected = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
        if expected != Some(values.len() as u64) {
            return Err(format!(
                "voice file {shown}: {name} holds {} values, its dims {shape:?} say {}",
                values.len(),
                expected.map_or("more".into(), |n| n.to_string())
            ));
        }
        tensors.push(TensorSummary { name: name.clone(), role: None, dtype: "f32".into(), shape, stats: stats(&values), values: None });
    }
    if !["style_ttl", "style_dp"].iter().all(|k| tensors.iter().any(|t| t.name == *k)) {
        return Err(bad("a voice style has the arrays style_ttl and style_dp, each with dims and data".into()));
    }
    Ok(VoiceSummary { file: shown.to_string(), format: "supertonic-voice-style".into(), variant: None, format_version: None, tensors })
}

fn flatten(v: &serde_json::Value, out: &mut Vec<f32>) -> Result<(), String> {
    match v {
        serde_json::Value::Array(items) => items.iter().try_for_each(|i| flatten(i, out)),
        serde_json::Value::Number(n) => {
            out.push(n.as_f64().ok_or("a value is not a number")? as f32);
            Ok(())
        }
        other => Err(format!("unexpected value {other}")),
    }
}

/// The summary as lines; names and strings from the file are escaped as log
/// lines are (a hostile file must not drive the terminal).
pub fn render(s: &VoiceSummary) -> String {
    use engine_core::logging::escape;
    let mut out = format!("{}: {}", escape(&s.file), s.format);
    if let Some(v) = &s.variant {
        out += &format!(", variant {}", escape(v));
    }
    if let Some(v) = s.format_version {
        out += &format!(", format version {v}");
    }
    out += "\n";
    for t in &s.tensors {
        let shape: Vec<String> = t.shape.iter().map(u64::to_string).collect();
        out += &format!("  {} {} [{}]", escape(&t.name), t.dtype, shape.join(", "));
        if let Some(role) = t.role {
            out += &format!(": {role}");
        }
        out += "\n";
        match &t.stats {
            Some(st) => {
                out += &format!("    min {:.6} max {:.6} mean {:.6} rms {:.6}", st.min, st.max, st.mean, st.rms);
                if st.non_finite > 0 {
                    out += &format!(" ({} not finite)", st.non_finite);
                }
                out += "\n";
            }
            None if t.dtype == "f32" && t.shape.iter().product::<u64>() > 0 => out += "    no finite values\n",
            None => {}
        }
        if let Some(values) = &t.values {
            let ids: Vec<String> = values.iter().map(i64::to_string).collect();
            out += &format!("    ids ({}): {}\n", ids.len(), ids.join(" "));
        }
    }
    out
}
