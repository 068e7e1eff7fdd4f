#!/usr/bin/env python3
"""Convert an official Supertonic bundle (v1, v2 or v3) to one GGUF file.

Input: the bundle directory as published (``onnx/{duration_predictor,
text_encoder,vector_estimator,vocoder}.onnx``, ``onnx/tts.json``,
``onnx/unicode_indexer.json``, ``voice_styles/*.json``; ``tts.json`` and the
indexer may also sit at the top level).

Output: a GGUF with every weight under the engine's names (docs/gguf.md), the
hyper-parameters (from tts.json and from the graphs: dilations, head counts,
attention scales, CFG scales), the character indexer and every voice.

Anonymous ONNX initializers (``onnx::MatMul_<n>``, ``onnx::Conv_<n>``,
``onnx::PRelu_<n>``) are named by graph structure, never by their numbers,
which change between exports: a MatMul weight takes the name of the bias added
to its product, a Conv or PRelu parameter the module path of its node.
Input-independent subgraphs (the tanh style keys) are evaluated here.

Usage:
    convert.py BUNDLE_DIR OUT.gguf [--weights f32|f16|bf16|q8_0] [--keep-f32 GLOB ...]
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gguf_atomic import write_atomically  # noqa: E402

ARCH = "supertonic"
LANGUAGES = {
    "v1": ["en"],
    "v2": ["en", "ko", "es", "pt", "fr"],
    "v3": ["en", "ko", "ja", "ar", "bg", "cs", "da", "de", "el", "es", "et", "fi", "fr", "hi", "hr", "hu",
           "id", "it", "lt", "lv", "nl", "pl", "pt", "ro", "ru", "sk", "sl", "sv", "tr", "uk", "vi", "na"],
}
DEFAULT_LANGUAGE = {"v1": "en", "v2": "en", "v3": "na"}
SHORT_CHUNK_LANGUAGES = {"v1": [], "v2": ["ko"], "v3": ["ko", "ja"]}
DEFAULT_STEPS = {"v1": 5, "v2": 5, "v3": 8}
# Weights that stay F32 whatever --weights says: embeddings read by row,
# depthwise taps read as per-channel vectors, and everything small.
DEFAULT_KEEP_F32 = ["*.char_emb", "*.dw.weight", "*.rel_k", "*.rel_v", "*.keys*", "voice.*", "text.*", "*.ln.*",
                    "*.ln1.*", "*.ln2.*", "*.gamma", "*.bias", "voc.bn.*", "voc.latent_*", "ve.rope.*", "ve.time.freqs",
                    "ve.uncond.*", "*.prelu", "dp.sentence_token"]


class ConversionError(Exception):
    pass


class Graph:
    """One ONNX graph with lookups by tensor name (initializers and Constant nodes)."""

    def __init__(self, path: Path):
        if not path.is_file():
            raise ConversionError(f"{path} is missing")
        self.path = path
        self.model = onnx.load(str(path))
        g = self.model.graph
        self.values: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        self.initializers = [t.name for t in g.initializer]
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in g.node:
            if n.op_type == "Constant":
                for a in n.attribute:
                    if a.name == "value":
                        self.values[n.output[0]] = numpy_helper.to_array(a.t)
            for o in n.output:
                self.producer[o] = n
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.nodes = list(g.node)

    def scalar(self, name: str) -> float | None:
        v = self.values.get(name)
        return float(v.reshape(-1)[0]) if v is not None and v.size == 1 else None

    def consumer(self, name: str, op: str) -> onnx.NodeProto | None:
        return next((n for n in self.consumers.get(name, []) if n.op_type == op), None)

    def attr(self, node: onnx.NodeProto, key: str, default=None):
        for a in node.attribute:
            if a.name == key:
                return onnx.helper.get_attribute_value(a)
        return default


def module_path(node_name: str, root: str) -> str:
    """`/decoder/head/act/PRelu` → `<root>.decoder.head.act`."""
    parts = [p for p in node_name.split("/") if p][:-1]
    return ".".join([root] + parts)


def canonical_weights(graph: Graph, root: str) -> dict[str, np.ndarray]:
    """Every float initializer under an official module name; linear weights in
    PyTorch layout ([out, in])."""
    out: dict[str, np.ndarray] = {}
    for name in graph.initializers:
        value = graph.values[name]
        if name.startswith("onnx::MatMul_"):
            mm = graph.consumer(name, "MatMul")
            add = mm and graph.consumer(mm.output[0], "Add")
            bias = add and next((i for i in add.input if i.endswith(".bias") and i in graph.values), None)
            if not bias:
                raise ConversionError(f"{graph.path.name}: cannot name {name}: its MatMul has no named bias")
            out[bias[: -len("bias")] + "weight"] = value.T.copy()
        elif name.startswith("onnx::Conv_"):
            conv = graph.consumer(name, "Conv")
            if conv is None:
                raise ConversionError(f"{graph.path.name}: {name} feeds no Conv")
            role = {1: "weight", 2: "bias"}[list(conv.input).index(name)]
            out[f"{module_path(conv.name, root)}.{role}"] = value
        elif name.startswith("onnx::PRelu_"):
            prelu = graph.consumer(name, "PRelu")
            if prelu is None:
                raise ConversionError(f"{graph.path.name}: {name} feeds no PRelu")
            out[f"{module_path(prelu.name, root)}.weight"] = value
        elif name.startswith("onnx::"):
            # Other anonymous initializers (shape and scalar constants a real
            # export may fold) carry no weights; anything the engine needs and
            # cannot find is reported by name when it is looked up.
            continue
        else:
            out[name] = value
    return out


def conv_dilation(graph: Graph, weight_name: str) -> int:
    conv = graph.consumer(weight_name, "Conv")
    if conv is None:
        raise ConversionError(f"{graph.path.name}: {weight_name} feeds no Conv")
    return int(graph.attr(conv, "dilations", [1])[0])


def attention_scale(graph: Graph, prefix: str) -> float:
    """1 / divisor of the scores (`Div(MatMul(q, k), c)` under node path `prefix`)."""
    for n in graph.nodes:
        if n.name.startswith(prefix) and n.op_type in ("Div", "Mul"):
            src = graph.producer.get(n.input[0])
            c = graph.scalar(n.input[1])
            if src is not None and src.op_type == "MatMul" and c is not None and not all(i in graph.values for i in src.input):
                return 1.0 / c if n.op_type == "Div" else c
    raise ConversionError(f"{graph.path.name}: no score scaling under {prefix}")


def reshape_heads(graph: Graph, prefix: str) -> int:
    """Head count from the `[0, 0, heads, head_dim]` Reshape of the query."""
    for n in graph.nodes:
        if n.name.startswith(prefix) and n.op_type == "Reshape":
            shape = graph.values.get(n.input[1])
            src = graph.producer.get(n.input[0])
            if shape is not None and shape.size == 4 and src is not None and "W_query" in src.name:
                return int(shape[2])
    raise ConversionError(f"{graph.path.name}: no query head split under {prefix}")


def cfg_scales(graph: Graph) -> tuple[float, float] | None:
    """Guidance `cond·v_c − uncond·v_u`: a Sub of two Muls by scalar constants."""
    for n in graph.nodes:
        if n.op_type != "Sub":
            continue
        scales = []
        for i in n.input:
            m = graph.producer.get(i)
            s = [graph.scalar(x) for x in m.input] if m is not None and m.op_type == "Mul" else []
            scales.append(next((x for x in s if x is not None), None))
        if all(s is not None for s in scales):
            return scales[0], scales[1]
    return None


def convnext_tensors(src: dict[str, np.ndarray], old: str, new: str, out: dict[str, np.ndarray]) -> int:
    """Maps one ConvNeXt stack `<old>.<i>.*` → `<new>.<i>.*`; returns its depth."""
    i = 0
    while f"{old}.{i}.pwconv1.weight" in src:
        p, q = f"{old}.{i}", f"{new}.{i}"
        dw = src.get(f"{p}.dwconv.weight", src.get(f"{p}.dwconv.net.weight"))
        dwb = src.get(f"{p}.dwconv.bias", src.get(f"{p}.dwconv.net.bias"))
        out[f"{q}.dw.weight"] = dw[:, 0, :].T.copy()  # [k, C]
        out[f"{q}.dw.bias"] = dwb
        out[f"{q}.ln.weight"] = src[f"{p}.norm.norm.weight"]
        out[f"{q}.ln.bias"] = src[f"{p}.norm.norm.bias"]
        out[f"{q}.pw1.weight"] = src[f"{p}.pwconv1.weight"][:, :, 0]
        out[f"{q}.pw1.bias"] = src[f"{p}.pwconv1.bias"]
        out[f"{q}.pw2.weight"] = src[f"{p}.pwconv2.weight"][:, :, 0]
        out[f"{q}.pw2.bias"] = src[f"{p}.pwconv2.bias"]
        out[f"{q}.gamma"] = src[f"{p}.gamma"].reshape(-1)
        i += 1
    if i == 0:
        raise ConversionError(f"no ConvNeXt layers under {old}")
    return i


def convnext_hparams(graph: Graph, src: dict[str, np.ndarray], old: str, n: int) -> dict:
    dils = []
    for i in range(n):
        wname = next(k for k in (f"{old}.{i}.dwconv.weight", f"{old}.{i}.dwconv.net.weight") if k in src)
        dils.append(conv_dilation(graph, wname))
    return {"kernel": int(src[wname].shape[2]), "inner": int(src[f"{old}.0.pwconv1.weight"].shape[0]), "dilations": dils}


def attn_encoder_tensors(src, old: str, new: str, out) -> int:
    i = 0
    while f"{old}.attn_layers.{i}.conv_q.weight" in src:
        a, q = f"{old}.attn_layers.{i}", f"{new}.{i}"
        for x in "qkvo":
            out[f"{q}.{x}.weight"] = src[f"{a}.conv_{x}.weight"][:, :, 0]
            out[f"{q}.{x}.bias"] = src[f"{a}.conv_{x}.bias"]
        out[f"{q}.rel_k"] = src[f"{a}.emb_rel_k"][0]
        out[f"{q}.rel_v"] = src[f"{a}.emb_rel_v"][0]
        for ln, k in (("ln1", "norm_layers_1"), ("ln2", "norm_layers_2")):
            out[f"{q}.{ln}.weight"] = src[f"{old}.{k}.{i}.norm.weight"]
            out[f"{q}.{ln}.bias"] = src[f"{old}.{k}.{i}.norm.bias"]
        for name, k in (("up", "conv_1"), ("down", "conv_2")):
            w = src[f"{old}.ffn_layers.{i}.{k}.weight"]
            if w.shape[2] != 1:
                raise ConversionError(f"{old}.ffn_layers.{i}.{k}: kernel {w.shape[2]} (only 1 is supported)")
            out[f"{q}.ffn.{name}.weight"] = w[:, :, 0]
            out[f"{q}.ffn.{name}.bias"] = src[f"{old}.ffn_layers.{i}.{k}.bias"]
        i += 1
    return i


def tanh_keys(prototype: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`tanh(P Wᵀ + b)`: [tokens, units].

    Computed in float64 and rounded to float32 once at the end, with each dot
    product an explicit sum along the last axis (numpy's pairwise summation)
    instead of a BLAS matmul, whose summation order depends on the BLAS build
    and the CPU: this way the native converter (tts convert) reproduces every
    bit."""
    p64 = prototype.reshape(prototype.shape[-2], prototype.shape[-1]).astype(np.float64)
    w64, b64 = w.astype(np.float64), b.astype(np.float64)
    return np.tanh((p64[:, None, :] * w64[None, :, :]).sum(-1) + b64).astype(np.float32)


