#!/usr/bin/env python3
"""Convert an official Chatterbox Turbo, Nano or Multilingual checkpoint directory to GGUF.

Input: the directory as published. Turbo/Nano: `t3_turbo_v1.safetensors` or
`t3_nano_v1.safetensors`, `s3gen_meanflow.safetensors`, `ve.safetensors`,
`conds.pt`, and the GPT-2 tokenizer files `vocab.json`, `merges.txt`,
`added_tokens.json`. Multilingual (`--variant mtl`): `t3_mtl23ls_v2.safetensors`
(or `_v3` with `--t3-file`), `s3gen.pt` or `s3gen.safetensors`, `ve.pt` or
`ve.safetensors`, `conds.pt`, `grapheme_mtl_merged_expanded_v1.json`. Pickles
are read with `torch.load(weights_only=True)` only.

Output, in OUT_DIR:
- `t3-<variant>.gguf` (architecture `chatterbox`): the GPT-2 backbone, text and
  speech embeddings, speech head, speaker projection, the voice encoder, the
  built-in voice's T3 conditioning and the tokenizer as a `tokenizers` JSON.
- `s3gen-meanflow.gguf` (architecture `chatterbox-s3gen`): flow encoder, CFM
  estimator, HiFT (weight norm fused), CAMPPlus, S3Tokenizer, and the built-in
  voice's S3Gen conditioning. Multilingual: `t3-mtl.gguf` (Llama backbone,
  perceiver, emotion projection, learned positions) and `s3gen.gguf` (standard
  CFM).

Every dimension the engine needs is written as metadata; names and layouts are
in docs/gguf.md. `--weights f16|q8_0|q4_0` stores the large 2-D matrices in that
type; embeddings, norms, biases, the voice encoder, CAMPPlus and the tokenizer
stay F32 (quantising them breaks speaker embeddings and prompt tokens). The CFM
estimator's matrices and kernels follow `--decoder-weights f32|f16|bf16` (auto:
f16 with `--weights f16`, else f32).

Usage:
    convert.py CKPT_DIR OUT_DIR [--variant turbo|nano|mtl] [--weights f32|f16|q8_0|q4_0] [--t3-heads N] [--cfm-heads N]
               [--t3-file NAME] [--aligned-heads L:H,...] [--decoder-weights auto|f32|f16|bf16]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_atomic import write_atomically  # noqa: E402
from tokenizer_check import TokenizerError, check_tokenizer_ids  # noqa: E402

T3_FILES = {"turbo": "t3_turbo_v1.safetensors", "nano": "t3_nano_v1.safetensors", "mtl": "t3_mtl23ls_v2.safetensors"}
# Multilingual T3 files of the same shapes: `--t3-file` picks one.
MTL_T3_FILES = ("t3_mtl23ls_v2.safetensors", "t3_mtl23ls_v3.safetensors")
MTL_TOKENIZER = "grapheme_mtl_merged_expanded_v1.json"
MTL_CANGJIE = "Cangjie5_TC.json"
START_TEXT, STOP_TEXT = 255, 0
# The reference's Llama_520M configuration (t3/llama_configs.py): what the weights cannot show.
LLAMA_ROPE_THETA = 500000.0
LLAMA_ROPE_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_context": 8192}
LLAMA_RMS_EPS = 1e-5
# Perceiver(): AttentionBlock2(1024, 4 heads) with nn.LayerNorm's default eps.
PERCEIVER_HEADS = 4
# AlignmentStreamAnalyzer's LLAMA_ALIGNED_HEADS: (layer, head) pairs whose attention over the
# text tracks where speech is; the Multilingual loop reads them to suppress or force the stop.
ALIGNED_HEADS = [(12, 15), (13, 11), (9, 2)]
# GPT-2 fixes the head width at 64 for every size (small 12x64, medium 16x64).
GPT2_HEAD_DIM = 64
START_SPEECH, STOP_SPEECH, SILENCE_TOKEN = 6561, 6562, 4299
QUANT = {"f16": gguf.GGMLQuantizationType.F16, "q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}
FLOAT = {"f16": gguf.GGMLQuantizationType.F16, "bf16": gguf.GGMLQuantizationType.BF16}
# Never quantised: what is read by row, small, or numerically fragile.
KEEP_F32 = re.compile(r"(emb|wpe|_pos$|bias|\.ln|norm|\.bn|builtin|alpha|beta|gamma|^ve\.|campplus|s3tok|mel_fb|pos_bias|query)")


class ConversionError(Exception):
    pass


def load_safetensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file
    if not path.is_file():
        raise ConversionError(f"{path} is missing")
    return {k: v.astype(np.float32) if v.dtype in (np.float16,) else v for k, v in load_file(str(path)).items()}


def fuse_weight_norm(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`….parametrizations.weight.original0` (g) and `original1` (v) → `….weight` = g·v/‖v‖
    (norm over every dimension but the first)."""
    out = {}
    for k, v in state.items():
        if k.endswith(".parametrizations.weight.original0"):
            base = k[: -len(".parametrizations.weight.original0")]
            g, vv = v.astype(np.float64), state[base + ".parametrizations.weight.original1"].astype(np.float64)
            norm = np.sqrt((vv ** 2).reshape(vv.shape[0], -1).sum(axis=1)).reshape((-1,) + (1,) * (vv.ndim - 1))
            out[base + ".weight"] = (g * vv / norm).astype(np.float32)
        elif k.endswith(".parametrizations.weight.original1"):
            continue
        else:
            out[k] = v
    return out


