//! `tts` with the Supertonic plugin on the committed tiny fixtures: end-to-end
//! synthesis on CPU and Vulkan against the NumPy reference's waveform, CPU vs
//! Vulkan on a 10-word sentence, `tts bench`, and the bad-input contract (one
//! line on stderr, exit 1, no output file).

mod common;

use common::*;
use std::path::{Path, PathBuf};

fn fixture(config: &str) -> PathBuf {
    repo().join("tests/fixtures/supertonic").join(config)
}

/// Backend plugins plus the Supertonic plugin in one directory.
fn setup(backends: &[&str]) -> tempfile::TempDir {
    let plugins = plugin_dir(backends);
    std::fs::copy(artifacts().join("libtts_model_supertonic.so"), plugins.path().join("libtts_model_supertonic.so")).unwrap();
    plugins
}

fn profile_for(dir: &Path, backend: &str, model: &Path) -> PathBuf {
    write_profile(
        dir,
        &format!(
            "[backend]\nprefer = [\"{backend}\"]\nfallback = false\n[backends.cpu]\nthreads = 2\n[backends.vulkan]\nallow_software = true\npipeline_cache = false\n[model]\nfiles = [\"{}\"]\n",
            model.display()
        ),
    )
}

fn synth(profile: &Path, plugins: &Path, text: &str, out: &Path, sets: &[&str]) -> std::process::Output {
    let mut args = vec!["--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.to_str().unwrap(), "--text", text, "--out", out.to_str().unwrap()];
    for s in sets {
        args.extend_from_slice(&["--set", s]);
    }
    run(&args)
}

fn reference_wav(case: &str) -> Vec<f32> {
    let bytes = std::fs::read(fixture("tiny-v2").join("reference").join(case).join("wav.npy")).unwrap();
    npyz::NpyFile::new(&bytes[..]).unwrap().into_vec::<f32>().unwrap()
}

/// The shared NaN-failing, length-checking comparison (`engine_core::compare`).
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    engine_core::compare::max_rel_err(a, b).unwrap_or_else(|e| panic!("{e}"))
}

/// The `en` reference case through the CLI. Tolerance: the parity tolerance of
/// the backend (1e-4 CPU, 5e-3 Vulkan) plus 16-bit quantisation of the WAV.
#[test]
fn synthesizes_the_reference_waveform_on_cpu_and_vulkan() {
    let plugins = setup(&["cpu", "vulkan"]);
    let reference = reference_wav("en");
    let peak = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
    // Vulkan's duration rounds through f16, so its trimmed length may be one
    // sample off (Tolerances::trim_samples): bounded, then compared over both.
    for (backend, tol, length_slack) in [("cpu", 1e-4, 0), ("vulkan", 5e-3, 1)] {
        let dir = tempfile::tempdir().unwrap();
        let profile = profile_for(dir.path(), backend, &fixture("tiny-v2/model.gguf"));
        let wav = dir.path().join("en.wav");
        let o = synth(&profile, plugins.path(), "Hello, world! This is a tiny test.", &wav, &["voice=F1", "language=en", "steps=5", "speed=1.05", "seed=42"]);
        assert!(o.status.success(), "{backend}: {}", stderr(&o));
        let (rate, samples) = read_wav(&wav);
        assert_eq!(rate, 44100);
        assert!(samples.len().abs_diff(reference.len()) <= length_slack, "{backend}: {} samples vs {}", samples.len(), reference.len());
        let n = samples.len().min(reference.len());
        let e = rel_err(&samples[..n], &reference[..n]);
        eprintln!("{backend}: waveform rel err {e:.2e}");
        assert!(e <= tol + 1.0 / 32767.0 / peak, "{backend}: rel err {e}");
    }
}

