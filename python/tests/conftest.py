"""Fixtures of the package's tests: profiles for the repository's tiny model
fixtures, and the `tts` CLI whose output the package must match.

The package under test is the installed wheel (`cargo xtask test` installs
it into a fresh venv); the CLI is the one TTS_CLI names (xtask names the
bundle's, whose plugins the wheel carries), else the workspace's debug build."""

import os
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
SUPERTONIC = [FIXTURES / "supertonic" / "tiny-v2" / "model.gguf"]
CHATTERBOX = [FIXTURES / "chatterbox" / "turbo-tiny" / name for name in ("t3-turbo.gguf", "s3gen-meanflow.gguf")]


@pytest.fixture(autouse=True)
def bundled_plugins_only(monkeypatch):
    """The wheel's own plugins, never a directory the environment names."""
    monkeypatch.delenv("TTS_PLUGIN_PATH", raising=False)


def profile_text(files):
    names = ", ".join('"%s"' % f for f in files)
    return '[backend]\nprefer = ["cpu"]\nfallback = false\n[backends.cpu]\nthreads = 1\n[model]\nfiles = [%s]\n' % names


@pytest.fixture(params=["supertonic", "chatterbox"])
def model_files(request):
    return {"supertonic": SUPERTONIC, "chatterbox": CHATTERBOX}[request.param]


@pytest.fixture
def supertonic_profile(tmp_path):
    path = tmp_path / "supertonic.toml"
    path.write_text(profile_text(SUPERTONIC))
    return path


@pytest.fixture
def chatterbox_profile(tmp_path):
    path = tmp_path / "chatterbox.toml"
    path.write_text(profile_text(CHATTERBOX))
    return path


@pytest.fixture(scope="session")
def cli():
    path = pathlib.Path(os.environ.get("TTS_CLI", REPO / "target" / "debug" / "tts"))
    if not path.is_file():
        pytest.skip("no tts CLI at %s (build it: cargo build -p tts-cli, or name it in TTS_CLI)" % path)
    return path


def run_cli(cli, *args):
    """Runs the CLI; its stdout and stderr on failure, bounded in time."""
    env = {k: v for k, v in os.environ.items() if k not in ("TTS_PLUGIN_PATH", "TTS_LOG")}
    done = subprocess.run([str(cli), *map(str, args)], capture_output=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done


def assert_same_bytes(got, expected, what="the samples"):
    """`got == expected` for two byte strings of float32 samples, failing with
    one short line: pytest's own report of two long unequal byte strings is a
    diff that takes minutes to compute."""
    if got == expected:
        return
    n = min(len(got), len(expected))
    first = next((i for i in range(0, n, 4) if got[i : i + 4] != expected[i : i + 4]), n)
    pytest.fail("%s differ: %d and %d bytes, first at sample %d" % (what, len(got), len(expected), first // 4), pytrace=False)
