//! Speech-token sampling, in the reference's order for Turbo: temperature →
//! top-k → top-p → repetition penalty (the `transformers` logits processors),
//! softmax, then one draw. Every step is a separate function so tests can
//! compare each against the reference's intermediate rows.

use engine_core::model_kit::Result;

/// Sampling parameters (Turbo's defaults: 0.8, 1000, 0.95, 1.2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// Divides the logits; 0 or 1 disables it (0 means greedy for the draw).
    pub temperature: f32,
    /// Keeps the `top_k` highest logits (ties with the k-th kept); 0 disables.
    pub top_k: usize,
    /// Keeps the smallest set of top tokens whose probability exceeds `top_p`; 1 disables.
    /// f64 as in the reference, whose `1 - top_p` is formed in double precision.
    pub top_p: f64,
    /// Divides positive and multiplies negative logits of already generated tokens; 1 disables.
    pub repetition_penalty: f32,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.8, top_k: 1000, top_p: 0.95, repetition_penalty: 1.2 }
    }
}

impl SamplingParams {
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

pub fn apply_temperature(logits: &mut [f32], t: f32) {
    if t > 0.0 && t != 1.0 {
        logits.iter_mut().for_each(|v| *v /= t);
    }
}

pub fn apply_top_k(logits: &mut [f32], k: usize) {
    if k == 0 || k >= logits.len() {
        return;
    }
    let mut sorted = logits.to_vec();
    let (_, kth, _) = sorted.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    let threshold = *kth;
    logits.iter_mut().filter(|v| **v < threshold).for_each(|v| *v = f32::NEG_INFINITY);
}

/// Nucleus filter as `transformers` computes it: sort ascending, cumulative
/// softmax (accumulated in f64 and rounded per element, as torch's CPU
/// cumsum does), drop entries whose cumulative mass is ≤ 1 − p, keep the top one.
pub fn apply_top_p(logits: &mut [f32], p: f64) {
    if p >= 1.0 {
        return;
    }
    let probs = softmax(logits);
    // Entries already at −∞ (top-k's cut) hold no mass and stay −∞: only the
    // rest need sorting, ascending with ties in index order, which is the
    // order a stable sort of all of them gives.
    let mut order: Vec<(f32, u32)> = logits.iter().enumerate().filter(|(_, v)| **v != f32::NEG_INFINITY).map(|(i, &v)| (v, i as u32)).collect();
    if order.is_empty() {
        return;
    }
    order.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let cut = (1.0 - p) as f32;
    let mut cum = 0f64;
    let last = order.len() - 1;
    for (rank, &(_, i)) in order.iter().enumerate() {
        cum += probs[i as usize] as f64;
        if (cum as f32) <= cut && rank != last {
            logits[i as usize] = f32::NEG_INFINITY;
        }
    }
}

/// Penalises each distinct id of `history` once.
pub fn apply_repetition_penalty(logits: &mut [f32], history: &[u32], penalty: f32) {
    if penalty == 1.0 {
        return;
    }
    let mut seen = vec![false; logits.len()];
    for &id in history {
        let i = id as usize;
        if i < logits.len() && !std::mem::replace(&mut seen[i], true) {
            let v = logits[i];
            logits[i] = if v < 0.0 { v * penalty } else { v / penalty };
        }
    }
}

/// Numerically stable softmax in f32.
pub fn softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return vec![0.0; logits.len()];
    }
    // −∞ entries (the filters' cuts, most of them) are exactly 0 without an exp.
    let mut out: Vec<f32> = logits.iter().map(|&v| if v == f32::NEG_INFINITY { 0.0 } else { (v - max).exp() }).collect();
    let sum: f32 = out.iter().sum();
    out.iter_mut().for_each(|v| *v /= sum);
    out
}

/// Every processor in the reference order; returns the processed logits.
pub fn process(logits: &[f32], history: &[u32], params: &SamplingParams) -> Vec<f32> {
    let mut l = logits.to_vec();
    apply_temperature(&mut l, params.temperature);
    apply_top_k(&mut l, params.top_k);
    apply_top_p(&mut l, params.top_p);
    apply_repetition_penalty(&mut l, history, params.repetition_penalty);
    l
}

/// Index of the largest value (the first one on ties, as torch's argmax).
pub fn argmax(values: &[f32]) -> usize {
    values.iter().enumerate().fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| if v > bv { (i, v) } else { (bi, bv) }).0
}

/// Inverse-CDF draw: the first id whose cumulative probability (ids in
/// ascending order) exceeds `u` times the total.
pub fn draw_with_uniform(probs: &[f32], u: f32) -> usize {
    // The cumulative sums are accumulated in f64 and read rounded to f32, as
    // torch's CPU cumsum gives them; two passes instead of storing them.
    let total = probs.iter().fold(0f64, |acc, &p| acc + p as f64) as f32;
    let target = u * total;
    let mut acc = 0f64;
    probs
        .iter()
        .position(|&p| {
            acc += p as f64;
            acc as f32 > target
        })
        .unwrap_or(probs.len())
        .min(probs.len() - 1)
}

