//! The tone family's converter (ABI 5.4), as a third-party family would
//! write one: its "official checkpoint" is a directory holding `tone.json`
//! (`{"frequency": 440.0, "sample_rate": 16000}`), converted with the model
//! kit's GGUF writer into the `tone.gguf` that `load` reads.

use super::ARCH;
use abi_stable::std_types::{RResult, RString, RVec};
use engine_core::abi::{find_option, ConvertOutput, ConvertRequest, ConvertedFile, ConverterInfo, OptionKind, OptionValue};
use engine_core::backend_kit::spec;
use engine_core::model_kit::convert::{GgufWriter, MetaValue};
use engine_core::model_kit::{guarded, Result};
use std::path::Path;

pub const CHECKPOINT_FILE: &str = "tone.json";

pub extern "C" fn info() -> ConverterInfo {
    ConverterInfo {
        description: "a tone checkpoint directory (tone.json: frequency, sample_rate)".into(),
        marker_files: RVec::from(vec![RString::from(CHECKPOINT_FILE)]),
        options: RVec::from(vec![spec("octave", OptionKind::Int, OptionValue::Int(0), "shift the frequency by this many octaves")]),
    }
}

pub extern "C" fn convert(request: &ConvertRequest) -> RResult<ConvertOutput, RString> {
    guarded("tone converter", || convert_guarded(request))
}

fn convert_guarded(request: &ConvertRequest) -> Result<ConvertOutput> {
    let source = Path::new(request.source.as_str()).join(CHECKPOINT_FILE);
    let text = std::fs::read_to_string(&source).map_err(|e| format!("{}: {e}", source.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", source.display()))?;
    let number = |key: &str| json.get(key).and_then(|v| v.as_f64()).ok_or_else(|| format!("{}: no number `{key}`", source.display()));
    let (frequency, sample_rate) = (number("frequency")?, number("sample_rate")?);
    if !(frequency > 0.0 && (1.0..=384_000.0).contains(&sample_rate) && frequency < sample_rate / 2.0) {
        return Err(format!("{}: frequency {frequency} Hz at {sample_rate} Hz is not a tone this model plays", source.display()).into());
    }
    let octave = match find_option(&request.options, "octave") {
        Some(OptionValue::Int(o)) if (-8..=8).contains(o) => *o as i32,
        Some(other) => return Err(format!("option `octave`: {other:?} is not in -8..=8").into()),
        None => 0,
    };
    let mut gguf = GgufWriter::new(ARCH);
    gguf.add(format!("{ARCH}.sample_rate"), MetaValue::U32(sample_rate as u32));
    gguf.add(format!("{ARCH}.frequency"), MetaValue::F32((frequency * 2f64.powi(octave)) as f32));
    let path = Path::new(request.out_dir.as_str()).join("tone.gguf");
    let written = gguf.write_atomically(&path)?;
    Ok(ConvertOutput {
        files: RVec::from(vec![ConvertedFile { path: path.to_string_lossy().as_ref().into(), summary: format!("tone, {} bytes", written.bytes).into() }]),
        variant: "sine".into(),
    })
}
