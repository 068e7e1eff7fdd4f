//! The native Chatterbox converter: an official Turbo, Nano or Multilingual
//! directory → `t3-<variant>.gguf` and `s3gen-meanflow.gguf` / `s3gen.gguf`,
//! byte for byte what `tools/chatterbox/convert.py` writes from the same
//! files and options (docs/gguf.md has the layout).
//!
//! One module per part: [`options`] (what the caller may set), [`t3`] (GPT-2
//! and Llama backbones), [`voice_encoder`], [`s3gen`] (names, weight norm,
//! hyper-parameters of flow, CFM, HiFT, CAMPPlus and the S3Tokenizer),
//! [`conds`] (the built-in voice, through the restricted pickle reader),
//! [`tokenizer`] (the embedded tokenizer JSON and its id check) and
//! [`storage`] (which ggml type each tensor gets). The inputs are read with
//! model_kit's [`Checkpoint`](engine_core::model_kit::convert::Checkpoint)
//! (safetensors mapped, `.pt` storages read tensor by tensor) and the outputs
//! written with its `GgufWriter`: every tensor is planned from shapes alone
//! and produced only when the writer reaches it, so a conversion holds one
//! tensor's values at a time, and a failed one leaves no output file.

pub mod conds;
pub mod options;
pub mod plan;
pub mod s3gen;
pub mod source;
pub mod storage;
pub mod t3;
pub mod tokenizer;
pub mod voice_encoder;

pub use options::{option_specs, ConvertOptions, Variant};

use conds::Conds;
use engine_core::abi::OptionList;
use engine_core::model_kit::convert::{GgufWriter, MetaValue, PlannedTensor, Values};
use engine_core::model_kit::files::read_regular;
use engine_core::model_kit::{Error, Result};
use indexmap::IndexMap;
use plan::{Planned, Shapes};
use source::Source;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use storage::{storage_for, DecoderWeights, Weights};

/// One file written and what it holds: convert.py prints `{path}: {summary}`
/// ("T3 turbo, 49 tensors, 3 stored q4_0").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvertedFile {
    pub path: PathBuf,
    pub summary: String,
}

/// A finished conversion: the variant converted and the files, T3 first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conversion {
    pub variant: Variant,
    pub files: Vec<ConvertedFile>,
}

/// What the converter reads, for people (the plugin's `ConverterInfo`).
pub const DESCRIPTION: &str = "an official Chatterbox Turbo, Nano or Multilingual checkpoint directory (T3 safetensors, s3gen, ve, conds.pt, tokenizer)";
/// Any one of these marks a directory as a Chatterbox checkpoint: the T3 of
/// each variant.
pub const MARKER_FILES: [&str; 4] = [TURBO_T3, NANO_T3, MTL_T3_FILES[0], MTL_T3_FILES[1]];

pub const T3_ARCH: &str = crate::hparams::T3_ARCH;
pub const S3GEN_ARCH: &str = crate::hparams::S3GEN_ARCH;

/// The T3 checkpoint of each variant; Multilingual may also use the second
/// file of [`MTL_T3_FILES`] (`t3_file`).
pub const TURBO_T3: &str = "t3_turbo_v1.safetensors";
pub const NANO_T3: &str = "t3_nano_v1.safetensors";
pub const MTL_T3_FILES: [&str; 2] = ["t3_mtl23ls_v2.safetensors", "t3_mtl23ls_v3.safetensors"];
pub const MTL_TOKENIZER: &str = "grapheme_mtl_merged_expanded_v1.json";
/// Chinese preprocessing's character → Cangjie code table (Multilingual):
/// embedded in the T3 file as `chatterbox.cangjie5_tc` when present.
pub const MTL_CANGJIE: &str = "Cangjie5_TC.json";
const START_TEXT: usize = 255;
const STOP_TEXT: usize = 0;
const START_SPEECH: usize = 6561;
const STOP_SPEECH: usize = 6562;
const SILENCE_TOKEN: usize = 4299;
/// The reference's Llama_520M configuration (t3/llama_configs.py): what the weights cannot show.
const LLAMA_ROPE_THETA: f64 = 500000.0;
const LLAMA_ROPE_SCALING: [(&str, f64); 4] = [("factor", 8.0), ("low_freq_factor", 1.0), ("high_freq_factor", 4.0), ("original_context", 8192.0)];
const LLAMA_RMS_EPS: f64 = 1e-5;
const LAYER_NORM_EPS: f64 = 1e-5;
/// The most a tokenizer or added-tokens JSON may be (the official ones are ~2 MB).
const MAX_JSON: u64 = 64 << 20;

