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
    Command::new(tts()).args(args).env_remove("TTS_LOG").output().unwrap()
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

