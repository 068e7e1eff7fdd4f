//! S3Gen over speech tokens that arrive in blocks (streaming), carrying its
//! state from block to block instead of recomputing what came before.
//!
//! Attention is block-causal: a token, and its mel frames, attend to their
//! own block and to every block before it, as the reference's encoder and
//! decoder do under a chunk mask (`add_optional_chunk_mask`); convolutions
//! are not masked (the encoder's lookahead conv still reads the tokens after
//! a block, so a block is due only once they exist). Each attention layer
//! keeps the keys and values of every position so far in a cache on the
//! device (the encoder's two stacks, and the CFM's transformer blocks once
//! per Euler step), each causal conv hands its last input frames on, and the
//! upsampling conv its last two tokens: a block costs what its own
//! positions cost, plus attention over the positions before it.
//!
//! The CFM's caches may keep a [`Window`] instead of every frame: the
//! prompt's frames, then a ring of the most recent ones. The estimator has no
//! positional encoding, so where a frame sits in the cache does not matter,
//! only whether the mask lets a block see it.

use super::{cfm, encoder, EncoderOutput, S3Gen, MAX_NODES};
use crate::hparams::S3GenHparams;
use crate::t3::kv_cache::{AttentionPath, KvCache, KvDims, KvLayout};
use crate::Result;
use engine_core::model_kit::builder::compute_graph;
use ggml_sys::{GraphSlot, Type, TYPE_F32};

/// The memory plan's names of what a stream holds.
pub const STREAM_CACHES: &str = "s3gen.stream_caches";
pub const STREAM_ENCODER: &str = "s3gen.stream_encoder";
pub const STREAM_CFM: &str = "s3gen.stream_cfm";
pub const STREAM_VOCODER: &str = "s3gen.stream_vocoder";

/// Attention spans grow in steps of this many tokens, so that a graph built
/// for one block serves the blocks after it until the span must grow.
pub const SPAN_TOKENS: usize = 64;

/// The kinds of block a streamed chunk has, each with graphs of its own:
/// the first (the voice prompt with the first hop), a hop, and the last
/// (what is left when T3 ends). Every hop of every chunk then reuses one
/// graph per stage (where spans are whole, [`BlockStream`]); the first
/// block's stays for the next chunk, and the last block's for a next last
/// block of its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    First,
    Hop,
    Last,
}

impl BlockKind {
    pub const ALL: [BlockKind; 3] = [BlockKind::First, BlockKind::Hop, BlockKind::Last];

    pub fn index(self) -> usize {
        self as usize
    }
}

/// One graph slot per [`BlockKind`].
pub type KindSlots<K> = [GraphSlot<K>; 3];

/// What the CFM's attention keeps of the frames before a block: the first
/// `sink` frames (the prompt's), and the `recent` frames before the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub sink: usize,
    pub recent: usize,
    /// The most frames a block may have (past the sink, for the first).
    pub max_block: usize,
}

impl Window {
    /// Cache slots: the sink, then a ring that holds the recent frames and a block.
    pub fn slots(&self) -> usize {
        self.sink + self.recent + self.max_block
    }

    /// The slot of frame `f`.
    fn slot(&self, f: usize) -> usize {
        if f < self.sink {
            f
        } else {
            self.sink + (f - self.sink) % (self.recent + self.max_block)
        }
    }
}

/// How a text chunk streams, in tokens: the voice prompt before its speech,
/// the most codes it may bring, its hops, how many codes' frames before a
/// block the CFM sees (0: all), and the CFM's Euler steps. What sizes a
/// [`BlockStream`], for the stream and for the memory plan alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamShape {
    pub prompt_tokens: usize,
    pub max_codes: usize,
    pub first: usize,
    pub hop: usize,
    pub context_tokens: usize,
    pub steps: usize,
}

impl StreamShape {
    /// Tokens of the longest sequence: the prompt and every code.
    pub fn capacity(&self) -> usize {
        self.prompt_tokens + self.max_codes
    }