/// Converts the official checkpoint directory `source` into `out_dir`
/// (created if missing) per `options` (see [`option_specs`]).
pub fn convert(source: &Path, out_dir: &Path, options: &OptionList) -> Result<Vec<ConvertedFile>> {
    let options = ConvertOptions::from_list(options)?;
    Ok(convert_with(source, out_dir, &options)?.files)
}

/// [`convert`] with options already read; says which variant it converted.
pub fn convert_with(source: &Path, out_dir: &Path, options: &ConvertOptions) -> Result<Conversion> {
    if !source.is_dir() {
        return Err(Error::msg(format!("{}: not a directory (an official Chatterbox checkpoint directory)", source.display())));
    }
    let variant = match options.variant {
        Some(v) => v,
        None => detect_variant(source)?,
    };
    let conds = Conds::read(&source.join("conds.pt"))?;
    // Every input is opened and every plan made before anything is written,
    // so a bad input fails before either output exists.
    let ve_src = Source::open_first(source, &["ve.safetensors", "ve.pt"])?;
    let t3_name = match (variant, options.t3_file.as_deref()) {
        (Variant::Mtl, Some(name)) if !MTL_T3_FILES.contains(&name) => {
            return Err(Error::msg(format!("t3_file {name}: a Multilingual T3 is one of {}", MTL_T3_FILES.join(", "))));
        }
        (_, Some(name)) => name,
        // v2 as convert.py takes by default, else v3 when only it was downloaded.
        (Variant::Mtl, None) => MTL_T3_FILES.into_iter().find(|f| source.join(f).is_file()).unwrap_or(MTL_T3_FILES[0]),
        (Variant::Nano, None) => NANO_T3,
        (Variant::Turbo, None) => TURBO_T3,
    };
    let t3_src = Source::open_first(source, &[t3_name])?;
    let t3 = plan_t3(source, out_dir, variant, options, &conds, &t3_src, &ve_src)?;
    let s3_files: &[&str] = if variant == Variant::Mtl { &["s3gen.safetensors", "s3gen.pt"] } else { &["s3gen_meanflow.safetensors"] };
    let s3_src = Source::open_first(source, s3_files)?;
    let s3 = plan_s3gen(out_dir, options, &conds, &s3_src)?;

    std::fs::create_dir_all(out_dir).map_err(|e| Error::msg(format!("{}: {e}", out_dir.display())))?;
    let t3 = t3.write()?;
    match s3.write() {
        Ok(s3) => Ok(Conversion { variant, files: vec![t3, s3] }),
        Err(e) => {
            // Both files or neither: a T3 without its S3Gen is not a model.
            let _ = std::fs::remove_file(&t3.path);
            Err(e)
        }
    }
}

/// The variant whose T3 file `dir` holds; an error when none or several do.
pub fn detect_variant(dir: &Path) -> Result<Variant> {
    let candidates = [(Variant::Turbo, TURBO_T3), (Variant::Nano, NANO_T3), (Variant::Mtl, MTL_T3_FILES[0]), (Variant::Mtl, MTL_T3_FILES[1])];
    let mut found: Vec<(Variant, &str)> = candidates.into_iter().filter(|(_, f)| dir.join(f).is_file()).collect();
    found.dedup_by_key(|(v, _)| *v);
    match found.as_slice() {
        [(v, _)] => Ok(*v),
        [] => Err(Error::msg(format!(
            "{}: no T3 checkpoint ({TURBO_T3}, {NANO_T3}, {} or {}); is this an official Chatterbox directory?",
            dir.display(),
            MTL_T3_FILES[0],
            MTL_T3_FILES[1]
        ))),
        several => {
            let names: Vec<&str> = several.iter().map(|(_, f)| *f).collect();
            Err(Error::msg(format!("{}: holds the T3 checkpoints of several variants ({}); give variant", dir.display(), names.join(", "))))
        }
    }
}

/// `path`'s text as Python's `Path.read_text()` gives it: UTF-8, with
/// `\r\n` and `\r` read as `\n` (universal newlines).
pub fn read_text(path: &Path) -> Result<String> {
    let bytes = read_regular(path, "", MAX_JSON).map_err(Error::msg)?;
    let text = String::from_utf8(bytes).map_err(|e| source_error(path, format!("not UTF-8 text ({e})")))?;
    Ok(if text.contains('\r') { text.replace("\r\n", "\n").replace('\r', "\n") } else { text })
}

/// `PATH: message`.
pub fn source_error(path: &Path, message: impl std::fmt::Display) -> Error {
    Error::msg(format!("{}: {message}", path.display()))
}

