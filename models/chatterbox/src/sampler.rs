//! Speech-token sampling, in the reference's order for Turbo: temperature →
//! top-k → top-p → repetition penalty (the `transformers` logits processors),
//! softmax, then one draw. Every step is a separate function so tests can
//! compare each against the reference's intermediate rows; generation runs
//! the same chain on top-k's survivors alone ([`candidates`]).

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

/// The tokens `process` leaves finite, in id order, with their processed
/// logits. Top-k keeps about a thousand of Turbo's 6563 speech tokens, so
/// the nucleus filter, the penalty, the softmax and the draw work on those
/// alone: the same token as the dense chain, at a fraction of its cost (it
/// runs between every two decode steps, while the GPU waits).
#[derive(Debug, Clone, PartialEq)]
pub struct Candidates {
    ids: Vec<u32>,
    logits: Vec<f32>,
    vocab: usize,
}

/// Maps an f32 to a u32 whose unsigned order is `f32::total_cmp`'s.
fn order_key(v: f32) -> u32 {
    let b = v.to_bits();
    if b >> 31 == 1 {
        !b
    } else {
        b | 0x8000_0000
    }
}

fn from_order_key(k: u32) -> f32 {
    f32::from_bits(if k >> 31 == 1 { k & 0x7fff_ffff } else { !k })
}

/// `process` computed on the top-k survivors; see [`Candidates`].
pub fn candidates(logits: &[f32], history: &[u32], params: &SamplingParams) -> Candidates {
    let n = logits.len();
    let t = params.temperature;
    let scaled = |v: f32| if t > 0.0 && t != 1.0 { v / t } else { v };
    let keys: Vec<u32> = logits.iter().map(|&v| order_key(scaled(v))).collect();
    // `apply_top_k` cuts the values below (by `<`) the k-th largest by total order.
    let threshold = if params.top_k == 0 || params.top_k >= n {
        f32::NEG_INFINITY
    } else {
        let mut copy = keys.clone();
        from_order_key(*copy.select_nth_unstable(n - params.top_k).1)
    };
    // The same cut on the keys: `<` treats −0 as +0, total order puts it below.
    let lowest_kept = order_key(if threshold == 0.0 { -0.0 } else { threshold }).max(order_key(f32::NEG_INFINITY) + 1);
    let capacity = params.top_k.min(n) + 16;
    let (mut ids, mut survivor_keys) = (Vec::with_capacity(capacity), Vec::with_capacity(capacity));
    for (i, &key) in keys.iter().enumerate() {
        if key >= lowest_kept {
            ids.push(i as u32);
            survivor_keys.push(key);
        }
    }
    let mut values: Vec<f32> = survivor_keys.iter().map(|&k| from_order_key(k)).collect();
    let mut kept = vec![true; ids.len()];
    if params.top_p < 1.0 && !ids.is_empty() {
        let probs = softmax(&values);
        let order = ascending_slots(&survivor_keys);
        let cut = (1.0 - params.top_p) as f32;
        let (mut cum, last) = (0f64, order.len() - 1);
        for (rank, &slot) in order.iter().enumerate() {
            cum += probs[slot as usize] as f64;
            if (cum as f32) <= cut && rank != last {
                kept[slot as usize] = false;
            }
        }
    }
    if params.repetition_penalty != 1.0 {
        let mut penalised = vec![false; ids.len()];
        for id in history {
            if let Ok(slot) = ids.binary_search(id) {
                if kept[slot] && !std::mem::replace(&mut penalised[slot], true) {
                    let v = values[slot];
                    values[slot] = if v < 0.0 { v * params.repetition_penalty } else { v / params.repetition_penalty };
                }
            }
        }
    }
    let (ids, logits) = ids.into_iter().zip(values).zip(kept).filter(|(_, k)| *k).map(|(iv, _)| iv).unzip();
    Candidates { ids, logits, vocab: n }
}

