//! The HTTP surface: OpenAI's speech endpoint and model list, voices, health
//! and metrics. Every 4xx and 5xx carries OpenAI's JSON (`{"error":
//! {"message", "type", "param", "code"}}`), 404 and 405 included. The key is
//! checked before any byte of a body is read.

use super::encode::ResponseFormat;
use super::metrics::{self, Metrics};
use super::pool::{Event, Failure, Job, Pool};
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::json;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
pub use tts_serve_api::ApiError;
use tts_serve_api::{ApiKey, StreamFormat, OPENAI_MODEL_ALIASES};

/// A loaded model as the API sees it.
pub struct Served {
    pub pool: Pool,
    /// The model family and variant (which voice files it reads).
    pub family: String,
    pub variant: String,
    pub voices: Vec<String>,
    /// Each OpenAI voice name and the voice of this model it speaks with
    /// (`default`: the model's default voice), from the defaults and the
    /// profile's `[server.voices]`.
    pub openai_voices: IndexMap<String, String>,
    pub languages: Vec<String>,
    /// The model's option keys (does it take `speed`, `language`?).
    pub options: Vec<String>,
    /// The model's own rate (`pcm` is resampled to 24 kHz).
    pub sample_rate: u32,
}

pub struct AppState {
    /// Set once every model is loaded; until then speech requests get 503.
    pub models: OnceLock<IndexMap<String, Served>>,
    pub draining: AtomicBool,
    pub metrics: Arc<Metrics>,
    pub api_key: Option<ApiKey>,
    pub voices_dir: Option<PathBuf>,
    pub max_input_chars: usize,
    /// How long a speech request's whole body may take to arrive.
    pub body_timeout: Duration,
    pub cors: Cors,
}

/// Which web origins may call the API from a browser (`--cors-origin`).
#[derive(Debug, Clone, Default)]
pub struct Cors {
    /// Exact origins (`https://app.example`); empty: none.
    pub origins: Vec<String>,
    /// `--cors-origin '*'`: any origin.
    pub any: bool,
}

impl Cors {
    fn allows(&self, origin: &str) -> bool {
        self.any || self.origins.iter().any(|o| o == origin)
    }
}

/// How long a browser may cache a preflight's answer, in seconds.
const PREFLIGHT_MAX_AGE: u32 = 600;

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/", get(super::page::page))
        .route("/v1/audio/speech", post(speech))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/audio/voices", get(voices))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(state.clone(), cors))
        .with_state(state)
}

/// CORS: answers a preflight (`OPTIONS` with `Origin` and
/// `Access-Control-Request-Method`) itself, before the key is checked (a
/// browser sends none with it): 204 with the allowed methods and headers for
/// an allowed origin, 403 with OpenAI's error JSON for any other. Every other
/// response to an allowed origin carries `Access-Control-Allow-Origin`.
async fn cors(State(state): State<Arc<AppState>>, request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let origin = request.headers().get(header::ORIGIN).and_then(|v| v.to_str().ok()).map(str::to_string);
    let preflight = request.method() == axum::http::Method::OPTIONS && request.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let Some(origin) = origin else { return next.run(request).await };
    let allowed = state.cors.allows(&origin);
    if preflight {
        if !allowed {
            let message = match state.cors.origins.is_empty() && !state.cors.any {
                true => format!("cross-origin requests are not enabled (origin `{origin}`); start the server with --cors-origin ORIGIN"),
                false => format!("the origin `{origin}` may not call this server (--cors-origin)"),
            };
            let e = error(403, message, None, Some("cors_origin_not_allowed"));
            return counted(&state, "other", error_response(&e));
        }
        let mut response = StatusCode::NO_CONTENT.into_response();
        let h = response.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, OPTIONS"));
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, HeaderValue::from_static("authorization, content-type"));
        h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from(PREFLIGHT_MAX_AGE));
        allow_origin(&state.cors, &origin, h);
        return counted(&state, "other", response);
    }
    let mut response = next.run(request).await;
    if allowed {
        let h = response.headers_mut();
        allow_origin(&state.cors, &origin, h);
        h.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, HeaderValue::from_static("x-sample-rate, x-tts-instructions, retry-after"));
    }
    response
}

