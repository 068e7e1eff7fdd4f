//! Hyper-parameters of a converted Chatterbox model, read from GGUF metadata
//! (written by `tools/chatterbox/convert.py`; see docs/gguf.md). Nothing has a
//! default: a key the converter did not write is an error naming the key.

use ggml_sys::gguf::{GgufFile, Metadata};

/// `general.architecture` of the T3 file.
pub const T3_ARCH: &str = "chatterbox";
/// `general.architecture` of the S3Gen (+ HiFT) file.
pub const S3GEN_ARCH: &str = "chatterbox-s3gen";

/// The transformer under T3. Turbo and Nano are GPT-2; Multilingual (Llama)
/// gets its own variant and graph builder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backbone {
    Gpt2,
}

#[derive(Debug, Clone, PartialEq)]
pub struct T3Hparams {
    /// `turbo` or `nano`.
    pub variant: String,
    pub backbone: Backbone,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    /// Positions of the learned position table (`wpe` rows): the context limit.
    pub n_ctx: usize,
    pub n_ff: usize,
    pub text_vocab: usize,
    pub speech_vocab: usize,
    /// Width of the speaker embedding that `cond.spkr` projects.
    pub speaker_dim: usize,
    pub layer_norm_eps: f32,
    pub start_speech_token: u32,
    pub stop_speech_token: u32,
    /// Appended three times before S3Gen so the last word is not cut off.
    pub silence_token: u32,
    /// Speech-token prompt length of the built-in voice.
    pub cond_prompt_len: usize,
}

impl T3Hparams {
    pub fn load(file: &GgufFile) -> Result<Self, String> {
        let m = Metadata::new(file, T3_ARCH);
        let backbone = match m.str("backbone")?.as_str() {
            "gpt2" => Backbone::Gpt2,
            other => {
                return Err(format!(
                    "{}: T3 backbone '{other}' is not supported by this plugin version",
                    file.path().display()
                ))
            }
        };
        let hp = T3Hparams {
            variant: m.str("variant")?,
            backbone,
            n_layer: m.usize("n_layer")?,
            n_embd: m.usize("n_embd")?,
            n_head: m.usize("n_head")?,
            n_ctx: m.usize("n_ctx")?,
            n_ff: m.usize("n_ff")?,
            text_vocab: m.usize("text_vocab")?,
            speech_vocab: m.usize("speech_vocab")?,
            speaker_dim: m.usize("speaker_dim")?,
            layer_norm_eps: m.f32("layer_norm_eps")?,
            start_speech_token: m.u32("start_speech_token")?,
            stop_speech_token: m.u32("stop_speech_token")?,
            silence_token: m.u32("silence_token")?,
            cond_prompt_len: m.usize("cond_prompt_len")?,
        };
        if hp.n_head == 0 || !hp.n_embd.is_multiple_of(hp.n_head) {
            return Err(format!(
                "{}: n_embd {} does not split into {} heads",
                file.path().display(),
                hp.n_embd,
                hp.n_head
            ));
        }
        for (name, token) in [
            ("start", hp.start_speech_token),
            ("stop", hp.stop_speech_token),
            ("silence", hp.silence_token),
        ] {
            if token as usize >= hp.speech_vocab {
                return Err(format!(
                    "{}: {name} speech token {token} is outside the speech vocabulary ({})",
                    file.path().display(),
                    hp.speech_vocab
                ));
            }
        }
        Ok(hp)
    }

    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head
    }
}

/// CosyVoice's UpsampleConformerEncoder (the flow front end): speech-token
/// embeddings → pre-lookahead conv → conformer layers → ×`up_stride`
/// upsampling → more conformer layers.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderHparams {
    pub n_embd: usize,
    pub n_head: usize,
    pub n_ff: usize,
    pub n_layer: usize,
    pub n_up_layer: usize,
    /// Future frames the first lookahead conv sees (its kernel is this + 1).
    pub pre_lookahead: usize,
    /// Kernel of the second, causal lookahead conv.
    pub lookahead_conv2_kernel: usize,
    pub leaky_relu_slope: f32,
    /// Mel frames per speech token.
    pub up_stride: usize,
    pub layer_norm_eps: f32,
    pub embed_norm_eps: f32,
    pub after_norm_eps: f32,
}

