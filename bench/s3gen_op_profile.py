#!/usr/bin/env python3
"""Chatterbox Turbo's S3Gen and HiFT on the CPU, op by op: `tts` against the PyTorch reference.

Both sides run the full-size random Turbo checkpoint of bench/chatterbox_vs_torch.py
(`tts` its F32 conversion) with the same text, thread count and fixed speech-token
count, so S3Gen's encoder, its CFM estimator and HiFT see the same shapes. Per stage
(encoder, CFM, HiFT) the script reports:
- the stage's wall time on each side (medians of untraced runs);
- where it goes, by kind of op: `tts` from the CPU plugin's per-op log
  (GGML_CPU_PERF_LOGGER, backends/cpu patch 0006: each node's wall time until its
  slowest worker is done), PyTorch from torch.profiler (each top-level aten op
  called inside the stage, inclusive of what it calls);
- the ops that take the most time on each side, with their shapes.

`tts` computes a convolution as im2col (patches in memory) and a product; PyTorch
calls oneDNN's direct convolution. The kinds therefore pair "products and
convolutions" on both sides and show im2col apart. What a stage spends outside its
graphs (host work: HiFT's sine source, uploads and downloads) is its wall time less
the logged ops of the same run, and likewise on PyTorch's side (Python and dispatch
between the ops; the traced run's own wall, since the profiler slows every op).

    target/chatterbox-venv/bin/python bench/s3gen_op_profile.py [--threads 2] [--tokens 100]
        [--runs 3] [--top 8] [--markdown out.md]

Needs target/chatterbox-full (see bench/chatterbox_vs_torch.py) and target/release.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

from benchlib import cpu_name, print_table, tts_profile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES = ("encoder", "cfm", "hift")
STAGE_TITLES = {"encoder": "S3Gen encoder", "cfm": "CFM estimator (2 meanflow steps)", "hift": "HiFT (F0, source, decoder, ISTFT)"}
KINDS = ("products and convolutions", "of which im2col", "attention", "norms", "activations and element-wise", "copies and layout",
         "STFT / ISTFT", "other ops", "outside the logged ops")

# ---------------------------------------------------------------- tts side

LOG_LINE = re.compile(r"^(.*): (\d+) x ([0-9.]+) us = ([0-9.]+) us$")


def tts_graphs(stderr):
    """Every graph's per-op lines in run order: [(name, count, total_us)]."""
    graphs = []
    for block in stderr.split("----------------\n")[1:]:
        lines = block.splitlines()
        if not lines or lines[0] != "CPU Timings:":
            continue
        ops = []
        for line in lines[1:]:
            m = LOG_LINE.match(line.strip())
            if m:
                ops.append((m.group(1), int(m.group(2)), float(m.group(4))))
        graphs.append(ops)
    return graphs


def op_of(name):
    """The ggml op of a log line's name ("FUSED3 ADD" -> "ADD", "MUL_MAT f32 m=..." -> "MUL_MAT")."""
    return name.split(" ")[1] if name.startswith("FUSED") else name.split(" ")[0]


def op_names(ops):
    return {op_of(name) for name, _, _ in ops}


def tts_stage_graphs(graphs):
    """The last synthesis's S3Gen and HiFT graphs by stage. A synthesis runs T3 (its
    decode steps are matrix-vector products), then the encoder, the CFM steps (the
    estimator's Mish: SOFTPLUS), HiFT's F0 predictor (ELU) and its decoder (SIN)."""
    hift = max(i for i, g in enumerate(graphs) if "SIN" in op_names(g))
    f0 = hift - 1
    if "ELU" not in op_names(graphs[f0]):
        sys.exit("the per-op log does not end with HiFT's F0 predictor and decoder graphs")
    cfm = []
    i = f0 - 1
    while i >= 0 and "SOFTPLUS" in op_names(graphs[i]):
        cfm.insert(0, i)
        i -= 1
    if not cfm:
        sys.exit("no CFM graph before HiFT's in the per-op log")
    encoder = i
    if "MUL_MAT_VEC" in op_names(graphs[encoder]):
        sys.exit("the graph before the CFM is a T3 step, not the S3Gen encoder")
    return {"encoder": [graphs[encoder]], "cfm": [graphs[j] for j in cfm], "hift": [graphs[f0], graphs[hift]]}


def tts_kind(name):
    op = op_of(name)
    if op in ("MUL_MAT", "MUL_MAT_VEC", "OUT_PROD", "CONV_TRANSPOSE_1D", "CONV_2D", "IM2COL"):
        return "products and convolutions"
    if op in ("FLASH_ATTN_EXT", "SOFT_MAX"):
        return "attention"
    if op in ("NORM", "RMS_NORM", "GROUP_NORM", "L2_NORM"):
        return "norms"
    if op in ("CPY", "CONT", "CONCAT", "PAD", "PAD_REFLECT_1D", "REPEAT", "GET_ROWS", "SET_ROWS", "DUP", "ROLL"):
        return "copies and layout"
    return "activations and element-wise"


