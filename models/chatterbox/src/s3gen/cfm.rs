//! CFM estimator: one velocity evaluation `v(x, mu, spks, cond, t, r)`.
//!
//! ConditionalDecoder with causal convolutions and a single U-Net level (no
//! resampling): resnet + transformer blocks + causal conv (down), `n_mid`
//! resnet + transformer stages, concat skip → resnet + transformer blocks +
//! causal conv (up), final causal block and a 1×1 projection. The time
//! embedding mixes t and r (meanflow). Layout `[channels, frames, rows]`:
//! one row, or the two rows of classifier-free guidance (conditional, then
//! unconditional) as one batch. Every row has every frame valid, so the masks
//! are all ones and are dropped.

use crate::hparams::{CfmHparams, S3GenHparams};
use engine_core::model_kit::Builder;
use ggml_sys::{GraphIo, Result, Tensor, TYPE_F32};

pub const X: &str = "x";
pub const MU: &str = "mu";
pub const SPKS: &str = "spks";
pub const COND: &str = "cond";
/// Sinusoidal embeddings of t and r (host-computed, see [`time_embedding`]).
pub const T_EMB: &str = "t_emb";
pub const R_EMB: &str = "r_emb";
pub const VELOCITY: &str = "velocity";

const P: &str = "cfm";

/// The estimator over `rows` rows of `frames` frames; t (and r) are shared by the rows.
pub fn build<'c>(b: &Builder<'c, '_>, hp: &S3GenHparams, frames: usize, rows: usize) -> Result<GraphIo<'c>> {
    let ctx = b.ctx;
    let c = &hp.cfm;
    let (mel, t, n) = (hp.mel_channels as i64, frames as i64, rows as i64);
    let mut io = GraphIo::default();
    let x = io.input(ctx, X, TYPE_F32, &[mel, t, n])?;
    let mu = io.input(ctx, MU, TYPE_F32, &[mel, t, n])?;
    let spks = io.input(ctx, SPKS, TYPE_F32, &[mel, 1, n])?;
    let cond = io.input(ctx, COND, TYPE_F32, &[mel, t, n])?;
    let t_emb = io.input(ctx, T_EMB, TYPE_F32, &[c.in_channels as i64, 1])?;

    let time_mlp =
        |e: Tensor<'c>| -> Result<Tensor<'c>> { b.linear(ctx.silu(b.linear(e, &format!("{P}.time_mlp.linear_1"))?)?, &format!("{P}.time_mlp.linear_2")) };
    let mut temb = time_mlp(t_emb)?;
    if hp.meanflow {
        let r_emb = io.input(ctx, R_EMB, TYPE_F32, &[c.in_channels as i64, 1])?;
        let both = ctx.concat(temb, time_mlp(r_emb)?, 0)?;
        temb = ctx.mul_mat(b.w(&format!("{P}.time_embed_mixer.weight"))?, both)?;
    }

    let h = ctx.concat(ctx.concat(ctx.concat(x, mu, 0)?, ctx.repeat_to(spks, [mel, t, n, 1])?, 0)?, cond, 0)?;
    let h = resnet(b, c, h, temb, &format!("{P}.down_blocks.0.0"))?;
    let h = transformers(b, c, h, &format!("{P}.down_blocks.0.1"))?;
    let skip = h;
    let mut h = causal_conv(b, c, h, &format!("{P}.down_blocks.0.2"))?;
    for m in 0..c.n_mid {
        h = resnet(b, c, h, temb, &format!("{P}.mid_blocks.{m}.0"))?;
        h = transformers(b, c, h, &format!("{P}.mid_blocks.{m}.1"))?;
    }
    let h = ctx.concat(h, skip, 0)?;
    let h = resnet(b, c, h, temb, &format!("{P}.up_blocks.0.0"))?;
    let h = transformers(b, c, h, &format!("{P}.up_blocks.0.1"))?;
    let h = causal_conv(b, c, h, &format!("{P}.up_blocks.0.2"))?;
    let h = causal_block(b, c, h, &format!("{P}.final_block"))?;
    let v = conv(b, h, &format!("{P}.final_proj"), 0)?;
    io.outputs.push((VELOCITY, v));
    Ok(io)
}

/// `steps + 1` time points from 0 to 1: `torch.linspace` in f32 (from both
/// ends, as its kernel), mapped through `1 − cos(π/2 · t)` when `cosine`.
pub fn schedule(steps: usize, cosine: bool) -> Vec<f32> {
    let n = steps + 1;
    let step = 1.0f32 / steps.max(1) as f32;
    (0..n)
        .map(|i| if i < n / 2 { step * i as f32 } else { 1.0 - step * (n - 1 - i) as f32 })
        .map(|t| if cosine { 1.0 - ((t * 0.5 * std::f32::consts::PI) as f64).cos() as f32 } else { t })
        .collect()
}

