#!/usr/bin/env python3
"""Chatterbox Turbo parity fixtures from the installed reference package (chatterbox-tts 0.1.7).

Builds the official Turbo modules with RANDOM weights, saves them under the official checkpoint
names/formats, reloads them the way the reference loader does (strict), and dumps per-stage
reference outputs (.npy) plus stages.json.  Every random draw of the pipeline is either dumped
(CFM z / noised_mels, SineGen phases / noise) or replaced by an injected draw (T3 token sampling).

    target/chatterbox-venv/bin/python tools/chatterbox/make_fixtures.py --size tiny \
        --out tests/fixtures/chatterbox/turbo-tiny
"""
import argparse
import copy
import hashlib
import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import chatterbox  # noqa: F401  (package __init__ imports tts/vc/mtl_tts; needs the dist installed)
import chatterbox.models.s3gen.s3gen as s3gen_mod
import chatterbox.models.s3gen.transformer.upsample_encoder as upenc_mod
import chatterbox.models.s3gen.xvector as xvector_mod
import chatterbox.models.s3gen.hifigan as hifigan_mod
from chatterbox.models.t3 import T3
from chatterbox.models.t3.llama_configs import LLAMA_CONFIGS, GPT2_MEDIUM_CONFIG
from chatterbox.models.t3.modules.t3_config import T3Config
from chatterbox.models.t3.modules.cond_enc import T3Cond
from chatterbox.models.s3gen import S3Gen
from chatterbox.models.s3gen.const import S3GEN_SIL
from chatterbox.models.voice_encoder import VoiceEncoder
from chatterbox.models.voice_encoder.config import VoiceEncConfig
from chatterbox.tts_turbo import Conditionals
from s3tokenizer.model_v2 import S3TokenizerV2
from safetensors.torch import save_file, load_file
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

# --------------------------------------------------------------------------------------------
# Sizes
# --------------------------------------------------------------------------------------------

SPEECH_VOCAB = 6563  # 6561 S3 codes + start 6561 + stop 6562 (kept at full size: token semantics)
START_SPEECH = 6561
STOP_SPEECH = 6562

SIZES = {
    "full": dict(
        t3_config=None,            # official GPT2_medium (turbo) / GPT2_small (nano) entry
        text_vocab=50276,
        cond_prompt_len=375,       # T3 speech prompt tokens (15 s @ 25 Hz)
        gen_prompt_tokens=250,     # S3Gen prompt tokens (10 s) -> prompt_feat 500 frames
        ve=None,
        s3=None,
        s3_speech_tokens=20,       # tokens of the greedy stream sent to S3Gen (+3 silence)
        sampler_rows=(0, 5),       # teacher-forced logit rows run through the sampler stage by stage
        threads=2,
    ),
    "tiny": dict(
        t3_config=dict(n_embd=16, hidden_size=16, n_head=2, n_layer=2, n_positions=160,
                       n_ctx=160, vocab_size=384),
        text_vocab=384,
        cond_prompt_len=12,
        gen_prompt_tokens=6,
        ve=dict(ve_hidden_size=24),
        s3=dict(
            enc=dict(size=16, heads=2, linear_units=48, num_blocks=1),
            dec=dict(channels=[16], num_heads=2, attention_head_dim=12, n_blocks=1, num_mid_blocks=1),
            hift=dict(base_channels=32),
            f0=dict(cond_channels=24),
            campplus=dict(m_channels=4, growth_rate=4, bn_size=2, init_channels=8),
            tokenizer=dict(n_audio_state=64, n_audio_head=1, n_audio_layer=1),
        ),
        s3_speech_tokens=8,
        sampler_rows=(5,),
        threads=1,
    ),
}

# Fixed text token ids (tokenizer bypassed).  Full: GPT-2 BPE ids intended to spell
# "Hello, this is a test." (15496 "Hello", 11 ",", 428 " this", 318 " is", 257 " a",
# 1332 " test", 13 ".") -- not verified offline against the Turbo tokenizer files.
TEXT_IDS = {
    "full": [15496, 11, 428, 318, 257, 1332, 13],
    "tiny": [300, 11, 42, 318, 257, 133, 13],
}

N_TF_STEPS = 20          # teacher-forced steps after the prefill
N_GREEDY_STEPS = 20      # greedy: prefill token + 20 loop steps = 21 tokens
N_SAMPLED_STEPS = 20     # injected-uniform sampled stream: 21 tokens
TURBO_SAMPLING = dict(temperature=0.8, top_k=1000, top_p=0.95, repetition_penalty=1.2)


# --------------------------------------------------------------------------------------------
# Construction (constructor args / run-time patches only; the installed package is not edited)
# --------------------------------------------------------------------------------------------

@contextmanager
def patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _override(cls, over):
    """Callable standing in for `cls` that forces keyword overrides (the real class is built)."""
    def make(*args, **kw):
        kw.update(over)
        return cls(*args, **kw)
    return make


