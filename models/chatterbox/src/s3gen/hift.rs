//! HiFT graphs: the F0 predictor and the decoder (the excitation's STFT, the
//! body's log-magnitude and phase channels, and the ISTFT head down to the
//! clamped waveform). The sine source and the trim fade run on the host
//! (`source.rs`): the source's phase is a long float32 running sum whose
//! rounding the reference fixes. The transforms are products with windowed
//! DFT bases derived at load ([`stft_bases`]); `source.rs` keeps FFT
//! versions of them as the host reference.
//!
//! Layout: time-first `[frames, channels]` (ne0 = time), which is what the
//! builder's 1-D convolution and ggml's transposed convolution take.

use crate::hparams::HiftHparams;
use engine_core::model_kit::{Builder, DerivedTensor};
use ggml_sys::{GraphIo, Result, Tensor, TYPE_F32};

pub const MEL: &str = "mel";
pub const F0: &str = "f0";
pub const SOURCE: &str = "source";
pub const CONV_POST: &str = "conv_post";
pub const WAV: &str = "wav";

/// Derived tensors: the windowed forward DFT `[n_fft, n_fft + 2]` (real rows,
/// then imaginary), the windowed inverse `[n_fft + 2, n_fft]` (with 1/n_fft
/// and the one-sided spectrum's factor 2) and the squared window `[n_fft, 1]`.
const STFT_BASIS: &str = "hift.stft.basis";
const ISTFT_BASIS: &str = "hift.istft.basis";
const WINDOW_SQUARED: &str = "hift.istft.window_sq";

const P: &str = "hift";
const F32: usize = std::mem::size_of::<f32>();

/// `mel` `[mel_channels, T]` (frame-major, as the CFM produces it) → `f0` `[T]` in Hz.
pub fn build_f0<'c>(b: &Builder<'c, '_>, hp: &HiftHparams, mel_channels: usize, frames: usize) -> Result<GraphIo<'c>> {
    let ctx = b.ctx;
    let mel = ctx.new_tensor(TYPE_F32, &[mel_channels as i64, frames as i64])?.set_name(MEL);
    let mut x = ctx.cont(ctx.transpose(mel)?)?;
    for l in 0..hp.f0_layers {
        let prefix = format!("{P}.f0_predictor.condnet.{}", 2 * l);
        x = ctx.elu(conv(b, x, &prefix, 1, hp.f0_kernel / 2, 1)?)?;
    }
    let x = ctx.cont(ctx.transpose(x)?)?; // [C, T]
    let f0 = ctx.abs(b.linear(x, &format!("{P}.f0_predictor.classifier"))?)?;
    Ok(GraphIo { inputs: vec![(MEL, mel)], outputs: vec![(F0, f0)] })
}

