//! A loaded Chatterbox model and the synthesis loop, per text chunk:
//! normalise → tokenize → T3 (speech tokens) → keep speech codes → S3Gen
//! flow encoder → CFM decoder → HiFT → trim fade; chunks are joined with a
//! short crossfade.
//!
//! Turbo and Nano: GPT-2 T3 on English BPE, three silence tokens appended,
//! the 2-step meanflow decoder. Multilingual: the guided Llama T3 on the
//! grapheme tokenizer with a language tag, the reference's start/stop slice,
//! the 10-step standard decoder with guidance.

use crate::chunk_stream::{BlockRunner, TokenChunker};
use crate::cloning::reference::ReferenceRules;
use crate::cloning::{voice_file, Voice};
use crate::hparams::{S3GenHparams, T3Hparams, S3GEN_ARCH, T3_ARCH};
use crate::s3gen::blocks::{BlockStream, StreamShape};
use crate::s3gen::source::{apply_trim_fade, SourceNoise};
use crate::s3gen::S3Gen;
use crate::sampler::{GuidedSamplingParams, SamplingParams, UniformSource, Xoshiro256};
pub use crate::speech_tokens::SpeechGenerator;
use crate::t3::guided::{GuidanceMode, GuidedT3};
use crate::t3::{OnToken, TokenLimits, T3};
use crate::text::multilingual::{self, MultilingualTokenizer};
use crate::text::{self, TextTokenizer};
use engine_core::audio::stretch::{self, TimeStretch};
use engine_core::model_kit::{npy, OpPolicy, PieceSender, Timings};
use engine_core::model_kit::{Error, Result};
use ggml_sys::gguf::GgufFile;
use ggml_sys::Backend;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

/// Random draws recorded from a reference run, injected instead of seeded
/// ones (parity debugging): `t3_uniforms.npy` (one per speech token),
/// `cfm_z.npy` (the initial Euler state, `(1, mel, frames)`), `sine_phase.npy`
/// and `sine_noise.npy` (HiFT's source, both or neither). Any other file
/// may be absent. docs/models/chatterbox.md, "Recorded draws", describes
/// each file and what it replaces.
#[derive(Debug, Clone, Default)]
pub struct RecordedDraws {
    pub t3_uniforms: Option<Vec<f32>>,
    /// `[mel][frames]` as the reference lays it out.
    pub cfm_z: Option<Vec<f32>>,
    pub sine_phase: Option<Vec<f32>>,
    pub sine_noise: Option<Vec<f32>>,
}

impl RecordedDraws {
    pub fn from_dir(dir: &Path) -> Result<Self> {
        if !dir.is_dir() {
            let what = if dir.exists() { "is not a directory" } else { "does not exist" };
            return Err(format!("draws: {} {what} (name a directory of recorded .npy draws)", dir.display()).into());
        }
        let load = |name: &str| -> Result<Option<Vec<f32>>> {
            let path = dir.join(format!("{name}.npy"));
            if path.exists() {
                npy::read_f32(&path).map(Some)
            } else {
                Ok(None)
            }
        };
        Ok(RecordedDraws { t3_uniforms: load("t3_uniforms")?, cfm_z: load("cfm_z")?, sine_phase: load("sine_phase")?, sine_noise: load("sine_noise")? })
    }

    /// The recorded initial Euler state as the CFM takes it (`[frame][mel]`),
    /// if `cfm_z.npy` was recorded. A wrong length is told in frames and
    /// tokens: the file fits one run's token count, and a run whose tokens
    /// differ needs other frames.
    fn cfm_z(&self, mel_ch: usize, frames: usize, prompt_frames: usize, speech_tokens: usize) -> Result<Option<Vec<f32>>> {
        let Some(z) = &self.cfm_z else { return Ok(None) };
        if z.len() % mel_ch != 0 {
            return Err(format!("cfm_z.npy holds {} values, not whole mel frames of {mel_ch} channels (it is (1, {mel_ch}, frames))", z.len()).into());
        }
        let held = z.len() / mel_ch;
        if held != frames {
            return Err(format!(
                "cfm_z.npy holds {held} mel frames; this synthesis needs {frames}: the voice prompt's {prompt_frames} and {} for {speech_tokens} speech tokens \
                 (the token stream diverged earlier, or the voice differs: the recorded draws fit another run)",
                frames - prompt_frames
            )
            .into());
        }
        Ok(Some(transpose(z, mel_ch, frames)))
    }

