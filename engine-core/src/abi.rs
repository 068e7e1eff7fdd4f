#![allow(non_local_definitions)]
//! The Rust-to-Rust plugin ABI (abi_stable). Every type here is layout-checked when
//! a plugin loads; changing one is an ABI change and bumps [`PLUGIN_ABI_VERSION`].
//!
//! Two root modules exist: [`BackendPluginRef`] (one per ggml backend: CPU,
//! Vulkan, ...) and [`ModelPluginRef`] (one per model family). A backend plugin
//! hands out [`BackendHandle`]s; a model plugin builds its graphs on them. Both
//! sides link the same shared `libggml-base`, so the raw ggml pointers inside a
//! handle are valid in every plugin of the process.

use abi_stable::{
    declare_root_module_statics,
    library::RootModule,
    sabi_trait,
    sabi_types::VersionStrings,
    std_types::{RBox, RResult, RSlice, RStr, RString, RVec, Tuple2},
    StableAbi,
};
use std::ffi::c_void;

/// Version of this ABI. abi_stable refuses a plugin built against another
/// major version, or against an older minor one (its prefix layouts accept
/// only plugins that have at least the host's fields): the loader then tries
/// the interfaces of earlier minors, kept as they were ([`v5_4`] to
/// [`v5_1`]), and adapts a plugin that matches one of them.
pub const PLUGIN_ABI_VERSION: &str = "5.6.0";

/// The backend plugin interface has not changed since 5.1, so backend plugins
/// of 5.1 load as they are.
pub const BACKEND_ABI_VERSION: &str = "5.1.0";

/// The model plugin interface of earlier minor versions, kept for loading
/// plugins built against them.
pub mod v5_1;
pub mod v5_2;
pub mod v5_3;
pub mod v5_4;
pub mod v5_5;

/// Identity of a plugin file.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct PluginInfo {
    /// Short name: "cpu", "vulkan", "supertonic", ...
    pub name: RString,
    /// The plugin crate's own version.
    pub version: RString,
    /// ggml version of the pinned source the plugin was built against.
    pub ggml_version: RString,
    /// Fingerprint of that source (must equal the host's).
    pub ggml_source_fingerprint: RString,
    pub description: RString,
}

/// Kind of a device, as used for automatic device choice.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Gpu,
    IntegratedGpu,
    Accelerator,
    Cpu,
    /// A CPU-type device behind a GPU API (lavapipe, SwiftShader).
    SoftwareGpu,
}

impl DeviceKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            DeviceKind::Gpu => "gpu",
            DeviceKind::IntegratedGpu => "igpu",
            DeviceKind::Accelerator => "accel",
            DeviceKind::Cpu => "cpu",
            DeviceKind::SoftwareGpu => "software-gpu",
        }
    }

    /// Higher is preferred by `device = "auto"`.
    pub fn preference(&self) -> u8 {
        match self {
            DeviceKind::Gpu => 4,
            DeviceKind::IntegratedGpu => 3,
            DeviceKind::Accelerator => 2,
            DeviceKind::Cpu => 1,
            DeviceKind::SoftwareGpu => 0,
        }
    }
}

#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct DeviceInfo {
    /// Index within its backend plugin.
    pub index: u32,
    /// ggml device name ("CPU", "Vulkan0", ...).
    pub name: RString,
    pub description: RString,
    /// Bus id ("0000:01:00.0"), empty where the backend reports none.
    pub bus_id: RString,
    pub kind: DeviceKind,
    pub memory_free: u64,
    pub memory_total: u64,
}

/// The answer of one capability probe on one device.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct ProbeResult {
    pub name: RString,
    pub supported: bool,
    /// What was asked (op, types, shape) — printed by `tts devices`.
    pub detail: RString,
}

/// A typed option value (backend options, synthesis options).
#[repr(C, u8)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub enum OptionValue {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(RString),
}

#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionKind {
    Bool,
    Int,
    Float,
    Str,
    /// A string naming a file or directory; relative paths resolve against the profile.
    Path,
}

impl OptionKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            OptionKind::Bool => "boolean",
            OptionKind::Int => "integer",
            OptionKind::Float => "float",
            OptionKind::Str => "string",
            OptionKind::Path => "path",
        }
    }

    /// "a boolean", "an integer", ... for messages.
    pub fn with_article(&self) -> &'static str {
        match self {
            OptionKind::Bool => "a boolean",
            OptionKind::Int => "an integer",
            OptionKind::Float => "a float",
            OptionKind::Str => "a string",
            OptionKind::Path => "a path",
        }
    }
}

