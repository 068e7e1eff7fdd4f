//! The storage types a converter writes and their encoders, bit for bit the
//! same as gguf-py 0.19's `gguf.quants.quantize` (Q8_0, Q4_0, BF16) and
//! NumPy's `astype(np.float16)` (F16), which the Python converters use: the
//! native converters must write byte-identical GGUFs.
//!
//! The Python encoders compute in float32 NumPy arithmetic; each step here is
//! the same IEEE float32 operation in the same order (no fused multiply-add,
//! no reassociation), so the results agree bit for bit. What that takes, per
//! type:
//! - Q8_0: `d = max|x| / 127`, `id = 1/d` (0 where `d == 0`), each value
//!   `x·id` rounded half away from zero (gguf-py's `np_roundf`), `d` stored
//!   as f16.
//! - Q4_0: the value of largest magnitude (the first such, as `argmax` picks;
//!   its sign kept), `d = max / -8`, `id` as above, `trunc(x·id + 8.5)`
//!   clipped to 15; byte `j` packs values `j` and `j + 16`.
//! - BF16: ggml's `ggml_compute_fp32_to_bf16`: NaNs made quiet, others
//!   rounded to nearest even.
//! - F16: round to nearest even with subnormals, as NumPy and `half` both do;
//!   a NaN keeps its payload the way NumPy's software conversion keeps it.

/// A tensor's storage type in a GGUF (ggml's `ggml_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    I16,
    I32,
}

/// Values per Q8_0 / Q4_0 block.
const QK: usize = 32;

impl GgmlType {
    /// Every type, for option parsing and tests.
    pub const ALL: [GgmlType; 7] = [GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::I16, GgmlType::I32];

