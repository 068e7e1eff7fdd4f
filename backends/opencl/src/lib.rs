//! OpenCL backend plugin: ggml's OpenCL module with this plugin's patch series.
//!
//! ggml's OpenCL kernels need half precision (`cl_khr_fp16`), and its backend
//! admits only Adreno and Intel GPUs; every other device is skipped with a log
//! line at most. This plugin asks the OpenCL ICD loader itself for every
//! platform and device first, and reports each one the module cannot use with
//! the reason (`backend_kit::REFUSED_DEVICE_FACT`, which `tts devices` prints).
//! With no usable device the backend has none, and the profile's next backend
//! is used.

use abi_stable::std_types::{RResult, RString, RVec};
use cl3::device::{CL_DEVICE_EXTENSIONS, CL_DEVICE_NAME, CL_DEVICE_TYPE, CL_DEVICE_TYPE_ALL, CL_DEVICE_TYPE_GPU, CL_DEVICE_VENDOR};
use cl3::platform::{CL_PLATFORM_NAME, CL_PLATFORM_VENDOR};
use engine_core::abi::{BackendOpenRequest, BackendSessionBox, DeviceKind, OptionKind, OptionSpec, OptionValue};
use engine_core::backend_kit::{self, BackendFlavor, GgmlSession};
use ggml_sys::{Device, Registry};

engine_core::backend_plugin!("opencl", "ggml OpenCL backend");

extern "C" fn option_specs() -> RVec<OptionSpec> {
    RVec::from(vec![backend_kit::spec(
        "platform",
        OptionKind::Str,
        OptionValue::Str("".into()),
        "the OpenCL platform to use: part of its name or vendor as the ICD loader lists them (\"\" = ggml's choice)",
    )])
}

/// One OpenCL device as the ICD loader describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClDevice {
    pub platform: String,
    pub name: String,
    pub vendor: String,
    pub is_gpu: bool,
    pub extensions: String,
}

impl ClDevice {
    /// Why ggml's OpenCL backend cannot run on this device, if it cannot.
    pub fn refusal(&self) -> Option<String> {
        let mut why = Vec::new();
        if !self.extensions.split_whitespace().any(|e| e == "cl_khr_fp16") {
            why.push("no cl_khr_fp16 (ggml's OpenCL kernels compute in half precision)");
        }
        let admitted_family = ["Adreno", "Intel"].iter().any(|f| self.name.contains(f) || self.vendor.contains(f));
        if !self.is_gpu || !admitted_family {
            why.push("not an Adreno or Intel GPU (the only devices ggml's OpenCL backend admits)");
        }
        (!why.is_empty()).then(|| why.join("; "))
    }

    pub fn describe(&self) -> String {
        let kind = if self.is_gpu { "GPU" } else { "not a GPU" };
        format!("{} / {} ({}, {kind})", self.platform, self.name.trim(), self.vendor.trim())
    }
}

/// One OpenCL platform and its devices, in the ICD loader's order (ggml's too).
#[derive(Debug, Clone, PartialEq)]
pub struct ClPlatform {
    pub name: String,
    pub vendor: String,
    pub devices: Vec<ClDevice>,
}

/// Every OpenCL platform with its devices; an error when no ICD loader
/// (`libOpenCL.so.1`) can be loaded.
pub fn enumerate() -> Result<Vec<ClPlatform>, String> {
    if let Err(e) = cl3::load_library() {
        return Err(format!("no OpenCL ICD loader (libOpenCL.so.1): {e}"));
    }
    let text = |r: Result<cl3::info_type::InfoType, i32>| r.map(|v| String::from(v).trim_end_matches('\0').to_string()).unwrap_or_default();
    // No platform is CL_PLATFORM_NOT_FOUND_KHR (-1001): an empty list, not an error.
    let ids = cl3::platform::get_platform_ids().unwrap_or_default();
    let mut platforms = Vec::new();
    for platform in ids {
        let name = text(cl3::platform::get_platform_info(platform, CL_PLATFORM_NAME));
        let vendor = text(cl3::platform::get_platform_info(platform, CL_PLATFORM_VENDOR));
        let mut devices = Vec::new();
        for device in cl3::device::get_device_ids(platform, CL_DEVICE_TYPE_ALL).unwrap_or_default() {
            let kind: u64 = cl3::device::get_device_info(device, CL_DEVICE_TYPE).map(u64::from).unwrap_or(0);
            devices.push(ClDevice {
                platform: name.clone(),
                name: text(cl3::device::get_device_info(device, CL_DEVICE_NAME)),
                vendor: text(cl3::device::get_device_info(device, CL_DEVICE_VENDOR)),
                is_gpu: kind & CL_DEVICE_TYPE_GPU != 0,
                extensions: text(cl3::device::get_device_info(device, CL_DEVICE_EXTENSIONS)),
            });
        }
        platforms.push(ClPlatform { name, vendor, devices });
    }
    Ok(platforms)
}

