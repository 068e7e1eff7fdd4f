//! The host side: opens the plugins a profile asks for, reports devices, probes and
//! resolved policies, picks a device, and runs synthesis through a model plugin.

use crate::abi::{
    AudioSink, BackendHandle, BackendOpenRequest, BackendSessionBox, DeviceInfo, LoadedModelInfo, MemoryPlanRequest, ModelBox, ModelLoadRequest, OptionList,
    OptionSpec, ProbeResult, ProgressSink, StreamSummary, SynthesisOutput, SynthesisRequest, VoiceCloneOutput, VoiceCloneRequest,
};
use crate::loader::{self, PluginFile, PluginKind};
use crate::policy::{self, DeviceRef, Resolution};
use crate::profile::{DeviceChoice, Profile};
use abi_stable::std_types::RResult;
use std::path::{Path, PathBuf};

mod convert;
mod fit;
mod report;

pub use convert::{convert_checkpoint, converters, ConvertReport, Converter};
pub use fit::{bytes, FitReport};
pub use report::{BackendReport, DeviceReport, DevicesReport, OptionGroup, OptionRow, OptionsReport, PluginReport, ProbeReport, Selection};

/// The environment variable naming plugin directories (`:`-separated, as
/// `PATH`; empty entries are ignored rather than read as the working directory).
pub const PLUGIN_PATH_ENV: &str = "TTS_PLUGIN_PATH";

/// Where code is loaded from (docs/reliability.md, "Trust model"), the first
/// that is given: `command_line` (`--plugin-dir`), [`PLUGIN_PATH_ENV`], the
/// profile's `[plugins] dirs` only when `trust_profile` (the user's explicit
/// opt-in), else the bundle's own `<exe dir>/plugins`, or the executable's
/// directory in a development build tree. A profile naming plugin
/// directories without the opt-in is refused: a profile is data, and may
/// come from anyone.
pub fn plugin_dirs(profile: &Profile, exe: Option<&Path>, command_line: &[PathBuf], trust_profile: bool) -> Result<Vec<PathBuf>, EngineError> {
    if !profile.plugin_dirs.is_empty() && !trust_profile {
        return fail(format!(
            "{}: [plugins] dirs would load code from {}; a profile is not trusted to name code: pass --trust-profile-plugins to allow it, or remove [plugins] dirs from the profile and give the directory with --plugin-dir or {PLUGIN_PATH_ENV}",
            profile.origin(),
            profile.plugin_dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
        ));
    }
    if let Some(named) = named_plugin_dirs(profile, command_line) {
        return Ok(named);
    }
    let Some(dir) = exe.and_then(Path::parent) else {
        return fail("cannot find the plugin directory: the path of the tts executable is unknown; pass --plugin-dir");
    };
    let bundled = dir.join("plugins");
    Ok(vec![if bundled.is_dir() { bundled } else { dir.to_path_buf() }])
}

/// [`plugin_dirs`] for a library (the C API's `libtts.so`) rather than an
/// executable, where no profile is trusted to name code: `given` (the
/// caller's argument), [`PLUGIN_PATH_ENV`], else the bundle's `plugins/`
/// beside the directory holding `library` (`lib/libtts.so` beside
/// `plugins/`), or the library's own directory in a development build tree.
/// A profile naming plugin directories is refused, as it is without the
/// opt-in in [`plugin_dirs`].
pub fn library_plugin_dirs(profile: &Profile, library: Option<&Path>, given: &[PathBuf]) -> Result<Vec<PathBuf>, EngineError> {
    if !profile.plugin_dirs.is_empty() {
        return fail(format!(
            "{}: [plugins] dirs would load code from {}; a profile is not trusted to name code: remove [plugins] dirs and pass the plugin directory as an argument or in {PLUGIN_PATH_ENV}",
            profile.origin(),
            profile.plugin_dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
        ));
    }
    if let Some(named) = named_plugin_dirs(profile, given) {
        return Ok(named);
    }
    let Some(dir) = library.and_then(Path::parent) else {
        return fail("cannot find the plugin directory: the path of the library is unknown; pass the plugin directory");
    };
    let bundled = dir.parent().map(|bundle| bundle.join("plugins")).filter(|p| p.is_dir());
    Ok(vec![bundled.unwrap_or_else(|| dir.to_path_buf())])
}

/// The plugin directories named by the caller, [`PLUGIN_PATH_ENV`] or a
/// (trusted) profile, in that order; None when none names any.
fn named_plugin_dirs(profile: &Profile, given: &[PathBuf]) -> Option<Vec<PathBuf>> {
    if !given.is_empty() {
        return Some(given.to_vec());
    }
    if let Some(value) = std::env::var_os(PLUGIN_PATH_ENV).filter(|v| !v.is_empty()) {
        return Some(std::env::split_paths(&value).filter(|p| !p.as_os_str().is_empty()).collect());
    }
    (!profile.plugin_dirs.is_empty()).then(|| profile.plugin_dirs.clone())
}

struct OpenBackend {
    name: String,
    session: BackendSessionBox,
    devices: Vec<DeviceInfo>,
    facts: Vec<(String, String)>,
}

enum BackendState {
    Open(OpenBackend),
    Unavailable(String),
}

