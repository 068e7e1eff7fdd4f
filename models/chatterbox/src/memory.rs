//! What a Chatterbox model needs in a device's memory, sized from its two
//! files alone: both files' weights as the policy stores them (with the
//! tensors a load derives from them), T3's K/V cache, and every graph the
//! runtime keeps, measured by ggml's allocator without allocating or reading
//! a weight into the device. The graphs come from the builders the runtime
//! uses (`t3::{gpt2, llama}`, `s3gen::{encoder, cfm, hift}`,
//! `cloning::{voice_encoder, campplus, s3tokenizer}`) at the shapes it
//! builds them at, so at given lengths the plan is what a synthesis allocates
//! (`tests/memory.rs` holds it to that, byte for byte).
//!
//! What the runtime keeps: one graph per stage slot, except T3's step
//! graphs, kept per attention span of [`KV_BLOCK`] positions while the cache
//! lasts (so every span up to the cache's end counts), the S3Tokenizer's two
//! and the voice encoder's two (a full batch and the rest).

use crate::cloning::{self, campplus, s3tokenizer, voice_encoder, ENCODER_RATE, S3GEN_PROMPT_SECONDS};
use crate::hparams::{LlamaHparams, S3GenHparams, T3Hparams};
use crate::model::{ModelFiles, SynthesisParams};
use crate::t3::kv_cache::{KvCache, KvDims, KvLayout};
use crate::t3::{attention_span, cache_positions, gpt2, llama, AttentionConfig, KV_BLOCK};
use crate::{s3gen, t3};
use engine_core::abi::{MemoryItem, MemoryPlan};
use engine_core::model_kit::builder::{measure_graph, Builder};
use engine_core::model_kit::{OpPolicy, Result, Weights};
use ggml_sys::gguf::GgufTensors;
use ggml_sys::{Backend, GraphIo, Result as GgmlResult};
use std::path::PathBuf;

/// The lengths one text chunk's graphs are sized at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lengths {
    /// Speech tokens of the voice's T3 prompt.
    pub voice_prompt_tokens: usize,
    /// Text tokens as T3 reads them (Multilingual's with its start and stop).
    pub text_tokens: usize,
    /// Speech tokens T3 may generate: `max_new_tokens` within the model's
    /// context (`T3::new_token_budget`, `GuidedT3::new_token_budget`).
    pub new_tokens: usize,
    /// Whether T3's step graphs of every attention span up to the cache's
    /// end count (those of shorter prompts: a model synthesizing many texts
    /// keeps them all), or only the spans this prompt's steps reach.
    pub every_span: bool,
    /// The voice's S3Gen prompt: speech tokens and mel frames.
    pub s3_prompt_tokens: usize,
    pub s3_prompt_frames: usize,
    /// Speech codes S3Gen decodes after the prompt.
    pub speech_codes: usize,
}

/// Text tokens a chunk of `max_chars` characters may make at most: four per
/// character (UTF-8's longest character, a byte-level tokenizer's worst
/// case) and room for the tokens a tokenizer adds (language tag, start,
/// stop). The pipeline refuses a chunk that makes more, so the plan holds
/// for any text. `None` when chunks are not bounded (`max_chars` 0).
pub fn max_chunk_tokens(max_chars: usize) -> Option<usize> {
    (max_chars > 0).then(|| 4 * max_chars + 8)
}

