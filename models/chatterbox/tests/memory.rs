//! The memory plan (`memory::plan`, sized from the two files alone) against
//! what the pipeline allocates: the tiny Turbo and Multilingual models loaded
//! on the CPU and on Vulkan (lavapipe on CI), one chunk synthesized at a
//! forced length, and the weights, the K/V cache and every graph compared
//! with the plan at that chunk's lengths, byte for byte, under the reference
//! and the native op policies. Cloning's graphs are sized at the longest
//! reference, so a real clone's must come within them.

mod common;

use engine_core::model_kit::{OpPolicy, PieceSender};
use ggml_sys::TYPE_F32;
use std::collections::BTreeMap;
use std::path::PathBuf;
use tts_model_chatterbox::memory::{self, Lengths};
use tts_model_chatterbox::model::{Chatterbox, SynthesisParams, VoiceSource};

fn fixtures() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/chatterbox")
}

fn model_files(variant: &str) -> Vec<PathBuf> {
    match variant {
        "turbo" => vec![fixtures().join("turbo-tiny/t3-turbo.gguf"), fixtures().join("turbo-tiny/s3gen-meanflow.gguf")],
        _ => vec![fixtures().join("mtl-tiny/t3-mtl.gguf"), fixtures().join("mtl-tiny/s3gen.gguf")],
    }
}

/// Bytes by stage of what `model` holds: weights, cache, graphs (a stage
/// with several graphs, T3's steps, summed).
fn resident(model: &Chatterbox) -> BTreeMap<&'static str, u64> {
    let mut out = BTreeMap::new();
    let (t3_weights, kv) = model.t3.resident_bytes();
    out.insert("t3.weights", t3_weights as u64);
    out.insert("t3.kv_cache", kv as u64);
    out.insert("s3gen.weights", model.s3gen.weight_bytes() as u64);
    for (stage, graph) in model.t3.graphs().into_iter().chain(model.s3gen.graphs()) {
        *out.entry(stage).or_insert(0) += graph.buffer_size() as u64;
    }
    out
}

/// A 12 s reference at 24 kHz: a chord over noise (loud enough to keep, long
/// enough for Turbo's 5 s minimum).
fn write_reference(dir: &std::path::Path) -> PathBuf {
    let path = dir.join("reference.wav");
    let spec = hound::WavSpec { channels: 1, sample_rate: 24_000, bits_per_sample: 16, sample_format: hound::SampleFormat::Int };
    let mut w = hound::WavWriter::create(&path, spec).unwrap();
    let mut state = 0x2545_F491u32;
    for i in 0..12 * 24_000 {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let t = i as f32 / 24_000.0;
        let noise = (state as f32 / u32::MAX as f32 - 0.5) * 0.1;
        let v = 0.3 * (std::f32::consts::TAU * 220.0 * t).sin() + 0.2 * (std::f32::consts::TAU * 330.0 * t).sin() + noise;
        w.write_sample((v * 20_000.0) as i16).unwrap();
    }
    w.finalize().unwrap();
    path
}