/// One option a plugin accepts. The host validates profile tables against these
/// (unknown key, wrong type → error with the key and line) before the plugin sees them.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct OptionSpec {
    pub key: RString,
    pub kind: OptionKind,
    pub default: OptionValue,
    pub help: RString,
}

pub type OptionList = RVec<Tuple2<RString, OptionValue>>;

/// What the host passes when it opens a backend plugin.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct BackendOpenRequest {
    /// Where the plugin file was loaded from; its ggml module sits beside it.
    pub plugin_path: RString,
    /// Validated options from `[backends.<name>]`, defaults filled in.
    pub options: OptionList,
}

/// An initialised device, usable by any model plugin in the process.
/// Dropping it frees the ggml backend.
#[repr(C)]
#[derive(StableAbi)]
pub struct BackendHandle {
    /// `ggml_backend_t`
    pub backend: *mut c_void,
    /// `ggml_backend_dev_t`
    pub device: *mut c_void,
    pub backend_name: RString,
    pub device_name: RString,
    /// CPU worker threads (0 when the backend has none).
    pub threads: u32,
    pub free: extern "C" fn(*mut c_void),
}

unsafe impl Send for BackendHandle {}
unsafe impl Sync for BackendHandle {}

impl Drop for BackendHandle {
    fn drop(&mut self) {
        (self.free)(self.backend);
    }
}

impl BackendHandle {
    /// A non-owning view of the ggml backend (the handle stays the owner).
    pub fn ggml_backend(&self) -> ggml_sys::Backend {
        unsafe { ggml_sys::Backend::from_raw(self.backend.cast()) }.expect("BackendHandle holds a null backend")
    }
}

/// One backend plugin, opened with options.
#[sabi_trait]
pub trait BackendSession: Send + Sync {
    /// Devices this plugin exposes under its options.
    fn devices(&self) -> RVec<DeviceInfo>;
    /// Capability probes for one device (cached by the plugin).
    fn probe(&self, device: u32) -> RResult<RVec<ProbeResult>, RString>;
    /// Initialises a device.
    fn init_device(&self, device: u32) -> RResult<BackendHandle, RString>;
    /// Facts about the loaded ggml module (file, stamp, build features).
    #[sabi(last_prefix_field)]
    fn module_facts(&self) -> OptionList;
}

pub type BackendSessionBox = BackendSession_TO<'static, RBox<()>>;

/// Root module of a backend plugin (`libtts_backend_<name>.so`).
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = BackendPluginRef)))]
#[sabi(missing_field(panic))]
pub struct BackendPlugin {
    pub info: extern "C" fn() -> PluginInfo,
    pub option_specs: extern "C" fn() -> RVec<OptionSpec>,
    #[sabi(last_prefix_field)]
    pub open: extern "C" fn(&BackendOpenRequest) -> RResult<BackendSessionBox, RString>,
}

impl RootModule for BackendPluginRef {
    declare_root_module_statics! {BackendPluginRef}
    const BASE_NAME: &'static str = "tts_backend";
    const NAME: &'static str = "tts backend plugin";
    const VERSION_STRINGS: VersionStrings = VersionStrings::new(BACKEND_ABI_VERSION);
}

/// K/V cache element type chosen by policy resolution.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvType {
    F32,
    F16,
    Bf16,
    Q8_0,
}

impl KvType {
    pub fn as_str(&self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Bf16 => "bf16",
            KvType::Q8_0 => "q8_0",
        }
    }
}

/// How matrix-product weights are stored on the device (policy `f16_weights`).
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightStorage {
    /// As converted (`auto` on a device with F16 products).
    AsStored,
    /// F32 weights narrowed to F16 at load (`on`).
    F16,
    /// F16 weights widened to F32 at load (`off`, or `auto` without F16 products).
    F32,
}

impl WeightStorage {
    pub fn as_str(&self) -> &'static str {
        match self {
            WeightStorage::AsStored => "as stored",
            WeightStorage::F16 => "f16",
            WeightStorage::F32 => "f32",
        }
    }
}

/// An op a deny rule forbids on the chosen device.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct DeniedOp {
    /// ggml op name (`FLASH_ATTN_EXT`).
    pub op: RString,
    /// The rule, as errors name it: `deny rule 2 (device "*Mali*"): reason`.
    pub rule: RString,
}

