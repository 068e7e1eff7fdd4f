#!/usr/bin/env python3
"""Synthesizes a corpus across a Ray cluster with the `tts` Python package.

    python tts_batch.py MANIFEST.jsonl --out DIR --profile PROFILE.toml [--address HOST:PORT]

MANIFEST.jsonl has one JSON object per line: `{"id": "...", "text": "..."}`,
any other keys being options of `Engine.synthesize` for that line (voice,
speed, seed, ...). Each line becomes `DIR/<id>.wav` (mono, 32-bit IEEE float:
the engine's samples exactly), and `DIR/results.jsonl` gets one line per
finished item. Running it again with the same manifest and DIR skips what is
recorded there and verified, and does the rest. docs/deploy.md, "Batch
corpora with Ray", describes it in full.

The driver (this process) reads and checks the manifest, hands items to Ray
actors (one `tts.Engine` each, loaded once) and is the only writer of
results.jsonl; an actor writes its audio under a private temporary name in
DIR and renames it into place once it is complete and synced."""

import argparse
import fcntl
import hashlib
import json
import logging
import os
import re
import signal
import socket
import struct
import sys
import time
import uuid

RESULTS = "results.jsonl"
FAILURES = "failures.jsonl"
# Every temporary this job makes in DIR is named so: ids never start with a
# dot, so no final file can match, and a later run can remove them all.
TEMP_PREFIX = ".tts-batch-"
TEMP_SUFFIX = ".tmp"
# Letters, digits and . _ -, not starting with a dot: the same file name on
# every file system and shell, never a path, never hidden.
ID_PATTERN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
ID_MAX_CHARS = 128
# Tasks waiting or running per actor: enough that an actor never idles while
# the driver records its last result, few enough that the driver holds only
# a window of the manifest's work in Ray, not all of it.
IN_FLIGHT_PER_WORKER = 2
# WAV's sizes are 32-bit: a longer result cannot be one WAV file.
WAV_MAX_DATA_BYTES = 0xFFFFFFFF - 64


class ManifestError(Exception):
    """A line of the manifest that cannot be run: one line, naming it."""


class Item:
    __slots__ = ("line", "id", "text", "options", "input_sha256")

    def __init__(self, line, id, text, options):
        self.line, self.id, self.text, self.options = line, id, text, options
        # What the audio is made from: a record made from another text or
        # other options is not this item's.
        canonical = json.dumps({"text": text, "options": options}, sort_keys=True, ensure_ascii=False)
        self.input_sha256 = hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def file(self):
        return self.id + ".wav"