pub struct Engine {
    profile: Profile,
    dirs: Vec<PathBuf>,
    files: Vec<PluginFile>,
    plugin_reports: Vec<PluginReport>,
    backends: Vec<(String, BackendState)>,
    /// Each loaded backend plugin's options (`[backends.<name>]`).
    backend_specs: Vec<(String, Vec<OptionSpec>)>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct EngineError(pub String);

fn fail<T>(msg: impl Into<String>) -> Result<T, EngineError> {
    Err(EngineError(msg.into()))
}

impl Engine {
    /// Opens what the profile can use: the backends it prefers (only the first when
    /// `fallback = false`). A backend that cannot be opened is recorded as
    /// unavailable with its reason; only profile errors fail here.
    pub fn open(profile: Profile, dirs: Vec<PathBuf>) -> Result<Engine, EngineError> {
        let names = if profile.fallback { profile.prefer.clone() } else { profile.prefer[..1].to_vec() };
        Engine::open_backends(profile, dirs, names)
    }

    /// Opens every backend the profile prefers or the plugin directories hold, and
    /// checks every model plugin, for `tts devices`.
    pub fn open_all(profile: Profile, dirs: Vec<PathBuf>) -> Result<Engine, EngineError> {
        let files = loader::discover(&dirs);
        let mut names: Vec<String> = profile.prefer.clone();
        for f in files.iter().filter(|f| f.kind == PluginKind::Backend) {
            if !names.contains(&f.name) {
                names.push(f.name.clone());
            }
        }
        let mut engine = Engine::open_backends(profile, dirs, names)?;
        for f in engine.files.iter().filter(|f| f.kind == PluginKind::Model) {
            let (loaded, version, abi, error) = match loader::load_model(&f.path) {
                Ok((m, info)) => (true, Some(info.version.to_string()), Some(m.abi_version().to_string()), None),
                Err(e) => (false, None, None, Some(e.to_string())),
            };
            engine.plugin_reports.push(PluginReport { kind: "model", name: f.name.clone(), path: f.path.display().to_string(), loaded, version, abi, error });
        }
        Ok(engine)
    }

    fn open_backends(profile: Profile, dirs: Vec<PathBuf>, names: Vec<String>) -> Result<Engine, EngineError> {
        let files = loader::discover(&dirs);
        let mut engine = Engine { profile, dirs, files, plugin_reports: Vec::new(), backends: Vec::new(), backend_specs: Vec::new() };
        for name in names {
            let state = engine.open_backend(&name)?;
            engine.backends.push((name, state));
        }
        Ok(engine)
    }

    fn open_backend(&mut self, name: &str) -> Result<BackendState, EngineError> {
        let Some(file) = self.files.iter().find(|f| f.kind == PluginKind::Backend && f.name == name) else {
            let dirs: Vec<String> = self.dirs.iter().map(|d| d.display().to_string()).collect();
            return Ok(BackendState::Unavailable(format!("no plugin file {} in {}", loader::backend_file_name(name), dirs.join(", "))));
        };
        let path = file.path.clone();
        let mut report =
            PluginReport { kind: "backend", name: name.into(), path: path.display().to_string(), loaded: false, version: None, abi: None, error: None };
        let loaded = match loader::load_backend(&path) {
            Ok((loaded, info)) => {
                report.loaded = true;
                report.version = Some(info.version.to_string());
                report.abi = Some(crate::abi::BACKEND_ABI_VERSION.to_string());
                loaded
            }
            Err(e) => {
                report.error = Some(e.to_string());
                self.plugin_reports.push(report);
                return Ok(BackendState::Unavailable(e.to_string()));
            }
        };
        self.plugin_reports.push(report);
        let specs: Vec<_> = (loaded.module.option_specs())().into_iter().collect();
        self.backend_specs.push((name.to_string(), specs.clone()));
        let options = self.profile.backend_options(name, &specs).map_err(|e| EngineError(e.to_string()))?;
        let request = BackendOpenRequest { plugin_path: path.display().to_string().into(), options };
        let opened = {
            let _registry = crate::loader::ggml_registry_guard();
            (loaded.module.open())(&request)
        };
        match opened {
            RResult::ROk(session) => {
                let devices: Vec<DeviceInfo> = session.devices().into_iter().collect();
                let facts = crate::backend_kit::facts_to_pairs(&session.module_facts());
                Ok(BackendState::Open(OpenBackend { name: name.into(), session, devices, facts }))
            }
            RResult::RErr(e) if e.starts_with(crate::backend_kit::OPTION_ERROR_PREFIX) => {
                fail(format!("{}: [backends.{name}] {}", self.profile.origin(), &e[crate::backend_kit::OPTION_ERROR_PREFIX.len()..]))
            }
            RResult::RErr(e) => {
                tracing::warn!(backend = name, "unavailable: {e}");
                Ok(BackendState::Unavailable(format!("{} could not open its ggml module: {e}", path.display())))
            }
        }
    }

