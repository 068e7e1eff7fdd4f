//! `tts` with Chatterbox Multilingual on the committed tiny fixture
//! (`tests/fixtures/chatterbox/mtl-tiny/`, random weights, synthetic grapheme
//! tokenizer): the shipped profile, every language code, the reference's
//! `generate` through the CLI with recorded draws, `tts bench`, and the
//! bad-input contract (one line on stderr, exit 1, no output file).

mod common;

use common::*;
use std::path::{Path, PathBuf};

fn fixture() -> PathBuf {
    repo().join("tests/fixtures/chatterbox/mtl-tiny")
}

fn model_files() -> Vec<PathBuf> {
    vec![fixture().join("t3-mtl.gguf"), fixture().join("s3gen.gguf")]
}

fn synth(profile: &Path, plugins: &Path, text: &str, out: &Path, sets: &[&str]) -> std::process::Output {
    let mut args = vec!["--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.to_str().unwrap(), "--text", text, "--out", out.to_str().unwrap()];
    for s in sets {
        args.extend_from_slice(&["--set", s]);
    }
    run(&args)
}

/// The command on the shipped profile (whose files are the fixture in
/// a checkout); the token cap keeps the random-weight model short.
#[test]
fn french_through_the_shipped_profile_writes_24khz_audio() {
    let plugins = plugins_with(&["cpu"], &["chatterbox"]);
    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("fr.wav");
    let o = synth(&repo().join("profiles/mtl.toml"), plugins.path(), "Bonjour tout le monde.", &wav, &["language=fr", "max_new_tokens=40"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (rate, samples) = read_wav(&wav);
    assert_eq!(rate, 24000);
    assert!(!samples.is_empty() && samples.iter().all(|v| v.is_finite() && v.abs() <= 1.0));
}

#[derive(serde::Deserialize)]
struct TextCases {
    languages: Vec<String>,
    cases: Vec<TextCase>,
}

#[derive(serde::Deserialize)]
struct TextCase {
    text: String,
    language: String,
}

/// Each of the 23 codes either synthesizes its test text or is refused with
/// the one line that names the missing preprocessing.
#[test]
fn every_language_synthesizes_or_is_refused_in_one_line() {
    let plugins = plugins_with(&["cpu"], &["chatterbox"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &model_files());
    let cases: TextCases = serde_json::from_str(&std::fs::read_to_string(repo().join("tests/fixtures/chatterbox/mtl-text/cases.json")).unwrap()).unwrap();
    assert_eq!(cases.languages.len(), 23);
    let refused = [
        ("ja", "kanji-to-hiragana conversion (pykakasi in the reference)"),
        ("zh", "word segmentation and Cangjie codes (pkuseg and Cangjie5_TC.json in the reference)"),
        ("he", "Hebrew diacritics (dicta_onnx in the reference)"),
        ("ru", "Russian stress marks (russian_text_stresser in the reference)"),
    ];
    for code in &cases.languages {
        let text = cases.cases.iter().find(|c| &c.language == code).map_or("Hello.", |c| c.text.as_str());
        let wav = dir.path().join(format!("{code}.wav"));
        let language = format!("language={code}");
        let o = synth(&profile, plugins.path(), text, &wav, &[&language, "max_new_tokens=8"]);
        match refused.iter().find(|(c, _)| c == code) {
            Some((_, what)) => {
                assert_one_line_error(&o, &format!("language '{code}' needs {what}, which this engine does not have"));
                assert!(!wav.exists(), "{code}: output file left behind");
            }
            None => {
                assert!(o.status.success(), "{code}: {}", stderr(&o));
                assert_eq!(read_wav(&wav).0, 24000, "{code}");
            }
        }
    }
}

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    language: String,
    max_new_tokens: usize,
}

/// `ChatterboxMultilingualTTS.generate` with recorded draws, through the CLI's
/// options: the waveform within 1e-3 (plus 16-bit quantisation).
#[test]
fn synthesizes_the_reference_waveform_through_the_cli() {
    let plugins = plugins_with(&["cpu"], &["chatterbox"]);
    let draws = fixture().join("reference/pipeline");
    let case: Case = serde_json::from_str(&std::fs::read_to_string(draws.join("case.json")).unwrap()).unwrap();
    let bytes = std::fs::read(draws.join("wav.npy")).unwrap();
    let reference = npyz::NpyFile::new(&bytes[..]).unwrap().into_vec::<f32>().unwrap();
    let peak = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &model_files());
    let wav = dir.path().join("out.wav");
    let sets = [format!("draws={}", draws.display()), format!("max_new_tokens={}", case.max_new_tokens), format!("language={}", case.language)];
    let o = synth(&profile, plugins.path(), &case.text, &wav, &[&sets[0], &sets[1], &sets[2]]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (rate, samples) = read_wav(&wav);
    assert_eq!(rate, 24000);
    let e = engine_core::compare::max_rel_err(&samples, &reference).unwrap();
    eprintln!("waveform rel err {e:.2e}");
    assert!(e <= 1e-3 + 1.0 / 32767.0 / peak, "rel err {e}");
}

#[test]
fn bench_reports_the_guided_stages() {
    let plugins = plugins_with(&["cpu"], &["chatterbox"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &model_files());
    let (p, d) = (profile.to_str().unwrap(), plugins.path().to_str().unwrap());
    let o = run(&[
        "bench",
        "--profile",
        p,
        "--plugin-dir",
        d,
        "--text",
        "Hello there.",
        "--runs",
        "1",
        "--json",
        "--set",
        "max_new_tokens=12",
        "--set",
        "min_new_tokens=12",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mut stages: Vec<&str> = report["stages_ms"].as_object().unwrap().keys().map(|k| k.as_str()).collect();
    stages.sort();
    assert_eq!(stages, ["hift", "s3gen.cfm", "s3gen.encoder", "t3.decode", "t3.ms_per_token", "t3.prefill"]);
    assert_eq!(report["variant"], "mtl");
}

#[test]
fn bad_inputs_are_one_line_errors_and_leave_no_file() {
    let plugins = plugins_with(&["cpu"], &["chatterbox"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &model_files());
    let wav = dir.path().join("x.wav");
    let check = |profile: &Path, sets: &[&str], want: &str| {
        let o = synth(profile, plugins.path(), "Hello.", &wav, sets);
        assert_one_line_error(&o, want);
        assert!(!wav.exists(), "{want}: output file left behind");
    };
    check(
        &profile,
        &["language=xx"],
        "unknown language 'xx'; Multilingual speaks ar, da, de, el, en, es, fi, fr, he, hi, it, ja, ko, ms, nl, no, pl, pt, ru, sv, sw, tr, zh",
    );
    check(&profile, &["cfg_weight=1.5"], "cfg_weight must be in 0..=1, got 1.5");
    check(&profile, &["cfg_weight=-0.1"], "cfg_weight must be in 0..=1, got -0.1");
    check(&profile, &["exaggeration=nan"], "option `exaggeration`: `nan` is not a finite float");
    check(&profile, &["min_p=2"], "min_p must be in 0..=1, got 2");
    check(&profile, &["guidance=sideways"], "guidance must be batch or two-pass, got 'sideways'");
    check(&profile, &["top_k=50"], "top_k=50 does not apply to Multilingual, which filters with min_p");

    let turbo = repo().join("tests/fixtures/chatterbox/turbo-tiny");
    // A Multilingual T3 with the Turbo (meanflow) S3Gen, and a Turbo T3 with the standard one.
    let p = profile_on(dir.path(), "cpu", &[fixture().join("t3-mtl.gguf"), turbo.join("s3gen-meanflow.gguf")]);
    check(&p, &[], "T3 'mtl'");
    check(&p, &[], "pairs with the standard S3Gen (s3gen.gguf)");
    let p = profile_on(dir.path(), "cpu", &[turbo.join("t3-turbo.gguf"), fixture().join("s3gen.gguf")]);
    check(&p, &[], "pairs with the meanflow S3Gen (s3gen-meanflow.gguf)");
    // A Multilingual T3 carrying the Turbo (GPT-2) tokenizer: its ids fit, its frame tokens are missing.
    let p = profile_on(dir.path(), "cpu", &[fixture().join("bad/t3-mtl-turbo-tokenizer.gguf"), fixture().join("s3gen.gguf")]);
    check(&p, &[], "t3-mtl-turbo-tokenizer.gguf: chatterbox.tokenizer_json: the embedded tokenizer has no [START] token");
    // Turbo speaks English only.
    let p = profile_on(dir.path(), "cpu", &[turbo.join("t3-turbo.gguf"), turbo.join("s3gen-meanflow.gguf")]);
    check(&p, &["language=fr"], "turbo speaks English only (language=en); language 'fr' needs the Multilingual model");
}