    /// The recorded source draws, if `sine_phase.npy` and `sine_noise.npy`
    /// were recorded (one without the other is an error: the seeded draws
    /// would silently replace both), the fundamental's phase zeroed as
    /// SineGen does. `speech_frames` mel frames of `per_frame` samples each
    /// come from `speech_tokens` tokens.
    fn source_noise(&self, bands: usize, per_frame: usize, speech_frames: usize, speech_tokens: usize) -> Result<Option<SourceNoise>> {
        let (phase, noise) = match (&self.sine_phase, &self.sine_noise) {
            (None, None) => return Ok(None),
            (Some(_), None) => return Err("sine_phase.npy is recorded without sine_noise.npy; the source takes both draws or neither".into()),
            (None, Some(_)) => return Err("sine_noise.npy is recorded without sine_phase.npy; the source takes both draws or neither".into()),
            (Some(p), Some(n)) => (p, n),
        };
        if phase.len() != bands {
            return Err(format!(
                "sine_phase.npy holds {} phases; this model's source has {bands} (the fundamental and {} harmonics): the recorded draws fit another model",
                phase.len(),
                bands - 1
            )
            .into());
        }
        if noise.len() % bands != 0 {
            return Err(format!("sine_noise.npy holds {} values, not {bands} bands of whole samples (it is (1, {bands}, samples))", noise.len()).into());
        }
        let (held, samples) = (noise.len() / bands, speech_frames * per_frame);
        if held != samples {
            let held_frames = if held % per_frame == 0 { format!("{} mel frames", held / per_frame) } else { "not whole mel frames".into() };
            return Err(format!(
                "sine_noise.npy holds {held} samples per band ({held_frames} of {per_frame}); this synthesis needs {samples}: {speech_frames} mel frames for {speech_tokens} speech tokens \
                 (the token stream diverged earlier: the recorded draws fit another run)"
            )
            .into());
        }
        let mut phase = phase.clone();
        phase[0] = 0.0;
        Ok(Some(SourceNoise { phase, noise: noise.clone() }))
    }
}

/// Where a synthesis takes its voice from.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum VoiceSource {
    /// The voice the model files carry (`conds.pt`).
    #[default]
    Builtin,
    /// Cloned from a recording at every synthesis (`reference_audio=`).
    Reference(PathBuf),
    /// A voice file saved earlier (`voice=`): no encoder runs.
    Saved(PathBuf),
}

#[derive(Debug, Clone)]
pub struct SynthesisParams {
    pub voice: VoiceSource,
    /// 0 means greedy decoding (the argmax of the processed logits).
    pub temperature: f32,
    /// None: the variant's default (Turbo 1000; Multilingual has no top-k step).
    pub top_k: Option<usize>,
    /// None: the variant's default (Turbo 0.95, Multilingual 1).
    pub top_p: Option<f64>,
    /// None: the variant's default (Turbo 1.2, Multilingual 2).
    pub repetition_penalty: Option<f32>,
    /// Multilingual: min-p filter (0 = off).
    pub min_p: f32,
    /// Multilingual: classifier-free guidance weight of T3 (0 = one row).
    pub cfg_weight: f32,
    /// Multilingual: the emotion token's exaggeration.
    pub exaggeration: f32,
    /// Multilingual: how T3's two guidance rows are computed.
    pub guidance: GuidanceMode,
    /// Multilingual: the language code; Turbo and Nano take `en` only.
    pub language: String,
    pub max_new_tokens: usize,
    /// The stop token is suppressed until this many tokens exist (benchmarks
    /// with a fixed token count; 0 = off).
    pub min_new_tokens: usize,
    pub seed: u64,
    /// Longest chunk of text synthesised at once (0 = no splitting).
    pub max_chars: usize,
    pub crossfade_ms: f32,
    /// Speaking rate, 0.25..=4: the model has no control of its own, so any
    /// speed but 1 time-stretches its audio at the same pitch.
    pub speed: f32,
    /// Streaming: hand audio on every this many speech tokens (0: per text chunk).
    pub stream_tokens: usize,
    /// Streaming: the first hop, shorter so the first audio comes sooner.
    pub stream_first_tokens: usize,
    /// Streaming: already vocoded speech codes S3Gen still sees before a
    /// hop's new ones (0 = every code so far).
    pub stream_context_tokens: usize,
    /// Streaming: the voice prompt's last this many codes (and their mel)
    /// condition S3Gen (0 = the whole prompt).
    pub stream_prompt_tokens: usize,
    /// Streaming: Euler steps of the CFM decoder; None = 1 for the meanflow
    /// decoder, else `cfm_steps`.
    pub stream_cfm_steps: Option<usize>,
    /// Streaming on a GPU: S3Gen's blocks run on a worker thread and device
    /// stream beside T3 (false: between T3's steps).
    pub stream_beside_t3: bool,
    /// Euler steps of the CFM decoder; None = the model's default.
    pub cfm_steps: Option<usize>,
    pub draws: Option<PathBuf>,
}

impl Default for SynthesisParams {
    fn default() -> Self {
        SynthesisParams {
            voice: VoiceSource::Builtin,
            temperature: 0.8,
            top_k: None,
            top_p: None,
            repetition_penalty: None,
            min_p: 0.05,
            cfg_weight: 0.5,
            exaggeration: 0.5,
            guidance: GuidanceMode::default(),
            language: "en".into(),
            max_new_tokens: 1000,
            min_new_tokens: 0,
            seed: 0,
            max_chars: 300,
            crossfade_ms: 20.0,
            speed: 1.0,
            stream_tokens: 25,
            stream_first_tokens: 10,
            stream_context_tokens: 50,
            stream_prompt_tokens: 100,
            stream_cfm_steps: None,
            stream_beside_t3: true,
            cfm_steps: None,
            draws: None,
        }
    }
}

impl SynthesisParams {
    pub fn token_limits(&self) -> TokenLimits {
        TokenLimits { max_new: self.max_new_tokens, min_new: self.min_new_tokens }
    }

