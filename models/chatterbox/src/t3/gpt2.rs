//! T3 on a GPT-2 backbone (Turbo, Nano): one graph builder for the prompt's
//! two parts (the voice prefix; the text and speech start) and for a decode
//! step (one speech token). New K/V rows go into the static cache with `set_rows`; attention
//! reads the first `kv_len` cache positions under an input mask, so a graph
//! depends only on its shape, never on the position it writes.
//!
//! Layout: activations `[n_embd, n_tokens]`; heads split as `[head_dim, n_head, n]`.

use super::kv_cache::{AttentionPath, KvCache};
use crate::hparams::T3Hparams;
use engine_core::model_kit::Builder;
use ggml_sys::{Context, GraphIo, Result, Tensor, TYPE_F16, TYPE_F32, TYPE_I32};

/// What a graph feeds the transformer. The prompt
/// `[spkr(speaker) | speech_emb(voice prompt) | text_emb(text) | speech_emb(start)]`
/// runs as two graphs, so that the voice's part, the same for every text, is
/// computed once and stays in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Feed {
    /// `[spkr(speaker) | speech_emb(voice prompt)]` from position 0.
    VoicePrefix { prompt_tokens: usize },
    /// `[text_emb(text) | speech_emb(start)]` after the voice prefix.
    TextSuffix { text_tokens: usize },
    /// `speech_emb(token)`, one position.
    Step,
}

impl Feed {
    pub fn n_tokens(&self) -> usize {
        match *self {
            Feed::VoicePrefix { prompt_tokens } => 1 + prompt_tokens,
            Feed::TextSuffix { text_tokens } => text_tokens + 1,
            Feed::Step => 1,
        }
    }
}

/// A graph's shape: what it feeds and how many cache positions it attends over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    pub feed: Feed,
    pub kv_len: usize,
}

/// Input names. `positions` index `wpe` and are the cache rows written (for
/// the transposed V of the explicit path, `kv_rows_v` hold one index per
/// element); `mask` is `[kv_len, n_tokens]`, 0 where visible and -inf elsewhere.
pub mod input {
    pub const SPEAKER: &str = "speaker";
    pub const PROMPT_TOKENS: &str = "prompt_tokens";
    pub const TEXT_TOKENS: &str = "text_tokens";
    pub const START_TOKEN: &str = "start_token";
    pub const TOKEN: &str = "token";
    pub const POSITIONS: &str = "positions";
    pub const KV_ROWS_V: &str = "kv_rows_v";
    pub const MASK: &str = "mask";
}
/// Output: speech logits of the last position, `[speech_vocab]`.
pub const LOGITS: &str = "logits";

pub fn build<'c>(b: &Builder<'c, '_>, hp: &T3Hparams, kv: &KvCache, shape: Shape) -> Result<GraphIo<'c>> {
    let ctx = b.ctx;
    let n = shape.feed.n_tokens() as i64;
    let mut io = GraphIo { inputs: Vec::new(), outputs: Vec::new() };

    let x = match shape.feed {
        Feed::VoicePrefix { prompt_tokens } => {
            let speaker = io.input(ctx, input::SPEAKER, TYPE_F32, &[hp.speaker_dim as i64, 1])?;
            let x = b.linear(speaker, "t3.cond.spkr")?;
            if prompt_tokens > 0 {
                let ids = io.input(ctx, input::PROMPT_TOKENS, TYPE_I32, &[prompt_tokens as i64])?;
                ctx.concat(x, ctx.get_rows(b.w("t3.speech_emb")?, ids)?, 1)?
            } else {
                x
            }
        }
        Feed::TextSuffix { text_tokens } => {
            let start = ctx.get_rows(b.w("t3.speech_emb")?, io.input(ctx, input::START_TOKEN, TYPE_I32, &[1])?)?;
            if text_tokens > 0 {
                let ids = io.input(ctx, input::TEXT_TOKENS, TYPE_I32, &[text_tokens as i64])?;
                ctx.concat(ctx.get_rows(b.w("t3.text_emb")?, ids)?, start, 1)?
            } else {
                start
            }
        }
        Feed::Step => {
            let token = io.input(ctx, input::TOKEN, TYPE_I32, &[1])?;
            ctx.get_rows(b.w("t3.speech_emb")?, token)?
        }
    };
    let positions = io.input(ctx, input::POSITIONS, TYPE_I32, &[n])?;
    let kv_rows_v = match kv.path {
        AttentionPath::Explicit => Some(io.input(ctx, input::KV_ROWS_V, TYPE_I32, &[n * hp.n_embd as i64])?),
        AttentionPath::Flash => None,
    };
    let mask_ty = if kv.path == AttentionPath::Flash { TYPE_F16 } else { TYPE_F32 };
    let mask = io.input(ctx, input::MASK, mask_ty, &[shape.kv_len as i64, n])?;

    let mut h = ctx.add(x, ctx.get_rows(b.w("t3.wpe")?, positions)?)?;
    for l in 0..hp.n_layer {
        let p = format!("t3.blk.{l}");
        let a = b.layer_norm(h, &format!("{p}.ln1"), hp.layer_norm_eps)?;
        let qkv = b.linear(a, &format!("{p}.attn.qkv"))?;
        let attn = attention(ctx, hp, kv, l, qkv, positions, kv_rows_v, mask, shape.kv_len)?;
        h = ctx.add(h, b.linear(attn, &format!("{p}.attn.out"))?)?;
        let m = b.layer_norm(h, &format!("{p}.ln2"), hp.layer_norm_eps)?;
        let ff = b.linear(b.gelu_tanh(b.linear(m, &format!("{p}.ffn.up"))?)?, &format!("{p}.ffn.down"))?;
        h = ctx.add(h, ff)?;
    }
    // Only the last position's logits are used: norm and project one column
    // (a step has only that one; no view keeps the last residual add and the
    // norm adjacent, so a device may fuse them).
    let last = if n == 1 { h } else { ctx.view(h, &[hp.n_embd as i64, 1], &[h.nb()[1]], (n as usize - 1) * h.nb()[1])? };
    let last = b.layer_norm(last, "t3.ln_f", hp.layer_norm_eps)?;
    let logits = b.linear(last, "t3.speech_head")?;
    io.outputs.push((LOGITS, logits));
    Ok(io)
}

