//! `vector_estimator.onnx`: the flow-matching vector field (input/output
//! projections, time encoder, blocks of ConvNeXt stacks with text and style
//! cross-attention, RoPE), under `ve.*`; with classifier-free guidance (v3)
//! also the unconditional tokens and the guidance scales.
//!
//! The style attention's keys depend only on weights (a style-key prototype
//! through the key projection and tanh): evaluated here, once per block, and
//! again for the unconditional token under guidance.

use super::layers::{attention_scale, cfg_scales, convnext_hparams, convnext_tensors, dim, linear, reshape_heads, ConvNextHp, CrossHp, Out};
use super::source::{Lazy, Weights};
use engine_core::model_kit::convert::onnx::OnnxGraph;
use engine_core::model_kit::{Error, Result};

#[derive(Clone, Debug, Default)]
pub struct VectorEstimatorHp {
    pub hidden: usize,
    pub time_dim: usize,
    pub time_hidden: usize,
    pub time_scale: f64,
    pub blocks: usize,
    pub convnext0: ConvNextHp,
    pub convnext1: ConvNextHp,
    pub convnext2: ConvNextHp,
    pub last_convnext: ConvNextHp,
    pub text_attn: CrossHp,
    pub style_attn: CrossHp,
    /// (cond, uncond) guidance scales; `None` without guidance.
    pub cfg: Option<(f64, f64)>,
}

const V: &str = "tts.ttl.vector_field";

