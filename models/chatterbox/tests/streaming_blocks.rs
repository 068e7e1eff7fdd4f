//! S3Gen over speech tokens in blocks, carrying its state (`s3gen::blocks`),
//! on the tiny Turbo fixture: one block is the one-shot encoder and CFM;
//! several blocks match the reference's encoder and decoder run under the
//! same block-causal mask (`tools/chatterbox/stream_reference.py`), and a
//! block never depends on the tokens after it (beyond the lookahead).

mod common;

use common::{check, fixture_dir, npy_i64, npy_i64_in, npy_in, open, rel_err};
use engine_core::model_kit::OpPolicy;
use ggml_sys::TYPE_F32;
use std::path::{Path, PathBuf};
use tts_model_chatterbox::model::transpose;
use tts_model_chatterbox::s3gen::blocks::{BlockStream, StreamShape};
use tts_model_chatterbox::s3gen::S3Gen;

fn policies() -> [OpPolicy; 2] {
    [OpPolicy::reference(), OpPolicy::native(TYPE_F32)]
}

fn load(policy: &OpPolicy) -> (engine_core::abi::BackendHandle, S3Gen) {
    let handle = open("cpu");
    let s3 = S3Gen::load(&fixture_dir().join("s3gen-meanflow.gguf"), handle.ggml_backend(), policy).unwrap();
    (handle, s3)
}

/// The built-in voice's prompt tokens, then the fixture's speech tokens.
fn sequence(s3: &S3Gen) -> Vec<i32> {
    let mut tokens = s3.builtin_voice().unwrap().prompt_token;
    tokens.extend(npy_i64("s3gen_tokens").into_iter().map(|v| v as i32));
    tokens
}

/// A stream of `tokens` whose CFM sees every frame before a block.
fn every_frame(tokens: usize, steps: usize) -> StreamShape {
    StreamShape { prompt_tokens: 0, max_codes: tokens, first: 1, hop: 1, context_tokens: 0, steps }
}

/// Gaussian-ish deterministic values (the test's own noise; any values do).
fn noise(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32 / (1 << 24) as f32 - 0.5) * 3.0).collect()
}

/// Encoder and CFM over `ends` (token block ends), each block's inputs cut
/// from the whole sequence's: the mel over every frame.
fn streamed(s3: &mut S3Gen, tokens: &[i32], ends: &[usize], z: &[f32], steps: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let voice = s3.builtin_voice().unwrap();
    let mel = s3.hp.mel_channels;
    let spks = s3.speaker_projection(&voice.embedding).unwrap();
    let mut stream = BlockStream::new(s3, &every_frame(tokens.len(), steps)).unwrap();
    let (mut hidden, mut mu, mut x) = (Vec::new(), Vec::new(), Vec::new());
    let mut frame = 0;
    for &end in ends {
        let out = stream.encode(s3, tokens, end).unwrap();
        let frames = out.frames;
        let feat = &voice.prompt_feat;
        let cond: Vec<f32> = (frame * mel..(frame + frames) * mel).map(|i| feat.get(i).copied().unwrap_or(0.0)).collect();
        let block_x = stream.integrate(s3, &z[frame * mel..(frame + frames) * mel], &out.mu, &spks, &cond, None).unwrap();
        hidden.extend(out.hidden);
        mu.extend(out.mu);
        x.extend(block_x);
        frame += frames;
    }
    (hidden, mu, x)
}

#[test]
fn one_block_is_the_one_shot_encoder_and_cfm() {
    for policy in policies() {
        let (_handle, mut s3) = load(&policy);
        let tokens = sequence(&s3);
        let one_shot = s3.encode(&tokens).unwrap();
        let mel = s3.hp.mel_channels;
        let z = noise(one_shot.frames * mel, 7);
        let voice = s3.builtin_voice().unwrap();
        let spks = s3.speaker_projection(&voice.embedding).unwrap();
        let mut cond = vec![0f32; one_shot.frames * mel];
        cond[..voice.prompt_feat.len()].copy_from_slice(&voice.prompt_feat);
        let steps = s3.hp.n_timesteps;
        let x = s3.integrate(&z, &one_shot.mu, &spks, &cond, steps).unwrap();
        let (hidden, mu, streamed_x) = streamed(&mut s3, &tokens, &[tokens.len()], &z, steps);
        check("one block: encoder output", &hidden, &one_shot.hidden, 1e-5);
        check("one block: mu", &mu, &one_shot.mu, 1e-5);
        check("one block: CFM result", &streamed_x, &x, 1e-5);
    }
}

