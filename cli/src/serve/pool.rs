//! A loaded model's workers: each owns a [`ModelSession`] on its own thread
//! and takes speech jobs from one bounded queue, streaming encoded audio back
//! to the request that waits for it.

use super::encode::{Encoder, ResponseFormat};
use super::metrics::{self, Metrics};
use engine_core::engine::{EngineError, ModelSession};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

pub struct Job {
    pub text: String,
    /// Synthesis options of this request (`voice`, `speed`, `language`).
    pub overrides: Vec<(String, String)>,
    pub format: ResponseFormat,
    pub events: mpsc::Sender<Event>,
    /// When the request arrived (time to first audio counts from here).
    pub received: Instant,
}

/// What a worker tells the waiting request, in order: audio (the first one
/// possibly empty: it says audio has started), then `Done` or `Failed`.
pub enum Event {
    Audio(Vec<u8>),
    /// The whole audio went out: its length in samples at the model's rate
    /// (for SSE's usage figures).
    Done {
        samples: u64,
        sample_rate: u32,
    },
    Failed(Failure),
}

/// An error as the API reports it.
#[derive(Debug, Clone)]
pub struct Failure {
    pub status: u16,
    pub message: String,
    pub param: Option<String>,
}

impl Failure {
    pub fn internal(message: impl Into<String>) -> Failure {
        Failure { status: 500, message: message.into(), param: None }
    }

    /// A synthesis error: one that names an option of this request, or text
    /// the model cannot speak (blank, or only characters it lacks), is the
    /// request's fault (400, which OpenAI's clients do not retry); anything
    /// else the server's (500).
    fn classify(message: &str, overrides: &[(String, String)]) -> Failure {
        let option = overrides.iter().map(|(k, _)| k).find(|k| message.contains(&format!("option `{k}`")) || message.contains(&format!("{k} must be")));
        // A voice file the model cannot read (another family's or variant's,
        // or a damaged one) is the request's choice, not a server fault.
        let voice_file = overrides.iter().any(|(k, _)| k == "voice") && message.contains("voice file");
        match option {
            Some(key) => Failure { status: 400, message: message.to_string(), param: Some(key.clone()) },
            None if voice_file => Failure { status: 400, message: message.to_string(), param: Some("voice".into()) },
            None if tts_serve_api::is_text_error(message) => Failure { status: 400, message: message.to_string(), param: Some("input".into()) },
            None => Failure::internal(format!("synthesis failed: {message}")),
        }
    }
}

pub struct Pool {
    jobs: crossbeam_channel::Sender<Job>,
    workers: Vec<JoinHandle<()>>,
}

/// How a worker hands events to the request waiting for them.
#[derive(Clone)]
struct Sender {
    /// Longest wait for room in a job's event channel.
    timeout: Duration,
    /// The server's runtime, whose timer bounds that wait.
    runtime: tokio::runtime::Handle,
}

impl Sender {
    /// Sends `event` to the job's request; false when the client has gone,
    /// or has not taken audio for the send timeout: a client that never
    /// reads would otherwise hold this worker (with `--workers 1`, the
    /// model) for as long as it stays connected.
    fn send(&self, job: &Job, event: Event) -> bool {
        // The timer is made inside `block_on`: it needs the runtime's context.
        match self.runtime.block_on(async { tokio::time::timeout(self.timeout, job.events.send(event)).await }) {
            Ok(sent) => sent.is_ok(),
            Err(_) => {
                tracing::debug!("the client took no audio for {} s; cancelling its synthesis", self.timeout.as_secs_f64());
                false
            }
        }
    }
}

impl Pool {
    /// One worker thread per session, all fed from a queue of `queue` jobs;
    /// each waits at most `send_timeout` for its client to take audio.
    pub fn start(
        id: &str,
        sessions: Vec<ModelSession>,
        queue: usize,
        send_timeout: Duration,
        runtime: tokio::runtime::Handle,
        metrics: Arc<Metrics>,
    ) -> Result<Pool, String> {
        let (jobs, receiver) = crossbeam_channel::bounded::<Job>(queue);
        // The model's gauges exist at 0 from the start, not from its first
        // request: an autoscaler reading queue depth from an idle replica
        // must see 0, not no data (which Kubernetes' HPA takes as a reason
        // never to scale down).
        let label = metrics::model(id);
        metrics.queue_depth.get_or_create(&label).set(0);
        metrics.busy_workers.get_or_create(&label).set(0);
        let sender = Sender { timeout: send_timeout, runtime };
        let mut workers = Vec::new();
        for (i, session) in sessions.into_iter().enumerate() {
            let (receiver, metrics, model, sender) = (receiver.clone(), metrics.clone(), id.to_string(), sender.clone());
            let worker = std::thread::Builder::new()
                .name(format!("tts-{id}-{i}"))
                .spawn(move || work(&model, session, receiver, &sender, &metrics))
                .map_err(|e| format!("starting a worker for {id}: {e}"))?;
            workers.push(worker);
        }
        Ok(Pool { jobs, workers })
    }

    /// Queues `job`; gives it back when the queue is full.
    pub fn submit(&self, job: Job) -> Result<(), Job> {
        self.jobs.try_send(job).map_err(|e| e.into_inner())
    }

