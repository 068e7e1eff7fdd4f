//! `tts voices`: what the loaded model can speak with.

use engine_core::engine::ModelSession;
use serde::Serialize;
use std::path::Path;

#[derive(Serialize)]
pub struct VoicesReport {
    pub family: String,
    pub variant: String,
    /// Built-in voices, the default first (empty: one unnamed voice, `voice = ""`).
    pub voices: Vec<String>,
    /// Language codes, the default first (empty: no language option).
    pub languages: Vec<String>,
    pub clones_voices: bool,
    /// The voice files of `--dir` this model can use (Supertonic: `NAME.json`
    /// voice styles; Chatterbox: `NAME.voice` saved by the same variant), sorted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub saved: Option<Vec<String>>,
}

pub fn report(session: &ModelSession, dir: Option<&Path>) -> Result<VoicesReport, String> {
    let catalog = session.catalog();
    let (family, variant) = (session.info.family.to_string(), session.info.variant.to_string());
    let saved = match dir {
        None => None,
        Some(d) if !d.is_dir() => return Err(format!("--dir {}: not a directory", d.display())),
        // Only the files this model can read: voice styles for Supertonic,
        // voices saved by the same Chatterbox variant.
        Some(d) => Some(
            crate::voice_files::usable(d, &family, &variant)
                .into_iter()
                .map(|(_, path)| path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default())
                .collect(),
        ),
    };
    Ok(VoicesReport {
        family,
        variant,
        voices: catalog.voices.iter().map(|v| v.to_string()).collect(),
        languages: catalog.languages.iter().map(|l| l.to_string()).collect(),
        clones_voices: catalog.clones_voices,
        saved,
    })
}

fn with_default(items: &[String]) -> String {
    items.iter().enumerate().map(|(i, v)| if i == 0 { format!("{v} (default)") } else { v.clone() }).collect::<Vec<_>>().join(", ")
}

pub fn render(r: &VoicesReport) -> String {
    let mut s = format!("{} {}\n", r.family, r.variant);
    s += &match r.voices.is_empty() {
        true => "  voices: one built-in voice (voice = \"\")\n".to_string(),
        false => format!("  voices: {}\n", with_default(&r.voices)),
    };
    if !r.languages.is_empty() {
        s += &format!("  languages: {}\n", with_default(&r.languages));
    }
    s += &match r.clones_voices {
        true => "  voice cloning: yes (tts voice save --reference REC --out NAME.voice; then --voice NAME.voice)\n".to_string(),
        false => "  voice cloning: no\n".to_string(),
    };
    if let Some(saved) = &r.saved {
        s += &match saved.is_empty() {
            true => "  voice files it can use: none\n".to_string(),
            false => format!("  voice files it can use: {}\n", saved.join(", ")),
        };
    }
    s
}
