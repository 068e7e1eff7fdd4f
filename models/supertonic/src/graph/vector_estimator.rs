//! Vector estimator (`vector_estimator.onnx`): one Euler step of the flow,
//! `x_next = x + v / N` (v3: `v = cond·v_c − uncond·v_u`, classifier-free
//! guidance with learned null text and style tokens, as a batch of two).
//!
//! Per main block g: ConvNeXt ×n (dilated) → + time embedding → ConvNeXt →
//! text cross-attention with length-aware RoPE → ConvNeXt → style
//! cross-attention (tanh keys); each attention is post-norm with a residual.

use super::Builder;
use crate::hparams::VectorEstimatorHp;
use ggml_sys::{GraphIo, Result, Tensor, TYPE_F32};

/// Shapes one cached step graph is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepShape {
    pub latent_len: usize,
    pub text_len: usize,
    pub total_steps: usize,
}

pub struct Dims {
    pub latent_channels: usize,
    pub text_dim: usize,
    pub style_dim: usize,
    pub style_tokens: usize,
}

/// Inputs: `noisy_latent` `[latent_channels, L]`, `time_features` `[time_dim]`
/// (the sinusoidal encoding of t, computed on the host), `text_emb` `[Ct, T]`,
/// `style_ttl` `[style_dim, tokens]`, and the RoPE tables `rope_cos_q`/`rope_sin_q`
/// `[head_dim, L]`, `rope_cos_k`/`rope_sin_k` `[head_dim, T]` (see [`rope_tables`]).
/// Output: `denoised_latent` `[latent_channels, L]`.
pub fn build<'c>(b: &Builder<'c, '_>, hp: &VectorEstimatorHp, dims: &Dims, shape: StepShape) -> Result<GraphIo<'c>> {
    let ctx = b.ctx;
    let (l, t) = (shape.latent_len as i64, shape.text_len as i64);
    let head_dim = (hp.text_attn.units / hp.text_attn.heads) as i64;
    let x = ctx.new_tensor(TYPE_F32, &[dims.latent_channels as i64, l])?;
    let time_in = ctx.new_tensor(TYPE_F32, &[hp.time_dim as i64, 1])?;
    let text = ctx.new_tensor(TYPE_F32, &[dims.text_dim as i64, t])?;
    let style = ctx.new_tensor(TYPE_F32, &[dims.style_dim as i64, dims.style_tokens as i64])?;
    let cos_q = ctx.new_tensor(TYPE_F32, &[head_dim, l])?;
    let sin_q = ctx.new_tensor(TYPE_F32, &[head_dim, l])?;
    let cos_k = ctx.new_tensor(TYPE_F32, &[head_dim, t])?;
    let sin_k = ctx.new_tensor(TYPE_F32, &[head_dim, t])?;

    // Time embedding: Linear → Mish → Linear.
    let te = b.linear(time_in, "ve.time.mlp0")?;
    let te = ctx.mul(te, ctx.tanh(ctx.softplus(te)?)?)?;
    let te = b.linear(te, "ve.time.mlp2")?;

    // Guidance runs a batch of two, [cond, uncond]. Both halves see the same
    // latent and time, so everything before the first text attention is
    // computed once and then duplicated.
    //
    // The unconditional text is one learned token at every position, so its
    // values are the same at every position and the text attention of that
    // half returns `out(v(token))` whatever the scores: it is computed as that
    // one vector instead of a full attention.
    let cfg = hp.cfg.is_some();
    let null_text = if cfg { Some(ctx.reshape(b.w("ve.uncond.text_token")?, &[dims.text_dim as i64, 1])?) } else { None };
    let style_in = if cfg { ctx.concat(style, b.w("ve.uncond.style_values")?, 2)? } else { style };

    let mut h = b.linear_no_bias(x, "ve.proj_in.weight")?;
    for g in 0..hp.blocks {
        let p = format!("ve.block.{g}");
        h = b.convnext_stack(h, &format!("{p}.convnext0"), &hp.convnext0, false)?;
        h = ctx.add(h, b.linear(te, &format!("{p}.time"))?)?;
        h = b.convnext_stack(h, &format!("{p}.convnext1"), &hp.convnext1, false)?;
        if cfg && g == 0 {
            h = ctx.concat(h, h, 2)?;
        }

        let a = &hp.text_attn;
        let h_cond = if cfg { ctx.view(h, &[hp.hidden as i64, l, 1], &[h.nb()[1], h.nb()[2]], 0)? } else { h };
        let q = rope(b, b.split_heads(b.linear(h_cond, &format!("{p}.text_attn.q"))?, a.heads)?, cos_q, sin_q)?;
        let k = rope(b, b.split_heads(b.linear(text, &format!("{p}.text_attn.k"))?, a.heads)?, cos_k, sin_k)?;
        let v = b.split_heads(b.linear(text, &format!("{p}.text_attn.v"))?, a.heads)?;
        let o = b.attention(q, k, v, None, a.scale)?;
        let mut o = b.linear(o, &format!("{p}.text_attn.o"))?;
        if let Some(token) = null_text {
            let o_null = b.linear(b.linear(token, &format!("{p}.text_attn.v"))?, &format!("{p}.text_attn.o"))?;
            let o_null = ctx.repeat_to(o_null, [hp.hidden as i64, l, 1, 1])?;
            o = ctx.concat(ctx.reshape(o, &[hp.hidden as i64, l, 1])?, o_null, 2)?;
        }
        h = b.layer_norm(ctx.add(h, o)?, &format!("{p}.text_attn.ln"))?;

        h = b.convnext_stack(h, &format!("{p}.convnext2"), &hp.convnext2, false)?;

        let keys = b.w(&format!("{p}.style_attn.keys"))?;
        let keys = if cfg { ctx.concat(keys, b.w(&format!("{p}.style_attn.keys_uncond"))?, 2)? } else { keys };
        let o = b.cross_attention(h, keys, style_in, &format!("{p}.style_attn"), &hp.style_attn)?;
        h = b.layer_norm(ctx.add(h, o)?, &format!("{p}.style_attn.ln"))?;
    }
    h = b.convnext_stack(h, "ve.last_convnext", &hp.last_convnext, false)?;
    let mut v = b.linear_no_bias(h, "ve.proj_out.weight")?;
    if let Some((cond, uncond)) = hp.cfg {
        let nb = v.nb();
        let ne = [dims.latent_channels as i64, l];
        let vc = ctx.view(v, &ne, &[nb[1]], 0)?;
        let vu = ctx.view(v, &ne, &[nb[1]], nb[2])?;
        v = ctx.sub(ctx.scale(vc, cond)?, ctx.scale(vu, uncond)?)?;
    }
    let next = ctx.add(x, ctx.scale(v, 1.0 / shape.total_steps as f32)?)?;
    Ok(GraphIo {
        inputs: vec![
            ("noisy_latent", x),
            ("time_features", time_in),
            ("text_emb", text),
            ("style_ttl", style),
            ("rope_cos_q", cos_q),
            ("rope_sin_q", sin_q),
            ("rope_cos_k", cos_k),
            ("rope_sin_k", sin_k),
        ],
        outputs: vec![("denoised_latent", next)],
    })
}

