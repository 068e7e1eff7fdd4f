//! Supertonic model-family plugin (`libtts_model_supertonic.so`).
//!
//! Layout: [`convert`] (official ONNX bundles to GGUF), [`hparams`] (GGUF
//! metadata, range-checked), [`tensors`] (the tensor
//! table checked at load), [`text`] (frontend), [`voice`], [`noise`], [`graph`] (one builder
//! per ONNX stage), [`model`] (the synthesis loop). This file is the plugin
//! surface: option specs and the ABI glue.

pub mod convert;
pub mod graph;
pub mod hparams;
pub mod memory;
pub mod model;
pub mod noise;
pub mod tensors;
pub mod text;
pub mod voice;

use abi_stable::{
    export_root_module,
    prefix_type::PrefixTypeTrait,
    sabi_trait::TD_Opaque,
    std_types::{RResult, RString, RVec},
};
use engine_core::abi::{
    AudioSink, BackendHandle, ConvertOutput, ConvertRequest, ConvertedFile, ConverterInfo, LoadedModelInfo, MemoryPlan, MemoryPlanRequest, Model, ModelBox,
    ModelCatalog, ModelFamilyInfo, ModelLoadRequest, ModelPlugin, ModelPluginRef, Model_TO, OptionKind, OptionList, OptionSpec, OptionValue, PluginInfo,
    StreamSummary, SynthesisOutput, SynthesisRequest,
};
use engine_core::backend_kit::spec;
use engine_core::model_kit::Result;
use engine_core::model_kit::{guarded, Error, OpPolicy, OptionReader, PieceSender};
use model::{NoiseSource, Supertonic, SynthesisParams, VoiceChoice};

#[export_root_module]
pub fn get_library() -> ModelPluginRef {
    // Supertonic does not clone voices.
    ModelPlugin {
        info,
        family,
        option_specs,
        load,
        load_for_cloning: None,
        converter: Some(converter),
        convert: Some(convert_checkpoint),
        plan_memory: Some(plan_memory),
    }
    .leak_into_prefix()
}

/// The converter from the official ONNX bundle (ABI 5.4; `tts convert`,
/// `tts pull`): [`convert`].
extern "C" fn converter() -> ConverterInfo {
    ConverterInfo {
        description: "an official Supertonic 1/2/3 bundle (onnx/*.onnx, tts.json, unicode_indexer.json, voice_styles/*.json)".into(),
        marker_files: convert::MARKER_FILES.iter().map(|f| RString::from(*f)).collect(),
        options: convert::option_specs().into(),
    }
}

extern "C" fn convert_checkpoint(request: &ConvertRequest) -> RResult<ConvertOutput, RString> {
    guarded("supertonic converter", || {
        let options = convert::ConvertOptions::from_list(&request.options)?;
        let files = convert::convert_with(std::path::Path::new(request.source.as_str()), std::path::Path::new(request.out_dir.as_str()), &options)?;
        // One file, `supertonic-<version>.gguf`: the version is the variant.
        let variant = files
            .first()
            .and_then(|f| f.path.file_stem())
            .and_then(|stem| stem.to_str())
            .and_then(|stem| stem.strip_prefix("supertonic-"))
            .unwrap_or_default()
            .to_string();
        Ok(ConvertOutput { files: files.iter().map(|f| ConvertedFile::new(&f.path, &f.summary)).collect(), variant: variant.into() })
    })
}

extern "C" fn info() -> PluginInfo {
    engine_core::abi::plugin_info("supertonic", env!("CARGO_PKG_VERSION"), "Supertonic 1/2/3 text-to-speech (44.1 kHz)")
}

extern "C" fn family() -> ModelFamilyInfo {
    ModelFamilyInfo {
        family: "supertonic".into(),
        architectures: RVec::from(vec![RString::from(hparams::ARCH)]),
        variants: ["v1", "v2", "v3"].into_iter().map(RString::from).collect(),
    }
}

