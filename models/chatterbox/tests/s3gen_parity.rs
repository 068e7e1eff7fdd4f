//! S3Gen parity on CPU against the reference run (`s3gen_*` dumps), each stage
//! fed the reference's own inputs.

mod common;

use common::{check, npy, npy_i64, open};
use tts_model_chatterbox::s3gen::source::{apply_trim_fade, SourceNoise};
use tts_model_chatterbox::s3gen::S3Gen;

const ENCODER_TOL: f32 = 1e-5;

#[test]
fn flow_encoder_and_speaker_projection_match_the_reference() {
    let handle = open("cpu");
    let mut s3 = S3Gen::load(&common::fixture_dir().join("s3gen-meanflow.gguf"), handle.ggml_backend()).unwrap();
    let voice = s3.builtin_voice().unwrap();
    let mut tokens = voice.prompt_token.clone();
    tokens.extend(npy_i64("s3gen_tokens").into_iter().map(|v| v as i32));
    let out = s3.encode(&tokens).unwrap();
    let (shape, reference) = npy("s3gen_encoder_out");
    assert_eq!(shape, [1, out.frames as u64, s3.hp.encoder.n_embd as u64]);
    check("encoder output", &out.hidden, &reference, ENCODER_TOL);
    check("mu (encoder_proj)", &out.mu, &npy("s3gen_mu").1, ENCODER_TOL);
    check("speaker projection", &s3.speaker_projection(&voice.embedding).unwrap(), &npy("s3gen_spks").1, ENCODER_TOL);
}

/// `[rows][cols]` → `[cols][rows]`.
fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..cols).flat_map(|c| (0..rows).map(move |r| v[r * cols + c])).collect()
}

#[test]
fn cfm_steps_and_integration_match_the_reference() {
    let handle = open("cpu");
    let mut s3 = S3Gen::load(&common::fixture_dir().join("s3gen-meanflow.gguf"), handle.ggml_backend()).unwrap();
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
        check(&format!("CFM step {i} velocity"), &v, &channel_major(&format!("s3gen_cfm_step{i}_v")), ENCODER_TOL);
    }
    let x = s3.integrate(&channel_major("s3gen_z"), &mu, &spks, &cond, steps).unwrap();
    let (shape, reference) = npy("s3gen_mel");
    let generated = shape[2] as usize;
    let frames = x.len() / mel;
    let ours = transpose(&x[(frames - generated) * mel..], generated, mel);
    check("CFM output mel", &ours, &reference, ENCODER_TOL);
}

#[test]
fn hift_matches_the_reference_with_injected_source_noise() {
    let handle = open("cpu");
    let mut s3 = S3Gen::load(&common::fixture_dir().join("s3gen-meanflow.gguf"), handle.ggml_backend()).unwrap();
    let mel_channels = s3.hp.mel_channels;
    let (shape, mel) = npy("s3gen_mel");
    let mel = transpose(&mel, mel_channels, shape[2] as usize);
    let mut phase = npy("hift_sine_phase").1;
    phase[0] = 0.0;
    let draws = SourceNoise { phase, noise: npy("hift_sine_noise").1 };
    let f0 = npy("hift_f0").1;
    let source = npy("hift_source").1;
    check("HiFT f0", &s3.predict_f0(&mel).unwrap(), &f0, 1e-5);
    // Stage by stage from the reference's inputs.
    check("HiFT source", &s3.excitation(&f0, &draws).unwrap(), &source, 1e-5);
    check("HiFT body (conv_post)", &s3.hift_body(&mel, &source).unwrap(), &npy("hift_conv_post").1, 1e-5);
    // End to end from the mel. The source's phase is a running sum over every
    // sample, so f0's last-bit differences grow along the signal (to ~1e-4).
    let out = s3.vocode(&mel, &draws).unwrap();
    check("HiFT source (our f0)", &out.source, &source, 1e-3);
    check("HiFT waveform", &out.wav, &npy("hift_wav").1, 1e-3);
    let mut wav = out.wav.clone();
    apply_trim_fade(&mut wav, s3.hp.hift.trim_fade_samples);
    check("S3Gen waveform (trim fade)", &wav, &npy("s3gen_wav").1, 1e-3);
}
