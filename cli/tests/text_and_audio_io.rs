//! How text gets in and audio gets out: `--text`, `--text-file`, stdin;
//! `--out FILE`, `--out -` (streamed to stdout) in each `--format`; the short
//! flags over `--set`; `tts options`, `tts completions`; -q. On the tiny
//! Supertonic fixture, CPU, one thread.

mod common;

use common::{assert_one_line_error, plugins_with, profile_on, run_stdin, stderr, supertonic_fixture, tts};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const TEXT: &str = "Hello there. A second sentence makes a second chunk.";

struct Setup {
    _plugins: tempfile::TempDir,
    dir: tempfile::TempDir,
    args: Vec<String>,
}

impl Setup {
    fn new() -> Setup {
        let plugins = plugins_with(&["cpu"], &["supertonic"]);
        let dir = tempfile::tempdir().unwrap();
        let profile = profile_on(dir.path(), "cpu", &[supertonic_fixture()]);
        let args = vec!["--profile".into(), profile.display().to_string(), "--plugin-dir".into(), plugins.path().display().to_string()];
        Setup { _plugins: plugins, dir, args }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The profile arguments of a synthesis, with the official chunks when
    /// streaming too (no shorter first piece): streamed and one-shot output
    /// are then the same samples.
    fn synthesis_args(&self) -> Vec<&str> {
        let mut all: Vec<&str> = self.args.iter().map(String::as_str).collect();
        all.extend_from_slice(&["--set", "stream_first_chars=0"]);
        all
    }

    /// `tts <profile args> <args>` with `input` on stdin.
    fn run(&self, args: &[&str], input: Option<&[u8]>) -> std::process::Output {
        let mut all = self.synthesis_args();
        all.extend_from_slice(args);
        run_stdin(&all, input)
    }

    /// `tts <subcommand> <profile args> <args>`.
    fn run_sub(&self, sub: &str, args: &[&str]) -> std::process::Output {
        let mut all = vec![sub];
        all.extend(self.args.iter().map(String::as_str));
        all.extend_from_slice(args);
        run_stdin(&all, None)
    }

    /// The WAV file `--text TEXT --out FILE` writes, as bytes.
    fn wav_file(&self, extra: &[&str]) -> Vec<u8> {
        let out = self.path("one-shot.wav");
        let mut args = vec!["--text", TEXT, "--out", out.to_str().unwrap()];
        args.extend_from_slice(extra);
        let o = self.run(&args, None);
        assert!(o.status.success(), "{}", stderr(&o));
        std::fs::read(&out).unwrap()
    }
}

fn ok_stdout(o: &std::process::Output) -> Vec<u8> {
    assert!(o.status.success(), "{}", stderr(o));
    assert!(!stderr(o).contains("panicked"), "{}", stderr(o));
    o.stdout.clone()
}

#[test]
fn stdin_text_streamed_to_stdout_is_the_same_audio_as_a_file() {
    let s = Setup::new();
    let file = s.wav_file(&[]);
    // Stdout is a pipe here: the header says "length unknown", the samples are the file's.
    let piped = ok_stdout(&s.run(&["--out", "-"], Some(TEXT.as_bytes())));
    assert_eq!(&piped[4..8], &[0xff; 4]);
    assert_eq!(&piped[40..44], &[0xff; 4]);
    assert_eq!((&piped[..4], &piped[8..40], &piped[44..]), (&file[..4], &file[8..40], &file[44..]), "streamed and one-shot samples are identical");
    eprintln!("stdin -> stdout: {} data bytes, identical to the one-shot file", piped.len() - 44);
    // `--text -` and `--text-file -` read stdin too; --text-file reads a file.
    assert_eq!(ok_stdout(&s.run(&["--text", "-", "--out", "-"], Some(TEXT.as_bytes()))), piped);
    let text_file = s.path("text.txt");
    std::fs::write(&text_file, TEXT).unwrap();
    assert_eq!(ok_stdout(&s.run(&["--text-file", text_file.to_str().unwrap(), "--out", "-"], None)), piped);
}

#[test]
fn stdout_redirected_to_a_file_gets_the_real_sizes() {
    let s = Setup::new();
    let file = s.wav_file(&[]);
    let redirected = s.path("redirected.wav");
    let mut cmd = Command::new(tts());
    cmd.args(s.synthesis_args()).args(["--text", TEXT, "--out", "-"]).env_remove("TTS_LOG");
    let status = cmd.stdout(std::fs::File::create(&redirected).unwrap()).stderr(Stdio::null()).status().unwrap();
    assert!(status.success());
    assert_eq!(std::fs::read(&redirected).unwrap(), file, "`--out - > a.wav` writes the same bytes as `--out a.wav`");
    let reader = hound::WavReader::open(&redirected).unwrap();
    assert_eq!(reader.len() as usize, (file.len() - 44) / 2);
    assert_eq!(reader.into_samples::<i16>().filter(Result::is_ok).count(), (file.len() - 44) / 2, "every sample reads");
}

#[test]
fn raw_formats_hold_the_samples_alone() {
    let s = Setup::new();
    let file = s.wav_file(&[]);
    let pcm16 = ok_stdout(&s.run(&["--text", TEXT, "--out", "-", "--format", "pcm16"], None));
    assert_eq!(pcm16, file[44..].to_vec(), "pcm16 is the WAV's data chunk");
    let f32s = ok_stdout(&s.run(&["--text", TEXT, "--out", "-", "--format", "f32"], None));
    assert_eq!(f32s.len(), 2 * pcm16.len());
    // The same samples before 16-bit rounding.
    for (f, p) in f32s.chunks_exact(4).zip(pcm16.chunks_exact(2)) {
        let (f, p) = (f32::from_le_bytes(f.try_into().unwrap()), i16::from_le_bytes(p.try_into().unwrap()));
        assert_eq!(engine_core::audio::pcm16(f), p);
    }
    // A raw file, written whole.
    let raw = s.path("out.raw");
    let o = s.run(&["--text", TEXT, "--out", raw.to_str().unwrap(), "--format", "pcm16"], None);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(&raw).unwrap(), pcm16);
}

