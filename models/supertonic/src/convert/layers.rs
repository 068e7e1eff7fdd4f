//! What the four graphs share: the ConvNeXt stacks, the relative-attention
//! encoders, linear layers, and the hyper-parameters only the graph
//! structure holds (dilations, head counts, score scales, guidance scales,
//! normalisation epsilons), as tools/supertonic/convert.py reads them.

use super::source::{Lazy, Weights};
use engine_core::model_kit::convert::onnx::{AttributeValue, OnnxGraph, OnnxNode};
use engine_core::model_kit::{Error, Result};
use std::collections::BTreeMap;

/// The output tensors under their GGUF names (sorted, as the GGUF lists them).
pub type Out<'g> = BTreeMap<String, Lazy<'g>>;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConvNextHp {
    pub kernel: usize,
    pub inner: usize,
    pub dilations: Vec<i64>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct AttnHp {
    pub layers: usize,
    pub heads: i64,
    pub filter: usize,
    /// `(rel_k rows - 1) // 2`.
    pub window: i64,
}

/// A cross-attention: heads, units and the score scale.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CrossHp {
    pub heads: i64,
    pub units: usize,
    pub scale: f64,
}

fn file(graph: &OnnxGraph) -> String {
    graph.path().display().to_string()
}

/// Axis `axis` of output tensor `key`.
pub fn dim(out: &Out, graph: &OnnxGraph, key: &str, axis: usize) -> Result<usize> {
    let t = out.get(key).ok_or_else(|| Error::msg(format!("{}: missing tensor or key {key}", file(graph))))?;
    t.shape().get(axis).copied().ok_or_else(|| Error::msg(format!("{}: {key} has shape {:?}, no axis {axis}", file(graph), t.shape())))
}

/// `out[new.weight], out[new.bias] = src[old.weight], src[old.bias]`.
pub fn linear<'g>(src: &Weights<'g>, old: &str, new: &str, out: &mut Out<'g>) -> Result<()> {
    out.insert(format!("{new}.weight"), src.get(&format!("{old}.weight"))?);
    out.insert(format!("{new}.bias"), src.get(&format!("{old}.bias"))?);
    Ok(())
}

/// Maps one ConvNeXt stack `<old>.<i>.*` → `<new>.<i>.*`; returns its depth.
pub fn convnext_tensors<'g>(src: &Weights<'g>, old: &str, new: &str, out: &mut Out<'g>) -> Result<usize> {
    let mut i = 0;
    while src.contains(&format!("{old}.{i}.pwconv1.weight")) {
        let (p, q) = (format!("{old}.{i}"), format!("{new}.{i}"));
        let either = |a: &str, b: &str| src.find(&format!("{p}.{a}")).or_else(|| src.find(&format!("{p}.{b}")));
        let dw = either("dwconv.weight", "dwconv.net.weight").ok_or_else(|| Error::msg(format!("{}: missing tensor {p}.dwconv.weight", file(src.graph))))?;
        let dwb = either("dwconv.bias", "dwconv.net.bias").ok_or_else(|| Error::msg(format!("{}: missing tensor {p}.dwconv.bias", file(src.graph))))?;
        out.insert(format!("{q}.dw.weight"), dw.index(1, 0)?.t()); // [k, C]
        out.insert(format!("{q}.dw.bias"), dwb);
        out.insert(format!("{q}.ln.weight"), src.get(&format!("{p}.norm.norm.weight"))?);
        out.insert(format!("{q}.ln.bias"), src.get(&format!("{p}.norm.norm.bias"))?);
        out.insert(format!("{q}.pw1.weight"), src.get(&format!("{p}.pwconv1.weight"))?.index(2, 0)?);
        out.insert(format!("{q}.pw1.bias"), src.get(&format!("{p}.pwconv1.bias"))?);
        out.insert(format!("{q}.pw2.weight"), src.get(&format!("{p}.pwconv2.weight"))?.index(2, 0)?);
        out.insert(format!("{q}.pw2.bias"), src.get(&format!("{p}.pwconv2.bias"))?);
        out.insert(format!("{q}.gamma"), src.get(&format!("{p}.gamma"))?.flatten());
        i += 1;
    }
    if i == 0 {
        return Err(Error::msg(format!("{}: no ConvNeXt layers under {old}", file(src.graph))));
    }
    Ok(i)
}

