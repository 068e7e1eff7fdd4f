//! Converting official checkpoints to GGUF (ABI 5.4): the host finds the
//! model plugin whose converter recognises a checkpoint directory, validates
//! the converter options against that plugin's specs and runs it. Each family
//! converts its own checkpoints (a third-party family brings its converter as
//! it brings its synthesis); the host only dispatches. No backend is opened.

use super::{fail, EngineError};
use crate::abi::{ConvertRequest, ConverterInfo, OptionList};
use crate::loader::{self, LoadedModelPlugin, PluginKind};
use abi_stable::std_types::{RResult, Tuple2};
use std::path::{Path, PathBuf};

/// A model plugin that converts checkpoints.
pub struct Converter {
    /// The family it converts for ("chatterbox").
    pub family: String,
    pub plugin_path: PathBuf,
    pub info: ConverterInfo,
    plugin: LoadedModelPlugin,
}

impl Converter {
    /// Whether `source` holds one of the files that mark this family's checkpoints.
    pub fn recognises(&self, source: &Path) -> bool {
        self.info.marker_files.iter().any(|f| source.join(f.as_str()).is_file())
    }
}

/// What a conversion wrote.
#[derive(Debug, Clone)]
pub struct ConvertReport {
    pub family: String,
    /// The variant converted ("turbo", "v2", …).
    pub variant: String,
    /// Each file and its one-line summary, in the order a profile's
    /// `[model] files` lists them.
    pub files: Vec<(PathBuf, String)>,
}

/// Every model plugin in `dirs` that has a converter, by family name. A
/// plugin that does not load is skipped with a warning: `tts devices` reports
/// why.
pub fn converters(dirs: &[PathBuf]) -> Vec<Converter> {
    let mut out = Vec::new();
    for file in loader::discover(dirs).into_iter().filter(|f| f.kind == PluginKind::Model) {
        match loader::load_model(&file.path) {
            Ok((plugin, _)) => {
                if let Some(info) = plugin.converter() {
                    out.push(Converter { family: plugin.family().family.to_string(), plugin_path: file.path.clone(), info, plugin });
                }
            }
            Err(e) => tracing::warn!(plugin = %file.path.display(), "skipped: {e}"),
        }
    }
    out
}

/// Converts the official checkpoint in `source` into GGUF files in `out_dir`
/// (created if missing) with the converter of `family`, or of the one family
/// whose marker files `source` holds. `overrides` are `--set KEY=VALUE`
/// converter options, validated against the converter's specs.
pub fn convert_checkpoint(
    dirs: &[PathBuf],
    source: &Path,
    out_dir: &Path,
    family: Option<&str>,
    overrides: &[(String, String)],
) -> Result<ConvertReport, EngineError> {
    if !source.is_dir() {
        return fail(format!("{}: not a directory (give the checkpoint directory as published)", source.display()));
    }
    let all = converters(dirs);
    let converter = pick(&all, source, family, dirs)?;
    let mut options: OptionList = converter.info.options.iter().map(|s| Tuple2(s.key.clone(), s.default.clone())).collect();
    let owner = format!("the {} converter", converter.family);
    crate::profile::apply_named_overrides(&mut options, "converter option", &owner, &converter.info.options, overrides).map_err(EngineError)?;
    std::fs::create_dir_all(out_dir).map_err(|e| EngineError(format!("{}: cannot create the output directory: {e}", out_dir.display())))?;
    let request = ConvertRequest { source: source.to_string_lossy().as_ref().into(), out_dir: out_dir.to_string_lossy().as_ref().into(), options };
    match converter.plugin.convert(&request) {
        RResult::ROk(output) => Ok(ConvertReport {
            family: converter.family.clone(),
            variant: output.variant.to_string(),
            files: output.files.iter().map(|f| (PathBuf::from(f.path.as_str()), f.summary.to_string())).collect(),
        }),
        RResult::RErr(e) => Err(EngineError(e.to_string())),
    }
}

fn pick<'a>(all: &'a [Converter], source: &Path, family: Option<&str>, dirs: &[PathBuf]) -> Result<&'a Converter, EngineError> {
    let families = || {
        let names: Vec<&str> = all.iter().map(|c| c.family.as_str()).collect();
        if names.is_empty() {
            format!("no model plugin in {} has a converter", dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "))
        } else {
            format!("converters: {}", names.join(", "))
        }
    };
    if let Some(name) = family {
        return all.iter().find(|c| c.family == name).ok_or_else(|| EngineError(format!("no converter for the family `{name}` ({})", families())));
    }
    let matching: Vec<&Converter> = all.iter().filter(|c| c.recognises(source)).collect();
    match matching.as_slice() {
        [one] => Ok(one),
        [] => {
            let looked: Vec<String> = all
                .iter()
                .map(|c| format!("{} looks for {}", c.family, c.info.marker_files.iter().map(|f| f.as_str()).collect::<Vec<_>>().join(" or ")))
                .collect();
            let looked = if looked.is_empty() { families() } else { looked.join("; ") };
            fail(format!("{}: no converter recognises this directory ({looked}); pass --family", source.display()))
        }
        more => fail(format!(
            "{}: holds the files of several families ({}); pass --family",
            source.display(),
            more.iter().map(|c| c.family.as_str()).collect::<Vec<_>>().join(", ")
        )),
    }
}
