//! Multilingual T3 parity on CPU against the reference run of
//! `chatterbox-tts==0.1.7` on the tiny random-weight fixture
//! (`tests/fixtures/chatterbox/mtl-tiny/`, from `tools/chatterbox/make_mtl_fixtures.py`
//! and `convert.py --variant mtl`): the perceiver and the conditioning, both
//! guidance rows' logits at the prefill and over 20 teacher-forced steps, the
//! aligned attention and the analyzer's verdicts, and the token streams of the
//! reference loop (greedy, and sampled with its recorded uniforms); the
//! standard S3Gen decoder's guided Euler steps.
//! Error measure: max |ours − ref| / max |ref|.

mod common;

use common::{open, rel_err};
use engine_core::model_kit::OpPolicy;
use ggml_sys::{TYPE_F16, TYPE_F32};
use std::path::{Path, PathBuf};
use tts_model_chatterbox::model::transpose;
use tts_model_chatterbox::s3gen::S3Gen;
use tts_model_chatterbox::sampler::{self, GuidedSamplingParams, UniformSource};
use tts_model_chatterbox::t3::alignment::AlignmentAnalyzer;
use tts_model_chatterbox::t3::guided::{self, Forward, GuidanceMode, GuidedChoice, GuidedT3};
use tts_model_chatterbox::t3::{T3Conditioning, TokenLimits};

const EXAGGERATION: f32 = 0.5;

/// Stated tolerances per backend: CPU meets the 1e-4 on every
/// stage; Vulkan's f32 products may round through f16 (lavapipe included).
#[derive(Clone, Copy)]
struct Tol {
    conditioning: f32,
    logits: f32,
    aligned: f32,
    /// Each guided CFM step (both estimator rows and the next state) and the final mel.
    cfm: f32,
}
const CPU: Tol = Tol { conditioning: 1e-4, logits: 1e-4, aligned: 1e-4, cfm: 1e-5 };
const VULKAN: Tol = Tol { conditioning: 2e-3, logits: 2e-3, aligned: 5e-3, cfm: 5e-3 };

/// The fixture: the committed tiny one, or `TTS_MTL_FIXTURE` (an absolute
/// path), a directory laid out the same way (`t3-mtl.gguf`, `s3gen.gguf`,
/// the reference dumps in `reference/`), e.g. a full-size conversion made on
/// demand (docs/models/chatterbox.md, "Multilingual").
fn dir() -> PathBuf {
    match std::env::var_os("TTS_MTL_FIXTURE") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/chatterbox/mtl-tiny"),
    }
}

/// (shape, values) of a reference dump of this fixture.
fn npy(name: &str) -> (Vec<u64>, Vec<f32>) {
    common::npy_in(&dir().join("reference"), name)
}

fn ints(name: &str) -> Vec<i64> {
    npy(name).1.into_iter().map(|v| v as i64).collect()
}

fn load(policy: &OpPolicy, handle: &engine_core::abi::BackendHandle) -> GuidedT3 {
    GuidedT3::load(&dir().join("t3-mtl.gguf"), handle.ggml_backend(), policy).unwrap()
}

fn text() -> Vec<i32> {
    ints("t3_text_ids").into_iter().map(|v| v as i32).collect()
}

fn reference_params() -> GuidedSamplingParams {
    GuidedSamplingParams { cfg_weight: 0.5, repetition_penalty: 2.0, temperature: 0.8, min_p: 0.05, top_p: 1.0 }
}