    /// Turbo's and Nano's sampling chain (`inference_turbo`'s defaults where unset).
    pub fn turbo_sampling(&self) -> SamplingParams {
        let d = SamplingParams::default();
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k.unwrap_or(d.top_k),
            top_p: self.top_p.unwrap_or(d.top_p),
            repetition_penalty: self.repetition_penalty.unwrap_or(d.repetition_penalty),
        }
    }

    /// Multilingual's guided chain (`ChatterboxMultilingualTTS.generate`'s defaults where unset).
    pub fn guided_sampling(&self) -> Result<GuidedSamplingParams> {
        if let Some(k) = self.top_k {
            return Err(format!("top_k={k} does not apply to Multilingual, which filters with min_p").into());
        }
        let d = GuidedSamplingParams::default();
        Ok(GuidedSamplingParams {
            cfg_weight: self.cfg_weight,
            repetition_penalty: self.repetition_penalty.unwrap_or(d.repetition_penalty),
            temperature: self.temperature,
            min_p: self.min_p,
            top_p: self.top_p.unwrap_or(d.top_p),
        })
    }
}

pub struct Synthesis {
    pub samples: Vec<f32>,
    pub timings: Timings,
    /// Speech tokens per chunk, as T3 produced them (before filtering).
    pub speech_tokens: Vec<Vec<u32>>,
    /// Text ids per chunk, as T3 read them (one row: Multilingual's guidance
    /// rows share them).
    pub text_ids: Vec<Vec<i32>>,
}

/// What a streamed synthesis returns besides its audio.
pub struct StreamedTrace {
    pub timings: Timings,
    /// Speech tokens per chunk synthesized.
    pub speech_tokens: Vec<Vec<u32>>,
    /// Text ids per chunk synthesized.
    pub text_ids: Vec<Vec<i32>>,
}

pub struct Chatterbox {
    pub t3: SpeechGenerator,
    pub s3gen: S3Gen,
    builtin: Voice,
    /// The last streamed chunk's S3Gen state, kept for the next chunk of its
    /// shape (its caches are allocated once, not per chunk).
    stream: Option<BlockStream>,
    /// On a GPU, the backend S3Gen computes on: the device's, with a stream
    /// of its own, so that streamed blocks run beside T3's steps. Owned here,
    /// dropped after S3Gen and the stream.
    s3gen_stream: Option<Backend>,
}

/// A GGUF file's metadata and its `general.architecture`.
fn open_metadata(path: &Path) -> Result<(GgufFile, String)> {
    let file = GgufFile::open(path)?;
    let arch = file.get_str("general.architecture")?;
    Ok((file, arch))
}

/// A model's two files, told apart by architecture, with their metadata and
/// hyperparameters, checked to pair (the T3 and the S3Gen of one variant)
/// before any weight is read.
pub struct ModelFiles {
    pub t3_path: PathBuf,
    pub t3_meta: GgufFile,
    pub t3_hp: T3Hparams,
    pub s3_path: PathBuf,
    pub s3_hp: S3GenHparams,
    /// A guided (Multilingual, Llama) T3.
    pub guided: bool,
}

impl ModelFiles {
    /// The T3 file and the S3Gen file, given in either order.
    pub fn open(files: &[PathBuf]) -> Result<Self> {
        let [a, b] = files else {
            let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
            return Err(format!(
                "chatterbox takes two GGUF files (T3 and S3Gen); {} given{}",
                files.len(),
                if names.is_empty() { String::new() } else { format!(": {}", names.join(", ")) }
            )
            .into());
        };
        let (meta_a, meta_b) = (open_metadata(a)?, open_metadata(b)?);
        let ((t3_path, t3_meta), (s3_path, s3_meta)) = match (meta_a.1.as_str(), meta_b.1.as_str()) {
            (T3_ARCH, S3GEN_ARCH) => ((a, meta_a.0), (b, meta_b.0)),
            (S3GEN_ARCH, T3_ARCH) => ((b, meta_b.0), (a, meta_a.0)),
            (x, y) => {
                return Err(
                    format!("chatterbox needs one '{T3_ARCH}' and one '{S3GEN_ARCH}' file, got '{x}' ({}) and '{y}' ({})", a.display(), b.display()).into()
                )
            }
        };
        // The pairing and the tokenizer are checked on metadata, before any weights load.
        let t3_hp = T3Hparams::load(&t3_meta)?;
        let s3_hp = S3GenHparams::load(&s3_meta)?;
        let guided = t3_hp.llama().is_some();
        if s3_hp.meanflow == guided {
            let (wanted, file) = if guided { ("standard", "s3gen.gguf") } else { ("meanflow", "s3gen-meanflow.gguf") };
            return Err(format!(
                "T3 '{}' ({}) pairs with the {wanted} S3Gen ({file}); {} holds the '{}' one",
                t3_hp.variant,
                t3_path.display(),
                s3_path.display(),
                s3_hp.variant
            )
            .into());
        }
        if (t3_hp.start_speech_token as usize) < s3_hp.speech_vocab {
            return Err(format!("T3's start token {} lies inside S3Gen's speech vocabulary ({})", t3_hp.start_speech_token, s3_hp.speech_vocab).into());
        }
        Ok(ModelFiles { t3_path: t3_path.clone(), t3_meta, t3_hp, s3_path: s3_path.clone(), s3_hp, guided })
    }
}