/// `Access-Control-Allow-Origin` for an allowed `origin`: `*` when any may
/// call, else the origin itself (with `Vary: Origin`, so caches keep the
/// answers apart).
fn allow_origin(cors: &Cors, origin: &str, headers: &mut HeaderMap) {
    match (cors.any, HeaderValue::from_str(origin)) {
        (true, _) => {
            headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
        }
        (false, Ok(value)) => {
            headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
            headers.append(header::VARY, HeaderValue::from_static("origin"));
        }
        (false, Err(_)) => {}
    }
}

fn error(status: u16, message: impl Into<String>, param: Option<&str>, code: Option<&'static str>) -> ApiError {
    ApiError::new(status, message, param, code)
}

fn failure(f: &Failure) -> ApiError {
    error(f.status, f.message.clone(), f.param.as_deref(), None)
}

/// OpenAI's error JSON with the error's status (429 with `Retry-After`).
pub fn error_response(e: &ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, axum::Json(e.body())).into_response();
    if e.status == 429 {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

/// An error answered before the request's body was read: the connection
/// closes after it, so hyper neither reads nor buffers the rest of the body.
fn unread_body_error(e: &ApiError) -> Response {
    let mut response = error_response(e);
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Counts the response under `endpoint`.
fn counted(state: &AppState, endpoint: &str, response: Response) -> Response {
    state.metrics.count(endpoint, response.status().as_u16());
    response
}

/// None when the request may go on; the 401 otherwise (ApiKey compares in
/// constant time).
fn unauthorized(state: &AppState, headers: &HeaderMap) -> Option<ApiError> {
    let key = state.api_key.as_ref()?;
    key.check(headers.get(header::AUTHORIZATION).map(|v| v.as_bytes())).err()
}

fn loaded(state: &AppState) -> Result<&IndexMap<String, Served>, ApiError> {
    match (state.models.get(), state.draining.load(Ordering::Relaxed)) {
        (_, true) => Err(error(503, "the server is shutting down", None, None)),
        (None, _) => Err(error(503, "the models are still loading", None, None)),
        (Some(m), false) => Ok(m),
    }
}

/// The model a request names: a profile's id, or an OpenAI name for the first.
fn find<'a>(models: &'a IndexMap<String, Served>, name: &str) -> Result<(&'a str, &'a Served), ApiError> {
    if let Some((id, m)) = models.get_key_value(name) {
        return Ok((id, m));
    }
    if OPENAI_MODEL_ALIASES.contains(&name) {
        if let Some((id, m)) = models.first() {
            return Ok((id, m));
        }
    }
    let known: Vec<&str> = models.keys().map(|k| k.as_str()).collect();
    Err(error(404, format!("the model `{name}` does not exist; served: {}", known.join(", ")), Some("model"), Some("model_not_found")))
}

/// Voice files in the configured directory that `served` can read, by NAME
/// (`crate::voice_files`). Each request looks again, so files added while
/// serving count.
fn voice_files(state: &AppState, served: &Served) -> IndexMap<String, PathBuf> {
    match &state.voices_dir {
        Some(dir) => crate::voice_files::usable(dir, &served.family, &served.variant).into_iter().collect(),
        None => IndexMap::new(),
    }
}

/// Every voice name a request may give this model: `default`, its built-in
/// voices, the OpenAI names, and the voices directory's files it can read.
fn voice_names(state: &AppState, served: &Served) -> Vec<String> {
    let mut names: Vec<String> = std::iter::once("default".to_string()).chain(served.voices.iter().cloned()).collect();
    names.extend(served.openai_voices.keys().filter(|k| !names.contains(k)).cloned().collect::<Vec<_>>());
    names.extend(voice_files(state, served).into_keys().filter(|k| !names.contains(k)).collect::<Vec<_>>());
    names
}

/// The `voice` override for a request's voice name: a built-in voice, an
/// OpenAI name (through the model's table), a file of the voices directory
/// this model can read, or the model's default (None). Nothing from the
/// request becomes a path: names are looked up, never joined.
fn resolve_voice(state: &AppState, served: &Served, name: &str) -> Result<Option<String>, ApiError> {
    let name = served.openai_voices.get(name).map_or(name, |v| v.as_str());
    if name == "default" {
        return Ok(None);
    }
    if served.voices.iter().any(|v| v == name) {
        return Ok(Some(name.to_string()));
    }
    if let Some(path) = voice_files(state, served).get(name) {
        return Ok(Some(path.display().to_string()));
    }
    let known = voice_names(state, served).join(", ");
    Err(error(400, format!("unknown voice `{name}` for this {} model; its voices: {known}", served.family), Some("voice"), Some("voice_not_found")))
}

async fn speech(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let received = Instant::now();
    let (response, model) = speech_response(&state, &headers, body, received).await;
    // A streamed response is timed when its last byte goes out; an error when
    // it is answered (if it got as far as a model).
    if response.status() != StatusCode::OK && !model.is_empty() {
        state.metrics.latency.get_or_create(&metrics::model(&model)).observe(received.elapsed().as_secs_f64());
    }
    counted(&state, "speech", response)
}

/// The body, read only after the key and the server's state are checked,
/// within the body timeout and the size limit. A body over the limit (by its
/// `Content-Length` or as it arrives) is read no further than the limit, the
/// first `limit` bytes only scanned for the field they end in: instructions
/// over their cap get their own 400, anything else 413.
async fn read_body(state: &AppState, headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    use http_body_util::BodyExt;
    let limit = tts_serve_api::body_limit(state.max_input_chars);
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    let read = async move {
        let mut body = body;
        let mut bytes = Vec::with_capacity(declared.map_or(0, |n| n.min(limit as u64) as usize));
        let mut scanner: Option<tts_serve_api::OverflowScanner> = None;
        let mut seen = 0usize;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| error(400, format!("reading the request body: {e}"), None, None))?;
            let Ok(data) = frame.into_data() else { continue };
            // Past the limit (or declared so): scanned up to it, not kept.
            let over = declared.is_some_and(|n| n > limit as u64) || seen + data.len() > limit;
            if over && scanner.is_none() {
                let mut s = tts_serve_api::OverflowScanner::default();
                s.feed(&bytes);
                bytes = Vec::new();
                scanner = Some(s);
            }
            match scanner.as_mut() {
                Some(s) => {
                    let take = limit.saturating_sub(seen).min(data.len());
                    s.feed(&data[..take]);
                    seen += take;
                    if seen >= limit {
                        break;
                    }
                }
                None => {
                    bytes.extend_from_slice(&data);
                    seen += data.len();
                }
            }
        }
        match scanner {
            Some(s) => Err(s.error()),
            None => Ok(Bytes::from(bytes)),
        }
    };
    match tokio::time::timeout(state.body_timeout, read).await {
        Ok(result) => result,
        Err(_) => Err(error(408, format!("the request body did not arrive within {} s", state.body_timeout.as_secs_f64()), None, Some("body_timeout"))),
    }
}

