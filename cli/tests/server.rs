//! `tts serve` over loopback on the tiny fixtures: each response format
//! against the CLI's audio, OpenAI's error JSON for each bad request, the
//! model and voice lists, OpenAI's voice names, SSE, instructions, CORS,
//! metrics, a full queue, a client that goes away, a
//! model that panics, and draining on SIGTERM.

mod common;

use common::{plugins_with, repo, supertonic_fixture, tts};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const KEY: &str = "test-key";

struct Server {
    child: Option<Child>,
    base: String,
    _dir: tempfile::TempDir,
    _plugins: tempfile::TempDir,
    profile: PathBuf,
    plugin_dir: PathBuf,
}

/// A profile file named `name.toml` (the model id is the stem).
fn profile(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, body).unwrap();
    p
}

impl Server {
    /// Supertonic as `supertonic` and the tone model set to panic as `broken`,
    /// one CPU thread each, with `extra` flags.
    fn start(extra: &[&str]) -> Server {
        Server::start_with(&[], extra)
    }

    /// [`Server::start`] with more profiles: (name, the `[model]` and
    /// `[synthesis]` tables) after the CPU backend's.
    fn start_with(more: &[(&str, String)], extra: &[&str]) -> Server {
        let plugins = plugins_with(&["cpu"], &["supertonic", "chatterbox"]);
        std::fs::copy(common::artifacts().join("libtts_test_tone.so"), plugins.path().join("libtts_model_tone.so")).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let cpu = "[backend]\nprefer = [\"cpu\"]\nfallback = false\n[backends.cpu]\nthreads = 1\n";
        let supertonic = profile(dir.path(), "supertonic", &format!("{cpu}[model]\nfiles = [\"{}\"]\n", supertonic_fixture().display()));
        let gguf = dir.path().join("tone.gguf");
        let mut w = ggml_sys::gguf::GgufWriter::new();
        w.set_str("general.architecture", "tts-test-tone").set_u32("tts-test-tone.sample_rate", 16000).set_f32("tts-test-tone.frequency", 440.0);
        w.write_metadata(&gguf).unwrap();
        let broken = profile(dir.path(), "broken", &format!("{cpu}[model]\nfiles = [\"{}\"]\n[synthesis]\npanic = true\n", gguf.display()));
        let voices = dir.path().join("voices");
        std::fs::create_dir(&voices).unwrap();
        // Not a voice at all, a Supertonic style (listed for Supertonic
        // only: the listing reads no further than the name) and a Chatterbox
        // Turbo voice (a GGUF header naming its variant).
        std::fs::write(voices.join("mine.voice"), b"not read by the listing").unwrap();
        std::fs::write(voices.join("mine.json"), b"{}").unwrap();
        let mut theirs = ggml_sys::gguf::GgufWriter::new();
        theirs.set_str("general.architecture", "chatterbox-voice").set_str("chatterbox-voice.variant", "turbo");
        theirs.write_metadata(&voices.join("theirs.voice")).unwrap();
        let mut args: Vec<String> = ["serve", "--port", "0", "--api-key", KEY, "--max-input-chars", "50000"].map(String::from).to_vec();
        for (flag, value) in [("--profile", &supertonic), ("--profile", &broken), ("--plugin-dir", &plugins.path().to_path_buf()), ("--voices-dir", &voices)] {
            args.push(flag.into());
            args.push(value.display().to_string());
        }
        for (name, body) in more {
            args.push("--profile".into());
            args.push(profile(dir.path(), name, &format!("{cpu}{body}")).display().to_string());
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut child =
            Command::new(tts()).args(&args).env_remove("TTS_LOG").env_remove("TTS_API_KEY").stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let first = lines.next().expect("tts serve printed nothing").unwrap();
        let base = first.strip_prefix("listening on ").and_then(|r| r.split_whitespace().next()).unwrap_or_else(|| panic!("first line: {first}")).to_string();
        // The rest of stderr is drained so the server never blocks on it.
        std::thread::spawn(move || lines.for_each(drop));
        let plugin_dir = plugins.path().to_path_buf();
        let server = Server { child: Some(child), base, _dir: dir, _plugins: plugins, profile: supertonic, plugin_dir };
        let started = Instant::now();
        loop {
            let (status, _) = server.get("/health", false);
            if status == 200 {
                break;
            }
            assert_eq!(status, 503, "health while loading");
            assert!(started.elapsed() < Duration::from_secs(120), "the models did not load (hang guard)");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    fn agent() -> ureq::Agent {
        ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(120))).build().into()
    }

    fn get(&self, path: &str, auth: bool) -> (u16, Vec<u8>) {
        let mut request = Server::agent().get(format!("{}{path}", self.base));
        if auth {
            request = request.header("Authorization", format!("Bearer {KEY}"));
        }
        let mut r = request.call().unwrap();
        (r.status().as_u16(), r.body_mut().read_to_vec().unwrap())
    }

    /// POST /v1/audio/speech over a bare connection, the body written from
    /// a thread: a server that answers before reading a too-large body closes
    /// the connection under the writer (as curl sees it too). Status and body
    /// of a response with a Content-Length.
    fn speech_unread(&self, body: Vec<u8>) -> (u16, Vec<u8>) {
        let address = self.base.strip_prefix("http://").unwrap().to_string();
        let mut stream = std::net::TcpStream::connect(&address).unwrap();
        write!(
            stream,
            "POST /v1/audio/speech HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .unwrap();
        let mut writer = stream.try_clone().unwrap();
        std::thread::spawn(move || {
            let _ = writer.write_all(&body);
        });
        let mut response = Vec::new();
        let _ = stream.read_to_end(&mut response);
        let text = String::from_utf8_lossy(&response).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no response: {text}"));
        let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        (status, body.as_bytes().to_vec())
    }

    /// Sends a speech request for thousands of short paragraphs (one chunk,
    /// one piece each: hundreds of MB of PCM) on a bare connection and
    /// reads nothing: once the socket buffers fill, the worker waits on this
    /// client for as long as it stays connected.
    fn unread_request(&self) -> std::net::TcpStream {
        self.unread_request_as("supertonic", "pcm")
    }

    /// [`Server::unread_request`] to `model` in `format`.
    fn unread_request_as(&self, model: &str, format: &str) -> std::net::TcpStream {
        let address = self.address();
        let body = json!({"model": model, "voice": "default", "input": "Go.\n\n".repeat(8000), "response_format": format}).to_string();
        let mut stream = std::net::TcpStream::connect(&address).unwrap();
        write!(
            stream,
            "POST /v1/audio/speech HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        stream
    }

    /// `127.0.0.1:PORT`.
    fn address(&self) -> String {
        self.base.strip_prefix("http://").unwrap().to_string()
    }

    /// The server's resident memory, in MiB.
    fn rss_mib(&self) -> f64 {
        let pid = self.child.as_ref().unwrap().id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let kib: f64 = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap().trim().trim_end_matches("kB").trim().parse().unwrap();
        kib / 1024.0
    }

    /// The value of a metric line starting with `name ` (0 when absent).
    fn metric(&self, name: &str) -> f64 {
        self.metrics().lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' '))).map_or(0.0, |v| v.trim().parse().unwrap())
    }