def t3_hparams(size, variant):
    hp = T3Config(text_tokens_dict_size=SIZES[size]["text_vocab"])
    cfg = SIZES[size]["t3_config"]
    if size == "full":
        if variant == "turbo":
            hp.llama_config_name = "GPT2_medium"
        else:
            if "GPT2_small" not in LLAMA_CONFIGS:  # 0.1.7 predates Nano; HEAD's GPT2_SMALL_CONFIG dims
                d = dict(GPT2_MEDIUM_CONFIG)
                d.update(n_embd=768, hidden_size=768, n_head=12, n_layer=12)
                LLAMA_CONFIGS["GPT2_small"] = d
            hp.llama_config_name = "GPT2_small"
    else:
        d = dict(GPT2_MEDIUM_CONFIG)
        d.update(cfg)
        d["attn_implementation"] = "sdpa"
        LLAMA_CONFIGS["GPT2_fixture_tiny"] = d
        hp.llama_config_name = "GPT2_fixture_tiny"
    # Turbo-specific hp, exactly as ChatterboxTurboTTS.from_local sets them
    hp.speech_tokens_dict_size = SPEECH_VOCAB
    hp.input_pos_emb = None
    hp.speech_cond_prompt_len = SIZES[size]["cond_prompt_len"]
    hp.use_perceiver_resampler = False
    hp.emotion_adv = False
    return hp


def build_t3(size, variant):
    t3 = T3(t3_hparams(size, variant))
    return t3


def ve_config(size):
    hp = VoiceEncConfig()
    for k, v in (SIZES[size]["ve"] or {}).items():
        setattr(hp, k, v)
    return hp


def build_ve(size):
    return VoiceEncoder(ve_config(size))


def build_s3gen(size, meanflow=True, s3=None):
    s3 = s3 if s3 is not None else SIZES[size]["s3"]
    if s3 is None:
        return S3Gen(meanflow=meanflow)
    enc, dec = s3["enc"], s3["dec"]
    d = enc["size"]
    tok_cfg = S3TokenizerV2.__init__.__defaults__[0]  # shared default ModelConfig instance
    saved = {k: getattr(tok_cfg, k) for k in s3["tokenizer"]}
    fcm_defaults = xvector_mod.FCM.__init__.__defaults__
    try:
        for k, v in s3["tokenizer"].items():
            setattr(tok_cfg, k, v)
        xvector_mod.FCM.__init__.__defaults__ = (fcm_defaults[0], fcm_defaults[1],
                                                s3["campplus"]["m_channels"], fcm_defaults[3])
        cam = {k: v for k, v in s3["campplus"].items() if k != "m_channels"}
        with patched(upenc_mod, "PreLookaheadLayer", _override(upenc_mod.PreLookaheadLayer, dict(channels=d))), \
             patched(upenc_mod, "Upsample1D", _override(upenc_mod.Upsample1D, dict(channels=d, out_channels=d))), \
             patched(s3gen_mod, "UpsampleConformerEncoder", _override(
                 s3gen_mod.UpsampleConformerEncoder,
                 dict(input_size=d, output_size=d, attention_heads=enc["heads"],
                      linear_units=enc["linear_units"], num_blocks=enc["num_blocks"]))), \
             patched(s3gen_mod, "CausalMaskedDiffWithXvec", _override(
                 s3gen_mod.CausalMaskedDiffWithXvec, dict(input_size=d))), \
             patched(s3gen_mod, "ConditionalDecoder", _override(s3gen_mod.ConditionalDecoder, dec)), \
             patched(s3gen_mod, "CAMPPlus", _override(s3gen_mod.CAMPPlus, cam)), \
             patched(s3gen_mod, "ConvRNNF0Predictor", _override(s3gen_mod.ConvRNNF0Predictor, s3["f0"])), \
             patched(s3gen_mod, "HiFTGenerator", _override(s3gen_mod.HiFTGenerator, s3["hift"])):
            model = S3Gen(meanflow=meanflow)
    finally:
        for k, v in saved.items():
            setattr(tok_cfg, k, v)
        xvector_mod.FCM.__init__.__defaults__ = fcm_defaults
    return model


# --------------------------------------------------------------------------------------------
# Randomisation of what the default init leaves trivial
# --------------------------------------------------------------------------------------------

