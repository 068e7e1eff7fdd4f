//! T3 with classifier-free guidance on the Llama backbone (Multilingual): the
//! runtime (weights, a static K/V cache holding the conditional and the
//! unconditional row, cached graphs) and the reference's generation loop
//! (`T3.inference`): guidance combine → alignment analyzer → repetition
//! penalty → temperature → min-p → top-p → draw.
//!
//! Guidance runs as one batch of two rows by default, or as two passes of
//! one row each ([`GuidanceMode`]); both give the same logits. With a
//! guidance weight of 0 only the conditional row is computed.

use super::alignment::AlignmentAnalyzer;
use super::kv_cache::{AttentionPath, KvCache, KvDims, KvLayout};
use super::llama::{self, input, output, Feed, Rows, Shape};
use super::{cache_positions, check_file, AttentionConfig, T3Conditioning, TokenLimits};
use crate::cloning::voice_encoder::{VoiceEncoderGraphs, VoiceEncoding};
use crate::hparams::{LlamaHparams, T3Hparams};
use crate::sampler::{self, GuidedSamplingParams, UniformSource};
use crate::tensors::T3_ROPE_FREQ_FACTORS;
use engine_core::model_kit::builder::compute_graph;
use engine_core::model_kit::{DerivedTensor, Error, OpPolicy, Result, Weights};
use ggml_sys::gguf::GgufTensors;
use ggml_sys::{Backend, ComputeGraph, GraphSlot};
use std::collections::HashMap;
use std::path::Path;

/// Upper bound on nodes of one graph (30 Llama layers need about 1100).
pub(crate) const MAX_NODES: usize = 16384;

/// How the two guidance rows are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GuidanceMode {
    /// One graph over both rows: the weights are read once per step.
    #[default]
    Batched,
    /// One graph per row, run one after the other.
    TwoPass,
}

impl GuidanceMode {
    /// The option's spelling: `batch` or `two-pass`.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "batch" => Ok(GuidanceMode::Batched),
            "two-pass" => Ok(GuidanceMode::TwoPass),
            other => Err(format!("guidance must be batch or two-pass, got '{other}'").into()),
        }
    }
}

/// The conditioning a sequence starts from: a voice and the emotion value.
#[derive(Debug, Clone, PartialEq)]
struct CachedConditioning {
    voice: T3Conditioning,
    exaggeration: f32,
    positions: usize,
}

/// One forward's results: each computed row's logits (`rows × speech_vocab`,
/// conditional first) and row 0's aligned attention over the text (one
/// vector per query, empty without an analyzer or row 0).
#[derive(Debug, Clone)]
pub struct Forward {
    pub logits: Vec<Vec<f32>>,
    pub aligned: Vec<Vec<f32>>,
}

pub struct GuidedT3 {
    // Graphs reference the weights and the cache: declared (dropped) first.
    cond_graph: GraphSlot<Shape>,
    text_graphs: GraphSlot<Shape>,
    step_graphs: HashMap<Shape, ComputeGraph>,
    voice_encoder: VoiceEncoderGraphs,
    kv: Option<KvCache>,
    weights: Weights,
    backend: Backend,
    pub hp: T3Hparams,
    attention: AttentionConfig,
    policy: OpPolicy,
    pub mode: GuidanceMode,
    /// Positions written by the current sequence, and speech tokens fed.
    n_past: usize,
    speech_fed: usize,
    /// Rows of the current sequence (1 unguided, 2 guided).
    rows: usize,
    /// Text positions of the current sequence (the analyzer's columns).
    text: std::ops::Range<usize>,
    cached: Option<CachedConditioning>,
}

/// Weights in matrix products only (may live in repacked extra buffers).
pub(crate) fn is_matmul_weight(name: &str) -> bool {
    name.starts_with("t3.") && name.ends_with(".weight") && !name.contains("norm") && !name.contains("emotion")
}

