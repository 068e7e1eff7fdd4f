//! `duration_predictor.onnx`: the sentence encoder (character embedding,
//! ConvNeXt stack, relative-attention encoder, projection) and the two-layer
//! predictor, under `dp.*`.

use super::layers::{attn_encoder_tensors, attn_hparams, convnext_hparams, convnext_tensors, dim, linear, reshape_heads_relative, AttnHp, ConvNextHp, Out};
use super::source::Weights;
use engine_core::model_kit::convert::onnx::OnnxGraph;
use engine_core::model_kit::Result;

/// What the metadata takes from this graph.
#[derive(Clone, Debug, Default)]
pub struct DurationHp {
    pub char_dim: usize,
    pub convnext: ConvNextHp,
    pub attn: AttnHp,
    pub predictor_hidden: usize,
}

pub fn convert<'g>(graph: &'g OnnxGraph, out: &mut Out<'g>) -> Result<DurationHp> {
    let src = Weights::of(graph, "tts.dp")?;
    let p = "tts.dp.sentence_encoder";
    out.insert("dp.char_emb".into(), src.get(&format!("{p}.text_embedder.char_embedder.weight"))?);
    out.insert("dp.sentence_token".into(), src.get(&format!("{p}.sentence_token"))?.flatten());
    let stack = format!("{p}.convnext.convnext");
    let n = convnext_tensors(&src, &stack, "dp.convnext", out)?;
    let convnext = convnext_hparams(&src, &stack, n)?;
    let layers = attn_encoder_tensors(&src, &format!("{p}.attn_encoder"), "dp.attn", out)?;
    out.insert("dp.proj_out.weight".into(), src.get(&format!("{p}.proj_out.net.weight"))?.index(2, 0)?);
    linear(&src, "tts.dp.predictor.layers.0", "dp.pred.0", out)?;
    linear(&src, "tts.dp.predictor.layers.1", "dp.pred.1", out)?;
    out.insert("dp.pred.prelu".into(), src.get("tts.dp.predictor.activation.weight")?.flatten());
    let char_dim = dim(out, graph, "dp.char_emb", 1)?;
    let mut attn = attn_hparams(out, graph, "dp.attn", layers)?;
    let predictor_hidden = dim(out, graph, "dp.pred.0.weight", 0)?;
    // Head counts the graph keeps only in Reshape constants.
    attn.heads = reshape_heads_relative(graph, char_dim)?;
    Ok(DurationHp { char_dim, convnext, attn, predictor_hidden })
}