/// The longest chunk a synthesis with `params` can make: the longest text
/// chunk (within the model's prompt limit), the most speech tokens
/// `max_new_tokens` and the context allow after the shortest text, and the
/// longest voice prompts a voice can bring (the built-in one's, or a cloned
/// or saved one's: T3's `cond_prompt_len` tokens, S3Gen's
/// [`S3GEN_PROMPT_SECONDS`] of mel). Each length is its own maximum: T3's
/// prompt graphs grow with the text, S3Gen's with the speech, and a model
/// that synthesizes many texts keeps both stages' largest, though no one
/// chunk has both (T3's cache is capped at its context).
pub fn longest_chunk(files: &ModelFiles, builtin: BuiltinPrompts, params: &SynthesisParams) -> Lengths {
    let (t3, s3) = (&files.t3_hp, &files.s3_hp);
    let voice_prompt_tokens = builtin.t3_tokens.max(t3.cond_prompt_len);
    let cloned_frames = cloning::max_prompt_frames(s3.hift.sample_rate);
    let s3_prompt_tokens = builtin.s3_tokens.max(cloned_frames / 2);
    // HiFT decodes the frames after the prompt's mel: the prompt's tokens may
    // make more frames than its mel has (a built-in voice), never fewer than 0.
    let up = s3.encoder.up_stride;
    let excess = |tokens: usize, frames: usize| (tokens * up).saturating_sub(frames);
    let s3_prompt_frames = (s3_prompt_tokens * up).saturating_sub(excess(builtin.s3_tokens, builtin.s3_frames).max(excess(cloned_frames / 2, cloned_frames)));
    let (text_tokens, new_tokens, codes) = match t3.llama() {
        None => {
            // Room for the voice prefix, the start token and two speech positions.
            let room = t3.n_ctx.saturating_sub(voice_prompt_tokens + 4);
            let text = max_chunk_tokens(params.max_chars).map_or(room, |m| m.min(room));
            // After a one-token text (`T3::new_token_budget`).
            let budget = params.max_new_tokens.min(t3.n_ctx.saturating_sub(2 + voice_prompt_tokens + 1).saturating_sub(1));
            // Turbo's loop ends after its budget + 1st token; its silence follows.
            (text, budget, budget + 1 + crate::speech_tokens::SILENCE_CODES)
        }
        Some(l) => {
            let text = max_chunk_tokens(params.max_chars).map_or(l.text_positions, |m| m.min(l.text_positions));
            let budget = params.max_new_tokens.min(l.speech_positions - 1);
            (text, budget, budget)
        }
    };
    Lengths { voice_prompt_tokens, text_tokens, new_tokens, every_span: true, s3_prompt_tokens, s3_prompt_frames, speech_codes: codes }
}

/// The built-in voice's prompt lengths, from the two files' tensor shapes.
#[derive(Clone, Copy, Debug, Default)]
pub struct BuiltinPrompts {
    pub t3_tokens: usize,
    pub s3_tokens: usize,
    pub s3_frames: usize,
}

impl BuiltinPrompts {
    fn read(t3: &GgufTensors, s3: &GgufTensors) -> Result<Self> {
        let ne = |g: &GgufTensors, name: &str| -> Result<[i64; 4]> {
            g.ctx.get_tensor(name).map(|t| t.ne()).ok_or_else(|| format!("{}: tensor '{name}' is missing", g.file.path().display()).into())
        };
        Ok(BuiltinPrompts {
            t3_tokens: ne(t3, crate::tensors::T3_PROMPT_TOKENS)?[0] as usize,
            s3_tokens: ne(s3, crate::tensors::S3_PROMPT_TOKEN)?[0] as usize,
            s3_frames: ne(s3, crate::tensors::S3_PROMPT_FEAT)?[1] as usize,
        })
    }
}