impl GuidedT3 {
    pub fn load(path: &Path, backend: Backend, policy: &OpPolicy) -> Result<Self> {
        policy.check_denials("chatterbox", crate::GRAPH_OPS)?;
        policy.check_denials("chatterbox", crate::LLAMA_T3_OPS)?;
        let gguf = GgufTensors::open(path)?;
        let (hp, table) = check_file(&gguf)?;
        let Some(l) = hp.llama().cloned() else {
            return Err(format!("{}: T3 '{}' has a GPT-2 backbone; guided generation needs the Llama one", path.display(), hp.variant).into());
        };
        let mut weights = Weights::load(gguf, &backend, table, policy.matmul_weights, is_matmul_weight)?;
        weights.add_derived(&backend, derived_tensors(&l))?;
        let attention = AttentionConfig::resolve(&backend, policy, l.head_dim)?;
        Ok(GuidedT3 {
            cond_graph: GraphSlot::default(),
            text_graphs: GraphSlot::with_capacity(2),
            step_graphs: HashMap::new(),
            voice_encoder: VoiceEncoderGraphs::default(),
            kv: None,
            weights,
            backend,
            hp,
            attention,
            policy: policy.clone(),
            mode: GuidanceMode::default(),
            n_past: 0,
            speech_fed: 0,
            rows: 1,
            text: 0..0,
            cached: None,
        })
    }

    fn llama(&self) -> &LlamaHparams {
        self.hp.llama().expect("checked at load")
    }

    pub fn attention(&self) -> AttentionConfig {
        self.attention
    }

    /// The built-in voice's conditioning (`voice.builtin.*`, from `conds.pt`).
    pub fn builtin_voice(&self) -> Result<T3Conditioning> {
        super::builtin_voice(&self.weights)
    }

    /// Device bytes of the weights (derived tensors included) and of the K/V
    /// cache (0 before the first prompt): what the memory plan sizes.
    pub fn resident_bytes(&self) -> (usize, usize) {
        (self.weights.buffer_bytes() + self.weights.derived_bytes(), self.kv.as_ref().map_or(0, KvCache::bytes))
    }

