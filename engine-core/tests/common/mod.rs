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

/// Held by each test that drives a device: two lavapipe devices initialised
/// from parallel test threads abort the process inside the driver.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}
