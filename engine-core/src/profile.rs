//! The TOML profile: which plugins, backend and device to use, per-backend options,
//! policies, deny-lists, model files and synthesis defaults. Reference:
//! `docs/profile.md`. Every error names the file, line and key.

use crate::abi::{OptionKind, OptionList, OptionSpec, OptionValue};
use crate::policy::{DenyRule, PolicyConfig};
use abi_stable::std_types::Tuple2;
use indexmap::IndexMap;
use serde::Deserialize;
use std::ops::Range;
use std::path::{Path, PathBuf};
use toml::Spanned;

/// The profile compiled into the binary; used when `--profile` is not given.
pub const EMBEDDED_DEFAULT: &str = include_str!("../../profiles/default.toml");

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileError {
    pub origin: String,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl std::fmt::Display for ProfileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.origin, self.message)
        } else {
            write!(f, "{}:{}:{}: {}", self.origin, self.line, self.column, self.message)
        }
    }
}

impl std::error::Error for ProfileError {}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    #[serde(default)]
    plugins: PluginsSection,
    #[serde(default)]
    backend: BackendSection,
    #[serde(default)]
    backends: IndexMap<String, IndexMap<String, Spanned<toml::Value>>>,
    #[serde(default)]
    policies: PolicyConfig,
    #[serde(default)]
    deny: Vec<RawDenyRule>,
    #[serde(default)]
    model: ModelSection,
    #[serde(default)]
    synthesis: IndexMap<String, Spanned<toml::Value>>,
    #[serde(default)]
    server: ServerSection,
}

/// `[server]`: what `tts serve` does with this profile's model.
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct ServerSection {
    /// OpenAI voice name -> a voice of this model (`alloy = "F2"`); the
    /// server checks both sides when it loads the model.
    #[serde(default)]
    voices: IndexMap<String, Spanned<String>>,
}

#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub struct PluginsSection {
    /// Directories searched for plugin files; relative to the profile.
    #[serde(default)]
    pub dirs: Vec<PathBuf>,
}

/// How the device is chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceChoice {
    /// Best device of the first available backend: discrete > integrated > CPU.
    Auto,
    /// A ggml device name ("Vulkan0") or a bus id ("0000:01:00.0").
    Name(String),
    /// An index into the chosen backend's device list.
    Index(u32),
}

impl std::fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceChoice::Auto => write!(f, "auto"),
            DeviceChoice::Name(n) => write!(f, "\"{n}\""),
            DeviceChoice::Index(i) => write!(f, "{i}"),
        }
    }
}

/// `device`: "auto", a name, or a non-negative index (kept as a TOML value so
/// the error for anything else can say what is accepted).
type RawDeviceChoice = toml::Value;

#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct BackendSection {
    #[serde(default = "default_prefer")]
    prefer: Vec<String>,
    #[serde(default)]
    device: Option<Spanned<RawDeviceChoice>>,
    /// When false, only the first backend in `prefer` may be used.
    #[serde(default = "yes")]
    fallback: bool,
    /// The most device memory a model may plan to use ("6 GiB", "512MiB"),
    /// below the device's free memory; unset: the free memory.
    #[serde(default)]
    memory_budget: Option<Spanned<String>>,
}

impl Default for BackendSection {
    fn default() -> Self {
        BackendSection { prefer: default_prefer(), device: None, fallback: true, memory_budget: None }
    }
}

/// Bytes of a size written as a number and a unit: `B`, binary `KiB`
/// `MiB` `GiB` `TiB`, or decimal `kB` `MB` `GB` `TB`, with or without a
/// space ("1.5 GiB", "512MiB", "4096 B").
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = (&t[..split], t[split..].trim());
    let scale: f64 = match unit {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024f64.powi(2),
        "GiB" => 1024f64.powi(3),
        "TiB" => 1024f64.powi(4),
        "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        _ => return Err(format!("{text:?} is not a size: give a number and a unit (B, KiB, MiB, GiB, TiB, kB, MB, GB, TB), e.g. \"6 GiB\"")),
    };
    let value: f64 = number.parse().map_err(|_| format!("{text:?} is not a size: {number:?} is not a number"))?;
    let bytes = value * scale;
    if !(1.0..=u64::MAX as f64).contains(&bytes) {
        return Err(format!("{text:?} is not a size of at least one byte"));
    }
    Ok(bytes.round() as u64)
}

