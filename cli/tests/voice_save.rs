//! `tts voice save` loads a model only to clone (plugin ABI 5.3,
//! `load_for_cloning`): Chatterbox reads the voice encoder, CAMPPlus and the
//! S3Tokenizer and nothing else, and saves the voice file the full model
//! saves, byte for byte; such a model refuses to synthesize with one line; a
//! plugin without that entry point (the tone plugin, and its ABI 5.1 build)
//! is loaded in full instead.

mod common;

use common::*;
use engine_core::engine::{Engine, ModelSession};
use engine_core::profile::Profile;
use std::path::{Path, PathBuf};

fn mtl_files() -> Vec<PathBuf> {
    let dir = repo().join("tests/fixtures/chatterbox/mtl-tiny");
    vec![dir.join("t3-mtl.gguf"), dir.join("s3gen.gguf")]
}

/// 7 s of a voiced 16 kHz recording: two harmonics under a syllable envelope
/// and a little noise, as a 16-bit WAV.
fn write_reference(path: &Path) {
    let rate = 16_000u32;
    let spec = hound::WavSpec { channels: 1, sample_rate: rate, bits_per_sample: 16, sample_format: hound::SampleFormat::Int };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    let mut state: u32 = 12345;
    for n in 0..7 * rate as usize {
        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let t = n as f64 / rate as f64;
        let tau = 2.0 * std::f64::consts::PI;
        let env = 0.55 + 0.45 * (tau * 2.5 * t).sin();
        let s = env * (0.4 * (tau * 150.0 * t).sin() + 0.2 * (tau * 455.0 * t).sin()) + 0.02 * (state as f64 / u32::MAX as f64 - 0.5);
        w.write_sample((s * 32767.0).round() as i16).unwrap();
    }
    w.finalize().unwrap();
}

fn engine(profile: &Path, plugins: &Path) -> Engine {
    Engine::open(Profile::load(profile).unwrap(), vec![plugins.to_path_buf()]).unwrap()
}

/// On Turbo and Multilingual: the voice from a cloning-only load equals the
/// fully loaded model's, through the engine and through `tts voice save`;
/// the cloning-only model's synthesis is a one-line refusal.
#[test]
fn a_cloning_only_load_saves_the_full_models_voice() {
    let plugins = plugins_with(&["cpu"], &["chatterbox"]);
    let dir = tempfile::tempdir().unwrap();
    let reference = dir.path().join("me.wav");
    write_reference(&reference);
    for (variant, files) in [("turbo", chatterbox_fixture()), ("mtl", mtl_files())] {
        let sub = dir.path().join(variant);
        std::fs::create_dir(&sub).unwrap();
        let profile = profile_on(&sub, "cpu", &files);
        let engine = engine(&profile, plugins.path());
        let (full_voice, cloning_voice, cli_voice) = (sub.join("full.voice"), sub.join("cloning.voice"), sub.join("cli.voice"));
        let mut full = engine.open_model(&[]).unwrap();
        assert!(!full.cloning_only);
        full.save_voice(&reference, &full_voice).unwrap();
        drop(full);
        let mut cloning = engine.open_model_for_cloning(&[]).unwrap();
        assert!(cloning.cloning_only, "{variant}: chatterbox has a cloning-only load");
        assert_eq!((cloning.info.family.as_str(), cloning.info.variant.as_str(), cloning.info.sample_rate), ("chatterbox", variant, 24_000));
        let timings = cloning.save_voice(&reference, &cloning_voice).unwrap();
        assert!(timings.iter().any(|(stage, _)| stage == "clone.voice_encoder"), "{timings:?}");
        let e = cloning.synthesize("Hello there.").unwrap_err();
        assert!(e.0.contains("loaded for voice cloning only") && !e.0.contains('\n'), "{variant}: {}", e.0);
        let e = cloning.synthesize_streaming("Hello there.", |_, _| Ok(true)).unwrap_err();
        assert!(e.0.contains("loaded for voice cloning only"), "{variant}: {}", e.0);
        drop(cloning);
        // The plugin logs which load it made.
        let o = save_voice_with(&profile, plugins.path(), &reference, &cli_voice, &[("TTS_LOG", "info")]);
        assert!(o.status.success(), "{variant}: {}", stderr(&o));
        assert!(stderr(&o).contains("chatterbox model loaded for voice cloning only"), "{variant}: {}", stderr(&o));
        assert!(stderr(&o).contains("clone.s3tokenizer"), "{}", stderr(&o));
        let want = std::fs::read(&full_voice).unwrap();
        assert_eq!(std::fs::read(&cloning_voice).unwrap(), want, "{variant}: the cloning-only load's voice is the full load's");
        assert_eq!(std::fs::read(&cli_voice).unwrap(), want, "{variant}: tts voice save writes the full load's voice");
    }
}

