//! `text_encoder.onnx`: the text encoder (character embedding, ConvNeXt
//! stack, relative-attention encoder) and the speech-prompted text encoder
//! (two cross-attentions to the voice's style tokens), under `te.*`.
//!
//! The style keys do not depend on the input: v1/v2 exports fold them to a
//! constant `[heads, 1, head_dim, tokens]`; v3 exports keep the subgraph
//! `tanh(style_key W_k + b)`, evaluated here.

use super::layers::{
    attention_scale, attn_encoder_tensors, attn_hparams, convnext_hparams, convnext_tensors, dim, linear, reshape_heads_relative, AttnHp, ConvNextHp, CrossHp,
    Out,
};
use super::source::{Lazy, Weights};
use engine_core::model_kit::convert::onnx::OnnxGraph;
use engine_core::model_kit::{Error, Result};

#[derive(Clone, Debug, Default)]
pub struct TextEncoderHp {
    pub char_dim: usize,
    pub convnext: ConvNextHp,
    pub attn: AttnHp,
    pub spte: CrossHp,
    pub style_tokens: usize,
    pub style_dim: usize,
}

const SPTE_PREFIX: &str = "/speech_prompted_text_encoder/attention1/";

pub fn convert<'g>(graph: &'g OnnxGraph, out: &mut Out<'g>) -> Result<TextEncoderHp> {
    let src = Weights::of(graph, "tts.ttl")?;
    let p = "tts.ttl.text_encoder";
    out.insert("te.char_emb".into(), src.get(&format!("{p}.text_embedder.char_embedder.weight"))?);
    let stack = format!("{p}.convnext.convnext");
    let n = convnext_tensors(&src, &stack, "te.convnext", out)?;
    let convnext = convnext_hparams(&src, &stack, n)?;
    let layers = attn_encoder_tensors(&src, &format!("{p}.attn_encoder"), "te.attn", out)?;
    let char_dim = dim(out, graph, "te.char_emb", 1)?;
    let mut attn = attn_hparams(out, graph, "te.attn", layers)?;

    let s = "tts.ttl.speech_prompted_text_encoder";
    let mut heads = None;
    for a in [1, 2] {
        linear(&src, &format!("{s}.attention{a}.W_query.linear"), &format!("te.spte.{a}.q"), out)?;
        linear(&src, &format!("{s}.attention{a}.W_value.linear"), &format!("te.spte.{a}.v"), out)?;
        linear(&src, &format!("{s}.attention{a}.out_fc.linear"), &format!("te.spte.{a}.o"), out)?;
        let suffix = format!("/attention{a}/tanh/Tanh_output_0");
        let keys = if let Some(folded) = src.first(|k| k.ends_with(&suffix)) {
            // v1/v2 export: keys folded to [heads, 1, head_dim, tokens].
            let k = src.get(&folded)?;
            let shape = k.shape().to_vec();
            if shape.len() != 4 {
                return Err(Error::msg(format!(
                    "{}: {folded} has shape {shape:?}; folded style keys are [heads, 1, head_dim, tokens]",
                    graph.path().display()
                )));
            }
            heads = Some(shape[0] as i64);
            k.index(1, 0)?.permute(&[2, 0, 1])?.reshape(&[Some(shape[3]), None])?
        } else {
            // v3 export: the live subgraph tanh(style_key W_k + b).
            let proto = src
                .find("tts.ttl.style_encoder.style_token_layer.style_key")
                .ok_or_else(|| Error::msg(format!("{}: neither folded style keys nor style_key found", graph.path().display())))?;
            let w = src.get(&format!("{s}.attention{a}.W_key.linear.weight"))?;
            let b = src.get(&format!("{s}.attention{a}.W_key.linear.bias"))?;
            Lazy::tanh_keys(proto, w, b)?
        };
        out.insert(format!("te.spte.{a}.keys"), keys);
    }
    out.insert("te.spte.ln.weight".into(), src.get(&format!("{s}.norm.norm.weight"))?);
    out.insert("te.spte.ln.bias".into(), src.get(&format!("{s}.norm.norm.bias"))?);
    let heads = match heads {
        Some(h) => h,
        None => super::layers::reshape_heads(graph, SPTE_PREFIX)?,
    };
    let spte = CrossHp { heads, units: dim(out, graph, "te.spte.1.q.weight", 0)?, scale: attention_scale(graph, SPTE_PREFIX)? };
    let style_tokens = dim(out, graph, "te.spte.1.keys", 0)?;
    let style_dim = dim(out, graph, "te.spte.1.v.weight", 1)?;
    attn.heads = reshape_heads_relative(graph, char_dim)?;
    Ok(TextEncoderHp { char_dim, convnext, attn, spte, style_tokens, style_dim })
}
