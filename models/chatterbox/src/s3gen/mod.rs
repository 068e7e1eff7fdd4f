//! S3Gen: speech tokens → mel (flow encoder, then the CFM decoder) and the
//! HiFT vocoder. This module owns the runtime: weights, the built-in voice,
//! cached graphs per shape.

pub mod blocks;
pub mod cfm;
pub mod encoder;
pub mod hift;
pub mod source;
pub mod stream;

use crate::hparams::{S3GenHparams, S3GEN_ARCH};
use engine_core::model_kit::builder::compute_graph;
use engine_core::model_kit::Result;
use engine_core::model_kit::{OpPolicy, Weights};
use ggml_sys::gguf::GgufTensors;
use ggml_sys::{Backend, GraphSlot};
use std::path::Path;

/// Upper bound on nodes of one S3Gen graph.
pub(crate) const MAX_NODES: usize = 16384;

/// A voice's S3Gen conditioning (the reference's `ref_dict`).
#[derive(Debug, Clone, PartialEq)]
pub struct S3GenConditioning {
    /// Speech tokens of the reference audio, placed before the generated ones.
    pub prompt_token: Vec<i32>,
    /// Mel frames of the reference audio, `[frames][mel_channels]`, flattened.
    pub prompt_feat: Vec<f32>,
    /// x-vector speaker embedding.
    pub embedding: Vec<f32>,
}

/// HiFT's stages for one mel.
pub struct VocoderOutput {
    /// Hz per mel frame.
    pub f0: Vec<f32>,
    /// The excitation, one value per output sample.
    pub source: Vec<f32>,
    /// The clamped waveform (before the trim fade).
    pub wav: Vec<f32>,
}

/// What the flow encoder produces for `prompt + speech` tokens.
pub struct EncoderOutput {
    /// `[frames][n_embd]`, flattened.
    pub hidden: Vec<f32>,
    /// `[frames][mel_channels]`, flattened: the CFM's `mu`.
    pub mu: Vec<f32>,
    pub frames: usize,
}

pub(crate) fn is_matmul_weight(name: &str) -> bool {
    (name.starts_with("enc.") || name.starts_with("flow."))
        && name.ends_with(".weight")
        && !name.contains("norm")
        && !name.contains("embed.out.1")
        && !name.contains("input_embedding")
        && !name.contains(".conv")
}

/// Everything checked about an S3Gen file before any weight is read, without
/// a device: architecture, hparams, the tensor table, the built-in voice's tokens.
pub fn check_file(gguf: &GgufTensors) -> Result<(S3GenHparams, engine_core::model_kit::TensorTable)> {
    engine_core::model_kit::require_architecture(&gguf.file, S3GEN_ARCH, "a Chatterbox S3Gen model")?;
    let hp = S3GenHparams::load(&gguf.file)?;
    let mut table = crate::tensors::s3gen_table(&hp);
    table.check(gguf)?;
    crate::t3::check_tokens(gguf, crate::tensors::S3_PROMPT_TOKEN, hp.speech_vocab)?;
    Ok((hp, table))
}

/// Every tensor a full load derives from the weights: HiFT's snake
/// reciprocals and STFT bases, then CAMPPlus's and the S3Tokenizer's.
pub(crate) fn derived_tensors(weights: &Weights, hp: &S3GenHparams) -> Result<Vec<engine_core::model_kit::DerivedTensor>> {
    let mut derived = hift::snake_reciprocals(weights)?;
    derived.extend(hift::stft_bases(&hp.hift));
    derived.extend(cloning_derived(weights, hp)?);
    Ok(derived)
}

/// The tensors CAMPPlus and the S3Tokenizer derive at load from their weights.
fn cloning_derived(weights: &Weights, hp: &S3GenHparams) -> Result<Vec<engine_core::model_kit::DerivedTensor>> {
    let mut derived = crate::cloning::campplus::fold_batch_norms(weights, &hp.campplus)?;
    derived.extend(crate::cloning::campplus::local_taps(weights, &hp.campplus)?);
    derived.extend(crate::cloning::s3tokenizer::fsmn_taps(weights, &hp.tokenizer)?);
    Ok(derived)
}

