//! The Metal module needs macOS and Xcode's Metal compiler, which this build
//! does not assume: it is built by `cargo xtask module-kit metal` on a Mac from
//! the same pinned source and patches. Here only the stamp that module must
//! carry is compiled in.

fn main() {
    if let Err(e) = ggml_build_support::declare_external_module("ggml-metal") {
        panic!("tts-backend-metal: {e}");
    }
}