def run_tts(a, t3, s3):
    release = os.path.join(ROOT, "target", "release")
    with tempfile.TemporaryDirectory() as d:
        profile = os.path.join(d, "cpu.toml")
        with open(profile, "w") as f:
            f.write(tts_profile("cpu", a.threads))
        base = [os.path.join(release, "tts"), "bench", "--profile", profile, "--plugin-dir", release, "--model", t3, "--model", s3,
                "--text", a.text, "--json", "--set", f"min_new_tokens={a.tokens}", "--set", f"max_new_tokens={a.tokens - 1}", "--set", "seed=0"]
        timed = subprocess.run(base + ["--runs", str(a.runs), "--warmup", "1"], capture_output=True, text=True)
        if timed.returncode != 0:
            sys.exit(f"tts bench failed:\n{timed.stderr}")
        logged = subprocess.run(base + ["--runs", "1", "--warmup", "1"], capture_output=True, text=True, env={**os.environ, "GGML_CPU_PERF_LOGGER": "1"})
        if logged.returncode != 0:
            sys.exit(f"tts bench (logged) failed:\n{logged.stderr[-4000:]}")
    def walls(report):
        stages = json.loads(report)["stages_ms"]
        return {"encoder": stages["s3gen.encoder"], "cfm": stages["s3gen.cfm"], "hift": stages["hift"]}
    wall, logged_wall = walls(timed.stdout), walls(logged.stdout)
    by_stage = tts_stage_graphs(tts_graphs(logged.stderr))
    out = {}
    for stage, graphs in by_stage.items():
        kinds, ops = defaultdict(float), defaultdict(lambda: [0, 0.0])
        for g in graphs:
            for name, count, us in g:
                kinds[tts_kind(name)] += us / 1e3
                if op_of(name) == "IM2COL":
                    kinds["of which im2col"] += us / 1e3
                ops[name][0] += count
                ops[name][1] += us / 1e3
        logged_ms = sum(v for k, v in kinds.items() if k != "of which im2col")
        kinds["outside the logged ops"] = logged_wall[stage] - logged_ms
        out[stage] = {"wall_ms": wall[stage], "kinds": dict(kinds), "ops": {k: v for k, v in ops.items()}, "graphs": len(graphs),
                      "nodes": sum(c for g in graphs for _, c, _ in g)}
    return out

# ---------------------------------------------------------------- PyTorch side


def torch_kind(name):
    op = name.removeprefix("aten::")
    if op in ("linear", "addmm", "mm", "bmm", "matmul", "baddbmm", "einsum", "conv1d", "conv2d", "conv_transpose1d", "convolution", "_convolution"):
        return "products and convolutions"
    if op in ("scaled_dot_product_attention", "softmax", "_softmax"):
        return "attention"
    if op in ("layer_norm", "group_norm", "native_layer_norm"):
        return "norms"
    if op in ("stft", "istft") or op.startswith("fft_") or op.startswith("_fft"):
        return "STFT / ISTFT"
    if op in ("cat", "stack", "transpose", "permute", "contiguous", "clone", "copy_", "to", "_to_copy", "pad", "constant_pad_nd",
              "reflection_pad1d", "repeat", "expand", "index", "index_select", "slice", "select", "view", "reshape", "flip",
              "repeat_interleave", "narrow", "unsqueeze", "squeeze", "zeros", "zeros_like", "ones", "empty", "full", "new_zeros",
              "detach", "t", "split", "chunk", "unbind", "masked_fill", "fill_", "zero_", "interpolate", "upsample_nearest1d"):
        return "copies and layout"
    return "activations and element-wise"


