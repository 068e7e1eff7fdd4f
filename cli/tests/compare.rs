//! `tts compare`: two profiles on the same text, the table, the JSON and PNG
//! reports, `--expect` as a gate, and its bad inputs.

mod common;

use common::*;
use std::path::{Path, PathBuf};

const TEXT: &str = "Hello there.";

fn compare(dir: &Path, plugins: &Path, a: &Path, b: &Path, extra: &[&str]) -> std::process::Output {
    let json = dir.join("report.json");
    let png = dir.join("report.png");
    let mut args = vec!["compare", "--plugin-dir", plugins.to_str().unwrap(), "--profile", a.to_str().unwrap(), "--profile", b.to_str().unwrap()];
    args.extend(["--text", TEXT, "--runs", "1", "--json", json.to_str().unwrap(), "--plot", png.to_str().unwrap()]);
    args.extend(extra);
    run(&args)
}

/// A second profile in its own directory (profile_on names its file profile.toml).
fn profile_in(dir: &Path, name: &str, backend: &str, files: &[PathBuf], extra: &str) -> PathBuf {
    let sub = dir.join(name);
    std::fs::create_dir(&sub).unwrap();
    let path = profile_on(&sub, backend, files);
    let mut body = std::fs::read_to_string(&path).unwrap();
    body.push_str(extra);
    std::fs::write(&path, body).unwrap();
    path
}

