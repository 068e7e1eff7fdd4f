#!/usr/bin/env python3
"""Write a random-weight Supertonic bundle in the official ONNX layout.

    python tools/supertonic/make_bundle.py --config tiny-v2 --seed 0 --out DIR

Produces
  DIR/onnx/{duration_predictor,text_encoder,vector_estimator,vocoder}.onnx
  DIR/onnx/tts.json, DIR/onnx/unicode_indexer.json
  DIR/voice_styles/{F1,M1}.json
  DIR/params.npz              every parameter under its module name (used by reference.py)
  DIR/initializer_map.json    ONNX initializer name -> params.npz name (+ how it was derived)

The graphs imitate a TorchScript-exporter export (opset 19, IR 9, producer
"pytorch" 2.8.0): anonymous onnx::MatMul_<n> weights ([in,out]) followed by an
Add with the named bias, exporter-style node names, folded constants, Pad(edge)
before depthwise Conv, decomposed erf-GELU, Softplus/Tanh/Mul Mish,
LayerNormalization over the last axis after a Transpose.

Parameter layouts in params.npz (see also README in this folder):
  * Linear layers exported as MatMul: "<module>.weight" is [in, out] (y = x @ W + b).
  * Linear layers exported as Gemm (DP predictor, VE time MLP): torch layout [out, in].
  * Conv weights: [out, in/group, k].
"""
import argparse
import json
import math
import os
import sys
from collections import OrderedDict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from configs import build_indexer, get_config, time_frequencies, vocab_size  # noqa: E402

F32 = np.float32
I64 = np.int64

# module prefixes
DP = "tts.dp."
DPS = "tts.dp.sentence_encoder."
TE = "tts.ttl.text_encoder."
SPTE = "tts.ttl.speech_prompted_text_encoder."
STYLE_KEY = "tts.ttl.style_encoder.style_token_layer.style_key"
VF = "tts.ttl.vector_field."
UNC = "tts.ttl.uncond_masker."
AE = "tts.ae."
DEC = "tts.ae.decoder."


# ---------------------------------------------------------------------------
# parameters

class ParamGen:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.p = OrderedDict()

    def add(self, name, arr):
        assert name not in self.p, name
        self.p[name] = np.ascontiguousarray(arr)

    def normal(self, shape, std=1.0, mean=0.0):
        return (mean + std * self.rng.standard_normal(shape)).astype(F32)

    def uniform(self, shape, lo, hi):
        return self.rng.uniform(lo, hi, shape).astype(F32)

    def bias(self, name, n):
        self.add(name, self.normal((n,), 0.1))

    def linear_mm(self, pre, nin, nout):  # MatMul weight [in,out]
        self.add(pre + "weight", self.normal((nin, nout), 1.0 / math.sqrt(nin)))
        self.bias(pre + "bias", nout)

    def linear_gemm(self, pre, nin, nout, bias=True):  # torch layout [out,in]
        self.add(pre + "weight", self.normal((nout, nin), 1.0 / math.sqrt(nin)))
        if bias:
            self.bias(pre + "bias", nout)

    def conv(self, pre, cout, cin, k, bias=True, wname="weight"):
        self.add(pre + wname, self.normal((cout, cin, k), 1.0 / math.sqrt(cin * k)))
        if bias:
            self.bias(pre + "bias", cout)

    def ln(self, pre, c):
        self.add(pre + "weight", self.normal((c,), 0.1, 1.0))
        self.add(pre + "bias", self.normal((c,), 0.1))

    def convnext(self, pre, c, ci, k, dw="dwconv."):
        self.conv(pre + dw, c, 1, k)
        self.ln(pre + "norm.norm.", c)
        self.conv(pre + "pwconv1.", ci, c, 1)
        self.conv(pre + "pwconv2.", c, ci, 1)
        self.add(pre + "gamma", self.uniform((1, c, 1), 0.1, 0.5))

    def attn_encoder(self, pre, c, heads, filt, layers, window):
        hd = c // heads
        for i in range(layers):
            a = f"{pre}attn_layers.{i}."
            for n in ("conv_q.", "conv_k.", "conv_v.", "conv_o."):
                self.conv(a + n, c, c, 1)
            self.add(a + "emb_rel_k", self.normal((1, 2 * window + 1, hd), 1.0 / math.sqrt(hd)))
            self.add(a + "emb_rel_v", self.normal((1, 2 * window + 1, hd), 1.0 / math.sqrt(hd)))
            self.ln(f"{pre}norm_layers_1.{i}.norm.", c)
            self.conv(f"{pre}ffn_layers.{i}.conv_1.", filt, c, 1)
            self.conv(f"{pre}ffn_layers.{i}.conv_2.", c, filt, 1)
            self.ln(f"{pre}norm_layers_2.{i}.norm.", c)

    def attention(self, pre, q_in, kv_in, units, out_dim, key=True):
        self.linear_mm(pre + "W_query.linear.", q_in, units)
        if key:
            self.linear_mm(pre + "W_key.linear.", kv_in, units)
        self.linear_mm(pre + "W_value.linear.", kv_in, units)
        self.linear_mm(pre + "out_fc.linear.", units, out_dim)


