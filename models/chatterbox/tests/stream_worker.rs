//! Streamed S3Gen blocks on a worker thread and device stream beside T3 (a
//! GPU: lavapipe on CI) against the same blocks run between T3's steps: the
//! same pieces, sample for sample, across text chunks (the stream kept from
//! one chunk to the next), for Turbo's meanflow decoder and Multilingual's
//! guided one; a listener that stops mid-stream ends the synthesis with no
//! more audio and no hang. On the CPU, S3Gen shares T3's backend.

mod common;

use engine_core::model_kit::{OpPolicy, PieceSender};
use std::path::PathBuf;
use tts_model_chatterbox::model::{Chatterbox, SynthesisParams};

fn model_files(variant: &str) -> Vec<PathBuf> {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/chatterbox");
    match variant {
        "turbo" => vec![fixtures.join("turbo-tiny/t3-turbo.gguf"), fixtures.join("turbo-tiny/s3gen-meanflow.gguf")],
        _ => vec![fixtures.join("mtl-tiny/t3-mtl.gguf"), fixtures.join("mtl-tiny/s3gen.gguf")],
    }
}

/// Two sentences in two chunks, each streamed in hops of 8 codes.
const TEXT: &str = "Hello there, my old friend. It has been a long time.";

fn params(beside_t3: bool) -> SynthesisParams {
    SynthesisParams {
        max_new_tokens: 40,
        min_new_tokens: 41,
        max_chars: 30,
        seed: 5,
        stream_tokens: 8,
        stream_first_tokens: 4,
        stream_beside_t3: beside_t3,
        ..SynthesisParams::default()
    }
}

/// Each piece the stream hands on.
fn pieces(model: &mut Chatterbox, params: &SynthesisParams) -> Vec<Vec<f32>> {
    let mut pieces = Vec::new();
    let mut sender = PieceSender::new(|piece: &[f32]| {
        pieces.push(piece.to_vec());
        true
    });
    model.synthesize_streaming(TEXT, params, &mut sender).unwrap();
    drop(sender);
    pieces
}

#[test]
fn blocks_beside_t3_hand_on_the_pieces_of_blocks_between_its_steps() {
    if !common::available("vulkan") {
        eprintln!("skipped: no Vulkan device");
        return;
    }
    let handle = common::open("vulkan");
    for variant in ["turbo", "mtl"] {
        let mut model = Chatterbox::load(&model_files(variant), &handle.ggml_backend(), &OpPolicy::reference()).unwrap();
        assert!(model.has_s3gen_stream(), "{variant}: S3Gen has a stream of its own on a GPU");
        let beside = pieces(&mut model, &params(true));
        let between = pieces(&mut model, &params(false));
        assert!(beside.len() >= 8, "{variant}: {} pieces for two chunks of 40 codes in hops of 8", beside.len());
        assert_eq!(beside.len(), between.len(), "{variant}: pieces");
        for (i, (a, b)) in beside.iter().zip(&between).enumerate() {
            assert_eq!(a.len(), b.len(), "{variant}: piece {i}'s length");
            let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{variant}: piece {i} differs");
        }
        // Run again beside T3: the kept stream restarts as a new one.
        assert_eq!(pieces(&mut model, &params(true)), beside, "{variant}: a second run");
    }
}

#[test]
fn a_listener_that_stops_ends_a_stream_beside_t3() {
    if !common::available("vulkan") {
        eprintln!("skipped: no Vulkan device");
        return;
    }
    let handle = common::open("vulkan");
    let mut model = Chatterbox::load(&model_files("turbo"), &handle.ggml_backend(), &OpPolicy::reference()).unwrap();
    let mut received = 0;
    let mut sender = PieceSender::new(|_: &[f32]| {
        received += 1;
        received < 2
    });
    model.synthesize_streaming(TEXT, &params(true), &mut sender).unwrap();
    drop(sender);
    assert_eq!(received, 2, "no piece after the listener said stop");
    // The model streams again afterwards.
    assert!(pieces(&mut model, &params(true)).len() >= 8);
}

#[test]
fn on_the_cpu_s3gen_shares_t3s_backend() {
    let handle = common::open("cpu");
    let mut model = Chatterbox::load(&model_files("turbo"), &handle.ggml_backend(), &OpPolicy::reference()).unwrap();
    assert!(!model.has_s3gen_stream());
    // `stream_beside_t3` then runs the blocks between T3's steps.
    assert!(pieces(&mut model, &params(true)).len() >= 8);
}
