//! `tts.Engine`: a profile's model, opened once, synthesizing any number of
//! texts. Synthesis runs with the GIL released; the model computes one text
//! at a time, so calls from several threads take turns on its lock.

use crate::location::module_path;
use crate::options::{overrides, python_value};
use crate::stream::Stream;
use crate::tts_error;
use engine_core::abi::OptionValue;
use engine_core::engine::{library_plugin_dirs, Engine as CoreEngine, ModelSession, PLUGIN_PATH_ENV};
use engine_core::profile::Profile;
use numpy::PyArray1;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

/// The open model and the engine it runs on.
pub(crate) struct Loaded {
    // Declared first, so dropped first: the session computes on the engine's
    // backend, which must outlive it.
    pub session: ModelSession,
    _engine: CoreEngine,
}

/// The model, shared by an [`Engine`] and the streams it started.
pub(crate) type SharedModel = Arc<Mutex<Loaded>>;

/// Locks the model; a synthesis that panicked on another thread left it poisoned.
pub(crate) fn lock(model: &SharedModel) -> Result<MutexGuard<'_, Loaded>, String> {
    model.lock().map_err(|_| "the engine is unusable: a synthesis on another thread failed inside the engine".to_string())
}

/// What Python reads of a model without waiting for its lock.
struct Facts {
    family: String,
    variant: String,
    sample_rate: u32,
    backend: String,
    device: String,
    voices: Vec<String>,
    languages: Vec<String>,
    /// Key, kind, default, help.
    options: Vec<(String, String, OptionValue, String)>,
}

/// An engine with a model loaded: `Engine(profile=None, profile_text=None,
/// plugin_dir=None, model=None, **options)`. `profile` is a TOML profile's
/// path, `profile_text` its text (relative paths in it are read from the
/// working directory); neither: the embedded default profile. `model` (a
/// path or a list) replaces the profile's model files, as `tts --model`
/// does; `options` are set over its `[synthesis]`, as `tts --set` does.
#[pyclass(module = "tts", frozen)]
pub struct Engine {
    model: SharedModel,
    facts: Facts,
}

#[pymethods]
impl Engine {
    #[new]
    #[pyo3(signature = (profile=None, profile_text=None, plugin_dir=None, model=None, **options))]
    fn new(
        py: Python<'_>,
        profile: Option<PathBuf>,
        profile_text: Option<String>,
        plugin_dir: Option<PathBuf>,
        model: Option<&Bound<'_, PyAny>>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let set = overrides(options)?;
        let model_files = model.map(model_files).transpose()?;
        let mut profile = match (profile, profile_text) {
            (Some(_), Some(_)) => return Err(PyValueError::new_err("give profile or profile_text, not both")),
            (Some(path), None) => py.detach(|| Profile::load(&path)),
            (None, Some(text)) => Profile::parse(&text, "<profile_text>", Path::new(".")),
            (None, None) => Ok(Profile::embedded_default()),
        }
        .map_err(|e| tts_error(e.to_string()))?;
        if let Some(files) = model_files {
            profile.model_files = files;
        }
        let loaded = py.detach(|| open(profile, plugin_dir, &set)).map_err(tts_error)?;
        let catalog = loaded.session.catalog();
        let facts = Facts {
            family: loaded.session.info.family.to_string(),
            variant: loaded.session.info.variant.to_string(),
            sample_rate: loaded.session.info.sample_rate,
            backend: loaded.session.backend.clone(),
            device: loaded.session.device.clone(),
            voices: catalog.voices.iter().map(|v| v.to_string()).collect(),
            languages: catalog.languages.iter().map(|l| l.to_string()).collect(),
            options: loaded
                .session
                .option_specs()
                .iter()
                .map(|s| (s.key.to_string(), s.kind.as_str().to_string(), s.default.clone(), s.help.to_string()))
                .collect(),
        };
        Ok(Engine { model: Arc::new(Mutex::new(loaded)), facts })
    }

