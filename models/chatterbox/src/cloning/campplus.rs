//! CAMPPlus: the mean-subtracted Kaldi fbank of a 16 kHz recording → the
//! x-vector S3Gen conditions on (REF `s3gen/xvector.py`, `CAMPPlus.forward`).
//!
//! Layouts: the head treats the fbank as an image `[T, F, C]` (time fastest,
//! PyTorch's `(C, F, T)`); its output is `[T, C·F']`, which the strided TDNN
//! reads time-first. The dense blocks then run channels-first `[C, T]`, where
//! 1×1 convolutions are plain products and the dense concatenation appends
//! rows. Every batch norm is folded at load into a per-channel scale and shift
//! ([`fold_batch_norms`]). The dense layers' local convolutions run as one
//! product per tap ([`local_taps`]): channels-first, the frames a tap reads
//! are a contiguous slice of the padded input, so nothing is gathered.

use crate::hparams::CampplusHparams;
use crate::tensors::campplus_batch_norms;
use engine_core::model_kit::{Builder, DerivedTensor, Weights};
use ggml_sys::{GraphIo, Result, Tensor, TYPE_F32};

pub const FBANK: &str = "campplus.fbank";
/// `[1, segments, 1]`: 1 / frames of each context-pooling segment.
pub const SEGMENT_SCALE: &str = "campplus.segment_scale";
pub const XVECTOR: &str = "campplus.xvector";

fn scale_name(prefix: &str) -> String {
    format!("{prefix}.scale")
}

fn shift_name(prefix: &str) -> String {
    format!("{prefix}.shift")
}

/// Each batch norm as `scale = w / √(var + eps)`, `shift = b − mean·scale`
/// (w = 1, b = 0 when it is not affine), computed once from the file's statistics.
pub fn fold_batch_norms(weights: &Weights, c: &CampplusHparams) -> engine_core::model_kit::Result<Vec<DerivedTensor>> {
    let mut out = Vec::new();
    for bn in campplus_batch_norms(c) {
        let p = &bn.prefix;
        let (mean, var) = (weights.host_f32(&format!("{p}.running_mean"))?, weights.host_f32(&format!("{p}.running_var"))?);
        let (w, b) = match bn.affine {
            true => (weights.host_f32(&format!("{p}.weight"))?, weights.host_f32(&format!("{p}.bias"))?),
            false => (vec![1.0; bn.channels], vec![0.0; bn.channels]),
        };
        if var.iter().any(|v| !(*v >= 0.0 && v.is_finite())) {
            return Err(format!("CAMPPlus batch norm {p} has a negative or non-finite running variance").into());
        }
        let scale: Vec<f32> = (0..bn.channels).map(|i| (w[i] as f64 / (var[i] as f64 + c.bn_eps as f64).sqrt()) as f32).collect();
        let shift: Vec<f32> = (0..bn.channels).map(|i| (b[i] as f64 - mean[i] as f64 * scale[i] as f64) as f32).collect();
        let ne = vec![bn.channels as i64];
        out.push(DerivedTensor { name: scale_name(p), ne: ne.clone(), values: scale });
        out.push(DerivedTensor { name: shift_name(p), ne, values: shift });
    }
    Ok(out)
}

fn taps_name(weight: &str) -> String {
    format!("{weight}.taps")
}

fn local_kernels(c: &CampplusHparams) -> impl Iterator<Item = String> + '_ {
    c.block_layers
        .iter()
        .enumerate()
        .flat_map(|(b, &layers)| (0..layers).map(move |l| format!("campplus.block{}.tdnnd{}.cam_layer.linear_local.weight", b + 1, l + 1)))
}

/// Each local kernel `[k, in, out]` (ggml order) as one `[in, out]` matrix per
/// tap, stacked `[in, out, k]`.
pub fn local_taps(weights: &Weights, c: &CampplusHparams) -> engine_core::model_kit::Result<Vec<DerivedTensor>> {
    local_kernels(c)
        .map(|name| {
            let [_, cin, cout, _] = weights.ne(&name)?;
            Ok(DerivedTensor::taps_outermost(weights, &name, taps_name(&name), &[cin, cout])?)
        })
        .collect()
}