    /// Polls /metrics until the server holds `n` connections besides the one
    /// asking (a hang guard, not a timing check).
    fn wait_for_connections(&self, n: usize) {
        let started = Instant::now();
        while self.metric("tts_open_connections") < (n + 1) as f64 {
            assert!(started.elapsed() < Duration::from_secs(60), "the server holds {} connections, not {n}", self.metric("tts_open_connections") - 1.0);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Polls /metrics until it holds `line` (a hang guard, not a timing check).
    fn wait_for_metric(&self, line: &str) {
        let started = Instant::now();
        while !self.metrics().lines().any(|l| l == line) {
            assert!(started.elapsed() < Duration::from_secs(120), "no `{line}` in: {}", self.metrics());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// POST /v1/audio/speech with `body` (bytes as given) and `key`.
    fn speech_raw(&self, body: &[u8], key: Option<&str>) -> (u16, ureq::http::HeaderMap, Vec<u8>) {
        let mut request = Server::agent().post(format!("{}/v1/audio/speech", self.base)).header("Content-Type", "application/json");
        if let Some(k) = key {
            request = request.header("Authorization", format!("Bearer {k}"));
        }
        let mut r = request.send(body).unwrap();
        let headers = r.headers().clone();
        let bytes = r.body_mut().with_config().limit(64 << 20).read_to_vec().unwrap();
        (r.status().as_u16(), headers, bytes)
    }

    fn speech(&self, body: Value) -> (u16, ureq::http::HeaderMap, Vec<u8>) {
        self.speech_raw(body.to_string().as_bytes(), Some(KEY))
    }

    fn metrics(&self) -> String {
        String::from_utf8(self.get("/metrics", false).1).unwrap()
    }

    /// SIGTERM, then the exit status.
    fn stop(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().unwrap();
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if started.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                panic!("tts serve did not stop on SIGTERM (hang guard)");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The OpenAI error object of a response.
fn error_of(status: u16, body: &[u8]) -> (u16, Value) {
    let v: Value = serde_json::from_slice(body).unwrap_or_else(|e| panic!("{status}: not JSON ({e}): {}", String::from_utf8_lossy(body)));
    let e = v["error"].clone();
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["type"].is_string(), "{v}");
    (status, e)
}

const TEXT: &str = "Hello from the server. It streams as it speaks.";

/// The CLI's WAV for TEXT under the same profile and plugins.
fn cli_wav(server: &Server) -> Vec<u8> {
    let out = common::run(&[
        "--profile",
        &server.profile.display().to_string(),
        "--plugin-dir",
        &server.plugin_dir.display().to_string(),
        "--text",
        TEXT,
        "--out",
        "-",
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    out.stdout
}

#[test]
fn each_format_carries_the_clis_audio() {
    let server = Server::start(&[]);
    let cli = cli_wav(&server);
    let cli_samples = &cli[44..];

    let (status, headers, wav) = server.speech(json!({"model": "supertonic", "input": TEXT, "voice": "default", "response_format": "wav"}));
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&wav));
    assert_eq!(headers["content-type"], "audio/wav");
    // Sizes unknown while streaming; the samples are the CLI's, bit for bit.
    assert_eq!(&wav[4..8], &[0xFF; 4]);
    assert_eq!(&wav[44..], cli_samples, "server and CLI synthesize the same samples");
    println!("wav: {} bytes, identical to the CLI's samples", wav.len());

    let (status, headers, pcm) = server.speech(json!({"model": "supertonic", "voice": "default", "input": TEXT, "response_format": "pcm"}));
    assert_eq!((status, headers["content-type"].to_str().unwrap(), headers["x-sample-rate"].to_str().unwrap()), (200, "audio/pcm", "24000"));
    let n = (cli_samples.len() / 2) as u64;
    assert_eq!(pcm.len() as u64, 2 * (n * 24_000).div_ceil(44_100), "24 kHz: ceil(n * 24000 / 44100) samples");

    let (status, _, flac) = server.speech(json!({"model": "supertonic", "voice": "default", "input": TEXT, "response_format": "flac"}));
    assert_eq!(status, 200);
    let clip = engine_core::audio::input::decode_mono(&flac, 60.0).unwrap();
    let want: Vec<f32> = cli_samples.chunks(2).map(|b| i16::from_le_bytes([b[0], b[1]]) as f32 / 32768.0).collect();
    assert_eq!(clip.samples.len(), want.len());
    let worst = clip.samples.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst <= 1e-4, "FLAC against the CLI's 16-bit samples: {worst}");

    // MP3 is the default format.
    let (status, headers, mp3) = server.speech(json!({"model": "tts-1", "input": TEXT, "voice": "default"}));
    assert_eq!((status, headers["content-type"].to_str().unwrap()), (200, "audio/mpeg"));
    let clip = engine_core::audio::input::decode_mono(&mp3, 60.0).unwrap();
    let extra = clip.samples.len() as i64 - want.len() as i64;
    assert!((0..=3 * 1152).contains(&extra), "MP3 of {} samples for {}", clip.samples.len(), want.len());
    println!("pcm {} B, flac {} B (max diff {worst:.1e}), mp3 {} B decoding to {} samples", pcm.len(), flac.len(), mp3.len(), clip.samples.len());

    let metrics = server.metrics();
    assert!(metrics.contains("tts_http_requests_total{endpoint=\"speech\",status=\"200\"} 4"), "{metrics}");
    assert!(metrics.contains("tts_speech_time_to_first_audio_seconds_count{model=\"supertonic\"} 4"), "{metrics}");
    assert!(metrics.contains("tts_audio_seconds_total{model=\"supertonic\"}"), "{metrics}");
}

#[test]
fn bad_requests_get_their_status_and_openai_error_json() {
    let server = Server::start(&[]);
    let ok = json!({"model": "supertonic", "voice": "default", "input": "Hi.", "response_format": "wav"});
    let with = |key: &str, value: Value| {
        let mut body = ok.clone();
        body[key] = value;
        body.to_string().into_bytes()
    };
    // What, body, key, then the status and `param` wanted.
    type Case<'a> = (&'a str, Vec<u8>, Option<&'a str>, u16, Option<&'a str>);
    let cases: Vec<Case> = vec![
        ("no key", ok.to_string().into_bytes(), None, 401, None),
        ("wrong key", ok.to_string().into_bytes(), Some("nope"), 401, None),
        ("unknown model", with("model", json!("tts-9")), Some(KEY), 404, Some("model")),
        ("unknown voice", with("voice", json!("nobody")), Some(KEY), 400, Some("voice")),
        ("no voice", with("voice", Value::Null), Some(KEY), 400, Some("voice")),
        ("a voice object without id", with("voice", json!({"name": "alloy"})), Some(KEY), 400, Some("voice")),
        ("instructions over 4096 characters", with("instructions", json!("a".repeat(4097))), Some(KEY), 400, Some("instructions")),
        ("a path as voice", with("voice", json!("../voices/mine.voice")), Some(KEY), 400, Some("voice")),
        ("empty input", with("input", json!("  ")), Some(KEY), 400, Some("input")),
        ("input over the limit", with("input", json!("a".repeat(50_001))), Some(KEY), 413, Some("input")),
        ("malformed JSON", b"{\"model\": \"supertonic\", \"input\": ".to_vec(), Some(KEY), 400, None),
        ("speed 10", with("speed", json!(10)), Some(KEY), 400, Some("speed")),
        // OpenAI's range is 0.25..=4.0; NaN is not JSON, so the body is malformed.
        ("speed 0.2", with("speed", json!(0.2)), Some(KEY), 400, Some("speed")),
        ("speed 4.1", with("speed", json!(4.1)), Some(KEY), 400, Some("speed")),
        ("speed NaN", br#"{"model": "supertonic", "voice": "default", "input": "Hi.", "speed": NaN}"#.to_vec(), Some(KEY), 400, None),
        (
            "speed at a model with no speed control",
            json!({"model": "broken", "voice": "default", "input": "Hi.", "speed": 2.0}).to_string().into_bytes(),
            Some(KEY),
            400,
            Some("speed"),
        ),
        ("unknown format", with("response_format", json!("ogg")), Some(KEY), 400, Some("response_format")),
        ("unknown stream_format", with("stream_format", json!("websocket")), Some(KEY), 400, Some("stream_format")),
        ("unknown language", with("language", json!("xx")), Some(KEY), 400, Some("language")),
    ];
    for (what, body, key, want_status, want_param) in cases {
        let (status, _, bytes) = server.speech_raw(&body, key);
        let (status, e) = error_of(status, &bytes);
        println!("{what}: {status} {}", e["message"]);
        assert_eq!(status, want_status, "{what}: {e}");
        assert_eq!(e["param"].as_str(), want_param, "{what}: {e}");
    }
    let (status, bytes) = server.speech_unread(with("input", json!("a".repeat(1 << 20))));
    let (status, e) = error_of(status, &bytes);
    println!("1 MB input: {status} {}", e["message"]);
    assert_eq!((status, e["param"].as_str()), (413, Some("input")), "{e}");
    let (status, _, bytes) = server.speech_raw(&with("response_format", json!("m4a")), Some(KEY));
    assert_eq!(error_of(status, &bytes).1["message"], "response_format `m4a` is not supported; supported: mp3, opus, aac, flac, wav, pcm");
    let (status, body) = server.get("/v1/nothing", true);
    assert_eq!(error_of(status, &body).0, 404);
    // Still serving.
    assert_eq!(server.speech(ok).0, 200);
}

#[test]
fn models_voices_health_and_a_model_that_panics() {
    let server = Server::start(&[]);
    let (status, body) = server.get("/v1/models", true);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status, 200);
    let ids: Vec<&str> = v["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["supertonic", "broken"]);
    assert_eq!(server.get("/v1/models", false).0, 401);

    let (status, body) = server.get("/v1/audio/voices?model=supertonic", true);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status, 200, "{v}");
    let voices: Vec<&str> = v["voices"].as_array().unwrap().iter().map(|x| x.as_str().unwrap()).collect();
    // default, the built-in voices, OpenAI's names, then the one file
    // Supertonic can read: not the Chatterbox voice, nor the junk `.voice`.
    let mut want = vec!["default", "F1", "M1"];
    want.extend(tts_serve_api::OPENAI_VOICES);
    want.push("mine");
    assert_eq!(voices, want, "{v}");
    assert_eq!(
        (v["openai_voices"]["alloy"].as_str(), v["openai_voices"]["ash"].as_str(), v["openai_voices"]["coral"].as_str()),
        (Some("F1"), Some("M1"), Some("default"))
    );
    // The tone model has no built-in voices and reads no voice files.
    let v: Value = serde_json::from_slice(&server.get("/v1/audio/voices?model=broken", true).1).unwrap();
    assert_eq!(v["voices"].as_array().unwrap().len(), 1 + tts_serve_api::OPENAI_VOICES.len(), "{v}");
    let (status, body) = server.get("/v1/audio/voices?model=nope", true);
    assert_eq!(error_of(status, &body).0, 404);

    let v: Value = serde_json::from_slice(&server.get("/health", false).1).unwrap();
    assert_eq!(v, json!({"status": "ok", "models": ["supertonic", "broken"]}));

    // The tone model panics inside synthesis: a 500 for that request, and the
    // same worker serves the next one.
    for _ in 0..2 {
        let (status, _, body) = server.speech(json!({"model": "broken", "voice": "default", "input": "Hi.", "response_format": "wav"}));
        let (status, e) = error_of(status, &body);
        assert_eq!(status, 500, "{e}");
        assert_eq!(server.speech(json!({"model": "supertonic", "voice": "default", "input": "Hi.", "response_format": "wav"})).0, 200);
    }
}

#[test]
fn a_full_queue_answers_429_with_retry_after() {
    let server = Server::start(&["--queue", "1", "--workers", "1"]);
    // The one worker busy with a client that does not read, one request
    // waiting in the queue of one: the next is refused.
    let busy = server.unread_request();
    server.wait_for_metric("tts_busy_workers{model=\"supertonic\"} 1");
    let waiting = server.unread_request();
    server.wait_for_metric("tts_queue_depth{model=\"supertonic\"} 1");
    let (status, headers, body) = server.speech(json!({"model": "supertonic", "voice": "default", "input": "Hi.", "response_format": "wav"}));
    let (status, e) = error_of(status, &body);
    assert_eq!((status, headers.get("retry-after").map(|v| v.to_str().unwrap())), (429, Some("1")), "{e}");
    assert_eq!(e["code"], "queue_full");
    // Both clients go away: their syntheses stop, and the worker serves again.
    drop((busy, waiting));
    server.wait_for_metric("tts_cancelled_syntheses_total{model=\"supertonic\"} 2");
    assert_eq!(server.speech(json!({"model": "supertonic", "voice": "default", "input": "Hi.", "response_format": "wav"})).0, 200);
}

#[test]
fn a_client_that_goes_away_cancels_and_sigterm_drains() {
    let mut server = Server::start(&[]);
    let mut stream = server.unread_request();
    let mut first = [0u8; 256];
    let n = stream.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"), "{}", String::from_utf8_lossy(&first[..n]));
    server.wait_for_metric("tts_busy_workers{model=\"supertonic\"} 1");
    drop(stream);
    server.wait_for_metric("tts_cancelled_syntheses_total{model=\"supertonic\"} 1");
    server.wait_for_metric("tts_busy_workers{model=\"supertonic\"} 0");
    assert_eq!(server.speech(json!({"model": "supertonic", "voice": "default", "input": "Still here.", "response_format": "wav"})).0, 200);
    let status = server.stop();
    assert!(status.success(), "{status:?}");
}

#[test]
fn serve_refuses_bad_flags_in_one_line() {
    let profile = repo().join("profiles/supertonic.toml");
    let p = profile.display().to_string();
    for (args, want) in [
        (vec!["serve", "--profile", &p, "--workers", "0", "--port", "0"], "--workers and --queue must be at least 1"),
        (vec!["serve", "--profile", &p, "--profile", &p, "--port", "0"], "two models are named `supertonic`"),
        (vec!["serve", "--profile", &p, "--voices-dir", "/nonexistent/voices", "--port", "0"], "--voices-dir /nonexistent/voices: not a directory"),
        (
            vec!["serve", "--profile", &p, "--require-api-key", "--host", "0.0.0.0", "--port", "0"],
            "no API key, and --require-api-key is given: set TTS_API_KEY (or --api-key)",
        ),
    ] {
        let out = common::run(&args);
        common::assert_one_line_error(&out, want);
    }
}

/// The official `openai` Python package (`cargo xtask test` installs it and
/// names its interpreter in `TTS_OPENAI_PYTHON`): every format whole and
/// streamed, and the errors it raises (tests/server/openai_client.py).
#[test]
fn the_official_openai_client_works_against_the_server() {
    let Some(python) = std::env::var_os("TTS_OPENAI_PYTHON") else {
        assert!(std::env::var_os("TTS_REQUIRE_OPENAI").is_none(), "TTS_REQUIRE_OPENAI is set but no TTS_OPENAI_PYTHON: run `cargo xtask test`");
        println!("skipped: TTS_OPENAI_PYTHON names no Python with the openai package (`cargo xtask test` installs one)");
        return;
    };
    let server = Server::start(&[]);
    let script = repo().join("tests/server/openai_client.py");
    let child =
        Command::new(python).arg(&script).args([server.base.as_str(), KEY, "supertonic", "F1"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let out = common::wait_or_kill(child, Duration::from_secs(120), "openai_client.py");
    println!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("all checks passed"));
}

/// The acceptance's error cases through `curl` itself: the documented status
/// and OpenAI's error JSON for each.
#[test]
fn curl_gets_the_documented_errors() {
    if Command::new("curl").arg("--version").output().is_err() {
        println!("skipped: no curl here");
        return;
    }
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let body = |name: &str, bytes: Vec<u8>| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let ok = |key: &str, value: Value| {
        let mut b = json!({"model": "supertonic", "input": "Hello.", "voice": "default", "response_format": "wav"});
        b[key] = value;
        b.to_string().into_bytes()
    };
    let cases = [
        ("missing key", body("ok.json", ok("voice", json!("default"))), false, 401),
        ("wrong model", body("model.json", ok("model", json!("nope"))), true, 404),
        ("unknown voice", body("voice.json", ok("voice", json!("nobody"))), true, 400),
        ("empty input", body("empty.json", ok("input", json!(""))), true, 400),
        ("1 MB input", body("big.json", ok("input", json!("a".repeat(1 << 20)))), true, 413),
        ("malformed JSON", body("bad.json", b"{\"model\": ".to_vec()), true, 400),
        ("speed 10", body("speed.json", ok("speed", json!(10))), true, 400),
        ("unsupported format", body("m4a.json", ok("response_format", json!("m4a"))), true, 400),
        ("a good request", body("good.json", ok("voice", json!("default"))), true, 200),
    ];
    for (what, file, with_key, want) in cases {
        let out_file = dir.path().join("response");
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "-o"]).arg(&out_file).args(["-w", "%{http_code}", "-H", "Content-Type: application/json", "--data-binary"]);
        cmd.arg(format!("@{}", file.display())).arg(format!("{}/v1/audio/speech", server.base));
        if with_key {
            cmd.args(["-H", &format!("Authorization: Bearer {KEY}")]);
        }
        let out = cmd.output().unwrap();
        let status: u16 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or_else(|_| panic!("{what}: curl said {:?}", out));
        let response = std::fs::read(&out_file).unwrap();
        println!("curl, {what}: {status}");
        assert_eq!(status, want, "{what}: {}", String::from_utf8_lossy(&response));
        if want == 200 {
            assert_eq!(&response[..4], b"RIFF");
        } else {
            error_of(status, &response);
        }
    }
}

/// Raises this process's soft limit on open files to `n` (the server child
/// inherits it, and raises its own as it needs).
fn allow_open_files(n: libc::rlim_t) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
    if limit.rlim_cur != libc::RLIM_INFINITY && limit.rlim_cur < n {
        assert!(limit.rlim_max == libc::RLIM_INFINITY || limit.rlim_max >= n, "this test needs {n} open files; the hard limit is {}", limit.rlim_max);
        limit.rlim_cur = n;
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    }
}

/// Reads until the peer closes, an error, or `limit`: what arrived, and
/// whether the connection ended (EOF or reset) within the limit.
fn read_until_closed(stream: &mut std::net::TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    let started = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = limit.saturating_sub(started.elapsed());
        if left.is_zero() {
            return (got, false);
        }
        stream.set_read_timeout(Some(left)).unwrap();
        match stream.read(&mut buf) {
            Ok(0) => return (got, true),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => return (got, false),
            Err(_) => return (got, true),
        }
    }
}

