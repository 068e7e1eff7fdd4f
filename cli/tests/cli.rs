//! End-to-end checks of the `tts` binary: plugin discovery and refusal, profile
//! errors, policy resolution, and the one-line error contract (no panic, non-zero
//! exit, no output file).

mod common;

use common::*;
use serde_json::Value;
use std::path::Path;

fn devices_json(profile: &Path, plugin_dir: &Path) -> Value {
    let o = run(&["devices", "--json", "--profile", profile.to_str().unwrap(), "--plugin-dir", plugin_dir.to_str().unwrap()]);
    assert!(o.status.success(), "tts devices failed: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn backend<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["backends"].as_array().unwrap().iter().find(|b| b["name"] == name).unwrap_or_else(|| panic!("no backend {name} in {report}"))
}

#[test]
fn version_names_ggml_and_plugin_abi() {
    let o = run(&["--version"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains(&format!("plugin ABI {}", engine_core::PLUGIN_ABI_VERSION)) && out.contains("ggml 0.26.0"), "{out}");
}

#[test]
fn ci_profile_lists_cpu_and_lavapipe_with_every_probe_and_policy() {
    let plugins = plugin_dir(&["cpu", "vulkan"]);
    let report = devices_json(&repo().join("profiles/ci.toml"), plugins.path());
    for (name, kind) in [("cpu", "cpu"), ("vulkan", "software-gpu")] {
        let b = backend(&report, name);
        assert_eq!(b["available"], true, "{b}");
        let devices = b["devices"].as_array().unwrap();
        let device = devices.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind} device in {b}"));
        let probes = device["probes"].as_array().unwrap();
        let names: Vec<&str> = probes.iter().map(|p| p["name"].as_str().unwrap()).collect();
        // The Vulkan plugin adds what the device computes with (patch 0005).
        let mut want = engine_probe_names();
        if name == "vulkan" {
            want.extend(["matrix_cores", "integer_dot", "bf16_arithmetic"]);
        }
        assert_eq!(names, want, "{name}");
        assert!(probes.iter().all(|p| p["supported"].is_boolean()));
        let decisions = device["policies"]["decisions"].as_array().unwrap_or_else(|| panic!("{name}: {}", device["policy_error"]));
        assert_eq!(decisions.len(), 8, "{name}");
        assert!(decisions.iter().all(|d| d["enabled"].is_boolean() && !d["reason"].as_str().unwrap().is_empty()));
    }
    // lavapipe has no BF16: kv_bf16 = "auto" resolves off there and the cache stays F16.
    let vk = &backend(&report, "vulkan")["devices"][0];
    let bf16 = vk["probes"].as_array().unwrap().iter().find(|p| p["name"] == "flash_attn_bf16_kv").unwrap();
    if bf16["supported"] == false {
        assert_eq!(vk["policies"]["kv_type"], "f16");
    }
    // Mesa 22.3's lavapipe offers no tensor-core path: the rows say so, and
    // not that the module lacks the shaders.
    let row = |n: &str| vk["probes"].as_array().unwrap().iter().find(|p| p["name"] == n).unwrap().clone();
    assert_eq!((row("matrix_cores")["supported"].as_bool(), row("matrix_cores")["detail"].as_str()), (Some(false), Some("matrix cores: none")));
    assert_eq!(row("integer_dot")["detail"], "packed int8 dot products");
    assert_eq!(report["selected"]["backend"], "vulkan");
}

fn engine_probe_names() -> Vec<&'static str> {
    vec![
        "native_leaky_relu",
        "mul_mat_f16_weight",
        "mul_mat_f16_activation",
        "flash_attn_f32_kv",
        "flash_attn_f16_kv",
        "flash_attn_bf16_kv",
        "flash_attn_q8_0_kv",
        "conv_transpose_1d",
        "pinned_host_buffer",
    ]
}

#[test]
fn missing_vulkan_plugin_leaves_cpu_working() {
    let plugins = plugin_dir(&["cpu"]);
    let report = devices_json(&repo().join("profiles/ci.toml"), plugins.path());
    let vk = backend(&report, "vulkan");
    assert_eq!(vk["available"], false);
    assert!(vk["reason"].as_str().unwrap().starts_with("no plugin file libtts_backend_vulkan.so in "), "{vk}");
    assert_eq!(report["selected"]["backend"], "cpu");

    let o = run(&["devices", "--profile", repo().join("profiles/ci.toml").to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap()]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("backend vulkan: unavailable: no plugin file libtts_backend_vulkan.so"), "{text}");
}

