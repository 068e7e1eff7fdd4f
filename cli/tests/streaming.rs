//! Streaming through the plugin ABI with the tone fixture plugin: pieces in
//! order, cancellation by the receiver, and a plugin built against ABI 5.1
//! (before streaming existed) answering with one piece of the same audio.

mod common;

use common::{artifacts, tone_setup, write_profile};
use engine_core::engine::{Engine, EngineError, ModelSession};
use engine_core::profile::Profile;
use std::path::Path;

/// The tone model on the CPU, with the plugin file `tone_plugin` installed as
/// the tone family's plugin.
fn tone_session(tone_plugin: &Path, dir: &Path) -> ModelSession {
    let (plugins, gguf) = tone_setup(&["cpu"]);
    std::fs::copy(tone_plugin, plugins.path().join("libtts_model_tone.so")).unwrap();
    let profile = write_profile(dir, &format!("[backend]\nprefer = [\"cpu\"]\nfallback = false\n[model]\nfiles = [\"{}\"]\n", gguf.display()));
    let engine = Engine::open(Profile::load(&profile).unwrap(), vec![plugins.path().to_path_buf()]).unwrap();
    let session = engine.open_model(&[]).unwrap();
    // The plugin files stay loaded for the process; the directory may go.
    std::mem::forget(plugins);
    session
}

/// Every piece of one streamed synthesis of `text`, and how it ended.
fn pieces(session: &mut ModelSession, text: &str, stop_after: Option<usize>) -> (Vec<Vec<f32>>, engine_core::abi::StreamSummary) {
    let mut got: Vec<Vec<f32>> = Vec::new();
    let summary = session
        .synthesize_streaming(text, |samples, _| {
            got.push(samples.to_vec());
            Ok(stop_after.is_none_or(|n| got.len() < n))
        })
        .unwrap();
    (got, summary)
}

#[test]
fn pieces_arrive_in_order_and_join_to_the_one_shot_audio() {
    let dir = tempfile::tempdir().unwrap();
    let mut session = tone_session(&artifacts().join("libtts_test_tone.so"), dir.path());
    let whole = session.synthesize("hello").unwrap();
    let (got, summary) = pieces(&mut session, "hello", None);
    assert_eq!(got.iter().map(Vec::len).collect::<Vec<_>>(), vec![1600; 5], "one piece per character");
    assert_eq!(got.concat(), whole.samples.to_vec(), "streamed and one-shot audio are the same samples");
    assert_eq!((summary.pieces, summary.samples, summary.cancelled, summary.sample_rate), (5, 8000, false, 16000));
}

#[test]
fn the_receiver_can_stop_a_synthesis() {
    let dir = tempfile::tempdir().unwrap();
    let mut session = tone_session(&artifacts().join("libtts_test_tone.so"), dir.path());
    let (got, summary) = pieces(&mut session, "hello", Some(2));
    assert_eq!(got.len(), 2);
    assert!(summary.cancelled && summary.pieces == 2, "{summary:?}");
    // An error from the receiver stops the synthesis and is what the caller gets.
    let e = session.synthesize_streaming("hello", |_, _| Err(EngineError("the listener went away".into()))).unwrap_err();
    assert_eq!(e.0, "the listener went away");
    // A receiver that panics ends the synthesis with an error, not an abort.
    let e = session.synthesize_streaming("hello", |_, _| panic!("receiver bug")).unwrap_err();
    assert!(e.0.contains("the audio receiver panicked"), "{}", e.0);
    // The session still works afterwards.
    assert_eq!(pieces(&mut session, "hi", None).0.len(), 2);
}