/// The CFM estimator (Matcha/CosyVoice ConditionalDecoder, causal, one U-Net
/// level): resnet + transformer blocks down, `n_mid` middle stages, up with a skip.
#[derive(Debug, Clone, PartialEq)]
pub struct CfmHparams {
    /// `x ⊕ mu ⊕ spks ⊕ cond` channels (4 × mel).
    pub in_channels: usize,
    pub channels: usize,
    pub time_dim: usize,
    /// Transformer blocks per stage.
    pub n_transformer: usize,
    pub n_mid: usize,
    pub n_head: usize,
    pub head_dim: usize,
    pub ff_dim: usize,
    pub conv_kernel: usize,
    /// Factor on t inside the sinusoidal time embedding.
    pub time_scale: f32,
    pub layer_norm_eps: f32,
}

/// HiFT (HiFi-GAN with a neural-source-filter excitation and an ISTFT head).
#[derive(Debug, Clone, PartialEq)]
pub struct HiftHparams {
    pub sample_rate: u32,
    pub base_channels: usize,
    pub conv_pre_kernel: usize,
    pub conv_post_kernel: usize,
    pub upsample_rates: Vec<usize>,
    pub upsample_kernels: Vec<usize>,
    /// Kernels of the resblocks averaged after each upsampling stage.
    pub resblock_kernels: Vec<usize>,
    /// Kernel of the source branch's resblock at each stage.
    pub source_resblock_kernels: Vec<usize>,
    pub resblock_dilations: Vec<usize>,
    pub n_fft: usize,
    pub hop: usize,
    /// Overtones above the fundamental in the sine source.
    pub harmonics: usize,
    pub nsf_alpha: f32,
    pub nsf_sigma: f32,
    pub voiced_threshold: f32,
    pub lrelu_slope: f32,
    pub audio_limit: f32,
    pub f0_layers: usize,
    pub f0_kernel: usize,
    /// Samples silenced, then faded in, at the start of every waveform.
    pub trim_fade_samples: usize,
}

