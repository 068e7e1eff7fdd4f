//! The S3Tokenizer (V2): the log mel of a 16 kHz recording → 25 Hz speech
//! tokens, the reference voice's prompt for T3 and S3Gen (REF
//! `s3tokenizer/model_v2.py`, through `S3Tokenizer.forward`).
//!
//! Graph ([`build`]), channels-first `[D, T]`: two stride-2 convolutions with
//! GELU (100 → 25 Hz), then blocks of pre-norm attention with rotary
//! positions plus an FSMN memory (a depthwise convolution over the values,
//! added to them), and a GELU MLP; finally FSQ's projection. Host
//! ([`quantize`]): each projected value through `tanh`, ×0.999, rounded to
//! −1/0/1, read as the digits of a base-3 token.

use crate::hparams::TokenizerHparams;
use engine_core::model_kit::{Builder, DerivedTensor, Weights};
use ggml_sys::{GraphIo, Result, Tensor, TYPE_F32, TYPE_I32};

pub const MEL: &str = "s3tok.mel";
pub const POSITIONS: &str = "s3tok.positions";
/// `[fsq_dims, tokens]`: FSQ's projection, before `tanh` and rounding.
pub const PROJECTION: &str = "s3tok.projection";

const P: &str = "s3tok.encoder";
/// Mel frames per token: two stride-2 convolutions.
pub const FRAMES_PER_TOKEN: usize = 4;

/// Tokens for `frames` mel frames: `(T − 1) / 2 + 1` twice (kernel 3, padding 1, stride 2).
pub fn token_count(frames: usize) -> usize {
    let half = |t: usize| (t.max(1) - 1) / 2 + 1;
    half(half(frames))
}

fn taps_name(layer: usize) -> String {
    format!("{P}.blocks.{layer}.attn.fsmn_taps")
}

/// The FSMN kernels as `[D, K]` (channel fastest), the layout the depthwise
/// convolution reads; the file keeps PyTorch's `[K, 1, D]`.
pub fn fsmn_taps(weights: &Weights, tok: &TokenizerHparams) -> engine_core::model_kit::Result<Vec<DerivedTensor>> {
    (0..tok.n_layer)
        .map(|l| Ok(DerivedTensor::taps_outermost(weights, &format!("{P}.blocks.{l}.attn.fsmn_block.weight"), taps_name(l), &[tok.n_state as i64])?))
        .collect()
}

/// Inputs [`MEL`] `[n_mels, frames]` and [`POSITIONS`] (I32, `0..tokens`);
/// output [`PROJECTION`].
pub fn build<'c>(b: &Builder<'c, '_>, tok: &TokenizerHparams, frames: usize) -> Result<GraphIo<'c>> {
    let ctx = b.ctx;
    let tokens = token_count(frames) as i64;
    let mel = ctx.new_tensor(TYPE_F32, &[tok.n_mels as i64, frames as i64])?.set_name(MEL);
    let positions = ctx.new_tensor(TYPE_I32, &[tokens])?.set_name(POSITIONS);
    let conv = |x: Tensor<'c>, name: &str| -> Result<Tensor<'c>> {
        let padded = ctx.pad_ext(x, [[0, 0], [1, 1], [0, 0], [0, 0]])?;
        let y = ctx.conv_1d(b.w(&format!("{P}.{name}.weight"))?, padded, 2, 1)?;
        ctx.gelu_erf(ctx.add(y, b.w(&format!("{P}.{name}.bias"))?)?)
    };
    let mut x = conv(conv(mel, "conv1")?, "conv2")?;
    for l in 0..tok.n_layer {
        x = block(b, tok, x, positions, l)?;
    }
    let projection = b.linear(x, "s3tok.quantizer._codebook.project_down")?.set_name(PROJECTION);
    Ok(GraphIo { inputs: vec![(MEL, mel), (POSITIONS, positions)], outputs: vec![(PROJECTION, projection)] })
}