    /// Lets the workers finish what is queued, then joins them.
    pub fn stop(self) {
        let Pool { jobs, workers } = self;
        drop(jobs);
        for w in workers {
            let _ = w.join();
        }
    }
}

fn work(id: &str, mut session: ModelSession, jobs: crossbeam_channel::Receiver<Job>, sender: &Sender, metrics: &Metrics) {
    let label = metrics::model(id);
    for job in jobs.iter() {
        metrics.queue_depth.get_or_create(&label).dec();
        if job.events.is_closed() {
            // The client went away while the job waited.
            metrics.cancelled.get_or_create(&label).inc();
            continue;
        }
        metrics.busy_workers.get_or_create(&label).inc();
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| synthesize(&mut session, &job, sender, metrics, &label)));
        metrics.busy_workers.get_or_create(&label).dec();
        let last = match outcome {
            Ok(event) => event,
            Err(_) => {
                tracing::error!(model = id, "a worker panicked during synthesis; it goes on with the next request");
                Some(Event::Failed(Failure::internal("internal error during synthesis")))
            }
        };
        if let Some(event) = last {
            // All audio went out, but a client that stalled before taking the
            // end did not get a whole response: that is a cancellation too.
            let done = matches!(event, Event::Done { .. });
            if !sender.send(&job, event) && done {
                metrics.cancelled.get_or_create(&label).inc();
            }
        }
    }
}

/// Runs one job, sending audio as it is encoded; returns the last event to
/// send (None when the client has gone or stalled).
fn synthesize(session: &mut ModelSession, job: &Job, sender: &Sender, metrics: &Metrics, label: &metrics::ModelLabel) -> Option<Event> {
    let mut encoder = Encoder::new(job.format);
    let (mut started, gone, mut samples) = (false, std::cell::Cell::new(false), 0u64);
    // Checked on every progress report too: a client that leaves while
    // Chatterbox's T3 generates stops it there, not at the chunk's audio.
    let on_progress = |_: &engine_core::engine::Progress<'_>| {
        gone.set(job.events.is_closed());
        !gone.get()
    };
    let result = session.synthesize_observed(
        &job.text,
        &job.overrides,
        |piece, rate| {
            // Checked on every piece, not only when bytes go out: FLAC sends
            // nothing until the end (and MP3 not while a frame fills), so a send
            // alone would not notice a client that left.
            if job.events.is_closed() {
                gone.set(true);
                return Ok(false);
            }
            let bytes = encoder.piece(piece, rate).map_err(EngineError)?;
            samples += piece.len() as u64;
            if !started {
                metrics.first_audio.get_or_create(label).observe(job.received.elapsed().as_secs_f64());
            }
            if (!started || !bytes.is_empty()) && !sender.send(job, Event::Audio(bytes)) {
                gone.set(true);
                return Ok(false);
            }
            started = true;
            Ok(true)
        },
        on_progress,
    );
    match result {
        Ok(summary) if gone.get() || summary.cancelled => {
            metrics.cancelled.get_or_create(label).inc();
            None
        }
        Ok(summary) => {
            metrics.audio_seconds.get_or_create(label).inc_by(samples as f64 / summary.sample_rate.max(1) as f64);
            let done = Event::Done { samples, sample_rate: summary.sample_rate };
            match encoder.finish(summary.sample_rate) {
                Ok(tail) if !tail.is_empty() || !started => match sender.send(job, Event::Audio(tail)) {
                    true => Some(done),
                    false => {
                        metrics.cancelled.get_or_create(label).inc();
                        None
                    }
                },
                Ok(_) => Some(done),
                Err(e) => Some(Event::Failed(Failure::internal(e))),
            }
        }
        Err(e) => Some(Event::Failed(Failure::classify(&e.0, &job.overrides))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn option_errors_are_the_requests_fault_and_others_the_servers() {
        let set = vec![("speed".to_string(), "3".to_string())];
        let f = Failure::classify("supertonic: speed must be in 0.5..=2.0, got 3", &set);
        assert_eq!((f.status, f.param.as_deref()), (400, Some("speed")));
        let f = Failure::classify("option `speed`: `x` is not a float", &set);
        assert_eq!((f.status, f.param.as_deref()), (400, Some("speed")));
        let f = Failure::classify("text is empty", &[]);
        assert_eq!((f.status, f.param.as_deref()), (400, Some("input")));
        let f = Failure::classify("unsupported characters for this model: '☃' (U+2603) (set unsupported_chars = \"skip\" to leave them out)", &[]);
        assert_eq!((f.status, f.param.as_deref()), (400, Some("input")));
        let voice = vec![("voice".to_string(), "/v/mine.json".to_string())];
        let f = Failure::classify("supertonic: voice file /v/mine.json: not a voice style JSON (expected value at line 1 column 1)", &voice);
        assert_eq!((f.status, f.param.as_deref()), (400, Some("voice")));
        let f = Failure::classify("ggml: out of memory", &set);
        assert_eq!((f.status, f.message.as_str()), (500, "synthesis failed: ggml: out of memory"));
    }
}
