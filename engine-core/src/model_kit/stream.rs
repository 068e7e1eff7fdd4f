//! Streaming synthesis, the family side: a family's loop hands each final
//! piece of audio to a [`PieceSender`], which counts pieces and samples, skips
//! empty ones and remembers when the receiver asked to stop. The same loop
//! serves one-shot synthesis ([`PieceSender::collecting`]) and the plugin ABI
//! ([`PieceSender::to_sink`]), so streamed pieces join to exactly the one-shot
//! samples.

use crate::abi::{AudioSink, StageTiming, StreamSummary, TokenTrace};
use abi_stable::std_types::RVec;

/// Takes a piece; false: stop.
type Receiver<'a> = Box<dyn FnMut(&[f32]) -> bool + 'a>;

pub struct PieceSender<'a> {
    receiver: Receiver<'a>,
    pub pieces: u32,
    pub samples: u64,
    /// The receiver asked to stop: the family's loop should end.
    pub cancelled: bool,
}

impl<'a> PieceSender<'a> {
    /// Pieces to `receiver`, which returns false to stop.
    pub fn new(receiver: impl FnMut(&[f32]) -> bool + 'a) -> Self {
        PieceSender { receiver: Box::new(receiver), pieces: 0, samples: 0, cancelled: false }
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
}
