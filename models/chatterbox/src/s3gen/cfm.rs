//! CFM estimator: one velocity evaluation `v(x, mu, spks, cond, t, r)`.
//!
//! ConditionalDecoder with causal convolutions and a single U-Net level (no
//! resampling): resnet + transformer blocks + causal conv (down), `n_mid`
//! resnet + transformer stages, concat skip → resnet + transformer blocks +
//! causal conv (up), final causal block and a 1×1 projection. The time
//! embedding mixes t and r (meanflow). Layout `[channels, frames, rows]`:
//! one row, or the two rows of classifier-free guidance (conditional, then
//! unconditional) as one batch. Every row has every frame valid, so the masks
//! are all ones and are dropped.

use crate::hparams::{CfmHparams, S3GenHparams};
use crate::t3::kv_cache::KvCache;
use engine_core::model_kit::Builder;
use ggml_sys::{GraphIo, Result, Tensor, TYPE_F32, TYPE_I32};
use std::cell::Cell;

pub const X: &str = "x";
pub const MU: &str = "mu";
pub const SPKS: &str = "spks";
pub const COND: &str = "cond";
/// Sinusoidal embeddings of t and r (host-computed, see [`time_embedding`]).
pub const T_EMB: &str = "t_emb";
pub const R_EMB: &str = "r_emb";
pub const VELOCITY: &str = "velocity";
/// A block's inputs and outputs besides those above (see [`build_block`]).
pub const KV_ROWS: &str = "kv_rows";
pub const MASK: &str = "mask";
pub const CONV_TAILS: &str = "conv_tails";
pub const CONV_TAILS_OUT: &str = "conv_tails_out";

const P: &str = "cfm";

/// The estimator over `rows` rows of `frames` frames; t (and r) are shared by the rows.
pub fn build<'c>(b: &Builder<'c, '_>, hp: &S3GenHparams, frames: usize, rows: usize) -> Result<GraphIo<'c>> {
    let mut io = GraphIo::default();
    estimator(b, hp, frames, rows, &mut io, None)?;
    Ok(io)
}

/// The channels of each causal conv's input, in the order the estimator
/// applies them: what a block carries of each (its last `conv_kernel − 1`
/// frames, per row) to the next.
pub fn causal_conv_channels(c: &CfmHparams) -> Vec<usize> {
    let resnet = |input: usize| [input, c.channels];
    let mut channels = resnet(c.in_channels).to_vec();
    channels.push(c.channels);
    for _ in 0..c.n_mid {
        channels.extend(resnet(c.channels));
    }
    channels.extend(resnet(2 * c.channels));
    channels.extend([c.channels, c.channels]);
    channels
}

/// Rows of a block's attention mask over `frames` queries: GPU kernels of
/// fused attention read masks in tiles of 64 queries (as the model kit's
/// zero masks are padded), while the explicit path's softmax reads only the
/// rows it has queries for.
pub fn mask_rows(frames: i64) -> i64 {
    const MASK_ROW_TILE: i64 = 64;
    (frames + MASK_ROW_TILE - 1) / MASK_ROW_TILE * MASK_ROW_TILE
}

/// Values of `conv_tails` (and `conv_tails_out`) for `rows` rows.
pub fn conv_tail_len(c: &CfmHparams, rows: usize) -> usize {
    causal_conv_channels(c).iter().sum::<usize>() * (c.conv_kernel - 1) * rows
}

/// Transformer blocks of the estimator: the layers of its K/V cache.
pub fn attention_layers(c: &CfmHparams) -> usize {
    (c.n_mid + 2) * c.n_transformer
}

