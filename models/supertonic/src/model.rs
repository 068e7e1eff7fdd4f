//! A loaded Supertonic model and the synthesis loop: frontend → duration →
//! text encoder → N estimator steps → vocoder, per text chunk, on the backend
//! the host handed over. Each stage keeps its graph for the last shape it ran.

use crate::graph::vector_estimator::{self, StepShape};
use crate::graph::{duration, text_encoder, vocoder, Builder};
use crate::hparams::{Hparams, Version};
use crate::noise::NumpyLegacyRng;
use crate::tensors;
use crate::text::{self, Encoded, Indexer, UnsupportedChars};
use crate::voice::{Voice, VoiceShape};
use engine_core::audio::stretch::{self, TimeStretch};
use engine_core::model_kit::builder::compute_graph;
use engine_core::model_kit::{finite, npy, OpPolicy, PieceSender, Timings, Weights};
use engine_core::model_kit::{Error, Result};
use ggml_sys::gguf::GgufTensors;
use ggml_sys::{Backend, ComputeGraph, GraphIo, GraphSlot, Result as GgmlResult};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

/// The speeds the model's own duration control makes (the official helper's
/// range; steps: [`crate::hparams::Version::max_steps`]). A `speed` beyond it
/// (up to [`SPEED_RANGE`]) is made at the nearest end of this range, then
/// time-stretched by the rest.
pub const NATIVE_SPEED_RANGE: std::ops::RangeInclusive<f32> = 0.5..=2.0;
/// The speeds the option takes (OpenAI's range).
pub const SPEED_RANGE: std::ops::RangeInclusive<f64> = stretch::SPEED_RANGE;
/// Silence between chunks, seconds.
pub const CHUNK_SILENCE_S: f32 = 0.3;

/// The pause where streaming cut its first chunk: within a sentence, a clause's
/// pause rather than the official one between chunks.
pub const CUT_SILENCE_S: f32 = 0.1;
/// The longest a chunk may speak (a chunk is at most 300 characters: about 40 s
/// at half speed). A duration predictor that says more comes from a corrupt
/// model, and every buffer of the chunk would grow with it.
pub const MAX_CHUNK_SECONDS: f32 = 120.0;

/// Where the voice comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum VoiceChoice {
    /// An embedded voice by name; empty = the first one.
    Named(String),
    File(std::path::PathBuf),
}

/// Initial noise source.
#[derive(Debug, Clone, PartialEq)]
pub enum NoiseSource {
    /// NumPy-compatible seeded Gaussian noise, drawn chunk after chunk.
    Seed(u32),
    /// Noise from a `.npy` file: `[1, C, L]` (one chunk) or a flat array that
    /// holds every chunk's noise in order.
    Npy(std::path::PathBuf),
}

#[derive(Debug, Clone, PartialEq)]
pub struct SynthesisParams {
    pub voice: VoiceChoice,
    /// Empty = the model's default language.
    pub language: String,
    /// None = the model's default step count.
    pub steps: Option<usize>,
    pub speed: f32,
    pub noise: NoiseSource,
    pub unsupported_chars: UnsupportedChars,
    /// Streaming: a first chunk longer than this many characters is cut at a
    /// clause or word within it (0 = the official chunks).
    pub stream_first_chars: usize,
}

pub struct Synthesis {
    pub samples: Vec<f32>,
    pub timings: Timings,
}

/// Graphs kept per stage: the chunks of a long text have different shapes,
/// and a text synthesised again (or another of a few chunks) then finds every
/// stage's graph built, allocated and, on a GPU, already recorded for replay.
/// Four stages of four stay within the 16 graphs the CUDA plugin's module
/// keeps recorded (its patch 0002).
const GRAPHS_PER_STAGE: usize = 4;

struct GraphCache {
    duration: GraphSlot<usize>,
    text_encoder: GraphSlot<usize>,
    vector_estimator: GraphSlot<StepShape>,
    vocoder: GraphSlot<usize>,
}

impl Default for GraphCache {
    fn default() -> Self {
        GraphCache {
            duration: GraphSlot::with_capacity(GRAPHS_PER_STAGE),
            text_encoder: GraphSlot::with_capacity(GRAPHS_PER_STAGE),
            vector_estimator: GraphSlot::with_capacity(GRAPHS_PER_STAGE),
            vocoder: GraphSlot::with_capacity(GRAPHS_PER_STAGE),
        }
    }
}