/// Classifier-free guidance of the decoder: `(1 + w)·cond − w·uncond`.
pub fn combine_guidance(cond: &[f32], uncond: &[f32], w: f32) -> Vec<f32> {
    let keep = 1.0 + w;
    cond.iter().zip(uncond).map(|(c, u)| keep * c - w * u).collect()
}

/// `[sin | cos]` of `scale · t · 10000^(-i/(half-1))`, in f32 as the reference forms it.
pub fn time_embedding(dim: usize, scale: f32, t: f32) -> Vec<f32> {
    let half = dim / 2;
    let step = (10000f64.ln() / (half as f64 - 1.0)) as f32;
    let args: Vec<f32> = (0..half).map(|i| (scale * t) * (i as f32 * -step).exp()).collect();
    args.iter().map(|a| (*a as f64).sin() as f32).chain(args.iter().map(|a| (*a as f64).cos() as f32)).collect()
}

fn mish<'c>(b: &Builder<'c, '_>, x: Tensor<'c>) -> Result<Tensor<'c>> {
    b.ctx.mul(x, b.ctx.tanh(b.ctx.softplus(x)?)?)
}

/// Convolution with `left` zero frames of padding on the left.
fn conv<'c>(b: &Builder<'c, '_>, x: Tensor<'c>, prefix: &str, left: usize) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let x = if left > 0 { ctx.pad_ext(x, [[0, 0], [left as i32, 0], [0, 0], [0, 0]])? } else { x };
    ctx.add(ctx.conv_1d(b.w(&format!("{prefix}.weight"))?, x, 1, 1)?, b.w(&format!("{prefix}.bias"))?)
}

fn causal_conv<'c>(b: &Builder<'c, '_>, c: &CfmHparams, x: Tensor<'c>, prefix: &str) -> Result<Tensor<'c>> {
    conv(b, x, prefix, c.conv_kernel - 1)
}

/// CausalBlock1D: causal conv → LayerNorm over channels → Mish.
fn causal_block<'c>(b: &Builder<'c, '_>, c: &CfmHparams, x: Tensor<'c>, prefix: &str) -> Result<Tensor<'c>> {
    let h = causal_conv(b, c, x, &format!("{prefix}.block.0"))?;
    let h = b.layer_norm(h, &format!("{prefix}.block.2"), c.layer_norm_eps)?;
    mish(b, h)
}

/// CausalResnetBlock1D: `block2(block1(x) + Linear(mish(temb))) + res_conv(x)`.
fn resnet<'c>(b: &Builder<'c, '_>, c: &CfmHparams, x: Tensor<'c>, temb: Tensor<'c>, prefix: &str) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let h = causal_block(b, c, x, &format!("{prefix}.block1"))?;
    let h = ctx.add(h, b.linear(mish(b, temb)?, &format!("{prefix}.mlp.1"))?)?;
    let h = causal_block(b, c, h, &format!("{prefix}.block2"))?;
    ctx.add(h, conv(b, x, &format!("{prefix}.res_conv"), 0)?)
}

fn transformers<'c>(b: &Builder<'c, '_>, c: &CfmHparams, mut x: Tensor<'c>, prefix: &str) -> Result<Tensor<'c>> {
    for i in 0..c.n_transformer {
        x = transformer_block(b, c, x, &format!("{prefix}.{i}"))?;
    }
    Ok(x)
}

/// diffusers BasicTransformerBlock (self-attention only):
/// `x += Attn(LN1(x))`, `x += W2 gelu(W1 LN3(x))` (exact GELU).
fn transformer_block<'c>(b: &Builder<'c, '_>, c: &CfmHparams, x: Tensor<'c>, prefix: &str) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let [_, t, n, _] = x.ne();
    let (hd, nh) = (c.head_dim as i64, c.n_head as i64);
    let h = b.layer_norm(x, &format!("{prefix}.norm1"), c.layer_norm_eps)?;
    let proj = |name: &str| -> Result<Tensor<'c>> { ctx.reshape(b.linear_no_bias(h, &format!("{prefix}.attn1.{name}.weight"))?, &[hd, nh, t, n]) };
    let (q, k, v) = (proj("to_q")?, proj("to_k")?, proj("to_v")?);
    let by_head = |y: Tensor<'c>| ctx.permute(y, [0, 2, 1, 3]); // [hd, t, nh, rows]
                                                                // Every frame of every row is valid: no mask. Fused or explicit as the
                                                                // policy and device allow; the fused CPU path accumulates in F32.
    let out = b.attention(by_head(q)?, by_head(k)?, by_head(v)?, None, 1.0 / (hd as f32).sqrt())?; // [hd·nh, t, rows]
    let x = ctx.add(x, b.linear(out, &format!("{prefix}.attn1.to_out.0"))?)?;
    let h = b.layer_norm(x, &format!("{prefix}.norm3"), c.layer_norm_eps)?;
    let h = b.linear(ctx.gelu_erf(b.linear(h, &format!("{prefix}.ff.net.0.proj"))?)?, &format!("{prefix}.ff.net.2"))?;
    ctx.add(x, h)
}
