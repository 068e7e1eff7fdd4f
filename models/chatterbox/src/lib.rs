//! Chatterbox model-family plugin (`libtts_model_chatterbox.so`): Turbo and
//! Nano (GPT-2 T3, meanflow decoder) and Multilingual (guided Llama T3,
//! standard decoder with guidance).
//!
//! Layout: [`hparams`] (GGUF metadata, range-checked), [`tensors`] (the tensor
//! tables checked at load), [`text`] (normalisation, sentence split,
//! tokenizers), [`t3`] (speech-token models: graph builders, static K/V cache,
//! generation loops, the alignment analyzer), [`sampler`], [`speech_tokens`]
//! (text → speech tokens per variant), [`s3gen`] (flow encoder, CFM estimator,
//! HiFT graphs and host DSP), [`model`] (the synthesis loop), [`chunk_stream`]
//! (a chunk streamed as T3 generates, its S3Gen blocks beside T3 on a GPU). This file is the
//! plugin surface: option specs and the ABI glue.

pub mod chunk_stream;
pub mod cloner;
pub mod cloning;
pub mod convert;
pub mod dsp;
pub mod hparams;
pub mod memory;
pub mod model;
pub mod s3gen;
pub mod sampler;
pub mod speech_tokens;
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
    AudioSink, BackendHandle, ConvertOutput, ConvertRequest, ConvertedFile, ConverterInfo, LoadedModelInfo, MemoryPlan, MemoryPlanRequest, Model, ModelBox,
    ModelCatalog, ModelFamilyInfo, ModelLoadRequest, ModelPlugin, ModelPluginRef, Model_TO, OptionKind, OptionList, OptionSpec, OptionValue, PluginInfo,
    ProgressSink, StreamSummary, SynthesisOutput, SynthesisRequest, TokenTrace, VoiceCloneOutput, VoiceCloneRequest,
};
use engine_core::backend_kit::spec;
use engine_core::model_kit::Result;
use engine_core::model_kit::{guarded, Error, OpPolicy, OptionReader, PieceSender};
use model::{Chatterbox, SynthesisParams, VoiceSource};
use t3::guided::GuidanceMode;

#[export_root_module]
pub fn get_library() -> ModelPluginRef {
    ModelPlugin {
        info,
        family,
        option_specs,
        load,
        load_for_cloning: Some(load_for_cloning),
        converter: Some(converter),
        convert: Some(convert_checkpoint),
        plan_memory: Some(plan_memory),
    }
    .leak_into_prefix()
}

/// The converter from the official checkpoint directory (ABI 5.4; `tts
/// convert`, `tts pull`): [`convert`].
extern "C" fn converter() -> ConverterInfo {
    ConverterInfo {
        description: convert::DESCRIPTION.into(),
        marker_files: convert::MARKER_FILES.iter().map(|f| RString::from(*f)).collect(),
        options: convert::option_specs().into(),
    }
}

extern "C" fn convert_checkpoint(request: &ConvertRequest) -> RResult<ConvertOutput, RString> {
    guarded("chatterbox converter", || {
        let options = convert::ConvertOptions::from_list(&request.options)?;
        let done = convert::convert_with(std::path::Path::new(request.source.as_str()), std::path::Path::new(request.out_dir.as_str()), &options)?;
        Ok(ConvertOutput { files: done.files.iter().map(|f| ConvertedFile::new(&f.path, &f.summary)).collect(), variant: done.variant.name().into() })
    })
}

extern "C" fn info() -> PluginInfo {
    engine_core::abi::plugin_info("chatterbox", env!("CARGO_PKG_VERSION"), "Chatterbox Turbo / Nano / Multilingual text-to-speech (24 kHz)")
}

extern "C" fn family() -> ModelFamilyInfo {
    ModelFamilyInfo {
        family: "chatterbox".into(),
        architectures: RVec::from(vec![RString::from(hparams::T3_ARCH), RString::from(hparams::S3GEN_ARCH)]),
        variants: ["turbo", "nano", "mtl"].into_iter().map(RString::from).collect(),
    }
}