#[test]
fn corrupt_plugin_file_is_refused_by_name() {
    let plugins = plugin_dir(&["cpu"]);
    std::fs::write(plugins.path().join("libtts_backend_vulkan.so"), b"\x7fELF this is not a shared object").unwrap();
    let report = devices_json(&repo().join("profiles/ci.toml"), plugins.path());
    let reason = backend(&report, "vulkan")["reason"].as_str().unwrap().to_string();
    assert!(reason.contains("libtts_backend_vulkan.so is not a loadable library"), "{reason}");
    assert_eq!(report["selected"]["backend"], "cpu");
}

#[test]
fn library_without_root_module_is_not_a_plugin() {
    let plugins = plugin_dir(&["cpu"]);
    std::fs::copy(artifacts().join("libggml-cpu.so"), plugins.path().join("libtts_backend_vulkan.so")).unwrap();
    let report = devices_json(&repo().join("profiles/ci.toml"), plugins.path());
    let reason = backend(&report, "vulkan")["reason"].as_str().unwrap().to_string();
    assert!(reason.ends_with("libtts_backend_vulkan.so is a library but not a tts plugin (no plugin root module exported)"), "{reason}");
}

#[test]
fn plugin_for_another_abi_version_is_refused() {
    let plugins = plugin_dir(&["cpu"]);
    std::fs::copy(artifacts().join("libtts_test_abi_mismatch.so"), plugins.path().join("libtts_backend_future.so")).unwrap();
    let report = devices_json(&repo().join("profiles/ci.toml"), plugins.path());
    let reason = backend(&report, "future")["reason"].as_str().unwrap().to_string();
    assert!(reason.ends_with("libtts_backend_future.so was built for plugin ABI 9.0.0; this host speaks plugin ABI 5.1.0"), "{reason}");
    assert_eq!(report["selected"]["backend"], "cpu", "a bad plugin never stops the others");
}

#[test]
fn module_with_a_foreign_stamp_is_refused() {
    let plugins = plugin_dir(&["cpu"]);
    let stamp = plugins.path().join("libggml-cpu.so.stamp.json");
    let mut json: Value = serde_json::from_str(&std::fs::read_to_string(&stamp).unwrap()).unwrap();
    json["patches_fingerprint"] = Value::String("0000".into());
    std::fs::write(&stamp, json.to_string()).unwrap();
    let report = devices_json(&repo().join("profiles/ci.toml"), plugins.path());
    let reason = backend(&report, "cpu")["reason"].as_str().unwrap().to_string();
    assert!(reason.contains("does not match this plugin: patches_fingerprint is 0000 in its stamp"), "{reason}");
}

/// An OpenCL module built from another ggml source is refused at load, with
/// the reason, and the next backend is used.
#[test]
fn an_opencl_module_from_another_ggml_source_is_refused() {
    if !pocl_installed() {
        return;
    }
    let plugins = plugin_dir(&["opencl", "cpu"]);
    let stamp = plugins.path().join("libggml-opencl.so.stamp.json");
    let mut json: Value = serde_json::from_str(&std::fs::read_to_string(&stamp).unwrap()).unwrap();
    json["source_fingerprint"] = Value::String("ffff".into());
    std::fs::write(&stamp, json.to_string()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let profile = write_profile(dir.path(), "[backend]\nprefer = [\"opencl\", \"cpu\"]\n[backends.cpu]\nthreads = 1\n");
    let report = devices_json(&profile, plugins.path());
    let cl = backend(&report, "opencl");
    let reason = cl["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("does not match this plugin: source_fingerprint is ffff in its stamp"), "{cl}");
    assert_eq!(report["selected"]["backend"], "cpu");
}

#[test]
fn unknown_profile_key_is_a_one_line_error_with_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_profile(dir.path(), "[backend]\nprefer = [\"cpu\"]\n\n[policies]\nflash_atn = \"on\"\n");
    let o = run(&["devices", "--profile", p.to_str().unwrap()]);
    assert_one_line_error(&o, &format!("{}:5:1: unknown field `flash_atn`", p.display()));
}

#[test]
fn unknown_backend_option_is_a_one_line_error_with_line() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugin_dir(&["cpu"]);
    let p = write_profile(dir.path(), "[backend]\nprefer = [\"cpu\"]\n[backends.cpu]\nthreads = 2\nthread_pool = 4\n");
    let o = run(&["devices", "--profile", p.to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap()]);
    assert_one_line_error(&o, ":5:15: unknown key `thread_pool` in [backends.cpu]: the cpu backend takes threads");
}