    fn resolve(&self, backend: &OpenBackend, device: &DeviceInfo) -> (Vec<ProbeResult>, Result<Resolution, String>) {
        let probes: Vec<ProbeResult> = match backend.session.probe(device.index) {
            RResult::ROk(p) => p.into_iter().collect(),
            RResult::RErr(e) => return (Vec::new(), Err(format!("probing {} failed: {e}", device.name))),
        };
        let dev = DeviceRef { backend: &backend.name, name: device.name.as_str(), description: device.description.as_str() };
        let resolution = policy::resolve(&self.profile.policies, &self.profile.deny, &dev, &probes);
        (probes, resolution)
    }

    pub fn devices_report(&self) -> DevicesReport {
        let backends = self
            .backends
            .iter()
            .map(|(name, state)| match state {
                BackendState::Unavailable(reason) => BackendReport {
                    name: name.clone(),
                    preferred: self.profile.prefer.contains(name),
                    available: false,
                    reason: Some(reason.clone()),
                    module: Vec::new(),
                    devices: Vec::new(),
                },
                BackendState::Open(b) => BackendReport {
                    name: name.clone(),
                    preferred: self.profile.prefer.contains(name),
                    available: true,
                    reason: b.devices.is_empty().then(|| "the module reports no usable device".to_string()),
                    module: b.facts.clone(),
                    devices: b
                        .devices
                        .iter()
                        .map(|d| {
                            let (probes, resolution) = self.resolve(b, d);
                            let (policies, policy_error) = match resolution {
                                Ok(r) => (Some(r), None),
                                Err(e) => (None, Some(e)),
                            };
                            DeviceReport {
                                index: d.index,
                                name: d.name.to_string(),
                                description: d.description.to_string(),
                                bus_id: (!d.bus_id.is_empty()).then(|| d.bus_id.to_string()),
                                kind: d.kind.as_str(),
                                memory_free: d.memory_free,
                                memory_total: d.memory_total,
                                probes: probes
                                    .into_iter()
                                    .map(|p| ProbeReport { name: p.name.into(), supported: p.supported, detail: p.detail.into() })
                                    .collect(),
                                policies,
                                policy_error,
                            }
                        })
                        .collect(),
                },
            })
            .collect();
        let (selected, selection_error) = match self.select() {
            Ok((b, d, _)) => (Some(Selection { backend: b.name.clone(), device: d.index, device_name: d.name.to_string() }), None),
            Err(e) => (None, Some(e.0)),
        };
        DevicesReport {
            host_version: env!("CARGO_PKG_VERSION").into(),
            plugin_abi: crate::PLUGIN_ABI_VERSION.into(),
            ggml_version: ggml_sys::runtime_version(),
            profile: self.profile.origin().into(),
            ggml_base_loaded: loaded_libraries("libggml-base"),
            plugin_dirs: self.dirs.iter().map(|d| d.display().to_string()).collect(),
            plugins: self.plugin_reports.clone(),
            backends,
            selected,
            selection_error,
        }
    }

    /// Picks backend and device as the profile says and resolves policies for it.
    fn select(&self) -> Result<(&OpenBackend, &DeviceInfo, Resolution), EngineError> {
        let mut reasons = Vec::new();
        let candidates = if self.profile.fallback { &self.profile.prefer[..] } else { &self.profile.prefer[..1] };
        for name in candidates {
            let Some((_, state)) = self.backends.iter().find(|(n, _)| n == name) else {
                continue;
            };
            let backend = match state {
                BackendState::Open(b) if !b.devices.is_empty() => b,
                BackendState::Open(b) => {
                    // A plugin that names the devices it refused says why.
                    let refused = crate::backend_kit::refused_devices(&b.facts);
                    if refused.is_empty() {
                        reasons.push(format!("{name}: no usable device"));
                    } else {
                        reasons.push(format!("{name}: no usable device; refused {}", refused.join("; ")));
                    }
                    continue;
                }
                BackendState::Unavailable(r) => {
                    reasons.push(format!("{name}: {r}"));
                    continue;
                }
            };
            let Some(device) = pick_device(&backend.devices, &self.profile.device) else {
                let names: Vec<&str> = backend.devices.iter().map(|d| d.name.as_str()).collect();
                reasons.push(format!("{name}: no device {} (devices: {})", self.profile.device, names.join(", ")));
                continue;
            };
            let (_, resolution) = self.resolve(backend, device);
            tracing::info!(backend = %name, device = %device.name, description = %device.description, "device selected");
            return match resolution {
                Ok(r) => Ok((backend, device, r)),
                Err(e) => fail(format!("{} on {}: {e}", self.profile.origin(), device.name)),
            };
        }
        let policy = if self.profile.fallback { "" } else { " (fallback = false)" };
        fail(format!("no backend of [{}] is usable{policy}: {}", candidates.join(", "), reasons.join("; ")))
    }

