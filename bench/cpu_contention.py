#!/usr/bin/env python3
"""CPU plugin under contention: synthesis with and without one competing busy process.

For the tiny Turbo and Supertonic fixtures, on the CPU backend at the default
thread count (`threads = 0`, one worker per core), times `tts bench` on an idle
machine and while one CPU-bound process runs beside it, with the plugin's
`adapt_threads` off (how ggml schedules its workers unpatched: every core, every
graph) and on (the default: before each graph, leave the cores other processes
keep busy). Reports each median and the busy/idle ratio.

    python3 bench/cpu_contention.py [--runs 10] [--rounds 3] [--markdown out.md]

`tts` comes from the bundle `cargo xtask dist --release` builds in dist/tts.
Run it on an otherwise quiet machine: the "idle" column assumes one.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import cpu_name, print_table, run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TTS = os.path.join(ROOT, "dist", "tts", "tts")
FIXTURES = {
    "turbo-tiny": ("turbo.toml", "Hello there, how are you today?"),
    "supertonic-v2-tiny": ("supertonic.toml", "Hello there, how are you today?"),
}


def profile_text(name, adapt):
    """The repository's profile for a fixture, pinned to the CPU backend."""
    with open(os.path.join(ROOT, "profiles", name)) as f:
        text = f.read()
    text = text.replace('"../tests/', f'"{ROOT}/tests/')
    lines = []
    for line in text.splitlines():
        if line.startswith("prefer ="):
            line = 'prefer = ["cpu"]'
        lines.append(line)
        if line.strip() == "[backends.cpu]":
            lines.append(f"adapt_threads = {'true' if adapt else 'false'}")
    return "\n".join(lines) + "\n"


def bench(profile, text, runs):
    out = run([TTS, "bench", "--profile", profile, "--text", text, "--runs", str(runs), "--json"])
    return json.loads(out)["total_ms"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="synthesis runs per tts bench call")
    ap.add_argument("--rounds", type=int, default=3, help="tts bench calls per cell; the median is reported")
    ap.add_argument("--markdown", help="also write the table here")
    a = ap.parse_args()
    if not os.path.exists(TTS):
        sys.exit(f"{TTS} is missing: run `cargo xtask dist --release` first")

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for fixture, (profile_name, text) in FIXTURES.items():
            for adapt in (False, True):
                profile = os.path.join(tmp, f"{fixture}-{adapt}.toml")
                with open(profile, "w") as f:
                    f.write(profile_text(profile_name, adapt))
                cells = {}
                for busy in (False, True):
                    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
                    try:
                        if hog:
                            time.sleep(0.5)
                        cells[busy] = statistics.median(bench(profile, text, a.runs) for _ in range(a.rounds))
                    finally:
                        if hog:
                            hog.kill()
                            hog.wait()
                            # A burstable VM throttles for a while after a busy spell: let the
                            # next idle cell start idle.
                            time.sleep(5)
                rows.append((fixture, "on" if adapt else "off", cells[False], cells[True], cells[True] / cells[False]))

    cores = os.cpu_count()
    lines = [
        f"CPU: {cpu_name()}, {cores} cores; threads = 0; median of {a.rounds} x `tts bench --runs {a.runs}`, total ms per synthesis",
        "",
        "| fixture | adapt_threads | idle ms | one busy process ms | busy / idle |",
        "|---|---|---|---|---|",
    ]
    for fixture, adapt, idle, busy, ratio in rows:
        lines.append(f"| {fixture} | {adapt} | {idle:.1f} | {busy:.1f} | {ratio:.2f}x |")
    print_table(lines, a.markdown)


if __name__ == "__main__":
    main()
