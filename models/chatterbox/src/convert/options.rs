//! The conversion options (`tts convert --option KEY=VALUE`, or the plugin's
//! option list), with the meaning and defaults of `tools/chatterbox/convert.py`'s
//! flags. Unknown keys are refused: a misspelt option must not silently
//! produce a different file.

use super::storage::{DecoderWeights, Weights};
use engine_core::abi::{OptionKind, OptionList, OptionSpec, OptionValue};
use engine_core::model_kit::{Error, Result};

/// Which T3 the directory holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    Turbo,
    Nano,
    Mtl,
}

impl Variant {
    pub fn parse(s: &str) -> Result<Variant> {
        Ok(match s {
            "turbo" => Variant::Turbo,
            "nano" => Variant::Nano,
            "mtl" => Variant::Mtl,
            other => return Err(Error::msg(format!("variant must be one of turbo, nano, mtl, got '{other}'"))),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Variant::Turbo => "turbo",
            Variant::Nano => "nano",
            Variant::Mtl => "mtl",
        }
    }
}

/// The options, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvertOptions {
    /// `None`: detected from the T3 file the directory holds.
    pub variant: Option<Variant>,
    pub weights: Weights,
    /// As given (`auto` is resolved against `weights` where it is used).
    pub decoder_weights: DecoderWeights,
    /// `None`: width / 64, as the official sizes have.
    pub t3_heads: Option<usize>,
    pub cfm_heads: Option<usize>,
    /// The T3 checkpoint's file name, when not the variant's default.
    pub t3_file: Option<String>,
    /// Multilingual: (layer, head) pairs of the alignment analyzer.
    pub aligned_heads: Option<Vec<(usize, usize)>>,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            variant: None,
            weights: Weights::F32,
            decoder_weights: DecoderWeights::Auto,
            t3_heads: None,
            cfm_heads: None,
            t3_file: None,
            aligned_heads: None,
        }
    }
}

/// What `tts convert` may pass, for its help and for typing `KEY=VALUE`
/// pairs. An empty string or 0 leaves a setting at its default.
pub fn option_specs() -> Vec<OptionSpec> {
    let spec = |key: &str, kind, default, help: &str| OptionSpec { key: key.into(), kind, default, help: help.into() };
    let s = |v: &str| OptionValue::Str(v.into());
    vec![
        spec("variant", OptionKind::Str, s(""), "turbo, nano or mtl (default: from the T3 file the directory holds)"),
        spec("weights", OptionKind::Str, s("f32"), "storage of the large matrices: f32, f16, q8_0, q4_0"),
        spec("decoder_weights", OptionKind::Str, s("auto"), "the CFM estimator's storage: auto (f16 with weights=f16, else f32), f32, f16, bf16"),
        spec("t3_heads", OptionKind::Int, OptionValue::Int(0), "attention heads of a non-standard T3 size (0: width / 64)"),
        spec("cfm_heads", OptionKind::Int, OptionValue::Int(0), "attention heads of a non-standard CFM estimator (0: width / 64)"),
        spec("t3_file", OptionKind::Str, s(""), "the T3 checkpoint to read (Multilingual: t3_mtl23ls_v2.safetensors or t3_mtl23ls_v3.safetensors)"),
        spec("aligned_heads", OptionKind::Str, s(""), "Multilingual: LAYER:HEAD pairs the alignment analyzer reads (official: 12:15,13:11,9:2)"),
    ]
}

