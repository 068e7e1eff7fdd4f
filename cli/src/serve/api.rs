//! The HTTP surface: OpenAI's speech endpoint and model list, voices, health
//! and metrics. Errors are OpenAI's JSON (`{"error": {"message", "type",
//! "param", "code"}}`).

use super::encode::ResponseFormat;
use super::metrics::{self, Metrics};
use super::pool::{Event, Failure, Job, Pool};
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
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
use std::time::Instant;

/// OpenAI's model names, answered by the first profile's model, so clients
/// written for OpenAI work unchanged.
pub const OPENAI_MODEL_ALIASES: [&str; 3] = ["tts-1", "tts-1-hd", "gpt-4o-mini-tts"];

/// OpenAI's bounds on `speed`.
const SPEED_RANGE: std::ops::RangeInclusive<f64> = 0.25..=4.0;

/// A loaded model as the API sees it.
pub struct Served {
    pub pool: Pool,
    pub voices: Vec<String>,
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
    pub api_key: Option<String>,
    pub voices_dir: Option<PathBuf>,
    pub max_input_chars: usize,
}

pub fn router(state: Arc<AppState>, body_limit: usize) -> Router {
    Router::new()
        .route("/v1/audio/speech", post(speech))
        .route("/v1/models", get(models))
        .route("/v1/audio/voices", get(voices))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// An error as OpenAI reports it; it becomes the response at the handler's edge.
#[derive(Debug)]
pub struct ApiError {
    status: u16,
    message: String,
    param: Option<String>,
    code: Option<&'static str>,
}

fn error(status: u16, message: impl Into<String>, param: Option<&str>, code: Option<&'static str>) -> ApiError {
    ApiError { status, message: message.into(), param: param.map(str::to_string), code }
}

fn failure(f: &Failure) -> ApiError {
    error(f.status, f.message.clone(), f.param.as_deref(), None)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = match self.status {
            401 => "authentication_error",
            429 => "rate_limit_error",
            s if s >= 500 => "server_error",
            _ => "invalid_request_error",
        };
        let body = json!({"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}});
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, axum::Json(body)).into_response();
        if self.status == 429 {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// Counts the response under `endpoint`.
fn counted(state: &AppState, endpoint: &str, response: Response) -> Response {
    state.metrics.count(endpoint, response.status().as_u16());
    response
}

/// None when the request may go on; the 401 otherwise. Compared in constant time.
fn unauthorized(state: &AppState, headers: &HeaderMap) -> Option<ApiError> {
    let key = state.api_key.as_deref()?;
    let given = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).unwrap_or("");
    let same = given.len() == key.len() && given.bytes().zip(key.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
    match same {
        true => None,
        false if given.is_empty() => Some(error(401, "no API key given: send `Authorization: Bearer KEY`", None, Some("invalid_api_key"))),
        false => Some(error(401, "incorrect API key", None, Some("invalid_api_key"))),
    }
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

#[derive(Deserialize)]
struct SpeechRequest {
    model: String,
    input: String,
    #[serde(default)]
    voice: Option<String>,
    #[serde(default)]
    speed: Option<f64>,
    #[serde(default)]
    response_format: Option<String>,
    #[serde(default)]
    stream_format: Option<String>,
    /// Not OpenAI's: the language of a multilingual model.
    #[serde(default)]
    language: Option<String>,
}

/// Voice files in the configured directory: `NAME.voice` (saved clones) and
/// `NAME.json` (voice styles), by NAME.
fn voice_files(state: &AppState) -> IndexMap<String, PathBuf> {
    let mut files = IndexMap::new();
    let Some(dir) = &state.voices_dir else { return files };
    let Ok(entries) = std::fs::read_dir(dir) else { return files };
    let mut found: Vec<(String, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| {
            let path = e.path();
            let ext = path.extension()?.to_str()?;
            let stem = path.file_stem()?.to_str()?.to_string();
            (ext == "voice" || ext == "json").then_some((stem, path))
        })
        .collect();
    found.sort();
    files.extend(found);
    files
}

/// The `voice` override for a request's voice name: a built-in voice, a file
/// of the voices directory by name, or the model's default. Nothing from the
/// request becomes a path: names are looked up, never joined.
fn resolve_voice(state: &AppState, served: &Served, voice: Option<&str>) -> Result<Option<String>, ApiError> {
    let name = match voice {
        None | Some("") | Some("default") => return Ok(None),
        Some(v) => v,
    };
    if served.voices.iter().any(|v| v == name) {
        return Ok(Some(name.to_string()));
    }
    let files = voice_files(state);
    if let Some(path) = files.get(name) {
        return Ok(Some(path.display().to_string()));
    }
    let mut known: Vec<String> = std::iter::once("default".to_string()).chain(served.voices.iter().cloned()).collect();
    known.extend(files.keys().cloned());
    Err(error(400, format!("unknown voice `{name}`; this model's voices: {}", known.join(", ")), Some("voice"), Some("voice_not_found")))
}

async fn speech(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Response {
    let received = Instant::now();
    let (response, model) = speech_response(&state, &headers, body, received).await;
    // A streamed response is timed when its last byte goes out; an error when
    // it is answered (if it got as far as a model).
    if response.status() != StatusCode::OK && !model.is_empty() {
        state.metrics.latency.get_or_create(&metrics::model(&model)).observe(received.elapsed().as_secs_f64());
    }
    counted(&state, "speech", response)
}

async fn speech_response(state: &Arc<AppState>, headers: &HeaderMap, body: Result<Bytes, BytesRejection>, received: Instant) -> (Response, String) {
    let mut model = String::new();
    let result = async {
        if let Some(e) = unauthorized(state, headers) {
            return Err(e);
        }
        let models = loaded(state)?;
        let body = match body {
            Ok(b) => b,
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => return Err(error(413, "the request body is too large", Some("input"), None)),
            Err(e) => return Err(error(400, format!("reading the request body: {e}"), None, None)),
        };
        let request: SpeechRequest =
            serde_json::from_slice(&body).map_err(|e| error(400, format!("the request body is not valid JSON for this endpoint: {e}"), None, None))?;
        let (id, served) = find(models, &request.model)?;
        model = id.to_string();
        let (job, format, events) = prepare(state, served, request, received)?;
        start(state, id, served, job, format, events, received).await
    }
    .await;
    (result.unwrap_or_else(IntoResponse::into_response), model)
}

type Prepared = (Job, ResponseFormat, tokio::sync::mpsc::Receiver<Event>);

/// Validates the request's fields and builds its job.
fn prepare(state: &AppState, served: &Served, request: SpeechRequest, received: Instant) -> Result<Prepared, ApiError> {
    if request.input.trim().is_empty() {
        return Err(error(400, "input is empty", Some("input"), None));
    }
    let chars = request.input.chars().count();
    if chars > state.max_input_chars {
        return Err(error(413, format!("input holds {chars} characters; this server takes at most {}", state.max_input_chars), Some("input"), None));
    }
    let format = ResponseFormat::parse(request.response_format.as_deref().unwrap_or("mp3")).map_err(|e| error(400, e, Some("response_format"), None))?;
    if let Some(f) = request.stream_format.as_deref().filter(|f| *f != "audio") {
        return Err(error(400, format!("stream_format `{f}` is not supported; supported: audio"), Some("stream_format"), None));
    }
    let mut overrides = Vec::new();
    if let Some(speed) = request.speed {
        if !SPEED_RANGE.contains(&speed) {
            return Err(error(400, format!("speed must be in 0.25..=4.0, got {speed}"), Some("speed"), None));
        }
        match served.options.iter().any(|k| k == "speed") {
            true => overrides.push(("speed".to_string(), speed.to_string())),
            false if speed == 1.0 => {}
            false => return Err(error(400, "this model has no speed control (speed must be 1.0)", Some("speed"), None)),
        }
    }
    if let Some(voice) = resolve_voice(state, served, request.voice.as_deref())? {
        overrides.push(("voice".to_string(), voice));
    }
    if let Some(language) = request.language.filter(|l| !l.is_empty()) {
        if !served.languages.contains(&language) {
            let known = if served.languages.is_empty() { "none (the model has no language option)".to_string() } else { served.languages.join(", ") };
            return Err(error(400, format!("unknown language `{language}`; this model's languages: {known}"), Some("language"), None));
        }
        overrides.push(("language".to_string(), language));
    }
    let (events, receiver) = tokio::sync::mpsc::channel(32);
    Ok((Job { text: request.input, overrides, format, events, received }, format, receiver))
}

/// Queues the job and answers once the first audio (or an error) is there:
/// a failure before any audio gets its own status, one after it ends the
/// stream early (the client sees an incomplete transfer).
async fn start(
    state: &Arc<AppState>,
    id: &str,
    served: &Served,
    job: Job,
    format: ResponseFormat,
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
        Some(Event::Done) | None => return Err(failure(&Failure::internal("the synthesis ended without audio"))),
    };
    let metrics = state.metrics.clone();
    let stream = futures_util::stream::unfold((Some(first), events, false), move |(first, mut events, ended)| {
        let (metrics, label) = (metrics.clone(), label.clone());
        async move {
            if let Some(bytes) = first {
                return Some((Ok(Bytes::from(bytes)), (None, events, false)));
            }
            if ended {
                return None;
            }
            match events.recv().await {
                Some(Event::Audio(bytes)) => Some((Ok(Bytes::from(bytes)), (None, events, false))),
                Some(Event::Done) => {
                    metrics.latency.get_or_create(&label).observe(received.elapsed().as_secs_f64());
                    None
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
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(format.content_type()));
    let rate = if format == ResponseFormat::Pcm { super::encode::PCM_RATE } else { served.sample_rate };
    headers.insert("x-sample-rate", HeaderValue::from(rate));
    Ok(response)
}

async fn models(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let response = match unauthorized(&state, &headers).map(Err).unwrap_or_else(|| loaded(&state)) {
        Err(e) => e.into_response(),
        Ok(models) => {
            let data: Vec<_> = models.keys().map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "tts"})).collect();
            axum::Json(json!({"object": "list", "data": data})).into_response()
        }
    };
    counted(&state, "models", response)
}

#[derive(Deserialize)]
struct VoicesQuery {
    model: Option<String>,
}

/// The voices of one model (`?model=ID`, else the first): `default`, the
/// built-in ones, then the files of the voices directory.
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
        let mut voices: Vec<String> = std::iter::once("default".to_string()).chain(served.voices.iter().cloned()).collect();
        voices.extend(voice_files(&state).into_keys());
        Ok(axum::Json(json!({"model": id, "voices": voices, "languages": served.languages})).into_response())
    })()
    .unwrap_or_else(IntoResponse::into_response);
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
    counted(&state, "other", error(404, format!("no endpoint at {}", uri.path()), None, Some("not_found")).into_response())
}