@torch.no_grad()
def randomize(t3, s3gen, ve, g):
    def rn(shape, std):
        return torch.randn(shape, generator=g) * std

    for model in (t3, s3gen, ve):
        for mod in model.modules():
            if isinstance(mod, (nn.LayerNorm, nn.BatchNorm1d, nn.BatchNorm2d)):
                if getattr(mod, "weight", None) is not None:
                    mod.weight.copy_(1.0 + rn(mod.weight.shape, 0.1))
                if getattr(mod, "bias", None) is not None:
                    mod.bias.copy_(rn(mod.bias.shape, 0.1))
                if isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d)) and mod.running_mean is not None:
                    mod.running_mean.copy_(rn(mod.running_mean.shape, 0.1))
                    mod.running_var.copy_(torch.rand(mod.running_var.shape, generator=g) + 0.5)
        # every remaining constant parameter (zero biases, ones, ...) gets a small perturbation
        for name, p in model.named_parameters():
            if p.numel() > 1 and torch.all(p == p.reshape(-1)[0]):
                p.add_(rn(p.shape, 0.02))

    # Snake alpha near 1 (default exactly 1)
    for mod in s3gen.modules():
        if isinstance(mod, hifigan_mod.Snake):
            mod.alpha.copy_(0.7 + 0.6 * torch.rand(mod.alpha.shape, generator=g))
    # weight-norm g != ||v|| so that g * v / ||v|| is exercised
    for name, p in s3gen.named_parameters():
        if name.endswith("parametrizations.weight.original0"):
            p.mul_(0.8 + 0.4 * torch.rand(p.shape, generator=g))
    # non-identity meanflow time mixer (default init is [I | 0])
    mixer = getattr(s3gen.flow.decoder.estimator, "time_embed_mixer", None)
    if mixer is not None:
        D = mixer.weight.shape[0]
        mixer.weight.add_(rn(mixer.weight.shape, 0.5 / (2 * D) ** 0.5))
    if t3.speech_head.bias is not None:
        t3.speech_head.bias.copy_(rn(t3.speech_head.bias.shape, 0.5))


@torch.no_grad()
def scale_t3_logits(t3, conds, text_ids, target_std=3.0):
    """Default init gives speech logits std ~0.1 (flat sampler); rescale speech_head so that the
    prefill logits have std `target_std` (top-k/top-p/rep-penalty then act on a few hundred ids)."""
    embeds, _ = t3.prepare_input_embeds(t3_cond=copy.deepcopy(conds.t3), text_tokens=torch.tensor([text_ids]),
                                        speech_tokens=torch.tensor([[START_SPEECH]]), cfg_weight=0.0)
    h = t3.tfmr(inputs_embeds=embeds)[0][:, -1]
    k = target_std / float(t3.speech_head(h).std())
    t3.speech_head.weight.mul_(k)
    t3.speech_head.bias.mul_(k)
    return k


@torch.no_grad()
def steer_f0(s3gen, mel, lo=120.0, hi=280.0):
    """Rescale the F0 classifier so that f0 = |W h + b| lies in [lo, hi] Hz on this mel."""
    f0p = s3gen.mel2wav.f0_predictor
    h = f0p.condnet(mel).transpose(1, 2)  # (1, T, C)
    proj = (h @ f0p.classifier.weight[0]).reshape(-1)
    mid, half = (lo + hi) / 2, (hi - lo) / 2
    scale = half / float((proj - proj.mean()).abs().max().clamp_min(1e-6))
    f0p.classifier.weight.mul_(scale)
    f0p.classifier.bias.fill_(mid - float(proj.mean()) * scale)
    f0 = f0p(mel)
    return float(f0.min()), float(f0.max())


# --------------------------------------------------------------------------------------------
# Conditionals
# --------------------------------------------------------------------------------------------

def make_conds(size, g, ve_embed_size=256):
    L = SIZES[size]["cond_prompt_len"]
    P = SIZES[size]["gen_prompt_tokens"]
    spk = torch.randn(1, ve_embed_size, generator=g)
    spk = spk / spk.norm(dim=1, keepdim=True)
    t3c = T3Cond(
        speaker_emb=spk,
        cond_prompt_speech_tokens=torch.randint(0, 6561, (1, L), generator=g),
        emotion_adv=0.5 * torch.ones(1, 1, 1),
    )
    gen = dict(
        prompt_token=torch.randint(0, 6561, (1, P), generator=g),
        prompt_token_len=torch.tensor([P]),
        prompt_feat=(-6.0 + 2.0 * torch.randn(1, 2 * P, 80, generator=g)).clamp(-11.5, 2.0),
        prompt_feat_len=None,
        embedding=torch.randn(1, 192, generator=g),
    )
    return Conditionals(t3c, gen)


# --------------------------------------------------------------------------------------------
# Dump bookkeeping
# --------------------------------------------------------------------------------------------

class Dumper:
    def __init__(self, out):
        self.out = out
        self.stages = {}

    def __call__(self, name, arr, module, inputs, note=""):
        if torch.is_tensor(arr):
            arr = arr.detach().cpu()
            arr = arr.numpy() if arr.dtype != torch.bool else arr.to(torch.uint8).numpy()
        arr = np.ascontiguousarray(arr)
        if arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        np.save(self.out / f"{name}.npy", arr)
        self.stages[name] = dict(file=f"{name}.npy", shape=list(arr.shape), dtype=str(arr.dtype),
                                 module=module, inputs=list(inputs), note=note)


@contextmanager
def record_rng(log):
    """Record (not replace) every torch.randn / randn_like / Uniform.sample draw, in order."""
    real_randn, real_randn_like = torch.randn, torch.randn_like
    real_sample = torch.distributions.uniform.Uniform.sample

    def randn(*a, **k):
        t = real_randn(*a, **k)
        log.append(("torch.randn", t))
        return t

    def randn_like(*a, **k):
        t = real_randn_like(*a, **k)
        log.append(("torch.randn_like", t))
        return t

    def sample(self, *a, **k):
        t = real_sample(self, *a, **k)
        log.append(("Uniform(-pi,pi).sample", t))  # SineGen zeroes [:, 0] in place afterwards
        return t

    torch.randn, torch.randn_like = randn, randn_like
    torch.distributions.uniform.Uniform.sample = sample
    try:
        yield
    finally:
        torch.randn, torch.randn_like = real_randn, real_randn_like
        torch.distributions.uniform.Uniform.sample = real_sample


