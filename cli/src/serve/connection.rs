//! The accept loop under the router: a cap on open connections, hyper's
//! header timeout on each, and a drain bounded by the grace period. axum's own
//! `serve` has neither timeouts nor a cap, so a few thousand clients that send
//! nothing could hold every descriptor (docs/server.md, "Limits").

use super::api::AppState;
use super::Limits;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

/// hyper's buffer for one connection's reads (its default is ~400 KiB): a
/// request head must fit, and bodies stream through it.
const READ_BUFFER: usize = 64 << 10;

/// Serves until SIGINT or SIGTERM, then drains within `limits.shutdown_grace`.
pub async fn serve(listener: TcpListener, app: Router, state: Arc<AppState>, limits: Limits) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).max_buf_size(READ_BUFFER);
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let (stop, stopping) = watch::channel(false);
    let mut connections = JoinSet::new();
    let signal = super::shutdown(state.clone());
    tokio::pin!(signal);
    loop {
        tokio::select! {
            _ = &mut signal => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of descriptors or memory, or the peer left
                        // before the accept: wait a little rather than spin.
                        tracing::warn!("accepting a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    refuse(stream, limits.max_connections);
                    state.metrics.refused_connections.inc();
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let connection = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
                let (mut stopping, state) = (stopping.clone(), state.clone());
                connections.spawn(async move {
                    let _permit = permit;
                    state.metrics.connections.inc();
                    tokio::pin!(connection);
                    tokio::select! {
                        _ = connection.as_mut() => {}
                        _ = stopping.changed() => {
                            // No more requests on this connection; the one
                            // under way (if any) may finish.
                            connection.as_mut().graceful_shutdown();
                            let _ = connection.await;
                        }
                    }
                    state.metrics.connections.dec();
                });
            }
        }
    }
    drop(listener);
    let _ = stop.send(true);
    let open = connections.len();
    let drained = tokio::time::timeout(limits.shutdown_grace, async { while connections.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!("{} of {open} connection(s) still open {} s after the signal; closing them", connections.len(), limits.shutdown_grace.as_secs_f64());
        connections.shutdown().await;
    }
}

/// Answers a connection over the cap with 503 and closes it, without waiting
/// on the client: whatever fits the socket's buffer now is sent.
fn refuse(stream: TcpStream, cap: usize) {
    let e = tts_serve_api::ApiError::new(503, format!("the server holds its maximum of {cap} connections; retry shortly"), None, Some("too_many_connections"));
    let body = e.body().to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(response.as_bytes());
}
