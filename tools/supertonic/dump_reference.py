#!/usr/bin/env python3
"""Write per-stage NumPy reference dumps for a bundle and cross-check them with onnxruntime.

    python tools/supertonic/dump_reference.py --bundle DIR --out OUTDIR

For every case OUTDIR/<case>/ gets text_ids, text_mask, style_ttl, style_dp, duration (raw
DP output, before /speed), text_emb, noise, ve_step0, latent, wav_full (untrimmed vocoder
output), wav (final pipeline output) as float32/int64 .npy, and case.json.
OUTDIR/batch2/ holds a padded batch of two texts for DP, TE and one VE step.

Every stage is also run with onnxruntime on the same inputs; the script exits non-zero if
any max|ort-ref|/max|ref| exceeds --tol (default 1e-5).
"""
import argparse
import tempfile
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import text as textfe  # noqa: E402
from ort_pipeline import OrtStages  # noqa: E402
from reference import (Reference, _RefStages, load_bundle_meta, load_voice,  # noqa: E402
                       synthesize_with, voice_path)

F32 = np.float32

CASES_V2 = [
    {"name": "en", "text": "Hello, world! This is a tiny test.", "lang": "en", "voice": "F1",
     "steps": 5, "speed": 1.05, "seed": 42},
    {"name": "ko_pt", "text": "Olá! A canção é ótima, não é?", "lang": "pt", "voice": "M1",
     "steps": 3, "speed": 1.2, "seed": 7},
]
# Long text: several chunks (paragraphs, sentences, abbreviations), 0.3 s silences
# and the final trim. Only the waveform is dumped (the stage arrays are per chunk).
LONG_CASES = {
    "v2": [{"name": "long_en", "lang": "en", "voice": "M1", "steps": 2, "speed": 1.0, "seed": 3,
            "text": ("Dr. Smith arrived at noon. He had travelled from the coast, e.g. by the old road, "
                     "and he was tired. Nobody expected him before the evening, so the house was quiet. "
                     "The children were at school and the dog was asleep by the fire.\n\n"
                     "Mr. Jones opened the door. What a surprise! They talked for an hour about the weather, "
                     "the harvest and the price of bread, and then they walked down to the river together.")},
           # Four chunks whose float32 durations give one sample more summed in the
           # official order (dur_cat += dur + silence) than in the other two orders.
           {"name": "duration_sum_order", "lang": "en", "voice": "F1", "steps": 2, "speed": 1.05,
            "seed": 1, "text": "Hello there.\n\nWhat a day!\n\nCome back soon?\n\nA b c d e f."},
           # Characters the indexer lacks, read as the last embedding row as the official
           # code does (the engine's unsupported_chars = "official").
           {"name": "official_unsupported", "lang": "en", "voice": "F1", "steps": 2, "speed": 1.0,
            "seed": 5, "text": "Stra\u00dfe \u03a9 right\u2011now!", "unsupported_chars": "official"}],
    "v3": [],
}

CASES_V3 = [
    {"name": "en", "text": "Hello, world! This is a tiny test.", "lang": "en", "voice": "F1",
     "steps": 8, "speed": 1.05, "seed": 42},
    {"name": "ja", "text": "こんにちは。さようなら。", "lang": "ja", "voice": "M1",
     "steps": 3, "speed": 1.2, "seed": 7},
]
BATCH2 = {"texts": ["Hello, world! This is a tiny test.", "Short one."], "lang": "en",
          "voices": ["F1", "M1"], "speed": 1.05, "seed": 123,
          # fixed latent lengths (random DPs give ~equal durations for any text, which would
          # leave the latent mask untested)
          "latent_lengths": [7, 4]}


