//! Chatterbox model-family plugin (`libtts_model_chatterbox.so`): Turbo and
//! Nano (GPT-2 T3), with Multilingual (Llama T3) planned on the same layout.
//!
//! Layout: [`hparams`] (GGUF metadata, range-checked), [`tensors`] (the tensor
//! tables checked at load), [`text`] (normalisation,
//! sentence split, tokenizer), [`t3`] (speech-token generator: graph builder,
//! static K/V cache, generation loop), [`sampler`], [`s3gen`] (flow encoder,
//! CFM estimator, HiFT graphs and host DSP), [`model`] (the synthesis loop),
//! [`graph`] (shared builder helpers). This file is the plugin surface: option
//! specs and the ABI glue.

pub mod hparams;
pub mod model;
pub mod s3gen;
pub mod sampler;
pub mod t3;
pub mod tensors;
pub mod text;

use abi_stable::{
    export_root_module,
    prefix_type::PrefixTypeTrait,
    sabi_trait::TD_Opaque,
    std_types::{RResult, RString, RVec},
};
use engine_core::abi::{
    find_option, BackendHandle, LoadedModelInfo, Model, ModelBox, ModelFamilyInfo, ModelLoadRequest, ModelPlugin, ModelPluginRef, Model_TO, OptionKind,
    OptionList, OptionSpec, OptionValue, PluginInfo, SynthesisOutput, SynthesisRequest,
};
use engine_core::backend_kit::spec;
use engine_core::model_kit::{guarded, OpPolicy};
use model::{Chatterbox, SynthesisParams};
use sampler::SamplingParams;

#[export_root_module]
pub fn get_library() -> ModelPluginRef {
    ModelPlugin { info, family, option_specs, load }.leak_into_prefix()
}

extern "C" fn info() -> PluginInfo {
    engine_core::abi::plugin_info("chatterbox", env!("CARGO_PKG_VERSION"), "Chatterbox Turbo / Nano text-to-speech (24 kHz)")
}

extern "C" fn family() -> ModelFamilyInfo {
    ModelFamilyInfo {
        family: "chatterbox".into(),
        architectures: RVec::from(vec![RString::from(hparams::T3_ARCH), RString::from(hparams::S3GEN_ARCH)]),
        variants: ["turbo", "nano"].into_iter().map(RString::from).collect(),
    }
}

extern "C" fn option_specs() -> RVec<OptionSpec> {
    RVec::from(vec![
        spec("seed", OptionKind::Int, OptionValue::Int(0), "seed of the token sampler and the vocoder noise, 0..=9223372036854775807"),
        spec("temperature", OptionKind::Float, OptionValue::Float(0.8), "sampling temperature, 0..=5 (0 = greedy: the most likely token)"),
        spec("top_k", OptionKind::Int, OptionValue::Int(1000), "keep the k most likely speech tokens (0 = all)"),
        spec("top_p", OptionKind::Float, OptionValue::Float(0.95), "nucleus sampling mass, in (0, 1] (1 = off)"),
        spec("repetition_penalty", OptionKind::Float, OptionValue::Float(1.2), "penalty on already generated tokens, 1..=10 (1 = off)"),
        spec("max_new_tokens", OptionKind::Int, OptionValue::Int(1000), "speech tokens per chunk at most (25 per second of audio), 1..=8000"),
        spec("min_new_tokens", OptionKind::Int, OptionValue::Int(0), "no stop before this many speech tokens (fixed-length benchmarks; 0 = off)"),
        spec("max_chars", OptionKind::Int, OptionValue::Int(300), "split text longer than this at sentence ends (0 = never split)"),
        spec("crossfade_ms", OptionKind::Float, OptionValue::Float(20.0), "crossfade between chunks, 0..=500 ms"),
        spec("cfm_steps", OptionKind::Int, OptionValue::Int(-1), "Euler steps of the mel decoder, 1..=10 (-1 = the model's default: 2)"),
        spec(
            "draws",
            OptionKind::Path,
            OptionValue::Str("".into()),
            "debug: a directory of recorded random draws (t3_uniforms, cfm_z, sine_phase, sine_noise .npy) to inject",
        ),
    ])
}

fn int(options: &OptionList, key: &str, default: i64) -> i64 {
    match find_option(options, key) {
        Some(OptionValue::Int(v)) => *v,
        _ => default,
    }
}

fn float(options: &OptionList, key: &str, default: f64) -> f64 {
    match find_option(options, key) {
        Some(OptionValue::Float(v)) => *v,
        Some(OptionValue::Int(v)) => *v as f64,
        _ => default,
    }
}

