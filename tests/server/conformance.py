"""The official `openai` Python package against a running `tts serve`: every
response_format with every stream_format, each plainly (`audio.speech.create`)
and streamed (`with_streaming_response`), written to OUT_DIR for the Rust test
to decode with an independent decoder.

    python conformance.py BASE_URL API_KEY MODEL OUT_DIR

Files: `python-{plain|streamed}-{audio|sse}.{format}`; an SSE response's
`speech.audio.delta` chunks are decoded from base64 and joined, and its
`speech.audio.done` event must come last with usage.
"""

import base64
import json
import sys
from pathlib import Path

import openai

base, key, model, out_dir = sys.argv[1:5]
out = Path(out_dir)
client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
text = "The official client speaks to this server."
FORMATS = ["mp3", "opus", "aac", "flac", "wav", "pcm"]


def from_sse(body: bytes, what: str) -> bytes:
    audio, done = [], None
    for line in body.decode("utf-8").splitlines():
        if not line.startswith("data:"):
            continue
        assert done is None, f"{what}: an event after speech.audio.done"
        event = json.loads(line[len("data:"):].strip())
        if event["type"] == "speech.audio.delta":
            audio.append(base64.b64decode(event["audio"]))
        elif event["type"] == "speech.audio.done":
            done = event
        else:
            raise AssertionError(f"{what}: unexpected event {event['type']}")
    assert done is not None, f"{what}: no speech.audio.done"
    usage = done["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"], usage
    return b"".join(audio)


for fmt in FORMATS:
    for stream in ["audio", "sse"]:
        # The voice every OpenAI example uses.
        args = dict(model=model, voice="alloy", input=text, response_format=fmt, stream_format=stream)
        plain = client.audio.speech.create(**args).content
        chunks = []
        with client.audio.speech.with_streaming_response.create(**args) as response:
            assert response.http_response.status_code == 200
            for chunk in response.iter_bytes():
                chunks.append(chunk)
        streamed = b"".join(chunks)
        if stream == "sse":
            plain, streamed = from_sse(plain, f"{fmt} plain"), from_sse(streamed, f"{fmt} streamed")
        assert plain and streamed, f"{fmt} {stream}: no audio"
        (out / f"python-plain-{stream}.{fmt}").write_bytes(plain)
        (out / f"python-streamed-{stream}.{fmt}").write_bytes(streamed)
        print(f"{fmt} {stream}: {len(plain)} bytes plain, {len(streamed)} streamed in {len(chunks)} chunk(s)")
print("all requests answered")