impl Chatterbox {
    /// Device bytes of the streaming state kept since the last streamed
    /// chunk, by the memory plan's items (none before one).
    pub fn stream_resident_bytes(&self) -> Vec<(&'static str, usize)> {
        let Some(stream) = &self.stream else { return Vec::new() };
        let mut items = stream.resident_bytes().to_vec();
        items.push((crate::s3gen::blocks::STREAM_VOCODER, self.s3gen.window_graph_bytes()));
        items
    }

    /// Whether S3Gen has a device stream of its own, so that streamed blocks
    /// may run beside T3 (`stream_beside_t3`): a GPU device.
    pub fn has_s3gen_stream(&self) -> bool {
        self.s3gen_stream.is_some()
    }

    /// Loads the T3 file and the S3Gen file, given in either order, onto
    /// `backend` (borrowed: the caller keeps it alive longer than the model).
    pub fn load(files: &[PathBuf], backend: &Backend, policy: &OpPolicy) -> Result<Self> {
        policy.check_denials("chatterbox", crate::GRAPH_OPS)?;
        let ModelFiles { t3_path, t3_meta, t3_hp, s3_path, guided, .. } = ModelFiles::open(files)?;
        let (t3_path, s3_path) = (&t3_path, &s3_path);
        let json = t3_meta.get_str("chatterbox.tokenizer_json")?;
        let tokenizer_error = |e: Error| Error::msg(format!("{}: chatterbox.tokenizer_json: {e}", t3_path.display()));
        let borrow = || unsafe { Backend::from_raw(backend.as_ptr()) }.expect("backend is not null");
        let t3 = if guided {
            let tokenizer = MultilingualTokenizer::from_json(&json, t3_hp.text_vocab).map_err(tokenizer_error)?;
            SpeechGenerator::Llama { t3: GuidedT3::load(t3_path, borrow(), policy)?, tokenizer }
        } else {
            let tokenizer = TextTokenizer::from_json(&json, t3_hp.text_vocab).map_err(tokenizer_error)?;
            SpeechGenerator::Gpt2 { t3: T3::load(t3_path, borrow(), policy)?, tokenizer }
        };
        let s3gen_stream = match backend.second_stream() {
            Ok(second) => second,
            Err(e) => {
                tracing::warn!("S3Gen shares T3's stream, so streamed blocks wait for T3's steps: {e}");
                None
            }
        };
        let s3_backend = match &s3gen_stream {
            Some(second) => unsafe { Backend::from_raw(second.as_ptr()) }.expect("backend is not null"),
            None => borrow(),
        };
        let s3gen = S3Gen::load(s3_path, s3_backend, policy)?;
        let builtin = Voice { t3: t3.builtin_voice()?, s3gen: s3gen.builtin_voice()? };
        if !builtin.s3gen.prompt_feat.len().is_multiple_of(s3gen.hp.mel_channels) {
            return Err(format!("{}: the built-in prompt_feat is not whole mel frames", s3_path.display()).into());
        }
        Ok(Chatterbox { t3, s3gen, builtin, stream: None, s3gen_stream })
    }

    /// The voice the files carry (`voice.builtin.*`).
    pub fn builtin_voice(&self) -> &Voice {
        &self.builtin
    }

    /// What this variant's `prepare_conditionals` does to a reference clip.
    pub fn reference_rules(&self) -> ReferenceRules {
        crate::cloner::reference_rules(self.is_multilingual())
    }

    /// A voice cloned from the recording at `path`: read as the reference
    /// reads it, then the three encoders (timed as `clone.*` stages).
    pub fn clone_voice(&mut self, path: &Path, timings: &mut Timings) -> Result<Voice> {
        let rules = self.reference_rules();
        crate::cloner::clone_voice(&mut self.t3, &mut self.s3gen, &rules, path, timings)
    }

    /// [`clone_voice`](Self::clone_voice) as a voice file's bytes.
    pub fn save_voice(&mut self, path: &Path, timings: &mut Timings) -> Result<Vec<u8>> {
        let voice = self.clone_voice(path, timings)?;
        voice_file::to_bytes(&voice, &self.t3.hp().variant, self.s3gen.hp.mel_channels)
    }

    /// The voice `source` names, for this model.
    fn voice(&mut self, source: &VoiceSource, timings: &mut Timings) -> Result<Voice> {
        match source {
            VoiceSource::Builtin => Ok(self.builtin.clone()),
            VoiceSource::Reference(path) => self.clone_voice(path, timings),
            VoiceSource::Saved(path) => voice_file::read(path, self.t3.hp(), &self.s3gen.hp),
        }
    }

    pub fn variant(&self) -> &str {
        &self.t3.hp().variant
    }

    pub fn sample_rate(&self) -> u32 {
        self.s3gen.hp.hift.sample_rate
    }

    /// Whether T3 is Multilingual's (a language option, 23 languages).
    pub fn is_multilingual(&self) -> bool {
        matches!(self.t3, SpeechGenerator::Llama { .. })
    }