/// The index of the platform `wanted` names (part of a name or vendor, as
/// ggml matches it), or why none can be used. ggml's OpenCL backend ends the
/// process when its platform variable names no platform, or one without
/// devices, so both are refused here first.
pub fn choose_platform(platforms: &[ClPlatform], wanted: &str) -> Result<usize, String> {
    let listed = || {
        let names: Vec<String> = platforms.iter().map(|p| format!("\"{}\" ({})", p.name, p.vendor)).collect();
        if names.is_empty() {
            "the ICD loader lists none".to_string()
        } else {
            format!("platforms: {}", names.join(", "))
        }
    };
    let Some(i) = platforms.iter().position(|p| p.name.contains(wanted) || p.vendor.contains(wanted)) else {
        return Err(format!("platform \"{wanted}\" matches no OpenCL platform ({})", listed()));
    };
    if platforms[i].devices.is_empty() {
        return Err(format!("platform \"{wanted}\" ({}) has no devices", platforms[i].name));
    }
    Ok(i)
}

/// The platform choice of the first open in this process (None inside: ggml's
/// own choice), with the option value that gave it.
static FIRST_PLATFORM: std::sync::Mutex<Option<(Option<usize>, String)>> = std::sync::Mutex::new(None);

/// Records the first choice; a later one must be the same platform, since ggml
/// would keep the first.
fn same_platform_as_first(first: &mut Option<(Option<usize>, String)>, chosen: Option<usize>, wanted: &str) -> Result<(), String> {
    match first {
        None => {
            *first = Some((chosen, wanted.to_string()));
            Ok(())
        }
        Some((earlier, _)) if *earlier == chosen => Ok(()),
        Some((_, earlier_wanted)) => Err(format!(
            "platform \"{wanted}\": this process already opened OpenCL with platform \"{earlier_wanted}\", and ggml's OpenCL module keeps the platform it \
             started with; run profiles that choose different OpenCL platforms in separate processes"
        )),
    }
}

struct OpenCl;

impl BackendFlavor for OpenCl {
    fn classify(&self, _registry: &Registry, _index: usize, device: &Device) -> Option<DeviceKind> {
        Some(backend_kit::gpu_kind(device))
    }
}

