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

use super::{cfm, encoder, EncoderOutput, S3Gen, MAX_NODES};
use crate::t3::kv_cache::{AttentionPath, KvCache, KvDims, KvLayout};
use crate::Result;
use engine_core::model_kit::builder::compute_graph;
use ggml_sys::{GraphSlot, TYPE_F32};

/// Attention spans grow in steps of this many tokens, so that a graph built
/// for one block serves the blocks after it until the span must grow.
pub const SPAN_TOKENS: usize = 64;

/// The state of one streamed sequence (prompt tokens, then speech tokens).
pub struct BlockStream {
    // Graphs first: they are dropped before the caches they read.
    encoder_graph: GraphSlot<encoder::BlockShape>,
    /// One graph per Euler step: each writes its own cache.
    cfm_graphs: Vec<GraphSlot<(usize, usize)>>,
    encoder_caches: encoder::EncoderCaches,
    cfm_caches: Vec<KvCache>,
    /// Per Euler step, every causal conv's last input frames.
    conv_tails: Vec<Vec<f32>>,
    /// The first conformer stack's outputs for the last tokens encoded.
    up_tail: Vec<f32>,
    /// Tokens encoded so far, and frames estimated.
    tokens_done: usize,
    frames_done: usize,
    capacity: usize,
    schedule: Vec<f32>,
    /// CFM rows: 2 for classifier-free guidance, else 1.
    rows: usize,
}

impl BlockStream {
    /// A stream of up to `capacity` tokens (prompt included), integrated in
    /// `steps` Euler steps.
    pub fn new(s3: &S3Gen, capacity: usize, steps: usize) -> Result<BlockStream> {
        let hp = &s3.hp;
        let capacity = capacity.max(1).div_ceil(SPAN_TOKENS) * SPAN_TOKENS;
        let (e, c) = (&hp.encoder, &hp.cfm);
        let cache = |n_layer: usize, width: usize, n_ctx: usize, rows: usize, ty| -> Result<KvCache> {
            Ok(KvCache::new(&s3.backend, KvDims { n_layer, width, n_ctx, rows }, ty, AttentionPath::Flash, KvLayout::Split)?)
        };
        let encoder_caches = encoder::EncoderCaches {
            tokens: cache(e.n_layer, e.n_embd, capacity, 1, TYPE_F32)?,
            frames: cache(e.n_up_layer, e.n_embd, capacity * e.up_stride, 1, TYPE_F32)?,
        };
        let rows = if hp.meanflow || hp.cfg_rate == 0.0 { 1 } else { 2 };
        let frames = capacity * e.up_stride;
        let cfm_caches =
            (0..steps).map(|_| cache(cfm::attention_layers(c), c.n_head * c.head_dim, frames, rows, s3.policy.kv_type)).collect::<Result<Vec<_>>>()?;
        Ok(BlockStream {
            encoder_graph: GraphSlot::default(),
            cfm_graphs: (0..steps).map(|_| GraphSlot::default()).collect(),
            encoder_caches,
            cfm_caches,
            conv_tails: vec![vec![0.0; cfm::conv_tail_len(c, rows)]; steps],
            up_tail: vec![0.0; encoder::UP_CONTEXT_TOKENS * e.n_embd],
            tokens_done: 0,
            frames_done: 0,
            capacity,
            schedule: s3.schedule(steps),
            rows,
        })
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
        if end <= start || end > tokens.len() || end > self.capacity {
            return Err(
                format!("a block must end after token {start}, at most at {} (of {}), not at {end}", tokens.len().min(self.capacity), tokens.len()).into()
            );
        }
        if let Some(t) = tokens.iter().find(|&&t| t < 0 || t as usize >= s3.hp.speech_vocab) {
            return Err(format!("speech token {t} is outside S3Gen's vocabulary of {}", s3.hp.speech_vocab).into());
        }
        let left = start.min(e.lookahead_conv2_kernel - 1);
        let right = (tokens.len() - end).min(e.pre_lookahead);
        let shape = encoder::BlockShape { left, new: end - start, right, span: self.span(end) };
        let (d, stride, n) = (e.n_embd, e.up_stride, shape.new);
        let caches = &self.encoder_caches;
        let graph = self.encoder_graph.get_or_build(shape, || {
            compute_graph(&s3.backend, &s3.weights, &s3.policy, MAX_NODES, "the S3Gen encoder", |b| encoder::build_block(&b, &s3.hp, shape, caches))
        })?;
        graph.set_i32(encoder::TOKENS, &tokens[start - left..end + right])?;
        graph.set_f32(encoder::POS_EMB, &encoder::relative_offsets(d, end as i64 - 1, shape.span + n - 1))?;
        let up_span = shape.span * stride;
        graph.set_f32(encoder::UP_POS_EMB, &encoder::relative_offsets(d, (end * stride) as i64 - 1, up_span + n * stride - 1))?;
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
        let span = self.span(self.tokens_done) * s3.hp.encoder.up_stride;
        let n_ctx = self.cfm_caches.first().map_or(0, |c| c.n_ctx);
        let kv_rows: Vec<i32> = (0..self.rows).flat_map(|r| (start..end).map(move |p| (r * n_ctx + p) as i32)).collect();
        let mask = visible_before(end, span, frames);
        let c = &s3.hp.cfm;
        let mut x = x0.to_vec();
        for step in 0..self.cfm_graphs.len() {
            let (t, r) = (self.schedule[step], self.schedule[step + 1]);
            let cache = &self.cfm_caches[step];
            let graph = self.cfm_graphs[step].get_or_build((frames, span), || {
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
        end.div_ceil(SPAN_TOKENS).saturating_mul(SPAN_TOKENS).min(self.capacity)
    }
}

/// `[queries][keys]` mask over `keys` positions: 0 before `end`, -inf from it.
fn visible_before(end: usize, keys: usize, queries: usize) -> Vec<f32> {
    let row: Vec<f32> = (0..keys).map(|j| if j < end { 0.0 } else { f32::NEG_INFINITY }).collect();
    row.repeat(queries)
}
