//! Finding and loading plugin files. Each load checks, in order: the file exists,
//! it is a loadable library (`libloading`), it exports a plugin root module, its
//! plugin ABI version matches, every type reachable from the root module has the
//! layout this host expects (abi_stable), and it was built against the same ggml
//! source as the host. Plugins are never unloaded.

use crate::abi::{
    v5_1, v5_2, v5_3, v5_4, v5_5, BackendHandle, BackendPluginRef, ConvertOutput, ConvertRequest, ConverterInfo, MemoryPlan, MemoryPlanRequest, ModelBox,
    ModelFamilyInfo, ModelLoadRequest, ModelPluginRef, OptionSpec, PluginInfo,
};
use abi_stable::library::{lib_header_from_path, LibraryError, RootModule};
use abi_stable::std_types::{RResult, RString, RVec};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// Held while a backend opens or initialises a device. Opening a backend
/// plugin loads its ggml module into ggml's process-wide module list, which has
/// no lock (`ggml-backend-reg.cpp`): two threads opening backends at once (tests
/// on CPU and Vulkan side by side, a server loading models) could corrupt it.
/// The host is the only caller of `open` and `init_device`, so it serialises them.
pub(crate) fn ggml_registry_guard() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// File name prefixes: `libtts_backend_<name>.so`, `libtts_model_<family>.so`.
pub const BACKEND_PREFIX: &str = "libtts_backend_";
pub const MODEL_PREFIX: &str = "libtts_model_";
pub const PLUGIN_SUFFIX: &str = std::env::consts::DLL_SUFFIX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginKind {
    Backend,
    Model,
}

/// A plugin file found in a plugin directory (not loaded yet).
#[derive(Debug, Clone)]
pub struct PluginFile {
    pub kind: PluginKind,
    /// Name from the file name: "cpu", "vulkan", "supertonic".
    pub name: String,
    pub path: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("plugin file {0} does not exist")]
    Missing(PathBuf),
    #[error("plugin {path} is not a loadable library: {reason}")]
    NotLoadable { path: PathBuf, reason: String },
    #[error("{0} is a library but not a tts plugin (no plugin root module exported)")]
    NotAPlugin(PathBuf),
    #[error("plugin {path} was built for plugin ABI {found}; this host speaks plugin ABI {expected}")]
    AbiVersion { path: PathBuf, found: String, expected: String },
    #[error("plugin {path} has an incompatible ABI layout (built against a different engine-core): {detail}")]
    AbiLayout { path: PathBuf, detail: String },
    #[error("plugin {path} was built against ggml {found_version} (source {found}), the host against ggml {expected_version} (source {expected})")]
    GgmlMismatch { path: PathBuf, found: String, found_version: String, expected: String, expected_version: String },
    #[error("plugin {path} failed to initialise: {reason}")]
    Init { path: PathBuf, reason: String },
    #[error("plugin {path} is not loaded: {reason}")]
    Untrusted { path: PathBuf, reason: String },
}

/// Refuses code that someone other than this user or root could have
/// replaced, as ssh's StrictModes does for keys: the file (links followed)
/// and the directory it really lies in must be owned by root or by this
/// process's user, and writable by neither group nor others. The reason
/// names the path, the mode or owner, and the fix.
pub fn check_trusted(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let real = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let dir = real.parent().unwrap_or(Path::new("/")).to_path_buf();
    let me = unsafe { libc::geteuid() };
    for (what, p) in [("file", &real), ("directory", &dir)] {
        let m = std::fs::metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
        let mode = m.mode() & 0o7777;
        if m.uid() != 0 && m.uid() != me {
            return Err(format!("its {what} {} is owned by user {}, neither root nor this user ({me})", p.display(), m.uid()));
        }
        if mode & 0o022 != 0 {
            let who = if mode & 0o002 != 0 { "anyone" } else { "its group" };
            return Err(format!("its {what} {} is writable by {who} (mode {mode:04o}); remove that with chmod go-w", p.display()));
        }
    }
    Ok(())
}