/// A block of `frames` frames after those already estimated at this step,
/// each row attending to itself and to every frame before it: the
/// transformer blocks write the new frames' keys and values into `cache`
/// (its layer l ↔ the l-th block) at `kv_rows` (I32, row `r`'s frame `p`
/// at `r · cache.n_ctx + p`) and read its first `span` frames under `mask`
/// (`[span, frames]`, 0 where visible, -inf elsewhere, its rows padded to
/// [`mask_rows`]); the causal
/// convs start from `conv_tails` (each conv's last input frames, per row,
/// in [`causal_conv_channels`]' order, zeros before the first block) and
/// hand theirs on in `conv_tails_out`.
pub fn build_block<'c>(b: &Builder<'c, '_>, hp: &S3GenHparams, frames: usize, rows: usize, span: usize, cache: &KvCache) -> Result<GraphIo<'c>> {
    let ctx = b.ctx;
    let mut io = GraphIo::default();
    let (n, r) = (frames as i64, rows as i64);
    let mask_ty = if b.policy.fused_attention { ggml_sys::TYPE_F16 } else { TYPE_F32 };
    let block = BlockState {
        cache,
        kv_rows: io.input(ctx, KV_ROWS, TYPE_I32, &[n * r])?,
        span: span as i64,
        mask: io.input(ctx, MASK, mask_ty, &[span as i64, mask_rows(n)])?,
        tails: io.input(ctx, CONV_TAILS, TYPE_F32, &[conv_tail_len(&hp.cfm, rows) as i64])?,
        tail_offset: Cell::new(0),
        tails_out: Cell::new(None),
        layer: Cell::new(0),
    };
    estimator(b, hp, frames, rows, &mut io, Some(&block))?;
    let out = block.tails_out.get().ok_or_else(|| ggml_sys::Error::Msg("the CFM has no causal conv".into()))?;
    if block.tail_offset.get() != conv_tail_len(&hp.cfm, rows) || block.layer.get() != attention_layers(&hp.cfm) {
        return Err(ggml_sys::Error::Msg("the CFM block graph and its state layout disagree".into()));
    }
    io.outputs.push((CONV_TAILS_OUT, out));
    Ok(io)
}

/// What a block graph threads through the estimator.
struct BlockState<'c, 'k> {
    cache: &'k KvCache,
    kv_rows: Tensor<'c>,
    span: i64,
    mask: Tensor<'c>,
    tails: Tensor<'c>,
    /// Values of `tails` the convs applied so far took.
    tail_offset: Cell<usize>,
    /// The tails handed on so far, concatenated.
    tails_out: Cell<Option<Tensor<'c>>>,
    /// The next transformer block's cache layer.
    layer: Cell<usize>,
}

fn estimator<'c>(b: &Builder<'c, '_>, hp: &S3GenHparams, frames: usize, rows: usize, io: &mut GraphIo<'c>, block: Option<&BlockState<'c, '_>>) -> Result<()> {
    let ctx = b.ctx;
    let c = &hp.cfm;
    let (mel, t, n) = (hp.mel_channels as i64, frames as i64, rows as i64);
    let x = io.input(ctx, X, TYPE_F32, &[mel, t, n])?;
    let mu = io.input(ctx, MU, TYPE_F32, &[mel, t, n])?;
    let spks = io.input(ctx, SPKS, TYPE_F32, &[mel, 1, n])?;
    let cond = io.input(ctx, COND, TYPE_F32, &[mel, t, n])?;
    let t_emb = io.input(ctx, T_EMB, TYPE_F32, &[c.in_channels as i64, 1])?;

    let time_mlp =
        |e: Tensor<'c>| -> Result<Tensor<'c>> { b.linear(ctx.silu(b.linear(e, &format!("{P}.time_mlp.linear_1"))?)?, &format!("{P}.time_mlp.linear_2")) };
    let mut temb = time_mlp(t_emb)?;
    if hp.meanflow {
        let r_emb = io.input(ctx, R_EMB, TYPE_F32, &[c.in_channels as i64, 1])?;
        let both = ctx.concat(temb, time_mlp(r_emb)?, 0)?;
        temb = ctx.mul_mat(b.w(&format!("{P}.time_embed_mixer.weight"))?, both)?;
    }

    let h = ctx.concat(ctx.concat(ctx.concat(x, mu, 0)?, ctx.repeat_to(spks, [mel, t, n, 1])?, 0)?, cond, 0)?;
    let h = resnet(b, c, h, temb, block, &format!("{P}.down_blocks.0.0"))?;
    let h = transformers(b, c, h, block, &format!("{P}.down_blocks.0.1"))?;
    let skip = h;
    let mut h = causal_conv(b, c, h, block, &format!("{P}.down_blocks.0.2"))?;
    for m in 0..c.n_mid {
        h = resnet(b, c, h, temb, block, &format!("{P}.mid_blocks.{m}.0"))?;
        h = transformers(b, c, h, block, &format!("{P}.mid_blocks.{m}.1"))?;
    }
    let h = ctx.concat(h, skip, 0)?;
    let h = resnet(b, c, h, temb, block, &format!("{P}.up_blocks.0.0"))?;
    let h = transformers(b, c, h, block, &format!("{P}.up_blocks.0.1"))?;
    let h = causal_conv(b, c, h, block, &format!("{P}.up_blocks.0.2"))?;
    let h = causal_block(b, c, h, block, &format!("{P}.final_block"))?;
    let v = conv(b, h, &format!("{P}.final_proj"), 0)?;
    io.outputs.push((VELOCITY, v));
    Ok(())
}

