//! Builds `libggml-vulkan.so` from the pinned ggml source plus `patches/*.patch`,
//! with the tensor-core shader variants: glslc built from the pinned shaderc
//! sources and Vulkan 1.4 headers (see `ggml_build_support::vulkan_toolchain`).

use ggml_build_support::{build_backend_module, tool_cache, vulkan_toolchain};

fn main() {
    if let Err(e) = build() {
        panic!("tts-backend-vulkan: {e}");
    }
}

fn build() -> Result<(), String> {
    let mut defines = vec![("GGML_VULKAN".to_string(), "ON".to_string())];
    let toolchain = vulkan_toolchain::resolve(&tool_cache()?)?;
    // The plugin reports what its module was built with next to what the device
    // offers (`tts devices`).
    println!("cargo:rustc-env=TTS_VULKAN_SHADER_SET={}", if toolchain.is_some() { "matrix-cores" } else { "basic" });
    if let Some(toolchain) = &toolchain {
        defines.extend(toolchain.cmake_defines());
    }
    let defines: Vec<(&str, &str)> = defines.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    build_backend_module("ggml-vulkan", &["ggml-vulkan"], &defines).map(|_| ())
}