def make_params(cfg, seed):
    g = ParamGen(seed)
    V = vocab_size(cfg)
    S, SD = cfg["n_style"], cfg["style_dim"]
    W = cfg["rel_window"]
    # ---- duration predictor
    d = cfg["dp"]
    C = d["char_dim"]
    g.add(DPS + "text_embedder.char_embedder.weight", g.normal((V, C)))
    g.add(DPS + "sentence_token", g.normal((1, C, 1)))
    for i, _ in enumerate(d["dilations"]):
        g.convnext(f"{DPS}convnext.convnext.{i}.", C, d["inner"], d["k"])
    g.attn_encoder(DPS + "attn_encoder.", C, d["attn_heads"], d["attn_filter"], d["attn_layers"], W)
    g.conv(DPS + "proj_out.net.", C, C, 1, bias=False)
    nin = C + cfg["dp_n_style"] * cfg["dp_style_dim"]
    g.linear_gemm(DP + "predictor.layers.0.", nin, d["hidden"])
    g.add(DP + "predictor.activation.weight", g.uniform((1,), 0.1, 0.3))
    # A benchmark's bundle asks for a duration (`--duration-s`): the text then
    # moves the prediction by a few percent instead of tens of percent.
    g.add(DP + "predictor.layers.1.weight", g.normal((1, d["hidden"]), 0.002 if d.get("duration_fixed") else 0.02))
    g.add(DP + "predictor.layers.1.bias", np.array([math.log(d["duration_s"])], F32))
    # ---- text encoder
    t = cfg["te"]
    C = t["char_dim"]
    g.add(TE + "text_embedder.char_embedder.weight", g.normal((V, C)))
    for i, _ in enumerate(t["dilations"]):
        g.convnext(f"{TE}convnext.convnext.{i}.", C, t["inner"], t["k"])
    g.attn_encoder(TE + "attn_encoder.", C, t["attn_heads"], t["attn_filter"], t["attn_layers"], W)
    g.add(STYLE_KEY, g.normal((1, S, SD)))
    U = cfg["spte"]["units"]
    for a in ("attention1.", "attention2."):
        g.attention(SPTE + a, C, SD, U, C)
    g.ln(SPTE + "norm.norm.", C)
    # ---- vector estimator
    v = cfg["ve"]
    H, LC, TD = v["hidden"], cfg["latent_channels"], v["time_dim"]
    g.conv(VF + "proj_in.net.", H, LC, 1, bias=False)
    g.linear_gemm(VF + "time_encoder.mlp.0.linear.", TD, v["time_hidden"])
    g.linear_gemm(VF + "time_encoder.mlp.2.linear.", v["time_hidden"], TD)
    hd = v["text_units"] // v["text_heads"]
    for b in range(v["n_blocks"]):
        m = 6 * b
        for i, _ in enumerate(v["convnext_0"]):
            g.convnext(f"{VF}main_blocks.{m}.convnext.{i}.", H, v["inner"], v["k"])
        g.linear_mm(f"{VF}main_blocks.{m + 1}.linear.linear.", TD, H)
        for i, _ in enumerate(v["convnext_1"]):
            g.convnext(f"{VF}main_blocks.{m + 2}.convnext.{i}.", H, v["inner"], v["k"])
        g.attention(f"{VF}main_blocks.{m + 3}.attn.", H, C, v["text_units"], H)
        if b == 0:
            k = np.arange(hd // 2, dtype=np.float64)
            theta = cfg["rotary_scale"] * cfg["rotary_base"] ** (-2.0 * k / hd)
            g.add(f"{VF}main_blocks.3.attn.theta", theta.reshape(1, 1, hd // 2).astype(F32))
            g.add(f"{VF}main_blocks.3.attn.increments",
                  np.arange(cfg["rope_max_positions"], dtype=I64).reshape(1, -1, 1))
        g.ln(f"{VF}main_blocks.{m + 3}.norm.norm.", H)
        for i, _ in enumerate(v["convnext_2"]):
            g.convnext(f"{VF}main_blocks.{m + 4}.convnext.{i}.", H, v["inner"], v["k"])
        g.attention(f"{VF}main_blocks.{m + 5}.attn.", H, SD, v["style_units"], H)
        g.ln(f"{VF}main_blocks.{m + 5}.norm.norm.", H)
    for i, _ in enumerate(v["last_convnext"]):
        g.convnext(f"{VF}last_convnext.convnext.{i}.", H, v["inner"], v["k"])
    g.conv(VF + "proj_out.net.", LC, H, 1, bias=False)
    if v["cfg"]:
        g.add(UNC + "text_special_token", g.normal((1, C, 1)))
        g.add(UNC + "style_key_special_token", g.normal((1, S, SD)))
        g.add(UNC + "style_value_special_token", g.normal((1, S, SD)))
    # ---- vocoder
    o = cfg["voc"]
    LD, VH = cfg["latent_dim"], o["hidden"]
    g.add(AE + "latent_mean", g.normal((1, LD, 1), 0.1))
    g.add(AE + "latent_std", g.uniform((1, LD, 1), 0.5, 1.5))
    g.conv(DEC + "embed.", VH, LD, o["k_init"])
    for i, _ in enumerate(o["dilations"]):
        g.convnext(f"{DEC}convnext.{i}.", VH, o["inner"], o["k"], dw="dwconv.net.")
    fn = DEC + "final_norm.norm."
    g.add(fn + "weight", g.normal((VH,), 0.1, 1.0))
    g.add(fn + "bias", g.normal((VH,), 0.1))
    g.add(fn + "running_mean", g.normal((VH,), 0.1))
    g.add(fn + "running_var", g.uniform((VH,), 0.5, 1.5))
    g.conv(DEC + "head.layer1.net.", o["head_hidden"], VH, o["head_k"])
    g.add(DEC + "head.activation.weight", g.uniform((1,), 0.1, 0.3))
    g.conv(DEC + "head.layer2.", o["head_out"], o["head_hidden"], 1, bias=False)
    # Keep the waveform in the audio range ([-1, 1]) as a trained vocoder does, so
    # WAV output (16-bit) is not clipped.
    g.p[DEC + "head.layer2.weight"] *= F32(0.01)
    return g.p


def make_voice(cfg, seed, name):
    rng = np.random.default_rng([seed, 1000 + sum(map(ord, name))])
    ttl = (0.0625 * rng.standard_normal((1, cfg["n_style"], cfg["style_dim"]))).astype(F32)
    dp = (0.25 * rng.standard_normal((1, cfg["dp_n_style"], cfg["dp_style_dim"]))).astype(F32)
    return {
        "style_ttl": {"dims": list(ttl.shape), "type": "float32", "data": ttl.tolist()},
        "style_dp": {"dims": list(dp.shape), "type": "float32", "data": dp.tolist()},
        "metadata": {"source_file": f"{name}.wav", "source_sample_rate": cfg["sample_rate"],
                     "target_sample_rate": cfg["sample_rate"],
                     "extracted_at": "1970-01-01T00:00:00.000000",
                     "generator": f"random style (make_bundle.py, config {cfg['name']}, seed {seed})"},
    }


# ---------------------------------------------------------------------------
# ONNX graph builder

class GB:
    def __init__(self, cfg, params, root, anon_start=0):
        import onnx  # noqa: F401
        self.cfg, self.P, self.root = cfg, params, root
        self.nodes, self.inits, self.init_names = [], [], set()
        self.counts = {}
        self.anon_ctr = anon_start
        self.map = OrderedDict()

    # -- bookkeeping
    def _uniq(self, base):
        while True:
            n = self.counts.get(base, 0)
            self.counts[base] = n + 1
            nm = base if n == 0 else f"{base}_{n}"
            if nm + "_output_0" not in self.init_names:
                return nm

    def op(self, op, inputs, scope, out=None, n_out=1, **attrs):
        from onnx import helper
        nm = self._uniq(f"{self.root}{scope}/{op}")
        outs = [out] if out else [f"{nm}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=nm, **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, value, scope, dtype=None):
        from onnx import helper, numpy_helper
        arr = np.asarray(value, dtype=dtype)
        if arr.dtype == np.float64:
            arr = arr.astype(F32)
        nm = self._uniq(f"{self.root}{scope}/Constant")
        outn = nm + "_output_0"
        self.nodes.append(helper.make_node("Constant", [], [outn], name=nm,
                                           value=numpy_helper.from_array(arr)))
        return outn

    def i64(self, vals, scope):
        return self.const(np.array(vals, dtype=I64), scope)

    def _add_init(self, name, arr, param, how):
        from onnx import numpy_helper
        if name in self.init_names:
            return name
        self.init_names.add(name)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        self.map[name] = {"param": param, "how": how, "shape": list(arr.shape)}
        return name

    def init(self, pname):
        return self._add_init(pname, self.P[pname], pname, "same")

    def anon(self, kind, pname, arr=None, how="same"):
        name = f"onnx::{kind}_{self.anon_ctr}"
        self.anon_ctr += 1
        return self._add_init(name, self.P[pname] if arr is None else arr, pname, how)

    def special(self, name, arr, param, how):
        return self._add_init(name, arr, param, how)

    # -- elementary blocks
    def shape_dim(self, x, axis, scope):
        return self.op("Shape", [x], scope, start=axis, end=axis + 1)

    def conv(self, x, w, b, scope, dil=1, group=1):
        k = self.P_shape(w)[2]
        ins = [x, w] + ([b] if b else [])
        return self.op("Conv", ins, scope, dilations=[dil], group=group, kernel_shape=[k],
                       pads=[0, 0], strides=[1])

    def P_shape(self, init_name):
        for t in reversed(self.inits):
            if t.name == init_name:
                return list(t.dims)
        raise KeyError(init_name)

    def pad_edge(self, x, left, right, scope):
        if left == 0 and right == 0:
            return x
        pads = self.i64([0, 0, left, 0, 0, right], scope)
        return self.op("Pad", [x, pads], scope, mode="edge")

    def ln_channel(self, x, pre, scope):
        h = self.op("Transpose", [x], scope, perm=[0, 2, 1])
        h = self.op("LayerNormalization", [h, self.init(pre + "weight"), self.init(pre + "bias")],
                    scope, axis=-1, epsilon=self.cfg["ln_eps"])
        return self.op("Transpose", [h], scope, perm=[0, 2, 1])

    def ln_last(self, x, pre, scope):
        return self.op("LayerNormalization", [x, self.init(pre + "weight"), self.init(pre + "bias")],
                       scope, axis=-1, epsilon=self.cfg["ln_eps"])

    def gelu(self, x, scope):
        h = self.op("Div", [x, self.const(np.float32(math.sqrt(2.0)), scope)], scope)
        h = self.op("Erf", [h], scope)
        h = self.op("Add", [h, self.const(np.float32(1.0), scope)], scope)
        h = self.op("Mul", [x, h], scope)
        return self.op("Mul", [h, self.const(np.float32(0.5), scope)], scope)

    def mish(self, x, scope):
        h = self.op("Softplus", [x], scope)
        h = self.op("Tanh", [h], scope)
        return self.op("Mul", [x, h], scope)

    def linear(self, x, pre, scope):
        """MatMul with anonymous [in,out] weight + Add(named bias)."""
        mm = self.op("MatMul", [x, self.anon("MatMul", pre + "weight")], scope)
        return self.op("Add", [self.init(pre + "bias"), mm], scope)

    def gemm(self, x, pre, scope):
        return self.op("Gemm", [x, self.init(pre + "weight"), self.init(pre + "bias")], scope,
                       alpha=1.0, beta=1.0, transB=1)

    def convnext(self, x, mask, pre, scope, k, dil, causal, dw="dwconv."):
        c = self.P[pre + dw + "weight"].shape[0]
        xm = self.op("Mul", [x, mask], scope) if mask else x
        tot = dil * (k - 1)
        left = tot if causal else tot // 2
        h = self.pad_edge(xm, left, tot - left, scope + "/" + dw.rstrip(".").replace(".", "/"))
        h = self.conv(h, self.init(pre + dw + "weight"), self.init(pre + dw + "bias"),
                      scope + "/" + dw.rstrip(".").replace(".", "/"), dil=dil, group=c)
        if mask:
            h = self.op("Mul", [h, mask], scope)
        h = self.ln_channel(h, pre + "norm.norm.", scope + "/norm")
        h = self.conv(h, self.init(pre + "pwconv1.weight"), self.init(pre + "pwconv1.bias"),
                      scope + "/pwconv1")
        h = self.gelu(h, scope + "/act")
        h = self.conv(h, self.init(pre + "pwconv2.weight"), self.init(pre + "pwconv2.bias"),
                      scope + "/pwconv2")
        h = self.op("Mul", [self.init(pre + "gamma"), h], scope)
        out = self.op("Add", [xm, h], scope)
        if mask:
            out = self.op("Mul", [out, mask], scope)
        return out

    def convnext_stack(self, x, mask, pre, scope, k, dils, causal=False, dw="dwconv."):
        for i, d in enumerate(dils):
            x = self.convnext(x, mask, f"{pre}{i}.", f"{scope}.{i}", k, d, causal, dw)
        return x

    # -- VITS relative-position self attention
    def _rel_emb(self, emb, T1, scope):
        W = self.cfg["rel_window"]
        z = self.i64([0], scope)
        pads = self.op("Concat", [z, T1, z, z, T1, z], scope, axis=0)
        e = self.op("Pad", [emb, pads], scope, mode="constant")
        two_t = self.op("Mul", [T1, self.i64([2], scope)], scope)
        end = self.op("Add", [two_t, self.i64([W], scope)], scope)
        return self.op("Slice", [e, self.i64([W + 1], scope), end, self.i64([1], scope)], scope)

    def _rel_to_abs(self, x, T1, scope):
        x = self.op("Pad", [x, self.i64([0, 0, 0, 0, 0, 0, 0, 1], scope)], scope, mode="constant")
        x = self.op("Reshape", [x, self.i64([0, 0, -1], scope)], scope)
        tm1 = self.op("Sub", [T1, self.i64([1], scope)], scope)
        pads = self.op("Concat", [self.i64([0, 0, 0, 0, 0], scope), tm1], scope, axis=0)
        x = self.op("Pad", [x, pads], scope, mode="constant")
        tp1 = self.op("Add", [T1, self.i64([1], scope)], scope)
        two_tm1 = self.op("Sub", [self.op("Mul", [T1, self.i64([2], scope)], scope),
                                  self.i64([1], scope)], scope)
        shp = self.op("Concat", [self.i64([0, 0], scope), tp1, two_tm1], scope, axis=0)
        x = self.op("Reshape", [x, shp], scope)
        starts = self.op("Concat", [self.i64([0], scope), tm1], scope, axis=0)
        ends = self.op("Concat", [T1, two_tm1], scope, axis=0)
        return self.op("Slice", [x, starts, ends, self.i64([2, 3], scope)], scope)

    def _abs_to_rel(self, x, T1, scope):
        tm1 = self.op("Sub", [T1, self.i64([1], scope)], scope)
        pads = self.op("Concat", [self.i64([0, 0, 0, 0, 0, 0, 0], scope), tm1], scope, axis=0)
        x = self.op("Pad", [x, pads], scope, mode="constant")
        x = self.op("Reshape", [x, self.i64([0, 0, -1], scope)], scope)
        pads = self.op("Concat", [self.i64([0, 0], scope), T1, self.i64([0, 0, 0], scope)],
                       scope, axis=0)
        x = self.op("Pad", [x, pads], scope, mode="constant")
        two_t = self.op("Mul", [T1, self.i64([2], scope)], scope)
        shp = self.op("Concat", [self.i64([0, 0], scope), T1, two_t], scope, axis=0)
        x = self.op("Reshape", [x, shp], scope)
        return self.op("Slice", [x, self.i64([1], scope), self.i64([2 ** 62], scope),
                                 self.i64([3], scope)], scope)

    def rel_attn(self, x, mask, pre, scope, heads):
        c = self.P[pre + "conv_q.weight"].shape[0]
        hd = c // heads

        def proj(n):
            return self.conv(x, self.init(pre + n + ".weight"), self.init(pre + n + ".bias"),
                             f"{scope}/{n}")

        def split(t):
            t = self.op("Reshape", [t, self.i64([0, heads, hd, -1], scope)], scope)
            return self.op("Transpose", [t], scope, perm=[0, 1, 3, 2])

        q, k, v = split(proj("conv_q")), split(proj("conv_k")), split(proj("conv_v"))
        T1 = self.shape_dim(x, 2, scope)
        qs = self.op("Div", [q, self.const(np.float32(math.sqrt(hd)), scope)], scope)
        kt = self.op("Transpose", [k], scope, perm=[0, 1, 3, 2])
        scores = self.op("MatMul", [qs, kt], scope)
        relk = self._rel_emb(self.init(pre + "emb_rel_k"), T1, scope)
        relk = self.op("Unsqueeze", [relk, self.i64([0], scope)], scope)
        relk = self.op("Transpose", [relk], scope, perm=[0, 1, 3, 2])
        rl = self.op("MatMul", [qs, relk], scope)
        scores = self.op("Add", [scores, self._rel_to_abs(rl, T1, scope)], scope)
        am = self.op("Mul", [self.op("Unsqueeze", [mask, self.i64([2], scope)], scope),
                             self.op("Unsqueeze", [mask, self.i64([3], scope)], scope)], scope)
        cond = self.op("Equal", [am, self.const(np.float32(0.0), scope)], scope)
        scores = self.op("Where", [cond, self.const(np.float32(-1e4), scope), scores], scope)
        p = self.op("Softmax", [scores], scope, axis=-1)
        out = self.op("MatMul", [p, v], scope)
        rw = self._abs_to_rel(p, T1, scope)
        relv = self._rel_emb(self.init(pre + "emb_rel_v"), T1, scope)
        relv = self.op("Unsqueeze", [relv, self.i64([0], scope)], scope)
        out = self.op("Add", [out, self.op("MatMul", [rw, relv], scope)], scope)
        out = self.op("Transpose", [out], scope, perm=[0, 1, 3, 2])
        out = self.op("Reshape", [out, self.i64([0, c, -1], scope)], scope)
        return self.conv(out, self.init(pre + "conv_o.weight"), self.init(pre + "conv_o.bias"),
                         f"{scope}/conv_o")

    def attn_encoder(self, x, mask, pre, scope, heads, layers):
        x = self.op("Mul", [x, mask], scope)
        for i in range(layers):
            y = self.rel_attn(x, mask, f"{pre}attn_layers.{i}.", f"{scope}/attn_layers.{i}", heads)
            x = self.ln_channel(self.op("Add", [x, y], scope), f"{pre}norm_layers_1.{i}.norm.",
                                f"{scope}/norm_layers_1.{i}")
            f = f"{pre}ffn_layers.{i}."
            fs = f"{scope}/ffn_layers.{i}"
            h = self.op("Mul", [x, mask], fs)
            h = self.conv(h, self.init(f + "conv_1.weight"), self.init(f + "conv_1.bias"), fs + "/conv_1")
            h = self.op("Relu", [h], fs)
            h = self.op("Mul", [h, mask], fs)
            h = self.conv(h, self.init(f + "conv_2.weight"), self.init(f + "conv_2.bias"), fs + "/conv_2")
            h = self.op("Mul", [h, mask], fs)
            x = self.ln_channel(self.op("Add", [x, h], scope), f"{pre}norm_layers_2.{i}.norm.",
                                f"{scope}/norm_layers_2.{i}")
        return self.op("Mul", [x, mask], scope)

    # -- style / tanh-key attention (heads stacked on axis 0)
    def tanh_keys(self, proto, pre, scope, heads):
        """proto [Bk,S,D] -> tanh(proto W_k + b) as [H,Bk,hd,S]."""
        k = self.linear(proto, pre + "W_key.linear.", scope + "/W_key/linear")
        k = self.op("Tanh", [k], scope + "/tanh")
        units = self.P[pre + "W_key.linear.weight"].shape[1]
        k = self.op("Reshape", [k, self.i64([0, 0, heads, units // heads], scope)], scope)
        return self.op("Transpose", [k], scope, perm=[2, 0, 3, 1])

    def style_attn(self, q_in, kT, v_in, pre, scope, heads, scale):
        units = self.P[pre + "W_query.linear.weight"].shape[1]
        hd = units // heads
        q = self.linear(q_in, pre + "W_query.linear.", scope + "/W_query/linear")
        q = self.op("Reshape", [q, self.i64([0, 0, heads, hd], scope)], scope)
        q = self.op("Transpose", [q], scope, perm=[2, 0, 1, 3])
        v = self.linear(v_in, pre + "W_value.linear.", scope + "/W_value/linear")
        v = self.op("Reshape", [v, self.i64([0, 0, heads, hd], scope)], scope)
        v = self.op("Transpose", [v], scope, perm=[2, 0, 1, 3])
        s = self.op("MatMul", [q, kT], scope)
        s = self.op("Div", [s, self.const(np.float32(scale), scope)], scope)
        p = self.op("Softmax", [s], scope, axis=-1)
        o = self.op("MatMul", [p, v], scope)
        o = self.op("Transpose", [o], scope, perm=[1, 2, 0, 3])
        o = self.op("Reshape", [o, self.i64([0, 0, units], scope)], scope)
        return self.linear(o, pre + "out_fc.linear.", scope + "/out_fc/linear")

    # -- model assembly
    def model(self, inputs, outputs, graph_name):
        import onnx
        from onnx import helper
        graph = helper.make_graph(self.nodes, graph_name, inputs, outputs, self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)],
                              producer_name="pytorch", producer_version="2.8.0")
        m.ir_version = 9
        onnx.checker.check_model(m)
        return m


def _vi(name, elem, dims):
    from onnx import helper
    return helper.make_tensor_value_info(name, elem, dims)


# ---------------------------------------------------------------------------
# graphs

def build_dp(cfg, P):
    from onnx import TensorProto as TP
    g = GB(cfg, P, "")
    d = cfg["dp"]
    C = d["char_dim"]
    s = "/sentence_encoder"
    emb = g.op("Gather", [g.init(DPS + "text_embedder.char_embedder.weight"), "text_ids"],
               s + "/text_embedder/char_embedder", axis=0)
    x = g.op("Transpose", [emb], s + "/text_embedder", perm=[0, 2, 1])
    x = g.op("Mul", [x, "text_mask"], s + "/text_embedder")
    B1 = g.shape_dim("text_ids", 0, s)
    tok_shape = g.op("Concat", [B1, g.i64([C, 1], s)], s, axis=0)
    tok = g.op("Expand", [g.init(DPS + "sentence_token"), tok_shape], s)
    x = g.op("Concat", [tok, x], s, axis=2)
    ones = g.op("Expand", [g.const(np.ones((1, 1, 1), F32), s),
                           g.op("Concat", [B1, g.i64([1, 1], s)], s, axis=0)], s)
    mask = g.op("Concat", [ones, "text_mask"], s, axis=2)
    xc = g.convnext_stack(x, mask, DPS + "convnext.convnext.", s + "/convnext/convnext",
                          d["k"], d["dilations"])
    xa = g.attn_encoder(xc, mask, DPS + "attn_encoder.", s + "/attn_encoder", d["attn_heads"],
                        d["attn_layers"])
    h = g.op("Add", [xc, xa], s)
    h = g.conv(h, g.init(DPS + "proj_out.net.weight"), None, s + "/proj_out/net")
    h = g.op("Mul", [h, mask], s + "/proj_out")
    sent = g.op("Gather", [h, g.const(np.array(0, I64), s)], s, axis=2)   # [B,C]
    sty = g.op("Reshape", ["style_dp", g.i64([0, -1], "/predictor")], "/predictor")
    z = g.op("Concat", [sent, sty], "/predictor", axis=1)
    z = g.gemm(z, DP + "predictor.layers.0.", "/predictor/layers.0")
    z = g.op("PRelu", [z, g.init(DP + "predictor.activation.weight")], "/predictor/activation")
    z = g.gemm(z, DP + "predictor.layers.1.", "/predictor/layers.1")
    z = g.op("Exp", [z], "/predictor")
    g.op("Squeeze", [z, g.i64([1], "/predictor")], "/predictor", out="duration")
    return g.model(
        [_vi("text_ids", TP.INT64, ["batch_size", "text_length"]),
         _vi("style_dp", TP.FLOAT, ["batch_size", cfg["dp_n_style"], cfg["dp_style_dim"]]),
         _vi("text_mask", TP.FLOAT, ["batch_size", 1, "text_length"])],
        [_vi("duration", TP.FLOAT, ["batch_size"])], "main_graph"), g.map


def _fold_keys(P, pre, heads):
    """tanh(style_key W_k + b) as [H,1,hd,S] (the v2 export's folded constant)."""
    k = np.tanh(P[STYLE_KEY][0] @ P[pre + "W_key.linear.weight"] + P[pre + "W_key.linear.bias"])
    S, U = k.shape
    return np.ascontiguousarray(k.reshape(S, heads, U // heads).transpose(1, 2, 0)[:, None]).astype(F32)


def build_te(cfg, P):
    from onnx import TensorProto as TP
    g = GB(cfg, P, "", cfg["anon"]["te"])
    t = cfg["te"]
    C = t["char_dim"]
    s = "/text_encoder"
    emb = g.op("Gather", [g.init(TE + "text_embedder.char_embedder.weight"), "text_ids"],
               s + "/text_embedder/char_embedder", axis=0)
    x = g.op("Transpose", [emb], s + "/text_embedder", perm=[0, 2, 1])
    x = g.op("Mul", [x, "text_mask"], s + "/text_embedder")
    xc = g.convnext_stack(x, "text_mask", TE + "convnext.convnext.", s + "/convnext/convnext",
                          t["k"], t["dilations"])
    xa = g.attn_encoder(xc, "text_mask", TE + "attn_encoder.", s + "/attn_encoder",
                        t["attn_heads"], t["attn_layers"])
    h = g.op("Add", [xc, xa], s)
    h = g.op("Mul", [h, "text_mask"], s + "/proj_out")
    sp = "/speech_prompted_text_encoder"
    heads = cfg["spte"]["heads"]
    q_in = g.op("Transpose", [h], sp, perm=[0, 2, 1])
    mask_t = g.op("Transpose", ["text_mask"], sp, perm=[0, 2, 1])
    scale = math.sqrt(cfg["style_dim"])
    cur = q_in
    for a in ("attention1", "attention2"):
        pre = f"{SPTE}{a}."
        if cfg["version"] == "v3":
            # live K subgraph; anonymous weights numbered Q,K,V,O
            o = _style_attn_qkvo(g, cur, g.init(STYLE_KEY), "style_ttl", pre, f"{sp}/{a}",
                                 heads, scale)
        else:
            kT = g.special(f"{sp}/{a}/tanh/Tanh_output_0", _fold_keys(P, pre, heads),
                           pre + "W_key.linear.weight",
                           f"tanh({STYLE_KEY}[0] @ W_key + b) reshaped [H,1,hd,S]")
            o = g.style_attn(cur, kT, "style_ttl", pre, f"{sp}/{a}", heads, scale)
        o = g.op("Mul", [o, mask_t], f"{sp}/{a}")
        cur = g.op("Add", [q_in, o], sp)
    h = g.ln_last(cur, SPTE + "norm.norm.", sp + "/norm")
    h = g.op("Transpose", [h], sp, perm=[0, 2, 1])
    g.op("Mul", [h, "text_mask"], sp, out="text_emb")
    return g.model(
        [_vi("text_ids", TP.INT64, ["batch_size", "text_length"]),
         _vi("style_ttl", TP.FLOAT, ["batch_size", cfg["n_style"], cfg["style_dim"]]),
         _vi("text_mask", TP.FLOAT, ["batch_size", 1, "text_length"])],
        [_vi("text_emb", TP.FLOAT, ["batch_size", C, "text_length"])], "main_graph"), g.map


def build_ve(cfg, P):
    from onnx import TensorProto as TP
    v = cfg["ve"]
    v3 = v["cfg"] is not None
    g = GB(cfg, P, "/vector_estimator", cfg["anon"]["ve"])
    C = cfg["te"]["char_dim"]
    LC, H, TD = cfg["latent_channels"], v["hidden"], v["time_dim"]
    x, te_in, sty, lm, tm = "noisy_latent", "text_emb", "style_ttl", "latent_mask", "text_mask"
    cs, ts = "current_step", "total_step"
    proto_name = "/vector_estimator/Expand_output_0" if v3 else "/Expand_output_0"
    proto = g.special(proto_name, P[STYLE_KEY], STYLE_KEY, "same (style-key prototype)")
    B1 = g.shape_dim(x, 0, "")
    if v3:
        # classifier-free guidance batch: [cond ; uncond]
        sshape = g.op("Shape", [sty], "")
        te_u = g.op("Mul", [g.init(UNC + "text_special_token"), tm], "/uncond_masker")
        sk_u = g.op("Expand", [g.init(UNC + "style_key_special_token"), sshape], "/uncond_masker")
        sv_u = g.op("Expand", [g.init(UNC + "style_value_special_token"), sshape], "/uncond_masker")
        pk_c = g.op("Expand", [proto, sshape], "")
        xin = g.op("Concat", [x, x], "", axis=0)
        te_in = g.op("Concat", [te_in, te_u], "", axis=0)
        sv = g.op("Concat", [sty, sv_u], "", axis=0)
        pk = g.op("Concat", [pk_c, sk_u], "", axis=0)
        lm2 = g.op("Concat", [lm, lm], "", axis=0)
        tm2 = g.op("Concat", [tm, tm], "", axis=0)
        cs2 = g.op("Concat", [cs, cs], "", axis=0)
        ts2 = g.op("Concat", [ts, ts], "", axis=0)
    else:
        xin, sv, pk, lm2, tm2, cs2, ts2 = x, sty, proto, lm, tm, cs, ts
    # time encoder
    tsc = "/time_encoder/sinusoidal"
    t = g.op("Div", [cs2, ts2], "")
    t = g.op("Unsqueeze", [t, g.i64([1], tsc)], tsc)
    t = g.op("Mul", [t, g.const(np.float32(1000.0), tsc)], tsc)
    freqs = np.array(time_frequencies(TD), dtype=F32).reshape(1, -1)
    f = g.special("/vector_estimator/time_encoder/sinusoidal/Constant_3_output_0", freqs, None,
                  "exp(-i*ln(1e4)/(half-1)), i<half")
    arg = g.op("Mul", [t, f], tsc)
    temb = g.op("Concat", [g.op("Sin", [arg], tsc), g.op("Cos", [arg], tsc)], tsc, axis=-1)
    temb = g.gemm(temb, VF + "time_encoder.mlp.0.linear.", "/time_encoder/mlp/mlp.0/linear")
    temb = g.mish(temb, "/time_encoder/mlp/mlp.1")
    temb = g.gemm(temb, VF + "time_encoder.mlp.2.linear.", "/time_encoder/mlp/mlp.2/linear")
    # rope tables (shared by all text attentions)
    hd = v["text_units"] // v["text_heads"]
    inc = g.init(VF + "main_blocks.3.attn.increments")
    theta = g.init(VF + "main_blocks.3.attn.theta")
    rs = "/main_blocks.3/attn"

    def rope_tab(src, msk):
        n1 = g.shape_dim(src, 2, rs)
        pos = g.op("Slice", [inc, g.i64([0], rs), n1, g.i64([1], rs)], rs)
        pos = g.op("Cast", [pos], rs, to=TP.FLOAT)
        ln = g.op("ReduceSum", [msk, g.i64([1, 2], rs)], rs, keepdims=1)
        ang = g.op("Mul", [g.op("Div", [pos, ln], rs), theta], rs)
        c = g.op("Unsqueeze", [g.op("Cos", [ang], rs), g.i64([1], rs)], rs)
        s_ = g.op("Unsqueeze", [g.op("Sin", [ang], rs), g.i64([1], rs)], rs)
        return c, s_

    cos_q, sin_q = rope_tab(xin, lm2)
    cos_k, sin_k = rope_tab(te_in, tm2)

    def rope(z, c, s_, sc):
        a = g.op("Slice", [z, g.i64([0], sc), g.i64([hd // 2], sc), g.i64([3], sc)], sc)
        b = g.op("Slice", [z, g.i64([hd // 2], sc), g.i64([hd], sc), g.i64([3], sc)], sc)
        r1 = g.op("Sub", [g.op("Mul", [a, c], sc), g.op("Mul", [b, s_], sc)], sc)
        r2 = g.op("Add", [g.op("Mul", [b, c], sc), g.op("Mul", [a, s_], sc)], sc)
        return g.op("Concat", [r1, r2], sc, axis=3)

    amask = g.op("Mul", [g.op("Unsqueeze", [lm2, g.i64([3], rs)], rs),
                         g.op("Unsqueeze", [tm2, g.i64([2], rs)], rs)], rs)
    acond = g.op("Equal", [amask, g.const(np.float32(0.0), rs)], rs)
    te_t = g.op("Transpose", [te_in], "", perm=[0, 2, 1])

    h = g.conv(xin, g.init(VF + "proj_in.net.weight"), None, "/proj_in/net")
    h = g.op("Mul", [h, lm2], "/proj_in")
    for b in range(v["n_blocks"]):
        m = 6 * b
        mb = lambda j: f"/main_blocks.{m + j}"  # noqa: E731
        h = g.convnext_stack(h, lm2, f"{VF}main_blocks.{m}.convnext.", mb(0) + "/convnext",
                             v["k"], v["convnext_0"])
        tc = g.linear(temb, f"{VF}main_blocks.{m + 1}.linear.linear.", mb(1) + "/linear/linear")
        tc = g.op("Unsqueeze", [tc, g.i64([2], mb(1))], mb(1))
        h = g.op("Mul", [g.op("Add", [h, tc], mb(1)), lm2], mb(1))
        h = g.convnext_stack(h, lm2, f"{VF}main_blocks.{m + 2}.convnext.", mb(2) + "/convnext",
                             v["k"], v["convnext_1"])
        # text cross attention with LARoPE
        sc = mb(3) + "/attn"
        pre = f"{VF}main_blocks.{m + 3}.attn."
        nh, U = v["text_heads"], v["text_units"]
        ht = g.op("Transpose", [h], sc, perm=[0, 2, 1])

        def heads(z):
            z = g.op("Reshape", [z, g.i64([0, 0, nh, hd], sc)], sc)
            return g.op("Transpose", [z], sc, perm=[0, 2, 1, 3])

        q = heads(g.linear(ht, pre + "W_query.linear.", sc + "/W_query/linear"))
        k = heads(g.linear(te_t, pre + "W_key.linear.", sc + "/W_key/linear"))
        vv = heads(g.linear(te_t, pre + "W_value.linear.", sc + "/W_value/linear"))
        q = rope(q, cos_q, sin_q, sc)
        k = rope(k, cos_k, sin_k, sc)
        s = g.op("MatMul", [q, g.op("Transpose", [k], sc, perm=[0, 1, 3, 2])], sc)
        s = g.op("Div", [s, g.const(np.float32(math.sqrt(C)), sc)], sc)
        s = g.op("Where", [acond, g.const(np.float32(-1e4), sc), s], sc)
        p = g.op("Softmax", [s], sc, axis=-1)
        o = g.op("MatMul", [p, vv], sc)
        o = g.op("Transpose", [o], sc, perm=[0, 2, 1, 3])
        o = g.op("Reshape", [o, g.i64([0, 0, U], sc)], sc)
        o = g.linear(o, pre + "out_fc.linear.", sc + "/out_fc/linear")
        o = g.op("Mul", [g.op("Transpose", [o], sc, perm=[0, 2, 1]), lm2], sc)
        h = g.ln_channel(g.op("Add", [h, o], mb(3)), f"{VF}main_blocks.{m + 3}.norm.norm.", mb(3) + "/norm")
        h = g.op("Mul", [h, lm2], mb(3))
        h = g.convnext_stack(h, lm2, f"{VF}main_blocks.{m + 4}.convnext.", mb(4) + "/convnext",
                             v["k"], v["convnext_2"])
        # style cross attention (tanh keys from the prototype)
        sc = mb(5) + "/attn"
        pre = f"{VF}main_blocks.{m + 5}.attn."
        ht = g.op("Transpose", [h], sc, perm=[0, 2, 1])
        o = _style_attn_qkvo(g, ht, pk, sv, pre, sc, v["style_heads"], math.sqrt(cfg["style_dim"]))
        o = g.op("Mul", [g.op("Transpose", [o], sc, perm=[0, 2, 1]), lm2], sc)
        h = g.ln_channel(g.op("Add", [h, o], mb(5)), f"{VF}main_blocks.{m + 5}.norm.norm.", mb(5) + "/norm")
        h = g.op("Mul", [h, lm2], mb(5))
    h = g.convnext_stack(h, lm2, f"{VF}last_convnext.convnext.", "/last_convnext/convnext",
                         v["k"], v["last_convnext"])
    vel = g.conv(h, g.init(VF + "proj_out.net.weight"), None, "/proj_out/net")
    vel = g.op("Mul", [vel, lm2], "/proj_out")
    tsr = g.op("Reshape", [ts, g.i64([-1, 1, 1], "")], "")
    if v3:
        vc = g.op("Slice", [vel, g.i64([0], ""), B1, g.i64([0], "")], "")
        twoB = g.op("Mul", [B1, g.i64([2], "")], "")
        vu = g.op("Slice", [vel, B1, twoB, g.i64([0], "")], "")
        wc, wu = v["cfg"]
        vel = g.op("Sub", [g.op("Mul", [vc, g.const(np.float32(wc), "")], ""),
                           g.op("Mul", [vu, g.const(np.float32(wu), "")], "")], "")
        xn = g.op("Add", [x, g.op("Div", [vel, tsr], "")], "")
        g.op("Mul", [xn, lm], "", out="denoised_latent")
    else:
        g.op("Add", [x, g.op("Div", [vel, tsr], "")], "", out="denoised_latent")
    return g.model(
        [_vi("noisy_latent", TP.FLOAT, ["batch_size", LC, "latent_length"]),
         _vi("text_emb", TP.FLOAT, ["batch_size", C, "text_length"]),
         _vi("style_ttl", TP.FLOAT, ["batch_size", cfg["n_style"], cfg["style_dim"]]),
         _vi("latent_mask", TP.FLOAT, ["batch_size", 1, "latent_length"]),
         _vi("text_mask", TP.FLOAT, ["batch_size", 1, "text_length"]),
         _vi("current_step", TP.FLOAT, ["batch_size"]),
         _vi("total_step", TP.FLOAT, ["batch_size"])],
        [_vi("denoised_latent", TP.FLOAT, ["batch_size", LC, "latent_length"])], "main_graph"), g.map


def _style_attn_qkvo(g, q_in, proto, v_in, pre, scope, heads, scale):
    """Style attention whose anonymous weights are numbered Q,K,V,O."""
    units = g.P[pre + "W_query.linear.weight"].shape[1]
    hd = units // heads
    q = g.linear(q_in, pre + "W_query.linear.", scope + "/W_query/linear")
    kT = g.tanh_keys(proto, pre, scope, heads)
    v = g.linear(v_in, pre + "W_value.linear.", scope + "/W_value/linear")
    q = g.op("Reshape", [q, g.i64([0, 0, heads, hd], scope)], scope)
    q = g.op("Transpose", [q], scope, perm=[2, 0, 1, 3])
    v = g.op("Reshape", [v, g.i64([0, 0, heads, hd], scope)], scope)
    v = g.op("Transpose", [v], scope, perm=[2, 0, 1, 3])
    s = g.op("MatMul", [q, kT], scope)
    s = g.op("Div", [s, g.const(np.float32(scale), scope)], scope)
    p = g.op("Softmax", [s], scope, axis=-1)
    o = g.op("MatMul", [p, v], scope)
    o = g.op("Transpose", [o], scope, perm=[1, 2, 0, 3])
    o = g.op("Reshape", [o, g.i64([0, 0, units], scope)], scope)
    return g.linear(o, pre + "out_fc.linear.", scope + "/out_fc/linear")


def build_voc(cfg, P):
    from onnx import TensorProto as TP
    o = cfg["voc"]
    LD, CCF = cfg["latent_dim"], cfg["chunk_compress_factor"]
    g = GB(cfg, P, "", cfg["anon"]["voc_conv"])
    s = ""
    z = g.op("Div", ["latent", g.const(np.float32(cfg["normalizer_scale"]), s)], s)
    z = g.op("Reshape", [z, g.i64([0, LD, CCF, -1], s)], s)
    z = g.op("Transpose", [z], s, perm=[0, 1, 3, 2])
    z = g.op("Reshape", [z, g.i64([0, LD, -1], s)], s)
    z = g.op("Mul", [z, g.init(AE + "latent_std")], s)
    z = g.op("Add", [z, g.init(AE + "latent_mean")], s)
    d = "/decoder"
    z = g.pad_edge(z, o["k_init"] - 1, 0, d + "/embed")
    w = g.anon("Conv", DEC + "embed.weight")
    b = g.anon("Conv", DEC + "embed.bias")
    h = g.op("Conv", [z, w, b], d + "/embed", dilations=[1], group=1, kernel_shape=[o["k_init"]],
             pads=[0, 0], strides=[1])
    h = g.convnext_stack(h, None, DEC + "convnext.", d + "/convnext", o["k"], o["dilations"],
                         causal=True, dw="dwconv.net.")
    fn = DEC + "final_norm.norm."
    h = g.op("BatchNormalization", [h] + [g.init(fn + n) for n in
                                          ("weight", "bias", "running_mean", "running_var")],
             d + "/final_norm/norm", epsilon=cfg["bn_eps"], momentum=0.9)
    h = g.pad_edge(h, o["head_k"] - 1, 0, d + "/head/layer1")
    h = g.conv(h, g.init(DEC + "head.layer1.net.weight"), g.init(DEC + "head.layer1.net.bias"),
               d + "/head/layer1/net")
    g.anon_ctr = cfg["anon"]["voc_prelu"]
    h = g.op("PRelu", [h, g.anon("PRelu", DEC + "head.activation.weight")], d + "/head/activation")
    h = g.conv(h, g.init(DEC + "head.layer2.weight"), None, d + "/head/layer2")
    h = g.op("Transpose", [h], d, perm=[0, 2, 1])
    g.op("Reshape", [h, g.i64([0, -1], d)], d, out="wav_tts")
    return g.model([_vi("latent", TP.FLOAT, ["batch_size", cfg["latent_channels"], "latent_length"])],
                   [_vi("wav_tts", TP.FLOAT, ["batch_size", "wav_length"])], "main_graph"), g.map


# ---------------------------------------------------------------------------
# tts.json

def tts_json(cfg):
    te, dp, ve, vo = cfg["te"], cfg["dp"], cfg["ve"], cfg["voc"]
    S, SD = cfg["n_style"], cfg["style_dim"]
    LD, CCF = cfg["latent_dim"], cfg["chunk_compress_factor"]
    cd = f"resources/metadata/char_dict/{cfg['split']}/char_dict.json"

    def cnx(idim, k, inner, dils):
        return {"idim": idim, "ksz": k, "intermediate_dim": inner, "num_layers": len(dils),
                "dilation_lst": list(dils)}

    C, DC, H = te["char_dim"], dp["char_dim"], ve["hidden"]
    return {
        "tts_version": cfg["tts_version"], "split": cfg["split"],
        "ttl_ckpt_path": "unknown.pt", "dp_ckpt_path": "unknown.pt", "ae_ckpt_path": "unknown.pt",
        "ttl_train": "unknown", "dp_train": "unknown", "ae_train": "unknown",
        "ttl": {
            "latent_dim": LD, "chunk_compress_factor": CCF,
            "batch_expander": {"n_batch_expand": 6},
            "normalizer": {"scale": cfg["normalizer_scale"]},
            "text_encoder": {
                "char_dict_path": cd,
                "text_embedder": {"char_dict_path": cd, "char_emb_dim": C},
                "convnext": cnx(C, te["k"], te["inner"], te["dilations"]),
                "attn_encoder": {"hidden_channels": C, "filter_channels": te["attn_filter"],
                                 "n_heads": te["attn_heads"], "n_layers": te["attn_layers"],
                                 "p_dropout": 0.1},
                "proj_out": {"idim": C, "odim": C}},
            "flow_matching": {"sig_min": 0},
            "style_encoder": {
                "proj_in": {"ldim": LD, "chunk_compress_factor": CCF, "odim": SD},
                "convnext": cnx(SD, 5, 4 * SD, [1] * 6),
                "style_token_layer": {"input_dim": SD, "n_style": S, "style_key_dim": SD,
                                      "style_value_dim": SD, "prototype_dim": SD,
                                      "n_units": SD, "n_heads": 2}},
            "speech_prompted_text_encoder": {"text_dim": C, "style_dim": SD,
                                             "n_units": cfg["spte"]["units"],
                                             "n_heads": cfg["spte"]["heads"]},
            "uncond_masker": {"prob_both_uncond": 0.04, "prob_text_uncond": 0.01, "std": 0.1,
                              "text_dim": C, "n_style": S, "style_key_dim": SD,
                              "style_value_dim": SD},
            "vector_field": {
                "proj_in": {"ldim": LD, "chunk_compress_factor": CCF, "odim": H},
                "time_encoder": {"time_dim": ve["time_dim"], "hdim": ve["time_hidden"]},
                "main_blocks": {
                    "n_blocks": ve["n_blocks"],
                    "time_cond_layer": {"idim": H, "time_dim": ve["time_dim"]},
                    "style_cond_layer": {"idim": H, "style_dim": SD},
                    "text_cond_layer": {"idim": H, "text_dim": C, "n_heads": ve["text_heads"],
                                        "use_residual": True, "rotary_base": cfg["rotary_base"],
                                        "rotary_scale": cfg["rotary_scale"]},
                    "convnext_0": cnx(H, ve["k"], ve["inner"], ve["convnext_0"]),
                    "convnext_1": cnx(H, ve["k"], ve["inner"], ve["convnext_1"]),
                    "convnext_2": cnx(H, ve["k"], ve["inner"], ve["convnext_2"])},
                "last_convnext": cnx(H, ve["k"], ve["inner"], ve["last_convnext"]),
                "proj_out": {"idim": H, "chunk_compress_factor": CCF, "ldim": LD}}},
        "ae": {
            "sample_rate": cfg["sample_rate"], "n_delay": 0,
            "base_chunk_size": cfg["base_chunk_size"], "chunk_compress_factor": 1, "ldim": LD,
            "encoder": {
                "spec_processor": {"n_fft": 2048, "win_length": 2048, "hop_length": 512,
                                   "n_mels": 228, "sample_rate": cfg["sample_rate"], "eps": 1e-05,
                                   "norm_mean": 0.0, "norm_std": 1.0},
                "ksz_init": vo["k_init"], "ksz": vo["k"], "num_layers": len(vo["dilations"]),
                "dilation_lst": [1] * len(vo["dilations"]), "intermediate_dim": vo["inner"],
                "idim": 1253, "hdim": vo["hidden"], "odim": LD},
            "decoder": {
                "ksz_init": vo["k_init"], "ksz": vo["k"], "num_layers": len(vo["dilations"]),
                "dilation_lst": list(vo["dilations"]), "intermediate_dim": vo["inner"],
                "idim": LD, "hdim": vo["hidden"],
                "head": {"idim": vo["hidden"], "hdim": vo["head_hidden"], "odim": vo["head_out"],
                         "ksz": vo["head_k"]}}},
        "dp": {
            "latent_dim": LD, "chunk_compress_factor": CCF, "normalizer": {"scale": 1.0},
            "sentence_encoder": {
                "char_emb_dim": DC, "char_dict_path": cd,
                "text_embedder": {"char_dict_path": cd, "char_emb_dim": DC},
                "convnext": cnx(DC, dp["k"], dp["inner"], dp["dilations"]),
                "attn_encoder": {"hidden_channels": DC, "filter_channels": dp["attn_filter"],
                                 "n_heads": dp["attn_heads"], "n_layers": dp["attn_layers"],
                                 "p_dropout": 0.0},
                "proj_out": {"idim": DC, "odim": DC}},
            "style_encoder": {
                "proj_in": {"ldim": LD, "chunk_compress_factor": CCF, "odim": DC},
                "convnext": cnx(DC, 5, dp["inner"], [1] * 4),
                "style_token_layer": {"input_dim": DC, "n_style": cfg["dp_n_style"],
                                      "style_key_dim": 0, "style_value_dim": cfg["dp_style_dim"],
                                      "prototype_dim": DC, "n_units": DC, "n_heads": 2}},
            "predictor": {"sentence_dim": DC, "n_style": cfg["dp_n_style"],
                          "style_dim": cfg["dp_style_dim"], "hdim": dp["hidden"], "n_layer": 2}},
    }


# ---------------------------------------------------------------------------

def write_bundle(config, seed, out, duration_s=None):
    import onnx
    cfg = get_config(config)
    if duration_s is not None:
        cfg["dp"].update(duration_s=duration_s, duration_fixed=True)
    P = make_params(cfg, seed)
    os.makedirs(os.path.join(out, "onnx"), exist_ok=True)
    os.makedirs(os.path.join(out, "voice_styles"), exist_ok=True)
    maps = {}
    for name, fn in (("duration_predictor", build_dp), ("text_encoder", build_te),
                     ("vector_estimator", build_ve), ("vocoder", build_voc)):
        m, mp = fn(cfg, P)
        onnx.save(m, os.path.join(out, "onnx", name + ".onnx"))
        maps[name] = mp
    with open(os.path.join(out, "onnx", "tts.json"), "w") as f:
        json.dump(tts_json(cfg), f, indent=4)
    with open(os.path.join(out, "onnx", "unicode_indexer.json"), "w") as f:
        json.dump(build_indexer(cfg), f)
    for v in ("F1", "M1"):
        with open(os.path.join(out, "voice_styles", v + ".json"), "w") as f:
            json.dump(make_voice(cfg, seed, v), f, indent=2)
    np.savez(os.path.join(out, "params.npz"), **P)
    with open(os.path.join(out, "initializer_map.json"), "w") as f:
        json.dump({"config": cfg["name"], "seed": seed, "graphs": maps}, f, indent=1)
    with open(os.path.join(out, "bundle_config.json"), "w") as f:
        json.dump({"config": cfg["name"], "seed": seed, "cfg": cfg}, f, indent=1)
    return cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--duration-s", type=float,
                    help="what the random duration predictor says for any text, within a few percent "
                         "(its output bias is the log of it, its output weights are made small)")
    a = ap.parse_args()
    cfg = write_bundle(a.config, a.seed, a.out, a.duration_s)
    tot = 0
    for n in ("duration_predictor", "text_encoder", "vector_estimator", "vocoder"):
        sz = os.path.getsize(os.path.join(a.out, "onnx", n + ".onnx"))
        tot += sz
        print(f"{n}.onnx {sz} bytes")
    print(f"wrote {cfg['name']} bundle (seed {a.seed}) to {a.out}; onnx total {tot} bytes")


if __name__ == "__main__":
    main()
