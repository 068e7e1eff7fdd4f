//! `vocoder.onnx`: the latent statistics, the input convolution, the
//! ConvNeXt decoder, its final batch norm and the two-layer head, under `voc.*`.

use super::layers::{convnext_hparams, convnext_tensors, dim, float_attr, ConvNextHp, Out};
use super::source::Weights;
use engine_core::model_kit::convert::onnx::OnnxGraph;
use engine_core::model_kit::{Error, Result};

#[derive(Clone, Debug, Default)]
pub struct VocoderHp {
    pub hidden: usize,
    pub kernel_init: usize,
    pub convnext: ConvNextHp,
    pub head_hidden: usize,
    pub head_kernel: usize,
    pub batch_norm_eps: f64,
    pub base_chunk_size: usize,
}

pub fn convert<'g>(graph: &'g OnnxGraph, out: &mut Out<'g>) -> Result<VocoderHp> {
    let file = graph.path().display().to_string();
    let fail = |msg: String| Error::msg(format!("{file}: {msg}"));
    let src = Weights::of(graph, "tts.ae")?;
    let latent = src.get("tts.ae.latent_mean")?.flatten();
    let latent_dim = latent.len();
    out.insert("voc.latent_mean".into(), latent);
    out.insert("voc.latent_std".into(), src.get("tts.ae.latent_std")?.flatten());
    let mut embed = Vec::new();
    for k in src.keys() {
        let shape = src.shape(k)?;
        if k.ends_with(".weight") && shape.len() == 3 && shape[1] == latent_dim && !k.contains("convnext") && !k.contains("head") {
            embed.push(k.to_string());
        }
    }
    if embed.len() != 1 {
        return Err(fail(format!("expected one input convolution, found {embed:?}")));
    }
    let w = src.get(&embed[0])?;
    let (hidden, kernel_init) = (w.shape()[0], w.shape()[2]);
    out.insert("voc.embed.weight".into(), w.permute(&[0, 2, 1])?.reshape(&[Some(hidden), None])?);
    out.insert("voc.embed.bias".into(), src.get(&format!("{}bias", &embed[0][..embed[0].len() - "weight".len()]))?);
    let n = convnext_tensors(&src, "tts.ae.decoder.convnext", "voc.convnext", out)?;
    let convnext = convnext_hparams(&src, "tts.ae.decoder.convnext", n)?;
    for (a, b) in [("weight", "weight"), ("bias", "bias"), ("running_mean", "mean"), ("running_var", "var")] {
        out.insert(format!("voc.bn.{b}"), src.get(&format!("tts.ae.decoder.final_norm.norm.{a}"))?);
    }
    let h1 = src.get("tts.ae.decoder.head.layer1.net.weight")?;
    if h1.ndim() != 3 {
        return Err(fail(format!("tts.ae.decoder.head.layer1.net.weight has shape {:?}; expected [out, in, kernel]", h1.shape())));
    }
    let (head_hidden, head_kernel) = (h1.shape()[0], h1.shape()[2]);
    out.insert("voc.head1.weight".into(), h1.permute(&[0, 2, 1])?.reshape(&[Some(head_hidden), None])?);
    out.insert("voc.head1.bias".into(), src.get("tts.ae.decoder.head.layer1.net.bias")?);
    let mut prelu = Vec::new();
    for k in src.keys() {
        if k.starts_with("tts.ae.decoder.head") && src.get(k)?.len() == 1 {
            prelu.push(k.to_string());
        }
    }
    if prelu.len() != 1 {
        return Err(fail(format!("expected one head PReLU slope, found {prelu:?}")));
    }
    out.insert("voc.head.prelu".into(), src.get(&prelu[0])?.flatten());
    out.insert("voc.head2.weight".into(), src.get("tts.ae.decoder.head.layer2.weight")?.index(2, 0)?);
    let bn = graph.nodes().iter().find(|n| n.op_type == "BatchNormalization").ok_or_else(|| fail("no BatchNormalization node".into()))?;
    let batch_norm_eps = float_attr(graph, bn, "epsilon", 1e-5)?;
    let base_chunk_size = dim(out, graph, "voc.head2.weight", 0)?;
    Ok(VocoderHp { hidden, kernel_init, convnext, head_hidden, head_kernel, batch_norm_eps, base_chunk_size })
}