#[test]
fn forced_on_unsupported_policy_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugin_dir(&["cpu"]);
    // The CPU device has no pinned host buffer type.
    let p = write_profile(dir.path(), "[backend]\nprefer = [\"cpu\"]\n[policies]\npinned_host = \"on\"\n[model]\nfiles = [\"m.gguf\"]\n");
    let report = devices_json(&p, plugins.path());
    let cpu = &backend(&report, "cpu")["devices"][0];
    let err = cpu["policy_error"].as_str().unwrap();
    assert!(err.starts_with("policy `pinned_host` is on, but CPU ("), "{err}");
    assert!(err.contains("does not support it (probe pinned_host_buffer:"), "{err}");

    let wav = dir.path().join("out.wav");
    let o = run(&["--profile", p.to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap(), "--text", "hello", "--out", wav.to_str().unwrap()]);
    assert_one_line_error(&o, "policy `pinned_host` is on, but CPU");
    assert!(!wav.exists());
}

#[test]
fn deny_list_hit_switches_feature_off_and_refuses_on() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugin_dir(&["cpu"]);
    let rule = "[[deny]]\ndevice = \"cpu*\"\nfeatures = [\"native_leaky_relu\"]\nops = [\"CONV_TRANSPOSE_1D\"]\nreason = \"test rule\"\n";
    let p = write_profile(dir.path(), &format!("[backend]\nprefer = [\"cpu\"]\n{rule}"));
    let report = devices_json(&p, plugins.path());
    let policies = &backend(&report, "cpu")["devices"][0]["policies"];
    let decision = |f: &str| policies["decisions"].as_array().unwrap().iter().find(|d| d["feature"] == f).unwrap().clone();
    assert_eq!(decision("native_leaky_relu")["enabled"], false);
    assert_eq!(decision("native_leaky_relu")["reason"], "deny rule 1 (device \"cpu*\"): test rule");
    assert_eq!(decision("conv_transpose_1d")["enabled"], false, "denied op switches off the feature using it");
    assert_eq!(policies["denied_ops"], serde_json::json!(["CONV_TRANSPOSE_1D"]));

    let p = write_profile(dir.path(), &format!("[backend]\nprefer = [\"cpu\"]\n[policies]\nnative_leaky_relu = \"on\"\n{rule}"));
    let report = devices_json(&p, plugins.path());
    let err = backend(&report, "cpu")["devices"][0]["policy_error"].as_str().unwrap().to_string();
    assert!(err.starts_with("policy `native_leaky_relu` is on, but deny rule 1 (device \"cpu*\"): test rule disables it on CPU"), "{err}");
}

#[test]
fn no_fallback_when_profile_forbids_it() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugin_dir(&["cpu"]);
    let p = write_profile(dir.path(), "[backend]\nprefer = [\"vulkan\", \"cpu\"]\nfallback = false\n");
    let report = devices_json(&p, plugins.path());
    let err = report["selection_error"].as_str().unwrap();
    assert!(err.starts_with("no backend of [vulkan] is usable (fallback = false): vulkan: no plugin file"), "{err}");
}

#[test]
fn synthesis_input_errors_are_one_line_and_leave_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugin_dir(&["cpu"]);
    let wav = dir.path().join("out.wav");
    let plugin_args = ["--plugin-dir", plugins.path().to_str().unwrap()];

    let p = write_profile(dir.path(), "[backend]\nprefer = [\"cpu\"]\n");
    let mut args = vec!["--profile", p.to_str().unwrap(), "--text", "  ", "--out", wav.to_str().unwrap()];
    args.extend(plugin_args);
    assert_one_line_error(&run(&args), "text is empty");

    args[3] = "hello";
    assert_one_line_error(&run(&args), "[model] files is empty");

    let p = write_profile(dir.path(), "[backend]\nprefer = [\"cpu\"]\n[model]\nfiles = [\"missing.gguf\"]\n");
    args[1] = p.to_str().unwrap();
    assert_one_line_error(&run(&args), "missing.gguf does not exist");

    std::fs::write(dir.path().join("truncated.gguf"), b"GGUF\x03\x00\x00\x00\x01").unwrap();
    let p = write_profile(dir.path(), "[backend]\nprefer = [\"cpu\"]\n[model]\nfiles = [\"truncated.gguf\"]\n");
    assert_one_line_error(&run(&args), "truncated.gguf is not a valid GGUF file");
    assert!(!wav.exists());
    let _ = p;
}

