//! Flow front end: speech tokens → `mu` (the CFM's conditioning mel).
//!
//! CosyVoice's UpsampleConformerEncoder: embedding → linear + LayerNorm, ×√d
//! → pre-lookahead convs (residual) → conformer layers with ESPnet relative
//! position self-attention → nearest ×stride upsampling + causal conv →
//! a second linear embedding → more conformer layers → LayerNorm → linear to
//! the mel channels. Layout `[channels, frames]`; batch 1, every frame valid,
//! so no masks.

use crate::hparams::{EncoderHparams, S3GenHparams};
use crate::t3::kv_cache::KvCache;
use engine_core::model_kit::Builder;
use ggml_sys::{GraphIo, Result, Tensor, TYPE_F32, TYPE_I32};

pub const TOKENS: &str = "tokens";
pub const POS_EMB: &str = "pos_emb";
pub const UP_POS_EMB: &str = "up_pos_emb";
pub const ENCODER_OUT: &str = "encoder_out";
pub const MU: &str = "mu";
/// A block's inputs besides those above (see [`build_block`]).
pub const KV_ROWS: &str = "kv_rows";
pub const UP_KV_ROWS: &str = "up_kv_rows";
pub const MASK: &str = "mask";
pub const UP_MASK: &str = "up_mask";
pub const UP_TAIL: &str = "up_tail";
pub const UP_TAIL_OUT: &str = "up_tail_out";

/// Tokens before a block whose first conformer stack's outputs the
/// upsampling conv reads (its left padding is two tokens' frames).
pub const UP_CONTEXT_TOKENS: usize = 2;

const P: &str = "enc";
/// Row count multiple the CPU's blocked GEMM needs (see `rel_pos_attention`).
const ROW_ALIGN: i64 = 4;

/// Inputs: `tokens` I32 `[n]`, `pos_emb` `[d, 2n-1]`, `up_pos_emb` `[d, 2·stride·n-1]`
/// (see [`relative_positions`]). Outputs: `encoder_out` `[d, stride·n]`, `mu` `[mel, stride·n]`.
pub fn build<'c>(b: &Builder<'c, '_>, hp: &S3GenHparams, n_tokens: usize) -> Result<GraphIo<'c>> {
    let ctx = b.ctx;
    let e = &hp.encoder;
    let (d, n) = (e.n_embd as i64, n_tokens as i64);
    let n_up = n * e.up_stride as i64;
    let tokens = ctx.new_tensor(TYPE_I32, &[n])?.set_name(TOKENS);
    let pos_emb = ctx.new_tensor(TYPE_F32, &[d, 2 * n - 1])?.set_name(POS_EMB);
    let up_pos_emb = ctx.new_tensor(TYPE_F32, &[d, 2 * n_up - 1])?.set_name(UP_POS_EMB);

    let x = ctx.get_rows(b.w("flow.input_embedding.weight")?, tokens)?;
    let x = embed(b, e, x, &format!("{P}.embed"))?;
    let mut x = pre_lookahead(b, e, x)?;
    for l in 0..e.n_layer {
        x = conformer_layer(b, e, x, pos_emb, Keys::Own, &format!("{P}.encoders.{l}"))?;
    }
    // Nearest-neighbour ×stride, then a causal conv of kernel 2·stride+1.
    let stride = e.up_stride as i64;
    let x = ctx.reshape(ctx.repeat_to(ctx.reshape(x, &[d, 1, n])?, [d, stride, n, 1])?, &[d, n_up])?;
    let x = ctx.pad_ext(x, [[0, 0], [2 * stride as i32, 0], [0, 0], [0, 0]])?;
    let x = ctx.add(ctx.conv_1d(b.w(&format!("{P}.up_layer.conv.weight"))?, x, 1, 1)?, b.w(&format!("{P}.up_layer.conv.bias"))?)?;
    let mut x = embed(b, e, x, &format!("{P}.up_embed"))?;
    for l in 0..e.n_up_layer {
        x = conformer_layer(b, e, x, up_pos_emb, Keys::Own, &format!("{P}.up_encoders.{l}"))?;
    }
    let out = b.layer_norm(x, &format!("{P}.after_norm"), e.after_norm_eps)?;
    let mu = b.linear(out, "flow.encoder_proj")?;
    Ok(GraphIo { inputs: vec![(TOKENS, tokens), (POS_EMB, pos_emb), (UP_POS_EMB, up_pos_emb)], outputs: vec![(ENCODER_OUT, out), (MU, mu)] })
}

