//! T3 on a Llama backbone (Multilingual): one graph builder for the prompt's
//! two parts (the conditioning; the text and the speech start) and for a
//! decode step, over one or both rows of classifier-free guidance.
//!
//! Rows: 0 is conditional, 1 unconditional (its text embeddings are zero, its
//! text positions are not, as the reference's `text_emb[1].zero_()` leaves
//! them). The conditioning is the same for both rows, so it is computed once
//! and its K/V written to every cache row. A graph computes either both rows
//! as one batch or one row (the two-pass alternative); activations are
//! `[n_embd, tokens · rows]`, each row's tokens contiguous, and only attention
//! splits the rows apart.
//!
//! RMSNorm, NEOX rotary positions (llama3 frequency scaling as `freq_factors`),
//! grouped-query attention, SwiGLU over the fused gate/up projection; the
//! learned text and speech position tables are added to the embeddings.

use super::kv_cache::{AttentionPath, KvCache, KvLayout};
use crate::hparams::{LlamaHparams, T3Hparams};
use crate::tensors::T3_ROPE_FREQ_FACTORS;
use engine_core::model_kit::Builder;
use ggml_sys::{Context, GraphIo, Result, Tensor, TYPE_F16, TYPE_F32, TYPE_I32, TYPE_I64};

/// What a graph feeds the transformer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Feed {
    /// `[spkr(speaker) | perceiver(speech_emb(prompt) + speech_pos) | emotion]`
    /// from position 0 (no perceiver tokens without a prompt).
    Conditioning { prompt_tokens: usize },
    /// `[text_emb(text) + text_pos | speech_emb(start) + speech_pos(0), twice]`
    /// after the conditioning: the reference feeds the start token from the
    /// embedded prompt and again as the loop's first input, both at speech position 0.
    Text { text_tokens: usize },
    /// `speech_emb(token) + speech_pos(i)`, one position.
    Step,
}

impl Feed {
    pub fn n_tokens(&self, l: &LlamaHparams) -> usize {
        match *self {
            Feed::Conditioning { prompt_tokens } => l.cond_len(prompt_tokens),
            Feed::Text { text_tokens } => text_tokens + 2,
            Feed::Step => 1,
        }
    }
}

/// The guidance rows a graph computes, `first..first + count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rows {
    pub first: usize,
    pub count: usize,
}

/// A graph's shape. The conditioning always computes one row and writes it to
/// every cache row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    pub feed: Feed,
    pub kv_len: usize,
    pub rows: Rows,
}

impl Shape {
    /// Rows computed.
    pub fn batch(&self) -> usize {
        if matches!(self.feed, Feed::Conditioning { .. }) {
            1
        } else {
            self.rows.count
        }
    }

    /// Cache rows written, in the order of the `kv_rows` input.
    pub fn written_rows(&self, cache_rows: usize) -> std::ops::Range<usize> {
        match self.feed {
            Feed::Conditioning { .. } => 0..cache_rows,
            _ => self.rows.first..self.rows.first + self.rows.count,
        }
    }

    /// Query positions whose attention the alignment output carries (the
    /// reference's analyzer reads the rows after the text: both start tokens
    /// at the prefill, then one per step); 0 where row 0 is not computed.
    pub fn aligned_queries(&self) -> usize {
        match self.feed {
            Feed::Text { .. } if self.rows.first == 0 => 2,
            Feed::Step if self.rows.first == 0 => 1,
            _ => 0,
        }
    }
}

/// Input names. `positions` `[tokens · rows]` are the rotary positions (cache
/// positions, repeated per row); `kv_rows` the cache rows written, per written
/// row; `kv_rows_v` (explicit path) one index per V element; `mask`
/// `[kv_len, tokens]`, shared by the rows.
pub mod input {
    pub const SPEAKER: &str = "speaker";
    pub const PROMPT_TOKENS: &str = "prompt_tokens";
    pub const PROMPT_POSITIONS: &str = "prompt_positions";
    pub const EMOTION: &str = "emotion";
    pub const TEXT_TOKENS: &str = "text_tokens";
    pub const TEXT_POSITIONS: &str = "text_positions";
    pub const START_TOKEN: &str = "start_token";
    pub const TOKEN: &str = "token";
    /// Speech position of the start tokens or of the step's token.
    pub const SPEECH_POSITION: &str = "speech_position";
    pub const POSITIONS: &str = "positions";
    pub const KV_ROWS: &str = "kv_rows";
    pub const KV_ROWS_V: &str = "kv_rows_v";
    pub const MASK: &str = "mask";
    /// The mask's last `aligned_queries` rows, as its own tensor (a view at
    /// that row offset would not meet the device's buffer alignment).
    pub const ALIGNED_MASK: &str = "aligned_mask";
}

