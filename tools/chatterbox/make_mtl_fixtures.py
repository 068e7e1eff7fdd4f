#!/usr/bin/env python3
"""Chatterbox Multilingual parity fixtures from the installed reference package (chatterbox-tts 0.1.7).

As make_fixtures.py does for Turbo: the official Multilingual modules with RANDOM weights (a Llama
T3 with perceiver, emotion token and learned positions; the standard S3Gen), saved under the
official names and formats (`t3_mtl23ls_v2.safetensors`, `s3gen.pt`, `ve.pt`, `conds.pt`,
`grapheme_mtl_merged_expanded_v1.json`), reloaded as `ChatterboxMultilingualTTS.from_local` does,
then per-stage dumps (.npy) and stages.json. T3 token sampling is replaced by injected draws.

    target/chatterbox-venv/bin/python tools/chatterbox/make_mtl_fixtures.py --size tiny \
        --tokenizer tests/fixtures/chatterbox/mtl-text/tokenizer.json --out DIR
"""
import argparse
import copy
import json
import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tokenizer looks up Cangjie5_TC.json on the Hub

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402  (shared construction, randomisation and dump helpers)

import chatterbox.mtl_tts as mtl_mod  # noqa: E402
import chatterbox.models.t3.modules.cond_enc as cond_enc_mod  # noqa: E402
import chatterbox.models.t3.inference.alignment_stream_analyzer as asa_mod  # noqa: E402
from chatterbox.models.t3 import T3  # noqa: E402
from chatterbox.models.t3.llama_configs import LLAMA_CONFIGS, LLAMA_520M_CONFIG_DICT  # noqa: E402
from chatterbox.models.t3.modules.t3_config import T3Config  # noqa: E402
from chatterbox.models.t3.modules.cond_enc import T3Cond  # noqa: E402
from chatterbox.models.tokenizers.tokenizer import MTLTokenizer  # noqa: E402
from safetensors.torch import save_file, load_file  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402

START_SPEECH, STOP_SPEECH = 6561, 6562

SIZES = {
    "full": dict(
        llama=None,                 # the official Llama_520M entry
        perceiver=None,
        text_vocab=2454,
        max_text_tokens=2048,
        max_speech_tokens=4096,
        cond_prompt_len=150,
        gen_prompt_tokens=150,      # S3Gen prompt (6 s) -> prompt_feat 300 frames
        aligned_heads=None,         # the reference's LLAMA_ALIGNED_HEADS
        ve=None,
        s3=None,
        threads=2,
    ),
    "tiny": dict(
        # 4 heads of 8 over 2 K/V heads: grouped-query attention is exercised.
        llama=dict(hidden_size=32, intermediate_size=80, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=8),
        perceiver=dict(pre_attention_query_token=32, pre_attention_query_size=32, embedding_dim=32,
                       num_attn_heads=4),
        text_vocab=None,            # the tokenizer's
        max_text_tokens=62,
        max_speech_tokens=124,
        cond_prompt_len=12,
        gen_prompt_tokens=6,
        aligned_heads=[(2, 3), (3, 1), (1, 2)],
        ve=dict(ve_hidden_size=24),
        s3=mf.SIZES["tiny"]["s3"],
        threads=1,
    ),
}

TEXT = ("Hello world, this is a test.", "en")
N_TF_STEPS = 20
N_STREAM_STEPS = 40
# The end-to-end case: T3 tokens cap (keeps HiFT's recorded noise small) and its draws' seed.
N_PIPELINE_TOKENS = 16
PIPELINE_SEED = 2468
# What ChatterboxMultilingualTTS.generate passes to T3.inference.
MTL_SAMPLING = dict(temperature=0.8, cfg_weight=0.5, repetition_penalty=2.0, min_p=0.05, top_p=1.0)
EXAGGERATION = 0.5