    /// The model plugin that loads the architecture of `first` (the profile's
    /// first model file), and its family.
    fn model_plugin(&self, first: &Path) -> Result<(loader::LoadedModelPlugin, String), EngineError> {
        let gguf = ggml_sys::gguf::GgufFile::open(first).map_err(|e| EngineError(e.to_string()))?;
        let arch = gguf.get_str("general.architecture").map_err(|e| EngineError(e.to_string()))?;
        drop(gguf);
        let mut tried = Vec::new();
        let mut chosen = None;
        for f in self.files.iter().filter(|f| f.kind == PluginKind::Model) {
            match loader::load_model(&f.path) {
                Ok((m, _)) => {
                    let family = m.family();
                    if family.architectures.iter().any(|a| a.as_str() == arch) {
                        chosen = Some((m, family.family.to_string()));
                        break;
                    }
                    tried.push(family.family.to_string());
                }
                Err(e) => tried.push(format!("{} ({e})", f.name)),
            }
        }
        let Some(found) = chosen else {
            return fail(format!(
                "no model plugin loads architecture '{arch}' of {} (model plugins found: {})",
                first.display(),
                if tried.is_empty() { "none".into() } else { tried.join(", ") }
            ));
        };
        Ok(found)
    }

    /// Every option the profile's model family (`[synthesis]`, `--set`) and
    /// its backends (`[backends.<name>]`) accept, with kind, default and help.
    pub fn options_report(&self) -> Result<OptionsReport, EngineError> {
        let rows = |specs: &[OptionSpec]| specs.iter().map(OptionRow::from_spec).collect::<Vec<_>>();
        let model = match self.profile.model_files.first() {
            Some(first) => {
                let (plugin, family) = self.model_plugin(first)?;
                Some(OptionGroup { section: "synthesis".into(), owner: family, options: rows(&plugin.option_specs().into_iter().collect::<Vec<_>>()) })
            }
            None => None,
        };
        let backends = self
            .backend_specs
            .iter()
            .map(|(name, specs)| OptionGroup { section: format!("backends.{name}"), owner: name.clone(), options: rows(specs) })
            .collect();
        Ok(OptionsReport { model, backends })
    }

    /// Selects the device, loads the model plugin for the profile's GGUF and the
    /// model on that device, and validates `[synthesis]` plus `overrides`. The
    /// session synthesizes any number of texts without reloading.
    pub fn open_model(&self, overrides: &[(String, String)]) -> Result<ModelSession, EngineError> {
        self.open_session(overrides, false)
    }

    /// [`open_model`](Self::open_model) for cloning voices only (`tts voice
    /// save`): the plugin's `load_for_cloning` (ABI 5.3) reads only what
    /// cloning needs, and the session's `synthesize` is refused. A plugin
    /// without it gives the full model ([`ModelSession::cloning_only`] false).
    pub fn open_model_for_cloning(&self, overrides: &[(String, String)]) -> Result<ModelSession, EngineError> {
        self.open_session(overrides, true)
    }

    /// The model's memory plan on the selected device beside the device's
    /// free memory and the profile's budget (`tts fit`); `overrides` are the
    /// `--set` options, whose limits size the plan.
    pub fn fit(&self, overrides: &[(String, String)]) -> Result<FitReport, EngineError> {
        let fit = self.prepare(overrides, true)?.fit;
        match &fit.plan_error {
            Some(e) => fail(format!("sizing the model's memory: {e}")),
            None => Ok(fit),
        }
    }

    fn open_session(&self, overrides: &[(String, String)], for_cloning: bool) -> Result<ModelSession, EngineError> {
        // Sized and checked only for synthesis: cloning loads a fraction of the model.
        let Prepared { backend, device, resolution, model_plugin, specs, options, handle, request, fit } = self.prepare(overrides, !for_cloning)?;
        if let Some(refusal) = fit.refusal() {
            return fail(refusal);
        }
        if let Some(e) = &fit.plan_error {
            tracing::debug!("the model's memory was not sized, so the load is not checked: {e}");
        }
        let cloning_only = for_cloning && model_plugin.has_cloning_load();
        let loaded = match for_cloning {
            true => model_plugin.load_for_cloning(&request, &handle),
            false => model_plugin.load(&request, &handle),
        };
        let model = match loaded {
            RResult::ROk(m) => m,
            RResult::RErr(e) => return fail(e.to_string()),
        };
        let info = model.info();
        let model_files = self.profile.model_files.clone();
        Ok(ModelSession {
            model,
            _handle: handle,
            options,
            specs,
            model_files,
            backend: backend.name.clone(),
            device: device.name.to_string(),
            info,
            resolution,
            cloning_only,
        })
    }