    /// Synthesizes `text` (with `options` over the engine's for this text
    /// only) into one array of float32 samples in [-1, 1] at `sample_rate`:
    /// the samples `tts --out FILE.f32` writes.
    #[pyo3(signature = (text, **options))]
    fn synthesize<'py>(&self, py: Python<'py>, text: &str, options: Option<&Bound<'py, PyDict>>) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let set = overrides(options)?;
        let model = self.model.clone();
        let samples = py
            .detach(move || -> Result<Vec<f32>, String> {
                let mut loaded = lock(&model)?;
                // The pieces join to exactly the one-shot samples (as the
                // CLI's file output does); the caller's options come after,
                // so an explicit one wins.
                let mut all = loaded.session.one_shot_overrides();
                all.extend(set);
                let mut samples = Vec::new();
                loaded
                    .session
                    .synthesize_streaming_with(text, &all, |piece, _rate| {
                        samples.extend_from_slice(piece);
                        Ok(true)
                    })
                    .map_err(|e| e.to_string())?;
                Ok(samples)
            })
            .map_err(tts_error)?;
        Ok(PyArray1::from_vec(py, samples))
    }

    /// Synthesizes `text` on a thread of its own, yielding float32 arrays as
    /// the model makes them (`for piece in engine.stream(text): ...`).
    /// Closing the iterator (`close()`, leaving its `with` block, or dropping
    /// it) stops the synthesis.
    #[pyo3(signature = (text, **options))]
    fn stream(&self, text: &str, options: Option<&Bound<'_, PyDict>>) -> PyResult<Stream> {
        if text.trim().is_empty() {
            return Err(tts_error("text is empty"));
        }
        Ok(Stream::start(self.model.clone(), text.to_string(), overrides(options)?))
    }

    /// Samples per second of every array this engine returns.
    #[getter]
    fn sample_rate(&self) -> u32 {
        self.facts.sample_rate
    }

    /// The model family (`supertonic`, `chatterbox`).
    #[getter]
    fn family(&self) -> &str {
        &self.facts.family
    }

    /// The family's variant the model files are.
    #[getter]
    fn variant(&self) -> &str {
        &self.facts.variant
    }

    /// The backend the model runs on (`cpu`, `vulkan`, ...).
    #[getter]
    fn backend(&self) -> &str {
        &self.facts.backend
    }

    /// The device the model runs on.
    #[getter]
    fn device(&self) -> &str {
        &self.facts.device
    }

    /// The model's built-in voices, the default first (the `voice` option
    /// also takes a voice file's path where the model clones voices).
    #[getter]
    fn voices<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, &self.facts.voices)
    }

    /// The language codes the `language` option takes, the default first
    /// (empty: the model has no such option).
    #[getter]
    fn languages<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, &self.facts.languages)
    }

    /// The options `synthesize` and `stream` take, by key:
    /// `{"kind": ..., "default": ..., "help": ...}`.
    #[getter]
    fn options<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let all = PyDict::new(py);
        for (key, kind, default, help) in &self.facts.options {
            let one = PyDict::new(py);
            one.set_item("kind", kind)?;
            one.set_item("default", python_value(py, default)?)?;
            one.set_item("help", help)?;
            all.set_item(key, one)?;
        }
        Ok(all)
    }

    fn __repr__(&self) -> String {
        format!("<tts.Engine {} {} on {} ({}), {} Hz>", self.facts.family, self.facts.variant, self.facts.device, self.facts.backend, self.facts.sample_rate)
    }
}

/// `model=`: one path or a list of them, as `--model` is given once or more.
fn model_files(model: &Bound<'_, PyAny>) -> PyResult<Vec<PathBuf>> {
    match model.extract::<PathBuf>() {
        Ok(one) => Ok(vec![one]),
        Err(_) => model.extract::<Vec<PathBuf>>().map_err(|_| PyTypeError::new_err("model: give a path or a list of paths")),
    }
}

/// Opens the engine and its model: plugins from `plugin_dir`, else
/// [`PLUGIN_PATH_ENV`], else the wheel's own `tts/plugins/`. A profile is
/// never trusted to name code (docs/reliability.md, "Trust model").
fn open(profile: Profile, plugin_dir: Option<PathBuf>, set: &[(String, String)]) -> Result<Loaded, String> {
    if !profile.plugin_dirs.is_empty() {
        return Err(format!(
            "{}: [plugins] dirs would load code from {}; a profile is not trusted to name code: remove [plugins] dirs and pass plugin_dir= or set {PLUGIN_PATH_ENV}",
            profile.origin(),
            profile.plugin_dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
        ));
    }
    let given: Vec<PathBuf> = plugin_dir.into_iter().collect();
    let dirs = library_plugin_dirs(&profile, module_path().as_deref(), &given).map_err(|e| e.to_string())?;
    let engine = CoreEngine::open(profile, dirs).map_err(|e| e.to_string())?;
    let session = engine.open_model(set).map_err(|e| e.to_string())?;
    Ok(Loaded { session, _engine: engine })
}
