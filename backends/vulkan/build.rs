//! Builds `libggml-vulkan.so` from the pinned ggml source plus `patches/*.patch`
//! (needs glslc, the Vulkan headers and SPIRV-Headers; see README).

fn main() {
    let defines = [("GGML_VULKAN", "ON")];
    if let Err(e) = ggml_build_support::build_backend_module("ggml-vulkan", &["ggml-vulkan"], &defines) {
        panic!("tts-backend-vulkan: {e}");
    }
}