/// Outputs: `logits` `[speech_vocab, rows]` of each computed row's last
/// position; `aligned` `[kv_len, queries]`, row 0's attention probabilities
/// averaged over the aligned heads; `cond_emb` `[n_embd, cond_len]` and
/// `perceiver` `[n_embd, queries]` from the conditioning graph.
pub mod output {
    pub const LOGITS: &str = "logits";
    pub const ALIGNED: &str = "aligned";
    pub const COND_EMB: &str = "cond_emb";
    pub const PERCEIVER: &str = "perceiver";
}

pub fn build<'c>(b: &Builder<'c, '_>, hp: &T3Hparams, l: &LlamaHparams, kv: &KvCache, shape: Shape) -> Result<GraphIo<'c>> {
    let ctx = b.ctx;
    let n = shape.feed.n_tokens(l) as i64;
    let batch = shape.batch() as i64;
    let written = shape.written_rows(kv.rows).len() as i64;
    let mut io = GraphIo { inputs: Vec::new(), outputs: Vec::new() };

    let x = match shape.feed {
        Feed::Conditioning { prompt_tokens } => {
            let speaker = io.input(ctx, input::SPEAKER, TYPE_F32, &[hp.speaker_dim as i64, 1])?;
            let mut x = b.linear(speaker, "t3.cond.spkr")?;
            if prompt_tokens > 0 {
                let ids = io.input(ctx, input::PROMPT_TOKENS, TYPE_I32, &[prompt_tokens as i64])?;
                let pos = io.input(ctx, input::PROMPT_POSITIONS, TYPE_I32, &[prompt_tokens as i64])?;
                let prompt = ctx.add(ctx.get_rows(b.w("t3.speech_emb")?, ids)?, ctx.get_rows(b.w("t3.speech_pos")?, pos)?)?;
                let resampled = perceiver(b, l, prompt, hp.layer_norm_eps)?;
                io.outputs.push((output::PERCEIVER, resampled));
                x = ctx.concat(x, resampled, 1)?;
            }
            let emotion = io.input(ctx, input::EMOTION, TYPE_F32, &[1, 1])?;
            let w = ctx.reshape(b.w("t3.cond.emotion.weight")?, &[hp.n_embd as i64, 1])?;
            let x = ctx.concat(x, ctx.mul(w, emotion)?, 1)?;
            io.outputs.push((output::COND_EMB, x));
            x
        }
        Feed::Text { text_tokens } => {
            // Only the conditional row (0) reads the text tokens.
            let ids = if shape.rows.first == 0 { Some(io.input(ctx, input::TEXT_TOKENS, TYPE_I32, &[text_tokens as i64])?) } else { None };
            let pos = io.input(ctx, input::TEXT_POSITIONS, TYPE_I32, &[text_tokens as i64])?;
            let start = io.input(ctx, input::START_TOKEN, TYPE_I32, &[1])?;
            let speech_pos = io.input(ctx, input::SPEECH_POSITION, TYPE_I32, &[1])?;
            let start = ctx.add(ctx.get_rows(b.w("t3.speech_emb")?, start)?, ctx.get_rows(b.w("t3.speech_pos")?, speech_pos)?)?;
            let starts = ctx.concat(start, start, 1)?;
            let text_pos = ctx.get_rows(b.w("t3.text_pos")?, pos)?;
            let mut x: Option<Tensor<'c>> = None;
            for r in shape.rows.first..shape.rows.first + shape.rows.count {
                let text = match ids {
                    Some(ids) if r == 0 => ctx.add(ctx.get_rows(b.w("t3.text_emb")?, ids)?, text_pos)?,
                    _ => text_pos,
                };
                let row = ctx.concat(text, starts, 1)?;
                x = Some(match x {
                    Some(x) => ctx.concat(x, row, 1)?,
                    None => row,
                });
            }
            x.expect("at least one row")
        }
        Feed::Step => {
            let token = io.input(ctx, input::TOKEN, TYPE_I32, &[1])?;
            let speech_pos = io.input(ctx, input::SPEECH_POSITION, TYPE_I32, &[1])?;
            let e = ctx.add(ctx.get_rows(b.w("t3.speech_emb")?, token)?, ctx.get_rows(b.w("t3.speech_pos")?, speech_pos)?)?;
            if batch == 2 {
                ctx.concat(e, e, 1)?
            } else {
                e
            }
        }
    };
    let positions = io.input(ctx, input::POSITIONS, TYPE_I32, &[n * batch])?;
    // I64 row indices: ggml-cuda and ggml-vulkan fuse a rotation, the view of
    // its result and the `set_rows` writing it only over I64 indices.
    let kv_rows = io.input(ctx, input::KV_ROWS, TYPE_I64, &[n * written])?;
    let kv_rows_v = match kv.path {
        AttentionPath::Explicit => Some(io.input(ctx, input::KV_ROWS_V, TYPE_I32, &[n * written * kv.width as i64])?),
        AttentionPath::Flash => None,
    };
    let mask_ty = if kv.path == AttentionPath::Flash { TYPE_F16 } else { TYPE_F32 };
    let mask = io.input(ctx, input::MASK, mask_ty, &[shape.kv_len as i64, n])?;
    let freq_factors = l.rope_scaling.map(|_| b.w(T3_ROPE_FREQ_FACTORS)).transpose()?;
    let queries = shape.aligned_queries() as i64;
    let aligned_mask =
        if queries > 0 && !l.aligned_heads.is_empty() { Some(io.input(ctx, input::ALIGNED_MASK, TYPE_F32, &[shape.kv_len as i64, queries])?) } else { None };

    let io_in = Inputs { positions, freq_factors, kv_rows, kv_rows_v, mask, aligned_mask };
    let mut h = x;
    let mut aligned: Option<Tensor<'c>> = None;
    for layer in 0..hp.n_layer {
        let p = format!("t3.blk.{layer}");
        let a = b.rms_norm(h, &format!("{p}.attn_norm.weight"), l.rms_norm_eps)?;
        let qkv = b.linear_no_bias(a, &format!("{p}.attn.qkv.weight"))?;
        let (attn, probs) = attention(ctx, hp, l, kv, layer, qkv, &io_in, shape)?;
        if let Some(probs) = probs {
            aligned = Some(match aligned {
                Some(sum) => ctx.add(sum, probs)?,
                None => probs,
            });
        }
        h = ctx.add(h, b.linear_no_bias(attn, &format!("{p}.attn.out.weight"))?)?;
        let m = b.rms_norm(h, &format!("{p}.ffn_norm.weight"), l.rms_norm_eps)?;
        let ff = b.linear_no_bias(ctx.swiglu(b.linear_no_bias(m, &format!("{p}.ffn.gate_up.weight"))?)?, &format!("{p}.ffn.down.weight"))?;
        h = ctx.add(h, ff)?;
    }
    if let Some(sum) = aligned {
        io.outputs.push((output::ALIGNED, ctx.scale_bias(sum, 1.0 / l.aligned_heads.len() as f32, 0.0)?));
    }
    // Only each row's last position is scored. (The conditioning graph
    // scores one too: its output keeps the last layer's K/V writes in the graph.)
    let d = hp.n_embd as i64;
    let row_bytes = h.nb()[1];
    let last = ctx.cont(ctx.view(h, &[d, batch], &[n as usize * row_bytes], (n as usize - 1) * row_bytes)?)?;
    let last = b.rms_norm(last, "t3.norm_f.weight", l.rms_norm_eps)?;
    io.outputs.push((output::LOGITS, b.linear_no_bias(last, "t3.speech_head.weight")?));
    Ok(io)
}