def read_manifest(path):
    """The manifest's items, in order; ManifestError at the first bad line."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ManifestError("%s: %s" % (path, e.strerror or e))
    items, seen = [], {}
    for number, line in enumerate(raw.split(b"\n"), start=1):
        where = "%s:%d" % (path, number)
        if not line.strip():
            continue
        try:
            entry = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            raise ManifestError("%s: not UTF-8" % where)
        except ValueError as e:
            raise ManifestError("%s: not JSON (%s)" % (where, e))
        if not isinstance(entry, dict):
            raise ManifestError("%s: not a JSON object" % where)
        id, text = entry.pop("id", None), entry.pop("text", None)
        if not isinstance(id, str):
            raise ManifestError("%s: \"id\" must be a string" % where)
        if len(id) > ID_MAX_CHARS or not ID_PATTERN.fullmatch(id):
            raise ManifestError(
                "%s: id %s is not a safe file name (1 to %d of A-Z a-z 0-9 . _ -, not starting with a dot)"
                % (where, json.dumps(id[:ID_MAX_CHARS + 1]), ID_MAX_CHARS)
            )
        if id in seen:
            raise ManifestError("%s: id %s repeats line %d" % (where, json.dumps(id), seen[id]))
        if not isinstance(text, str) or not text.strip():
            raise ManifestError("%s: \"text\" must be a non-empty string" % where)
        for key, value in entry.items():
            # The kinds Engine.synthesize takes (docs/python.md); null,
            # lists and objects are none of them.
            if not isinstance(value, (bool, int, float, str)):
                raise ManifestError("%s: option %s must be a string, number or boolean" % (where, json.dumps(key)))
        seen[id] = number
        items.append(Item(number, id, text, entry))
    if not items:
        raise ManifestError("%s: no items" % path)
    return items


def check_options(items, known, manifest):
    """Every option a line names is one the engine takes (ManifestError)."""
    for item in items:
        for key in item.options:
            if key not in known:
                raise ManifestError(
                    "%s:%d: unknown option %s (the engine takes: %s)" % (manifest, item.line, json.dumps(key), ", ".join(sorted(known)))
                )


def float_wav(samples, sample_rate):
    """Mono 32-bit IEEE float WAV bytes (WAVE_FORMAT_IEEE_FLOAT, with the
    `fact` chunk the format asks of non-PCM data) of float32 `samples`."""
    data = samples.astype("<f4", copy=False).tobytes()
    if len(data) > WAV_MAX_DATA_BYTES:
        raise ValueError("%d samples are too many for one WAV file" % samples.size)
    fmt = struct.pack("<HHIIHHH", 3, 1, sample_rate, sample_rate * 4, 4, 32, 0)
    fact = struct.pack("<I", samples.size)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"fact" + struct.pack("<I", len(fact)) + fact
    body += b"data" + struct.pack("<I", len(data))
    return b"RIFF" + struct.pack("<I", len(body) + len(data)) + body + data


def write_atomically(directory, name, data):
    """`directory/name` holds `data` whole, or keeps what it held: written
    under a private temporary name, synced, renamed into place, and the
    rename synced."""
    temp = os.path.join(directory, "%s%s.%s%s" % (TEMP_PREFIX, name, uuid.uuid4().hex, TEMP_SUFFIX))
    try:
        with open(temp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, os.path.join(directory, name))
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
    sync_directory(directory)


def sync_directory(directory):
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Synthesizer:
    """One Ray actor: one engine, loaded once, synthesizing items into DIR.
    Made a Ray actor by `ray.remote` in `start_workers`, so importing this
    file needs no Ray."""

    def __init__(self, out, profile, plugin_dir, model):
        self.out, self.engine, self.error = out, None, None
        try:
            import tts

            self.engine = tts.Engine(profile=profile, plugin_dir=plugin_dir, model=model)
        except Exception as e:  # reported by ready(): the driver stops with it
            self.error = "opening the engine: %s" % e

    def ready(self):
        """The engine's option names, or the error opening it."""
        if self.error:
            return {"error": self.error}
        return {"options": sorted(self.engine.options), "sample_rate": self.engine.sample_rate}

    def synthesize(self, id, text, options):
        """Writes `id`.wav; its record, or `{"error": message}` when the engine refuses the item."""
        import tts

        try:
            samples = self.engine.synthesize(text, **options)
            data = float_wav(samples, self.engine.sample_rate)
        except (tts.TtsError, TypeError, ValueError) as e:
            return {"id": id, "error": str(e)}
        name = id + ".wav"
        try:
            write_atomically(self.out, name, data)
        except OSError as e:
            return {"id": id, "error": "writing %s: %s" % (os.path.join(self.out, name), e.strerror or e)}
        rate = self.engine.sample_rate
        return {
            "id": id,
            "file": name,
            "samples": int(samples.size),
            "sample_rate": rate,
            "seconds": round(samples.size / rate, 6),
            "sha256": hashlib.sha256(data).hexdigest(),
        }


def check_reachable(address):
    """Raises OSError when `address` names a host:port that takes no TCP
    connection: Ray itself retries such an address for many minutes."""
    host, sep, port = (address or "").rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return  # "auto", "local", ray://...: Ray's own
    with socket.create_connection((host.strip("[]"), int(port)), timeout=10):
        pass


def first_line(error):
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def remove_temporaries(out):
    for name in os.listdir(out):
        if name.startswith(TEMP_PREFIX) and name.endswith(TEMP_SUFFIX):
            try:
                os.unlink(os.path.join(out, name))
            except FileNotFoundError:
                pass


def load_results(out, items):
    """The records of results.jsonl that still describe their file (present,
    with the recorded sha256) and the current manifest's input for the id,
    one per id. A line that is not a complete JSON object (the last one, cut
    by a kill) is dropped, and so is any record that does not verify."""
    by_id = {item.id: item for item in items}
    kept = {}
    try:
        with open(os.path.join(out, RESULTS), "rb") as f:
            lines = f.read().split(b"\n")
    except FileNotFoundError:
        return kept
    for line in lines:
        try:
            record = json.loads(line)
            id, name, sha = record["id"], record["file"], record["sha256"]
        except (ValueError, TypeError, KeyError):
            continue
        item = by_id.get(id)
        if item is None or name != item.file or record.get("input_sha256") != item.input_sha256 or id in kept:
            continue
        try:
            if sha256_file(os.path.join(out, name)) != sha:
                continue
        except OSError:
            continue
        kept[id] = record
    return kept


def rewrite_results(out, records):
    """results.jsonl holds exactly `records`, replaced atomically."""
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
    write_atomically(out, RESULTS, text.encode())