/// Prefill + 20 teacher-forced steps; every forward's two rows and aligned
/// attention against the reference. Returns the forwards and the worst errors.
fn teacher_forced(t3: &mut GuidedT3, voice: &T3Conditioning) -> (Vec<Forward>, f32, f32) {
    let (shape, logits) = npy("t3_tf_logits");
    let vocab = shape[2] as usize;
    let (_, aligned) = npy("t3_tf_aligned");
    let text_len = text().len();
    let given = ints("t3_tf_tokens");
    let mut forwards = vec![t3.prefill(voice, EXAGGERATION, &text(), true, 40).unwrap()];
    for &token in &given[..given.len() - 1] {
        forwards.push(t3.step(token as u32).unwrap());
    }
    let (mut worst_logits, mut worst_aligned) = (0f32, 0f32);
    let mut aligned_row = 0;
    for (i, f) in forwards.iter().enumerate() {
        assert_eq!(f.logits.len(), 2, "both guidance rows");
        for (r, row) in f.logits.iter().enumerate() {
            let at = (i * 2 + r) * vocab;
            worst_logits = worst_logits.max(rel_err(row, &logits[at..at + vocab]));
        }
        for row in &f.aligned {
            let at = aligned_row * text_len;
            worst_aligned = worst_aligned.max(rel_err(row, &aligned[at..at + text_len]));
            aligned_row += 1;
        }
    }
    assert_eq!(aligned_row, aligned.len() / text_len, "aligned rows read");
    (forwards, worst_logits, worst_aligned)
}