async fn speech_response(state: &Arc<AppState>, headers: &HeaderMap, body: Body, received: Instant) -> (Response, String) {
    // Nothing of the body is read until the key and the state are checked.
    if let Some(e) = unauthorized(state, headers) {
        return (unread_body_error(&e), String::new());
    }
    let models = match loaded(state) {
        Ok(m) => m,
        Err(e) => return (unread_body_error(&e), String::new()),
    };
    let body = match read_body(state, headers, body).await {
        Ok(b) => b,
        Err(e) => return (unread_body_error(&e), String::new()),
    };
    let mut model = String::new();
    let result = async {
        let request = tts_serve_api::parse_speech(&body, state.max_input_chars)?;
        let (id, served) = find(models, &request.model)?;
        model = id.to_string();
        let (job, reply, events) = prepare(state, served, request, received)?;
        start(state, id, served, job, reply, events, received).await
    }
    .await;
    (result.unwrap_or_else(|e| error_response(&e)), model)
}

type Prepared = (Job, Reply, tokio::sync::mpsc::Receiver<Event>);

/// Checks the request's fields against the model and builds its job (the
/// checks that need no model ran in `parse_speech`).
fn prepare(state: &AppState, served: &Served, request: tts_serve_api::SpeechRequest, received: Instant) -> Result<Prepared, ApiError> {
    let format = request.format;
    let mut overrides = Vec::new();
    if let Some(speed) = request.speed {
        match served.options.iter().any(|k| k == "speed") {
            true => overrides.push(("speed".to_string(), speed.to_string())),
            false if speed == 1.0 => {}
            false => return Err(error(400, "this model has no speed control (speed must be 1.0)", Some("speed"), None)),
        }
    }
    if let Some(voice) = resolve_voice(state, served, &request.voice)? {
        overrides.push(("voice".to_string(), voice));
    }
    if let Some(language) = request.language {
        if !served.languages.contains(&language) {
            let known = if served.languages.is_empty() { "none (the model has no language option)".to_string() } else { served.languages.join(", ") };
            return Err(error(400, format!("unknown language `{language}`; this model's languages: {known}"), Some("language"), None));
        }
        overrides.push(("language".to_string(), language));
    }
    let (events, receiver) = tokio::sync::mpsc::channel(32);
    let reply = Reply {
        format,
        stream: request.stream,
        input_chars: request.input.chars().count() as u64,
        // No served family has an instruction input yet (docs/server.md).
        instructions_ignored: request.instructions.is_some(),
    };
    Ok((Job { text: request.input, overrides, format, events, received }, reply, receiver))
}