extern "C" fn option_specs() -> RVec<OptionSpec> {
    RVec::from(vec![
        spec(
            "reference_audio",
            OptionKind::Path,
            OptionValue::Str("".into()),
            "clone the voice of this recording (WAV, FLAC, MP3 or Ogg; Turbo/Nano: longer than 5 s; the first 60 s are read); the encoders run at every synthesis: save it once with `tts voice save` to skip them",
        ),
        spec("voice", OptionKind::Path, OptionValue::Str("".into()), "a voice file saved by `tts voice save` with this model (\"\" = the built-in voice)"),
        spec("seed", OptionKind::Int, OptionValue::Int(0), "seed of the token sampler and the vocoder noise, 0..=9223372036854775807"),
        spec(
            "language",
            OptionKind::Str,
            OptionValue::Str("en".into()),
            "language code: Multilingual speaks ar da de el en es fi fr hi it ko ms nl no pl pt sv sw tr (ja, zh, he, ru are refused: their reference preprocessing needs libraries this engine lacks); Turbo and Nano speak en",
        ),
        spec("temperature", OptionKind::Float, OptionValue::Float(0.8), "sampling temperature, 0..=5 (0 = greedy: the most likely token)"),
        spec("top_k", OptionKind::Int, OptionValue::Int(-1), "Turbo/Nano: keep the k most likely speech tokens, 0 = all (-1 = the default, 1000)"),
        spec("top_p", OptionKind::Float, OptionValue::Float(-1.0), "nucleus sampling mass, in (0, 1], 1 = off (-1 = the variant's default: Turbo 0.95, Multilingual 1)"),
        spec(
            "repetition_penalty",
            OptionKind::Float,
            OptionValue::Float(-1.0),
            "penalty on already generated tokens, 1..=10, 1 = off (-1 = the variant's default: Turbo 1.2, Multilingual 2)",
        ),
        spec("min_p", OptionKind::Float, OptionValue::Float(0.05), "Multilingual: drop tokens less likely than min_p times the most likely one, 0..=1 (0 = off)"),
        spec("cfg_weight", OptionKind::Float, OptionValue::Float(0.5), "Multilingual: classifier-free guidance weight of the speech-token model, 0..=1 (0 = unguided, one row)"),
        spec("exaggeration", OptionKind::Float, OptionValue::Float(0.5), "Multilingual: emotion exaggeration, 0..=2 (0.5 = neutral)"),
        spec(
            "guidance",
            OptionKind::Str,
            OptionValue::Str("batch".into()),
            "Multilingual: T3's two guidance rows as one batch (batch: the weights are read once per token) or one pass each (two-pass)",
        ),
        spec("max_new_tokens", OptionKind::Int, OptionValue::Int(1000), "speech tokens per chunk at most (25 per second of audio), 1..=8000"),
        spec("min_new_tokens", OptionKind::Int, OptionValue::Int(0), "no stop before this many speech tokens (fixed-length benchmarks; 0 = off)"),
        spec("max_chars", OptionKind::Int, OptionValue::Int(300), "split text longer than this at sentence ends (0 = never split)"),
        spec("crossfade_ms", OptionKind::Float, OptionValue::Float(20.0), "crossfade between chunks, 0..=500 ms"),
        spec(
            "speed",
            OptionKind::Float,
            OptionValue::Float(1.0),
            "speaking rate, 0.25..=4.0: the audio time-stretched at the same pitch (1 = the model's own rate, untouched)",
        ),
        spec(
            "stream_tokens",
            OptionKind::Int,
            OptionValue::Int(25),
            "streaming only: audio every this many speech tokens (1 s per 25; CosyVoice2's hop), 0 = per text chunk; 0..=1000",
        ),
        spec(
            "stream_first_tokens",
            OptionKind::Int,
            OptionValue::Int(10),
            "streaming only: speech tokens before the first audio (at most stream_tokens), 1..=1000",
        ),
        spec(
            "stream_context_tokens",
            OptionKind::Int,
            OptionValue::Int(50),
            "streaming only: speech tokens before each hop whose mel frames the mel decoder still attends to, besides the voice prompt's (bounds its cache), 0 = all of them; 0..=8000",
        ),
        spec(
            "stream_prompt_tokens",
            OptionKind::Int,
            OptionValue::Int(100),
            "streaming only: the voice prompt's last this many speech tokens (25 per second) condition the mel decoder: fewer bring the first audio sooner and sound less like one-shot; 0 = the whole prompt; 0..=8000",
        ),
        spec(
            "stream_cfm_steps",
            OptionKind::Int,
            OptionValue::Int(-1),
            "streaming only: Euler steps of the mel decoder, 1..=10 (-1 = 1 for Turbo/Nano, whose decoder was distilled for one step; Multilingual: cfm_steps)",
        ),
        spec(
            "stream_beside_t3",
            OptionKind::Bool,
            OptionValue::Bool(true),
            "streaming only, on a GPU: the mel decoder's and vocoder's blocks run on a thread and device stream of their own while T3 generates (false: between T3's steps, as on the CPU; the same samples)",
        ),
        spec("cfm_steps", OptionKind::Int, OptionValue::Int(-1), "Euler steps of the mel decoder, 1..=10 (-1 = the model's default: Turbo/Nano 2, Multilingual 10)"),
        spec(
            "draws",
            OptionKind::Path,
            OptionValue::Str("".into()),
            "debug: a directory of recorded random draws (t3_uniforms, cfm_z, sine_phase, sine_noise .npy) to inject",
        ),
    ])
}

