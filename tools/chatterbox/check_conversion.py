#!/usr/bin/env python3
"""Checks convert.py's GGUF files against the reference package's own modules.

Loads the official checkpoint directory with chatterbox-tts (T3, S3Gen, the
voice encoder, `Conditionals`, the tokenizer through transformers'
AutoTokenizer, as the reference does) and compares every converted tensor with
what the module computes from its parameters (weight norm through torch's own
parametrization), the built-in voice with conds.pt, and the tokenizer JSON
embedded in the T3 file with AutoTokenizer on sample texts. Exit 1 on any
mismatch.

    check_conversion.py CKPT_DIR OUT_DIR [--variant turbo] [--t3-heads N]
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

import gguf
from convert import s3gen_name

SAMPLES = ["Hello, this is a test.", "The quick brown fox [laugh] jumps over the lazy dog!", "[sigh] Well... maybe."]


def gguf_tensors(path: Path) -> tuple[dict, dict]:
    r = gguf.GGUFReader(str(path))
    tensors = {t.name: np.array(t.data) for t in r.tensors}
    fields = {f.name: f.contents() for f in r.fields.values()}
    return tensors, fields


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt", type=Path)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--variant", default="turbo")
    a = ap.parse_args()
    from safetensors.torch import load_file
    from transformers import AutoTokenizer
    from tokenizers import Tokenizer
    from chatterbox.models.s3gen import S3Gen

    bad = []

    def same(name, got, want, tol=0.0):
        got, want = np.asarray(got, dtype=np.float64).reshape(-1), np.asarray(want, dtype=np.float64).reshape(-1)
        if got.shape != want.shape:
            bad.append(f"{name}: {got.size} values vs {want.size}")
            return
        err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-12) if got.size else 0.0
        if err > tol:
            bad.append(f"{name}: relative error {err:.3e}")

    t3, t3_meta = gguf_tensors(a.out_dir / f"t3-{a.variant}.gguf")
    state = load_file(str(a.ckpt / f"t3_{a.variant}_v1.safetensors"))
    for k, v in state.items():
        m = __import__("re").match(r"tfmr\.h\.(\d+)\.(ln_1|ln_2|attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.(weight|bias)", k)
        if m:
            i, mod, kind = m.groups()
            name = {"ln_1": "ln1", "ln_2": "ln2", "attn.c_attn": "attn.qkv", "attn.c_proj": "attn.out", "mlp.c_fc": "ffn.up", "mlp.c_proj": "ffn.down"}[mod]
            want = v.numpy().T if (kind == "weight" and "ln" not in mod) else v.numpy()
            same(k, t3[f"t3.blk.{i}.{name}.{kind}"], want)
    for k, g in (("tfmr.wpe.weight", "t3.wpe"), ("text_emb.weight", "t3.text_emb"), ("speech_emb.weight", "t3.speech_emb"),
                 ("speech_head.weight", "t3.speech_head.weight"), ("speech_head.bias", "t3.speech_head.bias"),
                 ("cond_enc.spkr_enc.weight", "t3.cond.spkr.weight")):
        same(k, t3[g], state[k].numpy())

    conds = torch.load(str(a.ckpt / "conds.pt"), map_location="cpu", weights_only=True)
    same("conds speaker_emb", t3["voice.builtin.speaker_emb"], conds["t3"]["speaker_emb"].numpy())
    same("conds prompt tokens", t3["voice.builtin.prompt_speech_tokens"], conds["t3"]["cond_prompt_speech_tokens"].numpy())

    # S3Gen: every parameter as the module computes it (weight norm included).
    s3, _ = gguf_tensors(a.out_dir / "s3gen-meanflow.gguf")
    sd = load_file(str(a.ckpt / "s3gen_meanflow.safetensors"))
    checked = 0
    for k, v in sd.items():
        if k.endswith(".parametrizations.weight.original0"):
            base = k[: -len(".parametrizations.weight.original0")]
            g, vv = v.double(), sd[base + ".parametrizations.weight.original1"].double()
            w = torch._weight_norm(vv, g, 0).numpy()
            same(base, s3[s3gen_name(f"{base}.weight")], w, 1e-6)
            checked += 1
        elif k.endswith("original1") or k.endswith("num_batches_tracked"):
            continue
        else:
            same(k, s3[s3gen_name(k)], v.float().numpy())
            checked += 1
    same("conds prompt_feat", s3["voice.builtin.prompt_feat"], conds["gen"]["prompt_feat"].numpy())
    same("conds embedding", s3["voice.builtin.embedding"], conds["gen"]["embedding"].numpy())

    # Tokenizer: the embedded JSON against AutoTokenizer on the directory.
    ref = AutoTokenizer.from_pretrained(str(a.ckpt))
    ours = Tokenizer.from_str(str(t3_meta["chatterbox.tokenizer_json"]))
    for text in SAMPLES:
        want = ref(text)["input_ids"]
        got = ours.encode(text).ids
        if got != want:
            bad.append(f"tokenizer on {text!r}: {got} vs {want}")
    if bad:
        print("MISMATCH:\n  " + "\n  ".join(bad), file=sys.stderr)
        sys.exit(1)
    print(f"ok: T3 {len(t3)} tensors, S3Gen {checked} parameters, conds, tokenizer on {len(SAMPLES)} texts")


if __name__ == "__main__":
    main()
