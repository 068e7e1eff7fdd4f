#!/usr/bin/env python3
"""Supertonic: time to first audio, streaming `tts` against onnxruntime's one-shot pipeline.

A random-weight duration predictor says about the same duration for any text,
so a streamed first piece cut short (`stream_first_chars`) would still be
synthesised as long as the whole sentence. This benchmark therefore sets what
the predictor says (`make_bundle.py --duration-s`, the same weights otherwise)
to what real Supertonic speech lasts: about 14 characters per second, from the
official v1 README's figures (59, 152 and 266 characters at 912, 1048 and 1263
characters/s of synthesis with RTF 0.015, 0.013 and 0.012: 13.7, 13.6 and 15.2
characters per second of audio).

In one run, alternating rounds:
- ORT, one-shot (`tools/supertonic/ort_pipeline.py`, the official pipeline),
  the whole sentence, the predictor saying len(text) / 14 s: its first audio is
  its total;
- `tts bench --stream` with `stream_first_chars = 0` on the same bundle: the
  whole sentence is the first piece;
- `tts bench --stream` with `stream_first_chars = N` on a bundle whose
  predictor says N / 14 s (the first piece is at most N characters, so this
  overstates its duration): the first audio when the first piece is cut.

    target/tools-venv/bin/python bench/supertonic_stream.py [--threads 2] [--first-chars 30]
        [--backends cpu] [--runs 5] [--rounds 3] [--markdown out.md]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

from benchlib import cpu_name, gpu_name, print_table, run, tts_profile
from supertonic_vs_ort import ROOT, STEPS, ensure_model, ort_bench

CHARS_PER_S = 14.0
DEFAULT_TEXT = "The quick brown fox jumps over the lazy dog near the quiet river bank while the sun sets behind hills."


def tts_stream(gguf, backend, threads, text, steps, runs, warmup, first_chars):
    release = os.path.join(ROOT, "target", "release")
    with tempfile.TemporaryDirectory() as d:
        profile = os.path.join(d, f"{backend}.toml")
        with open(profile, "w") as f:
            f.write(tts_profile(backend, threads))
        out = run([os.path.join(release, "tts"), "bench", "--stream", "--profile", profile, "--plugin-dir", release, "--model", gguf,
                   "--text", text, "--runs", str(runs), "--warmup", str(warmup), "--json",
                   "--set", f"steps={steps}", "--set", "voice=F1", "--set", "language=en", "--set", "speed=1.05", "--set", "seed=42",
                   "--set", f"stream_first_chars={first_chars}"])
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", default="v2", choices=sorted(STEPS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backends", nargs="+", default=["cpu"])
    ap.add_argument("--first-chars", type=int, default=30, help="stream_first_chars of the cut row")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--text", default=DEFAULT_TEXT)
    ap.add_argument("--markdown")
    a = ap.parse_args()
    steps = STEPS[a.version]
    # The predictor's output is scaled by 1 / speed; the bundle's number is before it.
    whole_s = round(len(a.text) / CHARS_PER_S * 1.05, 2)
    head_s = round(min(a.first_chars, len(a.text)) / CHARS_PER_S * 1.05, 2)
    whole_bundle, whole_gguf = ensure_model(a.version, "f32", whole_s)
    _, head_gguf = ensure_model(a.version, "f32", head_s)
    ort, whole, cut = [], {b: [] for b in a.backends}, {b: [] for b in a.backends}
    for _ in range(a.rounds):
        ort.append(ort_bench(whole_bundle, a.threads, a.text, steps, a.runs, a.warmup))
        for b in a.backends:
            whole[b].append(tts_stream(whole_gguf, b, a.threads, a.text, steps, a.runs, a.warmup, 0))
            cut[b].append(tts_stream(head_gguf, b, a.threads, a.text, steps, a.runs, a.warmup, a.first_chars))
    med = lambda rounds, key: statistics.median(r[key] for r in rounds)
    ort_ms = med(ort, "total_ms")
    gpu = gpu_name()
    lines = [f"Supertonic {a.version}, full-size random weights (F32), {steps} steps, voice F1, speed 1.05; {cpu_name()}, {a.threads} threads"
             f"{f'; GPU {gpu}' if gpu else ''}; text ({len(a.text)} characters): \"{a.text}\"; median over {a.rounds} alternating rounds "
             f"of the median of {a.runs} runs (after {a.warmup} warm-up). The duration predictor says {whole_s:g} s for the whole sentence, "
             f"{head_s:g} s for the cut first piece (14 characters per second at speed 1).", "",
             "| side | first piece | first audio ms | total ms | audio s |", "|---|---|---|---|---|",
             f"| ORT one-shot (CPU) | the sentence | {ort_ms:.1f} | {ort_ms:.1f} | {ort[0]['audio_seconds']:.2f} |"]
    rows = {"ort_ms": ort_ms}
    for b in a.backends:
        w_first, c_first = med(whole[b], "first_audio_ms"), med(cut[b], "first_audio_ms")
        lines.append(f"| tts {b}, `stream_first_chars = 0` | the sentence | {w_first:.1f} | {med(whole[b], 'total_ms'):.1f} | {whole[b][0]['audio_seconds']:.2f} |")
        lines.append(f"| tts {b}, `stream_first_chars = {a.first_chars}` | ≤ {a.first_chars} characters | **{c_first:.1f}** ({ort_ms / c_first:.1f}× sooner than ORT) | - | - |")
        rows[b] = {"whole_first_ms": w_first, "cut_first_ms": c_first}
    print(json.dumps(rows), file=sys.stderr)
    print_table(lines, a.markdown)


if __name__ == "__main__":
    main()
