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
