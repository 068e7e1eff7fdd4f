#!/usr/bin/env python3
"""Chatterbox Turbo or Multilingual: `tts` against the PyTorch reference on the same full-size random weights.

One run of this script times, in alternating rounds, the reference package
(`chatterbox-tts==0.1.7`, `ChatterboxTurboTTS.from_local` on the official-format
checkpoint directory, F32, CPU) and `tts bench` on the GGUF files converted from the
same directory (F32, and each `--weights` storage), with the same text, the same
thread count and the same fixed speech-token count: both sides suppress the stop
token (the reference through a speech-head hook, `tts` with `min_new_tokens`) and cap
the count, so both run one prefill and N-1 decode steps, then S3Gen and HiFT on N+3
tokens. The ratio is reference time / tts time (above 1: tts is faster). Each side
runs in its own process, so peak RSS is its own.

T3 decode is bound by memory bandwidth: each step reads every T3 matrix once. The
script measures this machine's copy bandwidth and reports the bound (bytes of the
T3 matrices / bandwidth) next to the measured ms per token.

    target/chatterbox-venv/bin/python bench/chatterbox_vs_torch.py [--tokens 100] [--threads 2]
        [--weights f32 q8_0 q4_0] [--runs 2] [--rounds 2] [--markdown out.md]
        [--device cuda --backends cuda vulkan]

`--device cuda` runs the reference on the GPU (F32, as the package loads it;
each timed call ends with `torch.cuda.synchronize()`) and takes the bound from
the GPU's copy bandwidth; `--backends` picks the `tts` side's backends, one row
each (GPU rows use the policies' defaults: fused attention and an F16 K/V
cache where the device runs them; weights as the file stores them, so
`--weights f16` is the F16 row).

`--stream` times `tts bench --stream` (audio handed on every `stream_tokens` speech
tokens while T3 generates) and adds its time to the first audio; the reference has
no streaming, so its column stays its one-shot time.

`--variant mtl` benchmarks Multilingual (`ChatterboxMultilingualTTS.generate`,
language `en`): T3 runs both guidance rows (cfg_weight 0.5) and S3Gen the 10-step
decoder with guidance; the fixed count is kept on both sides by suppressing the stop
token while the alignment analyzer still runs but its verdicts are not applied (the
reference through a patched `AlignmentStreamAnalyzer.step`, `tts` with
`min_new_tokens`); S3Gen then decodes the N tokens (no silence tokens, as the reference).
`--guidance` adds `tts` rows with T3's guidance as a batch of two and as two passes.

The checkpoint directories are target/chatterbox-full (Turbo: tools/chatterbox/make_fixtures.py
--size full, plus make_tokenizer.py --vocab 50276) and target/chatterbox-mtl-full
(make_mtl_fixtures.py --size full --no-dumps --tokenizer tests/fixtures/chatterbox/mtl-text/tokenizer.json);
conversions go to <dir>/gguf-<weights>/. `tts` and the plugins come from target/release
(`cargo build --release --workspace`).
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
TOOLS = os.path.join(ROOT, "tools", "chatterbox")
VARIANTS = {
    # checkpoint dir, T3 checkpoint, converted T3, converted S3Gen, convert.py arguments
    "turbo": ("chatterbox-full", "t3_turbo_v1.safetensors", "t3-turbo.gguf", "s3gen-meanflow.gguf", []),
    "mtl": ("chatterbox-mtl-full", "t3_mtl23ls_v2.safetensors", "t3-mtl.gguf", "s3gen.gguf", ["--variant", "mtl"]),
}
DEFAULT_TEXT = "The quick brown fox jumps over the lazy dog near the quiet river bank."
STOP = 6562


def ckpt_dir(variant):
    return os.path.join(ROOT, "target", VARIANTS[variant][0])


def load_reference(a):
    """The reference model as its from_local loads it, with the fixed token count imposed;
    returns (tts, generate-with-text)."""
    import torch
    t0 = time.perf_counter()
    if a.variant == "turbo":
        from chatterbox.tts_turbo import ChatterboxTurboTTS
        tts = ChatterboxTurboTTS.from_local(a.ckpt, a.device)
        t3 = tts.t3
        # No stop token: N tokens (one from the prefill, N-1 steps).
        t3.speech_head.register_forward_hook(lambda m, i, o: o.index_fill_(-1, torch.tensor([STOP], device=o.device), float("-inf")))
        real_inference = type(t3).inference_turbo
        t3.inference_turbo = lambda *args, **kw: real_inference(t3, *args, **{**kw, "max_gen_len": a.tokens - 1})
        generate = lambda text: tts.generate(text)
    else:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from chatterbox.mtl_tts import ChatterboxMultilingualTTS
        import chatterbox.models.t3.inference.alignment_stream_analyzer as asa
        tts = ChatterboxMultilingualTTS.from_local(a.ckpt, a.device)
        t3 = tts.t3
        # The stop token far below every other in both guidance rows (finite: the combine subtracts
        # the rows); the analyzer runs but its verdict (suppress or force the stop) is not applied.
        t3.speech_head.register_forward_hook(lambda m, i, o: o.index_fill_(-1, torch.tensor([STOP], device=o.device), -1e9))
        real_step = asa.AlignmentStreamAnalyzer.step
        asa.AlignmentStreamAnalyzer.step = lambda self, logits, next_token=None: (real_step(self, logits.clone(), next_token=next_token), logits)[1]
        real_inference = type(t3).inference
        t3.inference = lambda **kw: real_inference(t3, **{**kw, "max_new_tokens": a.tokens})
        # The filter tts adds: the reference's flow embedding fails on ids >= 6561, which random weights sample.
        import chatterbox.mtl_tts as mtl_mod
        real_drop = mtl_mod.drop_invalid_tokens
        mtl_mod.drop_invalid_tokens = lambda x: (lambda kept: kept[kept < 6561])(real_drop(x))
        generate = lambda text: tts.generate(text, language_id="en")
    return tts, generate, (time.perf_counter() - t0) * 1e3


def torch_worker(a):
    """Runs in a child process: times the reference's generate stage by stage, prints JSON."""
    import torch

    torch.set_num_threads(a.threads)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    tts, generate, load_ms = load_reference(a)
    tts.watermarker.apply_watermark = lambda wav, sample_rate: wav  # tts does not watermark
    t3 = tts.t3
    calls = []
    real_forward = t3.tfmr.forward

    def timed_forward(*args, **kw):
        sync()
        s = time.perf_counter()
        out = real_forward(*args, **kw)
        sync()
        calls.append((time.perf_counter() - s) * 1e3)
        return out
    t3.tfmr.forward = timed_forward
    stage = {}

    def timed(obj, name, key):
        real = getattr(obj, name)

        def wrap(*args, **kw):
            sync()
            s = time.perf_counter()
            out = real(*args, **kw)
            sync()
            stage[key] = (time.perf_counter() - s) * 1e3
            return out
        setattr(obj, name, wrap)
    timed(tts.s3gen, "flow_inference", "s3gen")
    timed(tts.s3gen, "hift_inference", "hift")

    totals, per_stage, samples = [], {}, 0
    for i in range(a.warmup + a.runs):
        calls.clear()
        stage.clear()
        torch.manual_seed(i)
        t0 = time.perf_counter()
        with torch.inference_mode():
            wav = generate(a.text)
        sync()
        total = (time.perf_counter() - t0) * 1e3
        if i < a.warmup:
            continue
        samples = int(wav.numel())
        totals.append(total)
        row = {"t3.prefill": calls[0], "t3.decode": sum(calls[1:]), "t3.ms_per_token": sum(calls[1:]) / max(len(calls) - 1, 1),
               "s3gen": stage["s3gen"], "hift": stage["hift"], "tokens": len(calls)}
        for k, v in row.items():
            per_stage.setdefault(k, []).append(v)
    print(json.dumps({
        "total_ms": statistics.median(totals),
        "stages_ms": {k: statistics.median(v) for k, v in per_stage.items()},
        "audio_seconds": samples / 24000,
        "load_ms": load_ms,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))



def ensure_gguf(variant, weights, decoder="auto"):
    _, t3_src, t3_name, s3_name, convert_args = VARIANTS[variant]
    ckpt = ckpt_dir(variant)
    out = os.path.join(ckpt, f"gguf-{weights}" + ("" if decoder == "auto" else f"-{decoder}"))
    t3, s3 = os.path.join(out, t3_name), os.path.join(out, s3_name)
    src = os.path.join(ckpt, t3_src)
    if not os.path.isfile(src):
        sys.exit(f"{src} is missing: generate the full-size checkpoint first (see this script's docstring)")
    if not os.path.isfile(t3) or os.path.getmtime(t3) < os.path.getmtime(src):
        run([sys.executable, os.path.join(TOOLS, "convert.py"), ckpt, out, "--weights", weights, "--decoder-weights", decoder] + convert_args)
    return t3, s3


def t3_matrix_bytes(t3_path):
    """Bytes every decode step reads: the T3 transformer's and head's matrices."""
    import gguf
    r = gguf.GGUFReader(t3_path)
    return sum(int(t.n_bytes) for t in r.tensors if t.name.startswith("t3.blk.") or t.name.startswith("t3.speech_head"))


def copy_bandwidth_gbs(threads):
    """Read+write bandwidth of large array copies (STREAM-like), in GB/s."""
    import numpy as np
    n = 256 * 1024 * 1024 // 4
    a, b = np.ones(n, dtype=np.float32), np.empty(n, dtype=np.float32)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return 2 * a.nbytes / best / 1e9


def gpu_copy_bandwidth_gbs():
    """Read+write bandwidth of large device-to-device copies, in GB/s."""
    import torch
    a = torch.ones(256 * 1024 * 1024 // 4, device="cuda")
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(10):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        b.copy_(a)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2 * a.numel() * 4 / best / 1e9


def tts_bench(t3, s3, backend, threads, text, tokens, runs, warmup, extra):
    release = os.path.join(ROOT, "target", "release")
    with tempfile.TemporaryDirectory() as d:
        profile = os.path.join(d, f"{backend}.toml")
        with open(profile, "w") as f:
            f.write(tts_profile(backend, threads))
        out = run([os.path.join(release, "tts"), "bench", "--profile", profile, "--plugin-dir", release, "--model", t3, "--model", s3,
                   "--text", text, "--runs", str(runs), "--warmup", str(warmup), "--json",
                   "--set", f"min_new_tokens={tokens}", "--set", "seed=0"] + extra)
    return json.loads(out)


def torch_bench(variant, device, threads, text, tokens, runs, warmup):
    out = run([sys.executable, os.path.abspath(__file__), "--torch-worker", "--variant", variant, "--device", device, "--ckpt", ckpt_dir(variant), "--threads", str(threads),
               "--text", text, "--tokens", str(tokens), "--runs", str(runs), "--warmup", str(warmup)])
    # The reference prints progress to stdout; the report is the last line.
    return json.loads(out.strip().splitlines()[-1])



def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="turbo")
    ap.add_argument("--decoder-weights", nargs="+", default=["auto"], choices=["auto", "f32", "f16", "bf16"],
                    help="convert.py --decoder-weights: the CFM estimator's storage, one tts row each")
    ap.add_argument("--guidance", nargs="+", default=["batch"], choices=["batch", "two-pass"],
                    help="Multilingual: T3's guidance rows as one batch and/or two passes, one tts row each")
    ap.add_argument("--threads", nargs="+", type=int, default=[2])
    ap.add_argument("--weights", nargs="+", default=["f32", "q8_0", "q4_0"], help="GGUF storage for tts (the reference runs F32)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the reference runs")
    ap.add_argument("--backends", nargs="+", default=["cpu"], help="tts backends, one row each per weight storage")
    ap.add_argument("--tokens", type=int, default=100, help="speech tokens generated by each side")
    ap.add_argument("--runs", type=int, default=2, help="timed runs per round and side")
    ap.add_argument("--rounds", type=int, default=2, help="alternating reference / tts rounds (median of round medians)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--text", default=DEFAULT_TEXT)
    ap.add_argument("--markdown", help="also write the table here")
    ap.add_argument("--stream", action="store_true",
                    help="time tts's streaming synthesis (`tts bench --stream`: audio every stream_tokens tokens) and report its time to first audio; the reference has no streaming and runs one-shot")
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_worker:
        a.threads = a.threads[0]
        return torch_worker(a)

    files = {(w, d): ensure_gguf(a.variant, w, d) for w in a.weights for d in a.decoder_weights}
    bandwidth = gpu_copy_bandwidth_gbs() if a.device == "cuda" else copy_bandwidth_gbs(max(a.threads))
    cap = a.tokens - 1 if a.variant == "turbo" else a.tokens  # inference_turbo's cap counts one token fewer
    modes = a.guidance if a.variant == "mtl" else [None]
    rows = []
    for threads in a.threads:
        sides = [(b, w, d, m) for b in a.backends for w in a.weights for d in a.decoder_weights for m in modes]
        ref_rounds, tts_rounds = [], {side: [] for side in sides}
        for _ in range(a.rounds):
            # Alternate the sides so that drift in the machine's speed hits both alike.
            ref_rounds.append(torch_bench(a.variant, a.device, threads, a.text, a.tokens, a.runs, a.warmup))
            for b, w, d, m in sides:
                extra = ["--set", f"max_new_tokens={cap}"] + (["--set", f"guidance={m}"] if m else []) + (["--stream"] if a.stream else [])
                tts_rounds[(b, w, d, m)].append(tts_bench(*files[(w, d)], b, threads, a.text, a.tokens, a.runs, a.warmup, extra))
        med = lambda rounds, f: statistics.median(f(r) for r in rounds)
        ref_ms = med(ref_rounds, lambda r: r["total_ms"])
        ref_tok = med(ref_rounds, lambda r: r["stages_ms"]["t3.ms_per_token"])
        ref_s3 = med(ref_rounds, lambda r: r["stages_ms"]["s3gen"] + r["stages_ms"]["hift"])
        for (b, w, d, m), rs in tts_rounds.items():
            tts_ms = med(rs, lambda r: r["total_ms"])
            # Weights run as the file stores them (the f16_weights policy keeps F16 files F16).
            bound = t3_matrix_bytes(files[(w, d)][0]) / (bandwidth * 1e9) * 1e3
            row = {"threads": threads, "backend": b, "weights": w, "decoder": d, "guidance": m, "tokens": a.tokens, "audio_s": rs[0]["audio_seconds"],
                   "ref_audio_s": ref_rounds[0]["audio_seconds"],
                   "ref_ms": ref_ms, "tts_ms": tts_ms, "ratio": ref_ms / tts_ms,
                   "ref_ms_per_token": ref_tok, "tts_ms_per_token": med(rs, lambda r: r["stages_ms"]["t3.ms_per_token"]),
                   "bound_ms_per_token": bound,
                   "tts_prefill_ms": med(rs, lambda r: r["stages_ms"]["t3.prefill"]),
                   "ref_s3gen_hift_ms": ref_s3,
                   "tts_s3gen_ms": med(rs, lambda r: r["stages_ms"]["s3gen.encoder"] + r["stages_ms"]["s3gen.cfm"]),
                   "tts_hift_ms": med(rs, lambda r: r["stages_ms"]["hift"]),
                   "tts_rtf": med(rs, lambda r: r["rtf"]),
                   "tts_first_audio_ms": med(rs, lambda r: r.get("first_audio_ms") or float("nan")),
                   "ref_rss_mib": max(r["peak_rss_mib"] for r in ref_rounds), "tts_rss_mib": max(r["peak_rss_mib"] for r in rs)}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)

    gpu = gpu_name() if a.device == "cuda" else None
    where = f"GPU {gpu}, host {cpu_name()}" if gpu else f"{cpu_name()}, {os.cpu_count()} cores"
    lines = [f"Chatterbox {a.variant}. Machine: {where}, copy bandwidth {bandwidth:.1f} GB/s; text: \"{a.text}\"; "
             f"{a.tokens} speech tokens on both sides; median over {a.rounds} alternating rounds of the median of {a.runs} runs "
             f"(after {a.warmup} warm-up) per side. The reference is F32 on {a.device} in every row.", "",
             "| threads | tts backend | tts weights | decoder | guidance | audio s ref / tts | reference ms | tts ms | ratio | T3 ms/token ref / tts (bound) | S3Gen+HiFT ms ref / tts | tts RTF | peak RSS MiB ref / tts |"
             + (" tts first audio ms (streaming) |" if a.stream else ""),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if a.stream else "")]
    for r in rows:
        lines.append(f"| {r['threads']} | {r['backend']} | {r['weights']} | {r['decoder']} | {r['guidance'] or '-'} | {r['ref_audio_s']:.2f} / {r['audio_s']:.2f} | {r['ref_ms']:.0f} | {r['tts_ms']:.0f} | **{r['ratio']:.2f}×** | "
                     f"{r['ref_ms_per_token']:.2f} / {r['tts_ms_per_token']:.2f} ({r['bound_ms_per_token']:.2f}) | "
                     f"{r['ref_s3gen_hift_ms']:.0f} / {r['tts_s3gen_ms'] + r['tts_hift_ms']:.1f} | {r['tts_rtf']:.3f} | "
                     f"{r['ref_rss_mib']:.0f} / {r['tts_rss_mib']:.0f} |" + (f" **{r['tts_first_audio_ms']:.0f}** |" if a.stream else ""))
    print_table(lines, a.markdown)


if __name__ == "__main__":
    main()