impl ConvertOptions {
    /// Reads `list`; an unknown key, a value of the wrong kind or out of range
    /// is a one-line error naming the option.
    pub fn from_list(list: &OptionList) -> Result<ConvertOptions> {
        let specs = option_specs();
        for pair in list.iter() {
            let key = pair.0.as_str();
            if !specs.iter().any(|s| s.key.as_str() == key) {
                let known: Vec<&str> = specs.iter().map(|s| s.key.as_str()).collect();
                return Err(Error::msg(format!("unknown conversion option `{key}` (chatterbox takes {})", known.join(", "))));
            }
        }
        let get = |key: &str| list.iter().find(|p| p.0.as_str() == key).map(|p| &p.1);
        let string = |key: &str| -> Result<Option<String>> {
            match get(key) {
                None => Ok(None),
                Some(OptionValue::Str(s)) if s.is_empty() => Ok(None),
                Some(OptionValue::Str(s)) => Ok(Some(s.to_string())),
                Some(_) => Err(Error::msg(format!("option `{key}` is not a string"))),
            }
        };
        // Heads: a positive integer, given as a number or as its decimal text.
        let heads = |key: &str| -> Result<Option<usize>> {
            let v = match get(key) {
                None => return Ok(None),
                Some(OptionValue::Int(v)) => *v,
                Some(OptionValue::Str(s)) if s.is_empty() => return Ok(None),
                Some(OptionValue::Str(s)) => s.trim().parse::<i64>().map_err(|_| Error::msg(format!("{key} must be a whole number, got '{s}'")))?,
                Some(_) => return Err(Error::msg(format!("option `{key}` is not an integer"))),
            };
            match v {
                0 => Ok(None),
                1..=4096 => Ok(Some(v as usize)),
                _ => Err(Error::msg(format!("{key} must be in 1..=4096, got {v}"))),
            }
        };
        Ok(ConvertOptions {
            variant: string("variant")?.map(|s| Variant::parse(&s)).transpose()?,
            weights: string("weights")?.map(|s| Weights::parse(&s)).transpose()?.unwrap_or(Weights::F32),
            decoder_weights: string("decoder_weights")?.map(|s| DecoderWeights::parse(&s)).transpose()?.unwrap_or(DecoderWeights::Auto),
            t3_heads: heads("t3_heads")?,
            cfm_heads: heads("cfm_heads")?,
            t3_file: string("t3_file")?,
            aligned_heads: string("aligned_heads")?.map(|s| parse_aligned_heads(&s)).transpose()?,
        })
    }
}

/// `L:H,L:H,...` (what convert.py's `--aligned-heads` takes).
pub fn parse_aligned_heads(text: &str) -> Result<Vec<(usize, usize)>> {
    let wrong = || Error::msg(format!("aligned_heads '{text}': expected LAYER:HEAD[,LAYER:HEAD...]"));
    text.split(',')
        .map(|item| {
            let (l, h) = item.split_once(':').ok_or_else(wrong)?;
            let parse = |s: &str| s.trim().parse::<usize>().map_err(|_| wrong());
            Ok((parse(l)?, parse(h)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine_core::abi::option_list;

    fn list(pairs: &[(&str, OptionValue)]) -> OptionList {
        option_list(pairs.iter().map(|(k, v)| (k.to_string(), v.clone())))
    }

    #[test]
    fn options_as_convert_py_takes_them() {
        assert_eq!(ConvertOptions::from_list(&OptionList::new()), Ok(ConvertOptions::default()));
        let o = ConvertOptions::from_list(&list(&[
            ("variant", OptionValue::Str("mtl".into())),
            ("weights", OptionValue::Str("q4_0".into())),
            ("decoder_weights", OptionValue::Str("bf16".into())),
            ("t3_heads", OptionValue::Int(4)),
            ("cfm_heads", OptionValue::Str("2".into())),
            ("aligned_heads", OptionValue::Str("2:3,3:1,1:2".into())),
        ]))
        .unwrap();
        assert_eq!(o.variant, Some(Variant::Mtl));
        assert_eq!((o.weights, o.decoder_weights), (Weights::Q4_0, DecoderWeights::BF16));
        assert_eq!((o.t3_heads, o.cfm_heads), (Some(4), Some(2)));
        assert_eq!(o.aligned_heads, Some(vec![(2, 3), (3, 1), (1, 2)]));

        let e = |pairs: &[(&str, OptionValue)]| ConvertOptions::from_list(&list(pairs)).unwrap_err().to_string();
        assert_eq!(
            e(&[("weight", OptionValue::Str("f16".into()))]),
            "unknown conversion option `weight` (chatterbox takes variant, weights, decoder_weights, t3_heads, cfm_heads, t3_file, aligned_heads)"
        );
        assert_eq!(e(&[("aligned_heads", OptionValue::Str("2:x".into()))]), "aligned_heads '2:x': expected LAYER:HEAD[,LAYER:HEAD...]");
        assert_eq!(e(&[("aligned_heads", OptionValue::Str("2,3".into()))]), "aligned_heads '2,3': expected LAYER:HEAD[,LAYER:HEAD...]");
        assert_eq!(e(&[("t3_heads", OptionValue::Int(-1))]), "t3_heads must be in 1..=4096, got -1");
        assert_eq!(e(&[("variant", OptionValue::Str("big".into()))]), "variant must be one of turbo, nano, mtl, got 'big'");
        assert_eq!(e(&[("decoder_weights", OptionValue::Str("q8_0".into()))]), "decoder_weights must be one of auto, f32, f16, bf16, got 'q8_0'");
    }
}