fn status_of(response: &[u8]) -> Option<u16> {
    String::from_utf8_lossy(response).split_whitespace().nth(1)?.parse().ok()
}

/// The JSON body of a raw HTTP/1.1 response with a Content-Length.
fn body_of(response: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(response);
    text.split_once("\r\n\r\n").map(|(_, b)| b.as_bytes().to_vec()).unwrap_or_default()
}

#[test]
fn an_empty_api_key_is_refused_and_an_open_address_without_one_warns() {
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let p = profile(dir.path(), "supertonic", &format!("[backend]\nprefer = [\"cpu\"]\n[model]\nfiles = [\"{}\"]\n", supertonic_fixture().display()));
    let (p, plugins) = (p.display().to_string(), plugins.path().display().to_string());
    let base = ["serve", "--profile", &p, "--plugin-dir", &plugins, "--port", "0"];
    // `--api-key "$KEY"` with KEY unset: before, this served with no authentication.
    let out = common::run(&[&base[..], &["--api-key", ""]].concat());
    common::assert_one_line_error(&out, "--api-key is empty");
    let out = common::run_with(&base, None, &[("TTS_API_KEY", "")]);
    common::assert_one_line_error(&out, "TTS_API_KEY is set but empty");
    // A non-loopback address (TEST-NET-1: never this machine's, so the bind
    // fails and nothing listens) without a key: the warning comes first.
    let out = common::run(&[&base[..], &["--host", "192.0.2.1"]].concat());
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("listening on 192.0.2.1:0 with no API key"), "{err}");
    assert!(err.lines().last().unwrap().starts_with("error: binding 192.0.2.1:0"), "{err}");
}

