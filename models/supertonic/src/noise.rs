//! Initial latent noise. The default generator reproduces NumPy's legacy
//! `np.random.seed(s); np.random.randn(...)` (MT19937 with `init_genrand`, the
//! polar Gaussian method with its cached second value), so a seeded run can be
//! compared sample for sample with the official Python pipeline.

const N: usize = 624;
const M: usize = 397;

pub struct NumpyLegacyRng {
    state: [u32; N],
    index: usize,
    cached_gauss: Option<f64>,
}

impl NumpyLegacyRng {
    pub fn new(seed: u32) -> Self {
        let mut state = [0u32; N];
        state[0] = seed;
        for i in 1..N {
            state[i] = 1812433253u32.wrapping_mul(state[i - 1] ^ (state[i - 1] >> 30)).wrapping_add(i as u32);
        }
        NumpyLegacyRng { state, index: N, cached_gauss: None }
    }

    fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            for i in 0..N {
                let y = (self.state[i] & 0x8000_0000) | (self.state[(i + 1) % N] & 0x7fff_ffff);
                let mut v = self.state[(i + M) % N] ^ (y >> 1);
                if y & 1 != 0 {
                    v ^= 0x9908_b0df;
                }
                self.state[i] = v;
            }
            self.index = 0;
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// Uniform in [0, 1) with 53 random bits.
    fn next_f64(&mut self) -> f64 {
        let a = (self.next_u32() >> 5) as f64;
        let b = (self.next_u32() >> 6) as f64;
        (a * 67108864.0 + b) / 9007199254740992.0
    }

    /// One standard normal value.
    pub fn gauss(&mut self) -> f64 {
        if let Some(g) = self.cached_gauss.take() {
            return g;
        }
        loop {
            let x1 = 2.0 * self.next_f64() - 1.0;
            let x2 = 2.0 * self.next_f64() - 1.0;
            let r2 = x1 * x1 + x2 * x2;
            if r2 < 1.0 && r2 != 0.0 {
                let f = (-2.0 * r2.ln() / r2).sqrt();
                self.cached_gauss = Some(f * x1);
                return f * x2;
            }
        }
    }

    /// `randn(n)` cast to f32, in NumPy's C order.
    pub fn randn(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.gauss() as f32).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_numpy_legacy_randn() {
        // np.random.seed(42); np.random.randn(4)
        let mut rng = NumpyLegacyRng::new(42);
        let want = [0.4967141530112327, -0.13826430117118466, 0.6476885381006925, 1.5230298564080254];
        for w in want {
            let g = rng.gauss();
            assert!((g - w).abs() < 1e-15, "{g} vs {w}");
        }
    }
}
