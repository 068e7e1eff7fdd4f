"""The package `tts` as installed from its wheel: the CLI's samples bit for
bit, streaming, listing, threads, and the engine's errors as TtsError."""

import threading
import time

import numpy as np
import pytest

import tts
from conftest import CHATTERBOX, SUPERTONIC, assert_same_bytes, profile_text, run_cli

TEXT = "Hello there. This is a test of the engine."


def cli_samples(cli, profile, tmp_path, *sets):
    out = tmp_path / "cli.f32"
    args = ["--profile", profile, "--quiet", "--text", TEXT, "--out", out]
    for s in sets:
        args += ["--set", s]
    run_cli(cli, *args)
    return out.read_bytes()


def test_synthesize_matches_the_cli_bit_for_bit(cli, model_files, tmp_path):
    profile = tmp_path / "profile.toml"
    profile.write_text(profile_text(model_files))
    engine = tts.Engine(profile=str(profile))
    samples = engine.synthesize(TEXT)
    assert isinstance(samples, np.ndarray) and samples.dtype == np.float32 and samples.ndim == 1
    assert samples.size > 0
    assert_same_bytes(samples.tobytes(), cli_samples(cli, profile, tmp_path))


def test_options_match_the_clis_set(cli, supertonic_profile, tmp_path):
    engine = tts.Engine(profile=supertonic_profile)
    samples = engine.synthesize(TEXT, voice="M1", speed=1.3, steps=3)
    assert_same_bytes(samples.tobytes(), cli_samples(cli, supertonic_profile, tmp_path, "voice=M1", "speed=1.3", "steps=3"))
    # Options of one call do not stay: the next is the profile's again.
    assert_same_bytes(engine.synthesize(TEXT).tobytes(), cli_samples(cli, supertonic_profile, tmp_path))
    # Options given to the engine apply to every call, as --set does.
    set_at_open = tts.Engine(profile=supertonic_profile, voice="M1", speed=1.3, steps=3)
    assert_same_bytes(set_at_open.synthesize(TEXT).tobytes(), samples.tobytes())


def test_profile_text_and_path_give_the_same_engine(supertonic_profile):
    by_path = tts.Engine(profile=supertonic_profile).synthesize(TEXT)
    by_text = tts.Engine(profile_text=supertonic_profile.read_text()).synthesize(TEXT)
    assert_same_bytes(by_path.tobytes(), by_text.tobytes())


def test_model_replaces_the_profiles_files_as_the_clis_model_does(cli, supertonic_profile, tmp_path):
    expected = tts.Engine(profile=supertonic_profile).synthesize(TEXT).tobytes()
    no_files = profile_text([])
    assert_same_bytes(tts.Engine(profile_text=no_files, model=SUPERTONIC[0]).synthesize(TEXT).tobytes(), expected)
    assert_same_bytes(tts.Engine(profile_text=no_files, model=[str(SUPERTONIC[0])]).synthesize(TEXT).tobytes(), expected)
    # The embedded default profile, as `tts --model FILE` with no profile.
    out = tmp_path / "default.f32"
    run_cli(cli, "--model", SUPERTONIC[0], "--quiet", "--text", TEXT, "--out", out)
    assert_same_bytes(tts.Engine(model=SUPERTONIC[0]).synthesize(TEXT).tobytes(), out.read_bytes())
    chatterbox = tts.Engine(profile_text=no_files, model=CHATTERBOX)
    assert chatterbox.family == "chatterbox"
    expect_error("[model] files is empty", tts.Engine, profile_text=no_files)
    with pytest.raises(TypeError, match="model: give a path or a list of paths"):
        tts.Engine(profile_text=no_files, model=3)


def test_the_model_is_described(supertonic_profile):
    engine = tts.Engine(profile=supertonic_profile)
    assert (engine.family, engine.variant, engine.sample_rate) == ("supertonic", "v2", 44100)
    assert engine.backend == "cpu"
    assert engine.voices == ["F1", "M1"]
    assert engine.languages[0] == "en"
    speed = engine.options["speed"]
    assert speed["kind"] == "float" and speed["default"] == pytest.approx(1.05) and "speaking rate" in speed["help"]
    assert engine.options["seed"]["default"] == 42
    assert "supertonic v2" in repr(engine)


def test_stream_pieces_join_to_the_one_shot_samples(model_files, tmp_path):
    engine = tts.Engine(profile_text=profile_text(model_files))
    one_shot = engine.synthesize(TEXT)
    # The model's one-shot pieces: per text chunk (Supertonic's first chunk
    # not cut short, Chatterbox's pieces not per token hop).
    joined = {"supertonic": dict(stream_first_chars=0), "chatterbox": dict(stream_tokens=0)}[engine.family]
    pieces = list(engine.stream(TEXT, **joined))
    assert all(p.dtype == np.float32 and p.ndim == 1 and p.size > 0 for p in pieces)
    assert_same_bytes(np.concatenate(pieces).tobytes(), one_shot.tobytes())


def test_a_stream_yields_several_pieces(chatterbox_profile):
    engine = tts.Engine(profile=chatterbox_profile)
    pieces = list(engine.stream(TEXT))
    assert len(pieces) > 1
    assert sum(p.size for p in pieces) > 0