/// `x += out(attention(LN(x))) + fsmn(v)`, `x += MLP(LN(x))`.
fn block<'c>(b: &Builder<'c, '_>, tok: &TokenizerHparams, x: Tensor<'c>, positions: Tensor<'c>, layer: usize) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let p = format!("{P}.blocks.{layer}");
    let (d, heads) = (tok.n_state as i64, tok.n_head as i64);
    let (hd, t) = (d / heads, x.ne()[1]);
    let h = b.layer_norm(x, &format!("{p}.attn_ln"), tok.layer_norm_eps)?;
    // Rotary positions on [hd, heads, T], then heads outermost for attention.
    let rotated = |y: Tensor<'c>| -> Result<Tensor<'c>> {
        let y = ctx.rope_neox(ctx.reshape(y, &[hd, heads, t])?, positions, None, tok.rope_base)?;
        ctx.permute(y, [0, 2, 1, 3])
    };
    let q = rotated(b.linear(h, &format!("{p}.attn.query"))?)?;
    let k = rotated(b.linear_no_bias(h, &format!("{p}.attn.key.weight"))?)?;
    let v = b.linear(h, &format!("{p}.attn.value"))?; // [D, T]
    let v_heads = ctx.permute(ctx.reshape(v, &[hd, heads, t])?, [0, 2, 1, 3])?;
    // The reference scales q and k by hd^-1/4 each.
    let attn = b.attention(q, k, v_heads, None, 1.0 / (hd as f32).sqrt())?;
    let attn = b.linear(ctx.reshape(attn, &[d, t])?, &format!("{p}.attn.out"))?;
    // FSMN memory: a symmetric depthwise convolution over the values, plus them.
    let pad = (tok.fsmn_kernel / 2) as i32;
    let memory = b.depthwise_conv_1d(b.w(&taps_name(layer))?, ctx.pad_ext(v, [[0, 0], [pad, pad], [0, 0], [0, 0]])?, 1)?;
    let memory = ctx.add(ctx.reshape(memory, &[d, t])?, v)?;
    let x = ctx.add(ctx.add(x, attn)?, memory)?;
    let h = b.layer_norm(x, &format!("{p}.mlp_ln"), tok.layer_norm_eps)?;
    let h = b.linear(ctx.gelu_erf(b.linear(h, &format!("{p}.mlp.0"))?)?, &format!("{p}.mlp.2"))?;
    ctx.add(x, h)
}

/// FSQ on the projection `[token][fsq_dims]`: digit `i` of a token is
/// `round(0.999·tanh(h_i)) + 1` (ties to even, as `torch.round`), worth `levels^i`.
pub fn quantize(projection: &[f32], tok: &TokenizerHparams) -> Vec<i32> {
    // The reference's 0.9990000128746033 is 0.999 rounded to f32.
    const SCALE: f32 = 0.999;
    projection
        .chunks_exact(tok.fsq_dims)
        .map(|h| h.iter().rev().fold(0i32, |acc, &v| acc * tok.fsq_levels as i32 + ((v.tanh() * SCALE).round_ties_even() as i32 + 1)))
        .collect()
}

/// Nodes of a [`build`] graph, bounded: under 64 per block plus 4 per FSMN
/// tap (the depthwise fallback), 64 for the rest.
pub fn max_nodes(tok: &TokenizerHparams) -> usize {
    (64 + 4 * tok.fsmn_kernel) * tok.n_layer + 64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hp() -> TokenizerHparams {
        TokenizerHparams {
            n_mels: 128,
            n_state: 64,
            n_head: 1,
            n_layer: 1,
            n_ff: 256,
            fsmn_kernel: 31,
            rope_base: 10000.0,
            rope_positions: 2048,
            fsq_dims: 8,
            fsq_levels: 3,
            layer_norm_eps: 1e-5,
        }
    }

    #[test]
    fn tokens_are_a_quarter_of_the_frames_rounded_up() {
        assert_eq!(token_count(1500), 375);
        assert_eq!(token_count(1001), 251);
        assert_eq!(token_count(1), 1);
    }

    #[test]
    fn fsq_digits_are_little_endian_base_three() {
        let tok = hp();
        // tanh(±3) ≈ ±0.995 → ±1; tanh(0.1) → 0; digit 0 is the least significant.
        let mut h = [0.1f32; 8];
        assert_eq!(quantize(&h, &tok), vec![(0..8).map(|i| 3i32.pow(i)).sum::<i32>()]);
        h[0] = 3.0;
        h[7] = -3.0;
        assert_eq!(quantize(&h, &tok), vec![2 + (1..7).map(|i| 3i32.pow(i)).sum::<i32>()]);
        // Every digit −1: token 0.
        assert_eq!(quantize(&[-3.0; 8], &tok), vec![0]);
    }
}