/// Which of HiFT's graphs a run uses: the whole utterance's, or those of a
/// kind of streamed window (each kept for the next window of its kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocoderGraphs {
    Whole,
    Window(blocks::BlockKind),
}

pub struct S3Gen {
    // Graphs reference the weights: declared (dropped) first.
    encoder_graph: GraphSlot<usize>,
    /// Keyed by (frames, rows).
    cfm_graph: GraphSlot<(usize, usize)>,
    /// HiFT's over a whole utterance, by mel frames.
    f0_graph: GraphSlot<usize>,
    hift_graph: GraphSlot<usize>,
    /// HiFT's over a streamed chunk's windows, one per kind of block.
    window_f0_graphs: blocks::KindSlots<usize>,
    window_hift_graphs: blocks::KindSlots<usize>,
    /// CAMPPlus's, by fbank frames.
    campplus_graph: GraphSlot<usize>,
    /// The S3Tokenizer's, by mel frames (the T3 prompt's and S3Gen's lengths).
    tokenizer_graph: GraphSlot<usize>,
    weights: Weights,
    backend: Backend,
    pub hp: S3GenHparams,
    /// The source's merge layer (9 → 1), read once for the host-side excitation.
    source_merge: (Vec<f32>, f32),
    /// `spk_embed_affine_layer` (weight, bias), read once for the host-side projection.
    speaker_affine: (Vec<f32>, Vec<f32>),
    policy: OpPolicy,
    /// Loaded for cloning only: each of CAMPPlus's and the S3Tokenizer's
    /// graphs is dropped after its run, so that no stage's buffer sits beside
    /// the next one's (what sets the peak of `tts voice save`). A model that
    /// synthesizes keeps them for the next text.
    cloning_only: bool,
    /// The encoder's relative-position tables by length (tokens, frames) of
    /// the last shape: hundreds of thousands of sines, the same for every
    /// text of that length.
    position_tables: Vec<(usize, std::sync::Arc<[f32]>)>,
}

impl S3Gen {
    pub fn load(path: &Path, backend: Backend, policy: &OpPolicy) -> Result<Self> {
        let gguf = GgufTensors::open(path)?;
        let (hp, table) = check_file(&gguf)?;
        let mut weights = Weights::load(gguf, &backend, table, policy.matmul_weights, is_matmul_weight)?;
        let derived = derived_tensors(&weights, &hp)?;
        weights.add_derived(&backend, derived)?;
        let source_merge = (weights.host_f32("hift.m_source.l_linear.weight")?, weights.host_f32("hift.m_source.l_linear.bias")?[0]);
        let speaker_affine = (weights.host_f32("flow.spk_embed_affine_layer.weight")?, weights.host_f32("flow.spk_embed_affine_layer.bias")?);
        Ok(Self::assemble(weights, backend, hp, policy, source_merge, speaker_affine, false))
    }

    /// The file checked whole as [`load`](Self::load) checks it, and only
    /// CAMPPlus's and the S3Tokenizer's weights read
    /// ([`crate::tensors::is_s3gen_cloning_tensor`]): an S3Gen that computes
    /// x-vectors and speech tokens (`xvector`, `speech_token_projection`)
    /// and nothing else (the flow encoder, the CFM decoder and HiFT would
    /// fail on their first weight).
    pub fn load_for_cloning(path: &Path, backend: Backend, policy: &OpPolicy) -> Result<Self> {
        let gguf = GgufTensors::open(path)?;
        let (hp, table) = check_file(&gguf)?;
        let mut weights = Weights::load_part(gguf, &backend, table, policy.matmul_weights, is_matmul_weight, crate::tensors::is_s3gen_cloning_tensor)?;
        let derived = cloning_derived(&weights, &hp)?;
        weights.add_derived(&backend, derived)?;
        Ok(Self::assemble(weights, backend, hp, policy, (Vec::new(), 0.0), (Vec::new(), Vec::new()), true))
    }