def t3_tensors(state: dict[str, np.ndarray], n_head: int | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """GPT-2 T3 → engine names; Conv1D weights ([in, out]) transposed to [out, in]."""
    n_layer = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"tfmr\.h\.(\d+)\.", k)))
    out = {"t3.wpe": state["tfmr.wpe.weight"], "t3.ln_f.weight": state["tfmr.ln_f.weight"], "t3.ln_f.bias": state["tfmr.ln_f.bias"]}
    for i in range(n_layer):
        p, q = f"tfmr.h.{i}", f"t3.blk.{i}"
        for a, b in (("ln_1", "ln1"), ("ln_2", "ln2")):
            out[f"{q}.{b}.weight"], out[f"{q}.{b}.bias"] = state[f"{p}.{a}.weight"], state[f"{p}.{a}.bias"]
        for a, b in (("attn.c_attn", "attn.qkv"), ("attn.c_proj", "attn.out"), ("mlp.c_fc", "ffn.up"), ("mlp.c_proj", "ffn.down")):
            out[f"{q}.{b}.weight"] = np.ascontiguousarray(state[f"{p}.{a}.weight"].T)
            out[f"{q}.{b}.bias"] = state[f"{p}.{a}.bias"]
    out["t3.text_emb"] = state["text_emb.weight"]
    out["t3.speech_emb"] = state["speech_emb.weight"]
    out["t3.speech_head.weight"] = state["speech_head.weight"]
    out["t3.speech_head.bias"] = state["speech_head.bias"]
    out["t3.cond.spkr.weight"] = state["cond_enc.spkr_enc.weight"]
    out["t3.cond.spkr.bias"] = state["cond_enc.spkr_enc.bias"]
    n_ctx, n_embd = state["tfmr.wpe.weight"].shape
    if n_head is None:
        if n_embd % GPT2_HEAD_DIM:
            raise ConversionError(f"GPT-2 width {n_embd} is not a multiple of the head width {GPT2_HEAD_DIM}; give --t3-heads")
        n_head = n_embd // GPT2_HEAD_DIM
    if n_embd % n_head:
        raise ConversionError(f"GPT-2 width {n_embd} does not split into {n_head} heads")
    hp = {"n_layer": n_layer, "n_embd": n_embd, "n_head": n_head, "n_ctx": n_ctx,
          "n_ff": state["tfmr.h.0.mlp.c_fc.weight"].shape[1], "text_vocab": state["text_emb.weight"].shape[0],
          "speech_vocab": state["speech_emb.weight"].shape[0], "speaker_dim": state["cond_enc.spkr_enc.weight"].shape[1]}
    return out, hp


