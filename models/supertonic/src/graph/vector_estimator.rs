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

/// Everything the steps share: per main block, the text attention's keys (with
/// RoPE) and values, the style attention's keys and values, and (v3) the
/// unconditional half's text-attention output. Computed once per chunk.
///
/// Inputs: `text_emb` `[Ct, T]`, `style_ttl` `[style_dim, tokens]`, the key
/// RoPE tables `rope_cos_k`/`rope_sin_k` `[head_dim, T]`. Outputs per block g:
/// `text_k.g`, `text_v.g` `[head_dim, T, heads]`, `style_k.g`, `style_v.g`
/// `[head_dim, tokens, heads, B]`, and with guidance `text_null.g` `[C, 1]`.
pub fn build_conditioning<'c>(b: &Builder<'c, '_>, hp: &VectorEstimatorHp, dims: &Dims, text_len: usize) -> Result<GraphIo<'c>> {
    let ctx = b.ctx;
    let t = text_len as i64;
    let head_dim = (hp.text_attn.units / hp.text_attn.heads) as i64;
    let text = ctx.new_tensor(TYPE_F32, &[dims.text_dim as i64, t])?;
    let style = ctx.new_tensor(TYPE_F32, &[dims.style_dim as i64, dims.style_tokens as i64])?;
    let cos_k = ctx.new_tensor(TYPE_F32, &[head_dim, t])?;
    let sin_k = ctx.new_tensor(TYPE_F32, &[head_dim, t])?;
    let mut io = GraphIo::new().input("text_emb", text).input("style_ttl", style).input("rope_cos_k", cos_k).input("rope_sin_k", sin_k);

    // Guidance (v3) adds the unconditional half: learned style values, and a
    // text that is one learned token at every position. Its values are then
    // equal at every position, so that half's text attention returns
    // `out(v(token))` whatever the scores: one vector per block.
    let cfg = hp.cfg.is_some();
    let style_in = if cfg { ctx.concat(style, b.w("ve.uncond.style_values")?, 2)? } else { style };
    for g in 0..hp.blocks {
        let p = format!("ve.block.{g}");
        let a = &hp.text_attn;
        let k = rope(b, b.split_heads(b.linear(text, &format!("{p}.text_attn.k"))?, a.heads)?, cos_k, sin_k)?;
        let v = b.split_heads(b.linear(text, &format!("{p}.text_attn.v"))?, a.heads)?;
        io = io.output(format!("text_k.{g}"), k).output(format!("text_v.{g}"), v);
        if cfg {
            let token = ctx.reshape(b.w("ve.uncond.text_token")?, &[dims.text_dim as i64, 1])?;
            let null = b.linear(b.linear(token, &format!("{p}.text_attn.v"))?, &format!("{p}.text_attn.o"))?;
            io = io.output(format!("text_null.{g}"), null);
        }
        let keys = b.w(&format!("{p}.style_attn.keys"))?;
        let keys = if cfg { ctx.concat(keys, b.w(&format!("{p}.style_attn.keys_uncond"))?, 2)? } else { keys };
        let s = &hp.style_attn;
        let sk = b.split_heads(keys, s.heads)?;
        let sv = b.split_heads(b.linear(style_in, &format!("{p}.style_attn.v"))?, s.heads)?;
        io = io.output(format!("style_k.{g}"), sk).output(format!("style_v.{g}"), sv);
    }
    Ok(io)
}

