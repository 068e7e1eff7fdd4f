//! T3: text tokens + voice conditioning → speech tokens. This module owns the
//! runtime: weights, the static K/V cache, cached graphs (one prompt graph per
//! shape, one step graph per attention span) and the generation loop.

pub mod alignment;
pub mod gpt2;
pub mod guided;
pub mod kv_cache;
pub mod llama;

use crate::cloning::voice_encoder::{VoiceEncoderGraphs, VoiceEncoding};
use crate::hparams::{T3Hparams, T3_ARCH};
use crate::sampler::{self, SamplingParams, UniformSource};
use engine_core::model_kit::builder::compute_graph;
use engine_core::model_kit::OpPolicy;
use engine_core::model_kit::Weights;
use engine_core::model_kit::{Error, Result};
use ggml_sys::gguf::GgufTensors;
use ggml_sys::{Backend, ComputeGraph, GraphSlot, Type, TYPE_F32};
use gpt2::{input, Feed, Shape};
pub use kv_cache::{AttentionPath, KvCache, KvDims, KvLayout};
use std::collections::HashMap;
use std::path::Path;

/// Attention spans are rounded up to this many positions, so one step graph
/// serves a whole block of positions (its mask hides the unwritten ones).
pub const KV_BLOCK: usize = 256;
/// Upper bound on nodes of one T3 graph (GPT-2 medium needs about 1000).
pub(crate) const MAX_NODES: usize = 8192;

/// How attention and its cache run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionConfig {
    pub path: AttentionPath,
    /// Cache element type; the explicit path always uses F32.
    pub kv_type: Type,
}

impl AttentionConfig {
    pub const REFERENCE: AttentionConfig = AttentionConfig { path: AttentionPath::Explicit, kv_type: TYPE_F32 };

    /// The path and cache type `policy` allows.
    pub fn from_policy(policy: &OpPolicy) -> Self {
        if policy.fused_attention {
            AttentionConfig { path: AttentionPath::Flash, kv_type: policy.kv_type }
        } else {
            Self::REFERENCE
        }
    }

    /// A static K/V cache of `dims` in this type, laid out for this path.
    fn new_cache(&self, backend: &Backend, dims: KvDims, layout: KvLayout) -> Result<KvCache> {
        let kv = KvCache::new(backend, dims, self.kv_type, self.path, layout)?;
        tracing::debug!(positions = dims.n_ctx, rows = dims.rows, mib = kv.bytes() as f64 / (1 << 20) as f64, "T3 K/V cache");
        Ok(kv)
    }

    /// The path and cache type `policy` allows for heads of `head_dim` on
    /// `backend`'s device: a block-quantized cache whose blocks do not tile a
    /// head falls back to F16, a device without a fused kernel for this head
    /// size and cache type to the explicit path (or, where the profile forced
    /// them, an error). Decided once per model, since the cache layout follows.
    pub fn resolve(backend: &Backend, policy: &OpPolicy, head_dim: usize) -> Result<Self> {
        let attention = AttentionConfig::from_policy(policy);
        let (kv_policy, kv_probe) = engine_core::model_kit::policy::kv_cache_policy(attention.kv_type);
        let attention = match attention.path {
            AttentionPath::Explicit => AttentionConfig { path: AttentionPath::Explicit, kv_type: TYPE_F32 },
            // A block-quantized cache row must split into whole blocks per head.
            AttentionPath::Flash if !head_dim.is_multiple_of(unsafe { ggml_sys::sys::ggml_blck_size(attention.kv_type) } as usize) => {
                policy.refuse_if_forced(&[kv_policy], &format!("T3's heads of {head_dim} do not split into {kv_policy} cache blocks"))?;
                tracing::warn!(head_dim, "heads do not split into K/V cache blocks; using an F16 cache");
                AttentionConfig { path: AttentionPath::Flash, kv_type: ggml_sys::TYPE_F16 }
            }
            AttentionPath::Flash => attention,
        };
        // The cache layout follows the path, so a device without a fused
        // kernel for this head size and cache type gets the explicit path
        // for the whole model, decided here rather than per node (or, where
        // the profile forced fused attention or the cache type, an error).
        let attention = match backend.device() {
            Some(dev) if attention.path == AttentionPath::Flash && !engine_core::probes::flash_attn_runs(dev, attention.kv_type, head_dim as i64) => {
                let kv = ggml_sys::type_name(attention.kv_type);
                policy.refuse_if_forced(
                        &["flash_attn", kv_policy],
                        &format!(
                            "{} has no fused attention kernel for T3's head size {head_dim} with a {kv} K/V cache (probe {kv_probe} passes only for other head sizes)",
                            dev.name()
                        ),
                    )?;
                tracing::warn!(head_dim, kv, device = %dev.name(), "no fused attention kernel for T3's heads; using explicit attention");
                AttentionConfig::REFERENCE
            }
            _ => attention,
        };
        Ok(attention)
    }
}

