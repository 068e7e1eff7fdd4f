//! CUDA backend plugin: ggml's CUDA module with this plugin's patch series.
//! The module is built on a machine with nvcc (`cargo xtask module-kit cuda`)
//! and put beside this plugin; it is checked against the stamp compiled in
//! here. Without it, or without a driver or device, opening this backend fails
//! with one line and the profile's next backend is used.

use abi_stable::std_types::{RResult, RString, RVec};
use engine_core::abi::{BackendOpenRequest, BackendSessionBox, DeviceKind, OptionSpec};
use engine_core::backend_kit::{self, BackendFlavor, GgmlSession};
use ggml_sys::{Device, Registry};

engine_core::backend_plugin!("cuda", "ggml CUDA backend");

extern "C" fn option_specs() -> RVec<OptionSpec> {
    RVec::new()
}

struct Cuda;

impl BackendFlavor for Cuda {
    fn classify(&self, _registry: &Registry, _index: usize, device: &Device) -> Option<DeviceKind> {
        Some(backend_kit::gpu_kind(device))
    }
}

extern "C" fn open(req: &BackendOpenRequest) -> RResult<BackendSessionBox, RString> {
    backend_kit::guarded_open(|| {
        let (registry, facts) = engine_core::load_plugin_module!(req)?;
        Ok(GgmlSession::new(Cuda, registry, facts).into_box())
    })
}
