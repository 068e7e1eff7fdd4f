"""On-device text-to-speech: the tts engine and its plugins (docs/python.md).

    import tts
    engine = tts.Engine(profile="profile.toml")
    samples = engine.synthesize("Hello.", speed=1.1)   # numpy float32 array
    rate = engine.sample_rate
    for piece in engine.stream("A longer text."):      # arrays as they are made
        ...

Every error of the engine is a ``tts.TtsError`` carrying its one-line message.
"""

from .lib._tts import Engine, Stream, TtsError

__all__ = ["Engine", "Stream", "TtsError"]
