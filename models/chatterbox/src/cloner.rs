//! A Chatterbox model loaded only to clone voices (the plugin's
//! `load_for_cloning`, what `tts voice save` asks for): the voice encoder's
//! weights from the T3 file, CAMPPlus's and the S3Tokenizer's from the S3Gen
//! file ([`crate::tensors::is_t3_cloning_tensor`],
//! [`crate::tensors::is_s3gen_cloning_tensor`]), and none of T3's transformer,
//! the flow encoder, the CFM decoder or HiFT. Both files are still checked
//! whole before a weight is read (metadata, pairing, tensor tables, built-in
//! tokens), and cloning runs the same code on the same weights as a fully
//! loaded model, so the voice file is byte for byte the one the full load
//! saves.

use crate::cloning::reference::{self, ReferenceRules};
use crate::cloning::voice_encoder::{VoiceEncoderGraphs, VoiceEncoding};
use crate::cloning::{self, voice_file, Voice};
use crate::hparams::T3Hparams;
use crate::model::ModelFiles;
use crate::s3gen::S3Gen;
use engine_core::model_kit::{Error, OpPolicy, Result, Timings, Weights};
use ggml_sys::gguf::GgufTensors;
use ggml_sys::Backend;
use std::path::{Path, PathBuf};

/// The T3 file's hparams and its voice encoder, without the transformer.
pub struct VoiceEncoderWeights {
    // The graphs reference the weights: declared (dropped) first.
    graphs: VoiceEncoderGraphs,
    weights: Weights,
    backend: Backend,
    hp: T3Hparams,
    policy: OpPolicy,
}

impl VoiceEncoderWeights {
    /// Checks the T3 file at `path` as [`crate::t3::T3::load`] does and reads
    /// the voice encoder's tensors only.
    pub fn load(path: &Path, backend: Backend, policy: &OpPolicy) -> Result<Self> {
        let gguf = GgufTensors::open(path)?;
        let (hp, table) = crate::t3::check_file(&gguf)?;
        // The voice encoder stays F32 whatever the weight policy (no matrix
        // goes to repacked buffers): its tensors are plain F32 in the table.
        let weights = Weights::load_part(gguf, &backend, table, policy.matmul_weights, |_| false, crate::tensors::is_t3_cloning_tensor)?;
        Ok(VoiceEncoderWeights { graphs: VoiceEncoderGraphs::default(), weights, backend, hp, policy: policy.clone() })
    }
}

impl VoiceEncoding for VoiceEncoderWeights {
    fn hp(&self) -> &T3Hparams {
        &self.hp
    }

    fn voice_encoder_partials(&mut self, batch: &[f32], partials: usize) -> Result<Vec<f32>> {
        self.graphs.run(&self.backend, &self.weights, &self.policy, &self.hp.voice_encoder, batch, partials)
    }
}

/// What a variant's `prepare_conditionals` does to a reference clip: Turbo's
/// and Nano's rules for a GPT-2 T3, Multilingual's for a guided one.
pub fn reference_rules(guided: bool) -> ReferenceRules {
    match guided {
        false => ReferenceRules::TURBO,
        true => ReferenceRules::MULTILINGUAL,
    }
}

/// A voice cloned from the recording at `path`: read as the reference reads
/// it, then the three encoders (timed as `clone.*` stages). Shared by the
/// full model and the [`Cloner`].
pub fn clone_voice(t3: &mut impl VoiceEncoding, s3: &mut S3Gen, rules: &ReferenceRules, path: &Path, timings: &mut Timings) -> Result<Voice> {
    let rate = s3.hp.hift.sample_rate;
    let wav = timings.time("clone.read", || reference::load(path, rate, rules))?;
    cloning::conditionals(t3, s3, &wav, timings).map_err(|e| Error::msg(format!("{}: {e}", path.display())))
}

/// A model that clones voices and does nothing else.
pub struct Cloner {
    encoder: VoiceEncoderWeights,
    s3gen: S3Gen,
    rules: ReferenceRules,
}

impl Cloner {
    /// Loads the cloning parts of the T3 file and the S3Gen file, given in
    /// either order, onto `backend` (borrowed: the caller keeps it alive
    /// longer than the model).
    pub fn load(files: &[PathBuf], backend: &Backend, policy: &OpPolicy) -> Result<Self> {
        let files = ModelFiles::open(files)?;
        let borrow = || unsafe { Backend::from_raw(backend.as_ptr()) }.expect("backend is not null");
        let encoder = VoiceEncoderWeights::load(&files.t3_path, borrow(), policy)?;
        let s3gen = S3Gen::load_for_cloning(&files.s3_path, borrow(), policy)?;
        Ok(Cloner { encoder, s3gen, rules: reference_rules(files.guided) })
    }

    pub fn variant(&self) -> &str {
        &self.encoder.hp.variant
    }

    pub fn sample_rate(&self) -> u32 {
        self.s3gen.hp.hift.sample_rate
    }

    /// Whether T3 is Multilingual's.
    pub fn is_multilingual(&self) -> bool {
        self.encoder.hp.llama().is_some()
    }

    /// The voice of the recording at `path` as a voice file's bytes.
    pub fn save_voice(&mut self, path: &Path, timings: &mut Timings) -> Result<Vec<u8>> {
        let voice = clone_voice(&mut self.encoder, &mut self.s3gen, &self.rules, path, timings)?;
        voice_file::to_bytes(&voice, &self.encoder.hp.variant, self.s3gen.hp.mel_channels)
    }
}