    /// Everything up to a load: the device, the model plugin, the validated
    /// options, an initialised backend, the load request and the memory fit
    /// (the plan asked of the plugin only with `size_memory`).
    fn prepare(&self, overrides: &[(String, String)], size_memory: bool) -> Result<Prepared<'_>, EngineError> {
        let (backend, device, resolution) = self.select()?;
        let Some(first) = self.profile.model_files.first() else {
            return fail(format!("{}: [model] files is empty; name the model GGUF file(s) there or pass --model FILE", self.profile.origin()));
        };
        for (i, a) in self.profile.model_files.iter().enumerate() {
            let same = |b: &PathBuf| a == b || std::fs::canonicalize(a).ok().zip(std::fs::canonicalize(b).ok()).is_some_and(|(x, y)| x == y);
            if self.profile.model_files[..i].iter().any(same) {
                return fail(format!("model file {} is given twice", a.display()));
            }
        }
        let (model_plugin, family) = self.model_plugin(first)?;
        let specs: Vec<_> = model_plugin.option_specs().into_iter().collect();
        let options = self.profile.synthesis_options(&family, &specs, overrides).map_err(|e| EngineError(e.to_string()))?;
        let initialised = {
            let _registry = crate::loader::ggml_registry_guard();
            backend.session.init_device(device.index)
        };
        let handle = match initialised {
            RResult::ROk(h) => h,
            RResult::RErr(e) => return fail(format!("initialising {}: {e}", device.name)),
        };
        let request = ModelLoadRequest {
            files: self.profile.model_files.iter().map(|p| p.display().to_string().into()).collect(),
            policies: resolution.policies.clone(),
        };
        // A plan that fails (a file the load will refuse with its own
        // message) leaves the load unchecked; `tts fit` reports the error.
        let planned = size_memory.then(|| model_plugin.plan_memory(&MemoryPlanRequest { load: request.clone(), options: options.clone() }, &handle)).flatten();
        let (plan, plan_error) = match planned {
            None => (None, None),
            Some(RResult::ROk(plan)) => (Some(plan), None),
            Some(RResult::RErr(e)) => (None, Some(e.to_string())),
        };
        let (free, total) = handle.ggml_backend().device().map(|d| d.memory()).unwrap_or((0, 0));
        let fit = FitReport {
            family,
            backend: backend.name.clone(),
            device: device.name.to_string(),
            free: free as u64,
            total: total as u64,
            configured_budget: self.profile.memory_budget,
            plan,
            plan_error,
        };
        Ok(Prepared { backend, device, resolution, model_plugin, specs, options, handle, request, fit })
    }
}

/// What [`Engine::prepare`] readies for a load.
struct Prepared<'e> {
    backend: &'e OpenBackend,
    device: &'e DeviceInfo,
    resolution: Resolution,
    model_plugin: loader::LoadedModelPlugin,
    specs: Vec<OptionSpec>,
    options: OptionList,
    handle: BackendHandle,
    request: ModelLoadRequest,
    fit: FitReport,
}

/// A model loaded on a device with validated synthesis options.
pub struct ModelSession {
    // Dropped before the backend handle it computes on.
    model: ModelBox,
    _handle: BackendHandle,
    options: OptionList,
    /// The model plugin's option specs, for per-request overrides.
    specs: Vec<crate::abi::OptionSpec>,
    /// The model files the session was loaded from.
    model_files: Vec<PathBuf>,
    pub backend: String,
    pub device: String,
    pub info: LoadedModelInfo,
    /// The policies resolved for the device (what the model was loaded with).
    pub resolution: policy::Resolution,
    /// Loaded only to clone voices ([`Engine::open_model_for_cloning`] with a
    /// plugin that can): it refuses to synthesize.
    pub cloning_only: bool,
}

impl ModelSession {
    /// A GPU's (free, total) memory now, in bytes, where its backend reports it
    /// (the CPU's would be the host's, which RSS already covers).
    pub fn device_memory(&self) -> Option<(u64, u64)> {
        let device = self._handle.ggml_backend().device().filter(|d| d.kind() != ggml_sys::DeviceKind::Cpu)?;
        let (free, total) = device.memory();
        (total > 0).then_some((free as u64, total as u64))
    }

    pub fn synthesize(&mut self, text: &str) -> Result<SynthesisOutput, EngineError> {
        if text.trim().is_empty() {
            return fail("text is empty");
        }
        let output = match self.model.synthesize(&SynthesisRequest { text: text.into(), options: self.options.clone() }) {
            RResult::ROk(o) => o,
            RResult::RErr(e) => return fail(e.to_string()),
        };
        for t in output.timings.iter() {
            tracing::debug!(stage = %t.stage, ms = t.ms, "stage timing");
        }
        crate::audio::check_samples(&output.samples, output.sample_rate).map_err(|e| EngineError(format!("{}: {e}", self.info.family)))?;
        Ok(output)
    }

    /// Synthesizes `text`, handing each piece of audio to `on_piece` (mono
    /// samples in [-1, 1], the sample rate) as the model produces it; a plugin
    /// without streaming gives one piece. `on_piece` returns `Ok(false)` to
    /// stop the synthesis (the summary then says `cancelled`) or an error,
    /// which stops it and is returned. Every piece is checked as
    /// [`SynthesisOutput`]s are (finite samples, a sample rate in range, the
    /// same rate throughout) before `on_piece` sees it.
    pub fn synthesize_streaming(&mut self, text: &str, on_piece: impl FnMut(&[f32], u32) -> Result<bool, EngineError>) -> Result<StreamSummary, EngineError> {
        self.synthesize_streaming_with(text, &[], on_piece)
    }

    /// [`ModelSession::synthesize_streaming`] with `overrides` (`key`, text)
    /// set over the session's options for this text only (a server's
    /// per-request voice or speed). An unknown key or a value of the wrong
    /// kind fails before synthesis, naming the key.
    pub fn synthesize_streaming_with(
        &mut self,
        text: &str,
        overrides: &[(String, String)],
        on_piece: impl FnMut(&[f32], u32) -> Result<bool, EngineError>,
    ) -> Result<StreamSummary, EngineError> {
        self.synthesize_observed(text, overrides, on_piece, |_| true)
    }