class Tally:
    def __init__(self, skipped):
        self.start = time.monotonic()
        self.done, self.skipped, self.failed, self.audio_seconds = 0, skipped, 0, 0.0

    def summary(self, workers, interrupted):
        wall = time.monotonic() - self.start
        return {
            "done": self.done,
            "skipped": self.skipped,
            "failed": self.failed,
            "interrupted": interrupted,
            "workers": workers,
            "wall_seconds": round(wall, 3),
            "items_per_second": round(self.done / wall, 3) if wall > 0 else 0.0,
            "audio_seconds": round(self.audio_seconds, 3),
            "audio_seconds_per_second": round(self.audio_seconds / wall, 3) if wall > 0 else 0.0,
        }


def summary_line(s):
    return "tts_batch: %d done, %d skipped, %d failed%s in %.1f s: %.2f items/s, %.2f s of audio per s (%d workers)" % (
        s["done"],
        s["skipped"],
        s["failed"],
        ", interrupted" if s["interrupted"] else "",
        s["wall_seconds"],
        s["items_per_second"],
        s["audio_seconds_per_second"],
        s["workers"],
    )


def parse_args(argv):
    p = argparse.ArgumentParser(prog="tts_batch", description="Synthesize a JSON Lines manifest of texts across a Ray cluster.")
    p.add_argument("manifest", help="JSON Lines: {\"id\": ..., \"text\": ..., option: value, ...} per line")
    p.add_argument("--out", required=True, help="output directory, on a file system every node shares")
    p.add_argument("--profile", help="engine profile (TOML), at the same path on every node")
    p.add_argument("--plugin-dir", help="plugin directory on every node (default: TTS_PLUGIN_PATH, else the wheel's own)")
    p.add_argument("--model", action="append", help="model file replacing the profile's (repeat for a family of several files)")
    p.add_argument("--address", help="Ray cluster address (default: ray.init's: RAY_ADDRESS, a local cluster, or a new one)")
    p.add_argument("--workers", type=int, help="actors, one engine each (default: the cluster's CPUs / --cpus-per-worker)")
    p.add_argument("--cpus-per-worker", type=float, default=1.0, help="CPUs Ray reserves per actor; match the profile's threads (default 1)")
    p.add_argument("--start-timeout", type=float, default=300, help="seconds to wait for every worker to start (default 300)")
    p.add_argument("--summary", help="also write the run's figures to this JSON file")
    args = p.parse_args(argv)
    if args.workers is not None and args.workers < 1:
        p.error("--workers must be at least 1")
    if args.cpus_per_worker <= 0:
        p.error("--cpus-per-worker must be above 0")
    return args


def stop_as_ctrl_c(signum, frame):
    """SIGTERM (a scheduler stopping the job) ends the run as Ctrl-C does."""
    raise KeyboardInterrupt


def main(argv=None):
    args = parse_args(argv)
    try:
        items = read_manifest(args.manifest)
    except ManifestError as e:
        print("tts_batch: %s" % e, file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, stop_as_ctrl_c)
    try:
        return run(args, items)
    except KeyboardInterrupt:
        print("tts_batch: interrupted", file=sys.stderr)
        return 130


class Journal:
    """DIR/results.jsonl (appended) and DIR/failures.jsonl (this run's,
    made at the first failure): only the driver writes them, a line at a
    time, flushed as each item ends."""

    def __init__(self, out):
        self.results = open(os.path.join(out, RESULTS), "a", encoding="utf-8")
        self.failures_path, self.failures = os.path.join(out, FAILURES), None

    def done(self, record):
        self.results.write(json.dumps(record, sort_keys=True) + "\n")
        self.results.flush()

    def failed(self, item, error):
        if self.failures is None:
            self.failures = open(self.failures_path, "w", encoding="utf-8")
        self.failures.write(json.dumps({"id": item.id, "line": item.line, "error": error}) + "\n")
        self.failures.flush()

    def close(self):
        self.results.close()
        if self.failures is not None:
            self.failures.close()


class Stop(Exception):
    """The run cannot go on: one line for the user, exit 1."""


