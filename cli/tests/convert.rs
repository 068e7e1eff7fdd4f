//! `tts convert`: the host finds the model plugin whose converter recognises
//! a checkpoint directory and runs it (ABI 5.4). The tone test plugin's
//! converter shows the dispatch as a third-party family would use it; the
//! Chatterbox and Supertonic converters turn the committed official-format
//! tiny checkpoints into the committed GGUFs, byte for byte.

mod common;

use common::*;
use std::path::Path;

fn tone_checkpoint(dir: &Path, json: &str) -> std::path::PathBuf {
    let ckpt = dir.join("tone-ckpt");
    std::fs::create_dir_all(&ckpt).unwrap();
    std::fs::write(ckpt.join("tone.json"), json).unwrap();
    ckpt
}

fn tone_plugins() -> tempfile::TempDir {
    let plugins = plugin_dir(&["cpu"]);
    std::fs::copy(artifacts().join("libtts_test_tone.so"), plugins.path().join("libtts_model_tone.so")).unwrap();
    plugins
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_tone_checkpoint_converts_by_its_marker_file_and_then_speaks() {
    let plugins = tone_plugins();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = tone_checkpoint(dir.path(), r#"{"frequency": 440.0, "sample_rate": 16000}"#);
    let out = dir.path().join("out");
    let o = run(&["convert", s(&ckpt), s(&out), "--plugin-dir", s(plugins.path()), "--set", "octave=1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let gguf = out.join("tone.gguf");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).lines().next().unwrap(),
        format!("{}: tone, {} bytes", gguf.display(), std::fs::metadata(&gguf).unwrap().len())
    );
    assert_eq!(dir_names(&out), ["tone.gguf"], "nothing but the model: no temporary left");
    let file = ggml_sys::gguf::GgufFile::open(&gguf).unwrap();
    assert_eq!(file.get_f32("tts-test-tone.frequency").unwrap(), 880.0, "octave=1 doubles the frequency");
    assert_eq!(file.get_u32("tts-test-tone.sample_rate").unwrap(), 16000);

    let profile = profile_on(dir.path(), "cpu", &[gguf]);
    let wav = dir.path().join("a.wav");
    let o = run(&["--profile", s(&profile), "--plugin-dir", s(plugins.path()), "--text", "hi", "--out", s(&wav)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(read_wav(&wav).1.len(), 2 * 1600, "0.1 s per character at 16 kHz");
}

#[test]
fn convert_list_names_each_converter_with_its_marker_files_and_options() {
    let plugins = tone_plugins();
    let o = run(&["convert", "--list", "--json", "--plugin-dir", s(plugins.path())]);
    assert!(o.status.success(), "{}", stderr(&o));
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let tone = &list.as_array().unwrap()[0];
    assert_eq!(tone["family"], "tone");
    assert_eq!(tone["marker_files"], serde_json::json!(["tone.json"]));
    assert_eq!(tone["options"][0]["key"], "octave");
    assert_eq!(tone["options"][0]["default"], "0");
}

#[test]
fn convert_refuses_what_it_cannot_convert_in_one_line() {
    let plugins = tone_plugins();
    let dir = tempfile::tempdir().unwrap();
    let p = s(plugins.path());
    let out = dir.path().join("out");
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let o = run(&["convert", s(&empty), s(&out), "--plugin-dir", p]);
    assert_one_line_error(&o, &format!("{}: no converter recognises this directory (tone looks for tone.json); pass --family", empty.display()));
    let o = run(&["convert", s(&empty), s(&out), "--plugin-dir", p, "--family", "piper"]);
    assert_one_line_error(&o, "no converter for the family `piper` (converters: tone)");
    let o = run(&["convert", s(&dir.path().join("missing")), s(&out), "--plugin-dir", p]);
    assert_one_line_error(&o, "missing: not a directory");

    let ckpt = tone_checkpoint(dir.path(), r#"{"frequency": 440.0, "sample_rate": 16000}"#);
    let o = run(&["convert", s(&ckpt), s(&out), "--plugin-dir", p, "--set", "pitch=2"]);
    assert_one_line_error(&o, "unknown converter option `pitch` for the tone converter (known: octave)");
    let o = run(&["convert", s(&ckpt), s(&out), "--plugin-dir", p, "--set", "octave=up"]);
    assert_one_line_error(&o, "option `octave`: `up` is not an integer");
    let o = run(&["convert", s(&ckpt), s(&out), "--plugin-dir", p, "--weights", "q4_0"]);
    assert_one_line_error(&o, "unknown converter option `weights` for the tone converter (known: octave)");

    let bad = tone_checkpoint(&dir.path().join("bad"), r#"{"frequency": 9000.0, "sample_rate": 16000}"#);
    let o = run(&["convert", s(&bad), s(&out), "--plugin-dir", p]);
    assert_one_line_error(&o, "tone.json: frequency 9000 Hz at 16000 Hz is not a tone this model plays");
    assert!(!out.join("tone.gguf").exists(), "a refused conversion writes nothing");
}

/// `cargo xtask test` builds the tone plugin against ABI 5.3 (the root module
/// of then, before the converter; `--features abi-5-3`) into `target/abi-5-3/`:
/// the loader takes it through 5.3's interface; it still speaks, and converts
/// nothing.
#[test]
fn a_plugin_built_against_abi_5_3_loads_without_a_converter() {
    let Some(old_plugin) = old_abi_tone_plugin("5.3") else {
        return;
    };
    let (loaded, _) = engine_core::loader::load_model(&old_plugin).unwrap();
    assert_eq!(loaded.abi_version(), "5.3.0");
    assert!(loaded.converter().is_none());
    let (current, _) = engine_core::loader::load_model(&artifacts().join("libtts_test_tone.so")).unwrap();
    assert_eq!(current.abi_version(), engine_core::PLUGIN_ABI_VERSION);
    assert!(current.converter().is_some());

    let plugins = plugin_dir(&["cpu"]);
    std::fs::copy(&old_plugin, plugins.path().join("libtts_model_tone.so")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = tone_checkpoint(dir.path(), r#"{"frequency": 440.0, "sample_rate": 16000}"#);
    let o = run(&["convert", s(&ckpt), s(&dir.path().join("out")), "--plugin-dir", s(plugins.path())]);
    assert_one_line_error(&o, "no model plugin in");
}

/// The families' converters through the plugin ABI: the committed
/// official-format tiny checkpoints convert to the committed GGUFs, which the
/// Python converters made from the same files.
#[test]
fn the_family_plugins_convert_the_official_tiny_checkpoints_to_the_committed_ggufs() {
    let plugins = plugins_with(&["cpu"], &["chatterbox", "supertonic"]);
    let fixtures = repo().join("tests/fixtures");
    // (fixture, the GGUFs in order, converter options)
    type Case<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, &'a str)]);
    let cases: [Case; 3] = [
        ("chatterbox/turbo-tiny", &["t3-turbo.gguf", "s3gen-meanflow.gguf"], &[("t3_heads", "2"), ("cfm_heads", "2")]),
        ("chatterbox/mtl-tiny", &["t3-mtl.gguf", "s3gen.gguf"], &[("variant", "mtl"), ("t3_heads", "4"), ("cfm_heads", "2"), ("aligned_heads", "2:3,3:1,1:2")]),
        ("supertonic/tiny-v2", &["model.gguf"], &[]),
    ];
    for (case, expected, options) in cases {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let source = fixtures.join(case).join("official");
        let mut args = vec![
            "convert".to_string(),
            source.display().to_string(),
            out.display().to_string(),
            "--plugin-dir".into(),
            s(plugins.path()).into(),
            "--json".into(),
        ];
        for (k, v) in options {
            args.push("--set".into());
            args.push(format!("{k}={v}"));
        }
        let o = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(o.status.success(), "{case}: {}", stderr(&o));
        let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let files = report["files"].as_array().unwrap();
        assert_eq!(files.len(), expected.len(), "{case}: {report}");
        for (file, name) in files.iter().zip(expected) {
            let written = std::fs::read(file["path"].as_str().unwrap()).unwrap();
            let committed = std::fs::read(fixtures.join(case).join(name)).unwrap();
            assert!(written == committed, "{case}: {} differs from the committed {name}", file["path"]);
        }
    }
}

/// Supertonic 1 has no short-chunk languages: the converters leave the empty
/// `text.short_chunk_languages` out (as gguf-py leaves empty strings out), and
/// the model reads its absence as none.
#[test]
fn a_converted_supertonic_1_bundle_speaks() {
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let source = repo().join("tests/fixtures/supertonic/tiny-v1/official");
    let o = run(&["convert", s(&source), s(&out), "--plugin-dir", s(plugins.path())]);
    assert!(o.status.success(), "{}", stderr(&o));
    let gguf = out.join("supertonic-v1.gguf");
    let file = ggml_sys::gguf::GgufFile::open(&gguf).unwrap();
    assert!(!file.keys().iter().any(|k| k == "supertonic.text.short_chunk_languages"));
    let profile = profile_on(dir.path(), "cpu", &[gguf]);
    let wav = dir.path().join("a.wav");
    let o = run(&["--profile", s(&profile), "--plugin-dir", s(plugins.path()), "--text", "Hello.", "--out", s(&wav)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!read_wav(&wav).1.is_empty());
}
