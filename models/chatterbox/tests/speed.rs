//! `speed`: Chatterbox has no rate control of its own, so any speed but 1 is
//! its audio time-stretched at the same pitch (engine_core::audio::stretch),
//! one-shot and streamed; speed 1 is the audio untouched.

mod common;

use common::open;
use engine_core::audio::stretch::stretch;
use engine_core::model_kit::{OpPolicy, PieceSender};
use tts_model_chatterbox::model::{Chatterbox, SynthesisParams};

const TEXT: &str = "The quick brown fox jumps over the lazy dog. She sells sea shells.";

fn load(handle: &engine_core::abi::BackendHandle) -> Chatterbox {
    let dir = common::fixture_dir();
    let files = [dir.join("t3-turbo.gguf"), dir.join("s3gen-meanflow.gguf")];
    Chatterbox::load(&files, &handle.ggml_backend(), &OpPolicy::reference()).unwrap()
}

fn params(speed: f32) -> SynthesisParams {
    SynthesisParams { max_new_tokens: 12, min_new_tokens: 12, seed: 7, max_chars: 50, speed, ..SynthesisParams::default() }
}

#[test]
fn speeds_stretch_the_models_audio_to_its_duration_over_the_speed() {
    let handle = open("cpu");
    let mut model = load(&handle);
    let rate = model.sample_rate();
    let normal = model.synthesize(TEXT, &params(1.0)).unwrap();
    assert_eq!(SynthesisParams::default().speed, 1.0);
    for speed in [0.25f32, 0.8, 2.0, 4.0] {
        let out = model.synthesize(TEXT, &params(speed)).unwrap();
        assert_eq!(out.speech_tokens, normal.speech_tokens, "speed {speed}: the same speech");
        assert!(out.samples == stretch(&normal.samples, rate, speed as f64).unwrap(), "speed {speed}: not the stretched speed-1 audio");
        let want = normal.samples.len() as f64 / speed as f64;
        let error = (out.samples.len() as f64 - want).abs() / want;
        println!("speed {speed}: {} samples for {want:.1} ({:.3} %)", out.samples.len(), error * 100.0);
        assert!(error < 0.02, "speed {speed}: {} samples, speed 1's duration / speed is {want}", out.samples.len());
        assert!(out.timings.get("time_stretch").is_some(), "speed {speed}: the stretch is timed");
    }
    assert!(normal.timings.get("time_stretch").is_none(), "speed 1 does not stretch");
}

#[test]
fn streamed_pieces_go_through_one_stretch() {
    let handle = open("cpu");
    let mut model = load(&handle);
    let rate = model.sample_rate();
    let streamed = |speed: f32| SynthesisParams { stream_tokens: 5, stream_first_tokens: 3, ..params(speed) };
    let mut base = Vec::new();
    let mut sender = PieceSender::collecting(&mut base);
    model.synthesize_streaming(TEXT, &streamed(1.0), &mut sender).unwrap();
    drop(sender);
    for speed in [0.25f32, 4.0] {
        let mut pieces: Vec<Vec<f32>> = Vec::new();
        let mut sender = PieceSender::new(|p| {
            pieces.push(p.to_vec());
            true
        });
        model.synthesize_streaming(TEXT, &streamed(speed), &mut sender).unwrap();
        drop(sender);
        assert!(pieces.len() > 3, "speed {speed}: {} pieces", pieces.len());
        assert!(pieces.concat() == stretch(&base, rate, speed as f64).unwrap(), "speed {speed}: the pieces are not the stretched speed-1 stream");
    }
}

#[test]
fn speeds_outside_a_quarter_to_four_are_refused() {
    let handle = open("cpu");
    let mut model = load(&handle);
    for bad in [0.2f32, 4.1, 0.0, f32::NAN] {
        let e = model.synthesize(TEXT, &params(bad)).err().unwrap();
        assert_eq!(e.to_string(), format!("speed must be in 0.25..=4, got {}", bad as f64));
    }
}