    fn assemble(
        weights: Weights,
        backend: Backend,
        hp: S3GenHparams,
        policy: &OpPolicy,
        source_merge: (Vec<f32>, f32),
        speaker_affine: (Vec<f32>, Vec<f32>),
        cloning_only: bool,
    ) -> Self {
        S3Gen {
            encoder_graph: GraphSlot::default(),
            cfm_graph: GraphSlot::default(),
            f0_graph: GraphSlot::default(),
            hift_graph: GraphSlot::default(),
            window_f0_graphs: Default::default(),
            window_hift_graphs: Default::default(),
            campplus_graph: GraphSlot::default(),
            tokenizer_graph: GraphSlot::with_capacity(2),
            weights,
            backend,
            hp,
            source_merge,
            speaker_affine,
            policy: policy.clone(),
            cloning_only,
            position_tables: Vec::new(),
        }
    }

    /// Whether S3Gen's graphs run on the host's cores (the CPU backend): host
    /// work done beside them would compete with them for those cores.
    /// Whether S3Gen computes on a GPU (discrete or integrated).
    pub fn on_gpu(&self) -> bool {
        self.backend.device().is_some_and(|d| d.is_gpu())
    }

    pub fn runs_on_host(&self) -> bool {
        self.backend.device().is_none_or(|d| d.kind() == ggml_sys::DeviceKind::Cpu)
    }

    /// Device bytes of the weights, derived tensors included.
    pub fn weight_bytes(&self) -> usize {
        self.weights.buffer_bytes() + self.weights.derived_bytes()
    }

    /// The graphs built so far, by stage (census tests).
    pub fn graphs(&self) -> Vec<(&'static str, &ggml_sys::ComputeGraph)> {
        let graphs = [
            ("s3gen.encoder", self.encoder_graph.graph()),
            ("s3gen.cfm", self.cfm_graph.graph()),
            ("hift.f0", self.f0_graph.graph()),
            ("hift", self.hift_graph.graph()),
            ("campplus", self.campplus_graph.graph()),
            ("s3tokenizer", self.tokenizer_graph.graph()),
        ];
        graphs.into_iter().filter_map(|(name, graph)| graph.map(|g| (name, g))).collect()
    }

    /// The built-in voice (`voice.builtin.*`, from `conds.pt`).
    pub fn builtin_voice(&self) -> Result<S3GenConditioning> {
        Ok(S3GenConditioning {
            prompt_token: self.weights.host_i32(crate::tensors::S3_PROMPT_TOKEN)?,
            prompt_feat: self.weights.host_f32(crate::tensors::S3_PROMPT_FEAT)?,
            embedding: self.weights.host_f32(crate::tensors::S3_EMBEDDING)?,
        })
    }

    /// CAMPPlus on a mean-subtracted fbank (`cloning::features::campplus_fbank`):
    /// the x-vector, `speaker_dim` values.
    pub fn xvector(&mut self, fbank: &crate::cloning::features::Features) -> Result<Vec<f32>> {
        use crate::cloning::campplus;
        let c = &self.hp.campplus;
        if fbank.dims != c.feat_dim {
            return Err(format!("CAMPPlus takes {} fbank bins, got {}", c.feat_dim, fbank.dims).into());
        }
        // The unbiased deviation over time needs two frames after the TDNN.
        if campplus::tdnn_frames(c, fbank.frames) < 2 {
            return Err(format!("CAMPPlus needs a longer recording than {} fbank frames", fbank.frames).into());
        }
        let frames = fbank.frames;
        let mut time_first = vec![0.0; fbank.data.len()];
        for (t, row) in fbank.data.chunks_exact(fbank.dims).enumerate() {
            row.iter().enumerate().for_each(|(f, &v)| time_first[f * frames + t] = v);
        }
        let scale = campplus::segment_scale(c, campplus::tdnn_frames(c, frames));
        let graph = self.campplus_graph.get_or_build(frames, || {
            compute_graph(&self.backend, &self.weights, &self.policy, campplus::max_nodes(&self.hp.campplus), "CAMPPlus", |b| {
                campplus::build(&b, &self.hp.campplus, frames)
            })
        })?;
        graph.set_f32(campplus::FBANK, &time_first)?;
        graph.set_f32(campplus::SEGMENT_SCALE, &scale)?;
        let xvector = graph.compute_and_get_f32(&self.backend, campplus::XVECTOR);
        if self.cloning_only {
            self.campplus_graph.clear();
        }
        engine_core::model_kit::finite::check_stage("CAMPPlus", xvector?)
    }