#[test]
fn the_key_is_checked_before_the_body_and_the_scheme_in_any_case() {
    let server = Server::start(&["--header-timeout", "120", "--body-timeout", "120"]);
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let r = Server::agent().get(format!("{}/v1/models", server.base)).header("Authorization", format!("{scheme} {KEY}")).call().unwrap();
        assert_eq!(r.status().as_u16(), 200, "{scheme}");
    }
    // Unauthenticated requests announcing 80 KB and sending half: each gets
    // its 401 at once, without the server waiting for (or holding) the rest.
    // Before, every body was read whole before the key was looked at.
    const CLIENTS: usize = 3000;
    allow_open_files(CLIENTS as libc::rlim_t + 512);
    let before = server.rss_mib();
    let half = vec![b'x'; 40 << 10];
    let mut streams = Vec::new();
    for _ in 0..CLIENTS {
        let mut s = std::net::TcpStream::connect(server.address()).unwrap();
        write!(s, "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 81920\r\n\r\n").unwrap();
        let _ = s.write_all(&half);
        streams.push(s);
    }
    let peak = server.rss_mib();
    let started = Instant::now();
    for (i, s) in streams.iter_mut().enumerate() {
        let (response, closed) = read_until_closed(s, Duration::from_secs(30));
        assert_eq!(status_of(&response), Some(401), "client {i}: {}", String::from_utf8_lossy(&response));
        assert!(closed, "client {i}: the connection stayed open after its 401");
        assert_eq!(error_of(401, &body_of(&response)).1["code"], "invalid_api_key");
    }
    let answered = started.elapsed();
    drop(streams);
    // The memory taken while they were connected is given back (a hang guard
    // of 30 s; the bound is docs/server.md's).
    let started = Instant::now();
    let mut after = server.rss_mib();
    while after > before + 32.0 && started.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
        after = server.rss_mib();
    }
    println!("{CLIENTS} unauthenticated half bodies: RSS {before:.1} MiB before, {peak:.1} MiB with them connected, {after:.1} MiB after; all 401 within {answered:?}");
    assert!(after <= before + 32.0, "RSS {before:.1} MiB before, {after:.1} MiB after the clients left");
    assert_eq!(server.speech(json!({"model": "supertonic", "voice": "default", "input": "Hi.", "response_format": "wav"})).0, 200);
}