fn default_prefer() -> Vec<String> {
    vec!["cuda".into(), "metal".into(), "vulkan".into(), "opencl".into(), "cpu".into()]
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct RawDenyRule {
    device: String,
    #[serde(default)]
    backend: Option<String>,
    #[serde(default)]
    features: Vec<Spanned<String>>,
    #[serde(default)]
    ops: Vec<Spanned<String>>,
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct ModelSection {
    #[serde(default)]
    files: Vec<PathBuf>,
}

/// A parsed, validated profile.
#[derive(Debug, Clone)]
pub struct Profile {
    origin: String,
    source: String,
    /// Directory relative paths resolve against (the profile's own; cwd when embedded).
    pub base_dir: PathBuf,
    pub plugin_dirs: Vec<PathBuf>,
    pub prefer: Vec<String>,
    pub device: DeviceChoice,
    pub fallback: bool,
    /// `[backend] memory_budget`: the most device memory a load may plan for.
    pub memory_budget: Option<u64>,
    backend_options: IndexMap<String, IndexMap<String, Spanned<toml::Value>>>,
    pub policies: PolicyConfig,
    pub deny: Vec<DenyRule>,
    pub model_files: Vec<PathBuf>,
    synthesis: IndexMap<String, Spanned<toml::Value>>,
    server_voices: IndexMap<String, Spanned<String>>,
}

impl Profile {
    pub fn load(path: &Path) -> Result<Profile, ProfileError> {
        let origin = path.display().to_string();
        let error = |message: String| ProfileError { origin: origin.clone(), line: 0, column: 0, message };
        // A profile is untrusted input like any other: a regular file, capped.
        let bytes =
            crate::model_kit::files::read_regular(path, "", crate::model_kit::files::caps::PROFILE).map_err(|e| error(format!("cannot read profile: {e}")))?;
        let source = String::from_utf8(bytes)
            .map_err(|e| error(format!("cannot read profile: not UTF-8 text (invalid byte at offset {})", e.utf8_error().valid_up_to())))?;
        let base = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf();
        Profile::parse(&source, &origin, &base)
    }

    pub fn embedded_default() -> Profile {
        Profile::parse(EMBEDDED_DEFAULT, "<embedded default profile>", Path::new(".")).expect("the embedded default profile is valid")
    }

    pub fn parse(source: &str, origin: &str, base_dir: &Path) -> Result<Profile, ProfileError> {
        let raw: RawProfile = toml::from_str(source).map_err(|e| {
            let (line, column) = e.span().map(|s| line_col(source, s.start)).unwrap_or((0, 0));
            let mut message = e.message().trim().replace('\n', " ");
            if let Some(key) = e.span().and_then(|s| key_at(source, s.start)) {
                if !message.contains(&format!("`{key}`")) {
                    message = format!("key `{key}`: {message}");
                }
            }
            ProfileError { origin: origin.to_string(), line, column, message }
        })?;
        let at = |span: Range<usize>, message: String| {
            let (line, column) = line_col(source, span.start);
            ProfileError { origin: origin.to_string(), line, column, message }
        };

        let device = match &raw.backend.device {
            None => DeviceChoice::Auto,
            Some(d) => match d.get_ref() {
                toml::Value::String(n) if n == "auto" => DeviceChoice::Auto,
                toml::Value::String(n) if !n.is_empty() => DeviceChoice::Name(n.clone()),
                toml::Value::Integer(i) if u32::try_from(*i).is_ok() => DeviceChoice::Index(*i as u32),
                other => {
                    let found = match other {
                        toml::Value::String(_) => "an empty name".to_string(),
                        toml::Value::Integer(i) => i.to_string(),
                        v => format!("a {}", v.type_str()),
                    };
                    return Err(at(
                        d.span(),
                        format!("key `device`: use \"auto\", a device name like \"Vulkan0\", a bus id like \"0000:01:00.0\", or a device index 0..={}; found {found}", u32::MAX),
                    ));
                }
            },
        };
        let memory_budget = match &raw.backend.memory_budget {
            None => None,
            Some(b) => Some(parse_size(b.get_ref()).map_err(|e| at(b.span(), format!("key `memory_budget`: {e}")))?),
        };
        if raw.backend.prefer.is_empty() {
            return Err(ProfileError {
                origin: origin.into(),
                line: find_line(source, "prefer"),
                column: 1,
                message: "key `prefer`: list at least one backend".into(),
            });
        }

        let mut deny = Vec::new();
        for (i, rule) in raw.deny.iter().enumerate() {
            for f in &rule.features {
                if !crate::policy::FEATURES.contains(&f.get_ref().as_str()) {
                    return Err(at(
                        f.span(),
                        format!("deny rule {}: unknown feature `{}` (known: {})", i + 1, f.get_ref(), crate::policy::FEATURES.join(", ")),
                    ));
                }
            }
            for op in &rule.ops {
                if !known_op(op.get_ref()) {
                    return Err(at(op.span(), format!("deny rule {}: unknown ggml op `{}`", i + 1, op.get_ref())));
                }
            }
            let matcher = globset::GlobBuilder::new(&rule.device)
                .case_insensitive(true)
                .build()
                .map_err(|e| ProfileError {
                    origin: origin.into(),
                    line: find_line(source, &rule.device),
                    column: 1,
                    message: format!("deny rule {}: bad device pattern: {e}", i + 1),
                })?
                .compile_matcher();
            deny.push(DenyRule {
                number: i + 1,
                device_pattern: rule.device.clone(),
                matcher,
                backend: rule.backend.clone(),
                features: rule.features.iter().map(|f| f.get_ref().clone()).collect(),
                ops: rule.ops.iter().map(|f| f.get_ref().to_uppercase()).collect(),
                reason: rule.reason.clone(),
            });
        }

        let resolve = |p: &PathBuf| {
            if p.is_absolute() {
                p.clone()
            } else {
                base_dir.join(p)
            }
        };
        Ok(Profile {
            origin: origin.into(),
            source: source.into(),
            base_dir: base_dir.to_path_buf(),
            plugin_dirs: raw.plugins.dirs.iter().map(resolve).collect(),
            prefer: raw.backend.prefer.clone(),
            device,
            fallback: raw.backend.fallback,
            memory_budget,
            backend_options: raw.backends,
            policies: raw.policies,
            deny,
            model_files: raw.model.files.iter().map(resolve).collect(),
            synthesis: raw.synthesis,
            server_voices: raw.server.voices,
        })
    }

    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// `[server.voices]`: (OpenAI voice name, the model's voice), in the
    /// file's order.
    pub fn server_voices(&self) -> Vec<(String, String)> {
        self.server_voices.iter().map(|(k, v)| (k.clone(), v.get_ref().clone())).collect()
    }

    /// An error about `[server.voices]`'s entry for `name`, at its line.
    pub fn server_voice_error(&self, name: &str, message: String) -> ProfileError {
        let (line, column) = self.server_voices.get(name).map_or((0, 0), |v| line_col(&self.source, v.span().start));
        ProfileError { origin: self.origin.clone(), line, column, message }
    }

    /// Validates `[backends.<name>]` against a plugin's option specs, filling defaults.
    pub fn backend_options(&self, backend: &str, specs: &[OptionSpec]) -> Result<OptionList, ProfileError> {
        let empty = IndexMap::new();
        let table = self.backend_options.get(backend).unwrap_or(&empty);
        self.validate_options(&format!("[backends.{backend}]"), &format!("the {backend} backend"), table, specs)
    }

    /// Validates `[synthesis]` (plus command-line overrides) against the specs
    /// of the model plugin of `family` that loads the model.
    pub fn synthesis_options(&self, family: &str, specs: &[OptionSpec], overrides: &[(String, String)]) -> Result<OptionList, ProfileError> {
        let owner = format!("the {family} model (is this profile written for another model family?)");
        let mut list = self.validate_options("[synthesis]", &owner, &self.synthesis, specs)?;
        apply_overrides(&mut list, family, specs, overrides).map_err(|message| ProfileError { origin: "command line".into(), line: 0, column: 0, message })?;
        Ok(list)
    }

    /// `owner` names who takes the options, for the unknown-key message.
    fn validate_options(
        &self,
        table_name: &str,
        owner: &str,
        table: &IndexMap<String, Spanned<toml::Value>>,
        specs: &[OptionSpec],
    ) -> Result<OptionList, ProfileError> {
        let at = |span: Range<usize>, message: String| {
            let (line, column) = line_col(&self.source, span.start);
            ProfileError { origin: self.origin.clone(), line, column, message }
        };
        for (key, value) in table {
            if !specs.iter().any(|s| s.key.as_str() == key) {
                let (takes, rest) = owner.split_once(" (").map_or((owner, String::new()), |(a, b)| (a, format!(" ({b}")));
                return Err(at(value.span(), format!("unknown key `{key}` in {table_name}: {takes} takes {}{rest}", spec_keys(specs))));
            }
        }
        let mut out = OptionList::new();
        for spec in specs {
            let value = match table.get(spec.key.as_str()) {
                None => spec.default.clone(),
                Some(v) => convert(spec, v.get_ref(), &self.base_dir).map_err(|m| at(v.span(), format!("key `{}` in {table_name}: {m}", spec.key)))?,
            };
            out.push(Tuple2(spec.key.clone(), value));
        }
        Ok(out)
    }
}

fn spec_keys(specs: &[OptionSpec]) -> String {
    if specs.is_empty() {
        "none".into()
    } else {
        specs.iter().map(|s| s.key.as_str()).collect::<Vec<_>>().join(", ")
    }
}

fn convert(spec: &OptionSpec, value: &toml::Value, base: &Path) -> Result<OptionValue, String> {
    let wrong = || format!("expected {}, found {}", spec.kind.with_article(), value.type_str());
    Ok(match (spec.kind, value) {
        (OptionKind::Bool, toml::Value::Boolean(b)) => OptionValue::Bool(*b),
        (OptionKind::Int, toml::Value::Integer(i)) => OptionValue::Int(*i),
        (OptionKind::Float, toml::Value::Float(f)) if !f.is_finite() => return Err(format!("expected a finite float, found {f}")),
        (OptionKind::Float, toml::Value::Float(f)) => OptionValue::Float(*f),
        (OptionKind::Float, toml::Value::Integer(i)) => OptionValue::Float(*i as f64),
        (OptionKind::Str, toml::Value::String(s)) => OptionValue::Str(s.as_str().into()),
        (OptionKind::Path, toml::Value::String(s)) if s.is_empty() => OptionValue::Str("".into()),
        (OptionKind::Path, toml::Value::String(s)) => {
            let p = Path::new(s);
            let p = if p.is_absolute() { p.to_path_buf() } else { base.join(p) };
            OptionValue::Str(p.to_string_lossy().as_ref().into())
        }
        _ => return Err(wrong()),
    })
}

/// Sets `overrides` (`key`, text) in a validated option list, each parsed as
/// its spec's kind; the error names the key (`option `speed`: ...`) or the
/// unknown key with the known ones.
pub fn apply_overrides(list: &mut OptionList, family: &str, specs: &[OptionSpec], overrides: &[(String, String)]) -> Result<(), String> {
    apply_named_overrides(list, "synthesis option", &format!("the {family} model"), specs, overrides)
}

/// [`apply_overrides`] for options of another kind (`what`: "converter
/// option") taken by `owner` ("the chatterbox converter").
pub fn apply_named_overrides(list: &mut OptionList, what: &str, owner: &str, specs: &[OptionSpec], overrides: &[(String, String)]) -> Result<(), String> {
    for (key, text) in overrides {
        let spec = specs.iter().find(|s| s.key.as_str() == key).ok_or_else(|| format!("unknown {what} `{key}` for {owner} (known: {})", spec_keys(specs)))?;
        let value = parse_override(spec, text).map_err(|message| format!("option `{key}`: {message}"))?;
        for Tuple2(k, v) in list.iter_mut() {
            if k.as_str() == key {
                *v = value.clone();
            }
        }
    }
    Ok(())
}

fn parse_override(spec: &OptionSpec, text: &str) -> Result<OptionValue, String> {
    let bad = || format!("`{text}` is not {}", spec.kind.with_article());
    Ok(match spec.kind {
        OptionKind::Bool => OptionValue::Bool(text.parse().map_err(|_| bad())?),
        OptionKind::Int => OptionValue::Int(text.parse().map_err(|_| match text.trim().parse::<i128>() {
            Ok(_) => format!("`{text}` is out of range for an integer option ({}..={})", i64::MIN, i64::MAX),
            Err(_) => bad(),
        })?),
        OptionKind::Float => match text.parse::<f64>() {
            Ok(f) if f.is_finite() => OptionValue::Float(f),
            Ok(_) => return Err(format!("`{text}` is not a finite float")),
            Err(_) => return Err(bad()),
        },
        OptionKind::Str | OptionKind::Path => OptionValue::Str(text.into()),
    })
}

fn known_op(name: &str) -> bool {
    let upper = name.to_uppercase();
    (0..ggml_sys::sys::GGML_OP_COUNT).any(|op| ggml_sys::op_name(op) == upper)
}

/// 1-based line and column of a byte offset.
pub fn line_col(source: &str, offset: usize) -> (usize, usize) {
    let before = &source[..offset.min(source.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// The key assigned on the line holding `offset`, if that line is `key = value`.
fn key_at(source: &str, offset: usize) -> Option<String> {
    let start = source[..offset.min(source.len())].rfind('\n').map_or(0, |i| i + 1);
    let line = source[start..].lines().next()?;
    let (key, _) = line.split_once('=')?;
    let key = key.trim().trim_matches('"');
    (!key.is_empty() && !key.starts_with('[')).then(|| key.to_string())
}

fn find_line(source: &str, needle: &str) -> usize {
    source.lines().position(|l| l.contains(needle)).map_or(0, |i| i + 1)
}
