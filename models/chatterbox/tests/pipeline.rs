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

/// `values` as a float32 `.npy` of `shape` (the layout the fixture tools save).
fn write_npy(path: &std::path::Path, shape: &[u64], values: &[f32]) {
    use npyz::WriterBuilder;
    let file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut w = npyz::WriteOptions::new().default_dtype().shape(shape).writer(file).begin_nd().unwrap();
    w.extend(values.iter().copied()).unwrap();
    w.finish().unwrap();
}

/// Recorded draws that do not fit the synthesis are told in speech tokens,
/// mel frames and samples, with the likely cause, rather than value counts.
/// The fixture's run: 13 drawn tokens and Turbo's 3 silence tokens, 16
/// speech tokens, 32 mel frames after the voice prompt's 12, 480 samples a
/// frame, 9 source bands.
#[test]
fn recorded_draws_of_the_wrong_length_say_so_in_frames_and_tokens() {
    use engine_core::model_kit::npy::read_f32;
    let handle = open("cpu");
    let mut model = load(&handle);
    let recorded = reference_dir().join("pipeline");
    let case: serde_json::Value = serde_json::from_slice(&std::fs::read(recorded.join("case.json")).unwrap()).unwrap();
    let text = case["text"].as_str().unwrap().to_string();
    let cap = case["max_new_tokens"].as_u64().unwrap() as usize;
    let draw_files = ["t3_uniforms", "cfm_z", "sine_phase", "sine_noise"];
    let original = |name: &str| read_f32(&recorded.join(format!("{name}.npy"))).unwrap();
    // A copy of the recorded draws, edited, synthesised with `max_new_tokens`.
    let mut synthesize = |max_new_tokens: usize, edit: &dyn Fn(&std::path::Path)| -> Result<usize, String> {
        let dir = tempfile::tempdir().unwrap();
        for name in draw_files {
            std::fs::copy(recorded.join(format!("{name}.npy")), dir.path().join(format!("{name}.npy"))).unwrap();
        }
        edit(dir.path());
        let params = SynthesisParams { max_new_tokens, draws: Some(dir.path().to_path_buf()), ..SynthesisParams::default() };
        model.synthesize(&text, &params).map(|s| s.samples.len()).map_err(|e| e.to_string())
    };
    assert_eq!(synthesize(cap, &|_| {}), Ok(16 * 2 * 480), "the copy, unedited, fits");

    let diverged = "(the token stream diverged earlier: the recorded draws fit another run)";
    // Another run's cap: 9 tokens drawn, 12 with the silence.
    assert_eq!(
        synthesize(8, &|_| {}).unwrap_err(),
        "cfm_z.npy holds 44 mel frames; this synthesis needs 36: the voice prompt's 12 and 24 for 12 speech tokens \
         (the token stream diverged earlier, or the voice differs: the recorded draws fit another run)"
    );
    let uniforms = original("t3_uniforms");
    assert_eq!(
        synthesize(cap, &|d| write_npy(&d.join("t3_uniforms.npy"), &[5], &uniforms[..5])).unwrap_err(),
        "t3_uniforms.npy holds 5 uniforms, one per speech token; speech token 6 has none \
         (the token stream diverged earlier, or max_new_tokens is above the recorded run's: the recorded draws fit another run)"
    );
    let z = original("cfm_z");
    let z40: Vec<f32> = z.chunks(44).flat_map(|mel_row| mel_row[..40].to_vec()).collect();
    assert_eq!(
        synthesize(cap, &|d| write_npy(&d.join("cfm_z.npy"), &[1, 80, 40], &z40)).unwrap_err(),
        "cfm_z.npy holds 40 mel frames; this synthesis needs 44: the voice prompt's 12 and 32 for 16 speech tokens \
         (the token stream diverged earlier, or the voice differs: the recorded draws fit another run)"
    );
    assert_eq!(
        synthesize(cap, &|d| write_npy(&d.join("cfm_z.npy"), &[3519], &z[..3519])).unwrap_err(),
        "cfm_z.npy holds 3519 values, not whole mel frames of 80 channels (it is (1, 80, frames))"
    );
    let noise = original("sine_noise");
    let cut = |samples: usize| -> Vec<f32> { noise.chunks(15360).flat_map(|band| band[..samples].to_vec()).collect() };
    assert_eq!(
        synthesize(cap, &|d| write_npy(&d.join("sine_noise.npy"), &[1, 9, 14400], &cut(14400))).unwrap_err(),
        format!(
            "sine_noise.npy holds 14400 samples per band (30 mel frames of 480); this synthesis needs 15360: 32 mel frames for 16 speech tokens {diverged}"
        )
    );
    assert_eq!(
        synthesize(cap, &|d| write_npy(&d.join("sine_noise.npy"), &[1, 9, 15000], &cut(15000))).unwrap_err(),
        format!("sine_noise.npy holds 15000 samples per band (not whole mel frames of 480); this synthesis needs 15360: 32 mel frames for 16 speech tokens {diverged}")
    );
    assert_eq!(
        synthesize(cap, &|d| write_npy(&d.join("sine_noise.npy"), &[100], &noise[..100])).unwrap_err(),
        "sine_noise.npy holds 100 values, not 9 bands of whole samples (it is (1, 9, samples))"
    );
    let phase = original("sine_phase");
    assert_eq!(
        synthesize(cap, &|d| write_npy(&d.join("sine_phase.npy"), &[1, 8, 1], &phase[..8])).unwrap_err(),
        "sine_phase.npy holds 8 phases; this model's source has 9 (the fundamental and 8 harmonics): the recorded draws fit another model"
    );
    assert_eq!(
        synthesize(cap, &|d| std::fs::remove_file(d.join("sine_noise.npy")).unwrap()).unwrap_err(),
        "sine_phase.npy is recorded without sine_noise.npy; the source takes both draws or neither"
    );
    assert_eq!(
        synthesize(cap, &|d| std::fs::remove_file(d.join("sine_phase.npy")).unwrap()).unwrap_err(),
        "sine_noise.npy is recorded without sine_phase.npy; the source takes both draws or neither"
    );
}
