//! Builds `libggml-opencl.so` from the pinned ggml source plus `patches/*.patch`
//! (needs the OpenCL headers, the ICD loader's development files and Python 3,
//! which embeds the kernels; see README).

fn main() {
    let defines = [("GGML_OPENCL", "ON"), ("GGML_OPENCL_EMBED_KERNELS", "ON")];
    if let Err(e) = ggml_build_support::build_backend_module("ggml-opencl", &["ggml-opencl"], &defines) {
        panic!("tts-backend-opencl: {e}");
    }
}