#[test]
fn health_answers_within_a_second_while_2000_half_open_connections_are_held() {
    const HELD: usize = 2000;
    allow_open_files(HELD as libc::rlim_t + 512);
    // Timeouts far beyond the test, so every connection is still held when /health is asked.
    let server = Server::start(&["--header-timeout", "300", "--body-timeout", "300"]);
    let mut held = Vec::new();
    for i in 0..HELD {
        let mut s = std::net::TcpStream::connect(server.address()).unwrap();
        // A third send nothing, a third half a header, a third half a body.
        match i % 3 {
            0 => {}
            1 => write!(s, "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\n").unwrap(),
            _ => write!(s, "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Length: 1000\r\n\r\n{{\"model\"").unwrap(),
        }
        held.push(s);
    }
    server.wait_for_connections(HELD);
    let mut worst = Duration::ZERO;
    for _ in 0..5 {
        let asked = Instant::now();
        let (status, _) = server.get("/health", false);
        worst = worst.max(asked.elapsed());
        assert_eq!(status, 200);
    }
    println!("/health with {HELD} half-open connections held: slowest of 5 answers {worst:?}");
    assert!(worst < Duration::from_secs(1), "/health took {worst:?} with {HELD} half-open connections held");
    drop(held);
}

#[test]
fn timeouts_close_silent_slow_and_idle_connections() {
    let server = Server::start(&["--header-timeout", "1", "--idle-timeout", "1", "--body-timeout", "1"]);
    let connect = |what: &'static str| {
        let mut s = std::net::TcpStream::connect(server.address()).unwrap();
        match what {
            "sends nothing" => {}
            "half a header" => write!(s, "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\n").unwrap(),
            "half a body" => {
                write!(s, "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Length: 1000\r\n\r\n{{\"model\"").unwrap()
            }
            _ => write!(s, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap(),
        }
        (what, s, Instant::now())
    };
    let mut cases: Vec<_> = ["sends nothing", "half a header", "half a body", "idle after a response"].into_iter().map(connect).collect();
    for (what, s, opened) in &mut cases {
        // Before, all four were still open after 95 s; 30 s is a hang guard.
        let (response, closed) = read_until_closed(s, Duration::from_secs(30));
        println!("{what}: closed after {:?}, status {:?}", opened.elapsed(), status_of(&response));
        assert!(closed, "{what}: still open after 30 s with 1 s timeouts");
        match *what {
            "half a body" => assert_eq!(error_of(408, &body_of(&response)).0, status_of(&response).unwrap()),
            "idle after a response" => assert_eq!(status_of(&response), Some(200)),
            _ => assert!(response.is_empty(), "{what}: {}", String::from_utf8_lossy(&response)),
        }
    }
}

/// One response with a Content-Length, read without waiting for the close.
fn read_response(stream: &mut std::net::TcpStream) -> Vec<u8> {
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        assert_eq!(stream.read(&mut byte).unwrap(), 1, "closed mid-head: {}", String::from_utf8_lossy(&got));
        got.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&got).to_ascii_lowercase();
    let length: usize = head.lines().find_map(|l| l.strip_prefix("content-length:")).unwrap().trim().parse().unwrap();
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).unwrap();
    got.extend(body);
    got
}

