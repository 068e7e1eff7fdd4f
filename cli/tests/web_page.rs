//! The web page `tts serve` answers at `/`, in headless Chromium (Debian's
//! `chromium`; `cargo xtask deps` installs it): it loads, lists the served
//! models and their voices from the API, synthesizes while streaming, and
//! its `<audio>` element plays the result, with no script error. The test
//! reads the DOM Chromium prints once the page is done (`--dump-dom` after
//! a virtual-time budget); the page fills its form from the query and
//! speaks at once with `run=1`. Without Chromium the tests report themselves
//! skipped, unless `TTS_REQUIRE_CHROMIUM` is set (CI sets it).

mod common;

use common::{plugins_with, repo, start_serve, supertonic_fixture, wait_or_kill, Serving};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The server and what it reads, kept as long as it runs.
struct Server {
    serving: Serving,
    _dir: tempfile::TempDir,
    _plugins: tempfile::TempDir,
}

fn profile(dir: &Path, name: &str, model: &str) -> PathBuf {
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, format!("[backend]\nprefer = [\"cpu\"]\nfallback = false\n[backends.cpu]\nthreads = 1\n[model]\nfiles = [{model}]\n")).unwrap();
    p
}

/// Supertonic (`supertonic`) and Chatterbox Turbo (`turbo`) on the tiny
/// fixtures, with `extra` flags.
fn serve(extra: &[&str]) -> Server {
    let plugins = plugins_with(&["cpu"], &["supertonic", "chatterbox"]);
    let dir = tempfile::tempdir().unwrap();
    let turbo = repo().join("tests/fixtures/chatterbox/turbo-tiny");
    let supertonic = profile(dir.path(), "supertonic", &format!("\"{}\"", supertonic_fixture().display()));
    let turbo = profile(dir.path(), "turbo", &format!("\"{}\", \"{}\"", turbo.join("t3-turbo.gguf").display(), turbo.join("s3gen-meanflow.gguf").display()));
    let mut args = vec!["--plugin-dir", plugins.path().to_str().unwrap(), "--profile", supertonic.to_str().unwrap(), "--profile", turbo.to_str().unwrap()];
    args.extend_from_slice(extra);
    let serving = start_serve(&args);
    Server { serving, _dir: dir, _plugins: plugins }
}

fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|name| std::env::var_os("PATH").and_then(|paths| std::env::split_paths(&paths).map(|d| d.join(name)).find(|p| p.is_file())))
}

/// The DOM of `url` after the page's scripts ran (at most `budget_ms` of
/// virtual time), from a Chromium with a private profile directory.
fn dump_dom(chromium: &Path, url: &str, budget_ms: u32) -> String {
    let profile = tempfile::tempdir().unwrap();
    let child = Command::new(chromium)
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--mute-audio",
            "--autoplay-policy=no-user-gesture-required",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--virtual-time-budget={budget_ms}"))
        .args(["--dump-dom", url])
        .env("HOME", profile.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_or_kill(child, Duration::from_secs(120), "chromium --dump-dom");
    assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The text of the element with `id` in `dom` (a flat element: no nested tags).
fn text_of<'a>(dom: &'a str, id: &str) -> &'a str {
    let start = dom.find(&format!("id=\"{id}\"")).unwrap_or_else(|| panic!("no #{id} in {dom}"));
    let open = start + dom[start..].find('>').unwrap() + 1;
    &dom[open..open + dom[open..].find('<').unwrap()]
}

fn require_chromium() -> Option<PathBuf> {
    let found = chromium();
    if found.is_none() {
        assert!(std::env::var_os("TTS_REQUIRE_CHROMIUM").is_none(), "TTS_REQUIRE_CHROMIUM is set but no chromium is on PATH (cargo xtask deps installs it)");
        eprintln!("skipped: no chromium on PATH (apt install chromium)");
    }
    found
}

#[test]
fn the_page_lists_the_models_speaks_while_streaming_and_plays() {
    let Some(chromium) = require_chromium() else { return };
    let server = serve(&[]);
    let url = format!("{}/?model=supertonic&voice=M1&text=Hello%20there.&format=mp3&run=1", server.serving.base);
    // Playback starts on the media pipeline's real clock while the page runs
    // on virtual time, so on a loaded machine the dump can come before the
    // `playing` event: the page is loaded again, at most three times in all,
    // until it shows playback. Every assertion below holds for the last load.
    let played = |dom: &str| dom.contains("data-state=\"playing\"") || dom.contains("data-state=\"ended\"");
    let mut dom = dump_dom(&chromium, &url, 30_000);
    for _ in 1..3 {
        if played(&dom) {
            break;
        }
        dom = dump_dom(&chromium, &url, 30_000);
    }
    assert_eq!(text_of(&dom, "errors"), "", "script or API errors");
    for model in ["supertonic", "turbo"] {
        assert!(dom.contains(&format!("<option value=\"{model}\">{model}</option>")), "{model} not listed: {dom}");
    }
    assert!(dom.contains("<option value=\"M1\" selected=\"\">M1</option>") || dom.contains("value=\"M1\""), "voices not listed: {dom}");
    let status = text_of(&dom, "status");
    assert!(status.starts_with("done: "), "status: {status}");
    let player = &dom[dom.find("id=\"player\"").unwrap()..];
    let player = &player[..player.find('>').unwrap()];
    assert!(player.contains("src=\"blob:"), "the audio element has the utterance: {player}");
    assert!(player.contains("data-state=\"playing\"") || player.contains("data-state=\"ended\""), "the audio element did not play: {player}");
    let seconds: f64 = player.split("data-seconds=\"").nth(1).and_then(|s| s.split('"').next()).unwrap().parse().unwrap();
    assert!(seconds > 0.1, "{seconds} s of audio");
    let link = &dom[dom.find("id=\"download\"").unwrap()..];
    assert!(link.contains("download=\"speech.mp3\""), "the download is the chosen format: {link}");
}

#[test]
fn the_page_reports_an_api_error_in_the_page() {
    let Some(chromium) = require_chromium() else { return };
    let server = serve(&[]);
    // Speed 9 is outside OpenAI's range: the server's message shows in the page.
    let url = format!("{}/?model=supertonic&text=Hello.&speed=9&run=1", server.serving.base);
    let dom = dump_dom(&chromium, &url, 20_000);
    let errors = text_of(&dom, "errors");
    assert!(errors.contains("speed"), "errors: {errors}");
    assert_eq!(text_of(&dom, "status"), "failed");
}