/// The per-graph inputs every layer's attention reads.
struct Inputs<'c> {
    positions: Tensor<'c>,
    freq_factors: Option<Tensor<'c>>,
    kv_rows: Tensor<'c>,
    kv_rows_v: Option<Tensor<'c>>,
    mask: Tensor<'c>,
    aligned_mask: Option<Tensor<'c>>,
}

/// Causal grouped-query self-attention of one layer: rotates Q and K, writes
/// this graph's K/V into the cache rows it owns, then attends over cache
/// positions `[0, kv_len)` of the computed rows. Also returns row 0's
/// attention probabilities summed over this layer's aligned heads, for the
/// last `shape.aligned_queries()` positions, where there are any.
#[allow(clippy::too_many_arguments)]
fn attention<'c>(
    ctx: &'c Context,
    hp: &T3Hparams,
    l: &LlamaHparams,
    kv: &KvCache,
    layer: usize,
    qkv: Tensor<'c>,
    io: &Inputs<'c>,
    shape: Shape,
) -> Result<(Tensor<'c>, Option<Tensor<'c>>)> {
    let f = std::mem::size_of::<f32>();
    let (hd, nh, nkv) = (l.head_dim as i64, hp.n_head as i64, l.n_head_kv as i64);
    let (q_width, w) = (nh * hd, kv.width as i64);
    let cols = qkv.ne()[1];
    let batch = shape.batch() as i64;
    let n = cols / batch;
    let row = qkv.nb()[1];
    // Each column of `qkv` is Q's heads, then K's, then V. One rotation over
    // Q and K together, written in place, leaves rotated K next to V, so the
    // flash path stores both with one write into a cache whose row per
    // position is K then V (three kernels a layer become two on the GPUs).
    let qk = ctx.rope_neox_inplace(ctx.view(qkv, &[hd, nh + nkv, cols], &[hd as usize * f, row], 0)?, io.positions, io.freq_factors, l.rope_base)?;
    // Views of `qk` (not of `qkv`): they read what the rotation wrote.
    let column = |width: i64, offset: i64| ctx.view(qk, &[width, cols], &[row], offset as usize * f);
    let written = shape.written_rows(kv.rows).len();
    let kv_len = shape.kv_len as i64;
    let first = shape.rows.first;
    let head_bytes = Context::row_size(kv.ty, hd);
    let pos_bytes = match (kv.path, kv.layout) {
        (AttentionPath::Flash, KvLayout::Fused) => Context::row_size(kv.ty, 2 * w),
        (AttentionPath::Explicit, KvLayout::Split) => Context::row_size(kv.ty, w),
        _ => {
            return Err(ggml_sys::Error::Msg(
                "the Llama T3 reads a fused K|V cache on the flash path and a split one on the explicit path (a bug in the caller)".into(),
            ))
        }
    };
    let seq_bytes = pos_bytes * kv.n_ctx;
    // The conditioning is computed once and written to every cache row.
    let rows_of = |src: Tensor<'c>| -> Result<Tensor<'c>> {
        if written <= batch as usize {
            return Ok(src);
        }
        let one = ctx.cont(src)?;
        (1..written).try_fold(one, |all, _| ctx.concat(all, one, 1))
    };
    let cache_view = |all: Tensor<'c>, offset: usize| ctx.view(all, &[hd, kv_len, nkv, batch], &[pos_bytes, head_bytes, seq_bytes], first * seq_bytes + offset);
    // Flash: one write of K|V; explicit: K here, V transposed below.
    let k_all = match kv.layout {
        KvLayout::Fused => ctx.set_rows(kv.tensor(ctx, "kv", layer), rows_of(column(2 * w, q_width)?)?, io.kv_rows)?,
        KvLayout::Split => ctx.set_rows(kv.tensor(ctx, "k", layer), rows_of(column(w, q_width)?)?, io.kv_rows)?,
    };
    let k_view = cache_view(k_all, 0)?;
    // Q as [hd, n, nh, B]: head h of token t of row b at b·n·row + t·row + h·hd.
    let q4 = ctx.permute(ctx.view(qk, &[hd, nh, n, batch], &[hd as usize * f, row, n as usize * row], 0)?, [0, 2, 1, 3])?;
    let scale = 1.0 / (hd as f32).sqrt();

    let out = match kv.path {
        // V sits after K in each position's row of the fused cache.
        AttentionPath::Flash => ctx.flash_attn_ext(q4, k_view, cache_view(k_all, Context::row_size(kv.ty, w))?, Some(io.mask), scale)?, // [hd, nh, n, B]
        AttentionPath::Explicit => {
            // V^T per row: element (channel e, position p) of row r at (r·width + e)·n_ctx + p.
            let n_ctx = kv.n_ctx as i64;
            let v_src = rows_of(column(w, q_width + w)?)?;
            let total = v_src.ne()[1];
            let v_t = ctx.cont(ctx.transpose(v_src)?)?; // [tokens, w]
            let v_flat = ctx.reshape(kv.tensor(ctx, "v", layer), &[1, n_ctx * w * kv.rows as i64])?;
            let v_all = ctx.set_rows(v_flat, ctx.reshape(v_t, &[1, total * w])?, io.kv_rows_v.expect("explicit path has V row indices"))?;
            let p = f * kv.n_ctx;
            let v_view = ctx.view(v_all, &[kv_len, hd, nkv, batch], &[p, hd as usize * p, w as usize * p], first * w as usize * p)?;
            let kq = ctx.soft_max_ext(ctx.mul_mat(k_view, ctx.cont(q4)?)?, Some(io.mask), scale)?; // [kv_len, n, nh, B]
            let kqv = ctx.mul_mat(v_view, kq)?; // [hd, n, nh, B]
            ctx.cont(ctx.permute(kqv, [0, 2, 1, 3])?)? // [hd, nh, n, B]
        }
    };
    let out = ctx.reshape(out, &[q_width, cols])?;

    // Row 0's probabilities for the aligned heads of this layer, recomputed
    // explicitly (the fused kernel does not expose them): [kv_len, m] each.
    let m = shape.aligned_queries() as i64;
    let mut probs: Option<Tensor<'c>> = None;
    if let Some(mask_m) = io.aligned_mask {
        let group = (nh / nkv) as usize;
        for &(_, head) in l.aligned_heads.iter().filter(|(al, _)| *al == layer) {
            let q_h = ctx.view(qk, &[hd, m], &[row], (n - m) as usize * row + head * hd as usize * f)?;
            let k_h = ctx.view(k_all, &[hd, kv_len], &[pos_bytes], (head / group) * head_bytes)?;
            let p = ctx.soft_max_ext(ctx.mul_mat(k_h, ctx.cont(q_h)?)?, Some(mask_m), scale)?;
            probs = Some(match probs {
                Some(sum) => ctx.add(sum, p)?,
                None => p,
            });
        }
    }
    Ok((out, probs))
}

