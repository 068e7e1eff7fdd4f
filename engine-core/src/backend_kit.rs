//! What every backend plugin does the same way: load its stamped ggml module from
//! beside the plugin file, list devices, probe them (cached per device) and hand
//! out [`BackendHandle`]s. A plugin supplies a [`BackendFlavor`] for the parts
//! that differ (device classification, extra probes, per-device init).

use crate::abi::{
    find_option, BackendHandle, BackendOpenRequest, BackendSession, BackendSessionBox, BackendSession_TO, DeviceInfo, DeviceKind, OptionList, OptionValue,
    ProbeResult,
};
use crate::probes;
use abi_stable::std_types::{RResult, RString, RVec, Tuple2};
use ggml_sys::{Device, Registry};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A GPU backend's device kind as ggml reports it: a discrete or an
/// integrated GPU, anything else an accelerator.
pub fn gpu_kind(device: &Device) -> DeviceKind {
    match device.kind() {
        ggml_sys::DeviceKind::IntegratedGpu => DeviceKind::IntegratedGpu,
        ggml_sys::DeviceKind::Gpu => DeviceKind::Gpu,
        _ => DeviceKind::Accelerator,
    }
}

/// The backend-specific parts of a plugin.
pub trait BackendFlavor: Send + Sync + 'static {
    /// Classifies a ggml device; `None` hides it (e.g. software devices not allowed).
    fn classify(&self, registry: &Registry, index: usize, device: &Device) -> Option<DeviceKind>;
    /// Adjusts or extends the common probe results for a device (`index` is
    /// its index in the ggml registry, as for [`BackendFlavor::classify`]).
    fn adjust_probes(&self, _index: usize, _device: &Device, _results: &mut Vec<ProbeResult>) {}
    /// Called on a freshly initialised backend (threads, ...). Returns the thread count.
    fn configure(&self, _backend: &ggml_sys::Backend) -> u32 {
        0
    }
}

/// A module stamp as written by the build (see `ggml-build-support`).
struct Stamp {
    json: serde_json::Value,
}

impl Stamp {
    fn field(&self, key: &str) -> String {
        self.json.get(key).and_then(|v| v.as_str()).unwrap_or("").to_string()
    }
}

/// Checks a module against the stamp the plugin was built with: same ggml version,
/// same source, same patch series, and the file's hash matches its own stamp (not
/// swapped or truncated after stamping). This is also how a module built elsewhere
/// (CUDA with nvcc on a GPU host) is accepted: it must carry a stamp from the same
/// pinned source and patches.
fn verify_stamp(module: &Path, expected: &Stamp) -> Result<Stamp, String> {
    let stamp_path = PathBuf::from(format!("{}.stamp.json", module.display()));
    let text = std::fs::read_to_string(&stamp_path).map_err(|_| {
        format!("ggml module {} has no build stamp {} (was it built from this project's pinned source?)", module.display(), stamp_path.display())
    })?;
    let found = Stamp { json: serde_json::from_str(&text).map_err(|e| format!("{}: not a valid stamp: {e}", stamp_path.display()))? };
    for key in ["ggml_version", "source_fingerprint", "patches_fingerprint"] {
        if found.field(key) != expected.field(key) {
            return Err(format!(
                "ggml module {} does not match this plugin: {key} is {} in its stamp, the plugin expects {}",
                module.display(),
                found.field(key),
                expected.field(key)
            ));
        }
    }
    let bytes = std::fs::read(module).map_err(|e| format!("{}: {e}", module.display()))?;
    let sha = hex::encode(Sha256::digest(&bytes));
    if sha != found.field("module_sha256") {
        let short = |s: &str| s.chars().take(12).collect::<String>();
        return Err(format!(
            "ggml module {} was modified after it was stamped (sha256 {} != {})",
            module.display(),
            short(&sha),
            short(&found.field("module_sha256"))
        ));
    }
    Ok(found)
}

/// ggml's own suitability score of a module for this machine (CPU variants check
/// the ISA; 0 = cannot run here). Modules without a score function count as 1.
fn module_score(module: &Path) -> Result<i32, String> {
    // Loading runs the module's code: the same trust rule as plugins.
    crate::loader::check_trusted(module).map_err(|e| format!("ggml module {} is not loaded: {e}", module.display()))?;
    let lib = unsafe { libloading::Library::new(module) }.map_err(|e| format!("{}: {e}", module.display()))?;
    let score = unsafe { lib.get::<unsafe extern "C" fn() -> i32>(b"ggml_backend_score\0") }.map(|f| unsafe { f() }).unwrap_or(1);
    Ok(score)
}