#[test]
fn the_idle_and_header_timeouts_are_separate() {
    // A 1 s header timeout does not cut a kept-alive connection that waits
    // 3 s between requests...
    let server = Server::start(&["--header-timeout", "1", "--idle-timeout", "300"]);
    let mut kept = std::net::TcpStream::connect(server.address()).unwrap();
    let mut slow = std::net::TcpStream::connect(server.address()).unwrap();
    write!(kept, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(status_of(&read_response(&mut kept)), Some(200));
    write!(slow, "GET /health HTTP/1.1\r\nHost: x\r\n").unwrap();
    std::thread::sleep(Duration::from_secs(3));
    write!(kept, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(status_of(&read_response(&mut kept)), Some(200), "the idle connection was closed by the header timeout");
    // ...while a head sent slowly is cut by it.
    assert!(read_until_closed(&mut slow, Duration::from_secs(30)).1, "half a head outlived a 1 s header timeout");
    drop(server);

    // A 1 s idle timeout closes a kept-alive connection while a half-sent
    // head, under a 300 s header timeout, stays open.
    let server = Server::start(&["--header-timeout", "300", "--idle-timeout", "1"]);
    let mut idle = std::net::TcpStream::connect(server.address()).unwrap();
    let mut slow = std::net::TcpStream::connect(server.address()).unwrap();
    write!(slow, "GET /health HTTP/1.1\r\nHost: x\r\n").unwrap();
    write!(idle, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(status_of(&read_response(&mut idle)), Some(200));
    let started = Instant::now();
    assert!(read_until_closed(&mut idle, Duration::from_secs(30)).1, "an idle connection outlived a 1 s idle timeout");
    println!("idle connection closed {:?} after its response (1 s idle timeout)", started.elapsed());
    slow.set_nonblocking(true).unwrap();
    let still_open = matches!(slow.read(&mut [0u8; 16]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    assert!(still_open, "half a head was closed by the idle timeout");
}

#[test]
fn connections_over_the_cap_are_refused() {
    let server = Server::start(&["--max-connections", "3", "--header-timeout", "120"]);
    // Connections are opened until the server answers one (held ones stay
    // silent until the header timeout). A connection of the harness's own
    // that the server has not yet seen close may still take a place, so the
    // refusal may come one connection early, never before the cap is full.
    let mut held = Vec::new();
    let mut extra = loop {
        assert!(held.len() <= 5, "no connection over the cap of 3 was refused");
        let s = std::net::TcpStream::connect(server.address()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        match s.peek(&mut [0u8; 1]) {
            Ok(n) if n > 0 => break s,
            _ => held.push(s),
        }
    };
    assert!(held.len() >= 2, "refused after {} connections with a cap of 3", held.len());
    let (response, closed) = read_until_closed(&mut extra, Duration::from_secs(30));
    assert!(closed, "the connection over the cap was kept open");
    let (status, e) = error_of(status_of(&response).unwrap(), &body_of(&response));
    assert_eq!((status, e["code"].as_str()), (503, Some("too_many_connections")), "{e}");
    drop(held);
    let started = Instant::now();
    while server.get("/health", false).0 != 200 {
        assert!(started.elapsed() < Duration::from_secs(30), "no connection freed");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(server.metric("tts_refused_connections_total") >= 1.0);
}

#[test]
fn sigterm_closes_half_open_connections_after_the_grace_period() {
    let mut server = Server::start(&["--shutdown-grace", "1", "--header-timeout", "300", "--body-timeout", "300"]);
    let mut header = std::net::TcpStream::connect(server.address()).unwrap();
    write!(header, "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\n").unwrap();
    let mut body = std::net::TcpStream::connect(server.address()).unwrap();
    write!(body, "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Length: 1000\r\n\r\n{{\"model\"").unwrap();
    server.wait_for_connections(2);
    // Before, the drain waited on these for ever (stop() panics after 60 s).
    let started = Instant::now();
    let status = server.stop();
    println!("SIGTERM with two half-open connections and a 1 s grace: exited after {:?}", started.elapsed());
    assert!(status.success(), "{status:?}");
    for s in [&mut header, &mut body] {
        assert!(read_until_closed(s, Duration::from_secs(5)).1);
    }
}

#[test]
fn every_format_cancels_when_its_client_leaves() {
    let server = Server::start(&[]);
    for (i, format) in ["flac", "mp3", "opus", "aac", "wav", "pcm"].into_iter().enumerate() {
        let mut stream = server.unread_request_as("supertonic", format);
        let mut first = [0u8; 256];
        let n = stream.read(&mut first).unwrap();
        assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"), "{format}: {}", String::from_utf8_lossy(&first[..n]));
        drop(stream);
        // Before, FLAC (which sends nothing until the end) ran to the end of
        // its synthesis and was never counted.
        server.wait_for_metric(&format!("tts_cancelled_syntheses_total{{model=\"supertonic\"}} {}", i + 1));
        server.wait_for_metric("tts_busy_workers{model=\"supertonic\"} 0");
    }
    assert_eq!(server.speech(json!({"model": "supertonic", "voice": "default", "input": "Still here.", "response_format": "flac"})).0, 200);
}

/// Both ways a model delivers audio cancel: streamed pieces (Supertonic's
/// short first piece, Chatterbox's speech-token hops) and one piece per text
/// chunk (`stream_first_chars = 0`, `stream_tokens = 0`), in FLAC (nothing
/// sent until the end) and WAV.
#[test]
fn both_stream_modes_cancel_when_the_client_leaves() {
    let supertonic = format!("[model]\nfiles = [\"{}\"]\n", supertonic_fixture().display());
    let turbo: Vec<String> = common::chatterbox_fixture().iter().map(|p| format!("\"{}\"", p.display())).collect();
    let turbo = format!("[model]\nfiles = [{}]\n[synthesis]\nmax_chars = 30\nmax_new_tokens = 12\n", turbo.join(", "));
    let server = Server::start_with(
        &[
            ("supertonic-chunks", format!("{supertonic}[synthesis]\nstream_first_chars = 0\n")),
            ("turbo-hops", turbo.clone()),
            ("turbo-chunks", format!("{turbo}stream_tokens = 0\n")),
        ],
        &[],
    );
    for model in ["supertonic", "supertonic-chunks", "turbo-hops", "turbo-chunks"] {
        for (i, format) in ["flac", "wav"].into_iter().enumerate() {
            let mut stream = server.unread_request_as(model, format);
            let mut first = [0u8; 256];
            let n = stream.read(&mut first).unwrap();
            assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"), "{model} {format}: {}", String::from_utf8_lossy(&first[..n]));
            drop(stream);
            server.wait_for_metric(&format!("tts_cancelled_syntheses_total{{model=\"{model}\"}} {}", i + 1));
            server.wait_for_metric(&format!("tts_busy_workers{{model=\"{model}\"}} 0"));
        }
    }
}

#[test]
fn unspeakable_input_is_the_requests_fault_and_every_error_is_json() {
    let server = Server::start(&[]);
    // Only characters the model has no row for: before, 500 `server_error`,
    // which OpenAI's clients retry.
    let (status, _, body) = server.speech(json!({"model": "supertonic", "voice": "default", "input": "\u{1}\u{2}\u{7f}", "response_format": "wav"}));
    let (status, e) = error_of(status, &body);
    println!("unsupported characters: {status} {e}");
    assert_eq!((status, e["type"].as_str(), e["param"].as_str()), (400, Some("invalid_request_error"), Some("input")), "{e}");
    // A 405 had an empty body.
    let (status, body) = server.get("/v1/audio/speech", true);
    let (status, e) = error_of(status, &body);
    assert_eq!((status, e["type"].as_str()), (405, Some("invalid_request_error")), "{e}");
    let r = Server::agent().delete(format!("{}/health", server.base)).call().unwrap();
    assert_eq!(r.status().as_u16(), 405);
}

#[test]
fn a_client_that_never_reads_is_cut_off_after_the_send_timeout() {
    let server = Server::start(&["--workers", "1", "--send-timeout", "1"]);
    // Hundreds of MB of WAV (the format that fills the kernel's buffers
    // fastest) to a client that reads nothing: once they are full the worker
    // waits on it. Before, it waited as long as the client stayed connected,
    // and every other request with it.
    let mut stalled = server.unread_request_as("supertonic", "wav");
    server.wait_for_metric("tts_busy_workers{model=\"supertonic\"} 1");
    let asked = Instant::now();
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(60))).build().into();
    let request = agent.post(format!("{}/v1/audio/speech", server.base)).header("Authorization", format!("Bearer {KEY}"));
    let mut response = request
        .send_json(json!({"model": "supertonic", "voice": "default", "input": "Hi.", "response_format": "wav"}))
        .expect("the second request was not served within 60 s (hang guard; a 1 s send timeout)");
    let served = asked.elapsed();
    assert_eq!(response.status().as_u16(), 200);
    assert!(!response.body_mut().read_to_vec().unwrap().is_empty());
    server.wait_for_metric("tts_cancelled_syntheses_total{model=\"supertonic\"} 1");
    // The stalled connection is closed (what the kernel buffered still arrives first).
    let (got, closed) = read_until_closed(&mut stalled, Duration::from_secs(30));
    assert!(closed, "the stalled connection is still open");
    assert_eq!(status_of(&got), Some(200));
    println!("a client that never reads, 1 s send timeout: the next request served after {served:?}; {} B reached the stalled client", got.len());
}

/// Runs `tts` with the hard and soft limits on open files set to `limit`,
/// until it exits or prints a line starting with `until`; its stderr so far.
fn run_with_open_files(args: &[&str], limit: libc::rlim_t, until: &str) -> (Option<i32>, String) {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(tts());
    command.args(args).env_remove("TTS_LOG").env_remove("TTS_API_KEY").stdout(Stdio::null()).stderr(Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe and touches only the child.
    unsafe {
        command.pre_exec(move || match libc::setrlimit(libc::RLIMIT_NOFILE, &libc::rlimit { rlim_cur: limit, rlim_max: limit }) {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        });
    }
    let mut child = command.spawn().unwrap();
    let mut err = String::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        err.push_str(&line);
        err.push('\n');
        if line.starts_with(until) {
            let _ = child.kill();
            let _ = child.wait();
            return (None, err);
        }
    }
    (child.wait().unwrap().code(), err)
}

#[test]
fn the_default_connection_cap_fits_a_hard_open_file_limit_of_1024() {
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let p = profile(dir.path(), "supertonic", &format!("[backend]\nprefer = [\"cpu\"]\n[model]\nfiles = [\"{}\"]\n", supertonic_fixture().display()));
    let (p, plugins) = (p.display().to_string(), plugins.path().display().to_string());
    let base = ["serve", "--profile", &p, "--plugin-dir", &plugins, "--port", "0"];
    // Before, the default of 4096 connections refused to start under it.
    let (code, err) = run_with_open_files(&base, 1024, "listening on");
    assert_eq!(code, None, "{err}");
    assert!(err.contains("the hard open-file limit is 1024: serving at most 768 connections instead of the default 4096"), "{err}");
    // A number the user chose that does not fit is still refused, in one line.
    let (code, err) = run_with_open_files(&[&base[..], &["--max-connections", "1000"]].concat(), 1024, "listening on");
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: --max-connections 1000 needs 1256 open files, and the hard limit is 1024"), "{err}");
}

/// A request on a bare connection (`Connection: close`): status, head (lower
/// case), body.
fn raw_request(server: &Server, request: &str) -> (u16, String, Vec<u8>) {
    let mut stream = std::net::TcpStream::connect(server.address()).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let (response, closed) = read_until_closed(&mut stream, Duration::from_secs(60));
    assert!(closed, "the server did not close the connection (hang guard)");
    let text = String::from_utf8_lossy(&response).into_owned();
    let head = text.split_once("\r\n\r\n").map_or(text.as_str(), |(h, _)| h).to_ascii_lowercase();
    (status_of(&response).unwrap_or_else(|| panic!("no status: {text}")), head, body_of(&response))
}

/// OpenAI's voice names map to the model's voices (alloy: F1, ash: M1 with
/// the defaults; a profile's `[server.voices]` over them), the voice object
/// `{"id": ...}` names the same voice as the string, and a voice another
/// model reads is 400 with this model's list (a Chatterbox voice file at
/// Supertonic was a 500).
#[test]
fn openai_voice_names_and_objects_map_to_the_models_voices() {
    let more = [("remapped", format!("[model]\nfiles = [\"{}\"]\n[server.voices]\nalloy = \"M1\"\n", supertonic_fixture().display()))];
    let server = Server::start_with(&more, &[]);
    let wav = |model: &str, voice: Value| {
        let (status, _, bytes) = server.speech(json!({"model": model, "voice": voice, "input": "Hi.", "response_format": "wav"}));
        assert_eq!(status, 200, "{model} {voice}: {}", String::from_utf8_lossy(&bytes));
        bytes
    };
    let (f1, m1) = (wav("supertonic", json!("F1")), wav("supertonic", json!("M1")));
    assert_ne!(f1, m1);
    assert_eq!(wav("supertonic", json!("alloy")), f1, "alloy speaks as F1");
    assert_eq!(wav("supertonic", json!("ash")), m1, "ash speaks as M1");
    assert_eq!(wav("supertonic", json!({"id": "ash"})), m1, "the voice object");
    assert_eq!(wav("supertonic", json!({"id": "M1"})), m1);
    // F2 is not in the tiny model: coral falls back to the default voice.
    assert_eq!(wav("supertonic", json!("coral")), f1);
    assert_eq!(wav("remapped", json!("alloy")), m1, "[server.voices] alloy = \"M1\"");

    for (model, voice) in [("supertonic", "theirs"), ("broken", "F1"), ("supertonic", "nobody")] {
        let (status, _, body) = server.speech(json!({"model": model, "voice": voice, "input": "Hi.", "response_format": "wav"}));
        let (status, e) = error_of(status, &body);
        let message = e["message"].as_str().unwrap();
        println!("{model}, voice {voice}: {status} {message}");
        assert_eq!((status, e["param"].as_str(), e["code"].as_str()), (400, Some("voice"), Some("voice_not_found")), "{e}");
        assert!(message.starts_with(&format!("unknown voice `{voice}`")) && message.contains("its voices: default") && message.contains("alloy"), "{message}");
    }
    let (status, _, body) = server.speech(json!({"model": "supertonic", "input": "Hi.", "response_format": "wav"}));
    let (status, e) = error_of(status, &body);
    assert_eq!((status, e["param"].as_str()), (400, Some("voice")), "an omitted voice: {e}");
}

/// A profile's `[server.voices]` is checked when the server starts: a key
/// that is no OpenAI voice (at its line), and a voice the model lacks.
#[test]
fn a_bad_server_voices_table_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let model = supertonic_fixture().display().to_string();
    for (table, want) in [
        ("[server.voices]\nalloy = \"F1\"\nbob = \"F1\"\n", "supertonic.toml:7:7: [server.voices]: `bob` is not an OpenAI voice name (known: alloy, ash,"),
        (
            "[server.voices]\nalloy = \"F9\"\n",
            "model supertonic: [server.voices] alloy = \"F9\": not a voice of this model (default, F1, M1) nor a file of --voices-dir",
        ),
        ("[server]\nvoice = \"F1\"\n", "unknown field `voice`"),
    ] {
        let p = profile(dir.path(), "supertonic", &format!("[backend]\nprefer = [\"cpu\"]\n[model]\nfiles = [\"{model}\"]\n{table}"));
        let out = common::run(&["serve", "--port", "0", "--profile", &p.display().to_string(), "--plugin-dir", &plugins.path().display().to_string()]);
        // The model's table is checked once it loads, after `listening on`.
        let stderr = common::stderr(&out);
        assert!(!out.status.success() && stderr.lines().last().is_some_and(|l| l.starts_with("error: ") && l.contains(want)), "want `{want}` in: {stderr}");
    }
}

/// `stream_format: "sse"`: `speech.audio.delta` events whose base64 audio
/// joins to the very bytes of the audio stream, then `speech.audio.done`
/// with the usage (input characters; 20 ms frames of audio).
#[test]
fn sse_carries_the_audio_streams_bytes_and_ends_with_usage() {
    use base64::Engine as _;
    let server = Server::start(&[]);
    let (_, headers, wav) = server.speech(json!({"model": "supertonic", "voice": "alloy", "input": TEXT, "response_format": "wav"}));
    let rate: u64 = headers["x-sample-rate"].to_str().unwrap().parse().unwrap();
    // The model's samples, whatever the format (pcm is resampled to 24 kHz).
    let samples = ((wav.len() - 44) / 2) as u64;
    for format in ["wav", "pcm", "mp3"] {
        let body = |stream: &str| json!({"model": "supertonic", "voice": "alloy", "input": TEXT, "response_format": format, "stream_format": stream});
        let (status, _, audio) = server.speech(body("audio"));
        assert_eq!(status, 200);
        let (status, headers, events) = server.speech(body("sse"));
        assert_eq!((status, headers["content-type"].to_str().unwrap()), (200, "text/event-stream"));
        let text = String::from_utf8(events).unwrap();
        assert!(text.ends_with("\n\n"), "{text}");
        let events: Vec<Value> = text
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| serde_json::from_str(e.strip_prefix("data: ").unwrap_or_else(|| panic!("not a data line: {e}"))).unwrap())
            .collect();
        let (done, deltas) = events.split_last().unwrap();
        assert!(!deltas.is_empty());
        let mut joined = Vec::new();
        for d in deltas {
            assert_eq!(d["type"], "speech.audio.delta", "{d}");
            let chunk = base64::engine::general_purpose::STANDARD.decode(d["audio"].as_str().unwrap()).unwrap();
            assert!(!chunk.is_empty(), "an empty delta");
            joined.extend(chunk);
        }
        assert_eq!(joined, audio, "{format}: the SSE deltas carry the audio stream's bytes");
        let frames = (samples * 50).div_ceil(rate);
        let chars = TEXT.chars().count() as u64;
        assert_eq!(*done, json!({"type": "speech.audio.done", "usage": {"input_tokens": chars, "output_tokens": frames, "total_tokens": chars + frames}}));
        println!("{format}: {} delta events, usage {}", deltas.len(), done["usage"]);
    }
}

/// `instructions` are taken, and the response says that the model ignored
/// them; over 4096 characters is 400, 1 MB (over the body limit) too.
#[test]
fn instructions_are_accepted_and_reported_ignored() {
    let server = Server::start(&[]);
    let body = |instructions: Value| json!({"model": "supertonic", "voice": "alloy", "input": "Hi.", "response_format": "wav", "instructions": instructions});
    let (status, headers, with) = server.speech(body(json!("Speak like a pirate.")));
    assert_eq!(status, 200);
    assert_eq!(headers["x-tts-instructions"], "ignored (supertonic has no instruction input)");
    let (_, headers, without) = server.speech(json!({"model": "supertonic", "voice": "alloy", "input": "Hi.", "response_format": "wav"}));
    assert!(headers.get("x-tts-instructions").is_none());
    assert_eq!(with, without);
    let (status, _, bytes) = server.speech(body(json!("a".repeat(4097))));
    let (status, e) = error_of(status, &bytes);
    assert_eq!((status, e["param"].as_str()), (400, Some("instructions")), "{e}");
    // 1 MB of instructions is over the body limit too: the body is read no
    // further than the limit, and the field it ends in is to blame.
    let (status, bytes) = server.speech_unread(body(json!("a".repeat(1 << 20))).to_string().into_bytes());
    let (status, e) = error_of(status, &bytes);
    println!("1 MB instructions: {status} {}", e["message"]);
    assert_eq!((status, e["param"].as_str()), (400, Some("instructions")), "{e}");
}

/// CORS: a preflight from an allowed origin gets 204 with the allowed
/// methods, headers and max age, one from any other origin 403 with OpenAI's
/// error JSON; responses to an allowed origin carry its
/// `Access-Control-Allow-Origin`. And `/v1/models/{id}`.
#[test]
fn cors_preflights_and_the_model_object() {
    let server = Server::start(&["--cors-origin", "http://app.example", "--cors-origin", "http://localhost:3000"]);
    let address = server.address();
    let preflight = |origin: &str| {
        raw_request(
            &server,
            &format!("OPTIONS /v1/audio/speech HTTP/1.1\r\nHost: {address}\r\nOrigin: {origin}\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type\r\nConnection: close\r\n\r\n"),
        )
    };
    for origin in ["http://app.example", "http://localhost:3000"] {
        let (status, head, _) = preflight(origin);
        assert_eq!(status, 204, "{head}");
        for line in [
            format!("access-control-allow-origin: {origin}"),
            "access-control-allow-methods: get, post, options".into(),
            "access-control-allow-headers: authorization, content-type".into(),
            "access-control-max-age: 600".into(),
        ] {
            assert!(head.lines().any(|l| l == line), "no `{line}` in {head}");
        }
    }
    let (status, head, body) = preflight("http://evil.example");
    let (status, e) = error_of(status, &body);
    assert_eq!((status, e["code"].as_str()), (403, Some("cors_origin_not_allowed")), "{e}");
    assert!(!head.contains("access-control-allow-origin"), "{head}");

    // The actual request: the header for an allowed origin, none for another.
    for (origin, allowed) in [("http://app.example", true), ("http://evil.example", false)] {
        let (status, head, _) = raw_request(
            &server,
            &format!("GET /v1/models HTTP/1.1\r\nHost: {address}\r\nOrigin: {origin}\r\nAuthorization: Bearer {KEY}\r\nConnection: close\r\n\r\n"),
        );
        assert_eq!(status, 200);
        assert_eq!(head.lines().any(|l| l == format!("access-control-allow-origin: {origin}")), allowed, "{head}");
    }
    // OPTIONS that is not a preflight is still a method the path does not take.
    let (status, _, body) = raw_request(&server, &format!("OPTIONS /v1/models HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"));
    assert_eq!(error_of(status, &body).0, 405);

    let (status, body) = server.get("/v1/models/supertonic", true);
    assert_eq!(
        (status, serde_json::from_slice::<Value>(&body).unwrap()),
        (200, json!({"id": "supertonic", "object": "model", "created": 0, "owned_by": "tts"}))
    );
    let (status, body) = server.get("/v1/models/tts-1", true);
    assert_eq!((status, serde_json::from_slice::<Value>(&body).unwrap()["id"].clone()), (200, json!("tts-1")));
    let (status, body) = server.get("/v1/models/nope", true);
    let (status, e) = error_of(status, &body);
    assert_eq!((status, e["code"].as_str()), (404, Some("model_not_found")), "{e}");
    assert_eq!(server.get("/v1/models/supertonic", false).0, 401);
}

#[test]
fn cors_flags_are_checked_in_one_line() {
    let p = repo().join("profiles/supertonic.toml").display().to_string();
    for (args, want) in [
        (
            vec!["serve", "--profile", &p, "--port", "0", "--api-key", "k", "--cors-origin", "*"],
            "--cors-origin '*' with an API key lets any web page use the server",
        ),
        (vec!["serve", "--profile", &p, "--port", "0", "--cors-origin", "app.example"], "--cors-origin app.example: not an origin (scheme://host[:port]"),
    ] {
        let out = common::run(&args);
        common::assert_one_line_error(&out, want);
    }
}

/// Chatterbox: OpenAI's names speak with its one built-in voice, and its list
/// holds only voices saved by its own variant (not a Nano voice, not a
/// Supertonic style, which is 400 with the list when asked for).
#[test]
fn chatterbox_lists_only_voices_of_its_variant() {
    let turbo: Vec<String> = common::chatterbox_fixture().iter().map(|p| format!("\"{}\"", p.display())).collect();
    let turbo = format!("[model]\nfiles = [{}]\n[synthesis]\nmax_new_tokens = 12\n", turbo.join(", "));
    let server = Server::start_with(&[("turbo", turbo)], &[]);
    // Files added while the server runs count.
    let mut nano = ggml_sys::gguf::GgufWriter::new();
    nano.set_str("general.architecture", "chatterbox-voice").set_str("chatterbox-voice.variant", "nano");
    nano.write_metadata(&server._dir.path().join("voices/nano.voice")).unwrap();

    let (status, body) = server.get("/v1/audio/voices?model=turbo", true);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status, 200, "{v}");
    let mut want = vec!["default"];
    want.extend(tts_serve_api::OPENAI_VOICES);
    want.push("theirs");
    assert_eq!(v["voices"], json!(want));
    assert!(v["openai_voices"].as_object().unwrap().values().all(|voice| voice == "default"), "{v}");

    let speak = |voice: &str| server.speech(json!({"model": "turbo", "voice": voice, "input": "Hi.", "response_format": "wav"}));
    let (status, _, default) = speak("default");
    assert_eq!(status, 200);
    let (status, _, alloy) = speak("alloy");
    assert_eq!(status, 200);
    assert!(alloy == default, "alloy speaks with the built-in voice ({} and {} bytes)", alloy.len(), default.len());
    for voice in ["mine", "nano"] {
        let (status, _, body) = speak(voice);
        let (status, e) = error_of(status, &body);
        assert_eq!((status, e["code"].as_str()), (400, Some("voice_not_found")), "{voice}: {e}");
        assert!(
            e["message"].as_str().unwrap().ends_with("alloy, ash, ballad, coral, echo, fable, nova, onyx, sage, shimmer, verse, marin, cedar, theirs"),
            "{e}"
        );
    }
}

/// `tts health` (the container's HEALTHCHECK): 0 and silent while the server
/// is ready, 1 with one line once it is gone or for a URL it cannot ask.
#[test]
fn tts_health_answers_for_a_running_server_and_names_why_not() {
    let mut server = Server::start(&[]);
    let ok = common::run(&["health", "--url", &server.base]);
    assert!(ok.status.success() && ok.stdout.is_empty() && ok.stderr.is_empty(), "{ok:?}");
    let base = server.base.clone();
    assert!(server.stop().success());
    let gone = common::run(&["health", "--url", &base, "--timeout", "10"]);
    common::assert_one_line_error(&gone, &format!("{base}/health: Connection Failed"));
    common::assert_one_line_error(&common::run(&["health", "--url", "ftp://127.0.0.1:1"]), "--url ftp://127.0.0.1:1: not an http:// or https:// URL");
}