/// Synthesis options from the host's validated list; ranges checked here.
pub fn params_from_options(options: &OptionList) -> Result<SynthesisParams> {
    let specs = option_specs();
    let o = OptionReader::new(options, &specs);
    let seed = o.int("seed")?;
    let seed = u64::try_from(seed).map_err(|_| Error::msg(format!("seed must be non-negative, got {seed}")))?;
    let temperature = o.float_in("temperature", 0.0..=5.0)? as f32;
    // -1 leaves the variant's default.
    let top_k = match o.int("top_k")? {
        -1 => None,
        _ => Some(o.count("top_k")?),
    };
    let top_p = match o.float("top_p")? {
        -1.0 => None,
        p if p > 0.0 && p <= 1.0 => Some(p),
        p => return Err(Error::msg(format!("top_p must be in (0, 1], got {p}"))),
    };
    let repetition_penalty = match o.float("repetition_penalty")? {
        -1.0 => None,
        _ => Some(o.float_in("repetition_penalty", 1.0..=10.0)? as f32),
    };
    let max_new_tokens = o.int_in("max_new_tokens", 1..=8000)? as usize;
    let min_new_tokens = o.count("min_new_tokens")?;
    let max_chars = o.count("max_chars")?;
    let crossfade_ms = o.float_in("crossfade_ms", 0.0..=500.0)? as f32;
    let speed = o.float_in("speed", engine_core::audio::stretch::SPEED_RANGE)? as f32;
    let stream_tokens = o.int_in("stream_tokens", 0..=1000)? as usize;
    let stream_first_tokens = o.int_in("stream_first_tokens", 1..=1000)? as usize;
    let steps = |key: &str| -> Result<Option<usize>> {
        match o.int(key)? {
            -1 => Ok(None),
            n if (1..=10).contains(&n) => Ok(Some(n as usize)),
            n => Err(Error::msg(format!("{key} must be in 1..=10 (or -1), got {n}"))),
        }
    };
    let (cfm_steps, stream_cfm_steps) = (steps("cfm_steps")?, steps("stream_cfm_steps")?);
    let voice = match (o.path("reference_audio")?, o.path("voice")?) {
        (Some(r), Some(v)) => return Err(Error::msg(format!("reference_audio ({}) and voice ({}) both name a voice; give one", r.display(), v.display()))),
        (Some(r), None) => VoiceSource::Reference(r),
        (None, Some(v)) => VoiceSource::Saved(v),
        (None, None) => VoiceSource::Builtin,
    };
    Ok(SynthesisParams {
        voice,
        temperature,
        top_k,
        top_p,
        repetition_penalty,
        min_p: o.float_in("min_p", 0.0..=1.0)? as f32,
        cfg_weight: o.float_in("cfg_weight", 0.0..=1.0)? as f32,
        exaggeration: o.float_in("exaggeration", 0.0..=2.0)? as f32,
        guidance: GuidanceMode::parse(&o.string("guidance")?)?,
        language: o.string("language")?,
        max_new_tokens,
        min_new_tokens,
        seed,
        max_chars,
        crossfade_ms,
        speed,
        stream_tokens,
        stream_first_tokens,
        stream_context_tokens: o.int_in("stream_context_tokens", 0..=8000)? as usize,
        stream_prompt_tokens: o.int_in("stream_prompt_tokens", 0..=8000)? as usize,
        stream_cfm_steps,
        stream_beside_t3: o.bool("stream_beside_t3")?,
        cfm_steps,
        draws: o.path("draws")?,
    })
}

/// Every ggml op a Chatterbox graph may use, under any policy (the census
/// test checks the graphs against it): a deny rule on one of these without a
/// kit fallback is a load error.
pub const GRAPH_OPS: &[&str] = &[
    "ADD",
    "CLAMP",
    "CONCAT",
    "CONT",
    "CONV_2D",
    "CONV_2D_DW",
    "CONV_TRANSPOSE_1D",
    "COS",
    "CPY",
    "DIV",
    "FLASH_ATTN_EXT",
    "GET_ROWS",
    "IM2COL",
    "LEAKY_RELU",
    "MEAN",
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
    "SQRT",
    "SUB",
    "SUM_ROWS",
    "TRANSPOSE",
    "UNARY",
    "VIEW",
];