    /// Checks the options that depend on the variant, before any compute.
    fn check_params(&self, params: &SynthesisParams) -> Result<()> {
        match &self.t3 {
            SpeechGenerator::Gpt2 { .. } if params.language != "en" => {
                Err(format!("{} speaks English only (language=en); language '{}' needs the Multilingual model", self.variant(), params.language).into())
            }
            SpeechGenerator::Gpt2 { .. } => {
                // As the reference's Turbo generate: accepted, ignored, said once.
                let d = SynthesisParams::default();
                let ignored: Vec<&str> = [
                    ("cfg_weight", params.cfg_weight != d.cfg_weight),
                    ("exaggeration", params.exaggeration != d.exaggeration),
                    ("min_p", params.min_p != d.min_p),
                ]
                .into_iter()
                .filter_map(|(name, set)| set.then_some(name))
                .collect();
                if !ignored.is_empty() {
                    tracing::warn!(variant = self.variant(), "{} apply to Multilingual only and are ignored", ignored.join(", "));
                }
                Ok(())
            }
            SpeechGenerator::Llama { .. } => {
                multilingual::check_language(&params.language)?;
                params.guided_sampling().map(|_| ())
            }
        }
    }

    pub fn synthesize(&mut self, text: &str, params: &SynthesisParams) -> Result<Synthesis> {
        let mut samples = Vec::new();
        let StreamedTrace { timings, speech_tokens, text_ids } = self.run(text, params, &mut PieceSender::collecting(&mut samples), 0)?;
        Ok(Synthesis { samples, timings, speech_tokens, text_ids })
    }

    /// [`Self::synthesize`], handing audio to `out` as it is made, until
    /// `out` says stop: every `params.stream_tokens` speech tokens (the vocoder
    /// going on across them, `s3gen::stream`), or per text chunk when that is
    /// 0, holding back what the next piece still blends into. Returns the
    /// stage timings and each chunk's text ids and speech tokens.
    pub fn synthesize_streaming(&mut self, text: &str, params: &SynthesisParams, out: &mut PieceSender) -> Result<StreamedTrace> {
        self.run(text, params, out, params.stream_tokens)
    }

    /// Speed 1 is the model's audio as it is; another speed sends every piece
    /// through one [`TimeStretch`], so streamed pieces join to the one-shot samples.
    fn run(&mut self, text: &str, params: &SynthesisParams, out: &mut PieceSender, token_hop: usize) -> Result<StreamedTrace> {
        stretch::check_speed(params.speed as f64)?;
        if params.speed == 1.0 {
            return self.run_at_model_speed(text, params, out, token_hop);
        }
        let mut stretcher = TimeStretch::new(self.sample_rate(), params.speed as f64)?;
        let mut stretch_ms = 0f64;
        let mut trace = {
            let mut stretched = out.through(|piece| {
                let start = std::time::Instant::now();
                let piece = stretcher.push(piece);
                stretch_ms += start.elapsed().as_secs_f64() * 1e3;
                piece
            });
            let trace = self.run_at_model_speed(text, params, &mut stretched, token_hop)?;
            if stretched.cancelled {
                return Ok(trace);
            }
            trace
        };
        let start = std::time::Instant::now();
        let rest = stretcher.finish();
        trace.timings.add("time_stretch", stretch_ms + start.elapsed().as_secs_f64() * 1e3);
        out.send(&rest);
        Ok(trace)
    }

    fn run_at_model_speed(&mut self, text: &str, params: &SynthesisParams, out: &mut PieceSender, token_hop: usize) -> Result<StreamedTrace> {
        if text.trim().is_empty() {
            return Err("text is empty".into());
        }
        self.check_params(params)?;
        let chunks = text::split_sentences(text, params.max_chars);
        let draws = match &params.draws {
            Some(dir) => {
                if chunks.len() > 1 {
                    return Err(format!("recorded draws cover one chunk; the text splits into {} (raise max_chars)", chunks.len()).into());
                }
                Some(RecordedDraws::from_dir(dir)?)
            }
            None => None,
        };
        let mut timings = Timings::default();
        let voice = self.voice(&params.voice, &mut timings)?;
        // Tokenize every chunk first, so a text problem fails before any compute.
        let encoded: Vec<Vec<i32>> = chunks.iter().map(|c| self.t3.encode(c, params, &voice.t3)).collect::<Result<_>>()?;
        // The memory plan sizes T3's prompt for chunks of at most this many tokens.
        if let Some(limit) = crate::memory::max_chunk_tokens(params.max_chars) {
            if let Some((i, ids)) = encoded.iter().enumerate().find(|(_, ids)| ids.len() > limit) {
                return Err(format!(
                    "text chunk {} makes {} tokens, more than the {limit} a chunk of max_chars={} may (4 per character)",
                    i + 1,
                    ids.len(),
                    params.max_chars
                )
                .into());
            }
        }
        let mut speech_tokens = Vec::new();
        let mut join = CrossfadeJoin::new((params.crossfade_ms.max(0.0) * self.sample_rate() as f32 / 1000.0) as usize);
        for (i, ids) in encoded.iter().enumerate() {
            let seed = params.seed.wrapping_add(i as u64);
            if token_hop > 0 && draws.is_none() {
                let mut chunk_out = ChunkOut { out: &mut *out, join: &mut join, starts_chunk: true, token_limit: params.max_new_tokens as u64, reported: 0 };
                let (tokens, going_on) = self.synthesize_chunk_streamed(ids, &voice, params, seed, token_hop, &mut timings, &mut chunk_out)?;
                speech_tokens.push(tokens);
                if !going_on {
                    break;
                }
                continue;
            }
            let (token_limit, mut reported) = (params.max_new_tokens as u64, 0);
            let mut on_token = |tokens: &[u32]| -> Result<bool> {
                reported = tokens.len();
                Ok(out.progress(SPEECH_TOKENS, reported as u64, token_limit))
            };
            let (wav, tokens) = self.synthesize_chunk(ids, &voice, params, seed, draws.as_ref(), &mut timings, &mut on_token)?;
            // The token that ends generation is not handed on; the count ends exact.
            if reported != tokens.len() {
                out.progress(SPEECH_TOKENS, tokens.len() as u64, token_limit);
            }
            speech_tokens.push(tokens);
            // A stop during T3 leaves no audio to send.
            if out.cancelled || !out.send(&join.push(&wav)) {
                break;
            }
        }
        out.send(&join.finish());
        // Every token after the first costs one decode step.
        let steps: usize = speech_tokens.iter().map(|t| t.len().saturating_sub(1)).sum();
        let decode_ms = timings.get("t3.decode").unwrap_or(0.0);
        timings.add("t3.ms_per_token", decode_ms / steps.max(1) as f64);
        // The chunks a stopped stream never reached have no speech tokens; their ids are left out too.
        let mut text_ids = encoded;
        text_ids.truncate(speech_tokens.len());
        Ok(StreamedTrace { timings, speech_tokens, text_ids })
    }