    /// The CFM's window: the prompt's frames, the context's, and room for
    /// a block past the prompt (the first hop, a hop, or the last block's
    /// rest: less than a hop, the lookahead and the closing silence).
    pub fn window(&self, hp: &S3GenHparams) -> Option<Window> {
        let up = hp.encoder.up_stride;
        let max_block = (self.hop.max(self.first) + hp.encoder.pre_lookahead + crate::speech_tokens::SILENCE_CODES) * up;
        (self.context_tokens > 0).then(|| Window { sink: self.prompt_tokens * up, recent: self.context_tokens * up, max_block })
    }

    /// Tokens of each kind of block ([`BlockKind::ALL`]'s order): the first
    /// (the prompt and the first hop), a hop, and at most the last (less than
    /// a hop, the lookahead and the closing silence).
    pub fn block_tokens(&self, hp: &S3GenHparams) -> [usize; 3] {
        [self.prompt_tokens + self.first, self.hop, self.hop + hp.encoder.pre_lookahead + crate::speech_tokens::SILENCE_CODES]
    }

    /// Mel frames of each kind of block's vocoder window at most: the new
    /// frames past the prompt, after the last window's kept frames.
    pub fn vocoder_windows(&self, hp: &S3GenHparams) -> [usize; 3] {
        let [_, hop, last] = self.block_tokens(hp);
        let (up, kept) = (hp.encoder.up_stride, super::stream::CACHE_FRAMES);
        [self.first * up, kept + hop * up, kept + last * up]
    }
}

/// The caches a [`BlockStream`] of `shape` keeps: the encoder's (token and
/// frame stacks, F32) and the CFM's, one per Euler step (in `kv_type`).
fn cache_specs(hp: &S3GenHparams, shape: &StreamShape, kv_type: Type) -> [(KvDims, Type, usize); 3] {
    let (e, c) = (&hp.encoder, &hp.cfm);
    let capacity = rounded_capacity(shape.capacity());
    let rows = guidance_rows(hp);
    let frames = shape.window(hp).map_or(capacity * e.up_stride, |w| w.slots());
    [
        (KvDims { n_layer: e.n_layer, width: e.n_embd, n_ctx: capacity, rows: 1 }, TYPE_F32, 1),
        (KvDims { n_layer: e.n_up_layer, width: e.n_embd, n_ctx: capacity * e.up_stride, rows: 1 }, TYPE_F32, 1),
        (KvDims { n_layer: cfm::attention_layers(c), width: c.n_head * c.head_dim, n_ctx: frames, rows }, kv_type, shape.steps),
    ]
}

fn rounded_capacity(tokens: usize) -> usize {
    tokens.max(1).div_ceil(SPAN_TOKENS) * SPAN_TOKENS
}

/// CFM rows: both guidance rows where the standard decoder guides.
fn guidance_rows(hp: &S3GenHparams) -> usize {
    if hp.meanflow || hp.cfg_rate == 0.0 {
        1
    } else {
        2
    }
}

fn kv_cache(backend: &ggml_sys::Backend, dims: KvDims, ty: Type, measuring: bool) -> Result<KvCache> {
    let (path, layout) = (AttentionPath::Flash, KvLayout::Split);
    Ok(if measuring { KvCache::for_measuring(backend, dims, ty, path, layout)? } else { KvCache::new(backend, dims, ty, path, layout)? })
}

/// The caches of a stream of `shape` on `backend`, without memory: for the
/// memory plan, which measures the block graphs over them.
pub struct MeasuredCaches {
    pub encoder: encoder::EncoderCaches,
    pub cfm: KvCache,
    /// Device bytes of every cache the stream allocates (the CFM's once per step).
    pub bytes: usize,
}

pub fn measured_caches(backend: &ggml_sys::Backend, hp: &S3GenHparams, shape: &StreamShape, kv_type: Type) -> Result<MeasuredCaches> {
    let [tokens, frames, cfm] = cache_specs(hp, shape, kv_type);
    let encoder = encoder::EncoderCaches { tokens: kv_cache(backend, tokens.0, tokens.1, true)?, frames: kv_cache(backend, frames.0, frames.1, true)? };
    let cfm_cache = kv_cache(backend, cfm.0, cfm.1, true)?;
    let bytes = encoder.tokens.bytes() + encoder.frames.bytes() + cfm_cache.bytes() * cfm.2;
    Ok(MeasuredCaches { encoder, cfm: cfm_cache, bytes })
}

