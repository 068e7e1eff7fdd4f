//! The Vulkan plugin's persistent pipeline cache (patch 0003): after a graph runs,
//! `<dir>/ggml-vk-<vendor>-<device>-<driver>.bin` holds a VkPipelineCache whose
//! header names the device, and no temporary file is left behind.
//! (Own test binary: the cache directory is read once per process, when the
//! Vulkan device is created.)

mod common;

use common::open_device;
use engine_core::abi::OptionValue;
use ggml_sys::{Context, TYPE_F32};

#[test]
fn pipeline_cache_is_written_with_a_valid_header() {
    let dir = tempfile::tempdir().unwrap();
    let handle = open_device(
        "vulkan",
        vec![
            ("allow_software", OptionValue::Bool(true)),
            ("pipeline_cache", OptionValue::Bool(true)),
            ("pipeline_cache_dir", OptionValue::Str(dir.path().display().to_string().into())),
        ],
    );
    let backend = handle.ggml_backend();
    let ctx = Context::new_no_alloc(4, 8).unwrap();
    let a = ctx.new_tensor(TYPE_F32, &[32, 8]).unwrap();
    let b = ctx.new_tensor(TYPE_F32, &[32, 4]).unwrap();
    let c = ctx.mul_mat(a, b).unwrap();
    let mut graph = ctx.new_graph(8).unwrap();
    graph.build_forward(c);
    let _buf = backend.alloc_ctx_tensors(&ctx).unwrap();
    a.set_f32(&vec![0.5; 256]).unwrap();
    b.set_f32(&vec![2.0; 128]).unwrap();
    backend.compute(&graph).unwrap();
    assert!(c.get_f32().unwrap().iter().all(|v| (*v - 32.0).abs() < 1e-4));

    let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().to_string()).collect();
    assert_eq!(files.len(), 1, "one cache file, no temporaries: {files:?}");
    let name = &files[0];
    assert!(name.starts_with("ggml-vk-") && name.ends_with(".bin"), "{name}");
    let parts: Vec<&str> = name.trim_start_matches("ggml-vk-").trim_end_matches(".bin").split('-').collect();
    assert_eq!(parts.len(), 3, "vendor-device-driver: {name}");
    let vendor = u32::from_str_radix(parts[0], 16).unwrap();
    let device = u32::from_str_radix(parts[1], 16).unwrap();

    let data = std::fs::read(dir.path().join(name)).unwrap();
    let word = |i: usize| u32::from_le_bytes(data[i * 4..i * 4 + 4].try_into().unwrap());
    assert!(data.len() >= 32, "cache holds at least its header");
    assert_eq!(word(1), 1, "VK_PIPELINE_CACHE_HEADER_VERSION_ONE");
    assert_eq!((word(2), word(3)), (vendor, device), "header names the device in the file name");
}