/// Sizes the model of `files` on `backend`'s device under `policy` for a
/// synthesis with `params` of one chunk of `lengths` (`None`:
/// [`longest_chunk`]), cloning included: bytes by item, in pipeline order.
/// Chunks run one after another, so one chunk's graphs are what a synthesis
/// of any length holds at once.
pub fn plan(files: &[PathBuf], backend: &Backend, policy: &OpPolicy, params: &SynthesisParams, lengths: Option<Lengths>) -> Result<(MemoryPlan, Lengths)> {
    let model = ModelFiles::open(files)?;
    let (t3_gguf, s3_gguf) = (GgufTensors::open(&model.t3_path)?, GgufTensors::open(&model.s3_path)?);
    let builtin = BuiltinPrompts::read(&t3_gguf, &s3_gguf)?;
    let lengths = lengths.unwrap_or_else(|| longest_chunk(&model, builtin, params));
    let (t3_hp, s3_hp) = (&model.t3_hp, &model.s3_hp);

    let mut items = Vec::new();
    let (t3_weights, t3_is_matmul) = t3_weights(t3_gguf, backend, t3_hp, policy)?;
    items.push(("t3.weights".to_string(), t3_weights.size_on(backend, t3_is_matmul) + t3_weights.derived_bytes()));
    let (_, s3_table) = s3gen::check_file(&s3_gguf)?;
    let mut s3_weights = Weights::for_measuring(s3_gguf, s3_table, policy.matmul_weights)?;
    let derived = s3gen::derived_tensors(&s3_weights, s3_hp)?;
    s3_weights.add_derived(backend, derived)?;
    items.push(("s3gen.weights".to_string(), s3_weights.size_on(backend, s3gen::is_matmul_weight) + s3_weights.derived_bytes()));

    let measure = |weights: &Weights, max_nodes: usize, f: &dyn for<'c> Fn(&Builder<'c, '_>) -> GgmlResult<GraphIo<'c>>| {
        measure_graph(backend.buffer_type(), backend.device(), weights, policy, max_nodes, |b| f(&b))
    };
    let t3_items = match t3_hp.llama() {
        None => gpt2_items(backend, policy, t3_hp, &lengths, &|max_nodes, f| measure(&t3_weights, max_nodes, f))?,
        Some(l) => {
            let rows = t3::guided::row_sets(if params.cfg_weight != 0.0 { 2 } else { 1 }, params.guidance);
            llama_items(backend, policy, t3_hp, l, &lengths, &rows, &|max_nodes, f| measure(&t3_weights, max_nodes, f))?
        }
    };
    items.extend(t3_items);

    let s3 = |max_nodes, f: &dyn for<'c> Fn(&Builder<'c, '_>) -> GgmlResult<GraphIo<'c>>| measure(&s3_weights, max_nodes, f);
    let up = s3_hp.encoder.up_stride;
    let tokens = lengths.s3_prompt_tokens + lengths.speech_codes;
    let frames = tokens * up;
    let vocoded = frames.saturating_sub(lengths.s3_prompt_frames).max(1);
    // The standard decoder's guidance runs both rows as one batch.
    let cfm_rows = if !s3_hp.meanflow && s3_hp.cfg_rate != 0.0 { 2 } else { 1 };
    let mel = s3_hp.mel_channels;
    items.push(("s3gen.encoder".into(), s3(s3gen::MAX_NODES, &|b| s3gen::encoder::build(b, s3_hp, tokens))?));
    items.push(("s3gen.cfm".into(), s3(s3gen::MAX_NODES, &|b| s3gen::cfm::build(b, s3_hp, frames, cfm_rows))?));
    items.push(("hift.f0".into(), s3(s3gen::MAX_NODES, &|b| s3gen::hift::build_f0(b, &s3_hp.hift, mel, vocoded))?));
    items.push(("hift".into(), s3(s3gen::MAX_NODES, &|b| s3gen::hift::build_decoder(b, &s3_hp.hift, mel, vocoded))?));

    if params.stream_tokens > 0 {
        items.extend(stream_items(backend, policy, s3_hp, params, &lengths, &s3)?);
    }
    items.extend(cloning_items(t3_hp, s3_hp, &|max_nodes, f| measure(&t3_weights, max_nodes, f), &s3)?);

    let sized_for = format!(
        "text chunks of up to {} tokens, up to {} speech tokens each, after voice prompts of up to {} (T3) and {} (S3Gen) tokens; cloning a reference of up to {} s",
        lengths.text_tokens,
        lengths.new_tokens,
        lengths.voice_prompt_tokens,
        lengths.s3_prompt_tokens,
        cloning::reference::MAX_SECONDS
    );
    let items = items.into_iter().map(|(what, bytes)| MemoryItem { what: what.into(), bytes: bytes as u64 }).collect();
    Ok((MemoryPlan { items, sized_for: sized_for.into() }, lengths))
}

/// What a streamed chunk's S3Gen keeps (`s3gen::blocks`): its caches, sized
/// exactly, and its encoder's, CFM's and vocoder's graphs, one per kind of
/// block (the prompt and the first hop; a hop; a hop with the lookahead and
/// the closing silence, the last's bound), each over the longest span.
fn stream_items(
    backend: &Backend,
    policy: &OpPolicy,
    hp: &S3GenHparams,
    params: &SynthesisParams,
    lengths: &Lengths,
    measure: &Measure<'_>,
) -> Result<Vec<(String, usize)>> {
    use s3gen::blocks;
    let prompt = match params.stream_prompt_tokens {
        0 => lengths.s3_prompt_tokens,
        keep => keep.min(lengths.s3_prompt_tokens),
    };
    let hop = params.stream_tokens;
    let steps = crate::model::stream_cfm_steps(hp, params);
    let shape = crate::model::stream_shape(prompt, params, params.stream_first_tokens.clamp(1, hop), hop, steps);
    let caches = blocks::measured_caches(backend, hp, &shape, policy.kv_type)?;
    // The stream keeps the graph of each kind of block (first, hop, last),
    // each bound here by its block over the longest span.
    let span = blocks::span_tokens(shape.capacity(), shape.capacity());
    let e = &hp.encoder;
    let cfm_span = shape.window(hp).map_or(span * e.up_stride, |w| w.slots());
    let rows = caches.cfm.rows;
    let (mut encoder, mut cfm, mut vocoder) = (0, 0, 0);
    for (block, window) in shape.block_tokens(hp).into_iter().zip(shape.vocoder_windows(hp)) {
        let encoder_shape = s3gen::encoder::BlockShape { left: e.lookahead_conv2_kernel - 1, new: block, right: e.pre_lookahead, span };
        encoder += measure(s3gen::MAX_NODES, &|b| s3gen::encoder::build_block(b, hp, encoder_shape, &caches.encoder))?;
        cfm += measure(s3gen::MAX_NODES, &|b| s3gen::cfm::build_block(b, hp, block * e.up_stride, rows, cfm_span, &caches.cfm))?;
        vocoder += measure(s3gen::MAX_NODES, &|b| s3gen::hift::build_f0(b, &hp.hift, hp.mel_channels, window))?;
        vocoder += measure(s3gen::MAX_NODES, &|b| s3gen::hift::build_decoder(b, &hp.hift, hp.mel_channels, window))?;
    }
    Ok(vec![
        (blocks::STREAM_CACHES.into(), caches.bytes),
        (blocks::STREAM_ENCODER.into(), encoder),
        (blocks::STREAM_CFM.into(), cfm * steps),
        (blocks::STREAM_VOCODER.into(), vocoder),
    ])
}

