//! `--out` of every extension writes its format, checked by decoders other
//! than ours (hound and symphonia; ffmpeg for Opus, AAC and MP3's exact
//! length, skipped with a message where it is not installed), `--format`
//! overrides the extension, an unknown extension is a one-line error, and
//! `tts serve` answers opus and aac requests with the same streams.

mod common;

use common::{assert_one_line_error, plugins_with, profile_on, run, start_serve, supertonic_fixture};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const TEXT: &str = "Every format, one encoder.";

/// What ffprobe and ffmpeg make of `path`: container, codec, rate and the
/// decoded samples; None (after saying so) where ffmpeg is not installed.
fn ffmpeg(path: &Path) -> Option<(String, String, u32, Vec<f32>)> {
    if Command::new("ffprobe").arg("-version").output().is_err() || Command::new("ffmpeg").arg("-version").output().is_err() {
        // CI installs it (xtask's APT list) and sets TTS_REQUIRE_FFMPEG: there its absence fails.
        assert!(std::env::var_os("TTS_REQUIRE_FFMPEG").is_none(), "TTS_REQUIRE_FFMPEG is set but ffmpeg/ffprobe are not installed");
        eprintln!("skipped: ffmpeg/ffprobe are not installed (Debian package ffmpeg); {} was not decoded", path.display());
        return None;
    }
    let probe = Command::new("ffprobe")
        .args(["-v", "error", "-show_entries", "format=format_name:stream=codec_name,sample_rate,channels", "-of", "json"])
        .arg(path)
        .output()
        .unwrap();
    assert!(probe.status.success(), "ffprobe {}: {}", path.display(), String::from_utf8_lossy(&probe.stderr));
    let json: serde_json::Value = serde_json::from_slice(&probe.stdout).unwrap();
    assert_eq!(json["streams"][0]["channels"], 1, "mono");
    let decoded = Command::new("ffmpeg").args(["-v", "error", "-i"]).arg(path).args(["-f", "f32le", "-"]).output().unwrap();
    assert!(decoded.status.success(), "ffmpeg {}: {}", path.display(), String::from_utf8_lossy(&decoded.stderr));
    Some((
        json["format"]["format_name"].as_str().unwrap().to_string(),
        json["streams"][0]["codec_name"].as_str().unwrap().to_string(),
        json["streams"][0]["sample_rate"].as_str().unwrap().parse().unwrap(),
        decoded.stdout.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
    ))
}

/// Checks an Opus or AAC stream of `n` samples at `rate` (the WAV's):
/// Opus gives back the exact length at 48 kHz (within one 20 ms frame);
/// ADTS cannot state the encoder's delay, so AAC decodes to FDK's 2048
/// samples of delay plus the audio, rounded up to a whole 1024-sample frame.
fn check_lossy(path: &Path, format: &str, n: usize, rate: u32) {
    let Some((container, codec, got_rate, samples)) = ffmpeg(path) else { return };
    let (want_container, want_rate) = if format == "opus" { ("ogg", 48_000) } else { ("aac", rate) };
    assert_eq!((container.as_str(), codec.as_str(), got_rate), (want_container, format, want_rate), "{}", path.display());
    let want = (n as f64 * want_rate as f64 / rate as f64).round() as i64;
    let extra = samples.len() as i64 - want;
    if format == "opus" {
        assert!(extra.abs() <= 960, "{}: {} samples decoded for {want}", path.display(), samples.len());
    } else {
        assert!((2048..2048 + 1024).contains(&extra), "{}: {} samples decoded for {want}", path.display(), samples.len());
    }
}

/// Whether an MP3 starts with a Xing/Info frame: the tag follows a mono
/// frame's header and side information (17 bytes for MPEG-1, 9 for MPEG-2).
fn starts_with_info_frame(mp3: &[u8]) -> bool {
    let at = 4 + if (mp3[1] >> 3) & 3 == 3 { 17 } else { 9 };
    matches!(&mp3[at..at + 4], b"Info" | b"Xing")
}

/// Runs `tts` with `stdout` as its standard output (a file of the test's
/// temporary directory).
fn run_with_stdout(args: &[&str], stdout: std::fs::File) -> std::process::Output {
    let mut cmd = Command::new(common::tts());
    cmd.args(args).env_remove("TTS_LOG").env_remove(engine_core::output::TEST_FAULT_ENV);
    cmd.stdout(std::process::Stdio::from(stdout)).stderr(std::process::Stdio::piped());
    common::wait_or_kill(cmd.spawn().unwrap(), Duration::from_secs(120), &format!("tts {}", args.join(" ")))
}