fn policies() -> [(&'static str, OpPolicy); 2] {
    [("reference ops, explicit attention", OpPolicy::reference()), ("native ops, fused attention", OpPolicy::native(TYPE_F32))]
}

#[test]
fn perceiver_and_conditioning_match_the_reference() {
    conditioning_suite("cpu", CPU);
}

fn conditioning_suite(backend: &str, tol: Tol) {
    let handle = open(backend);
    for (what, policy) in policies() {
        let mut t3 = load(&policy, &handle);
        let voice = t3.builtin_voice().unwrap();
        let (cond, perceiver) = t3.condition(&voice, EXAGGERATION).unwrap();
        let e_p = rel_err(&perceiver, &npy("t3_perceiver_out").1);
        let e_c = rel_err(&cond, &npy("t3_cond_emb").1);
        println!("  {backend}, {what}: perceiver rel err {e_p:.2e}, conditioning {e_c:.2e} (tolerance {:.0e})", tol.conditioning);
        assert!(e_p <= tol.conditioning && e_c <= tol.conditioning);
        assert_eq!(t3.condition(&voice, EXAGGERATION).unwrap().0.len(), 0, "the same voice stays cached");
    }
}

#[test]
fn guided_logits_and_aligned_attention_match_the_reference() {
    logits_suite("cpu", CPU);
}

fn logits_suite(backend: &str, tol: Tol) {
    let handle = open(backend);
    for (what, policy) in policies() {
        for mode in [GuidanceMode::Batched, GuidanceMode::TwoPass] {
            let mut t3 = load(&policy, &handle);
            t3.mode = mode;
            let voice = t3.builtin_voice().unwrap();
            let (_, e_logits, e_aligned) = teacher_forced(&mut t3, &voice);
            println!(
                "  {backend}, {what}, {mode:?}: logits (prefill + 20 steps, both rows) rel err {e_logits:.2e} (tolerance {:.0e}), aligned attention {e_aligned:.2e} ({:.0e})",
                tol.logits, tol.aligned
            );
            assert!(e_logits <= tol.logits && e_aligned <= tol.aligned);
        }
    }
}

#[test]
fn a_half_precision_cache_drifts_little() {
    let handle = open("cpu");
    let mut t3 = load(&OpPolicy::native(TYPE_F16), &handle);
    let voice = t3.builtin_voice().unwrap();
    let (_, e_logits, e_aligned) = teacher_forced(&mut t3, &voice);
    println!("  F16 K/V: logits rel err {e_logits:.2e}, aligned {e_aligned:.2e} (tolerance 1e-2)");
    assert!(e_logits <= 1e-2 && e_aligned <= 1e-2);
}

#[test]
fn the_analyzer_suppresses_and_forces_the_stop_as_the_reference() {
    let handle = open("cpu");
    let mut t3 = load(&OpPolicy::reference(), &handle);
    let voice = t3.builtin_voice().unwrap();
    let (forwards, ..) = teacher_forced(&mut t3, &voice);
    let stop = t3.hp.stop_speech_token;
    let (ref_stop, forced) = (npy("t3_tf_stop_logit").1, npy("t3_tf_forced").1);
    let given = ints("t3_tf_tokens");
    let mut analyzer = AlignmentAnalyzer::new(text().len(), stop);
    for (i, f) in forwards.iter().enumerate() {
        let mut logits = sampler::combine_guidance(&f.logits[0], &f.logits[1], 0.5);
        let last = if i == 0 { t3.hp.start_speech_token } else { given[i - 1] as u32 };
        let verdict = analyzer.step(&mut logits, &f.aligned, last);
        assert_eq!(logits[stop as usize], ref_stop[i], "step {i}: the stop token's logit");
        assert_eq!(verdict.stop_forced, forced[i] == 1.0, "step {i}: forced");
    }
    assert!(forced.contains(&1.0), "the fixture repeats a token, so the stop is forced once");
}

#[test]
fn token_streams_match_the_reference_loop() {
    token_suite("cpu", true);
}

/// The reference loop's streams; where `exact` is false (Vulkan) they are
/// reported, since a flip between two near-equal logits is legitimate there,
/// but batch and two passes must still agree with each other.
fn token_suite(backend: &str, exact: bool) {
    let handle = open(backend);
    for (what, policy) in policies() {
        let mut t3 = load(&policy, &handle);
        let voice = t3.builtin_voice().unwrap();
        let params = reference_params();
        let (greedy, _) = guided::generate(&mut t3, &voice, EXAGGERATION, &text(), &params, &mut GuidedChoice::Greedy, TokenLimits::at_most(40)).unwrap();
        let expected: Vec<u32> = ints("t3_greedy_tokens").into_iter().map(|t| t as u32).collect();
        let same_greedy = matching_prefix(&greedy, &expected);
        let uniforms = npy("t3_sampled_uniforms").1;
        let mut choice = GuidedChoice::Sample(UniformSource::recorded(uniforms));
        let (sampled, _) = guided::generate(&mut t3, &voice, EXAGGERATION, &text(), &params, &mut choice, TokenLimits::at_most(40)).unwrap();
        let expected_sampled: Vec<u32> = ints("t3_sampled_tokens").into_iter().map(|t| t as u32).collect();
        let same_sampled = matching_prefix(&sampled, &expected_sampled);
        println!("  {backend}, {what}: greedy {same_greedy}/{} and sampled {same_sampled}/{} tokens as the reference", expected.len(), expected_sampled.len());
        if exact {
            assert_eq!(greedy, expected, "{what}: greedy tokens");
            assert_eq!(sampled, expected_sampled, "{what}: sampled tokens");
        }
        t3.mode = GuidanceMode::TwoPass;
        let (two_pass, _) = guided::generate(&mut t3, &voice, EXAGGERATION, &text(), &params, &mut GuidedChoice::Greedy, TokenLimits::at_most(40)).unwrap();
        assert_eq!(two_pass, greedy, "{what}: two passes give the batch's tokens");
    }
}

fn matching_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[test]
fn standard_cfm_steps_with_guidance_match_the_reference() {
    cfm_suite("cpu", CPU);
}

/// The cosine schedule, each of the 10 guided Euler steps (the batch of two
/// estimator rows, the combined next state) from the reference's state, and
/// the whole integration from the recorded noise.
fn cfm_suite(backend: &str, tol: Tol) {
    cfm_suite_on(backend, "s3gen.gguf", tol.cfm);
}

/// A conversion with the decoder's matrices and kernels in BF16
/// (`convert.py --decoder-weights bf16`): the drift against the F32
/// reference, bounded at 3e-2 per stage.
#[test]
fn a_bf16_decoder_drifts_little() {
    cfm_suite_on("cpu", "s3gen-bf16-decoder.gguf", 3e-2);
}

fn cfm_suite_on(backend: &str, file: &str, tol: f32) {
    let handle = open(backend);
    for (what, policy) in policies() {
        let mut s3 = S3Gen::load(&dir().join(file), handle.ggml_backend(), &policy).unwrap();
        assert!(!s3.hp.meanflow);
        let mel = s3.hp.mel_channels;
        // Reference layouts: x, cond, v are (rows, mel, T); mu is (1, T, mel); ours are [T][mel] per row.
        let by_frame = |name: &str| -> Vec<Vec<f32>> {
            let (shape, v) = npy(name);
            let frames = shape[2] as usize;
            v.chunks(mel * frames).map(|row| transpose(row, mel, frames)).collect()
        };
        let (mu, spks, cond) = (npy("s3gen_mu").1, npy("s3gen_spks").1, by_frame("s3gen_cond").remove(0));
        let steps = s3.hp.n_timesteps;
        let schedule = s3.schedule(steps);
        let t_ref = npy("s3gen_cfm_t").1;
        let e_t = schedule[..steps].iter().zip(&t_ref).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(e_t <= 1.2e-7, "cosine schedule differs by {e_t:.2e}");
        let (mut worst_rows, mut worst_state) = (0f32, 0f32);
        for i in 0..steps {
            let x = by_frame(&format!("s3gen_cfm_step{i}_x")).remove(0);
            let [v_cond, v_uncond] = s3.guided_velocities(&x, &mu, &spks, &cond, schedule[i]).unwrap();
            let reference = by_frame(&format!("s3gen_cfm_step{i}_v"));
            worst_rows = worst_rows.max(rel_err(&v_cond, &reference[0])).max(rel_err(&v_uncond, &reference[1]));
            let v = tts_model_chatterbox::s3gen::cfm::combine_guidance(&v_cond, &v_uncond, s3.hp.cfg_rate);
            let dt = schedule[i + 1] - schedule[i];
            let next: Vec<f32> = x.iter().zip(&v).map(|(a, b)| a + dt * b).collect();
            let next_ref = if i + 1 < steps {
                by_frame(&format!("s3gen_cfm_step{}_x", i + 1)).remove(0)
            } else {
                let (shape, m) = npy("s3gen_mel");
                let prompt_frames = next.len() / mel - shape[2] as usize;
                let mut full = next[..prompt_frames * mel].to_vec();
                full.extend(transpose(&m, mel, shape[2] as usize));
                full
            };
            worst_state = worst_state.max(rel_err(&next, &next_ref));
        }
        let z = by_frame("s3gen_z").remove(0);
        let x = s3.integrate(&z, &mu, &spks, &cond, steps).unwrap();
        let (shape, m) = npy("s3gen_mel");
        let generated = shape[2] as usize;
        let e_mel = rel_err(&x[x.len() - generated * mel..], &transpose(&m, mel, generated));
        println!(
            "  {backend}, {file}, {what}: schedule |dt| {e_t:.1e}; per step: estimator rows rel err {worst_rows:.2e}, next state {worst_state:.2e}; mel after {steps} steps {e_mel:.2e} (tolerance {:.0e})",
            tol
        );
        assert!(worst_rows <= tol && worst_state <= tol && e_mel <= tol);
    }
}

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    language: String,
    exaggeration: f32,
    cfg_weight: f32,
    max_new_tokens: usize,
    speech_tokens: Vec<u32>,
}

