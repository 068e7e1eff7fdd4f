//! `/metrics` in Prometheus' text format.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabel {
    pub model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub endpoint: String,
    pub status: u16,
}

type Seconds = Family<ModelLabel, Histogram, fn() -> Histogram>;

pub struct Metrics {
    registry: Registry,
    /// Every response by endpoint and status.
    pub requests: Family<RequestLabels, Counter>,
    /// Speech requests from arrival to the last byte handed to the connection.
    pub latency: Seconds,
    /// Speech requests from arrival to the first audio (queue wait included).
    pub first_audio: Seconds,
    /// Speech requests waiting for a worker.
    pub queue_depth: Family<ModelLabel, Gauge>,
    /// Workers synthesizing now.
    pub busy_workers: Family<ModelLabel, Gauge>,
    pub audio_seconds: Family<ModelLabel, Counter<f64, AtomicU64>>,
    /// Syntheses stopped because the client went away.
    pub cancelled: Family<ModelLabel, Counter>,
    /// Client connections open now.
    pub connections: Gauge,
    /// Connections closed at once because `--max-connections` were open.
    pub refused_connections: Counter,
}

fn seconds_histogram() -> Histogram {
    // 5 ms .. ~82 s.
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("tts");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency: Seconds = Family::new_with_constructor(seconds_histogram);
        let first_audio: Seconds = Family::new_with_constructor(seconds_histogram);
        let queue_depth = Family::<ModelLabel, Gauge>::default();
        let busy_workers = Family::<ModelLabel, Gauge>::default();
        let audio_seconds = Family::<ModelLabel, Counter<f64, AtomicU64>>::default();
        let cancelled = Family::<ModelLabel, Counter>::default();
        registry.register("http_requests", "HTTP responses by endpoint and status", requests.clone());
        registry.register("speech_latency_seconds", "speech requests, arrival to last byte", latency.clone());
        registry.register("speech_time_to_first_audio_seconds", "speech requests, arrival to first audio", first_audio.clone());
        registry.register("queue_depth", "speech requests waiting for a worker", queue_depth.clone());
        registry.register("busy_workers", "workers synthesizing", busy_workers.clone());
        registry.register("audio_seconds", "seconds of audio produced", audio_seconds.clone());
        registry.register("cancelled_syntheses", "syntheses stopped because the client went away", cancelled.clone());
        let connections = Gauge::default();
        let refused_connections = Counter::default();
        registry.register("open_connections", "client connections open", connections.clone());
        registry.register("refused_connections", "connections closed at once because --max-connections were open", refused_connections.clone());
        Metrics { registry, requests, latency, first_audio, queue_depth, busy_workers, audio_seconds, cancelled, connections, refused_connections }
    }

    pub fn count(&self, endpoint: &str, status: u16) {
        self.requests.get_or_create(&RequestLabels { endpoint: endpoint.into(), status }).inc();
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

pub fn model(id: &str) -> ModelLabel {
    ModelLabel { model: id.to_string() }
}