def t3_llama_tensors(state: dict[str, np.ndarray], n_head: int | None = None,
                     aligned_heads: list[tuple[int, int]] | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """Llama T3 (Multilingual) → engine names. Q, K and V are fused into one `attn.qkv`
    (rows Q, then K, then V), gate and up into one `ffn.gate_up` (rows gate, then up): one
    product each, and ggml's SwiGLU takes the pair as one tensor."""
    if "model" in state and not any(k.startswith("tfmr.") for k in state):
        raise ConversionError("the T3 file is a legacy {'model': [...]} wrapper; save its state dict as safetensors")
    n_layer = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"tfmr\.layers\.(\d+)\.", k)))
    q_width = state["tfmr.layers.0.self_attn.q_proj.weight"].shape[0]
    kv_width = state["tfmr.layers.0.self_attn.k_proj.weight"].shape[0]
    n_embd = state["tfmr.norm.weight"].shape[0]
    if n_head is None:
        if q_width % GPT2_HEAD_DIM or kv_width % GPT2_HEAD_DIM:
            raise ConversionError(f"Llama query width {q_width} / key width {kv_width} are not multiples of 64; give --t3-heads")
        n_head = q_width // GPT2_HEAD_DIM
    if q_width % n_head:
        raise ConversionError(f"Llama query width {q_width} does not split into {n_head} heads")
    head_dim = q_width // n_head
    if kv_width % head_dim or n_head % (kv_width // head_dim):
        raise ConversionError(f"Llama key width {kv_width} is not a divisor count of {head_dim}-wide heads of {n_head}")
    out = {"t3.norm_f.weight": state["tfmr.norm.weight"]}
    for i in range(n_layer):
        p, q = f"tfmr.layers.{i}", f"t3.blk.{i}"
        out[f"{q}.attn_norm.weight"] = state[f"{p}.input_layernorm.weight"]
        out[f"{q}.ffn_norm.weight"] = state[f"{p}.post_attention_layernorm.weight"]
        out[f"{q}.attn.qkv.weight"] = np.concatenate([state[f"{p}.self_attn.{x}_proj.weight"] for x in "qkv"], axis=0)
        out[f"{q}.attn.out.weight"] = state[f"{p}.self_attn.o_proj.weight"]
        out[f"{q}.ffn.gate_up.weight"] = np.concatenate([state[f"{p}.mlp.{x}_proj.weight"] for x in ("gate", "up")], axis=0)
        out[f"{q}.ffn.down.weight"] = state[f"{p}.mlp.down_proj.weight"]
    out["t3.text_emb"] = state["text_emb.weight"]
    out["t3.speech_emb"] = state["speech_emb.weight"]
    out["t3.text_pos"] = state["text_pos_emb.emb.weight"]
    out["t3.speech_pos"] = state["speech_pos_emb.emb.weight"]
    out["t3.speech_head.weight"] = state["speech_head.weight"]
    out["t3.cond.spkr.weight"] = state["cond_enc.spkr_enc.weight"]
    out["t3.cond.spkr.bias"] = state["cond_enc.spkr_enc.bias"]
    out["t3.cond.emotion.weight"] = state["cond_enc.emotion_adv_fc.weight"]
    c = "cond_enc.perceiver"
    out["t3.perceiver.query"] = state[f"{c}.pre_attention_query"].reshape(-1, n_embd)
    for a, b in (("norm", "norm"), ("to_q", "q"), ("to_k", "k"), ("to_v", "v"), ("proj_out", "out")):
        out[f"t3.perceiver.{b}.weight"], out[f"t3.perceiver.{b}.bias"] = state[f"{c}.attn.{a}.weight"], state[f"{c}.attn.{a}.bias"]
    aligned = ALIGNED_HEADS if aligned_heads is None else aligned_heads
    for layer, head in aligned:
        if layer >= n_layer or head >= n_head:
            raise ConversionError(f"aligned head ({layer}, {head}) is outside {n_layer} layers of {n_head} heads; give --aligned-heads")
    hp = {"n_layer": n_layer, "n_embd": n_embd, "n_head": n_head, "n_head_kv": kv_width // head_dim, "head_dim": head_dim,
          "n_ff": state["tfmr.layers.0.mlp.gate_proj.weight"].shape[0], "text_vocab": state["text_emb.weight"].shape[0],
          "speech_vocab": state["speech_emb.weight"].shape[0], "speaker_dim": state["cond_enc.spkr_enc.weight"].shape[1],
          "text_positions": state["text_pos_emb.emb.weight"].shape[0], "speech_positions": state["speech_pos_emb.emb.weight"].shape[0],
          "perceiver.queries": out["t3.perceiver.query"].shape[0], "perceiver.n_head": PERCEIVER_HEADS}
    if n_embd % PERCEIVER_HEADS:
        raise ConversionError(f"the perceiver's width {n_embd} does not split into {PERCEIVER_HEADS} heads")
    meta = [("aligned_heads", [x for pair in aligned for x in pair])]
    return out, hp, meta


def voice_encoder_tensors(state: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict]:
    layers = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"lstm\.weight_ih_l(\d+)$", k)))
    out = {}
    for l in range(layers):
        for a in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            out[f"ve.lstm.{l}.{a}"] = state[f"lstm.{a}_l{l}"]
    out["ve.proj.weight"], out["ve.proj.bias"] = state["proj.weight"], state["proj.bias"]
    hp = {"layers": layers, "hidden": state["lstm.weight_hh_l0"].shape[1], "n_mels": state["lstm.weight_ih_l0"].shape[1],
          "embedding": state["proj.weight"].shape[0]}
    return out, hp


