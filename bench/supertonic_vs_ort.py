#!/usr/bin/env python3
"""Supertonic: `tts` against onnxruntime on the same full-size random-weight bundle.

For each version (v2, v3) and thread count, one run of this script times the
official pipeline on onnxruntime (tools/supertonic/ort_pipeline.py: the same
text frontend, noise, step loop and trim) and `tts bench` on the GGUF converted
from the same bundle, with the same text, voice, steps and thread count, and
reports the ratio (ORT time / tts time; above 1 means tts is faster) and each
side's peak RSS. Each side runs in its own process so that RSS is its own.

    target/tools-venv/bin/python bench/supertonic_vs_ort.py [--versions v2 v3] [--threads 1 2]
        [--runs 5] [--rounds 3] [--weights f32 q8_0] [--backends cpu cuda vulkan] [--markdown out.md]
        [--text TEXT] [--duration SECONDS]

`--backends` picks the `tts` side's backends (one row each; GPU rows use the
policies' defaults, F16 weights among them where the device runs them); ORT
always runs on the CPU, the only provider the onnxruntime wheel has.

Bundles are generated on demand (tools/supertonic/make_bundle.py, seed 0) into
target/supertonic-bundles/<version>[-d<duration>]/ and converted into target/supertonic-models/.
`tts` and the plugins come from target/release (`cargo build --release --workspace`).
"""
import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time

from benchlib import cpu_name, gpu_name, print_table, run, tts_profile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, "tools", "supertonic")
DEFAULT_TEXT = "The quick brown fox jumps over the lazy dog near the quiet river bank."
STEPS = {"v2": 5, "v3": 8}