/// The initial noise from a `.npy` file (the reference's own draws) gives the
/// reference waveform whatever the seed; a voice style JSON in the official
/// format loads and changes the voice: one written here, and the real
/// Supertonic 2 `M1.json` when `TTS_SHARED_DATA` names the shared data
/// directory (not committed).
#[test]
fn noise_file_and_voice_json_drive_synthesis() {
    let plugins = setup(&["cpu"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_for(dir.path(), "cpu", &fixture("tiny-v2/model.gguf"));
    let text = "Hello, world! This is a tiny test.";
    let noise = fixture("tiny-v2/reference/en/noise.npy");
    let wav = dir.path().join("noise.wav");
    let o = synth(&profile, plugins.path(), text, &wav, &["voice=F1", "steps=5", "seed=999", &format!("noise_npy={}", noise.display())]);
    assert!(o.status.success(), "{}", stderr(&o));
    let reference = reference_wav("en");
    let peak = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
    let e = rel_err(&read_wav(&wav).1, &reference);
    assert!(e <= 1e-4 + 1.0 / 32767.0 / peak, "noise file: rel err {e}");

    let written = dir.path().join("voice.json");
    let values = |n: usize, k: f32| (0..n).map(|i| ((i as f32 * k).sin() * 0.5).to_string()).collect::<Vec<_>>().join(",");
    std::fs::write(
        &written,
        format!(
            r#"{{"style_ttl":{{"dims":[1,50,256],"type":"float32","data":[{}]}},"style_dp":{{"dims":[1,8,16],"type":"float32","data":[{}]}}}}"#,
            values(50 * 256, 0.37),
            values(128, 0.91)
        ),
    )
    .unwrap();
    let mut voices = vec![written];
    match std::env::var_os("TTS_SHARED_DATA") {
        Some(shared) => voices.push(PathBuf::from(shared).join("supertonic-v2/voice_styles/M1.json")),
        None => eprintln!("skipped the real M1.json: TTS_SHARED_DATA does not name the shared data directory"),
    }
    for voice in voices {
        let out = dir.path().join("voice.wav");
        let o = synth(&profile, plugins.path(), text, &out, &["steps=5", &format!("voice={}", voice.display())]);
        assert!(o.status.success(), "{}: {}", voice.display(), stderr(&o));
        let (rate, samples) = read_wav(&out);
        assert_eq!(rate, 44100);
        assert!(samples.len() != reference.len() || rel_err(&samples, &reference) > 1e-2, "{}: another voice should change the waveform", voice.display());
    }
}

/// Warm synthesis of a 10-word sentence on Vulkan (lavapipe) agrees with the CPU
/// (tolerance 5e-3 relative, as the Vulkan parity tests).
#[test]
fn ten_words_on_vulkan_match_cpu() {
    let plugins = setup(&["cpu", "vulkan"]);
    let text = "The quick brown fox jumps over the lazy dog every morning.";
    let mut outputs = Vec::new();
    for backend in ["cpu", "vulkan"] {
        let dir = tempfile::tempdir().unwrap();
        let profile = profile_for(dir.path(), backend, &fixture("tiny-v3/model.gguf"));
        let wav = dir.path().join("ten.wav");
        let o = synth(&profile, plugins.path(), text, &wav, &["language=en"]);
        assert!(o.status.success(), "{backend}: {}", stderr(&o));
        outputs.push(read_wav(&wav).1);
    }
    // The trimmed length may differ by one sample (Vulkan's duration rounds
    // through f16; see Tolerances::trim_samples): bounded, then compared.
    let (a, b) = (&outputs[1], &outputs[0]);
    assert!(a.len().abs_diff(b.len()) <= 1, "lengths {} and {}", a.len(), b.len());
    let n = a.len().min(b.len());
    let e = rel_err(&a[..n], &b[..n]);
    eprintln!("vulkan vs cpu: rel err {e:.2e}");
    assert!(e <= 5e-3, "vulkan vs cpu: {e}");
}

#[test]
fn bench_reports_every_stage_rtf_and_rss() {
    let plugins = setup(&["cpu"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_for(dir.path(), "cpu", &fixture("tiny-v3/model.gguf"));
    let o = run(&[
        "bench",
        "--profile",
        profile.to_str().unwrap(),
        "--plugin-dir",
        plugins.path().to_str().unwrap(),
        "--text",
        "Hello there.",
        "--runs",
        "2",
        "--json",
        "--set",
        "steps=3",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let stages: Vec<&str> = report["stages_ms"].as_object().unwrap().keys().map(|k| k.as_str()).collect();
    assert_eq!(stages, ["duration", "text_encoder", "vector_estimator.step0", "vector_estimator.step1", "vector_estimator.step2", "vocoder"]);
    assert_eq!(report["variant"], "v3");
    assert!(report["rtf"].as_f64().unwrap() > 0.0);
    assert!(report["peak_rss_mib"].as_f64().unwrap() > 1.0);
}

/// A plugin's own log events reach stderr under `TTS_LOG` (each plugin library
/// has its own `tracing` dispatcher; engine_core::logging installs it there).
#[test]
fn plugin_log_events_reach_stderr() {
    let plugins = setup(&["cpu"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_for(dir.path(), "cpu", &fixture("tiny-v2/model.gguf"));
    let wav = dir.path().join("log.wav");
    let o = std::process::Command::new(tts())
        .args(["--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap(), "--text", "Hello.", "--out", wav.to_str().unwrap()])
        .env("TTS_LOG", "info")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("supertonic model loaded") && err.contains("version=\"v2\""), "plugin event missing from stderr: {err}");
}

/// Characters the model lacks are left out with a warning that names them
/// (the default), or read as the last embedding row (`official`); v3 takes at
/// most 50 steps, as the official helper.
#[test]
fn unsupported_characters_and_v3_steps_follow_the_official_helper() {
    let plugins = setup(&["cpu"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_for(dir.path(), "cpu", &fixture("tiny-v2/model.gguf"));
    let wav = dir.path().join("x.wav");
    for (policy, how) in [("skip", "left out"), ("official", "read as the last embedding row")] {
        let o = synth(&profile, plugins.path(), "Tokyo is 東京 ß", &wav, &[&format!("unsupported_chars={policy}")]);
        assert!(o.status.success(), "{policy}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains(&format!("characters this model has no row for were {how}")) && err.contains("'東' (U+6771), '京' (U+4EAC), 'ß' (U+00DF)"),
            "{policy}: {err}"
        );
        assert!(read_wav(&wav).1.len() > 1000);
    }
    let v3 = profile_for(dir.path(), "cpu", &fixture("tiny-v3/model.gguf"));
    let o = synth(&v3, plugins.path(), "Hello.", &wav, &["steps=51"]);
    assert_one_line_error(&o, "steps must be in 1..=50 for Supertonic v3, got 51");
    let o = synth(&v3, plugins.path(), "Hello.", &wav, &["steps=50"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn bad_inputs_are_one_line_errors_and_leave_no_file() {
    let plugins = setup(&["cpu"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_for(dir.path(), "cpu", &fixture("tiny-v2/model.gguf"));
    let wav = dir.path().join("x.wav");
    let check = |text: &str, sets: &[&str], want: &str| {
        let o = synth(&profile, plugins.path(), text, &wav, sets);
        assert_one_line_error(&o, want);
        assert!(!wav.exists(), "{want}: output file left behind");
    };
    check("", &[], "text is empty");
    check("   ", &[], "text is empty");
    check("Tokyo is 東京 ß", &["unsupported_chars=error"], "unsupported characters for this model: '東' (U+6771), '京' (U+4EAC), 'ß' (U+00DF)");
    check("東京 ß", &[], "nothing speakable remains of \"東京 ß\" without the characters this model lacks: '東' (U+6771), '京' (U+4EAC), 'ß' (U+00DF)");
    check("Hello.", &["unsupported_chars=drop"], "unsupported_chars must be one of skip, error, official, got 'drop'");
    check("Hello.", &["voice=Q7"], "unknown voice 'Q7' (embedded voices: F1, M1;");
    check("Hello.", &["voice=/nonexistent/voice.json"], "voice file /nonexistent/voice.json");
    check("Hello.", &["language=de"], "language 'de' is not supported by Supertonic v2 (supported: en, ko, es, pt, fr)");
    check("Hello.", &["steps=0"], "steps must be in 1..=100 (v3: 1..=50), got 0");
    check("Hello.", &["steps=101"], "steps must be in 1..=100 for Supertonic v2, got 101");
    check("Hello.", &["speed=4.5"], "speed must be in 0.25..=4, got 4.5");
    check("Hello.", &["speed=0.1"], "speed must be in 0.25..=4, got 0.1");
    check("Hello.", &["seed=-3"], "seed must be in 0..=4294967295, got -3");
    check("Hello.", &["noise_npy=/nonexistent/noise.npy"], "noise file /nonexistent/noise.npy");

    // A voice style JSON of the wrong shape.
    let voice = dir.path().join("small.json");
    std::fs::write(&voice, r#"{"style_ttl":{"dims":[1,2,2],"type":"float32","data":[[[0,0],[0,0]]]},"style_dp":{"dims":[1,8,16],"type":"float32","data":[]}}"#)
        .unwrap();
    check("Hello.", &[&format!("voice={}", voice.display())], "style_ttl has dims [1, 2, 2], this model needs [1, 50, 256]");

    // A GGUF of another family.
    let other = dir.path().join("kokoro.gguf");
    let mut w = ggml_sys::gguf::GgufWriter::new();
    w.set_str("general.architecture", "kokoro");
    w.write_metadata(&other).unwrap();
    let p = profile_for(dir.path(), "cpu", &other);
    assert_one_line_error(&synth(&p, plugins.path(), "Hello.", &wav, &[]), "no model plugin loads architecture 'kokoro'");
    // A Supertonic GGUF without its hyper-parameters.
    let bare = dir.path().join("bare.gguf");
    let mut w = ggml_sys::gguf::GgufWriter::new();
    w.set_str("general.architecture", "supertonic");
    w.write_metadata(&bare).unwrap();
    let p = profile_for(dir.path(), "cpu", &bare);
    assert_one_line_error(&synth(&p, plugins.path(), "Hello.", &wav, &[]), "metadata key 'supertonic.version' is missing");
    // A truncated GGUF.
    let full = std::fs::read(fixture("tiny-v2/model.gguf")).unwrap();
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &full[..full.len() / 2]).unwrap();
    let p = profile_for(dir.path(), "cpu", &cut);
    assert_one_line_error(&synth(&p, plugins.path(), "Hello.", &wav, &[]), "is truncated");
    assert!(!wav.exists());
}
