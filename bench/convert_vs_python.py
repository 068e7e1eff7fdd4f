#!/usr/bin/env python3
"""`tts convert` against the Python reference converter on the same checkpoint
directory: wall time and peak RSS of each (`/usr/bin/time`), runs alternated,
the outputs compared byte for byte. Prints a Markdown table with the ratios
(docs/performance.md, "Conversion: native against the Python converters").

    bench/convert_vs_python.py --family chatterbox --dir CKPT [--set variant=mtl] \\
        [--weights f32,q4_0] [--runs 2] [--tts target/release/tts]
    bench/convert_vs_python.py --family supertonic --dir BUNDLE [--weights f32,q8_0]

The Python side runs tools/<family>/convert.py with the venv's interpreter
(target/chatterbox-venv/bin/python unless --python). Run it on a quiet machine:
both converters are memory- and disk-bound, and a concurrent build skews both.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(cmd: list[str]) -> tuple[float, int]:
    """(seconds, peak RSS in bytes) of `cmd`, which must succeed."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as t:
        p = subprocess.run(["/usr/bin/time", "-f", "%e %M", "-o", t.name, *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if p.returncode != 0:
            sys.exit(f"convert_vs_python: {' '.join(cmd)} failed:\n{p.stderr}")
        seconds, kb = t.read().split()[-2:]
    return float(seconds), int(kb) * 1024


def python_args(family: str, ckpt: Path, out: Path, weights: str, sets: list[str]) -> list[str]:
    if family == "supertonic":
        return [str(ROOT / "tools/supertonic/convert.py"), str(ckpt), str(out / "model.gguf"), "--weights", weights]
    args = [str(ROOT / "tools/chatterbox/convert.py"), str(ckpt), str(out), "--weights", weights]
    for s in sets:
        key, value = s.split("=", 1)
        args += [f"--{key.replace('_', '-')}", value]
    return args


def same_outputs(family: str, native: Path, python: Path) -> bool:
    if family == "supertonic":
        (one,) = native.glob("*.gguf")
        return filecmp.cmp(one, python / "model.gguf", shallow=False)
    names = sorted(p.name for p in native.glob("*.gguf"))
    return names == sorted(p.name for p in python.glob("*.gguf")) and all(filecmp.cmp(native / n, python / n, shallow=False) for n in names)


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=("chatterbox", "supertonic"), required=True)
    ap.add_argument("--dir", type=Path, required=True, help="the official checkpoint directory")
    ap.add_argument("--weights", default="f32", help="comma-separated storages")
    ap.add_argument("--set", action="append", default=[], help="converter option KEY=VALUE (both converters)")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--tts", type=Path, default=ROOT / "target/release/tts")
    ap.add_argument("--python", type=Path, default=ROOT / "target/chatterbox-venv/bin/python")
    ap.add_argument("--work", type=Path, help="where outputs go (default: a temporary beside the checkpoint)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="convert-bench-", dir=args.work or args.dir.parent))
    ckpt_bytes = size(args.dir)
    print(f"{args.dir} ({ckpt_bytes / 2**30:.2f} GiB), {args.runs} alternated runs each, best time and highest peak", file=sys.stderr)
    rows = []
    try:
        for weights in args.weights.split(","):
            py_t, nat_t, py_m, nat_m = [], [], [], []
            for _ in range(args.runs):
                for side in ("python", "native"):
                    out = work / side
                    shutil.rmtree(out, ignore_errors=True)
                    out.mkdir()
                    if side == "python":
                        t, m = timed([str(args.python), *python_args(args.family, args.dir, out, weights, args.set)])
                        py_t.append(t), py_m.append(m)
                    else:
                        cmd = [str(args.tts), "-q", "convert", str(args.dir), str(out), "--weights", weights]
                        for s in args.set:
                            cmd += ["--set", s]
                        t, m = timed(cmd)
                        nat_t.append(t), nat_m.append(m)
                identical = same_outputs(args.family, work / "native", work / "python")
                if not identical:
                    sys.exit(f"convert_vs_python: {weights}: the outputs differ")
            rows.append((weights, min(py_t), max(py_m), min(nat_t), max(nat_m)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("| weights | Python time | Python peak RSS | native time | native peak RSS | time ratio | native peak / checkpoint | outputs |")
    print("|---|---|---|---|---|---|---|---|")
    for w, pt, pm, nt, nm in rows:
        print(f"| {w} | {pt:.1f} s | {pm / 2**30:.2f} GiB | {nt:.1f} s | {nm / 2**20:.0f} MiB | {pt / nt:.2f}x | {nm / ckpt_bytes:.1%} | identical |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
