//! Signal helpers the vocoder's host STFT and the cloning front ends share.

/// Periodic Hann window of length `n` (`torch.hann_window`,
/// `scipy.signal.get_window("hann")`).
pub fn hann_periodic(n: usize) -> Vec<f64> {
    (0..n).map(|i| 0.5 - 0.5 * (std::f64::consts::TAU * i as f64 / n as f64).cos()).collect()
}

/// The index numpy/torch "reflect" padding reads for position `i` of an
/// `n`-sample signal (the edge sample is not repeated).
pub fn reflect_index(i: isize, n: usize) -> usize {
    let n = n as isize;
    let j = if i < 0 {
        -i
    } else if i >= n {
        2 * (n - 1) - i
    } else {
        i
    };
    j as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reflection_skips_the_edge_sample() {
        let idx: Vec<usize> = (-2..6).map(|i| reflect_index(i, 4)).collect();
        assert_eq!(idx, vec![2, 1, 0, 1, 2, 3, 2, 1]);
    }

    #[test]
    fn periodic_hann_starts_at_zero_and_peaks_mid_window() {
        let w = hann_periodic(8);
        assert_eq!(w[0], 0.0);
        assert!((w[4] - 1.0).abs() < 1e-15);
        assert!((w[1] - w[7]).abs() < 1e-15);
    }
}