    /// The S3Tokenizer up to FSQ's projection on a log mel
    /// (`cloning::features::s3tokenizer_log_mel`): `[token][fsq_dims]`; see
    /// `cloning::s3tokenizer::quantize` for the tokens.
    pub fn speech_token_projection(&mut self, mel: &crate::cloning::features::Features) -> Result<Vec<f32>> {
        use crate::cloning::s3tokenizer;
        let tok = &self.hp.tokenizer;
        if mel.dims != tok.n_mels || mel.frames == 0 {
            return Err(format!("the S3Tokenizer takes {} mel bins, got {} frames of {}", tok.n_mels, mel.frames, mel.dims).into());
        }
        let (frames, tokens) = (mel.frames, s3tokenizer::token_count(mel.frames));
        if tokens > tok.rope_positions {
            return Err(format!(
                "the S3Tokenizer takes at most {} tokens ({} s of audio), the recording gives {tokens}",
                tok.rope_positions,
                tok.rope_positions / 25
            )
            .into());
        }
        let graph = self.tokenizer_graph.get_or_build(frames, || {
            compute_graph(&self.backend, &self.weights, &self.policy, s3tokenizer::max_nodes(&self.hp.tokenizer), "the S3Tokenizer", |b| {
                s3tokenizer::build(&b, &self.hp.tokenizer, frames)
            })
        })?;
        graph.set_f32(s3tokenizer::MEL, &mel.data)?;
        graph.set_i32(s3tokenizer::POSITIONS, &(0..tokens as i32).collect::<Vec<_>>())?;
        let projection = graph.compute_and_get_f32(&self.backend, s3tokenizer::PROJECTION);
        if self.cloning_only {
            self.tokenizer_graph.clear();
        }
        engine_core::model_kit::finite::check_stage("the S3Tokenizer", projection?)
    }

    /// Runs the flow encoder over `tokens` (prompt tokens first).
    pub fn encode(&mut self, tokens: &[i32]) -> Result<EncoderOutput> {
        let n = tokens.len();
        if n == 0 {
            return Err("S3Gen got no speech tokens".into());
        }
        if let Some(t) = tokens.iter().find(|&&t| t < 0 || t as usize >= self.hp.speech_vocab) {
            return Err(format!("speech token {t} is outside S3Gen's vocabulary of {}", self.hp.speech_vocab).into());
        }
        let (d, frames) = (self.hp.encoder.n_embd, n * self.hp.encoder.up_stride);
        let (pos, up_pos) = (self.position_table(d, n), self.position_table(d, frames));
        let graph = self.encoder_graph.get_or_build(n, || {
            compute_graph(&self.backend, &self.weights, &self.policy, MAX_NODES, "the S3Gen encoder", |b| encoder::build(&b, &self.hp, n))
        })?;
        graph.set_i32(encoder::TOKENS, tokens)?;
        graph.set_f32(encoder::POS_EMB, &pos)?;
        graph.set_f32(encoder::UP_POS_EMB, &up_pos)?;
        graph.compute(&self.backend)?;
        let hidden = engine_core::model_kit::finite::check_stage("the S3Gen encoder", graph.get_f32(encoder::ENCODER_OUT)?)?;
        let mu = engine_core::model_kit::finite::check_stage("the S3Gen encoder", graph.get_f32(encoder::MU)?)?;
        Ok(EncoderOutput { hidden, mu, frames })
    }