def pad_vocab(path, size):
    """Pads the tokenizer's vocabulary with unused entries to the official size (2454), so the
    full-size text embedding has a row for every id (the synthetic one covers the test texts only)."""
    from tokenizers import Tokenizer
    tok = json.loads(path.read_text())
    vocab = tok["model"]["vocab"]
    n = Tokenizer.from_file(str(path)).get_vocab_size()
    assert n <= size and n == max(vocab.values()) + 1, (n, size)
    for i in range(size - n):
        vocab["[unused%d]" % i] = n + i
    path.write_text(json.dumps(tok, ensure_ascii=False))
    assert Tokenizer.from_file(str(path)).get_vocab_size() == size


def t3_hparams(size, text_vocab):
    cfg = SIZES[size]
    hp = T3Config.multilingual()
    hp.text_tokens_dict_size = text_vocab
    hp.max_text_tokens = cfg["max_text_tokens"]
    hp.max_speech_tokens = cfg["max_speech_tokens"]
    hp.speech_cond_prompt_len = cfg["cond_prompt_len"]
    if cfg["llama"] is not None:
        d = dict(LLAMA_520M_CONFIG_DICT)
        d.update(cfg["llama"])
        LLAMA_CONFIGS["Llama_fixture_tiny"] = d
        hp.llama_config_name = "Llama_fixture_tiny"
    return hp


def build_t3(size, text_vocab):
    over = SIZES[size]["perceiver"]
    with mf.patched(cond_enc_mod, "Perceiver", mf._override(cond_enc_mod.Perceiver, over or {})):
        return T3(t3_hparams(size, text_vocab))


def build_ve(size):
    from chatterbox.models.voice_encoder import VoiceEncoder
    from chatterbox.models.voice_encoder.config import VoiceEncConfig
    hp = VoiceEncConfig()
    for k, v in (SIZES[size]["ve"] or {}).items():
        setattr(hp, k, v)
    return VoiceEncoder(hp)


@torch.no_grad()
def randomize_llama(t3, g):
    """RMSNorm gains off 1. The default init (std 0.02) leaves every layer's output far below the
    unit-variance embeddings and the attention uniform: query and key projections are scaled so
    that attention is peaked (the alignment analyzer's argmax over text positions is then well
    separated), value/output and MLP projections so that each layer moves the residual stream."""
    for mod in t3.modules():
        if isinstance(mod, LlamaRMSNorm):
            mod.weight.copy_(1.0 + 0.1 * torch.randn(mod.weight.shape, generator=g))
    for layer in t3.tfmr.layers:
        gains = [(layer.self_attn.q_proj, 12.0), (layer.self_attn.k_proj, 12.0), (layer.self_attn.v_proj, 8.0),
                 (layer.self_attn.o_proj, 8.0), (layer.mlp.gate_proj, 5.0), (layer.mlp.up_proj, 5.0),
                 (layer.mlp.down_proj, 5.0)]
        for proj, gain in gains:
            proj.weight.mul_(gain)


@torch.no_grad()
def scale_logits(t3, conds, text_ids, target_std=3.0):
    """Rescale speech_head so that the conditional prefill logits have std `target_std`
    (random init leaves them nearly flat, and min-p would then keep every token)."""
    embeds, _ = t3.prepare_input_embeds(t3_cond=copy.deepcopy(conds.t3), text_tokens=text_ids[:1],
                                        speech_tokens=torch.tensor([[START_SPEECH]]), cfg_weight=0.0)
    h = t3.tfmr(inputs_embeds=embeds)[0][:, -1]
    k = target_std / float(t3.speech_head(h).std())
    t3.speech_head.weight.mul_(k)
    return k


def make_conds(size, g):
    L, P = SIZES[size]["cond_prompt_len"], SIZES[size]["gen_prompt_tokens"]
    spk = torch.randn(1, 256, generator=g)
    t3c = T3Cond(speaker_emb=spk / spk.norm(dim=1, keepdim=True),
                 cond_prompt_speech_tokens=torch.randint(0, 6561, (1, L), generator=g),
                 emotion_adv=EXAGGERATION * torch.ones(1, 1, 1))
    gen = dict(prompt_token=torch.randint(0, 6561, (1, P), generator=g), prompt_token_len=torch.tensor([P]),
               prompt_feat=(-6.0 + 2.0 * torch.randn(1, 2 * P, 80, generator=g)).clamp(-11.5, 2.0),
               prompt_feat_len=None, embedding=torch.randn(1, 192, generator=g))
    return mtl_mod.Conditionals(t3c, gen)