/// A voice's T3 conditioning.
#[derive(Debug, Clone, PartialEq)]
pub struct T3Conditioning {
    pub speaker_emb: Vec<f32>,
    pub prompt_speech_tokens: Vec<i32>,
}

/// `n` rounded up to whole [`KV_BLOCK`]s.
pub(crate) fn whole_blocks(n: usize) -> usize {
    n.div_ceil(KV_BLOCK) * KV_BLOCK
}

/// Cache positions a graph attends over when `used` are written: whole
/// blocks, so one graph serves a block of positions, within the cache.
pub(crate) fn attention_span(kv: Option<&KvCache>, used: usize) -> usize {
    let n_ctx = kv.map_or(used, |kv| kv.n_ctx);
    whole_blocks(used).min(n_ctx)
}

/// Positions for a cache that must hold `positions`: whole blocks, at most
/// the model's `n_ctx`, never fewer than asked.
pub(crate) fn cache_positions(positions: usize, n_ctx: usize) -> usize {
    whole_blocks(positions).min(n_ctx).max(positions)
}

/// The built-in voice a T3 file carries (`voice.builtin.*`, from `conds.pt`).
pub fn builtin_voice(weights: &Weights) -> Result<T3Conditioning> {
    Ok(T3Conditioning {
        speaker_emb: weights.host_f32(crate::tensors::T3_SPEAKER_EMB)?,
        prompt_speech_tokens: weights.host_i32(crate::tensors::T3_PROMPT_TOKENS)?,
    })
}

/// The I32 tensor `name` read from the file, checked to hold only tokens
/// below `vocab` (they index an embedding table).
pub fn read_tokens(gguf: &GgufTensors, name: &str, vocab: usize) -> Result<Vec<i32>> {
    let tokens: Vec<i32> = gguf.read_bytes(name)?.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    match tokens.iter().find(|&&t| t < 0 || t as usize >= vocab) {
        Some(bad) => Err(format!("{}: {name} holds token {bad}, outside the vocabulary of {vocab}", gguf.file.path().display()).into()),
        None => Ok(tokens),
    }
}

/// [`read_tokens`] for its check alone.
pub fn check_tokens(gguf: &GgufTensors, name: &str, vocab: usize) -> Result<()> {
    read_tokens(gguf, name, vocab).map(|_| ())
}

/// Everything checked about a T3 file before any weight is read, without a
/// device: architecture, hparams, the tensor table, the built-in voice's tokens.
pub fn check_file(gguf: &GgufTensors) -> Result<(T3Hparams, engine_core::model_kit::TensorTable)> {
    engine_core::model_kit::require_architecture(&gguf.file, T3_ARCH, "a Chatterbox T3 model")?;
    let hp = T3Hparams::load(&gguf.file)?;
    let mut table = crate::tensors::t3_table(&hp);
    table.check(gguf)?;
    check_tokens(gguf, crate::tensors::T3_PROMPT_TOKENS, hp.speech_vocab)?;
    Ok((hp, table))
}

