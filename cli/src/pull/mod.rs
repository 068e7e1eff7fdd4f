//! `tts pull NAME`: fetch a catalog model's official files from the Hugging
//! Face Hub (`hub`), convert them with the family's converter, and install the
//! GGUFs with a ready profile as `MODELS_DIR/NAME/`; `tts models` lists and
//! removes what is installed (docs/models.md).
//!
//! Nothing half-written ever appears under `MODELS_DIR/NAME`: a pull works
//! in a private `MODELS_DIR/.pull-PID-XXXXXX/` and renames the finished
//! directory into place; a failure removes the temporary, and a later pull
//! removes those whose process has died (a signal ends the process without
//! unwinding).

pub mod catalog;
pub mod hub;

use serde::Serialize;
use std::path::{Path, PathBuf};

/// Name of the profile inside an installed model's directory.
pub const PROFILE: &str = "profile.toml";
/// Name of the record of what was pulled.
pub const RECORD: &str = "pulled.json";
const TEMP_PREFIX: &str = ".pull-";

/// The converter `tts pull` calls (`convert::convert_checkpoint`): official
/// checkpoint directory, output directory, family, options → the variant
/// converted and the GGUFs written, in profile order, each with the
/// converter's one-line summary.
pub type Converter<'a> = &'a dyn Fn(&Path, &Path, Option<&str>, &[(String, String)]) -> Result<(String, Vec<(PathBuf, String)>), String>;

/// `--models-dir`, else `$TTS_MODELS_DIR`, else `$XDG_DATA_HOME/tts/models`,
/// else `~/.local/share/tts/models`.
pub fn models_dir(flag: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(dir) = flag {
        return Ok(dir.to_path_buf());
    }
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = var("TTS_MODELS_DIR") {
        return Ok(dir);
    }
    if let Some(data) = var("XDG_DATA_HOME") {
        return Ok(data.join("tts/models"));
    }
    var("HOME").map(|h| h.join(".local/share/tts/models")).ok_or_else(|| "HOME is not set; give --models-dir or set TTS_MODELS_DIR".to_string())
}

/// What `tts pull` was asked.
pub struct PullRequest<'a> {
    pub spec: &'a str,
    pub weights: Option<&'a str>,
    pub set: &'a [(String, String)],
    pub models_dir: Option<&'a Path>,
    pub quiet: bool,
}

/// `pulled.json`: what an installed model is and where it came from.
#[derive(Serialize, serde::Deserialize, Debug, Clone)]
pub struct Record {
    pub name: String,
    pub family: String,
    pub variant: String,
    pub storage: String,
    /// The repository, revision asked for and commit of each source.
    pub sources: Vec<RecordSource>,
    pub options: Vec<(String, String)>,
    pub files: Vec<RecordFile>,
    /// UTC, RFC 3339.
    pub pulled_at: String,
}

#[derive(Serialize, serde::Deserialize, Debug, Clone)]
pub struct RecordSource {
    pub repo: String,
    pub revision: String,
    pub commit: String,
}

#[derive(Serialize, serde::Deserialize, Debug, Clone)]
pub struct RecordFile {
    pub name: String,
    pub bytes: u64,
}

