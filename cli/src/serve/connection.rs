//! The accept loop under the router: a cap on open connections, a watchdog
//! with header, keep-alive idle and send timeouts on each, and a drain
//! bounded by the grace period. axum's own `serve` has neither timeouts nor a cap, so a
//! few thousand clients that send nothing could hold every descriptor
//! (docs/server.md, "Limits").

use super::api::AppState;
use super::Limits;
use axum::body::Body;
use axum::Router;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

/// hyper's buffer for one connection's reads (its default is ~400 KiB): a
/// request head must fit, and bodies stream through it.
const READ_BUFFER: usize = 64 << 10;

/// Where one connection stands, for its watchdog: hyper alone cannot tell a
/// kept-alive connection waiting for its next request (the idle timeout) from
/// one sending a head slowly (the header timeout): its one timer runs from the
/// end of the previous response.
struct Activity {
    state: Mutex<ActivityState>,
}

struct ActivityState {
    /// Requests under way (head read, response not yet sent whole).
    busy: usize,
    /// When the connection last had no request under way.
    idle_since: Instant,
    /// When the head of the next request began: the first byte after the
    /// connection went idle (a new connection counts from its opening).
    head_since: Option<Instant>,
    /// Since when the socket has taken nothing of a write (the client reads
    /// nothing and the kernel's buffers are full).
    stalled_since: Option<Instant>,
}

impl Activity {
    fn new() -> Arc<Activity> {
        let now = Instant::now();
        Arc::new(Activity { state: Mutex::new(ActivityState { busy: 0, idle_since: now, head_since: Some(now), stalled_since: None }) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ActivityState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes arrived.
    fn read(&self) {
        let mut s = self.lock();
        if s.busy == 0 && s.head_since.is_none() {
            s.head_since = Some(Instant::now());
        }
    }

    /// A write was tried: `took` whether the socket took any of it.
    fn wrote(&self, took: bool) {
        let mut s = self.lock();
        match (took, s.stalled_since) {
            (true, _) => s.stalled_since = None,
            (false, None) => s.stalled_since = Some(Instant::now()),
            (false, Some(_)) => {}
        }
    }

    /// A request's head is in; the request is under way until the returned
    /// guard (kept by its response body) is dropped.
    fn begin(self: &Arc<Self>) -> Busy {
        let mut s = self.lock();
        s.busy += 1;
        s.head_since = None;
        Busy(self.clone())
    }

    /// Which timeout, if any, has run out.
    fn expired(&self, limits: &Limits) -> Option<&'static str> {
        let s = self.lock();
        match (s.busy, s.head_since) {
            // A response under way that the client has not read from for the
            // send timeout: its worker gave up on it (or is about to), and the
            // connection would otherwise stay open as long as the client does.
            (1.., _) if s.stalled_since.is_some_and(|t| t.elapsed() >= limits.send_timeout) => Some("send"),
            (0, Some(t)) if t.elapsed() >= limits.header_timeout => Some("header"),
            (0, None) if s.idle_since.elapsed() >= limits.idle_timeout => Some("idle"),
            _ => None,
        }
    }
}

struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.busy = s.busy.saturating_sub(1);
        if s.busy == 0 {
            s.idle_since = Instant::now();
            s.head_since = None;
        }
    }
}

/// The client's socket, telling its [`Activity`] when bytes arrive.
struct Watched {
    io: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read();
        }
        polled
    }
}

impl Watched {
    fn note(&self, polled: &Poll<std::io::Result<usize>>) {
        match polled {
            Poll::Ready(Ok(n)) => self.activity.wrote(*n > 0),
            Poll::Pending => self.activity.wrote(false),
            Poll::Ready(Err(_)) => {}
        }
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.note(&polled);
        polled
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.note(&polled);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// How often a connection's watchdog looks: a quarter of the shortest
/// timeout, within 20 ms..=1 s.
fn tick(limits: &Limits) -> Duration {
    (limits.header_timeout.min(limits.idle_timeout).min(limits.send_timeout) / 4).clamp(Duration::from_millis(20), Duration::from_secs(1))
}

/// Serves until SIGINT or SIGTERM, then drains within `limits.shutdown_grace`.
pub async fn serve(listener: TcpListener, app: Router, state: Arc<AppState>, limits: Limits) {
    let mut http = hyper::server::conn::http1::Builder::new();
    // hyper's own header timer (from the end of the previous response) stays
    // as a backstop behind the watchdog, which enforces the two timeouts.
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout + limits.idle_timeout).max_buf_size(READ_BUFFER);
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
                let activity = Activity::new();
                let service = {
                    let (router, activity) = (TowerToHyperService::new(app.clone()), activity.clone());
                    hyper::service::service_fn(move |request| {
                        let busy = activity.begin();
                        let response = hyper::service::Service::call(&router, request);
                        async move {
                            let response = response.await?;
                            // Busy until hyper drops the body, its last byte sent.
                            Ok::<_, std::convert::Infallible>(response.map(move |body| {
                                Body::new(body.map_frame(move |frame| {
                                    let _busy = &busy;
                                    frame
                                }))
                            }))
                        }
                    })
                };
                let connection = http.serve_connection(TokioIo::new(Watched { io: stream, activity: activity.clone() }), service);
                let (mut stopping, state) = (stopping.clone(), state.clone());
                connections.spawn(async move {
                    let _permit = permit;
                    state.metrics.connections.inc();
                    tokio::pin!(connection);
                    let mut watchdog = tokio::time::interval(tick(&limits));
                    watchdog.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    loop {
                        tokio::select! {
                            _ = connection.as_mut() => break,
                            _ = watchdog.tick() => {
                                if let Some(which) = activity.expired(&limits) {
                                    // Dropping the connection closes the socket.
                                    tracing::debug!("closing a connection: its {which} timeout ran out");
                                    break;
                                }
                            }
                            _ = stopping.changed() => {
                                // No more requests on this connection; the one
                                // under way (if any) may finish.
                                connection.as_mut().graceful_shutdown();
                                let _ = connection.as_mut().await;
                                break;
                            }
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
