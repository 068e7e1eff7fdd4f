//! The parity suite, stage by stage, for one backend: each stage is fed the
//! reference's own inputs, so errors do not compound; the pipeline case then
//! runs end to end from text with the reference's draws injected.

use super::{check, npy, npy_i64, open, reference_dir, rel_err};
use engine_core::model_kit::npy::read_f32 as read_npy_f32;
use engine_core::model_kit::OpPolicy;
use tts_model_chatterbox::model::{Chatterbox, SynthesisParams};
use tts_model_chatterbox::s3gen::source::{apply_trim_fade, SourceNoise};
use tts_model_chatterbox::s3gen::S3Gen;
use tts_model_chatterbox::sampler::{SamplingParams, UniformSource};
use tts_model_chatterbox::t3::{self, TokenChoice, TokenLimits, T3};

/// Relative tolerances of one backend.
pub struct Tolerances {
    pub logits: f32,
    pub encoder: f32,
    pub cfm: f32,
    pub hift_body: f32,
    /// The waveform from the body's output (ISTFT head, clamp, trim fade).
    pub waveform: f32,
    /// The waveform from the mel through our own f0. The source's phase is a
    /// running sum over every sample, so f0's relative rounding is multiplied
    /// by the number of cycles (about 1000 here): None = reported, not bounded.
    pub waveform_from_mel: Option<f32>,
    /// Whether greedy and sampled token streams must match the reference exactly.
    pub exact_tokens: bool,
}

/// No bounds: every stage's error is printed (other conversions, quantized weights).
pub const REPORT: Tolerances = Tolerances {
    logits: f32::INFINITY,
    encoder: f32::INFINITY,
    cfm: f32::INFINITY,
    hift_body: f32::INFINITY,
    waveform: f32::INFINITY,
    waveform_from_mel: None,
    exact_tokens: false,
};

/// CPU: f32 throughout; the differences are summation order and libm.
pub const CPU: Tolerances =
    Tolerances { logits: 1e-4, encoder: 1e-5, cfm: 1e-5, hift_body: 1e-5, waveform: 1e-4, waveform_from_mel: Some(1e-3), exact_tokens: true };

pub use tts_model_chatterbox::model::transpose;

fn text_ids() -> Vec<i32> {
    npy_i64("t3_text_ids").into_iter().map(|v| v as i32).collect()
}

/// Max relative error of the teacher-forced rows: the prefill, then one row per fed token.
pub fn teacher_forced(t3: &mut T3) -> f32 {
    let (shape, reference) = npy("t3_tf_logits");
    let (rows, vocab) = (shape[0] as usize, shape[1] as usize);
    let tokens = npy_i64("t3_tf_tokens");
    let cond = t3.builtin_voice().unwrap();
    let mut worst = 0f32;
    let mut logits = t3.prefill(&cond, &text_ids(), rows).unwrap();
    for r in 0..rows {
        let e = rel_err(&logits, &reference[r * vocab..(r + 1) * vocab]);
        if e > worst {
            worst = e;
        }
        if r + 1 < rows {
            logits = t3.step(tokens[r] as u32).unwrap();
        }
    }
    worst
}

/// What a policy is called in the suites' reports.
pub fn describe(policy: &OpPolicy) -> String {
    format!(
        "{} attention, {} leaky_relu, {} conv_transpose_1d, weights {}",
        if policy.fused_attention { "fused" } else { "explicit" },
        if policy.native_leaky_relu { "native" } else { "composed" },
        if policy.native_conv_transpose_1d { "native" } else { "decomposed" },
        policy.matmul_weights.as_str()
    )
}

