//! The native Supertonic converter: an official bundle (v1, v2 or v3:
//! `onnx/{duration_predictor,text_encoder,vector_estimator,vocoder}.onnx`,
//! `tts.json`, `unicode_indexer.json`, `voice_styles/*.json`) to one GGUF,
//! byte-identical to what tools/supertonic/convert.py writes from the same
//! bundle with the same options (docs/gguf.md lists the names and keys).
//!
//! One module per ONNX graph ([`duration`], [`text_encoder`],
//! [`vector_estimator`], [`vocoder`]) maps its weights to the engine's names
//! and reads the hyper-parameters only the graph holds; [`source`] names
//! anonymous initializers by graph structure and keeps every output tensor
//! lazy, so the writer reads one tensor at a time from the memory-mapped
//! graphs; [`bundle`] reads the JSON files. This file checks the options,
//! adds the metadata in the Python converter's order, picks each tensor's
//! storage and writes the file atomically.

pub mod bundle;
pub mod duration;
pub mod layers;
pub mod source;
pub mod text_encoder;
pub mod vector_estimator;
pub mod vocoder;

use crate::hparams::ARCH;
use bundle::{read_indexer, read_voices, TtsConfig};
use engine_core::abi::{OptionKind, OptionList, OptionSpec, OptionValue};
use engine_core::model_kit::convert::onnx::OnnxGraph;
use engine_core::model_kit::convert::{GgmlType, GgufWriter, MetaValue, PlannedTensor, Values};
use engine_core::model_kit::{Error, Result};
use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use layers::{layer_norm_eps, AttnHp, ConvNextHp, CrossHp, Out};
use ndarray::{ArrayD, IxDyn};
use source::Lazy;
use std::path::{Path, PathBuf};

/// One file written and what it holds: convert.py prints `{path}: {summary}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvertedFile {
    pub path: PathBuf,
    pub summary: String,
}

/// A file whose presence marks a directory as a Supertonic bundle.
pub const MARKER_FILES: &[&str] = &["onnx/vector_estimator.onnx"];

/// The four graphs, in the order they are converted.
pub const GRAPHS: [&str; 4] = ["duration_predictor", "text_encoder", "vector_estimator", "vocoder"];

/// Weights that stay F32 whatever `weights` says: embeddings read by row,
/// depthwise taps read as per-channel vectors, and everything small
/// (convert.py's `DEFAULT_KEEP_F32`).
pub const DEFAULT_KEEP_F32: &[&str] = &[
    "*.char_emb",
    "*.dw.weight",
    "*.rel_k",
    "*.rel_v",
    "*.keys*",
    "voice.*",
    "text.*",
    "*.ln.*",
    "*.ln1.*",
    "*.ln2.*",
    "*.gamma",
    "*.bias",
    "voc.bn.*",
    "voc.latent_*",
    "ve.rope.*",
    "ve.time.freqs",
    "ve.uncond.*",
    "*.prelu",
    "dp.sentence_token",
];

/// The model version the bundle holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
    V3,
}

impl Version {
    pub fn name(self) -> &'static str {
        match self {
            Version::V1 => "v1",
            Version::V2 => "v2",
            Version::V3 => "v3",
        }
    }

    fn languages(self) -> &'static [&'static str] {
        match self {
            Version::V1 => &["en"],
            Version::V2 => &["en", "ko", "es", "pt", "fr"],
            Version::V3 => &[
                "en", "ko", "ja", "ar", "bg", "cs", "da", "de", "el", "es", "et", "fi", "fr", "hi", "hr", "hu", "id", "it", "lt", "lv", "nl", "pl", "pt", "ro",
                "ru", "sk", "sl", "sv", "tr", "uk", "vi", "na",
            ],
        }
    }

    fn default_language(self) -> &'static str {
        match self {
            Version::V1 | Version::V2 => "en",
            Version::V3 => "na",
        }
    }

    fn short_chunk_languages(self) -> &'static [&'static str] {
        match self {
            Version::V1 => &[],
            Version::V2 => &["ko"],
            Version::V3 => &["ko", "ja"],
        }
    }

    fn default_steps(self) -> u32 {
        match self {
            Version::V1 | Version::V2 => 5,
            Version::V3 => 8,
        }
    }
}

/// The storage of the large matrices (`weights`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weights {
    F32,
    F16,
    BF16,
    Q8_0,
}

