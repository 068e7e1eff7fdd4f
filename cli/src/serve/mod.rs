//! `tts serve`: models loaded once behind the OpenAI speech API
//! (`POST /v1/audio/speech`, `GET /v1/models`), plus `GET /v1/audio/voices`,
//! `GET /health` and `GET /metrics`. Each profile is one model; each model has
//! `workers` sessions fed from one bounded queue. docs/server.md.

mod api;
mod encode;
mod metrics;
mod pool;

use engine_core::engine::Engine;
use indexmap::IndexMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

pub struct ServeOptions {
    pub listen: SocketAddr,
    pub workers: usize,
    pub queue: usize,
    pub api_key: Option<String>,
    pub voices_dir: Option<PathBuf>,
    pub max_input_chars: usize,
    /// Synthesis options over every profile's `[synthesis]` (`--set`).
    pub set: Vec<(String, String)>,
}

/// A profile to serve: the model id requests name, and its opened engine.
pub struct ModelSource {
    pub id: String,
    pub engine: Engine,
}

/// Binds, answers `/health` with 503 while the models load, serves until
/// SIGINT or SIGTERM, then drains: new requests get 503, those under way
/// finish, and the workers finish their queues.
pub fn run(sources: Vec<ModelSource>, options: ServeOptions, quiet: bool) -> Result<(), String> {
    // The command line checked workers, queue and the voices directory.
    let listener = std::net::TcpListener::bind(options.listen).map_err(|e| format!("binding {}: {e}", options.listen))?;
    listener.set_nonblocking(true).map_err(|e| format!("{}: {e}", options.listen))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    let state = Arc::new(api::AppState {
        models: OnceLock::new(),
        draining: Default::default(),
        metrics: Arc::new(metrics::Metrics::new()),
        api_key: options.api_key.clone(),
        voices_dir: options.voices_dir.clone(),
        max_input_chars: options.max_input_chars,
    });
    // Four bytes per character at most, plus room for the other fields.
    let body_limit = options.max_input_chars.saturating_mul(4).saturating_add(64 << 10);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(|e| format!("starting the runtime: {e}"))?;
    let server = {
        let state = state.clone();
        let app = api::router(state.clone(), body_limit);
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| e.to_string())?;
            axum::serve(listener, app).with_graceful_shutdown(shutdown(state)).await.map_err(|e| format!("serving: {e}"))
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
        let model = api::Served {
            voices: catalog.voices.iter().map(|v| v.to_string()).collect(),
            languages: catalog.languages.iter().map(|l| l.to_string()).collect(),
            options: first.option_specs().iter().map(|s| s.key.to_string()).collect(),
            sample_rate: first.info.sample_rate,
            pool: pool::Pool::start(&source.id, sessions, options.queue, state.metrics.clone())?,
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
