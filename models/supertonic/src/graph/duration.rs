//! Duration predictor (`duration_predictor.onnx`): utterance length in seconds.
//!
//! char embedding → prepend the learned sentence token → ConvNeXt stack →
//! relative attention encoder (+ outer residual) → the sentence token's vector
//! through `proj_out` → concat with the flattened `style_dp` → Linear → PReLU →
//! Linear → exp.

use super::Builder;
use crate::hparams::DurationHp;
use ggml_sys::{GraphIo, Result, TYPE_F32, TYPE_I32};

/// Inputs: `text_ids` I32 `[T]`, `style_dp` F32 `[tokens·dim]` (row-major
/// `[tokens, dim]`). Output: `duration` `[1]`, seconds before the speed factor.
pub fn build<'c>(b: &Builder<'c, '_>, hp: &DurationHp, prelu_slope: f32, text_len: usize) -> Result<GraphIo<'c>> {
    let ctx = b.ctx;
    let ids = ctx.new_tensor(TYPE_I32, &[text_len as i64])?;
    let style = ctx.new_tensor(TYPE_F32, &[(hp.style_tokens * hp.style_dim) as i64, 1])?;
    let emb = ctx.get_rows(b.w("dp.char_emb")?, ids)?; // [C, T]
    let token = ctx.reshape(b.w("dp.sentence_token")?, &[hp.char_dim as i64, 1])?;
    let x = ctx.concat(token, emb, 1)?; // [C, T+1]
    let conv = b.convnext_stack(x, "dp.convnext", &hp.convnext, false)?;
    let attn = b.attention_encoder(conv, "dp.attn", &hp.attn)?;
    let h = ctx.add(conv, attn)?;
    let sentence = ctx.view(h, &[hp.char_dim as i64, 1], &[h.nb()[1]], 0)?;
    let sentence = b.linear_no_bias(ctx.cont(sentence)?, "dp.proj_out.weight")?;
    let features = ctx.concat(sentence, style, 0)?;
    let hidden = b.leaky_relu(b.linear(features, "dp.pred.0")?, prelu_slope)?;
    let duration = ctx.exp(b.linear(hidden, "dp.pred.1")?)?;
    Ok(GraphIo { inputs: vec![("text_ids", ids), ("style_dp", style)], outputs: vec![("duration", duration)] })
}
