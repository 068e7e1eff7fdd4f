//! Text encoder (`text_encoder.onnx`): `text_emb` `[C, T]`.
//!
//! char embedding → ConvNeXt stack → relative attention encoder (+ outer
//! residual) → speech-prompted text encoder: two style cross-attentions whose
//! residuals both add to the encoder output (`h1 = h + A1(h)`,
//! `h2 = h + A2(h1)`), then LayerNorm.

use super::Builder;
use crate::hparams::TextEncoderHp;
use ggml_sys::{GraphIo, Result, TYPE_F32, TYPE_I32};

/// Inputs: `text_ids` I32 `[T]`, `style_ttl` F32 `[style_dim, tokens]`.
/// Output: `text_emb` `[C, T]`.
pub fn build<'c>(b: &Builder<'c, '_>, hp: &TextEncoderHp, style_dim: usize, style_tokens: usize, text_len: usize) -> Result<GraphIo<'c>> {
    let ctx = b.ctx;
    let ids = ctx.new_tensor(TYPE_I32, &[text_len as i64])?;
    let style = ctx.new_tensor(TYPE_F32, &[style_dim as i64, style_tokens as i64])?;
    let emb = ctx.get_rows(b.w("te.char_emb")?, ids)?;
    let conv = b.convnext_stack(emb, "te.convnext", &hp.convnext, false)?;
    let h = ctx.add(conv, b.attention_encoder(conv, "te.attn", &hp.attn)?)?;
    let h1 = ctx.add(h, b.cross_attention(h, b.w("te.spte.1.keys")?, style, "te.spte.1", &hp.spte)?)?;
    let h2 = ctx.add(h, b.cross_attention(h1, b.w("te.spte.2.keys")?, style, "te.spte.2", &hp.spte)?)?;
    let out = b.layer_norm(h2, "te.spte.ln")?;
    Ok(GraphIo { inputs: vec![("text_ids", ids), ("style_ttl", style)], outputs: vec![("text_emb", out)] })
}