def rel_err(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("inf")
    d = np.abs(b).max()
    return float(np.abs(a - b).max() / (d if d > 0 else 1.0))


class Checker:
    def __init__(self, tol):
        self.tol, self.rows, self.bad = tol, [], []

    def __call__(self, case, stage, ort_val, ref_val):
        e = rel_err(ort_val, ref_val)
        self.rows.append((case, stage, e))
        flag = "OK" if e <= self.tol else "FAIL"
        print(f"  {case:8s} {stage:16s} max rel err {e:.3e}  {flag}")
        if not e <= self.tol:
            self.bad.append((case, stage, e))


def save(d, name, arr):
    np.save(os.path.join(d, name + ".npy"), np.ascontiguousarray(arr))


def dump_case(bundle, out, case, ref, ort_st, chk):
    d = os.path.join(out, case["name"])
    os.makedirs(d, exist_ok=True)
    tr = {}
    wav, dur = synthesize_with(_RefStages(ref), bundle, case["text"], case["lang"], case["voice"],
                               case["steps"], case["speed"], case["seed"], trace=tr)
    style_ttl, style_dp = load_voice(voice_path(bundle, case["voice"]))
    save(d, "text_ids", tr["text_ids"].astype(np.int64))
    save(d, "text_mask", tr["text_mask"])
    save(d, "style_ttl", style_ttl)
    save(d, "style_dp", style_dp)
    save(d, "duration", tr["duration"])
    save(d, "text_emb", tr["text_emb"])
    save(d, "noise", tr["noise"])
    save(d, "ve_step0", tr["ve_step0"])
    save(d, "latent", tr["latent"])
    save(d, "wav_full", tr["wav_full"])
    save(d, "wav", wav.astype(F32))
    meta = dict(case)
    meta.update({"prepared": tr["prepared"], "L": tr["L"], "T": tr["T"], "wav_len": tr["wav_len"],
                 "duration_raw": float(tr["duration"][0]), "duration_s": dur,
                 "samples": int(wav.shape[0]), "config": ref.cfg["name"]})
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
    # onnxruntime cross-check, stage by stage with identical inputs
    n = case["name"]
    ids, tm, lm = tr["text_ids"], tr["text_mask"], tr["latent_mask"]
    chk(n, "duration", ort_st.dp(ids, style_dp, tm), tr["duration"])
    chk(n, "text_emb", ort_st.te(ids, style_ttl, tm), tr["text_emb"])
    tot = np.array([case["steps"]], F32)
    x = ort_st.ve(tr["noise"], tr["text_emb"], style_ttl, lm, tm, np.array([0], F32), tot)
    chk(n, "ve_step0", x, tr["ve_step0"])
    for s in range(1, case["steps"]):
        x = ort_st.ve(x, tr["text_emb"], style_ttl, lm, tm, np.array([s], F32), tot)
    chk(n, "latent(loop)", x, tr["latent"])
    chk(n, "wav_full", ort_st.voc(tr["latent"]), tr["wav_full"])
    wav_o, _ = synthesize_with(ort_st, bundle, case["text"], case["lang"], case["voice"],
                               case["steps"], case["speed"], case["seed"])
    chk(n, "wav(pipeline)", wav_o, wav)
    return meta


def dump_pipeline_case(bundle, out, case, ref, ort_st, chk):
    """Whole-pipeline case: the waveform of the NumPy reference, checked against ORT."""
    d = os.path.join(out, case["name"])
    os.makedirs(d, exist_ok=True)
    wav, dur = synthesize_with(_RefStages(ref), bundle, case["text"], case["lang"], case["voice"],
                               case["steps"], case["speed"], case["seed"])
    save(d, "wav", wav.astype(F32))
    meta = dict(case)
    meta.update({"duration_s": dur, "samples": int(wav.shape[0]), "config": ref.cfg["name"],
                 "chunks": len(textfe.chunk_text(case["text"], textfe.chunk_len(case["lang"], load_bundle_meta(bundle)[2])))})
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
    wav_o, _ = synthesize_with(ort_st, bundle, case["text"], case["lang"], case["voice"],
                               case["steps"], case["speed"], case["seed"])
    chk(case["name"], "wav(pipeline)", wav_o, wav)
    return meta


def dump_batch2(bundle, out, ref, ort_st, chk, version, steps):
    d = os.path.join(out, "batch2")
    os.makedirs(d, exist_ok=True)
    _, indexer, _ = load_bundle_meta(bundle)
    prepared = [textfe.prepare(t, BATCH2["lang"], version) for t in BATCH2["texts"]]
    ids, tm = textfe.batch_ids(prepared, indexer)
    vs = [load_voice(voice_path(bundle, v)) for v in BATCH2["voices"]]
    style_ttl = np.concatenate([v[0] for v in vs])
    style_dp = np.concatenate([v[1] for v in vs])
    raw = ref.duration(ids, style_dp, tm)
    emb = ref.text_encoder(ids, style_ttl, tm)
    lens = np.array(BATCH2["latent_lengths"], dtype=np.int64)
    L = int(lens.max())
    lm = (np.arange(L)[None, :] < lens[:, None]).astype(F32)[:, None, :]
    np.random.seed(BATCH2["seed"])
    noise = np.random.randn(2, ref.cfg["latent_channels"], L).astype(F32) * lm
    cs, ts = np.zeros(2, F32), np.full(2, steps, F32)
    x1 = ref.vector_estimator(noise, emb, style_ttl, lm, tm, cs, ts)
    for k, v in {"text_ids": ids, "text_mask": tm, "style_ttl": style_ttl, "style_dp": style_dp,
                 "duration": raw, "text_emb": emb, "latent_mask": lm, "noise": noise,
                 "current_step": cs, "total_step": ts, "ve_step0": x1}.items():
        save(d, k, v)
    meta = {"texts": BATCH2["texts"], "prepared": prepared, "lang": BATCH2["lang"],
            "voices": BATCH2["voices"], "speed": BATCH2["speed"], "seed": BATCH2["seed"],
            "steps": steps, "T": int(ids.shape[1]), "text_lengths": [int(x) for x in tm.sum((1, 2))],
            "L": L, "latent_lengths": [int(x) for x in lens], "config": ref.cfg["name"],
            "note": "latent lengths fixed (not from DP); noise = np.random.seed(seed); "
                    "randn(2,144,L) * latent_mask; one VE step with current_step=0, "
                    "total_step=steps; speed unused"}
    chk("batch2", "duration", ort_st.dp(ids, style_dp, tm), raw)
    chk("batch2", "text_emb", ort_st.te(ids, style_ttl, tm), emb)
    chk("batch2", "ve_step0", ort_st.ve(noise, emb, style_ttl, lm, tm, cs, ts), x1)
    # padding invariance (informational: edge padding sees zeros past the end, so not exact)
    info = {}
    for b in range(2):
        tb = int(tm[b].sum())
        lb = int(lens[b])
        e1 = ref.text_encoder(ids[b:b + 1, :tb], style_ttl[b:b + 1], tm[b:b + 1, :, :tb])
        info[f"te_item{b}_vs_unpadded"] = rel_err(emb[b:b + 1, :, :tb], e1)
        d1 = ref.duration(ids[b:b + 1, :tb], style_dp[b:b + 1], tm[b:b + 1, :, :tb])
        info[f"dp_item{b}_vs_unpadded"] = rel_err(raw[b:b + 1], d1)
        v1 = ref.vector_estimator(noise[b:b + 1, :, :lb], e1, style_ttl[b:b + 1],
                                  lm[b:b + 1, :, :lb], tm[b:b + 1, :, :tb], cs[:1], ts[:1])
        info[f"ve_item{b}_vs_unpadded"] = rel_err(x1[b:b + 1, :, :lb], v1)
        info[f"ve_item{b}_padded_region_absmax"] = float(np.abs(x1[b, :, lb:]).max()) if lb < L else 0.0
    meta["padding_check"] = info
    print("  batch2 padding check (batched item vs same item unpadded, NumPy):",
          json.dumps(info))
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
    return meta


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--keep-batch2", action="store_true", help="also write the padded-batch arrays")
    a = ap.parse_args()
    ref = Reference(a.bundle)
    _, _, version = load_bundle_meta(a.bundle)
    ort_st = OrtStages(a.bundle, a.threads)
    chk = Checker(a.tol)
    cases = CASES_V3 if version == "v3" else CASES_V2
    print(f"bundle {a.bundle} ({ref.cfg['name']}, {version}); ORT vs NumPy, tol {a.tol}")
    metas = [dump_case(a.bundle, a.out, c, ref, ort_st, chk) for c in cases]
    metas += [dump_pipeline_case(a.bundle, a.out, c, ref, ort_st, chk) for c in LONG_CASES[version]]
    # The padded batch proves the reference's masking against ORT; the engine runs
    # batch 1, so its arrays are only kept on request.
    with tempfile.TemporaryDirectory() as scratch:
        metas.append(dump_batch2(a.bundle, a.out if a.keep_batch2 else scratch, ref, ort_st, chk, version, cases[0]["steps"]))
    summary = {"config": ref.cfg["name"], "tol": a.tol,
               "errors": [{"case": c, "stage": s, "max_rel_err": e} for c, s, e in chk.rows],
               "cases": metas}
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, ensure_ascii=False)
    if chk.bad:
        print("FAILED: ORT and NumPy reference disagree:", chk.bad, file=sys.stderr)
        sys.exit(1)
    print("all stages within tolerance")


if __name__ == "__main__":
    main()