/// Runs a pull; returns the installed directory.
pub fn pull(request: &PullRequest, convert: Converter) -> Result<PathBuf, String> {
    let entry = catalog::lookup(request.spec)?;
    let models = models_dir(request.models_dir)?;
    let hub = hub::Hub::from_env(request.quiet)?;
    let mut options: Vec<(String, String)> = entry.options.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let storage = request.weights.unwrap_or("f32").to_string();
    options.push(("weights".into(), storage.clone()));
    for (key, value) in request.set {
        options.retain(|(k, _)| k != key);
        options.push((key.clone(), value.clone()));
    }
    let storage = options.iter().rev().find(|(k, _)| k == "weights").map_or(storage, |(_, v)| v.clone());

    // Everything is fetched and verified before anything is written under
    // the models directory.
    let mut fetched = Vec::new();
    let mut sources = Vec::new();
    for source in &entry.source {
        let resolved = hub.fetch(&source.repo, &source.revision, &source.files)?;
        sources.push(RecordSource { repo: source.repo.clone(), revision: source.revision.clone(), commit: resolved.commit.clone() });
        let bytes: u64 = resolved.files.iter().map(|f| f.bytes).sum();
        tracing::info!("{}@{} (commit {}): {} files, {bytes} bytes, verified", source.repo, source.revision, resolved.commit, resolved.files.len());
        fetched.extend(resolved.files);
    }

    std::fs::create_dir_all(&models).map_err(|e| format!("models directory {}: {e}", models.display()))?;
    remove_abandoned_temporaries(&models);
    let work = tempfile::Builder::new()
        .prefix(&format!("{TEMP_PREFIX}{}-", std::process::id()))
        .tempdir_in(&models)
        .map_err(|e| format!("models directory {}: {e}", models.display()))?;
    let source_dir = work.path().join("source");
    let model_dir = work.path().join("model");
    std::fs::create_dir_all(&model_dir).map_err(|e| format!("{}: {e}", model_dir.display()))?;
    // The converter sees one directory laid out as the official repository;
    // the files stay in the Hub cache (links, no copies).
    for file in &fetched {
        let link = source_dir.join(&file.name);
        let target = std::fs::canonicalize(&file.path).map_err(|e| format!("{}: {e}", file.path.display()))?;
        std::fs::create_dir_all(link.parent().unwrap()).map_err(|e| format!("{}: {e}", source_dir.display()))?;
        std::os::unix::fs::symlink(&target, &link).map_err(|e| format!("{}: {e}", link.display()))?;
    }

    // A full-size conversion takes minutes: a spinner says it is alive
    // (indicatif draws nothing when stderr is not a terminal).
    let spinner = (!request.quiet).then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {elapsed} {msg}") {
            bar.set_style(style);
        }
        bar.set_message(format!("converting {} ({}, weights {storage})", entry.name, entry.family));
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        bar
    });
    let converted = convert(&source_dir, &model_dir, Some(&entry.family), &options);
    if let Some(bar) = spinner {
        bar.finish_and_clear();
    }
    let (variant, written) = converted?;
    if !request.quiet {
        // By final file name: the temporary's path would mislead.
        for (path, summary) in &written {
            let summary = summary.strip_prefix(&format!("{}: ", path.display())).unwrap_or(summary);
            eprintln!("{}: {summary}", path.file_name().unwrap_or_default().to_string_lossy());
        }
    }
    let mut gguf_names = Vec::new();
    for (path, _) in &written {
        let name = path.file_name().and_then(|n| n.to_str()).ok_or_else(|| format!("converter wrote {}, not a plain file name", path.display()))?;
        if path.parent() != Some(model_dir.as_path()) {
            return Err(format!("converter wrote {} outside its output directory", path.display()));
        }
        gguf_names.push(name.to_string());
    }
    for keep in &entry.keep {
        let from = fetched.iter().find(|f| &f.name == keep).ok_or_else(|| format!("catalog: {} keeps {keep}, which it does not fetch", entry.name))?;
        let to = model_dir.join(Path::new(keep).file_name().unwrap_or_default());
        std::fs::copy(&from.path, &to).map_err(|e| format!("copying {keep} into {}: {e}", model_dir.display()))?;
    }
    let profile = profile_text(&entry.name, &sources, &gguf_names);
    std::fs::write(model_dir.join(PROFILE), profile).map_err(|e| format!("{}: {e}", model_dir.join(PROFILE).display()))?;
    let mut files = Vec::new();
    for name in gguf_names.iter().chain(&entry.keep) {
        let name = Path::new(name).file_name().unwrap_or_default().to_string_lossy().into_owned();
        let bytes = std::fs::metadata(model_dir.join(&name)).map_err(|e| format!("{}: {e}", model_dir.join(&name).display()))?.len();
        files.push(RecordFile { name, bytes });
    }
    let record = Record { name: entry.name.clone(), family: entry.family.clone(), variant, storage, sources, options, files, pulled_at: utc_now() };
    let json = serde_json::to_string_pretty(&record).map_err(|e| e.to_string())? + "\n";
    std::fs::write(model_dir.join(RECORD), json).map_err(|e| format!("{}: {e}", model_dir.join(RECORD).display()))?;
    sync_dir(&model_dir);

    // Into place: an earlier pull of the same name moves aside first, and is
    // removed with the temporary.
    let target = models.join(&entry.name);
    if target.symlink_metadata().is_ok() {
        std::fs::rename(&target, work.path().join("replaced")).map_err(|e| format!("moving the earlier {} aside: {e}", target.display()))?;
    }
    std::fs::rename(&model_dir, &target).map_err(|e| format!("installing {}: {e}", target.display()))?;
    sync_dir(&models);
    drop(work);
    Ok(target)
}