#[test]
fn missing_profile_and_missing_arguments() {
    assert_one_line_error(&run(&["devices", "--profile", "/nonexistent/p.toml"]), "/nonexistent/p.toml: cannot read profile");
    assert_one_line_error(&run(&["--text", "hi"]), "give --out FILE (or --out - for stdout)");
    let o = run(&["--bogus-flag"]);
    assert_eq!(o.status.code(), Some(2), "clap usage errors exit 2");
}

/// The model ABI end to end on each backend: the host picks the model plugin by
/// GGUF architecture, the model computes on the device a backend plugin created.
/// Tolerance: 16-bit quantisation (1/32767) plus 1e-4 for sin on F32 arguments up
/// to ~2800 rad.
#[test]
fn model_plugin_synthesizes_on_cpu_and_vulkan() {
    let (plugins, gguf) = tone_setup(&["cpu", "vulkan"]);
    for backend in ["cpu", "vulkan"] {
        let dir = tempfile::tempdir().unwrap();
        let profile = write_profile(
            dir.path(),
            &format!(
                "[backend]\nprefer = [\"{backend}\"]\nfallback = false\n[backends.vulkan]\nallow_software = true\npipeline_cache = false\n[model]\nfiles = [\"{}\"]\n[synthesis]\ngain = 0.25\n",
                gguf.display()
            ),
        );
        let wav = dir.path().join("tone.wav");
        let o = run(&[
            "--profile",
            profile.to_str().unwrap(),
            "--plugin-dir",
            plugins.path().to_str().unwrap(),
            "--text",
            "hello",
            "--out",
            wav.to_str().unwrap(),
            "--set",
            "gain=0.5",
        ]);
        assert!(o.status.success(), "{backend}: {}", stderr(&o));
        let (rate, samples) = read_wav(&wav);
        assert_eq!(rate, 16000);
        assert_eq!(samples.len(), 5 * 1600, "0.1 s per character");
        let worst =
            samples.iter().enumerate().map(|(n, s)| (s - 0.5 * (std::f64::consts::TAU * 440.0 * n as f64 / 16000.0).sin() as f32).abs()).fold(0.0f32, f32::max);
        eprintln!("{backend}: tone max error {worst:.2e}");
        assert!(worst < 1.0 / 32767.0 + 1e-4, "{backend}: max error {worst}");
        let names: Vec<String> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
        assert!(!names.iter().any(|n| n.contains("partial")), "no temporary left: {names:?}");
    }
}