    /// [`ModelSession::synthesize_streaming_with`], also handing `on_progress`
    /// what the model reports of its work before each piece is ready (a
    /// plugin of ABI 5.5 or later that counts something, such as Chatterbox's
    /// speech tokens; others report nothing). `on_progress` returns false to
    /// stop the synthesis, as `on_piece`'s `Ok(false)` does.
    pub fn synthesize_observed(
        &mut self,
        text: &str,
        overrides: &[(String, String)],
        mut on_piece: impl FnMut(&[f32], u32) -> Result<bool, EngineError>,
        mut on_progress: impl FnMut(&Progress<'_>) -> bool,
    ) -> Result<StreamSummary, EngineError> {
        if text.trim().is_empty() {
            return fail("text is empty");
        }
        let mut options = self.options.clone();
        crate::profile::apply_overrides(&mut options, self.info.family.as_str(), &self.specs, overrides).map_err(EngineError)?;
        let family = self.info.family.to_string();
        let mut receiver = PieceReceiver { on_piece: &mut on_piece, on_progress: &mut on_progress, rate: None, family, failure: None };
        let context: *mut std::ffi::c_void = (&mut receiver as *mut PieceReceiver<'_>).cast();
        let sink = AudioSink { context, deliver: deliver_piece };
        let progress = ProgressSink { context, report: report_progress };
        let result = self.model.synthesize_with_progress(&SynthesisRequest { text: text.into(), options }, &sink, &progress);
        if let Some(e) = receiver.failure.take() {
            return Err(e);
        }
        match result {
            RResult::ROk(summary) => Ok(summary),
            RResult::RErr(e) => fail(e.to_string()),
        }
    }

    /// The files this session reads, as (what, path) for error messages: its
    /// model files, every non-empty path option (a voice file, a reference
    /// recording, a noise file, a draws directory), and a string `voice`
    /// option that is not one of the model's built-in voices (the catalog's
    /// contract: `voice` is a built-in name or a voice file). Other string
    /// options (a language, a mode) are words, never opened as files, so a
    /// file that happens to share the word is not an input.
    pub fn input_paths(&self) -> Vec<(String, PathBuf)> {
        use crate::abi::{OptionKind, OptionValue};
        let mut inputs: Vec<(String, PathBuf)> = self.model_files.iter().map(|p| ("model file".to_string(), p.clone())).collect();
        let mut built_in: Option<Vec<String>> = None;
        for option in self.options.iter() {
            let OptionValue::Str(v) = &option.1 else { continue };
            if v.is_empty() {
                continue;
            }
            let file = match self.specs.iter().find(|s| s.key == option.0).map(|s| s.kind) {
                Some(OptionKind::Path) => true,
                Some(OptionKind::Str) if option.0.as_str() == "voice" => {
                    let names = built_in.get_or_insert_with(|| self.catalog().voices.iter().map(|n| n.to_string()).collect());
                    !names.iter().any(|n| n == v.as_str())
                }
                _ => false,
            };
            if file {
                inputs.push((format!("{} file", option.0), PathBuf::from(v.as_str())));
            }
        }
        inputs
    }

    /// Refuses `out` when it is one of this session's inputs or of `extra`
    /// (a reference recording, a text file): [`crate::output::refuse_input_as_output`].
    pub fn refuse_input_as_output(&self, out: &Path, extra: &[(String, PathBuf)]) -> Result<(), EngineError> {
        let mut inputs = self.input_paths();
        inputs.extend_from_slice(extra);
        crate::output::refuse_input_as_output(out, &inputs).map_err(EngineError)
    }

    /// Overrides that make the model's streamed pieces join to exactly its
    /// one-shot samples, for a front end that collects the whole audio
    /// (a file, a buffer): [`ONE_SHOT_PIECES`] the model has.
    pub fn one_shot_overrides(&self) -> Vec<(String, String)> {
        ONE_SHOT_PIECES.iter().filter(|(key, _)| self.specs.iter().any(|s| s.key.as_str() == *key)).map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// The model plugin's options: key, kind, default and help.
    pub fn option_specs(&self) -> &[crate::abi::OptionSpec] {
        &self.specs
    }

    /// The model's built-in voices and languages.
    pub fn catalog(&self) -> crate::abi::ModelCatalog {
        self.model.catalog()
    }

    /// Clones the voice of the recording at `reference`: the model's voice
    /// file bytes and the stage timings.
    pub fn clone_voice(&mut self, reference: &Path) -> Result<VoiceCloneOutput, EngineError> {
        if !reference.is_file() {
            let what = if reference.exists() { "is not a regular file" } else { "does not exist" };
            return fail(format!("reference {} {what}", reference.display()));
        }
        let request = VoiceCloneRequest { reference: reference.display().to_string().into(), options: self.options.clone() };
        match self.model.clone_voice(&request) {
            RResult::ROk(o) => Ok(o),
            RResult::RErr(e) => fail(e.to_string()),
        }
    }

    /// [`clone_voice`](Self::clone_voice), the voice file written to `out`
    /// ([`crate::output`]: no partial file, no link followed). Returns the
    /// stage timings.
    pub fn save_voice(&mut self, reference: &Path, out: &Path) -> Result<Vec<(String, f64)>, EngineError> {
        self.refuse_input_as_output(out, &[("reference".to_string(), reference.to_path_buf())])?;
        let output = self.clone_voice(reference)?;
        crate::output::write_file(out, &output.voice).map_err(|e| EngineError(format!("{}: {e}", out.display())))?;
        Ok(output.timings.iter().map(|t| (t.stage.to_string(), t.ms)).collect())
    }
}

/// Options that make a model's streamed pieces join to exactly its one-shot
/// samples, where the model has them: Supertonic's first-chunk cut off
/// (`stream_first_chars = 0`), Chatterbox's pieces per text chunk rather than
/// per speech-token hop (`stream_tokens = 0`).
pub const ONE_SHOT_PIECES: &[(&str, &str)] = &[("stream_first_chars", "0"), ("stream_tokens", "0")];

/// What a model reports of its work before a piece is ready
/// ([`ModelSession::synthesize_observed`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Progress<'a> {
    /// What is counted ("speech tokens").
    pub unit: &'a str,
    /// How many so far in the piece being made.
    pub done: u64,
    /// The most there can be in it, where the model knows a bound.
    pub limit: Option<u64>,
}

/// The caller's receiver of streamed audio: samples and rate in, whether to go on out.
type OnPiece<'a> = dyn FnMut(&[f32], u32) -> Result<bool, EngineError> + 'a;
/// The caller's receiver of progress: whether to go on.
type OnProgress<'a> = dyn FnMut(&Progress<'_>) -> bool + 'a;

/// The host's side of an [`AudioSink`] and a [`ProgressSink`]: the caller's
/// callbacks, the rate of the first piece, and the first error (which stops
/// the synthesis).
struct PieceReceiver<'a> {
    on_piece: &'a mut OnPiece<'a>,
    on_progress: &'a mut OnProgress<'a>,
    rate: Option<u32>,
    family: String,
    failure: Option<EngineError>,
}

