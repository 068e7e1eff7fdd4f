//! S3Gen parity on CPU against the reference run (`s3gen_*` dumps), each stage
//! fed the reference's own inputs.

mod common;

use common::{check, npy, npy_i64, open};
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
