//! Vulkan backend plugin: ggml's Vulkan module with this plugin's patches
//! (Debian 12 headers, optional software devices, persistent pipeline cache,
//! device feature query), built with tensor-core shader variants.

use abi_stable::std_types::{RResult, RString, RVec};
use engine_core::abi::{BackendOpenRequest, BackendSessionBox, DeviceKind, OptionKind, OptionSpec, OptionValue, ProbeResult};
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

/// `ggml_backend_vk_device_features` (patch 0005): writes a device's feature
/// words into a buffer, returns their full length or -1.
type DeviceFeatures = unsafe extern "C" fn(usize, *mut std::ffi::c_char, usize) -> i32;

/// Which shader set the module was built with (`basic` lacks the tensor-core
/// variants; see `ggml_build_support::vulkan_toolchain`).
const SHADER_SET: &str = env!("TTS_VULKAN_SHADER_SET");

struct Vulkan {
    allow_software: bool,
    device_features: Option<DeviceFeatures>,
}

impl Vulkan {
    fn features(&self, index: usize) -> Option<Vec<String>> {
        let f = self.device_features?;
        let mut buf = vec![0u8; 256];
        let len = unsafe { f(index, buf.as_mut_ptr().cast(), buf.len()) };
        let len = usize::try_from(len).ok()?.min(buf.len() - 1);
        Some(String::from_utf8_lossy(&buf[..len]).split_whitespace().map(str::to_string).collect())
    }
}

/// The probe rows for what the device computes with: its matrix-core mode
/// (`NV_coopmat2` or `KHR_coopmat`, the tensor-core paths of ggml's matrix
/// products and flash attention), integer dot products (quantized products)
/// and bf16 arithmetic. `shader_set` explains a "no" that the module's build,
/// not the device, decided.
fn feature_probes(words: &[String], shader_set: &str) -> Vec<ProbeResult> {
    let has = |w: &str| words.iter().any(|x| x == w);
    let built = if shader_set == "basic" { " (module built without tensor-core shaders)" } else { "" };
    let matrix_cores = ["NV_coopmat2", "KHR_coopmat"].into_iter().find(|m| has(m));
    let row = |name: &str, supported: bool, detail: String| ProbeResult { name: name.into(), supported, detail: detail.into() };
    vec![
        row("matrix_cores", matrix_cores.is_some(), format!("matrix cores: {}{built}", matrix_cores.unwrap_or("none"))),
        row("integer_dot", has("int_dot"), format!("packed int8 dot products{}", if has("int_dot") { "" } else { built })),
        row("bf16_arithmetic", has("bf16"), "VK_KHR_shader_bfloat16".to_string()),
    ]
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

    fn adjust_probes(&self, index: usize, _device: &Device, results: &mut Vec<ProbeResult>) {
        if let Some(words) = self.features(index) {
            results.extend(feature_probes(&words, SHADER_SET));
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
        let device_features = registry.proc_address("ggml_backend_vk_device_features").map(|f| unsafe { std::mem::transmute::<_, DeviceFeatures>(f.as_ptr()) });
        Ok(GgmlSession::new(Vulkan { allow_software, device_features }, registry, facts).into_box())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(words: &str, shader_set: &str) -> Vec<(String, bool, String)> {
        let words: Vec<String> = words.split_whitespace().map(str::to_string).collect();
        feature_probes(&words, shader_set).into_iter().map(|p| (p.name.to_string(), p.supported, p.detail.to_string())).collect()
    }

    #[test]
    fn coopmat2_is_reported_over_khr_coopmat() {
        let r = rows("fp16 bf16 int_dot NV_coopmat2", "matrix-cores");
        assert_eq!(r[0], ("matrix_cores".into(), true, "matrix cores: NV_coopmat2".into()));
        assert!(r[1].1 && r[2].1);
        assert_eq!(rows("fp16 KHR_coopmat", "matrix-cores")[0].2, "matrix cores: KHR_coopmat");
    }

    /// The module this build placed beside the plugin embeds the SPIR-V of
    /// every tensor-core shader family: each shader declares its extension by
    /// name (`OpExtension`), so a build that fell back to a glslc without
    /// them fails here, not silently on a user's GPU.
    #[test]
    fn the_module_carries_the_tensor_core_shaders() {
        if SHADER_SET == "basic" {
            eprintln!("skipped: built with TTS_VULKAN_SHADERS=basic");
            return;
        }
        let exe = std::env::current_exe().unwrap();
        let module = exe.parent().and_then(|deps| deps.parent()).unwrap().join(format!("{}.so", env!("TTS_MODULE_STEM")));
        let bytes = std::fs::read(&module).unwrap_or_else(|e| panic!("{}: {e}", module.display()));
        let count = |needle: &[u8]| bytes.windows(needle.len()).filter(|w| *w == needle).count();
        for ext in ["SPV_KHR_cooperative_matrix", "SPV_NV_cooperative_matrix2", "SPV_KHR_integer_dot_product", "SPV_KHR_bfloat16"] {
            assert!(count(ext.as_bytes()) > 0, "{} has no shader declaring {ext}", module.display());
        }
    }

    #[test]
    fn a_basic_build_says_why_the_device_has_no_matrix_cores() {
        let r = rows("fp16", "basic");
        assert_eq!(r[0], ("matrix_cores".into(), false, "matrix cores: none (module built without tensor-core shaders)".into()));
        assert_eq!(r[1], ("integer_dot".into(), false, "packed int8 dot products (module built without tensor-core shaders)".into()));
        assert_eq!(rows("fp16", "matrix-cores")[0].2, "matrix cores: none");
    }
}