/// Weights in matrix products only (may live in repacked extra buffers).
pub(crate) fn is_matmul_weight(name: &str) -> bool {
    name.starts_with("t3.") && name.ends_with(".weight") && !name.contains(".ln")
}

pub struct T3 {
    // Graphs reference the weights and the cache: declared (dropped) first.
    prefix_graph: GraphSlot<Shape>,
    suffix_graph: GraphSlot<Shape>,
    step_graphs: HashMap<usize, ComputeGraph>,
    voice_encoder: VoiceEncoderGraphs,
    kv: Option<KvCache>,
    weights: Weights,
    backend: Backend,
    pub hp: T3Hparams,
    attention: AttentionConfig,
    policy: OpPolicy,
    /// Positions written in the cache by the current sequence.
    n_past: usize,
    /// The voice whose prefix (positions `[0, 1 + prompt tokens)`) the cache
    /// holds: the same voice's next prompt starts after it.
    cached_voice: Option<T3Conditioning>,
}

impl T3 {
    pub fn load(path: &Path, backend: Backend, policy: &OpPolicy) -> Result<Self> {
        let gguf = GgufTensors::open(path)?;
        let (hp, table) = check_file(&gguf)?;
        let weights = Weights::load(gguf, &backend, table, policy.matmul_weights, is_matmul_weight)?;
        let attention = AttentionConfig::resolve(&backend, policy, hp.head_dim())?;
        Ok(T3 {
            prefix_graph: GraphSlot::default(),
            suffix_graph: GraphSlot::default(),
            step_graphs: HashMap::new(),
            voice_encoder: VoiceEncoderGraphs::default(),
            kv: None,
            weights,
            backend,
            hp,
            attention,
            policy: policy.clone(),
            n_past: 0,
            cached_voice: None,
        })
    }

    /// The built-in voice's conditioning (`voice.builtin.*`, from `conds.pt`).
    pub fn builtin_voice(&self) -> Result<T3Conditioning> {
        builtin_voice(&self.weights)
    }

    /// Device bytes of the weights (derived tensors included) and of the K/V
    /// cache (0 before the first prompt): what the memory plan sizes.
    pub fn resident_bytes(&self) -> (usize, usize) {
        (self.weights.buffer_bytes() + self.weights.derived_bytes(), self.kv.as_ref().map_or(0, KvCache::bytes))
    }