/// Lists plugin files in `dirs` (non-recursive), sorted by kind and name. A name
/// found in an earlier directory shadows later ones.
pub fn discover(dirs: &[PathBuf]) -> Vec<PluginFile> {
    let mut found: Vec<PluginFile> = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut names: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        names.sort();
        for path in names {
            let Some(file) = path.file_name().and_then(|f| f.to_str()) else {
                continue;
            };
            let Some(stem) = file.strip_suffix(PLUGIN_SUFFIX) else {
                continue;
            };
            let (kind, name) = if let Some(n) = stem.strip_prefix(BACKEND_PREFIX) {
                (PluginKind::Backend, n)
            } else if let Some(n) = stem.strip_prefix(MODEL_PREFIX) {
                (PluginKind::Model, n)
            } else {
                continue;
            };
            if !found.iter().any(|f| f.kind == kind && f.name == name) {
                found.push(PluginFile { kind, name: name.to_string(), path });
            }
        }
    }
    found.sort_by(|a, b| (a.kind as u8, &a.name).cmp(&(b.kind as u8, &b.name)));
    found
}

/// The file name a backend plugin would have.
pub fn backend_file_name(name: &str) -> String {
    format!("{BACKEND_PREFIX}{name}{PLUGIN_SUFFIX}")
}

/// A loaded backend plugin.
#[derive(Clone, Copy)]
pub struct LoadedBackendPlugin {
    pub module: BackendPluginRef,
}

/// A loaded model plugin: built against this ABI, or against an earlier
/// minor version whose interface the host keeps (`abi::v5_5` to
/// `abi::v5_1`). The entry points the interfaces share are held as they are;
/// `load` differs, only 5.3 and later may have `load_for_cloning`, and only
/// 5.4 and later a converter.
#[derive(Clone, Copy)]
pub struct LoadedModelPlugin {
    info: extern "C" fn() -> PluginInfo,
    family: extern "C" fn() -> ModelFamilyInfo,
    option_specs: extern "C" fn() -> RVec<OptionSpec>,
    load: ModelLoader,
    load_for_cloning: Option<ModelLoader>,
    converter: Option<Converter>,
    plan_memory: Option<PlanMemoryFn>,
    abi_version: &'static str,
}

type PlanMemoryFn = extern "C" fn(&MemoryPlanRequest, &BackendHandle) -> RResult<MemoryPlan, RString>;

/// A family's converter (ABI 5.4): what it reads, and the conversion.
#[derive(Clone, Copy)]
struct Converter {
    info: extern "C" fn() -> ConverterInfo,
    convert: extern "C" fn(&ConvertRequest) -> RResult<ConvertOutput, RString>,
}

impl Converter {
    /// Both entry points or neither: a plugin that declares one without the
    /// other converts nothing.
    fn both(
        info: Option<extern "C" fn() -> ConverterInfo>,
        convert: Option<extern "C" fn(&ConvertRequest) -> RResult<ConvertOutput, RString>>,
    ) -> Option<Converter> {
        Some(Converter { info: info?, convert: convert? })
    }
}

type LoadFn = extern "C" fn(&ModelLoadRequest, &BackendHandle) -> RResult<ModelBox, RString>;

type LoadFn5_2 = extern "C" fn(&ModelLoadRequest, &BackendHandle) -> RResult<v5_2::ModelBox, RString>;

#[derive(Clone, Copy)]
enum ModelLoader {
    /// This ABI's model trait (5.5 and later).
    Current(LoadFn),
    /// The model trait of 5.2 to 5.4.
    V5_2(LoadFn5_2),
    V5_1(extern "C" fn(&ModelLoadRequest, &BackendHandle) -> RResult<v5_1::ModelBox, RString>),
}

impl ModelLoader {
    /// Loads a model; one from an earlier interface is adapted to this one.
    fn call(self, request: &ModelLoadRequest, handle: &BackendHandle) -> RResult<ModelBox, RString> {
        match self {
            ModelLoader::Current(load) => load(request, handle),
            ModelLoader::V5_2(load) => load(request, handle).map(v5_2::Legacy::adapt),
            ModelLoader::V5_1(load) => load(request, handle).map(v5_1::Legacy::adapt),
        }
    }
}