/// Decoder. Inputs: `mel` `[mel_channels, T]`, `source` `[T·∏rates·hop]`
/// (the excitation). Outputs: `conv_post` `[F, n_fft+2]` (F = T·∏rates + 1
/// STFT frames: log-magnitudes then phases before `sin`) and `wav`, the
/// ISTFT head's waveform clamped to ±`audio_limit`.
pub fn build_decoder<'c>(b: &Builder<'c, '_>, hp: &HiftHparams, mel_channels: usize, frames: usize) -> Result<GraphIo<'c>> {
    let ctx = b.ctx;
    let samples = frames * hp.samples_per_frame();
    let mel = ctx.new_tensor(TYPE_F32, &[mel_channels as i64, frames as i64])?.set_name(MEL);
    let excitation = ctx.new_tensor(TYPE_F32, &[samples as i64])?.set_name(SOURCE);
    let source = stft(b, hp, excitation)?;

    let x = ctx.cont(ctx.transpose(mel)?)?;
    let mut x = conv(b, x, &format!("{P}.conv_pre"), 1, hp.conv_pre_kernel / 2, 1)?;
    let stages = hp.upsample_rates.len();
    let n_res = hp.resblock_kernels.len();
    // The source branch of stage i sees the STFT downsampled by the rates still to come.
    let mut remaining: usize = hp.upsample_rates.iter().product();
    for i in 0..stages {
        let (rate, kernel) = (hp.upsample_rates[i], hp.upsample_kernels[i]);
        x = b.leaky_relu(x, hp.lrelu_slope)?;
        x = upsample(b, x, &format!("{P}.ups.{i}"), rate, kernel)?;
        if i == stages - 1 {
            x = ctx.pad_reflect_1d(x, 1, 0)?;
        }
        remaining /= rate;
        let si = if remaining == 1 {
            conv(b, source, &format!("{P}.source_downs.{i}"), 1, 0, 1)?
        } else {
            conv(b, source, &format!("{P}.source_downs.{i}"), remaining, remaining / 2, 1)?
        };
        let si = resblock(b, hp, si, &format!("{P}.source_resblocks.{i}"), hp.source_resblock_kernels[i])?;
        x = ctx.add(x, si)?;
        let mut sum: Option<Tensor<'c>> = None;
        for (j, &k) in hp.resblock_kernels.iter().enumerate() {
            let r = resblock(b, hp, x, &format!("{P}.resblocks.{}", i * n_res + j), k)?;
            sum = Some(match sum {
                None => r,
                Some(s) => ctx.add(s, r)?,
            });
        }
        x = ctx.scale(sum.expect("at least one resblock"), 1.0 / n_res as f32)?;
    }
    // PyTorch's default slope here, not `lrelu_slope`.
    let x = b.leaky_relu(x, 0.01)?;
    let out = conv(b, x, &format!("{P}.conv_post"), 1, hp.conv_post_kernel / 2, 1)?;
    let wav = istft_head(b, hp, out)?;
    Ok(GraphIo { inputs: vec![(MEL, mel), (SOURCE, excitation)], outputs: vec![(CONV_POST, out), (WAV, wav)] })
}

/// `torch.stft(x, n_fft, hop, hann, center=True, pad_mode="reflect")` of
/// `x` `[L]` as `[L/hop + 1, n_fft + 2]` (real parts, then imaginary): the
/// reflect-padded signal convolved at stride `hop` with the DFT basis, each
/// basis row an output channel.
fn stft<'c>(b: &Builder<'c, '_>, hp: &HiftHparams, x: Tensor<'c>) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let n = hp.n_fft as i64;
    let len = x.ne()[0];
    let padded = ctx.pad_reflect_1d(ctx.reshape(x, &[len, 1])?, (n / 2) as i32, (n / 2) as i32)?;
    let basis = ctx.reshape(b.w(STFT_BASIS)?, &[n, 1, n + 2])?;
    b.conv_1d(basis, padded, hp.hop, 0, 1)
}

/// The head on `conv_post` `[F, 2·bins]`: magnitude `min(e^x, 100)`, phase
/// `sin(x)`, the windowed inverse of every frame, overlap-added and divided
/// by the window's squared envelope (`torch.istft`, center=True), clamped.
fn istft_head<'c>(b: &Builder<'c, '_>, hp: &HiftHparams, conv_post: Tensor<'c>) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let (n, hop) = (hp.n_fft as i64, hp.hop as i64);
    let bins = n / 2 + 1;
    let [f, _, _, _] = conv_post.ne();
    let nb1 = conv_post.nb()[1];
    let log_mag = ctx.view(conv_post, &[f, bins], &[nb1], 0)?;
    let phase = ctx.sin(ctx.view(conv_post, &[f, bins], &[nb1], bins as usize * nb1)?)?;
    let mag = ctx.clamp(ctx.exp(log_mag)?, f32::MIN, 100.0)?;
    let re = ctx.mul(mag, ctx.cos(phase)?)?;
    let im = ctx.mul(mag, ctx.sin(phase)?)?;
    let spectrum = ctx.cont(ctx.transpose(ctx.concat(re, im, 1)?)?)?; // [2·bins, F]
    let frames = ctx.mul_mat(b.w(ISTFT_BASIS)?, spectrum)?; // [n_fft, F], windowed
    let window_sq = ctx.repeat_to(b.w(WINDOW_SQUARED)?, [n, f, 1, 1])?;
    let y = ctx.div(overlap_add(b, frames, hop)?, overlap_add(b, window_sq, hop)?)?;
    let total = y.ne()[0] * y.ne()[1];
    let y = ctx.view(ctx.reshape(y, &[total])?, &[total - n], &[], (n / 2) as usize * F32)?;
    ctx.clamp(y, -hp.audio_limit, hp.audio_limit)
}

