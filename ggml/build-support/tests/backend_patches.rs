//! Every backend plugin's patch series against the pinned ggml tree: each
//! applies in order and touches only its own backend's directory. Backends
//! whose modules are built elsewhere (CUDA on a GPU host) are checked here too,
//! so a ggml bump that breaks one of their patches fails in CI, loudly.

use ggml_build_support::{locate_source, patch_series, prepare_source};
use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).unwrap().to_path_buf()
}

/// `(backend, patches directory)` for every `backends/*/patches`.
fn backend_series() -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(workspace_root().join("backends"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path().join("patches")))
        .filter(|(_, dir)| dir.is_dir())
        .collect();
    out.sort();
    out
}

#[test]
fn every_backend_patch_series_applies_to_the_pinned_ggml_within_its_own_directory() {
    let scratch = tempfile::tempdir().unwrap();
    let pristine = locate_source(scratch.path()).unwrap();
    let series = backend_series();
    let names: Vec<&str> = series.iter().map(|(n, _)| n.as_str()).collect();
    for expected in ["cpu", "cuda", "metal", "opencl", "vulkan"] {
        assert!(names.contains(&expected), "backends/{expected}/patches is missing (found {names:?})");
    }
    for (backend, dir) in &series {
        let patches = patch_series(dir);
        let dest = scratch.path().join(backend);
        if let Err(e) = prepare_source(&pristine, &dest, &patches, &format!("src/ggml-{backend}/")) {
            panic!("backend {backend}: {e}");
        }
        eprintln!("{backend}: {} patches apply to the pinned ggml, each within src/ggml-{backend}/", patches.len());
        std::fs::remove_dir_all(&dest).unwrap();
    }
}

/// A pristine stand-in: `src/ggml.c` (the shared base) and `src/ggml-x/x.c`.
fn tiny_tree(dir: &Path) -> PathBuf {
    let root = dir.join("pristine");
    std::fs::create_dir_all(root.join("src/ggml-x")).unwrap();
    std::fs::write(root.join("src/ggml.c"), "int base = 1;\n").unwrap();
    std::fs::write(root.join("src/ggml-x/x.c"), "int x = 1;\n").unwrap();
    root
}

fn write_patch(dir: &Path, name: &str, file: &str, old: &str, new: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("--- a/{file}\n+++ b/{file}\n@@ -1 +1 @@\n-{old}\n+{new}\n")).unwrap();
    path
}

#[test]
fn a_patch_that_applies_within_its_directory_changes_the_copy_only() {
    let dir = tempfile::tempdir().unwrap();
    let pristine = tiny_tree(dir.path());
    let patch = write_patch(dir.path(), "0001.patch", "src/ggml-x/x.c", "int x = 1;", "int x = 2;");
    prepare_source(&pristine, &dir.path().join("out"), &[patch], "src/ggml-x/").unwrap();
    assert_eq!(std::fs::read_to_string(dir.path().join("out/src/ggml-x/x.c")).unwrap(), "int x = 2;\n");
    assert_eq!(std::fs::read_to_string(pristine.join("src/ggml-x/x.c")).unwrap(), "int x = 1;\n", "the pristine tree stays");
}

#[test]
fn a_patch_outside_its_backend_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pristine = tiny_tree(dir.path());
    let patch = write_patch(dir.path(), "0001-base.patch", "src/ggml.c", "int base = 1;", "int base = 2;");
    let e = prepare_source(&pristine, &dir.path().join("out"), &[patch], "src/ggml-x/").unwrap_err();
    assert!(e.contains("0001-base.patch: touches src/ggml.c; a backend patch may only change src/ggml-x/"), "{e}");
}

#[test]
fn a_patch_that_no_longer_applies_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let pristine = tiny_tree(dir.path());
    let patch = write_patch(dir.path(), "0002-stale.patch", "src/ggml-x/x.c", "int x = 7;", "int x = 8;");
    let e = prepare_source(&pristine, &dir.path().join("out"), &[patch], "src/ggml-x/").unwrap_err();
    assert!(e.contains("0002-stale.patch does not apply to llama-cpp-sys-2-"), "{e}");
}
