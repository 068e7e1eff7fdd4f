#!/usr/bin/env python3
"""Reference rows for Multilingual's guided sampling chain.

`T3.inference` (chatterbox-tts 0.1.7, the path `ChatterboxMultilingualTTS`
takes) processes each step's logits in this order: the guidance combine
`cond + cfg·(cond − uncond)`, transformers' `RepetitionPenaltyLogitsProcessor`
over the ids so far (starting with the start token), `/ temperature` when it
is not 1, `MinPLogitsWarper`, `TopPLogitsWarper`. This script runs that chain
with transformers' own processors (the version the reference pins) on random
rows and writes them with every intermediate:

    target/chatterbox-venv/bin/python tools/chatterbox/mtl_sampler_cases.py \\
        --out tests/fixtures/chatterbox/mtl-sampler/cases.json

−∞ is written as null. The vocabulary is small (the processors do not depend
on its size) to keep the fixture small.
"""
import argparse
import json

import torch
from transformers.generation.logits_process import MinPLogitsWarper, RepetitionPenaltyLogitsProcessor, TopPLogitsWarper

VOCAB = 128
PARAMS = [  # cfg_weight, repetition_penalty, temperature, min_p, top_p
    (0.5, 2.0, 0.8, 0.05, 1.0),    # the 0.1.7 defaults
    (0.5, 1.2, 0.8, 0.05, 0.95),
    (0.0, 1.0, 1.0, 0.2, 1.0),
    (1.5, 2.0, 0.5, 0.0, 0.8),
    (0.3, 1.5, 1.3, 0.1, 0.5),
    (0.5, 2.0, 0.8, 0.05, 1.0),
]


def row(t):
    return [None if v == float("-inf") else float(v) for v in t.reshape(-1).tolist()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    g = torch.Generator().manual_seed(7)
    cases = []
    for i, (cfg, rep, temp, min_p, top_p) in enumerate(PARAMS):
        scale = 2.0 + 3.0 * i
        cond = torch.randn(1, VOCAB, generator=g) * scale
        uncond = cond + torch.randn(1, VOCAB, generator=g) * 0.5 * scale
        history = torch.cat([torch.tensor([[VOCAB - 2]]), torch.randint(0, VOCAB, (1, 3 + 5 * i), generator=g)], dim=1)
        combined = cond + torch.as_tensor(cfg, dtype=cond.dtype) * (cond - uncond)
        penalised = RepetitionPenaltyLogitsProcessor(penalty=float(rep))(history, combined.clone())
        tempered = penalised / temp if temp != 1.0 else penalised
        after_min_p = MinPLogitsWarper(min_p=min_p)(history, tempered.clone())
        after_top_p = TopPLogitsWarper(top_p=top_p)(history, after_min_p.clone())
        probs = torch.softmax(after_top_p, dim=-1)
        cases.append({
            "cfg_weight": cfg, "repetition_penalty": rep, "temperature": temp, "min_p": min_p, "top_p": top_p,
            "history": history.reshape(-1).tolist(), "cond": row(cond), "uncond": row(uncond),
            "combined": row(combined), "penalised": row(penalised), "tempered": row(tempered),
            "after_min_p": row(after_min_p), "processed": row(after_top_p), "probs": row(probs),
        })
    with open(a.out, "w") as f:
        json.dump({"torch": torch.__version__, "cases": cases}, f)
    print(f"wrote {len(cases)} cases to {a.out}")


if __name__ == "__main__":
    main()