/// The attention span, in tokens, of a block ending at `end` in a stream of
/// `capacity` tokens (rounded as the stream rounds it).
pub fn span_tokens(end: usize, capacity: usize) -> usize {
    end.div_ceil(SPAN_TOKENS).saturating_mul(SPAN_TOKENS).min(rounded_capacity(capacity))
}

/// The state of one streamed sequence (prompt tokens, then speech tokens).
pub struct BlockStream {
    // Graphs first: they are dropped before the caches they read.
    encoder_graphs: KindSlots<encoder::BlockShape>,
    /// Per Euler step (each writes its own cache), one per kind of block.
    cfm_graphs: Vec<KindSlots<(usize, usize)>>,
    /// The kind of the block last encoded (the CFM's next).
    kind: BlockKind,
    encoder_caches: encoder::EncoderCaches,
    cfm_caches: Vec<KvCache>,
    /// Per Euler step, every causal conv's last input frames.
    conv_tails: Vec<Vec<f32>>,
    /// The first conformer stack's outputs for the last tokens encoded.
    up_tail: Vec<f32>,
    /// The encoder's relative-position tables (tokens, frames), kept
    /// across blocks: each block reads a run of offsets, mostly the same.
    token_offsets: OffsetTable,
    frame_offsets: OffsetTable,
    /// Tokens encoded so far, and frames estimated.
    tokens_done: usize,
    frames_done: usize,
    schedule: Vec<f32>,
    /// CFM rows: 2 for classifier-free guidance, else 1.
    rows: usize,
    window: Option<Window>,
    /// With a window: the frame each CFM cache slot holds.
    slot_frames: Vec<Option<usize>>,
    shape: StreamShape,
    /// Attention spans are the whole capacity from the first block on (a
    /// GPU: masked keys cost it little, while a graph per span would be
    /// rebuilt, and re-captured, as the span grows); else they grow in
    /// [`SPAN_TOKENS`] steps with the sequence (the host, whose work
    /// follows the span, and other devices).
    whole_span: bool,
}

impl BlockStream {
    /// The stream of a chunk of `shape`.
    pub fn new(s3: &S3Gen, shape: &StreamShape) -> Result<BlockStream> {
        let hp = &s3.hp;
        let [tokens, frames, cfm] = cache_specs(hp, shape, s3.policy.kv_type);
        let encoder_caches =
            encoder::EncoderCaches { tokens: kv_cache(&s3.backend, tokens.0, tokens.1, false)?, frames: kv_cache(&s3.backend, frames.0, frames.1, false)? };
        let cfm_caches = (0..cfm.2).map(|_| kv_cache(&s3.backend, cfm.0, cfm.1, false)).collect::<Result<Vec<_>>>()?;
        let rows = guidance_rows(hp);
        let window = shape.window(hp);
        Ok(BlockStream {
            encoder_graphs: Default::default(),
            cfm_graphs: (0..shape.steps).map(|_| Default::default()).collect(),
            kind: BlockKind::First,
            encoder_caches,
            cfm_caches,
            conv_tails: vec![vec![0.0; cfm::conv_tail_len(&hp.cfm, rows)]; shape.steps],
            up_tail: vec![0.0; encoder::UP_CONTEXT_TOKENS * hp.encoder.n_embd],
            token_offsets: OffsetTable::default(),
            frame_offsets: OffsetTable::default(),
            tokens_done: 0,
            frames_done: 0,
            schedule: s3.schedule(shape.steps),
            rows,
            window,
            slot_frames: vec![None; window.map_or(0, |w| w.slots())],
            shape: *shape,
            whole_span: s3.on_gpu(),
        })
    }

    pub fn shape(&self) -> StreamShape {
        self.shape
    }

