//! Comparing two signals the way parity tests bound them: a NaN, an infinity
//! where the other side has none, or two lengths are errors, never a number
//! that a tolerance check could pass (`f32::max` drops NaN).

/// `max |ours − reference| / max |reference|` over equal-length slices.
/// Equal infinities (masked logits) are skipped; any other non-finite value,
/// or a length mismatch, is an error naming the first offending element.
pub fn max_rel_err(ours: &[f32], reference: &[f32]) -> Result<f32, String> {
    if ours.len() != reference.len() {
        return Err(format!("lengths differ: {} values against the reference's {}", ours.len(), reference.len()));
    }
    let mut scale = 0f32;
    let mut worst = 0f32;
    for (i, (&a, &b)) in ours.iter().zip(reference).enumerate() {
        if a.is_infinite() && a == b {
            continue;
        }
        if !a.is_finite() || !b.is_finite() {
            return Err(format!("element {i}: {a} against the reference's {b}"));
        }
        let d = (a - b).abs();
        if d > worst {
            worst = d;
        }
        if b.abs() > scale {
            scale = b.abs();
        }
    }
    Ok(worst / scale.max(1e-12))
}

/// Signal-to-noise ratio of `ours` against `reference` in dB (equal lengths,
/// finite values; infinite when they are identical).
pub fn snr_db(ours: &[f32], reference: &[f32]) -> Result<f64, String> {
    max_rel_err(ours, reference)?;
    let signal: f64 = reference.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let noise: f64 = ours.iter().zip(reference).map(|(&a, &b)| ((a - b) as f64).powi(2)).sum();
    Ok(if noise == 0.0 { f64::INFINITY } else { 10.0 * (signal / noise).log10() })
}

/// `n` deterministic test inputs in [-2, 2) on a grid of `1 / per_unit`
/// (a power of two up to 1024 keeps every value exact in F16), from `seed`:
/// backends compared on them see identical inputs in either precision.
pub fn grid_values(n: usize, seed: u64, per_unit: u32) -> Vec<f32> {
    let next = |s: u64| s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut s = next(seed);
    (0..n)
        .map(|_| {
            s = next(s);
            ((s >> 33) % (4 * per_unit as u64)) as f32 / per_unit as f32 - 2.0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_to_the_reference_peak() {
        assert_eq!(max_rel_err(&[1.0, 2.5], &[1.0, 2.0]), Ok(0.25));
        assert_eq!(max_rel_err(&[f32::NEG_INFINITY, 1.0], &[f32::NEG_INFINITY, 1.0]), Ok(0.0));
    }

    #[test]
    fn nan_and_lengths_fail() {
        assert_eq!(max_rel_err(&[f32::NAN, 1.0], &[0.0, 1.0]), Err("element 0: NaN against the reference's 0".into()));
        assert_eq!(max_rel_err(&[0.0, 1.0], &[0.0, f32::NAN]), Err("element 1: 1 against the reference's NaN".into()));
        assert_eq!(max_rel_err(&[f32::INFINITY], &[1.0]), Err("element 0: inf against the reference's 1".into()));
        assert_eq!(max_rel_err(&[1.0], &[1.0, 2.0]), Err("lengths differ: 1 values against the reference's 2".into()));
    }

    #[test]
    fn snr() {
        assert_eq!(snr_db(&[1.0, -1.0], &[1.0, -1.0]), Ok(f64::INFINITY));
        let db = snr_db(&[1.1, -1.0], &[1.0, -1.0]).unwrap();
        assert!((db - 10.0 * (2.0f64 / 0.01).log10()).abs() < 1e-4, "{db}");
        assert!(snr_db(&[f32::NAN], &[1.0]).is_err());
    }
}