/// Loads the module family `<stem>` from beside the plugin: `<stem>.so`, or among
/// `<stem>-*.so` variants the best-scoring one this machine can run. Every
/// candidate must pass [`verify_stamp`].
pub fn load_stamped_module(plugin_path: &Path, stem: &str, expected_stamp: &str) -> Result<(Registry, OptionList), String> {
    let dir = plugin_path.parent().unwrap_or(Path::new("."));
    let expected = Stamp { json: serde_json::from_str(expected_stamp).map_err(|e| format!("plugin's compiled-in stamp: {e}"))? };
    let mut candidates: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
            name == format!("{stem}.so") || (name.starts_with(&format!("{stem}-")) && name.ends_with(".so"))
        })
        .collect();
    candidates.sort();
    if candidates.is_empty() {
        return Err(format!("ggml module {} is missing (it ships beside the plugin)", dir.join(format!("{stem}.so")).display()));
    }
    let mut rejected = Vec::new();
    let mut best: Option<(i32, PathBuf, Stamp)> = None;
    for module in candidates {
        let checked = verify_stamp(&module, &expected).and_then(|stamp| Ok((module_score(&module)?, stamp)));
        match checked {
            Ok((0, _)) => rejected.push(format!("{} cannot run on this machine (ggml score 0)", module.display())),
            Ok((score, stamp)) => {
                if best.as_ref().is_none_or(|(s, _, _)| score > *s) {
                    best = Some((score, module, stamp));
                }
            }
            Err(e) => rejected.push(e),
        }
    }
    let Some((score, module, found)) = best else {
        return Err(rejected.join("; "));
    };
    let registry = ggml_sys::load_backend_module(&module).map_err(|e| e.to_string())?;
    let mut facts: Vec<(String, OptionValue)> = vec![
        ("module".into(), OptionValue::Str(module.display().to_string().into())),
        ("module_score".into(), OptionValue::Int(score as i64)),
        ("registry".into(), OptionValue::Str(registry.name().into())),
        ("ggml_version".into(), OptionValue::Str(found.field("ggml_version").into())),
        ("patches_fingerprint".into(), OptionValue::Str(found.field("patches_fingerprint").into())),
    ];
    for r in rejected {
        facts.push(("rejected_module".into(), OptionValue::Str(r.into())));
    }
    for (k, v) in registry.features() {
        facts.push((format!("feature.{k}"), OptionValue::Str(v.into())));
    }
    Ok((registry, crate::abi::option_list(facts)))
}

/// Exports a backend plugin's root module and its `info()`: the crate defines
/// `option_specs()` and `open(request)`; `backend_plugin!("cuda", "ggml CUDA
/// backend")` does the rest (the version is the plugin crate's own).
#[macro_export]
macro_rules! backend_plugin {
    ($name:literal, $description:literal) => {
        #[::abi_stable::export_root_module]
        pub fn get_library() -> $crate::abi::BackendPluginRef {
            use ::abi_stable::prefix_type::PrefixTypeTrait;
            $crate::abi::BackendPlugin { info, option_specs, open }.leak_into_prefix()
        }

        extern "C" fn info() -> $crate::abi::PluginInfo {
            $crate::abi::plugin_info($name, env!("CARGO_PKG_VERSION"), $description)
        }
    };
}

/// Loads the ggml module this backend plugin was built with, from beside the
/// plugin file named in `request`, checking it against the stamp compiled into the
/// plugin (`TTS_MODULE_STEM` / `TTS_MODULE_STAMP`, set by the plugin's build script
/// through `ggml_build_support::build_backend_module`).
#[macro_export]
macro_rules! load_plugin_module {
    ($request:expr) => {
        $crate::backend_kit::load_stamped_module(::std::path::Path::new($request.plugin_path.as_str()), env!("TTS_MODULE_STEM"), env!("TTS_MODULE_STAMP"))
    };
}

struct DeviceEntry {
    info: DeviceInfo,
    /// Index in the ggml registry (the module's own numbering).
    registry_index: usize,
    device: Device,
    probes: Mutex<Option<Vec<ProbeResult>>>,
}

/// A [`BackendSession`] over a loaded module's devices.
pub struct GgmlSession<F: BackendFlavor> {
    flavor: F,
    devices: Vec<DeviceEntry>,
    facts: OptionList,
}

impl<F: BackendFlavor> GgmlSession<F> {
    pub fn new(flavor: F, registry: Registry, facts: OptionList) -> Self {
        let devices = registry
            .devices()
            .into_iter()
            .enumerate()
            .filter_map(|(i, device)| {
                let kind = flavor.classify(&registry, i, &device)?;
                Some((i, device, kind))
            })
            .enumerate()
            .map(|(index, (registry_index, device, kind))| {
                let (free, total) = device.memory();
                DeviceEntry {
                    info: DeviceInfo {
                        index: index as u32,
                        name: device.name().into(),
                        description: device.description().into(),
                        bus_id: device.bus_id().unwrap_or_default().into(),
                        kind,
                        memory_free: free as u64,
                        memory_total: total as u64,
                    },
                    registry_index,
                    device,
                    probes: Mutex::new(None),
                }
            })
            .collect();
        GgmlSession { flavor, devices, facts }
    }

    pub fn into_box(self) -> BackendSessionBox {
        BackendSession_TO::from_value(self, abi_stable::sabi_trait::TD_Opaque)
    }

    fn entry(&self, index: u32) -> Result<&DeviceEntry, RString> {
        self.devices.get(index as usize).ok_or_else(|| format!("no device {index} (this backend has {})", self.devices.len()).into())
    }
}

