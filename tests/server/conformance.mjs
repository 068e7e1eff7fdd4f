// The official `openai` Node package against a running `tts serve`: every
// response_format with every stream_format, each awaited whole and read as a
// stream, written to OUT_DIR for the Rust test to decode with an independent
// decoder.
//
//     node conformance.mjs BASE_URL API_KEY MODEL OUT_DIR
//
// Files: `node-{plain|streamed}-{audio|sse}.{format}`; an SSE response's
// `speech.audio.delta` chunks are decoded from base64 and joined, and its
// `speech.audio.done` event must come last with usage.
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import OpenAI from "openai";

const [base, key, model, outDir] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0 });
const text = "The official client speaks to this server.";
const FORMATS = ["mp3", "opus", "aac", "flac", "wav", "pcm"];

function fromSse(body, what) {
  const audio = [];
  let done = null;
  for (const line of body.toString("utf8").split(/\r?\n/)) {
    if (!line.startsWith("data:")) continue;
    if (done) throw new Error(`${what}: an event after speech.audio.done`);
    const event = JSON.parse(line.slice(5).trim());
    if (event.type === "speech.audio.delta") audio.push(Buffer.from(event.audio, "base64"));
    else if (event.type === "speech.audio.done") done = event;
    else throw new Error(`${what}: unexpected event ${event.type}`);
  }
  if (!done) throw new Error(`${what}: no speech.audio.done`);
  const u = done.usage;
  if (u.total_tokens !== u.input_tokens + u.output_tokens) throw new Error(`${what}: usage ${JSON.stringify(u)}`);
  return Buffer.concat(audio);
}

for (const fmt of FORMATS) {
  for (const stream of ["audio", "sse"]) {
    // The voice object form, with the voice every OpenAI example uses.
    const params = { model, voice: { id: "alloy" }, input: text, response_format: fmt, stream_format: stream };
    const whole = await client.audio.speech.create(params);
    let plain = Buffer.from(await whole.arrayBuffer());
    const response = await client.audio.speech.create(params).asResponse();
    if (response.status !== 200) throw new Error(`${fmt} ${stream}: status ${response.status}`);
    const chunks = [];
    for await (const chunk of response.body) chunks.push(Buffer.from(chunk));
    let streamed = Buffer.concat(chunks);
    if (stream === "sse") {
      plain = fromSse(plain, `${fmt} plain`);
      streamed = fromSse(streamed, `${fmt} streamed`);
    }
    if (!plain.length || !streamed.length) throw new Error(`${fmt} ${stream}: no audio`);
    writeFileSync(join(outDir, `node-plain-${stream}.${fmt}`), plain);
    writeFileSync(join(outDir, `node-streamed-${stream}.${fmt}`), streamed);
    console.log(`${fmt} ${stream}: ${plain.length} bytes plain, ${streamed.length} streamed in ${chunks.length} chunk(s)`);
  }
}
console.log("all requests answered");