/// The profile written beside the GGUFs: the built-in profile's backend
/// choice, and the model files relative to the profile.
fn profile_text(name: &str, sources: &[RecordSource], files: &[String]) -> String {
    let from: Vec<String> = sources.iter().map(|s| format!("{}@{}", s.repo, s.commit)).collect();
    let files: Vec<String> = files.iter().map(|f| format!("\"{f}\"")).collect();
    format!(
        "# Written by `tts pull {name}` from {}.\n# Reference: docs/profile.md; `tts --model-name {name}` uses it.\n\n\
         [backend]\nprefer = [\"cuda\", \"metal\", \"vulkan\", \"opencl\", \"cpu\"]\ndevice = \"auto\"\n\n\
         [backends.cpu]\nthreads = 0\n\n[backends.vulkan]\nallow_software = false\n\n\
         [model]\nfiles = [{}]\n",
        from.join(", "),
        files.join(", ")
    )
}

/// Temporaries of pulls whose process is gone (ended by a signal or killed).
fn remove_abandoned_temporaries(models: &Path) {
    let Ok(entries) = std::fs::read_dir(models) else { return };
    for entry in entries.flatten().take(10_000) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(TEMP_PREFIX).and_then(|r| r.split('-').next()).and_then(|p| p.parse::<i32>().ok()) else { continue };
        // SAFETY: kill with signal 0 only asks whether the process exists.
        let gone = pid > 0 && unsafe { libc::kill(pid, 0) } == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Now as `YYYY-MM-DDTHH:MM:SSZ`.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (proleptic Gregorian; the
    // era-based method, valid for any date after 1970).
    let z = days as i64 + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// One installed model, as `tts models` shows it.
#[derive(Serialize, Debug)]
pub struct Installed {
    pub name: String,
    pub family: String,
    pub variant: String,
    pub storage: String,
    pub bytes: u64,
    pub path: PathBuf,
}

/// The models installed in `models` (directories holding a `pulled.json`),
/// sorted by name. A missing models directory holds none.
pub fn list(models: &Path) -> Result<Vec<Installed>, String> {
    let entries = match std::fs::read_dir(models) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("models directory {}: {e}", models.display())),
    };
    let mut out = Vec::new();
    for entry in entries.flatten().take(10_000) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let dir = entry.path();
        let Ok(text) = std::fs::read_to_string(dir.join(RECORD)) else { continue };
        let record: Record = match serde_json::from_str(&text) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("{}: {e}; skipped", dir.join(RECORD).display());
                continue;
            }
        };
        let bytes = std::fs::read_dir(&dir).map(|d| d.flatten().filter_map(|e| e.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum()).unwrap_or(0);
        out.push(Installed { name, family: record.family, variant: record.variant, storage: record.storage, bytes, path: dir });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// `tts models` as a table.
pub fn render(models: &Path, installed: &[Installed]) -> String {
    if installed.is_empty() {
        let mut out = format!("no models in {}; `tts pull NAME` installs one of:\n", models.display());
        for e in catalog::entries() {
            out += &format!("  {:<26} {}\n", e.name, e.about);
        }
        return out;
    }
    let mut out = format!("{:<26} {:<11} {:<8} {:<7} {:>10}  {}\n", "NAME", "FAMILY", "VARIANT", "STORAGE", "SIZE", "PATH");
    for m in installed {
        out += &format!("{:<26} {:<11} {:<8} {:<7} {:>10}  {}\n", m.name, m.family, m.variant, m.storage, human_bytes(m.bytes), m.path.display());
    }
    out
}

fn human_bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.2} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

