#!/usr/bin/env python3
"""Summarises a per-op timing log (GGML_CUDA_PERF_LOGGER / GGML_VK_PERF_LOGGER):
graphs with the same op mix are grouped; for each group, how often it ran,
its launches and GPU time per run, and the ops that take the most time.
Usage: perf_summary.py LOG [--top N]"""
import argparse
import re
from collections import OrderedDict

# ggml-vulkan appends "(N GFLOPS/s)" to products and attention.
LINE = re.compile(r"^(.*): (\d+) x ([0-9.]+) us = ([0-9.]+) us(?: \([0-9.]+ GFLOPS/s\))?$")


def graphs(text):
    for block in text.split("----------------\n")[1:]:
        ops = []
        for line in block.splitlines():
            m = LINE.match(line.strip())
            if m:
                ops.append((m.group(1), int(m.group(2)), float(m.group(4))))
        if ops:
            yield ops


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--top", type=int, default=8)
    a = ap.parse_args()
    groups = OrderedDict()
    for ops in graphs(open(a.log, errors="replace").read()):
        key = tuple(sorted((name.split(" ")[0], n) for name, n, _ in ops))
        groups.setdefault(key, []).append(ops)
    for i, runs in enumerate(groups.values()):
        # The run of median GPU time stands for the group: a graph's first run
        # also pays one-time set-up (library handles, kernel loading).
        runs = sorted(runs, key=lambda ops: sum(t for _, _, t in ops))
        median = runs[len(runs) // 2]
        launches = sum(n for _, n, _ in median)
        total = sum(t for _, _, t in median)
        print(f"group {i}: {len(runs)} run(s), {launches} launches, GPU {total / 1000:.3f} ms (median run)")
        for name, n, t in sorted(median, key=lambda op: -op[2])[: a.top]:
            print(f"    {name}: {n} x {t / n:.1f} us = {t / 1000:.3f} ms")

if __name__ == "__main__":
    main()