/// What the Llama T3 (Multilingual) adds to [`GRAPH_OPS`]: a deny rule on one
/// of these refuses that T3 only.
pub const LLAMA_T3_OPS: &[&str] = &["GLU", "RMS_NORM", "ROPE"];

/// What voice cloning (the S3Tokenizer) adds to [`GRAPH_OPS`]: a deny rule on
/// one of these refuses cloning when its graph is built, not the model.
pub const CLONING_OPS: &[&str] = &["ROPE"];

/// The load-time checks of either Chatterbox file (T3 with its tokenizer, or
/// S3Gen) on a file image in memory (no device, no weights loaded): what the
/// fuzz targets drive.
pub fn check_model_bytes(bytes: &[u8]) -> Result<()> {
    let gguf = ggml_sys::gguf::GgufTensors::from_bytes(bytes, "model.gguf")?;
    let arch = gguf.file.get_str("general.architecture")?;
    if arch == hparams::S3GEN_ARCH {
        return s3gen::check_file(&gguf).map(|_| ());
    }
    let (hp, _) = t3::check_file(&gguf)?;
    let json = gguf.file.get_str("chatterbox.tokenizer_json")?;
    match hp.llama() {
        Some(_) => text::multilingual::MultilingualTokenizer::from_json(&json, hp.text_vocab).map(|_| ()),
        None => text::TextTokenizer::from_json(&json, hp.text_vocab).map(|_| ()),
    }
}

/// The voice-file checks (`--set voice=NAME.voice`) on a file image in memory,
/// for the model whose T3 and S3Gen hyperparameters are given: what the
/// `voice_file` fuzz target drives.
pub fn check_voice_bytes(bytes: &[u8], t3: &hparams::T3Hparams, s3: &hparams::S3GenHparams) -> Result<()> {
    let gguf = ggml_sys::gguf::GgufTensors::from_bytes(bytes, "voice.voice")?;
    cloning::voice_file::check(&gguf, "voice.voice", t3, s3).map(|_| ())
}

struct Plugin {
    model: Chatterbox,
}