/// A block of tokens after those already encoded: `left` tokens before it
/// (what the lookahead's causal conv reads), `new` tokens, `right` tokens
/// after it (what the lookahead conv reads; fewer at the end of the
/// utterance), and attention over the caches' first `span` tokens (and
/// `span · stride` frames).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockShape {
    pub left: usize,
    pub new: usize,
    pub right: usize,
    pub span: usize,
}

/// The keys and values of every token (`tokens`, the first conformer stack)
/// and frame (`frames`, the stack after upsampling) encoded so far.
pub struct EncoderCaches {
    pub tokens: KvCache,
    pub frames: KvCache,
}

/// The encoder over one block of a sequence that arrives in blocks, each
/// attending to itself and to every block before it (block-causal
/// attention): the new positions' keys and values go into `caches`.
/// Inputs: `tokens` I32 `[left + new + right]`; `kv_rows` / `up_kv_rows`
/// I32, the cache rows of the new tokens and frames; `mask` `[span, new]`
/// and `up_mask` `[span·stride, new·stride]` (0 over the positions before
/// the block's end, -inf after); `pos_emb` `[d, span + new − 1]` and
/// `up_pos_emb` `[d, (span + new)·stride − 1]` from the last new position
/// down ([`relative_offsets`]); `up_tail` `[d, UP_CONTEXT_TOKENS]`, the
/// previous block's `up_tail_out` (zeros before the first). Outputs:
/// `encoder_out`, `mu` over the new frames, and `up_tail_out`.
pub fn build_block<'c>(b: &Builder<'c, '_>, hp: &S3GenHparams, shape: BlockShape, caches: &EncoderCaches) -> Result<GraphIo<'c>> {
    let ctx = b.ctx;
    let e = &hp.encoder;
    let stride = e.up_stride as i64;
    let (d, n, span) = (e.n_embd as i64, shape.new as i64, shape.span as i64);
    let (n_up, up_span) = (n * stride, span * stride);
    let mut io = GraphIo::default();
    let tokens = io.input(ctx, TOKENS, TYPE_I32, &[(shape.left + shape.new + shape.right) as i64])?;
    let pos_emb = io.input(ctx, POS_EMB, TYPE_F32, &[d, span + n - 1])?;
    let up_pos_emb = io.input(ctx, UP_POS_EMB, TYPE_F32, &[d, up_span + n_up - 1])?;
    let kv_rows = io.input(ctx, KV_ROWS, TYPE_I32, &[n])?;
    let up_kv_rows = io.input(ctx, UP_KV_ROWS, TYPE_I32, &[n_up])?;
    let mask = io.input(ctx, MASK, TYPE_F32, &[span, n])?;
    let up_mask = io.input(ctx, UP_MASK, TYPE_F32, &[up_span, n_up])?;
    let up_tail = io.input(ctx, UP_TAIL, TYPE_F32, &[d, UP_CONTEXT_TOKENS as i64])?;

    let x = ctx.get_rows(b.w("flow.input_embedding.weight")?, tokens)?;
    let x = embed(b, e, x, &format!("{P}.embed"))?;
    let mut x = pre_lookahead_window(b, e, x, shape.left, shape.right)?;
    for l in 0..e.n_layer {
        let keys = Keys::Cached { cache: &caches.tokens, layer: l, rows: kv_rows, span, mask };
        x = conformer_layer(b, e, x, pos_emb, keys, &format!("{P}.encoders.{l}"))?;
    }
    // The upsampling conv's left context is the previous block's last tokens.
    let ctx_tokens = UP_CONTEXT_TOKENS as i64;
    let x = ctx.concat(up_tail, x, 1)?; // [d, ctx + n]
    let tail_out = ctx.cont(ctx.view(x, &[d, ctx_tokens], &[x.nb()[1]], n as usize * x.nb()[1])?)?;
    let all = n + ctx_tokens;
    let x = ctx.reshape(ctx.repeat_to(ctx.reshape(x, &[d, 1, all])?, [d, stride, all, 1])?, &[d, all * stride])?;
    let x = ctx.add(ctx.conv_1d(b.w(&format!("{P}.up_layer.conv.weight"))?, x, 1, 1)?, b.w(&format!("{P}.up_layer.conv.bias"))?)?;
    let mut x = embed(b, e, x, &format!("{P}.up_embed"))?;
    for l in 0..e.n_up_layer {
        let keys = Keys::Cached { cache: &caches.frames, layer: l, rows: up_kv_rows, span: up_span, mask: up_mask };
        x = conformer_layer(b, e, x, up_pos_emb, keys, &format!("{P}.up_encoders.{l}"))?;
    }
    let out = b.layer_norm(x, &format!("{P}.after_norm"), e.after_norm_eps)?;
    let mu = b.linear(out, "flow.encoder_proj")?;
    io.outputs.extend([(ENCODER_OUT, out), (MU, mu), (UP_TAIL_OUT, tail_out)]);
    Ok(io)
}