def ort_worker(a):
    """Runs in a child process: times the ORT pipeline, prints JSON."""
    sys.path.insert(0, TOOLS)
    from ort_pipeline import OrtStages
    from reference import synthesize_with

    t0 = time.perf_counter()
    stages = OrtStages(a.bundle, a.threads)
    load_ms = (time.perf_counter() - t0) * 1e3
    totals, per_stage = [], {}
    samples = 0
    for i in range(a.warmup + a.runs):
        timings = {}
        t0 = time.perf_counter()
        wav, _ = synthesize_with(stages, a.bundle, a.text, "en", "F1", a.steps, 1.05, 42, timings)
        total = (time.perf_counter() - t0) * 1e3
        if i < a.warmup:
            continue
        samples = int(wav.shape[0])
        totals.append(total)
        flat = {"duration": sum(timings.get("dp", [])), "text_encoder": sum(timings.get("te", [])),
                "vocoder": sum(timings.get("vocoder", []))}
        for s, ms in enumerate(timings.get("ve", [])):
            flat[f"vector_estimator.step{s}"] = ms
        for k, v in flat.items():
            per_stage.setdefault(k, []).append(v)
    print(json.dumps({
        "total_ms": statistics.median(totals),
        "stages_ms": {k: statistics.median(v) for k, v in per_stage.items()},
        "audio_seconds": samples / 44100,
        "load_ms": load_ms,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))



def ensure_model(version, weights, duration):
    name = version if duration is None else f"{version}-d{duration:g}"
    bundle = os.path.join(ROOT, "target", "supertonic-bundles", name)
    if not os.path.isfile(os.path.join(bundle, "onnx", "vector_estimator.onnx")):
        print(f"generating the full-size {name} bundle ...", file=sys.stderr)
        extra = [] if duration is None else ["--duration-s", str(duration)]
        run([sys.executable, os.path.join(TOOLS, "make_bundle.py"), "--config", version, "--seed", "0", "--out", bundle] + extra)
    models = os.path.join(ROOT, "target", "supertonic-models")
    os.makedirs(models, exist_ok=True)
    gguf = os.path.join(models, f"{name}-{weights}.gguf")
    if not os.path.isfile(gguf) or os.path.getmtime(gguf) < os.path.getmtime(os.path.join(bundle, "onnx", "vector_estimator.onnx")):
        run([sys.executable, os.path.join(TOOLS, "convert.py"), bundle, gguf, "--weights", weights])
    return bundle, gguf


def tts_bench(gguf, backend, threads, text, steps, runs, warmup):
    release = os.path.join(ROOT, "target", "release")
    with tempfile.TemporaryDirectory() as d:
        profile = os.path.join(d, f"{backend}.toml")
        with open(profile, "w") as f:
            f.write(tts_profile(backend, threads))
        out = run([os.path.join(release, "tts"), "bench", "--profile", profile, "--plugin-dir", release, "--model", gguf,
                   "--text", text, "--runs", str(runs), "--warmup", str(warmup), "--json",
                   "--set", f"steps={steps}", "--set", "voice=F1", "--set", "language=en", "--set", "speed=1.05", "--set", "seed=42"])
    return json.loads(out)


def ort_bench(bundle, threads, text, steps, runs, warmup):
    out = run([sys.executable, os.path.abspath(__file__), "--ort-worker", "--bundle", bundle, "--threads", str(threads),
               "--text", text, "--steps", str(steps), "--runs", str(runs), "--warmup", str(warmup)])
    return json.loads(out)



def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--versions", nargs="+", default=["v2", "v3"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--weights", nargs="+", default=["f32"], help="GGUF weight storage for tts (ORT always runs the F32 bundle)")
    ap.add_argument("--backends", nargs="+", default=["cpu"], help="tts backends, one row each")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per round and side")
    ap.add_argument("--rounds", type=int, default=3, help="alternating ORT / tts rounds (median of round medians)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--text", default=DEFAULT_TEXT)
    ap.add_argument("--duration", type=float,
                    help="seconds the random duration predictor says per chunk (before the speed factor); "
                         "random weights otherwise say about 2 s for any text, real ones about 10 s for 150 characters")
    ap.add_argument("--markdown", help="also write the table here")
    # worker mode
    ap.add_argument("--ort-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--bundle", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.ort_worker:
        a.threads = a.threads[0]
        return ort_worker(a)

    rows = []
    for version in a.versions:
        steps = STEPS[version]
        for weights in a.weights:
            bundle, gguf = ensure_model(version, weights, a.duration)
            for threads in a.threads:
                # Alternate the two sides over several rounds so that drift in the
                # machine's speed (shared hosts) hits both alike; medians of rounds.
                ort_rounds, tts_rounds = [], {b: [] for b in a.backends}
                for _ in range(a.rounds):
                    ort_rounds.append(ort_bench(bundle, threads, a.text, steps, a.runs, a.warmup))
                    for b in a.backends:
                        tts_rounds[b].append(tts_bench(gguf, b, threads, a.text, steps, a.runs, a.warmup))
                for backend in a.backends:
                    rows.append(table_row(version, weights, backend, threads, steps, ort_rounds, tts_rounds[backend]))

    gpu = gpu_name()
    said = "" if a.duration is None else f"; the random duration predictor says {a.duration:g} s a chunk"
    lines = [f"Machine: {cpu_name()}, {os.cpu_count()} cores{f'; GPU {gpu}' if gpu else ''}; text: \"{a.text}\" (voice F1, speed 1.05, seed 42{said}); "
             f"median over {a.rounds} alternating rounds of the median of {a.runs} runs (after {a.warmup} warm-up) per side; "
             "ORT on the CPU with the row's threads.", "",
             "| version | tts weights | tts backend | threads | steps | audio s | ORT ms | tts ms | ratio | VE ms ORT / tts | vocoder ms ORT / tts | peak RSS MiB ORT / tts |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['version']} | {r['weights']} | {r['backend']} | {r['threads']} | {r['steps']} | {r['audio_s']:.2f} | {r['ort_ms']:.0f} | "
                     f"{r['tts_ms']:.1f} | **{r['ratio']:.2f}×** | {r['ort_ve_ms']:.0f} / {r['tts_ve_ms']:.1f} | "
                     f"{r['ort_vocoder_ms']:.0f} / {r['tts_vocoder_ms']:.1f} | {r['ort_rss_mib']:.0f} / {r['tts_rss_mib']:.0f} |")
    print_table(lines, a.markdown)


def table_row(version, weights, backend, threads, steps, ort_rounds, tts_rounds):
    ve = lambda r: sum(v for k, v in r["stages_ms"].items() if k.startswith("vector_estimator"))
    med = lambda rounds, f: statistics.median(f(r) for r in rounds)
    ort_ms, tts_ms = med(ort_rounds, lambda r: r["total_ms"]), med(tts_rounds, lambda r: r["total_ms"])
    row = {"version": version, "weights": weights, "backend": backend, "threads": threads, "steps": steps,
           "audio_s": tts_rounds[0]["audio_seconds"], "ort_ms": ort_ms, "tts_ms": tts_ms,
           "ratio": ort_ms / tts_ms,
           "ort_ve_ms": med(ort_rounds, ve), "tts_ve_ms": med(tts_rounds, ve),
           "ort_vocoder_ms": med(ort_rounds, lambda r: r["stages_ms"]["vocoder"]),
           "tts_vocoder_ms": med(tts_rounds, lambda r: r["stages_ms"]["vocoder"]),
           "ort_rss_mib": max(r["peak_rss_mib"] for r in ort_rounds), "tts_rss_mib": max(r["peak_rss_mib"] for r in tts_rounds)}
    print(json.dumps(row), file=sys.stderr)
    return row


if __name__ == "__main__":
    main()