pub struct Supertonic {
    // Graphs reference the weights: declared (dropped) first.
    graphs: GraphCache,
    weights: Weights,
    backend: Backend,
    policy: OpPolicy,
    pub hp: Hparams,
    indexer: Indexer,
    voices: BTreeMap<String, Voice>,
    dp_prelu: f32,
    vocoder_prelu: f32,
    rope_theta: Vec<f32>,
    time_freqs: Vec<f32>,
}

/// What [`check_file`] establishes about a model file.
pub struct CheckedFile {
    pub hp: Hparams,
    pub voice_names: Vec<String>,
    /// The tensor table, checked against the file.
    pub table: engine_core::model_kit::TensorTable,
    pub indexer: Indexer,
}

/// Everything checked about a Supertonic file before any weight is read, and
/// without a device: its architecture, every hparam against its range, every
/// tensor against the table they imply, the indexer against the embeddings.
pub fn check_file(gguf: &GgufTensors) -> Result<CheckedFile> {
    let path = gguf.file.path().display();
    engine_core::model_kit::require_architecture(&gguf.file, crate::hparams::ARCH, "a Supertonic model")?;
    let hp = Hparams::load(&gguf.file)?;
    let voice_names: Vec<String> =
        gguf.file.tensors().iter().filter_map(|t| t.name.strip_prefix("voice.")?.strip_suffix(".style_ttl").map(str::to_string)).collect();
    if voice_names.is_empty() {
        return err(format!("{path}: the model embeds no voice"));
    }
    let mut table = tensors::table(&hp, &voice_names);
    table.check(gguf)?;
    let rows = table.dim(tensors::VOCAB).expect("declared by the table");
    let indexer = Indexer::new(read_indexer(gguf)?, rows).map_err(|e| format!("{path}: {e}"))?;
    Ok(CheckedFile { hp, voice_names, table, indexer })
}

/// Weights only ever used as the first operand of a matrix product (the
/// `linear` layers), which may live in the device's extra buffers; the rest
/// (embeddings read by row, depthwise taps read as views, norms) stay in plain memory.
pub(crate) fn is_matmul_weight(name: &str) -> bool {
    name.ends_with(".weight") && ![".dw.", ".ln", ".bn.", "char_emb"].iter().any(|p| name.contains(p))
}

/// Upper bound on nodes in one stage graph.
pub(crate) const MAX_NODES: usize = 16384;

fn err<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::msg(msg))
}

impl Supertonic {
    pub fn load(path: &Path, backend: Backend, policy: &OpPolicy) -> Result<Self> {
        policy.check_denials("supertonic", crate::GRAPH_OPS)?;
        let gguf = GgufTensors::open(path)?;
        let CheckedFile { hp, voice_names, table, indexer } = check_file(&gguf)?;
        let weights = Weights::load(gguf, &backend, table, policy.matmul_weights, is_matmul_weight)?;
        let mut voices = BTreeMap::new();
        for name in voice_names {
            let (ttl, dp) = tensors::voice_tensors(&name);
            voices.insert(name, Voice { style_ttl: weights.host_f32(&ttl)?, style_dp: weights.host_f32(&dp)? });
        }
        let scalar = |name: &str| -> Result<f32> { Ok(weights.host_f32(name)?[0]) };
        let dp_prelu = scalar("dp.pred.prelu")?;
        let vocoder_prelu = scalar("voc.head.prelu")?;
        let rope_theta = weights.host_f32("ve.rope.theta")?;
        let time_freqs = weights.host_f32("ve.time.freqs")?;
        Ok(Supertonic {
            graphs: GraphCache::default(),
            weights,
            backend,
            policy: policy.clone(),
            hp,
            indexer,
            voices,
            dp_prelu,
            vocoder_prelu,
            rope_theta,
            time_freqs,
        })
    }

    /// The graphs built so far, by stage (census tests).
    pub fn graphs(&self) -> Vec<(&'static str, &ComputeGraph)> {
        let g = &self.graphs;
        let mut out = Vec::new();
        out.extend(g.duration.graph().map(|x| ("duration", x)));
        out.extend(g.text_encoder.graph().map(|x| ("text_encoder", x)));
        out.extend(g.vector_estimator.graph().map(|x| ("vector_estimator", x)));
        out.extend(g.vocoder.graph().map(|x| ("vocoder", x)));
        out
    }

    /// The bytes of the buffers holding the weights.
    pub fn weight_bytes(&self) -> usize {
        self.weights.buffer_bytes()
    }