fn plan_t3<'a>(
    dir: &Path,
    out_dir: &Path,
    variant: Variant,
    options: &ConvertOptions,
    conds: &Conds,
    t3_src: &'a Source,
    ve_src: &'a Source,
) -> Result<Output<'a>> {
    let (ve, ve_hp) = voice_encoder::plan(ve_src)?;
    let a = T3_ARCH;
    let weights = options.weights;
    let mut meta: Vec<(String, MetaValue)> = vec![
        (format!("{a}.variant"), MetaValue::Str(variant.name().into())),
        (format!("{a}.backbone"), MetaValue::Str(if variant == Variant::Mtl { "llama" } else { "gpt2" }.into())),
        (format!("{a}.weights"), MetaValue::Str(weights.name().into())),
    ];
    let (plan, norms, tokenizer) = if variant == Variant::Mtl {
        let plan = t3::plan_llama(t3_src, options.t3_heads, options.aligned_heads.as_deref())?;
        let tok = dir.join(MTL_TOKENIZER);
        if !tok.is_file() {
            return Err(Error::msg(format!("{} is missing", tok.display())));
        }
        let json = tokenizer::checked(read_text(&tok)?, plan.hparam("text_vocab"), &tok)?;
        (plan, vec![("rms_norm_eps", LLAMA_RMS_EPS), ("layer_norm_eps", LAYER_NORM_EPS)], json)
    } else {
        let plan = t3::plan_gpt2(t3_src, options.t3_heads)?;
        let json = tokenizer::gpt2_tokenizer_json(dir, plan.hparam("text_vocab"))?;
        (plan, vec![("layer_norm_eps", LAYER_NORM_EPS)], json)
    };
    meta.extend(plan.hparams.iter().map(|&(k, v)| (format!("{a}.{k}"), MetaValue::U32(v as u32))));
    meta.extend(norms.iter().map(|&(k, v)| (format!("{a}.{k}"), MetaValue::F32(v as f32))));
    for (k, v) in [("start_speech_token", START_SPEECH), ("stop_speech_token", STOP_SPEECH), ("silence_token", SILENCE_TOKEN)] {
        meta.push((format!("{a}.{k}"), MetaValue::U32(v as u32)));
    }
    meta.push((format!("{a}.cond_prompt_len"), MetaValue::U32(conds.prompt_speech_tokens.len() as u32)));
    meta.extend(ve_hp.iter().map(|&(k, v)| (format!("{a}.voice_encoder.{k}"), MetaValue::U32(v as u32))));
    meta.push((format!("{a}.tokenizer_json"), MetaValue::Str(tokenizer)));
    if variant == Variant::Mtl {
        meta.push((format!("{a}.rope.freq_base"), MetaValue::F32(LLAMA_ROPE_THETA as f32)));
        meta.push((format!("{a}.rope.scaling"), MetaValue::Str("llama3".into())));
        meta.extend(LLAMA_ROPE_SCALING.iter().map(|&(k, v)| (format!("{a}.rope.scaling.{k}"), MetaValue::F32(v as f32))));
        meta.push((format!("{a}.start_text_token"), MetaValue::U32(START_TEXT as u32)));
        meta.push((format!("{a}.stop_text_token"), MetaValue::U32(STOP_TEXT as u32)));
    }
    meta.extend(plan.extra.into_iter().map(|(k, v)| (format!("{a}.{k}"), v)));
    // The Cangjie table Chinese preprocessing reads, embedded when the
    // directory has it, so that Chinese needs no download later.
    let cangjie = dir.join(MTL_CANGJIE);
    if variant == Variant::Mtl && cangjie.is_file() {
        meta.push((format!("{a}.cangjie5_tc"), MetaValue::Str(read_text(&cangjie)?)));
    }

    let mut tensors = plan.tensors;
    tensors.extend(ve);
    let speaker_emb = conds.speaker_emb.clone();
    let tokens = conds.prompt_speech_tokens.clone();
    tensors.insert("voice.builtin.speaker_emb".into(), Planned::float(speaker_emb.shape().to_vec(), move || Ok(Values::F32(speaker_emb))));
    tensors.insert("voice.builtin.prompt_speech_tokens".into(), Planned::int(tokens.shape().to_vec(), move || Ok(Values::I32(tokens))));

    let path = out_dir.join(format!("t3-{}.gguf", variant.name()));
    let summary = format!("T3 {}, {} tensors", variant.name(), tensors.len());
    let narrowed = if weights != Weights::F32 { Some(format!("stored {}", weights.name())) } else { None };
    Ok(Output { path, arch: a, meta, tensors, weights, decoder: DecoderWeights::F32, summary, narrowed, always: true })
}

