#!/usr/bin/env python3
"""`tts serve` on loopback: time to first audio and total time of each
`response_format` beside `wav`, from one server (the encoders' cost, since
the synthesis is the same), `--runs` sequential requests each, interleaved
by format so drift on a shared machine spreads over all of them.

    python3 bench/server_formats.py [--tts target/release/tts] [--fixture supertonic|turbo] [--runs 30]

Standard library only; the server and profile come from bench/server_load.py.
"""
import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_load import ROOT, Server, tiny_profile  # noqa: E402

FORMATS = ["wav", "pcm", "flac", "mp3", "opus", "aac"]
TEXT = ("The quick brown fox jumps over the lazy dog. Every format is encoded as the audio comes. "
        "A second paragraph follows here, so the answer streams in several pieces.")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tts", default=os.path.join(ROOT, "target/release/tts"))
    p.add_argument("--fixture", choices=["supertonic", "turbo"], default="supertonic")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", type=int, default=30)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        server = Server(args.tts, tiny_profile(d, args.fixture, args.threads), 1, 16)
        try:
            for fmt in FORMATS:  # warm-up
                server.speech(TEXT, fmt)
            results = {f: [] for f in FORMATS}
            for _ in range(args.runs):
                for fmt in FORMATS:
                    status, ttfa, total, size, _ = server.speech(TEXT, fmt)
                    if status != 200:
                        sys.exit(f"{fmt}: status {status}")
                    results[fmt].append((ttfa, total, size))
        finally:
            server.stop()
    base_ttfa = statistics.median(r[0] for r in results["wav"]) * 1000
    print(f"{args.fixture}, {args.runs} requests per format (medians)")
    print("| format | first audio ms | added to wav's | total ms | bytes |")
    print("|---|---|---|---|---|")
    for fmt in FORMATS:
        ttfa = statistics.median(r[0] for r in results[fmt]) * 1000
        total = statistics.median(r[1] for r in results[fmt]) * 1000
        size = statistics.median(r[2] for r in results[fmt])
        print(f"| {fmt} | {ttfa:.2f} | {ttfa - base_ttfa:+.2f} | {total:.2f} | {size:.0f} |")


if __name__ == "__main__":
    main()