impl Weights {
    pub fn parse(s: &str) -> Result<Weights> {
        Ok(match s {
            "f32" => Weights::F32,
            "f16" => Weights::F16,
            "bf16" => Weights::BF16,
            "q8_0" => Weights::Q8_0,
            other => return Err(Error::msg(format!("weights must be one of f32, f16, bf16, q8_0, got '{other}'"))),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Weights::F32 => "f32",
            Weights::F16 => "f16",
            Weights::BF16 => "bf16",
            Weights::Q8_0 => "q8_0",
        }
    }
}

/// The options, checked.
#[derive(Clone, Debug)]
pub struct ConvertOptions {
    pub weights: Weights,
    /// GGUF tensor names (globs) kept F32 besides [`DEFAULT_KEEP_F32`].
    pub keep_f32: Vec<String>,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions { weights: Weights::F32, keep_f32: Vec::new() }
    }
}

/// What `tts convert` may pass (convert.py's `--weights` and `--keep-f32`).
pub fn option_specs() -> Vec<OptionSpec> {
    let spec = |key: &str, default: &str, help: &str| OptionSpec {
        key: key.into(),
        kind: OptionKind::Str,
        default: OptionValue::Str(default.into()),
        help: help.into(),
    };
    vec![
        spec("weights", "f32", "storage of the large matrices: f32, f16, bf16, q8_0 (bf16 and q8_0 where the last dimension is a multiple of 32)"),
        spec("keep_f32", "", "comma-separated GGUF tensor names (globs, as Python's fnmatch) kept F32 besides the built-in list"),
    ]
}

impl ConvertOptions {
    /// Reads `list`; an unknown key or a value of the wrong kind is a
    /// one-line error naming the option.
    pub fn from_list(list: &OptionList) -> Result<ConvertOptions> {
        let specs = option_specs();
        let mut options = ConvertOptions::default();
        for pair in list.iter() {
            let key = pair.0.as_str();
            let value = match &pair.1 {
                OptionValue::Str(s) => s.as_str(),
                _ if specs.iter().any(|s| s.key.as_str() == key) => return Err(Error::msg(format!("option `{key}` is not a string"))),
                _ => "",
            };
            match key {
                "weights" => options.weights = if value.is_empty() { Weights::F32 } else { Weights::parse(value)? },
                "keep_f32" => options.keep_f32 = value.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect(),
                _ => {
                    let known: Vec<&str> = specs.iter().map(|s| s.key.as_str()).collect();
                    return Err(Error::msg(format!("unknown conversion option `{key}` (supertonic takes {})", known.join(", "))));
                }
            }
        }
        Ok(options)
    }
}

/// Converts the official bundle `source` into `out_dir/supertonic-<v1|v2|v3>.gguf`
/// (`out_dir` created if missing) per `options` (see [`option_specs`]).
pub fn convert(source: &Path, out_dir: &Path, options: &OptionList) -> Result<Vec<ConvertedFile>> {
    let options = ConvertOptions::from_list(options)?;
    convert_with(source, out_dir, &options)
}