#[test]
fn a_block_does_not_depend_on_the_tokens_after_its_lookahead() {
    let (_handle, mut s3) = load(&OpPolicy::reference());
    let tokens = sequence(&s3);
    let prompt = s3.builtin_voice().unwrap().prompt_token.len();
    let (stride, mel, lookahead) = (s3.hp.encoder.up_stride, s3.hp.mel_channels, s3.hp.encoder.pre_lookahead);
    let ends = [prompt + 3, prompt + 7, tokens.len()];
    assert!(ends[1] + lookahead < tokens.len(), "the fixture has too few speech tokens for three blocks");
    let z = noise(tokens.len() * stride * mel, 11);
    let steps = s3.hp.n_timesteps;
    let (hidden, mu, x) = streamed(&mut s3, &tokens, &ends, &z, steps);
    // Different speech after the second block's lookahead: the first two
    // blocks' frames are the same, the third's are not.
    let mut other = tokens.clone();
    for t in &mut other[ends[1] + lookahead..] {
        *t = (*t + 17) % s3.hp.speech_vocab as i32;
    }
    let (hidden2, mu2, x2) = streamed(&mut s3, &other, &ends, &z, steps);
    let cut = ends[1] * stride;
    let d = s3.hp.encoder.n_embd;
    assert_eq!(hidden[..cut * d], hidden2[..cut * d], "the encoder's first blocks changed");
    assert_eq!(mu[..cut * mel], mu2[..cut * mel], "mu's first blocks changed");
    assert_eq!(x[..cut * mel], x2[..cut * mel], "the CFM's first blocks changed");
    assert!(rel_err(&x2[cut * mel..], &x[cut * mel..]) > 1e-3, "the last block should follow its tokens");
    // And blocks differ from one-shot attention (each sees less), so the mask acts.
    let (_, _, whole) = streamed(&mut s3, &tokens, &[tokens.len()], &z, steps);
    assert!(rel_err(&x[..ends[0] * stride * mel], &whole[..ends[0] * stride * mel]) > 1e-4, "the first block should see less than the whole");
}

/// The reference's block-streamed run over a tiny fixture
/// (`reference/stream/`): every block's encoder output and mu, and every
/// Euler step's velocity over its frames (the guided combination where the
/// decoder guides), with the reference's noise.
fn matches_the_reference_blocks(backend: &str, fixture: &Path, s3gen_file: &str, policy: &OpPolicy, tol: f32) {
    matches_the_reference_run(backend, fixture, "stream", s3gen_file, policy, tol)
}

/// As [`matches_the_reference_blocks`], the CFM seeing the prompt's frames
/// and a window of frames before each block (`reference/stream-window/`,
/// whose `stream_window` holds the prompt's frames and the window's).
fn matches_the_windowed_reference(backend: &str, fixture: &Path, s3gen_file: &str, policy: &OpPolicy, tol: f32) {
    matches_the_reference_run(backend, fixture, "stream-window", s3gen_file, policy, tol)
}