#[test]
fn text_to_waveform_with_recorded_draws_matches_generate() {
    pipeline_suite("cpu", Some(1e-3));
}

/// `ChatterboxMultilingualTTS.generate` with its draws recorded against
/// `synthesize` with them injected: the same speech tokens, and the waveform
/// within `wave_tol` (None: reported, as on Vulkan, where f0 rounding becomes
/// phase drift along HiFT's source).
fn pipeline_suite(backend: &str, wave_tol: Option<f32>) {
    use tts_model_chatterbox::model::{Chatterbox, SynthesisParams};
    let handle = open(backend);
    // Either order: the loader tells the files apart by architecture.
    let files = [dir().join("s3gen.gguf"), dir().join("t3-mtl.gguf")];
    let mut model = Chatterbox::load(&files, &handle.ggml_backend(), &OpPolicy::reference()).unwrap();
    assert_eq!(model.variant(), "mtl");
    let draws = dir().join("reference/pipeline");
    let case: Case = serde_json::from_str(&std::fs::read_to_string(draws.join("case.json")).unwrap()).unwrap();
    let params = SynthesisParams {
        language: case.language.clone(),
        exaggeration: case.exaggeration,
        cfg_weight: case.cfg_weight,
        max_new_tokens: case.max_new_tokens,
        draws: Some(draws.clone()),
        ..SynthesisParams::default()
    };
    let out = model.synthesize(&case.text, &params).unwrap();
    assert_eq!(out.speech_tokens, vec![case.speech_tokens.clone()], "{backend}: speech tokens");
    let reference = engine_core::model_kit::npy::read_f32(&draws.join("wav.npy")).unwrap();
    assert_eq!(out.samples.len(), reference.len(), "{backend}: waveform length");
    let e = rel_err(&out.samples, &reference);
    match wave_tol {
        Some(tol) => {
            println!("  {backend}: waveform from text rel err {e:.2e} (tolerance {tol:.0e})");
            assert!(e <= tol);
        }
        None => println!("  {backend}: waveform from text rel err {e:.2e} (reported)"),
    }
    for stage in ["t3.prefill", "t3.decode", "s3gen.encoder", "s3gen.cfm", "hift"] {
        assert!(out.timings.get(stage).is_some(), "{stage} timed");
    }
}