def torch_worker(a):
    """Child process: the reference's S3Gen stages, timed untraced, then once under the profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import chatterbox_vs_torch as cvt

    torch.set_num_threads(a.threads)
    a.variant, a.device = "turbo", "cpu"
    tts, generate, _ = cvt.load_reference(a)
    tts.watermarker.apply_watermark = lambda wav, sample_rate: wav
    s3 = tts.s3gen
    wall, traced = defaultdict(list), defaultdict(list)
    tracing = {"on": False}

    def labelled(obj, name, stage):
        real = getattr(obj, name)

        def wrap(*args, **kw):
            t0 = time.perf_counter()
            with record_function(f"stage::{stage}"):
                out = real(*args, **kw)
            (traced if tracing["on"] else wall)[stage].append((time.perf_counter() - t0) * 1e3)
            return out
        setattr(obj, name, wrap)
    labelled(s3, "flow_inference", "flow")
    labelled(s3.flow.decoder, "forward", "cfm")
    labelled(s3, "hift_inference", "hift")

    for i in range(1 + a.runs):
        torch.manual_seed(i)
        with torch.inference_mode():
            generate(a.text)
        if i == 0:
            wall.clear()
    tracing["on"] = True
    torch.manual_seed(0)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof, torch.inference_mode():
        generate(a.text)

    events = prof.events()
    label = {}

    def stage_of(ev):
        p = ev.cpu_parent
        while p is not None:
            if p.name.startswith("stage::"):
                s = p.name.removeprefix("stage::")
                return "encoder" if s == "flow" else s
            p = p.cpu_parent
        return None
    kinds = {s: defaultdict(float) for s in STAGES}
    ops = {s: defaultdict(lambda: [0, 0.0]) for s in STAGES}
    for ev in events:
        parent = ev.cpu_parent
        # Top-level ops: called by the stage's code directly, not by another op.
        if parent is None or not parent.name.startswith("stage::") or ev.name.startswith("stage::"):
            continue
        stage = stage_of(ev)
        ms = ev.cpu_time_total / 1e3
        kinds[stage][torch_kind(ev.name)] += ms
        shapes = "x".join(str(s) for s in ev.input_shapes[0]) if ev.input_shapes and ev.input_shapes[0] else ""
        key = f"{ev.name} {shapes}".strip()
        ops[stage][key][0] += 1
        ops[stage][key][1] += ms
    def by_stage(times):
        med = {s: statistics.median(v) for s, v in times.items()}
        # The flow's time holds the CFM's.
        return {"encoder": med["flow"] - med["cfm"], "cfm": med["cfm"], "hift": med["hift"]}
    walls, traced_walls = by_stage(wall), by_stage(traced)
    out = {}
    for s in STAGES:
        k = dict(kinds[s])
        # The traced run's own wall: the profiler slows every op alike.
        k["outside the logged ops"] = traced_walls[s] - sum(kinds[s].values())
        out[s] = {"wall_ms": walls[s], "kinds": k, "ops": {n: v for n, v in ops[s].items()}}
    print(json.dumps(out))


def run_torch(a):
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-worker", "--ckpt", os.path.join(ROOT, "target", "chatterbox-full"),
           "--threads", str(a.threads), "--tokens", str(a.tokens), "--runs", str(a.runs), "--text", a.text]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"the reference worker failed:\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])

# ---------------------------------------------------------------- report


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3, help="untimed warm-up, then this many timed runs per side")
    ap.add_argument("--top", type=int, default=8, help="ops listed per stage and side")
    ap.add_argument("--text", default="The quick brown fox jumps over the lazy dog near the quiet river bank.")
    ap.add_argument("--markdown", help="also write the tables here")
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_worker:
        return torch_worker(a)

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import chatterbox_vs_torch as cvt
    t3, s3 = cvt.ensure_gguf("turbo", "f32")
    ref = run_torch(a)
    ours = run_tts(a, t3, s3)

    lines = [f"Chatterbox Turbo, S3Gen and HiFT by stage and kind of op. Machine: {cpu_name()}, {os.cpu_count()} cores; "
             f"{a.threads} threads on both sides; {a.tokens} speech tokens; full-size random weights, F32 on both sides. "
             f"Stage walls: medians of {a.runs} untraced runs after a warm-up; kinds: one traced run.", "",
             "| stage | kind | PyTorch ms | tts ms | tts / PyTorch |", "|---|---|---|---|---|"]
    for s in STAGES:
        r, t = ref[s], ours[s]
        lines.append(f"| **{STAGE_TITLES[s]}** | wall | **{r['wall_ms']:.0f}** | **{t['wall_ms']:.0f}** | **{t['wall_ms'] / r['wall_ms']:.2f}** |")
        for k in KINDS:
            rv, tv = r["kinds"].get(k, 0.0), t["kinds"].get(k, 0.0)
            if abs(rv) < 0.05 and abs(tv) < 0.05:
                continue
            ratio = f"{tv / rv:.2f}" if rv > 0.5 and tv > 0 else "-"
            lines.append(f"| | {k} | {rv:.1f} | {tv:.1f} | {ratio} |")
    lines += ["", f"The {a.top} costliest ops of each stage (name and shapes; count; total ms):", ""]
    for s in STAGES:
        lines += [f"{STAGE_TITLES[s]}: tts runs {ours[s]['graphs']} graph(s), {ours[s]['nodes']} logged nodes.", "",
                  "| PyTorch op | n | ms | tts op | n | ms |", "|---|---|---|---|---|---|"]
        top = lambda d: sorted(d.items(), key=lambda kv: -kv[1][1])[: a.top]
        for (rn, (rc, rms)), (tn, (tc, tms)) in zip(top(ref[s]["ops"]), top(ours[s]["ops"])):
            lines.append(f"| `{rn}` | {rc} | {rms:.1f} | `{tn}` | {tc} | {tms:.1f} |")
        lines.append("")
    print_table(lines, a.markdown)


if __name__ == "__main__":
    main()