/// The outcome of policy resolution for one device; what model plugins obey
/// (through `engine_core::model_kit::OpPolicy`).
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct ResolvedPolicies {
    pub flash_attn: bool,
    pub kv_type: KvType,
    pub matmul_weights: WeightStorage,
    pub native_leaky_relu: bool,
    pub conv_transpose_1d: bool,
    pub pinned_host: bool,
    /// Ops a deny rule forbids on this device; model plugins use fallbacks or refuse to load.
    pub denied_ops: RVec<DeniedOp>,
    /// The policies the profile sets to "on" rather than "auto": a model that
    /// cannot honour one of them on this device refuses to load instead of
    /// falling back.
    pub forced: RVec<RString>,
}

/// Which families and GGUF files a model plugin takes.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct ModelFamilyInfo {
    pub family: RString,
    /// `general.architecture` values this plugin loads.
    pub architectures: RVec<RString>,
    /// Variant names (read from GGUF metadata at load): "v2", "turbo", ...
    pub variants: RVec<RString>,
}

#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct ModelLoadRequest {
    /// GGUF files from the profile, in order.
    pub files: RVec<RString>,
    pub policies: ResolvedPolicies,
}

/// What a memory plan is asked for (ABI 5.6): the files and policies a load
/// would get, and the synthesis options whose limits size the graphs.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct MemoryPlanRequest {
    pub load: ModelLoadRequest,
    pub options: OptionList,
}

/// One item of a memory plan: weights, a cache, a stage graph's
/// intermediates, staging.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct MemoryItem {
    pub what: RString,
    pub bytes: u64,
}

/// The device memory a model needs, by item, sized before it is loaded
/// (ABI 5.6), and at which lengths (`sized_for`, one line for people).
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Default, PartialEq)]
pub struct MemoryPlan {
    pub items: RVec<MemoryItem>,
    pub sized_for: RString,
}

impl MemoryPlan {
    pub fn total(&self) -> u64 {
        self.items.iter().map(|i| i.bytes).sum()
    }

    /// The bytes of item `what`.
    pub fn get(&self, what: &str) -> Option<u64> {
        self.items.iter().find(|i| i.what.as_str() == what).map(|i| i.bytes)
    }
}

#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct LoadedModelInfo {
    pub family: RString,
    pub variant: RString,
    pub sample_rate: u32,
}

#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct SynthesisRequest {
    pub text: RString,
    /// Validated synthesis options (voice, language, steps, speed, seed, ...).
    pub options: OptionList,
}

#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct StageTiming {
    pub stage: RString,
    pub ms: f64,
}

/// A discrete intermediate result that two runs either share exactly or not
/// (Chatterbox: T3's speech tokens); `tts compare` reports where they part.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct TokenTrace {
    pub name: RString,
    pub tokens: RVec<u32>,
}

#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct SynthesisOutput {
    /// Mono samples in [-1, 1].
    pub samples: RVec<f32>,
    pub sample_rate: u32,
    pub timings: RVec<StageTiming>,
    /// Token streams of the run, if the model has any.
    pub tokens: RVec<TokenTrace>,
}

#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct VoiceCloneRequest {
    /// The recording to clone (a path the host checked exists).
    pub reference: RString,
    /// Validated synthesis options (a family may read some while cloning).
    pub options: OptionList,
}

#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct VoiceCloneOutput {
    /// The voice file, in the family's own documented format; the host writes it.
    pub voice: RVec<u8>,
    pub timings: RVec<StageTiming>,
}

/// Where a streamed synthesis delivers its audio (ABI 5.2): the host's
/// callback, called on the synthesizing thread with each piece in order
/// (mono samples in [-1, 1] at `sample_rate`). It returns false to stop the
/// synthesis: the listener went away, or the host cancels.
#[repr(C)]
#[derive(StableAbi)]
pub struct AudioSink {
    /// The host's state, opaque to the plugin.
    pub context: *mut c_void,
    pub deliver: extern "C" fn(context: *mut c_void, samples: RSlice<'_, f32>, sample_rate: u32) -> bool,
}

impl AudioSink {
    /// Hands `samples` to the host; false: stop synthesizing.
    pub fn send(&self, samples: &[f32], sample_rate: u32) -> bool {
        (self.deliver)(self.context, RSlice::from_slice(samples), sample_rate)
    }
}

/// Where a synthesis reports the work it does before a piece is ready (ABI
/// 5.5): the host's callback, called on the synthesizing thread. `unit` names
/// what is counted ("speech tokens"), `done` how many so far in the current
/// piece, `limit` the most there can be in it (0: no bound known). It returns
/// false to stop the synthesis, as [`AudioSink`] does: a host can then cancel
/// a long autoregressive stretch that has not yet produced a piece.
#[repr(C)]
#[derive(StableAbi)]
pub struct ProgressSink {
    /// The host's state, opaque to the plugin.
    pub context: *mut c_void,
    pub report: extern "C" fn(context: *mut c_void, unit: RStr<'_>, done: u64, limit: u64) -> bool,
}

impl ProgressSink {
    /// Tells the host `done` of at most `limit` `unit`s are done; false: stop
    /// synthesizing.
    pub fn report(&self, unit: &str, done: u64, limit: u64) -> bool {
        (self.report)(self.context, RStr::from_str(unit), done, limit)
    }
}

/// How a streamed synthesis ended; its audio went to the [`AudioSink`].
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Default)]
pub struct StreamSummary {
    pub sample_rate: u32,
    /// Samples delivered, over all pieces.
    pub samples: u64,
    /// Pieces delivered.
    pub pieces: u32,
    /// The sink asked to stop before the end.
    pub cancelled: bool,
    pub timings: RVec<StageTiming>,
    pub tokens: RVec<TokenTrace>,
}

