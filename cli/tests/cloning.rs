//! Voice cloning through `tts`: `--set reference_audio=`, `tts voice save` and
//! `--set voice=` on the tiny Turbo and Multilingual fixtures, and the
//! reference recordings users hand in, good and bad: each a one-line error
//! (exit 1, no output file) or a documented success.

mod common;

use common::*;
use std::path::{Path, PathBuf};

fn mtl_files() -> Vec<PathBuf> {
    let dir = repo().join("tests/fixtures/chatterbox/mtl-tiny");
    vec![dir.join("t3-mtl.gguf"), dir.join("s3gen.gguf")]
}

/// A voiced recording: two harmonics under a syllable envelope, a little noise.
fn voiced(rate: u32, seconds: f64) -> Vec<f64> {
    let mut state: u32 = 12345;
    (0..(rate as f64 * seconds) as usize)
        .map(|n| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let t = n as f64 / rate as f64;
            let tau = 2.0 * std::f64::consts::PI;
            let env = 0.55 + 0.45 * (tau * 2.5 * t).sin();
            env * (0.4 * (tau * 150.0 * t).sin() + 0.2 * (tau * 455.0 * t).sin()) + 0.02 * (state as f64 / u32::MAX as f64 - 0.5)
        })
        .collect()
}

/// Writes `channels` copies of `samples` as a WAV of the given sample format.
fn write_wav(path: &Path, samples: &[f64], rate: u32, channels: u16, bits: u16, float: bool) {
    let format = if float { hound::SampleFormat::Float } else { hound::SampleFormat::Int };
    let spec = hound::WavSpec { channels, sample_rate: rate, bits_per_sample: bits, sample_format: format };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    for &s in samples {
        for _ in 0..channels {
            match (float, bits) {
                (true, _) => w.write_sample(s as f32).unwrap(),
                (false, 8) => w.write_sample((s * 127.0).round() as i8).unwrap(),
                (false, 16) => w.write_sample((s * 32767.0).round() as i16).unwrap(),
                (false, 24) => w.write_sample((s * 8_388_607.0).round() as i32).unwrap(),
                _ => unreachable!(),
            }
        }
    }
    w.finalize().unwrap();
}

