#![allow(dead_code)]
//! Shared by the parity tests. Stage-by-stage parity of the ggml Supertonic against the NumPy reference
//! (`tools/supertonic/reference.py`, itself checked against onnxruntime on the
//! same random-weight ONNX bundles), on the committed tiny fixtures
//! (`tests/fixtures/supertonic/<config>/`), through the CPU plugin and the
//! Vulkan plugin (lavapipe on CI).
//!
//! Each stage is fed the reference's own inputs, so errors do not compound;
//! the pipeline case then runs end to end from text and seed.
//! Error measure: max |ours − reference| / max |reference|.

use engine_core::abi::{BackendHandle, OptionValue};
use engine_core::loader;
use std::path::{Path, PathBuf};
use tts_model_supertonic::model::{transpose, NoiseSource, Supertonic, SynthesisParams, VoiceChoice};
use tts_model_supertonic::text::UnsupportedChars;
use tts_model_supertonic::voice::Voice;

/// Per-stage tolerances for one backend.
pub struct Tolerances {
    pub duration: f32,
    pub text_encoder: f32,
    pub ve_step: f32,
    pub ve_loop: f32,
    pub vocoder: f32,
    pub waveform: f32,
    /// Allowed difference of the trimmed length, samples.
    pub trim_samples: usize,
}

/// CPU: f32 throughout; the differences are summation order and libm.
pub const CPU: Tolerances = Tolerances { duration: 1e-4, text_encoder: 1e-4, ve_step: 1e-4, ve_loop: 1e-4, vocoder: 1e-4, waveform: 1e-4, trim_samples: 0 };
/// Vulkan: its f32 matrix products may round through f16 internally.
pub const VULKAN: Tolerances = Tolerances { duration: 2e-3, text_encoder: 2e-3, ve_step: 2e-3, ve_loop: 5e-3, vocoder: 2e-3, waveform: 5e-3, trim_samples: 1 };
/// CUDA: ggml-cuda's f32 matrix products run on tensor cores (TF32 inputs).
pub const CUDA: Tolerances = Tolerances { duration: 2e-3, text_encoder: 2e-3, ve_step: 2e-3, ve_loop: 5e-3, vocoder: 2e-3, waveform: 5e-3, trim_samples: 1 };

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn artifact_dir() -> PathBuf {
    std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().to_path_buf()
}

/// The plugin options the tests open `backend` with: a software Vulkan
/// device (lavapipe on CI) is allowed, the CPU takes two threads.
fn options(backend: &str) -> Vec<(&'static str, OptionValue)> {
    match backend {
        "vulkan" => vec![("allow_software", OptionValue::Bool(true))],
        _ => vec![("threads", OptionValue::Int(2))],
    }
}

/// Whether `backend` opens device 0 here; where not, the test says it is
/// skipped (see `loader::open_device_with_or_skip`).
pub fn available(backend: &str) -> bool {
    loader::open_device_with_or_skip(&artifact_dir().join(loader::backend_file_name(backend)), backend, options(backend)).is_some()
}

pub fn open(backend: &str) -> BackendHandle {
    let path = artifact_dir().join(loader::backend_file_name(backend));
    let options = options(backend);
    loader::open_backend_device(&path, options, 0).unwrap_or_else(|e| panic!("{e} (build the workspace first)"))
}

fn npy(path: &Path) -> (Vec<u64>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let f = npyz::NpyFile::new(&bytes[..]).unwrap();
    let shape = f.shape().to_vec();
    let values = match f.dtype().descr().trim_matches('\'') {
        "<f4" => f.into_vec::<f32>().unwrap(),
        "<f8" => f.into_vec::<f64>().unwrap().into_iter().map(|v| v as f32).collect(),
        "<i8" => f.into_vec::<i64>().unwrap().into_iter().map(|v| v as f32).collect(),
        other => panic!("{}: dtype {other}", path.display()),
    };
    (shape, values)
}

fn check(stage: &str, ours: &[f32], reference: &[f32], tol: f32) {
    let e = engine_core::compare::max_rel_err(ours, reference).unwrap_or_else(|e| panic!("{stage}: {e}"));
    println!("  {stage:<16} rel err {e:.3e} (tolerance {tol:.0e})");
    assert!(e <= tol, "{stage}: relative error {e:.3e} exceeds {tol:.0e}");
}

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    lang: String,
    voice: String,
    steps: usize,
    speed: f64,
    seed: u32,
    /// The frontend's policy for characters the indexer lacks (default: skip).
    #[serde(default)]
    unsupported_chars: Option<String>,
}

/// The tests of one binary run one at a time (two lavapipe devices driven from
/// parallel test threads corrupted the heap now and then).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs the fixture's cases on both graph paths: composed ops with explicit
/// attention (what deny rules fall back to), then native ops with fused attention.
pub fn run_fixture(backend: &str, config: &str, tol: &Tolerances) {
    use engine_core::model_kit::OpPolicy;
    for policy in [OpPolicy::reference(), OpPolicy::native(ggml_sys::TYPE_F32)] {
        println!("{backend} {config}: fused attention {}, native leaky_relu {}", policy.fused_attention, policy.native_leaky_relu);
        run_fixture_with(backend, config, tol, &policy);
    }
}