def text_tokens(tokenizer, text, language):
    """As ChatterboxMultilingualTTS.generate: punc_norm, encode, two rows, SOT/EOT."""
    ids = tokenizer.text_to_tokens(mtl_mod.punc_norm(text), language_id=language)
    ids = torch.cat([ids, ids], dim=0)
    ids = torch.nn.functional.pad(ids, (1, 0), value=255)
    return torch.nn.functional.pad(ids, (0, 1), value=0).long()


class StreamRecorder:
    """Runs T3.inference with torch.multinomial replaced by `draw` and records, per step, the raw
    speech-head rows (cond, uncond), the aligned attention the analyzer read, and the logits the
    analyzer returned."""

    def __init__(self, t3):
        self.t3 = t3

    def run(self, conds, ids, draw, max_new_tokens, **sampling):
        raw, probs, aligned, after = [], [], [], []
        hook = self.t3.speech_head.register_forward_hook(lambda m, i, o: raw.append(o[:, -1].clone()))
        real_step = asa_mod.AlignmentStreamAnalyzer.step

        def step(analyzer, logits, next_token=None):
            aligned.append(torch.stack(analyzer.last_aligned_attns).mean(dim=0).clone())
            out = real_step(analyzer, logits, next_token=next_token)
            after.append(out[0].clone())
            return out

        def multinomial(p, num_samples=1, *a, **k):
            probs.append(p[0].clone())
            return torch.tensor([[draw(len(probs) - 1, p[0])]], dtype=torch.long)

        asa_mod.AlignmentStreamAnalyzer.step = step
        try:
            with mf.replace_multinomial(multinomial):
                toks = self.t3.inference(t3_cond=copy.deepcopy(conds.t3), text_tokens=ids,
                                         max_new_tokens=max_new_tokens, **sampling)
        finally:
            hook.remove()
            asa_mod.AlignmentStreamAnalyzer.step = real_step
        return dict(tokens=toks[0], raw=torch.stack(raw), probs=torch.stack(probs), aligned=aligned,
                    after=torch.stack(after))


REFERENCE_DROP_INVALID = mtl_mod.drop_invalid_tokens


def speech_only(tokens):
    """The reference's drop_invalid_tokens (slice between SOS and EOS), then the filter the engine adds:
    ids >= 6561 (which random weights sample) would index past the flow's 6561-row embedding."""
    kept = REFERENCE_DROP_INVALID(tokens)
    return kept[kept < START_SPEECH]


