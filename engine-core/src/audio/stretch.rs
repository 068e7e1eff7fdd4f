//! Pitch-preserving time-stretch (WSOLA: waveform-similarity overlap-add),
//! for the `speed` option of families whose model cannot change its speaking
//! rate itself (Chatterbox) or not as far as asked (Supertonic beyond its
//! native range).
//!
//! Frames of 30 ms are laid down every 15 ms of output under a Hann window
//! (two of them sum to one), and taken from the input every `15 ms · speed`:
//! the spacing changes the duration, the untouched samples inside each frame
//! keep the pitch. Each frame's start is moved by up to ±12.5 ms (one period
//! of an 80 Hz voice) to where the input looks most like the natural
//! continuation of the frame before it (normalised cross-correlation over the
//! overlap), so the overlap adds waveforms in phase instead of beating.
//!
//! [`TimeStretch`] takes pieces and gives pieces; its decisions depend only on
//! the samples, never on how they were cut, so streaming gives exactly the
//! samples of [`stretch`] on the whole clip. The output holds
//! `round(input / speed)` samples. Memory is one frame plus the search span
//! plus the piece being pushed; time is a fixed number of multiply-adds per
//! output sample (a coarse search on every `rate / 11 025`-th lag and sample,
//! then a full one around the best coarse lag).
//!
//! No crate did this well enough to depend on: `rubberband` is GPL, `ssstretch`
//! wraps a C++ library through a build script, `wsola` (0.1.0) has one
//! release and `timestretch` is tuned for dance music and changes weekly.

use std::ops::RangeInclusive;

/// The speeds [`TimeStretch`] takes (OpenAI's range for `speed`).
pub const SPEED_RANGE: RangeInclusive<f64> = 0.25..=4.0;

/// Output hop (half a frame), seconds.
const HOP_S: f64 = 0.015;
/// How far a frame's start may move from its nominal place, seconds.
const TOLERANCE_S: f64 = 0.0125;

/// `Err` naming the value unless `speed` is finite and in [`SPEED_RANGE`].
pub fn check_speed(speed: f64) -> Result<(), String> {
    match speed.is_finite() && SPEED_RANGE.contains(&speed) {
        true => Ok(()),
        false => Err(format!("speed must be in {}..={}, got {speed}", SPEED_RANGE.start(), SPEED_RANGE.end())),
    }
}

/// `samples` at `rate` Hz played `speed` times as fast at the same pitch:
/// `round(len / speed)` samples.
pub fn stretch(samples: &[f32], rate: u32, speed: f64) -> Result<Vec<f32>, String> {
    let mut s = TimeStretch::new(rate, speed)?;
    let mut out = s.push(samples);
    out.extend(s.finish());
    Ok(out)
}

/// A streaming [`stretch`]: [`TimeStretch::push`] pieces, then
/// [`TimeStretch::finish`]; the pieces it returns join to the one-shot output.
pub struct TimeStretch {
    speed: f64,
    hop: usize,
    tolerance: usize,
    /// Lag and sample step of the coarse search.
    coarse: usize,
    /// The periodic Hann window of one frame (`2 · hop`).
    window: Vec<f32>,
    /// Input from absolute index `input_start` on; `input_total` pushed in all.
    input: Vec<f32>,
    input_start: u64,
    input_total: u64,
    /// Frames laid down so far, and where the last one was taken from.
    frames: u64,
    last_pos: u64,
    /// The last frame's windowed second half, waiting for the next frame.
    tail: Vec<f32>,
    emitted: u64,
    /// Scratch: the search span and the natural continuation.
    span: Vec<f32>,
    reference: Vec<f32>,
}

