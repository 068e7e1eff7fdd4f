//! A backend plugin from a hypothetical future host: same root-module name, plugin
//! ABI 9.0.0 and a different layout. The host must refuse it with a clear error.
#![allow(non_local_definitions)]

use abi_stable::{
    declare_root_module_statics, export_root_module, library::RootModule, prefix_type::PrefixTypeTrait, sabi_types::VersionStrings, std_types::RString,
    StableAbi,
};

#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = FutureBackendRef)))]
#[sabi(missing_field(panic))]
pub struct FutureBackend {
    #[sabi(last_prefix_field)]
    pub describe: extern "C" fn() -> RString,
}

impl RootModule for FutureBackendRef {
    declare_root_module_statics! {FutureBackendRef}
    const BASE_NAME: &'static str = "tts_backend";
    const NAME: &'static str = "tts backend plugin";
    const VERSION_STRINGS: VersionStrings = VersionStrings::new("9.0.0");
}

extern "C" fn describe() -> RString {
    "plugin ABI 2".into()
}

#[export_root_module]
pub fn get_library() -> FutureBackendRef {
    FutureBackend { describe }.leak_into_prefix()
}