/// How the response is sent.
struct Reply {
    format: ResponseFormat,
    stream: StreamFormat,
    /// For SSE's usage: `input_tokens`.
    input_chars: u64,
    instructions_ignored: bool,
}

/// One SSE event: `data: JSON` and a blank line.
fn sse_event(value: serde_json::Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// A `speech.audio.delta` event with `audio` in base64.
fn sse_delta(audio: &[u8]) -> Bytes {
    use base64::Engine as _;
    sse_event(json!({"type": "speech.audio.delta", "audio": base64::engine::general_purpose::STANDARD.encode(audio)}))
}

/// The `speech.audio.done` event. OpenAI counts tokens of its own models;
/// here `input_tokens` is the input's characters and `output_tokens` the
/// audio's 20 ms frames (50 a second, the last one partial), so both grow
/// with what the request cost (docs/server.md).
fn sse_done(input_chars: u64, samples: u64, sample_rate: u32) -> Bytes {
    let frames = (samples * 50).div_ceil(u64::from(sample_rate.max(1)));
    sse_event(json!({"type": "speech.audio.done", "usage": {"input_tokens": input_chars, "output_tokens": frames, "total_tokens": input_chars + frames}}))
}

/// Queues the job and answers once the first audio (or an error) is there:
/// a failure before any audio gets its own status, one after it ends the
/// stream early (the client sees an incomplete transfer).
async fn start(
    state: &Arc<AppState>,
    id: &str,
    served: &Served,
    job: Job,
    reply: Reply,
    mut events: tokio::sync::mpsc::Receiver<Event>,
    received: Instant,
) -> Result<Response, ApiError> {
    let label = metrics::model(id);
    // Counted before the worker can take it (and count it out).
    state.metrics.queue_depth.get_or_create(&label).inc();
    if served.pool.submit(job).is_err() {
        state.metrics.queue_depth.get_or_create(&label).dec();
        return Err(error(429, "the queue is full; retry shortly", None, Some("queue_full")));
    }
    let first = match events.recv().await {
        Some(Event::Audio(bytes)) => bytes,
        Some(Event::Failed(f)) => return Err(failure(&f)),
        Some(Event::Done { .. }) | None => return Err(failure(&Failure::internal("the synthesis ended without audio"))),
    };
    let metrics = state.metrics.clone();
    let (sse, input_chars) = (reply.stream == StreamFormat::Sse, reply.input_chars);
    // Audio as sent: the bytes themselves, or SSE deltas (an empty piece,
    // which only says that audio has started, is no event).
    let piece = move |bytes: Vec<u8>| match sse {
        false => Bytes::from(bytes),
        true if bytes.is_empty() => Bytes::new(),
        true => sse_delta(&bytes),
    };
    let stream = futures_util::stream::unfold((Some(first), events, false), move |(first, mut events, ended)| {
        let (metrics, label) = (metrics.clone(), label.clone());
        async move {
            if let Some(bytes) = first {
                return Some((Ok(piece(bytes)), (None, events, false)));
            }
            if ended {
                return None;
            }
            match events.recv().await {
                Some(Event::Audio(bytes)) => Some((Ok(piece(bytes)), (None, events, false))),
                Some(Event::Done { samples, sample_rate }) => {
                    metrics.latency.get_or_create(&label).observe(received.elapsed().as_secs_f64());
                    // The stream ends after the done event.
                    sse.then(|| (Ok(sse_done(input_chars, samples, sample_rate)), (None, events, true)))
                }
                Some(Event::Failed(f)) => {
                    tracing::error!("synthesis failed after audio was sent: {}", f.message);
                    Some((Err(std::io::Error::other(f.message)), (None, events, true)))
                }
                None => Some((Err(std::io::Error::other("the worker stopped")), (None, events, true))),
            }
        }
    });
    let mut response = Response::new(Body::from_stream(stream));
    let headers = response.headers_mut();
    let format = reply.format;
    match reply.stream {
        StreamFormat::Audio => headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(format.content_type())),
        StreamFormat::Sse => {
            headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"))
        }
    };
    let rate = super::encode::response_rate(format, served.sample_rate);
    headers.insert("x-sample-rate", HeaderValue::from(rate));
    if reply.instructions_ignored {
        // The family name is the plugin's own (ASCII); a value that is not a
        // header value is left out rather than failing the response.
        if let Ok(value) = HeaderValue::from_str(&format!("ignored ({} has no instruction input)", served.family)) {
            headers.insert("x-tts-instructions", value);
        }
    }
    Ok(response)
}