def run_pipeline(conds, t3, s3gen, ve, tokenizer, out, dump):
    """ChatterboxMultilingualTTS.generate, unchanged but for: T3's token draws come from recorded
    uniforms (inverse CDF), max_new_tokens is capped, the token filter above replaces
    drop_invalid_tokens, and the Perth watermark is skipped. Every random draw is recorded; the
    standard CFM's estimator calls (a batch of 2 for guidance) and S3Gen's intermediates are dumped."""
    tts = mtl_mod.ChatterboxMultilingualTTS(t3, s3gen, ve, tokenizer, "cpu", conds=conds)
    tts.watermarker.apply_watermark = lambda wav, sample_rate: wav
    real_inference = type(t3).inference
    tts.t3.inference = lambda **kw: real_inference(t3, **dict(kw, max_new_tokens=N_PIPELINE_TOKENS))
    g = torch.Generator().manual_seed(PIPELINE_SEED)
    uniforms = torch.rand(N_PIPELINE_TOKENS + 1, generator=g, dtype=torch.float32)
    drawn = []

    def multinomial(p, num_samples=1, *a, **k):
        drawn.append(mf.inverse_cdf(p[0], float(uniforms[len(drawn)])))
        return torch.tensor([[drawn[-1]]], dtype=torch.long)

    rec, est_calls = {}, []
    flow, hift = s3gen.flow, s3gen.mel2wav
    keep = lambda name: (lambda m, i, o: rec.__setitem__(name, o.clone()))
    hooks = [flow.spk_embed_affine_layer.register_forward_hook(keep("spks")),
             flow.encoder_proj.register_forward_hook(keep("mu")),
             flow.input_embedding.register_forward_pre_hook(lambda m, i: rec.__setitem__("tokens", i[0].clone())),
             hift.f0_predictor.register_forward_pre_hook(lambda m, i: rec.__setitem__("mel", i[0].clone()))]
    est = flow.decoder.estimator
    est_forward = type(est).forward

    def est_wrap(x, mask, mu, t, spks=None, cond=None, r=None):
        v = est_forward(est, x, mask, mu, t, spks=spks, cond=cond, r=r)
        est_calls.append(dict(x=x.clone(), mu=mu.clone(), t=t.clone(), spks=spks.clone(), cond=cond.clone(),
                              mask=mask.clone(), v=v.clone()))
        return v
    est.forward = est_wrap
    mtl_mod.drop_invalid_tokens = speech_only
    rng_log = []
    torch.manual_seed(PIPELINE_SEED)
    try:
        with mf.replace_multinomial(multinomial), mf.record_rng(rng_log), torch.inference_mode():
            wav = tts.generate(TEXT[0], language_id=TEXT[1], exaggeration=EXAGGERATION, **{
                k: MTL_SAMPLING[k] for k in ("cfg_weight", "temperature", "repetition_penalty", "min_p", "top_p")})
    finally:
        mtl_mod.drop_invalid_tokens = REFERENCE_DROP_INVALID
        for h in hooks:
            h.remove()
        del est.forward, t3.inference
    kinds = [k for k, _ in rng_log]
    assert kinds == ["torch.randn_like", "Uniform(-pi,pi).sample", "torch.randn_like", "torch.randn_like"], kinds
    z, phase, sine_noise, _ = [t for _, t in rng_log]
    assert all(bool((c["mask"] == 1).all()) for c in est_calls)

    P = int(conds.gen["prompt_token"].shape[1])
    speech = speech_only(torch.tensor(drawn))
    tokens = rec["tokens"][0, P:]
    assert torch.equal(tokens, speech), (tokens, speech)
    S3 = "S3Gen (standard)"
    dump("s3gen_tokens", tokens, "input", ["pipeline/speech_tokens"],
         "the drawn tokens after drop_invalid_tokens and the < 6561 filter (no silence appended, as MTL)")
    dump("s3gen_mu", rec["mu"], S3 + ".flow.encoder_proj", ["conds.pt:gen.prompt_token", "s3gen_tokens"],
         "(1, 2(P+N), 80)")
    dump("s3gen_spks", rec["spks"], S3 + ".flow.spk_embed_affine_layer", ["conds.pt:gen.embedding"],
         "Linear(192->80) of F.normalize(embedding)")
    dump("s3gen_cond", est_calls[0]["cond"][:1], "CausalMaskedDiffWithXvec.inference", ["conds.pt:gen.prompt_feat"],
         "(1, 80, 2(P+N)): prompt_feat in the first 2P frames, zeros after")
    dump("s3gen_z", z, "CausalConditionalCFM.forward: torch.randn_like(mu)", [],
         "the initial Euler state (standard decoder: no noised_mels)")
    dump("s3gen_cfm_t", torch.cat([c["t"][:1] for c in est_calls]), "CausalConditionalCFM.forward", [],
         "t of each Euler step: 1 - cos(pi/2 * linspace(0, 1, 11)) without its last point")
    for i, c in enumerate(est_calls):
        assert torch.equal(c["x"][0], c["x"][1]) and not c["mu"][1].any() and not c["spks"][1].any() \
            and not c["cond"][1].any()
        dump(f"s3gen_cfm_step{i}_x", c["x"][:1], "CausalConditionalCFM.solve_euler",
             ["s3gen_z"] if i == 0 else [f"s3gen_cfm_step{i-1}_x", f"s3gen_cfm_step{i-1}_v"],
             "Euler state before step %d (both guidance rows take it)" % i)
        dump(f"s3gen_cfm_step{i}_v", c["v"], S3 + ".flow.decoder.estimator (ConditionalDecoder)",
             [f"s3gen_cfm_step{i}_x", "s3gen_mu", "s3gen_spks", "s3gen_cond", "s3gen_cfm_t"],
             "(2, 80, T): row 0 conditional, row 1 with mu, spks and cond zeroed; "
             "next x = x + (t[i+1] - t[i]) * (1.7 v0 - 0.7 v1)")
    dump("s3gen_mel", rec["mel"], "CausalMaskedDiffWithXvec.inference", ["s3gen_cfm_step9_x", "s3gen_cfm_step9_v"],
         "final state, prompt frames [0, 2P) dropped: (1, 80, 2N)")

    case = dict(text=TEXT[0], language=TEXT[1], exaggeration=EXAGGERATION, max_new_tokens=N_PIPELINE_TOKENS,
                **MTL_SAMPLING,
                note="ChatterboxMultilingualTTS.generate with recorded draws, the < 6561 token filter, no watermark; "
                     "speech_tokens as drawn (a stop token is not drawn when the cap ends the stream)")
    mf.save_pipeline_case(out / "pipeline", uniforms, drawn, z, phase, sine_noise, wav, case)


