//! Kernel tests for the Vulkan plugin's fusions (`backends/vulkan/patches/`,
//! 0007): each fused chain on the models' shapes, against the CPU plugin on the
//! same inputs and against the unfused dispatches on the same device. They run
//! on lavapipe here and in CI, and on the GPU host's device (`bench/gpu_host.sh
//! parity` and `vk_fusion`, where a GPU is ranked before a software device).
//!
//! A chain is kept from fusing by giving its middle node a second reader (a
//! `concat` with it), which is what ggml's fusion rules refuse; the fused and
//! the unfused graph then compute the same values from the same inputs.

mod common;

use common::{check_close, layer_norm, matvec_gelu, one_at_a_time, open_device, Chain, Gelu};
use engine_core::abi::{BackendHandle, OptionValue};
use ggml_sys::{TYPE_F16, TYPE_F32};

fn vulkan() -> BackendHandle {
    open_device(
        "vulkan",
        vec![("allow_software", OptionValue::Bool(true)), ("pipeline_cache", OptionValue::Bool(false)), ("pipeline_cache_dir", OptionValue::Str("".into()))],
    )
}

fn cpu() -> BackendHandle {
    open_device("cpu", vec![("threads", OptionValue::Int(2))])
}

/// The fused LayerNorm: T3's decode and prefill rows (1024 wide), S3Gen's and
/// Supertonic's 512-wide frames, a width that leaves the last of the 512
/// threads' strides short, and an odd one; with and without the bias.
#[test]
fn fused_layer_norm_matches_the_cpu_and_the_unfused_dispatches() {
    let _serial = one_at_a_time();
    let cpu = cpu();
    let gpu = vulkan();
    for (cols, rows) in [(1024, 1), (1024, 60), (512, 706), (512, 41), (1100, 2), (80, 3)] {
        for bias in [true, false] {
            let want = layer_norm(&cpu, cols, rows, bias, Chain::Fused);
            let fused = layer_norm(&gpu, cols, rows, bias, Chain::Fused);
            let unfused = layer_norm(&gpu, cols, rows, bias, Chain::Unfused);
            check_close(&format!("layer norm [{cols}, {rows}] bias {bias} against the CPU"), &fused, &want, 1e-5);
            check_close(&format!("layer norm [{cols}, {rows}] bias {bias} fused against unfused"), &fused, &unfused, 1e-6);
        }
    }
}

/// The GELU in the matrix-vector epilogue, as T3's feed-forward (1024 → 4096)
/// and an odd shape run it: F32 weights against the CPU, F32 and F16 weights
/// against the unfused dispatches (the same sums, then the same GELU).
#[test]
fn matvec_with_gelu_matches_the_cpu_and_the_unfused_dispatches() {
    let _serial = one_at_a_time();
    let cpu = cpu();
    let gpu = vulkan();
    for (cols, rows) in [(1024, 4096), (80, 33)] {
        let want = matvec_gelu(&cpu, TYPE_F32, cols, rows, Gelu::Composed);
        let got = matvec_gelu(&gpu, TYPE_F32, cols, rows, Gelu::Node);
        check_close(&format!("matvec + bias + gelu F32 [{cols} -> {rows}] against the CPU"), &got, &want, 1e-5);
        for ty in [TYPE_F32, TYPE_F16] {
            let fused = matvec_gelu(&gpu, ty, cols, rows, Gelu::Node);
            let unfused = matvec_gelu(&gpu, ty, cols, rows, Gelu::NodeUnfused);
            let name = ggml_sys::type_name(ty);
            check_close(&format!("matvec + bias + gelu {name} [{cols} -> {rows}] fused against unfused"), &fused, &unfused, 1e-6);
        }
    }
}