fn plan_s3gen<'a>(out_dir: &Path, options: &ConvertOptions, conds: &Conds, src: &'a Source) -> Result<Output<'a>> {
    let mut tensors = s3gen::plan(src)?;
    for (name, values) in [
        ("voice.builtin.prompt_token", Values::I32(conds.prompt_token.clone())),
        ("voice.builtin.prompt_feat", Values::F32(conds.prompt_feat.clone())),
        ("voice.builtin.embedding", Values::F32(conds.embedding.clone())),
    ] {
        let shape = values.shape().to_vec();
        let integer = matches!(values, Values::I32(_));
        tensors.insert(name.into(), Planned { shape, integer, produce: Box::new(move || Ok(values)) });
    }
    let shapes = Shapes::new(src.shapes().what(), tensors.iter().map(|(k, p)| (k.clone(), p.shape.clone())).collect());
    let meanflow = tensors.contains_key("cfm.time_embed_mixer.weight");
    let weights = options.weights;
    let decoder = options.decoder_weights.resolve(weights);
    let b = S3GEN_ARCH;
    let mut meta: Vec<(String, MetaValue)> = vec![
        (format!("{b}.variant"), MetaValue::Str(if meanflow { "meanflow" } else { "standard" }.into())),
        (format!("{b}.meanflow"), MetaValue::Bool(meanflow)),
        (format!("{b}.n_timesteps"), MetaValue::U32(if meanflow { 2 } else { 10 })),
        (format!("{b}.cfg_rate"), MetaValue::F32(if meanflow { 0.0 } else { 0.7 })),
        (format!("{b}.speech_vocab"), MetaValue::U32(shapes.dim("flow.input_embedding.weight", 0)? as u32)),
    ];
    let parts = [
        s3gen::flow_hparams(&shapes)?,
        s3gen::cfm_hparams(&shapes, options.cfm_heads)?,
        s3gen::hift_hparams(&shapes)?,
        s3gen::campplus_hparams(&shapes)?,
        s3gen::tokenizer_hparams(&shapes)?,
    ];
    meta.extend(parts.into_iter().flatten().map(|(k, v)| (format!("{b}.{k}"), v)));
    meta.push((format!("{b}.weights"), MetaValue::Str(weights.name().into())));
    meta.push((format!("{b}.decoder_weights"), MetaValue::Str(decoder.name().into())));

    let path = out_dir.join(if meanflow { "s3gen-meanflow.gguf" } else { "s3gen.gguf" });
    let summary = format!("S3Gen {}, {} tensors", if meanflow { "meanflow" } else { "standard" }, tensors.len());
    let narrowed = Some(format!("narrowed (matrices {}, decoder {})", weights.name(), decoder.name()));
    Ok(Output { path, arch: b, meta, tensors, weights, decoder, summary, narrowed, always: false })
}

/// One output file, planned: written by [`Output::write`].
struct Output<'a> {
    path: PathBuf,
    arch: &'static str,
    meta: Vec<(String, MetaValue)>,
    tensors: IndexMap<String, Planned<'a>>,
    weights: Weights,
    decoder: DecoderWeights,
    /// convert.py's line without the count of narrowed tensors …
    summary: String,
    /// … and how that count is worded (`None`: not reported) …
    narrowed: Option<String>,
    /// … reported even when zero (T3) or only when not (S3Gen).
    always: bool,
}

impl Output<'_> {
    /// Writes the GGUF: the metadata in order, then the tensors sorted by
    /// name (as convert.py's `sorted(tensors)`), each in the storage
    /// [`storage_for`] picks, through `<path>.part` renamed at the end.
    fn write(self) -> Result<ConvertedFile> {
        let mut writer = GgufWriter::new(self.arch);
        for (key, value) in self.meta {
            writer.add(key, value);
        }
        let sorted: BTreeMap<String, Planned<'_>> = self.tensors.into_iter().collect();
        let mut narrowed = 0usize;
        for (name, planned) in sorted {
            let (storage, narrow) = storage_for(&name, &planned.shape, planned.integer, self.weights, self.decoder);
            narrowed += usize::from(narrow);
            writer.add_tensor(PlannedTensor::new(name, planned.shape, storage, planned.produce));
        }
        writer.write_atomically(&self.path)?;
        let mut summary = self.summary;
        if let Some(words) = self.narrowed.filter(|_| self.always || narrowed > 0) {
            summary.push_str(&format!(", {narrowed} {words}"));
        }
        Ok(ConvertedFile { path: self.path, summary })
    }
}
