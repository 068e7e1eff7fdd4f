//! Conformance with OpenAI's clients: the official `openai` Python package
//! and the official `openai` Node package drive `tts serve` (the tiny
//! Supertonic fixture) for every `response_format` × `stream_format`, each
//! plainly and streamed (tests/server/conformance.{py,mjs}), and every
//! result is decoded by an independent decoder, ffmpeg: its container and
//! codec are the format's, its sample rate the one the format promises, and
//! its length within one codec frame of the WAV response's. `cargo xtask
//! test` installs both packages (and ffmpeg); there their absence is a
//! failure (`TTS_REQUIRE_OPENAI`), elsewhere the test reports itself skipped.

mod common;

use common::{plugins_with, start_serve, supertonic_fixture, wait_or_kill, Serving};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const KEY: &str = "conformance-key";

/// The server and what it reads, kept as long as it runs.
struct Server {
    serving: Serving,
    _dir: tempfile::TempDir,
    _plugins: tempfile::TempDir,
}

fn serve() -> Server {
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("supertonic.toml");
    std::fs::write(
        &profile,
        format!("[backend]\nprefer = [\"cpu\"]\nfallback = false\n[backends.cpu]\nthreads = 1\n[model]\nfiles = [\"{}\"]\n", supertonic_fixture().display()),
    )
    .unwrap();
    let serving = start_serve(&["--api-key", KEY, "--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap()]);
    Server { serving, _dir: dir, _plugins: plugins }
}

/// The decoded audio of `file` as ffmpeg reads it: container, codec, sample
/// rate and the number of samples it decodes to.
struct Decoded {
    container: String,
    codec: String,
    rate: u32,
    samples: usize,
}

fn decode(file: &Path, format: &str) -> Decoded {
    // OpenAI's pcm has no header: 16-bit little-endian mono at 24 kHz.
    let raw: &[&str] = if format == "pcm" { &["-f", "s16le", "-ar", "24000", "-ac", "1"] } else { &[] };
    let probe = |entries: &str| {
        let mut cmd = Command::new("ffprobe");
        cmd.args(["-v", "error"]).args(raw).args(["-show_entries", entries, "-of", "default=nw=1:nk=1"]).arg(file);
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "ffprobe {}: {}", file.display(), String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or_default().trim().to_string()
    };
    let container = probe("format=format_name");
    let codec = probe("stream=codec_name");
    let rate: u32 = probe("stream=sample_rate").parse().unwrap();
    let o = Command::new("ffmpeg").args(["-v", "error"]).args(raw).arg("-i").arg(file).args(["-f", "s16le", "-ac", "1", "-"]).output().unwrap();
    assert!(o.status.success(), "ffmpeg {}: {}", file.display(), String::from_utf8_lossy(&o.stderr));
    Decoded { container, codec, rate, samples: o.stdout.len() / 2 }
}

/// What each format must decode as: container, codec, the length of one
/// codec frame in seconds at `rate` (the tolerance on the length), and the
/// codec's delay that a decoder plays before the audio because the stream
/// cannot say where the audio starts: ADTS has no field for FDK's 2048
/// samples, and a streamed MP3 carries no LAME tag (LAME writes it before the
/// audio with totals known only at the end), so LAME's 576 samples plus the
/// decoder's 529 are played. Ogg Opus states its pre-skip and end, so its
/// decoded length is exact.
fn expected(format: &str, rate: u32) -> (&'static str, &'static str, f64, f64) {
    let at = |samples: f64| samples / rate as f64;
    match format {
        "wav" => ("wav", "pcm_s16le", at(1.0), 0.0),
        "pcm" => ("s16le", "pcm_s16le", 1.0 / 24_000.0, 0.0),
        "flac" => ("flac", "flac", at(1.0), 0.0),
        "mp3" => ("mp3", "mp3", at(1152.0), at(576.0 + 529.0)),
        "aac" => ("aac", "aac", at(1024.0), at(2048.0)),
        "opus" => ("ogg", "opus", 0.020, 0.0),
        other => panic!("unknown format {other}"),
    }
}

/// Runs a client script; the directory it wrote its files into.
fn run_client(program: &Path, script: &Path, server: &Server, out: &Path, envs: &[(&str, &Path)]) {
    let mut cmd = Command::new(program);
    cmd.arg(script).args([server.serving.base.as_str(), KEY, "supertonic"]).arg(out).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let o = wait_or_kill(cmd.spawn().unwrap(), Duration::from_secs(300), &script.display().to_string());
    println!("{}", String::from_utf8_lossy(&o.stdout));
    assert!(o.status.success(), "{}: {}{}", script.display(), String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
}

fn check_all(out: &Path, client: &str) {
    let wav = decode(&out.join(format!("{client}-plain-audio.wav")), "wav");
    let seconds = wav.samples as f64 / wav.rate as f64;
    let mut checked = 0;
    for format in ["mp3", "opus", "aac", "flac", "wav", "pcm"] {
        for mode in ["plain", "streamed"] {
            for stream in ["audio", "sse"] {
                let file = out.join(format!("{client}-{mode}-{stream}.{format}"));
                let d = decode(&file, format);
                let (container, codec, frame, delay) = expected(format, wav.rate);
                let what = format!("{client} {mode} {stream} {format}");
                assert!(d.container.split(',').any(|c| c == container), "{what}: container {} (want {container})", d.container);
                assert_eq!(d.codec, codec, "{what}: codec");
                let want_rate = match format {
                    "pcm" => 24_000,
                    "opus" => 48_000,
                    _ => wav.rate,
                };
                assert_eq!(d.rate, want_rate, "{what}: sample rate");
                let got = d.samples as f64 / d.rate as f64;
                assert!(
                    (got - delay - seconds).abs() <= frame + 1e-9,
                    "{what}: {got:.4} s decoded, the WAV response {seconds:.4} s plus the codec's delay {delay:.4} s (tolerance one frame, {frame:.4} s)"
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 24);
}

/// Whether `program` runs (`version_flag`: ffmpeg's `-version`, node's `--version`).
fn have(program: &str, version_flag: &str) -> bool {
    Command::new(program).arg(version_flag).output().is_ok_and(|o| o.status.success())
}

fn require(what: &str, found: bool) -> bool {
    if !found {
        assert!(std::env::var_os("TTS_REQUIRE_OPENAI").is_none(), "TTS_REQUIRE_OPENAI is set but {what} is missing: run `cargo xtask test`");
        println!("skipped: {what} is missing (`cargo xtask test` installs it)");
    }
    found
}

#[test]
fn the_official_python_client_gets_every_format_in_both_stream_formats() {
    let python = std::env::var_os("TTS_OPENAI_PYTHON").map(PathBuf::from);
    if !require("TTS_OPENAI_PYTHON (the openai Python package)", python.is_some()) || !require("ffmpeg", have("ffmpeg", "-version")) {
        return;
    }
    let server = serve();
    let out = tempfile::tempdir().unwrap();
    run_client(&python.unwrap(), &common::repo().join("tests/server/conformance.py"), &server, out.path(), &[]);
    check_all(out.path(), "python");
}

#[test]
fn the_official_node_client_gets_every_format_in_both_stream_formats() {
    let modules = std::env::var_os("TTS_OPENAI_NODE_MODULES").map(PathBuf::from);
    if !require("TTS_OPENAI_NODE_MODULES (the openai Node package)", modules.is_some())
        || !require("ffmpeg", have("ffmpeg", "-version"))
        || !require("node", have("node", "--version"))
    {
        return;
    }
    let server = serve();
    // Node resolves an ES module's imports from the script's own directory:
    // the script runs from a private copy beside a link to the package.
    let work = tempfile::tempdir().unwrap();
    let script = work.path().join("conformance.mjs");
    std::fs::copy(common::repo().join("tests/server/conformance.mjs"), &script).unwrap();
    std::os::unix::fs::symlink(modules.unwrap(), work.path().join("node_modules")).unwrap();
    let out = tempfile::tempdir().unwrap();
    run_client(Path::new("node"), &script, &server, out.path(), &[]);
    check_all(out.path(), "node");
}
