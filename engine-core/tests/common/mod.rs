//! Shared by the integration tests that load real backend plugins from the build tree.
#![allow(dead_code)]

use engine_core::abi::{BackendHandle, OptionValue};
use engine_core::loader;
use std::path::PathBuf;

pub fn artifact_dir() -> PathBuf {
    // <target>/<profile>/deps/<test binary>
    std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().to_path_buf()
}

pub fn open_device(backend: &str, options: Vec<(&str, OptionValue)>) -> BackendHandle {
    let path = artifact_dir().join(loader::backend_file_name(backend));
    loader::open_backend_device(&path, options, 0).unwrap_or_else(|e| panic!("{e} (run `cargo build --workspace` first)"))
}