/// Slots of `keys` ([`order_key`]s) ascending, ties in slot order (the order
/// a stable sort gives): a least-significant-digit radix sort.
fn ascending_slots(keys: &[u32]) -> Vec<u32> {
    let mut counts = [[0u32; 256]; 4];
    for &key in keys {
        for (digit, c) in counts.iter_mut().enumerate() {
            c[((key >> (8 * digit)) & 255) as usize] += 1;
        }
    }
    let mut order: Vec<u32> = (0..keys.len() as u32).collect();
    let mut next = vec![0u32; keys.len()];
    for (digit, c) in counts.iter().enumerate() {
        if c.iter().any(|&n| n as usize == keys.len()) {
            continue; // every key has this digit: the pass would not move anything
        }
        let mut start = [0u32; 256];
        let mut sum = 0;
        for (s, &n) in start.iter_mut().zip(c) {
            *s = sum;
            sum += n;
        }
        for &slot in &order {
            let d = ((keys[slot as usize] >> (8 * digit)) & 255) as usize;
            next[start[d] as usize] = slot;
            start[d] += 1;
        }
        std::mem::swap(&mut order, &mut next);
    }
    order
}

impl Candidates {
    /// Nothing survived the filters (every logit was −∞).
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// `draw_with_uniform(&softmax(&processed), u)`: the entries cut to −∞
    /// have probability 0, which changes neither the sums (taken in id order)
    /// nor where the cumulative sum first exceeds the target.
    pub fn draw(&self, u: f32) -> usize {
        if self.ids.is_empty() {
            return self.vocab.saturating_sub(1);
        }
        let probs = softmax(&self.logits);
        let total = probs.iter().fold(0f64, |acc, &p| acc + p as f64) as f32;
        let target = u * total;
        let mut acc = 0f64;
        match probs.iter().position(|&p| {
            acc += p as f64;
            acc as f32 > target
        }) {
            Some(slot) => self.ids[slot] as usize,
            None => self.vocab - 1,
        }
    }
}

/// Multilingual's guided sampling (`T3.inference` in chatterbox-tts 0.1.7):
/// the combine of the guided pair of rows, then the repetition penalty,
/// temperature, min-p and top-p, in that order. Defaults are 0.1.7's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GuidedSamplingParams {
    /// `cond + w·(cond − uncond)`; 0 leaves the conditional row.
    pub cfg_weight: f32,
    pub repetition_penalty: f32,
    /// Divides the logits unless 1 (the options keep it positive).
    pub temperature: f32,
    /// Drops tokens whose probability is below `min_p` times the largest; 0 disables.
    pub min_p: f32,
    /// As [`SamplingParams::top_p`]; 1 disables.
    pub top_p: f64,
}

impl Default for GuidedSamplingParams {
    fn default() -> Self {
        GuidedSamplingParams { cfg_weight: 0.5, repetition_penalty: 2.0, temperature: 0.8, min_p: 0.05, top_p: 1.0 }
    }
}

/// Classifier-free guidance: `cond + w·(cond − uncond)`, in f32 as the reference.
pub fn combine_guidance(cond: &[f32], uncond: &[f32], weight: f32) -> Vec<f32> {
    cond.iter().zip(uncond).map(|(&c, &u)| c + weight * (c - u)).collect()
}