pub fn t3(backend: &str, policy: &OpPolicy, tol: &Tolerances) {
    let handle = open(backend);
    let mut t3 = T3::load(&super::t3_file(), handle.ggml_backend(), policy).unwrap();
    let e = teacher_forced(&mut t3);
    println!("  {backend} ({}): T3 teacher-forced logits rel err {e:.3e} (tolerance {:.0e})", describe(policy), tol.logits);
    assert!(e <= tol.logits, "teacher-forced logits differ by {e:.3e}");
    // A second sequence on the same cache must not see the first one.
    let e2 = teacher_forced(&mut t3);
    assert!(e2 <= tol.logits, "second run differs by {e2:.3e}");

    let cond = t3.builtin_voice().unwrap();
    let greedy: Vec<u32> = npy_i64("t3_greedy_tokens").into_iter().map(|v| v as u32).collect();
    let (tokens, _) = t3::generate(&mut t3, &cond, &text_ids(), &mut TokenChoice::Greedy, TokenLimits::at_most(greedy.len() - 1)).unwrap();
    let sampled: Vec<u32> = npy_i64("t3_sampled_tokens").into_iter().map(|v| v as u32).collect();
    let mut choice = TokenChoice::Sample(SamplingParams::default(), UniformSource::recorded(npy("t3_sampled_uniforms").1));
    let (drawn, _) = t3::generate(&mut t3, &cond, &text_ids(), &mut choice, TokenLimits::at_most(sampled.len() - 1)).unwrap();
    let agree = |a: &[u32], b: &[u32]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
    println!("  {backend}: greedy tokens agree for {}/{}, sampled for {}/{}", agree(&tokens, &greedy), greedy.len(), agree(&drawn, &sampled), sampled.len());
    if tol.exact_tokens {
        assert_eq!(tokens, greedy, "greedy tokens");
        assert_eq!(drawn, sampled, "sampled tokens with the reference's uniforms");
    }
}

fn s3gen(backend: &str, policy: &OpPolicy) -> (engine_core::abi::BackendHandle, S3Gen) {
    let handle = open(backend);
    let s3 = S3Gen::load(&super::fixture_dir().join("s3gen-meanflow.gguf"), handle.ggml_backend(), policy).unwrap();
    (handle, s3)
}

pub fn encoder(backend: &str, policy: &OpPolicy, tol: &Tolerances) {
    let (_handle, mut s3) = s3gen(backend, policy);
    let voice = s3.builtin_voice().unwrap();
    let mut tokens = voice.prompt_token.clone();
    tokens.extend(npy_i64("s3gen_tokens").into_iter().map(|v| v as i32));
    let out = s3.encode(&tokens).unwrap();
    let (shape, reference) = npy("s3gen_encoder_out");
    assert_eq!(shape, [1, out.frames as u64, s3.hp.encoder.n_embd as u64]);
    check(&format!("{backend} encoder output"), &out.hidden, &reference, tol.encoder);
    check(&format!("{backend} mu (encoder_proj)"), &out.mu, &npy("s3gen_mu").1, tol.encoder);
    check(&format!("{backend} speaker projection"), &s3.speaker_projection(&voice.embedding).unwrap(), &npy("s3gen_spks").1, tol.encoder);
}

pub fn cfm(backend: &str, policy: &OpPolicy, tol: &Tolerances) {
    let (_handle, mut s3) = s3gen(backend, policy);
    let mel = s3.hp.mel_channels;
    // Reference layouts: x, cond, v are (1, mel, T); mu is (1, T, mel); ours are [T][mel].
    let channel_major = |name: &str| {
        let (shape, v) = npy(name);
        transpose(&v, mel, shape[2] as usize)
    };
    let mu = npy("s3gen_mu").1;
    let spks = npy("s3gen_spks").1;
    let cond = channel_major("s3gen_cond");
    let steps = s3.hp.n_timesteps;
    for i in 0..steps {
        let x = channel_major(&format!("s3gen_cfm_step{i}_x"));
        let (t, r) = (i as f32 / steps as f32, (i + 1) as f32 / steps as f32);
        let v = s3.velocity(&x, &mu, &spks, &cond, t, r).unwrap();
        check(&format!("{backend} CFM step {i} velocity"), &v, &channel_major(&format!("s3gen_cfm_step{i}_v")), tol.cfm);
    }
    let x = s3.integrate(&channel_major("s3gen_z"), &mu, &spks, &cond, steps).unwrap();
    let (shape, reference) = npy("s3gen_mel");
    let generated = shape[2] as usize;
    let frames = x.len() / mel;
    let ours = transpose(&x[(frames - generated) * mel..], generated, mel);
    check(&format!("{backend} CFM output mel"), &ours, &reference, tol.cfm);
}

