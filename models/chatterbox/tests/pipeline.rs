//! The synthesis loop on CPU beyond parity (which `parity.rs` checks): seeded
//! reproducibility, long text in chunks, and the model's input errors.

mod common;

use common::{open, reference_dir};
use engine_core::model_kit::OpPolicy;
use tts_model_chatterbox::model::{Chatterbox, SynthesisParams};

fn load(handle: &engine_core::abi::BackendHandle) -> Chatterbox {
    let dir = common::fixture_dir();
    let files = [dir.join("t3-turbo.gguf"), dir.join("s3gen-meanflow.gguf")];
    Chatterbox::load(&files, &handle.ggml_backend(), &OpPolicy::reference()).unwrap()
}

#[test]
fn seeded_synthesis_is_reproducible_and_long_text_is_chunked() {
    let handle = open("cpu");
    let mut model = load(&handle);
    let params = SynthesisParams { max_new_tokens: 8, seed: 7, max_chars: 50, ..SynthesisParams::default() };
    let text = "The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore.";
    let a = model.synthesize(text, &params).unwrap();
    let b = model.synthesize(text, &params).unwrap();
    assert_eq!(a.speech_tokens.len(), 2, "two sentences, two chunks");
    assert_eq!(a.samples, b.samples, "same seed, same waveform");
    let c = model.synthesize(text, &SynthesisParams { seed: 8, ..params.clone() }).unwrap();
    assert_ne!(a.speech_tokens, c.speech_tokens, "another seed, other tokens");
    // Each chunk: (tokens kept + 3 silence) × 2 frames × 480 samples, joined with a 20 ms crossfade.
    let per_token = 2 * model.s3gen.hp.hift.samples_per_frame();
    let chunk_len = |t: &Vec<u32>| (t.iter().filter(|&&x| x < 6561).count() + 3) * per_token;
    let expected = chunk_len(&a.speech_tokens[0]) + chunk_len(&a.speech_tokens[1]) - 480;
    assert_eq!(a.samples.len(), expected);
    assert!(a.samples.iter().all(|v| v.is_finite() && v.abs() <= 0.99));
}

#[test]
fn bad_inputs_fail_with_one_line_errors() {
    let handle = open("cpu");
    let mut model = load(&handle);
    let params = SynthesisParams { max_new_tokens: 4, ..SynthesisParams::default() };
    assert_eq!(model.synthesize("  ", &params).err().unwrap(), "text is empty");
    let long = "word ".repeat(200);
    let e = model.synthesize(&long, &SynthesisParams { max_chars: 0, ..params.clone() }).err().unwrap();
    assert!(e.starts_with("the text is too long for T3: "), "{e}");
    let e =
        model.synthesize("Hello. World.", &SynthesisParams { max_chars: 8, draws: Some(reference_dir().join("pipeline")), ..params.clone() }).err().unwrap();
    assert_eq!(e, "recorded draws cover one chunk; the text splits into 2 (raise max_chars)");

    let dir = common::fixture_dir();
    let t3 = dir.join("t3-turbo.gguf");
    let e = Chatterbox::load(&[t3.clone(), t3.clone()], &handle.ggml_backend(), &OpPolicy::reference()).err().unwrap();
    assert!(e.starts_with("chatterbox needs one 'chatterbox' and one 'chatterbox-s3gen' file, got 'chatterbox'"), "{e}");
    let e = Chatterbox::load(std::slice::from_ref(&t3), &handle.ggml_backend(), &OpPolicy::reference()).err().unwrap();
    assert_eq!(e, format!("chatterbox takes two GGUF files (T3 and S3Gen); 1 given: {}", t3.display()));
}
