//! The model plugin's root module as it was at ABI 5.5, before
//! `plan_memory`: what a plugin built then declares, type for type (abi_stable
//! compares names and layouts). Its model trait is this ABI's. Nothing here
//! may change.

use super::{BackendHandle, ConvertOutput, ConvertRequest, ConverterInfo, ModelBox, ModelFamilyInfo, ModelLoadRequest, OptionSpec, PluginInfo};
use abi_stable::{
    declare_root_module_statics,
    library::RootModule,
    sabi_types::VersionStrings,
    std_types::{RResult, RString, RVec},
    StableAbi,
};

pub const PLUGIN_ABI_VERSION: &str = "5.5.0";

/// Root module of a model-family plugin (ABI 5.5).
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
    #[sabi(missing_field(default))]
    pub load_for_cloning: Option<extern "C" fn(&ModelLoadRequest, &BackendHandle) -> RResult<ModelBox, RString>>,
    #[sabi(missing_field(default))]
    pub converter: Option<extern "C" fn() -> ConverterInfo>,
    #[sabi(missing_field(default))]
    pub convert: Option<extern "C" fn(&ConvertRequest) -> RResult<ConvertOutput, RString>>,
}

impl RootModule for ModelPluginRef {
    declare_root_module_statics! {ModelPluginRef}
    const BASE_NAME: &'static str = "tts_model";
    const NAME: &'static str = "tts model plugin";
    const VERSION_STRINGS: VersionStrings = VersionStrings::new(PLUGIN_ABI_VERSION);
}
