//! `speed` beyond the model's own duration control (0.5..=2): the nearest
//! speed it makes, time-stretched by the rest, one-shot and streamed, on the
//! committed tiny v2 fixture through the CPU plugin.

mod common;

use engine_core::audio::stretch::stretch;
use engine_core::model_kit::{OpPolicy, PieceSender};
use tts_model_supertonic::model::{NoiseSource, Supertonic, SynthesisParams, VoiceChoice};
use tts_model_supertonic::text::UnsupportedChars;

const TEXT: &str = "Hello, world! This is a tiny test of the speaking rate.";

fn params(speed: f32) -> SynthesisParams {
    SynthesisParams {
        voice: VoiceChoice::Named("F1".into()),
        language: "en".into(),
        steps: Some(2),
        speed,
        noise: NoiseSource::Seed(7),
        unsupported_chars: UnsupportedChars::Skip,
        stream_first_chars: 0,
    }
}

/// The tests of this binary run one at a time (each holds a backend).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The model with the backend it runs on (which must outlive it).
fn load() -> (Supertonic, engine_core::abi::BackendHandle, std::sync::MutexGuard<'static, ()>) {
    let serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::repo_root().join("tests/fixtures/supertonic/tiny-v2");
    let handle = common::open("cpu");
    let model = Supertonic::load(&dir.join("model.gguf"), handle.ggml_backend(), &OpPolicy::reference()).unwrap_or_else(|e| panic!("{e}"));
    (model, handle, serial)
}

#[test]
fn speeds_beyond_the_duration_control_are_its_nearest_end_stretched() {
    let (mut model, _handle, _serial) = load();
    let rate = model.hp.sample_rate;
    let mut at = |speed: f32| model.synthesize(TEXT, &params(speed)).unwrap().samples;
    let normal = at(1.0);
    for (speed, native) in [(4.0, 2.0), (3.0, 2.0), (0.25, 0.5), (0.4, 0.5)] {
        let base = at(native);
        let out = at(speed);
        let factor = speed as f64 / native as f64;
        // Exactly the stretch of what the duration control makes at its end.
        assert!(out == stretch(&base, rate, factor).unwrap(), "speed {speed}: not the stretched speed-{native} output");
        // Durations: of the clamped speed's over the rest, and of speed 1's over the speed.
        let want = base.len() as f64 / factor;
        assert!((out.len() as f64 - want).abs() <= 1.0, "speed {speed}: {} samples, want {want}", out.len());
        let from_normal = normal.len() as f64 / speed as f64;
        let error = (out.len() as f64 - from_normal).abs() / from_normal;
        println!("speed {speed}: {} samples, speed 1 gave {} ({:.3} % from its duration / speed)", out.len(), normal.len(), error * 100.0);
        assert!(error < 0.02, "speed {speed}: {} samples, speed 1's duration / speed is {from_normal}", out.len());
    }
}

#[test]
fn streaming_beyond_the_duration_control_stretches_the_pieces_as_one() {
    let (mut model, _handle, _serial) = load();
    let rate = model.hp.sample_rate;
    let text = "Hello there, friend of mine. What a day it was! Come back soon, will you?";
    // Streaming cuts the first chunk early: more pieces, all through one stretch.
    let streamed = |speed: f32| SynthesisParams { stream_first_chars: 12, ..params(speed) };
    for (speed, native) in [(0.25f32, 0.5f32), (4.0, 2.0)] {
        let mut pieces: Vec<Vec<f32>> = Vec::new();
        let mut sender = PieceSender::new(|p| {
            pieces.push(p.to_vec());
            true
        });
        model.synthesize_streaming(text, &streamed(speed), &mut sender).unwrap();
        drop(sender);
        assert!(pieces.len() > 2, "speed {speed}: {} pieces", pieces.len());
        let mut base = Vec::new();
        let mut sender = PieceSender::collecting(&mut base);
        model.synthesize_streaming(text, &streamed(native), &mut sender).unwrap();
        drop(sender);
        let want = stretch(&base, rate, speed as f64 / native as f64).unwrap();
        assert!(pieces.concat() == want, "speed {speed}: the pieces are not the stretched speed-{native} stream");
    }
}

#[test]
fn speeds_outside_a_quarter_to_four_are_refused() {
    let (model, _handle, _serial) = load();
    for bad in [0.2f32, 4.1, 0.0, f32::NAN, f32::INFINITY] {
        let e = model.validate(&params(bad)).unwrap_err().to_string();
        assert_eq!(e, format!("speed must be in 0.25..=4, got {}", bad as f64));
    }
    for good in [0.25f32, 0.5, 2.0, 4.0] {
        model.validate(&params(good)).unwrap();
    }
}