fn run_fixture_with(backend: &str, config: &str, tol: &Tolerances, policy: &engine_core::model_kit::OpPolicy) {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = repo_root().join("tests/fixtures/supertonic").join(config);
    let handle = open(backend);
    let mut model = Supertonic::load(&dir.join("model.gguf"), handle.ggml_backend(), policy).unwrap_or_else(|e| panic!("{e}"));
    let mut cases: Vec<PathBuf> =
        std::fs::read_dir(dir.join("reference")).unwrap().map(|e| e.unwrap().path()).filter(|p| p.join("latent.npy").is_file()).collect();
    cases.sort();
    assert!(!cases.is_empty(), "no reference cases in {}", dir.display());
    check_pipeline_cases(&mut model, &dir, backend, config, tol);
    let c = model.hp.latent_channels();
    let text_dim = model.hp.te.char_dim;
    for case_dir in cases {
        let case: Case = serde_json::from_str(&std::fs::read_to_string(case_dir.join("case.json")).unwrap()).unwrap();
        println!("{backend} {config} {}:", case_dir.file_name().unwrap().to_string_lossy());
        let load = |name: &str| npy(&case_dir.join(format!("{name}.npy")));
        let ids: Vec<i32> = load("text_ids").1.iter().map(|v| *v as i32).collect();
        assert_eq!(model.encode_text(&case.text, &case.lang, UnsupportedChars::Skip).unwrap().ids, ids, "text frontend ids");
        let voice = Voice { style_ttl: load("style_ttl").1, style_dp: load("style_dp").1 };

        let duration = model.duration(&ids, &voice).unwrap();
        check("duration", &[duration], &load("duration").1, tol.duration);

        let text_emb = model.text_encoder(&ids, &voice).unwrap();
        let (_, te_ref) = load("text_emb");
        let t = ids.len();
        check("text_encoder", &text_emb, &transpose(&te_ref, text_dim, t), tol.text_encoder);

        let (noise_shape, noise) = load("noise");
        let l = noise_shape[2] as usize;
        let mut first_step = Vec::new();
        let latent = model
            .denoise(&transpose(&noise, c, l), &transpose(&te_ref, text_dim, t), &voice, case.steps, |s, x, _| {
                if s == 0 {
                    first_step = x.to_vec();
                }
            })
            .unwrap();
        check("ve_step0", &first_step, &transpose(&load("ve_step0").1, c, l), tol.ve_step);
        let (_, latent_ref) = load("latent");
        check("ve_loop", &latent, &transpose(&latent_ref, c, l), tol.ve_loop);

        let wav_full = model.vocoder(&transpose(&latent_ref, c, l)).unwrap();
        check("vocoder", &wav_full, &load("wav_full").1, tol.vocoder);

        let out = model.synthesize(&case.text, &params(&case)).unwrap();
        let (_, wav) = load("wav");
        // The trim length is floor(rate · duration): a duration a few ulps away
        // (GPU) may land one sample off; the samples themselves must agree.
        let n = out.samples.len().min(wav.len());
        assert!(out.samples.len().abs_diff(wav.len()) <= tol.trim_samples, "waveform length {} vs reference {}", out.samples.len(), wav.len());
        check("waveform", &out.samples[..n], &wav[..n], tol.waveform);
    }
    // Inputs and outputs go through pinned host memory where the policy asks and the device offers it.
    let staged = policy.pinned_host && handle.ggml_backend().device().and_then(|d| d.host_buffer_type()).is_some();
    assert_eq!(model.graphs().len(), 4);
    for (name, graph) in model.graphs() {
        assert_eq!(graph.is_staged(), staged, "{backend} {name}: host staging");
    }
}

fn params(case: &Case) -> SynthesisParams {
    SynthesisParams {
        voice: VoiceChoice::Named(case.voice.clone()),
        language: case.lang.clone(),
        steps: Some(case.steps),
        speed: case.speed as f32,
        noise: NoiseSource::Seed(case.seed),
        unsupported_chars: UnsupportedChars::parse(case.unsupported_chars.as_deref().unwrap_or("skip")).unwrap(),
        stream_first_chars: 0,
    }
}

/// Whole-pipeline cases (long text: several chunks, silences, the final trim):
/// only the waveform is compared.
fn check_pipeline_cases(model: &mut Supertonic, dir: &Path, backend: &str, config: &str, tol: &Tolerances) {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(dir.join("reference"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("wav.npy").is_file() && !p.join("latent.npy").is_file())
        .collect();
    cases.sort();
    for case_dir in cases {
        let case: Case = serde_json::from_str(&std::fs::read_to_string(case_dir.join("case.json")).unwrap()).unwrap();
        println!("{backend} {config} {} (pipeline):", case_dir.file_name().unwrap().to_string_lossy());
        let out = model.synthesize(&case.text, &params(&case)).unwrap();
        let (_, wav) = npy(&case_dir.join("wav.npy"));
        assert!(out.samples.len().abs_diff(wav.len()) <= tol.trim_samples, "waveform length {} vs reference {}", out.samples.len(), wav.len());
        let n = out.samples.len().min(wav.len());
        check("waveform", &out.samples[..n], &wav[..n], tol.waveform);
    }
}