/// `steps + 1` time points from 0 to 1: `torch.linspace` in f32 (from both
/// ends, as its kernel), mapped through `1 − cos(π/2 · t)` when `cosine`.
pub fn schedule(steps: usize, cosine: bool) -> Vec<f32> {
    let n = steps + 1;
    let step = 1.0f32 / steps.max(1) as f32;
    (0..n)
        .map(|i| if i < n / 2 { step * i as f32 } else { 1.0 - step * (n - 1 - i) as f32 })
        .map(|t| if cosine { 1.0 - ((t * 0.5 * std::f32::consts::PI) as f64).cos() as f32 } else { t })
        .collect()
}

/// Classifier-free guidance of the decoder: `(1 + w)·cond − w·uncond`.
pub fn combine_guidance(cond: &[f32], uncond: &[f32], w: f32) -> Vec<f32> {
    let keep = 1.0 + w;
    cond.iter().zip(uncond).map(|(c, u)| keep * c - w * u).collect()
}

/// `[sin | cos]` of `scale · t · 10000^(-i/(half-1))`, in f32 as the reference forms it.
pub fn time_embedding(dim: usize, scale: f32, t: f32) -> Vec<f32> {
    let half = dim / 2;
    let step = (10000f64.ln() / (half as f64 - 1.0)) as f32;
    let args: Vec<f32> = (0..half).map(|i| (scale * t) * (i as f32 * -step).exp()).collect();
    args.iter().map(|a| (*a as f64).sin() as f32).chain(args.iter().map(|a| (*a as f64).cos() as f32)).collect()
}

fn mish<'c>(b: &Builder<'c, '_>, x: Tensor<'c>) -> Result<Tensor<'c>> {
    b.ctx.mul(x, b.ctx.tanh(b.ctx.softplus(x)?)?)
}

/// Convolution with `left` zero frames of padding on the left.
fn conv<'c>(b: &Builder<'c, '_>, x: Tensor<'c>, prefix: &str, left: usize) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let x = if left > 0 { ctx.pad_ext(x, [[0, 0], [left as i32, 0], [0, 0], [0, 0]])? } else { x };
    unpadded_conv(b, x, prefix)
}

fn unpadded_conv<'c>(b: &Builder<'c, '_>, x: Tensor<'c>, prefix: &str) -> Result<Tensor<'c>> {
    b.ctx.add(b.ctx.conv_1d(b.w(&format!("{prefix}.weight"))?, x, 1, 1)?, b.w(&format!("{prefix}.bias"))?)
}

/// A causal conv: zeros before the sequence, or, in a block, the previous
/// block's last input frames (whose successors it hands on).
fn causal_conv<'c>(b: &Builder<'c, '_>, c: &CfmHparams, x: Tensor<'c>, block: Option<&BlockState<'c, '_>>, prefix: &str) -> Result<Tensor<'c>> {
    let context = c.conv_kernel - 1;
    let Some(block) = block else {
        return conv(b, x, prefix, context);
    };
    let ctx = b.ctx;
    let [channels, frames, rows, _] = x.ne();
    let len = channels as usize * context * rows as usize;
    let offset = block.tail_offset.replace(block.tail_offset.get() + len);
    let f = std::mem::size_of::<f32>();
    let tail = ctx.reshape(ctx.view(block.tails, &[len as i64], &[], offset * f)?, &[channels, context as i64, rows])?;
    let x = ctx.concat(tail, x, 1)?; // [channels, context + frames, rows]
    let last = ctx.view(x, &[channels, context as i64, rows], &[x.nb()[1], x.nb()[2]], frames as usize * x.nb()[1])?;
    let last = ctx.reshape(ctx.cont(last)?, &[len as i64])?;
    block.tails_out.set(Some(match block.tails_out.get() {
        Some(before) => ctx.concat(before, last, 0)?,
        None => last,
    }));
    unpadded_conv(b, x, prefix)
}