    /// The graphs built so far, by stage (census tests).
    pub fn graphs(&self) -> Vec<(&'static str, &ComputeGraph)> {
        let mut out: Vec<(&'static str, &ComputeGraph)> = Vec::new();
        out.extend(self.prefix_graph.graph().map(|g| ("t3.prefix", g)));
        out.extend(self.suffix_graph.graph().map(|g| ("t3.suffix", g)));
        out.extend(self.step_graphs.values().map(|g| ("t3.step", g)));
        out.extend(self.voice_encoder.graph().map(|g| ("voice_encoder", g)));
        out
    }

    pub fn attention(&self) -> AttentionConfig {
        self.attention
    }

    /// Positions a sequence of `prompt_tokens` + `new_tokens` occupies.
    pub fn check_context(&self, prompt_tokens: usize, new_tokens: usize) -> Result<()> {
        let need = prompt_tokens + new_tokens;
        if need > self.hp.n_ctx {
            return Err(format!(
                "the text is too long for T3: {prompt_tokens} prompt positions + {new_tokens} speech tokens exceed its context of {} positions",
                self.hp.n_ctx
            )
            .into());
        }
        Ok(())
    }

    /// How many speech tokens fit after a prompt of `prompt_positions`: at most
    /// `wanted`, fewer when the context is shorter. An error when the prompt
    /// leaves no room at all.
    pub fn new_token_budget(&self, prompt_positions: usize, wanted: usize) -> Result<usize> {
        let room = self.hp.n_ctx.saturating_sub(prompt_positions);
        if room < 2 {
            return Err(format!(
                "the text is too long for T3: its prompt takes {prompt_positions} of the {} context positions, leaving no room for speech",
                self.hp.n_ctx
            )
            .into());
        }
        Ok(wanted.min(room - 1))
    }

    /// Makes the cache hold at least `positions`, growing it (and dropping the
    /// graphs bound to the old one) in whole blocks.
    fn reserve(&mut self, positions: usize) -> Result<()> {
        if self.kv.as_ref().is_some_and(|kv| kv.n_ctx >= positions) {
            return Ok(());
        }
        let n_ctx = cache_positions(positions, self.hp.n_ctx);
        self.prefix_graph.clear();
        self.suffix_graph.clear();
        self.step_graphs.clear();
        self.cached_voice = None;
        self.kv = None;
        let dims = KvDims { n_layer: self.hp.n_layer, width: self.hp.n_embd, n_ctx, rows: 1 };
        self.kv = Some(self.attention.new_cache(&self.backend, dims, KvLayout::Fused)?);
        Ok(())
    }

    fn span(&self, used: usize) -> usize {
        attention_span(self.kv.as_ref(), used)
    }

    /// Uploads the position-dependent inputs for `n` new tokens at `start`.
    fn set_positions(&self, graph: &ComputeGraph, start: usize, n: usize, kv_len: usize) -> Result<()> {
        let kv = self.kv.as_ref().expect("cache reserved");
        let rows: Vec<i32> = (start..start + n).map(|p| p as i32).collect();
        graph.set_i32(input::POSITIONS, &rows)?;
        if kv.path == AttentionPath::Explicit {
            let v_rows: Vec<i32> = (0..self.hp.n_embd).flat_map(|e| rows.iter().map(move |&p| (e * kv.n_ctx) as i32 + p)).collect();
            graph.set_i32(input::KV_ROWS_V, &v_rows)?;
        }
        let mut mask = vec![f32::NEG_INFINITY; kv_len * n];
        for i in 0..n {
            mask[i * kv_len..i * kv_len + start + i + 1].fill(0.0);
        }
        Ok(graph.set_f32(input::MASK, &mask)?)
    }

    /// Runs the prompt `[speaker | voice prompt tokens | text | start]`,
    /// reserving room for `max_new_tokens` more positions, and returns the
    /// logits of the first speech token. The voice's part is computed only
    /// when the cache does not hold it already (another voice, or a grown
    /// cache): consecutive texts in one voice pay for their text alone.
    pub fn prefill(&mut self, cond: &T3Conditioning, text: &[i32], max_new_tokens: usize) -> Result<Vec<f32>> {
        let hp = &self.hp;
        if cond.speaker_emb.len() != hp.speaker_dim {
            return Err(format!("the speaker embedding has {} values, T3 takes {}", cond.speaker_emb.len(), hp.speaker_dim).into());
        }
        let check_ids = |ids: &[i32], vocab: usize, what: &str| match ids.iter().find(|&&t| t < 0 || t as usize >= vocab) {
            Some(t) => Err(Error::msg(format!("{what} token {t} is outside the vocabulary of {vocab}"))),
            None => Ok(()),
        };
        check_ids(&cond.prompt_speech_tokens, hp.speech_vocab, "prompt speech")?;
        check_ids(text, hp.text_vocab, "text")?;
        let prefix = Feed::VoicePrefix { prompt_tokens: cond.prompt_speech_tokens.len() }.n_tokens();
        let suffix = Feed::TextSuffix { text_tokens: text.len() };
        let n = prefix + suffix.n_tokens();
        self.check_context(n, max_new_tokens)?;
        self.reserve(n + max_new_tokens)?;
        if self.cached_voice.as_ref() != Some(cond) {
            self.cached_voice = None;
            let shape = Shape { feed: Feed::VoicePrefix { prompt_tokens: cond.prompt_speech_tokens.len() }, kv_len: self.span(prefix) };
            self.prefix_graph.get_or_build(shape, || build_graph(&self.backend, &self.weights, &self.policy, &self.hp, self.kv.as_ref(), shape))?;
            let graph = self.prefix_graph.graph().expect("built above");
            graph.set_f32(input::SPEAKER, &cond.speaker_emb)?;
            if !cond.prompt_speech_tokens.is_empty() {
                graph.set_i32(input::PROMPT_TOKENS, &cond.prompt_speech_tokens)?;
            }
            self.set_positions(graph, 0, prefix, shape.kv_len)?;
            graph.compute(&self.backend)?;
            self.cached_voice = Some(cond.clone());
        }
        let shape = Shape { feed: suffix, kv_len: self.span(n) };
        self.suffix_graph.get_or_build(shape, || build_graph(&self.backend, &self.weights, &self.policy, &self.hp, self.kv.as_ref(), shape))?;
        let graph = self.suffix_graph.graph().expect("built above");
        if !text.is_empty() {
            graph.set_i32(input::TEXT_TOKENS, text)?;
        }
        graph.set_i32(input::START_TOKEN, &[self.hp.start_speech_token as i32])?;
        self.set_positions(graph, prefix, suffix.n_tokens(), shape.kv_len)?;
        let logits = engine_core::model_kit::finite::check_stage("T3", graph.compute_and_get_f32(&self.backend, gpt2::LOGITS)?)?;
        self.n_past = n;
        Ok(logits)
    }

    /// Feeds one speech token at the next position; returns the next logits.
    pub fn step(&mut self, token: u32) -> Result<Vec<f32>> {
        let pos = self.n_past;
        let capacity = self.kv.as_ref().map_or(0, |kv| kv.n_ctx);
        if pos == 0 {
            return Err("T3 step before prefill".into());
        }
        if pos >= capacity {
            return Err(format!("T3 context is full ({capacity} positions)").into());
        }
        if token as usize >= self.hp.speech_vocab {
            return Err(format!("speech token {token} is outside the vocabulary of {}", self.hp.speech_vocab).into());
        }
        let kv_len = self.span(pos + 1);
        if !self.step_graphs.contains_key(&kv_len) {
            let g = build_graph(&self.backend, &self.weights, &self.policy, &self.hp, self.kv.as_ref(), Shape { feed: Feed::Step, kv_len })?;
            self.step_graphs.insert(kv_len, g);
        }
        let graph = &self.step_graphs[&kv_len];
        graph.set_i32(input::TOKEN, &[token as i32])?;
        self.set_positions(graph, pos, 1, kv_len)?;
        let logits = engine_core::model_kit::finite::check_stage("T3", graph.compute_and_get_f32(&self.backend, gpt2::LOGITS)?)?;
        self.n_past += 1;
        Ok(logits)
    }
}

/// One T3 graph of `shape` over the model's weights and cache.
fn build_graph(backend: &Backend, weights: &Weights, policy: &OpPolicy, hp: &T3Hparams, kv: Option<&KvCache>, shape: Shape) -> Result<ComputeGraph> {
    let kv = kv.expect("cache reserved before building");
    compute_graph(backend, weights, policy, MAX_NODES, "T3", |b| gpt2::build(&b, hp, kv, shape))
}

/// How each speech token is chosen.
#[derive(Debug, Clone)]
pub enum TokenChoice {
    /// The argmax of the raw logits.
    Greedy,
    /// The processed distribution, drawn with these uniforms.
    Sample(SamplingParams, UniformSource),
}

/// How many speech tokens a generation may and must produce.
#[derive(Debug, Clone, Copy)]
pub struct TokenLimits {
    pub max_new: usize,
    /// The stop token is suppressed until this many exist (fixed-length benchmarks; 0 = off).
    pub min_new: usize,
}

impl TokenLimits {
    pub fn at_most(max_new: usize) -> Self {
        TokenLimits { max_new, min_new: 0 }
    }
}

/// Timing of one generation.
#[derive(Debug, Default, Clone, Copy)]
pub struct GenerationStats {
    pub prefill_ms: f64,
    pub steps: usize,
    pub steps_ms: f64,
}

/// The reference's `inference_turbo` loop: prefill, then up to
/// `max_new_tokens` steps; stops after the stop token (which is dropped, and
/// is suppressed until `min_new_tokens` tokens exist) or when every logit is
/// filtered out. The repetition history starts as the
/// start token and then holds the generated tokens only.
pub fn generate(t3: &mut T3, cond: &T3Conditioning, text: &[i32], choice: &mut TokenChoice, limits: TokenLimits) -> Result<(Vec<u32>, GenerationStats)> {
    generate_streaming(t3, cond, text, choice, limits, &mut |_| Ok(true))
}

/// Called with the tokens so far after each new one (the stop token never):
/// `Ok(false)` ends generation there (streaming hands tokens on in chunks
/// and stops when its listener goes away).
pub type OnToken<'a> = dyn FnMut(&[u32]) -> Result<bool> + 'a;

/// [`generate`], handing each new token to `on_token`.
pub fn generate_streaming(
    t3: &mut T3,
    cond: &T3Conditioning,
    text: &[i32],
    choice: &mut TokenChoice,
    limits: TokenLimits,
    on_token: &mut OnToken<'_>,
) -> Result<(Vec<u32>, GenerationStats)> {
    let TokenLimits { max_new: max_new_tokens, min_new: min_new_tokens } = limits;
    let max_new_tokens = t3.new_token_budget(2 + cond.prompt_speech_tokens.len() + text.len(), max_new_tokens)?;
    let mut stats = GenerationStats::default();
    let started = std::time::Instant::now();
    let mut logits = t3.prefill(cond, text, max_new_tokens + 1)?;
    stats.prefill_ms = started.elapsed().as_secs_f64() * 1e3;
    let stop = t3.hp.stop_speech_token;
    let mut tokens: Vec<u32> = Vec::new();
    let steps_started = std::time::Instant::now();
    // What `on_token` spends (streaming runs S3Gen there) is not T3's.
    let mut listener_ms = 0.0;
    loop {
        let history: &[u32] = if tokens.is_empty() { &[t3.hp.start_speech_token] } else { &tokens };
        // As transformers' MinNewTokensLength: no stop before the minimum.
        if tokens.len() < min_new_tokens {
            if let Some(l) = logits.get_mut(stop as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
        let token = match choice {
            TokenChoice::Greedy => sampler::argmax(&logits) as u32,
            TokenChoice::Sample(params, uniforms) => {
                let candidates = sampler::candidates(&logits, history, params);
                if candidates.is_empty() {
                    break;
                }
                candidates.draw(uniforms.draw()?) as u32
            }
        };
        tokens.push(token);
        if (tokens.len() > 1 && token == stop) || tokens.len() > max_new_tokens {
            break;
        }
        let listening = std::time::Instant::now();
        let going_on = on_token(&tokens)?;
        listener_ms += listening.elapsed().as_secs_f64() * 1e3;
        if !going_on {
            break;
        }
        logits = t3.step(token)?;
        stats.steps += 1;
    }
    stats.steps_ms = steps_started.elapsed().as_secs_f64() * 1e3 - listener_ms;
    if tokens.last() == Some(&stop) {
        tokens.pop();
    }
    Ok((tokens, stats))
}

impl VoiceEncoding for T3 {
    fn hp(&self) -> &T3Hparams {
        &self.hp
    }
    fn voice_encoder_partials(&mut self, batch: &[f32], partials: usize) -> Result<Vec<f32>> {
        self.voice_encoder.run(&self.backend, &self.weights, &self.policy, &self.hp.voice_encoder, batch, partials)
    }
}
