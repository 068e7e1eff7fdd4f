//! Shared by the integration tests that load real backend plugins from the build tree.
#![allow(dead_code)]

use engine_core::abi::{BackendHandle, OptionValue};
use engine_core::loader;
use ggml_sys::{Context, Tensor};
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

/// Deterministic values in [-1, 1).
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Builds a graph with `build` (inputs and their values, then the output),
/// runs it on `handle`'s backend and returns the output.
pub fn run_graph(handle: &BackendHandle, build: impl for<'c> FnOnce(&'c Context) -> (Vec<(Tensor<'c>, Vec<f32>)>, Tensor<'c>)) -> Vec<f32> {
    let backend = handle.ggml_backend();
    let ctx = Context::new_no_alloc(16, 16).unwrap();
    let (inputs, out) = build(&ctx);
    let mut graph = ctx.new_graph(16).unwrap();
    graph.build_forward(out);
    let _buffer = backend.alloc_ctx_tensors(&ctx).unwrap();
    for (t, v) in &inputs {
        t.set_f32(v).unwrap();
    }
    backend.compute(&graph).unwrap();
    out.get_f32().unwrap()
}