impl PieceReceiver<'_> {
    fn receive(&mut self, samples: &[f32], rate: u32) -> Result<bool, EngineError> {
        crate::audio::check_samples(samples, rate).map_err(|e| EngineError(format!("{}: {e}", self.family)))?;
        match self.rate.replace(rate) {
            Some(first) if first != rate => fail(format!("{}: a streamed piece at {rate} Hz follows pieces at {first} Hz", self.family)),
            _ => (self.on_piece)(samples, rate),
        }
    }
}

/// [`AudioSink::deliver`] for a [`PieceReceiver`]. A panic in the callback
/// must not unwind into the plugin: it becomes the failure, and stops.
extern "C" fn deliver_piece(context: *mut std::ffi::c_void, samples: abi_stable::std_types::RSlice<'_, f32>, rate: u32) -> bool {
    // SAFETY: `context` is the PieceReceiver that `synthesize_streaming` keeps
    // alive, and only borrowed, for the duration of the plugin call.
    let receiver = unsafe { &mut *context.cast::<PieceReceiver<'_>>() };
    if receiver.failure.is_some() {
        return false;
    }
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| receiver.receive(samples.as_slice(), rate)));
    match outcome {
        Ok(Ok(keep_going)) => keep_going,
        Ok(Err(e)) => {
            receiver.failure = Some(e);
            false
        }
        Err(_) => {
            receiver.failure = Some(EngineError("internal error: the audio receiver panicked".into()));
            false
        }
    }
}

/// [`ProgressSink::report`] for a [`PieceReceiver`]; a panic in the callback
/// becomes the failure, as in [`deliver_piece`].
extern "C" fn report_progress(context: *mut std::ffi::c_void, unit: abi_stable::std_types::RStr<'_>, done: u64, limit: u64) -> bool {
    // SAFETY: as in `deliver_piece`: the receiver outlives the plugin call,
    // and the plugin calls its sinks one at a time on one thread.
    let receiver = unsafe { &mut *context.cast::<PieceReceiver<'_>>() };
    if receiver.failure.is_some() {
        return false;
    }
    let progress = Progress { unit: unit.as_str(), done, limit: (limit > 0).then_some(limit) };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (receiver.on_progress)(&progress))) {
        Ok(keep_going) => keep_going,
        Err(_) => {
            receiver.failure = Some(EngineError("internal error: the progress receiver panicked".into()));
            false
        }
    }
}

/// The device a choice names. `auto`: the most preferred kind (discrete GPU >
/// integrated GPU > accelerator > CPU > software GPU), the lowest index among equals.
pub fn pick_device<'a>(devices: &'a [DeviceInfo], choice: &DeviceChoice) -> Option<&'a DeviceInfo> {
    match choice {
        DeviceChoice::Auto => devices.iter().max_by_key(|d| (d.kind.preference(), std::cmp::Reverse(d.index))),
        DeviceChoice::Name(n) => devices.iter().find(|d| d.name.as_str() == n || (!d.bus_id.is_empty() && d.bus_id.eq_ignore_ascii_case(n))),
        DeviceChoice::Index(i) => devices.iter().find(|d| d.index == *i),
    }
}