/// Kernel, inner width and per-layer dilations of a ConvNeXt stack of `n` layers.
pub fn convnext_hparams(src: &Weights, old: &str, n: usize) -> Result<ConvNextHp> {
    let mut dilations = Vec::with_capacity(n);
    let mut kernel = 0;
    for i in 0..n {
        let name = [format!("{old}.{i}.dwconv.weight"), format!("{old}.{i}.dwconv.net.weight")]
            .into_iter()
            .find(|k| src.contains(k))
            .ok_or_else(|| Error::msg(format!("{}: missing tensor {old}.{i}.dwconv.weight", file(src.graph))))?;
        dilations.push(conv_dilation(src.graph, &name)?);
        kernel = *src.shape(&name)?.get(2).ok_or_else(|| Error::msg(format!("{}: {name} is not a 1-D convolution weight", file(src.graph))))?;
    }
    let pw1 = format!("{old}.0.pwconv1.weight");
    let inner = *src.shape(&pw1)?.first().ok_or_else(|| Error::msg(format!("{}: {pw1} is a scalar, not a convolution weight", file(src.graph))))?;
    Ok(ConvNextHp { kernel, inner, dilations })
}

/// The relative-attention encoder `<old>` → `<new>.<i>.*`; returns its depth.
pub fn attn_encoder_tensors<'g>(src: &Weights<'g>, old: &str, new: &str, out: &mut Out<'g>) -> Result<usize> {
    let mut i = 0;
    while src.contains(&format!("{old}.attn_layers.{i}.conv_q.weight")) {
        let (a, q) = (format!("{old}.attn_layers.{i}"), format!("{new}.{i}"));
        for x in ["q", "k", "v", "o"] {
            out.insert(format!("{q}.{x}.weight"), src.get(&format!("{a}.conv_{x}.weight"))?.index(2, 0)?);
            out.insert(format!("{q}.{x}.bias"), src.get(&format!("{a}.conv_{x}.bias"))?);
        }
        out.insert(format!("{q}.rel_k"), src.get(&format!("{a}.emb_rel_k"))?.index(0, 0)?);
        out.insert(format!("{q}.rel_v"), src.get(&format!("{a}.emb_rel_v"))?.index(0, 0)?);
        for (ln, k) in [("ln1", "norm_layers_1"), ("ln2", "norm_layers_2")] {
            out.insert(format!("{q}.{ln}.weight"), src.get(&format!("{old}.{k}.{i}.norm.weight"))?);
            out.insert(format!("{q}.{ln}.bias"), src.get(&format!("{old}.{k}.{i}.norm.bias"))?);
        }
        for (name, k) in [("up", "conv_1"), ("down", "conv_2")] {
            let w = src.get(&format!("{old}.ffn_layers.{i}.{k}.weight"))?;
            match w.shape().get(2) {
                Some(1) => {}
                Some(kernel) => return Err(Error::msg(format!("{}: {old}.ffn_layers.{i}.{k}: kernel {kernel} (only 1 is supported)", file(src.graph)))),
                None => return Err(Error::msg(format!("{}: {old}.ffn_layers.{i}.{k}.weight is not a 1-D convolution weight", file(src.graph)))),
            }
            out.insert(format!("{q}.ffn.{name}.weight"), w.index(2, 0)?);
            out.insert(format!("{q}.ffn.{name}.bias"), src.get(&format!("{old}.ffn_layers.{i}.{k}.bias"))?);
        }
        i += 1;
    }
    Ok(i)
}

/// The encoder's hyper-parameters but its heads (found later in the graph).
pub fn attn_hparams(out: &Out, graph: &OnnxGraph, new: &str, layers: usize) -> Result<AttnHp> {
    let filter = dim(out, graph, &format!("{new}.0.ffn.up.weight"), 0)?;
    let window = (dim(out, graph, &format!("{new}.0.rel_k"), 0)? as i64 - 1).div_euclid(2);
    Ok(AttnHp { layers, heads: 0, filter, window })
}

/// `attr(node, key, default)` of an INTS attribute: its first value.
fn first_int(graph: &OnnxGraph, node: &OnnxNode, key: &str, default: i64) -> Result<i64> {
    match node.attribute(key) {
        None => Ok(default),
        Some(AttributeValue::Ints(v)) if !v.is_empty() => Ok(v[0]),
        Some(_) => Err(Error::msg(format!("{}: attribute {key} of {} node {} is not a list of integers", file(graph), node.op_type, node.name))),
    }
}

/// The dilation of the convolution that `weight_name` feeds.
pub fn conv_dilation(graph: &OnnxGraph, weight_name: &str) -> Result<i64> {
    let conv = graph.consumer(weight_name, "Conv").ok_or_else(|| Error::msg(format!("{}: {weight_name} feeds no Conv", file(graph))))?;
    first_int(graph, conv, "dilations", 1)
}