impl StreamSummary {
    /// A whole synthesis delivered as one piece: what a model without
    /// streaming does (the default [`Model::synthesize_streaming`]).
    pub fn one_piece(output: SynthesisOutput, sink: &AudioSink) -> StreamSummary {
        let kept = sink.send(&output.samples, output.sample_rate);
        StreamSummary {
            sample_rate: output.sample_rate,
            samples: output.samples.len() as u64,
            pieces: 1,
            cancelled: !kept,
            timings: output.timings,
            tokens: output.tokens,
        }
    }
}

/// What a loaded model offers to choose from (ABI 5.2): `tts voices`, the
/// server's voice list.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Default)]
pub struct ModelCatalog {
    /// Built-in voices by the names the `voice` option takes, the default first.
    pub voices: RVec<RString>,
    /// Language codes the `language` option takes, the default first (empty:
    /// the model has no such option).
    pub languages: RVec<RString>,
    /// Whether it clones voices (`tts voice save`, voice files as `voice`).
    pub clones_voices: bool,
}

/// What a family's converter reads (ABI 5.4; `tts convert`, `tts pull`).
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct ConverterInfo {
    /// What it converts, for people ("the official … checkpoint directory").
    pub description: RString,
    /// File names (relative to the checkpoint directory) any one of which
    /// marks a directory as this family's checkpoint: `tts convert` picks the
    /// plugin whose marker it finds.
    pub marker_files: RVec<RString>,
    /// Its options (`tts convert --set KEY=VALUE`), validated by the host
    /// as synthesis options are.
    pub options: RVec<OptionSpec>,
}

/// One conversion (ABI 5.4): an official checkpoint directory in, GGUF
/// files out.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct ConvertRequest {
    /// The checkpoint directory as published.
    pub source: RString,
    /// An existing directory the GGUF files are written into, each through a
    /// temporary that is renamed when complete.
    pub out_dir: RString,
    /// Validated converter options, defaults filled in.
    pub options: OptionList,
}

/// A file a conversion wrote.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct ConvertedFile {
    pub path: RString,
    /// One line: what it holds ("T3 turbo, 49 tensors, 12 stored q8_0").
    pub summary: RString,
}

impl ConvertedFile {
    pub fn new(path: &std::path::Path, summary: &str) -> Self {
        ConvertedFile { path: path.to_string_lossy().as_ref().into(), summary: summary.into() }
    }
}

/// What a conversion wrote, in the order a profile's `[model] files` lists
/// them.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Default)]
pub struct ConvertOutput {
    pub files: RVec<ConvertedFile>,
    /// The variant converted ("turbo", "v2", …).
    pub variant: RString,
}

/// A loaded model, bound to the backend it was loaded on.
///
/// Methods after `synthesize` were added in minor ABI versions: a plugin
/// built before one existed answers it with the default body below.
#[sabi_trait]
pub trait Model: Send {
    fn info(&self) -> LoadedModelInfo;
    #[sabi(last_prefix_field)]
    fn synthesize(&mut self, request: &SynthesisRequest) -> RResult<SynthesisOutput, RString>;

    /// Computes a reusable voice from a reference recording (ABI 5.1).
    fn clone_voice(&mut self, request: &VoiceCloneRequest) -> RResult<VoiceCloneOutput, RString> {
        let _ = request;
        RResult::RErr(RString::from("this model family does not clone voices"))
    }