def load_tiny(ckpt, size="tiny"):
    """The Multilingual models of a checkpoint directory this script wrote (`size` as it was
    written), reloaded as `ChatterboxMultilingualTTS.from_local` loads them, with the run-time
    registrations `main` makes (the tiny Llama entry, the aligned heads, the analyzer on):
    (t3, s3gen, ve, tokenizer), in eval mode."""
    cfg = SIZES[size]
    if cfg["aligned_heads"] is not None:
        asa_mod.LLAMA_ALIGNED_HEADS[:] = cfg["aligned_heads"]
    T3Config.is_multilingual = property(lambda self: True)
    tokenizer = MTLTokenizer(str(ckpt / "grapheme_mtl_merged_expanded_v1.json"))
    ve = build_ve(size)
    ve.load_state_dict(torch.load(ckpt / "ve.pt", weights_only=True))
    ve.eval()
    t3 = build_t3(size, tokenizer.tokenizer.get_vocab_size())
    t3.load_state_dict(load_file(ckpt / "t3_mtl23ls_v2.safetensors"))
    t3.eval()
    s3gen = mf.build_s3gen(size, meanflow=False, s3=cfg["s3"])
    s3gen.load_state_dict(torch.load(ckpt / "s3gen.pt", weights_only=True))
    s3gen.eval()
    return t3, s3gen, ve, tokenizer


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--tokenizer", type=Path, required=True, help="grapheme tokenizer JSON to ship and use")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--threads", type=int, help="torch threads (default: the size's)")
    ap.add_argument("--no-dumps", action="store_true", help="checkpoints only")
    args = ap.parse_args()
    cfg = SIZES[args.size]
    out = mf.start(args, cfg["threads"])
    t_start = time.time()
    g = torch.Generator().manual_seed(args.seed)
    if cfg["aligned_heads"] is not None:
        asa_mod.LLAMA_ALIGNED_HEADS[:] = cfg["aligned_heads"]
    # The reference enables the alignment analyzer only for the official vocabulary size.
    T3Config.is_multilingual = property(lambda self: True)

    shutil.copyfile(args.tokenizer, out / "grapheme_mtl_merged_expanded_v1.json")
    if cfg["text_vocab"] is not None:
        pad_vocab(out / "grapheme_mtl_merged_expanded_v1.json", cfg["text_vocab"])
    tokenizer = MTLTokenizer(str(out / "grapheme_mtl_merged_expanded_v1.json"))
    text_vocab = cfg["text_vocab"] or tokenizer.tokenizer.get_vocab_size()
    ids = text_tokens(tokenizer, *TEXT)

    # ---------------- build, randomise, steer, save -----------------------------------------
    t3 = build_t3(args.size, text_vocab).eval()
    s3gen = mf.build_s3gen(args.size, meanflow=False, s3=cfg["s3"]).eval()
    ve = build_ve(args.size).eval()
    randomize_llama(t3, g)
    mf.randomize(t3, s3gen, ve, g)
    conds = make_conds(args.size, g)
    scale_logits(t3, conds, ids)
    conds.save(out / "conds.pt")
    save_file({k: v.contiguous() for k, v in t3.state_dict().items()}, out / "t3_mtl23ls_v2.safetensors")
    torch.save(s3gen.state_dict(), out / "s3gen.pt")
    torch.save(ve.state_dict(), out / "ve.pt")
    del t3, s3gen, ve

    # ---------------- reload as ChatterboxMultilingualTTS.from_local ------------------------
    ve = build_ve(args.size)
    ve.load_state_dict(torch.load(out / "ve.pt", weights_only=True))
    t3 = build_t3(args.size, text_vocab)
    t3.load_state_dict(load_file(out / "t3_mtl23ls_v2.safetensors"))  # strict
    t3.eval()
    s3gen = mf.build_s3gen(args.size, meanflow=False, s3=cfg["s3"])
    s3gen.load_state_dict(torch.load(out / "s3gen.pt", weights_only=True))
    s3gen.eval()
    conds = mtl_mod.Conditionals.load(out / "conds.pt")

    given = torch.randint(0, 6561, (N_TF_STEPS + 1,), generator=g).tolist()
    given[15] = given[14]  # two equal tokens in a row: the analyzer forces the stop token
    uniforms = torch.rand(N_STREAM_STEPS + 1, generator=g, dtype=torch.float32)
    meta = dict(
        reference="chatterbox-tts==0.1.7 (torch %s, transformers %s)" % (
            torch.__version__, __import__("transformers").__version__),
        size=args.size, seed=args.seed, threads=torch.get_num_threads(), dtype="float32", device="cpu",
        text=TEXT[0], language=TEXT[1], text_ids=ids[0].tolist(), teacher_forced_tokens=given,
        aligned_heads=[list(h) for h in asa_mod.LLAMA_ALIGNED_HEADS], sampling=MTL_SAMPLING,
        exaggeration=EXAGGERATION, llama={k: v for k, v in LLAMA_CONFIGS[t3.hp.llama_config_name].items()
                                         if k != "rope_scaling"},
        rope_scaling=LLAMA_CONFIGS[t3.hp.llama_config_name]["rope_scaling"],
    )
    if args.no_dumps:
        (out / "stages.json").write_text(json.dumps(dict(meta=meta, stages={}), indent=1) + "\n")
        return

    dump = mf.Dumper(out)
    dump("t3_text_ids", ids[0], "MTLTokenizer.text_to_tokens + SOT/EOT",
         ["grapheme_mtl_merged_expanded_v1.json"], "%r in %s, as generate() builds it" % TEXT)
    perceiver_in = {}
    hook = t3.cond_enc.perceiver.register_forward_hook(
        lambda m, i, o: perceiver_in.update(x=i[0].clone(), y=o.clone()))
    with torch.inference_mode():
        cond_emb = t3.prepare_conditioning(copy.deepcopy(conds.t3))
        embeds, len_cond = t3.prepare_input_embeds(t3_cond=copy.deepcopy(conds.t3), text_tokens=ids,
                                                   speech_tokens=START_SPEECH * torch.ones_like(ids[:, :1]),
                                                   cfg_weight=MTL_SAMPLING["cfg_weight"])
    hook.remove()
    dump("t3_perceiver_in", perceiver_in["x"][0], "T3.prepare_conditioning", ["conds.pt:t3"],
         "speech_emb(cond_prompt_speech_tokens) + speech_pos_emb(0..L-1)")
    dump("t3_perceiver_out", perceiver_in["y"][0], "Perceiver", ["t3_perceiver_in"],
         "attn(query, prompt) then attn(that, that), one shared AttentionBlock2")
    dump("t3_cond_emb", cond_emb[0], "T3CondEnc", ["conds.pt:t3"],
         "[spkr_enc(speaker_emb) | perceiver | emotion_adv_fc(%g)]" % EXAGGERATION)
    dump("t3_prefill_embeds", embeds, "T3.prepare_input_embeds", ["t3_cond_emb", "t3_text_ids"],
         "(2, N, d): [cond | text_emb + text_pos | speech_emb(6561) + speech_pos(0)]; row 1's text_emb "
         "zeroed before its positions are added (CFG). inference() appends one more start token.")

    rec = StreamRecorder(t3)
    t0 = time.time()
    # N + 1 draws give the prefill row and N rows after teacher-forced tokens (one more is cut).
    tf = rec.run(conds, ids, lambda i, p: given[i], N_TF_STEPS + 1, **MTL_SAMPLING)
    assert tf["tokens"].tolist() == given, (tf["tokens"].tolist(), given)
    tf["raw"] = tf["raw"][:N_TF_STEPS + 1]
    dump("t3_tf_tokens", torch.tensor(given), "input", [],
         "teacher-forced tokens: token i is fed after logits row i; tokens 14 and 15 are equal")
    dump("t3_tf_logits", tf["raw"], "T3.inference (speech_head hook)", ["conds.pt", "t3_text_ids", "t3_tf_tokens"],
         "(steps, 2, V): raw rows (cond, uncond) of the last position; row 0 = prefill")
    a0 = tf["aligned"][0]
    i0, j0 = len_cond, len_cond + ids.shape[1]
    aligned = torch.cat([a0[j0:, i0:j0]] + [a[:, i0:j0] for a in tf["aligned"][1:]], dim=0)
    dump("t3_tf_aligned", aligned, "AlignmentStreamAnalyzer (spied attention)", ["t3_tf_logits"],
         "mean over the aligned heads of row 0's attention over the text positions, one row per query "
         "the analyzer read (2 at the prefill, then 1 per step), before its monotonic masking")
    after = tf["after"][:N_TF_STEPS + 1]
    others = torch.cat([after[:, :STOP_SPEECH], after[:, STOP_SPEECH + 1:]], dim=1)
    dump("t3_tf_stop_logit", after[:, STOP_SPEECH], "AlignmentStreamAnalyzer.step", ["t3_tf_logits", "t3_tf_aligned"],
         "the stop token's guidance-combined logit (cfg 0.5) after the analyzer: -32768 when suppressed, "
         "+32768 when forced")
    dump("t3_tf_forced", (others == -2.0 ** 15).all(dim=1), "AlignmentStreamAnalyzer.step", ["t3_tf_stop_logit"],
         "1 where the analyzer forced the stop token (every other logit -32768)")
    meta["t3_teacher_forced_s"] = time.time() - t0

    greedy = rec.run(conds, ids, lambda i, p: int(torch.argmax(p)), N_STREAM_STEPS, **MTL_SAMPLING)
    dump("t3_greedy_tokens", greedy["tokens"], "T3.inference, multinomial -> argmax of its probs",
         ["conds.pt", "t3_text_ids"], "MTL defaults %s; stops after 6562 (kept)" % MTL_SAMPLING)
    sampled = rec.run(conds, ids, lambda i, p: mf.inverse_cdf(p, float(uniforms[i])), N_STREAM_STEPS,
                      **MTL_SAMPLING)
    dump("t3_sampled_uniforms", uniforms, "input (torch.rand, seeded)", [], "one U[0,1) per step")
    dump("t3_sampled_tokens", sampled["tokens"], "T3.inference, multinomial -> inverse CDF",
         ["conds.pt", "t3_text_ids", "t3_sampled_uniforms"],
         "MTL defaults; token = first i with cumsum(probs)[i] > u*sum(probs); stops after 6562 (kept)")

    t0 = time.time()
    run_pipeline(conds, t3, s3gen, ve, tokenizer, out, dump)
    meta["pipeline_s"] = time.time() - t0

    doc = dict(meta=meta, stages=dump.stages)
    (out / "stages.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print("wrote %s in %.1f s" % (out, time.time() - t_start), file=sys.stderr)


if __name__ == "__main__":
    main()