    /// One text chunk streamed as T3 generates: after `stream_first_tokens`
    /// speech tokens, then every `hop` (the last `pre_lookahead` tokens held
    /// back: the encoder has not seen what follows them), S3Gen's next block
    /// ([`TokenChunker`]) goes to the vocoder stream. On a device where S3Gen
    /// has a stream of its own, the blocks run on a worker thread while T3
    /// goes on; the pieces are handed on in order as T3's steps find them
    /// done. Each token is reported to `out` as progress. Returns the tokens
    /// and whether `out` wants more.
    #[allow(clippy::too_many_arguments)]
    fn synthesize_chunk_streamed(
        &mut self,
        ids: &[i32],
        voice: &Voice,
        params: &SynthesisParams,
        seed: u64,
        hop: usize,
        timings: &mut Timings,
        out: &mut ChunkOut,
    ) -> Result<(Vec<u32>, bool)> {
        let codes_of = self.t3.code_reader(self.s3gen.hp.speech_vocab as u32);
        let overlap = params.stream_beside_t3 && self.s3gen_stream.is_some();
        let (t3, s3) = (&mut self.t3, &mut self.s3gen);
        let (chunker, mut due) = TokenChunker::new(s3, voice, params, seed, hop, self.stream.take())?;
        let stop = AtomicBool::new(false);
        let mut going_on = true;
        let (tokens, end) = std::thread::scope(|scope| -> Result<_> {
            let (mut runner, worker) = if overlap {
                let (runner, worker) = BlockRunner::spawn(scope, chunker, s3, &stop)?;
                (runner, Some(worker))
            } else {
                (BlockRunner::inline(chunker, s3), None)
            };
            let generated = {
                let mut on_token = |tokens: &[u32]| -> Result<bool> {
                    going_on = out.tokens(tokens.len());
                    if going_on {
                        let codes = codes_of.read(tokens, false);
                        if due.take(codes.len()) {
                            runner.submit(codes, false)?;
                        }
                        going_on = out.audio_from(&mut runner, false)?;
                    }
                    Ok(going_on)
                };
                t3.generate(ids, &voice.t3, params, UniformSource::seeded(seed), timings, &mut on_token)
            };
            // The token that ends generation is not handed to `on_token`; the count ends exact.
            let finished = generated.and_then(|tokens| {
                going_on = going_on && out.tokens(tokens.len());
                if going_on {
                    let codes = codes_of.read(&tokens, true);
                    if codes.is_empty() {
                        return Err(format!("T3 produced no speech tokens ({} tokens, none a speech code)", tokens.len()).into());
                    }
                    runner.submit(codes, true)?;
                    going_on = out.audio_from(&mut runner, true)?;
                }
                Ok(tokens)
            });
            if finished.is_err() || !going_on {
                runner.stop();
            }
            let end = match worker {
                Some(worker) => {
                    drop(runner);
                    Some(worker.join().map_err(|panic| {
                        let what = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned());
                        Error::msg(format!("internal error: the S3Gen block worker panicked: {}", what.as_deref().unwrap_or("(no message)")))
                    })?)
                }
                None => runner.into_inline_end(),
            };
            Ok((finished?, end))
        })?;
        if let Some((chunker, stage_ms)) = end {
            for (stage, ms) in &stage_ms.entries {
                timings.add(stage, *ms);
            }
            self.stream = chunker.into_blocks();
        }
        Ok((tokens, going_on))
    }

    /// One text chunk in one piece: T3's tokens (each handed to `on_token`,
    /// which may stop generation), then S3Gen over all of them. A stop leaves
    /// no audio.
    #[allow(clippy::too_many_arguments)]
    fn synthesize_chunk(
        &mut self,
        ids: &[i32],
        voice: &Voice,
        params: &SynthesisParams,
        seed: u64,
        draws: Option<&RecordedDraws>,
        timings: &mut Timings,
        on_token: &mut OnToken<'_>,
    ) -> Result<(Vec<f32>, Vec<u32>)> {
        let uniforms = match draws.and_then(|d| d.t3_uniforms.clone()) {
            Some(u) => UniformSource::recorded(u),
            None => UniformSource::seeded(seed),
        };
        let mut stopped = false;
        let tokens = self.t3.generate(ids, &voice.t3, params, uniforms, timings, &mut |tokens: &[u32]| {
            let going_on = on_token(tokens)?;
            stopped = !going_on;
            Ok(going_on)
        })?;
        if stopped {
            return Ok((Vec::new(), tokens));
        }
        let s3 = &mut self.s3gen;
        let codes = self.t3.speech_codes(&tokens, s3.hp.speech_vocab as u32);
        if codes.is_empty() {
            return Err(format!("T3 produced no speech tokens ({} tokens, none a speech code)", tokens.len()).into());
        }
        let mut speech: Vec<i32> = voice.s3gen.prompt_token.clone();
        speech.extend(codes);

        let encoded = timings.time("s3gen.encoder", || s3.encode(&speech))?;
        let mel_ch = s3.hp.mel_channels;
        let frames = encoded.frames;
        let prompt_frames = voice.s3gen.prompt_feat.len() / mel_ch;
        if prompt_frames >= frames {
            return Err(format!("the voice's prompt has {prompt_frames} mel frames, the encoder produced only {frames}").into());
        }
        let spks = s3.speaker_projection(&voice.s3gen.embedding)?;
        // The CFM's `cond`: the voice's mel over the prompt frames, zeros after.
        let mut cond = vec![0f32; frames * mel_ch];
        cond[..prompt_frames * mel_ch].copy_from_slice(&voice.s3gen.prompt_feat);
        let speech_tokens = speech.len() - voice.s3gen.prompt_token.len();
        let z = match draws.map(|d| d.cfm_z(mel_ch, frames, prompt_frames, speech_tokens)).transpose()?.flatten() {
            Some(z) => z,
            None => Xoshiro256::new(seed ^ 0x5EED_CF31).gaussians(frames * mel_ch),
        };
        let steps = params.cfm_steps.unwrap_or(s3.hp.n_timesteps);
        let (harmonics, per_frame) = (s3.hp.hift.harmonics, s3.hp.hift.samples_per_frame());
        let samples = (frames - prompt_frames) * per_frame;
        let recorded_noise = draws.map(|d| d.source_noise(harmonics + 1, per_frame, frames - prompt_frames, speech_tokens)).transpose()?.flatten();
        let noise_seed = seed ^ 0x50_0C3E;
        // While a GPU integrates the CFM, the host draws HiFT's source noise
        // (the same draws either way); on the CPU backend it waits its turn.
        // The buffers are allocated here, on the calling thread.
        let seeded = recorded_noise.is_none();
        let overlap = seeded && !s3.runs_on_host();
        let mut noise = recorded_noise.unwrap_or_else(|| SourceNoise::zeroed(harmonics, samples));
        let x = std::thread::scope(|scope| {
            let drawing = overlap.then(|| scope.spawn(|| noise.draw_seeded(noise_seed)));
            let x = timings.time("s3gen.cfm", || s3.integrate(&z, &encoded.mu, &spks, &cond, steps));
            if let Some(drawing) = drawing {
                drawing.join().map_err(|_| Error::msg("drawing HiFT's source noise failed"))?;
            }
            x
        })?;
        if seeded && !overlap {
            noise.draw_seeded(noise_seed);
        }
        let mel = &x[prompt_frames * mel_ch..];
        let trim = s3.hp.hift.trim_fade_samples;
        let out = timings.time("hift", || s3.vocode(mel, &noise))?;
        let mut wav = out.wav;
        apply_trim_fade(&mut wav, trim);
        Ok((wav, tokens))
    }
}