/// Synthesis options from the host's validated list; ranges checked here.
pub fn params_from_options(options: &OptionList) -> Result<SynthesisParams, String> {
    let in_range = |key: &str, v: f64, lo: f64, hi: f64| {
        if (lo..=hi).contains(&v) {
            Ok(v)
        } else {
            Err(format!("{key} must be in {lo}..={hi}, got {v}"))
        }
    };
    let seed = int(options, "seed", 0);
    let seed = u64::try_from(seed).map_err(|_| format!("seed must be non-negative, got {seed}"))?;
    let temperature = in_range("temperature", float(options, "temperature", 0.8), 0.0, 5.0)? as f32;
    let top_k = int(options, "top_k", 1000);
    let top_k = usize::try_from(top_k).map_err(|_| format!("top_k must be non-negative, got {top_k}"))?;
    let top_p = float(options, "top_p", 0.95);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(format!("top_p must be in (0, 1], got {top_p}"));
    }
    let repetition_penalty = in_range("repetition_penalty", float(options, "repetition_penalty", 1.2), 1.0, 10.0)? as f32;
    let max_new_tokens = in_range("max_new_tokens", int(options, "max_new_tokens", 1000) as f64, 1.0, 8000.0)? as usize;
    let min_new_tokens = int(options, "min_new_tokens", 0);
    let min_new_tokens = usize::try_from(min_new_tokens).map_err(|_| format!("min_new_tokens must be non-negative, got {min_new_tokens}"))?;
    let max_chars = int(options, "max_chars", 300);
    let max_chars = usize::try_from(max_chars).map_err(|_| format!("max_chars must be non-negative, got {max_chars}"))?;
    let crossfade_ms = in_range("crossfade_ms", float(options, "crossfade_ms", 20.0), 0.0, 500.0)? as f32;
    let cfm_steps = match int(options, "cfm_steps", -1) {
        -1 => None,
        n if (1..=10).contains(&n) => Some(n as usize),
        n => return Err(format!("cfm_steps must be in 1..=10 (or -1), got {n}")),
    };
    let draws = match find_option(options, "draws") {
        Some(OptionValue::Str(s)) if !s.is_empty() => Some(std::path::PathBuf::from(s.as_str())),
        _ => None,
    };
    Ok(SynthesisParams {
        sampling: SamplingParams { temperature, top_k, top_p, repetition_penalty },
        max_new_tokens,
        min_new_tokens,
        seed,
        max_chars,
        crossfade_ms,
        cfm_steps,
        draws,
    })
}

/// Every ggml op a Chatterbox graph may use, under any policy (the census
/// test checks the graphs against it): a deny rule on one of these without a
/// kit fallback is a load error.
pub const GRAPH_OPS: &[&str] = &[
    "ADD",
    "CONCAT",
    "CONT",
    "CONV_TRANSPOSE_1D",
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
    "PAD_REFLECT_1D",
    "PERMUTE",
    "REPEAT",
    "RESHAPE",
    "SCALE",
    "SET_ROWS",
    "SIN",
    "SOFT_MAX",
    "SQR",
    "TRANSPOSE",
    "UNARY",
    "VIEW",
];

/// The load-time checks of either Chatterbox file (T3 with its tokenizer, or
/// S3Gen) on a file image in memory (no device, no weights loaded): what the
/// fuzz targets drive.
pub fn check_model_bytes(bytes: &[u8]) -> Result<(), String> {
    let gguf = ggml_sys::gguf::GgufTensors::from_bytes(bytes, "model.gguf").map_err(|e| e.to_string())?;
    let arch = gguf.file.get_str("general.architecture").map_err(|e| e.to_string())?;
    if arch == hparams::S3GEN_ARCH {
        return s3gen::check_file(&gguf).map(|_| ());
    }
    let (hp, _) = t3::check_file(&gguf)?;
    let json = gguf.file.get_str("chatterbox.tokenizer_json").map_err(|e| e.to_string())?;
    text::TextTokenizer::from_json(&json, hp.text_vocab).map(|_| ())
}

struct Plugin {
    model: Chatterbox,
}

extern "C" fn load(request: &ModelLoadRequest, handle: &BackendHandle) -> RResult<ModelBox, RString> {
    engine_core::logging::init_from_env();
    guarded("chatterbox", || {
        let files: Vec<std::path::PathBuf> = request.files.iter().map(|f| f.as_str().into()).collect();
        let policy = OpPolicy::from_resolved(&request.policies);
        let model = Chatterbox::load(&files, &handle.ggml_backend(), &policy)?;
        tracing::info!(variant = model.variant(), attention = ?model.t3.attention(), "chatterbox model loaded");
        Ok(Model_TO::from_value(Plugin { model }, TD_Opaque))
    })
}

impl Model for Plugin {
    fn info(&self) -> LoadedModelInfo {
        LoadedModelInfo { family: "chatterbox".into(), variant: self.model.variant().into(), sample_rate: self.model.sample_rate() }
    }

    fn synthesize(&mut self, request: &SynthesisRequest) -> RResult<SynthesisOutput, RString> {
        guarded("chatterbox", || {
            let params = params_from_options(&request.options).map_err(|e| format!("chatterbox: {e}"))?;
            let s = self.model.synthesize(request.text.as_str(), &params).map_err(|e| format!("chatterbox: {e}"))?;
            Ok(SynthesisOutput { samples: s.samples.into(), sample_rate: self.model.sample_rate(), timings: s.timings.into_stage_timings() })
        })
    }
}
