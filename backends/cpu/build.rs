//! Builds ggml's CPU module from the pinned ggml source plus `patches/*.patch`.
//!
//! `TTS_CPU_VARIANTS` picks what is built:
//! - `native` (default): one `libggml-cpu.so` for the build machine's ISA. ggml
//!   refuses GGML_NATIVE together with DL modules (its run-time feature check needs
//!   explicit ISA definitions), so the ISA is detected here and passed as switches.
//! - `all`: every ISA variant ggml knows (`libggml-cpu-haswell.so`, ...,
//!   `-sapphirerapids`, ARM levels on ARM), for bundles shipped to other machines;
//!   the plugin loads the best one the running CPU supports.
//! - `baseline`: one `libggml-cpu.so` at ggml's default x86 level (AVX2, FMA,
//!   F16C, BMI2: Haswell and later).

fn main() {
    println!("cargo:rerun-if-env-changed=TTS_CPU_VARIANTS");
    let mode = std::env::var("TTS_CPU_VARIANTS").unwrap_or_else(|_| "native".into());
    // GGML_LLAMAFILE: tiled F32/F16 matrix kernels (ggml alone defaults it off;
    // without them F32 products fall back to one dot product per output).
    let mut defines = vec![("GGML_CPU", "ON"), ("GGML_OPENMP", "OFF"), ("GGML_LLAMAFILE", "ON")];
    let targets: &[&str] = match mode.as_str() {
        "native" => {
            defines.extend(host_isa());
            &["ggml-cpu"]
        }
        "baseline" => &["ggml-cpu"],
        "all" => {
            defines.push(("GGML_CPU_ALL_VARIANTS", "ON"));
            &[]
        }
        other => panic!("tts-backend-cpu: TTS_CPU_VARIANTS={other}: use native, all or baseline"),
    };
    if let Err(e) = ggml_build_support::build_backend_module("ggml-cpu", targets, &defines) {
        panic!("tts-backend-cpu: {e}");
    }
}

#[cfg(target_arch = "x86_64")]
fn host_isa() -> Vec<(&'static str, &'static str)> {
    // Only valid when host == target, which is how this crate is built.
    let same_arch = std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64");
    if !same_arch {
        return Vec::new();
    }
    let checks: [(&str, bool); 11] = [
        ("GGML_SSE42", std::is_x86_feature_detected!("sse4.2")),
        ("GGML_AVX", std::is_x86_feature_detected!("avx")),
        ("GGML_F16C", std::is_x86_feature_detected!("f16c")),
        ("GGML_FMA", std::is_x86_feature_detected!("fma")),
        ("GGML_AVX2", std::is_x86_feature_detected!("avx2")),
        ("GGML_BMI2", std::is_x86_feature_detected!("bmi2")),
        ("GGML_AVX_VNNI", std::is_x86_feature_detected!("avxvnni")),
        (
            "GGML_AVX512",
            std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512bw")
                && std::is_x86_feature_detected!("avx512dq")
                && std::is_x86_feature_detected!("avx512vl"),
        ),
        ("GGML_AVX512_VBMI", std::is_x86_feature_detected!("avx512vbmi")),
        ("GGML_AVX512_VNNI", std::is_x86_feature_detected!("avx512vnni")),
        ("GGML_AVX512_BF16", std::is_x86_feature_detected!("avx512bf16")),
    ];
    checks.into_iter().filter(|(_, on)| *on).map(|(k, _)| (k, "ON")).collect()
}

#[cfg(not(target_arch = "x86_64"))]
fn host_isa() -> Vec<(&'static str, &'static str)> {
    Vec::new()
}