/// A FLOAT attribute as f64 (`float(attr(node, key, default))`).
pub fn float_attr(graph: &OnnxGraph, node: &OnnxNode, key: &str, default: f64) -> Result<f64> {
    match node.attribute(key) {
        None => Ok(default),
        Some(AttributeValue::Float(f)) => Ok(*f as f64),
        Some(AttributeValue::Int(i)) => Ok(*i as f64),
        Some(_) => Err(Error::msg(format!("{}: attribute {key} of {} node {} is not a number", file(graph), node.op_type, node.name))),
    }
}

/// 1 / divisor of the scores (`Div(MatMul(q, k), c)` under node path `prefix`).
pub fn attention_scale(graph: &OnnxGraph, prefix: &str) -> Result<f64> {
    for n in graph.nodes() {
        if !(n.name.starts_with(prefix) && (n.op_type == "Div" || n.op_type == "Mul")) || n.inputs.len() < 2 {
            continue;
        }
        let src = graph.producer(&n.inputs[0]);
        let c = graph.scalar(&n.inputs[1]);
        if let (Some(src), Some(c)) = (src, c) {
            if src.op_type == "MatMul" && !src.inputs.iter().all(|i| graph.contains_value(i)) {
                if n.op_type == "Mul" {
                    return Ok(c);
                }
                if c == 0.0 {
                    return Err(Error::msg(format!("{}: node {} divides the scores by 0", file(graph), n.name)));
                }
                return Ok(1.0 / c);
            }
        }
    }
    Err(Error::msg(format!("{}: no score scaling under {prefix}", file(graph))))
}

/// The integer values of a shape constant (`int(x)` of each element).
fn int_values(graph: &OnnxGraph, name: &str) -> Option<Vec<i64>> {
    let t = graph.value(name)?;
    match t.to_i64() {
        Some(v) => Some(v.iter().copied().collect()),
        None => Some(t.to_f64().iter().map(|&x| x as i64).collect()),
    }
}

/// Head count from the `[0, 0, heads, head_dim]` Reshape of the query.
pub fn reshape_heads(graph: &OnnxGraph, prefix: &str) -> Result<i64> {
    for n in graph.nodes() {
        if !(n.name.starts_with(prefix) && n.op_type == "Reshape") || n.inputs.len() < 2 {
            continue;
        }
        let shape = int_values(graph, &n.inputs[1]);
        let src = graph.producer(&n.inputs[0]);
        if let (Some(shape), Some(src)) = (shape, src) {
            if shape.len() == 4 && src.name.contains("W_query") {
                return Ok(shape[2]);
            }
        }
    }
    Err(Error::msg(format!("{}: no query head split under {prefix}", file(graph))))
}

/// Head count of a relative-attention encoder: its `[B, heads, head_dim, T]`
/// view of the projected queries.
pub fn reshape_heads_relative(graph: &OnnxGraph, channels: usize) -> Result<i64> {
    for n in graph.nodes() {
        if n.op_type != "Reshape" || !n.name.contains("attn_layers.0") || n.inputs.len() < 2 {
            continue;
        }
        if let Some(shape) = int_values(graph, &n.inputs[1]) {
            if shape.len() == 4 && shape[1] > 0 && shape[2] > 0 && shape[1].checked_mul(shape[2]) == Some(channels as i64) {
                return Ok(shape[1]);
            }
        }
    }
    Err(Error::msg(format!("{}: no head split found in the attention encoder", file(graph))))
}

/// Guidance `cond·v_c − uncond·v_u`: a Sub of two Muls by scalar constants.
pub fn cfg_scales(graph: &OnnxGraph) -> Option<(f64, f64)> {
    for n in graph.nodes() {
        if n.op_type != "Sub" || n.inputs.len() < 2 {
            continue;
        }
        let scales: Vec<Option<f64>> = n
            .inputs
            .iter()
            .map(|i| match graph.producer(i) {
                Some(m) if m.op_type == "Mul" => m.inputs.iter().find_map(|x| graph.scalar(x)),
                _ => None,
            })
            .collect();
        if scales.iter().all(|s| s.is_some()) {
            return Some((scales[0]?, scales[1]?));
        }
    }
    None
}

/// The epsilon of the first LayerNormalization node.
pub fn layer_norm_eps(graph: &OnnxGraph) -> Result<f64> {
    let ln =
        graph.nodes().iter().find(|n| n.op_type == "LayerNormalization").ok_or_else(|| Error::msg(format!("{}: no LayerNormalization node", file(graph))))?;
    float_attr(graph, ln, "epsilon", 1e-5)
}
