//! `tts serve`: models loaded once behind the OpenAI speech API
//! (`POST /v1/audio/speech`, `GET /v1/models`, `GET /v1/models/{id}`), plus
//! `GET /v1/audio/voices`, `GET /health`, `GET /metrics` and CORS for
//! browsers. Each profile is one model; each model has
//! `workers` sessions fed from one bounded queue. docs/server.md.

mod api;
mod connection;
mod encode;
mod metrics;
mod page;
mod pool;

pub use api::Cors;

use engine_core::engine::Engine;
use indexmap::IndexMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

pub struct ServeOptions {
    pub listen: SocketAddr,
    pub workers: usize,
    pub queue: usize,
    /// Checked non-empty by the command line; refused here too.
    pub api_key: Option<String>,
    pub voices_dir: Option<PathBuf>,
    pub max_input_chars: usize,
    /// Synthesis options over every profile's `[synthesis]` (`--set`).
    pub set: Vec<(String, String)>,
    /// `limits.max_connections` is the default, not the user's choice: it
    /// shrinks to fit the open-file limit instead of refusing to start.
    pub max_connections_default: bool,
    pub limits: Limits,
    /// Origins browsers may call from (`--cors-origin`).
    pub cors: api::Cors,
}

/// What one client may hold of the server, and for how long.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// For a request's head, from its first byte (a new connection's first
    /// head: from the opening).
    pub header_timeout: Duration,
    /// Between a response's end and the first byte of the next request on a
    /// kept-alive connection.
    pub idle_timeout: Duration,
    /// For a speech request's whole body, from the end of its head.
    pub body_timeout: Duration,
    /// For the client to take the next piece of a response: past it the
    /// synthesis is cancelled, its worker freed and the connection closed.
    pub send_timeout: Duration,
    /// Connections open at once; more are answered 503 and closed.
    pub max_connections: usize,
    /// How long a drain waits for open connections before closing them.
    pub shutdown_grace: Duration,
}

/// `GET URL/health` (`tts health`): Ok on 200; else the status and what it
/// means, or why no answer came. No proxy: the server probed is usually this
/// host's own.
pub fn probe_health(url: &str, timeout: Duration) -> Result<(), String> {
    let base = url.trim_end_matches('/');
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        return Err(format!("--url {url}: not an http:// or https:// URL"));
    }
    let agent = ureq2::AgentBuilder::new().timeout(timeout).redirects(0).build();
    let health = format!("{base}/health");
    match agent.get(&health).call() {
        Ok(answer) if answer.status() == 200 => Ok(()),
        Ok(answer) => Err(format!("{health}: {} {}", answer.status(), answer.status_text())),
        Err(ureq2::Error::Status(503, _)) => Err(format!("{health}: 503, not ready (loading its models or draining)")),
        Err(ureq2::Error::Status(code, answer)) => Err(format!("{health}: {code} {}", answer.status_text())),
        Err(ureq2::Error::Transport(t)) => {
            // ureq names the URL itself; once is enough.
            let said = t.to_string();
            let said = said.strip_prefix(&format!("{health}: ")).unwrap_or(&said);
            Err(format!("{health}: {}", engine_core::logging::escape(said)))
        }
    }
}

/// A profile to serve: the model id requests name, and its opened engine.
pub struct ModelSource {
    pub id: String,
    pub engine: Engine,
    /// The profile's `[server.voices]`: (OpenAI voice name, this model's
    /// voice), the names already checked against OpenAI's.
    pub openai_voices: Vec<(String, String)>,
}

