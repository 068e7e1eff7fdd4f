#!/usr/bin/env python3
"""Streaming against one-shot synthesis of the same text: first audio, speed, and how alike the audio is.

For each `--config` (streaming options as `key=value` words; `""` = the
defaults) one row: `tts bench --stream` gives the time to the first audio, the
whole streamed synthesis and its real-time factor; `tts bench` the one-shot
time; then the text is synthesised once each way with the same seed (`tts
--out FILE --format f32` against `tts --out - --format f32`, the streamed
samples read from the pipe) and compared: log-mel cosine (80 mel bands,
1024-point Hann frames every 256 samples, log10 of the band power; the
definition `cli/tests/streaming.rs` uses) and SNR of the streamed samples
against the one-shot ones, over the shorter of the two (a cut Supertonic first
piece changes the length). Needs numpy (any of the tool venvs) and a release
build; `--rate 44100` for Supertonic.

    target/tools-venv/bin/python bench/stream_vs_oneshot.py --model T3.gguf --model S3GEN.gguf --threads 2 \
        --set min_new_tokens=150 --set max_new_tokens=149 \
        --config "" --config "stream_prompt_tokens=0 stream_cfm_steps=2"
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from benchlib import cpu_name, print_table, run, tts_profile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DEFAULT_TEXT = "The quick brown fox jumps over the lazy dog near the quiet river bank while the sun sets behind hills."


def log_mel(x, rate, n=1024, hop=256, bands=80):
    mel = lambda hz: 2595.0 * np.log10(1.0 + hz / 700.0)
    top = mel(rate / 2.0)
    edges = 700.0 * (10 ** (top * np.arange(bands + 2) / (bands + 1) / 2595.0) - 1.0)
    hz = np.arange(n // 2 + 1) * rate / n
    fb = np.zeros((bands, hz.size))
    for b in range(bands):
        lo, mid, hi = edges[b], edges[b + 1], edges[b + 2]
        up = (hz > lo) & (hz <= mid)
        down = (hz > mid) & (hz < hi)
        fb[b, up] = (hz[up] - lo) / (mid - lo)
        fb[b, down] = (hi - hz[down]) / (hi - mid)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)
    starts = range(0, max(len(x) - n, 0), hop)
    frames = np.stack([x[s:s + n].astype(np.float64) * window for s in starts])
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    return np.log10(power @ fb.T + 1e-5).ravel()


def compare(streamed, whole, rate):
    """Over the common length (a cut Supertonic first piece changes the length)."""
    n = min(len(streamed), len(whole))
    a, b = log_mel(streamed[:n], rate), log_mel(whole[:n], rate)
    cosine = float(a @ b / np.sqrt((a @ a) * (b @ b)))
    err = streamed[:n].astype(np.float64) - whole[:n]
    snr = 10 * np.log10(np.sum(whole[:n].astype(np.float64) ** 2) / max(np.sum(err ** 2), 1e-30))
    return cosine, snr


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", required=True, help="model GGUF file (repeatable)")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--text", default=DEFAULT_TEXT)
    ap.add_argument("--set", action="append", default=[], help="option for every row (key=value)")
    ap.add_argument("--config", action="append", default=None, help="streaming options of one row (key=value words)")
    ap.add_argument("--rate", type=int, default=24000, help="the model's sample rate (44100 for Supertonic)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--markdown", help="also write the table here")
    a = ap.parse_args()
    release = os.path.join(ROOT, "target", "release")
    tts = os.path.join(release, "tts")
    configs = a.config or [""]
    with tempfile.TemporaryDirectory() as d:
        profile = os.path.join(d, "p.toml")
        with open(profile, "w") as f:
            f.write(tts_profile(a.backend, a.threads))
        base = [tts, "--profile", profile, "--plugin-dir", release] + sum((["--model", m] for m in a.model), []) + ["--text", a.text]
        common = sum((["--set", s] for s in a.set), [])

        def bench(extra):
            out = run([tts, "bench"] + base[1:] + ["--runs", str(a.runs), "--warmup", str(a.warmup), "--json"] + common + extra)
            return json.loads(out)

        one_shot = bench([])
        whole_path = os.path.join(d, "whole.f32")
        run(base + common + ["--out", whole_path, "--format", "f32", "-q"])
        whole = np.fromfile(whole_path, dtype="<f4")
        rows = []
        for config in configs:
            sets = sum((["--set", kv] for kv in config.split()), [])
            streamed_run = bench(sets + ["--stream"])
            streamed = np.frombuffer(
                subprocess.run(base + common + sets + ["--out", "-", "--format", "f32", "-q"], check=True, capture_output=True).stdout, dtype="<f4")
            cosine, snr = compare(streamed, whole, a.rate)
            rows.append({"config": config or "(defaults)", "first_audio_ms": streamed_run["first_audio_ms"], "stream_ms": streamed_run["total_ms"],
                         "stream_rtf": streamed_run["rtf"], "one_shot_ms": one_shot["total_ms"], "audio_s": one_shot["audio_seconds"],
                         "samples": [len(streamed), len(whole)], "log_mel_cosine": cosine, "snr_db": snr,
                         "stages_ms": streamed_run["stages_ms"]})
            print(json.dumps(rows[-1]), file=sys.stderr)
    lines = [f"{cpu_name() if a.backend == 'cpu' else a.backend}, {a.threads} threads; one-shot {rows[0]['one_shot_ms']:.0f} ms for {rows[0]['audio_s']:.2f} s of audio",
             "", "| streaming options | first audio ms | streamed total ms | streamed / one-shot | streamed RTF | log-mel cosine | SNR dB |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r["stream_ms"] / r["one_shot_ms"]
        lines.append(f"| {r['config']} | **{r['first_audio_ms']:.0f}** | {r['stream_ms']:.0f} | {ratio:.2f}x | {r['stream_rtf']:.2f} | {r['log_mel_cosine']:.4f} | {r['snr_db']:.1f} |")
    # Where the time goes: each stage's median ms per run (a stage that runs
    # beside another on a thread of its own overlaps it: the stages then sum
    # to more than the total).
    stages = list(dict.fromkeys(k for st in [one_shot["stages_ms"]] + [r["stages_ms"] for r in rows] for k in st))
    lines += ["", "| ms per run | " + " | ".join(stages) + " | total |", "|---" * (len(stages) + 2) + "|"]
    for name, st, total in [("one-shot", one_shot["stages_ms"], one_shot["total_ms"])] + [(f"streamed, {r['config']}", r["stages_ms"], r["stream_ms"]) for r in rows]:
        lines.append(f"| {name} | " + " | ".join(f"{st[k]:.1f}" if k in st else "-" for k in stages) + f" | {total:.1f} |")
    print_table(lines, a.markdown)


if __name__ == "__main__":
    main()