def run(args, items):
    out = os.path.abspath(args.out)
    try:
        os.makedirs(out, exist_ok=True)
        lock = os.open(out, os.O_RDONLY)
    except OSError as e:
        print("tts_batch: %s: %s" % (out, e.strerror or e), file=sys.stderr)
        return 1
    try:
        # Two drivers on one DIR would record items twice. Released when
        # this process ends, however it ends.
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print("tts_batch: %s: another run is using this directory" % out, file=sys.stderr)
        return 1
    remove_temporaries(out)
    recorded = load_results(out, items)
    rewrite_results(out, [recorded[i.id] for i in items if i.id in recorded])
    if os.path.exists(os.path.join(out, FAILURES)):
        os.unlink(os.path.join(out, FAILURES))
    todo = [i for i in items if i.id not in recorded]
    tally = Tally(skipped=len(items) - len(todo))
    journal, actors, interrupted = Journal(out), [], False
    try:
        if todo:
            ray = connect(args.address)
            actors = start_workers(ray, args, out, min(args.workers or default_workers(ray, args), len(todo)))
            check_options(todo, ray.get(actors[0].ready.remote())["options"], args.manifest)
            distribute(ray, actors, todo, tally, journal)
    except (Stop, ManifestError) as e:
        print("tts_batch: %s" % e, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        interrupted = True
    finally:
        for a in actors:
            ray.kill(a)
        journal.close()
        if not interrupted:
            # Every task of this run has ended; a temporary left now is an
            # actor's that was killed while writing.
            remove_temporaries(out)
    summary = tally.summary(len(actors), interrupted)
    print(summary_line(summary), file=sys.stderr)
    if args.summary:
        with open(args.summary, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2, sort_keys=True)
            f.write("\n")
    if interrupted:
        raise KeyboardInterrupt
    return 1 if tally.failed else 0


def connect(address):
    """Ray, connected to the cluster at `address` (None: ray.init's default)."""
    try:
        import ray
    except ImportError as e:
        raise Stop("Ray is needed (pip install ray): %s" % e)
    try:
        check_reachable(address)
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except Exception as e:  # Ray's errors have no common base here
        raise Stop("connecting to Ray at %s: %s" % (address or "the default address", first_line(e)))
    # Ray's core worker replaced the handler with its own, which logs a
    # stack and dies of the signal.
    signal.signal(signal.SIGTERM, stop_as_ctrl_c)
    if __name__ != "__main__":
        # Imported (by a test or another script): the workers cannot import
        # this file by name, so Ray sends its code along.
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return ray


def default_workers(ray, args):
    return max(1, int(ray.cluster_resources().get("CPU", 1) // args.cpus_per_worker))


def start_workers(ray, args, out, count):
    """`count` actors, each with its engine open (Stop if one cannot open
    it, or if they are not all up within --start-timeout)."""
    actor = ray.remote(num_cpus=args.cpus_per_worker, max_restarts=2)(Synthesizer)
    model = args.model[0] if args.model and len(args.model) == 1 else args.model
    profile = os.path.abspath(args.profile) if args.profile else None
    plugin_dir = os.path.abspath(args.plugin_dir) if args.plugin_dir else None
    actors = [actor.remote(out, profile, plugin_dir, model) for _ in range(count)]
    states = [a.ready.remote() for a in actors]
    # An actor waits for free CPUs: more workers than the cluster holds
    # would wait for ever.
    started, _ = ray.wait(states, num_returns=len(states), timeout=args.start_timeout)
    if len(started) < len(states):
        for a in actors:
            ray.kill(a)
        raise Stop(
            "%d of %d workers started within %g s (the cluster has %g CPUs; each worker takes %g)"
            % (len(started), count, args.start_timeout, ray.cluster_resources().get("CPU", 0), args.cpus_per_worker)
        )
    for state in states:
        try:
            error = ray.get(state).get("error")
        except ray.exceptions.RayError as e:
            error = "a worker failed to start: %s" % first_line(e)
        if error:
            for a in actors:
                ray.kill(a)
            raise Stop(error)
    return actors


def distribute(ray, actors, todo, tally, journal):
    """Runs `todo` on `actors`, at most IN_FLIGHT_PER_WORKER tasks each at a
    time, recording each item as it ends."""
    queue = list(reversed(todo))
    running = {}  # task -> (actor, item)
    load = {a: 0 for a in actors}
    while queue or running:
        for a in actors:
            while queue and load[a] < IN_FLIGHT_PER_WORKER:
                item = queue.pop()
                running[a.synthesize.remote(item.id, item.text, item.options)] = (a, item)
                load[a] += 1
        # A timeout so that Ctrl-C is seen while every task runs long.
        ready, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
        for task in ready:
            a, item = running.pop(task)
            load[a] -= 1
            try:
                outcome = ray.get(task)
            except ray.exceptions.RayError as e:
                # The actor died (a crash, a node lost): this item fails, the
                # actor restarts (max_restarts) for the next ones.
                outcome = {"error": "worker failed: %s" % first_line(e)}
            if "error" in outcome:
                tally.failed += 1
                journal.failed(item, outcome["error"])
                continue
            outcome["input_sha256"] = item.input_sha256
            journal.done(outcome)
            tally.done += 1
            tally.audio_seconds += outcome["seconds"]


if __name__ == "__main__":
    sys.exit(main())