/// [`convert`] with options already read.
pub fn convert_with(source: &Path, out_dir: &Path, options: &ConvertOptions) -> Result<Vec<ConvertedFile>> {
    if !source.is_dir() {
        return Err(Error::msg(format!("{}: not a directory (expected an official Supertonic bundle)", source.display())));
    }
    let keep_f32 = keep_f32_set(&options.keep_f32)?;
    let config = TtsConfig::read(source)?;
    let indexer = read_indexer(source)?;
    let mut graphs = Vec::with_capacity(GRAPHS.len());
    for name in GRAPHS {
        let path = source.join("onnx").join(format!("{name}.onnx"));
        if !path.is_file() {
            return Err(Error::msg(format!("{} is missing", path.display())));
        }
        graphs.push(OnnxGraph::open(&path)?);
    }
    let mut out = Out::new();
    let dp = duration::convert(&graphs[0], &mut out)?;
    let te = text_encoder::convert(&graphs[1], &mut out)?;
    let ve = vector_estimator::convert(&graphs[2], &mut out)?;
    let voc = vocoder::convert(&graphs[3], &mut out)?;
    let version = detect_version(&config, ve.cfg.is_some())?;

    let voices = read_voices(source)?;
    for voice in &voices {
        if voice.style_ttl.shape() != [te.style_tokens, te.style_dim] {
            return Err(Error::msg(format!(
                "{}: style_ttl {:?} does not fit the model ([{}, {}])",
                voice.path.display(),
                voice.style_ttl.shape(),
                te.style_tokens,
                te.style_dim
            )));
        }
        if voice.style_dp.shape() != voices[0].style_dp.shape() {
            return Err(Error::msg(format!(
                "{}: style_dp {:?} differs from {}'s {:?}",
                voice.path.display(),
                voice.style_dp.shape(),
                voices[0].path.display(),
                voices[0].style_dp.shape()
            )));
        }
        out.insert(format!("voice.{}.style_ttl", voice.name), Lazy::Ready(voice.style_ttl.clone().into_dyn()));
        out.insert(format!("voice.{}.style_dp", voice.name), Lazy::Ready(voice.style_dp.clone().into_dyn()));
    }
    let (dp_tokens, dp_dim) = (voices[0].style_dp.shape()[0], voices[0].style_dp.shape()[1]);
    let vocab = indexer.iter().copied().max().unwrap_or(0) as i64 + 1;
    for key in ["dp.char_emb", "te.char_emb"] {
        let rows = out.get(key).and_then(|t| t.shape().first().copied()).unwrap_or(0);
        if (rows as i64) < vocab {
            return Err(Error::msg(format!("{}: {key} has {rows} rows but the indexer uses {vocab}", source.display())));
        }
    }

    let mut w = GgufWriter::new(ARCH);
    let meta = Meta { what: source.display().to_string() };
    w.add("general.name", MetaValue::Str(format!("Supertonic {}", version.name())));
    let k = |s: &str| format!("{ARCH}.{s}");
    w.add(k("version"), MetaValue::Str(version.name().into()));
    w.add(k("tts_version"), MetaValue::Str(config.tts_version.clone()));
    w.add(k("sample_rate"), MetaValue::U32(config.sample_rate));
    w.add(k("base_chunk_size"), meta.u32("base_chunk_size", voc.base_chunk_size)?);
    w.add(k("chunk_compress_factor"), MetaValue::U32(config.chunk_compress_factor));
    w.add(k("latent_dim"), MetaValue::U32(config.latent_dim));
    w.add(k("normalizer_scale"), MetaValue::F32(config.normalizer_scale as f32));
    w.add(k("layer_norm_eps"), MetaValue::F32(layer_norm_eps(&graphs[1])? as f32));
    w.add(k("batch_norm_eps"), MetaValue::F32(voc.batch_norm_eps as f32));
    w.add(k("default_steps"), MetaValue::U32(version.default_steps()));
    w.add(k("style_tokens"), meta.u32("style_tokens", te.style_tokens)?);
    w.add(k("style_dim"), meta.u32("style_dim", te.style_dim)?);
    w.add(k("text.language_wrap"), MetaValue::Str(if version == Version::V1 { "none" } else { "open_close" }.into()));
    w.add(k("text.languages"), MetaValue::ArrStr(version.languages().iter().map(|s| s.to_string()).collect()));
    w.add(k("text.default_language"), MetaValue::Str(version.default_language().into()));
    w.add(k("text.chunk_chars"), MetaValue::U32(300));
    w.add(k("text.short_chunk_chars"), MetaValue::U32(120));
    // A comma-separated string: GGUF writers drop empty arrays (v1 has none).
    w.add(k("text.short_chunk_languages"), MetaValue::Str(version.short_chunk_languages().join(",")));

    w.add(k("dp.char_dim"), meta.u32("dp.char_dim", dp.char_dim)?);
    meta.convnext(&mut w, "dp.convnext", &dp.convnext)?;
    meta.attn(&mut w, "dp.attn", &dp.attn)?;
    w.add(k("dp.style_tokens"), meta.u32("dp.style_tokens", dp_tokens)?);
    w.add(k("dp.style_dim"), meta.u32("dp.style_dim", dp_dim)?);
    w.add(k("dp.predictor_hidden"), meta.u32("dp.predictor_hidden", dp.predictor_hidden)?);
    w.add(k("te.char_dim"), meta.u32("te.char_dim", te.char_dim)?);
    meta.convnext(&mut w, "te.convnext", &te.convnext)?;
    meta.attn(&mut w, "te.attn", &te.attn)?;
    meta.cross(&mut w, "te.spte", &te.spte)?;
    for (key, value) in [("hidden", ve.hidden), ("time_dim", ve.time_dim), ("time_hidden", ve.time_hidden), ("blocks", ve.blocks)] {
        w.add(k(&format!("ve.{key}")), meta.u32(key, value)?);
    }
    w.add(k("ve.time_scale"), MetaValue::F32(ve.time_scale as f32));
    for (key, hp) in [("convnext0", &ve.convnext0), ("convnext1", &ve.convnext1), ("convnext2", &ve.convnext2), ("last_convnext", &ve.last_convnext)] {
        meta.convnext(&mut w, &format!("ve.{key}"), hp)?;
    }
    meta.cross(&mut w, "ve.text_attn", &ve.text_attn)?;
    meta.cross(&mut w, "ve.style_attn", &ve.style_attn)?;
    w.add(k("ve.cfg"), MetaValue::Bool(ve.cfg.is_some()));
    if let Some((cond, uncond)) = ve.cfg {
        w.add(k("ve.cfg_cond_scale"), MetaValue::F32(cond as f32));
        w.add(k("ve.cfg_uncond_scale"), MetaValue::F32(uncond as f32));
    }
    for (key, value) in [("hidden", voc.hidden), ("kernel_init", voc.kernel_init), ("head_hidden", voc.head_hidden), ("head_kernel", voc.head_kernel)] {
        w.add(k(&format!("voc.{key}")), meta.u32(key, value)?);
    }
    meta.convnext(&mut w, "voc.convnext", &voc.convnext)?;
    w.add(k("weights"), MetaValue::Str(options.weights.name().into()));

    // Every tensor in name order, as the Python converter sorts them.
    let tensor_count = out.len() + 1;
    let mut stored = 0;
    let mut indexer = Some(indexer);
    let mut planned = Vec::with_capacity(tensor_count);
    let text_indexer = "text.indexer";
    let mut pending: Vec<(String, Option<Lazy>)> = out.into_iter().map(|(n, t)| (n, Some(t))).collect();
    let at = pending.partition_point(|(n, _)| n.as_str() < text_indexer);
    pending.insert(at, (text_indexer.to_string(), None));
    for (name, tensor) in pending {
        let Some(tensor) = tensor else {
            planned.push(indexer_tensor(indexer.take().unwrap_or_default()));
            continue;
        };
        let storage = storage_for(&name, tensor.shape(), options.weights, &keep_f32);
        if storage != GgmlType::F32 {
            stored += 1;
        }
        let shape = tensor.shape().to_vec();
        planned.push(PlannedTensor::new(name, shape, storage, move || Ok(Values::F32(tensor.values()?))));
    }
    for tensor in planned {
        w.add_tensor(tensor);
    }

    std::fs::create_dir_all(out_dir).map_err(|e| Error::msg(format!("{}: {e}", out_dir.display())))?;
    let path = out_dir.join(format!("supertonic-{}.gguf", version.name()));
    w.write_atomically(&path)?;
    let stored = if options.weights != Weights::F32 { format!(", {stored} stored {}", options.weights.name()) } else { String::new() };
    let names: Vec<&str> = voices.iter().map(|v| v.name.as_str()).collect();
    let summary = format!("Supertonic {}, {tensor_count} tensors{stored}, voices {}", version.name(), names.join(", "));
    Ok(vec![ConvertedFile { path, summary }])
}

