//! Flow front end: speech tokens → `mu` (the CFM's conditioning mel).
//!
//! CosyVoice's UpsampleConformerEncoder: embedding → linear + LayerNorm, ×√d
//! → pre-lookahead convs (residual) → conformer layers with ESPnet relative
//! position self-attention → nearest ×stride upsampling + causal conv →
//! a second linear embedding → more conformer layers → LayerNorm → linear to
//! the mel channels. Layout `[channels, frames]`; batch 1, every frame valid,
//! so no masks.

use crate::hparams::{EncoderHparams, S3GenHparams};
use engine_core::model_kit::Builder;
use ggml_sys::{GraphIo, Result, Tensor, TYPE_F32, TYPE_I32};

pub const TOKENS: &str = "tokens";
pub const POS_EMB: &str = "pos_emb";
pub const UP_POS_EMB: &str = "up_pos_emb";
pub const ENCODER_OUT: &str = "encoder_out";
pub const MU: &str = "mu";

const P: &str = "enc";
/// Row count multiple the CPU's blocked GEMM needs (see `rel_pos_attention`).
const ROW_ALIGN: i64 = 4;

/// Inputs: `tokens` I32 `[n]`, `pos_emb` `[d, 2n-1]`, `up_pos_emb` `[d, 2·stride·n-1]`
/// (see [`relative_positions`]). Outputs: `encoder_out` `[d, stride·n]`, `mu` `[mel, stride·n]`.
pub fn build<'c>(b: &Builder<'c, '_>, hp: &S3GenHparams, n_tokens: usize) -> Result<GraphIo<'c>> {
    let ctx = b.ctx;
    let e = &hp.encoder;
    let (d, n) = (e.n_embd as i64, n_tokens as i64);
    let n_up = n * e.up_stride as i64;
    let tokens = ctx.new_tensor(TYPE_I32, &[n])?.set_name(TOKENS);
    let pos_emb = ctx.new_tensor(TYPE_F32, &[d, 2 * n - 1])?.set_name(POS_EMB);
    let up_pos_emb = ctx.new_tensor(TYPE_F32, &[d, 2 * n_up - 1])?.set_name(UP_POS_EMB);

    let x = ctx.get_rows(b.w("flow.input_embedding.weight")?, tokens)?;
    let x = embed(b, e, x, &format!("{P}.embed"))?;
    let mut x = pre_lookahead(b, e, x)?;
    for l in 0..e.n_layer {
        x = conformer_layer(b, e, x, pos_emb, &format!("{P}.encoders.{l}"))?;
    }
    // Nearest-neighbour ×stride, then a causal conv of kernel 2·stride+1.
    let stride = e.up_stride as i64;
    let x = ctx.reshape(ctx.repeat_to(ctx.reshape(x, &[d, 1, n])?, [d, stride, n, 1])?, &[d, n_up])?;
    let x = ctx.pad_ext(x, [[0, 0], [2 * stride as i32, 0], [0, 0], [0, 0]])?;
    let x = ctx.add(ctx.conv_1d(b.w(&format!("{P}.up_layer.conv.weight"))?, x, 1, 1)?, b.w(&format!("{P}.up_layer.conv.bias"))?)?;
    let mut x = embed(b, e, x, &format!("{P}.up_embed"))?;
    for l in 0..e.n_up_layer {
        x = conformer_layer(b, e, x, up_pos_emb, &format!("{P}.up_encoders.{l}"))?;
    }
    let out = b.layer_norm(x, &format!("{P}.after_norm"), e.after_norm_eps)?;
    let mu = b.linear(out, "flow.encoder_proj")?;
    Ok(GraphIo { inputs: vec![(TOKENS, tokens), (POS_EMB, pos_emb), (UP_POS_EMB, up_pos_emb)], outputs: vec![(ENCODER_OUT, out), (MU, mu)] })
}

/// LinearNoSubsampling + the positional module's input scaling: `√d · LN(W x + b)`.
fn embed<'c>(b: &Builder<'c, '_>, e: &EncoderHparams, x: Tensor<'c>, prefix: &str) -> Result<Tensor<'c>> {
    let x = b.linear(x, &format!("{prefix}.out.0"))?;
    let x = b.layer_norm(x, &format!("{prefix}.out.1"), e.embed_norm_eps)?;
    b.ctx.scale(x, (e.n_embd as f32).sqrt())
}

/// `x + conv2(pad_left(leaky_relu(conv1(pad_right(x)))))`: conv1 looks
/// `pre_lookahead` frames ahead, conv2 is causal.
fn pre_lookahead<'c>(b: &Builder<'c, '_>, e: &EncoderHparams, x: Tensor<'c>) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let p = format!("{P}.pre_lookahead_layer");
    let h = ctx.pad_ext(x, [[0, 0], [0, e.pre_lookahead as i32], [0, 0], [0, 0]])?;
    let h = ctx.add(ctx.conv_1d(b.w(&format!("{p}.conv1.weight"))?, h, 1, 1)?, b.w(&format!("{p}.conv1.bias"))?)?;
    let h = b.leaky_relu(h, e.leaky_relu_slope)?;
    let h = ctx.pad_ext(h, [[0, 0], [e.lookahead_conv2_kernel as i32 - 1, 0], [0, 0], [0, 0]])?;
    let h = ctx.add(ctx.conv_1d(b.w(&format!("{p}.conv2.weight"))?, h, 1, 1)?, b.w(&format!("{p}.conv2.bias"))?)?;
    ctx.add(x, h)
}