impl LoadedModelPlugin {
    fn current(m: ModelPluginRef) -> Self {
        LoadedModelPlugin {
            info: m.info(),
            family: m.family(),
            option_specs: m.option_specs(),
            load: ModelLoader::Current(m.load()),
            load_for_cloning: m.load_for_cloning().map(ModelLoader::Current),
            converter: Converter::both(m.converter(), m.convert()),
            plan_memory: m.plan_memory(),
            abi_version: crate::abi::PLUGIN_ABI_VERSION,
        }
    }

    fn v5_5(m: v5_5::ModelPluginRef) -> Self {
        LoadedModelPlugin {
            info: m.info(),
            family: m.family(),
            option_specs: m.option_specs(),
            load: ModelLoader::Current(m.load()),
            load_for_cloning: m.load_for_cloning().map(ModelLoader::Current),
            converter: Converter::both(m.converter(), m.convert()),
            plan_memory: None,
            abi_version: v5_5::PLUGIN_ABI_VERSION,
        }
    }

    fn v5_4(m: v5_4::ModelPluginRef) -> Self {
        LoadedModelPlugin {
            info: m.info(),
            family: m.family(),
            option_specs: m.option_specs(),
            load: ModelLoader::V5_2(m.load()),
            load_for_cloning: m.load_for_cloning().map(ModelLoader::V5_2),
            converter: Converter::both(m.converter(), m.convert()),
            plan_memory: None,
            abi_version: v5_4::PLUGIN_ABI_VERSION,
        }
    }

    fn v5_3(m: v5_3::ModelPluginRef) -> Self {
        LoadedModelPlugin {
            info: m.info(),
            family: m.family(),
            option_specs: m.option_specs(),
            load: ModelLoader::V5_2(m.load()),
            load_for_cloning: m.load_for_cloning().map(ModelLoader::V5_2),
            converter: None,
            plan_memory: None,
            abi_version: v5_3::PLUGIN_ABI_VERSION,
        }
    }

    fn v5_2(m: v5_2::ModelPluginRef) -> Self {
        LoadedModelPlugin {
            info: m.info(),
            family: m.family(),
            option_specs: m.option_specs(),
            load: ModelLoader::V5_2(m.load()),
            load_for_cloning: None,
            converter: None,
            plan_memory: None,
            abi_version: v5_2::PLUGIN_ABI_VERSION,
        }
    }

    fn v5_1(m: v5_1::ModelPluginRef) -> Self {
        LoadedModelPlugin {
            info: m.info(),
            family: m.family(),
            option_specs: m.option_specs(),
            load: ModelLoader::V5_1(m.load()),
            load_for_cloning: None,
            converter: None,
            plan_memory: None,
            abi_version: v5_1::PLUGIN_ABI_VERSION,
        }
    }

    pub fn info(&self) -> PluginInfo {
        (self.info)()
    }

    pub fn family(&self) -> ModelFamilyInfo {
        (self.family)()
    }

    pub fn option_specs(&self) -> RVec<OptionSpec> {
        (self.option_specs)()
    }

    /// Loads a model; one from an earlier interface is adapted to this one.
    pub fn load(&self, request: &ModelLoadRequest, handle: &BackendHandle) -> RResult<ModelBox, RString> {
        self.load.call(request, handle)
    }

    /// Whether the plugin loads a model only to clone voices (ABI 5.3).
    pub fn has_cloning_load(&self) -> bool {
        self.load_for_cloning.is_some()
    }

    /// Loads a model only to clone voices, where the plugin can; else the
    /// full model ([`load`](Self::load)), which clones as well.
    pub fn load_for_cloning(&self, request: &ModelLoadRequest, handle: &BackendHandle) -> RResult<ModelBox, RString> {
        match self.load_for_cloning {
            Some(load) => load.call(request, handle),
            None => self.load(request, handle),
        }
    }

    /// What the family's converter reads (ABI 5.4); `None` where it has none.
    pub fn converter(&self) -> Option<ConverterInfo> {
        self.converter.map(|c| (c.info)())
    }

