//! `tts fit` and the memory check before every load: a model's memory plan
//! (ABI 5.6) beside the device's free memory and `memory_budget`. Supertonic
//! and Chatterbox plan their memory; on the CPU and on lavapipe the tiny
//! models fit the free memory and are refused, with one line and no output,
//! under a budget below their plan; options that set lengths change it. A family without a plan (the tone fixture, a plugin built
//! before 5.6) is reported as such and never refused.

mod common;

use common::*;

fn fit_json(args: &[&str]) -> (serde_json::Value, std::process::Output) {
    let out = run(args);
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    (json, out)
}

fn check_backend(backend: &str) {
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugins_with(&[backend], &["supertonic"]);
    let profile = profile_on(dir.path(), backend, &[supertonic_fixture()]);
    let (p, pd) = (profile.to_str().unwrap(), plugins.path().to_str().unwrap());

    let (report, out) = fit_json(&["fit", "--profile", p, "--plugin-dir", pd, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(report["family"], "supertonic");
    assert_eq!(report["backend"], backend);
    assert_eq!(report["fits"], true);
    let items: Vec<&str> = report["plan"]["items"].as_array().unwrap().iter().map(|i| i["what"].as_str().unwrap()).collect();
    assert_eq!(items, ["weights", "duration", "text_encoder", "vector_estimator", "vocoder"]);
    let need = report["plan"]["total"].as_u64().unwrap();
    let sum: u64 = report["plan"]["items"].as_array().unwrap().iter().map(|i| i["bytes"].as_u64().unwrap()).sum();
    assert_eq!(need, sum);
    assert!(need > 1 << 20, "{need} bytes for the weights and four graphs at the longest chunk");
    assert!(report["plan"]["sized_for"].as_str().unwrap().contains("120 s"), "{report}");

    // A budget one byte short of the plan refuses it; exactly the plan fits.
    let short = format!("{} B", need - 1);
    let (report, out) = fit_json(&["fit", "--profile", p, "--plugin-dir", pd, "--json", "--memory-budget", &short]);
    assert_eq!(report["fits"], false);
    assert_one_line_error(&out, "does not fit");
    let exact = format!("{need} B");
    let (report, out) = fit_json(&["fit", "--profile", p, "--plugin-dir", pd, "--json", "--memory-budget", &exact]);
    assert_eq!((report["fits"].clone(), out.status.code()), (serde_json::Value::Bool(true), Some(0)));

    // Synthesis under the short budget: refused before loading, nothing written.
    let wav = dir.path().join("out.wav");
    let out = run(&["--profile", p, "--plugin-dir", pd, "--memory-budget", &short, "--text", "Hello.", "--out", wav.to_str().unwrap()]);
    assert_one_line_error(&out, &format!("the supertonic model needs {} on", engine_core::engine::bytes(need)));
    assert_one_line_error(&out, "memory_budget");
    assert!(!wav.exists());
    // Under the exact budget it synthesizes.
    let out = run(&["--profile", p, "--plugin-dir", pd, "--memory-budget", &exact, "--text", "Hello.", "--out", wav.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(read_wav(&wav).1.len() > 1000);
}

#[test]
fn supertonic_fits_the_cpu_and_a_budget_below_its_plan_refuses_it() {
    check_backend("cpu");
}

#[test]
fn supertonic_fits_lavapipe_and_a_budget_below_its_plan_refuses_it() {
    check_backend("vulkan");
}

fn check_chatterbox(backend: &str) {
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugins_with(&[backend], &["chatterbox"]);
    let profile = profile_on(dir.path(), backend, &chatterbox_fixture());
    let (p, pd) = (profile.to_str().unwrap(), plugins.path().to_str().unwrap());
    let fit = |extra: &[&str]| {
        let mut args = vec!["fit", "--profile", p, "--plugin-dir", pd, "--json"];
        args.extend_from_slice(extra);
        fit_json(&args)
    };

    let (report, out) = fit(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!((report["family"].as_str(), report["fits"].as_bool()), (Some("chatterbox"), Some(true)));
    let items: Vec<&str> = report["plan"]["items"].as_array().unwrap().iter().map(|i| i["what"].as_str().unwrap()).collect();
    let want = [
        "t3.weights",
        "s3gen.weights",
        "t3.kv_cache",
        "t3.prefix",
        "t3.suffix",
        "t3.step",
        "s3gen.encoder",
        "s3gen.cfm",
        "hift.f0",
        "hift",
        // Streaming's S3Gen state (`stream_tokens` is 25 by default).
        "s3gen.stream_caches",
        "s3gen.stream_encoder",
        "s3gen.stream_cfm",
        "s3gen.stream_vocoder",
        "voice_encoder",
        "campplus",
        "s3tokenizer",
    ];
    assert_eq!(items, want);
    let need = report["plan"]["total"].as_u64().unwrap();
    assert!(report["plan"]["sized_for"].as_str().unwrap().contains("speech tokens"), "{report}");

    // Lengths set on the command line change the plan: shorter chunks and
    // fewer speech tokens need less.
    let (small, out) = fit(&["--set", "max_chars=10", "--set", "max_new_tokens=8"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let small_need = small["plan"]["total"].as_u64().unwrap();
    assert!(small_need < need, "{small_need} < {need}");
    let (more, _) = fit(&["--set", "max_chars=10", "--set", "max_new_tokens=60"]);
    assert!(more["plan"]["total"].as_u64().unwrap() > small_need, "{more}");
    let out = run(&["fit", "--profile", p, "--plugin-dir", pd, "--set", "max_new_tokens=0"]);
    assert_one_line_error(&out, "max_new_tokens");
    // Without streaming the plan holds no stream state, and needs less.
    let (unstreamed, _) = fit(&["--set", "stream_tokens=0"]);
    let unstreamed_items: Vec<&str> = unstreamed["plan"]["items"].as_array().unwrap().iter().map(|i| i["what"].as_str().unwrap()).collect();
    assert_eq!(unstreamed_items, want.iter().copied().filter(|w| !w.starts_with("s3gen.stream")).collect::<Vec<_>>());
    assert!(unstreamed["plan"]["total"].as_u64().unwrap() < need, "{unstreamed}");

    // A budget below the plan refuses the synthesis before loading.
    let short = format!("{} B", need - 1);
    let wav = dir.path().join("out.wav");
    let out = run(&["--profile", p, "--plugin-dir", pd, "--memory-budget", &short, "--text", "Hello.", "--out", wav.to_str().unwrap()]);
    assert_one_line_error(&out, &format!("the chatterbox model needs {} on", engine_core::engine::bytes(need)));
    assert!(!wav.exists());
    let exact = format!("{need} B");
    let out =
        run(&["--profile", p, "--plugin-dir", pd, "--memory-budget", &exact, "--text", "Hello.", "--set", "max_new_tokens=8", "--out", wav.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(read_wav(&wav).1.len() > 1000);
}

#[test]
fn chatterbox_fits_the_cpu_and_its_lengths_change_the_plan() {
    check_chatterbox("cpu");
}

#[test]
fn chatterbox_fits_lavapipe_and_a_budget_below_its_plan_refuses_it() {
    check_chatterbox("vulkan");
}

#[test]
fn the_profile_budget_is_read_and_a_bad_one_is_refused_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let pd = plugins.path().to_str().unwrap();
    let model = supertonic_fixture().display().to_string();
    let profile = write_profile(dir.path(), &format!("[backend]\nprefer = [\"cpu\"]\nmemory_budget = \"64 KiB\"\n[model]\nfiles = [\"{model}\"]\n"));
    let (report, out) = fit_json(&["fit", "--profile", profile.to_str().unwrap(), "--plugin-dir", pd, "--json"]);
    assert_eq!((report["memory_budget"].as_u64(), report["fits"].as_bool()), (Some(65536), Some(false)));
    assert_one_line_error(&out, "budget is 64.0 KiB");
    // --memory-budget overrides the profile's.
    let (report, _) = fit_json(&["fit", "--profile", profile.to_str().unwrap(), "--plugin-dir", pd, "--json", "--memory-budget", "1 TiB"]);
    assert_eq!(report["memory_budget"].as_u64(), Some(1 << 40));

    for (value, want) in [("\"lots\"", "\"lots\" is not a size"), ("\"0 B\"", "at least one byte"), ("\"12 parsecs\"", "is not a size"), ("12", "invalid type")]
    {
        let profile = write_profile(dir.path(), &format!("[backend]\nprefer = [\"cpu\"]\nmemory_budget = {value}\n[model]\nfiles = [\"{model}\"]\n"));
        let out = run(&["fit", "--profile", profile.to_str().unwrap(), "--plugin-dir", pd]);
        assert_one_line_error(&out, want);
        assert_one_line_error(&out, "memory_budget");
        assert_one_line_error(&out, ":3:");
    }
    let out = run(&["fit", "--model", &model, "--plugin-dir", pd, "--memory-budget=-5 GiB"]);
    assert_one_line_error(&out, "--memory-budget");
}

#[test]
fn a_family_without_a_plan_is_reported_and_never_refused() {
    let (plugins, gguf) = tone_setup(&["cpu"]);
    let pd = plugins.path().to_str().unwrap();
    let (report, out) = fit_json(&["fit", "--model", gguf.to_str().unwrap(), "--plugin-dir", pd, "--json", "--memory-budget", "1 B"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!((report["plan"].is_null(), report["fits"].is_null()), (true, true));
    let out = run(&["fit", "--model", gguf.to_str().unwrap(), "--plugin-dir", pd, "--memory-budget", "1 B"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("the tone plugin does not size its memory (no plan); loads are not checked"));
    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("tone.wav");
    let out = run(&["--model", gguf.to_str().unwrap(), "--plugin-dir", pd, "--memory-budget", "1 B", "--text", "hi", "--out", wav.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// `cargo xtask test` builds the tone plugin against ABI 5.5 (its root module
/// of then, without `plan_memory`) into `target/abi-5-5/`: the loader takes it
/// through 5.5's interface, and it has no plan.
#[test]
fn a_plugin_built_against_abi_5_5_loads_without_a_plan() {
    let Some(old_plugin) = old_abi_tone_plugin("5.5") else {
        return;
    };
    let (loaded, _) = engine_core::loader::load_model(&old_plugin).unwrap();
    assert_eq!(loaded.abi_version(), "5.5.0");
    assert!(loaded.converter().is_some(), "5.5 had converters");
    let (plugins, gguf) = tone_setup(&["cpu"]);
    std::fs::copy(&old_plugin, plugins.path().join("libtts_model_tone.so")).unwrap();
    let pd = plugins.path().to_str().unwrap();
    let (report, out) = fit_json(&["fit", "--model", gguf.to_str().unwrap(), "--plugin-dir", pd, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(report["plan"].is_null());
}

#[test]
fn tts_serve_refuses_a_model_that_does_not_fit() {
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let model = supertonic_fixture().display().to_string();
    let out = run(&["serve", "--model", &model, "--plugin-dir", plugins.path().to_str().unwrap(), "--port", "0", "--memory-budget", "1 MiB"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    let last = err.lines().last().unwrap_or_default();
    assert!(last.starts_with("error: model default: the supertonic model needs") && last.contains("does not fit"), "{err}");
}

#[test]
fn a_file_the_plan_cannot_read_is_refused_by_fit_and_by_the_load_with_its_own_message() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let pd = plugins.path().to_str().unwrap();
    let bad = crafted(dir.path(), "bad.gguf", &supertonic_fixture(), |e| {
        e.set_u32("supertonic.sample_rate", 7);
    });
    let out = run(&["fit", "--model", bad.to_str().unwrap(), "--plugin-dir", pd]);
    assert_one_line_error(&out, "sizing the model's memory: ");
    let wav = dir.path().join("x.wav");
    let load = run(&["--model", bad.to_str().unwrap(), "--plugin-dir", pd, "--text", "Hi.", "--out", wav.to_str().unwrap()]);
    assert_one_line_error(&load, "bad.gguf");
    assert!(!stderr(&load).contains("sizing the model's memory"), "{}", stderr(&load));
    assert!(!wav.exists());
}
