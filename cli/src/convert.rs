//! `tts convert`: an official checkpoint directory to the GGUF files the
//! engine loads, by the converter of the model plugin that recognises it
//! (`engine::convert_checkpoint`). `tts pull` converts through the same call.

use crate::Common;
use engine_core::engine;
use engine_core::profile::Profile;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// What a conversion wrote.
#[derive(Debug, Clone)]
pub struct ConvertReport {
    pub family: String,
    /// The variant converted ("turbo", "v2", …).
    pub variant: String,
    /// In the order a profile's `[model] files` lists them.
    pub files: Vec<ConvertedFile>,
}

#[derive(Debug, Clone)]
pub struct ConvertedFile {
    pub path: PathBuf,
    /// One line: what the file holds.
    pub summary: String,
}

/// Converts the official checkpoint in `source` into `out_dir` with the
/// converter of `family`, or of the one family that recognises the files;
/// `options` are converter options (`weights`, `variant`, …) as KEY=VALUE
/// text. Plugins come from `common`'s plugin directories.
pub fn convert_checkpoint(common: &Common, source: &Path, out_dir: &Path, family: Option<&str>, options: &[(String, String)]) -> Result<ConvertReport, String> {
    let dirs = plugin_dirs(common)?;
    let report = engine::convert_checkpoint(&dirs, source, out_dir, family, options).map_err(|e| e.to_string())?;
    Ok(ConvertReport {
        family: report.family,
        variant: report.variant,
        files: report.files.into_iter().map(|(path, summary)| ConvertedFile { path, summary }).collect(),
    })
}

/// Where the model plugins are, as for synthesis: `--plugin-dir`,
/// `TTS_PLUGIN_PATH`, the profile's (trusted) directories, the bundle's own.
fn plugin_dirs(common: &Common) -> Result<Vec<PathBuf>, String> {
    let profile = match common.profiles.as_slice() {
        [] => Profile::embedded_default(),
        [one] => Profile::load(one).map_err(|e| e.to_string())?,
        more => return Err(format!("--profile is given {} times; a conversion takes one", more.len())),
    };
    let exe = std::env::current_exe().ok();
    engine::plugin_dirs(&profile, exe.as_deref(), &common.plugin_dirs, common.trust_profile_plugins).map_err(|e| e.to_string())
}

/// `tts convert SOURCE OUT_DIR`: converts, with a spinner on a terminal, and
/// prints one line per file written.
pub fn run(
    common: &Common,
    source: &Path,
    out_dir: &Path,
    family: Option<&str>,
    options: &[(String, String)],
    quiet: bool,
    json: bool,
) -> Result<String, String> {
    let spinner = (!quiet && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {elapsed} {msg}") {
            bar.set_style(style);
        }
        bar.set_message(format!("converting {}", source.display()));
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        bar
    });
    let report = convert_checkpoint(common, source, out_dir, family, options);
    if let Some(bar) = spinner {
        bar.finish_and_clear();
    }
    let report = report?;
    if json {
        let files: Vec<serde_json::Value> =
            report.files.iter().map(|f| serde_json::json!({"path": f.path.display().to_string(), "summary": f.summary})).collect();
        let value = serde_json::json!({"family": report.family, "variant": report.variant, "files": files});
        return serde_json::to_string_pretty(&value).map(|s| s + "\n").map_err(|e| e.to_string());
    }
    Ok(report.files.iter().map(|f| format!("{}: {}\n", f.path.display(), f.summary)).collect())
}

/// `tts convert --list`: each converter's family, what it reads, its marker
/// files and its options.
pub fn list(common: &Common, json: bool) -> Result<String, String> {
    let dirs = plugin_dirs(common)?;
    let converters = engine::converters(&dirs);
    let options = |c: &engine::Converter| c.info.options.iter().map(engine::OptionRow::from_spec).collect::<Vec<_>>();
    let markers = |c: &engine::Converter| c.info.marker_files.iter().map(|f| f.to_string()).collect::<Vec<_>>();
    if json {
        let list: Vec<serde_json::Value> = converters
            .iter()
            .map(|c| {
                serde_json::json!({
                    "family": c.family,
                    "plugin": c.plugin_path.display().to_string(),
                    "description": c.info.description.as_str(),
                    "marker_files": markers(c),
                    "options": options(c),
                })
            })
            .collect();
        return serde_json::to_string_pretty(&list).map(|s| s + "\n").map_err(|e| e.to_string());
    }
    if converters.is_empty() {
        return Ok(format!("no model plugin in {} has a converter\n", dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")));
    }
    let mut out = String::new();
    for (i, c) in converters.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out += &format!("{}: {}\nrecognised by any of: {}\n", c.family, c.info.description, markers(c).join(", "));
        let group = engine::OptionGroup { section: "--set".into(), owner: format!("the {} converter", c.family), options: options(c) };
        out += &crate::options::render_group(&group);
    }
    Ok(out)
}