    pub fn voice_names(&self) -> Vec<String> {
        self.voices.keys().cloned().collect()
    }

    fn voice_shape(&self) -> VoiceShape {
        VoiceShape { ttl: (self.hp.style_tokens, self.hp.style_dim), dp: (self.hp.dp.style_tokens, self.hp.dp.style_dim) }
    }

    pub fn resolve_voice(&self, choice: &VoiceChoice) -> Result<Voice> {
        match choice {
            VoiceChoice::Named(name) if name.is_empty() => Ok(self.voices.values().next().expect("at least one voice").clone()),
            VoiceChoice::Named(name) => self.voices.get(name).cloned().ok_or_else(|| {
                Error::msg(format!("unknown voice '{name}' (embedded voices: {}; or give a voice style JSON path)", self.voice_names().join(", ")))
            }),
            VoiceChoice::File(path) => Voice::from_json_file(path, &self.voice_shape()),
        }
    }

    /// Checks user options against the model (language, steps, speed).
    pub fn validate(&self, params: &SynthesisParams) -> Result<()> {
        if !params.language.is_empty() && !self.hp.text.languages.contains(&params.language) {
            return err(format!(
                "language '{}' is not supported by Supertonic {} (supported: {})",
                params.language,
                self.hp.version.as_str(),
                self.hp.text.languages.join(", ")
            ));
        }
        if let Some(steps) = params.steps {
            let max = self.hp.version.max_steps();
            if !(1..=max).contains(&steps) {
                return err(format!("steps must be in 1..={max} for Supertonic {}, got {steps}", self.hp.version.as_str()));
            }
        }
        stretch::check_speed(params.speed as f64)?;
        Ok(())
    }

    pub fn language<'a>(&'a self, params: &'a SynthesisParams) -> &'a str {
        if params.language.is_empty() {
            &self.hp.text.default_language
        } else {
            &params.language
        }
    }

    /// Text → wrapped, normalised string → embedding row ids, with characters
    /// the indexer lacks handled as `policy` says.
    pub fn encode_text(&self, text: &str, language: &str, policy: UnsupportedChars) -> Result<Encoded> {
        let normalized = text::normalize(text);
        let wrapped = text::wrap(&normalized, language, self.hp.text.wrap_open_close);
        let encoded = self.indexer.encode(&wrapped, policy).map_err(|bad| {
            format!("unsupported characters for this model: {} (set unsupported_chars = \"skip\" to leave them out)", text::describe_chars(&bad))
        })?;
        if policy == UnsupportedChars::Skip
            && !encoded.unsupported.is_empty()
            && !normalized.chars().any(|c| c.is_alphanumeric() && !encoded.unsupported.contains(&c))
        {
            return err(format!(
                "nothing speakable remains of {text:?} without the characters this model lacks: {}",
                text::describe_chars(&encoded.unsupported)
            ));
        }
        Ok(encoded)
    }

    /// Chunks of the input, as the official pipeline splits long text.
    pub fn chunks(&self, text: &str, language: &str) -> Vec<String> {
        let max = if self.hp.text.short_chunk_languages.iter().any(|l| l == language) { self.hp.text.short_chunk_chars } else { self.hp.text.chunk_chars };
        text::chunk_text(text, max)
    }

    fn build_graph(&self, what: &str, f: impl for<'c> FnOnce(&Builder<'c, '_>) -> GgmlResult<GraphIo<'c>>) -> Result<ComputeGraph> {
        let ln_eps = self.hp.layer_norm_eps;
        compute_graph(&self.backend, &self.weights, &self.policy, MAX_NODES, what, |kit| f(&Builder::new(kit, ln_eps)))
    }

    /// Duration predictor: seconds (before the speed factor).
    pub fn duration(&mut self, ids: &[i32], voice: &Voice) -> Result<f32> {
        let mut cache = std::mem::take(&mut self.graphs.duration);
        let result = (|| -> Result<_> {
            let g =
                cache.get_or_build(ids.len(), || self.build_graph("the duration predictor", |b| duration::build(b, &self.hp.dp, self.dp_prelu, ids.len())))?;
            g.set_i32("text_ids", ids)?;
            g.set_f32("style_dp", &voice.style_dp)?;
            Ok(finite::check_stage("the duration predictor", g.compute_and_get_f32(&self.backend, "duration")?)?[0])
        })();
        self.graphs.duration = cache;
        result
    }

