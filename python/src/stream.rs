//! `tts.Stream`: one synthesis on a thread of its own, its pieces handed to
//! Python through a bounded channel. The model waits while Python has not
//! taken the pieces already made, so a slow reader holds little audio; a
//! closed stream stops the synthesis at its next piece.

use crate::engine::{lock, SharedModel};
use crate::tts_error;
use numpy::PyArray1;
use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Pieces made ahead of the reader.
const PIECES_AHEAD: usize = 4;

/// What the synthesis thread sends.
enum Message {
    Piece(Vec<f32>),
    Failed(String),
}

/// An iterator over the float32 arrays of one synthesis
/// ([`crate::engine::Engine::stream`]).
#[pyclass(module = "tts", frozen)]
pub struct Stream {
    /// None once the stream is closed or ended.
    pieces: Mutex<Option<Receiver<Message>>>,
    cancelled: Arc<AtomicBool>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl Stream {
    pub(crate) fn start(model: SharedModel, text: String, set: Vec<(String, String)>) -> Stream {
        let (sender, receiver) = sync_channel(PIECES_AHEAD);
        let cancelled = Arc::new(AtomicBool::new(false));
        let stop = cancelled.clone();
        let worker = std::thread::spawn(move || synthesize(&model, &text, &set, &sender, &stop));
        Stream { pieces: Mutex::new(Some(receiver)), cancelled, worker: Mutex::new(Some(worker)) }
    }

    /// Stops the synthesis and forgets its pieces; the synthesis thread ends
    /// at its next piece (a send to a dropped receiver fails).
    fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
        if let Ok(mut pieces) = self.pieces.lock() {
            pieces.take();
        }
    }
}

/// The synthesis thread: each piece to the channel; a failure as the last
/// message unless the stream was closed (then nobody reads it).
fn synthesize(model: &SharedModel, text: &str, set: &[(String, String)], sender: &SyncSender<Message>, cancelled: &AtomicBool) {
    let result = lock(model).and_then(|mut loaded| {
        // Closed while it waited for the model (another text was being made).
        if cancelled.load(Ordering::SeqCst) {
            return Ok(());
        }
        loaded
            .session
            .synthesize_streaming_with(text, set, |piece, _rate| {
                if cancelled.load(Ordering::SeqCst) {
                    return Ok(false);
                }
                Ok(sender.send(Message::Piece(piece.to_vec())).is_ok())
            })
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    if let Err(e) = result {
        let _ = sender.send(Message::Failed(e));
    }
}

#[pymethods]
impl Stream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next piece, waiting (GIL released) while the model makes it.
    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyArray1<f32>>>> {
        let next = py.detach(|| -> Option<Message> {
            let pieces = self.pieces.lock().ok()?;
            pieces.as_ref()?.recv().ok()
        });
        match next {
            Some(Message::Piece(samples)) => Ok(Some(PyArray1::from_vec(py, samples))),
            Some(Message::Failed(e)) => {
                self.cancel();
                Err(tts_error(e))
            }
            // The synthesis ended (its sender is gone) or the stream was closed.
            None => {
                self.cancel();
                Ok(None)
            }
        }
    }

    /// Stops the synthesis and waits (GIL released) until the engine is
    /// free for the next text. Closing a closed or ended stream does nothing.
    fn close(&self, py: Python<'_>) {
        self.cancel();
        let worker = self.worker.lock().ok().and_then(|mut w| w.take());
        if let Some(worker) = worker {
            // A panic there already reached Python as the stream's error.
            py.detach(|| {
                let _ = worker.join();
            });
        }
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }
}

impl Drop for Stream {
    /// A stream dropped unread stops its synthesis without waiting for it.
    fn drop(&mut self) {
        self.cancel();
    }
}