/// The token streams a synthesis reports (`tts --print-tokens`, `tts
/// compare`): the speech tokens T3 produced (first, as before text ids were
/// reported) and the text ids it read, each one stream over all text chunks,
/// since where two runs first differ is what a comparison reports.
fn token_traces(text_ids: &[Vec<i32>], speech_tokens: &[Vec<u32>]) -> RVec<TokenTrace> {
    // Tokenizer ids index the text vocabulary: never negative.
    let ids: Vec<u32> = text_ids.iter().flatten().map(|&id| id as u32).collect();
    RVec::from(vec![
        TokenTrace { name: "speech_tokens".into(), tokens: speech_tokens.concat().into() },
        TokenTrace { name: "text_ids".into(), tokens: ids.into() },
    ])
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

/// The memory a load and a synthesis with the request's options need
/// (ABI 5.6; `tts fit`, the check before each load): [`memory::plan`] at the
/// longest chunk those options allow.
extern "C" fn plan_memory(request: &MemoryPlanRequest, handle: &BackendHandle) -> RResult<MemoryPlan, RString> {
    guarded("chatterbox memory plan", || {
        let files: Vec<std::path::PathBuf> = request.load.files.iter().map(|f| f.as_str().into()).collect();
        let policy = OpPolicy::from_resolved(&request.load.policies);
        let params = params_from_options(&request.options)?;
        Ok(memory::plan(&files, &handle.ggml_backend(), &policy, &params, None)?.0)
    })
}

/// `tts voice save`'s load: the voice encoder, CAMPPlus and the S3Tokenizer
/// only ([`cloner::Cloner`]).
extern "C" fn load_for_cloning(request: &ModelLoadRequest, handle: &BackendHandle) -> RResult<ModelBox, RString> {
    engine_core::logging::init_from_env();
    guarded("chatterbox", || {
        let files: Vec<std::path::PathBuf> = request.files.iter().map(|f| f.as_str().into()).collect();
        let policy = OpPolicy::from_resolved(&request.policies);
        let cloner = cloner::Cloner::load(&files, &handle.ggml_backend(), &policy)?;
        tracing::info!(variant = cloner.variant(), "chatterbox model loaded for voice cloning only");
        Ok(Model_TO::from_value(ClonerPlugin { cloner }, TD_Opaque))
    })
}

/// A model loaded by [`load_for_cloning`]: it clones and refuses the rest.
struct ClonerPlugin {
    cloner: cloner::Cloner,
}

impl Model for ClonerPlugin {
    fn info(&self) -> LoadedModelInfo {
        LoadedModelInfo { family: "chatterbox".into(), variant: self.cloner.variant().into(), sample_rate: self.cloner.sample_rate() }
    }

    /// Also what streaming answers (the trait's default streams `synthesize`).
    fn synthesize(&mut self, _request: &SynthesisRequest) -> RResult<SynthesisOutput, RString> {
        RResult::RErr("chatterbox: this model was loaded for voice cloning only (tts voice save); it does not synthesize".into())
    }

    fn catalog(&self) -> ModelCatalog {
        ModelCatalog { voices: RVec::new(), languages: languages(self.cloner.is_multilingual()), clones_voices: true }
    }

    fn clone_voice(&mut self, request: &VoiceCloneRequest) -> RResult<VoiceCloneOutput, RString> {
        guarded("chatterbox", || {
            let mut timings = engine_core::model_kit::Timings::default();
            let voice = self.cloner.save_voice(std::path::Path::new(request.reference.as_str()), &mut timings).map_err(|e| format!("chatterbox: {e}"))?;
            Ok(VoiceCloneOutput { voice: voice.into(), timings: timings.into_stage_timings() })
        })
    }
}

/// The language codes a model takes: Multilingual's 23 (English first),
/// English alone for Turbo and Nano.
fn languages(multilingual: bool) -> RVec<RString> {
    let languages: Vec<RString> = match multilingual {
        true => std::iter::once("en").chain(text::multilingual::LANGUAGES.iter().map(|(code, _)| *code).filter(|c| *c != "en")).map(RString::from).collect(),
        false => vec![RString::from("en")],
    };
    languages.into()
}

impl Plugin {
    fn stream(&mut self, request: &SynthesisRequest, mut out: PieceSender) -> RResult<StreamSummary, RString> {
        guarded("chatterbox", || {
            let params = params_from_options(&request.options).map_err(|e| format!("chatterbox: {e}"))?;
            let trace = self.model.synthesize_streaming(request.text.as_str(), &params, &mut out).map_err(|e| format!("chatterbox: {e}"))?;
            Ok(out.summary(self.model.sample_rate(), trace.timings.into_stage_timings(), token_traces(&trace.text_ids, &trace.speech_tokens)))
        })
    }
}

impl Model for Plugin {
    fn info(&self) -> LoadedModelInfo {
        LoadedModelInfo { family: "chatterbox".into(), variant: self.model.variant().into(), sample_rate: self.model.sample_rate() }
    }

    fn synthesize(&mut self, request: &SynthesisRequest) -> RResult<SynthesisOutput, RString> {
        guarded("chatterbox", || {
            let params = params_from_options(&request.options).map_err(|e| format!("chatterbox: {e}"))?;
            let s = self.model.synthesize(request.text.as_str(), &params).map_err(|e| format!("chatterbox: {e}"))?;
            Ok(SynthesisOutput {
                samples: s.samples.into(),
                sample_rate: self.model.sample_rate(),
                timings: s.timings.into_stage_timings(),
                tokens: token_traces(&s.text_ids, &s.speech_tokens),
            })
        })
    }

    /// One built-in voice (`voice = ""`); Multilingual's 23 languages
    /// (English first), English alone for Turbo and Nano.
    fn catalog(&self) -> ModelCatalog {
        ModelCatalog { voices: RVec::new(), languages: languages(self.model.is_multilingual()), clones_voices: true }
    }

    /// One piece per text chunk (the crossfade tail held for the next), or
    /// every `stream_tokens` speech tokens.
    fn synthesize_streaming(&mut self, request: &SynthesisRequest, sink: &AudioSink) -> RResult<StreamSummary, RString> {
        let rate = self.model.sample_rate();
        self.stream(request, PieceSender::to_sink(sink, rate))
    }

    /// The same, reporting each speech token T3 generates ("speech tokens",
    /// bounded by `max_new_tokens`) to `progress`, which may stop it.
    fn synthesize_with_progress(&mut self, request: &SynthesisRequest, sink: &AudioSink, progress: &ProgressSink) -> RResult<StreamSummary, RString> {
        let rate = self.model.sample_rate();
        self.stream(request, PieceSender::to_sinks(sink, progress, rate))
    }

    fn clone_voice(&mut self, request: &VoiceCloneRequest) -> RResult<VoiceCloneOutput, RString> {
        guarded("chatterbox", || {
            let mut timings = engine_core::model_kit::Timings::default();
            let voice = self.model.save_voice(std::path::Path::new(request.reference.as_str()), &mut timings).map_err(|e| format!("chatterbox: {e}"))?;
            Ok(VoiceCloneOutput { voice: voice.into(), timings: timings.into_stage_timings() })
        })
    }
}
