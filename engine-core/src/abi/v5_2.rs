//! The model plugin interface as it was at ABI 5.2: the model trait of then,
//! which 5.3 and 5.4 kept (streaming and the catalog, no progress), and the
//! root module of then, before `load_for_cloning`: what a plugin built then
//! declares, type for type (abi_stable compares names and layouts, and a
//! plugin's trait table must have at least the host's methods, so a 5.2 to
//! 5.4 model is not the current trait). [`Legacy`] adapts such a model to
//! the current [`super::Model`], which answers `synthesize_with_progress`
//! with its default: the streaming synthesis, no progress. Nothing here may
//! change.

use super::{
    AudioSink, LoadedModelInfo, ModelCatalog, ModelFamilyInfo, ModelLoadRequest, OptionSpec, PluginInfo, StreamSummary, SynthesisOutput, SynthesisRequest,
    VoiceCloneOutput, VoiceCloneRequest,
};
use super::{BackendHandle, Model_TO as CurrentModelTo};
use abi_stable::{
    declare_root_module_statics,
    library::RootModule,
    sabi_trait,
    sabi_trait::TD_Opaque,
    sabi_types::VersionStrings,
    std_types::{RBox, RResult, RString, RVec},
    StableAbi,
};

pub const PLUGIN_ABI_VERSION: &str = "5.2.0";

/// A loaded model (ABI 5.2 to 5.4).
#[sabi_trait]
pub trait Model: Send {
    fn info(&self) -> LoadedModelInfo;
    #[sabi(last_prefix_field)]
    fn synthesize(&mut self, request: &SynthesisRequest) -> RResult<SynthesisOutput, RString>;

    fn clone_voice(&mut self, request: &VoiceCloneRequest) -> RResult<VoiceCloneOutput, RString> {
        let _ = request;
        RResult::RErr(RString::from("this model family does not clone voices"))
    }

    fn synthesize_streaming(&mut self, request: &SynthesisRequest, sink: &AudioSink) -> RResult<StreamSummary, RString> {
        match self.synthesize(request) {
            RResult::ROk(output) => RResult::ROk(StreamSummary::one_piece(output, sink)),
            RResult::RErr(e) => RResult::RErr(e),
        }
    }

    fn catalog(&self) -> ModelCatalog {
        ModelCatalog::default()
    }
}

pub type ModelBox = Model_TO<'static, RBox<()>>;

/// Root module of a model-family plugin (ABI 5.2).
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = ModelPluginRef)))]
#[sabi(missing_field(panic))]
pub struct ModelPlugin {
    pub info: extern "C" fn() -> PluginInfo,
    pub family: extern "C" fn() -> ModelFamilyInfo,
    pub option_specs: extern "C" fn() -> RVec<OptionSpec>,
    #[sabi(last_prefix_field)]
    pub load: extern "C" fn(&ModelLoadRequest, &BackendHandle) -> RResult<ModelBox, RString>,
}

impl RootModule for ModelPluginRef {
    declare_root_module_statics! {ModelPluginRef}
    const BASE_NAME: &'static str = "tts_model";
    const NAME: &'static str = "tts model plugin";
    const VERSION_STRINGS: VersionStrings = VersionStrings::new(PLUGIN_ABI_VERSION);
}

/// A 5.2 to 5.4 model behind the current interface.
pub struct Legacy(pub ModelBox);

impl super::Model for Legacy {
    fn info(&self) -> LoadedModelInfo {
        self.0.info()
    }

    fn synthesize(&mut self, request: &SynthesisRequest) -> RResult<SynthesisOutput, RString> {
        self.0.synthesize(request)
    }

    fn clone_voice(&mut self, request: &VoiceCloneRequest) -> RResult<VoiceCloneOutput, RString> {
        self.0.clone_voice(request)
    }

    fn synthesize_streaming(&mut self, request: &SynthesisRequest, sink: &AudioSink) -> RResult<StreamSummary, RString> {
        self.0.synthesize_streaming(request, sink)
    }

    fn catalog(&self) -> ModelCatalog {
        self.0.catalog()
    }
}

impl Legacy {
    /// The 5.2 to 5.4 model as a current [`super::ModelBox`].
    pub fn adapt(model: ModelBox) -> super::ModelBox {
        CurrentModelTo::from_value(Legacy(model), TD_Opaque)
    }
}