/// LinearNoSubsampling + the positional module's input scaling: `√d · LN(W x + b)`.
fn embed<'c>(b: &Builder<'c, '_>, e: &EncoderHparams, x: Tensor<'c>, prefix: &str) -> Result<Tensor<'c>> {
    let x = b.linear(x, &format!("{prefix}.out.0"))?;
    let x = b.layer_norm(x, &format!("{prefix}.out.1"), e.embed_norm_eps)?;
    b.ctx.scale(x, (e.n_embd as f32).sqrt())
}

/// `x + conv2(pad_left(leaky_relu(conv1(pad_right(x)))))`: conv1 looks
/// `pre_lookahead` frames ahead, conv2 is causal.
fn pre_lookahead<'c>(b: &Builder<'c, '_>, e: &EncoderHparams, x: Tensor<'c>) -> Result<Tensor<'c>> {
    pre_lookahead_window(b, e, x, 0, 0)
}

/// [`pre_lookahead`] over a window of `left` positions, the block, and
/// `right` positions: the zero padding stands in only for the positions
/// the window lacks (before the sequence, or after its end). Returns the
/// block's positions.
fn pre_lookahead_window<'c>(b: &Builder<'c, '_>, e: &EncoderHparams, x: Tensor<'c>, left: usize, right: usize) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let p = format!("{P}.pre_lookahead_layer");
    let (conv2_context, lookahead) = (e.lookahead_conv2_kernel - 1, e.pre_lookahead);
    let h = ctx.pad_ext(x, [[0, 0], [0, lookahead.saturating_sub(right) as i32], [0, 0], [0, 0]])?;
    let h = ctx.add(ctx.conv_1d(b.w(&format!("{p}.conv1.weight"))?, h, 1, 1)?, b.w(&format!("{p}.conv1.bias"))?)?;
    let h = b.leaky_relu(h, e.leaky_relu_slope)?;
    let h = ctx.pad_ext(h, [[0, 0], [conv2_context.saturating_sub(left) as i32, 0], [0, 0], [0, 0]])?;
    let h = ctx.add(ctx.conv_1d(b.w(&format!("{p}.conv2.weight"))?, h, 1, 1)?, b.w(&format!("{p}.conv2.bias"))?)?;
    let block = if left == 0 && right == 0 { x } else { ctx.view(x, &[x.ne()[0], h.ne()[1]], &[x.nb()[1]], left * x.nb()[1])? };
    ctx.add(block, h)
}

/// Where an attention layer's keys and values come from.
#[derive(Clone, Copy)]
pub enum Keys<'c, 'k> {
    /// The layer's own positions: the whole sequence at once.
    Own,
    /// A block of new positions after the ones already in `cache`: the new
    /// keys and values are written at `rows` (I64, one cache row per new
    /// position), and attention reads the cache's first `span` positions
    /// under `mask` (`[span, n]`, 0 where visible, -inf elsewhere).
    Cached { cache: &'k KvCache, layer: usize, rows: Tensor<'c>, span: i64, mask: Tensor<'c> },
}

/// Pre-norm conformer layer without macaron or convolution module:
/// `x += MHA(LN(x))`, `x += W2 silu(W1 LN(x))`.
fn conformer_layer<'c>(b: &Builder<'c, '_>, e: &EncoderHparams, x: Tensor<'c>, pos_emb: Tensor<'c>, keys: Keys<'c, '_>, prefix: &str) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let h = b.layer_norm(x, &format!("{prefix}.norm_mha"), e.layer_norm_eps)?;
    let x = ctx.add(x, rel_pos_attention(b, e, h, pos_emb, keys, &format!("{prefix}.self_attn"))?)?;
    let h = b.layer_norm(x, &format!("{prefix}.norm_ff"), e.layer_norm_eps)?;
    let h = b.linear(ctx.silu(b.linear(h, &format!("{prefix}.feed_forward.w_1"))?)?, &format!("{prefix}.feed_forward.w_2"))?;
    ctx.add(x, h)
}

