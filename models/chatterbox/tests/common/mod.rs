#![allow(dead_code)]
//! Shared by the Chatterbox parity tests: backends, fixture files, error measure.
//!
//! The fixtures (`tests/fixtures/chatterbox/turbo-tiny/`) come from the
//! reference package `chatterbox-tts==0.1.7` run on random weights saved in the
//! official checkpoint formats (`tools/chatterbox/make_fixtures.py`), converted
//! with `tools/chatterbox/convert.py`. Error measure: max |ours − ref| / max |ref|.

use engine_core::abi::{BackendHandle, OptionValue};
use engine_core::loader;
use std::path::{Path, PathBuf};

/// The converted GGUF pair: the committed tiny fixture, or the directory in
/// `TTS_CHATTERBOX_FIXTURE` (a full-size or quantized conversion made on demand).
pub fn fixture_dir() -> PathBuf {
    match std::env::var_os("TTS_CHATTERBOX_FIXTURE") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/chatterbox/turbo-tiny"),
    }
}

/// The fixture's T3 file (`t3-<variant>.gguf`: turbo for the committed one).
pub fn t3_file() -> PathBuf {
    let dir = fixture_dir();
    let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("t3-") && n.ends_with(".gguf")))
        .collect();
    found.sort();
    found.into_iter().next().unwrap_or_else(|| panic!("{}: no t3-*.gguf", dir.display()))
}

/// The reference dumps: `<fixture>/reference`, or `TTS_CHATTERBOX_REFERENCE`.
pub fn reference_dir() -> PathBuf {
    match std::env::var_os("TTS_CHATTERBOX_REFERENCE") {
        Some(dir) => PathBuf::from(dir),
        None => fixture_dir().join("reference"),
    }
}

fn artifact_dir() -> PathBuf {
    std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().to_path_buf()
}

/// The plugin options the tests open `backend` with: a software Vulkan
/// device (lavapipe on CI) is allowed, the CPU takes two threads.
fn options(backend: &str) -> Vec<(&'static str, OptionValue)> {
    match backend {
        "vulkan" => vec![("allow_software", OptionValue::Bool(true))],
        _ => vec![("threads", OptionValue::Int(2))],
    }
}

/// Whether `backend` opens device 0 here; where not, the test says it is
/// skipped (see `loader::open_device_with_or_skip`).
pub fn available(backend: &str) -> bool {
    loader::open_device_with_or_skip(&artifact_dir().join(loader::backend_file_name(backend)), backend, options(backend)).is_some()
}

/// Opens device 0 of a backend plugin built next to the test binary.
pub fn open(backend: &str) -> BackendHandle {
    let path = artifact_dir().join(loader::backend_file_name(backend));
    let options = options(backend);
    loader::open_backend_device(&path, options, 0).unwrap_or_else(|e| panic!("{e} (build the workspace first)"))
}

/// A fixture `.npy` as (shape, f32 values); int64 arrays are converted.
pub fn npy(name: &str) -> (Vec<u64>, Vec<f32>) {
    npy_in(&reference_dir(), name)
}

/// `dir/name.npy` as (shape, f32 values); int64 and uint8 (boolean) arrays are converted.
pub fn npy_in(dir: &Path, name: &str) -> (Vec<u64>, Vec<f32>) {
    let path = dir.join(format!("{name}.npy"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let f = npyz::NpyFile::new(&bytes[..]).unwrap();
    // A transposed tensor's `.numpy()` saves column-major: read as it is, it would be transposed.
    assert!(f.order() == npyz::Order::C, "{}: saved in Fortran order; save np.ascontiguousarray(...)", path.display());
    let shape = f.shape().to_vec();
    let values = match f.dtype().descr().trim_matches('\'') {
        "<f4" => f.into_vec::<f32>().unwrap(),
        "<i8" => f.into_vec::<i64>().unwrap().into_iter().map(|v| v as f32).collect(),
        "|u1" => f.into_vec::<u8>().unwrap().into_iter().map(f32::from).collect(),
        other => panic!("{}: dtype {other}", path.display()),
    };
    (shape, values)
}

/// A fixture `.npy` of integers.
pub fn npy_i64(name: &str) -> Vec<i64> {
    npy_i64_in(&reference_dir(), name)
}

/// `dir/name.npy` of integers.
pub fn npy_i64_in(dir: &Path, name: &str) -> Vec<i64> {
    let path = dir.join(format!("{name}.npy"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    npyz::NpyFile::new(&bytes[..]).unwrap().into_vec::<i64>().unwrap()
}

/// The shared NaN-failing, length-checking comparison (`engine_core::compare`).
pub fn rel_err(ours: &[f32], reference: &[f32]) -> f32 {
    engine_core::compare::max_rel_err(ours, reference).unwrap_or_else(|e| panic!("{e}"))
}

pub fn check(stage: &str, ours: &[f32], reference: &[f32], tol: f32) -> f32 {
    let e = rel_err(ours, reference);
    println!("  {stage:<24} rel err {e:.3e} (tolerance {tol:.0e})");
    assert!(e <= tol, "{stage}: relative error {e:.3e} exceeds {tol:.0e}");
    e
}

pub mod suites;
