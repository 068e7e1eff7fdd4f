//! `tts` with the Chatterbox plugin on the committed tiny Turbo fixture:
//! text → waveform against `ChatterboxTurboTTS.generate` (recorded draws) on
//! CPU and Vulkan, CPU vs Vulkan on a seeded sentence, `tts bench`, and the
//! bad-input contract (one line on stderr, exit 1, no output file).

mod common;

use common::*;
use std::path::{Path, PathBuf};

fn fixture() -> PathBuf {
    repo().join("tests/fixtures/chatterbox/turbo-tiny")
}

/// Backend plugins plus the Chatterbox plugin in one directory.
fn setup(backends: &[&str]) -> tempfile::TempDir {
    let plugins = plugin_dir(backends);
    std::fs::copy(artifacts().join("libtts_model_chatterbox.so"), plugins.path().join("libtts_model_chatterbox.so")).unwrap();
    plugins
}

fn profile_for(dir: &Path, backend: &str, files: &[PathBuf]) -> PathBuf {
    let files: Vec<String> = files.iter().map(|f| format!("\"{}\"", f.display())).collect();
    write_profile(
        dir,
        &format!(
            "[backend]\nprefer = [\"{backend}\"]\nfallback = false\n[backends.cpu]\nthreads = 2\n[backends.vulkan]\nallow_software = true\npipeline_cache = false\n[model]\nfiles = [{}]\n",
            files.join(", ")
        ),
    )
}

fn model_files() -> Vec<PathBuf> {
    vec![fixture().join("t3-turbo.gguf"), fixture().join("s3gen-meanflow.gguf")]
}

fn synth(profile: &Path, plugins: &Path, text: &str, out: &Path, sets: &[&str]) -> std::process::Output {
    let mut args = vec!["--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.to_str().unwrap(), "--text", text, "--out", out.to_str().unwrap()];
    for s in sets {
        args.extend_from_slice(&["--set", s]);
    }
    run(&args)
}

/// The shared NaN-failing, length-checking comparison (`engine_core::compare`).
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    engine_core::compare::max_rel_err(a, b).unwrap_or_else(|e| panic!("{e}"))
}

/// RMS of 20 ms frames at 24 kHz.
fn frame_rms(x: &[f32]) -> Vec<f32> {
    x.chunks(480).map(|f| (f.iter().map(|v| v * v).sum::<f32>() / f.len() as f32).sqrt()).collect()
}

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    max_new_tokens: usize,
}

/// The reference's `generate(text)` through the CLI with its draws injected.
/// Tolerance, relative, plus 16-bit quantisation: 1e-3 on CPU; 5e-2 on Vulkan,
/// whose f0 differs by ~3e-4 (F16-rounded products), which the source's phase
/// integral multiplies by the cycle count (models/chatterbox/tests/parity_vulkan.rs
/// checks every stage with tight tolerances).
#[test]
fn synthesizes_the_reference_waveform_on_cpu_and_vulkan() {
    let plugins = setup(&["cpu", "vulkan"]);
    let draws = fixture().join("reference/pipeline");
    let case: Case = serde_json::from_str(&std::fs::read_to_string(draws.join("case.json")).unwrap()).unwrap();
    let bytes = std::fs::read(draws.join("wav.npy")).unwrap();
    let reference = npyz::NpyFile::new(&bytes[..]).unwrap().into_vec::<f32>().unwrap();
    let peak = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (backend, tol) in [("cpu", 1e-3), ("vulkan", 5e-2)] {
        let dir = tempfile::tempdir().unwrap();
        let profile = profile_for(dir.path(), backend, &model_files());
        let wav = dir.path().join("out.wav");
        let sets = [format!("draws={}", draws.display()), format!("max_new_tokens={}", case.max_new_tokens)];
        let o = synth(&profile, plugins.path(), &case.text, &wav, &[&sets[0], &sets[1]]);
        assert!(o.status.success(), "{backend}: {}", stderr(&o));
        let (rate, samples) = read_wav(&wav);
        assert_eq!(rate, 24000);
        assert_eq!(samples.len(), reference.len(), "{backend}: length");
        let e = rel_err(&samples, &reference);
        eprintln!("{backend}: waveform rel err {e:.2e}");
        assert!(e <= tol + 1.0 / 32767.0 / peak, "{backend}: rel err {e}");
    }
}

/// Greedy decoding through the whole pipeline on Vulkan (lavapipe) agrees with
/// the CPU: the same tokens, hence the same length, and the waveform within the
/// f0-drift bound explained above.
#[test]
fn greedy_sentence_on_vulkan_matches_cpu() {
    let plugins = setup(&["cpu", "vulkan"]);
    let text = "The quick brown fox jumps over the lazy dog.";
    let mut outputs = Vec::new();
    for backend in ["cpu", "vulkan"] {
        let dir = tempfile::tempdir().unwrap();
        let profile = profile_for(dir.path(), backend, &model_files());
        let wav = dir.path().join("greedy.wav");
        let o = synth(&profile, plugins.path(), text, &wav, &["temperature=0", "max_new_tokens=20", "seed=3"]);
        assert!(o.status.success(), "{backend}: {}", stderr(&o));
        outputs.push(read_wav(&wav).1);
    }
    assert_eq!(outputs[0].len(), outputs[1].len(), "same tokens, same length");
    // The source's phase integral turns f0 rounding into phase drift that grows
    // along the waveform (reported); the loudness envelope, which phase does not
    // move, must agree closely.
    let e = rel_err(&outputs[1], &outputs[0]);
    let envelope = rel_err(&frame_rms(&outputs[1]), &frame_rms(&outputs[0]));
    eprintln!("vulkan vs cpu: waveform rel err {e:.2e} (reported), 20 ms RMS envelope rel err {envelope:.2e}");
    assert!(envelope <= 2e-2, "vulkan vs cpu envelope: {envelope}");
}

