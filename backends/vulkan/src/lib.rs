//! Vulkan backend plugin: ggml's Vulkan module with this plugin's patches
//! (Debian 12 headers, optional software devices, persistent pipeline cache).

use abi_stable::std_types::{RResult, RString, RVec};
use engine_core::abi::{BackendOpenRequest, BackendSessionBox, DeviceKind, OptionKind, OptionSpec, OptionValue};
use engine_core::backend_kit::{self, BackendFlavor, GgmlSession};
use ggml_sys::{Device, Registry};
use std::path::PathBuf;

engine_core::backend_plugin!("vulkan", "ggml Vulkan backend");

extern "C" fn option_specs() -> RVec<OptionSpec> {
    RVec::from(vec![
        backend_kit::spec(
            "allow_software",
            OptionKind::Bool,
            OptionValue::Bool(false),
            "list CPU-type Vulkan devices (lavapipe, SwiftShader), ranked after every GPU",
        ),
        backend_kit::spec("pipeline_cache", OptionKind::Bool, OptionValue::Bool(true), "keep compiled pipelines on disk between runs"),
        backend_kit::spec(
            "pipeline_cache_dir",
            OptionKind::Path,
            OptionValue::Str("".into()),
            "pipeline cache directory; empty = $XDG_CACHE_HOME/tts/vulkan or ~/.cache/tts/vulkan",
        ),
    ])
}

/// `VkPhysicalDeviceType` values.
const VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: i32 = 1;
const VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: i32 = 2;
const VK_PHYSICAL_DEVICE_TYPE_CPU: i32 = 4;

struct Vulkan {
    allow_software: bool,
}

impl BackendFlavor for Vulkan {
    fn classify(&self, registry: &Registry, index: usize, _device: &Device) -> Option<DeviceKind> {
        type PhysicalType = unsafe extern "C" fn(usize) -> i32;
        let f = registry.proc_address("ggml_backend_vk_physical_device_type")?;
        let f: PhysicalType = unsafe { std::mem::transmute(f.as_ptr()) };
        match unsafe { f(index) } {
            VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU => Some(DeviceKind::Gpu),
            VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU => Some(DeviceKind::IntegratedGpu),
            VK_PHYSICAL_DEVICE_TYPE_CPU if self.allow_software => Some(DeviceKind::SoftwareGpu),
            VK_PHYSICAL_DEVICE_TYPE_CPU => None,
            _ => Some(DeviceKind::Accelerator),
        }
    }
}

fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("tts").join("vulkan"))
}

extern "C" fn open(req: &BackendOpenRequest) -> RResult<BackendSessionBox, RString> {
    backend_kit::guarded_open(|| {
        let allow_software = backend_kit::option_bool(req, "allow_software");
        // The patched module reads these while it enumerates devices, which
        // happens once per process, when it is first loaded: they must be set
        // first. Software devices are always enumerated and `classify` hides
        // them unless this profile allows them, so a second profile in the
        // same process (`tts compare`, a server with several models) gets
        // the devices it would get alone, not those the first one enumerated.
        std::env::set_var("GGML_VK_ALLOW_CPU_DEVICES", "1");
        if backend_kit::option_bool(req, "pipeline_cache") {
            let dir = match backend_kit::option_str(req, "pipeline_cache_dir") {
                d if d.is_empty() => default_cache_dir(),
                d => Some(PathBuf::from(d)),
            };
            if let Some(dir) = dir {
                std::env::set_var("GGML_VK_PIPELINE_CACHE_DIR", dir);
            }
        } else {
            std::env::remove_var("GGML_VK_PIPELINE_CACHE_DIR");
        }
        let (registry, facts) = engine_core::load_plugin_module!(req)?;
        Ok(GgmlSession::new(Vulkan { allow_software }, registry, facts).into_box())
    })
}