def tokenizer_json(ckpt: Path, text_vocab: int) -> str:
    """The GPT-2 BPE plus the added tags as one `tokenizers` JSON (what the engine loads)."""
    tj = ckpt / "tokenizer.json"
    if tj.is_file():
        return checked_tokenizer(tj.read_text(), text_vocab, tj)
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    vocab_path, merges_path = ckpt / "vocab.json", ckpt / "merges.txt"
    if not vocab_path.is_file() or not merges_path.is_file():
        raise ConversionError(f"{ckpt}: neither tokenizer.json nor vocab.json + merges.txt")
    tok = Tokenizer(models.BPE.from_file(str(vocab_path), str(merges_path)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # GPT-2's end-of-text token is special: written literally in text it stays one id.
    if tok.token_to_id("<|endoftext|>") is not None:
        tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    added = ckpt / "added_tokens.json"
    if added.is_file():
        tags = sorted(json.loads(added.read_text()).items(), key=lambda kv: kv[1])
        tok.add_tokens([t for t, _ in tags])
        for t, i in tags:
            if tok.token_to_id(t) != i:
                raise ConversionError(f"added token {t!r}: id {tok.token_to_id(t)}, the checkpoint says {i}")
    return checked_tokenizer(tok.to_str(), text_vocab, vocab_path)


def checked_tokenizer(text: str, text_vocab: int, source: Path) -> str:
    """`text` when every id it can produce is a row of T3's text embedding (tokenizer_check.py)."""
    try:
        check_tokenizer_ids(text, text_vocab)
    except TokenizerError as e:
        raise ConversionError(f"{source}: {e}") from e
    return text


# ggml caps tensor names at 63 bytes: the official S3Gen names get shorter prefixes.
S3GEN_PREFIXES = [("flow.decoder.estimator.", "cfm."), ("flow.encoder.", "enc."), ("mel2wav.", "hift."),
                  ("speaker_encoder.xvector.", "campplus."), ("speaker_encoder.", "campplus."), ("tokenizer.", "s3tok.")]
S3GEN_WORDS = [(".nonlinear", ".nl"), (".batchnorm.", ".bn.")]
GGML_MAX_NAME = 63


def s3gen_name(official: str) -> str:
    name = official
    for a, b in S3GEN_PREFIXES:
        if name.startswith(a):
            name = b + name[len(a):]
            break
    for a, b in S3GEN_WORDS:
        name = name.replace(a, b)
    if len(name.encode()) > GGML_MAX_NAME:
        raise ConversionError(f"S3Gen tensor {official!r} maps to {name!r}, longer than ggml's {GGML_MAX_NAME} bytes")
    return name


def s3gen_flow_hparams(s3: dict[str, np.ndarray]) -> dict:
    """The flow front end's dimensions, from the tensor shapes, plus the constants of the
    reference modules (CosyVoice's UpsampleConformerEncoder and its layers)."""
    e = "enc"
    count = lambda prefix: 1 + max(int(m.group(1)) for k in s3 if (m := re.match(re.escape(prefix) + r"\.(\d+)\.", k)))
    up_kernel = s3[f"{e}.up_layer.conv.weight"].shape[2]
    if up_kernel % 2 != 1:
        raise ConversionError(f"{e}.up_layer.conv has kernel {up_kernel}; Upsample1D uses 2*stride+1")
    return {
        "mel_channels": int(s3["flow.encoder_proj.weight"].shape[0]),
        "speaker_dim": int(s3["flow.spk_embed_affine_layer.weight"].shape[1]),
        "encoder.n_embd": int(s3[f"{e}.embed.out.0.weight"].shape[0]),
        "encoder.n_head": int(s3[f"{e}.encoders.0.self_attn.pos_bias_u"].shape[0]),
        "encoder.n_ff": int(s3[f"{e}.encoders.0.feed_forward.w_1.weight"].shape[0]),
        "encoder.n_layer": count(f"{e}.encoders"),
        "encoder.n_up_layer": count(f"{e}.up_encoders"),
        # PreLookaheadLayer: conv1 sees `pre_lookahead` future frames, conv2 is causal.
        "encoder.pre_lookahead": int(s3[f"{e}.pre_lookahead_layer.conv1.weight"].shape[2]) - 1,
        "encoder.lookahead_conv2_kernel": int(s3[f"{e}.pre_lookahead_layer.conv2.weight"].shape[2]),
        "encoder.leaky_relu_slope": 0.01,
        "encoder.up_stride": (up_kernel - 1) // 2,
        "encoder.layer_norm_eps": 1e-12,
        "encoder.embed_norm_eps": 1e-5,
        "encoder.after_norm_eps": 1e-5,
    }


def s3gen_cfm_hparams(s3: dict[str, np.ndarray], n_head: int | None) -> dict:
    """The CFM estimator (ConditionalDecoder, causal, one U-Net level) from the tensor shapes;
    the head count is not in the shapes: official checkpoints use 64-wide heads."""
    c = "cfm"
    count = lambda prefix: 1 + max(int(m.group(1)) for k in s3 if (m := re.match(re.escape(prefix) + r"\.(\d+)\.", k)))
    if any(k.startswith(f"{c}.down_blocks.1.") for k in s3):
        raise ConversionError("the CFM estimator has more than one U-Net level; the engine implements one")
    inner = int(s3[f"{c}.down_blocks.0.1.0.attn1.to_q.weight"].shape[0])
    if n_head is None:
        if inner % 64:
            raise ConversionError(f"CFM attention width {inner} is not a multiple of 64; give --cfm-heads")
        n_head = inner // 64
    if inner % n_head:
        raise ConversionError(f"CFM attention width {inner} does not split into {n_head} heads")
    return {
        "cfm.in_channels": int(s3[f"{c}.down_blocks.0.0.block1.block.0.weight"].shape[1]),
        "cfm.channels": int(s3[f"{c}.down_blocks.0.0.block1.block.0.weight"].shape[0]),
        "cfm.time_dim": int(s3[f"{c}.time_mlp.linear_2.weight"].shape[0]),
        "cfm.n_transformer": count(f"{c}.down_blocks.0.1"),
        "cfm.n_mid": count(f"{c}.mid_blocks"),
        "cfm.n_head": n_head,
        "cfm.head_dim": inner // n_head,
        "cfm.ff_dim": int(s3[f"{c}.down_blocks.0.1.0.ff.net.0.proj.weight"].shape[0]),
        "cfm.conv_kernel": int(s3[f"{c}.down_blocks.0.0.block1.block.0.weight"].shape[2]),
        # SinusoidalPosEmb(in_channels) multiplies t by 1000; LayerNorms use PyTorch's default eps.
        "cfm.time_scale": 1000.0,
        "cfm.layer_norm_eps": 1e-5,
    }


# HiFTGenerator as S3Gen builds it (s3gen.py): what the weights cannot show.
HIFT_UPSAMPLE_RATES = [8, 5, 3]
HIFT_DILATIONS = [1, 3, 5]


def s3gen_hift_hparams(s3: dict[str, np.ndarray]) -> dict:
    h = "hift"
    count = lambda prefix: 1 + max(int(m.group(1)) for k in s3 if (m := re.match(re.escape(prefix) + r"\.(\d+)\.", k)))
    n_up = count(f"{h}.ups")
    if n_up != len(HIFT_UPSAMPLE_RATES):
        raise ConversionError(f"HiFT has {n_up} upsampling stages, the reference configuration {len(HIFT_UPSAMPLE_RATES)}")
    up_kernels = [int(s3[f"{h}.ups.{i}.weight"].shape[2]) for i in range(n_up)]
    n_res = count(f"{h}.resblocks") // n_up
    res_kernels = [int(s3[f"{h}.resblocks.{j}.convs1.0.weight"].shape[2]) for j in range(n_res)]
    src_kernels = [int(s3[f"{h}.source_resblocks.{i}.convs1.0.weight"].shape[2]) for i in range(n_up)]
    for prefix in [f"{h}.resblocks", f"{h}.source_resblocks"]:
        if count(f"{prefix}.0.convs1") != len(HIFT_DILATIONS):
            raise ConversionError(f"{prefix}.0 has {count(f'{prefix}.0.convs1')} dilated convs, the reference {len(HIFT_DILATIONS)}")
    return {
        "hift.sample_rate": 24000,
        "hift.base_channels": int(s3[f"{h}.conv_pre.weight"].shape[0]),
        "hift.conv_pre_kernel": int(s3[f"{h}.conv_pre.weight"].shape[2]),
        "hift.conv_post_kernel": int(s3[f"{h}.conv_post.weight"].shape[2]),
        "hift.upsample_rates": HIFT_UPSAMPLE_RATES,
        "hift.upsample_kernels": up_kernels,
        "hift.resblock_kernels": res_kernels,
        "hift.source_resblock_kernels": src_kernels,
        "hift.resblock_dilations": HIFT_DILATIONS,
        "hift.n_fft": int(s3[f"{h}.conv_post.weight"].shape[0]) - 2,
        "hift.hop": 4,
        "hift.harmonics": int(s3[f"{h}.m_source.l_linear.weight"].shape[1]) - 1,
        "hift.nsf_alpha": 0.1,
        "hift.nsf_sigma": 0.003,
        "hift.voiced_threshold": 10.0,
        "hift.lrelu_slope": 0.1,
        "hift.audio_limit": 0.99,
        "hift.f0_layers": count(f"{h}.f0_predictor.condnet") // 2 + 1,
        "hift.f0_kernel": int(s3[f"{h}.f0_predictor.condnet.0.weight"].shape[2]),
        # S3Token2Wav: 20 ms of silence, then a 20 ms raised-cosine fade-in.
        "hift.trim_fade_samples": 480,
    }


# CAMPPlus as S3Gen builds it (xvector.py): what the weights cannot show.
CAMPPLUS_FEAT_DIM = 80          # extract_feature: Kaldi fbank, num_mel_bins=80
CAMPPLUS_TDNN_STRIDE = 2
CAMPPLUS_DILATIONS = [1, 2, 2]  # per CAMDenseTDNNBlock
CAMPPLUS_SEG_LEN = 100          # CAMLayer.seg_pooling
BATCH_NORM_EPS = 1e-5


def s3gen_campplus_hparams(s3: dict[str, np.ndarray]) -> dict:
    c = "campplus"
    # Blocks and their layers are numbered from 1 (`block1`, `tdnnd1`), the head's from 0.
    highest = lambda prefix: max(int(m.group(1)) for k in s3 if (m := re.match(re.escape(prefix) + r"(\d+)\.", k)))
    count = lambda prefix: 1 + highest(prefix)
    n_blocks = highest(f"{c}.block")
    if n_blocks != len(CAMPPLUS_DILATIONS):
        raise ConversionError(f"CAMPPlus has {n_blocks} dense blocks, the reference configuration {len(CAMPPLUS_DILATIONS)}")
    local = lambda i: s3[f"{c}.block{i}.tdnnd1.cam_layer.linear_local.weight"]
    return {
        "campplus.feat_dim": CAMPPLUS_FEAT_DIM,
        "campplus.head_channels": int(s3[f"{c}.head.conv1.weight"].shape[0]),
        "campplus.head_blocks": [count(f"{c}.head.layer1."), count(f"{c}.head.layer2.")],
        "campplus.channels": int(s3[f"{c}.tdnn.linear.weight"].shape[0]),
        "campplus.tdnn_kernel": int(s3[f"{c}.tdnn.linear.weight"].shape[2]),
        "campplus.tdnn_stride": CAMPPLUS_TDNN_STRIDE,
        "campplus.growth": int(local(1).shape[0]),
        "campplus.bn_channels": int(s3[f"{c}.block1.tdnnd1.linear1.weight"].shape[0]),
        "campplus.cam_channels": int(s3[f"{c}.block1.tdnnd1.cam_layer.linear1.weight"].shape[0]),
        "campplus.block_layers": [highest(f"{c}.block{i}.tdnnd") for i in range(1, n_blocks + 1)],
        "campplus.block_kernels": [int(local(i).shape[2]) for i in range(1, n_blocks + 1)],
        "campplus.block_dilations": CAMPPLUS_DILATIONS,
        "campplus.seg_len": CAMPPLUS_SEG_LEN,
        "campplus.embedding": int(s3[f"{c}.dense.linear.weight"].shape[0]),
        "campplus.bn_eps": BATCH_NORM_EPS,
    }


# S3TokenizerV2 (s3tokenizer/model_v2.py): its rotary table is built for 64-wide heads.
S3TOK_HEAD_DIM = 64
S3TOK_ROPE_BASE = 10000.0
S3TOK_ROPE_POSITIONS = 2048
S3TOK_FSQ_LEVELS = 3


def s3gen_tokenizer_hparams(s3: dict[str, np.ndarray]) -> dict:
    t = "s3tok.encoder"
    count = lambda prefix: 1 + max(int(m.group(1)) for k in s3 if (m := re.match(re.escape(prefix) + r"\.(\d+)\.", k)))
    n_state = int(s3[f"{t}.conv1.weight"].shape[0])
    if n_state % S3TOK_HEAD_DIM:
        raise ConversionError(f"S3Tokenizer width {n_state} is not a multiple of its {S3TOK_HEAD_DIM}-wide rotary heads")
    return {
        "tokenizer.n_mels": int(s3[f"{t}.conv1.weight"].shape[1]),
        "tokenizer.n_state": n_state,
        "tokenizer.n_head": n_state // S3TOK_HEAD_DIM,
        "tokenizer.n_layer": count(f"{t}.blocks"),
        "tokenizer.n_ff": int(s3[f"{t}.blocks.0.mlp.0.weight"].shape[0]),
        "tokenizer.fsmn_kernel": int(s3[f"{t}.blocks.0.attn.fsmn_block.weight"].shape[2]),
        "tokenizer.rope_base": S3TOK_ROPE_BASE,
        "tokenizer.rope_positions": S3TOK_ROPE_POSITIONS,
        "tokenizer.fsq_dims": int(s3["s3tok.quantizer._codebook.project_down.weight"].shape[0]),
        "tokenizer.fsq_levels": S3TOK_FSQ_LEVELS,
        "tokenizer.layer_norm_eps": 1e-5,
    }


def load_conds(path: Path) -> dict:
    import torch
    if not path.is_file():
        raise ConversionError(f"{path} is missing")
    c = torch.load(str(path), map_location="cpu", weights_only=True)
    t3, gen = c["t3"], c["gen"]
    arr = lambda x: x.detach().cpu().numpy()
    return {
        "speaker_emb": arr(t3["speaker_emb"]).reshape(-1).astype(np.float32),
        "prompt_speech_tokens": arr(t3["cond_prompt_speech_tokens"]).reshape(-1).astype(np.int32),
        "prompt_token": arr(gen["prompt_token"]).reshape(-1).astype(np.int32),
        "prompt_feat": arr(gen["prompt_feat"]).reshape(-1, arr(gen["prompt_feat"]).shape[-1]).astype(np.float32),
        "embedding": arr(gen["embedding"]).reshape(-1).astype(np.float32),
    }


def decoder_storage(weights: str, decoder: str) -> str:
    """The CFM estimator's storage: `auto` follows F16 conversions and keeps F32 otherwise (its
    products are compute-bound: block-quantized ones ran slower than F32 on CPU and GPU alike)."""
    return ("f16" if weights == "f16" else "f32") if decoder == "auto" else decoder


def write(path: Path, arch: str, meta: list[tuple[str, object]], tensors: dict[str, np.ndarray], weights: str,
          decoder: str = "f32") -> int:
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in meta:
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    converted = 0
    for name in sorted(tensors):
        v = tensors[name]
        if v.dtype.kind in "iu":
            w.add_tensor(name, v.astype(np.int32))
            continue
        v = np.ascontiguousarray(v, dtype=np.float32)
        # The decoder's matrices and convolution kernels: one float type for all (`--decoder-weights`).
        if name.startswith("cfm.") and name.endswith(".weight") and v.ndim in (2, 3) and not KEEP_F32.search(name):
            dt = FLOAT.get(decoder)
            if dt is None:
                w.add_tensor(name, v)
            else:
                w.add_tensor(name, gguf.quants.quantize(v, dt), raw_dtype=dt)
                converted += 1
            continue
        qt = QUANT.get(weights)
        # As llama.cpp does for its output layer: the head that scores the tokens keeps 8 bits.
        if weights == "q4_0" and name.startswith("t3.speech_head"):
            qt = QUANT["q8_0"]
        big = v.ndim == 2 and v.size >= 1024 and v.shape[-1] % 32 == 0
        if qt is not None and big and not KEEP_F32.search(name):
            w.add_tensor(name, gguf.quants.quantize(v, qt), raw_dtype=qt)
            converted += 1
        else:
            w.add_tensor(name, v)
    write_atomically(w, path)
    return converted


def load_state(ckpt: Path, *names: str) -> dict[str, np.ndarray]:
    """The first of `names` present in `ckpt`: safetensors, or a `torch.save` state dict read
    with `weights_only=True` (tensors and containers only, never arbitrary objects)."""
    for name in names:
        path = ckpt / name
        if not path.is_file():
            continue
        if path.suffix == ".safetensors":
            return load_safetensors(path)
        import torch
        try:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as e:
            raise ConversionError(f"{path} is not a weights-only torch checkpoint ({type(e).__name__}: {str(e).splitlines()[0]})")
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise ConversionError(f"{path} is not a state dict of tensors")
        return {k: v.detach().to(torch.float32 if v.is_floating_point() else v.dtype).numpy() for k, v in state.items()}
    raise ConversionError(f"{ckpt}: none of {', '.join(names)}")


def t3_meta(a: str, variant: str, backbone: str, weights: str, hp: dict, norms: list, conds: dict, ve_hp: dict,
            tokenizer: str) -> list:
    return [(f"{a}.variant", variant), (f"{a}.backbone", backbone), (f"{a}.weights", weights),
            *((f"{a}.{k}", int(v)) for k, v in hp.items()),
            *((f"{a}.{k}", v) for k, v in norms),
            (f"{a}.start_speech_token", START_SPEECH), (f"{a}.stop_speech_token", STOP_SPEECH),
            (f"{a}.silence_token", SILENCE_TOKEN),
            (f"{a}.cond_prompt_len", int(conds["prompt_speech_tokens"].size)),
            *((f"{a}.voice_encoder.{k}", int(v)) for k, v in ve_hp.items()),
            (f"{a}.tokenizer_json", tokenizer)]


def convert_t3(ckpt: Path, out_dir: Path, variant: str, weights: str, conds: dict, n_head: int | None,
               t3_file: str | None, aligned_heads) -> str:
    ve, ve_hp = voice_encoder_tensors(load_state(ckpt, "ve.safetensors", "ve.pt"))
    a = "chatterbox"
    if variant == "mtl":
        name = t3_file or MTL_T3_FILES[0]
        if name not in MTL_T3_FILES:
            raise ConversionError(f"--t3-file {name}: a Multilingual T3 is one of {', '.join(MTL_T3_FILES)}")
        t3, hp, extra = t3_llama_tensors(load_state(ckpt, name), n_head, aligned_heads)
        tok = ckpt / MTL_TOKENIZER
        if not tok.is_file():
            raise ConversionError(f"{tok} is missing")
        meta = t3_meta(a, variant, "llama", weights, hp, [("rms_norm_eps", LLAMA_RMS_EPS), ("layer_norm_eps", 1e-5)],
                       conds, ve_hp, checked_tokenizer(tok.read_text(), hp["text_vocab"], tok))
        meta += [(f"{a}.rope.freq_base", LLAMA_ROPE_THETA), (f"{a}.rope.scaling", "llama3"),
                 *((f"{a}.rope.scaling.{k}", float(v)) for k, v in LLAMA_ROPE_SCALING.items()),
                 (f"{a}.start_text_token", START_TEXT), (f"{a}.stop_text_token", STOP_TEXT),
                 *((f"{a}.{k}", v) for k, v in extra)]
        # The Cangjie table Chinese preprocessing reads, embedded when the directory has it.
        cangjie = ckpt / MTL_CANGJIE
        if cangjie.is_file():
            meta.append((f"{a}.cangjie5_tc", cangjie.read_text(encoding="utf-8")))
    else:
        t3, hp = t3_tensors(load_state(ckpt, t3_file or T3_FILES[variant]), n_head)
        meta = t3_meta(a, variant, "gpt2", weights, hp, [("layer_norm_eps", 1e-5)], conds, ve_hp,
                       tokenizer_json(ckpt, hp["text_vocab"]))
    t3.update(ve)
    t3["voice.builtin.speaker_emb"] = conds["speaker_emb"]
    t3["voice.builtin.prompt_speech_tokens"] = conds["prompt_speech_tokens"]
    t3_path = out_dir / f"t3-{variant}.gguf"
    n = write(t3_path, a, meta, t3, weights)
    stored = f", {n} stored {weights}" if weights != "f32" else ""
    return f"{t3_path}: T3 {variant}, {len(t3)} tensors{stored}"


def convert(ckpt: Path, out_dir: Path, variant: str, weights: str, n_head: int | None = None,
            cfm_heads: int | None = None, t3_file: str | None = None, aligned_heads=None,
            decoder: str = "auto") -> list[str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    conds = load_conds(ckpt / "conds.pt")
    lines = [convert_t3(ckpt, out_dir, variant, weights, conds, n_head, t3_file, aligned_heads)]

    s3_files = ("s3gen_meanflow.safetensors",) if variant in ("turbo", "nano") else ("s3gen.safetensors", "s3gen.pt")
    s3 = fuse_weight_norm(load_state(ckpt, *s3_files))
    s3 = {s3gen_name(k): v for k, v in s3.items() if not k.endswith("num_batches_tracked")}
    s3["voice.builtin.prompt_token"] = conds["prompt_token"]
    s3["voice.builtin.prompt_feat"] = conds["prompt_feat"]
    s3["voice.builtin.embedding"] = conds["embedding"]
    meanflow = "cfm.time_embed_mixer.weight" in s3
    b = "chatterbox-s3gen"
    meta = [(f"{b}.variant", "meanflow" if meanflow else "standard"), (f"{b}.meanflow", meanflow),
            (f"{b}.n_timesteps", 2 if meanflow else 10), (f"{b}.cfg_rate", 0.0 if meanflow else 0.7),
            (f"{b}.speech_vocab", int(s3["flow.input_embedding.weight"].shape[0])),
            *((f"{b}.{k}", v) for k, v in s3gen_flow_hparams(s3).items()),
            *((f"{b}.{k}", v) for k, v in s3gen_cfm_hparams(s3, cfm_heads).items()),
            *((f"{b}.{k}", v) for k, v in s3gen_hift_hparams(s3).items()),
            *((f"{b}.{k}", v) for k, v in s3gen_campplus_hparams(s3).items()),
            *((f"{b}.{k}", v) for k, v in s3gen_tokenizer_hparams(s3).items()),
            (f"{b}.weights", weights), (f"{b}.decoder_weights", decoder_storage(weights, decoder))]
    s3_path = out_dir / ("s3gen-meanflow.gguf" if meanflow else "s3gen.gguf")
    n2 = write(s3_path, b, meta, s3, weights, decoder_storage(weights, decoder))
    stored = f", {n2} narrowed (matrices {weights}, decoder {decoder_storage(weights, decoder)})" if n2 else ""
    return lines + [f"{s3_path}: S3Gen {'meanflow' if meanflow else 'standard'}, {len(s3)} tensors{stored}"]


def parse_aligned_heads(text: str) -> list[tuple[int, int]]:
    try:
        pairs = [tuple(int(x) for x in item.split(":")) for item in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LAYER:HEAD[,LAYER:HEAD...]")
    if not pairs or any(len(p) != 2 or min(p) < 0 for p in pairs):
        raise argparse.ArgumentTypeError(f"{text!r}: expected LAYER:HEAD[,LAYER:HEAD...]")
    return pairs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt", type=Path)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--variant", choices=sorted(T3_FILES), default="turbo")
    ap.add_argument("--weights", choices=("f32", "f16", "q8_0", "q4_0"), default="f32")
    ap.add_argument("--decoder-weights", choices=("auto", "f32", "f16", "bf16"), default="auto",
                    help="the CFM estimator's matrices and convolution kernels (auto: f16 with --weights f16, "
                         "else f32; bf16 for CPUs with AVX-512 BF16)")
    ap.add_argument("--t3-heads", type=int, help="attention heads of a non-standard GPT-2 size (official sizes: width / 64)")
    ap.add_argument("--cfm-heads", type=int, help="attention heads of a non-standard CFM estimator (official: width / 64)")
    ap.add_argument("--t3-file", help="the T3 checkpoint to read (Multilingual: %s)" % " or ".join(MTL_T3_FILES))
    ap.add_argument("--aligned-heads", type=parse_aligned_heads,
                    help="Multilingual: LAYER:HEAD pairs the alignment analyzer reads, for non-standard sizes "
                         "(official: %s)" % ",".join(f"{l}:{h}" for l, h in ALIGNED_HEADS))
    args = ap.parse_args(argv)
    try:
        for line in convert(args.ckpt, args.out_dir, args.variant, args.weights, args.t3_heads, args.cfm_heads,
                            args.t3_file, args.aligned_heads, args.decoder_weights):
            print(line)
    except Exception as e:  # one line for the user, whatever failed
        msg = str(e) if isinstance(e, ConversionError) else f"missing tensor or key {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
        print(f"convert.py: {args.ckpt}: {msg}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