/// The tone model on the CPU, loaded for cloning, with the plugin file
/// `tone_plugin` installed as the tone family's plugin.
fn tone_for_cloning(tone_plugin: &Path, dir: &Path) -> ModelSession {
    let (plugins, gguf) = tone_setup(&["cpu"]);
    std::fs::copy(tone_plugin, plugins.path().join("libtts_model_tone.so")).unwrap();
    let profile = write_profile(dir, &format!("[backend]\nprefer = [\"cpu\"]\nfallback = false\n[model]\nfiles = [\"{}\"]\n", gguf.display()));
    let session = engine(&profile, plugins.path()).open_model_for_cloning(&[]).unwrap();
    // The plugin files stay loaded for the process; the directory may go.
    drop(plugins);
    session
}

/// A plugin that offers no cloning-only load (the tone plugin declares none;
/// its ABI 5.1 build predates the field) is loaded in full: it synthesizes,
/// and voice save reaches its `clone_voice`.
#[test]
fn a_plugin_without_a_cloning_load_is_loaded_in_full() {
    let current = artifacts().join("libtts_test_tone.so");
    let mut plugins = vec![current];
    plugins.extend(old_abi_tone_plugin("5.1"));
    for plugin in plugins {
        let dir = tempfile::tempdir().unwrap();
        let mut session = tone_for_cloning(&plugin, dir.path());
        assert!(!session.cloning_only, "{}", plugin.display());
        assert_eq!(session.synthesize("hi").unwrap().samples.len(), 3200, "{}: the full model synthesizes", plugin.display());
        let e = session.save_voice(&plugin, &dir.path().join("x.voice")).unwrap_err();
        assert!(e.0.contains("does not clone voices"), "{}: {}", plugin.display(), e.0);
    }
}

/// `cargo xtask test` builds the tone plugin against ABI 5.2 (the root module
/// of then, without `load_for_cloning`; `--features abi-5-2`) into
/// `target/abi-5-2/`: the loader takes it through 5.2's interface, where it
/// keeps what 5.2 had (streaming in pieces), and loads it in full to clone.
#[test]
fn a_plugin_built_against_abi_5_2_keeps_streaming_and_clones_through_the_full_load() {
    let Some(old_plugin) = old_abi_tone_plugin("5.2") else {
        return;
    };
    let (loaded, _) = engine_core::loader::load_model(&old_plugin).unwrap();
    assert_eq!((loaded.abi_version(), loaded.has_cloning_load()), ("5.2.0", false));
    let (current, _) = engine_core::loader::load_model(&artifacts().join("libtts_test_tone.so")).unwrap();
    assert_eq!((current.abi_version(), current.has_cloning_load()), (engine_core::PLUGIN_ABI_VERSION, false));
    let dir = tempfile::tempdir().unwrap();
    let mut session = tone_for_cloning(&old_plugin, dir.path());
    assert!(!session.cloning_only);
    let mut pieces = 0;
    session
        .synthesize_streaming("hello", |_, _| {
            pieces += 1;
            Ok(true)
        })
        .unwrap();
    assert_eq!(pieces, 5, "one piece per character, as the 5.2 build streamed");
}