/// What T3's progress is reported as ([`PieceSender::progress`]).
const SPEECH_TOKENS: &str = "speech tokens";

/// Where a streamed chunk's audio and T3's progress go: the stream's sender,
/// the audio through the crossfade join between chunks.
struct ChunkOut<'s, 'a> {
    out: &'s mut PieceSender<'a>,
    join: &'s mut CrossfadeJoin,
    /// The next piece is the chunk's first (the join blends it into the last chunk's tail).
    starts_chunk: bool,
    token_limit: u64,
    /// The last count reported.
    reported: usize,
}

impl ChunkOut<'_, '_> {
    /// `done` speech tokens of this chunk are generated (a count already
    /// reported is not repeated); false: stop.
    fn tokens(&mut self, done: usize) -> bool {
        if done == self.reported {
            return !self.out.cancelled;
        }
        self.reported = done;
        self.out.progress(SPEECH_TOKENS, done as u64, self.token_limit)
    }

    /// Every piece `runner` has finished (with `wait`, every one still to
    /// come), in order; false: stop.
    fn audio_from(&mut self, runner: &mut BlockRunner, wait: bool) -> Result<bool> {
        while let Some(piece) = runner.next_piece(wait)? {
            if !self.audio(&piece) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// A piece of the chunk's audio; false: stop.
    fn audio(&mut self, piece: &[f32]) -> bool {
        let sent = self.out.send(&self.join.push_piece(piece, self.starts_chunk));
        self.starts_chunk = false;
        sent
    }
}

/// The CFM's Euler steps when streaming: `stream_cfm_steps`, else one for
/// the meanflow decoder (distilled for one step), else `cfm_steps`.
pub fn stream_cfm_steps(hp: &crate::hparams::S3GenHparams, params: &SynthesisParams) -> usize {
    params.stream_cfm_steps.or(if hp.meanflow { Some(1) } else { params.cfm_steps }).unwrap_or(hp.n_timesteps)
}

/// The shape of a streamed chunk after a voice prompt of `prompt_tokens`
/// codes (already cut to `stream_prompt_tokens`), with hops of `first`, then
/// `hop` codes: what its [`BlockStream`] holds.
pub fn stream_shape(prompt_tokens: usize, params: &SynthesisParams, first: usize, hop: usize, steps: usize) -> StreamShape {
    StreamShape {
        prompt_tokens,
        // T3 may end one token past its budget; Turbo's silence follows.
        max_codes: params.max_new_tokens + 1 + crate::speech_tokens::SILENCE_CODES,
        first,
        hop,
        context_tokens: params.stream_context_tokens,
        steps,
    }
}

/// `[rows][cols]` → `[cols][rows]`.
pub fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..cols).flat_map(|c| (0..rows).map(move |r| v[r * cols + c])).collect()
}