#[test]
fn flac_holds_the_wav_samples_losslessly() {
    let s = Setup::new();
    let wav = s.wav_file(&[]);
    let flac_file = s.path("out.flac");
    let o = s.run(&["--text", TEXT, "--out", flac_file.to_str().unwrap(), "--format", "flac"], None);
    assert!(o.status.success(), "{}", stderr(&o));
    let flac = std::fs::read(&flac_file).unwrap();
    assert_eq!(&flac[..4], b"fLaC");
    // A pipe gets the same stream as it is encoded, so its header cannot know
    // the frame sizes (bytes 12..18), the sample count and the checksum (the
    // low bits of 21..26, 26..42): 0, "unknown"; the rest is the same.
    let piped = ok_stdout(&s.run(&["--text", TEXT, "--out", "-", "--format", "flac"], None));
    assert_eq!((&piped[..12], &piped[18..21], &piped[42..]), (&flac[..12], &flac[18..21], &flac[42..]), "stdout gets the same stream");
    assert_eq!((&piped[12..18], &piped[26..42]), (&[0u8; 6][..], &[0u8; 16][..]), "sizes and checksum unknown");
    let piped_file = s.path("piped.flac");
    std::fs::write(&piped_file, &piped).unwrap();
    let want: Vec<i16> = wav[44..].chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]])).collect();
    for file in [&flac_file, &piped_file] {
        let decoded = engine_core::audio::input::read_mono(file, 60.0).unwrap();
        let got: Vec<i16> = decoded.samples.iter().map(|x| (x * 32768.0).round() as i16).collect();
        assert_eq!(got, want, "FLAC decodes to the WAV's samples");
    }
    eprintln!("flac: {} bytes against {} of WAV", flac.len(), wav.len());
}

