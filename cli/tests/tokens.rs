//! Tokens a user can see: `tts --print-tokens` (and `-v`) on stderr, `tts
//! voice show` on a saved voice and on broken files, on the tiny fixtures.
//! (`tts compare --json`'s token values: tests/compare.rs.)

mod common;

use common::*;
use engine_core::engine::Engine;
use engine_core::profile::Profile;
use std::path::Path;

/// The lines `--print-tokens` printed for `name` (`speech tokens`), as numbers,
/// checking the count it gives.
fn printed(stderr: &str, name: &str) -> Vec<u32> {
    let prefix = format!("{name} (");
    let line = stderr.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no `{name}` line in: {stderr}"));
    let (count, values) = line[prefix.len()..].split_once("): ").unwrap_or_else(|| panic!("{line}"));
    let values: Vec<u32> = values.split(' ').map(|v| v.parse().unwrap()).collect();
    assert_eq!(count.parse::<usize>().unwrap(), values.len(), "{line}");
    values
}

/// The speech tokens and text ids printed are those the model synthesized
/// with (the engine's own token streams for the same text and options), on
/// stderr only: stdout, here the audio, holds nothing else.
#[test]
fn print_tokens_shows_the_model_s_token_streams_on_stderr() {
    let plugins = plugins_with(&["cpu"], &["chatterbox", "supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &chatterbox_fixture());
    let sets = [("max_new_tokens", "12"), ("seed", "3")];
    let set_args: Vec<String> = sets.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let text = "Hello there.";
    let base = ["--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap(), "--text", text];
    let with_sets = |mut args: Vec<String>| {
        for s in &set_args {
            args.extend(["--set".to_string(), s.clone()]);
        }
        args
    };

    let engine = Engine::open(Profile::load(&profile).unwrap(), vec![plugins.path().to_path_buf()]).unwrap();
    let overrides: Vec<(String, String)> = sets.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let out = engine.open_model(&overrides).unwrap().synthesize(text).unwrap();
    let stream = |name: &str| out.tokens.iter().find(|t| t.name.as_str() == name).unwrap_or_else(|| panic!("no {name} stream")).tokens.to_vec();
    let (speech, text_ids) = (stream("speech_tokens"), stream("text_ids"));
    assert!(!speech.is_empty() && !text_ids.is_empty());

    // Audio to stdout: the tokens go to stderr.
    let args = with_sets(base.iter().map(|s| s.to_string()).chain(["--out".into(), "-".into(), "--print-tokens".into()]).collect());
    let o = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(o.stdout.starts_with(b"RIFF"), "stdout is the WAV");
    assert!(!o.stdout.windows(6).any(|w| w == b"tokens"), "no token line in the audio");
    assert_eq!(printed(&stderr(&o), "speech tokens"), speech);
    assert_eq!(printed(&stderr(&o), "text ids"), text_ids);

    // -v prints them too (to a file: the one-shot path).
    let wav = dir.path().join("a.wav");
    let args = with_sets(base.iter().map(|s| s.to_string()).chain(["--out".into(), wav.display().to_string(), "-v".into()]).collect());
    let o = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(printed(&stderr(&o), "speech tokens"), speech);
    assert_eq!(printed(&stderr(&o), "text ids"), text_ids);

    // Without either, no token line.
    let args = with_sets(base.iter().map(|s| s.to_string()).chain(["--out".into(), wav.display().to_string()]).collect());
    let o = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success() && !stderr(&o).contains("tokens ("), "{}", stderr(&o));

    // Supertonic has none, and says so.
    let sub = dir.path().join("supertonic");
    std::fs::create_dir(&sub).unwrap();
    let supertonic = profile_on(&sub, "cpu", &[supertonic_fixture()]);
    let o = run(&[
        "--profile",
        supertonic.to_str().unwrap(),
        "--plugin-dir",
        plugins.path().to_str().unwrap(),
        "--text",
        "Hello.",
        "--out",
        wav.to_str().unwrap(),
        "--print-tokens",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("supertonic has no token streams"), "{}", stderr(&o));
}

/// A voice recording: two harmonics under a syllable envelope.
fn write_reference(path: &Path) {
    let rate = 16_000;
    let spec = hound::WavSpec { channels: 1, sample_rate: rate, bits_per_sample: 16, sample_format: hound::SampleFormat::Int };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    let tau = 2.0 * std::f64::consts::PI;
    for n in 0..rate as usize * 7 {
        let t = n as f64 / rate as f64;
        let s = (0.55 + 0.45 * (tau * 2.5 * t).sin()) * (0.4 * (tau * 150.0 * t).sin() + 0.2 * (tau * 455.0 * t).sin());
        w.write_sample((s * 32767.0).round() as i16).unwrap();
    }
    w.finalize().unwrap();
}

fn i32s(bytes: &[u8]) -> Vec<i64> {
    bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64).collect()
}

/// `tts voice show` on a voice `tts voice save` wrote, with no profile or
/// plugin: the variant, every tensor's shape and type, and the token ids the
/// file holds, in full, as lines and as JSON.
#[test]
fn voice_show_prints_what_a_saved_voice_holds() {
    let plugins = plugins_with(&["cpu"], &["chatterbox"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &chatterbox_fixture());
    let reference = dir.path().join("me.wav");
    write_reference(&reference);
    let voice = dir.path().join("me.voice");
    let o = save_voice(&profile, plugins.path(), &reference, &voice);
    assert!(o.status.success(), "{}", stderr(&o));

    let file = ggml_sys::gguf::GgufTensors::open(&voice).unwrap();
    let t3_tokens = i32s(&file.read_bytes("voice.prompt_speech_tokens").unwrap());
    let s3_tokens = i32s(&file.read_bytes("voice.prompt_token").unwrap());
    assert!(!t3_tokens.is_empty() && !s3_tokens.is_empty());

    let o = run(&["voice", "show", voice.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((report["format"].as_str(), report["variant"].as_str(), report["format_version"].as_u64()), (Some("chatterbox-voice"), Some("turbo"), Some(1)));
    let tensors = report["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), file.ctx.tensors().len());
    for t in file.ctx.tensors() {
        let shown = tensors.iter().find(|s| s["name"] == t.name()).unwrap_or_else(|| panic!("{} not shown", t.name()));
        let ne = t.ne();
        let dims = ne.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1);
        assert_eq!(shown["shape"], serde_json::json!(ne[..dims]), "{shown}");
        assert_eq!(shown["dtype"], ggml_sys::type_name(t.ty()), "{shown}");
        if t.ty() == ggml_sys::TYPE_F32 {
            let values: Vec<f64> = file.read_bytes(&t.name()).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect();
            let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            // Through JSON at f32 precision (serde_json reads f64 text to within an ulp).
            assert_eq!(shown["stats"]["max"].as_f64().map(|m| m as f32), Some(max as f32), "{shown}");
            assert_eq!(shown["stats"]["non_finite"], 0, "{shown}");
        }
    }
    let values = |name: &str| -> Vec<i64> {
        let t = tensors.iter().find(|t| t["name"] == name).unwrap();
        t["values"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect()
    };
    assert_eq!(values("voice.prompt_speech_tokens"), t3_tokens);
    assert_eq!(values("voice.prompt_token"), s3_tokens);

    let o = run(&["voice", "show", voice.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(text.lines().next().unwrap().ends_with("chatterbox-voice, variant turbo, format version 1"), "{text}");
    let ids_after = |header: &str| -> Vec<i64> {
        let mut lines = text.lines().skip_while(|l| !l.contains(header));
        lines.next().unwrap_or_else(|| panic!("no `{header}` in {text}"));
        let line = lines.next().unwrap();
        line.trim().split_once(": ").unwrap().1.split(' ').map(|v| v.parse().unwrap()).collect()
    };
    assert_eq!(ids_after("T3 prompt speech tokens"), t3_tokens);
    assert_eq!(ids_after("S3Gen prompt tokens"), s3_tokens);
    assert!(text.contains("voice.prompt_feat f32 [80, "), "{text}");
}

/// A small valid voice file's bytes (the layout of docs/gguf.md).
fn voice_bytes() -> Vec<u8> {
    let mut w = ggml_sys::gguf::GgufWriter::new();
    w.set_str("general.architecture", "chatterbox-voice").set_u32("chatterbox-voice.format_version", 1).set_str("chatterbox-voice.variant", "turbo");
    let f32s = |n: usize| -> Vec<u8> { (0..n).flat_map(|i| (i as f32 * 0.01).to_le_bytes()).collect() };
    w.add_tensor("voice.speaker_emb", ggml_sys::TYPE_F32, &[256], f32s(256)).unwrap();
    w.add_tensor("voice.prompt_token", ggml_sys::TYPE_I32, &[4], [1i32, 2, 3, 4].iter().flat_map(|v| v.to_le_bytes()).collect()).unwrap();
    w.add_tensor("voice.prompt_feat", ggml_sys::TYPE_F32, &[80, 8], f32s(640)).unwrap();
    w.to_bytes().unwrap()
}

/// Broken or foreign files are one line naming what is wrong, exit 1,
/// nothing on stdout; a Supertonic voice style shows its arrays.
#[test]
fn voice_show_refuses_broken_files_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let good = voice_bytes();
    let at = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let whole = at("whole.voice", &good);
    let o = run(&["voice", "show", whole.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("ids (4): 1 2 3 4"));

    let big = dir.path().join("big.voice");
    std::fs::File::create(&big).unwrap().set_len(17 << 20).unwrap();
    let model = chatterbox_fixture()[0].clone();
    let cases: Vec<(std::path::PathBuf, &str)> = vec![
        (at("truncated.voice", &good[..good.len() - 100]), "is truncated: tensor 'voice.prompt_feat'"),
        (at("header.voice", &good[..40]), "is not a valid GGUF file"),
        (at("empty.voice", b""), "not a voice file (neither a Chatterbox voice"),
        (at("garbage.voice", &[0x9c; 4096]), "not a voice file (neither a Chatterbox voice"),
        (
            at("style.json", b"{\"style_ttl\": {\"dims\": [1, 2], \"data\": [[1, 2, 3]]}, \"style_dp\": {\"dims\": [1], \"data\": [1]}}"),
            "style_ttl holds 3 values, its dims [1, 2] say 2",
        ),
        (at("other.json", b"{\"voice\": 1}"), "not a voice style JSON"),
        (model, "a GGUF file of architecture 'chatterbox', not a voice"),
        (big, "the most this input may be"),
        (dir.path().to_path_buf(), "is a directory"),
        (dir.path().join("missing.voice"), "No such file"),
    ];
    for (path, want) in cases {
        let o = run(&["voice", "show", path.to_str().unwrap()]);
        assert_one_line_error(&o, want);
        assert!(o.stdout.is_empty(), "{}: {}", path.display(), String::from_utf8_lossy(&o.stdout));
    }

    let style = at(
        "voice.json",
        b"{\"style_ttl\": {\"dims\": [1, 2, 2], \"data\": [[[1, 2], [3, 4]]]}, \"style_dp\": {\"dims\": [1, 1, 2], \"data\": [[[0.5, -0.5]]]}}",
    );
    let o = run(&["voice", "show", style.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["format"], "supertonic-voice-style");
    let ttl = report["tensors"].as_array().unwrap().iter().find(|t| t["name"] == "style_ttl").unwrap();
    assert_eq!(ttl["shape"], serde_json::json!([1, 2, 2]));
    assert_eq!(ttl["stats"]["mean"], 2.5);
}