/// Pre-norm conformer layer without macaron or convolution module:
/// `x += MHA(LN(x))`, `x += W2 silu(W1 LN(x))`.
fn conformer_layer<'c>(b: &Builder<'c, '_>, e: &EncoderHparams, x: Tensor<'c>, pos_emb: Tensor<'c>, prefix: &str) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let h = b.layer_norm(x, &format!("{prefix}.norm_mha"), e.layer_norm_eps)?;
    let x = ctx.add(x, rel_pos_attention(b, e, h, pos_emb, &format!("{prefix}.self_attn"))?)?;
    let h = b.layer_norm(x, &format!("{prefix}.norm_ff"), e.layer_norm_eps)?;
    let h = b.linear(ctx.silu(b.linear(h, &format!("{prefix}.feed_forward.w_1"))?)?, &format!("{prefix}.feed_forward.w_2"))?;
    ctx.add(x, h)
}

/// ESPnet relative-position self-attention (Transformer-XL style):
/// `softmax(((q+u)·kᵀ + shift((q+v)·pᵀ)) / √d_k) · v`, where `p` projects the
/// relative position table (row m ↔ offset T−1−m) and the shift picks offset
/// i−j for query i and key j.
fn rel_pos_attention<'c>(b: &Builder<'c, '_>, e: &EncoderHparams, x: Tensor<'c>, pos_emb: Tensor<'c>, prefix: &str) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let (d, h) = (e.n_embd as i64, e.n_head as i64);
    let dk = d / h;
    let t = x.ne()[1];
    let heads = |y: Tensor<'c>, len: i64| -> Result<Tensor<'c>> { ctx.reshape(y, &[dk, h, len]) };
    let by_head = |y: Tensor<'c>| ctx.permute(y, [0, 2, 1, 3]); // [dk, h, len] → [dk, len, h]
    let q = heads(b.linear(x, &format!("{prefix}.linear_q"))?, t)?;
    let k = heads(b.linear(x, &format!("{prefix}.linear_k"))?, t)?;
    let v = heads(b.linear(x, &format!("{prefix}.linear_v"))?, t)?;
    let p = heads(ctx.mul_mat(b.w(&format!("{prefix}.linear_pos.weight"))?, pos_emb)?, 2 * t - 1)?;
    let q_u = ctx.add(q, b.w(&format!("{prefix}.pos_bias_u"))?)?;
    let q_v = ctx.add(q, b.w(&format!("{prefix}.pos_bias_v"))?)?;
    // The CPU's blocked F32 GEMM (tinyBLAS) takes a product only with a
    // contiguous right operand and output rows in fours: keys and relative
    // positions are padded with zero rows, and the scores read back cropped.
    let rows4 = |n: i64| n + (ROW_ALIGN - n % ROW_ALIGN) % ROW_ALIGN;
    let (tk, tp) = (rows4(t), rows4(2 * t - 1));
    let pad_rows = |y: Tensor<'c>, to: i64| ctx.pad_ext(y, [[0, 0], [0, (to - y.ne()[1]) as i32], [0, 0], [0, 0]]);
    let ac = ctx.mul_mat(pad_rows(by_head(k)?, tk)?, ctx.cont(by_head(q_u)?)?)?; // [tk, t, h]
    let bd = ctx.mul_mat(pad_rows(by_head(p)?, tp)?, ctx.cont(by_head(q_v)?)?)?; // [tp, t, h]
    let f = std::mem::size_of::<f32>();
    let ac = ctx.view(ac, &[t, t, h], &[tk as usize * f, (tk * t) as usize * f], 0)?;
    let row = tp as usize * f;
    let bd = ctx.view(bd, &[t, t, h], &[row - f, row * t as usize], (t as usize - 1) * f)?;
    let attn = ctx.soft_max_ext(ctx.add(ac, bd)?, None, 1.0 / (dk as f32).sqrt())?;
    let v_t = ctx.cont(ctx.permute(v, [1, 2, 0, 3])?)?; // [t, dk, h]
    let out = ctx.mul_mat(v_t, attn)?; // [dk, t, h]
    let out = ctx.reshape(ctx.cont(ctx.permute(out, [0, 2, 1, 3])?)?, &[d, t])?;
    b.linear(out, &format!("{prefix}.linear_out"))
}

/// The relative position table of EspnetRelPositionalEncoding for `t` frames:
/// `[d, 2t-1]`, row m holding offset `t-1-m` as interleaved `sin, cos` of
/// `offset · 10000^(-2i/d)` (products in f32 as the reference forms them).
pub fn relative_positions(d: usize, t: usize) -> Vec<f32> {
    let step = -(10000f64.ln() / d as f64) as f32;
    let div: Vec<f32> = (0..d / 2).map(|i| ((2 * i) as f32 * step).exp()).collect();
    let mut out = Vec::with_capacity(d * (2 * t - 1));
    for m in 0..2 * t - 1 {
        let offset = t as f32 - 1.0 - m as f32;
        for &dv in &div {
            let a = (offset.abs() * dv).copysign(offset) as f64;
            out.push(a.sin() as f32);
            out.push(a.cos() as f32);
        }
    }
    out
}