/// `cargo xtask test` builds the tone plugin against ABI 5.1 (its root module
/// and model trait of then, `--features abi-5-1`) into `target/abi-5-1/`; a
/// plain `cargo test` without it says so and skips.
#[test]
fn a_plugin_built_against_abi_5_1_loads_and_streams_one_piece() {
    let old_plugin = artifacts().parent().unwrap().join("abi-5-1/libtts_test_tone.so");
    if !old_plugin.is_file() {
        assert!(
            std::env::var_os("TTS_REQUIRE_ABI_5_1_FIXTURE").is_none(),
            "{} is missing (cargo build -p tts-test-plugin-tone --features abi-5-1 --profile abi-5-1)",
            old_plugin.display()
        );
        eprintln!("skipped: no ABI 5.1 build of the tone plugin at {} (`cargo xtask test` builds it)", old_plugin.display());
        return;
    }
    // abi_stable refuses it through the current interface; the loader takes it through 5.1's.
    let (loaded, _) = engine_core::loader::load_model(&old_plugin).unwrap();
    assert_eq!(loaded.abi_version(), "5.1.0");
    let (current, _) = engine_core::loader::load_model(&artifacts().join("libtts_test_tone.so")).unwrap();
    assert_eq!(current.abi_version(), engine_core::PLUGIN_ABI_VERSION);
    let dir = tempfile::tempdir().unwrap();
    let mut old = tone_session(&old_plugin, dir.path());
    let (got, summary) = pieces(&mut old, "hello", None);
    assert_eq!((got.len(), summary.pieces, summary.samples), (1, 1, 8000), "the whole synthesis as one piece");
    let dir = tempfile::tempdir().unwrap();
    let mut new = tone_session(&artifacts().join("libtts_test_tone.so"), dir.path());
    assert_eq!(got.concat(), pieces(&mut new, "hello", None).0.concat(), "the same audio as the 5.2 build's pieces");
    // A 5.1 plugin lists nothing it could not say then.
    assert_eq!((old.catalog().voices.len(), old.catalog().languages.len(), old.catalog().clones_voices), (0, 0, false));
    // Cancelling after the one piece is still reported.
    let (_, summary) = pieces(&mut old, "hello", Some(1));
    assert!(summary.cancelled, "{summary:?}");
}

/// A model session on the committed tiny fixture `files`, CPU, one thread.
fn fixture_session(files: &[std::path::PathBuf], families: &[&str], dir: &Path, overrides: &[(String, String)]) -> ModelSession {
    let plugins = common::plugins_with(&["cpu"], families);
    let profile = common::profile_on(dir, "cpu", files);
    let engine = Engine::open(Profile::load(&profile).unwrap(), vec![plugins.path().to_path_buf()]).unwrap();
    let session = engine.open_model(overrides).unwrap();
    std::mem::forget(plugins);
    session
}

/// Pieces of `text` streamed through `session`, against its one-shot synthesis.
fn streamed_against_one_shot(session: &mut ModelSession, text: &str) -> usize {
    let whole = session.synthesize(text).unwrap();
    let mut pieces: Vec<Vec<f32>> = Vec::new();
    let summary = session
        .synthesize_streaming(text, |p, rate| {
            assert_eq!(rate, whole.sample_rate);
            pieces.push(p.to_vec());
            Ok(true)
        })
        .unwrap();
    assert_eq!(pieces.concat(), whole.samples.to_vec(), "the pieces join to the one-shot samples");
    assert_eq!((summary.pieces as usize, summary.samples as usize, summary.cancelled), (pieces.len(), whole.samples.len(), false));
    pieces.len()
}

#[test]
fn supertonic_streams_one_piece_per_text_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let mut session = fixture_session(&[common::supertonic_fixture()], &["supertonic"], dir.path(), &[]);
    let long = "The quick brown fox jumps over the lazy dog near the river bank today. ".repeat(6);
    let n = streamed_against_one_shot(&mut session, &long);
    assert!(n >= 2, "{} characters in {n} piece(s)", long.len());
    assert_eq!(streamed_against_one_shot(&mut session, "Hello."), 1);
    eprintln!("supertonic: {} characters streamed in {n} pieces, identical to one-shot", long.len());
    // Stopping after the first chunk skips the rest.
    let (got, summary) = pieces(&mut session, &long, Some(1));
    assert!(summary.cancelled && got.len() == 1, "{summary:?}");
}

#[test]
fn chatterbox_streams_one_piece_per_text_chunk_with_the_crossfade_held_back() {
    let dir = tempfile::tempdir().unwrap();
    let overrides = [("max_chars".to_string(), "30".to_string()), ("max_new_tokens".to_string(), "12".to_string())];
    let mut session = fixture_session(&common::chatterbox_fixture(), &["chatterbox"], dir.path(), &overrides);
    let n = streamed_against_one_shot(&mut session, "First sentence here. Then a second one. And a third.");
    assert!(n >= 3, "{n} pieces");
    eprintln!("chatterbox: 3 text chunks streamed in {n} pieces (the last the crossfade tail), identical to one-shot");
}
