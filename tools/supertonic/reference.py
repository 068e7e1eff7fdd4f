#!/usr/bin/env python3
"""Independent NumPy (float32) reference of the four Supertonic stages.

Reads DIR/params.npz and DIR/bundle_config.json written by make_bundle.py (never the
ONNX graphs).  All stages accept batches with masks:

    ref = Reference(bundle_dir)
    dur  = ref.duration(text_ids, style_dp, text_mask)                 # [B]
    emb  = ref.text_encoder(text_ids, style_ttl, text_mask)            # [B,C,T]
    x    = ref.vector_estimator(x, emb, style_ttl, latent_mask, text_mask, cur, total)
    wav  = ref.vocoder(latent)                                         # [B, L*6*512]

`synthesize(bundle_dir, text, lang, voice, steps, speed, seed)` runs the official
pipeline (text frontend, DP, TE, Euler loop, vocoder, chunking with 0.3 s silences).
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import text as textfe  # noqa: E402

F32 = np.float32

_erf = np.vectorize(math.erf, otypes=[np.float64])


# ---------------------------------------------------------------------------
# primitives (channel-first [B,C,T])

def gelu(x):
    return (x * (0.5 * (1.0 + _erf(x.astype(np.float64) / math.sqrt(2.0))))).astype(F32)


def mish(x):
    return (x * np.tanh(np.logaddexp(F32(0), x))).astype(F32)


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(F32)


def layer_norm_last(x, w, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return ((x - mu) / np.sqrt(var + F32(eps)) * w + b).astype(F32)


def layer_norm_ch(x, w, b, eps):
    return layer_norm_last(x.transpose(0, 2, 1), w, b, eps).transpose(0, 2, 1)


def conv1d(x, w, b=None, dil=1, depthwise=False):
    """Valid (unpadded) 1-D convolution; x [B,Ci,T], w [Co,Ci|1,k]."""
    k = w.shape[2]
    tout = x.shape[2] - dil * (k - 1)
    if depthwise:
        y = np.zeros((x.shape[0], w.shape[0], tout), F32)
        for j in range(k):
            y += w[None, :, 0, j, None] * x[:, :, j * dil:j * dil + tout]
    elif k == 1:
        y = np.einsum("oi,bit->bot", w[:, :, 0], x).astype(F32)
    else:
        y = np.zeros((x.shape[0], w.shape[0], tout), F32)
        for j in range(k):
            y += np.einsum("oi,bit->bot", w[:, :, j], x[:, :, j * dil:j * dil + tout])
    if b is not None:
        y = y + b[None, :, None]
    return y.astype(F32)


def pad_edge(x, left, right):
    return np.pad(x, ((0, 0), (0, 0), (left, right)), mode="edge")


# ---------------------------------------------------------------------------

class Reference:
    def __init__(self, bundle_dir):
        with open(os.path.join(bundle_dir, "bundle_config.json")) as f:
            self.cfg = json.load(f)["cfg"]
        z = np.load(os.path.join(bundle_dir, "params.npz"))
        self.P = {k: z[k] for k in z.files}
        self.eps = self.cfg["ln_eps"]

    # -- blocks
    def convnext(self, x, mask, pre, k, dil, causal, dw="dwconv."):
        P = self.P
        xm = x * mask if mask is not None else x
        tot = dil * (k - 1)
        left = tot if causal else tot // 2
        h = conv1d(pad_edge(xm, left, tot - left), P[pre + dw + "weight"], P[pre + dw + "bias"],
                   dil, depthwise=True)
        if mask is not None:
            h = h * mask
        h = layer_norm_ch(h, P[pre + "norm.norm.weight"], P[pre + "norm.norm.bias"], self.eps)
        h = conv1d(h, P[pre + "pwconv1.weight"], P[pre + "pwconv1.bias"])
        h = gelu(h)
        h = conv1d(h, P[pre + "pwconv2.weight"], P[pre + "pwconv2.bias"])
        out = xm + P[pre + "gamma"] * h
        if mask is not None:
            out = out * mask
        return out.astype(F32)

    def convnext_stack(self, x, mask, pre, k, dils, causal=False, dw="dwconv."):
        for i, d in enumerate(dils):
            x = self.convnext(x, mask, f"{pre}{i}.", k, d, causal, dw)
        return x

    def rel_attention(self, x, mask, pre, heads):
        """VITS relative-position MHA, written directly from s_ij definition."""
        P, W = self.P, self.cfg["rel_window"]
        B, C, T = x.shape
        hd = C // heads

        def proj(n):
            y = conv1d(x, P[pre + n + ".weight"], P[pre + n + ".bias"])
            return y.reshape(B, heads, hd, T).transpose(0, 1, 3, 2)  # [B,H,T,hd]

        q, k, v = proj("conv_q"), proj("conv_k"), proj("conv_v")
        q = q / F32(math.sqrt(hd))
        s = q @ k.transpose(0, 1, 3, 2)
        ek, ev = P[pre + "emb_rel_k"][0], P[pre + "emb_rel_v"][0]  # [2W+1, hd]
        rel = np.arange(T)[None, :] - np.arange(T)[:, None]          # j - i
        valid = np.abs(rel) <= W
        idx = np.clip(rel + W, 0, 2 * W)
        e = q @ ek.T                                                  # [B,H,T,2W+1]
        local = np.take_along_axis(e, np.broadcast_to(idx, (B, heads, T, T)), axis=-1)
        s = s + np.where(valid, local, F32(0))
        am = mask[:, :, :, None] * mask[:, :, None, :]
        s = np.where(am == 0, F32(-1e4), s).astype(F32)
        p = softmax(s)
        out = p @ v
        prel = np.zeros((B, heads, T, 2 * W + 1), F32)
        ii = np.arange(T)
        for m in range(2 * W + 1):
            jj = ii + (m - W)
            ok = (jj >= 0) & (jj < T)
            prel[:, :, ii[ok], m] = p[:, :, ii[ok], jj[ok]]
        out = out + prel @ ev
        out = out.transpose(0, 1, 3, 2).reshape(B, C, T)
        return conv1d(out, P[pre + "conv_o.weight"], P[pre + "conv_o.bias"])

    def attn_encoder(self, x, mask, pre, heads, layers):
        P = self.P
        x = x * mask
        for i in range(layers):
            y = self.rel_attention(x, mask, f"{pre}attn_layers.{i}.", heads)
            n = f"{pre}norm_layers_1.{i}.norm."
            x = layer_norm_ch(x + y, P[n + "weight"], P[n + "bias"], self.eps)
            f = f"{pre}ffn_layers.{i}."
            h = conv1d(x * mask, P[f + "conv_1.weight"], P[f + "conv_1.bias"])
            h = np.maximum(h, F32(0))
            h = conv1d(h * mask, P[f + "conv_2.weight"], P[f + "conv_2.bias"]) * mask
            n = f"{pre}norm_layers_2.{i}.norm."
            x = layer_norm_ch(x + h, P[n + "weight"], P[n + "bias"], self.eps)
        return x * mask

    def lin(self, x, pre):
        return (x @ self.P[pre + "weight"] + self.P[pre + "bias"]).astype(F32)

    def tanh_keys(self, proto, pre):
        return np.tanh(self.lin(proto, pre + "W_key.linear.")).astype(F32)  # [Bk,S,U]

    def style_attention(self, q_in, keys, v_in, pre, heads, scale):
        """q_in [B,N,Cq]; keys [Bk,S,U] (tanh applied); v_in [B,S,D]."""
        B, N, _ = q_in.shape
        q = self.lin(q_in, pre + "W_query.linear.")
        U = q.shape[-1]
        hd = U // heads
        v = self.lin(v_in, pre + "W_value.linear.")
        qh = q.reshape(B, N, heads, hd).transpose(0, 2, 1, 3)
        kh = keys.reshape(keys.shape[0], -1, heads, hd).transpose(0, 2, 1, 3)
        vh = v.reshape(B, -1, heads, hd).transpose(0, 2, 1, 3)
        p = softmax((qh @ kh.transpose(0, 1, 3, 2)) / F32(scale))
        o = (p @ vh).transpose(0, 2, 1, 3).reshape(B, N, U)
        return self.lin(o, pre + "out_fc.linear.")

    # -- stages
    def duration(self, text_ids, style_dp, text_mask):
        P, d = self.P, self.cfg["dp"]
        pre = "tts.dp.sentence_encoder."
        B = text_ids.shape[0]
        x = P[pre + "text_embedder.char_embedder.weight"][text_ids].transpose(0, 2, 1) * text_mask
        tok = np.broadcast_to(P[pre + "sentence_token"], (B,) + P[pre + "sentence_token"].shape[1:])
        x = np.concatenate([tok, x], axis=2).astype(F32)
        mask = np.concatenate([np.ones((B, 1, 1), F32), text_mask], axis=2)
        xc = self.convnext_stack(x, mask, pre + "convnext.convnext.", d["k"], d["dilations"])
        xa = self.attn_encoder(xc, mask, pre + "attn_encoder.", d["attn_heads"], d["attn_layers"])
        h = conv1d(xc + xa, P[pre + "proj_out.net.weight"]) * mask
        z = np.concatenate([h[:, :, 0], style_dp.reshape(B, -1)], axis=1)
        z = z @ P["tts.dp.predictor.layers.0.weight"].T + P["tts.dp.predictor.layers.0.bias"]
        a = P["tts.dp.predictor.activation.weight"]
        z = np.where(z >= 0, z, a * z)
        z = z @ P["tts.dp.predictor.layers.1.weight"].T + P["tts.dp.predictor.layers.1.bias"]
        return np.exp(z).astype(F32)[:, 0]

    def text_encoder(self, text_ids, style_ttl, text_mask):
        P, t = self.P, self.cfg["te"]
        pre = "tts.ttl.text_encoder."
        x = P[pre + "text_embedder.char_embedder.weight"][text_ids].transpose(0, 2, 1) * text_mask
        xc = self.convnext_stack(x, text_mask, pre + "convnext.convnext.", t["k"], t["dilations"])
        xa = self.attn_encoder(xc, text_mask, pre + "attn_encoder.", t["attn_heads"], t["attn_layers"])
        h = (xc + xa) * text_mask
        sp = "tts.ttl.speech_prompted_text_encoder."
        q_in = h.transpose(0, 2, 1)
        mt = text_mask.transpose(0, 2, 1)
        proto = P["tts.ttl.style_encoder.style_token_layer.style_key"]
        scale = math.sqrt(self.cfg["style_dim"])
        cur = q_in
        for a in ("attention1.", "attention2."):
            keys = self.tanh_keys(proto, sp + a)
            o = self.style_attention(cur, keys, style_ttl, sp + a, self.cfg["spte"]["heads"], scale)
            cur = q_in + o * mt
        out = layer_norm_last(cur, P[sp + "norm.norm.weight"], P[sp + "norm.norm.bias"], self.eps)
        return (out.transpose(0, 2, 1) * text_mask).astype(F32)

    def _rope(self, x, mask):
        theta = self.P["tts.ttl.vector_field.main_blocks.3.attn.theta"].reshape(-1)
        n, h2 = x.shape[2], x.shape[3] // 2
        ln = mask.sum(axis=(1, 2))
        ang = (np.arange(n, dtype=F32)[None, :, None] / ln[:, None, None]) * theta[None, None, :]
        c, s = np.cos(ang)[:, None], np.sin(ang)[:, None]
        x1, x2 = x[..., :h2], x[..., h2:]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(F32)

    def _velocity(self, x, text_emb, proto, style_v, lm, tm, cs, ts):
        P, v, cfg = self.P, self.cfg["ve"], self.cfg
        vf = "tts.ttl.vector_field."
        B = x.shape[0]
        t = cs / ts
        freqs = np.array([math.exp(-i * math.log(10000.0) / (v["time_dim"] // 2 - 1))
                          for i in range(v["time_dim"] // 2)], dtype=F32)
        arg = (t[:, None] * F32(1000.0)) * freqs[None, :]
        te = np.concatenate([np.sin(arg), np.cos(arg)], axis=-1).astype(F32)
        te = te @ P[vf + "time_encoder.mlp.0.linear.weight"].T + P[vf + "time_encoder.mlp.0.linear.bias"]
        te = mish(te.astype(F32))
        te = (te @ P[vf + "time_encoder.mlp.2.linear.weight"].T
              + P[vf + "time_encoder.mlp.2.linear.bias"]).astype(F32)
        h = conv1d(x, P[vf + "proj_in.net.weight"]) * lm
        am = lm[:, :, :, None] * tm[:, :, None, :]
        te_t = text_emb.transpose(0, 2, 1)
        nh, U = v["text_heads"], v["text_units"]
        hd = U // nh
        for b in range(v["n_blocks"]):
            m = 6 * b
            mb = f"{vf}main_blocks."
            h = self.convnext_stack(h, lm, f"{mb}{m}.convnext.", v["k"], v["convnext_0"])
            tc = self.lin(te, f"{mb}{m + 1}.linear.linear.")
            h = (h + tc[:, :, None]) * lm
            h = self.convnext_stack(h, lm, f"{mb}{m + 2}.convnext.", v["k"], v["convnext_1"])
            # text attention with LARoPE
            pre = f"{mb}{m + 3}.attn."
            ht = h.transpose(0, 2, 1)
            q = self.lin(ht, pre + "W_query.linear.").reshape(B, -1, nh, hd).transpose(0, 2, 1, 3)
            k = self.lin(te_t, pre + "W_key.linear.").reshape(B, -1, nh, hd).transpose(0, 2, 1, 3)
            vv = self.lin(te_t, pre + "W_value.linear.").reshape(B, -1, nh, hd).transpose(0, 2, 1, 3)
            q, k = self._rope(q, lm), self._rope(k, tm)
            s = (q @ k.transpose(0, 1, 3, 2)) / F32(math.sqrt(cfg["te"]["char_dim"]))
            p = softmax(np.where(am == 0, F32(-1e4), s).astype(F32))
            o = (p @ vv).transpose(0, 2, 1, 3).reshape(B, -1, U)
            o = self.lin(o, pre + "out_fc.linear.").transpose(0, 2, 1) * lm
            n = f"{mb}{m + 3}.norm.norm."
            h = layer_norm_ch(h + o, P[n + "weight"], P[n + "bias"], self.eps) * lm
            h = self.convnext_stack(h, lm, f"{mb}{m + 4}.convnext.", v["k"], v["convnext_2"])
            # style attention
            pre = f"{mb}{m + 5}.attn."
            keys = self.tanh_keys(proto, pre)
            o = self.style_attention(h.transpose(0, 2, 1), keys, style_v, pre, v["style_heads"],
                                     math.sqrt(cfg["style_dim"]))
            o = o.transpose(0, 2, 1) * lm
            n = f"{mb}{m + 5}.norm.norm."
            h = layer_norm_ch(h + o, P[n + "weight"], P[n + "bias"], self.eps) * lm
        h = self.convnext_stack(h, lm, f"{vf}last_convnext.convnext.", v["k"], v["last_convnext"])
        return (conv1d(h, P[vf + "proj_out.net.weight"]) * lm).astype(F32)

    def vector_estimator(self, x, text_emb, style_ttl, latent_mask, text_mask, current_step,
                         total_step):
        P, v = self.P, self.cfg["ve"]
        B = x.shape[0]
        proto = P["tts.ttl.style_encoder.style_token_layer.style_key"]
        ts = total_step.astype(F32).reshape(-1, 1, 1)
        if v["cfg"] is None:
            vel = self._velocity(x, text_emb, proto, style_ttl, latent_mask, text_mask,
                                 current_step, total_step)
            return (x + vel / ts).astype(F32)
        u = "tts.ttl.uncond_masker."
        shp = style_ttl.shape
        te_u = P[u + "text_special_token"] * text_mask
        vel = self._velocity(
            np.concatenate([x, x]), np.concatenate([text_emb, te_u]).astype(F32),
            np.concatenate([np.broadcast_to(proto, shp),
                            np.broadcast_to(P[u + "style_key_special_token"], shp)]),
            np.concatenate([style_ttl, np.broadcast_to(P[u + "style_value_special_token"], shp)]),
            np.concatenate([latent_mask, latent_mask]), np.concatenate([text_mask, text_mask]),
            np.concatenate([current_step, current_step]), np.concatenate([total_step, total_step]))
        wc, wu = v["cfg"]
        vel = vel[:B] * F32(wc) - vel[B:] * F32(wu)
        return ((x + vel / ts) * latent_mask).astype(F32)

    def vocoder(self, latent):
        P, o, cfg = self.P, self.cfg["voc"], self.cfg
        B, _, L = latent.shape
        LD, R = cfg["latent_dim"], cfg["chunk_compress_factor"]
        z = (latent / F32(cfg["normalizer_scale"])).reshape(B, LD, R, L).transpose(0, 1, 3, 2)
        z = z.reshape(B, LD, L * R) * P["tts.ae.latent_std"] + P["tts.ae.latent_mean"]
        d = "tts.ae.decoder."
        h = conv1d(pad_edge(z.astype(F32), o["k_init"] - 1, 0), P[d + "embed.weight"], P[d + "embed.bias"])
        h = self.convnext_stack(h, None, d + "convnext.", o["k"], o["dilations"], causal=True,
                                dw="dwconv.net.")
        n = d + "final_norm.norm."
        h = ((h - P[n + "running_mean"][None, :, None])
             / np.sqrt(P[n + "running_var"][None, :, None] + F32(cfg["bn_eps"]))
             * P[n + "weight"][None, :, None] + P[n + "bias"][None, :, None]).astype(F32)
        h = conv1d(pad_edge(h, o["head_k"] - 1, 0), P[d + "head.layer1.net.weight"],
                   P[d + "head.layer1.net.bias"])
        a = P[d + "head.activation.weight"]
        h = np.where(h >= 0, h, a * h).astype(F32)
        h = conv1d(h, P[d + "head.layer2.weight"])
        return h.transpose(0, 2, 1).reshape(B, -1).astype(F32)


# ---------------------------------------------------------------------------
# pipeline (shared by the ORT runner)

def load_voice(path):
    with open(path) as f:
        d = json.load(f)
    ttl = np.array(d["style_ttl"]["data"], dtype=F32).reshape(d["style_ttl"]["dims"])
    dp = np.array(d["style_dp"]["data"], dtype=F32).reshape(d["style_dp"]["dims"])
    return ttl, dp


def load_bundle_meta(bundle_dir):
    with open(os.path.join(bundle_dir, "onnx", "tts.json")) as f:
        tts = json.load(f)
    with open(os.path.join(bundle_dir, "onnx", "unicode_indexer.json")) as f:
        indexer = json.load(f)
    ver = tts["tts_version"]
    version = {"v1.5.0": "v1", "v1.6.0": "v2", "v1.7.3": "v3"}.get(ver, "v3" if ver >= "v1.7" else "v2")
    return tts, indexer, version


def voice_path(bundle_dir, voice):
    if os.path.isfile(voice):
        return voice
    return os.path.join(bundle_dir, "voice_styles", voice + ".json")


def infer_chunk(stages, tts, indexer, version, chunk, lang, style_ttl, style_dp, steps, speed,
                timings=None, trace=None):
    """One official `_infer` call (batch 1). stages: object with dp/te/ve/voc methods."""
    sr = tts["ae"]["sample_rate"]
    frame = tts["ae"]["base_chunk_size"] * tts["ttl"]["chunk_compress_factor"]
    chans = tts["ttl"]["latent_dim"] * tts["ttl"]["chunk_compress_factor"]
    prepared = textfe.prepare(chunk, lang, version)
    ids, tmask = textfe.batch_ids([prepared], indexer)

    def timed(key, fn, *a):
        t0 = time.perf_counter()
        r = fn(*a)
        if timings is not None:
            timings.setdefault(key, []).append((time.perf_counter() - t0) * 1e3)
        return r

    raw = timed("dp", stages.dp, ids, style_dp, tmask)
    dur = (raw / speed).astype(F32)
    emb = timed("te", stages.te, ids, style_ttl, tmask)
    wav_len = (dur * sr).astype(np.int64)
    L = int((wav_len.max() + frame - 1) // frame)
    lm = (np.arange(L)[None, :] < ((wav_len + frame - 1) // frame)[:, None]).astype(F32)[:, None, :]
    noise = np.random.randn(1, chans, L).astype(F32) * lm
    x = noise
    tot = np.array([steps], dtype=F32)
    for s in range(steps):
        x = timed("ve", stages.ve, x, emb, style_ttl, lm, tmask, np.array([s], dtype=F32), tot)
        if trace is not None and s == 0:
            trace["ve_step0"] = x
    wav = timed("vocoder", stages.voc, x)
    if trace is not None:
        trace.update(prepared=prepared, text_ids=ids, text_mask=tmask, duration=raw, text_emb=emb,
                     noise=noise, latent_mask=lm, latent=x, wav_full=wav, L=L, T=ids.shape[1],
                     wav_len=int(wav_len[0]))
    return wav, dur


def synthesize_with(stages, bundle_dir, text, lang, voice, steps, speed, seed, timings=None,
                    trace=None):
    tts, indexer, version = load_bundle_meta(bundle_dir)
    style_ttl, style_dp = load_voice(voice_path(bundle_dir, voice))
    sr = tts["ae"]["sample_rate"]
    silence_s = 0.3
    np.random.seed(seed)
    wav_cat, dur_cat = None, None
    for i, chunk in enumerate(textfe.chunk_text(text, textfe.chunk_len(lang, version))):
        wav, dur = infer_chunk(stages, tts, indexer, version, chunk, lang, style_ttl, style_dp,
                               steps, speed, timings, trace if i == 0 else None)
        if wav_cat is None:
            wav_cat, dur_cat = wav, dur
        else:
            sil = np.zeros((1, int(silence_s * sr)), dtype=F32)
            wav_cat = np.concatenate([wav_cat, sil, wav], axis=1)
            dur_cat += dur + F32(silence_s)  # the official order: dur_cat += dur_onnx + silence_duration
    n = int(sr * float(dur_cat[0]))
    return wav_cat[0, :n], float(dur_cat[0])


class _RefStages:
    def __init__(self, ref):
        self.dp, self.te = ref.duration, ref.text_encoder
        self.ve, self.voc = ref.vector_estimator, ref.vocoder


def synthesize(bundle_dir, text, lang="en", voice="F1", steps=5, speed=1.05, seed=42,
               timings=None, trace=None):
    return synthesize_with(_RefStages(Reference(bundle_dir)), bundle_dir, text, lang, voice,
                           steps, speed, seed, timings, trace)


def write_wav(path, wav, sr):
    import wave
    pcm = (np.clip(wav, -1.0, 1.0) * 32767.0).astype("<i2")
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes(pcm.tobytes())


def main():
    ap = argparse.ArgumentParser(description="NumPy reference synthesis")
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--lang", default="en")
    ap.add_argument("--voice", default="F1")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--speed", type=float, default=1.05)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    wav, dur = synthesize(a.bundle, a.text, a.lang, a.voice, a.steps, a.speed, a.seed)
    print(json.dumps({"samples": int(wav.shape[0]), "duration_s": dur,
                      "peak": float(np.abs(wav).max()) if wav.size else 0.0}))
    if a.out:
        write_wav(a.out, wav, 44100)


if __name__ == "__main__":
    main()