/// Frames after the strided TDNN for `frames` fbank frames.
pub fn tdnn_frames(c: &CampplusHparams, frames: usize) -> usize {
    (frames + 2 * (c.tdnn_kernel / 2)).saturating_sub(c.tdnn_kernel) / c.tdnn_stride + 1
}

/// The [`SEGMENT_SCALE`] input for `frames` TDNN frames: `avg_pool1d` with
/// `ceil_mode` divides the last, shorter segment by its own length.
pub fn segment_scale(c: &CampplusHparams, frames: usize) -> Vec<f32> {
    (0..frames.div_ceil(c.seg_len)).map(|s| 1.0 / (frames - s * c.seg_len).min(c.seg_len) as f32).collect()
}

/// Input [`FBANK`] `[frames, feat_dim]` (time fastest: the fbank transposed)
/// and [`SEGMENT_SCALE`]; output [`XVECTOR`] `[embedding]`.
pub fn build<'c>(b: &Builder<'c, '_>, c: &CampplusHparams, frames: usize) -> Result<GraphIo<'c>> {
    let ctx = b.ctx;
    let fbank = ctx.new_tensor(TYPE_F32, &[frames as i64, c.feat_dim as i64])?.set_name(FBANK);
    let t = tdnn_frames(c, frames);
    let segments = t.div_ceil(c.seg_len);
    let segment_scale = ctx.new_tensor(TYPE_F32, &[1, segments as i64, 1])?.set_name(SEGMENT_SCALE);

    let x = head(b, c, ctx.reshape(fbank, &[frames as i64, c.feat_dim as i64, 1])?)?;
    let [w, f, ch, _] = x.ne();
    let x = ctx.reshape(x, &[w, f * ch])?;
    let pad = (c.tdnn_kernel / 2) as i32;
    let x = ctx.conv_1d_time_first(b.w("campplus.tdnn.linear.weight")?, x, c.tdnn_stride as i32, pad, 1)?; // [t, channels]
    let mut x = relu_norm(b, ctx.cont(ctx.transpose(x)?)?, "campplus.tdnn.nl.bn")?;
    for (i, (&layers, (&kernel, &dilation))) in c.block_layers.iter().zip(c.block_kernels.iter().zip(&c.block_dilations)).enumerate() {
        for l in 0..layers {
            let p = format!("campplus.block{}.tdnnd{}", i + 1, l + 1);
            let y = cam_layer(b, c, x, &p, kernel, dilation, segment_scale)?;
            x = ctx.concat(x, y, 0)?;
        }
        let p = format!("campplus.transit{}", i + 1);
        x = conv1x1(b, relu_norm(b, x, &format!("{p}.nl.bn"))?, &format!("{p}.linear.weight"))?;
    }
    let x = relu_norm(b, x, "campplus.out_nonlinear.bn")?;
    let stats = statistics(b, x)?;
    let xvector = norm(b, conv1x1(b, stats, "campplus.dense.linear.weight")?, "campplus.dense.nl.bn")?;
    let xvector = ctx.reshape(xvector, &[c.embedding as i64])?.set_name(XVECTOR);
    Ok(GraphIo { inputs: vec![(FBANK, fbank), (SEGMENT_SCALE, segment_scale)], outputs: vec![(XVECTOR, xvector)] })
}

/// FCM: conv + BN + ReLU, two stages of residual blocks that halve the
/// frequency axis, and a last frequency-halving conv + BN + ReLU.
fn head<'c>(b: &Builder<'c, '_>, c: &CampplusHparams, x: Tensor<'c>) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let conv = |x: Tensor<'c>, name: &str, freq_stride: i32, pad: i32| b.conv_2d(b.w(name)?, x, [1, freq_stride], [pad, pad]);
    let mut x = ctx.relu(norm_2d(b, conv(x, "campplus.head.conv1.weight", 1, 1)?, "campplus.head.bn1")?)?;
    for (stage, &blocks) in c.head_blocks.iter().enumerate() {
        for j in 0..blocks {
            let p = format!("campplus.head.layer{}.{j}", stage + 1);
            // The first block of a stage halves the frequency axis; its shortcut follows.
            let stride = if j == 0 { 2 } else { 1 };
            let out = ctx.relu(norm_2d(b, conv(x, &format!("{p}.conv1.weight"), stride, 1)?, &format!("{p}.bn1"))?)?;
            let out = norm_2d(b, conv(out, &format!("{p}.conv2.weight"), 1, 1)?, &format!("{p}.bn2"))?;
            let shortcut = match j {
                0 => norm_2d(b, conv(x, &format!("{p}.shortcut.0.weight"), stride, 0)?, &format!("{p}.shortcut.1"))?,
                _ => x,
            };
            x = ctx.relu(ctx.add(out, shortcut)?)?;
        }
    }
    ctx.relu(norm_2d(b, conv(x, "campplus.head.conv2.weight", 2, 1)?, "campplus.head.bn2")?)
}