#[test]
fn identical_profiles_agree_bit_for_bit_and_write_both_reports() {
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let a = profile_in(dir.path(), "a", "cpu", &[supertonic_fixture()], "");
    let b = profile_in(dir.path(), "b", "cpu", &[supertonic_fixture()], "");
    let o = compare(dir.path(), plugins.path(), &a, &b, &["--expect", "identical"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("agreement: identical;") && table.contains("B / A") && table.contains("vocoder"), "{table}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("report.json")).unwrap()).unwrap();
    assert_eq!(report["agreement"]["identical"], true);
    assert_eq!(report["agreement"]["max_rel_err"], 0.0);
    assert_eq!(report["a"]["family"], "supertonic");
    assert!(report["ratio"]["vocoder"].as_f64().is_some_and(|r| r > 0.0));
    let png = std::fs::read(dir.path().join("report.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn cpu_and_lavapipe_differ_and_the_gate_says_so() {
    let plugins = plugins_with(&["cpu", "vulkan"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let a = profile_in(dir.path(), "a", "cpu", &[supertonic_fixture()], "");
    let b = profile_in(dir.path(), "b", "vulkan", &[supertonic_fixture()], "");
    let o = compare(dir.path(), plugins.path(), &a, &b, &["--expect", "identical"]);
    assert_one_line_error(&o, "outputs are not identical: max rel err");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("report.json")).unwrap()).unwrap();
    assert_eq!(report["b"]["backend"], "vulkan");
    let e = report["agreement"]["max_rel_err"].as_f64().unwrap();
    assert!(e > 0.0 && e < 5e-3, "{e}");
    assert!(report["agreement"]["snr_db"].as_f64().unwrap() > 40.0);
    assert!(report["agreement"]["log_mel_cosine"].as_f64().unwrap() > 0.999);
    // The parity tolerance passes as a gate.
    let o = compare(dir.path(), plugins.path(), &a, &b, &["--expect", "max-rel=5e-3"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn one_policy_apart_on_cpu() {
    let plugins = plugins_with(&["cpu"], &["chatterbox"]);
    let dir = tempfile::tempdir().unwrap();
    let a = profile_in(dir.path(), "a", "cpu", &chatterbox_fixture(), "[synthesis]\nmax_new_tokens = 8\n");
    let b = profile_in(dir.path(), "b", "cpu", &chatterbox_fixture(), "[policies]\nconv_transpose_1d = \"off\"\n[synthesis]\nmax_new_tokens = 8\n");
    let o = compare(dir.path(), plugins.path(), &a, &b, &["--expect", "max-rel=1e-4"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("report.json")).unwrap()).unwrap();
    let on =
        |side: &str| report[side]["policies"]["decisions"].as_array().unwrap().iter().find(|d| d["feature"] == "conv_transpose_1d").unwrap()["enabled"].clone();
    assert_eq!((on("a"), on("b")), (serde_json::json!(true), serde_json::json!(false)));
    assert_eq!(report["agreement"]["same_length"], true);
    // The vocoder's path does not touch T3: the speech tokens are the same.
    let tokens = &report["agreement"]["tokens"][0];
    assert_eq!((tokens["name"].as_str(), tokens["identical"].as_bool()), (Some("speech_tokens"), Some(true)), "{tokens}");
    let n = tokens["a_len"].as_u64().unwrap();
    assert!(n > 0 && tokens["b_len"] == n, "{tokens}");
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("speech_tokens: identical ({n} tokens)")));
}

#[test]
fn token_streams_part_where_the_seeds_do() {
    let plugins = plugins_with(&["cpu"], &["chatterbox"]);
    let dir = tempfile::tempdir().unwrap();
    let a = profile_in(
        dir.path(),
        "a",
        "cpu",
        &chatterbox_fixture(),
        "[synthesis]
max_new_tokens = 12
seed = 1
",
    );
    let b = profile_in(
        dir.path(),
        "b",
        "cpu",
        &chatterbox_fixture(),
        "[synthesis]
max_new_tokens = 12
seed = 2
",
    );
    let o = compare(dir.path(), plugins.path(), &a, &b, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("report.json")).unwrap()).unwrap();
    let tokens = &report["agreement"]["tokens"][0];
    assert_eq!(tokens["identical"], false, "{tokens}");
    let i = tokens["first_difference"].as_u64().expect("a first difference") as usize;
    assert!(i < 12, "{tokens}");
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains(&format!("speech_tokens: differ from token {i} (A ")), "{table}");
    // The report carries each side's token values: they part at the index the
    // agreement names; the text ids, read before any draw, are the same.
    let values = |side: &str, name: &str| -> Vec<u64> {
        report[side]["tokens"][name].as_array().unwrap_or_else(|| panic!("{side}.tokens.{name} in {report}")).iter().map(|v| v.as_u64().unwrap()).collect()
    };
    let (sa, sb) = (values("a", "speech_tokens"), values("b", "speech_tokens"));
    assert_eq!((sa.len() as u64, sb.len() as u64), (tokens["a_len"].as_u64().unwrap(), tokens["b_len"].as_u64().unwrap()));
    assert_eq!(sa[..i], sb[..i]);
    assert_ne!(sa.get(i), sb.get(i));
    let text_ids = values("a", "text_ids");
    assert!(!text_ids.is_empty());
    assert_eq!(text_ids, values("b", "text_ids"));
    let agreed = report["agreement"]["tokens"].as_array().unwrap().iter().find(|t| t["name"] == "text_ids").expect("text ids compared");
    assert_eq!(agreed["identical"], true, "{agreed}");
    let o = compare(dir.path(), plugins.path(), &a, &b, &["--expect", "identical"]);
    assert_one_line_error(&o, "outputs are not identical");
}

#[test]
fn pinned_host_staging_changes_no_bit_on_lavapipe() {
    let plugins = plugins_with(&["vulkan"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let a = profile_in(dir.path(), "a", "vulkan", &[supertonic_fixture()], "[policies]\npinned_host = \"on\"\n");
    let b = profile_in(dir.path(), "b", "vulkan", &[supertonic_fixture()], "[policies]\npinned_host = \"off\"\n");
    let o = compare(dir.path(), plugins.path(), &a, &b, &["--expect", "identical"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("report.json")).unwrap()).unwrap();
    let on = |side: &str| report[side]["policies"]["decisions"].as_array().unwrap().iter().find(|d| d["feature"] == "pinned_host").unwrap()["enabled"].clone();
    assert_eq!((on("a"), on("b")), (serde_json::json!(true), serde_json::json!(false)));
}

#[test]
fn bad_inputs_are_one_line_errors_and_write_nothing() {
    let plugins = plugins_with(&["cpu"], &["supertonic", "chatterbox"]);
    let dir = tempfile::tempdir().unwrap();
    let a = profile_in(dir.path(), "a", "cpu", &[supertonic_fixture()], "");
    let c = profile_in(dir.path(), "c", "cpu", &chatterbox_fixture(), "");
    let written = |d: &Path| ["report.json", "report.png"].iter().any(|f| d.join(f).exists());

    let o = compare(dir.path(), plugins.path(), &a, &a, &["--expect", "close"]);
    assert_one_line_error(&o, "--expect \"close\": use `identical` or `max-rel=X` with X a number >= 0");
    let o = compare(dir.path(), plugins.path(), &a, &a, &["--expect", "max-rel=-1"]);
    assert_one_line_error(&o, "--expect \"max-rel=-1\"");
    assert!(!written(dir.path()));

    let o = compare(dir.path(), plugins.path(), &a, &c, &[]);
    assert_one_line_error(&o, "the profiles load different model families: ");
    assert!(!written(dir.path()));

    let missing = dir.path().join("no/such/dir/plot.png");
    let o = run(&[
        "compare",
        "--plugin-dir",
        plugins.path().to_str().unwrap(),
        "--profile",
        a.to_str().unwrap(),
        "--profile",
        a.to_str().unwrap(),
        "--text",
        TEXT,
        "--plot",
        missing.to_str().unwrap(),
    ]);
    assert_one_line_error(&o, &format!("--plot {}: directory {} does not exist", missing.display(), missing.parent().unwrap().display()));

    let o = run(&["compare", "--plugin-dir", plugins.path().to_str().unwrap(), "--profile", a.to_str().unwrap(), "--text", TEXT]);
    assert_one_line_error(&o, "tts compare takes two --profile files; 1 given");

    // A deny rule on an op the model needs and has no fallback for.
    let denied = profile_in(dir.path(), "d", "cpu", &[supertonic_fixture()], "[[deny]]\ndevice = \"*\"\nops = [\"SOFT_MAX\"]\nreason = \"test\"\n");
    let o = compare(dir.path(), plugins.path(), &a, &denied, &[]);
    assert_one_line_error(&o, "SOFT_MAX is denied on this device by deny rule 1 (device \"*\"): test, and supertonic has no fallback for it");
    assert!(!written(dir.path()));
}

/// Issue 31, item 16: ggml's Vulkan module enumerates its devices once per
/// process, with the first profile's `allow_software`. Side B, which allows
/// lavapipe, then saw no device and fell back to the CPU without a word: an
/// A/B of CPU against CPU reported as CPU against Vulkan. Each side now gets
/// the device its own profile resolves, in either order.
#[test]
fn each_side_gets_the_vulkan_device_its_own_profile_allows() {
    let plugins = plugins_with(&["cpu", "vulkan"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = |name: &str, allow_software: bool| {
        let sub = dir.path().join(name);
        std::fs::create_dir(&sub).unwrap();
        write_profile(
            &sub,
            &format!(
                "[backend]\nprefer = [\"vulkan\", \"cpu\"]\nfallback = true\n[backends.cpu]\nthreads = 1\n[backends.vulkan]\nallow_software = {allow_software}\npipeline_cache = false\n[model]\nfiles = [\"{}\"]\n",
                supertonic_fixture().display()
            ),
        )
    };
    let (hardware_only, software_too) = (profile("hardware-only", false), profile("software-too", true));
    // What each profile resolves alone, in a process of its own: the
    // expectation for its side of the comparison (with lavapipe and no GPU,
    // the CPU and lavapipe).
    let alone = |p: &Path| {
        let o = run(&["devices", "--json", "--profile", p.to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap()]);
        assert!(o.status.success(), "{}", stderr(&o));
        let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (report["selected"]["backend"].as_str().unwrap().to_string(), report["selected"]["device_name"].as_str().unwrap().to_string())
    };
    let (hardware, software) = (alone(&hardware_only), alone(&software_too));
    if hardware == software {
        // Each side still must match its own profile, but the defect (side B
        // falling back to the CPU) only shows where the two differ.
        eprintln!(
            "note: both profiles resolve to {} {} here; the case that found the defect needs a software Vulkan device (lavapipe) and no GPU",
            hardware.0, hardware.1
        );
    }
    for (a, b, want_a, want_b) in [(&hardware_only, &software_too, &hardware, &software), (&software_too, &hardware_only, &software, &hardware)] {
        let o = compare(dir.path(), plugins.path(), a, b, &[]);
        assert!(o.status.success(), "{}", stderr(&o));
        let report: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("report.json")).unwrap()).unwrap();
        for (side, want) in [("a", want_a), ("b", want_b)] {
            let got = (report[side]["backend"].as_str().unwrap(), report[side]["device"].as_str().unwrap());
            assert_eq!(got, (want.0.as_str(), want.1.as_str()), "side {side} of {} / {}", a.display(), b.display());
        }
    }
}