/// Half-split rotary embedding with host tables `[D, T]` (both halves hold the
/// same angles, the sine's first half negated): `x·cos + rotate_half(x)·sin`
/// on `[D, T, H, B]`, where `rotate_half(x) = [−x₂, x₁]` is the halves
/// swapped (one concatenation of two views) times the signed sine.
fn rope<'c>(b: &Builder<'c, '_>, x: Tensor<'c>, cos: Tensor<'c>, signed_sin: Tensor<'c>) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let [d, t, h, n] = x.ne();
    let nb = x.nb();
    let half = d / 2;
    let first = ctx.view(x, &[half, t, h, n], &[nb[1], nb[2], nb[3]], 0)?;
    let second = ctx.view(x, &[half, t, h, n], &[nb[1], nb[2], nb[3]], half as usize * 4)?;
    let swapped = ctx.concat(second, first, 0)?;
    ctx.add(ctx.mul(x, cos)?, ctx.mul(swapped, signed_sin)?)
}

/// Host tables for length-aware RoPE: angle(p, k) = (p / len) · θ_k; the
/// sine table's first half is negated (see [`rope`]).
pub fn rope_tables(theta: &[f32], len: usize) -> (Vec<f32>, Vec<f32>) {
    let half = theta.len();
    let mut cos = vec![0f32; 2 * half * len];
    let mut sin = vec![0f32; 2 * half * len];
    for p in 0..len {
        for (k, &th) in theta.iter().enumerate() {
            let angle = (p as f64 / len as f64) * th as f64;
            for (off, sign) in [(0, -1.0), (half, 1.0)] {
                cos[p * 2 * half + k + off] = angle.cos() as f32;
                sin[p * 2 * half + k + off] = sign * angle.sin() as f32;
            }
        }
    }
    (cos, sin)
}

/// The sinusoidal encoding of t = step / total: `[sin(s·t·f_i)…, cos(s·t·f_i)…]`.
pub fn time_features(freqs: &[f32], time_scale: f32, step: usize, total: usize) -> Vec<f32> {
    let t = step as f32 / total as f32;
    let args: Vec<f32> = freqs.iter().map(|f| time_scale * t * f).collect();
    args.iter().map(|a| a.sin()).chain(args.iter().map(|a| a.cos())).collect()
}