#[test]
fn model_errors_are_one_line_and_leave_no_file() {
    let (plugins, gguf) = tone_setup(&["cpu"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = write_profile(dir.path(), &format!("[backend]\nprefer = [\"cpu\"]\n[model]\nfiles = [\"{}\"]\n", gguf.display()));
    let wav = dir.path().join("x.wav");
    let base = ["--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap(), "--text", "hi", "--out", wav.to_str().unwrap()];
    let with = |extra: &[&str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        run(&a)
    };
    assert_one_line_error(&with(&["--set", "fail=true"]), "tone model: synthesis failed on request");
    assert_one_line_error(&with(&["--set", "gain=loud"]), "option `gain`: `loud` is not a float");
    assert_one_line_error(&with(&["--set", "voice=x"]), "unknown synthesis option `voice` for the tone model (known: gain, fail, panic)");
    assert!(!wav.exists());

    // A GGUF of an architecture no plugin loads.
    let other = dir.path().join("other.gguf");
    let mut w = ggml_sys::gguf::GgufWriter::new();
    w.set_str("general.architecture", "not-a-tts-family");
    w.write_metadata(&other).unwrap();
    let profile = write_profile(dir.path(), &format!("[backend]\nprefer = [\"cpu\"]\n[model]\nfiles = [\"{}\"]\n", other.display()));
    let mut a = base.to_vec();
    a[1] = profile.to_str().unwrap();
    assert_one_line_error(&run(&a), "no model plugin loads architecture 'not-a-tts-family'");
    // Output into a directory that does not exist.
    let profile = write_profile(dir.path(), &format!("[backend]\nprefer = [\"cpu\"]\n[model]\nfiles = [\"{}\"]\n", gguf.display()));
    let mut a = base.to_vec();
    a[1] = profile.to_str().unwrap();
    a[7] = "/nonexistent-dir/x.wav";
    assert_one_line_error(&run(&a), "output directory /nonexistent-dir does not exist");
}

#[test]
fn among_module_variants_a_tampered_one_is_skipped_with_its_reason() {
    let plugins = plugin_dir(&["cpu"]);
    let dir = plugins.path();
    // A second "variant" whose bytes no longer match its stamp.
    let mut bytes = std::fs::read(dir.join("libggml-cpu.so")).unwrap();
    bytes.extend_from_slice(b"tampered");
    std::fs::write(dir.join("libggml-cpu-tampered.so"), bytes).unwrap();
    std::fs::copy(dir.join("libggml-cpu.so.stamp.json"), dir.join("libggml-cpu-tampered.so.stamp.json")).unwrap();
    let report = devices_json(&repo().join("profiles/ci.toml"), dir);
    let cpu = backend(&report, "cpu");
    assert_eq!(cpu["available"], true, "{cpu}");
    let facts = cpu["module"].as_array().unwrap();
    let fact = |k: &str| facts.iter().filter(|f| f[0] == k).map(|f| f[1].as_str().unwrap().to_string()).collect::<Vec<_>>();
    assert!(fact("module")[0].ends_with("/libggml-cpu.so"), "{facts:?}");
    let rejected = fact("rejected_module");
    assert_eq!(rejected.len(), 1, "{facts:?}");
    assert!(rejected[0].contains("libggml-cpu-tampered.so was modified after it was stamped"), "{rejected:?}");
}

/// `tts soak`: repeated synthesis in one process, every output bit-identical
/// to the first (the 200-run figures come from `cargo xtask soak`).
#[test]
fn soak_reports_identical_outputs_and_memory() {
    let (plugins, gguf) = tone_setup(&["cpu"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &[gguf]);
    let base = ["soak", "--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap(), "--text", "hello"];
    let mut a = base.to_vec();
    a.extend(["--runs", "6", "--warmup", "2", "--json"]);
    let o = run(&a);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["identical"], true, "{report}");
    assert_eq!(report["runs"], 6);
    assert_eq!(report["samples"], 5 * 1600);
    assert!(report["rss_end_mib"].as_f64().unwrap() > 1.0);
    let mut a = base.to_vec();
    a.extend(["--runs", "1"]);
    assert_one_line_error(&run(&a), "--runs must be at least 2 and more than --warmup (10), got 1");
}

/// The CUDA plugin ships without its module wherever nvcc did not build one
/// (CI): it says so in one line and the profile's next backend runs. A module
/// built from another source or patch series is refused with the reason.
#[test]
fn cuda_without_a_matching_module_gives_way_to_the_next_backend() {
    let plugins = plugin_dir(&["cpu"]);
    let dir = plugins.path();
    std::fs::copy(artifacts().join("libtts_backend_cuda.so"), dir.join("libtts_backend_cuda.so")).unwrap();
    let work = tempfile::tempdir().unwrap();
    let profile = write_profile(work.path(), "[backend]\nprefer = [\"cuda\", \"cpu\"]\n[backends.cpu]\nthreads = 1\n");
    let report = devices_json(&profile, dir);
    let reason = backend(&report, "cuda")["reason"].as_str().unwrap().to_string();
    let plugin = dir.join("libtts_backend_cuda.so");
    let module = dir.join("libggml-cuda.so");
    assert_eq!(
        reason,
        format!("{} could not open its ggml module: ggml module {} is missing (it ships beside the plugin)", plugin.display(), module.display())
    );
    assert_eq!(report["selected"]["backend"], "cpu");

    // Another backend's module in its place: its stamp names another file and patch series.
    std::fs::copy(dir.join("libggml-cpu.so"), dir.join("libggml-cuda.so")).unwrap();
    std::fs::copy(dir.join("libggml-cpu.so.stamp.json"), dir.join("libggml-cuda.so.stamp.json")).unwrap();
    let report = devices_json(&profile, dir);
    let reason = backend(&report, "cuda")["reason"].as_str().unwrap().to_string();
    let mismatch = format!("could not open its ggml module: ggml module {} does not match this plugin: patches_fingerprint is ", module.display());
    assert!(reason.contains(&mismatch) && !reason.contains('\n'), "{reason}");
    assert_eq!(report["selected"]["backend"], "cpu");

    // Synthesis runs on the next backend.
    let (tone_plugins, gguf) = tone_setup(&["cpu"]);
    std::fs::copy(artifacts().join("libtts_backend_cuda.so"), tone_plugins.path().join("libtts_backend_cuda.so")).unwrap();
    let files = format!("[model]\nfiles = [\"{}\"]\n", gguf.display());
    let profile = write_profile(work.path(), &format!("[backend]\nprefer = [\"cuda\", \"cpu\"]\n[backends.cpu]\nthreads = 1\n{files}"));
    let out = work.path().join("o.wav");
    let o =
        run(&["--profile", profile.to_str().unwrap(), "--plugin-dir", tone_plugins.path().to_str().unwrap(), "--text", "hi", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.is_file());
}

/// Whether the pocl OpenCL ICD is installed; says the test is skipped when
/// not, and fails when `TTS_REQUIRE_OPENCL` is set (CI sets it).
fn pocl_installed() -> bool {
    if Path::new("/etc/OpenCL/vendors/pocl.icd").exists() {
        return true;
    }
    assert!(std::env::var_os("TTS_REQUIRE_OPENCL").is_none(), "TTS_REQUIRE_OPENCL is set but the pocl ICD is not installed");
    eprintln!("skipped: no pocl OpenCL ICD (/etc/OpenCL/vendors/pocl.icd)");
    false
}

/// The OpenCL plugin where the only OpenCL device is pocl (a CPU device without
/// `cl_khr_fp16`): the device is listed as refused with both reasons, the
/// backend has no device, and the profile's next backend is selected. Needs the
/// pocl ICD (`cargo xtask deps` installs it on Debian); without it the test
/// reports itself skipped, unless `TTS_REQUIRE_OPENCL` is set (CI sets it).
#[test]
fn opencl_names_each_device_it_refuses_and_the_next_backend_is_used() {
    if !pocl_installed() {
        return;
    }
    let plugins = plugin_dir(&["opencl", "cpu"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = write_profile(dir.path(), "[backend]\nprefer = [\"opencl\", \"cpu\"]\n[backends.cpu]\nthreads = 1\n");
    let report = devices_json(&profile, plugins.path());
    let cl = backend(&report, "opencl");
    assert_eq!(cl["available"], true, "the plugin and its module load: {cl}");
    assert_eq!(cl["devices"].as_array().unwrap().len(), 0, "{cl}");
    let refused: Vec<&str> =
        cl["module"].as_array().unwrap().iter().filter(|kv| kv[0].as_str().unwrap().starts_with("refused.")).map(|kv| kv[1].as_str().unwrap()).collect();
    let pocl = refused.iter().find(|r| r.starts_with("Portable Computing Language / ")).unwrap_or_else(|| panic!("pocl not listed as refused: {refused:?}"));
    assert!(
        pocl.contains("not a GPU): no cl_khr_fp16") && pocl.ends_with("not an Adreno or Intel GPU (the only devices ggml's OpenCL backend admits)"),
        "{pocl}"
    );
    assert_eq!(report["selected"]["backend"], "cpu");
    // The text report says the same.
    let o = run(&["devices", "--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap()]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains(&format!("  refused device: {pocl}")) && text.contains("selected: cpu device 0"), "{text}");
    // ggml's own variables, inherited from the environment, would end the
    // process when they name no platform; the plugin does not pass them on.
    let args = ["devices", "--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap()];
    let o = run_with(&args, None, &[("GGML_OPENCL_PLATFORM", "No Such Platform"), ("GGML_OPENCL_DEVICE", "9")]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("selected: cpu device 0"), "{}", stderr(&o));
}

/// The Metal plugin where no Metal module or device exists (any machine but a
/// Mac with the module built): one line says why, and the next backend is used.
#[test]
fn metal_without_its_module_says_so_and_the_next_backend_is_used() {
    let plugins = plugin_dir(&["cpu"]);
    std::fs::copy(artifacts().join("libtts_backend_metal.so"), plugins.path().join("libtts_backend_metal.so")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let profile = write_profile(dir.path(), "[backend]\nprefer = [\"metal\", \"cpu\"]\n[backends.cpu]\nthreads = 1\n");
    let report = devices_json(&profile, plugins.path());
    let metal = backend(&report, "metal");
    assert_eq!(metal["available"], false, "{metal}");
    let reason = metal["reason"].as_str().unwrap();
    assert!(
        reason.contains("libtts_backend_metal.so could not open its ggml module: ggml module ")
            && reason.ends_with("/libggml-metal.so is missing (it ships beside the plugin)"),
        "{reason}"
    );
    assert_eq!(report["selected"]["backend"], "cpu");
}

/// OpenCL bad input, each one line: a platform that does not exist (ggml's
/// own lookup would end the process), and a profile that insists on OpenCL
/// where its only device lacks `cl_khr_fp16` (the refusal is the reason).
#[test]
fn opencl_bad_platform_and_a_forced_device_without_fp16_are_one_line_errors() {
    if !pocl_installed() {
        return;
    }
    let plugins = plugins_with(&["opencl", "cpu"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.wav");
    let model = supertonic_fixture();
    let synth = |body: &str| {
        let profile = write_profile(dir.path(), &format!("{body}[model]\nfiles = [\"{}\"]\n", model.display()));
        run(&["--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap(), "--text", "Hi.", "--out", out.to_str().unwrap()])
    };
    let o = synth("[backend]\nprefer = [\"opencl\", \"cpu\"]\n[backends.opencl]\nplatform = \"No Such Platform\"\n");
    assert_one_line_error(&o, "[backends.opencl] platform \"No Such Platform\" matches no OpenCL platform (platforms: \"Portable Computing Language\"");
    assert!(!out.exists());
    let o = synth("[backend]\nprefer = [\"opencl\"]\nfallback = false\ndevice = 0\n");
    assert_one_line_error(&o, "no backend of [opencl] is usable (fallback = false): opencl: no usable device; refused Portable Computing Language / ");
    assert!(stderr(&o).contains("no cl_khr_fp16"), "{}", stderr(&o));
    assert!(!out.exists());
    // The platform named by part of its vendor: pocl, whose device is refused; the CPU is used.
    let o = synth("[backend]\nprefer = [\"opencl\", \"cpu\"]\n[backends.opencl]\nplatform = \"pocl\"\n[backends.cpu]\nthreads = 1\n");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.exists());
}

/// Issue 31, item 17: the global -q / -v were refused before a subcommand
/// (`tts -q devices`: "the subcommand 'devices' cannot be used with '--quiet'")
/// although the README shows `tts -q ...`. They work on either side; a
/// synthesis option before a subcommand, which it would ignore, is refused.
#[test]
fn global_flags_work_before_and_after_the_subcommand() {
    let plugins = plugin_dir(&["cpu"]);
    let profile = repo().join("profiles/ci.toml");
    let common = ["--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap()];
    for flags in [&["-q", "devices"][..], &["devices", "-q"], &["--quiet", "devices"], &["-v", "devices"], &["devices", "-vv"]] {
        let args: Vec<&str> = flags.iter().chain(&common).copied().collect();
        let o = run(&args);
        assert!(o.status.success(), "tts {}: {}", args.join(" "), stderr(&o));
        assert!(String::from_utf8_lossy(&o.stdout).contains("selected: cpu device 0"), "tts {}", args.join(" "));
    }
    // -q keeps even warnings off stderr: the missing Vulkan plugin warns otherwise.
    let o = run(&[&["-q", "devices"][..], &common].concat());
    assert_eq!(stderr(&o), "");
    // serve parses its global flags on either side too; a bad value then ends
    // it before it listens.
    for flags in [&["-v", "serve"][..], &["serve", "-v"], &["-q", "serve"], &["serve", "--quiet"]] {
        let args: Vec<&str> = flags.iter().chain(&["--port", "0", "--workers", "0"]).chain(&common).copied().collect();
        assert_one_line_error(&run(&args), "--workers and --queue must be at least 1");
    }
    let o = run(&[&["--text", "hello", "--out", "x.wav", "devices"][..], &common].concat());
    assert_one_line_error(&o, "--text, --out given before `devices`: synthesis options apply only without a subcommand");
    assert!(o.stdout.is_empty());
}

/// `-q` is quiet: `voice save` printed its "wrote ..." line regardless, and a
/// synthesis prints nothing on stderr either; without -q both say what they wrote.
#[test]
fn quiet_synthesis_and_voice_save_print_nothing() {
    let plugins = plugins_with(&["cpu"], &["chatterbox"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &chatterbox_fixture());
    let reference = dir.path().join("me.wav");
    let spec = hound::WavSpec { channels: 1, sample_rate: 16000, bits_per_sample: 16, sample_format: hound::SampleFormat::Int };
    let mut w = hound::WavWriter::create(&reference, spec).unwrap();
    for n in 0..16000 * 6 {
        let t = n as f64 / 16000.0;
        let s = (0.55 + 0.45 * (std::f64::consts::TAU * 2.5 * t).sin()) * 0.4 * (std::f64::consts::TAU * 150.0 * t).sin();
        w.write_sample((s * 32767.0).round() as i16).unwrap();
    }
    w.finalize().unwrap();
    let common = ["--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap()];
    let voice = dir.path().join("me.voice");
    let save = |quiet: &[&str]| {
        let args = [quiet, &["voice", "save", "--reference", reference.to_str().unwrap(), "--out", voice.to_str().unwrap()], &common[..]].concat();
        run(&args)
    };
    for quiet in [&["-q"][..], &["--quiet"]] {
        let o = save(quiet);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(stderr(&o), "", "{quiet:?}");
        assert!(voice.is_file());
        std::fs::remove_file(&voice).unwrap();
    }
    let o = save(&[]);
    assert!(o.status.success() && stderr(&o).contains(&format!("wrote {} (chatterbox turbo; ", voice.display())), "{}", stderr(&o));

    let out = dir.path().join("out.wav");
    let synth = |quiet: &[&str]| {
        let voice_set = format!("voice={}", voice.display());
        let args = [quiet, &["--text", "Hello there.", "--out", out.to_str().unwrap(), "--set", &voice_set, "--set", "max_new_tokens=8"], &common[..]].concat();
        run(&args)
    };
    let o = synth(&["-q"]);
    assert!(o.status.success() && out.is_file(), "{}", stderr(&o));
    assert_eq!(stderr(&o), "");
    let o = synth(&[]);
    assert!(o.status.success() && stderr(&o).contains(&format!("wrote {} (", out.display())), "{}", stderr(&o));
}

/// `soak --max-rss-growth-mib nan` passed whatever memory did (NaN compares
/// false); a limit that is not a finite number >= 0 is refused before any run.
#[test]
fn soak_refuses_a_limit_that_is_not_a_finite_number() {
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &[supertonic_fixture()]);
    for (limit, shown) in [("nan", "NaN"), ("NaN", "NaN"), ("inf", "inf"), ("-inf", "-inf"), ("-1", "-1")] {
        let limit_arg = format!("--max-rss-growth-mib={limit}");
        let o = run(&[
            "soak",
            "--profile",
            profile.to_str().unwrap(),
            "--plugin-dir",
            plugins.path().to_str().unwrap(),
            "--text",
            "Hi.",
            "--runs",
            "2",
            "--warmup",
            "1",
            &limit_arg,
        ]);
        assert_one_line_error(&o, &format!("--max-rss-growth-mib {shown}: give a finite number of MiB >= 0"));
        assert!(o.stdout.is_empty(), "{limit}: a soak ran");
    }
}

/// Warnings quoted the user's text raw: a right-to-left override, an escape
/// sequence or a bell in the text reached the terminal or log as itself.
/// Every log field and the error line now escape controls and bidi controls.
#[test]
fn user_text_in_warnings_and_errors_is_escaped() {
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &[supertonic_fixture()]);
    let out = dir.path().join("out.wav");
    let raw = ['\u{202e}', '\u{1b}', '\u{7}', '\u{2066}', '\u{9b}', '\u{200f}'];
    let text = "Hello \u{202e}dlrow\u{202c} \u{1b}[2J there\u{7}, \u{2066}x\u{2069} \u{9b}31m\u{200f}.";
    let o = run(&["--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap(), "--text", text, "--out", out.to_str().unwrap()]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("characters this model has no row for"), "no warning about the characters: {err}");
    assert!(!err.chars().any(|c| raw.contains(&c)), "raw control characters in: {err:?}");
    assert!(err.contains("\\u{202e}") && err.contains("\\u{1b}") && err.contains("\\u{7}"), "{err}");
    // An error quoting user text (here a --set value) is escaped the same way.
    let o = run(&[
        "--profile",
        profile.to_str().unwrap(),
        "--plugin-dir",
        plugins.path().to_str().unwrap(),
        "--text",
        "Hi.",
        "--out",
        out.to_str().unwrap(),
        "--set",
        "steps=\u{202e}8\u{1b}[0m",
    ]);
    assert_one_line_error(&o, "\\u{202e}8\\u{1b}[0m");
    assert!(!stderr(&o).chars().any(|c| raw.contains(&c)), "{:?}", stderr(&o));
}
