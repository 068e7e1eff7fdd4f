//! What `tts devices` shows, as data (serialised to JSON or rendered by the CLI).

use crate::policy::Resolution;
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct PluginReport {
    pub kind: &'static str,
    pub name: String,
    pub path: String,
    pub loaded: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The plugin ABI it was built against (an older minor runs adapted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub abi: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct DeviceReport {
    pub index: u32,
    pub name: String,
    pub description: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bus_id: Option<String>,
    pub kind: &'static str,
    pub memory_free: u64,
    pub memory_total: u64,
    pub probes: Vec<ProbeReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policies: Option<Resolution>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ProbeReport {
    pub name: String,
    pub supported: bool,
    pub detail: String,
}

#[derive(Debug, Serialize)]
pub struct BackendReport {
    pub name: String,
    pub preferred: bool,
    pub available: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub module: Vec<(String, String)>,
    pub devices: Vec<DeviceReport>,
}

#[derive(Debug, Serialize)]
pub struct Selection {
    pub backend: String,
    pub device: u32,
    pub device_name: String,
}

#[derive(Debug, Serialize)]
pub struct DevicesReport {
    pub host_version: String,
    pub plugin_abi: String,
    pub ggml_version: String,
    pub profile: String,
    /// Every file named libggml-base mapped into this process (one expected).
    pub ggml_base_loaded: Vec<String>,
    pub plugin_dirs: Vec<String>,
    pub plugins: Vec<PluginReport>,
    pub backends: Vec<BackendReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selected: Option<Selection>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selection_error: Option<String>,
}

/// What `tts options` shows: every option of the profile's model family and backends.
#[derive(Debug, Serialize)]
pub struct OptionsReport {
    /// `[synthesis]` of the model family the profile's model file needs.
    pub model: Option<OptionGroup>,
    /// `[backends.<name>]` of each backend plugin the profile opened.
    pub backends: Vec<OptionGroup>,
}

#[derive(Debug, Serialize)]
pub struct OptionGroup {
    /// The profile table the options go in.
    pub section: String,
    /// The model family or backend that declares them.
    pub owner: String,
    pub options: Vec<OptionRow>,
}

#[derive(Debug, Serialize)]
pub struct OptionRow {
    pub key: String,
    pub kind: &'static str,
    /// The default as TOML would write it.
    pub default: String,
    pub help: String,
}

impl OptionRow {
    pub fn from_spec(spec: &crate::abi::OptionSpec) -> OptionRow {
        use crate::abi::OptionValue;
        let default = match &spec.default {
            OptionValue::Bool(b) => b.to_string(),
            OptionValue::Int(i) => i.to_string(),
            OptionValue::Float(f) => format!("{f:?}"),
            OptionValue::Str(s) => format!("{:?}", s.as_str()),
        };
        OptionRow { key: spec.key.to_string(), kind: spec.kind.as_str(), default, help: spec.help.to_string() }
    }
}