    /// Converts a checkpoint with the family's converter; an error where it
    /// has none.
    pub fn convert(&self, request: &ConvertRequest) -> RResult<ConvertOutput, RString> {
        match self.converter {
            Some(c) => (c.convert)(request),
            None => RResult::RErr(RString::from(format!("the {} plugin (ABI {}) has no converter", self.family().family, self.abi_version))),
        }
    }

    /// The device memory a load of `request` and a synthesis at its options'
    /// limits need (ABI 5.6); `None` where the family sizes nothing (or was
    /// built before 5.6).
    pub fn plan_memory(&self, request: &MemoryPlanRequest, handle: &BackendHandle) -> Option<RResult<MemoryPlan, RString>> {
        self.plan_memory.map(|plan| plan(request, handle))
    }

    /// The plugin ABI version the plugin was built against.
    pub fn abi_version(&self) -> &'static str {
        self.abi_version
    }
}

pub fn load_backend(path: &Path) -> Result<(LoadedBackendPlugin, PluginInfo), PluginError> {
    let module: BackendPluginRef = load_root(path)?;
    let info = (module.info())();
    check_ggml(path, &info)?;
    tracing::debug!(plugin = %path.display(), name = %info.name, version = %info.version, "backend plugin loaded");
    Ok((LoadedBackendPlugin { module }, info))
}

/// Loads a model plugin through the current interface or, when abi_stable
/// refuses it for that one (an older minor version), through the interface of
/// ABI 5.5, then 5.4, 5.3, 5.2 and 5.1 (newest first: a 5.3 plugin would pass 5.2's
/// check too, and lose what it has); the error reported is the current
/// interface's.
pub fn load_model(path: &Path) -> Result<(LoadedModelPlugin, PluginInfo), PluginError> {
    let module = match load_root::<ModelPluginRef>(path) {
        Ok(m) => LoadedModelPlugin::current(m),
        Err(current @ (PluginError::AbiVersion { .. } | PluginError::AbiLayout { .. })) => {
            if let Ok(m) = load_root::<v5_5::ModelPluginRef>(path) {
                LoadedModelPlugin::v5_5(m)
            } else if let Ok(m) = load_root::<v5_4::ModelPluginRef>(path) {
                LoadedModelPlugin::v5_4(m)
            } else if let Ok(m) = load_root::<v5_3::ModelPluginRef>(path) {
                LoadedModelPlugin::v5_3(m)
            } else if let Ok(m) = load_root::<v5_2::ModelPluginRef>(path) {
                LoadedModelPlugin::v5_2(m)
            } else if let Ok(m) = load_root::<v5_1::ModelPluginRef>(path) {
                LoadedModelPlugin::v5_1(m)
            } else {
                return Err(current);
            }
        }
        Err(e) => return Err(e),
    };
    let info = module.info();
    check_ggml(path, &info)?;
    tracing::debug!(plugin = %path.display(), name = %info.name, version = %info.version, "model plugin loaded");
    Ok((module, info))
}

fn load_root<M: RootModule>(path: &Path) -> Result<M, PluginError> {
    if !path.is_file() {
        return Err(PluginError::Missing(path.to_path_buf()));
    }
    check_trusted(path).map_err(|reason| PluginError::Untrusted { path: path.to_path_buf(), reason })?;
    // Open with libloading first: its error is the plain dlopen reason (bad ELF,
    // wrong architecture, missing dependency), which we want to show as is.
    let library =
        unsafe { libloading::Library::new(path) }.map_err(|e| PluginError::NotLoadable { path: path.to_path_buf(), reason: one_line(&e.to_string()) })?;
    let exported = unsafe { library.get::<*const ()>(abi_stable::library::ROOT_MODULE_LOADER_NAME_WITH_NUL.as_bytes()) }.is_ok();
    // Plugins are never unloaded (abi_stable hands out 'static references into them).
    std::mem::forget(library);
    if !exported {
        return Err(PluginError::NotAPlugin(path.to_path_buf()));
    }
    let header = lib_header_from_path(path).map_err(|e| map_library_error(path, e))?;
    header.init_root_module::<M>().map_err(|e| map_library_error(path, e))
}