/// A CAM dense layer on `x` `[C, T]`: BN-ReLU, 1×1 to the bottleneck, BN-ReLU,
/// then the local dilated conv gated by context attention: `sigmoid(W₂
/// relu(W₁ (mean_T(h) + segment_mean(h))))`, constant within each segment.
/// Returns the `growth` new channels.
fn cam_layer<'c>(
    b: &Builder<'c, '_>,
    c: &CampplusHparams,
    x: Tensor<'c>,
    p: &str,
    kernel: usize,
    dilation: usize,
    segment_scale: Tensor<'c>,
) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let h = relu_norm(b, x, &format!("{p}.nl1.bn"))?;
    let h = relu_norm(b, conv1x1(b, h, &format!("{p}.linear1.weight"))?, &format!("{p}.nl2.bn"))?; // [bn, T]
    let pad = (kernel / 2 * dilation) as i32;
    let padded = ctx.pad_ext(h, [[0, 0], [pad, pad], [0, 0], [0, 0]])?;
    let y = conv_1d_taps(b, padded, &format!("{p}.cam_layer.linear_local.weight"), dilation)?; // [growth, T]

    let [bn, t, _, _] = h.ne();
    let (seg, segments) = (c.seg_len as i64, segment_scale.ne()[1]);
    let time_first = ctx.cont(ctx.transpose(h)?)?; // [T, bn]
    let mean = ctx.mean(time_first)?; // [1, bn]
    let whole = ctx.pad_ext(time_first, [[0, (seg * segments - t) as i32], [0, 0], [0, 0], [0, 0]])?;
    let seg_mean = ctx.mul(ctx.sum_rows(ctx.reshape(whole, &[seg, segments, bn])?)?, segment_scale)?; // [1, segments, bn]
    let context = ctx.add(seg_mean, ctx.reshape(mean, &[1, 1, bn])?)?;
    let context = ctx.cont(ctx.transpose(ctx.reshape(context, &[segments, bn])?)?)?; // [bn, segments]
    let a = ctx.relu(ctx.add(conv1x1(b, context, &format!("{p}.cam_layer.linear1.weight"))?, b.w(&format!("{p}.cam_layer.linear1.bias"))?)?)?;
    let gate = ctx.sigmoid(ctx.add(conv1x1(b, a, &format!("{p}.cam_layer.linear2.weight"))?, b.w(&format!("{p}.cam_layer.linear2.bias"))?)?)?;
    let growth = gate.ne()[0];
    let gate = ctx.repeat_to(ctx.reshape(gate, &[growth, 1, segments])?, [growth, seg, segments, 1])?;
    let gate = ctx.view(ctx.reshape(gate, &[growth, seg * segments])?, &[growth, t], &[growth as usize * std::mem::size_of::<f32>()], 0)?;
    ctx.mul(y, gate)
}

/// A 1-D convolution on channels-first `padded` `[C, T + (k − 1)·dilation]`
/// with the [`local_taps`] of `name`: tap `i` reads the contiguous slice that
/// starts at frame `i·dilation`.
fn conv_1d_taps<'c>(b: &Builder<'c, '_>, padded: Tensor<'c>, name: &str, dilation: usize) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let taps = b.w(&taps_name(name))?;
    let [ch, cout, k, _] = taps.ne();
    let t = padded.ne()[1] - (k - 1) * dilation as i64;
    let size = std::mem::size_of::<f32>();
    let frame = ch as usize * size;
    let mut y: Option<Tensor<'c>> = None;
    for tap in 0..k as usize {
        let matrix = ctx.view(taps, &[ch, cout], &[frame], tap * (ch * cout) as usize * size)?;
        let product = ctx.mul_mat(matrix, ctx.view(padded, &[ch, t], &[frame], tap * dilation * frame)?)?;
        y = Some(match y {
            Some(sum) => ctx.add(sum, product)?,
            None => product,
        });
    }
    y.ok_or_else(|| ggml_sys::Error::Msg(format!("{name} has no taps")))
}