/// ESPnet relative-position self-attention (Transformer-XL style):
/// `softmax(((q+u)·kᵀ + shift((q+v)·pᵀ)) / √d_k) · v`, where `p` projects the
/// relative position table and the shift picks offset i−j for query i and
/// key j. For `n` queries over `tk` keys the table has `tk + n − 1` rows, row
/// m holding offset `last − m` with `last` the last query's position.
fn rel_pos_attention<'c>(b: &Builder<'c, '_>, e: &EncoderHparams, x: Tensor<'c>, pos_emb: Tensor<'c>, keys: Keys<'c, '_>, prefix: &str) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let (d, h) = (e.n_embd as i64, e.n_head as i64);
    let dk = d / h;
    let n = x.ne()[1];
    let heads = |y: Tensor<'c>, len: i64| -> Result<Tensor<'c>> { ctx.reshape(y, &[dk, h, len]) };
    let by_head = |y: Tensor<'c>| ctx.permute(y, [0, 2, 1, 3]); // [dk, h, len] → [dk, len, h]
    let q = heads(b.linear(x, &format!("{prefix}.linear_q"))?, n)?;
    let k_new = b.linear(x, &format!("{prefix}.linear_k"))?;
    let v_new = b.linear(x, &format!("{prefix}.linear_v"))?;
    let (k, v, tk, mask) = match keys {
        Keys::Own => (heads(k_new, n)?, heads(v_new, n)?, n, None),
        Keys::Cached { cache, layer, rows, span, mask } => {
            let k_all = ctx.set_rows(cache.tensor(ctx, "k", layer), k_new, rows)?;
            let v_all = ctx.set_rows(cache.tensor(ctx, "v", layer), v_new, rows)?;
            let first = |all: Tensor<'c>| ctx.view(all, &[dk, h, span], &[dk as usize * all.nb()[0], all.nb()[1]], 0);
            (first(k_all)?, first(v_all)?, span, Some(mask))
        }
    };
    let p = heads(ctx.mul_mat(b.w(&format!("{prefix}.linear_pos.weight"))?, pos_emb)?, tk + n - 1)?;
    let q_u = ctx.add(q, b.w(&format!("{prefix}.pos_bias_u"))?)?;
    let q_v = ctx.add(q, b.w(&format!("{prefix}.pos_bias_v"))?)?;
    // The CPU's blocked F32 GEMM (tinyBLAS) takes a product only with a
    // contiguous right operand and output rows in fours: keys and relative
    // positions are padded with zero rows, and the scores read back cropped.
    let rows4 = |n: i64| n + (ROW_ALIGN - n % ROW_ALIGN) % ROW_ALIGN;
    let (tk4, tp) = (rows4(tk), rows4(tk + n - 1));
    let pad_rows = |y: Tensor<'c>, to: i64| ctx.pad_ext(y, [[0, 0], [0, (to - y.ne()[1]) as i32], [0, 0], [0, 0]]);
    let ac = ctx.mul_mat(pad_rows(by_head(k)?, tk4)?, ctx.cont(by_head(q_u)?)?)?; // [tk4, n, h]
    let bd = ctx.mul_mat(pad_rows(by_head(p)?, tp)?, ctx.cont(by_head(q_v)?)?)?; // [tp, n, h]
    let f = std::mem::size_of::<f32>();
    let ac = ctx.view(ac, &[tk, n, h], &[tk4 as usize * f, (tk4 * n) as usize * f], 0)?;
    let row = tp as usize * f;
    let bd = ctx.view(bd, &[tk, n, h], &[row - f, row * n as usize], (n as usize - 1) * f)?;
    let attn = ctx.soft_max_ext(ctx.add(ac, bd)?, mask, 1.0 / (dk as f32).sqrt())?;
    let v_t = ctx.cont(ctx.permute(v, [1, 2, 0, 3])?)?; // [tk, dk, h]
    let out = ctx.mul_mat(v_t, attn)?; // [dk, n, h]
    let out = ctx.reshape(ctx.cont(ctx.permute(out, [0, 2, 1, 3])?)?, &[d, n])?;
    b.linear(out, &format!("{prefix}.linear_out"))
}

/// The relative position table of EspnetRelPositionalEncoding for `t` frames:
/// `[d, 2t-1]`, row m holding offset `t-1-m` as interleaved `sin, cos` of
/// `offset · 10000^(-2i/d)` (products in f32 as the reference forms them).
pub fn relative_positions(d: usize, t: usize) -> Vec<f32> {
    relative_offsets(d, t as i64 - 1, 2 * t - 1)
}

/// `rows` rows of the table from offset `first` down: row m holds offset
/// `first − m` (a block's queries over a longer run of keys).
pub fn relative_offsets(d: usize, first: i64, rows: usize) -> Vec<f32> {
    let step = -(10000f64.ln() / d as f64) as f32;
    let div: Vec<f32> = (0..d / 2).map(|i| ((2 * i) as f32 * step).exp()).collect();
    let mut out = Vec::with_capacity(d * rows);
    for m in 0..rows {
        let offset = (first - m as i64) as f32;
        for &dv in &div {
            let a = (offset.abs() * dv).copysign(offset) as f64;
            out.push(a.sin() as f32);
            out.push(a.cos() as f32);
        }
    }
    out
}
