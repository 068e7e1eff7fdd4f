"""deploy/ray/tts_batch.py on a Ray cluster of this machine, on loopback
only: a 50-line corpus killed midway and resumed (no file made twice, none
cut, none missing, the in-process engine's samples bit for bit), failing
lines recorded while the others finish, and bad manifests refused before
anything starts.

The cluster is `ray start --head` in a session of its own, with a private
temporary directory and free ports; it is stopped by killing every process
of that session, never by `ray stop`, which would stop every Ray on the
machine. Without Ray the cluster's tests skip, unless TTS_REQUIRE_RAY is
set (`cargo xtask test` sets it once it has installed Ray), where they fail."""

import fcntl
import hashlib
import importlib.util
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

import pytest

import tts
from conftest import REPO, SUPERTONIC, assert_same_bytes, profile_text

SCRIPT = REPO / "deploy" / "ray" / "tts_batch.py"
ITEMS = 50


def job_env():
    env = {k: v for k, v in os.environ.items() if k not in ("TTS_PLUGIN_PATH", "TTS_LOG", "RAY_ADDRESS")}
    # Ray takes the machine's outward address for its node and listens on
    # every interface unless it runs as a single-machine cluster, where it
    # uses 127.0.0.1 for both.
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def session_processes(sid):
    """Live processes of session `sid` (zombies aside)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp session ...: comm may hold spaces.
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            found.append(int(entry))
    return found


def command_line(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def stop_session(head):
    """Stops `ray start --block` and then kills whatever of its session is
    left: the cluster's processes and nothing else."""
    if head.poll() is None:
        head.terminate()
        try:
            head.wait(timeout=20)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait(timeout=20)
    for _ in range(100):
        left = session_processes(head.pid)
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    pytest.fail("the Ray cluster's processes %s did not end" % session_processes(head.pid))


def require_ray():
    if importlib.util.find_spec("ray") is None:
        if os.environ.get("TTS_REQUIRE_RAY"):
            pytest.fail("TTS_REQUIRE_RAY is set but ray is not installed in %s" % sys.prefix)
        pytest.skip("ray is not installed (cargo xtask test installs it; by hand: pip install ray)")


class Cluster:
    def __init__(self, address, session):
        self.address, self.session = address, session

    def actors(self):
        """The cluster's processes that are the job's actors (Ray titles
        them by their class)."""
        return [pid for pid in session_processes(self.session) if "Synthesizer" in command_line(pid)]