extern "C" fn free_backend(p: *mut std::ffi::c_void) {
    unsafe { ggml_sys::Backend::free_raw(p.cast()) }
}

impl<F: BackendFlavor> BackendSession for GgmlSession<F> {
    fn devices(&self) -> RVec<DeviceInfo> {
        self.devices.iter().map(|d| d.info.clone()).collect()
    }

    fn probe(&self, device: u32) -> RResult<RVec<ProbeResult>, RString> {
        let entry = match self.entry(device) {
            Ok(e) => e,
            Err(e) => return RResult::RErr(e),
        };
        let mut cache = entry.probes.lock().unwrap_or_else(|p| p.into_inner());
        let results = cache.get_or_insert_with(|| {
            let mut r = probes::run_all(entry.device);
            self.flavor.adjust_probes(entry.registry_index, &entry.device, &mut r);
            r
        });
        RResult::ROk(results.iter().cloned().collect())
    }

    fn init_device(&self, device: u32) -> RResult<BackendHandle, RString> {
        let entry = match self.entry(device) {
            Ok(e) => e,
            Err(e) => return RResult::RErr(e),
        };
        match entry.device.init(None) {
            Ok(backend) => {
                let threads = self.flavor.configure(&backend);
                RResult::ROk(BackendHandle {
                    backend_name: backend.name().into(),
                    device_name: entry.info.name.clone(),
                    device: entry.device.as_ptr().cast(),
                    threads,
                    backend: backend.into_raw().cast(),
                    free: free_backend,
                })
            }
            Err(e) => RResult::RErr(e.to_string().into()),
        }
    }

    fn module_facts(&self) -> OptionList {
        self.facts.clone()
    }
}

/// Reads a validated option (the host filled defaults, so absence is a bug).
pub fn option_bool(req: &BackendOpenRequest, key: &str) -> bool {
    matches!(find_option(&req.options, key), Some(OptionValue::Bool(true)))
}

pub fn option_int(req: &BackendOpenRequest, key: &str) -> i64 {
    match find_option(&req.options, key) {
        Some(OptionValue::Int(i)) => *i,
        _ => 0,
    }
}

pub fn option_str(req: &BackendOpenRequest, key: &str) -> String {
    match find_option(&req.options, key) {
        Some(OptionValue::Str(s)) => s.to_string(),
        _ => String::new(),
    }
}

/// An `open` error that starts with this marks a bad option value: the host
/// stops with it as a profile error instead of falling back to the next
/// backend (a module that cannot load is the environment's problem; a bad
/// value is the user's, and silently using another backend would hide it).
pub const OPTION_ERROR_PREFIX: &str = "invalid option: ";

/// An `open` error for a bad `[backends.<name>]` value (see [`OPTION_ERROR_PREFIX`]).
pub fn option_error(message: impl std::fmt::Display) -> String {
    format!("{OPTION_ERROR_PREFIX}{message}")
}

/// Wraps a plugin's open function so a panic becomes an error, not an abort.
pub fn guarded_open(f: impl FnOnce() -> Result<BackendSessionBox, String> + std::panic::UnwindSafe) -> RResult<BackendSessionBox, RString> {
    crate::logging::init_from_env();
    match std::panic::catch_unwind(f) {
        Ok(Ok(s)) => RResult::ROk(s),
        Ok(Err(e)) => RResult::RErr(e.into()),
        Err(_) => RResult::RErr("backend plugin panicked while opening".into()),
    }
}

/// Convenience for option specs.
pub fn spec(key: &str, kind: crate::abi::OptionKind, default: OptionValue, help: &str) -> crate::abi::OptionSpec {
    crate::abi::OptionSpec { key: key.into(), kind, default, help: help.into() }
}

/// Module facts whose keys start with this (`refused.0`, `refused.1`, ...)
/// name a device the backend can see but not use, with the reason:
/// `tts devices` prints them, so a user learns why a GPU was passed over.
pub const REFUSED_DEVICE_FACT: &str = "refused.";

/// Appends one `refused.N` fact per refusal text to a module's facts.
pub fn add_refused_devices(facts: &mut OptionList, refusals: impl IntoIterator<Item = String>) {
    facts.extend(refusals.into_iter().enumerate().map(|(i, why)| Tuple2(format!("{REFUSED_DEVICE_FACT}{i}").into(), OptionValue::Str(why.into()))));
}

/// The refusal texts among facts read back with [`facts_to_pairs`].
pub fn refused_devices(facts: &[(String, String)]) -> Vec<&str> {
    facts.iter().filter(|(k, _)| k.starts_with(REFUSED_DEVICE_FACT)).map(|(_, v)| v.as_str()).collect()
}

pub fn facts_to_pairs(facts: &OptionList) -> Vec<(String, String)> {
    facts
        .iter()
        .map(|Tuple2(k, v)| {
            let v = match v {
                OptionValue::Bool(b) => b.to_string(),
                OptionValue::Int(i) => i.to_string(),
                OptionValue::Float(f) => f.to_string(),
                OptionValue::Str(s) => s.to_string(),
            };
            (k.to_string(), v)
        })
        .collect()
}
