//! A minimal model-family plugin used by the tests to exercise the model ABI end
//! to end: the host picks it by `general.architecture`, validates `[synthesis]`
//! against its option specs, and hands it a `BackendHandle` created by a backend
//! plugin; it reads its hparams from GGUF metadata and computes its waveform with a
//! ggml graph on that backend. Output: `gain * sin(2π f n / rate)` for 0.1 s per
//! character of text.

use abi_stable::{
    export_root_module,
    prefix_type::PrefixTypeTrait,
    sabi_trait::TD_Opaque,
    std_types::{RResult, RString, RVec},
};
use engine_core::abi::{
    find_option, BackendHandle, LoadedModelInfo, ModelFamilyInfo, ModelLoadRequest, OptionKind, OptionSpec, OptionValue, PluginInfo, StageTiming,
    SynthesisOutput, SynthesisRequest,
};
// With `abi-5-1` the plugin is what a build against ABI 5.1 was: its root
// module and model trait of then, no streaming.
#[cfg(feature = "abi-5-1")]
use engine_core::abi::v5_1::{Model, ModelBox, ModelPlugin, ModelPluginRef, Model_TO};
// With `abi-5-2`: the root module of 5.2, before `load_for_cloning`, and
// the model trait of 5.2 to 5.4 (streaming, no progress).
#[cfg(feature = "abi-5-2")]
use engine_core::abi::v5_2::{ModelPlugin, ModelPluginRef};
// With `abi-5-3`: the root module of 5.3, before the converter.
#[cfg(feature = "abi-5-3")]
use engine_core::abi::v5_3::{ModelPlugin, ModelPluginRef};
// With `abi-5-5`: the root module of 5.5, before `plan_memory`.
#[cfg(feature = "abi-5-5")]
use engine_core::abi::v5_5::{ModelPlugin, ModelPluginRef};
// With `abi-5-4`: the root module of 5.4, before the model's
// `synthesize_with_progress`.
#[cfg(any(feature = "abi-5-2", feature = "abi-5-3", feature = "abi-5-4"))]
use engine_core::abi::v5_2::{Model, ModelBox, Model_TO};
#[cfg(feature = "abi-5-4")]
use engine_core::abi::v5_4::{ModelPlugin, ModelPluginRef};
#[cfg(not(feature = "abi-5-1"))]
use engine_core::abi::{AudioSink, StreamSummary};
#[cfg(not(any(feature = "abi-5-1", feature = "abi-5-2", feature = "abi-5-3", feature = "abi-5-4")))]
use engine_core::abi::{Model, ModelBox, Model_TO};
#[cfg(not(any(feature = "abi-5-1", feature = "abi-5-2", feature = "abi-5-3", feature = "abi-5-4", feature = "abi-5-5")))]
use engine_core::abi::{ModelPlugin, ModelPluginRef};
use engine_core::backend_kit::spec;
use ggml_sys::gguf::GgufFile;
use ggml_sys::{Backend, Context, TYPE_F32};

#[cfg(not(any(feature = "abi-5-1", feature = "abi-5-2", feature = "abi-5-3")))]
mod converter;

pub const ARCH: &str = "tts-test-tone";

#[export_root_module]
pub fn get_library() -> ModelPluginRef {
    #[cfg(any(feature = "abi-5-1", feature = "abi-5-2"))]
    let plugin = ModelPlugin { info, family, option_specs, load };
    // No cloning-only load: the host clones with the full model.
    #[cfg(feature = "abi-5-3")]
    let plugin = ModelPlugin { info, family, option_specs, load, load_for_cloning: None };
    #[cfg(any(feature = "abi-5-4", feature = "abi-5-5"))]
    let plugin = ModelPlugin { info, family, option_specs, load, load_for_cloning: None, converter: Some(converter::info), convert: Some(converter::convert) };
    // No memory plan: `tts fit` reports that the family sizes nothing.
    #[cfg(not(any(feature = "abi-5-1", feature = "abi-5-2", feature = "abi-5-3", feature = "abi-5-4", feature = "abi-5-5")))]
    let plugin = ModelPlugin {
        info,
        family,
        option_specs,
        load,
        load_for_cloning: None,
        converter: Some(converter::info),
        convert: Some(converter::convert),
        plan_memory: None,
    };
    plugin.leak_into_prefix()
}

extern "C" fn info() -> PluginInfo {
    engine_core::abi::plugin_info("tone", env!("CARGO_PKG_VERSION"), "test fixture: sine tone on a ggml backend")
}

extern "C" fn family() -> ModelFamilyInfo {
    ModelFamilyInfo { family: "tone".into(), architectures: RVec::from(vec![RString::from(ARCH)]), variants: RVec::from(vec![RString::from("sine")]) }
}

