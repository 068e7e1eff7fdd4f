//! Hyper-parameters of a converted Supertonic model, read from GGUF metadata
//! (`supertonic.*`, written by `tools/supertonic/convert.py`; see docs/gguf.md).
//! Nothing here has a default: a key the converter did not write is an error,
//! and every value is checked against its documented range (docs/gguf.md).

use engine_core::model_kit::HparamReader;
use engine_core::model_kit::Result;
use ggml_sys::gguf::GgufFile;

pub const ARCH: &str = "supertonic";

/// Model generation, as detected by the converter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
    V3,
}

impl Version {
    pub fn as_str(&self) -> &'static str {
        match self {
            Version::V1 => "v1",
            Version::V2 => "v2",
            Version::V3 => "v3",
        }
    }
}

/// A ConvNeXt stack: depthwise kernel, inner width and one dilation per layer.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvNextHp {
    pub kernel: usize,
    pub inner: usize,
    pub dilations: Vec<usize>,
}

/// VITS-style relative-position self-attention encoder.
#[derive(Debug, Clone, PartialEq)]
pub struct AttnEncoderHp {
    pub layers: usize,
    pub heads: usize,
    pub filter: usize,
    pub window: usize,
}

/// Cross-attention over the style tokens (tanh keys) or the text.
#[derive(Debug, Clone, PartialEq)]
pub struct CrossAttnHp {
    pub heads: usize,
    pub units: usize,
    /// Multiplier of the attention scores (read from the graph: 1/16 officially).
    pub scale: f32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DurationHp {
    pub char_dim: usize,
    pub convnext: ConvNextHp,
    pub attn: AttnEncoderHp,
    pub style_tokens: usize,
    pub style_dim: usize,
    pub predictor_hidden: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TextEncoderHp {
    pub char_dim: usize,
    pub convnext: ConvNextHp,
    pub attn: AttnEncoderHp,
    pub spte: CrossAttnHp,
}

#[derive(Debug, Clone, PartialEq)]
pub struct VectorEstimatorHp {
    pub hidden: usize,
    pub time_dim: usize,
    pub time_hidden: usize,
    /// Factor on t inside the sinusoidal time encoding (1000 officially).
    pub time_scale: f32,
    pub blocks: usize,
    pub convnext0: ConvNextHp,
    pub convnext1: ConvNextHp,
    pub convnext2: ConvNextHp,
    pub last_convnext: ConvNextHp,
    pub text_attn: CrossAttnHp,
    pub style_attn: CrossAttnHp,
    /// Classifier-free guidance inside the estimator (v3): v = cond·v_c − uncond·v_u.
    pub cfg: Option<(f32, f32)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct VocoderHp {
    pub hidden: usize,
    pub kernel_init: usize,
    pub convnext: ConvNextHp,
    pub head_hidden: usize,
    pub head_kernel: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TextHp {
    /// "none" (v1) or "open_close" (`<lang>text</lang>`).
    pub wrap_open_close: bool,
    pub languages: Vec<String>,
    pub default_language: String,
    pub chunk_chars: usize,
    pub short_chunk_chars: usize,
    /// Languages chunked at `short_chunk_chars` (GGUF: comma-separated string).
    pub short_chunk_languages: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Hparams {
    pub version: Version,
    pub tts_version: String,
    pub sample_rate: u32,
    pub base_chunk_size: usize,
    pub chunk_compress_factor: usize,
    pub latent_dim: usize,
    pub normalizer_scale: f32,
    pub layer_norm_eps: f32,
    pub batch_norm_eps: f32,
    pub default_steps: u32,
    /// Style token count and width shared by voices (`style_ttl` is [tokens, dim]).
    pub style_tokens: usize,
    pub style_dim: usize,
    pub text: TextHp,
    pub dp: DurationHp,
    pub te: TextEncoderHp,
    pub ve: VectorEstimatorHp,
    pub vocoder: VocoderHp,
}

impl Version {
    /// Denoising steps the official helper accepts for this version (v3's
    /// helper refuses more than 50).
    pub fn max_steps(&self) -> usize {
        match self {
            Version::V3 => 50,
            Version::V1 | Version::V2 => 100,
        }
    }
}

/// Ranges of the Supertonic-specific keys (docs/gguf.md); the shared ones are in
/// [`engine_core::model_kit::hparams`].
pub mod ranges {
    use std::ops::RangeInclusive;
    pub const BASE_CHUNK: RangeInclusive<usize> = 1..=16384;
    pub const COMPRESS: RangeInclusive<usize> = 1..=64;
    pub const LATENT_DIM: RangeInclusive<usize> = 1..=4096;
    pub const SCALE: RangeInclusive<f32> = 1e-6..=1e6;
    pub const TIME_SCALE: RangeInclusive<f32> = 1e-6..=1e9;
    pub const CFG_SCALE: RangeInclusive<f32> = -1e3..=1e3;
    pub const CHUNK_CHARS: RangeInclusive<usize> = 1..=5000;
    pub const WINDOW: RangeInclusive<usize> = 0..=1024;
    pub const LANGUAGES: RangeInclusive<usize> = 1..=256;
}

impl Hparams {
    /// Latent channels seen by the estimator and vocoder (`latent_dim · compress`).
    pub fn latent_channels(&self) -> usize {
        self.latent_dim * self.chunk_compress_factor
    }

    /// Waveform samples per latent frame.
    pub fn samples_per_frame(&self) -> usize {
        self.base_chunk_size * self.chunk_compress_factor
    }

    /// Reads and range-checks every key; relations between keys are checked
    /// here, relations to tensor shapes by [`crate::tensors::table`].
    pub fn load(gguf: &GgufFile) -> Result<Self> {
        use engine_core::model_kit::hparams::{DIM, EPS, LAYERS, SAMPLE_RATE};
        let r = Reader(HparamReader::new(gguf, ARCH));
        let version = match r.choice("version", &["v1", "v2", "v3"])?.as_str() {
            "v1" => Version::V1,
            "v2" => Version::V2,
            _ => Version::V3,
        };
        let cfg =
            if r.flag("ve.cfg")? { Some((r.real("ve.cfg_cond_scale", ranges::CFG_SCALE)?, r.real("ve.cfg_uncond_scale", ranges::CFG_SCALE)?)) } else { None };
        let chunk_chars = r.count("text.chunk_chars", ranges::CHUNK_CHARS)?;
        let languages = r.strings("text.languages", ranges::LANGUAGES)?;
        let hp = Hparams {
            version,
            tts_version: r.string("tts_version")?,
            sample_rate: r.count("sample_rate", SAMPLE_RATE)? as u32,
            base_chunk_size: r.count("base_chunk_size", ranges::BASE_CHUNK)?,
            chunk_compress_factor: r.count("chunk_compress_factor", ranges::COMPRESS)?,
            latent_dim: r.count("latent_dim", ranges::LATENT_DIM)?,
            normalizer_scale: r.real("normalizer_scale", ranges::SCALE)?,
            layer_norm_eps: r.real("layer_norm_eps", EPS)?,
            batch_norm_eps: r.real("batch_norm_eps", EPS)?,
            default_steps: r.count("default_steps", 1..=version.max_steps())? as u32,
            style_tokens: r.count("style_tokens", DIM)?,
            style_dim: r.count("style_dim", DIM)?,
            text: TextHp {
                wrap_open_close: r.choice("text.language_wrap", &["none", "open_close"])? == "open_close",
                default_language: r.string("text.default_language")?,
                chunk_chars,
                short_chunk_chars: r.count("text.short_chunk_chars", 1..=chunk_chars)?,
                short_chunk_languages: r.string_or_empty("text.short_chunk_languages")?.split(',').filter(|l| !l.is_empty()).map(str::to_string).collect(),
                languages,
            },
            dp: DurationHp {
                char_dim: r.count("dp.char_dim", DIM)?,
                convnext: r.convnext("dp.convnext")?,
                attn: r.attn_encoder("dp.attn")?,
                style_tokens: r.count("dp.style_tokens", DIM)?,
                style_dim: r.count("dp.style_dim", DIM)?,
                predictor_hidden: r.count("dp.predictor_hidden", DIM)?,
            },
            te: TextEncoderHp {
                char_dim: r.count("te.char_dim", DIM)?,
                convnext: r.convnext("te.convnext")?,
                attn: r.attn_encoder("te.attn")?,
                spte: r.cross_attn("te.spte")?,
            },
            ve: VectorEstimatorHp {
                hidden: r.count("ve.hidden", DIM)?,
                time_dim: r.count("ve.time_dim", DIM)?,
                time_hidden: r.count("ve.time_hidden", DIM)?,
                time_scale: r.real("ve.time_scale", ranges::TIME_SCALE)?,
                blocks: r.count("ve.blocks", LAYERS)?,
                convnext0: r.convnext("ve.convnext0")?,
                convnext1: r.convnext("ve.convnext1")?,
                convnext2: r.convnext("ve.convnext2")?,
                last_convnext: r.convnext("ve.last_convnext")?,
                text_attn: r.cross_attn("ve.text_attn")?,
                style_attn: r.cross_attn("ve.style_attn")?,
                cfg,
            },
            vocoder: VocoderHp {
                hidden: r.count("voc.hidden", DIM)?,
                kernel_init: r.count("voc.kernel_init", engine_core::model_kit::hparams::KERNEL)?,
                convnext: r.convnext("voc.convnext")?,
                head_hidden: r.count("voc.head_hidden", DIM)?,
                head_kernel: r.count("voc.head_kernel", engine_core::model_kit::hparams::KERNEL)?,
            },
        };
        hp.check_relations(&r)?;
        Ok(hp)
    }

    fn check_relations(&self, r: &HparamReader) -> Result<()> {
        let language_ok = |l: &String| !l.is_empty() && l.len() <= 16 && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if let Some(bad) = self.text.languages.iter().find(|l| !language_ok(l)) {
            return Err(r.error(format!("language code '{bad}' in {ARCH}.text.languages is not 1..=16 ASCII letters, digits, '-' or '_'")));
        }
        for l in std::iter::once(&self.text.default_language).chain(&self.text.short_chunk_languages) {
            r.require(self.text.languages.contains(l), || format!("language '{l}' is not among {ARCH}.text.languages ({})", self.text.languages.join(", ")))?;
        }
        r.require((self.version == Version::V3) == self.ve.cfg.is_some(), || {
            format!("{ARCH}.ve.cfg must be set exactly for v3 models (this is {})", self.version.as_str())
        })?;
        r.require(self.version != Version::V1 || !self.text.wrap_open_close, || "v1 models take no language wrap".into())?;
        for (key, c, heads) in [("dp.attn", self.dp.char_dim, self.dp.attn.heads), ("te.attn", self.te.char_dim, self.te.attn.heads)] {
            r.require(c.is_multiple_of(heads), || format!("{ARCH}.{key}.heads = {heads} does not divide the width {c}"))?;
        }
        for (key, a) in [("te.spte", &self.te.spte), ("ve.text_attn", &self.ve.text_attn), ("ve.style_attn", &self.ve.style_attn)] {
            r.require(a.units.is_multiple_of(a.heads), || format!("{ARCH}.{key}.heads = {} does not divide {ARCH}.{key}.units = {}", a.heads, a.units))?;
        }
        let text_head = self.ve.text_attn.units / self.ve.text_attn.heads;
        r.require(text_head.is_multiple_of(2), || format!("the text attention's head width {text_head} is odd (rotary embeddings need pairs)"))?;
        r.require(self.ve.time_dim.is_multiple_of(2), || format!("{ARCH}.ve.time_dim = {} is odd (sine and cosine halves)", self.ve.time_dim))?;
        Ok(())
    }
}

/// The range-checked reader plus the composite entries (ConvNeXt stacks,
/// attention encoders, cross-attentions) the stages share.
struct Reader<'a>(HparamReader<'a>);

impl<'a> std::ops::Deref for Reader<'a> {
    type Target = HparamReader<'a>;
    fn deref(&self) -> &HparamReader<'a> {
        &self.0
    }
}

impl Reader<'_> {
    fn convnext(&self, p: &str) -> Result<ConvNextHp> {
        use engine_core::model_kit::hparams::{DILATION, DIM, KERNEL, LAYERS};
        Ok(ConvNextHp {
            kernel: self.count(&format!("{p}.kernel"), KERNEL)?,
            inner: self.count(&format!("{p}.inner"), DIM)?,
            dilations: self.counts(&format!("{p}.dilations"), LAYERS, DILATION)?,
        })
    }
    fn attn_encoder(&self, p: &str) -> Result<AttnEncoderHp> {
        use engine_core::model_kit::hparams::{DIM, HEADS, LAYERS};
        Ok(AttnEncoderHp {
            layers: self.count(&format!("{p}.layers"), LAYERS)?,
            heads: self.count(&format!("{p}.heads"), HEADS)?,
            filter: self.count(&format!("{p}.filter"), DIM)?,
            window: self.count(&format!("{p}.window"), ranges::WINDOW)?,
        })
    }
    fn cross_attn(&self, p: &str) -> Result<CrossAttnHp> {
        use engine_core::model_kit::hparams::{DIM, HEADS};
        Ok(CrossAttnHp {
            heads: self.count(&format!("{p}.heads"), HEADS)?,
            units: self.count(&format!("{p}.units"), DIM)?,
            scale: self.real(&format!("{p}.scale"), ranges::SCALE)?,
        })
    }
}