fn check(variant: &str, backend: &str) {
    let handle = common::open(backend);
    let files = model_files(variant);
    let new_tokens = 40;
    for policy in [OpPolicy::reference(), OpPolicy::native(TYPE_F32)] {
        let what = format!("{variant} on {backend}, fused attention {}", policy.fused_attention);
        let mut model = Chatterbox::load(&files, &handle.ggml_backend(), &policy).unwrap();
        // No stop before the budget: every step graph the budget implies is built.
        let params = SynthesisParams { max_new_tokens: new_tokens, min_new_tokens: new_tokens + 1, seed: 5, ..SynthesisParams::default() };
        let synthesis = model.synthesize("Hello there, my old friend.", &params).unwrap();
        let voice = model.builtin_voice();
        let codes = model.t3.speech_codes(&synthesis.speech_tokens[0], model.s3gen.hp.speech_vocab as u32).len();
        let lengths = Lengths {
            voice_prompt_tokens: voice.t3.prompt_speech_tokens.len(),
            text_tokens: synthesis.text_ids[0].len(),
            new_tokens,
            every_span: false,
            s3_prompt_tokens: voice.s3gen.prompt_token.len(),
            s3_prompt_frames: voice.s3gen.prompt_feat.len() / model.s3gen.hp.mel_channels,
            speech_codes: codes,
        };
        let (plan, _) = memory::plan(&files, &handle.ggml_backend(), &policy, &params, Some(lengths)).unwrap();
        let held = resident(&model);
        assert!(held.len() >= 9, "{what}: stages {:?}", held.keys());
        for (stage, bytes) in &held {
            assert_eq!(plan.get(stage), Some(*bytes), "{what}: {stage} at {lengths:?}");
        }

        // Streamed in hops of 8: the stream's caches are the plan's, its block
        // graphs (one per kind of block) within the plan's bound (each kind over the longest span).
        let hops = SynthesisParams { stream_tokens: 8, stream_first_tokens: 4, ..params.clone() };
        let mut samples = Vec::new();
        model.synthesize_streaming("Hello there, my old friend.", &hops, &mut PieceSender::collecting(&mut samples)).unwrap();
        let (plan, _) = memory::plan(&files, &handle.ggml_backend(), &policy, &hops, Some(lengths)).unwrap();
        let streamed = model.stream_resident_bytes();
        assert_eq!(streamed.len(), 4, "{what}: the stream keeps its state");
        let [(caches, cache_bytes), (encoder, encoder_bytes), (cfm, cfm_bytes), (vocoder, vocoder_bytes)] = streamed[..] else { unreachable!() };
        assert_eq!(plan.get(caches), Some(cache_bytes as u64), "{what}: {caches}");
        for (stage, bytes) in [(encoder, encoder_bytes), (cfm, cfm_bytes), (vocoder, vocoder_bytes)] {
            assert!(bytes > 0 && plan.get(stage) >= Some(bytes as u64), "{what}: {stage} planned {:?}, built {bytes}", plan.get(stage));
        }
        let unstreamed = SynthesisParams { stream_tokens: 0, ..hops };
        let (plan, _) = memory::plan(&files, &handle.ggml_backend(), &policy, &unstreamed, Some(lengths)).unwrap();
        assert_eq!(plan.get(caches), None, "{what}: stream_tokens = 0 plans no stream");

        // Cloning's graphs, sized at the longest reference, bound a real clone's.
        let dir = tempfile::tempdir().unwrap();
        let reference = write_reference(dir.path());
        let cloning = SynthesisParams { voice: VoiceSource::Reference(reference), max_new_tokens: 4, ..SynthesisParams::default() };
        model.synthesize("Hi.", &cloning).unwrap();
        let held = resident(&model);
        for stage in ["voice_encoder", "campplus", "s3tokenizer"] {
            let (built, planned) = (held.get(stage).copied(), plan.get(stage));
            assert!(built.is_some() && planned >= built, "{what}: {stage} planned {planned:?}, built {built:?}");
        }

        // The longest chunk of the options (short chunks: the tiny model's
        // context holds the speech): more speech tokens, a larger plan.
        let short = SynthesisParams { max_chars: 10, ..params.clone() };
        let (longest, sized) = memory::plan(&files, &handle.ggml_backend(), &policy, &short, None).unwrap();
        let (longer, _) =
            memory::plan(&files, &handle.ggml_backend(), &policy, &SynthesisParams { max_new_tokens: 4 * new_tokens, ..short.clone() }, None).unwrap();
        assert!(sized.every_span && sized.new_tokens <= new_tokens, "{what}: {sized:?}");
        // (The tiny T3's context, 160 positions, is less than one cache block: its cache and steps are capped.)
        for stage in ["s3gen.encoder", "s3gen.cfm", "hift"] {
            assert!(longer.get(stage) > longest.get(stage), "{what}: {stage} does not grow with max_new_tokens");
        }
        for stage in ["t3.kv_cache", "t3.step"] {
            assert!(longer.get(stage) >= longest.get(stage), "{what}: {stage} shrinks with max_new_tokens");
        }
        assert_eq!(longer.get("t3.weights"), plan.get("t3.weights"));
        assert_eq!(longest.total(), longest.items.iter().map(|i| i.bytes).sum::<u64>());
    }
}

#[test]
fn the_plan_is_what_a_turbo_synthesis_allocates_on_the_cpu() {
    check("turbo", "cpu");
}

#[test]
fn the_plan_is_what_a_multilingual_synthesis_allocates_on_the_cpu() {
    check("mtl", "cpu");
}

#[test]
fn the_plan_is_what_a_synthesis_allocates_on_vulkan() {
    if !common::available("vulkan") {
        eprintln!("skipped: no Vulkan device");
        return;
    }
    check("turbo", "vulkan");
    check("mtl", "vulkan");
}

#[test]
fn a_chunk_that_tokenizes_beyond_the_planned_bound_is_refused() {
    let handle = common::open("cpu");
    let mut model = Chatterbox::load(&model_files("turbo"), &handle.ggml_backend(), &OpPolicy::reference()).unwrap();
    // Emoji are four UTF-8 bytes each: a byte-level tokenizer may give each
    // several tokens; with max_chars 1 each chunk is one such character.
    let params = SynthesisParams { max_new_tokens: 2, max_chars: 1, ..SynthesisParams::default() };
    let limit = memory::max_chunk_tokens(1).unwrap();
    let text = "\u{1F600}".repeat(3);
    match model.synthesize(&text, &params) {
        Err(e) => assert!(e.to_string().contains(&format!("more than the {limit}")), "{e}"),
        Ok(s) => assert!(s.text_ids.iter().all(|ids| ids.len() <= limit), "{:?}", s.text_ids),
    }
}