    /// `encoder::relative_positions(d, t)`, computed once per length while the
    /// encoder keeps running the same shape.
    fn position_table(&mut self, d: usize, t: usize) -> std::sync::Arc<[f32]> {
        if let Some((_, table)) = self.position_tables.iter().find(|(len, _)| *len == t) {
            return table.clone();
        }
        let table: std::sync::Arc<[f32]> = encoder::relative_positions(d, t).into();
        // Two lengths per shape (tokens and frames); an older shape's go.
        if self.position_tables.len() >= 2 {
            self.position_tables.remove(0);
        }
        self.position_tables.push((t, table.clone()));
        table
    }

    /// One estimator evaluation over one row. Every array is
    /// `[frames][mel_channels]` flattened (`spks` one row); returns the
    /// velocity in the same layout. `r` is read by the meanflow decoder only.
    pub fn velocity(&mut self, x: &[f32], mu: &[f32], spks: &[f32], cond: &[f32], t: f32, r: f32) -> Result<Vec<f32>> {
        self.check_cfm_inputs(x, mu, spks, cond)?;
        self.estimate(1, x, mu, spks, cond, t, r)
    }

    /// The estimator's conditional and unconditional rows for classifier-free
    /// guidance, as one batch of two: both rows take `x` and `t`; the
    /// unconditional one has `mu`, `spks` and `cond` zeroed, as the reference
    /// fills its second row.
    pub fn guided_velocities(&mut self, x: &[f32], mu: &[f32], spks: &[f32], cond: &[f32], t: f32) -> Result<[Vec<f32>; 2]> {
        self.check_cfm_inputs(x, mu, spks, cond)?;
        let with_zero_row = |a: &[f32]| [a, &vec![0.0; a.len()]].concat();
        let both = self.estimate(2, &[x, x].concat(), &with_zero_row(mu), &with_zero_row(spks), &with_zero_row(cond), t, t)?;
        let (cond_row, uncond_row) = both.split_at(x.len());
        Ok([cond_row.to_vec(), uncond_row.to_vec()])
    }

    fn check_cfm_inputs(&self, x: &[f32], mu: &[f32], spks: &[f32], cond: &[f32]) -> Result<()> {
        let mel = self.hp.mel_channels;
        if x.is_empty() || !x.len().is_multiple_of(mel) || mu.len() != x.len() || cond.len() != x.len() || spks.len() != mel {
            return Err(
                format!("CFM inputs disagree: x {}, mu {}, cond {}, spks {} values for {mel} mel channels", x.len(), mu.len(), cond.len(), spks.len()).into()
            );
        }
        Ok(())
    }

    /// The estimator over `rows` rows stacked in each array.
    #[allow(clippy::too_many_arguments)]
    fn estimate(&mut self, rows: usize, x: &[f32], mu: &[f32], spks: &[f32], cond: &[f32], t: f32, r: f32) -> Result<Vec<f32>> {
        let frames = x.len() / (rows * self.hp.mel_channels);
        let graph = self.cfm_graph.get_or_build((frames, rows), || {
            compute_graph(&self.backend, &self.weights, &self.policy, MAX_NODES, "the CFM", |b| cfm::build(&b, &self.hp, frames, rows))
        })?;
        let c = &self.hp.cfm;
        let set = |name: &str, v: &[f32]| graph.set_f32(name, v);
        set(cfm::X, x)?;
        set(cfm::MU, mu)?;
        set(cfm::SPKS, spks)?;
        set(cfm::COND, cond)?;
        set(cfm::T_EMB, &cfm::time_embedding(c.in_channels, c.time_scale, t))?;
        if self.hp.meanflow {
            set(cfm::R_EMB, &cfm::time_embedding(c.in_channels, c.time_scale, r))?;
        }
        engine_core::model_kit::finite::check_stage("the CFM", graph.compute_and_get_f32(&self.backend, cfm::VELOCITY)?)
    }