@contextmanager
def replace_multinomial(fn):
    real = torch.multinomial
    torch.multinomial = fn
    try:
        yield
    finally:
        torch.multinomial = real


def run_turbo(t3, conds, text_ids, draw, max_gen_len, **sampling):
    """Run the reference T3.inference_turbo with torch.multinomial replaced by `draw`.
    Returns (tokens, raw logits per step, probs passed to the draw per step)."""
    logits_log, probs_log = [], []
    hook = t3.speech_head.register_forward_hook(lambda m, i, o: logits_log.append(o[0, -1].clone()))

    def multinomial(probs, num_samples=1, *a, **k):
        probs_log.append(probs[0].clone())
        tok = draw(len(probs_log) - 1, probs[0])
        return torch.tensor([[tok]], dtype=torch.long)

    cond = copy.deepcopy(conds.t3)
    try:
        with replace_multinomial(multinomial):
            toks = t3.inference_turbo(cond, torch.tensor([text_ids]), max_gen_len=max_gen_len, **sampling)
    finally:
        hook.remove()
    return toks, torch.stack(logits_log), torch.stack(probs_log)


def load_tiny_turbo(ckpt, size="tiny"):
    """The Turbo models of a checkpoint directory this script wrote (`size` as it was
    written), as `ChatterboxTurboTTS.from_local` loads them: (t3, s3gen, ve, tokenizer), in
    eval mode."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer
    t3 = build_t3(size, "turbo")
    t3.load_state_dict(load_file(ckpt / "t3_turbo_v1.safetensors"))
    del t3.tfmr.wte
    t3.eval()
    s3gen = build_s3gen(size)
    s3gen.load_state_dict(load_file(ckpt / "s3gen_meanflow.safetensors"), strict=True)
    s3gen.eval()
    ve = build_ve(size)
    ve.load_state_dict(load_file(ckpt / "ve.safetensors"))
    ve.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(ckpt))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return t3, s3gen, ve, tokenizer


def generate_recorded(tts, seed, max_gen_len, text, **kwargs):
    """`tts.generate(text, **kwargs)` on a ChatterboxTurboTTS with the watermark off, T3 capped at
    `max_gen_len` tokens, `torch.multinomial` drawing by inverse CDF from seeded uniforms, and the
    other draws recorded. Returns (uniforms, drawn tokens, cfm z, sine phase, sine noise, wav)."""
    import torch
    from functools import partial
    tts.watermarker.apply_watermark = lambda wav, sample_rate: wav
    tts.t3.inference_turbo = partial(type(tts.t3).inference_turbo, tts.t3, max_gen_len=max_gen_len)
    g = torch.Generator().manual_seed(seed)
    uniforms = torch.rand(max_gen_len + 1, generator=g, dtype=torch.float32)
    drawn = []

    def multinomial(probs, num_samples=1, *a, **k):
        tok = inverse_cdf(probs[0], float(uniforms[len(drawn)]))
        drawn.append(tok)
        return torch.tensor([[tok]], dtype=torch.long)

    rng_log = []
    torch.manual_seed(seed)
    with replace_multinomial(multinomial), record_rng(rng_log), torch.inference_mode():
        wav = tts.generate(text, **kwargs)
    kinds = [k for k, _ in rng_log]
    assert kinds == ["torch.randn", "torch.randn_like", "Uniform(-pi,pi).sample", "torch.randn_like",
                     "torch.randn_like"], kinds
    _, z, phase, sine_noise, _ = [t for _, t in rng_log]
    return uniforms, drawn, z, phase, sine_noise, wav


def save_pipeline_case(out, uniforms, drawn, z, phase, sine_noise, wav, case):
    """Writes an end-to-end case: the draws the engine injects (`t3_uniforms`, `cfm_z`,
    `sine_phase`, `sine_noise`), the drawn `speech_tokens`, the `wav` and `case.json`."""
    out.mkdir(parents=True, exist_ok=True)
    save = lambda name, a: np.save(out / f"{name}.npy", np.ascontiguousarray(a))
    save("t3_uniforms", uniforms.numpy())
    save("speech_tokens", np.array(drawn, dtype=np.int64))
    save("cfm_z", z.numpy())
    save("sine_phase", phase.numpy())
    save("sine_noise", sine_noise.numpy())
    save("wav", wav.numpy().reshape(-1).astype(np.float32))
    (out / "case.json").write_text(json.dumps(dict(case, speech_tokens=drawn, samples=int(wav.numel()))) + "\n")


def start(args, threads):
    """What every fixture run sets first: threads (`--threads` or the size's), deterministic
    kernels, the seed; returns the output directory, created."""
    torch.set_num_threads(args.threads or threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    return args.out


def inverse_cdf(probs, u):
    """Token = first index i with cumsum(probs)[i] > u * sum(probs) (float32, ascending id order)."""
    c = torch.cumsum(probs.to(torch.float32), dim=0)
    idx = int(torch.searchsorted(c, (u * c[-1]).reshape(1), right=True)[0])
    return min(idx, probs.numel() - 1)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--variant", choices=["turbo", "nano"], default="turbo",
                    help="nano = GPT2_small backbone saved as t3_nano_v1.safetensors (full size only)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-dumps", action="store_true", help="checkpoints only")
    args = ap.parse_args()
    if args.variant == "nano" and args.size != "full":
        ap.error("--variant nano needs --size full (tiny has its own backbone config)")

    cfg = SIZES[args.size]
    out = start(args, cfg["threads"])
    t_start = time.time()
    timings = {}

    t3_name = "t3_turbo_v1.safetensors" if args.variant == "turbo" else "t3_nano_v1.safetensors"
    text_ids = TEXT_IDS[args.size]
    g = torch.Generator().manual_seed(args.seed)

    # ---------------- phase 1: build, randomise, steer, save --------------------------------
    t0 = time.time()
    t3 = build_t3(args.size, args.variant).eval()
    s3gen = build_s3gen(args.size).eval()
    ve = build_ve(args.size).eval()
    randomize(t3, s3gen, ve, g)
    conds = make_conds(args.size, g)
    scale_t3_logits(t3, conds, text_ids)
    conds.save(out / "conds.pt")  # Conditionals.save: {"t3": T3Cond.__dict__, "gen": dict}
    timings["build_s"] = time.time() - t0

    given = torch.randint(0, 6561, (N_TF_STEPS + 1,), generator=g).tolist()
    uniforms = torch.rand(N_SAMPLED_STEPS + 1, generator=g, dtype=torch.float32)
    sampler_seed = int(torch.randint(0, 2**31 - 1, (1,), generator=g))
    s3gen_seed = int(torch.randint(0, 2**31 - 1, (1,), generator=g))

    # F0 steering needs the mel the fixture will actually produce: greedy tokens -> flow
    greedy1, _, _ = run_turbo(t3, conds, text_ids, lambda i, p: int(torch.argmax(p)), N_GREEDY_STEPS,
                              temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0)
    s3_tokens = s3gen_input_tokens(greedy1, cfg["s3_speech_tokens"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(s3gen_seed)
        mel = s3gen.flow_inference(s3_tokens, ref_dict=copy.deepcopy(conds.gen), n_cfm_timesteps=2,
                                   finalize=True)
    f0_range = steer_f0(s3gen, mel)

    save_file({k: v.contiguous() for k, v in t3.state_dict().items()}, out / t3_name)
    save_file({k: v.contiguous() for k, v in s3gen.state_dict().items()}, out / "s3gen_meanflow.safetensors")
    save_file({k: v.contiguous() for k, v in ve.state_dict().items()}, out / "ve.safetensors")
    del t3, s3gen, ve
    timings["phase1_s"] = time.time() - t0

    # ---------------- phase 2: reload like ChatterboxTurboTTS.from_local --------------------
    t0 = time.time()
    ve = build_ve(args.size)
    ve.load_state_dict(load_file(out / "ve.safetensors"))
    ve.eval()
    t3 = build_t3(args.size, args.variant)
    t3.load_state_dict(load_file(out / t3_name))  # strict
    del t3.tfmr.wte
    t3.eval()
    s3gen = build_s3gen(args.size)
    s3gen.load_state_dict(load_file(out / "s3gen_meanflow.safetensors"), strict=True)
    s3gen.eval()
    conds = Conditionals.load(out / "conds.pt")
    timings["reload_s"] = time.time() - t0
    attn_impl = t3.tfmr.config._attn_implementation

    meta = dict(
        reference="chatterbox-tts==0.1.7 (torch %s, transformers %s)" % (
            torch.__version__, __import__("transformers").__version__),
        size=args.size, variant=args.variant, seed=args.seed, threads=torch.get_num_threads(),
        dtype="float32", device="cpu", t3_attn_implementation=attn_impl,
        text_ids=text_ids, teacher_forced_tokens=given,
        sizes=json.loads(json.dumps(cfg)),
        t3_backbone={k: LLAMA_CONFIGS[t3.hp.llama_config_name][k]
                     for k in ("n_embd", "n_head", "n_layer", "n_positions", "vocab_size",
                               "activation_function", "layer_norm_epsilon")},
        f0_steered_range_hz=f0_range,
        checkpoints={},
    )
    if args.no_dumps:
        finish(out, meta, Dumper(out), timings, t_start, t3_name)
        return

    dump = Dumper(out)
    T3M = "T3 (%s backbone, %s attention)" % (t3.hp.llama_config_name, attn_impl)
    dump("t3_text_ids", torch.tensor(text_ids, dtype=torch.int64), "input", [],
         "fixed text token ids (tokenizer bypassed)")
    with torch.inference_mode():
        cond_emb = t3.prepare_conditioning(copy.deepcopy(conds.t3))
        embeds, len_cond = t3.prepare_input_embeds(
            t3_cond=copy.deepcopy(conds.t3), text_tokens=torch.tensor([text_ids]),
            speech_tokens=torch.tensor([[START_SPEECH]]), cfg_weight=0.0)
    dump("t3_cond_emb", cond_emb[0], "T3.prepare_conditioning", ["conds.pt:t3"],
         "[spkr_enc(speaker_emb) | speech_emb(cond_prompt_speech_tokens)], no positional term for GPT-2")
    dump("t3_prefill_embeds", embeds[0], "T3.prepare_input_embeds", ["t3_cond_emb", "t3_text_ids"],
         "[cond | text_emb(text_ids) | speech_emb(6561)]; GPT-2 wpe is added inside the backbone")

    # teacher forcing: prefill + 20 steps over given tokens
    t0 = time.time()
    toks, logits, _ = run_turbo(t3, conds, text_ids, lambda i, p: given[i], N_TF_STEPS,
                                temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0)
    assert toks[0].tolist() == given
    dump("t3_tf_tokens", torch.tensor(given, dtype=torch.int64), "input", [],
         "teacher-forced speech tokens; token i is fed after logits row i (the last one is never fed)")
    dump("t3_tf_logits", logits, T3M + ".inference_turbo (speech_head hook)",
         ["conds.pt", "t3_text_ids", "t3_tf_tokens"],
         "row 0 = prefill (last position, after speech start 6561); row i = after feeding t3_tf_tokens[i-1] "
         "with the KV cache")
    timings["t3_teacher_forced_s"] = time.time() - t0

    # greedy
    greedy, glogits, _ = run_turbo(t3, conds, text_ids, lambda i, p: int(torch.argmax(p)), N_GREEDY_STEPS,
                                   temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0)
    assert torch.equal(greedy, greedy1), "greedy stream changed after the checkpoint round trip"
    dump("t3_greedy_tokens", greedy[0], T3M + ".inference_turbo",
         ["conds.pt", "t3_text_ids"],
         "argmax of raw logits (temperature 1, top_k 0, top_p 1, rep 1: no processors); prefill token + "
         "%d loop steps" % N_GREEDY_STEPS)

    # sampler path on recorded teacher-forced rows, reference processor order
    procs = [("temperature", TemperatureLogitsWarper(TURBO_SAMPLING["temperature"])),
             ("top_k", TopKLogitsWarper(TURBO_SAMPLING["top_k"])),
             ("top_p", TopPLogitsWarper(TURBO_SAMPLING["top_p"])),
             ("rep_penalty", RepetitionPenaltyLogitsProcessor(TURBO_SAMPLING["repetition_penalty"]))]
    sg = torch.Generator().manual_seed(sampler_seed)
    rows = {}
    sampler_rows = list(cfg["sampler_rows"])
    for r in range(1, N_TF_STEPS + 1):  # also one row where the repetition penalty hits a kept id
        x = procs[2][1](torch.tensor([given[:r]]), procs[1][1](None, procs[0][1](None, logits[r:r + 1])))
        if torch.isfinite(x[0, given[:r]]).any():
            if r not in sampler_rows:
                sampler_rows.append(r)
            break
    meta["sampler_rows"] = sampler_rows
    for r in sampler_rows:
        ids = torch.tensor([[START_SPEECH]]) if r == 0 else torch.tensor([given[:r]])
        x = logits[r:r + 1].clone()
        rows[f"r{r}_input_ids"] = ids[0]
        rows[f"r{r}_in"] = x[0]
        for pname, p in procs:
            x = p(ids, x)
            rows[f"r{r}_{pname}"] = x[0].clone()
        probs = F.softmax(x, dim=-1)
        rows[f"r{r}_probs"] = probs[0]
        rows[f"r{r}_multinomial"] = torch.multinomial(probs, 1, generator=sg)[0]
    for k, v in rows.items():
        r = k.split("_")[0]
        dump(f"t3_sampler_{k}", v, "transformers 5.2.0 logits processors (inference_turbo order)",
             [f"t3_tf_logits[{r[1:]}]"],
             {"input_ids": "ids passed to the processors (step 0: [6561]; later: generated tokens only)",
              "in": "raw logits row", "temperature": "/0.8", "top_k": "top_k 1000 (-inf outside)",
              "top_p": "top_p 0.95 (sorted ascending, cumsum <= 0.05 removed, keep >=1)",
              "rep_penalty": "penalty 1.2 over unique input_ids (logit>0: /1.2, <0: *1.2), applied LAST",
              "probs": "softmax of the processed logits",
              "multinomial": "torch.multinomial(probs, 1, generator=torch.Generator().manual_seed("
                             f"{sampler_seed})) drawn for rows %s in that order" % (sampler_rows,)}[
                 k.split("_", 1)[1]])

    # sampled stream with injected uniforms (Turbo default sampling params)
    samp, slogits, sprobs = run_turbo(t3, conds, text_ids, lambda i, p: inverse_cdf(p, float(uniforms[i])),
                                      N_SAMPLED_STEPS, **TURBO_SAMPLING)
    dump("t3_sampled_uniforms", uniforms, "input (torch.rand, seeded)", [],
         "one U[0,1) per step; replaces torch.multinomial inside inference_turbo")
    dump("t3_sampled_tokens", samp[0], T3M + ".inference_turbo with multinomial -> inverse CDF",
         ["conds.pt", "t3_text_ids", "t3_sampled_uniforms"],
         "T 0.8, top_k 1000, top_p 0.95, rep 1.2; token = first i with cumsum(probs)[i] > u*sum(probs) "
         "(float32 cumsum over ids ascending). A trailing 6562 would be stripped by the reference.")

    # ---------------- S3Gen -----------------------------------------------------------------
    t0 = time.time()
    s3_tokens = s3gen_input_tokens(greedy, cfg["s3_speech_tokens"])
    dump("s3gen_tokens", s3_tokens[0], "input", ["t3_greedy_tokens"],
         "first %d greedy tokens (< 6561) + [4299, 4299, 4299] silence, as ChatterboxTurboTTS.generate"
         % cfg["s3_speech_tokens"])
    rec = {}
    hooks = []

    def keep(name, fn=lambda o: o):
        return lambda m, i, o: rec.__setitem__(name, fn(o))

    flow = s3gen.flow
    hooks.append(flow.spk_embed_affine_layer.register_forward_hook(keep("spks")))
    hooks.append(flow.encoder.register_forward_hook(keep("enc", lambda o: o[0].clone())))
    hooks.append(flow.encoder_proj.register_forward_hook(keep("mu")))
    hift = s3gen.mel2wav
    hooks.append(hift.f0_predictor.register_forward_hook(keep("f0")))
    hooks.append(hift.m_source.register_forward_hook(keep("source", lambda o: o[0].clone())))
    hooks.append(hift.f0_predictor.register_forward_pre_hook(
        lambda m, i: rec.__setitem__("mel", i[0].clone())))
    hooks.append(hift.conv_post.register_forward_hook(keep("conv_post", lambda o: o.clone())))

    est = flow.decoder.estimator
    est_calls = []
    est_forward = type(est).forward

    def est_wrap(x, mask, mu, t, spks=None, cond=None, r=None):
        out_ = est_forward(est, x, mask, mu, t, spks=spks, cond=cond, r=r)
        est_calls.append(dict(x=x.clone(), mask=mask.clone(), mu=mu.clone(), t=t.clone(), r=r.clone(),
                              spks=spks.clone(), cond=cond.clone(), v=out_.clone()))
        return out_
    est.forward = est_wrap

    istft_out = {}
    real_istft = hift._istft

    def istft_wrap(mag, phase):
        y = real_istft(mag, phase)
        istft_out["y"] = y.clone()
        return y
    hift._istft = istft_wrap

    decode_out = {}
    real_decode = hift.decode

    def decode_wrap(x, s):
        decode_out["s"] = s.clone()
        y = real_decode(x=x, s=s)
        decode_out["y"] = y.clone()
        return y
    hift.decode = decode_wrap

    rng_log = []
    torch.manual_seed(s3gen_seed)
    with record_rng(rng_log):
        wav, _ = s3gen.inference(s3_tokens, ref_dict=copy.deepcopy(conds.gen), n_cfm_timesteps=2)
    for h in hooks:
        h.remove()
    del est.forward, hift._istft, hift.decode
    timings["s3gen_s"] = time.time() - t0

    kinds = [k for k, _ in rng_log]
    assert kinds == ["torch.randn", "torch.randn_like", "Uniform(-pi,pi).sample",
                     "torch.randn_like", "torch.randn_like"], kinds
    noised_mels, z, phase, sine_noise, nsf_noise = [t for _, t in rng_log]
    S3M = "S3Gen(meanflow=True)"
    P = int(conds.gen["prompt_token"].shape[1])
    dump("s3gen_spks", rec["spks"], S3M + ".flow.spk_embed_affine_layer", ["conds.pt:gen.embedding"],
         "Linear(192->80) of F.normalize(embedding)")
    dump("s3gen_encoder_out", rec["enc"], S3M + ".flow.encoder (UpsampleConformerEncoder)",
         ["conds.pt:gen.prompt_token", "s3gen_tokens"],
         "input = input_embedding(concat(prompt_token, s3gen_tokens)); output (1, 2*(P+N), D), after after_norm")
    dump("s3gen_mu", rec["mu"], S3M + ".flow.encoder_proj", ["s3gen_encoder_out"], "(1, 2(P+N), 80)")
    dump("s3gen_noised_mels", noised_mels, "S3Token2Wav.flow_inference: torch.randn(1, 80, 2*N)",
         [], "RNG draw 1 (torch.manual_seed(%d) just before s3gen.inference); overwrites z[..., 2P:]" % s3gen_seed)
    dump("s3gen_z", z, "CausalConditionalCFM.forward: torch.randn_like(mu)", [],
         "RNG draw 2 as used: the reference overwrites z[..., 2P:] in place with s3gen_noised_mels, so this "
         "is the initial Euler state (= s3gen_cfm_step0_x)")
    for i, c in enumerate(est_calls):
        dump(f"s3gen_cfm_step{i}_x", c["x"], "CausalConditionalCFM.basic_euler", 
             ["s3gen_z", "s3gen_noised_mels"] if i == 0 else [f"s3gen_cfm_step{i-1}_x", f"s3gen_cfm_step{i-1}_v"],
             "estimator input x at step %d (t=%g, r=%g)" % (i, float(c["t"]), float(c["r"])))
        dump(f"s3gen_cfm_step{i}_v", c["v"], S3M + ".flow.decoder.estimator (ConditionalDecoder, meanflow)",
             [f"s3gen_cfm_step{i}_x", "s3gen_mu", "s3gen_spks", "s3gen_cond", "mask=ones"],
             "velocity; next x = x + (r - t) * v")
    dump("s3gen_cond", est_calls[0]["cond"], "CausalMaskedDiffWithXvec.inference", ["conds.pt:gen.prompt_feat"],
         "(1, 80, 2(P+N)): prompt_feat in the first 2P frames, zeros after")
    assert torch.equal(rec["mel"], decode_in_mel(est_calls, P))
    dump("s3gen_mel", rec["mel"],
         "CausalMaskedDiffWithXvec.inference", ["s3gen_cfm_step1_x", "s3gen_cfm_step1_v"],
         "final x after 2 Euler steps, prompt frames [0, 2P) dropped: (1, 80, 2N)")
    dump("hift_f0", rec["f0"], S3M + ".mel2wav.f0_predictor (ConvRNNF0Predictor)", ["s3gen_mel"],
         "Hz, (1, 2N); classifier steered so f0 is in %.0f..%.0f Hz" % f0_range)
    dump("hift_sine_phase", phase, "SineGen: Uniform(-pi, pi).sample((1, 9, 1))", [],
         "RNG draw 3, as used (row 0 zeroed in place by the reference)")
    dump("hift_sine_noise", sine_noise, "SineGen: torch.randn_like(sine_waves)", [],
         "RNG draw 4, (1, 9, 480*2N), standard normal; scaled by uv*0.003 + (1-uv)*0.1/3")
    dump("hift_source", decode_out["s"], S3M + ".mel2wav.m_source (SourceModuleHnNSF) -> (1,1,L)",
         ["hift_f0", "hift_sine_phase", "hift_sine_noise"],
         "tanh(l_linear(SineGen(upsample_nearest_480(f0)))) transposed to (1, 1, L). RNG draw 5 "
         "(torch.randn_like(uv), the unused noise branch, shape (1, L, 1)) is not dumped")
    dump("hift_conv_post", rec["conv_post"], S3M + ".mel2wav.conv_post", ["s3gen_mel", "hift_source"],
         "HiFT body output before ISTFT, (1, 18, 120*2N+1): [:9] -> exp (clip 100) magnitude, [9:] -> sin phase")
    dump("hift_istft", istft_out["y"], S3M + ".mel2wav._istft (torch.istft n_fft 16 hop 4 hann)",
         ["hift_conv_post"], "before the +-0.99 clamp, (1, 480*2N)")
    dump("hift_wav", decode_out["y"], S3M + ".mel2wav.decode", ["hift_istft"], "after clamp(+-0.99)")
    dump("s3gen_wav", wav, S3M + ".inference", ["hift_wav"],
         "final waveform: first 960 samples * trim_fade (480 zeros + 480-sample raised cosine); no watermark")
    meta["rng_draw_order"] = kinds
    meta["s3gen_seed"] = s3gen_seed
    meta["sampler_seed"] = sampler_seed

    # ---------------- VoiceEncoder ----------------------------------------------------------
    mels = torch.rand(2, 160, 40, generator=g) ** 2 * 4.0
    with torch.inference_mode():
        ve_emb = ve(mels)
    dump("ve_mels", mels, "input", [], "2 partials of 160 frames x 40 linear power mel bins")
    dump("ve_embeds", ve_emb, "VoiceEncoder.forward", ["ve_mels"], "L2-normalised partial embeddings (2, 256)")

    finish(out, meta, dump, timings, t_start, t3_name)


def decode_in_mel(est_calls, P):
    c = est_calls[-1]
    x = c["x"] + (c["r"] - c["t"]) * c["v"]
    return x[:, :, 2 * P:]


def s3gen_input_tokens(tokens, n):
    toks = tokens[tokens < 6561][:n]
    sil = torch.tensor([S3GEN_SIL, S3GEN_SIL, S3GEN_SIL]).long()
    return torch.cat([toks, sil])[None]


def finish(out, meta, dump, timings, t_start, t3_name):
    for f in (t3_name, "s3gen_meanflow.safetensors", "ve.safetensors", "conds.pt"):
        meta["checkpoints"][f] = dict(bytes=os.path.getsize(out / f), sha256=sha256(out / f))
    timings["total_s"] = time.time() - t_start
    doc = dict(meta=meta, stages=dump.stages)
    (out / "stages.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    total = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(json.dumps({k: round(v, 2) for k, v in timings.items()}), file=sys.stderr)
    print("wrote %s: %d files, %.2f MB" % (out, len(list(out.iterdir())), total / 1e6), file=sys.stderr)


if __name__ == "__main__":
    main()