fn map_library_error(path: &Path, e: LibraryError) -> PluginError {
    let path = path.to_path_buf();
    match e {
        e @ LibraryError::OpenError { .. } => PluginError::NotLoadable { path, reason: one_line(&e.to_string()) },
        LibraryError::GetSymbolError { .. } => PluginError::NotAPlugin(path),
        LibraryError::IncompatibleVersionNumber { expected_version, actual_version, .. } => {
            PluginError::AbiVersion { path, found: actual_version.to_string(), expected: expected_version.to_string() }
        }
        LibraryError::AbiInstability(detail) => PluginError::AbiLayout { path, detail: first_line(&detail.to_string()) },
        other => PluginError::Init { path, reason: one_line(&other.to_string()) },
    }
}

fn check_ggml(path: &Path, info: &PluginInfo) -> Result<(), PluginError> {
    if info.ggml_source_fingerprint.as_str() != ggml_sys::SOURCE_FINGERPRINT {
        return Err(PluginError::GgmlMismatch {
            path: path.to_path_buf(),
            found: short(info.ggml_source_fingerprint.as_str()),
            found_version: info.ggml_version.to_string(),
            expected: short(ggml_sys::SOURCE_FINGERPRINT),
            expected_version: ggml_sys::GGML_VERSION.to_string(),
        });
    }
    Ok(())
}

fn short(fp: &str) -> String {
    fp.chars().take(12).collect()
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn first_line(s: &str) -> String {
    let lines: Vec<&str> = s.lines().map(str::trim).filter(|l| !l.is_empty()).take(3).collect();
    one_line(&lines.join("; "))
}

/// Opens device 0 of the backend plugin at `path` for a test that needs that
/// backend's hardware. Where it cannot (no module, no GPU: CI), the reason is
/// printed and `None` returned so the test can say it is skipped, unless
/// `TTS_REQUIRE_BACKEND` names `backend` (runs on a GPU host), which panics.
pub fn open_device_or_skip(path: &Path, backend: &str) -> Option<crate::abi::BackendHandle> {
    open_device_with_or_skip(path, backend, Vec::new())
}

/// [`open_device_or_skip`] with the plugin options `options` (a software
/// Vulkan device, say, which a plain open refuses).
pub fn open_device_with_or_skip(path: &Path, backend: &str, options: Vec<(&str, crate::abi::OptionValue)>) -> Option<crate::abi::BackendHandle> {
    match open_backend_device(path, options, 0) {
        Ok(handle) => Some(handle),
        Err(e) if std::env::var("TTS_REQUIRE_BACKEND").is_ok_and(|b| b == backend) => panic!("{e}"),
        Err(e) => {
            println!("skipped: {backend} has no usable device here ({e})");
            None
        }
    }
}

/// Loads a backend plugin file, opens it with `options` (unvalidated: callers
/// pass known keys) and initialises device `device`. For tests and tools that
/// drive one backend directly rather than through a profile.
pub fn open_backend_device(path: &Path, options: Vec<(&str, crate::abi::OptionValue)>, device: u32) -> Result<crate::abi::BackendHandle, String> {
    use abi_stable::std_types::{RResult, Tuple2};
    let (plugin, _) = load_backend(path).map_err(|e| e.to_string())?;
    let request = crate::abi::BackendOpenRequest {
        plugin_path: path.display().to_string().into(),
        options: options.into_iter().map(|(k, v)| Tuple2(k.into(), v)).collect(),
    };
    let _registry = ggml_registry_guard();
    let session = match (plugin.module.open())(&request) {
        RResult::ROk(s) => s,
        RResult::RErr(e) => return Err(format!("opening {}: {e}", path.display())),
    };
    if session.devices().len() <= device as usize {
        return Err(format!("{} lists {} device(s), no device {device}", path.display(), session.devices().len()));
    }
    match session.init_device(device) {
        RResult::ROk(h) => Ok(h),
        RResult::RErr(e) => Err(format!("initialising device {device} of {}: {e}", path.display())),
    }
}