pub fn convert<'g>(graph: &'g OnnxGraph, out: &mut Out<'g>) -> Result<VectorEstimatorHp> {
    let file = graph.path().display().to_string();
    let fail = |msg: &str| Error::msg(format!("{file}: {msg}"));
    let src = Weights::of(graph, "tts.ttl")?;
    out.insert("ve.proj_in.weight".into(), src.get(&format!("{V}.proj_in.net.weight"))?.index(2, 0)?);
    out.insert("ve.proj_out.weight".into(), src.get(&format!("{V}.proj_out.net.weight"))?.index(2, 0)?);
    linear(&src, &format!("{V}.time_encoder.mlp.0.linear"), "ve.time.mlp0", out)?;
    linear(&src, &format!("{V}.time_encoder.mlp.2.linear"), "ve.time.mlp2", out)?;
    let freqs = src.first(|k| k.contains("time_encoder") && k.ends_with("_output_0")).ok_or_else(|| fail("time-encoder frequency table not found"))?;
    out.insert("ve.time.freqs".into(), src.get(&freqs)?.flatten());
    let time_scale = time_scale(graph, &freqs).ok_or_else(|| fail("time scale constant not found"))?;
    let theta: Vec<String> = src.keys().filter(|k| k.starts_with(&format!("{V}.main_blocks.")) && k.ends_with(".attn.theta")).map(str::to_string).collect();
    if theta.len() != 1 {
        return Err(fail(&format!("expected one shared RoPE theta, found {}", theta.len())));
    }
    out.insert("ve.rope.theta".into(), src.get(&theta[0])?.flatten());
    let prototype_name = src.first(|k| k.ends_with("Expand_output_0")).ok_or_else(|| fail("style key prototype (Expand_output_0) not found"))?;
    let prototype = src.get(&prototype_name)?;
    let cfg = cfg_scales(graph);
    let block_prefix = format!("{V}.main_blocks.");
    let n_modules = src
        .keys()
        .filter_map(|k| {
            let rest = k.strip_prefix(&block_prefix)?;
            let digits = rest.find(|c: char| !c.is_ascii_digit()).filter(|&end| end > 0 && rest[end..].starts_with('.'))?;
            rest[..digits].parse::<usize>().ok()
        })
        .max()
        .map(|m| m + 1)
        .ok_or_else(|| fail("no main_blocks modules"))?;
    if n_modules % 6 != 0 {
        return Err(fail(&format!("{n_modules} main_blocks modules, expected a multiple of 6")));
    }
    let blocks = n_modules / 6;
    let mut hp = VectorEstimatorHp { time_scale, blocks, cfg, ..Default::default() };
    for g in 0..blocks {
        let b = |j: usize| format!("{V}.main_blocks.{}", 6 * g + j);
        let q = format!("ve.block.{g}");
        for (j, name) in [(0, "convnext0"), (2, "convnext1"), (4, "convnext2")] {
            let stack = format!("{}.convnext", b(j));
            let n = convnext_tensors(&src, &stack, &format!("{q}.{name}"), out)?;
            let conv = convnext_hparams(&src, &stack, n)?;
            // As the Python converter: the last block's values are the ones recorded.
            match j {
                0 => hp.convnext0 = conv,
                2 => hp.convnext1 = conv,
                _ => hp.convnext2 = conv,
            }
        }
        linear(&src, &format!("{}.linear.linear", b(1)), &format!("{q}.time"), out)?;
        for (j, name) in [(3, "text_attn"), (5, "style_attn")] {
            let a = format!("{}.attn", b(j));
            linear(&src, &format!("{a}.W_query.linear"), &format!("{q}.{name}.q"), out)?;
            linear(&src, &format!("{a}.W_value.linear"), &format!("{q}.{name}.v"), out)?;
            linear(&src, &format!("{a}.out_fc.linear"), &format!("{q}.{name}.o"), out)?;
            let ln = if src.contains(&format!("{}.norm.norm.weight", b(j))) { format!("{}.norm.norm", b(j)) } else { format!("{a}.norm.norm") };
            out.insert(format!("{q}.{name}.ln.weight"), src.get(&format!("{ln}.weight"))?);
            out.insert(format!("{q}.{name}.ln.bias"), src.get(&format!("{ln}.bias"))?);
        }
        linear(&src, &format!("{}.attn.W_key.linear", b(3)), &format!("{q}.text_attn.k"), out)?;
        let wk = src.get(&format!("{}.attn.W_key.linear.weight", b(5)))?;
        let bk = src.get(&format!("{}.attn.W_key.linear.bias", b(5)))?;
        out.insert(format!("{q}.style_attn.keys"), Lazy::tanh_keys(prototype.clone(), wk.clone(), bk.clone())?);
        if cfg.is_some() {
            let special = src.get("tts.ttl.uncond_masker.style_key_special_token")?;
            out.insert(format!("{q}.style_attn.keys_uncond"), Lazy::tanh_keys(special, wk, bk)?);
        }
    }
    let stack = format!("{V}.last_convnext.convnext");
    let n = convnext_tensors(&src, &stack, "ve.last_convnext", out)?;
    hp.last_convnext = convnext_hparams(&src, &stack, n)?;
    if cfg.is_some() {
        out.insert("ve.uncond.text_token".into(), src.get("tts.ttl.uncond_masker.text_special_token")?.flatten());
        out.insert("ve.uncond.style_values".into(), src.get("tts.ttl.uncond_masker.style_value_special_token")?.last_two()?);
    }
    let text_prefix =
        if graph.nodes().iter().any(|n| n.name.starts_with("/vector_estimator/")) { "/vector_estimator/main_blocks.3/attn/" } else { "/main_blocks.3/attn/" };
    let style_prefix = text_prefix.replace("main_blocks.3", "main_blocks.5");
    hp.hidden = dim(out, graph, "ve.proj_in.weight", 0)?;
    hp.time_dim = dim(out, graph, "ve.time.mlp0.weight", 1)?;
    hp.time_hidden = dim(out, graph, "ve.time.mlp0.weight", 0)?;
    hp.text_attn = CrossHp {
        heads: reshape_heads(graph, text_prefix)?,
        units: dim(out, graph, "ve.block.0.text_attn.q.weight", 0)?,
        scale: attention_scale(graph, text_prefix)?,
    };
    hp.style_attn = CrossHp {
        heads: reshape_heads(graph, &style_prefix)?,
        units: dim(out, graph, "ve.block.0.style_attn.q.weight", 0)?,
        scale: attention_scale(graph, &style_prefix)?,
    };
    Ok(hp)
}

/// The time encoder's scale: `sin(t · scale · f)`, the constant of the
/// product that, times the frequency table, feeds the Sin.
fn time_scale(graph: &OnnxGraph, freqs: &str) -> Option<f64> {
    let sin = graph.nodes().iter().find(|n| n.op_type == "Sin" && n.name.contains("time_encoder"))?;
    let mul = graph.producer(sin.inputs.first()?)?;
    let inner = graph.producer(mul.inputs.iter().find(|i| *i != freqs)?)?;
    inner.inputs.iter().find_map(|i| graph.scalar(i))
}