extern "C" fn option_specs() -> RVec<OptionSpec> {
    RVec::from(vec![
        spec("gain", OptionKind::Float, OptionValue::Float(0.5), "amplitude"),
        spec("fail", OptionKind::Bool, OptionValue::Bool(false), "return an error from synthesize (tests)"),
        spec("panic", OptionKind::Bool, OptionValue::Bool(false), "panic inside synthesize (tests: the guard turns it into an error)"),
    ])
}

struct Hparams {
    sample_rate: u32,
    frequency: f32,
}

struct Tone {
    hparams: Hparams,
    /// Borrowed from the host's BackendHandle, which outlives the model.
    backend: Backend,
}

extern "C" fn load(request: &ModelLoadRequest, handle: &BackendHandle) -> RResult<ModelBox, RString> {
    let result = (|| -> Result<ModelBox, String> {
        let path = request.files.first().ok_or("no model file")?;
        let gguf = GgufFile::open(std::path::Path::new(path.as_str())).map_err(|e| e.to_string())?;
        let hparams = Hparams {
            sample_rate: gguf.get_u32(&format!("{ARCH}.sample_rate")).map_err(|e| e.to_string())?,
            frequency: gguf.get_f32(&format!("{ARCH}.frequency")).map_err(|e| e.to_string())?,
        };
        let backend = handle.ggml_backend();
        Ok(Model_TO::from_value(Tone { hparams, backend }, TD_Opaque))
    })();
    result.map_err(RString::from).into()
}

impl Model for Tone {
    fn info(&self) -> LoadedModelInfo {
        LoadedModelInfo { family: "tone".into(), variant: "sine".into(), sample_rate: self.hparams.sample_rate }
    }

    fn synthesize(&mut self, request: &SynthesisRequest) -> RResult<SynthesisOutput, RString> {
        engine_core::model_kit::guarded("tone model", || self.synthesize_guarded(request))
    }

    /// One piece per character (0.1 s each), stopping when the sink says so.
    #[cfg(not(feature = "abi-5-1"))]
    fn synthesize_streaming(&mut self, request: &SynthesisRequest, sink: &AudioSink) -> RResult<StreamSummary, RString> {
        engine_core::model_kit::guarded("tone model", || {
            let output = self.synthesize_guarded(request)?;
            let rate = output.sample_rate;
            let mut summary = StreamSummary { sample_rate: rate, timings: output.timings.clone(), ..StreamSummary::default() };
            for piece in output.samples.chunks(rate as usize / 10) {
                summary.pieces += 1;
                summary.samples += piece.len() as u64;
                if !sink.send(piece, rate) {
                    summary.cancelled = true;
                    break;
                }
            }
            Ok(summary)
        })
    }
}

impl Tone {
    fn synthesize_guarded(&self, request: &SynthesisRequest) -> engine_core::model_kit::Result<SynthesisOutput> {
        if matches!(find_option(&request.options, "fail"), Some(OptionValue::Bool(true))) {
            return Err("tone model: synthesis failed on request".into());
        }
        if matches!(find_option(&request.options, "panic"), Some(OptionValue::Bool(true))) {
            let empty: Vec<f32> = Vec::new();
            let _ = empty[request.text.len()];
        }
        let gain = match find_option(&request.options, "gain") {
            Some(OptionValue::Float(g)) => *g as f32,
            _ => 0.5,
        };
        let start = std::time::Instant::now();
        let n = request.text.chars().count() * self.hparams.sample_rate as usize / 10;
        let result = (|| -> ggml_sys::Result<Vec<f32>> {
            let ctx = Context::new_no_alloc(4, 8)?;
            let index = ctx.new_tensor(TYPE_F32, &[n as i64])?;
            let phase = ctx.scale(index, std::f32::consts::TAU * self.hparams.frequency / self.hparams.sample_rate as f32)?;
            let wave = ctx.scale(ctx.sin(phase)?, gain)?;
            let mut graph = ctx.new_graph(8)?;
            graph.build_forward(wave);
            let _buffer = self.backend.alloc_ctx_tensors(&ctx)?;
            index.set_f32(&(0..n).map(|i| i as f32).collect::<Vec<_>>())?;
            self.backend.compute(&graph)?;
            wave.get_f32()
        })();
        let samples = result.map_err(|e| format!("tone model: {e}"))?;
        Ok(SynthesisOutput {
            samples: samples.into(),
            sample_rate: self.hparams.sample_rate,
            timings: RVec::from(vec![StageTiming { stage: "tone".into(), ms: start.elapsed().as_secs_f64() * 1e3 }]),
            tokens: RVec::new(),
        })
    }
}