/// Overlap-add of frames `[n, F]` at `hop` (n a multiple of it) →
/// `[hop, F + n/hop − 1]`, i.e. `n + hop·(F − 1)` samples: output block `j`
/// sums the `q`-th hop of frame `j − q` over q, each q a view of the frames
/// padded with empty ones (the adds run as one kernel where fused).
fn overlap_add<'c>(b: &Builder<'c, '_>, frames: Tensor<'c>, hop: i64) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let [n, f, _, _] = frames.ne();
    let q = n / hop;
    // Padded as one row: ggml-cuda's PAD launches a block row per ne1, and
    // minutes of audio have more frames than a grid dimension allows.
    let edge = ((q - 1) * n) as i32;
    let flat = ctx.pad_ext(ctx.reshape(frames, &[n * f])?, [[edge, edge], [0, 0], [0, 0], [0, 0]])?;
    let padded = ctx.reshape(flat, &[n, f + 2 * (q - 1)])?;
    let nb1 = padded.nb()[1];
    let part = |j: i64| ctx.view(padded, &[hop, f + q - 1], &[nb1], (q - 1 - j) as usize * nb1 + (j * hop) as usize * F32);
    let mut sum = part(0)?;
    for j in 1..q {
        sum = ctx.add(sum, part(j)?)?;
    }
    Ok(sum)
}

/// The STFT's and ISTFT's bases and the squared window, for `add_derived`.
pub fn stft_bases(hp: &HiftHparams) -> Vec<DerivedTensor> {
    let n = hp.n_fft;
    let bins = n / 2 + 1;
    let tau = std::f64::consts::TAU;
    let window: Vec<f64> = (0..n).map(|i| 0.5 - 0.5 * (tau * i as f64 / n as f64).cos()).collect();
    let angle = |k: usize, i: usize| tau * ((k * i) % n) as f64 / n as f64;
    let mut forward = vec![0f32; n * 2 * bins];
    let mut inverse = vec![0f32; 2 * bins * n];
    for k in 0..bins {
        // DC and Nyquist appear once in the one-sided sum, their imaginary parts not at all.
        let edge = k == 0 || 2 * k == n;
        let weight = if edge { 1.0 } else { 2.0 } / n as f64;
        for i in 0..n {
            let (sin, cos) = angle(k, i).sin_cos();
            forward[k * n + i] = (window[i] * cos) as f32;
            forward[(bins + k) * n + i] = (-window[i] * sin) as f32;
            inverse[i * 2 * bins + k] = (weight * cos * window[i]) as f32;
            inverse[i * 2 * bins + bins + k] = if edge { 0.0 } else { (-weight * sin * window[i]) as f32 };
        }
    }
    vec![
        DerivedTensor { name: STFT_BASIS.into(), ne: vec![n as i64, 2 * bins as i64], values: forward },
        DerivedTensor { name: ISTFT_BASIS.into(), ne: vec![2 * bins as i64, n as i64], values: inverse },
        DerivedTensor { name: WINDOW_SQUARED.into(), ne: vec![n as i64, 1], values: window.iter().map(|w| (w * w) as f32).collect() },
    ]
}

/// Per-channel vector `[C]` as `[1, C]`, broadcastable over time.
fn channel_vec<'c>(b: &Builder<'c, '_>, name: &str) -> Result<Tensor<'c>> {
    let w = b.w(name)?;
    b.ctx.reshape(w, &[1, w.ne()[0]])
}

