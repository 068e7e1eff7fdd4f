//! Shared by the integration tests that load real backend plugins from the build tree.
#![allow(dead_code)]

use engine_core::abi::{BackendHandle, OptionValue};
use engine_core::loader;
use ggml_sys::{Context, Tensor, Type, TYPE_F16, TYPE_F32};
use std::path::PathBuf;

pub fn artifact_dir() -> PathBuf {
    // <target>/<profile>/deps/<test binary>
    std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().to_path_buf()
}

pub fn open_device(backend: &str, options: Vec<(&str, OptionValue)>) -> BackendHandle {
    let path = artifact_dir().join(loader::backend_file_name(backend));
    loader::open_backend_device(&path, options, 0).unwrap_or_else(|e| panic!("{e} (run `cargo build --workspace` first)"))
}

/// The Vulkan plugin on the first device, software ones (lavapipe) allowed,
/// with no pipeline cache on disk.
pub fn open_lavapipe() -> BackendHandle {
    let options =
        vec![("allow_software", OptionValue::Bool(true)), ("pipeline_cache", OptionValue::Bool(false)), ("pipeline_cache_dir", OptionValue::Str("".into()))];
    open_device("vulkan", options)
}

/// Held by each test that drives a device: two lavapipe devices initialised
/// from parallel test threads abort the process inside the driver.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether this process is a child started by [`run_as_child`] with `marker`.
pub fn in_child(marker: &str) -> bool {
    std::env::var_os(marker).is_some()
}

/// Runs `test` of this test binary again in a child process with `marker`
/// and `env` set and `unset` removed, for what a backend reads only when its
/// device starts (the per-op loggers); asserts that the child passed and
/// returns its stderr.
pub fn run_as_child(marker: &str, test: &str, env: &[(&str, &str)], unset: &[&str]) -> String {
    let _serial = one_at_a_time();
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command.args(["--exact", test, "--nocapture", "--test-threads=1"]).env(marker, "1");
    for (k, v) in env {
        command.env(k, v);
    }
    for k in unset {
        command.env_remove(k);
    }
    let child = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&child.stdout);
    let stderr = String::from_utf8_lossy(&child.stderr).into_owned();
    println!("{stdout}");
    // The per-op log lines (which start with a digit on Vulkan) are left out
    // of a failure's message.
    assert!(
        child.status.success(),
        "child failed:\n{stdout}\n{}",
        stderr.lines().filter(|l| !l.starts_with(|c: char| c.is_ascii_digit())).collect::<Vec<_>>().join("\n")
    );
    stderr
}

/// Asserts that a backend's per-op log (a child's stderr) has a line starting
/// with each of `dispatches`.
pub fn assert_logged(stderr: &str, dispatches: &[String]) {
    for d in dispatches {
        assert!(stderr.lines().any(|l| l.starts_with(d.as_str())), "no dispatch `{d}` in the per-op log:\n{stderr}");
    }
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
    let ctx = Context::new_no_alloc(64, 64).unwrap();
    let (inputs, out) = build(&ctx);
    let mut graph = ctx.new_graph(64).unwrap();
    graph.build_forward(out);
    let _buffer = backend.alloc_ctx_tensors(&ctx).unwrap();
    for (t, v) in &inputs {
        t.set_f32(v).unwrap();
    }
    backend.compute(&graph).unwrap();
    out.get_f32().unwrap()
}

/// How [`matvec_gelu`] builds `gelu(W x + b)`.
#[derive(Clone, Copy, PartialEq)]
pub enum Gelu {
    /// The tanh formula from elementary ops, in F32 (the CPU's GELU node
    /// reads an F16 table, so it is no reference at 1e-5).
    Composed,
    /// The device's GELU node right after the biased product: what the CUDA
    /// (0006) and Vulkan (0007) patches fuse into the product's epilogue.
    Node,
    /// The GELU node with the biased product also read by another node, so it
    /// cannot be fused: the unfused kernels' result.
    NodeUnfused,
}

/// `gelu(W x + b)` for `W` `[cols, rows]` of type `ty` and one column `x`.
pub fn matvec_gelu(handle: &BackendHandle, ty: Type, cols: usize, rows: usize, gelu: Gelu) -> Vec<f32> {
    run_graph(handle, |ctx| {
        let w = ctx.new_tensor(ty, &[cols as i64, rows as i64]).unwrap();
        let x = ctx.new_tensor(TYPE_F32, &[cols as i64, 1]).unwrap();
        let b = ctx.new_tensor(TYPE_F32, &[rows as i64, 1]).unwrap();
        let y = ctx.add(ctx.mul_mat(w, x).unwrap(), b).unwrap();
        let out = match gelu {
            Gelu::Composed => gelu_composed(ctx, y),
            Gelu::Node => ctx.gelu(y).unwrap(),
            Gelu::NodeUnfused => ctx.view(ctx.concat(ctx.gelu(y).unwrap(), y, 1).unwrap(), &[rows as i64, 1], &[rows * 4], 0).unwrap(),
        };
        // Weights scaled so that pre-activations spread over about ±3, GELU's curved part.
        let spread = 6.0 / (cols as f32).sqrt();
        let weights = values(cols * rows, (cols + rows) as u64).iter().map(|v| v * spread).collect();
        let inputs = vec![(w, weights), (x, values(cols, 31)), (b, values(rows, 32))];
        (inputs, ctx.cont(out).unwrap())
    })
}