/// Appends `next`, overlapping its first `fade` samples with the tail of
/// `out` under a linear crossfade.
/// Text chunks joined with a crossfade of `fade` samples as they arrive: each
/// push returns the samples no later chunk can change, and holds back the
/// tail the next one blends into.
struct CrossfadeJoin {
    fade: usize,
    tail: Vec<f32>,
}

impl CrossfadeJoin {
    fn new(fade: usize) -> Self {
        CrossfadeJoin { fade, tail: Vec::new() }
    }

    /// Adds a chunk; returns the samples now final. The held tail is the last
    /// `min(fade, everything so far)` samples, which is all [`join_crossfade`]
    /// reads of what came before.
    fn push(&mut self, next: &[f32]) -> Vec<f32> {
        join_crossfade(&mut self.tail, next, self.fade);
        let keep = self.fade.min(self.tail.len());
        self.tail.drain(..self.tail.len() - keep).collect()
    }

    /// Adds a piece of a chunk's audio (`starts_chunk`: its first, which
    /// blends into the held tail; later ones follow on); returns the samples
    /// now final. Whole chunks pushed as single pieces join as [`Self::push`].
    fn push_piece(&mut self, piece: &[f32], starts_chunk: bool) -> Vec<f32> {
        if starts_chunk {
            return self.push(piece);
        }
        self.tail.extend_from_slice(piece);
        let keep = self.fade.min(self.tail.len());
        self.tail.drain(..self.tail.len() - keep).collect()
    }

    /// The held tail, after the last chunk.
    fn finish(&mut self) -> Vec<f32> {
        std::mem::take(&mut self.tail)
    }
}

fn join_crossfade(out: &mut Vec<f32>, next: &[f32], fade: usize) {
    let fade = fade.min(out.len()).min(next.len());
    let start = out.len() - fade;
    for i in 0..fade {
        let w = (i as f32 + 0.5) / fade as f32;
        out[start + i] = out[start + i] * (1.0 - w) + next[i] * w;
    }
    out.extend_from_slice(&next[fade..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crossfade_overlaps_and_keeps_lengths() {
        let mut out = vec![1.0; 10];
        join_crossfade(&mut out, &[0.0; 10], 4);
        assert_eq!(out.len(), 16);
        assert_eq!(&out[..6], &[1.0; 6]);
        assert!(out[6..10].windows(2).all(|w| w[1] < w[0]));
        assert_eq!(&out[10..], &[0.0; 6]);
        let mut first = Vec::new();
        join_crossfade(&mut first, &[2.0; 3], 4);
        assert_eq!(first, vec![2.0; 3]);
    }

    #[test]
    fn a_streamed_join_hands_on_the_one_shot_samples() {
        let chunks: [Vec<f32>; 4] = [(0..10).map(|i| i as f32).collect(), vec![-1.0; 2], (0..7).map(|i| 0.5 * i as f32).collect(), vec![3.0; 9]];
        for fade in [0, 1, 4, 20] {
            let mut whole = Vec::new();
            let mut join = CrossfadeJoin::new(fade);
            let mut streamed = Vec::new();
            for c in &chunks {
                join_crossfade(&mut whole, c, fade);
                streamed.extend(join.push(c));
            }
            streamed.extend(join.finish());
            assert_eq!(streamed, whole, "fade {fade}");
        }
    }

    #[test]
    fn gaussian_draws_have_unit_variance() {
        let g = Xoshiro256::new(3).gaussians(20000);
        let mean = g.iter().sum::<f32>() / g.len() as f32;
        let var = g.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / g.len() as f32;
        assert!(mean.abs() < 0.03 && (var - 1.0).abs() < 0.05, "mean {mean}, variance {var}");
    }
}
