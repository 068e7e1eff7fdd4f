//! Capability probes: `supports_op` questions asked of a device on synthetic nodes
//! with the shapes the models use. Nothing is allocated or computed, so probing is
//! cheap; backend plugins still cache the answers per device.

use crate::abi::ProbeResult;
use ggml_sys::{Context, Device, Tensor, Type};

/// Probe names, in the order `tts devices` prints them.
pub const NATIVE_LEAKY_RELU: &str = "native_leaky_relu";
pub const MUL_MAT_F16_WEIGHT: &str = "mul_mat_f16_weight";
pub const MUL_MAT_F16_ACTIVATION: &str = "mul_mat_f16_activation";
pub const FLASH_ATTN_F32_KV: &str = "flash_attn_f32_kv";
pub const FLASH_ATTN_F16_KV: &str = "flash_attn_f16_kv";
pub const FLASH_ATTN_BF16_KV: &str = "flash_attn_bf16_kv";
pub const FLASH_ATTN_Q8_0_KV: &str = "flash_attn_q8_0_kv";
pub const CONV_TRANSPOSE_1D: &str = "conv_transpose_1d";
pub const PINNED_HOST_BUFFER: &str = "pinned_host_buffer";

pub const ALL: [&str; 9] = [
    NATIVE_LEAKY_RELU,
    MUL_MAT_F16_WEIGHT,
    MUL_MAT_F16_ACTIVATION,
    FLASH_ATTN_F32_KV,
    FLASH_ATTN_F16_KV,
    FLASH_ATTN_BF16_KV,
    FLASH_ATTN_Q8_0_KV,
    CONV_TRANSPOSE_1D,
    PINNED_HOST_BUFFER,
];

/// Attention shapes the probes use: the head sizes the model families have
/// (32: Supertonic's duration predictor; 64: Chatterbox T3/S3Gen and Supertonic's
/// encoders; 128: Supertonic's style attention), 16 heads, a 50-query batch against
/// a 256-slot static KV cache. A flash-attention probe passes if some head size
/// runs: the kit asks the device about each fused node again (and T3 about its
/// own head size at load), so a head size the device lacks runs explicit
/// attention without turning fused attention off for the rest (ggml-cuda has no
/// kernel for 32).
const HEAD_DIMS: [i64; 3] = [32, 64, 128];
const HEADS: i64 = 16;
const N_Q: i64 = 50;
const N_KV: i64 = 256;

/// The ggml op each probe asks about (for deny-lists on ops).
pub fn probe_op(name: &str) -> Option<&'static str> {
    Some(match name {
        NATIVE_LEAKY_RELU => "LEAKY_RELU",
        MUL_MAT_F16_WEIGHT | MUL_MAT_F16_ACTIVATION => "MUL_MAT",
        FLASH_ATTN_F32_KV | FLASH_ATTN_F16_KV | FLASH_ATTN_BF16_KV | FLASH_ATTN_Q8_0_KV => "FLASH_ATTN_EXT",
        CONV_TRANSPOSE_1D => "CONV_TRANSPOSE_1D",
        _ => return None,
    })
}

/// Runs every probe on `device`.
pub fn run_all(device: Device) -> Vec<ProbeResult> {
    ALL.iter().map(|name| run_one(device, name)).collect()
}

fn result(name: &str, supported: bool, detail: String) -> ProbeResult {
    ProbeResult { name: name.into(), supported, detail: detail.into() }
}