#[test]
fn a_reader_that_goes_away_stops_synthesis_quietly() {
    let s = Setup::new();
    let long = TEXT.repeat(6);
    let mut child = Command::new(tts())
        .args(&s.args)
        .args(["--text", &long, "--out", "-"])
        .env_remove("TTS_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 100];
    child.stdout.as_mut().unwrap().read_exact(&mut first).unwrap();
    drop(child.stdout.take()); // `| head -c 100`
    let o = common::wait_or_kill(child, std::time::Duration::from_secs(120), "tts to a closed pipe");
    let err = stderr(&o);
    assert!(o.status.success(), "exit {:?}: {err}", o.status);
    assert!(!err.contains("panicked") && !err.contains("error"), "{err}");
    assert_eq!(&first[..4], b"RIFF");
}

#[test]
fn text_input_mistakes_are_one_line_errors() {
    let s = Setup::new();
    let out = s.path("x.wav");
    let out = out.to_str().unwrap();
    assert_one_line_error(&s.run(&["--out", out], None), "text is empty");
    assert_one_line_error(&s.run(&["--out", out], Some(b"  \n")), "text is empty");
    assert_one_line_error(&s.run(&["--out", out], Some(&[0x68, 0xff, 0x69])), "stdin is not UTF-8 text (invalid byte at offset 1)");
    let missing = s.path("missing.txt");
    assert_one_line_error(&s.run(&["--text-file", missing.to_str().unwrap(), "--out", out], None), "--text-file");
    let o = s.run(&["--text", "hi", "--text-file", "x.txt", "--out", out], None);
    assert_eq!(o.status.code(), Some(2), "clap refuses both: {}", stderr(&o));
    assert_one_line_error(&s.run(&["--text", "hi"], None), "give --out FILE (or --out - for stdout)");
    assert!(!Path::new(out).exists(), "no output file after an error");
}

#[test]
fn short_flags_are_set_options() {
    let s = Setup::new();
    let a = ok_stdout(&s.run(&["--text", TEXT, "--out", "-", "--seed", "7", "--steps", "3", "--speed", "1.2"], None));
    let b = ok_stdout(&s.run(&["--text", TEXT, "--out", "-", "--set", "seed=7", "--set", "steps=3", "--set", "speed=1.2"], None));
    assert_eq!(a, b);
    assert_ne!(a, ok_stdout(&s.run(&["--text", TEXT, "--out", "-", "--seed", "8", "--steps", "3", "--speed", "1.2"], None)), "the seed is used");
    assert_one_line_error(&s.run(&["--text", TEXT, "--out", "-", "--seed", "7", "--set", "seed=8"], None), "seed is given twice");
    assert_one_line_error(&s.run(&["--text", TEXT, "--out", "-", "--voice", "nobody"], None), "unknown voice 'nobody'");
}

#[test]
fn options_lists_the_model_and_backend_options() {
    let s = Setup::new();
    let text = String::from_utf8(ok_stdout(&s.run_sub("options", &[]))).unwrap();
    assert!(text.contains("[synthesis] (supertonic)"), "{text}");
    assert!(text.contains("[backends.cpu] (cpu)"), "{text}");
    for key in ["steps", "voice", "speed", "threads"] {
        assert!(text.lines().any(|l| l.trim_start().starts_with(key)), "{key} missing:\n{text}");
    }
    let json: serde_json::Value = serde_json::from_slice(&ok_stdout(&s.run_sub("options", &["--json"]))).unwrap();
    let steps = json["model"]["options"].as_array().unwrap().iter().find(|o| o["key"] == "steps").unwrap();
    assert!(!steps["help"].as_str().unwrap().is_empty());
}

#[test]
fn completions_and_quiet() {
    for (shell, marker) in [("bash", "complete -F"), ("zsh", "#compdef tts"), ("fish", "complete -c tts")] {
        let o = run_stdin(&["completions", shell], None);
        let script = String::from_utf8(ok_stdout(&o)).unwrap();
        assert!(script.contains(marker) && script.contains("text-file"), "{shell}");
    }
    let s = Setup::new();
    let out = s.path("q.wav");
    let loud = s.run(&["--text", "hi", "--out", out.to_str().unwrap()], None);
    assert!(stderr(&loud).contains("wrote "), "{}", stderr(&loud));
    let quiet = s.run(&["-q", "--text", "hi", "--out", out.to_str().unwrap()], None);
    assert!(quiet.status.success());
    assert_eq!(stderr(&quiet), "", "-q prints nothing but errors");
}

#[test]
fn voices_lists_built_in_voices_languages_and_saved_files() {
    let s = Setup::new();
    let saved = s.path("saved");
    std::fs::create_dir(&saved).unwrap();
    // A Chatterbox voice is not Supertonic's to use; a voice style is.
    std::fs::write(saved.join("alice.voice"), b"a Chatterbox voice file").unwrap();
    std::fs::write(saved.join("notes.txt"), b"").unwrap();
    std::fs::write(saved.join("bright.json"), b"{}").unwrap();
    let json: serde_json::Value = serde_json::from_slice(&ok_stdout(&s.run_sub("voices", &["--json", "--dir", saved.to_str().unwrap()]))).unwrap();
    assert_eq!(json["family"], "supertonic");
    assert_eq!(json["voices"], serde_json::json!(["F1", "M1"]), "the fixture's embedded voice styles, default first");
    assert_eq!(json["languages"][0], "en", "v2's default language first");
    assert!(json["languages"].as_array().unwrap().len() > 1);
    assert_eq!(json["clones_voices"], false);
    assert_eq!(json["saved"], serde_json::json!(["bright.json"]), "only what Supertonic can read");
    let text = String::from_utf8(ok_stdout(&s.run_sub("voices", &[]))).unwrap();
    assert!(text.contains("voices: F1 (default), M1") && text.contains("languages: en (default)"), "{text}");
    // Every listed voice synthesizes.
    for voice in ["F1", "M1"] {
        ok_stdout(&s.run(&["--text", "hi", "--out", "-", "--voice", voice], None));
    }
}