fn synth(profile: &Path, plugins: &Path, out: &Path, sets: &[String]) -> std::process::Output {
    let mut args =
        vec!["--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.to_str().unwrap(), "--text", "Hello there.", "--out", out.to_str().unwrap()];
    for s in sets {
        args.extend_from_slice(&["--set", s]);
    }
    run(&args)
}

/// A voice saved once synthesizes exactly what cloning at every synthesis
/// does, on Turbo and on Multilingual (whose T3 runs the voice encoder too);
/// a voice saved with one variant is refused by the other, and by Supertonic.
#[test]
fn a_saved_voice_synthesizes_what_the_recording_does() {
    let plugins = plugins_with(&["cpu"], &["chatterbox", "supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let reference = dir.path().join("me.wav");
    write_wav(&reference, &voiced(16_000, 7.0), 16_000, 1, 16, false);
    let mut voices = Vec::new();
    for (variant, files) in [("turbo", chatterbox_fixture()), ("mtl", mtl_files())] {
        let sub = dir.path().join(variant);
        std::fs::create_dir(&sub).unwrap();
        let profile = profile_on(&sub, "cpu", &files);
        let voice = sub.join("me.voice");
        let o = save_voice(&profile, plugins.path(), &reference, &voice);
        assert!(o.status.success(), "{variant}: {}", stderr(&o));
        assert!(stderr(&o).contains("clone.voice_encoder"), "{}", stderr(&o));
        let (a, b, c) = (sub.join("saved.wav"), sub.join("cloned.wav"), sub.join("builtin.wav"));
        let o = synth(&profile, plugins.path(), &a, &[format!("voice={}", voice.display()), "seed=7".into()]);
        assert!(o.status.success(), "{variant}: {}", stderr(&o));
        let o = synth(&profile, plugins.path(), &b, &[format!("reference_audio={}", reference.display()), "seed=7".into()]);
        assert!(o.status.success(), "{variant}: {}", stderr(&o));
        let o = synth(&profile, plugins.path(), &c, &["seed=7".into()]);
        assert!(o.status.success(), "{variant}: {}", stderr(&o));
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap(), "{variant}: saved voice vs cloning at synthesis");
        assert_ne!(std::fs::read(&a).unwrap(), std::fs::read(&c).unwrap(), "{variant}: the cloned voice is not the built-in one");
        voices.push((profile, voice));
    }
    let [(turbo_profile, turbo_voice), (mtl_profile, mtl_voice)] = &voices[..] else { unreachable!() };
    let out = dir.path().join("x.wav");
    let o = synth(mtl_profile, plugins.path(), &out, &[format!("voice={}", turbo_voice.display())]);
    assert_one_line_error(&o, "the voice was saved with Chatterbox turbo; this model is mtl (save the voice again with this model)");
    let o = synth(turbo_profile, plugins.path(), &out, &[format!("voice={}", mtl_voice.display())]);
    assert_one_line_error(&o, "the voice was saved with Chatterbox mtl; this model is turbo");
    let o = synth(turbo_profile, plugins.path(), &out, &[format!("voice={}", turbo_voice.display()), format!("reference_audio={}", reference.display())]);
    assert_one_line_error(&o, "both name a voice; give one");
    let sub = dir.path().join("supertonic");
    std::fs::create_dir(&sub).unwrap();
    let supertonic = profile_on(&sub, "cpu", &[supertonic_fixture()]);
    let o = synth(&supertonic, plugins.path(), &out, &[format!("voice={}", turbo_voice.display())]);
    assert_one_line_error(&o, "a GGUF voice of another model family (Chatterbox); Supertonic takes a voice style JSON");
    // A Supertonic voice style handed to Chatterbox.
    let style = dir.path().join("style.json");
    std::fs::write(&style, "{\"style_ttl\": {}, \"style_dp\": {}}").unwrap();
    let o = synth(turbo_profile, plugins.path(), &out, &[format!("voice={}", style.display())]);
    assert_one_line_error(&o, "not a Chatterbox voice file (those are GGUF files saved by `tts voice save`)");
    // A model file is a GGUF file, but not a voice.
    let o = synth(turbo_profile, plugins.path(), &out, &[format!("voice={}", chatterbox_fixture()[1].display())]);
    assert_one_line_error(&o, "not a Chatterbox voice file (architecture 'chatterbox-s3gen'");
    // A voice from a newer tts.
    let newer = dir.path().join("newer.voice");
    let mut edit = ggml_sys::gguf::GgufEditor::open(turbo_voice).unwrap();
    edit.set_u32("chatterbox-voice.format_version", 2);
    edit.write(&newer).unwrap();
    let o = synth(turbo_profile, plugins.path(), &out, &[format!("voice={}", newer.display())]);
    assert_one_line_error(&o, "voice format version 2 comes from a newer tts; this one reads version 1 and older");
    // A voice whose prompt mel was tampered with.
    let bad = dir.path().join("nan.voice");
    let mut edit = ggml_sys::gguf::GgufEditor::open(turbo_voice).unwrap();
    edit.fill_f32("voice.prompt_feat", f32::NAN).unwrap();
    edit.write(&bad).unwrap();
    let o = synth(turbo_profile, plugins.path(), &out, &[format!("voice={}", bad.display())]);
    assert_one_line_error(&o, "voice.prompt_feat[0] is not a finite number");
    assert!(!out.exists());
}

/// Every recording a user might hand in: an error naming what is wrong, or
/// a voice (with a warning where the result may disappoint).
#[test]
fn bad_references_are_one_line_errors_or_documented_successes() {
    let plugins = plugins_with(&["cpu"], &["chatterbox"]);
    let dir = tempfile::tempdir().unwrap();
    let turbo = profile_on(dir.path(), "cpu", &chatterbox_fixture());
    let path = |name: &str| dir.path().join(name);
    let out = path("out.voice");
    let voice = voiced(24_000, 6.0);

    let fails = |reference: &Path, want: &str| {
        let o = save_voice(&turbo, plugins.path(), reference, &out);
        assert_one_line_error(&o, want);
        assert!(!out.exists(), "{}: an output file was left behind", reference.display());
    };
    std::fs::write(path("notes.wav"), "these are not samples").unwrap();
    fails(&path("notes.wav"), "notes.wav: not a recognised audio file (WAV, FLAC, MP3 or Ogg Vorbis)");
    std::fs::write(path("empty.wav"), "").unwrap();
    fails(&path("empty.wav"), "empty.wav: the file is empty");
    fails(&path("missing.wav"), "reference ");
    write_wav(&path("half.wav"), &voice[..12_000], 24_000, 1, 16, false);
    fails(&path("half.wav"), "half.wav: the recording is 0.50 s long; this model needs a reference longer than 5 s");
    write_wav(&path("silence.wav"), &vec![0.0; 24_000 * 6], 24_000, 1, 16, false);
    fails(&path("silence.wav"), "silence.wav: the recording is silent (every sample is zero");
    let whisper: Vec<f64> = voice.iter().map(|s| s * 1e-4).collect();
    write_wav(&path("whisper.wav"), &whisper, 24_000, 1, 32, true);
    fails(&path("whisper.wav"), "whisper.wav: the recording is silent (its peak is -");
    write_wav(&path("full.wav"), &voice, 24_000, 1, 16, false);
    let bytes = std::fs::read(path("full.wav")).unwrap();
    std::fs::write(path("cut-header.wav"), &bytes[..30]).unwrap();
    fails(&path("cut-header.wav"), "cut-header.wav: not a valid WAV file");

    let succeeds = |reference: &Path, warning: Option<&str>| {
        let o = save_voice(&turbo, plugins.path(), reference, &out);
        assert!(o.status.success(), "{}: {}", reference.display(), stderr(&o));
        if let Some(w) = warning {
            assert!(stderr(&o).contains(w), "{}: want `{w}` in {}", reference.display(), stderr(&o));
        }
        assert!(std::fs::metadata(&out).unwrap().len() > 0);
        std::fs::remove_file(&out).unwrap();
    };
    let clipped: Vec<f64> = voice.iter().map(|s| (s * 4.0).clamp(-1.0, 1.0)).collect();
    write_wav(&path("clipped.wav"), &clipped, 24_000, 1, 16, false);
    succeeds(&path("clipped.wav"), Some("of the samples are clipped; the cloned voice may sound distorted"));
    write_wav(&path("8k.wav"), &voiced(8_000, 6.0), 8_000, 1, 16, false);
    succeeds(&path("8k.wav"), Some("recorded at 8000 Hz"));
    write_wav(&path("96k.wav"), &voiced(96_000, 6.0), 96_000, 1, 16, false);
    succeeds(&path("96k.wav"), None);
    write_wav(&path("stereo.wav"), &voice, 24_000, 2, 16, false);
    succeeds(&path("stereo.wav"), None);
    for (name, bits, float) in [("8bit.wav", 8, false), ("24bit.wav", 24, false), ("float.wav", 32, true)] {
        write_wav(&path(name), &voice, 24_000, 1, bits, float);
        succeeds(&path(name), None);
    }
    // Two hours that claim 1.3 GB: a minute of voice, then a sparse tail; only
    // the first 60 s are read.
    let long = path("two-hours.wav");
    let minute = voiced(48_000, 60.0);
    write_wav(&long, &minute, 48_000, 2, 16, false);
    let data_bytes: u64 = 2 * 3600 * 48_000 * 4;
    let f = std::fs::OpenOptions::new().write(true).open(&long).unwrap();
    f.set_len(44 + data_bytes).unwrap();
    drop(f);
    let mut header = std::fs::read(&long).map(|b| b[..44].to_vec()).unwrap();
    header[4..8].copy_from_slice(&((36 + data_bytes) as u32).to_le_bytes());
    header[40..44].copy_from_slice(&(data_bytes as u32).to_le_bytes());
    let f = std::fs::OpenOptions::new().write(true).open(&long).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &header, 0).unwrap();
    drop(f);
    succeeds(&long, Some("longer than 60 s; the first 60 s are used"));
}

/// `tts bench --reference` times the cloning stages alone; a family that
/// does not clone (Supertonic: the ABI's default answer) says so in one line.
#[test]
fn bench_times_cloning_and_families_without_it_refuse() {
    let plugins = plugins_with(&["cpu"], &["chatterbox", "supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let reference = dir.path().join("me.wav");
    write_wav(&reference, &voiced(24_000, 6.0), 24_000, 1, 16, false);
    let turbo = profile_on(dir.path(), "cpu", &chatterbox_fixture());
    let bench = |profile: &Path| {
        run(&[
            "bench",
            "--profile",
            profile.to_str().unwrap(),
            "--plugin-dir",
            plugins.path().to_str().unwrap(),
            "--reference",
            reference.to_str().unwrap(),
            "--runs",
            "2",
            "--json",
        ])
    };
    let o = bench(&turbo);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["work"], "clone_voice");
    let stages = report["stages_ms"].as_object().unwrap();
    for stage in ["clone.read", "clone.resample", "clone.prompt", "clone.campplus", "clone.s3tokenizer", "clone.voice_encoder"] {
        assert!(stages[stage].as_f64().unwrap() > 0.0, "{stage}: {stages:?}");
    }
    let sub = dir.path().join("supertonic");
    std::fs::create_dir(&sub).unwrap();
    let o = bench(&profile_on(&sub, "cpu", &[supertonic_fixture()]));
    assert_one_line_error(&o, "this model family does not clone voices");
}

/// A voice file may hold no more prompt than cloning makes of the longest
/// reference it reads (10 s: 500 mel frames at 24 kHz, docs/gguf.md). A
/// crafted file that claimed 65,536 frames cost 2.4 GB; one frame past the
/// bound is refused now, naming it, and the saved voice itself is within it.
#[test]
fn a_voice_file_beyond_what_cloning_makes_is_refused() {
    use ggml_sys::gguf::{GgufTensors, GgufWriter};
    let plugins = plugins_with(&["cpu"], &["chatterbox"]);
    let dir = tempfile::tempdir().unwrap();
    let reference = dir.path().join("me.wav");
    write_wav(&reference, &voiced(24_000, 12.0), 24_000, 1, 16, false);
    let profile = profile_on(dir.path(), "cpu", &chatterbox_fixture());
    let voice = dir.path().join("me.voice");
    let o = save_voice(&profile, plugins.path(), &reference, &voice);
    assert!(o.status.success(), "{}", stderr(&o));
    let saved = GgufTensors::open(&voice).unwrap();
    let [mel, frames, ..] = saved.ctx.get_tensor("voice.prompt_feat").unwrap().ne();
    assert_eq!(frames, 500, "a 12 s reference: its first 10 s");
    // The same voice with one more frame (its last repeated).
    let mut w = GgufWriter::new();
    w.set_str("general.architecture", "chatterbox-voice")
        .set_u32("chatterbox-voice.format_version", saved.file.get_u32("chatterbox-voice.format_version").unwrap())
        .set_str("chatterbox-voice.variant", &saved.file.get_str("chatterbox-voice.variant").unwrap())
        .set_u32("chatterbox-voice.prompt_speech_tokens", saved.file.get_u32("chatterbox-voice.prompt_speech_tokens").unwrap());
    for name in ["voice.speaker_emb", "voice.prompt_speech_tokens", "voice.prompt_token", "voice.embedding"] {
        let t = saved.ctx.get_tensor(name).unwrap();
        let ne: Vec<i64> = t.ne().into_iter().take_while(|&n| n > 1).collect();
        w.add_tensor(name, t.ty(), if ne.is_empty() { &[1] } else { &ne }, saved.read_bytes(name).unwrap()).unwrap();
    }
    let mut feat = saved.read_bytes("voice.prompt_feat").unwrap();
    let last = feat[feat.len() - mel as usize * 4..].to_vec();
    feat.extend_from_slice(&last);
    w.add_tensor("voice.prompt_feat", ggml_sys::TYPE_F32, &[mel, frames + 1], feat).unwrap();
    let longer = dir.path().join("longer.voice");
    std::fs::write(&longer, w.to_bytes().unwrap()).unwrap();
    let out = dir.path().join("o.wav");
    let o = synth(&profile, plugins.path(), &out, &[format!("voice={}", longer.display())]);
    assert_one_line_error(&o, "tensor 'voice.prompt_feat' gives prompt_frames = 501 (allowed: 2..=500)");
    assert!(!out.exists());
}