def test_two_threads_synthesize_at_once(chatterbox_profile, supertonic_profile):
    engines = {"chatterbox": tts.Engine(profile=chatterbox_profile), "supertonic": tts.Engine(profile=supertonic_profile)}
    texts = ["Hello there.", "A second, different text."]
    expected = {(name, t): e.synthesize(t).tobytes() for name, e in engines.items() for t in texts}
    results, errors = {}, []

    def work(name, engine, text):
        try:
            for i in range(3):
                results[(name, text, i)] = engine.synthesize(text).tobytes()
        except Exception as e:  # reported below, with the thread's name
            errors.append("%s %r: %r" % (name, text, e))

    # Two threads on one engine (they take turns on its model), and two on
    # two engines (they run side by side).
    threads = [threading.Thread(target=work, args=("chatterbox", engines["chatterbox"], t)) for t in texts]
    threads += [threading.Thread(target=work, args=("supertonic", engines["supertonic"], t)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
        assert not t.is_alive(), "a synthesizing thread did not end"
    assert errors == []
    assert len(results) == 12
    for (name, text, _), got in results.items():
        assert_same_bytes(got, expected[(name, text)], what="%s, %r" % (name, text))


def test_the_gil_is_released_while_synthesizing(chatterbox_profile):
    engine = tts.Engine(profile=chatterbox_profile)
    long_text = "The quick brown fox jumps over the lazy dog. " * 4
    span = {}

    def synthesize():
        span["start"] = time.monotonic()
        engine.synthesize(long_text)
        span["end"] = time.monotonic()

    worker = threading.Thread(target=synthesize)
    ticks = []
    worker.start()
    while worker.is_alive() and len(ticks) < 100000:
        ticks.append(time.monotonic())
        time.sleep(0.001)
    worker.join(timeout=300)
    # Holding the GIL, the synthesis would leave this thread no turn
    # between its start and its end (it takes about half a second on the
    # tiny fixture); released, this thread ticks all along.
    inside = [t for t in ticks if span["start"] < t < span["end"]]
    assert len(inside) >= 5, "the main thread ran %d times during a %.3f s synthesis" % (len(inside), span["end"] - span["start"])


def test_a_closed_stream_stops_and_frees_the_engine(chatterbox_profile):
    engine = tts.Engine(profile=chatterbox_profile)
    reference = engine.synthesize(TEXT).tobytes()
    stream = engine.stream(TEXT)
    first = next(stream)
    assert first.size > 0
    stream.close()
    with pytest.raises(StopIteration):
        next(stream)
    stream.close()  # twice: nothing happens
    assert_same_bytes(engine.synthesize(TEXT).tobytes(), reference)
    # Leaving a with block closes it, and so does dropping it unread.
    with engine.stream(TEXT) as s:
        next(s)
    with pytest.raises(StopIteration):
        next(s)
    dropped = engine.stream(TEXT)
    next(dropped)
    del dropped
    assert_same_bytes(engine.synthesize(TEXT).tobytes(), reference)


def expect_error(message, call, *args, **kwargs):
    with pytest.raises(tts.TtsError) as caught:
        call(*args, **kwargs)
    text = str(caught.value)
    assert message in text and "\n" not in text, text
    return text


def test_bad_profiles_are_tts_errors(tmp_path):
    expect_error("cannot read profile", tts.Engine, profile=tmp_path / "missing.toml")
    expect_error("<profile_text>", tts.Engine, profile_text="[backend\nprefer = 1")
    missing_model = tmp_path / "no-model.gguf"
    expect_error(str(missing_model), tts.Engine, profile_text=profile_text([missing_model]))
    planted = profile_text(SUPERTONIC) + '[plugins]\ndirs = ["%s"]\n' % tmp_path
    expect_error("a profile is not trusted to name code", tts.Engine, profile_text=planted)
    expect_error("no plugin file libtts_backend_cpu.so", tts.Engine, profile_text=profile_text(SUPERTONIC), plugin_dir=tmp_path)
    with pytest.raises(ValueError, match="not both"):
        tts.Engine(profile=tmp_path / "a.toml", profile_text="")
    assert issubclass(tts.TtsError, Exception)


def test_plugins_come_from_plugin_dir_then_the_environment_then_the_wheel(tmp_path, monkeypatch):
    text = profile_text(SUPERTONIC)
    empty, other = tmp_path / "empty", tmp_path / "other"
    empty.mkdir()
    other.mkdir()
    monkeypatch.setenv("TTS_PLUGIN_PATH", str(empty))
    expect_error("no plugin file libtts_backend_cpu.so in %s" % empty, tts.Engine, profile_text=text)
    expect_error("no plugin file libtts_backend_cpu.so in %s" % other, tts.Engine, profile_text=text, plugin_dir=other)
    monkeypatch.delenv("TTS_PLUGIN_PATH")
    assert tts.Engine(profile_text=text).backend == "cpu"


def test_bad_texts_and_options_are_tts_errors(supertonic_profile):
    engine = tts.Engine(profile=supertonic_profile)
    expect_error("text is empty", engine.synthesize, "  \n")
    expect_error("text is empty", engine.stream, "")
    expect_error("unknown synthesis option `bogus`", engine.synthesize, TEXT, bogus=1)
    expect_error("option `speed`", engine.synthesize, TEXT, speed="fast")
    expect_error("option `speed`", engine.synthesize, TEXT, speed=float("nan"))
    expect_error("option `steps`", engine.synthesize, TEXT, steps=2**70)
    expect_error("unknown synthesis option `bogus`", tts.Engine, profile=supertonic_profile, bogus=1)
    with pytest.raises(TypeError, match="option `speed`: a list is not an option value"):
        engine.synthesize(TEXT, speed=[1.0])
    # A stream's error comes with its first piece, and ends it.
    stream = engine.stream(TEXT, bogus=1)
    expect_error("unknown synthesis option `bogus`", next, stream)
    with pytest.raises(StopIteration):
        next(stream)
    # After each error the engine still speaks.
    assert engine.synthesize(TEXT).size > 0
