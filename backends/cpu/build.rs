//! Builds `libggml-cpu.so` from the pinned ggml source plus `patches/*.patch`.
//!
//! ggml refuses GGML_NATIVE together with DL modules (its runtime feature check
//! needs explicit ISA definitions), so the build machine's ISA is detected here and
//! passed as explicit switches. `TTS_CPU_NATIVE=0` builds the baseline module for
//! bundles shipped to other machines.

fn main() {
    println!("cargo:rerun-if-env-changed=TTS_CPU_NATIVE");
    let native = std::env::var("TTS_CPU_NATIVE").map(|v| v != "0").unwrap_or(true);
    let mut defines = vec![("GGML_CPU", "ON"), ("GGML_OPENMP", "OFF")];
    if native {
        defines.extend(host_isa());
    }
    if let Err(e) = ggml_build_support::build_backend_module("ggml-cpu", "ggml-cpu", &defines) {
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