/// GELU's tanh formula from elementary ops, in F32.
fn gelu_composed<'c>(ctx: &'c Context, y: Tensor<'c>) -> Tensor<'c> {
    let inner = ctx.add(y, ctx.scale(ctx.mul(ctx.mul(y, y).unwrap(), y).unwrap(), 0.044715).unwrap()).unwrap();
    let t = ctx.tanh(ctx.scale(inner, 0.797_884_6).unwrap()).unwrap();
    ctx.mul(y, ctx.scale_bias(t, 0.5, 0.5).unwrap()).unwrap()
}

/// Asserts that `got` is within `tolerance` (largest relative error) of
/// `want`, printing the error under `what` either way.
pub fn check_close(what: &str, got: &[f32], want: &[f32], tolerance: f32) {
    let e = engine_core::compare::max_rel_err(got, want).unwrap();
    println!("{what}: rel err {e:.3e} (tolerance {tolerance:.0e})");
    assert!(e <= tolerance, "{what}: relative error {e:.3e}");
}

/// How a graph ends after a chain a device may fuse.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Chain {
    /// The chain alone: the device may fuse it.
    Fused,
    /// The chain's middle node also read by a concat: ggml's fusion rules
    /// refuse it, so the device runs each node.
    Unfused,
}

/// The first `rows` rows of `t` `[cols, 2 * rows]` (a concat of the result and
/// the node kept from fusing), as a contiguous tensor.
fn first_half<'c>(ctx: &'c Context, t: Tensor<'c>, cols: usize, rows: usize) -> Tensor<'c> {
    ctx.cont(ctx.view(t, &[cols as i64, rows as i64], &[cols * 4], 0).unwrap()).unwrap()
}