#[test]
fn bench_reports_every_stage_rtf_and_rss() {
    let plugins = setup(&["cpu"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_for(dir.path(), "cpu", &model_files());
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
        "max_new_tokens=16",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mut stages: Vec<&str> = report["stages_ms"].as_object().unwrap().keys().map(|k| k.as_str()).collect();
    stages.sort();
    assert_eq!(stages, ["hift", "s3gen.cfm", "s3gen.encoder", "t3.decode", "t3.ms_per_token", "t3.prefill"]);
    assert_eq!(report["variant"], "turbo");
    assert!(report["rtf"].as_f64().unwrap() > 0.0);
    assert!(report["peak_rss_mib"].as_f64().unwrap() > 1.0);
}

#[test]
fn bad_inputs_are_one_line_errors_and_leave_no_file() {
    let plugins = setup(&["cpu"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_for(dir.path(), "cpu", &model_files());
    let wav = dir.path().join("x.wav");
    let check = |profile: &Path, text: &str, sets: &[&str], want: &str| {
        let o = synth(profile, plugins.path(), text, &wav, sets);
        assert_one_line_error(&o, want);
        assert!(!wav.exists(), "{want}: output file left behind");
    };
    check(&profile, "   ", &[], "text is empty");
    check(&profile, &"word ".repeat(200), &["max_chars=0"], "the text is too long for T3: its prompt takes");
    check(&profile, "Hello.", &["temperature=-1"], "temperature must be in 0..=5, got -1");
    check(&profile, "Hello.", &["top_p=0"], "top_p must be in (0, 1], got 0");
    check(&profile, "Hello.", &["top_k=-2"], "top_k must be non-negative, got -2");
    check(&profile, "Hello.", &["repetition_penalty=0.5"], "repetition_penalty must be in 1..=10, got 0.5");
    check(&profile, "Hello.", &["max_new_tokens=0"], "max_new_tokens must be in 1..=8000, got 0");
    check(&profile, "Hello.", &["cfm_steps=0"], "cfm_steps must be in 1..=10 (or -1), got 0");
    check(&profile, "Hello.", &["seed=-1"], "seed must be non-negative, got -1");
    check(&profile, "Hello.", &["speed=4.1"], "speed must be in 0.25..=4, got 4.1");
    check(&profile, "Hello.", &["speed=0.2"], "speed must be in 0.25..=4, got 0.2");
    check(&profile, "Hello.", &["temperature=hot"], "temperature");
    check(&profile, "Hello.", &["draws=/nonexistent/draws"], "draws: /nonexistent/draws does not exist");

    // A Turbo T3 with a non-meanflow (Multilingual-style) S3Gen.
    let standard = fixture().join("bad/s3gen-standard-meta.gguf");
    let p = profile_for(dir.path(), "cpu", &[fixture().join("t3-turbo.gguf"), standard]);
    check(&p, "Hello.", &[], "T3 'turbo'");
    // The same file twice, and two T3 files.
    let p = profile_for(dir.path(), "cpu", &[fixture().join("t3-turbo.gguf"), fixture().join("t3-turbo.gguf")]);
    check(&p, "Hello.", &[], "t3-turbo.gguf is given twice");
    let copy = dir.path().join("t3-copy.gguf");
    std::fs::copy(fixture().join("t3-turbo.gguf"), &copy).unwrap();
    let p = profile_for(dir.path(), "cpu", &[fixture().join("t3-turbo.gguf"), copy]);
    check(&p, "Hello.", &[], "chatterbox needs one 'chatterbox' and one 'chatterbox-s3gen' file");
    // A truncated T3.
    let full = std::fs::read(fixture().join("t3-turbo.gguf")).unwrap();
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &full[..full.len() / 2]).unwrap();
    let p = profile_for(dir.path(), "cpu", &[cut, fixture().join("s3gen-meanflow.gguf")]);
    check(&p, "Hello.", &[], "cut.gguf");
}

/// `tts voices --dir` offers a Turbo model only the voices saved by Turbo:
/// a Multilingual voice, a Supertonic voice style and other files are left
/// out (the voice files here are their GGUF headers, which is what is read).
#[test]
fn voices_lists_only_the_voice_files_of_its_own_variant() {
    let plugins = setup(&["cpu"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_for(dir.path(), "cpu", &model_files());
    let saved = dir.path().join("voices");
    std::fs::create_dir(&saved).unwrap();
    for (name, variant) in [("mine", "turbo"), ("french", "mtl")] {
        let mut w = ggml_sys::gguf::GgufWriter::new();
        w.set_str("general.architecture", "chatterbox-voice").set_str("chatterbox-voice.variant", variant);
        w.write_metadata(&saved.join(format!("{name}.voice"))).unwrap();
    }
    std::fs::write(saved.join("style.json"), b"{}").unwrap();
    std::fs::write(saved.join("broken.voice"), b"not a GGUF").unwrap();
    let args = ["voices", "--json", "--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap(), "--dir", saved.to_str().unwrap()];
    let o = run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((json["family"].as_str(), json["variant"].as_str()), (Some("chatterbox"), Some("turbo")));
    assert_eq!(json["saved"], serde_json::json!(["mine.voice"]));
}