/// `MinPLogitsWarper`: tokens whose probability is below `min_p` times the
/// largest become −∞ (the most probable token always stays).
pub fn apply_min_p(logits: &mut [f32], min_p: f32) {
    if min_p <= 0.0 {
        return;
    }
    let probs = softmax(logits);
    let threshold = min_p * probs.iter().copied().fold(0.0, f32::max);
    let top = argmax(&probs);
    for (i, (l, p)) in logits.iter_mut().zip(&probs).enumerate() {
        if *p < threshold && i != top {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// Every step of the guided chain in the reference's order.
pub fn process_guided(cond: &[f32], uncond: &[f32], history: &[u32], params: &GuidedSamplingParams) -> Vec<f32> {
    let mut l = combine_guidance(cond, uncond, params.cfg_weight);
    process_combined(&mut l, history, params);
    l
}

/// The chain after the guidance combine (where the Multilingual loop's
/// alignment analyzer edits the logits): penalty, temperature, min-p, top-p.
pub fn process_combined(l: &mut [f32], history: &[u32], params: &GuidedSamplingParams) {
    apply_repetition_penalty(l, history, params.repetition_penalty);
    apply_temperature(l, params.temperature);
    apply_min_p(l, params.min_p);
    apply_top_p(l, params.top_p);
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
                // The file fits one run: a run that draws more tokens than it
                // recorded has left that run's token stream (or its cap).
                let v = values.get(*next).copied().ok_or_else(|| {
                    format!(
                        "t3_uniforms.npy holds {} uniforms, one per speech token; speech token {} has none \
                         (the token stream diverged earlier, or max_new_tokens is above the recorded run's: the recorded draws fit another run)",
                        values.len(),
                        values.len() + 1
                    )
                })?;
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
        let mut out = vec![0f32; n];
        self.fill_gaussians(&mut out);
        out
    }

    /// Fills `out` with what `gaussians(out.len())` returns, without
    /// allocating (worker threads fill buffers their caller owns).
    pub fn fill_gaussians(&mut self, out: &mut [f32]) {
        for pair in out.chunks_mut(2) {
            let u1 = (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
            let u2 = (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
            let r = (-2.0 * (1.0 - u1).ln()).sqrt();
            let a = std::f64::consts::TAU * u2;
            pair[0] = (r * a.cos()) as f32;
            if let Some(second) = pair.get_mut(1) {
                *second = (r * a.sin()) as f32;
            }
        }
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

    /// The candidates' logits where `process` leaves them finite, −∞ elsewhere.
    fn dense(c: &Candidates) -> Vec<f32> {
        let mut out = vec![f32::NEG_INFINITY; c.vocab];
        for (&i, &v) in c.ids.iter().zip(&c.logits) {
            out[i as usize] = v;
        }
        out
    }

    #[test]
    fn candidates_draw_the_dense_chains_token() {
        let mut rng = Xoshiro256::new(11);
        let params = [
            SamplingParams::default(),
            SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0 },
            SamplingParams { temperature: 0.7, top_k: 5, top_p: 0.5, repetition_penalty: 2.0 },
            SamplingParams { temperature: 1.3, top_k: 6563, top_p: 0.99, repetition_penalty: 1.2 },
            SamplingParams { temperature: 0.8, top_k: 1, top_p: 0.95, repetition_penalty: 1.2 },
        ];
        for (case, p) in params.iter().enumerate() {
            for spread in [0.5f32, 3.0, 12.0] {
                // Rounded values give ties; some −∞ (a suppressed stop token), a
                // history with repeats and ids past the vocabulary.
                let mut logits: Vec<f32> = rng.gaussians(6563).iter().map(|g| (g * spread * 8.0).round() / 8.0).collect();
                logits[6562] = f32::NEG_INFINITY;
                logits[17] = -0.0;
                let history: Vec<u32> = (0..300).map(|_| (rng.next_u64() % 7000) as u32).collect();
                let want = process(&logits, &history, p);
                let got = candidates(&logits, &history, p);
                assert_eq!(dense(&got), want, "case {case}, spread {spread}");
                let probs = softmax(&want);
                for _ in 0..200 {
                    let u = rng.next_f32();
                    assert_eq!(got.draw(u), draw_with_uniform(&probs, u), "case {case}, spread {spread}, u {u}");
                }
            }
        }
        let all_cut = vec![f32::NEG_INFINITY; 8];
        assert!(candidates(&all_cut, &[], &SamplingParams::default()).is_empty());
        for v in [f32::NEG_INFINITY, -3.5, -0.0, 0.0, 1e-30, 7.25, f32::INFINITY] {
            assert_eq!(from_order_key(order_key(v)).to_bits(), v.to_bits());
        }
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