impl TimeStretch {
    pub fn new(rate: u32, speed: f64) -> Result<Self, String> {
        check_speed(speed)?;
        if rate == 0 {
            return Err("cannot time-stretch audio at 0 Hz".into());
        }
        let hop = ((rate as f64 * HOP_S).round() as usize).max(4);
        let frame = 2 * hop;
        let window = (0..frame).map(|i| (0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / frame as f64).cos()) as f32).collect();
        Ok(TimeStretch {
            speed,
            hop,
            tolerance: (rate as f64 * TOLERANCE_S).round() as usize,
            coarse: (rate as usize / 11_025).max(1),
            window,
            input: Vec::new(),
            input_start: 0,
            input_total: 0,
            frames: 0,
            last_pos: 0,
            tail: Vec::new(),
            emitted: 0,
            span: Vec::new(),
            reference: Vec::new(),
        })
    }

    /// Adds `samples`; returns the output they complete.
    pub fn push(&mut self, samples: &[f32]) -> Vec<f32> {
        self.input.extend_from_slice(samples);
        self.input_total += samples.len() as u64;
        let mut out = Vec::new();
        while self.ready() {
            self.lay_frame(&mut out);
        }
        out
    }

    /// The rest of the output: the total is `round(pushed / speed)`.
    pub fn finish(mut self) -> Vec<f32> {
        let total = (self.input_total as f64 / self.speed).round() as u64;
        let before = self.emitted;
        let mut out = Vec::new();
        // Frames past the input read silence; the last one's tail completes the total.
        while self.emitted + (self.hop as u64) < total {
            self.lay_frame(&mut out);
        }
        let tail = std::mem::take(&mut self.tail);
        out.extend_from_slice(&tail);
        let room = total.saturating_sub(before) as usize;
        out.truncate(room);
        out.resize(room, 0.0);
        out
    }

    /// Where frame `k` would be taken from without a search.
    fn nominal(&self, k: u64) -> u64 {
        (k as f64 * self.hop as f64 * self.speed).round() as u64
    }

    /// The next frame's every candidate is in the input, and its output stays
    /// within what the input pushed so far makes (so no piece ever holds a
    /// sample past the final total).
    fn ready(&self) -> bool {
        let frame = 2 * self.hop as u64;
        let k = self.frames;
        let needed = if k == 0 { frame } else { (self.nominal(k) + self.tolerance as u64).max(self.last_pos + self.hop as u64) + frame };
        let made_after = (k + 1) * self.hop as u64;
        self.input_total >= needed && made_after as f64 <= (self.input_total as f64 / self.speed).floor()
    }

    /// Input samples `[from, from + len)`, silence past what was pushed.
    fn read(&self, from: u64, len: usize, into: &mut Vec<f32>) {
        into.clear();
        into.resize(len, 0.0);
        let start = from.max(self.input_start);
        let end = (from + len as u64).min(self.input_total);
        if start < end {
            let (a, b) = ((start - self.input_start) as usize, (end - self.input_start) as usize);
            let at = (start - from) as usize;
            into[at..at + (b - a)].copy_from_slice(&self.input[a..b]);
        }
    }

    /// Lays down the next frame; appends the output it completes to `out`.
    fn lay_frame(&mut self, out: &mut Vec<f32>) {
        let hop = self.hop;
        let k = self.frames;
        let pos = if k == 0 { 0 } else { self.best_start(k) };
        let mut frame = Vec::new();
        self.read(pos, 2 * hop, &mut frame);
        if k == 0 {
            // Nothing before the first frame: its first half is the input as it is.
            out.extend_from_slice(&frame[..hop]);
        } else {
            out.extend(self.tail.iter().zip(&frame[..hop]).zip(&self.window[..hop]).map(|((t, x), w)| t + x * w));
        }
        self.tail.clear();
        self.tail.extend(frame[hop..].iter().zip(&self.window[hop..]).map(|(x, w)| x * w));
        self.emitted += hop as u64;
        self.frames += 1;
        self.last_pos = pos;
        // Keep what the next frame may read (amortised: drop in halves).
        let keep = self.nominal(self.frames).saturating_sub(self.tolerance as u64).min(pos + hop as u64);
        let drop = keep.saturating_sub(self.input_start) as usize;
        if drop > 0 && drop >= self.input.len() / 2 {
            let drop = drop.min(self.input.len());
            self.input.drain(..drop);
            self.input_start += drop as u64;
        }
    }

    /// Frame `k`'s start within the tolerance of its nominal place: where the
    /// input best continues the previous frame.
    fn best_start(&mut self, k: u64) -> u64 {
        let hop = self.hop;
        let nominal = self.nominal(k);
        let lo = nominal.saturating_sub(self.tolerance as u64);
        let hi = nominal + self.tolerance as u64;
        let lags = (hi - lo) as usize + 1;
        let (mut span, mut reference) = (std::mem::take(&mut self.span), std::mem::take(&mut self.reference));
        self.read(lo, lags - 1 + hop, &mut span);
        self.read(self.last_pos + hop as u64, hop, &mut reference);
        let score = |lag: usize, step: usize| -> f64 {
            let (mut dot, mut energy) = (0f64, 0f64);
            for i in (0..hop).step_by(step) {
                let x = span[lag + i] as f64;
                dot += x * reference[i] as f64;
                energy += x * x;
            }
            if energy > 0.0 {
                dot / energy.sqrt()
            } else {
                0.0
            }
        };
        let best = |range: std::iter::StepBy<std::ops::RangeInclusive<usize>>, step: usize| {
            let mut best = (f64::NEG_INFINITY, 0usize);
            for lag in range {
                let s = score(lag, step);
                if s > best.0 {
                    best = (s, lag);
                }
            }
            best.1
        };
        let c = self.coarse;
        let rough = best((0..=lags - 1).step_by(c), c);
        let fine = best((rough.saturating_sub(c)..=(rough + c).min(lags - 1)).step_by(1), 1);
        (self.span, self.reference) = (span, reference);
        lo + fine as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speed_one_is_the_input_inside_and_lengths_are_exact() {
        let x: Vec<f32> = (0..24_000).map(|i| (i as f32 * 0.05).sin() * 0.5).collect();
        let y = stretch(&x, 24_000, 1.0).unwrap();
        assert_eq!(y.len(), x.len());
        let worst = x.iter().zip(&y).take(23_000).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-5, "{worst}");
        for (n, speed, want) in [(1000, 3.0, 333), (1001, 2.0, 501), (0, 0.25, 0), (7, 0.25, 28)] {
            assert_eq!(stretch(&vec![0.1; n], 24_000, speed).unwrap().len(), want, "{n} at {speed}");
        }
    }

    #[test]
    fn a_long_stream_holds_a_bounded_input() {
        for speed in [0.25, 4.0] {
            let mut s = TimeStretch::new(44_100, speed).unwrap();
            let piece: Vec<f32> = (0..441).map(|i| (i as f32 * 0.1).sin()).collect();
            let mut most = 0;
            for _ in 0..3000 {
                s.push(&piece);
                most = most.max(s.input.len());
            }
            // 30 s pushed; held: a frame, the search span and a piece, twice over at most.
            let bound = 2 * (2 * s.hop + 2 * s.tolerance + 2 * piece.len() + (s.hop as f64 * speed) as usize);
            assert!(most <= bound, "at {speed}: {most} samples held, bound {bound}");
        }
    }
}