/// A stage graph measured over one file's weights, by its builder.
type Measure<'a> = dyn Fn(usize, &dyn for<'c, 'w> Fn(&Builder<'c, 'w>) -> GgmlResult<GraphIo<'c>>) -> Result<usize> + 'a;

/// Which weights are matrix-product weights (placed in extra buffers).
type IsMatmulWeight = fn(&str) -> bool;

/// T3's weights for measuring, with what a load derives, and which of them
/// are matrix-product weights (the placement of extra buffers).
fn t3_weights(gguf: GgufTensors, backend: &Backend, hp: &T3Hparams, policy: &OpPolicy) -> Result<(Weights, IsMatmulWeight)> {
    let (_, table) = t3::check_file(&gguf)?;
    let mut weights = Weights::for_measuring(gguf, table, policy.matmul_weights)?;
    match hp.llama() {
        None => Ok((weights, t3::is_matmul_weight)),
        Some(l) => {
            weights.add_derived(backend, t3::guided::derived_tensors(l))?;
            Ok((weights, t3::guided::is_matmul_weight))
        }
    }
}

/// Attention spans of step graphs: a step at position `p` attends over
/// `span(p + 1)` positions; `every_span` adds those below the first step's.
fn step_spans(first_position: usize, steps: usize, kv: &KvCache, every_span: bool) -> Vec<usize> {
    let (span, cache) = (|used: usize| attention_span(Some(kv), used), kv.n_ctx);
    let first = if every_span { KV_BLOCK.min(cache) } else { span(first_position + 1) };
    let last = span(first_position + steps.max(1));
    let mut spans: Vec<usize> = (first..=last).step_by(KV_BLOCK).collect();
    if spans.last() != Some(&last) {
        spans.push(last);
    }
    if steps == 0 {
        spans.clear();
    }
    spans
}

/// Turbo's and Nano's T3 (`t3::T3`): the cache, the voice-prefix and
/// text-suffix graphs, and one step graph per attention span.
fn gpt2_items(backend: &Backend, policy: &OpPolicy, hp: &T3Hparams, lengths: &Lengths, measure: &Measure<'_>) -> Result<Vec<(String, usize)>> {
    let attention = AttentionConfig::resolve(backend, policy, hp.head_dim())?;
    let prefix = gpt2::Feed::VoicePrefix { prompt_tokens: lengths.voice_prompt_tokens };
    let suffix = gpt2::Feed::TextSuffix { text_tokens: lengths.text_tokens };
    let n = prefix.n_tokens() + suffix.n_tokens();
    // `generate` prefills with room for its budget + 1 tokens and steps once per token but the last.
    let cache = cache_positions((n + lengths.new_tokens + 1).min(hp.n_ctx), hp.n_ctx);
    let dims = KvDims { n_layer: hp.n_layer, width: hp.n_embd, n_ctx: cache, rows: 1 };
    let kv = KvCache::for_measuring(backend, dims, attention.kv_type, attention.path, KvLayout::Fused)?;
    let span = |used: usize| attention_span(Some(&kv), used);
    let graph = |shape: gpt2::Shape| measure(t3::MAX_NODES, &|b| gpt2::build(b, hp, &kv, shape));
    let steps: usize = step_spans(n, lengths.new_tokens, &kv, lengths.every_span)
        .into_iter()
        .map(|kv_len| graph(gpt2::Shape { feed: gpt2::Feed::Step, kv_len }))
        .sum::<Result<usize>>()?;
    Ok(vec![
        ("t3.kv_cache".into(), kv.bytes()),
        ("t3.prefix".into(), graph(gpt2::Shape { feed: prefix, kv_len: span(prefix.n_tokens()) })?),
        ("t3.suffix".into(), graph(gpt2::Shape { feed: suffix, kv_len: span(n) })?),
        ("t3.step".into(), steps),
    ])
}