/// Mean and unbiased standard deviation over time of `x` `[C, T]`, stacked `[2C, 1]`.
fn statistics<'c>(b: &Builder<'c, '_>, x: Tensor<'c>) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let [ch, t, _, _] = x.ne();
    let time_first = ctx.cont(ctx.transpose(x)?)?; // [T, C]
    let mean = ctx.mean(time_first)?; // [1, C]
    let var = ctx.scale(ctx.sum_rows(ctx.sqr(ctx.sub(time_first, mean)?)?)?, 1.0 / (t - 1) as f32)?;
    let stats = ctx.concat(ctx.reshape(mean, &[ch])?, ctx.reshape(ctx.sqrt(var)?, &[ch])?, 0)?;
    ctx.reshape(stats, &[2 * ch, 1])
}

/// A kernel-1 convolution (`[1, in, out]`) on channels-first `x` `[in, T]`.
fn conv1x1<'c>(b: &Builder<'c, '_>, x: Tensor<'c>, name: &str) -> Result<Tensor<'c>> {
    let w = b.w(name)?;
    let [_, cin, cout, _] = w.ne();
    b.ctx.mul_mat(b.ctx.reshape(w, &[cin, cout])?, x)
}

/// A folded batch norm on channels-first `x` `[C, …]`.
fn norm<'c>(b: &Builder<'c, '_>, x: Tensor<'c>, prefix: &str) -> Result<Tensor<'c>> {
    b.ctx.add(b.ctx.mul(x, b.w(&scale_name(prefix))?)?, b.w(&shift_name(prefix))?)
}

fn relu_norm<'c>(b: &Builder<'c, '_>, x: Tensor<'c>, prefix: &str) -> Result<Tensor<'c>> {
    b.ctx.relu(norm(b, x, prefix)?)
}

/// A folded batch norm on an image `[W, H, C]`.
fn norm_2d<'c>(b: &Builder<'c, '_>, x: Tensor<'c>, prefix: &str) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let per_channel = |name: String| -> Result<Tensor<'c>> {
        let v = b.w(&name)?;
        ctx.reshape(v, &[1, 1, v.ne()[0]])
    };
    ctx.add(ctx.mul(x, per_channel(scale_name(prefix))?)?, per_channel(shift_name(prefix))?)
}

/// Nodes of a [`build`] graph, bounded: under 64 per dense layer, 200 for the rest.
pub fn max_nodes(c: &CampplusHparams) -> usize {
    64 * c.block_layers.iter().sum::<usize>() + 200
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hp() -> CampplusHparams {
        CampplusHparams {
            feat_dim: 80,
            head_channels: 32,
            head_blocks: vec![2, 2],
            channels: 128,
            tdnn_kernel: 5,
            tdnn_stride: 2,
            growth: 32,
            bn_channels: 128,
            cam_channels: 64,
            block_layers: vec![12, 24, 16],
            block_kernels: vec![3, 3, 3],
            block_dilations: vec![1, 2, 2],
            seg_len: 100,
            embedding: 192,
            bn_eps: 1e-5,
        }
    }

    #[test]
    fn the_official_configuration_has_the_published_widths() {
        let c = hp();
        assert_eq!(c.head_bins() * c.head_channels, 320);
        assert_eq!(c.block_inputs(), (vec![128, 256, 512], 512));
        // 10 s of fbank (998 frames) → 499 TDNN frames, segments of 100, the last 99.
        assert_eq!(tdnn_frames(&c, 998), 499);
        let s = segment_scale(&c, 499);
        assert_eq!(s.len(), 5);
        assert_eq!((s[0], s[4]), (0.01, 1.0 / 99.0));
    }
}