/// `text.indexer`: I16 when every row fits (every official vocabulary
/// does), else I32; values cast as numpy's `astype` casts.
fn indexer_tensor<'a>(indexer: Vec<i32>) -> PlannedTensor<'a> {
    let n = indexer.len();
    if indexer.iter().copied().max().unwrap_or(0) < 32768 {
        let values = ArrayD::from_shape_vec(IxDyn(&[n]), indexer.iter().map(|&v| v as i16).collect()).unwrap_or_default();
        PlannedTensor::ready("text.indexer", GgmlType::I16, Values::I16(values))
    } else {
        let values = ArrayD::from_shape_vec(IxDyn(&[n]), indexer).unwrap_or_default();
        PlannedTensor::ready("text.indexer", GgmlType::I32, Values::I32(values))
    }
}

/// convert.py's storage rule: a 2-D tensor not kept F32 takes `weights`,
/// BF16 and Q8_0 only where the last dimension is a multiple of 32.
pub fn storage_for(name: &str, shape: &[usize], weights: Weights, keep_f32: &GlobSet) -> GgmlType {
    if shape.len() != 2 || keep_f32.is_match(name) {
        return GgmlType::F32;
    }
    match weights {
        Weights::F32 => GgmlType::F32,
        Weights::F16 => GgmlType::F16,
        Weights::BF16 if shape[1].is_multiple_of(32) => GgmlType::BF16,
        Weights::Q8_0 if shape[1].is_multiple_of(32) => GgmlType::Q8_0,
        _ => GgmlType::F32,
    }
}