    /// The graphs built so far, by stage (census tests).
    pub fn graphs(&self) -> Vec<(&'static str, &ComputeGraph)> {
        let mut out: Vec<(&'static str, &ComputeGraph)> = Vec::new();
        out.extend(self.cond_graph.graph().map(|g| ("t3.conditioning", g)));
        out.extend(self.text_graphs.graph().map(|g| ("t3.text", g)));
        out.extend(self.step_graphs.values().map(|g| ("t3.step", g)));
        out.extend(self.voice_encoder.graph().map(|g| ("voice_encoder", g)));
        out
    }

    /// How many speech tokens fit after `text_tokens` (SOT/EOT included): at
    /// most `wanted`, fewer where the speech position table is shorter. An
    /// error when the text does not fit its position table.
    pub fn new_token_budget(&self, text_tokens: usize, wanted: usize) -> Result<usize> {
        let l = self.llama();
        if text_tokens > l.text_positions {
            return Err(format!("the text is too long for T3: {text_tokens} tokens, its text positions end at {}", l.text_positions).into());
        }
        // Speech position 0 is the start token's; token i is fed at position i + 1.
        Ok(wanted.min(l.speech_positions - 1))
    }

    /// Makes the cache hold at least `positions` per row, growing it (and
    /// dropping the graphs bound to the old one) in whole blocks.
    fn reserve(&mut self, positions: usize) -> Result<()> {
        if self.kv.as_ref().is_some_and(|kv| kv.n_ctx >= positions) {
            return Ok(());
        }
        let n_ctx = cache_positions(positions, self.hp.n_ctx);
        self.cond_graph.clear();
        self.text_graphs.clear();
        self.step_graphs.clear();
        self.cached = None;
        self.kv = None;
        let dims = KvDims { n_layer: self.hp.n_layer, width: self.llama().kv_width(), n_ctx, rows: 2 };
        self.kv = Some(self.attention.new_cache(&self.backend, dims, KvLayout::Fused)?);
        Ok(())
    }

    fn span(&self, used: usize) -> usize {
        super::attention_span(self.kv.as_ref(), used)
    }

    /// Uploads the position-dependent inputs of `shape` for its tokens at `start`.
    fn set_positions(&self, graph: &ComputeGraph, shape: Shape, start: usize) -> Result<()> {
        let kv = self.kv.as_ref().expect("cache reserved");
        let n = shape.feed.n_tokens(self.llama());
        let positions: &[i32] = &(start..start + n).map(|p| p as i32).collect::<Vec<_>>();
        let rope: Vec<i32> = positions.iter().copied().cycle().take(n * shape.batch()).collect();
        graph.set_i32(input::POSITIONS, &rope)?;
        let written = shape.written_rows(kv.rows);
        let rows: Vec<i32> = written.clone().flat_map(|r| positions.iter().map(move |&p| (r * kv.n_ctx) as i32 + p)).collect();
        graph.set_i32(input::KV_ROWS, &rows)?;
        if kv.path == AttentionPath::Explicit {
            // V^T: channel e of row r at position p lives at (r·width + e)·n_ctx + p.
            let v_rows: Vec<i32> = (0..kv.width)
                .flat_map(|e| written.clone().flat_map(move |r| positions.iter().map(move |&p| ((r * kv.width + e) * kv.n_ctx) as i32 + p)))
                .collect();
            graph.set_i32(input::KV_ROWS_V, &v_rows)?;
        }
        let mut mask = vec![f32::NEG_INFINITY; shape.kv_len * n];
        for i in 0..n {
            mask[i * shape.kv_len..i * shape.kv_len + start + i + 1].fill(0.0);
        }
        let queries = shape.aligned_queries();
        if queries > 0 && !self.llama().aligned_heads.is_empty() {
            graph.set_f32(input::ALIGNED_MASK, &mask[(n - queries) * shape.kv_len..])?;
        }
        Ok(graph.set_f32(input::MASK, &mask)?)
    }

    fn build(&self, shape: Shape) -> Result<ComputeGraph> {
        build_graph(&self.backend, &self.weights, &self.policy, &self.hp, self.kv.as_ref(), shape)
    }

    /// The graph shapes of one forward: the batch, or one per row.
    fn row_sets(&self) -> Vec<Rows> {
        row_sets(self.rows, self.mode)
    }

    /// Writes the conditioning `[speaker | perceiver | emotion]` at positions
    /// `[0, cond_len)` of every cache row, unless the cache holds it already;
    /// returns its embeddings and the perceiver's output (empty when cached).
    pub fn condition(&mut self, voice: &T3Conditioning, exaggeration: f32) -> Result<(Vec<f32>, Vec<f32>)> {
        let hp = &self.hp;
        if voice.speaker_emb.len() != hp.speaker_dim {
            return Err(format!("the speaker embedding has {} values, T3 takes {}", voice.speaker_emb.len(), hp.speaker_dim).into());
        }
        if !exaggeration.is_finite() {
            return Err(format!("exaggeration must be a finite number, got {exaggeration}").into());
        }
        if let Some(t) = voice.prompt_speech_tokens.iter().find(|&&t| t < 0 || t as usize >= hp.speech_vocab) {
            return Err(format!("prompt speech token {t} is outside the vocabulary of {}", hp.speech_vocab).into());
        }
        let prompt = voice.prompt_speech_tokens.len();
        if prompt > self.llama().speech_positions {
            return Err(format!("the voice prompt has {prompt} tokens, T3's speech positions end at {}", self.llama().speech_positions).into());
        }
        let positions = self.llama().cond_len(prompt);
        if self.cached.as_ref().is_some_and(|c| c.voice == *voice && c.exaggeration.to_bits() == exaggeration.to_bits()) {
            return Ok((Vec::new(), Vec::new()));
        }
        self.cached = None;
        self.reserve(positions + 1)?;
        let shape = Shape { feed: Feed::Conditioning { prompt_tokens: prompt }, kv_len: self.span(positions), rows: Rows { first: 0, count: 1 } };
        self.cond_graph.get_or_build(shape, || build_graph(&self.backend, &self.weights, &self.policy, &self.hp, self.kv.as_ref(), shape))?;
        let graph = self.cond_graph.graph().expect("built above");
        graph.set_f32(input::SPEAKER, &voice.speaker_emb)?;
        if prompt > 0 {
            graph.set_i32(input::PROMPT_TOKENS, &voice.prompt_speech_tokens)?;
            graph.set_i32(input::PROMPT_POSITIONS, &(0..prompt as i32).collect::<Vec<_>>())?;
        }
        graph.set_f32(input::EMOTION, &[exaggeration])?;
        self.set_positions(graph, shape, 0)?;
        graph.compute(&self.backend)?;
        let cond = engine_core::model_kit::finite::check_stage("T3's conditioning", graph.get_f32(output::COND_EMB)?)?;
        let perceiver = if prompt > 0 { engine_core::model_kit::finite::check_stage("T3's perceiver", graph.get_f32(output::PERCEIVER)?)? } else { Vec::new() };
        self.cached = Some(CachedConditioning { voice: voice.clone(), exaggeration, positions });
        Ok((cond, perceiver))
    }

    /// Runs the prompt `[conditioning | text | start, start]` on one row
    /// (`guided == false`) or both, reserving room for `max_new_tokens`
    /// more positions. `text` carries its SOT/EOT tokens.
    pub fn prefill(&mut self, voice: &T3Conditioning, exaggeration: f32, text: &[i32], guided: bool, max_new_tokens: usize) -> Result<Forward> {
        if text.is_empty() {
            return Err("T3 needs at least one text token".into());
        }
        if let Some(t) = text.iter().find(|&&t| t < 0 || t as usize >= self.hp.text_vocab) {
            return Err(format!("text token {t} is outside the vocabulary of {}", self.hp.text_vocab).into());
        }
        let max_new_tokens = self.new_token_budget(text.len(), max_new_tokens)?;
        let cond_len = self.llama().cond_len(voice.prompt_speech_tokens.len());
        let n = cond_len + text.len() + 2;
        self.reserve(n + max_new_tokens)?;
        self.condition(voice, exaggeration)?;
        self.rows = if guided { 2 } else { 1 };
        self.text = cond_len..cond_len + text.len();
        let feed = Feed::Text { text_tokens: text.len() };
        let mut forward = Forward { logits: Vec::new(), aligned: Vec::new() };
        for rows in self.row_sets() {
            let shape = Shape { feed, kv_len: self.span(n), rows };
            self.text_graphs.get_or_build(shape, || build_graph(&self.backend, &self.weights, &self.policy, &self.hp, self.kv.as_ref(), shape))?;
            let graph = self.text_graphs.graph().expect("built above");
            // The unconditional row reads no text tokens.
            if rows.first == 0 {
                graph.set_i32(input::TEXT_TOKENS, text)?;
            }
            graph.set_i32(input::TEXT_POSITIONS, &(0..text.len() as i32).collect::<Vec<_>>())?;
            graph.set_i32(input::START_TOKEN, &[self.hp.start_speech_token as i32])?;
            graph.set_i32(input::SPEECH_POSITION, &[0])?;
            self.set_positions(graph, shape, cond_len)?;
            self.run(graph, shape, &mut forward)?;
        }
        self.n_past = n;
        self.speech_fed = 0;
        Ok(forward)
    }

    /// Feeds one speech token at the next position of every row.
    pub fn step(&mut self, token: u32) -> Result<Forward> {
        let pos = self.n_past;
        let capacity = self.kv.as_ref().map_or(0, |kv| kv.n_ctx);
        if pos == 0 {
            return Err("T3 step before prefill".into());
        }
        if pos >= capacity || self.speech_fed + 1 >= self.llama().speech_positions {
            return Err(format!("T3 context is full ({pos} positions)").into());
        }
        if token as usize >= self.hp.speech_vocab {
            return Err(format!("speech token {token} is outside the vocabulary of {}", self.hp.speech_vocab).into());
        }
        let kv_len = self.span(pos + 1);
        let mut forward = Forward { logits: Vec::new(), aligned: Vec::new() };
        for rows in self.row_sets() {
            let shape = Shape { feed: Feed::Step, kv_len, rows };
            if !self.step_graphs.contains_key(&shape) {
                let g = self.build(shape)?;
                self.step_graphs.insert(shape, g);
            }
            let graph = &self.step_graphs[&shape];
            graph.set_i32(input::TOKEN, &[token as i32])?;
            graph.set_i32(input::SPEECH_POSITION, &[(self.speech_fed + 1) as i32])?;
            self.set_positions(graph, shape, pos)?;
            self.run(graph, shape, &mut forward)?;
        }
        self.n_past += 1;
        self.speech_fed += 1;
        Ok(forward)
    }

    fn run(&self, graph: &ComputeGraph, shape: Shape, forward: &mut Forward) -> Result<()> {
        graph.compute(&self.backend)?;
        let vocab = self.hp.speech_vocab;
        let logits = engine_core::model_kit::finite::check_stage("T3", graph.get_f32(output::LOGITS)?)?;
        forward.logits.extend(logits.chunks_exact(vocab).map(<[f32]>::to_vec));
        let queries = shape.aligned_queries();
        if queries > 0 && !self.llama().aligned_heads.is_empty() {
            let aligned = graph.get_f32(output::ALIGNED)?;
            forward.aligned = aligned.chunks_exact(shape.kv_len).map(|row| row[self.text.clone()].to_vec()).collect();
        }
        Ok(())
    }
}

/// The graph shapes of one forward over `rows` cache rows (1 unguided, 2
/// guided) in `mode`: the batch, or one per row.
pub(crate) fn row_sets(rows: usize, mode: GuidanceMode) -> Vec<Rows> {
    match (rows, mode) {
        (2, GuidanceMode::Batched) => vec![Rows { first: 0, count: 2 }],
        (rows, _) => (0..rows).map(|first| Rows { first, count: 1 }).collect(),
    }
}

/// The tensors a Llama T3 derives at load: the rotary frequency divisors of
/// a scaled rope.
pub(crate) fn derived_tensors(l: &LlamaHparams) -> Vec<DerivedTensor> {
    match l.rope_scaling {
        Some(_) => {
            let values = l.rope_freq_factors();
            vec![DerivedTensor { name: T3_ROPE_FREQ_FACTORS.into(), ne: vec![values.len() as i64], values }]
        }
        None => Vec::new(),
    }
}

/// One graph of `shape` over the model's weights and cache.
fn build_graph(backend: &Backend, weights: &Weights, policy: &OpPolicy, hp: &T3Hparams, kv: Option<&KvCache>, shape: Shape) -> Result<ComputeGraph> {
    let kv = kv.expect("cache reserved before building");
    let l = hp.llama().expect("checked at load");
    compute_graph(backend, weights, policy, MAX_NODES, "T3", |b| llama::build(&b, hp, l, kv, shape))
}

/// How each speech token is chosen.
#[derive(Debug, Clone)]
pub enum GuidedChoice {
    /// The most likely token after guidance, analyzer and penalty (what the
    /// reference draws with temperature → 0).
    Greedy,
    /// The processed distribution, drawn with these uniforms.
    Sample(UniformSource),
}

/// Timing of one generation.
#[derive(Debug, Default, Clone, Copy)]
pub struct GuidedStats {
    pub prefill_ms: f64,
    pub steps: usize,
    pub steps_ms: f64,
}

/// The reference's Multilingual loop (`T3.inference`): up to `max_new_tokens`
/// tokens, stopping after the stop token, which is dropped (and suppressed
/// until `min_new_tokens` tokens exist). The repetition
/// history starts with the start token; the analyzer runs where the model
/// names aligned heads.
pub fn generate(
    t3: &mut GuidedT3,
    voice: &T3Conditioning,
    exaggeration: f32,
    text: &[i32],
    params: &GuidedSamplingParams,
    choice: &mut GuidedChoice,
    limits: TokenLimits,
) -> Result<(Vec<u32>, GuidedStats)> {
    generate_streaming(t3, voice, exaggeration, text, params, choice, limits, &mut |_| Ok(true))
}

/// [`generate`], handing each new token to `on_token` (see [`super::OnToken`]).
#[allow(clippy::too_many_arguments)]
pub fn generate_streaming(
    t3: &mut GuidedT3,
    voice: &T3Conditioning,
    exaggeration: f32,
    text: &[i32],
    params: &GuidedSamplingParams,
    choice: &mut GuidedChoice,
    limits: TokenLimits,
    on_token: &mut super::OnToken<'_>,
) -> Result<(Vec<u32>, GuidedStats)> {
    let TokenLimits { max_new: max_new_tokens, min_new: min_new_tokens } = limits;
    let guided = params.cfg_weight != 0.0;
    let max_new_tokens = t3.new_token_budget(text.len(), max_new_tokens)?;
    let mut stats = GuidedStats::default();
    let started = std::time::Instant::now();
    let mut forward = t3.prefill(voice, exaggeration, text, guided, max_new_tokens)?;
    stats.prefill_ms = started.elapsed().as_secs_f64() * 1e3;
    let (start, stop) = (t3.hp.start_speech_token, t3.hp.stop_speech_token);
    let mut analyzer = (!t3.llama().aligned_heads.is_empty()).then(|| AlignmentAnalyzer::new(text.len(), stop));
    let mut history = vec![start];
    let steps_started = std::time::Instant::now();
    // What `on_token` spends (streaming runs S3Gen there) is not T3's.
    let mut listener_ms = 0.0;
    for i in 0..max_new_tokens {
        let mut logits = match forward.logits.as_slice() {
            [cond, uncond] => sampler::combine_guidance(cond, uncond, params.cfg_weight),
            [cond] => cond.clone(),
            _ => return Err(Error::msg("T3 returned no logits")),
        };
        let last = *history.last().expect("starts with the start token");
        if let Some(a) = analyzer.as_mut() {
            if i < min_new_tokens {
                // Below the minimum (fixed-length benchmarks) the analyzer
                // keeps its state, but its verdict is not applied.
                a.step(&mut logits.clone(), &forward.aligned, last);
            } else {
                a.step(&mut logits, &forward.aligned, last);
            }
        }
        if i < min_new_tokens {
            logits[stop as usize] = f32::NEG_INFINITY;
        }
        sampler::process_combined(&mut logits, &history, params);
        let token = match choice {
            GuidedChoice::Greedy => sampler::argmax(&logits) as u32,
            GuidedChoice::Sample(uniforms) => sampler::draw_with_uniform(&sampler::softmax(&logits), uniforms.draw()?) as u32,
        };
        history.push(token);
        if token == stop || i + 1 == max_new_tokens {
            break;
        }
        let listening = std::time::Instant::now();
        let going_on = on_token(&history[1..])?;
        listener_ms += listening.elapsed().as_secs_f64() * 1e3;
        if !going_on {
            break;
        }
        forward = t3.step(token)?;
        stats.steps += 1;
    }
    stats.steps_ms = steps_started.elapsed().as_secs_f64() * 1e3 - listener_ms;
    let mut tokens = history.split_off(1);
    if tokens.last() == Some(&stop) {
        tokens.pop();
    }
    Ok((tokens, stats))
}

impl VoiceEncoding for GuidedT3 {
    fn hp(&self) -> &T3Hparams {
        &self.hp
    }
    fn voice_encoder_partials(&mut self, batch: &[f32], partials: usize) -> Result<Vec<f32>> {
        self.voice_encoder.run(&self.backend, &self.weights, &self.policy, &self.hp.voice_encoder, batch, partials)
    }
}