    /// ggml's type id, as a GGUF's tensor info holds it.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q8_0 => 8,
            GgmlType::I16 => 25,
            GgmlType::I32 => 26,
            GgmlType::BF16 => 30,
        }
    }

    /// The lower-case name converters' options use ("f32", "q8_0", …).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "f32",
            GgmlType::F16 => "f16",
            GgmlType::BF16 => "bf16",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::I16 => "i16",
            GgmlType::I32 => "i32",
        }
    }

    /// The type named `name` (as [`GgmlType::name`] spells it).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Values per block: 32 for Q8_0 and Q4_0, else 1. A quantized tensor's
    /// rows (its last dimension) must be a whole number of blocks.
    pub fn block_len(self) -> usize {
        match self {
            GgmlType::Q8_0 | GgmlType::Q4_0 => QK,
            _ => 1,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::I32 => 4,
            GgmlType::F16 | GgmlType::BF16 | GgmlType::I16 => 2,
            GgmlType::Q8_0 => 2 + QK,
            GgmlType::Q4_0 => 2 + QK / 2,
        }
    }

    /// Whether values of this type are encoded from floats (all but I16/I32).
    pub fn is_float(self) -> bool {
        !matches!(self, GgmlType::I16 | GgmlType::I32)
    }

    /// The bytes `values` take in this type (`values` a whole number of blocks).
    pub fn bytes_for(self, values: usize) -> usize {
        values / self.block_len() * self.block_bytes()
    }

    /// `values` (a whole number of blocks, in row-major order) in this type,
    /// with the same bits as gguf-py / NumPy produce.
    ///
    /// # Panics
    /// For I16/I32 (not float types) and when `values.len()` is not a multiple
    /// of [`GgmlType::block_len`]; the GGUF writer checks both before it
    /// encodes anything.
    pub fn encode(self, values: &[f32]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.bytes_for(values.len()));
        self.encode_into(values, &mut out);
        out
    }

    /// [`GgmlType::encode`], appending to `out`.
    pub fn encode_into(self, values: &[f32], out: &mut Vec<u8>) {
        assert!(self.is_float(), "{} is not a float storage type", self.name());
        assert!(values.len().is_multiple_of(self.block_len()), "{} values are not whole {} blocks", values.len(), self.name());
        match self {
            GgmlType::F32 => values.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            GgmlType::F16 => values.iter().for_each(|&v| out.extend_from_slice(&f16_bits(v).to_le_bytes())),
            GgmlType::BF16 => values.iter().for_each(|&v| out.extend_from_slice(&bf16_bits(v).to_le_bytes())),
            GgmlType::Q8_0 => values.chunks_exact(QK).for_each(|b| q8_0_block(b, out)),
            GgmlType::Q4_0 => values.chunks_exact(QK).for_each(|b| q4_0_block(b, out)),
            GgmlType::I16 | GgmlType::I32 => unreachable!(),
        }
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// ggml's fp32 → bf16 (gguf-py's `BF16.quantize_blocks`): a NaN keeps its
/// sign and top bits with the quiet bit set; anything else rounds to nearest
/// even (the carry of the largest finite values makes infinity).
fn bf16_bits(v: f32) -> u16 {
    let mut n = v.to_bits();
    if n & 0x7fff_ffff > 0x7f80_0000 {
        n = (n & 0xffff_0000) | (64 << 16);
    }
    ((n as u64 + (0x7fff + ((n >> 16) & 1)) as u64) >> 16) as u16
}

/// NumPy's float32 → float16 (`npy_floatbits_to_halfbits`): round to
/// nearest even with subnormals, as `half` does, and a NaN keeps its sign and
/// top significand bits without being made quiet (`half`, like the F16C
/// instruction, sets the quiet bit), staying a NaN.
fn f16_bits(v: f32) -> u16 {
    if v.is_nan() {
        let bits = v.to_bits();
        let sign = ((bits >> 16) & 0x8000) as u16;
        let mut h = 0x7c00 + ((bits & 0x007f_ffff) >> 13) as u16;
        if h == 0x7c00 {
            h += 1;
        }
        sign | h
    } else {
        half::f16::from_f32(v).to_bits()
    }
}

/// gguf-py's `np_roundf`: half away from zero, computed as it does.
fn np_roundf(n: f32) -> f32 {
    let a = n.abs();
    let floored = a.floor();
    let b = floored + (2.0 * (a - floored)).floor();
    np_sign(n) * b
}

/// `np.sign`: -1, 0 or 1 (NaN stays NaN).
fn np_sign(n: f32) -> f32 {
    if n > 0.0 {
        1.0
    } else if n < 0.0 {
        -1.0
    } else {
        n * 0.0
    }
}

/// `np.where(d == 0, 0, 1 / d)` in float32.
fn inverse_or_zero(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// A float32 → int8 cast as NumPy's C cast does it for the in-range values a
/// block produces (a NaN from a NaN input becomes 0, as on x86).
fn to_i8(v: f32) -> u8 {
    (v as i32) as i8 as u8
}

fn q8_0_block(block: &[f32], out: &mut Vec<u8>) {
    // `abs(blocks).max(axis=1)`: a NaN anywhere makes the maximum NaN.
    let amax = block.iter().map(|v| v.abs()).fold(block[0].abs(), |m, a| if a.is_nan() || a > m { a } else { m });
    let d = amax / 127.0;
    let id = inverse_or_zero(d);
    out.extend_from_slice(&f16_bits(d).to_le_bytes());
    out.extend(block.iter().map(|&v| to_i8(np_roundf(v * id))));
}

fn q4_0_block(block: &[f32], out: &mut Vec<u8>) {
    // `abs(blocks).argmax()`: the first index of the largest magnitude, or
    // of the first NaN.
    let mut imax = 0;
    let mut best = block[0].abs();
    if !best.is_nan() {
        for (i, v) in block.iter().enumerate().skip(1) {
            let a = v.abs();
            if a.is_nan() {
                imax = i;
                break;
            }
            if a > best {
                best = a;
                imax = i;
            }
        }
    }
    let d = block[imax] / -8.0;
    let id = inverse_or_zero(d);
    let q = |v: f32| -> u8 {
        // `np.trunc(x·id + 8.5).astype(np.uint8).clip(0, 15)`; the sum lies
        // in [0, 16.5] for finite input, a NaN casts to 0.
        let t = (v * id + 8.5).trunc();
        ((t as i32) as u8).min(15)
    };
    out.extend_from_slice(&f16_bits(d).to_le_bytes());
    let (low, high) = block.split_at(QK / 2);
    out.extend(low.iter().zip(high).map(|(&a, &b)| q(a) | (q(b) << 4)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_names_and_sizes_are_ggml_s() {
        let expected = [("f32", 0, 1, 4), ("f16", 1, 1, 2), ("bf16", 30, 1, 2), ("q8_0", 8, 32, 34), ("q4_0", 2, 32, 18), ("i16", 25, 1, 2), ("i32", 26, 1, 4)];
        for (t, (name, id, block, bytes)) in GgmlType::ALL.into_iter().zip(expected) {
            assert_eq!((t.name(), t.id(), t.block_len(), t.block_bytes()), (name, id, block, bytes));
            assert_eq!(GgmlType::from_name(name), Some(t));
        }
    }

    #[test]
    fn q8_0_of_a_known_block() {
        // max |x| = 127: d = 1, values rounded half away from zero.
        let mut b = [0f32; 32];
        b[0] = 127.0;
        b[1] = 2.5;
        b[2] = -2.5;
        b[3] = 0.49;
        let bytes = GgmlType::Q8_0.encode(&b);
        assert_eq!(&bytes[..2], &half::f16::from_f32(1.0).to_le_bytes());
        assert_eq!(&bytes[2..6], &[127, 3, (-3i8) as u8, 0]);
        // An all-zero block: d = 0, every value 0.
        assert_eq!(GgmlType::Q8_0.encode(&[0.0; 32]), vec![0u8; 34]);
    }

    #[test]
    fn q4_0_keeps_the_sign_of_the_largest_magnitude() {
        let mut b = [0f32; 32];
        b[5] = -8.0; // d = 1
        b[16] = 3.0;
        let bytes = GgmlType::Q4_0.encode(&b);
        assert_eq!(&bytes[..2], &half::f16::from_f32(1.0).to_le_bytes());
        // value 0 → trunc(8.5) = 8; -8 → 0; 3 → 11 (high nibble of byte 0).
        assert_eq!(bytes[2], 8 | (11 << 4));
        assert_eq!(bytes[2 + 5], 8 << 4);
    }

    #[test]
    fn f16_nans_keep_numpy_s_payloads() {
        let nan = |bits: u32| f16_bits(f32::from_bits(bits));
        assert_eq!([nan(0x7fc0_0000), nan(0x7f80_0001), nan(0xffc0_0001), nan(0x7fa0_0000)], [0x7e00, 0x7c01, 0xfe00, 0x7d00]);
        assert_eq!(f16_bits(65520.0), 0x7c00);
        assert_eq!(f16_bits(-0.0), 0x8000);
    }

    #[test]
    fn bf16_rounds_to_nearest_even_and_quiets_nans() {
        assert_eq!(bf16_bits(1.0), 0x3f80);
        assert_eq!(bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80); // tie, even stays
        assert_eq!(bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82); // tie, odd rounds up
        assert_eq!(bf16_bits(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(bf16_bits(f32::MAX), 0x7f80);
    }
}