    /// Text encoder: `[T, C]` row-major (ggml `[C, T]`).
    pub fn text_encoder(&mut self, ids: &[i32], voice: &Voice) -> Result<Vec<f32>> {
        let mut cache = std::mem::take(&mut self.graphs.text_encoder);
        let result = (|| -> Result<_> {
            let (sd, st) = (self.hp.style_dim, self.hp.style_tokens);
            let g = cache.get_or_build(ids.len(), || self.build_graph("the text encoder", |b| text_encoder::build(b, &self.hp.te, sd, st, ids.len())))?;
            g.set_i32("text_ids", ids)?;
            g.set_f32("style_ttl", &voice.style_ttl)?;
            finite::check_stage("the text encoder", g.compute_and_get_f32(&self.backend, "text_emb")?)
        })();
        self.graphs.text_encoder = cache;
        result
    }

    /// Runs `steps` estimator steps from `noise` (`[L, C]` row-major, ggml
    /// `[C, L]`); `on_step` sees each step's output.
    pub fn denoise(&mut self, noise: &[f32], text_emb: &[f32], voice: &Voice, steps: usize, mut on_step: impl FnMut(usize, &[f32], f64)) -> Result<Vec<f32>> {
        let c = self.hp.latent_channels();
        let latent_len = noise.len() / c;
        let text_len = text_emb.len() / self.hp.te.char_dim;
        let shape = StepShape { latent_len, text_len, total_steps: steps };
        let dims =
            vector_estimator::Dims { latent_channels: c, text_dim: self.hp.te.char_dim, style_dim: self.hp.style_dim, style_tokens: self.hp.style_tokens };
        let mut cache = std::mem::take(&mut self.graphs.vector_estimator);
        let result = (|| -> Result<_> {
            let g = cache.get_or_build(shape, || self.build_graph("the vector estimator", |b| vector_estimator::build(b, &self.hp.ve, &dims, shape)))?;
            let (cq, sq) = vector_estimator::rope_tables(&self.rope_theta, latent_len);
            let (ck, sk) = vector_estimator::rope_tables(&self.rope_theta, text_len);
            let mut x = noise.to_vec();
            for step in 0..steps {
                let start = Instant::now();
                // The allocator may reuse an input's memory once the graph has
                // consumed it, so every input is uploaded for every step.
                for (name, values) in [
                    ("text_emb", text_emb),
                    ("style_ttl", &voice.style_ttl[..]),
                    ("rope_cos_q", &cq),
                    ("rope_sin_q", &sq),
                    ("rope_cos_k", &ck),
                    ("rope_sin_k", &sk),
                ] {
                    g.set_f32(name, values)?;
                }
                let features = vector_estimator::time_features(&self.time_freqs, self.hp.ve.time_scale, step, steps);
                g.set_f32("time_features", &features)?;
                g.set_f32("noisy_latent", &x)?;
                x = g.compute_and_get_f32(&self.backend, "denoised_latent")?;
                finite::check_values(&format!("the vector estimator (step {} of {steps})", step + 1), &x)?;
                on_step(step, &x, start.elapsed().as_secs_f64() * 1e3);
            }
            Ok(x)
        })();
        self.graphs.vector_estimator = cache;
        result
    }

    /// Vocoder: the untrimmed waveform of a latent `[L, C]` row-major.
    pub fn vocoder(&mut self, latent: &[f32]) -> Result<Vec<f32>> {
        let latent_len = latent.len() / self.hp.latent_channels();
        let mut cache = std::mem::take(&mut self.graphs.vocoder);
        let result = (|| -> Result<_> {
            let g = cache.get_or_build(latent_len, || self.build_graph("the vocoder", |b| vocoder::build(b, &self.hp, self.vocoder_prelu, latent_len)))?;
            g.set_f32("latent", latent)?;
            finite::check_stage("the vocoder", g.compute_and_get_f32(&self.backend, "wav")?)
        })();
        self.graphs.vocoder = cache;
        result
    }

    /// Latent frames for a duration in seconds (after the speed factor).
    pub fn latent_len(&self, seconds: f32) -> (usize, usize) {
        let wav_len = (seconds * self.hp.sample_rate as f32) as usize;
        let frame = self.hp.samples_per_frame();
        (wav_len, wav_len.div_ceil(frame))
    }

    /// The full pipeline over every chunk of `text`.
    pub fn synthesize(&mut self, text: &str, params: &SynthesisParams) -> Result<Synthesis> {
        let mut samples = Vec::new();
        let timings = self.run(text, params, &mut PieceSender::collecting(&mut samples), 0)?;
        Ok(Synthesis { samples, timings })
    }