/// Distinct mapped files whose name starts with `prefix` (Linux; empty elsewhere).
/// Lets `tts devices` show that every plugin shares one libggml-base.
pub fn loaded_libraries(prefix: &str) -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut found: Vec<String> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| Path::new(p).file_name().is_some_and(|f| f.to_string_lossy().starts_with(prefix)))
        .map(str::to_string)
        .collect();
    found.sort();
    found.dedup();
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::DeviceKind;

    fn dev(index: u32, name: &str, kind: DeviceKind) -> DeviceInfo {
        DeviceInfo { index, name: name.into(), description: "".into(), bus_id: "".into(), kind, memory_free: 0, memory_total: 0 }
    }

    #[test]
    fn auto_prefers_discrete_then_integrated_then_cpu_then_software() {
        let all = [
            dev(0, "Vulkan0", DeviceKind::SoftwareGpu),
            dev(1, "Vulkan1", DeviceKind::IntegratedGpu),
            dev(2, "Vulkan2", DeviceKind::Gpu),
            dev(3, "Vulkan3", DeviceKind::Gpu),
        ];
        let pick = |n: usize| pick_device(&all[..n], &DeviceChoice::Auto).map(|d| d.name.to_string());
        assert_eq!(pick(4).as_deref(), Some("Vulkan2"), "first discrete GPU");
        assert_eq!(pick(2).as_deref(), Some("Vulkan1"), "integrated over software");
        assert_eq!(pick(1).as_deref(), Some("Vulkan0"), "software when it is all there is");
        assert_eq!(pick(0), None);
        let cpu_and_soft = [dev(0, "soft", DeviceKind::SoftwareGpu), dev(1, "cpu", DeviceKind::Cpu)];
        assert_eq!(pick_device(&cpu_and_soft, &DeviceChoice::Auto).unwrap().name.as_str(), "cpu");
    }

    #[test]
    fn a_library_finds_the_plugins_beside_its_directory_else_its_own() {
        if std::env::var_os(PLUGIN_PATH_ENV).is_some_and(|v| !v.is_empty()) {
            eprintln!("skipped: {PLUGIN_PATH_ENV} is set, and comes first");
            return;
        }
        let profile = Profile::parse("[backend]\nprefer = [\"cpu\"]\n", "p.toml", Path::new(".")).unwrap();
        let root = tempfile::tempdir().unwrap();
        let (lib, plugins) = (root.path().join("lib"), root.path().join("plugins"));
        std::fs::create_dir_all(&lib).unwrap();
        let library = lib.join("libtts.so");
        // A build tree: no plugins/ beside lib/, so the library's own directory.
        assert_eq!(library_plugin_dirs(&profile, Some(&library), &[]).unwrap(), std::slice::from_ref(&lib));
        // A bundle: lib/libtts.so beside plugins/.
        std::fs::create_dir_all(&plugins).unwrap();
        assert_eq!(library_plugin_dirs(&profile, Some(&library), &[]).unwrap(), [plugins]);
        // The caller's directory comes first.
        assert_eq!(library_plugin_dirs(&profile, Some(&library), std::slice::from_ref(&lib)).unwrap(), std::slice::from_ref(&lib));
        assert!(library_plugin_dirs(&profile, None, &[]).unwrap_err().0.contains("the path of the library is unknown"));
        // A profile naming code is refused even with a directory given.
        let naming = Profile::parse("[plugins]\ndirs = [\"/opt/x\"]\n[backend]\nprefer = [\"cpu\"]\n", "p.toml", Path::new(".")).unwrap();
        let refused = library_plugin_dirs(&naming, Some(&library), &[lib]).unwrap_err().0;
        assert!(refused.starts_with("p.toml: [plugins] dirs would load code from /opt/x; a profile is not trusted to name code"), "{refused}");
    }

    #[test]
    fn explicit_choices() {
        let all = [dev(0, "Vulkan0", DeviceKind::SoftwareGpu), dev(1, "Vulkan1", DeviceKind::Gpu)];
        assert_eq!(pick_device(&all, &DeviceChoice::Name("Vulkan0".into())).unwrap().index, 0);
        assert_eq!(pick_device(&all, &DeviceChoice::Index(1)).unwrap().name.as_str(), "Vulkan1");
        assert!(pick_device(&all, &DeviceChoice::Index(2)).is_none());
        assert!(pick_device(&all, &DeviceChoice::Name("CUDA0".into())).is_none());
    }

    #[test]
    fn a_bus_id_picks_its_device_in_any_case() {
        let mut all = [dev(0, "CUDA0", DeviceKind::Gpu), dev(1, "CUDA1", DeviceKind::Gpu), dev(2, "CPU", DeviceKind::Cpu)];
        all[0].bus_id = "0000:41:00.0".into();
        all[1].bus_id = "0000:C1:00.0".into();
        assert_eq!(pick_device(&all, &DeviceChoice::Name("0000:c1:00.0".into())).unwrap().name.as_str(), "CUDA1");
        assert_eq!(pick_device(&all, &DeviceChoice::Name("0000:41:00.0".into())).unwrap().index, 0);
        assert!(pick_device(&all, &DeviceChoice::Name("0000:01:00.0".into())).is_none());
        // A device without a bus id is never matched by an empty name.
        assert!(pick_device(&all, &DeviceChoice::Name("".into())).is_none());
    }
}