/// A convolution with `prefix.weight` and `prefix.bias` on time-first `x`.
fn conv<'c>(b: &Builder<'c, '_>, x: Tensor<'c>, prefix: &str, stride: usize, pad: usize, dilation: usize) -> Result<Tensor<'c>> {
    let y = b.conv_1d(b.w(&format!("{prefix}.weight"))?, x, stride, pad, dilation)?;
    b.ctx.add(y, channel_vec(b, &format!("{prefix}.bias"))?)
}

/// ConvTranspose1d with padding (k − rate)/2: the full transposed convolution,
/// cropped on both sides (ggml's takes no padding).
fn upsample<'c>(b: &Builder<'c, '_>, x: Tensor<'c>, prefix: &str, rate: usize, kernel: usize) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let full = b.conv_transpose_1d(b.w(&format!("{prefix}.weight"))?, x, rate)?;
    let pad = (kernel - rate) / 2;
    let len = x.ne()[0] * rate as i64;
    let [_, c, _, _] = full.ne();
    let y = ctx.view(full, &[len, c], &[full.nb()[1]], pad * std::mem::size_of::<f32>())?;
    ctx.add(y, channel_vec(b, &format!("{prefix}.bias"))?)
}

/// Suffix of the derived tensor holding `1/(α + 1e-9)` for a Snake's `α`.
const SNAKE_RECIPROCAL: &str = ".reciprocal";

/// Every Snake's `1/(α + 1e-9)` as `[1, C]`, computed once at load: a graph
/// then multiplies by it instead of adding and dividing per run.
pub fn snake_reciprocals(weights: &engine_core::model_kit::Weights) -> Result<Vec<DerivedTensor>> {
    let alphas: Vec<String> = weights.names().filter(|n| n.starts_with(P) && n.ends_with(".alpha")).map(str::to_string).collect();
    alphas
        .into_iter()
        .map(|name| {
            let values: Vec<f32> = weights.host_f32(&name)?.iter().map(|a| 1.0 / (a + 1e-9)).collect();
            Ok(DerivedTensor { ne: vec![1, values.len() as i64], name: format!("{name}{SNAKE_RECIPROCAL}"), values })
        })
        .collect()
}

/// `x + 1/(α + 1e-9) · sin²(αx)`, α per channel. The ops come in the order
/// (MUL, SIN, SQR, MUL, ADD) that ggml-cuda runs as one Snake kernel: the
/// reciprocal is a weight of shape `[1, C]`, no node of its own between them.
fn snake<'c>(b: &Builder<'c, '_>, x: Tensor<'c>, alpha_name: &str) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let reciprocal = b.w(&format!("{alpha_name}{SNAKE_RECIPROCAL}"))?;
    let alpha = channel_vec(b, alpha_name)?;
    let s = ctx.mul(ctx.sqr(ctx.sin(ctx.mul(x, alpha)?)?)?, reciprocal)?;
    ctx.add(x, s)
}

/// HiFi-GAN ResBlock with Snake: for each dilation d,
/// `x += conv2(snake(conv1_d(snake(x))))`.
fn resblock<'c>(b: &Builder<'c, '_>, hp: &HiftHparams, mut x: Tensor<'c>, prefix: &str, kernel: usize) -> Result<Tensor<'c>> {
    for (i, &d) in hp.resblock_dilations.iter().enumerate() {
        let h = snake(b, x, &format!("{prefix}.activations1.{i}.alpha"))?;
        let h = conv(b, h, &format!("{prefix}.convs1.{i}"), 1, d * (kernel - 1) / 2, d)?;
        let h = snake(b, h, &format!("{prefix}.activations2.{i}.alpha"))?;
        let h = conv(b, h, &format!("{prefix}.convs2.{i}"), 1, (kernel - 1) / 2, 1)?;
        x = b.ctx.add(x, h)?;
    }
    Ok(x)
}