    /// [`Self::synthesize`], handing each chunk's audio (after the silence
    /// that precedes it) to `out` as soon as it is computed, until `out` says
    /// stop; a long first chunk is cut at `stream_first_chars`. Returns the
    /// stage timings.
    pub fn synthesize_streaming(&mut self, text: &str, params: &SynthesisParams, out: &mut PieceSender) -> Result<Timings> {
        self.run(text, params, out, params.stream_first_chars)
    }

    /// A speed the duration control makes is synthesized as it is; another at
    /// the nearest speed it makes, every piece then time-stretched by the rest
    /// through one [`TimeStretch`] (so the joins between pieces stretch too).
    fn run(&mut self, text: &str, params: &SynthesisParams, out: &mut PieceSender, first_chars: usize) -> Result<Timings> {
        self.validate(params)?;
        let native = params.speed.clamp(*NATIVE_SPEED_RANGE.start(), *NATIVE_SPEED_RANGE.end());
        if native == params.speed {
            return self.run_native(text, params, out, first_chars);
        }
        let mut stretcher = TimeStretch::new(self.hp.sample_rate, params.speed as f64 / native as f64)?;
        let mut stretch_ms = 0f64;
        let mut timings = {
            let mut stretched = PieceSender::new(|piece| {
                let start = Instant::now();
                let piece = stretcher.push(piece);
                stretch_ms += start.elapsed().as_secs_f64() * 1e3;
                out.send(&piece)
            });
            let timings = self.run_native(text, &SynthesisParams { speed: native, ..params.clone() }, &mut stretched, first_chars)?;
            if stretched.cancelled {
                return Ok(timings);
            }
            timings
        };
        let start = Instant::now();
        let rest = stretcher.finish();
        timings.add("time_stretch", stretch_ms + start.elapsed().as_secs_f64() * 1e3);
        out.send(&rest);
        Ok(timings)
    }

    /// The synthesis loop at a speed the duration control makes.
    fn run_native(&mut self, text: &str, params: &SynthesisParams, out: &mut PieceSender, first_chars: usize) -> Result<Timings> {
        let language = self.language(params).to_string();
        let voice = self.resolve_voice(&params.voice)?;
        let steps = params.steps.unwrap_or(self.hp.default_steps as usize);
        let mut chunks = self.chunks(text, &language);
        if chunks.is_empty() {
            return err("text is empty");
        }
        // The silence before each chunk.
        let mut pauses: Vec<f32> = (0..chunks.len()).map(|i| if i == 0 { 0.0 } else { CHUNK_SILENCE_S }).collect();
        if let Some((head, tail)) = text::cut_first_piece(&chunks[0], first_chars) {
            let ends_sentence = head.ends_with(['.', '!', '?', '。', '！', '？']);
            chunks.splice(0..1, [head, tail]);
            pauses.insert(1, if ends_sentence { CHUNK_SILENCE_S } else { CUT_SILENCE_S });
        }
        // Encode everything first: an unsupported character fails before any compute.
        let encoded: Vec<Encoded> = chunks.iter().map(|c| self.encode_text(c, &language, params.unsupported_chars)).collect::<Result<_, _>>()?;
        let mut unsupported: Vec<char> = Vec::new();
        for c in encoded.iter().flat_map(|e| &e.unsupported) {
            if !unsupported.contains(c) {
                unsupported.push(*c);
            }
        }
        if !unsupported.is_empty() {
            let how = if params.unsupported_chars == UnsupportedChars::Skip { "left out" } else { "read as the last embedding row, as the official code does" };
            tracing::warn!("characters this model has no row for were {how}: {}", text::describe_chars(&unsupported));
        }
        let mut noise = NoiseStream::new(&params.noise)?;
        let mut timings = Timings::default();
        let mut delivered = 0usize;
        let mut total_seconds = 0f32;
        for (i, ids) in encoded.iter().map(|e| &e.ids).enumerate() {
            if ids.is_empty() {
                return err("nothing to speak: the text is empty after normalisation");
            }
            let seconds = timings.time("duration", || self.duration(ids, &voice))? / params.speed;
            // Every size below follows from this one number: bound it before allocating.
            if !(0.0..=MAX_CHUNK_SECONDS).contains(&seconds) {
                return err(format!(
                    "the duration predictor gave {seconds} s for a chunk of {} characters (allowed: 0..={MAX_CHUNK_SECONDS} s); the model file may be corrupt",
                    chunks[i].chars().count()
                ));
            }
            let (wav_len, latent_len) = self.latent_len(seconds);
            // The official graphs return no samples for a chunk shorter than one
            // sample; no text is that short, so such a duration comes from
            // out-of-range values (a voice's style_dp of 1e30 drives the exp to 0)
            // and must not become an empty WAV.
            if wav_len == 0 {
                return err(format!(
                    "the duration predictor gave {seconds} s for a chunk of {} characters, less than one sample; the voice or the model file holds values out of range",
                    chunks[i].chars().count()
                ));
            }
            let text_emb = timings.time("text_encoder", || self.text_encoder(ids, &voice))?;
            let x0 = noise.next(self.hp.latent_channels(), latent_len)?;
            let mut step_times = Vec::new();
            let latent = self.denoise(&x0, &text_emb, &voice, steps, |s, _, ms| step_times.push((format!("vector_estimator.step{s}"), ms)))?;
            for (stage, ms) in step_times {
                timings.add(&stage, ms);
            }
            let wav = timings.time("vocoder", || self.vocoder(&latent))?;
            let mut piece = vec![0f32; (pauses[i] * self.hp.sample_rate as f32) as usize];
            piece.extend_from_slice(&wav);
            // In the official order and precision: `dur_cat += dur + silence` in float32.
            total_seconds = if i == 0 { seconds } else { total_seconds + (seconds + pauses[i]) };
            if i + 1 == encoded.len() {
                // As the official code, the whole is cut to the f32 total times the rate in f64.
                let total = (self.hp.sample_rate as f64 * total_seconds as f64) as usize;
                piece.truncate(total.saturating_sub(delivered));
            }
            delivered += piece.len();
            if !out.send(&piece) {
                break;
            }
        }
        Ok(timings)
    }

