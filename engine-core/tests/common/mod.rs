//! Shared by the integration tests that load real backend plugins from the build tree.
#![allow(dead_code)]

use abi_stable::std_types::{RResult, Tuple2};
use engine_core::abi::{BackendHandle, BackendOpenRequest, OptionValue};
use engine_core::loader;
use std::path::PathBuf;

pub fn artifact_dir() -> PathBuf {
    // <target>/<profile>/deps/<test binary>
    std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().to_path_buf()
}

pub fn open_device(backend: &str, options: Vec<(&str, OptionValue)>) -> BackendHandle {
    let path = artifact_dir().join(loader::backend_file_name(backend));
    let (plugin, _) = loader::load_backend(&path).unwrap_or_else(|e| panic!("{e} (run `cargo build --workspace` first)"));
    let request = BackendOpenRequest {
        plugin_path: path.display().to_string().into(),
        options: options.into_iter().map(|(k, v)| Tuple2(k.into(), v)).collect(),
    };
    let session = match (plugin.module.open())(&request) {
        RResult::ROk(s) => s,
        RResult::RErr(e) => panic!("opening {backend}: {e}"),
    };
    assert!(!session.devices().is_empty(), "{backend} lists no device");
    match session.init_device(0) {
        RResult::ROk(h) => h,
        RResult::RErr(e) => panic!("init {backend}: {e}"),
    }
}

