#!/usr/bin/env python3
"""`tts serve` on loopback: its overhead over the CLI, throughput at 1, 2 and 4
concurrent requests on one CPU device, and a load test, in one run.

1. Overhead: the median latency of `--runs` sequential WAV requests against
   `tts bench --stream`'s median total synthesis time for the same text and profile
   (the server adds HTTP, queueing and encoding; both sides warm).
2. Contention: for workers = concurrency = 1, 2, 4, `--contention-seconds`
   of requests from that many clients: requests per second, seconds of audio
   per wall-clock second, median latency.
3. Load: `--clients` clients for `--seconds` s against one server (`--workers`,
   `--queue`): statuses (anything but 200 and 429 fails the run), p50/p95
   latency and time to first audio, server RSS after warm-up and at the end.

    python3 bench/server_load.py [--tts target/release/tts] [--profile P] [--seconds 60]

Standard library only. The default profile is a tiny fixture (`--fixture
supertonic|turbo`) on the CPU with `--threads` per worker.
"""
import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = "The quick brown fox jumps over the lazy dog, and the server answers at once."


def tiny_profile(directory, family, threads):
    """A profile for a tiny fixture on the CPU (`threads = 0`: every core, adapted)."""
    models = {
        "supertonic": ["tests/fixtures/supertonic/tiny-v2/model.gguf"],
        "turbo": ["tests/fixtures/chatterbox/turbo-tiny/t3-turbo.gguf", "tests/fixtures/chatterbox/turbo-tiny/s3gen-meanflow.gguf"],
    }[family]
    files = ", ".join(f'"{os.path.join(ROOT, m)}"' for m in models)
    path = os.path.join(directory, f"{family}.toml")
    with open(path, "w") as f:
        f.write(f'[backend]\nprefer = ["cpu"]\nfallback = false\n[backends.cpu]\nthreads = {threads}\n[model]\nfiles = [{files}]\n')
    return path


class Server:
    def __init__(self, tts, profile, workers, queue):
        self.proc = subprocess.Popen(
            [tts, "serve", "--profile", profile, "--port", "0", "--workers", str(workers), "--queue", str(queue)],
            stderr=subprocess.PIPE, text=True)
        line = self.proc.stderr.readline()
        if not line.startswith("listening on http://"):
            sys.exit(f"tts serve: {line}{self.proc.stderr.read()}")
        self.host, port = line.split()[2][len("http://"):].rsplit(":", 1)
        self.port = int(port)
        threading.Thread(target=lambda: self.proc.stderr.read(), daemon=True).start()
        self.model = os.path.splitext(os.path.basename(profile))[0]
        while True:
            try:
                if self.get("/health")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.05)

    def get(self, path):
        c = http.client.HTTPConnection(self.host, self.port, timeout=120)
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()

    def speech(self, text=TEXT, fmt="wav"):
        """(status, seconds to first body byte, seconds to the end, bytes, sample rate)."""
        start = time.perf_counter()
        c = http.client.HTTPConnection(self.host, self.port, timeout=300)
        c.request("POST", "/v1/audio/speech", json.dumps({"model": self.model, "voice": "default", "input": text, "response_format": fmt}),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        first = r.read(1)
        ttfa = time.perf_counter() - start
        rest = r.read()
        rate = int(r.getheader("x-sample-rate") or 0)
        return r.status, ttfa, time.perf_counter() - start, len(first) + len(rest), rate

    def rss_mib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def overhead(args, profile):
    server = Server(args.tts, profile, 1, 16)
    for _ in range(3):
        server.speech()
    latencies = [server.speech()[2] for _ in range(args.runs)]
    server.stop()
    bench = subprocess.run([args.tts, "bench", "--profile", profile, "--text", TEXT, "--stream", "--runs", str(args.runs), "--warmup", "3", "--json"],
                           capture_output=True, text=True, check=True)
    report = json.loads(bench.stdout)
    cli_ms = report["total_ms"]["median"] if isinstance(report.get("total_ms"), dict) else report["total_ms"]
    server_ms = statistics.median(latencies) * 1e3
    print(f"overhead: server median {server_ms:.2f} ms per request, CLI synthesis median {cli_ms:.2f} ms, "
          f"added {server_ms - cli_ms:.2f} ms ({args.runs} runs each)")


def clients(server, n, seconds, text=TEXT):
    """`n` clients in a loop for `seconds`: [(status, ttfa, latency, bytes)]."""
    results, lock, stop = [], threading.Lock(), time.perf_counter() + seconds

    def client():
        while time.perf_counter() < stop:
            r = server.speech(text)
            with lock:
                results.append(r)
            if r[0] == 429:
                time.sleep(0.05)

    threads = [threading.Thread(target=client) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def contention(args, profile):
    for n in (1, 2, 4):
        server = Server(args.tts, profile, n, 16)
        clients(server, n, 2)
        start = time.perf_counter()
        results = clients(server, n, args.contention_seconds)
        wall = time.perf_counter() - start
        server.stop()
        ok = [r for r in results if r[0] == 200]
        audio = sum((r[3] - 44) / 2 / r[4] for r in ok)
        print(f"contention: {n} worker(s) x {n} client(s): {len(ok) / wall:.1f} requests/s, "
              f"{audio / wall:.1f} s of audio per s, median latency {statistics.median(r[2] for r in ok) * 1e3:.1f} ms")


def load(args, profile):
    server = Server(args.tts, profile, args.workers, args.queue)
    clients(server, args.clients, 3)
    rss_start = server.rss_mib()
    results = clients(server, args.clients, args.seconds)
    rss_end = server.rss_mib()
    server.stop()
    statuses = {}
    for r in results:
        statuses[r[0]] = statuses.get(r[0], 0) + 1
    ok = [r for r in results if r[0] == 200]
    print(f"load: {args.clients} clients for {args.seconds} s ({args.workers} worker(s), queue {args.queue}): statuses {statuses}")
    print(f"load: latency p50 {pct([r[2] for r in ok], 50) * 1e3:.1f} ms, p95 {pct([r[2] for r in ok], 95) * 1e3:.1f} ms; "
          f"time to first audio p50 {pct([r[1] for r in ok], 50) * 1e3:.1f} ms, p95 {pct([r[1] for r in ok], 95) * 1e3:.1f} ms")
    print(f"load: server RSS {rss_start:.1f} MiB after warm-up, {rss_end:.1f} MiB at the end ({rss_end - rss_start:+.1f} MiB)")
    if set(statuses) - {200, 429}:
        sys.exit(f"statuses other than 200 and 429: {statuses}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tts", default=os.path.join(ROOT, "target/release/tts"))
    p.add_argument("--profile", help="default: a tiny fixture (--fixture) on the CPU")
    p.add_argument("--fixture", choices=["supertonic", "turbo"], default="supertonic")
    p.add_argument("--threads", type=int, default=1, help="CPU threads per worker of the fixture's profile (0: every core)")
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--contention-seconds", type=float, default=10)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--queue", type=int, default=8)
    p.add_argument("--skip", default="", help="comma-separated phases to skip: overhead,contention,load")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        profile = args.profile or tiny_profile(d, args.fixture, args.threads)
        skip = set(filter(None, args.skip.split(",")))
        print(f"machine: {os.cpu_count()} CPUs; profile {profile}")
        if "overhead" not in skip:
            overhead(args, profile)
        if "contention" not in skip:
            contention(args, profile)
        if "load" not in skip:
            load(args, profile)


if __name__ == "__main__":
    main()