/// Causal self-attention of one layer: writes this graph's K/V rows into the
/// cache, then attends over cache positions `[0, kv_len)`.
#[allow(clippy::too_many_arguments)]
fn attention<'c>(
    ctx: &'c Context,
    hp: &T3Hparams,
    kv: &KvCache,
    layer: usize,
    qkv: Tensor<'c>,
    kv_rows: Tensor<'c>,
    kv_rows_v: Option<Tensor<'c>>,
    mask: Tensor<'c>,
    kv_len: usize,
) -> Result<Tensor<'c>> {
    let (d, hd, nh) = (hp.n_embd as i64, hp.head_dim() as i64, hp.n_head as i64);
    let n = qkv.ne()[1];
    let f = std::mem::size_of::<f32>();
    let row = qkv.nb()[1];
    let part = |i: usize| ctx.view(qkv, &[d, n], &[row], i * d as usize * f);
    let q = ctx.view(qkv, &[hd, nh, n], &[hd as usize * f, row], 0)?;
    let q = ctx.permute(q, [0, 2, 1, 3])?; // [hd, n, nh]
    let scale = 1.0 / (hd as f32).sqrt();
    let kv_len = kv_len as i64;

    let out = match kv.path {
        AttentionPath::Flash => {
            // K and V side by side, as the projection lays them out.
            let kv_pair = ctx.view(qkv, &[2 * d, n], &[row], d as usize * f)?;
            let kv_all = ctx.set_rows(kv.tensor(ctx, "kv", layer), kv_pair, kv_rows)?;
            let pos_row = Context::row_size(kv.ty, 2 * d);
            let head = Context::row_size(kv.ty, hd);
            let k = ctx.view(kv_all, &[hd, kv_len, nh], &[pos_row, head], 0)?;
            let v = ctx.view(kv_all, &[hd, kv_len, nh], &[pos_row, head], Context::row_size(kv.ty, d))?;
            ctx.flash_attn_ext(q, k, v, Some(mask), scale)? // [hd, nh, n]
        }
        AttentionPath::Explicit => {
            let k_all = ctx.set_rows(kv.tensor(ctx, "k", layer), part(1)?, kv_rows)?;
            let k = ctx.view(k_all, &[hd, kv_len, nh], &[Context::row_size(kv.ty, d), Context::row_size(kv.ty, hd)], 0)?;
            // V^T: element (channel e, position p) at e * n_ctx + p.
            let n_ctx = kv.n_ctx as i64;
            let v_t = ctx.cont(ctx.transpose(part(2)?)?)?; // [n, d]
            let v_flat = ctx.reshape(kv.tensor(ctx, "v", layer), &[1, n_ctx * d])?;
            let v_all = ctx.set_rows(v_flat, ctx.reshape(v_t, &[1, n * d])?, kv_rows_v.expect("explicit path has V row indices"))?;
            let pos = f * kv.n_ctx;
            let v = ctx.view(v_all, &[kv_len, hd, nh], &[pos, hd as usize * pos], 0)?;
            // A contiguous right operand lets the CPU use its blocked GEMM (tinyBLAS).
            let kq = ctx.soft_max_ext(ctx.mul_mat(k, ctx.cont(q)?)?, Some(mask), scale)?; // [kv_len, n, nh]
            let kqv = ctx.mul_mat(v, kq)?; // [hd, n, nh]
            ctx.cont(ctx.permute(kqv, [0, 2, 1, 3])?)? // [hd, nh, n]
        }
    };
    ctx.reshape(out, &[d, n])
}