/// Uniform draws for sampling: seeded (xoshiro256**, reproducible across
/// platforms) or a recorded list (the reference's draws, for parity runs).
#[derive(Debug, Clone)]
pub enum UniformSource {
    Seeded(Xoshiro256),
    Recorded { values: Vec<f32>, next: usize },
}

impl UniformSource {
    pub fn seeded(seed: u64) -> Self {
        UniformSource::Seeded(Xoshiro256::new(seed))
    }

    pub fn recorded(values: Vec<f32>) -> Self {
        UniformSource::Recorded { values, next: 0 }
    }

    pub fn draw(&mut self) -> Result<f32> {
        match self {
            UniformSource::Seeded(rng) => Ok(rng.next_f32()),
            UniformSource::Recorded { values, next } => {
                let v = values.get(*next).copied().ok_or_else(|| format!("the recorded draws ran out after {} tokens", values.len()))?;
                *next += 1;
                Ok(v)
            }
        }
    }
}

/// xoshiro256** seeded through splitmix64.
#[derive(Debug, Clone)]
pub struct Xoshiro256([u64; 4]);

impl Xoshiro256 {
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Xoshiro256([next(), next(), next(), next()])
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// `n` standard normals (Box–Muller on 53-bit uniforms).
    pub fn gaussians(&mut self, n: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(n + 1);
        while out.len() < n {
            let u1 = (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
            let u2 = (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
            let r = (-2.0 * (1.0 - u1).ln()).sqrt();
            let a = std::f64::consts::TAU * u2;
            out.push((r * a.cos()) as f32);
            out.push((r * a.sin()) as f32);
        }
        out.truncate(n);
        out
    }

    /// Uniform in [0, 1) with 24 random bits.
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `apply_top_p` as first written: every entry sorted, −∞ ones included.
    fn top_p_sorting_everything(logits: &mut [f32], p: f64) {
        let probs = softmax(logits);
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[a].total_cmp(&logits[b]));
        let (cut, mut cum, last) = ((1.0 - p) as f32, 0f64, order.len() - 1);
        for (rank, &i) in order.iter().enumerate() {
            cum += probs[i] as f64;
            if (cum as f32) <= cut && rank != last {
                logits[i] = f32::NEG_INFINITY;
            }
        }
    }

    #[test]
    fn top_p_after_top_k_matches_sorting_every_entry() {
        let mut rng = Xoshiro256::new(7);
        for (k, p) in [(1000, 0.95), (3, 0.5), (1, 0.9), (0, 0.8)] {
            // Repeated values too, so that the sort's stability matters.
            let mut logits: Vec<f32> = (0..5000).map(|_| (rng.next_f32() * 40.0).round() / 4.0).collect();
            apply_top_k(&mut logits, k);
            let mut want = logits.clone();
            top_p_sorting_everything(&mut want, p);
            apply_top_p(&mut logits, p);
            assert_eq!(logits, want, "top_k {k}, top_p {p}");
        }
        let mut all_cut = vec![f32::NEG_INFINITY; 4];
        apply_top_p(&mut all_cut, 0.5);
        assert!(all_cut.iter().all(|v| *v == f32::NEG_INFINITY));
    }

    #[test]
    fn top_k_keeps_ties_and_top_p_keeps_at_least_one() {
        let mut l = vec![1.0, 3.0, 3.0, 2.0, 0.5];
        apply_top_k(&mut l, 2);
        assert_eq!(l, vec![f32::NEG_INFINITY, 3.0, 3.0, f32::NEG_INFINITY, f32::NEG_INFINITY]);
        let mut l = vec![0.0, 10.0, 0.0];
        apply_top_p(&mut l, 0.01);
        assert_eq!(l, vec![f32::NEG_INFINITY, 10.0, f32::NEG_INFINITY]);
    }

    #[test]
    fn repetition_penalty_counts_each_id_once() {
        let mut l = vec![2.0, -2.0, 1.0];
        apply_repetition_penalty(&mut l, &[0, 0, 1, 1, 1], 2.0);
        assert_eq!(l, vec![1.0, -4.0, 1.0]);
    }

    #[test]
    fn uniform_draw_follows_the_cumulative_distribution() {
        let p = [0.25, 0.0, 0.5, 0.25];
        assert_eq!(draw_with_uniform(&p, 0.0), 0);
        assert_eq!(draw_with_uniform(&p, 0.25), 2);
        assert_eq!(draw_with_uniform(&p, 0.7499), 2);
        assert_eq!(draw_with_uniform(&p, 0.75), 3);
        let mut r = Xoshiro256::new(7);
        assert!((0..1000).map(|_| r.next_f32()).all(|u| (0.0..1.0).contains(&u)));
    }
}