/// The perceiver resampler: the learned queries attend to the voice prompt,
/// then to themselves, through one shared attention block (LayerNorm on both
/// inputs, Q/K/V with biases, output projection, residual on the queries).
fn perceiver<'c>(b: &Builder<'c, '_>, l: &LlamaHparams, prompt: Tensor<'c>, eps: f32) -> Result<Tensor<'c>> {
    let query = b.w("t3.perceiver.query")?;
    let resampled = perceiver_block(b, l, query, prompt, eps)?;
    perceiver_block(b, l, resampled, resampled, eps)
}

fn perceiver_block<'c>(b: &Builder<'c, '_>, l: &LlamaHparams, x1: Tensor<'c>, x2: Tensor<'c>, eps: f32) -> Result<Tensor<'c>> {
    let ctx = b.ctx;
    let [d, t1, ..] = x1.ne();
    let t2 = x2.ne()[1];
    let heads = l.perceiver_heads as i64;
    let hd = d / heads;
    let n1 = b.layer_norm(x1, "t3.perceiver.norm", eps)?;
    let n2 = b.layer_norm(x2, "t3.perceiver.norm", eps)?;
    let split = |t: Tensor<'c>, len: i64| -> Result<Tensor<'c>> { ctx.permute(ctx.reshape(t, &[hd, heads, len, 1])?, [0, 2, 1, 3]) };
    let q = split(b.linear(n1, "t3.perceiver.q")?, t1)?;
    let k = split(b.linear(n2, "t3.perceiver.k")?, t2)?;
    let v = split(b.linear(n2, "t3.perceiver.v")?, t2)?;
    let o = b.attention(q, k, v, None, 1.0 / (hd as f32).sqrt())?; // [d, t1, 1]
    let h = b.linear(ctx.reshape(o, &[d, t1])?, "t3.perceiver.out")?;
    ctx.add(x1, h)
}