async fn models(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let response = match unauthorized(&state, &headers).map(Err).unwrap_or_else(|| loaded(&state)) {
        Err(e) => error_response(&e),
        Ok(models) => {
            let data: Vec<_> = models.keys().map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "tts"})).collect();
            axum::Json(json!({"object": "list", "data": data})).into_response()
        }
    };
    counted(&state, "models", response)
}

/// `GET /v1/models/{id}`: OpenAI's model object for a served id (or one of
/// OpenAI's names, which the first model answers); 404 otherwise.
async fn model(State(state): State<Arc<AppState>>, headers: HeaderMap, axum::extract::Path(name): axum::extract::Path<String>) -> Response {
    let response = match unauthorized(&state, &headers).map(Err).unwrap_or_else(|| loaded(&state)) {
        Err(e) => error_response(&e),
        Ok(models) => match find(models, &name) {
            // An OpenAI name is answered as itself: the client asked about it.
            Ok(_) => axum::Json(json!({"id": name, "object": "model", "created": 0, "owned_by": "tts"})).into_response(),
            Err(e) => error_response(&e),
        },
    };
    counted(&state, "models", response)
}

#[derive(Deserialize)]
struct VoicesQuery {
    model: Option<String>,
}

/// The voices of one model (`?model=ID`, else the first): `default`, the
/// built-in ones, the OpenAI names, then the files of the voices directory
/// that this model can read; `openai_voices` maps each OpenAI name to the
/// voice it speaks with.
async fn voices(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    query: Result<Query<VoicesQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let response = (|| {
        if let Some(e) = unauthorized(&state, &headers) {
            return Err(e);
        }
        let models = loaded(&state)?;
        let name = match &query {
            Ok(Query(q)) => q.model.clone(),
            Err(e) => return Err(error(400, e.to_string(), None, None)),
        };
        let (id, served) = match name {
            Some(n) => find(models, &n)?,
            None => match models.first() {
                Some((id, m)) => (id.as_str(), m),
                None => return Err(error(404, "no model is served", Some("model"), Some("model_not_found"))),
            },
        };
        let voices = voice_names(&state, served);
        Ok(axum::Json(json!({"model": id, "voices": voices, "openai_voices": served.openai_voices, "languages": served.languages})).into_response())
    })()
    .unwrap_or_else(|e| error_response(&e));
    counted(&state, "voices", response)
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    let response = match loaded(&state) {
        Ok(models) => axum::Json(json!({"status": "ok", "models": models.keys().collect::<Vec<_>>()})).into_response(),
        Err(_) if state.draining.load(Ordering::Relaxed) => (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({"status": "draining"}))).into_response(),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({"status": "loading"}))).into_response(),
    };
    counted(&state, "health", response)
}

async fn metrics_text(State(state): State<Arc<AppState>>) -> Response {
    let body = state.metrics.render();
    let response = ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response();
    counted(&state, "metrics", response)
}

async fn not_found(State(state): State<Arc<AppState>>, uri: axum::http::Uri) -> Response {
    counted(&state, "other", error_response(&error(404, format!("no endpoint at {}", uri.path()), None, Some("not_found"))))
}

async fn method_not_allowed(State(state): State<Arc<AppState>>, method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let e = error(405, format!("{method} is not allowed on {}", uri.path()), None, Some("method_not_allowed"));
    counted(&state, "other", error_response(&e))
}