    /// The decoder's `steps + 1` time points: uniform for meanflow, the
    /// cosine schedule `1 − cos(π/2 · t)` for the standard decoder.
    pub fn schedule(&self, steps: usize) -> Vec<f32> {
        cfm::schedule(steps, !self.hp.meanflow)
    }

    /// Euler integration from `x0` over [`Self::schedule`]: at each step
    /// (t, r), `x += (r − t)·v`, where v is the meanflow velocity at (t, r),
    /// or the standard decoder's guided `(1 + w)·v_cond − w·v_uncond` at t
    /// (w = the file's `cfg_rate`; one row when it is 0). Returns the final state.
    pub fn integrate(&mut self, x0: &[f32], mu: &[f32], spks: &[f32], cond: &[f32], steps: usize) -> Result<Vec<f32>> {
        let schedule = self.schedule(steps);
        let w = self.hp.cfg_rate;
        let mut x = x0.to_vec();
        for span in schedule.windows(2) {
            let (t, r) = (span[0], span[1]);
            let v = if self.hp.meanflow || w == 0.0 {
                self.velocity(&x, mu, spks, cond, t, r)?
            } else {
                let [cond_v, uncond_v] = self.guided_velocities(&x, mu, spks, cond, t)?;
                cfm::combine_guidance(&cond_v, &uncond_v, w)
            };
            let dt = r - t;
            x.iter_mut().zip(&v).for_each(|(a, b)| *a += dt * b);
        }
        Ok(x)
    }

    fn mel_frames(&self, mel: &[f32]) -> Result<usize> {
        let channels = self.hp.mel_channels;
        let frames = mel.len() / channels;
        if frames == 0 || mel.len() != frames * channels {
            return Err(format!("the mel has {} values, not whole frames of {channels} channels", mel.len()).into());
        }
        Ok(frames)
    }

    /// HiFT's F0 predictor: Hz per frame of a mel `[frames][mel_channels]`.
    pub fn predict_f0(&mut self, mel: &[f32]) -> Result<Vec<f32>> {
        self.predict_f0_with(VocoderGraphs::Whole, mel)
    }

    /// [`Self::predict_f0`] on the graphs `graphs` names.
    pub fn predict_f0_with(&mut self, graphs: VocoderGraphs, mel: &[f32]) -> Result<Vec<f32>> {
        let frames = self.mel_frames(mel)?;
        let slot = match graphs {
            VocoderGraphs::Whole => &mut self.f0_graph,
            VocoderGraphs::Window(kind) => &mut self.window_f0_graphs[kind.index()],
        };
        let graph = slot.get_or_build(frames, || {
            compute_graph(&self.backend, &self.weights, &self.policy, MAX_NODES, "HiFT's F0 predictor", |b| {
                hift::build_f0(&b, &self.hp.hift, self.hp.mel_channels, frames)
            })
        })?;
        graph.set_f32(hift::MEL, mel)?;
        engine_core::model_kit::finite::check_stage("HiFT's F0 predictor", graph.compute_and_get_f32(&self.backend, hift::F0)?)
    }

    /// The excitation for `f0` with the given random draws.
    pub fn excitation(&self, f0: &[f32], draws: &source::SourceNoise) -> Result<Vec<f32>> {
        let (weight, bias) = &self.source_merge;
        source::excitation(&self.hp.hift, f0, weight, *bias, draws)
    }

    /// [`Self::excitation`] of the frames after those `phase` covered.
    pub fn excitation_from(&self, f0: &[f32], draws: &source::SourceNoise, phase: &mut source::SourcePhase) -> Result<Vec<f32>> {
        let (weight, bias) = &self.source_merge;
        source::excitation_from(&self.hp.hift, f0, weight, *bias, draws, phase)
    }

