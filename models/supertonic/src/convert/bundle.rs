//! The bundle's JSON files: `tts.json` (configuration), `unicode_indexer.json`
//! (code point → embedding row) and `voice_styles/*.json` (the voices), read
//! as tools/supertonic/convert.py reads them.

use engine_core::model_kit::files::{caps, read_regular};
use engine_core::model_kit::{Error, Result};
use ndarray::{Array2, ArrayD, Axis, IxDyn};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The most a `tts.json` or `unicode_indexer.json` may be (the official ones
/// are ~5 KB and ~400 KB).
const MAX_JSON: u64 = 16 << 20;

/// The first of `candidates` (relative to `bundle`) that is a file.
pub fn find_file(bundle: &Path, candidates: &[&str]) -> Result<PathBuf> {
    candidates
        .iter()
        .map(|c| bundle.join(c))
        .find(|p| p.is_file())
        .ok_or_else(|| Error::msg(format!("{}: none of {} exists", bundle.display(), candidates.join(", "))))
}

pub fn read_json(path: &Path, cap: u64) -> Result<Value> {
    let bytes = read_regular(path, "", cap)?;
    serde_json::from_slice(&bytes).map_err(|e| Error::msg(format!("{}: not valid JSON ({e})", path.display())))
}

/// `tts.json`'s fields the GGUF records.
#[derive(Clone, Debug)]
pub struct TtsConfig {
    pub path: PathBuf,
    /// `str(tts.get("tts_version", ""))`.
    pub tts_version: String,
    pub sample_rate: u32,
    pub chunk_compress_factor: u32,
    pub latent_dim: u32,
    pub normalizer_scale: f64,
}

impl TtsConfig {
    pub fn read(bundle: &Path) -> Result<Self> {
        let path = find_file(bundle, &["onnx/tts.json", "tts.json"])?;
        let v = read_json(&path, MAX_JSON)?;
        let at = |keys: &[&str]| -> Result<&Value> {
            let mut cur = &v;
            for k in keys {
                cur = cur.get(k).ok_or_else(|| Error::msg(format!("{}: missing key {}", path.display(), keys.join("."))))?;
            }
            Ok(cur)
        };
        let uint = |keys: &[&str]| -> Result<u32> {
            let value = at(keys)?;
            // `int(x)`: a whole number, or a float truncated.
            let n = value.as_i64().or_else(|| value.as_f64().filter(|f| f.is_finite()).map(|f| f.trunc() as i64));
            n.and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| Error::msg(format!("{}: {} must be a whole number in 0..=4294967295, got {value}", path.display(), keys.join("."))))
        };
        let tts_version = match v.get("tts_version") {
            None => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
        };
        let scale = at(&["ttl", "normalizer", "scale"])?;
        let normalizer_scale = scale.as_f64().ok_or_else(|| Error::msg(format!("{}: ttl.normalizer.scale must be a number, got {scale}", path.display())))?;
        Ok(TtsConfig {
            tts_version,
            sample_rate: uint(&["ae", "sample_rate"])?,
            chunk_compress_factor: uint(&["ttl", "chunk_compress_factor"])?,
            latent_dim: uint(&["ttl", "latent_dim"])?,
            normalizer_scale,
            path,
        })
    }
}

/// The 65536 entries of `unicode_indexer.json`.
pub fn read_indexer(bundle: &Path) -> Result<Vec<i32>> {
    let path = find_file(bundle, &["onnx/unicode_indexer.json", "unicode_indexer.json"])?;
    let v = read_json(&path, MAX_JSON)?;
    let entries = v.as_array().ok_or_else(|| Error::msg(format!("{}: expected a list of integers", path.display())))?;
    if entries.len() != 65536 {
        return Err(Error::msg(format!("{}: unicode_indexer.json has {} entries, expected 65536", path.display(), entries.len())));
    }
    entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            e.as_i64().and_then(|n| i32::try_from(n).ok()).ok_or_else(|| Error::msg(format!("{}: entry {i} is {e}, not a 32-bit integer", path.display())))
        })
        .collect()
}

/// One voice: its style for the text encoder ([tokens, dim]) and for the
/// duration predictor ([tokens, dim]).
#[derive(Clone, Debug)]
pub struct Voice {
    pub name: String,
    pub path: PathBuf,
    pub style_ttl: Array2<f32>,
    pub style_dp: Array2<f32>,
}

/// Every `voice_styles/*.json`, by file name.
pub fn read_voices(bundle: &Path) -> Result<Vec<Voice>> {
    let dir = bundle.join("voice_styles");
    let mut paths = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for entry in entries {
            let entry = entry.map_err(|e| Error::msg(format!("{}: {e}", dir.display())))?;
            let name = entry.file_name();
            if name.to_str().is_some_and(|n| n.ends_with(".json") && n.len() > ".json".len()) {
                paths.push(entry.path());
            }
        }
    }
    paths.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    if paths.is_empty() {
        return Err(Error::msg(format!("{} holds no voice JSON", dir.display())));
    }
    paths.iter().map(|p| read_voice(p)).collect()
}

fn read_voice(path: &Path) -> Result<Voice> {
    let v = read_json(path, caps::VOICE_JSON)?;
    let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let style = |key: &str| -> Result<Array2<f32>> {
        let fail = |what: &str| Error::msg(format!("{}: {key} {what}", path.display()));
        let dims: Vec<usize> = v
            .get(key)
            .and_then(|s| s.get("dims"))
            .and_then(Value::as_array)
            .ok_or_else(|| fail("has no dims"))?
            .iter()
            .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
            .collect::<Option<_>>()
            .ok_or_else(|| fail("dims are not whole numbers"))?;
        let data = v.get(key).and_then(|s| s.get("data")).ok_or_else(|| fail("has no data"))?;
        let mut values = Vec::new();
        flatten(data, &mut values).map_err(|e| fail(&e))?;
        let expected = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if expected != Some(values.len()) {
            return Err(fail(&format!("has {} values, dims {dims:?} need {}", values.len(), expected.map_or("more".to_string(), |n| n.to_string()))));
        }
        // `style[0]`: the batch of one.
        let all = ArrayD::from_shape_vec(IxDyn(&dims), values).map_err(|e| fail(&e.to_string()))?;
        if all.ndim() != 3 || all.shape()[0] == 0 {
            return Err(fail(&format!("has dims {dims:?}; expected [1, tokens, dim]")));
        }
        all.index_axis_move(Axis(0), 0).into_dimensionality().map_err(|e| fail(&e.to_string()))
    };
    Ok(Voice { style_ttl: style("style_ttl")?, style_dp: style("style_dp")?, name, path: path.to_path_buf() })
}

/// The numbers of a nested list, row-major (`np.asarray(data, float32)`).
fn flatten(v: &Value, out: &mut Vec<f32>) -> std::result::Result<(), String> {
    match v {
        Value::Number(n) => {
            out.push(n.as_f64().ok_or("holds a number out of range")? as f32);
            Ok(())
        }
        Value::Array(items) => items.iter().try_for_each(|i| flatten(i, out)),
        _ => Err(format!("holds {v}, not a number")),
    }
}