extern "C" fn open(req: &BackendOpenRequest) -> RResult<BackendSessionBox, RString> {
    backend_kit::guarded_open(|| {
        let platforms = enumerate()?;
        // The profile picks the platform; ggml's own variables, inherited from
        // the environment, could end the process when they name nothing.
        std::env::remove_var("GGML_OPENCL_DEVICE");
        let wanted = backend_kit::option_str(req, "platform");
        let chosen = match wanted.as_str() {
            "" => None,
            w => Some(choose_platform(&platforms, w).map_err(backend_kit::option_error)?),
        };
        // ggml reads its platform variable once per process, when the module
        // first lists devices: a second profile in this process (`tts
        // compare`, a server with several models) that chose another platform
        // would silently run on the first one's.
        let mut first = FIRST_PLATFORM.lock().unwrap_or_else(|p| p.into_inner());
        same_platform_as_first(&mut first, chosen, &wanted).map_err(backend_kit::option_error)?;
        match chosen {
            None => std::env::remove_var("GGML_OPENCL_PLATFORM"),
            Some(index) => std::env::set_var("GGML_OPENCL_PLATFORM", index.to_string()),
        }
        let devices: Vec<ClDevice> = platforms.into_iter().flat_map(|p| p.devices).collect();
        let (registry, mut facts) = engine_core::load_plugin_module!(req)?;
        backend_kit::add_refused_devices(&mut facts, devices.iter().filter_map(|d| d.refusal().map(|why| format!("{}: {why}", d.describe()))));
        Ok(GgmlSession::new(OpenCl, registry, facts).into_box())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(name: &str, vendor: &str, is_gpu: bool, extensions: &str) -> ClDevice {
        ClDevice { platform: "P".into(), name: name.into(), vendor: vendor.into(), is_gpu, extensions: extensions.into() }
    }

    #[test]
    fn refusals_name_every_reason() {
        let pocl = device("cpu-haswell-AMD EPYC", "AuthenticAMD", false, "cl_khr_byte_addressable_store cl_khr_fp64");
        assert_eq!(
            pocl.refusal().unwrap(),
            "no cl_khr_fp16 (ggml's OpenCL kernels compute in half precision); not an Adreno or Intel GPU (the only devices ggml's OpenCL backend admits)"
        );
        let h100 = device("NVIDIA H100 80GB HBM3", "NVIDIA Corporation", true, "cl_khr_fp64 cl_khr_int64_base_atomics");
        assert!(h100.refusal().unwrap().starts_with("no cl_khr_fp16"));
        let arc = device("Intel(R) Arc(TM) A770 Graphics", "Intel(R) Corporation", true, "cl_khr_fp16 cl_khr_fp64");
        assert_eq!(arc.refusal(), None);
        let adreno = device("QUALCOMM Adreno(TM) 740", "QUALCOMM", true, "cl_khr_fp16");
        assert_eq!(adreno.refusal(), None);
        let mali = device("Mali-G715", "ARM", true, "cl_khr_fp16");
        assert_eq!(mali.refusal().unwrap(), "not an Adreno or Intel GPU (the only devices ggml's OpenCL backend admits)");
    }

    #[test]
    fn a_second_profile_choosing_another_platform_is_refused() {
        let mut first = None;
        assert_eq!(same_platform_as_first(&mut first, Some(1), "Intel"), Ok(()));
        assert_eq!(same_platform_as_first(&mut first, Some(1), "Intel(R) OpenCL"), Ok(()), "another name for the same platform");
        assert_eq!(
            same_platform_as_first(&mut first, Some(0), "pocl").unwrap_err(),
            "platform \"pocl\": this process already opened OpenCL with platform \"Intel\", and ggml's OpenCL module keeps the platform it started \
             with; run profiles that choose different OpenCL platforms in separate processes"
        );
        assert!(same_platform_as_first(&mut first, None, "").is_err(), "ggml's own choice may differ from the first profile's");
        let mut unset = None;
        assert_eq!(same_platform_as_first(&mut unset, None, ""), Ok(()));
        assert!(same_platform_as_first(&mut unset, Some(0), "pocl").is_err());
    }

    #[test]
    fn a_platform_is_chosen_by_part_of_its_name_or_vendor() {
        let platform = |name: &str, vendor: &str, devices: usize| ClPlatform {
            name: name.into(),
            vendor: vendor.into(),
            devices: vec![device("d", vendor, true, "cl_khr_fp16"); devices],
        };
        let platforms = [platform("Portable Computing Language", "The pocl project", 1), platform("Intel(R) OpenCL Graphics", "Intel(R) Corporation", 1)];
        assert_eq!(choose_platform(&platforms, "Intel"), Ok(1));
        assert_eq!(choose_platform(&platforms, "pocl"), Ok(0), "by vendor");
        assert_eq!(
            choose_platform(&platforms, "Adreno").unwrap_err(),
            "platform \"Adreno\" matches no OpenCL platform (platforms: \"Portable Computing Language\" (The pocl project), \"Intel(R) OpenCL Graphics\" (Intel(R) Corporation))"
        );
        assert_eq!(choose_platform(&[], "x").unwrap_err(), "platform \"x\" matches no OpenCL platform (the ICD loader lists none)");
        let empty = [platform("Empty", "Nobody", 0)];
        assert_eq!(choose_platform(&empty, "Empty").unwrap_err(), "platform \"Empty\" (Empty) has no devices");
    }
}