/// Multilingual's T3 (`t3::guided::GuidedT3`): the two-row cache, the
/// conditioning graph, the text graphs (one per row set) and the step graphs
/// (per attention span and row set).
fn llama_items(
    backend: &Backend,
    policy: &OpPolicy,
    hp: &T3Hparams,
    l: &LlamaHparams,
    lengths: &Lengths,
    rows: &[llama::Rows],
    measure: &Measure<'_>,
) -> Result<Vec<(String, usize)>> {
    let attention = AttentionConfig::resolve(backend, policy, l.head_dim)?;
    let cond_len = l.cond_len(lengths.voice_prompt_tokens);
    let n = cond_len + lengths.text_tokens + 2;
    let cache = cache_positions((n + lengths.new_tokens).min(hp.n_ctx), hp.n_ctx);
    let dims = KvDims { n_layer: hp.n_layer, width: l.kv_width(), n_ctx: cache, rows: 2 };
    let kv = KvCache::for_measuring(backend, dims, attention.kv_type, attention.path, KvLayout::Fused)?;
    let span = |used: usize| attention_span(Some(&kv), used);
    let graph = |shape: llama::Shape| measure(t3::guided::MAX_NODES, &|b| llama::build(b, hp, l, &kv, shape));
    let one_row = llama::Rows { first: 0, count: 1 };
    let conditioning =
        graph(llama::Shape { feed: llama::Feed::Conditioning { prompt_tokens: lengths.voice_prompt_tokens }, kv_len: span(cond_len), rows: one_row })?;
    let text_feed = llama::Feed::Text { text_tokens: lengths.text_tokens };
    let text = rows.iter().map(|&r| graph(llama::Shape { feed: text_feed, kv_len: span(n), rows: r })).sum::<Result<usize>>()?;
    // The loop steps after every token but the last.
    let mut steps = 0;
    for kv_len in step_spans(n, lengths.new_tokens.saturating_sub(1), &kv, lengths.every_span) {
        for &r in rows {
            steps += graph(llama::Shape { feed: llama::Feed::Step, kv_len, rows: r })?;
        }
    }
    Ok(vec![("t3.kv_cache".into(), kv.bytes()), ("t3.conditioning".into(), conditioning), ("t3.text".into(), text), ("t3.step".into(), steps)])
}

/// The graphs cloning a reference of up to `reference::MAX_SECONDS` leaves
/// in a synthesizing model: the voice encoder's two (a full batch of
/// partials and the rest, at most [`voice_encoder::MAX_BATCH`] and one
/// fewer), CAMPPlus's on S3Gen's [`S3GEN_PROMPT_SECONDS`], and the
/// S3Tokenizer's two (S3Gen's prompt and T3's), at most the longer of the
/// two and one frame fewer.
fn cloning_items(t3: &T3Hparams, s3: &S3GenHparams, t3_measure: &Measure<'_>, s3_measure: &Measure<'_>) -> Result<Vec<(String, usize)>> {
    let ve = &t3.voice_encoder;
    let batch = voice_encoder::MAX_BATCH;
    let voice_encoder = t3_measure(voice_encoder::max_nodes(ve), &|b| voice_encoder::build(b, ve, batch))?
        + t3_measure(voice_encoder::max_nodes(ve), &|b| voice_encoder::build(b, ve, batch - 1))?;
    let prompt_samples = S3GEN_PROMPT_SECONDS * ENCODER_RATE as usize;
    let fbank_frames = cloning::features::campplus_fbank_frames(prompt_samples);
    let campplus = s3_measure(campplus::max_nodes(&s3.campplus), &|b| campplus::build(b, &s3.campplus, fbank_frames))?;
    let mel_frames = cloning::features::s3tokenizer_mel_frames(prompt_samples).max(t3.cond_prompt_len * s3tokenizer::FRAMES_PER_TOKEN);
    let tok = &s3.tokenizer;
    let tokenizer = s3_measure(s3tokenizer::max_nodes(tok), &|b| s3tokenizer::build(b, tok, mel_frames))?
        + s3_measure(s3tokenizer::max_nodes(tok), &|b| s3tokenizer::build(b, tok, mel_frames - 1))?;
    Ok(vec![("voice_encoder".into(), voice_encoder), ("campplus".into(), campplus), ("s3tokenizer".into(), tokenizer)])
}
