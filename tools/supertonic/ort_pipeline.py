#!/usr/bin/env python3
"""Official Supertonic pipeline running the four ONNX graphs with onnxruntime.

    python tools/supertonic/ort_pipeline.py --bundle DIR --text "Hello." --lang en \
        --voice F1 --steps 5 --speed 1.05 --seed 42 --threads 1 --out out.wav [--timings]

Shares the text frontend and the pipeline driver with reference.py.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import synthesize_with, write_wav  # noqa: E402

STAGES = ("duration_predictor", "text_encoder", "vector_estimator", "vocoder")


class OrtStages:
    def __init__(self, bundle_dir, threads=1):
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        self.sess = {n: ort.InferenceSession(os.path.join(bundle_dir, "onnx", n + ".onnx"), so,
                                             providers=["CPUExecutionProvider"])
                     for n in STAGES}

    def dp(self, text_ids, style_dp, text_mask):
        return self.sess["duration_predictor"].run(
            None, {"text_ids": text_ids, "style_dp": style_dp, "text_mask": text_mask})[0]

    def te(self, text_ids, style_ttl, text_mask):
        return self.sess["text_encoder"].run(
            None, {"text_ids": text_ids, "style_ttl": style_ttl, "text_mask": text_mask})[0]

    def ve(self, x, text_emb, style_ttl, latent_mask, text_mask, current_step, total_step):
        return self.sess["vector_estimator"].run(
            None, {"noisy_latent": x, "text_emb": text_emb, "style_ttl": style_ttl,
                   "latent_mask": latent_mask, "text_mask": text_mask,
                   "current_step": current_step, "total_step": total_step})[0]

    def voc(self, latent):
        return self.sess["vocoder"].run(None, {"latent": latent})[0]


def synthesize(bundle_dir, text, lang="en", voice="F1", steps=5, speed=1.05, seed=42, threads=1,
               timings=None, trace=None):
    return synthesize_with(OrtStages(bundle_dir, threads), bundle_dir, text, lang, voice, steps,
                           speed, seed, timings, trace)


def main():
    ap = argparse.ArgumentParser(description="onnxruntime Supertonic pipeline")
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--lang", default="en")
    ap.add_argument("--voice", default="F1", help="voice name in voice_styles/ or a JSON path")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--speed", type=float, default=1.05)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--timings", action="store_true", help="print per-stage ms as JSON")
    a = ap.parse_args()
    stages = OrtStages(a.bundle, a.threads)
    timings = {}
    t0 = time.perf_counter()
    wav, dur = synthesize_with(stages, a.bundle, a.text, a.lang, a.voice, a.steps, a.speed,
                               a.seed, timings)
    total = (time.perf_counter() - t0) * 1e3
    if a.out:
        with open(os.path.join(a.bundle, "onnx", "tts.json")) as f:
            sr = json.load(f)["ae"]["sample_rate"]
        write_wav(a.out, wav, sr)
    info = {"samples": int(wav.shape[0]), "duration_s": dur}
    if a.timings:
        info["timings_ms"] = {
            "dp": timings.get("dp", []), "te": timings.get("te", []),
            "ve_steps": timings.get("ve", []), "vocoder": timings.get("vocoder", []),
            "total": total}
    print(json.dumps(info))


if __name__ == "__main__":
    main()