/// Binds, answers `/health` with 503 while the models load, serves until
/// SIGINT or SIGTERM, then drains: the listener closes, new requests get 503,
/// those under way have `shutdown_grace` to finish before their connections
/// are closed, and the workers finish (or drop, if their client is gone)
/// their queues.
pub fn run(sources: Vec<ModelSource>, options: ServeOptions, quiet: bool) -> Result<(), String> {
    // The command line checked workers, queue and the voices directory.
    let api_key = options.api_key.as_deref().map(tts_serve_api::ApiKey::new).transpose().map_err(|e| format!("--api-key: {e}"))?;
    if api_key.is_none() && !options.listen.ip().is_loopback() {
        tracing::warn!("listening on {} with no API key: anyone who can reach this address may use the server (set --api-key or TTS_API_KEY)", options.listen);
    }
    let mut limits = options.limits;
    limits.max_connections = fit_fd_limit(limits.max_connections, options.max_connections_default)?;
    let listener = std::net::TcpListener::bind(options.listen).map_err(|e| format!("binding {}: {e}", options.listen))?;
    listener.set_nonblocking(true).map_err(|e| format!("{}: {e}", options.listen))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    let state = Arc::new(api::AppState {
        models: OnceLock::new(),
        draining: Default::default(),
        metrics: Arc::new(metrics::Metrics::new()),
        api_key,
        voices_dir: options.voices_dir.clone(),
        max_input_chars: options.max_input_chars,
        body_timeout: limits.body_timeout,
        cors: options.cors.clone(),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(|e| format!("starting the runtime: {e}"))?;
    let server = {
        let state = state.clone();
        let app = api::router(state.clone());
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| e.to_string())?;
            connection::serve(listener, app, state, limits).await;
            Ok::<(), String>(())
        })
    };
    if !quiet {
        eprintln!("listening on http://{address} (loading {} model(s))", sources.len());
    }

    let mut served = IndexMap::new();
    for source in &sources {
        let mut sessions = Vec::new();
        for _ in 0..options.workers {
            sessions.push(source.engine.open_model(&options.set).map_err(|e| format!("model {}: {e}", source.id))?);
        }
        let first = &sessions[0];
        let catalog = first.catalog();
        let voices: Vec<String> = catalog.voices.iter().map(|v| v.to_string()).collect();
        let openai_voices =
            openai_voice_table(&voices, &source.openai_voices, options.voices_dir.as_deref()).map_err(|e| format!("model {}: {e}", source.id))?;
        let model = api::Served {
            family: first.info.family.to_string(),
            variant: first.info.variant.to_string(),
            voices,
            openai_voices,
            languages: catalog.languages.iter().map(|l| l.to_string()).collect(),
            options: first.option_specs().iter().map(|s| s.key.to_string()).collect(),
            sample_rate: first.info.sample_rate,
            pool: pool::Pool::start(&source.id, sessions, options.queue, limits.send_timeout, runtime.handle().clone(), state.metrics.clone())?,
        };
        served.insert(source.id.clone(), model);
    }
    state.models.set(served).map_err(|_| "the models were set twice".to_string())?;
    if !quiet {
        let ids: Vec<&str> = sources.iter().map(|s| s.id.as_str()).collect();
        eprintln!("ready: {} ({} worker(s) each, queue {})", ids.join(", "), options.workers, options.queue);
    }
    let outcome = runtime.block_on(server).map_err(|e| format!("the server stopped: {e}"))?;
    // Every request has been answered; let the workers finish and go.
    let state = Arc::try_unwrap(state).ok();
    if let Some(models) = state.and_then(|s| s.models.into_inner()) {
        for (_, m) in models {
            m.pool.stop();
        }
    }
    drop(sources);
    if !quiet {
        eprintln!("stopped");
    }
    outcome
}

/// Each OpenAI voice name and the voice of a model it speaks with: the
/// profile's choice (`overrides`), else the default built-in voice where the
/// model has it, else the model's default voice (`default`). A profile's
/// choice must be a built-in voice, `default`, or a voice file's NAME in the
/// voices directory.
fn openai_voice_table(builtins: &[String], overrides: &[(String, String)], voices_dir: Option<&std::path::Path>) -> Result<IndexMap<String, String>, String> {
    let mut table = IndexMap::new();
    for (name, voice) in tts_serve_api::OPENAI_VOICE_DEFAULTS {
        let voice = if builtins.iter().any(|v| v == voice) { voice } else { "default" };
        table.insert(name.to_string(), voice.to_string());
    }
    for (name, voice) in overrides {
        let is_file = voices_dir.is_some_and(|d| ["voice", "json"].iter().any(|ext| d.join(format!("{voice}.{ext}")).is_file()));
        let plain = !voice.is_empty() && !voice.contains(['/', '\\']) && voice != "." && voice != "..";
        if !(voice == "default" || builtins.contains(voice) || (plain && is_file)) {
            let known = if builtins.is_empty() { "default".to_string() } else { format!("default, {}", builtins.join(", ")) };
            return Err(format!("[server.voices] {name} = \"{voice}\": not a voice of this model ({known}) nor a file of --voices-dir"));
        }
        table.insert(name.clone(), voice.clone());
    }
    Ok(table)
}

/// The connection cap that fits the hard limit on open descriptors
/// (`tts_serve_api::connection_cap`: the default shrinks with a warning, a
/// chosen number that does not fit is refused), with the soft limit raised
/// to match: each connection holds one descriptor, and at the limit `accept`
/// fails for everyone, `/health` included.
fn fit_fd_limit(max_connections: usize, default: bool) -> Result<usize, String> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit write and read the struct given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(format!("reading the open-file limit: {}", std::io::Error::last_os_error()));
    }
    let hard = (limit.rlim_max != libc::RLIM_INFINITY).then_some(limit.rlim_max);
    let (cap, warning) = tts_serve_api::connection_cap((!default).then_some(max_connections), hard)?;
    if let Some(w) = warning {
        tracing::warn!("{w}");
    }
    let needed: libc::rlim_t = (cap as u64).saturating_add(tts_serve_api::FD_RESERVE);
    if limit.rlim_cur != libc::RLIM_INFINITY && limit.rlim_cur < needed {
        limit.rlim_cur = needed;
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return Err(format!("raising the open-file limit to {needed}: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(cap)
}

/// Waits for SIGINT or SIGTERM, then marks the server as draining.
async fn shutdown(state: Arc<api::AppState>) {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("cannot watch SIGTERM: {e}");
            return std::future::pending().await;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("draining: new requests get 503, those under way finish");
    state.draining.store(true, Ordering::Relaxed);
}