/// The suite on the Vulkan plugin (lavapipe on CI, software devices
/// allowed), in one test so one device serves it from one thread.
#[test]
fn mtl_suite_on_vulkan() {
    conditioning_suite("vulkan", VULKAN);
    logits_suite("vulkan", VULKAN);
    token_suite("vulkan", false);
    cfm_suite("vulkan", VULKAN);
    cfm_suite_on("vulkan", "s3gen-bf16-decoder.gguf", 3e-2);
    pipeline_suite("vulkan", None);
}

/// The suite on the CUDA plugin where a CUDA module and device exist (the
/// GPU host, `bench/gpu_host.sh decode_fusion`); elsewhere it says it is
/// skipped. ggml-cuda's f32 products take TF32 inputs: Vulkan's tolerances.
#[test]
fn mtl_suite_on_cuda() {
    if !common::available("cuda") {
        return;
    }
    conditioning_suite("cuda", VULKAN);
    logits_suite("cuda", VULKAN);
    token_suite("cuda", false);
    cfm_suite("cuda", VULKAN);
    pipeline_suite("cuda", None);
}

#[test]
fn the_llama_graphs_use_only_declared_ops_and_deny_rules_refuse_it() {
    use engine_core::model_kit::census::{all_on_denying, assert_declared, census, StageNodes};
    let handle = open("cpu");
    for policy in [OpPolicy::reference(), OpPolicy::native(TYPE_F32)] {
        let mut t3 = load(&policy, &handle);
        let voice = t3.builtin_voice().unwrap();
        guided::generate(&mut t3, &voice, EXAGGERATION, &text(), &reference_params(), &mut GuidedChoice::Greedy, TokenLimits::at_most(3)).unwrap();
        let nodes: StageNodes = t3.graphs().into_iter().map(|(s, g)| (s, census(g))).collect();
        assert_eq!(nodes.len(), 3, "conditioning, text and step graphs built");
        let declared: Vec<&str> = tts_model_chatterbox::GRAPH_OPS.iter().chain(tts_model_chatterbox::LLAMA_T3_OPS).copied().collect();
        assert_declared(&nodes, &declared);
    }
    let policy = OpPolicy::from_resolved(&all_on_denying(&["ROPE"]));
    let e = GuidedT3::load(&dir().join("t3-mtl.gguf"), handle.ggml_backend(), &policy).err().unwrap();
    assert_eq!(e.to_string(), "ROPE is denied on this device by deny rule 1 (device \"CPU\"): census, and chatterbox has no fallback for it");
}
