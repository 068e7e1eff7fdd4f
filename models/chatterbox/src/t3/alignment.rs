//! The Multilingual loop's alignment analyzer (the reference's
//! `AlignmentStreamAnalyzer`): a few attention heads of the Llama T3 track which
//! text token the speech has reached. From their attention over the text, per
//! step, it keeps the stop token suppressed until the end of the text is near,
//! and forces it on signs of a runaway: a long tail on the last tokens,
//! attention jumping back into the text after the end, or the same token
//! twice in a row. It edits the guidance-combined logits, before the
//! repetition penalty, exactly as the reference does (its ±2^15 included).

/// The reference's "minus/plus infinity" that is safe in 16-bit types.
const FORCE: f32 = 32768.0;

#[derive(Debug, Clone)]
pub struct AlignmentAnalyzer {
    /// Text tokens (the attention columns read), SOT/EOT included.
    text_len: usize,
    /// Attention rows so far, each `text_len` wide, after monotonic masking.
    alignment: Vec<Vec<f32>>,
    frame: usize,
    text_position: usize,
    complete: bool,
    completed_at: Option<usize>,
    /// The last tokens fed (the start token first), at most 8.
    recent: Vec<u32>,
    stop_token: u32,
}

/// What one step decided (for tests and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub stop_suppressed: bool,
    pub stop_forced: bool,
}

impl AlignmentAnalyzer {
    pub fn new(text_len: usize, stop_token: u32) -> Self {
        AlignmentAnalyzer { text_len, alignment: Vec::new(), frame: 0, text_position: 0, complete: false, completed_at: None, recent: Vec::new(), stop_token }
    }

    /// One step: `attention` holds the new query rows (2 at the prefill, then
    /// 1), each the mean over the aligned heads of the attention over the
    /// `text_len` text positions; `last_token` is the token just fed (the
    /// start token at the prefill). Edits `logits` in place.
    pub fn step(&mut self, logits: &mut [f32], attention: &[Vec<f32>], last_token: u32) -> Verdict {
        let s = self.text_len;
        // Monotonic masking: the k-th step sees text positions up to k only.
        for row in attention {
            let mut row = row.clone();
            row.iter_mut().skip(self.frame + 1).for_each(|v| *v = 0.0);
            self.alignment.push(row);
        }
        let rows = self.alignment.len();
        let current = argmax(self.alignment.last().expect("one row at least"));
        let delta = current as i64 - self.text_position as i64;
        if -4 < delta && delta < 7 {
            self.text_position = current;
        }
        // (The reference's false-start detection changes no logit: left out.)
        let a = &self.alignment;
        self.complete = self.complete || self.text_position + 3 >= s;
        if self.complete && self.completed_at.is_none() {
            self.completed_at = Some(rows);
        }
        let (long_tail, jumped_back) = match self.completed_at {
            Some(at) if self.complete => {
                let tail = &a[at..];
                let last3 = (s.saturating_sub(3)..s).map(|c| tail.iter().map(|r| r[c]).sum::<f32>()).fold(f32::NEG_INFINITY, f32::max);
                // Rows' maxima over all but the last 5 tokens (nothing when the text is that short).
                let earlier: f32 =
                    tail.iter().map(|r| r[..s.saturating_sub(5)].iter().copied().fold(f32::NEG_INFINITY, f32::max)).filter(|m| m.is_finite()).sum();
                (last3 >= 5.0, earlier > 5.0)
            }
            _ => (false, false),
        };
        self.recent.push(last_token);
        if self.recent.len() > 8 {
            self.recent.remove(0);
        }
        let repeated = self.recent.len() >= 3 && self.recent[self.recent.len() - 1] == self.recent[self.recent.len() - 2];
        let stop = self.stop_token as usize;
        let stop_suppressed = current + 3 < s && s > 5;
        if stop_suppressed {
            if let Some(l) = logits.get_mut(stop) {
                *l = -FORCE;
            }
        }
        let stop_forced = long_tail || jumped_back || repeated;
        if stop_forced {
            logits.fill(-FORCE);
            if let Some(l) = logits.get_mut(stop) {
                *l = FORCE;
            }
        }
        self.frame += 1;
        Verdict { stop_suppressed, stop_forced }
    }
}

/// The first index of the largest value, as torch's argmax.
fn argmax(v: &[f32]) -> usize {
    v.iter().enumerate().fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &x)| if x > bv { (i, x) } else { (bi, bv) }).0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_repeated_twice_forces_the_stop() {
        let mut a = AlignmentAnalyzer::new(4, 9);
        let row = vec![vec![0.9, 0.1, 0.0, 0.0]];
        let mut logits = vec![0.0; 10];
        assert!(!a.step(&mut logits, &[row[0].clone(), row[0].clone()], 7).stop_forced);
        assert!(!a.step(&mut logits, &row, 3).stop_forced);
        let mut logits = vec![1.0; 10];
        let v = a.step(&mut logits, &row, 3);
        assert!(v.stop_forced);
        assert_eq!(logits[9], FORCE);
        assert!(logits[..9].iter().all(|&l| l == -FORCE));
    }

    #[test]
    fn the_stop_stays_suppressed_until_the_end_of_a_long_text() {
        let mut a = AlignmentAnalyzer::new(10, 2);
        let mut logits = vec![0.5; 4];
        let v = a.step(&mut logits, &[vec![1.0; 10], vec![1.0; 10]], 1);
        assert!(v.stop_suppressed && !v.stop_forced);
        assert_eq!(logits, vec![0.5, 0.5, -FORCE, 0.5]);
    }
}