/// A LayerNorm as the model kit builds it, over `[cols, rows]`: `NORM`, `MUL`
/// by the weight row, and (with `bias`) `ADD` of the bias row.
pub fn layer_norm(handle: &BackendHandle, cols: usize, rows: usize, bias: bool, chain: Chain) -> Vec<f32> {
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

/// `h + W x` for `W` `[cols, rows]` of type `ty` and `n` columns in `x`, the
/// residual first as the Llama T3 adds it; with `Chain::Unfused` the product
/// is also read by a concat, so the add runs as its own kernel.
pub fn matvec_residual(handle: &BackendHandle, ty: Type, cols: usize, rows: usize, n: usize, chain: Chain) -> Vec<f32> {
    run_graph(handle, |ctx| {
        let w = ctx.new_tensor(ty, &[cols as i64, rows as i64]).unwrap();
        let x = ctx.new_tensor(TYPE_F32, &[cols as i64, n as i64]).unwrap();
        let h = ctx.new_tensor(TYPE_F32, &[rows as i64, n as i64]).unwrap();
        let product = ctx.mul_mat(w, x).unwrap();
        let sum = ctx.add(h, product).unwrap();
        let out = match chain {
            Chain::Fused => sum,
            Chain::Unfused => first_half(ctx, ctx.concat(sum, product, 1).unwrap(), rows, n),
        };
        let spread = 2.0 / (cols as f32).sqrt();
        // Weights F16 holds exactly, so F32 and F16 weights are the same matrix.
        let weights = through_f16(&values(cols * rows, (cols * 3 + rows) as u64).iter().map(|v| v * spread).collect::<Vec<_>>());
        (vec![(w, weights), (x, values(cols * n, 51)), (h, values(rows * n, 52))], out)
    })
}

/// `swiglu(W x)` for a fused gate-and-up `W` `[cols, 2 * rows]` of type `ty`
/// (gate rows first, as the Llama T3's feed-forward) and `n` columns in `x`:
/// `[rows, n]`. With `Chain::Unfused` the product is also read by a view, so
/// the SWIGLU runs as its own kernel.
pub fn matvec_swiglu(handle: &BackendHandle, ty: Type, cols: usize, rows: usize, n: usize, chain: Chain) -> Vec<f32> {
    run_graph(handle, |ctx| {
        let w = ctx.new_tensor(ty, &[cols as i64, 2 * rows as i64]).unwrap();
        let x = ctx.new_tensor(TYPE_F32, &[cols as i64, n as i64]).unwrap();
        let product = ctx.mul_mat(w, x).unwrap();
        let out = ctx.swiglu(product).unwrap();
        let out = match chain {
            Chain::Fused => out,
            Chain::Unfused => {
                let gate = ctx.cont(ctx.view(product, &[rows as i64, n as i64], &[product.nb()[1]], 0).unwrap()).unwrap();
                first_half(ctx, ctx.concat(out, gate, 1).unwrap(), rows, n)
            }
        };
        let spread = 2.0 / (cols as f32).sqrt();
        // Weights F16 holds exactly, so F32 and F16 weights are the same matrix.
        let weights = through_f16(&values(cols * 2 * rows, (cols * 5 + rows) as u64).iter().map(|v| v * spread).collect::<Vec<_>>());
        (vec![(w, weights), (x, values(cols * n, 53))], out)
    })
}

/// Values as F16 holds them (so an F32 copy of the weights is the same matrix).
pub fn through_f16(v: &[f32]) -> Vec<f32> {
    let mut half = vec![0u16; v.len()];
    let mut back = vec![0f32; v.len()];
    unsafe {
        ggml_sys::sys::ggml_fp32_to_fp16_row(v.as_ptr(), half.as_mut_ptr().cast(), v.len() as i64);
        ggml_sys::sys::ggml_fp16_to_fp32_row(half.as_ptr().cast(), back.as_mut_ptr(), v.len() as i64);
    }
    back
}

/// A decode step's fused attention as the guided Multilingual T3 runs it: one
/// query row for each of `heads` heads and `sequences` sequences (the
/// conditional and unconditional rows), F16 K and V over `kv` cached positions,
/// and one F16 mask row broadcast over the sequences that hides every position
/// from `visible` on. Right after the mask, in the same buffer, the graph
/// allocates a "trap" row that hides every position: a kernel that steps
/// through the mask per sequence instead of broadcasting it reads the trap and
/// gives the second sequence no keys. With `f32_accumulation` the op asks
/// for F32 precision (ggml's default lets a device sum in F16). Returns
/// `(output, reference)`, the reference computed here in f64 from the same
/// F16-rounded values.
pub fn broadcast_mask_attention(
    handle: &BackendHandle,
    heads: usize,
    sequences: usize,
    kv: usize,
    visible: usize,
    f32_accumulation: bool,
) -> (Vec<f32>, Vec<f32>) {
    const D: usize = 64;
    let scale = 0.125f32;
    let q_vals = through_f16(&values(D * heads * sequences, 61));
    let k_vals = through_f16(&values(D * kv * heads * sequences, 62));
    let v_vals = through_f16(&values(D * kv * heads * sequences, 63));
    let mask_vals: Vec<f32> = (0..kv).map(|i| if i < visible { 0.0 } else { f32::NEG_INFINITY }).collect();
    let backend = handle.ggml_backend();
    let ctx = Context::new_no_alloc(16, 16).unwrap();
    let (d, h, s, n) = (D as i64, heads as i64, sequences as i64, kv as i64);
    let q = ctx.new_tensor(TYPE_F32, &[d, 1, h, s]).unwrap();
    let k = ctx.new_tensor(TYPE_F16, &[d, n, h, s]).unwrap();
    let v = ctx.new_tensor(TYPE_F16, &[d, n, h, s]).unwrap();
    let mask = ctx.new_tensor(TYPE_F16, &[n, 1, 1, 1]).unwrap();
    let trap = ctx.new_tensor(TYPE_F16, &[n, 1, 1, 1]).unwrap();
    let out = ctx.flash_attn_ext(q, k, v, Some(mask), scale).unwrap();
    if f32_accumulation {
        unsafe { ggml_sys::sys::ggml_flash_attn_ext_set_prec(out.as_ptr(), ggml_sys::sys::GGML_PREC_F32) };
    }
    let mut graph = ctx.new_graph(16).unwrap();
    graph.build_forward(out);
    let _buffer = backend.alloc_ctx_tensors(&ctx).unwrap();
    // The trap only tests anything where it follows the mask directly.
    let (mask_at, trap_at) = unsafe { ((*mask.as_ptr()).data as usize, (*trap.as_ptr()).data as usize) };
    assert_eq!(trap_at, mask_at + kv * 2, "the trap row must follow the mask in its buffer");
    for (t, data) in [(q, &q_vals), (k, &k_vals), (v, &v_vals), (mask, &mask_vals), (trap, &vec![f32::NEG_INFINITY; kv])] {
        t.set_f32(data).unwrap();
    }
    backend.compute(&graph).unwrap();
    // out is [D, heads, 1, sequences]; K/V row p of head hh in sequence ss.
    let mut want = vec![0f32; D * heads * sequences];
    for ss in 0..sequences {
        for hh in 0..heads {
            let qrow = &q_vals[(ss * heads + hh) * D..][..D];
            let at = |p: usize| ((ss * heads + hh) * kv + p) * D;
            let logits: Vec<f64> =
                (0..visible).map(|p| qrow.iter().zip(&k_vals[at(p)..at(p) + D]).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * scale as f64).collect();
            let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for i in 0..D {
                let acc: f64 = weights.iter().enumerate().map(|(p, w)| w * v_vals[at(p) + i] as f64).sum();
                want[(ss * heads + hh) * D + i] = (acc / total) as f32;
            }
        }
    }
    (out.get_f32().unwrap(), want)
}
