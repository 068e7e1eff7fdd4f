//! Arithmetic that must give NumPy's bits: where a Python converter computes
//! a tensor (weight-norm fusion), the native converter must round the same
//! way in the same order, or the GGUFs differ in the last bit.
//!
//! NumPy sums a contiguous run of float64 values with its pairwise
//! summation (`pairwise_sum` in numpy/core/src/umath/loops_utils.h.src):
//! fewer than 8 values left to right; up to 128 in eight interleaved
//! accumulators combined as `((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7))`, then the
//! remainder left to right; more, split at half the count rounded down to a
//! multiple of 8 and each half summed so. A reduction such as
//! `x.sum(axis=1)` hands the inner loop at most the iterator's buffer
//! (8192 values, `np.getbufsize()`) at a time, adding each block's pairwise
//! sum to the running total that starts at 0: [`numpy_sum_f64`].

use super::super::error::{Error, Result};
use ndarray::{ArrayD, IxDyn};

/// NumPy's pairwise summation of `values` (the algorithm, without the
/// buffering of a reduction: see [`numpy_sum_f64`]).
pub fn pairwise_sum_f64(values: &[f64]) -> f64 {
    let n = values.len();
    if n < 8 {
        let mut res = 0.0;
        for &v in values {
            res += v;
        }
        res
    } else if n <= PW_BLOCKSIZE {
        let mut r = [0f64; 8];
        r.copy_from_slice(&values[..8]);
        let whole = n - n % 8;
        let mut i = 8;
        while i < whole {
            for (j, acc) in r.iter_mut().enumerate() {
                *acc += values[i + j];
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for &v in &values[whole..] {
            res += v;
        }
        res
    } else {
        let mut n2 = n / 2;
        n2 -= n2 % 8;
        pairwise_sum_f64(&values[..n2]) + pairwise_sum_f64(&values[n2..])
    }
}

/// NumPy's unrolled block (`PW_BLOCKSIZE`).
const PW_BLOCKSIZE: usize = 128;

/// NumPy's default ufunc buffer size, the most values a reduction's inner
/// loop receives at once.
pub const NUMPY_BUFSIZE: usize = 8192;

/// What `np.sum` / `arr.sum(axis=-1)` gives for a contiguous float64 row:
/// the pairwise sums of its 8192-value blocks added in order to 0.
pub fn numpy_sum_f64(values: &[f64]) -> f64 {
    let mut total = 0.0;
    for block in values.chunks(NUMPY_BUFSIZE) {
        total += pairwise_sum_f64(block);
    }
    total
}

/// Weight normalisation fused into one weight, bit for bit as
/// tools/chatterbox/convert.py's `fuse_weight_norm` computes it in float64:
/// `w = g·v / ‖v‖`, the norm over every dimension of `v` but the first
/// (`sqrt((v**2).reshape(o, -1).sum(axis=1))`), cast to float32.
///
/// `g` holds one value per output row (torch's `original0`, shaped
/// `[o, 1, …]`); `v` is `original1`, shaped `[o, …]`. Shapes that do not fit
/// are an error.
pub fn fuse_weight_norm(g: &ArrayD<f32>, v: &ArrayD<f32>) -> Result<ArrayD<f32>> {
    let shape = v.shape().to_vec();
    let rows = *shape.first().ok_or_else(|| Error::msg("weight norm: v is a scalar, not a weight"))?;
    let g_fits = g.ndim() == v.ndim() && g.shape()[0] == rows && g.shape()[1..].iter().all(|&d| d == 1);
    if !g_fits {
        return Err(Error::msg(format!("weight norm: g of shape {:?} does not scale the rows of v of shape {:?}", g.shape(), shape)));
    }
    let row_len: usize = shape[1..].iter().product();
    let g: Vec<f64> = g.iter().map(|&x| x as f64).collect();
    let v: Vec<f64> = v.iter().map(|&x| x as f64).collect();
    let mut out = Vec::with_capacity(v.len());
    let mut squares = Vec::with_capacity(row_len);
    for (r, row) in v.chunks(row_len.max(1)).enumerate().take(rows) {
        squares.clear();
        squares.extend(row.iter().map(|x| x * x));
        let norm = numpy_sum_f64(&squares).sqrt();
        out.extend(row.iter().map(|&x| ((g[r] * x) / norm) as f32));
    }
    Ok(ArrayD::from_shape_vec(IxDyn(&shape), out).expect("one value per element of v"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairwise_groups_as_numpy() {
        // 1e16 + 1 loses the 1 in f64; the grouping decides which ones survive.
        let mut x = vec![1.0f64; 16];
        x[0] = 1e16;
        // Eight accumulators: r0 = 1e16 + 1 (lost), r1..r7 = 2; then
        // ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)) = 1e16 + 2 + 4 + 8 = 1e16 + 14.
        assert_eq!(pairwise_sum_f64(&x), 1e16 + 14.0);
        // Left to right, every 1 is lost.
        assert_eq!(x.iter().fold(0.0, |a, b| a + b), 1e16);
        assert_eq!(pairwise_sum_f64(&[]), 0.0);
        assert_eq!(pairwise_sum_f64(&[-0.0]), 0.0);
        assert!(pairwise_sum_f64(&[-0.0]).is_sign_positive());
    }

    #[test]
    fn weight_norm_of_a_known_row() {
        let g = ArrayD::from_shape_vec(IxDyn(&[2, 1]), vec![2.0f32, 1.0]).unwrap();
        let v = ArrayD::from_shape_vec(IxDyn(&[2, 2]), vec![3.0f32, 4.0, 0.0, -2.0]).unwrap();
        let w = fuse_weight_norm(&g, &v).unwrap();
        assert_eq!(w.iter().copied().collect::<Vec<_>>(), vec![1.2, 1.6, 0.0, -1.0]);
        let bad = ArrayD::from_shape_vec(IxDyn(&[2]), vec![2.0f32, 1.0]).unwrap();
        assert_eq!(fuse_weight_norm(&bad, &v).unwrap_err(), "weight norm: g of shape [2] does not scale the rows of v of shape [2, 2]");
    }
}
