//! The CUDA module needs nvcc, which this build does not assume: it is built
//! by `cargo xtask module-kit cuda` on a GPU host from the same pinned source
//! and patches. Here only the stamp that module must carry is compiled in.

fn main() {
    if let Err(e) = ggml_build_support::declare_external_module("ggml-cuda") {
        panic!("tts-backend-cuda: {e}");
    }
}