extern "C" fn option_specs() -> RVec<OptionSpec> {
    RVec::from(vec![
        spec("voice", OptionKind::Str, OptionValue::Str("".into()), "embedded voice name (\"\" = the first) or a voice style JSON file"),
        spec("language", OptionKind::Str, OptionValue::Str("".into()), "language code (\"\" = the model's default: en for v1/v2, na for v3)"),
        spec(
            "steps",
            OptionKind::Int,
            OptionValue::Int(-1),
            "denoising steps, 1..=100 (v3: 1..=50, as the official helper) (-1 = the model's default: 5 for v1/v2, 8 for v3)",
        ),
        spec("speed", OptionKind::Float, OptionValue::Float(1.05), "speaking rate, 0.25..=4.0 (0.5..=2.0 by the model's duration control; beyond, that range's nearest end time-stretched at the same pitch)"),
        spec("seed", OptionKind::Int, OptionValue::Int(42), "noise seed (NumPy legacy randn compatible), 0..=4294967295"),
        spec("noise_npy", OptionKind::Path, OptionValue::Str("".into()), "initial noise from a .npy file instead of the seed"),
        spec(
            "unsupported_chars",
            OptionKind::Str,
            OptionValue::Str("skip".into()),
            "characters the model has no row for: skip (leave out, with a warning), error (refuse the text), official (the official code's last embedding row)",
        ),
        spec(
            "stream_first_chars",
            OptionKind::Int,
            OptionValue::Int(STREAM_FIRST_CHARS),
            "streaming only: a first text chunk longer than this is cut after its last sentence end, clause mark or word within it, so the first audio comes sooner (0 = the official chunks); 0..=1000",
        ),
    ])
}

/// Streaming's first piece at most (about 2 s of speech at the default speed).
const STREAM_FIRST_CHARS: i64 = 30;

/// Synthesis options from the host's validated list.
pub fn params_from_options(options: &OptionList) -> Result<SynthesisParams> {
    let specs = option_specs();
    let o = OptionReader::new(options, &specs);
    let voice = o.string("voice")?;
    let voice = if voice.ends_with(".json") || voice.contains('/') { VoiceChoice::File(voice.into()) } else { VoiceChoice::Named(voice) };
    let steps = match o.int("steps")? {
        -1 => None,
        n if n >= 1 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        n => return Err(Error::msg(format!("steps must be in 1..=100 (v3: 1..=50), got {n}"))),
    };
    let speed = o.float_in("speed", model::SPEED_RANGE)?;
    let seed = o.int_in("seed", 0..=u32::MAX as i64)? as u32;
    let noise = match o.path("noise_npy")? {
        Some(path) => NoiseSource::Npy(path),
        None => NoiseSource::Seed(seed),
    };
    let unsupported_chars = text::UnsupportedChars::parse(&o.string("unsupported_chars")?)?;
    let stream_first_chars = o.int_in("stream_first_chars", 0..=1000)? as usize;
    Ok(SynthesisParams { voice, language: o.string("language")?, steps, speed: speed as f32, noise, unsupported_chars, stream_first_chars })
}

/// The load-time checks of [`model::check_file`] on a file image in memory (no
/// device, no weights loaded): what the fuzz targets drive.
pub fn check_model_bytes(bytes: &[u8]) -> Result<()> {
    let gguf = ggml_sys::gguf::GgufTensors::from_bytes(bytes, "model.gguf")?;
    model::check_file(&gguf).map(|_| ())
}

/// Every ggml op a Supertonic graph may use, under any policy (the census
/// test checks the graphs against it): a deny rule on one of these without a
/// kit fallback is a load error.
pub const GRAPH_OPS: &[&str] = &[
    "ADD",
    "ARANGE",
    "CLAMP",
    "CONCAT",
    "CONT",
    "CONV_2D_DW",
    "CPY",
    "DIV",
    "FLASH_ATTN_EXT",
    "GET_ROWS",
    "IM2COL",
    "LEAKY_RELU",
    "MUL",
    "MUL_MAT",
    "NORM",
    "PAD",
    "PERMUTE",
    "REPEAT",
    "RESHAPE",
    "SCALE",
    "SOFT_MAX",
    "SQRT",
    "SUB",
    "SUM_ROWS",
    "TRANSPOSE",
    "UNARY",
    "VIEW",
];