impl HiftHparams {
    /// Waveform samples per mel frame (∏ rates × hop).
    pub fn samples_per_frame(&self) -> usize {
        self.upsample_rates.iter().product::<usize>() * self.hop
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct S3GenHparams {
    /// `meanflow` (Turbo's distilled decoder) or `standard`.
    pub variant: String,
    pub meanflow: bool,
    pub n_timesteps: usize,
    pub cfg_rate: f32,
    pub speech_vocab: usize,
    pub mel_channels: usize,
    /// Width of the x-vector (CAMPPlus) speaker embedding.
    pub speaker_dim: usize,
    pub encoder: EncoderHparams,
    pub cfm: CfmHparams,
    pub hift: HiftHparams,
}

impl S3GenHparams {
    pub fn load(file: &GgufFile) -> Result<Self, String> {
        let m = Metadata::new(file, S3GEN_ARCH);
        let encoder = EncoderHparams {
            n_embd: m.usize("encoder.n_embd")?,
            n_head: m.usize("encoder.n_head")?,
            n_ff: m.usize("encoder.n_ff")?,
            n_layer: m.usize("encoder.n_layer")?,
            n_up_layer: m.usize("encoder.n_up_layer")?,
            pre_lookahead: m.usize("encoder.pre_lookahead")?,
            lookahead_conv2_kernel: m.usize("encoder.lookahead_conv2_kernel")?,
            leaky_relu_slope: m.f32("encoder.leaky_relu_slope")?,
            up_stride: m.usize("encoder.up_stride")?,
            layer_norm_eps: m.f32("encoder.layer_norm_eps")?,
            embed_norm_eps: m.f32("encoder.embed_norm_eps")?,
            after_norm_eps: m.f32("encoder.after_norm_eps")?,
        };
        if encoder.n_head == 0 || !encoder.n_embd.is_multiple_of(encoder.n_head) {
            return Err(format!("{}: encoder width {} does not split into {} heads", file.path().display(), encoder.n_embd, encoder.n_head));
        }
        if encoder.up_stride == 0 || encoder.lookahead_conv2_kernel == 0 {
            return Err(format!("{}: encoder up_stride and lookahead_conv2_kernel must be positive", file.path().display()));
        }
        let cfm = CfmHparams {
            in_channels: m.usize("cfm.in_channels")?,
            channels: m.usize("cfm.channels")?,
            time_dim: m.usize("cfm.time_dim")?,
            n_transformer: m.usize("cfm.n_transformer")?,
            n_mid: m.usize("cfm.n_mid")?,
            n_head: m.usize("cfm.n_head")?,
            head_dim: m.usize("cfm.head_dim")?,
            ff_dim: m.usize("cfm.ff_dim")?,
            conv_kernel: m.usize("cfm.conv_kernel")?,
            time_scale: m.f32("cfm.time_scale")?,
            layer_norm_eps: m.f32("cfm.layer_norm_eps")?,
        };
        if cfm.conv_kernel == 0 || !cfm.in_channels.is_multiple_of(2) {
            return Err(format!("{}: CFM conv_kernel must be positive and in_channels even", file.path().display()));
        }
        let hift = HiftHparams {
            sample_rate: m.u32("hift.sample_rate")?,
            base_channels: m.usize("hift.base_channels")?,
            conv_pre_kernel: m.usize("hift.conv_pre_kernel")?,
            conv_post_kernel: m.usize("hift.conv_post_kernel")?,
            upsample_rates: m.usizes("hift.upsample_rates")?,
            upsample_kernels: m.usizes("hift.upsample_kernels")?,
            resblock_kernels: m.usizes("hift.resblock_kernels")?,
            source_resblock_kernels: m.usizes("hift.source_resblock_kernels")?,
            resblock_dilations: m.usizes("hift.resblock_dilations")?,
            n_fft: m.usize("hift.n_fft")?,
            hop: m.usize("hift.hop")?,
            harmonics: m.usize("hift.harmonics")?,
            nsf_alpha: m.f32("hift.nsf_alpha")?,
            nsf_sigma: m.f32("hift.nsf_sigma")?,
            voiced_threshold: m.f32("hift.voiced_threshold")?,
            lrelu_slope: m.f32("hift.lrelu_slope")?,
            audio_limit: m.f32("hift.audio_limit")?,
            f0_layers: m.usize("hift.f0_layers")?,
            f0_kernel: m.usize("hift.f0_kernel")?,
            trim_fade_samples: m.usize("hift.trim_fade_samples")?,
        };
        let stages = hift.upsample_rates.len();
        if stages == 0 || hift.upsample_kernels.len() != stages || hift.source_resblock_kernels.len() != stages {
            return Err(format!("{}: HiFT upsample rates, kernels and source resblocks disagree in count", file.path().display()));
        }
        if hift.upsample_rates.iter().zip(&hift.upsample_kernels).any(|(u, k)| k < u || (k - u) % 2 != 0) {
            return Err(format!("{}: a HiFT upsampling kernel is not rate + an even number", file.path().display()));
        }
        if hift.n_fft == 0 || hift.hop == 0 || hift.f0_kernel.is_multiple_of(2) || hift.resblock_kernels.is_empty() {
            return Err(format!("{}: HiFT n_fft, hop, f0_kernel or resblock kernels are invalid", file.path().display()));
        }
        Ok(S3GenHparams {
            variant: m.str("variant")?,
            meanflow: m.bool("meanflow")?,
            n_timesteps: m.usize("n_timesteps")?,
            cfg_rate: m.f32("cfg_rate")?,
            speech_vocab: m.usize("speech_vocab")?,
            mel_channels: m.usize("mel_channels")?,
            speaker_dim: m.usize("speaker_dim")?,
            encoder,
            cfm,
            hift,
        })
    }
}
