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

use common::{matvec_gelu, one_at_a_time, open_device, run_graph, values, Gelu};
use engine_core::abi::{BackendHandle, OptionValue};
use ggml_sys::{Context, Tensor, TYPE_F16, TYPE_F32};

fn vulkan() -> BackendHandle {
    open_device(
        "vulkan",
        vec![("allow_software", OptionValue::Bool(true)), ("pipeline_cache", OptionValue::Bool(false)), ("pipeline_cache_dir", OptionValue::Str("".into()))],
    )
}

fn cpu() -> BackendHandle {
    open_device("cpu", vec![("threads", OptionValue::Int(2))])
}

/// The first `rows` rows of `t` `[cols, 2 * rows]` (a concat of the result and
/// the node that was kept from fusing), as a contiguous tensor.
fn first_half<'c>(ctx: &'c Context, t: Tensor<'c>, cols: usize, rows: usize) -> Tensor<'c> {
    ctx.cont(ctx.view(t, &[cols as i64, rows as i64], &[cols * 4], 0).unwrap()).unwrap()
}

/// How a graph ends after a fused chain.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Chain {
    /// The chain alone: the device fuses it.
    Fused,
    /// The chain's middle node also read by a concat: the device runs each node.
    Unfused,
}

/// A LayerNorm as the models build it, over `[cols, rows]`: `NORM`, `MUL` by
/// the weight row, and (with `bias`) `ADD` of the bias row.
fn layer_norm(handle: &BackendHandle, cols: usize, rows: usize, bias: bool, chain: Chain) -> Vec<f32> {
    // An offset and a spread per row, as activations have.
    let xs: Vec<f32> = values(cols * rows, (cols * 7 + rows) as u64).iter().enumerate().map(|(i, v)| v * (1 + i / cols % 5) as f32 + 0.3).collect();
    run_graph(handle, |ctx| {
        let x = ctx.new_tensor(TYPE_F32, &[cols as i64, rows as i64]).unwrap();
        let w = ctx.new_tensor(TYPE_F32, &[cols as i64]).unwrap();
        let b = ctx.new_tensor(TYPE_F32, &[cols as i64]).unwrap();
        let normed = ctx.norm(x, 1e-5).unwrap();
        let scaled = ctx.mul(normed, w).unwrap();
        let out = if bias { ctx.add(scaled, b).unwrap() } else { scaled };
        let out = match chain {
            Chain::Fused => out,
            Chain::Unfused => first_half(ctx, ctx.concat(out, normed, 1).unwrap(), cols, rows),
        };
        (vec![(x, xs), (w, values(cols, 11)), (b, values(cols, 12))], out)
    })
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
            let e = engine_core::compare::max_rel_err(&fused, &want).unwrap();
            println!("layer norm [{cols}, {rows}] bias {bias}: rel err {e:.3e} against the CPU (tolerance 1e-5)");
            assert!(e <= 1e-5, "[{cols}, {rows}] bias {bias}: relative error {e:.3e} against the CPU");
            let e = engine_core::compare::max_rel_err(&fused, &unfused).unwrap();
            println!("layer norm [{cols}, {rows}] bias {bias}: rel err {e:.3e} fused against unfused (tolerance 1e-6)");
            assert!(e <= 1e-6, "[{cols}, {rows}] bias {bias}: relative error {e:.3e} fused against unfused");
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
        let e = engine_core::compare::max_rel_err(&got, &want).unwrap();
        println!("matvec + bias + gelu F32 [{cols} -> {rows}] against the CPU: rel err {e:.3e} (tolerance 1e-5)");
        assert!(e <= 1e-5, "[{cols} -> {rows}]: relative error {e:.3e} against the CPU");
        for ty in [TYPE_F32, TYPE_F16] {
            let fused = matvec_gelu(&gpu, ty, cols, rows, Gelu::Node);
            let unfused = matvec_gelu(&gpu, ty, cols, rows, Gelu::NodeUnfused);
            let e = engine_core::compare::max_rel_err(&fused, &unfused).unwrap();
            let name = ggml_sys::type_name(ty);
            println!("matvec + bias + gelu {name} [{cols} -> {rows}] fused against unfused: rel err {e:.3e} (tolerance 1e-6)");
            assert!(e <= 1e-6, "{name} [{cols} -> {rows}]: relative error {e:.3e} fused against unfused");
        }
    }
}