/// [`DEFAULT_KEEP_F32`] and `extra`, matched as Python's `fnmatch` matches on
/// POSIX: case-sensitive, `*` across dots, no escapes or `{a,b}` alternation
/// (braces are literal there, so they are made literal here).
pub fn keep_f32_set(extra: &[String]) -> Result<GlobSet> {
    let mut set = GlobSetBuilder::new();
    for pattern in DEFAULT_KEEP_F32.iter().copied().chain(extra.iter().map(String::as_str)) {
        let literal_braces = pattern.replace('{', "[{]").replace('}', "[}]");
        let glob = GlobBuilder::new(&literal_braces)
            .literal_separator(false)
            .backslash_escape(false)
            .build()
            .map_err(|e| Error::msg(format!("keep_f32: pattern '{pattern}' is not a glob ({e})")))?;
        set.add(glob);
    }
    set.build().map_err(|e| Error::msg(format!("keep_f32: {e}")))
}

/// convert.py's `detect_version`: `tts_version` 1.5.x is v1, 1.6.x v2,
/// 1.7.x v3; another version is taken from whether the vector estimator has
/// guidance (v3) or not (v2), with a warning. A version that contradicts
/// the graph is an error.
pub fn detect_version(config: &TtsConfig, has_cfg: bool) -> Result<Version> {
    let v = config.tts_version.as_str();
    let rest = v.strip_prefix('v').unwrap_or(v);
    let minor = rest.strip_prefix("1.").and_then(|r| {
        let digits: String = r.chars().take_while(|c| c.is_ascii_digit()).collect();
        digits.parse::<u64>().ok()
    });
    let version = match minor {
        Some(5) => Version::V1,
        Some(6) => Version::V2,
        Some(7) => Version::V3,
        _ => {
            let detected = if has_cfg { Version::V3 } else { Version::V2 };
            tracing::warn!("{}: unknown tts_version '{v}', detected {} from the graphs", config.path.display(), detected.name());
            detected
        }
    };
    if (version == Version::V3) != has_cfg {
        return Err(Error::msg(format!(
            "{}: tts_version {v} says {} but the vector estimator {} guidance",
            config.path.display(),
            version.name(),
            if has_cfg { "has" } else { "has no" }
        )));
    }
    Ok(version)
}

/// Metadata values checked to fit their GGUF types (gguf-py refuses what
/// does not fit a u32 or an i32).
struct Meta {
    what: String,
}

impl Meta {
    fn u32(&self, key: &str, value: usize) -> Result<MetaValue> {
        u32::try_from(value).map(MetaValue::U32).map_err(|_| Error::msg(format!("{}: {key} = {value} does not fit a u32", self.what)))
    }

    fn u32_signed(&self, key: &str, value: i64) -> Result<MetaValue> {
        u32::try_from(value).map(MetaValue::U32).map_err(|_| Error::msg(format!("{}: {key} = {value} does not fit a u32", self.what)))
    }

    fn convnext(&self, w: &mut GgufWriter, prefix: &str, hp: &ConvNextHp) -> Result<()> {
        w.add(format!("{ARCH}.{prefix}.kernel"), self.u32(&format!("{prefix}.kernel"), hp.kernel)?);
        w.add(format!("{ARCH}.{prefix}.inner"), self.u32(&format!("{prefix}.inner"), hp.inner)?);
        let dilations = hp
            .dilations
            .iter()
            .map(|&d| i32::try_from(d).map_err(|_| Error::msg(format!("{}: {prefix}.dilations: {d} does not fit an i32", self.what))))
            .collect::<Result<Vec<i32>>>()?;
        w.add(format!("{ARCH}.{prefix}.dilations"), MetaValue::ArrI32(dilations));
        Ok(())
    }

    fn attn(&self, w: &mut GgufWriter, prefix: &str, hp: &AttnHp) -> Result<()> {
        w.add(format!("{ARCH}.{prefix}.layers"), self.u32(&format!("{prefix}.layers"), hp.layers)?);
        w.add(format!("{ARCH}.{prefix}.heads"), self.u32_signed(&format!("{prefix}.heads"), hp.heads)?);
        w.add(format!("{ARCH}.{prefix}.filter"), self.u32(&format!("{prefix}.filter"), hp.filter)?);
        w.add(format!("{ARCH}.{prefix}.window"), self.u32_signed(&format!("{prefix}.window"), hp.window)?);
        Ok(())
    }

    fn cross(&self, w: &mut GgufWriter, prefix: &str, hp: &CrossHp) -> Result<()> {
        w.add(format!("{ARCH}.{prefix}.heads"), self.u32_signed(&format!("{prefix}.heads"), hp.heads)?);
        w.add(format!("{ARCH}.{prefix}.units"), self.u32(&format!("{prefix}.units"), hp.units)?);
        w.add(format!("{ARCH}.{prefix}.scale"), MetaValue::F32(hp.scale as f32));
        Ok(())
    }
}