fn matches_the_reference_run(backend: &str, fixture: &Path, run: &str, s3gen_file: &str, policy: &OpPolicy, tol: f32) {
    let dir = fixture.join("reference").join(run);
    let handle = open(backend);
    let mut s3 = S3Gen::load(&fixture.join(s3gen_file), handle.ggml_backend(), policy).unwrap();
    let voice = s3.builtin_voice().unwrap();
    let mut tokens = voice.prompt_token.clone();
    tokens.extend(npy_i64_in(&fixture.join("reference"), "s3gen_tokens").into_iter().map(|v| v as i32));
    let ends: Vec<usize> = npy_i64_in(&dir, "stream_block_ends").into_iter().map(|v| v as usize).collect();
    assert_eq!(*ends.last().unwrap(), tokens.len(), "the reference's blocks cover another sequence");
    let (mel, d, stride) = (s3.hp.mel_channels, s3.hp.encoder.n_embd, s3.hp.encoder.up_stride);
    let frames = tokens.len() * stride;
    // Channel-major `(rows, mel, frames)` → `[row][frame][mel]`.
    let frame_major = |name: &str| {
        let (shape, v) = npy_in(&dir, name);
        let rows = shape[0] as usize;
        v.chunks(mel * frames).take(rows).flat_map(|row| transpose(row, mel, frames)).collect::<Vec<f32>>()
    };
    let (hidden_ref, mu_ref) = (npy_in(&dir, "stream_encoder_out").1, npy_in(&dir, "stream_mu").1);
    let (z, cond, mel_ref) = (frame_major("stream_z"), frame_major("stream_cond"), frame_major("stream_mel"));
    let spks = s3.speaker_projection(&voice.embedding).unwrap();
    check("speaker projection", &spks, &npy_in(&dir, "stream_spks").1, 1e-5);
    let steps = s3.hp.n_timesteps;
    let w = s3.hp.cfg_rate;
    let velocity_ref: Vec<Vec<f32>> = (0..steps)
        .map(|i| {
            let v = frame_major(&format!("stream_cfm_step{i}_v"));
            if v.len() == 2 * frames * mel {
                let (cond_v, uncond_v) = v.split_at(frames * mel);
                tts_model_chatterbox::s3gen::cfm::combine_guidance(cond_v, uncond_v, w)
            } else {
                v
            }
        })
        .collect();
    let window = if dir.join("stream_window.npy").exists() { npy_i64_in(&dir, "stream_window") } else { Vec::new() };
    let shape = match window[..] {
        [] => every_frame(tokens.len(), steps),
        [sink, recent] => {
            let (sink, recent) = (sink as usize, recent as usize);
            assert!(sink.is_multiple_of(stride) && recent.is_multiple_of(stride), "a window of whole tokens");
            let prompt = sink / stride;
            assert_eq!(prompt, voice.prompt_token.len(), "the window keeps the prompt's frames");
            // Blocks of up to 3 speech tokens (the reference's hops).
            StreamShape { prompt_tokens: prompt, max_codes: tokens.len() - prompt, first: 3, hop: 3, context_tokens: recent / stride, steps }
        }
        _ => panic!("stream_window holds the prompt's frames and the window's"),
    };
    let mut stream = BlockStream::new(&s3, &shape).unwrap();
    let mut start = 0;
    for (b, &end) in ends.iter().enumerate() {
        let (f0, f1) = (start * stride, end * stride);
        let out = stream.encode(&mut s3, &tokens, end).unwrap();
        check(&format!("{backend} block {b} encoder output"), &out.hidden, &hidden_ref[f0 * d..f1 * d], tol);
        check(&format!("{backend} block {b} mu"), &out.mu, &mu_ref[f0 * mel..f1 * mel], tol);
        let range = f0 * mel..f1 * mel;
        let mut velocities = Vec::new();
        let x = stream.integrate(&mut s3, &z[range.clone()], &out.mu, &spks, &cond[range.clone()], Some(&mut velocities)).unwrap();
        for (i, v) in velocities.iter().enumerate() {
            check(&format!("{backend} block {b} CFM step {i} velocity"), v, &velocity_ref[i][range.clone()], tol);
        }
        check(&format!("{backend} block {b} mel"), &x, &mel_ref[range], tol);
        start = end;
    }
}

fn mtl_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/chatterbox/mtl-tiny")
}

#[test]
fn turbo_blocks_match_the_reference_under_its_block_mask() {
    for policy in policies() {
        matches_the_reference_blocks("cpu", &fixture_dir(), "s3gen-meanflow.gguf", &policy, 1e-5);
    }
}

#[test]
fn multilingual_guided_blocks_match_the_reference_under_its_block_mask() {
    for policy in policies() {
        matches_the_reference_blocks("cpu", &mtl_fixture(), "s3gen.gguf", &policy, 1e-5);
    }
}

/// The CFM's window (the prompt's frames and 6 before each block): later
/// blocks lose earlier speech frames, and Multilingual's last block
/// overwrites a ring slot.
#[test]
fn windowed_blocks_match_the_reference_under_its_windowed_mask() {
    for policy in policies() {
        matches_the_windowed_reference("cpu", &fixture_dir(), "s3gen-meanflow.gguf", &policy, 1e-5);
        matches_the_windowed_reference("cpu", &mtl_fixture(), "s3gen.gguf", &policy, 1e-5);
    }
}

/// Both variants on the Vulkan plugin (lavapipe on CI), in one test so one
/// Vulkan device serves them from one thread; its f32 products may round
/// through f16, hence the tolerance of `parity_vulkan.rs`'s CFM.
#[test]
fn blocks_match_the_reference_on_vulkan() {
    for policy in policies() {
        matches_the_reference_blocks("vulkan", &fixture_dir(), "s3gen-meanflow.gguf", &policy, 5e-3);
        matches_the_reference_blocks("vulkan", &mtl_fixture(), "s3gen.gguf", &policy, 5e-3);
        matches_the_windowed_reference("vulkan", &mtl_fixture(), "s3gen.gguf", &policy, 5e-3);
    }
}
