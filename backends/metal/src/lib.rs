//! Metal backend plugin: ggml's Metal module with this plugin's patch series.
//! The module is built on a Mac (`cargo xtask module-kit metal`) and put beside
//! this plugin; it is checked against the stamp compiled in here. Without it,
//! or without a Metal device, opening this backend fails with one line and the
//! profile's next backend is used.

use abi_stable::std_types::{RResult, RString, RVec};
use engine_core::abi::{BackendOpenRequest, BackendSessionBox, DeviceKind, OptionSpec};
use engine_core::backend_kit::{self, BackendFlavor, GgmlSession};
use ggml_sys::{Device, Registry};

engine_core::backend_plugin!("metal", "ggml Metal backend");

extern "C" fn option_specs() -> RVec<OptionSpec> {
    RVec::new()
}

struct Metal;

impl BackendFlavor for Metal {
    fn classify(&self, _registry: &Registry, _index: usize, device: &Device) -> Option<DeviceKind> {
        // Apple GPUs share the system's memory.
        Some(match device.kind() {
            ggml_sys::DeviceKind::Gpu | ggml_sys::DeviceKind::IntegratedGpu => DeviceKind::IntegratedGpu,
            _ => DeviceKind::Accelerator,
        })
    }
}

extern "C" fn open(req: &BackendOpenRequest) -> RResult<BackendSessionBox, RString> {
    backend_kit::guarded_open(|| {
        let (registry, facts) = engine_core::load_plugin_module!(req)?;
        Ok(GgmlSession::new(Metal, registry, facts).into_box())
    })
}