struct Plugin {
    model: Supertonic,
}

/// The device memory a load and a synthesis need (ABI 5.6): the weights and
/// one chunk's graphs at the longest chunk the pipeline makes
/// ([`memory::plan`]); chunks run one after another.
extern "C" fn plan_memory(request: &MemoryPlanRequest, handle: &BackendHandle) -> RResult<MemoryPlan, RString> {
    guarded("supertonic memory plan", || {
        let path = single_file(&request.load)?;
        let policy = OpPolicy::from_resolved(&request.load.policies);
        Ok(memory::plan(std::path::Path::new(path), &handle.ggml_backend(), &policy, None)?.0)
    })
}

/// The one GGUF file a Supertonic model is.
fn single_file(request: &ModelLoadRequest) -> Result<&str, String> {
    match request.files.as_slice() {
        [path] => Ok(path.as_str()),
        files => {
            let names: Vec<&str> = files.iter().map(|f| f.as_str()).collect();
            Err(format!(
                "supertonic takes one GGUF file; {} given{}",
                names.len(),
                if names.is_empty() { String::new() } else { format!(": {}", names.join(", ")) }
            ))
        }
    }
}

extern "C" fn load(request: &ModelLoadRequest, handle: &BackendHandle) -> RResult<ModelBox, RString> {
    engine_core::logging::init_from_env();
    guarded("supertonic", || {
        let path = single_file(request)?;
        let policy = OpPolicy::from_resolved(&request.policies);
        let model = Supertonic::load(std::path::Path::new(path), handle.ggml_backend(), &policy)?;
        tracing::info!(version = model.version().as_str(), voices = ?model.voice_names(), extra_buffer_weights = model.weights_in_extra_buffers(), "supertonic model loaded");
        Ok(Model_TO::from_value(Plugin { model }, TD_Opaque))
    })
}

impl Model for Plugin {
    fn info(&self) -> LoadedModelInfo {
        LoadedModelInfo { family: "supertonic".into(), variant: self.model.version().as_str().into(), sample_rate: self.model.hp.sample_rate }
    }

    fn synthesize(&mut self, request: &SynthesisRequest) -> RResult<SynthesisOutput, RString> {
        guarded("supertonic", || {
            let params = params_from_options(&request.options).map_err(|e| format!("supertonic: {e}"))?;
            let s = self.model.synthesize(request.text.as_str(), &params).map_err(|e| format!("supertonic: {e}"))?;
            Ok(SynthesisOutput {
                samples: s.samples.into(),
                sample_rate: self.model.hp.sample_rate,
                timings: s.timings.into_stage_timings(),
                tokens: RVec::new(),
            })
        })
    }

    fn catalog(&self) -> ModelCatalog {
        let default_language = &self.model.hp.text.default_language;
        let others = self.model.hp.text.languages.iter().filter(|l| *l != default_language);
        ModelCatalog {
            voices: self.model.voice_names().into_iter().map(RString::from).collect(),
            languages: std::iter::once(default_language).chain(others).map(|l| RString::from(l.as_str())).collect(),
            clones_voices: false,
        }
    }

    /// One piece per text chunk, each as soon as its vocoder ran.
    fn synthesize_streaming(&mut self, request: &SynthesisRequest, sink: &AudioSink) -> RResult<StreamSummary, RString> {
        guarded("supertonic", || {
            let params = params_from_options(&request.options).map_err(|e| format!("supertonic: {e}"))?;
            let rate = self.model.hp.sample_rate;
            let mut out = PieceSender::to_sink(sink, rate);
            let timings = self.model.synthesize_streaming(request.text.as_str(), &params, &mut out).map_err(|e| format!("supertonic: {e}"))?;
            Ok(out.summary(rate, timings.into_stage_timings(), RVec::new()))
        })
    }
}