    /// The stream at the start of a new sequence, its caches and graphs
    /// kept: what the caches hold from before is masked until overwritten.
    pub fn restarted(mut self) -> BlockStream {
        self.conv_tails.iter_mut().for_each(|t| t.fill(0.0));
        self.up_tail.fill(0.0);
        self.slot_frames.fill(None);
        self.tokens_done = 0;
        self.frames_done = 0;
        self
    }

    /// Device bytes by item, as the memory plan names them: the caches, the
    /// encoder's block graphs, the CFM's (those of every Euler step).
    pub fn resident_bytes(&self) -> [(&'static str, usize); 3] {
        [
            (STREAM_CACHES, self.cache_bytes()),
            (STREAM_ENCODER, kind_slot_bytes(&self.encoder_graphs)),
            (STREAM_CFM, self.cfm_graphs.iter().map(kind_slot_bytes).sum()),
        ]
    }

    /// Tokens encoded so far.
    pub fn tokens_done(&self) -> usize {
        self.tokens_done
    }

    /// Device bytes of the caches.
    pub fn cache_bytes(&self) -> usize {
        self.encoder_caches.tokens.bytes() + self.encoder_caches.frames.bytes() + self.cfm_caches.iter().map(KvCache::bytes).sum::<usize>()
    }

    /// Encodes the next block, tokens `[tokens_done, end)` of `tokens` (every
    /// token so far: the lookahead reads the ones after `end`, which must be
    /// there unless `end` is the sequence's end).
    pub fn encode(&mut self, s3: &mut S3Gen, tokens: &[i32], end: usize) -> Result<EncoderOutput> {
        let start = self.tokens_done;
        let e = &s3.hp.encoder;
        if end <= start || end > tokens.len() || end > self.shape.capacity() {
            return Err(format!(
                "a block must end after token {start}, at most at {} (of {}), not at {end}",
                tokens.len().min(self.shape.capacity()),
                tokens.len()
            )
            .into());
        }
        if let Some(t) = tokens.iter().find(|&&t| t < 0 || t as usize >= s3.hp.speech_vocab) {
            return Err(format!("speech token {t} is outside S3Gen's vocabulary of {}", s3.hp.speech_vocab).into());
        }
        let left = start.min(e.lookahead_conv2_kernel - 1);
        let right = (tokens.len() - end).min(e.pre_lookahead);
        let shape = encoder::BlockShape { left, new: end - start, right, span: self.span(end) };
        let (d, stride, n) = (e.n_embd, e.up_stride, shape.new);
        // Only the last block has no lookahead after it.
        self.kind = if start == 0 {
            BlockKind::First
        } else if end == tokens.len() {
            BlockKind::Last
        } else {
            BlockKind::Hop
        };
        let caches = &self.encoder_caches;
        let graph = self.encoder_graphs[self.kind.index()].get_or_build(shape, || {
            compute_graph(&s3.backend, &s3.weights, &s3.policy, MAX_NODES, "the S3Gen encoder", |b| encoder::build_block(&b, &s3.hp, shape, caches))
        })?;
        graph.set_i32(encoder::TOKENS, &tokens[start - left..end + right])?;
        graph.set_f32(encoder::POS_EMB, &self.token_offsets.rows(d, end as i64 - 1, shape.span + n - 1))?;
        let up_span = shape.span * stride;
        graph.set_f32(encoder::UP_POS_EMB, &self.frame_offsets.rows(d, (end * stride) as i64 - 1, up_span + n * stride - 1))?;
        graph.set_i32(encoder::KV_ROWS, &(start as i32..end as i32).collect::<Vec<_>>())?;
        graph.set_i32(encoder::UP_KV_ROWS, &((start * stride) as i32..(end * stride) as i32).collect::<Vec<_>>())?;
        graph.set_f32(encoder::MASK, &visible_before(end, shape.span, n))?;
        graph.set_f32(encoder::UP_MASK, &visible_before(end * stride, up_span, n * stride))?;
        graph.set_f32(encoder::UP_TAIL, &self.up_tail)?;
        graph.compute(&s3.backend)?;
        let hidden = engine_core::model_kit::finite::check_stage("the S3Gen encoder", graph.get_f32(encoder::ENCODER_OUT)?)?;
        let mu = engine_core::model_kit::finite::check_stage("the S3Gen encoder", graph.get_f32(encoder::MU)?)?;
        self.up_tail = graph.get_f32(encoder::UP_TAIL_OUT)?;
        self.tokens_done = end;
        Ok(EncoderOutput { hidden, mu, frames: n * stride })
    }

    /// Integrates the frames of the block last encoded from `x0`, each array
    /// `[frames][mel]` over those frames (`spks` one row), as
    /// [`S3Gen::integrate`] integrates a whole sequence; returns the final
    /// state, and each step's velocity into `trace` when given.
    pub fn integrate(&mut self, s3: &mut S3Gen, x0: &[f32], mu: &[f32], spks: &[f32], cond: &[f32], mut trace: Option<&mut Vec<Vec<f32>>>) -> Result<Vec<f32>> {
        s3.check_cfm_inputs(x0, mu, spks, cond)?;
        let frames = x0.len() / s3.hp.mel_channels;
        let (start, end) = (self.frames_done, self.tokens_done * s3.hp.encoder.up_stride);
        if start + frames != end {
            return Err(format!("the CFM block has {frames} frames; the encoded block has {}", end - start).into());
        }
        let with_zero_row = |a: &[f32]| if self.rows == 1 { a.to_vec() } else { [a, &vec![0.0; a.len()]].concat() };
        let (mu, spks, cond) = (with_zero_row(mu), with_zero_row(spks), with_zero_row(cond));
        let n_ctx = self.cfm_caches.first().map_or(0, |c| c.n_ctx);
        let (slots, span, mask) = match self.window {
            None => {
                let span = self.span(self.tokens_done) * s3.hp.encoder.up_stride;
                ((start..end).collect::<Vec<_>>(), span, visible_before(end, span, mask_rows(frames)))
            }
            Some(w) => {
                if end - start.max(w.sink) > w.max_block {
                    return Err(format!("a CFM block of {} frames past the prompt's exceeds the window's {}", end - start.max(w.sink), w.max_block).into());
                }
                let slots: Vec<usize> = (start..end).map(|f| w.slot(f)).collect();
                for (&slot, f) in slots.iter().zip(start..) {
                    self.slot_frames[slot] = Some(f);
                }
                let first_recent = start.saturating_sub(w.recent).max(w.sink);
                let visible = |f: &Option<usize>| f.is_some_and(|f| f < end && (f < w.sink || f >= first_recent));
                let row: Vec<f32> = self.slot_frames.iter().map(|f| if visible(f) { 0.0 } else { f32::NEG_INFINITY }).collect();
                (slots, n_ctx, row.repeat(mask_rows(frames)))
            }
        };
        let kv_rows: Vec<i32> = (0..self.rows).flat_map(|r| slots.iter().map(move |&p| (r * n_ctx + p) as i32)).collect();
        let c = &s3.hp.cfm;
        let mut x = x0.to_vec();
        for step in 0..self.cfm_graphs.len() {
            let (t, r) = (self.schedule[step], self.schedule[step + 1]);
            let cache = &self.cfm_caches[step];
            let graph = self.cfm_graphs[step][self.kind.index()].get_or_build((frames, span), || {
                compute_graph(&s3.backend, &s3.weights, &s3.policy, MAX_NODES, "the CFM", |b| cfm::build_block(&b, &s3.hp, frames, self.rows, span, cache))
            })?;
            let xs = if self.rows == 1 { x.clone() } else { [&x[..], &x[..]].concat() };
            graph.set_f32(cfm::X, &xs)?;
            graph.set_f32(cfm::MU, &mu)?;
            graph.set_f32(cfm::SPKS, &spks)?;
            graph.set_f32(cfm::COND, &cond)?;
            graph.set_f32(cfm::T_EMB, &cfm::time_embedding(c.in_channels, c.time_scale, t))?;
            if s3.hp.meanflow {
                graph.set_f32(cfm::R_EMB, &cfm::time_embedding(c.in_channels, c.time_scale, r))?;
            }
            graph.set_i32(cfm::KV_ROWS, &kv_rows)?;
            graph.set_f32(cfm::MASK, &mask)?;
            graph.set_f32(cfm::CONV_TAILS, &self.conv_tails[step])?;
            let v = engine_core::model_kit::finite::check_stage("the CFM", graph.compute_and_get_f32(&s3.backend, cfm::VELOCITY)?)?;
            self.conv_tails[step] = graph.get_f32(cfm::CONV_TAILS_OUT)?;
            let v = if self.rows == 1 {
                v
            } else {
                let (cond_v, uncond_v) = v.split_at(x.len());
                cfm::combine_guidance(cond_v, uncond_v, s3.hp.cfg_rate)
            };
            let dt = r - t;
            x.iter_mut().zip(&v).for_each(|(a, b)| *a += dt * b);
            if let Some(trace) = trace.as_deref_mut() {
                trace.push(v);
            }
        }
        self.frames_done = end;
        Ok(x)
    }

    /// The attention span, in tokens, of a block ending at `end`.
    fn span(&self, end: usize) -> usize {
        let capacity = self.shape.capacity();
        span_tokens(if self.whole_span { capacity } else { end }, capacity)
    }
}

/// Device bytes of the graphs held in `slots`.
pub fn kind_slot_bytes<K: PartialEq>(slots: &KindSlots<K>) -> usize {
    slots.iter().map(|slot| slot.graph().map_or(0, |g| g.buffer_size())).sum()
}

/// Rows of [`encoder::relative_offsets`] computed once and handed out as
/// runs: a block's table is hundreds of rows of sines, most of which the
/// previous block's had.
#[derive(Default)]
struct OffsetTable {
    /// Rows for offsets `lowest..lowest + rows`, ascending.
    lowest: i64,
    ascending: Vec<f32>,
}

impl OffsetTable {
    /// `rows` rows from offset `first` down (as `relative_offsets(d, first, rows)`).
    fn rows(&mut self, d: usize, first: i64, rows: usize) -> Vec<f32> {
        let last = first - rows as i64 + 1;
        let held = (self.ascending.len() / d) as i64;
        if self.ascending.is_empty() || last < self.lowest {
            // Down to the new lowest offset, and at least as high as before.
            let top = if self.ascending.is_empty() { first } else { first.max(self.lowest + held - 1) };
            self.lowest = last;
            self.ascending = encoder::relative_offsets(d, top, (top - last + 1) as usize);
            reverse_rows(&mut self.ascending, d);
        } else if first >= self.lowest + held {
            let top = self.lowest + held - 1;
            let mut more = encoder::relative_offsets(d, first, (first - top) as usize);
            reverse_rows(&mut more, d);
            self.ascending.extend(more);
        }
        let row = |offset: i64| &self.ascending[(offset - self.lowest) as usize * d..][..d];
        (0..rows as i64).flat_map(|m| row(first - m).iter().copied()).collect()
    }
}

/// Reverses the order of the `d`-wide rows of `v`.
fn reverse_rows(v: &mut [f32], d: usize) {
    let n = v.len() / d;
    for i in 0..n / 2 {
        let (a, b) = v.split_at_mut((n - 1 - i) * d);
        a[i * d..(i + 1) * d].swap_with_slice(&mut b[..d]);
    }
}

/// Query rows of a CFM block's mask ([`cfm::mask_rows`]).
fn mask_rows(frames: usize) -> usize {
    cfm::mask_rows(frames as i64) as usize
}

/// `[queries][keys]` mask over `keys` positions: 0 before `end`, -inf from it.
fn visible_before(end: usize, keys: usize, queries: usize) -> Vec<f32> {
    let row: Vec<f32> = (0..keys).map(|j| if j < end { 0.0 } else { f32::NEG_INFINITY }).collect();
    row.repeat(queries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_runs_are_the_tables_rows() {
        let d = 8;
        let mut table = OffsetTable::default();
        // Growing ends, a longer run reaching lower, a run inside what is held.
        for (first, rows) in [(5i64, 7usize), (9, 12), (20, 30), (3, 40), (12, 4), (0, 1)] {
            assert_eq!(table.rows(d, first, rows), encoder::relative_offsets(d, first, rows), "from {first}, {rows} rows");
        }
    }
}