def linear(src, old: str, new: str, out):
    out[f"{new}.weight"] = src[f"{old}.weight"]
    out[f"{new}.bias"] = src[f"{old}.bias"]


def convert_duration(graph: Graph, md: dict, out: dict):
    src = canonical_weights(graph, "tts.dp")
    p = "tts.dp.sentence_encoder"
    out["dp.char_emb"] = src[f"{p}.text_embedder.char_embedder.weight"]
    out["dp.sentence_token"] = src[f"{p}.sentence_token"].reshape(-1)
    n = convnext_tensors(src, f"{p}.convnext.convnext", "dp.convnext", out)
    md["dp.convnext"] = convnext_hparams(graph, src, f"{p}.convnext.convnext", n)
    layers = attn_encoder_tensors(src, f"{p}.attn_encoder", "dp.attn", out)
    out["dp.proj_out.weight"] = src[f"{p}.proj_out.net.weight"][:, :, 0]
    linear(src, "tts.dp.predictor.layers.0", "dp.pred.0", out)
    linear(src, "tts.dp.predictor.layers.1", "dp.pred.1", out)
    out["dp.pred.prelu"] = src["tts.dp.predictor.activation.weight"].reshape(-1)
    md["dp.char_dim"] = int(out["dp.char_emb"].shape[1])
    md["dp.attn"] = {"layers": layers, "heads": None, "filter": int(out["dp.attn.0.ffn.up.weight"].shape[0]),
                     "window": (out["dp.attn.0.rel_k"].shape[0] - 1) // 2}
    md["dp.predictor_hidden"] = int(out["dp.pred.0.weight"].shape[0])


def convert_text_encoder(graph: Graph, md: dict, out: dict):
    src = canonical_weights(graph, "tts.ttl")
    p = "tts.ttl.text_encoder"
    out["te.char_emb"] = src[f"{p}.text_embedder.char_embedder.weight"]
    n = convnext_tensors(src, f"{p}.convnext.convnext", "te.convnext", out)
    md["te.convnext"] = convnext_hparams(graph, src, f"{p}.convnext.convnext", n)
    layers = attn_encoder_tensors(src, f"{p}.attn_encoder", "te.attn", out)
    md["te.char_dim"] = int(out["te.char_emb"].shape[1])
    md["te.attn"] = {"layers": layers, "heads": None, "filter": int(out["te.attn.0.ffn.up.weight"].shape[0]),
                     "window": (out["te.attn.0.rel_k"].shape[0] - 1) // 2}
    s = "tts.ttl.speech_prompted_text_encoder"
    heads = None
    for a in (1, 2):
        linear(src, f"{s}.attention{a}.W_query.linear", f"te.spte.{a}.q", out)
        linear(src, f"{s}.attention{a}.W_value.linear", f"te.spte.{a}.v", out)
        linear(src, f"{s}.attention{a}.out_fc.linear", f"te.spte.{a}.o", out)
        folded = next((k for k in src if k.endswith(f"/attention{a}/tanh/Tanh_output_0")), None)
        if folded is not None:  # v1/v2 export: keys folded to [heads, 1, head_dim, tokens]
            k = src[folded]
            heads = k.shape[0]
            out[f"te.spte.{a}.keys"] = k[:, 0].transpose(2, 0, 1).reshape(k.shape[3], -1).copy()
        else:  # v3 export: the live subgraph tanh(style_key W_k + b)
            proto = src.get("tts.ttl.style_encoder.style_token_layer.style_key")
            if proto is None:
                raise ConversionError("text_encoder: neither folded style keys nor style_key found")
            out[f"te.spte.{a}.keys"] = tanh_keys(proto, src[f"{s}.attention{a}.W_key.linear.weight"],
                                                 src[f"{s}.attention{a}.W_key.linear.bias"])
    out["te.spte.ln.weight"] = src[f"{s}.norm.norm.weight"]
    out["te.spte.ln.bias"] = src[f"{s}.norm.norm.bias"]
    if heads is None:
        heads = reshape_heads(graph, "/speech_prompted_text_encoder/attention1/")
    md["te.spte"] = {"heads": int(heads), "units": int(out["te.spte.1.q.weight"].shape[0]),
                     "scale": attention_scale(graph, "/speech_prompted_text_encoder/attention1/")}
    md["style_tokens"], md["style_dim"] = int(out["te.spte.1.keys"].shape[0]), int(out["te.spte.1.v.weight"].shape[1])


def convert_vector_estimator(graph: Graph, md: dict, out: dict):
    src = canonical_weights(graph, "tts.ttl")
    v = "tts.ttl.vector_field"
    out["ve.proj_in.weight"] = src[f"{v}.proj_in.net.weight"][:, :, 0]
    out["ve.proj_out.weight"] = src[f"{v}.proj_out.net.weight"][:, :, 0]
    linear(src, f"{v}.time_encoder.mlp.0.linear", "ve.time.mlp0", out)
    linear(src, f"{v}.time_encoder.mlp.2.linear", "ve.time.mlp2", out)
    freqs = next((k for k in src if "time_encoder" in k and k.endswith("_output_0")), None)
    if freqs is None:
        raise ConversionError("vector_estimator: time-encoder frequency table not found")
    out["ve.time.freqs"] = src[freqs].reshape(-1).astype(np.float32)
    sin = next(n for n in graph.nodes if n.op_type == "Sin" and "time_encoder" in n.name)
    mul = graph.producer[sin.input[0]]  # t·scale·f
    inner = graph.producer.get(next(i for i in mul.input if i != freqs))
    time_scale = next((graph.scalar(i) for i in inner.input if graph.scalar(i) is not None), None) if inner else None
    if time_scale is None:
        raise ConversionError("vector_estimator: time scale constant not found")
    theta = [k for k in src if k.startswith(f"{v}.main_blocks.") and k.endswith(".attn.theta")]
    if len(theta) != 1:
        raise ConversionError(f"vector_estimator: expected one shared RoPE theta, found {len(theta)}")
    out["ve.rope.theta"] = src[theta[0]].reshape(-1)
    prototype = next((src[k] for k in src if k.endswith("Expand_output_0")), None)
    if prototype is None:
        raise ConversionError("vector_estimator: style key prototype (Expand_output_0) not found")
    cfg = cfg_scales(graph)
    n_modules = 1 + max(int(m.group(1)) for k in src if (m := re.match(rf"{re.escape(v)}\.main_blocks\.(\d+)\.", k)))
    if n_modules % 6:
        raise ConversionError(f"vector_estimator: {n_modules} main_blocks modules, expected a multiple of 6")
    blocks = n_modules // 6
    hp = {}
    for g in range(blocks):
        b, q = lambda j: f"{v}.main_blocks.{6 * g + j}", f"ve.block.{g}"
        for j, name in ((0, "convnext0"), (2, "convnext1"), (4, "convnext2")):
            n = convnext_tensors(src, f"{b(j)}.convnext", f"{q}.{name}", out)
            hp[name] = convnext_hparams(graph, src, f"{b(j)}.convnext", n)
        linear(src, f"{b(1)}.linear.linear", f"{q}.time", out)
        for j, name in ((3, "text_attn"), (5, "style_attn")):
            a = f"{b(j)}.attn"
            linear(src, f"{a}.W_query.linear", f"{q}.{name}.q", out)
            linear(src, f"{a}.W_value.linear", f"{q}.{name}.v", out)
            linear(src, f"{a}.out_fc.linear", f"{q}.{name}.o", out)
            ln = f"{b(j)}.norm.norm" if f"{b(j)}.norm.norm.weight" in src else f"{a}.norm.norm"
            out[f"{q}.{name}.ln.weight"] = src[f"{ln}.weight"]
            out[f"{q}.{name}.ln.bias"] = src[f"{ln}.bias"]
        linear(src, f"{b(3)}.attn.W_key.linear", f"{q}.text_attn.k", out)
        wk, bk = src[f"{b(5)}.attn.W_key.linear.weight"], src[f"{b(5)}.attn.W_key.linear.bias"]
        out[f"{q}.style_attn.keys"] = tanh_keys(prototype, wk, bk)
        if cfg:
            out[f"{q}.style_attn.keys_uncond"] = tanh_keys(src["tts.ttl.uncond_masker.style_key_special_token"], wk, bk)
    n = convnext_tensors(src, f"{v}.last_convnext.convnext", "ve.last_convnext", out)
    hp["last_convnext"] = convnext_hparams(graph, src, f"{v}.last_convnext.convnext", n)
    if cfg:
        out["ve.uncond.text_token"] = src["tts.ttl.uncond_masker.text_special_token"].reshape(-1)
        tok = src["tts.ttl.uncond_masker.style_value_special_token"]
        out["ve.uncond.style_values"] = tok.reshape(tok.shape[-2], tok.shape[-1])
    text_prefix = f"/vector_estimator/main_blocks.3/attn/" if any(n.name.startswith("/vector_estimator/") for n in graph.nodes) else "/main_blocks.3/attn/"
    style_prefix = text_prefix.replace("main_blocks.3", "main_blocks.5")
    md["ve"] = {
        "hidden": int(out["ve.proj_in.weight"].shape[0]),
        "time_dim": int(out["ve.time.mlp0.weight"].shape[1]),
        "time_hidden": int(out["ve.time.mlp0.weight"].shape[0]),
        "time_scale": float(time_scale),
        "blocks": blocks,
        **{k: hp[k] for k in ("convnext0", "convnext1", "convnext2", "last_convnext")},
        "text_attn": {"heads": reshape_heads(graph, text_prefix), "units": int(out["ve.block.0.text_attn.q.weight"].shape[0]),
                      "scale": attention_scale(graph, text_prefix)},
        "style_attn": {"heads": reshape_heads(graph, style_prefix), "units": int(out["ve.block.0.style_attn.q.weight"].shape[0]),
                       "scale": attention_scale(graph, style_prefix)},
        "cfg": cfg,
    }


def convert_vocoder(graph: Graph, md: dict, out: dict):
    src = canonical_weights(graph, "tts.ae")
    out["voc.latent_mean"] = src["tts.ae.latent_mean"].reshape(-1)
    out["voc.latent_std"] = src["tts.ae.latent_std"].reshape(-1)
    embed = [k for k in src if k.endswith(".weight") and src[k].ndim == 3 and src[k].shape[1] == out["voc.latent_mean"].size
             and "convnext" not in k and "head" not in k]
    if len(embed) != 1:
        raise ConversionError(f"vocoder: expected one input convolution, found {embed}")
    w = src[embed[0]]
    out["voc.embed.weight"] = w.transpose(0, 2, 1).reshape(w.shape[0], -1).copy()
    out["voc.embed.bias"] = src[embed[0][: -len("weight")] + "bias"]
    n = convnext_tensors(src, "tts.ae.decoder.convnext", "voc.convnext", out)
    conv = convnext_hparams(graph, src, "tts.ae.decoder.convnext", n)
    for a, b in (("weight", "weight"), ("bias", "bias"), ("running_mean", "mean"), ("running_var", "var")):
        out[f"voc.bn.{b}"] = src[f"tts.ae.decoder.final_norm.norm.{a}"]
    h1 = src["tts.ae.decoder.head.layer1.net.weight"]
    out["voc.head1.weight"] = h1.transpose(0, 2, 1).reshape(h1.shape[0], -1).copy()
    out["voc.head1.bias"] = src["tts.ae.decoder.head.layer1.net.bias"]
    prelu = [k for k in src if k.startswith("tts.ae.decoder.head") and src[k].size == 1]
    if len(prelu) != 1:
        raise ConversionError(f"vocoder: expected one head PReLU slope, found {prelu}")
    out["voc.head.prelu"] = src[prelu[0]].reshape(-1)
    out["voc.head2.weight"] = src["tts.ae.decoder.head.layer2.weight"][:, :, 0]
    bn = next(n for n in graph.nodes if n.op_type == "BatchNormalization")
    md["batch_norm_eps"] = float(graph.attr(bn, "epsilon", 1e-5))
    md["voc"] = {"hidden": int(w.shape[0]), "kernel_init": int(w.shape[2]), "convnext": conv,
                 "head_hidden": int(h1.shape[0]), "head_kernel": int(h1.shape[2])}
    md["base_chunk_size"] = int(out["voc.head2.weight"].shape[0])


def layer_norm_eps(graph: Graph) -> float:
    ln = next((n for n in graph.nodes if n.op_type == "LayerNormalization"), None)
    if ln is None:
        raise ConversionError(f"{graph.path.name}: no LayerNormalization node")
    return float(graph.attr(ln, "epsilon", 1e-5))


def detect_version(tts: dict, has_cfg: bool) -> str:
    v = str(tts.get("tts_version", ""))
    m = re.match(r"v?1\.(\d+)", v)
    minor = int(m.group(1)) if m else None
    version = {5: "v1", 6: "v2", 7: "v3"}.get(minor)
    if version is None:
        version = "v3" if has_cfg else "v2"
        print(f"warning: unknown tts_version '{v}', detected {version} from the graphs", file=sys.stderr)
    if (version == "v3") != has_cfg:
        raise ConversionError(f"tts_version {v} says {version} but the vector estimator {'has' if has_cfg else 'has no'} guidance")
    return version


def find_file(bundle: Path, *candidates: str) -> Path:
    for c in candidates:
        if (bundle / c).is_file():
            return bundle / c
    raise ConversionError(f"{bundle}: none of {', '.join(candidates)} exists")


def load_voices(bundle: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    voices = {}
    for path in sorted((bundle / "voice_styles").glob("*.json")):
        d = json.loads(path.read_text())
        ttl = np.asarray(d["style_ttl"]["data"], dtype=np.float32).reshape(d["style_ttl"]["dims"])
        dp = np.asarray(d["style_dp"]["data"], dtype=np.float32).reshape(d["style_dp"]["dims"])
        voices[path.stem] = (ttl[0], dp[0])
    if not voices:
        raise ConversionError(f"{bundle}/voice_styles holds no voice JSON")
    return voices


def convert(bundle: Path, out_path: Path, weights: str, keep_f32: list[str]) -> dict:
    tts = json.loads(find_file(bundle, "onnx/tts.json", "tts.json").read_text())
    indexer = np.asarray(json.loads(find_file(bundle, "onnx/unicode_indexer.json", "unicode_indexer.json").read_text()), dtype=np.int32)
    if indexer.shape != (65536,):
        raise ConversionError(f"unicode_indexer.json has {indexer.size} entries, expected 65536")
    graphs = {n: Graph(bundle / "onnx" / f"{n}.onnx") for n in ("duration_predictor", "text_encoder", "vector_estimator", "vocoder")}
    md: dict = {}
    tensors: dict[str, np.ndarray] = {}
    convert_duration(graphs["duration_predictor"], md, tensors)
    convert_text_encoder(graphs["text_encoder"], md, tensors)
    convert_vector_estimator(graphs["vector_estimator"], md, tensors)
    convert_vocoder(graphs["vocoder"], md, tensors)
    # Head counts the graphs keep only in Reshape constants.
    md["dp.attn"]["heads"] = reshape_heads_relative(graphs["duration_predictor"], md["dp.char_dim"])
    md["te.attn"]["heads"] = reshape_heads_relative(graphs["text_encoder"], md["te.char_dim"])
    version = detect_version(tts, md["ve"]["cfg"] is not None)

    voices = load_voices(bundle)
    for name, (ttl, dp) in voices.items():
        if ttl.shape != (md["style_tokens"], md["style_dim"]):
            raise ConversionError(f"voice {name}: style_ttl {ttl.shape} does not fit the model")
        tensors[f"voice.{name}.style_ttl"] = ttl
        tensors[f"voice.{name}.style_dp"] = dp
    dp_tokens, dp_dim = next(iter(voices.values()))[1].shape
    tensors["text.indexer"] = indexer
    vocab = int(indexer.max()) + 1
    for key in ("dp.char_emb", "te.char_emb"):
        if tensors[key].shape[0] < vocab:
            raise ConversionError(f"{key} has {tensors[key].shape[0]} rows but the indexer uses {vocab}")

    w = gguf.GGUFWriter(str(out_path), ARCH)
    w.add_name(f"Supertonic {version}")
    k = lambda s: f"{ARCH}.{s}"
    w.add_string(k("version"), version)
    w.add_string(k("tts_version"), str(tts.get("tts_version", "")))
    w.add_uint32(k("sample_rate"), int(tts["ae"]["sample_rate"]))
    w.add_uint32(k("base_chunk_size"), md["base_chunk_size"])
    w.add_uint32(k("chunk_compress_factor"), int(tts["ttl"]["chunk_compress_factor"]))
    w.add_uint32(k("latent_dim"), int(tts["ttl"]["latent_dim"]))
    w.add_float32(k("normalizer_scale"), float(tts["ttl"]["normalizer"]["scale"]))
    w.add_float32(k("layer_norm_eps"), layer_norm_eps(graphs["text_encoder"]))
    w.add_float32(k("batch_norm_eps"), md["batch_norm_eps"])
    w.add_uint32(k("default_steps"), DEFAULT_STEPS[version])
    w.add_uint32(k("style_tokens"), md["style_tokens"])
    w.add_uint32(k("style_dim"), md["style_dim"])
    w.add_string(k("text.language_wrap"), "none" if version == "v1" else "open_close")
    w.add_array(k("text.languages"), LANGUAGES[version])
    w.add_string(k("text.default_language"), DEFAULT_LANGUAGE[version])
    w.add_uint32(k("text.chunk_chars"), 300)
    w.add_uint32(k("text.short_chunk_chars"), 120)
    # A comma-separated string: GGUF writers drop empty arrays (v1 has none).
    w.add_string(k("text.short_chunk_languages"), ",".join(SHORT_CHUNK_LANGUAGES[version]))

    def convnext(prefix, hp):
        w.add_uint32(k(f"{prefix}.kernel"), hp["kernel"])
        w.add_uint32(k(f"{prefix}.inner"), hp["inner"])
        w.add_array(k(f"{prefix}.dilations"), [int(d) for d in hp["dilations"]])

    def attn(prefix, hp):
        for key in ("layers", "heads", "filter", "window"):
            w.add_uint32(k(f"{prefix}.{key}"), int(hp[key]))

    def cross(prefix, hp):
        w.add_uint32(k(f"{prefix}.heads"), int(hp["heads"]))
        w.add_uint32(k(f"{prefix}.units"), int(hp["units"]))
        w.add_float32(k(f"{prefix}.scale"), float(hp["scale"]))

    w.add_uint32(k("dp.char_dim"), md["dp.char_dim"])
    convnext("dp.convnext", md["dp.convnext"])
    attn("dp.attn", md["dp.attn"])
    w.add_uint32(k("dp.style_tokens"), int(dp_tokens))
    w.add_uint32(k("dp.style_dim"), int(dp_dim))
    w.add_uint32(k("dp.predictor_hidden"), md["dp.predictor_hidden"])
    w.add_uint32(k("te.char_dim"), md["te.char_dim"])
    convnext("te.convnext", md["te.convnext"])
    attn("te.attn", md["te.attn"])
    cross("te.spte", md["te.spte"])
    ve = md["ve"]
    for key in ("hidden", "time_dim", "time_hidden", "blocks"):
        w.add_uint32(k(f"ve.{key}"), int(ve[key]))
    w.add_float32(k("ve.time_scale"), ve["time_scale"])
    for key in ("convnext0", "convnext1", "convnext2", "last_convnext"):
        convnext(f"ve.{key}", ve[key])
    cross("ve.text_attn", ve["text_attn"])
    cross("ve.style_attn", ve["style_attn"])
    w.add_bool(k("ve.cfg"), ve["cfg"] is not None)
    if ve["cfg"] is not None:
        w.add_float32(k("ve.cfg_cond_scale"), float(ve["cfg"][0]))
        w.add_float32(k("ve.cfg_uncond_scale"), float(ve["cfg"][1]))
    voc = md["voc"]
    for key in ("hidden", "kernel_init", "head_hidden", "head_kernel"):
        w.add_uint32(k(f"voc.{key}"), int(voc[key]))
    convnext("voc.convnext", voc["convnext"])
    w.add_string(k("weights"), weights)

    quantized = 0
    for name in sorted(tensors):
        value = tensors[name]
        if name == "text.indexer":
            # I16 when the rows fit (every official vocabulary does): half the size.
            w.add_tensor(name, value.astype(np.int16 if value.max() < 32768 else np.int32))
            continue
        value = np.ascontiguousarray(value, dtype=np.float32)
        kind = weights if value.ndim == 2 and not any(fnmatch.fnmatch(name, p) for p in keep_f32) else "f32"
        if kind == "f16":
            w.add_tensor(name, value.astype(np.float16))
            quantized += 1
        elif kind in ("q8_0", "bf16") and value.shape[-1] % 32 == 0:
            qtype = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "bf16": gguf.GGMLQuantizationType.BF16}[kind]
            w.add_tensor(name, gguf.quants.quantize(value, qtype), raw_dtype=qtype)
            quantized += 1
        else:
            w.add_tensor(name, value)
    write_atomically(w, out_path)
    return {"version": version, "tensors": len(tensors), "converted": quantized, "voices": sorted(voices)}


def reshape_heads_relative(graph: Graph, channels: int) -> int:
    """Head count of a relative-attention encoder: its `[B, heads, head_dim, T]`
    view of the projected queries."""
    for n in graph.nodes:
        if n.op_type == "Reshape" and "attn_layers.0" in n.name:
            shape = graph.values.get(n.input[1])
            if shape is not None and shape.size == 4 and shape[1] > 0 and shape[2] > 0 and shape[1] * shape[2] == channels:
                return int(shape[1])
    raise ConversionError(f"{graph.path.name}: no head split found in the attention encoder")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--weights", choices=("f32", "f16", "bf16", "q8_0"), default="f32",
                    help="storage of the large matmul weights (default f32)")
    ap.add_argument("--keep-f32", action="append", default=[], metavar="GLOB",
                    help="GGUF tensor names (glob) kept F32 in addition to the built-in deny-list")
    args = ap.parse_args(argv)
    try:
        info = convert(args.bundle, args.out, args.weights, DEFAULT_KEEP_F32 + args.keep_f32)
    except Exception as e:  # one line for the user, whatever failed
        msg = f"missing tensor or key {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}" if not isinstance(e, ConversionError) else str(e)
        print(f"convert.py: {args.bundle}: {msg}", file=sys.stderr)
        return 1
    stored = f", {info['converted']} stored {args.weights}" if args.weights != "f32" else ""
    print(f"{args.out}: Supertonic {info['version']}, {info['tensors']} tensors{stored}, voices {', '.join(info['voices'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