pub fn hift(backend: &str, policy: &OpPolicy, tol: &Tolerances) {
    let (_handle, mut s3) = s3gen(backend, policy);
    let (shape, mel) = npy("s3gen_mel");
    let mel = transpose(&mel, s3.hp.mel_channels, shape[2] as usize);
    let mut phase = npy("hift_sine_phase").1;
    phase[0] = 0.0;
    let draws = SourceNoise { phase, noise: npy("hift_sine_noise").1 };
    let f0 = npy("hift_f0").1;
    let source = npy("hift_source").1;
    check(&format!("{backend} HiFT f0"), &s3.predict_f0(&mel).unwrap(), &f0, tol.hift_body);
    check(&format!("{backend} HiFT source"), &s3.excitation(&f0, &draws).unwrap(), &source, 1e-5);
    let body = s3.hift_body(&mel, &source).unwrap();
    check(&format!("{backend} HiFT body (conv_post)"), &body, &npy("hift_conv_post").1, tol.hift_body);
    let hp = s3.hp.hift.clone();
    let wav = tts_model_chatterbox::s3gen::source::istft_head(&hp, &body).unwrap();
    check(&format!("{backend} HiFT waveform (reference source, host ISTFT)"), &wav, &npy("hift_wav").1, tol.waveform);
    let wav = s3.hift_waveform(&mel, &source).unwrap();
    check(&format!("{backend} HiFT waveform (reference source)"), &wav, &npy("hift_wav").1, tol.waveform);

    let out = s3.vocode(&mel, &draws).unwrap();
    let mut wav = out.wav.clone();
    apply_trim_fade(&mut wav, hp.trim_fade_samples);
    let reference = npy("s3gen_wav").1;
    match tol.waveform_from_mel {
        Some(t) => {
            check(&format!("{backend} waveform from the mel"), &wav, &reference, t);
        }
        None => {
            let e = rel_err(&wav, &reference);
            println!("  {backend} waveform from the mel   rel err {e:.3e} (reported: f0 rounding grows along the phase integral)");
            assert!(wav.iter().all(|v| v.is_finite() && v.abs() <= hp.audio_limit));
        }
    }
}

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    max_new_tokens: usize,
    speech_tokens: Vec<u32>,
}

/// `ChatterboxTurboTTS.generate(text)` with recorded draws against `synthesize(text)`.
pub fn pipeline(backend: &str, policy: &OpPolicy, tol: &Tolerances) {
    let handle = open(backend);
    let dir = super::fixture_dir();
    // Either order: the loader tells the files apart by architecture.
    let files = [dir.join("s3gen-meanflow.gguf"), super::t3_file()];
    let mut model = Chatterbox::load(&files, &handle.ggml_backend(), policy).unwrap();
    let draws = reference_dir().join("pipeline");
    let case: Case = serde_json::from_str(&std::fs::read_to_string(draws.join("case.json")).unwrap()).unwrap();
    let params = SynthesisParams { max_new_tokens: case.max_new_tokens, draws: Some(draws.clone()), ..SynthesisParams::default() };
    let out = model.synthesize(&case.text, &params).unwrap();
    assert_eq!(out.speech_tokens, vec![case.speech_tokens.clone()], "speech tokens");
    // Inputs and outputs go through pinned host memory where the policy asks and the device offers it.
    let staged = policy.pinned_host && handle.ggml_backend().device().and_then(|d| d.host_buffer_type()).is_some();
    for (name, graph) in model.t3.graphs().into_iter().chain(model.s3gen.graphs()) {
        assert_eq!(graph.is_staged(), staged, "{backend} {name}: host staging");
    }
    let reference = read_npy_f32(&draws.join("wav.npy")).unwrap();
    assert_eq!(out.samples.len(), reference.len(), "waveform length");
    match tol.waveform_from_mel {
        Some(t) => {
            check(&format!("{backend} waveform from text"), &out.samples, &reference, t);
        }
        None => println!("  {backend} waveform from text   rel err {:.3e} (reported)", rel_err(&out.samples, &reference)),
    }
}