#[test]
fn out_of_every_extension_writes_its_format() {
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &[supertonic_fixture()]);
    let synth = |out: &Path, extra: &[&str]| {
        let mut args = vec!["--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap(), "--text", TEXT, "-q", "--out"];
        args.push(out.to_str().unwrap());
        args.extend_from_slice(extra);
        let o = run(&args);
        assert!(o.status.success(), "{}: {}", out.display(), common::stderr(&o));
        std::fs::read(out).unwrap()
    };
    let wav_path = dir.path().join("a.wav");
    let wav = synth(&wav_path, &[]);
    let (rate, samples) = common::read_wav(&wav_path);
    let n = samples.len();
    assert!(n > 1000, "{n} samples");
    assert_eq!(&wav[40..44], &(2 * n as u32).to_le_bytes(), "a file's WAV has its exact sizes");
    let pcm16: Vec<u8> = wav[44..].to_vec();
    for ext in ["pcm", "raw", "PCM"] {
        assert_eq!(synth(&dir.path().join(format!("a.{ext}")), &[]), pcm16, ".{ext}: the WAV's samples, no header");
    }
    let f32s = synth(&dir.path().join("a.f32"), &[]);
    assert_eq!(f32s.len(), 4 * n, ".f32: four bytes a sample");
    let flac = synth(&dir.path().join("a.flac"), &[]);
    let clip = engine_core::audio::input::decode_mono(&flac, 60.0).unwrap();
    assert_eq!((clip.sample_rate, clip.samples.len()), (rate, n), ".flac");
    let mp3_path = dir.path().join("a.mp3");
    let mp3 = synth(&mp3_path, &[]);
    assert!(starts_with_info_frame(&mp3), ".mp3: a file starts with LAME's Info frame");
    let clip = engine_core::audio::input::decode_mono(&mp3, 60.0).unwrap();
    let extra = clip.samples.len() as i64 - n as i64;
    assert_eq!(clip.sample_rate, rate, ".mp3");
    assert!((0..=3 * 1152).contains(&extra), ".mp3: {} samples for {n}", clip.samples.len());
    // ffmpeg trims the encoder delay and padding the LAME tag states.
    if let Some((container, codec, got_rate, decoded)) = ffmpeg(&mp3_path) {
        assert_eq!((container.as_str(), codec.as_str(), got_rate, decoded.len()), ("mp3", "mp3", rate, n), ".mp3: exactly the WAV's samples");
    }
    for (ext, format) in [("opus", "opus"), ("ogg", "opus"), ("aac", "aac")] {
        let path = dir.path().join(format!("a.{ext}"));
        let bytes = synth(&path, &[]);
        assert!(if format == "opus" { bytes.starts_with(b"OggS") } else { bytes[0] == 0xff && bytes[1] & 0xf6 == 0xf0 }, ".{ext}");
        check_lossy(&path, format, n, rate);
    }
    // --format wins over the extension.
    assert!(synth(&dir.path().join("b.mp3"), &["--format", "wav"]).starts_with(b"RIFF"));
    assert_eq!(synth(&dir.path().join("b.wav"), &["--format", "pcm"]), pcm16);
    // stdout: WAV unless --format says otherwise.
    let stdout = |extra: &[&str]| {
        let mut args = vec!["--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap(), "--text", TEXT, "-q", "--out", "-"];
        args.extend_from_slice(extra);
        let o = run(&args);
        assert!(o.status.success(), "{}", common::stderr(&o));
        o.stdout
    };
    let streamed = stdout(&[]);
    assert_eq!((&streamed[..4], &streamed[40..44]), (&b"RIFF"[..], &[0xff; 4][..]), "a streamed WAV's length is unknown");
    assert!(stdout(&["--format", "opus"]).starts_with(b"OggS"));
    // A pipe cannot go back to an Info frame: the MP3 has none, and decodes
    // longer than the streamed WAV by LAME's delay and the last frame's padding.
    let piped = stdout(&["--format", "mp3"]);
    assert!(!starts_with_info_frame(&piped), "a piped MP3 has no Info frame");
    let piped_path = dir.path().join("piped.mp3");
    std::fs::write(&piped_path, &piped).unwrap();
    if let Some((_, codec, got_rate, decoded)) = ffmpeg(&piped_path) {
        let extra = decoded.len() as i64 - (streamed.len() as i64 - 44) / 2;
        assert_eq!((codec.as_str(), got_rate), ("mp3", rate), "piped .mp3");
        assert!((0..=3 * 1152).contains(&extra), "piped .mp3: {extra} samples more than the WAV");
    }
    // `--out - >> x`: Linux appends every write on an O_APPEND descriptor,
    // so nothing can be written back: the output is appended as it is piped
    // (no header or Info frame after the audio).
    for format in ["mp3", "wav"] {
        let path = dir.path().join(format!("appended.{format}"));
        std::fs::write(&path, b"older bytes").unwrap();
        let file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        let mut args = vec!["--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap(), "--text", TEXT, "-q"];
        args.extend(["--out", "-", "--format", format]);
        let o = run_with_stdout(&args, file);
        assert!(o.status.success(), "{}", common::stderr(&o));
        let after = std::fs::read(&path).unwrap();
        assert_eq!(&after[..11], b"older bytes", ">> .{format}");
        assert!(after[11..] == stdout(&["--format", format]), ">> .{format}: {} bytes appended, as piped", after.len() - 11);
    }
}

#[test]
fn an_unknown_extension_is_a_one_line_error_listing_the_formats() {
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &[supertonic_fixture()]);
    let out = dir.path().join("speech.m4a");
    let o = run(&["--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap(), "--text", TEXT, "--out", out.to_str().unwrap()]);
    assert_one_line_error(
        &o,
        "speech.m4a: unknown audio extension `.m4a`; formats: wav (.wav), pcm (.pcm .raw), f32 (.f32), flac (.flac), mp3 (.mp3), opus (.opus .ogg), aac (.aac) (or name one with --format)",
    );
    assert!(!out.exists(), "no output written");
    assert_eq!(common::dir_names(dir.path()).len(), 1, "only the profile");
    // --format makes any name acceptable.
    let o = run(&[
        "--profile",
        profile.to_str().unwrap(),
        "--plugin-dir",
        plugins.path().to_str().unwrap(),
        "--text",
        TEXT,
        "-q",
        "--out",
        out.to_str().unwrap(),
        "--format",
        "aac",
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    assert_eq!(std::fs::read(&out).unwrap()[0], 0xff);
}

/// `tts serve` on the Supertonic fixture: opus and aac responses decode
/// with ffmpeg to the WAV response's length, as the CLI's files do.
#[test]
fn the_server_answers_opus_and_aac() {
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &[supertonic_fixture()]);
    let named = dir.path().join("supertonic.toml");
    std::fs::rename(&profile, &named).unwrap();
    let serving = start_serve(&["--api-key", "k", "--profile", named.to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap()]);
    let base = serving.base.clone();
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(120))).build().into();
    let speech = |format: &str| {
        let body = serde_json::json!({"model": "supertonic", "input": TEXT, "voice": "default", "response_format": format});
        let mut r = agent.post(format!("{base}/v1/audio/speech")).header("Authorization", "Bearer k").send_json(body).unwrap();
        let status = r.status().as_u16();
        let content_type = r.headers().get("content-type").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        let sample_rate = r.headers().get("x-sample-rate").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        let bytes = r.body_mut().with_config().limit(64 << 20).read_to_vec().unwrap();
        assert_eq!(status, 200, "{format}: {}", String::from_utf8_lossy(&bytes));
        (content_type, sample_rate, bytes)
    };
    let (_, _, wav) = speech("wav");
    let rate = u32::from_le_bytes(wav[24..28].try_into().unwrap());
    let n = (wav.len() - 44) / 2;
    for (format, content_type) in [("opus", "audio/ogg"), ("aac", "audio/aac")] {
        let (got_type, sample_rate, bytes) = speech(format);
        assert_eq!(got_type, content_type, "{format}");
        // X-Sample-Rate is the rate the response is in: Opus's is always 48 kHz.
        assert_eq!(sample_rate, if format == "opus" { "48000".to_string() } else { rate.to_string() }, "{format}: x-sample-rate");
        let path = dir.path().join(format!("response.{format}"));
        std::fs::write(&path, &bytes).unwrap();
        check_lossy(&path, format, n, rate);
    }
}
