//! Streaming synthesis, the family side: a family's loop hands each final
//! piece of audio to a [`PieceSender`], which counts pieces and samples, skips
//! empty ones and remembers when the receiver asked to stop; it also carries
//! what the family reports of its work before a piece is ready
//! ([`PieceSender::progress`]). The same loop
//! serves one-shot synthesis ([`PieceSender::collecting`]) and the plugin ABI
//! ([`PieceSender::to_sink`]), so streamed pieces join to exactly the one-shot
//! samples.

use crate::abi::{AudioSink, ProgressSink, StageTiming, StreamSummary, TokenTrace};
use abi_stable::std_types::RVec;

/// Takes a piece; false: stop.
type Receiver<'a> = Box<dyn FnMut(&[f32]) -> bool + 'a>;
/// Takes (unit, done, limit or 0); false: stop.
type ProgressReceiver<'a> = Box<dyn FnMut(&str, u64, u64) -> bool + 'a>;

pub struct PieceSender<'a> {
    receiver: Receiver<'a>,
    progress: Option<ProgressReceiver<'a>>,
    pub pieces: u32,
    pub samples: u64,
    /// The receiver asked to stop: the family's loop should end.
    pub cancelled: bool,
}

impl<'a> PieceSender<'a> {
    /// Pieces to `receiver`, which returns false to stop.
    pub fn new(receiver: impl FnMut(&[f32]) -> bool + 'a) -> Self {
        PieceSender { receiver: Box::new(receiver), progress: None, pieces: 0, samples: 0, cancelled: false }
    }

    /// Progress reports to `progress` as well, which returns false to stop.
    pub fn with_progress(mut self, progress: impl FnMut(&str, u64, u64) -> bool + 'a) -> Self {
        self.progress = Some(Box::new(progress));
        self
    }

    /// Every piece appended to `samples`: one-shot synthesis.
    pub fn collecting(samples: &'a mut Vec<f32>) -> Self {
        Self::new(move |piece| {
            samples.extend_from_slice(piece);
            true
        })
    }

    /// Pieces to the host's sink at `sample_rate`.
    pub fn to_sink(sink: &'a AudioSink, sample_rate: u32) -> Self {
        Self::new(move |piece| sink.send(piece, sample_rate))
    }

    /// Pieces to the host's sink at `sample_rate`, progress to its progress
    /// sink (ABI 5.5).
    pub fn to_sinks(sink: &'a AudioSink, progress: &'a ProgressSink, sample_rate: u32) -> Self {
        Self::to_sink(sink, sample_rate).with_progress(move |unit, done, limit| progress.report(unit, done, limit))
    }

    /// A sender whose pieces go through `transform` (a time-stretch) to this
    /// one, and whose progress reports go straight to it.
    pub fn through<'b>(&'b mut self, mut transform: impl FnMut(&[f32]) -> Vec<f32> + 'b) -> PieceSender<'b> {
        let pieces = std::rc::Rc::new(std::cell::RefCell::new(self));
        let progress = std::rc::Rc::clone(&pieces);
        PieceSender::new(move |piece| {
            let piece = transform(piece);
            pieces.borrow_mut().send(&piece)
        })
        .with_progress(move |unit, done, limit| progress.borrow_mut().progress(unit, done, limit))
    }

    /// Reports that `done` of at most `limit` (0: no bound known) `unit`s of
    /// the coming piece are done; false once the receiver asked to stop, now
    /// or before. Nothing is reported after a stop, nor where no one listens.
    pub fn progress(&mut self, unit: &str, done: u64, limit: u64) -> bool {
        if !self.cancelled {
            if let Some(report) = self.progress.as_mut() {
                self.cancelled = !report(unit, done, limit);
            }
        }
        !self.cancelled
    }

    /// Hands on `piece` (an empty one is skipped); false once the receiver
    /// asked to stop, now or before.
    pub fn send(&mut self, piece: &[f32]) -> bool {
        if !self.cancelled && !piece.is_empty() {
            self.pieces += 1;
            self.samples += piece.len() as u64;
            self.cancelled = !(self.receiver)(piece);
        }
        !self.cancelled
    }

    /// The ABI's account of a streamed synthesis.
    pub fn summary(&self, sample_rate: u32, timings: RVec<StageTiming>, tokens: RVec<TokenTrace>) -> StreamSummary {
        StreamSummary { sample_rate, samples: self.samples, pieces: self.pieces, cancelled: self.cancelled, timings, tokens }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_counted_empty_ones_skipped_and_a_stop_sticks() {
        let mut got: Vec<Vec<f32>> = Vec::new();
        let mut sender = PieceSender::new(|p| {
            got.push(p.to_vec());
            got.len() < 2
        });
        assert!(sender.send(&[1.0, 2.0]));
        assert!(sender.send(&[]));
        assert!(!sender.send(&[3.0]), "the receiver's second piece asks to stop");
        assert!(!sender.send(&[4.0]), "nothing after a stop");
        assert_eq!((sender.pieces, sender.samples, sender.cancelled), (2, 3, true));
        drop(sender);
        assert_eq!(got, vec![vec![1.0, 2.0], vec![3.0]]);
    }

    #[test]
    fn a_progress_receiver_can_stop_the_loop_and_hears_nothing_after() {
        let mut reports = Vec::new();
        let mut sender = PieceSender::new(|_| true).with_progress(|unit, done, limit| {
            reports.push((unit.to_string(), done, limit));
            done < 2
        });
        assert!(sender.progress("tokens", 1, 10));
        assert!(!sender.progress("tokens", 2, 10), "the receiver's second report asks to stop");
        assert!(!sender.progress("tokens", 3, 10));
        assert!(!sender.send(&[1.0]), "no piece after a stop");
        assert_eq!((sender.pieces, sender.cancelled), (0, true));
        drop(sender);
        assert_eq!(reports, vec![("tokens".to_string(), 1, 10), ("tokens".to_string(), 2, 10)]);
        let mut quiet = PieceSender::new(|_| true);
        assert!(quiet.progress("tokens", 1, 0), "no listener: go on");
    }
}