@pytest.fixture(scope="module")
def cluster():
    """A one-node Ray cluster with 2 CPUs on loopback."""
    require_ray()
    ray = pathlib.Path(sys.executable).with_name("ray")
    # Short: Ray's Unix sockets live under it, and their paths are bounded.
    root = tempfile.mkdtemp(prefix="tts-ray-")
    port = free_port()
    ports = ["--port=%d" % port]
    for option in (
        "--dashboard-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--metrics-export-port",
        "--runtime-env-agent-port",
        "--node-manager-port",
        "--object-manager-port",
    ):
        ports.append("%s=%d" % (option, free_port()))
    log = open(os.path.join(root, "ray-start.log"), "wb")
    head = subprocess.Popen(
        [str(ray), "start", "--head", "--block", "--node-ip-address=127.0.0.1", "--temp-dir=%s" % os.path.join(root, "ray"),
         "--include-dashboard=false", "--num-cpus=2", "--disable-usage-stats", *ports],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=job_env(), start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while b"Ray runtime started" not in pathlib.Path(log.name).read_bytes():
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail("ray start did not start: %s" % pathlib.Path(log.name).read_text(errors="replace")[-2000:])
            time.sleep(0.2)
        yield Cluster("127.0.0.1:%d" % port, head.pid)
    finally:
        stop_session(head)
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def job(manifest, out, profile, address, *more):
    return [sys.executable, str(SCRIPT), str(manifest), "--out", str(out), "--profile", str(profile), "--address", address, "--workers", "2", *more]


def run_job(args, timeout=300):
    return subprocess.run(args, capture_output=True, env=job_env(), timeout=timeout, stdin=subprocess.DEVNULL)


def corpus():
    """50 lines with options of their own, each long enough (about 0.1 s of
    synthesis) that the run can be killed midway."""
    lines = []
    for i in range(ITEMS):
        line = {"id": "line-%02d" % i, "text": "Sentence %d of the test corpus, which goes on for a while. " % i * 5, "steps": 60}
        if i % 3 == 0:
            line["voice"] = "M1"
        if i % 4 == 0:
            line["seed"] = 1000 + i
        if i % 5 == 0:
            line["speed"] = 1.2
        lines.append(line)
    return lines


def write_manifest(path, lines):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def complete_records(results):
    """The complete lines of results.jsonl, by id."""
    if not results.exists():
        return {}
    records = {}
    for line in results.read_bytes().split(b"\n"):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        records[record["id"]] = record
    return records


def float_wav_samples(data):
    """The data of a mono 32-bit float WAV (WAVE_FORMAT_IEEE_FLOAT), checking
    that every size in it agrees with the file's."""
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE", "not a RIFF WAVE file"
    assert struct.unpack_from("<I", data, 4)[0] == len(data) - 8, "the RIFF size is not the file's"
    at, chunks = 12, {}
    while at < len(data):
        name, size = data[at : at + 4], struct.unpack_from("<I", data, at + 4)[0]
        assert at + 8 + size <= len(data), "chunk %r runs past the end" % name
        chunks[name] = data[at + 8 : at + 8 + size]
        at += 8 + size + (size & 1)
    fmt, channels, rate, byte_rate, align, bits = struct.unpack_from("<HHIIHH", chunks[b"fmt "])
    assert (fmt, channels, byte_rate, align, bits) == (3, 1, rate * 4, 4, 32)
    samples = chunks[b"data"]
    assert struct.unpack("<I", chunks[b"fact"])[0] * 4 == len(samples)
    return rate, samples


def test_a_killed_run_resumes_without_duplicate_missing_or_cut_files(cluster, tmp_path, supertonic_profile):
    lines = corpus()
    manifest = write_manifest(tmp_path / "corpus.jsonl", lines)
    out, results = tmp_path / "out", tmp_path / "out" / "results.jsonl"
    first = subprocess.Popen(job(manifest, out, supertonic_profile, cluster.address), env=job_env(), stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        # Some, not all: a fifth of the items, while the rest still run.
        while len(complete_records(results)) < ITEMS // 5:
            assert first.poll() is None, "the first run ended before it recorded an item: %s" % first.stdout.read().decode(errors="replace")
            assert time.monotonic() < deadline, "the first run recorded nothing in 300 s"
            time.sleep(0.005)
    finally:
        first.kill()
        first.wait(timeout=30)
        first.stdout.close()
    # Only the driver writes results.jsonl: with it dead, these are final.
    before = complete_records(results)
    assert 0 < len(before) < ITEMS, "kill it midway: %d of %d items were recorded" % (len(before), ITEMS)
    kept = {id: os.stat(out / r["file"]) for id, r in before.items()}
    wait_for_the_killed_jobs_actors_to_end(cluster)
    # What a kill can leave besides: a line cut short in results.jsonl, and
    # a worker's temporary file.
    with open(results, "ab") as f:
        f.write(b'{"file": "line-49.wav", "id": "line-4')
    (out / ".tts-batch-line-49.wav.0123abcd.tmp").write_bytes(b"RIFF\0\0")

    summary_path = tmp_path / "summary.json"
    second = run_job(job(manifest, out, supertonic_profile, cluster.address, "--summary", str(summary_path)))
    stderr = second.stderr.decode(errors="replace")
    assert second.returncode == 0, stderr
    summary = json.loads(summary_path.read_text())
    assert (summary["done"], summary["skipped"], summary["failed"]) == (ITEMS - len(before), len(before), 0), summary
    assert summary["workers"] == 2 and summary["items_per_second"] > 0 and summary["audio_seconds_per_second"] > 0
    assert stderr.splitlines()[-1].startswith("tts_batch: %d done, %d skipped, 0 failed in " % (ITEMS - len(before), len(before))), stderr

    # Exactly one complete line and one file per id, nothing else in DIR.
    text = results.read_text()
    assert text.endswith("\n")
    records = [json.loads(line) for line in text.splitlines()]
    ids = [r["id"] for r in records]
    assert len(records) == ITEMS and sorted(ids) == sorted(line["id"] for line in lines)
    assert sorted(os.listdir(out)) == sorted(["results.jsonl"] + ["%s.wav" % id for id in ids])
    # What was recorded before the kill was not made again: same inode, same mtime.
    for id, stat in kept.items():
        now = os.stat(out / before[id]["file"])
        assert (now.st_ino, now.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns), "%s was written again" % id
        assert records[ids.index(id)] == before[id]

    # Every file whole, as recorded, and the in-process engine's samples.
    engine = tts.Engine(profile=supertonic_profile)
    for line, record in zip(lines, sorted(records, key=lambda r: r["id"])):
        assert record["file"] == line["id"] + ".wav"
        data = (out / record["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == record["sha256"], record["id"]
        rate, samples = float_wav_samples(data)
        assert rate == record["sample_rate"] == engine.sample_rate
        assert len(samples) == 4 * record["samples"]
        assert record["seconds"] == pytest.approx(record["samples"] / rate, abs=1e-6)
        options = {k: v for k, v in line.items() if k not in ("id", "text")}
        assert_same_bytes(samples, engine.synthesize(line["text"], **options).tobytes(), what=record["id"])


def test_ctrl_c_stops_the_run_and_keeps_what_was_recorded(cluster, tmp_path, supertonic_profile):
    manifest = write_manifest(tmp_path / "corpus.jsonl", corpus())
    out, results = tmp_path / "out", tmp_path / "out" / "results.jsonl"
    # SIGINT as a terminal sends it, whatever this process's parent ignores.
    run = subprocess.Popen(job(manifest, out, supertonic_profile, cluster.address), env=job_env(), stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not complete_records(results):
            assert run.poll() is None and time.monotonic() < deadline, "the run recorded nothing"
            time.sleep(0.005)
        run.send_signal(signal.SIGINT)
        stdout, stderr = run.communicate(timeout=60)
    finally:
        run.kill()
        run.wait(timeout=30)
    stderr = stderr.decode(errors="replace")
    assert run.returncode == 130, stderr
    assert "Traceback" not in stderr and stderr.endswith(" (2 workers)\ntts_batch: interrupted\n"), stderr
    assert ", 0 failed, interrupted in " in stderr.splitlines()[-2], stderr
    text = results.read_text()
    records = [json.loads(line) for line in text.splitlines()]
    assert text.endswith("\n") and 0 < len(records) < ITEMS
    for record in records:
        assert hashlib.sha256((out / record["file"]).read_bytes()).hexdigest() == record["sha256"]
    wait_for_the_killed_jobs_actors_to_end(cluster)


def wait_for_the_killed_jobs_actors_to_end(cluster):
    """Ray ends a dead driver's actors by itself; until then one may still
    finish its item and write its file."""
    deadline = time.monotonic() + 60
    while cluster.actors():
        assert time.monotonic() < deadline, "the killed run's actors are still alive after 60 s"
        time.sleep(0.2)


def test_failing_lines_are_recorded_with_the_engines_message_and_the_rest_finish(cluster, tmp_path, supertonic_profile):
    lines = [
        {"id": "good-1", "text": "The first line."},
        {"id": "no-such-voice", "text": "A voice the model does not have.", "voice": "nobody"},
        {"id": "good-2", "text": "The second good line.", "seed": 7},
        {"id": "too-fast", "text": "A speed out of range.", "speed": 9.5},
    ]
    manifest = write_manifest(tmp_path / "corpus.jsonl", lines)
    out = tmp_path / "out"
    engine = tts.Engine(profile=supertonic_profile)
    expected = {}
    for line in lines[1::2]:
        with pytest.raises(tts.TtsError) as caught:
            engine.synthesize(line["text"], **{k: v for k, v in line.items() if k not in ("id", "text")})
        expected[line["id"]] = str(caught.value)
    for attempt in (1, 2):
        done = run_job(job(manifest, out, supertonic_profile, cluster.address))
        stderr = done.stderr.decode(errors="replace")
        assert done.returncode == 1, stderr
        counts = "2 done, 0 skipped" if attempt == 1 else "0 done, 2 skipped"
        assert stderr.splitlines()[-1].startswith("tts_batch: %s, 2 failed in " % counts), stderr
        failures = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
        assert sorted(failures, key=lambda f: f["line"]) == [
            {"id": "no-such-voice", "line": 2, "error": expected["no-such-voice"]},
            {"id": "too-fast", "line": 4, "error": expected["too-fast"]},
        ]
        assert sorted(complete_records(out / "results.jsonl")) == ["good-1", "good-2"]
        assert sorted(os.listdir(out)) == ["failures.jsonl", "good-1.wav", "good-2.wav", "results.jsonl"]
    assert "unknown voice 'nobody'" in expected["no-such-voice"]


def test_an_option_the_engine_does_not_take_stops_the_run_before_any_synthesis(cluster, tmp_path, supertonic_profile):
    manifest = write_manifest(tmp_path / "corpus.jsonl", [{"id": "a", "text": "Hello."}, {"id": "b", "text": "Hello.", "loudness": 3}])
    out = tmp_path / "out"
    done = run_job(job(manifest, out, supertonic_profile, cluster.address))
    stderr = done.stderr.decode(errors="replace")
    assert done.returncode == 1
    assert stderr.startswith('tts_batch: %s:2: unknown option "loudness" (the engine takes: ' % manifest) and stderr.count("\n") == 1, stderr
    assert os.listdir(out) == ["results.jsonl"] and (out / "results.jsonl").read_bytes() == b""


def test_a_profile_the_workers_cannot_open_stops_the_run_with_the_engines_message(cluster, tmp_path):
    manifest = write_manifest(tmp_path / "corpus.jsonl", [{"id": "a", "text": "Hello."}])
    missing = tmp_path / "missing.gguf"
    profile = tmp_path / "bad.toml"
    profile.write_text(profile_text([missing]))
    with pytest.raises(tts.TtsError) as caught:
        tts.Engine(profile=profile)
    done = run_job(job(manifest, tmp_path / "out", profile, cluster.address))
    assert done.returncode == 1
    assert done.stderr.decode(errors="replace") == "tts_batch: opening the engine: %s\n" % caught.value
    assert os.listdir(tmp_path / "out") == ["results.jsonl"]


def test_more_workers_than_the_cluster_holds_is_an_error_not_a_hang(cluster, tmp_path, supertonic_profile):
    manifest = write_manifest(tmp_path / "corpus.jsonl", [{"id": "line-%d" % i, "text": "Hello."} for i in range(4)])
    args = job(manifest, tmp_path / "out", supertonic_profile, cluster.address, "--start-timeout", "5")
    args[args.index("--workers") + 1] = "3"
    done = run_job(args, timeout=120)
    stderr = done.stderr.decode(errors="replace")
    assert done.returncode == 1
    # 2 of 3, or fewer while an earlier test's actors give their CPUs back.
    assert re.fullmatch(r"tts_batch: [0-2] of 3 workers started within 5 s \(the cluster has 2 CPUs; each worker takes 1\)\n", stderr), stderr
    assert os.listdir(tmp_path / "out") == ["results.jsonl"]


@pytest.mark.parametrize(
    "lines, error",
    [
        (['{"id": "a", "text": "x"}', '{"id": "b", "text": "y"}', '{"id": "a", "text": "z"}'], ':3: id "a" repeats line 1'),
        (['{"id": "a", "text": "x"}', '{"id": "../escape", "text": "y"}'], ':2: id "../escape" is not a safe file name'),
        (['{"id": "a/b", "text": "x"}'], ':1: id "a/b" is not a safe file name'),
        (['{"id": ".hidden", "text": "x"}'], ':1: id ".hidden" is not a safe file name'),
        (['{"id": "", "text": "x"}'], ':1: id "" is not a safe file name'),
        (['{"id": "%s", "text": "x"}' % ("a" * 129)], ':1: id "%s" is not a safe file name' % ("a" * 129)),
        (['{"id": 7, "text": "x"}'], ':1: "id" must be a string'),
        (['{"id": "a", "text": "x"}', '{"id": "b", "text": "  "}'], ':2: "text" must be a non-empty string'),
        (['{"id": "a", "text": "x"}', '{"id": "b", "text": "y",'], ":2: not JSON ("),
        (['["a", "x"]'], ":1: not a JSON object"),
        (['{"id": "a", "text": "x", "voice": ["M1"]}'], ':1: option "voice" must be a string, number or boolean'),
        ([], ": no items"),
    ],
)
def test_a_bad_manifest_is_one_line_naming_the_line_and_nothing_starts(tmp_path, lines, error):
    manifest = tmp_path / "bad.jsonl"
    manifest.write_text("".join(line + "\n" for line in lines))
    out = tmp_path / "out"
    # An address nothing listens on: a run that got as far as Ray would fail otherwise.
    done = run_job([sys.executable, str(SCRIPT), str(manifest), "--out", str(out), "--profile", "x.toml", "--address", "127.0.0.1:9"], timeout=60)
    stderr = done.stderr.decode(errors="replace")
    assert done.returncode == 1 and done.stdout == b""
    assert stderr.startswith("tts_batch: %s%s" % (manifest, error)) and stderr.count("\n") == 1, stderr
    assert not out.exists()


def test_a_second_run_on_the_same_directory_is_refused(tmp_path):
    manifest = write_manifest(tmp_path / "corpus.jsonl", [{"id": "a", "text": "Hello."}])
    out = tmp_path / "out"
    out.mkdir()
    # What a running driver holds on DIR.
    held = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        done = run_job([sys.executable, str(SCRIPT), str(manifest), "--out", str(out), "--address", "127.0.0.1:9"], timeout=60)
    finally:
        os.close(held)
    assert done.returncode == 1
    assert done.stderr.decode(errors="replace") == "tts_batch: %s: another run is using this directory\n" % out
    assert os.listdir(out) == []


def test_the_wav_writer_agrees_with_the_checker_here():
    """The job's WAV writer, imported without Ray, against this file's reader."""
    spec = importlib.util.spec_from_file_location("tts_batch", SCRIPT)
    batch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(batch)
    samples = tts.Engine(profile_text=profile_text(SUPERTONIC)).synthesize("Hello there.")
    rate, data = float_wav_samples(batch.float_wav(samples, 44100))
    assert rate == 44100
    assert_same_bytes(data, samples.tobytes())