    /// [`Model::synthesize`], delivering the audio to `sink` piece by piece as
    /// it is produced, and stopping early when the sink says so (ABI 5.2). By
    /// default (and from plugins built before 5.2): the whole synthesis as
    /// one piece.
    fn synthesize_streaming(&mut self, request: &SynthesisRequest, sink: &AudioSink) -> RResult<StreamSummary, RString> {
        match self.synthesize(request) {
            RResult::ROk(output) => RResult::ROk(StreamSummary::one_piece(output, sink)),
            RResult::RErr(e) => RResult::RErr(e),
        }
    }

    /// Its voices and languages (ABI 5.2; before: nothing listed).
    fn catalog(&self) -> ModelCatalog {
        ModelCatalog::default()
    }

    /// [`Model::synthesize_streaming`], also reporting to `progress` the work
    /// done before each piece is ready, and stopping when either sink says so
    /// (ABI 5.5). By default (and from plugins built before 5.5): no
    /// progress, the streaming synthesis as it is.
    fn synthesize_with_progress(&mut self, request: &SynthesisRequest, sink: &AudioSink, progress: &ProgressSink) -> RResult<StreamSummary, RString> {
        let _ = progress;
        self.synthesize_streaming(request, sink)
    }
}

pub type ModelBox = Model_TO<'static, RBox<()>>;

/// Root module of a model-family plugin (`libtts_model_<family>.so`).
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = ModelPluginRef)))]
#[sabi(missing_field(panic))]
pub struct ModelPlugin {
    pub info: extern "C" fn() -> PluginInfo,
    pub family: extern "C" fn() -> ModelFamilyInfo,
    /// Schema of `[synthesis]` options.
    pub option_specs: extern "C" fn() -> RVec<OptionSpec>,
    #[sabi(last_prefix_field)]
    pub load: extern "C" fn(&ModelLoadRequest, &BackendHandle) -> RResult<ModelBox, RString>,
    /// Loads a model only to clone voices (ABI 5.3; `tts voice save`): the
    /// weights cloning reads and nothing else. Its `clone_voice` answers as
    /// the full model's does; its `synthesize` is a one-line refusal. `None`
    /// where the family has no lighter load, and read as `None` from a plugin
    /// built before the field existed: the host then clones with `load`.
    #[sabi(missing_field(default))]
    pub load_for_cloning: Option<extern "C" fn(&ModelLoadRequest, &BackendHandle) -> RResult<ModelBox, RString>>,
    /// What the family's converter reads (ABI 5.4); `None` where the family
    /// converts nothing, and read as `None` from a plugin built before.
    #[sabi(missing_field(default))]
    pub converter: Option<extern "C" fn() -> ConverterInfo>,
    /// Converts an official checkpoint to the GGUF files `load` takes (ABI
    /// 5.4), with the model kit's shared readers and writer; present exactly
    /// when `converter` is.
    #[sabi(missing_field(default))]
    pub convert: Option<extern "C" fn(&ConvertRequest) -> RResult<ConvertOutput, RString>>,
    /// The device memory a load and a synthesis at the options' limits need,
    /// sized from the files alone (ABI 5.6; `tts fit`, and the check before
    /// every load). `None` where the family sizes nothing, and read as `None`
    /// from a plugin built before.
    #[sabi(missing_field(default))]
    pub plan_memory: Option<extern "C" fn(&MemoryPlanRequest, &BackendHandle) -> RResult<MemoryPlan, RString>>,
}

impl RootModule for ModelPluginRef {
    declare_root_module_statics! {ModelPluginRef}
    const BASE_NAME: &'static str = "tts_model";
    const NAME: &'static str = "tts model plugin";
    const VERSION_STRINGS: VersionStrings = VersionStrings::new(PLUGIN_ABI_VERSION);
}

/// Plugin info filled from this build (plugins call this with their own name).
pub fn plugin_info(name: &str, version: &str, description: &str) -> PluginInfo {
    PluginInfo {
        name: name.into(),
        version: version.into(),
        ggml_version: ggml_sys::GGML_VERSION.into(),
        ggml_source_fingerprint: ggml_sys::SOURCE_FINGERPRINT.into(),
        description: description.into(),
    }
}

pub fn option_list(pairs: impl IntoIterator<Item = (String, OptionValue)>) -> OptionList {
    pairs.into_iter().map(|(k, v)| Tuple2(RString::from(k), v)).collect()
}

pub fn find_option<'a>(options: &'a OptionList, key: &str) -> Option<&'a OptionValue> {
    options.iter().find(|Tuple2(k, _)| k.as_str() == key).map(|Tuple2(_, v)| v)
}