/// CausalBlock1D: causal conv → LayerNorm over channels → Mish.
fn causal_block<'c>(b: &Builder<'c, '_>, c: &CfmHparams, x: Tensor<'c>, block: Option<&BlockState<'c, '_>>, prefix: &str) -> Result<Tensor<'c>> {
    let h = causal_conv(b, c, x, block, &format!("{prefix}.block.0"))?;
    let h = b.layer_norm(h, &format!("{prefix}.block.2"), c.layer_norm_eps)?;
    mish(b, h)
}

/// CausalResnetBlock1D: `block2(block1(x) + Linear(mish(temb))) + res_conv(x)`.
fn resnet<'c>(b: &Builder<'c, '_>, c: &CfmHparams, x: Tensor<'c>, temb: Tensor<'c>, block: Option<&BlockState<'c, '_>>, prefix: &str) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let h = causal_block(b, c, x, block, &format!("{prefix}.block1"))?;
    let h = ctx.add(h, b.linear(mish(b, temb)?, &format!("{prefix}.mlp.1"))?)?;
    let h = causal_block(b, c, h, block, &format!("{prefix}.block2"))?;
    ctx.add(h, conv(b, x, &format!("{prefix}.res_conv"), 0)?)
}

fn transformers<'c>(b: &Builder<'c, '_>, c: &CfmHparams, mut x: Tensor<'c>, block: Option<&BlockState<'c, '_>>, prefix: &str) -> Result<Tensor<'c>> {
    for i in 0..c.n_transformer {
        x = transformer_block(b, c, x, block, &format!("{prefix}.{i}"))?;
    }
    Ok(x)
}

/// diffusers BasicTransformerBlock (self-attention only):
/// `x += Attn(LN1(x))`, `x += W2 gelu(W1 LN3(x))` (exact GELU).
fn transformer_block<'c>(b: &Builder<'c, '_>, c: &CfmHparams, x: Tensor<'c>, block: Option<&BlockState<'c, '_>>, prefix: &str) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let [_, t, n, _] = x.ne();
    let (hd, nh) = (c.head_dim as i64, c.n_head as i64);
    let h = b.layer_norm(x, &format!("{prefix}.norm1"), c.layer_norm_eps)?;
    // Q, K and V from one product with the stacked weights (tensors.rs):
    // each frame's column holds Q's heads, then K's, then V's.
    let qkv = b.linear_no_bias(h, &format!("{prefix}.attn1.to_qkv.weight"))?; // [3·hd·nh, t, rows]
    let width = hd * nh;
    let [es, column, item, _] = qkv.nb();
    let heads = |part: i64| ctx.view(qkv, &[hd, nh, t, n], &[hd as usize * es, column, item], (part * width) as usize * es);
    let by_head = |y: Tensor<'c>| ctx.permute(y, [0, 2, 1, 3]); // [hd, t, nh, rows]
    let q = heads(0)?;
    let (k, v, mask) = match block {
        // Every frame of every row is valid: no mask.
        None => (heads(1)?, heads(2)?, None),
        Some(block) => {
            let layer = block.layer.replace(block.layer.get() + 1);
            // Part `part` of every frame of every row, one cache row each.
            let new = |part: i64| ctx.view(qkv, &[width, t * n], &[column], (part * width) as usize * es);
            let k_all = ctx.set_rows(block.cache.tensor(ctx, "k", layer), new(1)?, block.kv_rows)?;
            let v_all = ctx.set_rows(block.cache.tensor(ctx, "v", layer), new(2)?, block.kv_rows)?;
            // Row r's first `span` frames of the cache.
            let first = |all: Tensor<'c>| {
                let row = all.nb()[1];
                ctx.view(all, &[hd, nh, block.span, n], &[hd as usize * all.nb()[0], row, row * block.cache.n_ctx], 0)
            };
            (first(k_all)?, first(v_all)?, Some(block.mask))
        }
    };
    // Fused or explicit as the policy and device allow; the fused CPU path accumulates in F32.
    let out = b.attention(by_head(q)?, by_head(k)?, by_head(v)?, mask, 1.0 / (hd as f32).sqrt())?; // [hd·nh, t, rows]
    let x = ctx.add(x, b.linear(out, &format!("{prefix}.attn1.to_out.0"))?)?;
    let h = b.layer_norm(x, &format!("{prefix}.norm3"), c.layer_norm_eps)?;
    let h = b.linear(ctx.gelu_erf(b.linear(h, &format!("{prefix}.ff.net.0.proj"))?)?, &format!("{prefix}.ff.net.2"))?;
    ctx.add(x, h)
}
