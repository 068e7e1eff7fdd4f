//! Finiteness checks: a weight, a voice value or a stage's output that holds
//! NaN or infinity is an error naming it. Without them a corrupt value flows
//! through the graphs and comes out as silence: ggml's ReLU and leaky ReLU
//! map NaN to 0 and its clamp maps NaN to a bound, so the samples that reach
//! [`crate::audio::check_samples`] can be finite and wrong.
//!
//! Weights are checked as they are read at load ([`super::Weights::load`]),
//! in the type they are stored in: every element of F32, F16 and BF16
//! tensors, and the scale of every block of Q8_0 and Q4_0 ones (a block's
//! quants are small integers and always finite; its scale multiplies all 32).

use super::error::{Error, Result};
use ggml_sys::Type;

/// The number of non-finite values in `bytes` of type `ty` (for block types,
/// of blocks whose scale is not finite); `None` for types without float
/// values (integers).
pub fn count_non_finite(ty: Type, bytes: &[u8]) -> Option<usize> {
    use ggml_sys::{TYPE_BF16, TYPE_F16, TYPE_F32, TYPE_Q4_0, TYPE_Q8_0};
    // A value is NaN or infinite exactly when its exponent bits are all ones.
    let f16 = |c: [u8; 2]| u16::from_le_bytes(c) & 0x7c00 == 0x7c00;
    Some(match ty {
        t if t == TYPE_F32 => count::<4>(bytes, |c| u32::from_le_bytes(*c) & 0x7f80_0000 == 0x7f80_0000),
        t if t == TYPE_F16 => count::<2>(bytes, |c| f16(*c)),
        t if t == TYPE_BF16 => count::<2>(bytes, |c| u16::from_le_bytes(*c) & 0x7f80 == 0x7f80),
        // `block_q8_0` is an f16 scale and 32 i8 quants; `block_q4_0` an f16
        // scale and 16 bytes of 4-bit quants.
        t if t == TYPE_Q8_0 => count::<34>(bytes, |c| f16([c[0], c[1]])),
        t if t == TYPE_Q4_0 => count::<18>(bytes, |c| f16([c[0], c[1]])),
        _ => return None,
    })
}

/// How many `S`-byte items of `bytes` are `bad`. Summed as u32 over blocks
/// of 2^20 items, a form the compiler vectorises (a `filter().count()` ran
/// F16 at less than half the speed).
fn count<const S: usize>(bytes: &[u8], bad: impl Fn(&[u8; S]) -> bool + Copy) -> usize {
    bytes.chunks(S << 20).map(|block| block.chunks_exact(S).map(|c| bad(c.try_into().expect("S bytes")) as u32).sum::<u32>() as usize).sum()
}

/// `Ok` when every value of tensor `name` (stored as `ty`) is finite; else
/// "`<path>`: tensor '`name`' holds N non-finite values …". `converted_from`
/// is the file's type where the load policy stored the tensor in another
/// (F32 → F16 can overflow).
pub fn check_weight(path: &str, name: &str, ty: Type, converted_from: Option<Type>, bytes: &[u8]) -> Result<()> {
    let Some(bad) = count_non_finite(ty, bytes) else { return Ok(()) };
    if bad == 0 {
        return Ok(());
    }
    let what = if [ggml_sys::TYPE_Q8_0, ggml_sys::TYPE_Q4_0].contains(&ty) {
        let blocks = bytes.len() / if ty == ggml_sys::TYPE_Q8_0 { 34 } else { 18 };
        format!("{bad} of its {blocks} {} blocks have a non-finite scale (NaN or infinity)", ggml_sys::type_name(ty))
    } else {
        let n = bytes.len() / if ty == ggml_sys::TYPE_F32 { 4 } else { 2 };
        format!("holds {bad} non-finite values (NaN or infinity) of {n}")
    };
    let how = match converted_from {
        Some(from) => {
            format!(" once stored as {} (it is {} in the file: a value beyond the smaller type's range)", ggml_sys::type_name(ty), ggml_sys::type_name(from))
        }
        None => "; the model file is corrupt".to_string(),
    };
    Err(Error::msg(format!("{path}: tensor '{name}' {what}{how}")))
}

/// `Ok(values)` when every value a stage produced is finite; else an error
/// naming the stage (a finite but huge weight or input can overflow).
pub fn check_stage(stage: &str, values: Vec<f32>) -> Result<Vec<f32>> {
    check_values(stage, &values)?;
    Ok(values)
}

/// How many of `values` are NaN or infinite. Counted as the weights are (see
/// `count`): `all(is_finite)` stops early but does not vectorise, and ran at a
/// third of the speed.
pub fn count_non_finite_f32(values: &[f32]) -> usize {
    values.chunks(1 << 20).map(|block| block.iter().map(|v| !v.is_finite() as u32).sum::<u32>() as usize).sum()
}