    /// HiFT's decoder on a mel and its excitation, computed; the graph holds
    /// both outputs until the next run.
    fn run_hift(&mut self, graphs: VocoderGraphs, mel: &[f32], excitation: &[f32], output: &str) -> Result<Vec<f32>> {
        let frames = self.mel_frames(mel)?;
        let hp = &self.hp.hift;
        if excitation.len() != frames * hp.samples_per_frame() {
            return Err(format!("the excitation has {} samples, {frames} mel frames need {}", excitation.len(), frames * hp.samples_per_frame()).into());
        }
        let slot = match graphs {
            VocoderGraphs::Whole => &mut self.hift_graph,
            VocoderGraphs::Window(kind) => &mut self.window_hift_graphs[kind.index()],
        };
        let graph = slot.get_or_build(frames, || {
            compute_graph(&self.backend, &self.weights, &self.policy, MAX_NODES, "HiFT", |b| {
                hift::build_decoder(&b, &self.hp.hift, self.hp.mel_channels, frames)
            })
        })?;
        graph.set_f32(hift::MEL, mel)?;
        graph.set_f32(hift::SOURCE, excitation)?;
        let out = engine_core::model_kit::finite::check_stage("HiFT", graph.compute_and_get_f32(&self.backend, output)?)?;
        // The waveform's exp and clamp turn NaN into a bound: the body's output
        // is where a non-finite value still shows.
        if output != hift::CONV_POST {
            engine_core::model_kit::finite::check_values("HiFT", &graph.get_f32(hift::CONV_POST)?)?;
        }
        Ok(out)
    }

    /// HiFT's decoder body: mel + excitation → `conv_post` `[n_fft + 2][stft frames]`.
    pub fn hift_body(&mut self, mel: &[f32], excitation: &[f32]) -> Result<Vec<f32>> {
        self.run_hift(VocoderGraphs::Whole, mel, excitation, hift::CONV_POST)
    }

    /// HiFT's decoder down to the clamped waveform (before the trim fade).
    pub fn hift_waveform(&mut self, mel: &[f32], excitation: &[f32]) -> Result<Vec<f32>> {
        self.hift_waveform_with(VocoderGraphs::Whole, mel, excitation)
    }

    /// [`Self::hift_waveform`] on the graphs `graphs` names.
    pub fn hift_waveform_with(&mut self, graphs: VocoderGraphs, mel: &[f32], excitation: &[f32]) -> Result<Vec<f32>> {
        self.run_hift(graphs, mel, excitation, hift::WAV)
    }

    /// Device bytes of the vocoder's graphs over streamed windows.
    pub fn window_graph_bytes(&self) -> usize {
        blocks::kind_slot_bytes(&self.window_f0_graphs) + blocks::kind_slot_bytes(&self.window_hift_graphs)
    }

    /// The whole vocoder on a mel `[frames][mel_channels]`, with the source's random draws given.
    pub fn vocode(&mut self, mel: &[f32], draws: &source::SourceNoise) -> Result<VocoderOutput> {
        let f0 = self.predict_f0(mel)?;
        let excitation = self.excitation(&f0, draws)?;
        let wav = self.hift_waveform(mel, &excitation)?;
        Ok(VocoderOutput { f0, source: excitation, wav })
    }

    /// `spk_embed_affine_layer(normalize(embedding))`: the speaker vector the
    /// CFM decoder takes (small enough for the host).
    pub fn speaker_projection(&self, embedding: &[f32]) -> Result<Vec<f32>> {
        let (din, dout) = (self.hp.speaker_dim, self.hp.mel_channels);
        if embedding.len() != din {
            return Err(format!("the speaker embedding has {} values, S3Gen takes {din}", embedding.len()).into());
        }
        let (w, bias) = &self.speaker_affine;
        let norm = embedding.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
        Ok((0..dout).map(|o| bias[o] + (0..din).map(|i| w[o * din + i] * (embedding[i] / norm)).sum::<f32>()).collect())
    }
}
