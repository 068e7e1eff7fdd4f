//! Helpers shared by the `tts` binary tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn tts() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tts"))
}

pub fn artifacts() -> PathBuf {
    tts().parent().unwrap().to_path_buf()
}

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// A plugin directory holding the named backend plugins with their ggml modules.
pub fn plugin_dir(backends: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for b in backends {
        for file in [format!("libtts_backend_{b}.so"), format!("libggml-{b}.so"), format!("libggml-{b}.so.stamp.json")] {
            std::fs::copy(artifacts().join(&file), dir.path().join(&file))
                .unwrap_or_else(|e| panic!("{file}: {e} (build the workspace first: cargo build --workspace)"));
        }
    }
    dir
}

pub fn run(args: &[&str]) -> Output {
    run_with(args, None, &[])
}

/// Runs `tts` in `cwd` with extra environment variables; a run that has not
/// ended after two minutes is killed and fails the test (a hang guard, not a
/// timing check).
pub fn run_with(args: &[&str], cwd: Option<&Path>, envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(tts());
    cmd.args(args).env_remove("TTS_LOG").env_remove(engine_core::output::TEST_FAULT_ENV);
    cmd.envs(envs.iter().copied()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    let child = cmd.spawn().unwrap();
    wait_or_kill(child, std::time::Duration::from_secs(120), &format!("tts {}", args.join(" ")))
}

/// `tts voice save --reference REFERENCE --out OUT` with `profile` and the
/// plugins in `plugins`, and extra environment variables.
pub fn save_voice_with(profile: &Path, plugins: &Path, reference: &Path, out: &Path, envs: &[(&str, &str)]) -> Output {
    let args = [
        "voice",
        "save",
        "--profile",
        profile.to_str().unwrap(),
        "--plugin-dir",
        plugins.to_str().unwrap(),
        "--reference",
        reference.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    run_with(&args, None, envs)
}

/// [`save_voice_with`] with no extra environment.
pub fn save_voice(profile: &Path, plugins: &Path, reference: &Path, out: &Path) -> Output {
    save_voice_with(profile, plugins, reference, out, &[])
}

/// Runs `tts` with `input` on stdin (None: stdin closed, as on CI).
pub fn run_stdin(args: &[&str], input: Option<&[u8]>) -> Output {
    let mut cmd = Command::new(tts());
    cmd.args(args).env_remove("TTS_LOG").env_remove(engine_core::output::TEST_FAULT_ENV);
    cmd.stdin(if input.is_some() { std::process::Stdio::piped() } else { std::process::Stdio::null() });
    cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    if let Some(bytes) = input {
        let mut stdin = child.stdin.take().unwrap();
        let bytes = bytes.to_vec();
        // Written from a thread, so a large input cannot deadlock against stdout.
        std::thread::spawn(move || {
            use std::io::Write;
            let _ = stdin.write_all(&bytes);
        });
    }
    wait_or_kill(child, std::time::Duration::from_secs(120), &format!("tts {}", args.join(" ")))
}

/// Waits for `child`, killing it (and failing) after `limit`.
pub fn wait_or_kill(mut child: std::process::Child, limit: std::time::Duration, what: &str) -> Output {
    // Drained from threads: a child writing more than a pipe holds must not block.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn std::io::Read + Send>));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn std::io::Read + Send>));
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {limit:?} (hang)");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    Output { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() }
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// Asserts the error contract: exit 1, exactly one line on stderr starting with `error: `.
pub fn assert_one_line_error(o: &Output, contains: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "exit status; stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "want one line, got: {err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    assert!(lines[0].contains(contains), "want `{contains}` in: {err}");
}

pub fn write_profile(dir: &Path, body: &str) -> PathBuf {
    let p = dir.join("profile.toml");
    std::fs::write(&p, body).unwrap();
    p
}

pub fn read_wav(path: &Path) -> (u32, Vec<f32>) {
    let mut r = hound::WavReader::open(path).unwrap();
    let rate = r.spec().sample_rate;
    (rate, r.samples::<i16>().map(|s| s.unwrap() as f32 / i16::MAX as f32).collect())
}

/// A plugin directory holding the tone fixture model plugin as
/// `libtts_model_tone.so` beside the named backends, and a GGUF for it.
pub fn tone_setup(backends: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let plugins = plugin_dir(backends);
    std::fs::copy(artifacts().join("libtts_test_tone.so"), plugins.path().join("libtts_model_tone.so")).unwrap();
    let gguf = plugins.path().join("tone.gguf");
    let mut w = ggml_sys::gguf::GgufWriter::new();
    w.set_str("general.architecture", "tts-test-tone").set_u32("tts-test-tone.sample_rate", 16000).set_f32("tts-test-tone.frequency", 440.0);
    w.write_metadata(&gguf).unwrap();
    (plugins, gguf)
}

/// The tone plugin as `cargo xtask test` builds it against an older plugin
/// ABI (`abi` like "5.4", `--features abi-5-4`, into `target/abi-5-4/`).
/// `None` (the caller skips, saying so) where it was not built; where xtask
/// built it (`TTS_REQUIRE_ABI_5_4_FIXTURE`) a missing file fails instead.
pub fn old_abi_tone_plugin(abi: &str) -> Option<PathBuf> {
    let dashed = abi.replace('.', "-");
    let path = artifacts().parent().unwrap().join(format!("abi-{dashed}/libtts_test_tone.so"));
    if path.is_file() {
        return Some(path);
    }
    let required = format!("TTS_REQUIRE_ABI_{}_FIXTURE", abi.replace('.', "_"));
    assert!(std::env::var_os(&required).is_none(), "{} is missing (cargo xtask test builds it)", path.display());
    eprintln!("skipped: no ABI {abi} build of the tone plugin at {} (`cargo xtask test` builds it)", path.display());
    None
}

/// A plugin directory with the named backend plugins and model-family plugins.
pub fn plugins_with(backends: &[&str], families: &[&str]) -> tempfile::TempDir {
    let plugins = plugin_dir(backends);
    for f in families {
        let name = format!("libtts_model_{f}.so");
        std::fs::copy(artifacts().join(&name), plugins.path().join(&name)).unwrap();
    }
    plugins
}

/// A profile in `dir` running the model `files` on one backend (CPU: one thread).
pub fn profile_on(dir: &Path, backend: &str, files: &[PathBuf]) -> PathBuf {
    let files: Vec<String> = files.iter().map(|f| format!("\"{}\"", f.display())).collect();
    write_profile(
        dir,
        &format!(
            "[backend]\nprefer = [\"{backend}\"]\nfallback = false\n[backends.cpu]\nthreads = 1\n[backends.vulkan]\nallow_software = true\npipeline_cache = false\n[model]\nfiles = [{}]\n",
            files.join(", ")
        ),
    )
}

/// The committed tiny fixtures.
pub fn supertonic_fixture() -> PathBuf {
    repo().join("tests/fixtures/supertonic/tiny-v2/model.gguf")
}

pub fn chatterbox_fixture() -> Vec<PathBuf> {
    let dir = repo().join("tests/fixtures/chatterbox/turbo-tiny");
    vec![dir.join("t3-turbo.gguf"), dir.join("s3gen-meanflow.gguf")]
}

/// Names in `dir`, sorted.
pub fn dir_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
    v.sort();
    v
}

/// A copy of the model file `source` in `dir` as `name`, with `edit` applied.
pub fn crafted(dir: &Path, name: &str, source: &Path, edit: impl FnOnce(&mut ggml_sys::gguf::GgufEditor)) -> PathBuf {
    let path = dir.join(name);
    let mut e = ggml_sys::gguf::GgufEditor::open(source).unwrap();
    edit(&mut e);
    e.write(&path).unwrap();
    path
}

/// A running `tts serve`, killed when dropped.
pub struct Serving {
    pub child: std::process::Child,
    /// `http://127.0.0.1:PORT`, as the server printed it.
    pub base: String,
}

impl Serving {
    /// SIGTERM, then the exit status once it has drained (a hang guard of a
    /// minute, not a timing check).
    pub fn stop(&mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's id.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let started = std::time::Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(started.elapsed() < std::time::Duration::from_secs(60), "tts serve did not stop on SIGTERM (hang guard)");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `tts serve ARGS --port 0` (no key from the environment), reads the
/// address it prints first, keeps draining its stderr, and waits until
/// `/health` answers 200 (a hang guard of two minutes, not a timing check).
pub fn start_serve(args: &[&str]) -> Serving {
    start_serve_on(0, args)
}

/// [`start_serve`] on a chosen port (a replica restarted where its balancer
/// expects it).
pub fn start_serve_on(port: u16, args: &[&str]) -> Serving {
    let mut cmd = Command::new(tts());
    cmd.args(["serve", "--port", &port.to_string()]).args(args).env_remove("TTS_LOG").env_remove("TTS_API_KEY");
    serve_from(cmd)
}

/// Starts `cmd`, a prepared `tts serve` (its own binary, arguments and
/// environment), and waits for it as [`start_serve`] does: the address from
/// its first `listening on` line (lines before it, such as a pull's, are
/// skipped), then `/health` answering 200.
pub fn serve_from(mut cmd: Command) -> Serving {
    use std::io::{BufRead, BufReader};
    let mut child = cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let listening = lines.by_ref().map_while(Result::ok).find(|l| l.starts_with("listening on ")).expect("tts serve never printed `listening on`");
    let base = listening["listening on ".len()..].split_whitespace().next().unwrap().to_string();
    // The rest of stderr is drained so the server never blocks on it.
    std::thread::spawn(move || lines.for_each(drop));
    let serving = Serving { child, base };
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let started = std::time::Instant::now();
    while agent.get(format!("{}/health", serving.base)).call().map(|r| r.status().as_u16()).unwrap_or(0) != 200 {
        assert!(started.elapsed() < std::time::Duration::from_secs(120), "the models did not load (hang guard)");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    serving
}
