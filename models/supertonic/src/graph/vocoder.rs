//! Vocoder (`vocoder.onnx`, the autoencoder's decoder): latent → waveform.
//!
//! Unpack the compressed latent (`/normalizer_scale`, channel c·6+r → frame
//! 6l+r), de-normalise with the latent statistics, causal conv → causal
//! ConvNeXt stack → BatchNorm → causal conv → PReLU → 1×1 conv to
//! `base_chunk_size` samples per frame.

use super::Builder;
use crate::hparams::Hparams;
use ggml_sys::{GraphIo, Result, Tensor, TYPE_F32};

/// Input: `latent` `[latent_channels, L]`. Output: `wav` `[base_chunk, 6L]`
/// (flat: the waveform in order).
pub fn build<'c>(b: &Builder<'c, '_>, hp: &Hparams, prelu_slope: f32, latent_len: usize) -> Result<GraphIo<'c>> {
    let ctx = b.ctx;
    let (l, ld, ccf) = (latent_len as i64, hp.latent_dim as i64, hp.chunk_compress_factor as i64);
    let v = &hp.vocoder;
    let latent = ctx.new_tensor(TYPE_F32, &[ld * ccf, l])?;
    let z = ctx.scale(latent, 1.0 / hp.normalizer_scale)?;
    let z = ctx.reshape(z, &[ccf, ld, l])?;
    let z = ctx.cont(ctx.permute(z, [1, 0, 2, 3])?)?;
    let z = ctx.reshape(z, &[ld, ccf * l])?;
    let z = ctx.add(ctx.mul(z, b.w("voc.latent_std")?)?, b.w("voc.latent_mean")?)?;
    let h = causal_conv(b, z, "voc.embed", v.kernel_init)?;
    let h = b.convnext_stack(h, "voc.convnext", &v.convnext, true)?;
    // BatchNorm with running statistics.
    let var = ctx.scale_bias(b.w("voc.bn.var")?, 1.0, hp.batch_norm_eps)?;
    let gain = ctx.div(b.w("voc.bn.weight")?, ctx.sqrt(var)?)?;
    let h = ctx.add(ctx.mul(ctx.sub(h, b.w("voc.bn.mean")?)?, gain)?, b.w("voc.bn.bias")?)?;
    let h = causal_conv(b, h, "voc.head1", v.head_kernel)?;
    let h = b.leaky_relu(h, prelu_slope)?;
    let wav = b.linear_no_bias(h, "voc.head2.weight")?;
    Ok(GraphIo { inputs: vec![("latent", latent)], outputs: vec![("wav", wav)] })
}

/// Full convolution with edge padding on the left, as one matrix product over
/// the k shifted copies stacked along channels (weight `[k·Cin, Cout]`, input
/// channel index `tap·Cin + c`).
fn causal_conv<'c>(b: &Builder<'c, '_>, x: Tensor<'c>, prefix: &str, kernel: usize) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let [c, t, _, _] = x.ne();
    let xp = b.edge_pad(x, kernel - 1, 0)?;
    let xp = if xp.is_contiguous() { xp } else { ctx.cont(xp)? };
    let nb1 = xp.nb()[1];
    let mut stacked = ctx.view(xp, &[c, t], &[nb1], 0)?;
    for k in 1..kernel {
        stacked = ctx.concat(stacked, ctx.view(xp, &[c, t], &[nb1], k * nb1)?, 0)?;
    }
    b.linear(stacked, prefix)
}
