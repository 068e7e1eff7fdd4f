//! Voice files a model can use, found in a directory: what `tts voices
//! --dir` lists and what `tts serve --voices-dir` accepts by name. Supertonic
//! takes voice styles (`NAME.json`), Chatterbox the voices saved by a model
//! of its own variant (`NAME.voice`, whose GGUF header names the variant);
//! anything else in the directory is not offered to that model.

use std::path::{Path, PathBuf};

/// The files of `dir` that a model of `family` and `variant` can read, as
/// (NAME, path), sorted by name. An unreadable directory holds none.
pub fn usable(dir: &Path, family: &str, variant: &str) -> Vec<(String, PathBuf)> {
    let wanted = match family {
        "supertonic" => "json",
        "chatterbox" => "voice",
        _ => return Vec::new(),
    };
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut found: Vec<(String, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| {
            let path = e.path();
            let ext = path.extension()?.to_str()?;
            let stem = path.file_stem()?.to_str()?.to_string();
            (ext == wanted).then_some((stem, path))
        })
        .filter(|(_, path)| wanted != "voice" || chatterbox_voice_variant(path).is_some_and(|v| v == variant))
        .collect();
    found.sort();
    found
}

/// The variant a Chatterbox voice file was saved with, from its GGUF header
/// alone (no tensor data is read); None for anything else.
fn chatterbox_voice_variant(path: &Path) -> Option<String> {
    let file = ggml_sys::gguf::GgufFile::open(path).ok()?;
    (file.get_str("general.architecture").ok()? == "chatterbox-voice").then(|| file.get_str("chatterbox-voice.variant").ok()).flatten()
}