/// One Euler step. Inputs: `noisy_latent` `[latent_channels, L]`,
/// `time_features` `[time_dim]` (the sinusoidal encoding of t, computed on the
/// host), the query RoPE tables `rope_cos_q`/`rope_sin_q` `[head_dim, L]`; the
/// shared tensors come from the chunk's [`build_conditioning`] graph, whose
/// outputs `cond` looks up by name (they must outlive this graph).
/// Output: `denoised_latent` `[latent_channels, L]`.
pub fn build<'c>(b: &Builder<'c, '_>, hp: &VectorEstimatorHp, dims: &Dims, shape: StepShape, cond: &dyn Fn(&str) -> Result<Tensor<'c>>) -> Result<GraphIo<'c>> {
    let ctx = b.ctx;
    let l = shape.latent_len as i64;
    let head_dim = (hp.text_attn.units / hp.text_attn.heads) as i64;
    let x = ctx.new_tensor(TYPE_F32, &[dims.latent_channels as i64, l])?;
    let time_in = ctx.new_tensor(TYPE_F32, &[hp.time_dim as i64, 1])?;
    let cos_q = ctx.new_tensor(TYPE_F32, &[head_dim, l])?;
    let sin_q = ctx.new_tensor(TYPE_F32, &[head_dim, l])?;

    // Time embedding: Linear → Mish → Linear.
    let te = b.linear(time_in, "ve.time.mlp0")?;
    let te = ctx.mul(te, ctx.tanh(ctx.softplus(te)?)?)?;
    let te = b.linear(te, "ve.time.mlp2")?;

    // With guidance both halves see the same latent and time: everything before
    // the first text attention is computed once and then duplicated.
    let cfg = hp.cfg.is_some();
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
        let (o, _) = b.attention(q, cond(&format!("text_k.{g}"))?, cond(&format!("text_v.{g}"))?, a.scale)?;
        let mut o = b.linear(b.merge_heads(o)?, &format!("{p}.text_attn.o"))?;
        if cfg {
            let null = ctx.repeat_to(cond(&format!("text_null.{g}"))?, [hp.hidden as i64, l, 1, 1])?;
            o = ctx.concat(ctx.reshape(o, &[hp.hidden as i64, l, 1])?, null, 2)?;
        }
        h = b.layer_norm(ctx.add(h, o)?, &format!("{p}.text_attn.ln"))?;

        h = b.convnext_stack(h, &format!("{p}.convnext2"), &hp.convnext2, false)?;

        let s = &hp.style_attn;
        let q = b.split_heads(b.linear(h, &format!("{p}.style_attn.q"))?, s.heads)?;
        let (o, _) = b.attention(q, cond(&format!("style_k.{g}"))?, cond(&format!("style_v.{g}"))?, s.scale)?;
        let o = b.linear(b.merge_heads(o)?, &format!("{p}.style_attn.o"))?;
        h = b.layer_norm(ctx.add(h, o)?, &format!("{p}.style_attn.ln"))?;
    }
    h = b.convnext_stack(h, "ve.last_convnext", &hp.last_convnext, false)?;
    let mut v = b.linear_no_bias(h, "ve.proj_out.weight")?;
    if let Some((cond_scale, uncond_scale)) = hp.cfg {
        let nb = v.nb();
        let ne = [dims.latent_channels as i64, l];
        let vc = ctx.view(v, &ne, &[nb[1]], 0)?;
        let vu = ctx.view(v, &ne, &[nb[1]], nb[2])?;
        v = ctx.sub(ctx.scale(vc, cond_scale)?, ctx.scale(vu, uncond_scale)?)?;
    }
    let next = ctx.add(x, ctx.scale(v, 1.0 / shape.total_steps as f32)?)?;
    Ok(GraphIo::new()
        .input("noisy_latent", x)
        .input("time_features", time_in)
        .input("rope_cos_q", cos_q)
        .input("rope_sin_q", sin_q)
        .output("denoised_latent", next))
}

/// Half-split rotary embedding with host tables `[D, T]` (both halves hold the
/// same angles): `x·cos + rotate_half(x)·sin` on `[D, T, H, B]`.
fn rope<'c>(b: &Builder<'c, '_>, x: Tensor<'c>, cos: Tensor<'c>, sin: Tensor<'c>) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let [d, t, h, n] = x.ne();
    let nb = x.nb();
    let half = d / 2;
    let first = ctx.cont(ctx.view(x, &[half, t, h, n], &[nb[1], nb[2], nb[3]], 0)?)?;
    let second = ctx.cont(ctx.view(x, &[half, t, h, n], &[nb[1], nb[2], nb[3]], half as usize * 4)?)?;
    let rotated = ctx.concat(ctx.neg(second)?, first, 0)?;
    ctx.add(ctx.mul(x, cos)?, ctx.mul(rotated, sin)?)
}

/// Host tables for length-aware RoPE: angle(p, k) = (p / len) · θ_k.
pub fn rope_tables(theta: &[f32], len: usize) -> (Vec<f32>, Vec<f32>) {
    let half = theta.len();
    let mut cos = vec![0f32; 2 * half * len];
    let mut sin = vec![0f32; 2 * half * len];
    for p in 0..len {
        for (k, &th) in theta.iter().enumerate() {
            let angle = (p as f64 / len as f64) * th as f64;
            for off in [0, half] {
                cos[p * 2 * half + k + off] = angle.cos() as f32;
                sin[p * 2 * half + k + off] = angle.sin() as f32;
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