/// [`check_stage`] on borrowed values.
pub fn check_values(stage: &str, values: &[f32]) -> Result<()> {
    let bad = count_non_finite_f32(values);
    if bad == 0 {
        return Ok(());
    }
    Err(Error::msg(format!(
        "{stage} produced {bad} non-finite values (NaN or infinity) of {}; the model file or an input (voice, noise) holds values out of range",
        values.len()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ggml_sys::{TYPE_BF16, TYPE_F16, TYPE_F32, TYPE_I32, TYPE_Q4_0, TYPE_Q8_0};

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn every_float_type_counts_nan_and_infinity() {
        let v = [0.0, 1.0, -65504.0, f32::MAX, f32::MIN_POSITIVE, f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
        assert_eq!(count_non_finite(TYPE_F32, &f32_bytes(&v)), Some(3));
        // f16: 0x7c00 = +inf, 0xfe00 = NaN, 0x7bff = 65504 (finite).
        let f16: Vec<u8> = [0x3c00u16, 0x7c00, 0xfe00, 0x7bff].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(count_non_finite(TYPE_F16, &f16), Some(2));
        // bf16: the top half of an f32.
        let bf16: Vec<u8> = v.iter().flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes()).collect();
        assert_eq!(count_non_finite(TYPE_BF16, &bf16), Some(3));
        assert_eq!(count_non_finite(TYPE_I32, &[0xff; 8]), None, "integers are never non-finite");
        // Counted across the 2^20-item blocks of the sum.
        let mut many = vec![0u8; 2 * ((2 << 20) + 3)];
        for at in [0, (1 << 20) - 1, 1 << 20, (2 << 20) + 2] {
            many[2 * at..2 * at + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
        }
        assert_eq!(count_non_finite(TYPE_F16, &many), Some(4));
    }

    #[test]
    fn block_types_count_blocks_whose_scale_is_not_finite() {
        let mut q8 = vec![0xffu8; 3 * 34];
        for (block, scale) in [0x3c00u16, 0x7e00, 0x0001].iter().enumerate() {
            q8[block * 34..block * 34 + 2].copy_from_slice(&scale.to_le_bytes());
        }
        assert_eq!(count_non_finite(TYPE_Q8_0, &q8), Some(1), "quants of 0xff are -1, not NaN");
        let mut q4 = vec![0u8; 2 * 18];
        q4[18..20].copy_from_slice(&0x7c00u16.to_le_bytes());
        assert_eq!(count_non_finite(TYPE_Q4_0, &q4), Some(1));
        let e = check_weight("m.gguf", "w", TYPE_Q4_0, None, &q4).unwrap_err();
        assert_eq!(e, "m.gguf: tensor 'w' 1 of its 2 q4_0 blocks have a non-finite scale (NaN or infinity); the model file is corrupt");
    }

    /// The cost figures in docs/performance.md ("Finiteness checks"):
    /// `cargo test -p engine-core --release --lib finite_check_throughput -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, not a check"]
    fn finite_check_throughput() {
        let n = 1usize << 30;
        let mut x = 1u32;
        let bytes: Vec<u8> = (0..n / 4)
            .flat_map(|_| {
                x = x.wrapping_mul(1664525).wrapping_add(1013904223);
                ((x >> 9) as f32 / 8388608.0 - 0.5).to_le_bytes()
            })
            .collect();
        let floats: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        for round in 0..3 {
            let mut line = format!("round {round}, 1 GiB:");
            let mut copy = vec![0u8; n];
            let t = std::time::Instant::now();
            copy.copy_from_slice(std::hint::black_box(&bytes));
            line += &format!(" memcpy {:.0} ms;", t.elapsed().as_secs_f64() * 1e3);
            std::hint::black_box(&copy);
            for ty in [TYPE_F32, TYPE_F16, TYPE_BF16, TYPE_Q8_0, TYPE_Q4_0] {
                let t = std::time::Instant::now();
                std::hint::black_box(count_non_finite(ty, std::hint::black_box(&bytes)));
                let s = t.elapsed().as_secs_f64();
                line += &format!(" {} {:.0} ms ({:.1} GB/s);", ggml_sys::type_name(ty), s * 1e3, n as f64 / s / 1e9);
            }
            let t = std::time::Instant::now();
            std::hint::black_box(check_values("stage", std::hint::black_box(&floats)).is_ok());
            let s = t.elapsed().as_secs_f64();
            println!("{line} stage output {:.0} ms ({:.1} GB/s)", s * 1e3, n as f64 / s / 1e9);
        }
    }

    #[test]
    fn errors_name_the_tensor_or_the_stage() {
        assert!(check_weight("m.gguf", "w", TYPE_F32, None, &f32_bytes(&[1.0, 2.0])).is_ok());
        let e = check_weight("m.gguf", "enc.w", TYPE_F32, None, &f32_bytes(&[1.0, f32::NAN])).unwrap_err();
        assert_eq!(e, "m.gguf: tensor 'enc.w' holds 1 non-finite values (NaN or infinity) of 2; the model file is corrupt");
        let e = check_weight("m.gguf", "w", TYPE_F16, Some(TYPE_F32), &[0x00, 0x7c]).unwrap_err();
        assert!(e.ends_with("once stored as f16 (it is f32 in the file: a value beyond the smaller type's range)"), "{e}");
        assert_eq!(check_stage("the vocoder", vec![1.0, -3e38, 3e38]).unwrap().len(), 3, "huge but finite values pass");
        let e = check_stage("the vocoder", vec![1.0, f32::NEG_INFINITY, f32::NAN]).unwrap_err();
        assert!(e.starts_with("the vocoder produced 2 non-finite values (NaN or infinity) of 3;"), "{e}");
        assert!(check_values("x", &[]).is_ok());
    }
}
