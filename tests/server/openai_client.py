"""The official `openai` Python package against a running `tts serve`.

    python openai_client.py BASE_URL API_KEY MODEL VOICE

Each response format whole (`audio.speech.create`) and streamed
(`with_streaming_response`), OpenAI's voice `alloy` as a name and as a voice
object, `stream_format="sse"`, then the errors the package raises for a wrong
key, a wrong model, an unknown voice, stream format, and long instructions. Prints one line per check; exits
non-zero at the first failure.
"""

import struct
import sys

import openai

base, key, model, voice = sys.argv[1:5]
client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
text = "The official client speaks to this server."


def check_audio(fmt, data):
    assert len(data) > 0, f"{fmt}: no bytes"
    if fmt == "wav":
        assert data[:4] == b"RIFF" and data[8:12] == b"WAVE", data[:16]
        (rate,) = struct.unpack("<I", data[24:28])
        assert rate > 0, rate
    elif fmt == "flac":
        assert data[:4] == b"fLaC", data[:8]
    elif fmt == "mp3":
        assert data[:3] == b"ID3" or (data[0] == 0xFF and data[1] & 0xE0 == 0xE0), data[:4]
    elif fmt == "pcm":
        assert len(data) % 2 == 0, len(data)


for fmt in ["mp3", "wav", "pcm", "flac"]:
    whole = client.audio.speech.create(model=model, voice=voice, input=text, response_format=fmt)
    check_audio(fmt, whole.content)
    chunks = []
    with client.audio.speech.with_streaming_response.create(model=model, voice=voice, input=text, response_format=fmt) as response:
        assert response.http_response.status_code == 200
        for chunk in response.iter_bytes():
            chunks.append(chunk)
    streamed = b"".join(chunks)
    check_audio(fmt, streamed)
    assert streamed == whole.content, f"{fmt}: streamed and whole responses differ"
    print(f"{fmt}: {len(whole.content)} bytes whole, the same streamed in {len(chunks)} chunk(s)")

# The default format (mp3) through one of OpenAI's own model names, with
# OpenAI's own voice names and its custom voice object.
check_audio("mp3", client.audio.speech.create(model="tts-1", voice=voice, input=text).content)
print("tts-1 (default format mp3): ok")
alloy = client.audio.speech.create(model="tts-1", voice="alloy", input=text, response_format="wav").content
check_audio("wav", alloy)
assert client.audio.speech.create(model="tts-1", voice={"id": "alloy"}, input=text, response_format="wav").content == alloy
print(f"voice alloy and {{'id': 'alloy'}}: the same {len(alloy)} bytes")

# stream_format="sse": speech.audio.delta events (base64) carrying the audio
# stream's bytes, then speech.audio.done with usage.
import base64
import json

for fmt in ["wav", "pcm"]:
    audio = client.audio.speech.create(model=model, voice="alloy", input=text, response_format=fmt).content
    with client.audio.speech.with_streaming_response.create(
        model=model, voice="alloy", input=text, response_format=fmt, stream_format="sse"
    ) as response:
        assert response.headers["content-type"] == "text/event-stream", response.headers
        body = response.read().decode()
    events = [json.loads(e[len("data: "):]) for e in body.split("\n\n") if e]
    deltas, done = events[:-1], events[-1]
    assert all(e["type"] == "speech.audio.delta" for e in deltas), events
    assert b"".join(base64.b64decode(e["audio"]) for e in deltas) == audio, f"{fmt}: SSE audio differs"
    assert done["type"] == "speech.audio.done", done
    usage = done["usage"]
    assert usage["input_tokens"] == len(text) and usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"], usage
    print(f"sse {fmt}: {len(deltas)} delta event(s), the audio stream's bytes; usage {usage}")


def expect(error_type, **kwargs):
    try:
        kwargs.setdefault("model", model)
        kwargs.setdefault("voice", voice)
        kwargs.setdefault("input", text)
        c = kwargs.pop("client", client)
        c.audio.speech.create(**kwargs)
    except error_type as e:
        print(f"{error_type.__name__}: {e.status_code} {e.body['message'] if isinstance(e.body, dict) else e.body}")
        return
    raise AssertionError(f"no {error_type.__name__} for {kwargs}")


expect(openai.AuthenticationError, client=openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0))
expect(openai.NotFoundError, model="no-such-model")
expect(openai.BadRequestError, voice="no-such-voice")
expect(openai.BadRequestError, stream_format="websocket")
expect(openai.BadRequestError, instructions="x" * 4097)
expect(openai.BadRequestError, speed=10)
expect(openai.BadRequestError, response_format="ogg")
# Nothing the model can speak: 400, which the client does not retry (a 500 it would).
expect(openai.BadRequestError, input="\x01\x02\x7f")
print("all checks passed")