/// `tts models rm NAME`: removes an installed model (a directory with a
/// `pulled.json`; nothing else is ever removed). It disappears at once (a
/// rename), then its files are deleted.
pub fn remove(models: &Path, name: &str) -> Result<PathBuf, String> {
    check_name(name)?;
    let dir = models.join(name);
    if !dir.join(RECORD).is_file() {
        let known: Vec<String> = list(models)?.into_iter().map(|m| m.name).collect();
        let known = if known.is_empty() { "none is installed".to_string() } else { format!("installed: {}", known.join(", ")) };
        return Err(format!("no pulled model `{name}` in {} ({known})", models.display()));
    }
    let aside = tempfile::Builder::new()
        .prefix(&format!("{TEMP_PREFIX}{}-rm-", std::process::id()))
        .tempdir_in(models)
        .map_err(|e| format!("{}: {e}", models.display()))?;
    std::fs::rename(&dir, aside.path().join(name)).map_err(|e| format!("removing {}: {e}", dir.display()))?;
    aside.close().map_err(|e| format!("removing {}: {e}", dir.display()))?;
    Ok(dir)
}

/// A model name names one directory entry, never a path.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty() && !name.starts_with('.') && name.len() <= 128 && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!("`{name}` is not a model name (letters, digits, '-', '_', '.')"))
    }
}

/// The profile of the installed model `name` (`tts --model-name NAME`).
pub fn installed_profile(models_flag: Option<&Path>, name: &str) -> Result<PathBuf, String> {
    check_name(name)?;
    let models = models_dir(models_flag)?;
    let profile = models.join(name).join(PROFILE);
    if profile.is_file() {
        return Ok(profile);
    }
    let hint = if catalog::entries().iter().any(|e| e.name == name) {
        format!("run `tts pull {name}`")
    } else {
        let names: Vec<String> = catalog::entries().into_iter().map(|e| e.name).collect();
        format!("`tts pull NAME` installs one of: {}", names.join(", "))
    };
    Err(format!("model `{name}` is not pulled (no {}); {hint}", profile.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates_are_civil() {
        assert!(utc_now().starts_with("20"));
        assert_eq!(utc_now().len(), 20);
    }

    #[test]
    fn names_never_become_paths() {
        for bad in ["", ".", "..", "../x", "a/b", ".pull-1", "a b"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        check_name("chatterbox-turbo").unwrap();
    }

    #[test]
    fn profile_lists_files_relative_to_itself() {
        let p = profile_text("x", &[RecordSource { repo: "o/n".into(), revision: "main".into(), commit: "c".into() }], &["a.gguf".into(), "b.gguf".into()]);
        let parsed: toml::Value = toml::from_str(&p).unwrap();
        assert_eq!(parsed["model"]["files"].as_array().unwrap().len(), 2);
        assert!(p.contains("from o/n@c"));
    }

    #[test]
    fn listing_skips_temporaries_and_strangers() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(".pull-1-abc")).unwrap();
        std::fs::create_dir_all(dir.path().join("not-pulled")).unwrap();
        assert!(list(dir.path()).unwrap().is_empty());
        assert!(list(&dir.path().join("absent")).unwrap().is_empty());
        assert!(remove(dir.path(), "not-pulled").unwrap_err().contains("no pulled model `not-pulled`"));
        assert!(dir.path().join("not-pulled").is_dir());
    }
}