    /// Matrices the backend keeps in its own layout (CPU: AMX / repacked).
    pub fn weights_in_extra_buffers(&self) -> usize {
        self.weights.in_extra_buffers
    }

    pub fn version(&self) -> Version {
        self.hp.version
    }
}

/// The code-point table, stored I16 (or I32 for vocabularies over 32767 rows).
fn read_indexer(gguf: &GgufTensors) -> Result<Vec<i32>> {
    let t = gguf.ctx.get_tensor(tensors::INDEXER).ok_or_else(|| format!("{}: tensor '{}' is missing", gguf.file.path().display(), tensors::INDEXER))?;
    let bytes = gguf.read_bytes(tensors::INDEXER)?;
    match t.ty() {
        ggml_sys::sys::GGML_TYPE_I16 => Ok(bytes.chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]]) as i32).collect()),
        ggml_sys::sys::GGML_TYPE_I32 => Ok(bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()),
        other => err(format!("{}: text.indexer has type {}, expected i16 or i32", gguf.file.path().display(), ggml_sys::type_name(other))),
    }
}

/// Noise for successive chunks, converted to ggml's `[C, L]` order.
struct NoiseStream {
    rng: Option<NumpyLegacyRng>,
    file: Option<(Vec<f32>, usize)>,
}

impl NoiseStream {
    fn new(source: &NoiseSource) -> Result<Self> {
        Ok(match source {
            NoiseSource::Seed(seed) => NoiseStream { rng: Some(NumpyLegacyRng::new(*seed)), file: None },
            NoiseSource::Npy(path) => NoiseStream { rng: None, file: Some((npy::read_f32(path).map_err(|e| Error::msg(format!("noise file {e}")))?, 0)) },
        })
    }

    /// `randn(1, C, L)` in NumPy order, transposed to `[L, C]` row-major.
    fn next(&mut self, channels: usize, len: usize) -> Result<Vec<f32>> {
        let n = channels * len;
        let chw: Vec<f32> = match (&mut self.rng, &mut self.file) {
            (Some(rng), _) => rng.randn(n),
            (None, Some((values, pos))) => {
                if *pos + n > values.len() {
                    return err(format!("the noise file holds {} values, the synthesis needs at least {}", values.len(), *pos + n));
                }
                let out = values[*pos..*pos + n].to_vec();
                *pos += n;
                out
            }
            _ => unreachable!("one noise source is set"),
        };
        Ok(transpose(&chw, channels, len))
    }
}

/// `[rows, cols]` row-major → `[cols, rows]` row-major.
pub fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; values.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = values[r * cols + c];
        }
    }
    out
}