/// Runs one probe by name. Unknown names answer "unsupported".
pub fn run_one(device: Device, name: &str) -> ProbeResult {
    let ask = |build: &dyn Fn(&Context) -> ggml_sys::Result<(Tensor<'_>, String)>| -> ProbeResult {
        let outcome = Context::new_no_alloc(16, 16).and_then(|ctx| {
            let (node, detail) = build(&ctx)?;
            Ok((device.supports_op(node), detail))
        });
        match outcome {
            Ok((ok, detail)) => result(name, ok, detail),
            Err(e) => result(name, false, format!("probe could not be built: {e}")),
        }
    };
    match name {
        NATIVE_LEAKY_RELU => ask(&|ctx| {
            let x = ctx.new_tensor(ggml_sys::TYPE_F32, &[512, 64])?;
            Ok((ctx.leaky_relu(x, 0.1)?, "LEAKY_RELU f32 [512,64]".into()))
        }),
        MUL_MAT_F16_WEIGHT => ask(&|ctx| mul_mat(ctx, ggml_sys::TYPE_F16, ggml_sys::TYPE_F32)),
        MUL_MAT_F16_ACTIVATION => ask(&|ctx| mul_mat(ctx, ggml_sys::TYPE_F32, ggml_sys::TYPE_F16)),
        FLASH_ATTN_F32_KV => flash_attn(device, name, ggml_sys::TYPE_F32),
        FLASH_ATTN_F16_KV => flash_attn(device, name, ggml_sys::TYPE_F16),
        FLASH_ATTN_BF16_KV => flash_attn(device, name, ggml_sys::TYPE_BF16),
        FLASH_ATTN_Q8_0_KV => flash_attn(device, name, ggml_sys::TYPE_Q8_0),
        CONV_TRANSPOSE_1D => ask(&|ctx| {
            // HiFT upsampling layer: kernel 16, stride 8, 512 -> 256 channels.
            let kernel = ctx.new_tensor(ggml_sys::TYPE_F32, &[16, 256, 512])?;
            let input = ctx.new_tensor(ggml_sys::TYPE_F32, &[100, 512])?;
            Ok((ctx.conv_transpose_1d(kernel, input, 8, 0, 1)?, "CONV_TRANSPOSE_1D k16 s8 512->256ch, 100 frames".into()))
        }),
        PINNED_HOST_BUFFER => result(name, device.host_buffer_type().is_some(), "device offers a pinned host buffer type".into()),
        other => result(other, false, "unknown probe".into()),
    }
}

fn mul_mat(ctx: &Context, a_ty: Type, b_ty: Type) -> ggml_sys::Result<(Tensor<'_>, String)> {
    let a = ctx.new_tensor(a_ty, &[256, 256])?;
    let b = ctx.new_tensor(b_ty, &[256, 32])?;
    let detail = format!("MUL_MAT src0 {} [256,256] x src1 {} [256,32]", ggml_sys::type_name(a_ty), ggml_sys::type_name(b_ty));
    Ok((ctx.mul_mat(a, b)?, detail))
}

fn flash_attn_node(ctx: &Context, kv_ty: Type, head_dim: i64) -> ggml_sys::Result<Tensor<'_>> {
    let q = ctx.new_tensor(ggml_sys::TYPE_F32, &[head_dim, N_Q, HEADS])?;
    let k = ctx.new_tensor(kv_ty, &[head_dim, N_KV, HEADS])?;
    let v = ctx.new_tensor(kv_ty, &[head_dim, N_KV, HEADS])?;
    let mask = ctx.new_tensor(ggml_sys::TYPE_F16, &[N_KV, N_Q])?;
    ctx.flash_attn_ext(q, k, v, Some(mask), 1.0 / (head_dim as f32).sqrt())
}

/// Whether `device` runs masked fused attention with `kv_ty` K/V at `head_dim`.
pub fn flash_attn_runs(device: Device, kv_ty: Type, head_dim: i64) -> bool {
    Context::new_no_alloc(8, 8).and_then(|ctx| flash_attn_node(&ctx, kv_ty, head_dim).map(|node| device.supports_op(node))).unwrap_or(false)
}

fn flash_attn(device: Device, name: &str, kv_ty: Type) -> ProbeResult {
    let (runs, lacks): (Vec<i64>, Vec<i64>) = HEAD_DIMS.iter().partition(|&&d| flash_attn_runs(device, kv_ty, d));
    let list = |dims: &[i64]| dims.iter().map(i64::to_string).collect::<Vec<_>>().join("/");
    let mut detail = format!(
        "FLASH_ATTN_EXT q f32, k/v {}, head sizes {} x {HEADS} heads, {N_Q} queries over {N_KV} kv, f16 mask",
        ggml_sys::type_name(kv_ty),
        list(&HEAD_DIMS)
    );
    if !runs.is_empty() && !lacks.is_empty() {
        detail.push_str(&format!(" (head size {} runs explicit attention)", list(&lacks)));
    }
    result(name, !runs.is_empty(), detail)
}
