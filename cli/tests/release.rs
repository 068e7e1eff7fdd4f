//! The release archive (`cargo xtask release`, docs/release.md) works
//! unpacked anywhere: its checksums hold, its licence inventory lists the
//! crates, and `tts devices` and a synthesis run from it with an
//! environment that knows nothing of the build (no inherited variables, the
//! system's PATH, an LD_LIBRARY_PATH naming an empty directory, another
//! working directory), loading every library from the unpacked tree.
//!
//! `cargo xtask test` builds the archive (`--debug`) and names it in
//! `TTS_TEST_RELEASE_ARCHIVE`; without it these tests report themselves
//! skipped, unless `TTS_REQUIRE_RELEASE` is set, where they fail.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;

const ARCHIVE_ENV: &str = "TTS_TEST_RELEASE_ARCHIVE";

fn archive() -> Option<PathBuf> {
    match std::env::var_os(ARCHIVE_ENV) {
        Some(path) => Some(PathBuf::from(path)),
        None => {
            assert!(std::env::var_os("TTS_REQUIRE_RELEASE").is_none(), "TTS_REQUIRE_RELEASE is set but {ARCHIVE_ENV} names no archive");
            eprintln!("skipped: {ARCHIVE_ENV} is not set (cargo xtask test builds the archive and sets it)");
            None
        }
    }
}

/// The archive unpacked into a private directory, with a home, an empty
/// library directory and a working directory of its own beside it.
struct Unpacked {
    dir: tempfile::TempDir,
    /// The archive's single top directory, `tts-<version>-<os>-<arch>`.
    top: PathBuf,
}

fn unpack(archive: &Path) -> Unpacked {
    let dir = tempfile::tempdir().unwrap();
    let into = dir.path().join("unpacked");
    for d in [&into, &dir.path().join("home"), &dir.path().join("empty-lib"), &dir.path().join("work")] {
        std::fs::create_dir(d).unwrap();
    }
    let o = Command::new("tar").arg("-xzf").arg(archive).arg("-C").arg(&into).output().unwrap();
    assert!(o.status.success(), "tar: {}", stderr(&o));
    let names = dir_names(&into);
    assert_eq!(names.len(), 1, "one top directory: {names:?}");
    let name = archive.file_name().unwrap().to_string_lossy().trim_end_matches(".tar.gz").to_string();
    assert_eq!(names[0], name, "the top directory is named as the archive");
    let top = into.join(&names[0]);
    Unpacked { dir, top }
}

impl Unpacked {
    /// The bundled `tts`, run as by a stranger to the build.
    fn tts(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.top.join("tts"));
        cmd.args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("LD_LIBRARY_PATH", self.dir.path().join("empty-lib"))
            .env("HOME", self.dir.path().join("home"))
            .env("XDG_CACHE_HOME", self.dir.path().join("home/.cache"))
            .current_dir(self.dir.path().join("work"));
        cmd
    }
}

fn ok(o: Output, what: &str) -> Output {
    assert!(o.status.success(), "{what} failed: {}", stderr(&o));
    o
}

/// Every file of the unpacked tree is listed in its SHA256SUMS and matches
/// (`sha256sum -c`), and the SHA256SUMS beside the archive holds the
/// archive's checksum.
#[test]
fn the_archive_and_every_file_in_it_match_their_checksums() {
    let Some(archive) = archive() else { return };
    let dir = archive.parent().unwrap();
    let name = archive.file_name().unwrap().to_string_lossy().to_string();
    let beside = std::fs::read_to_string(dir.join("SHA256SUMS")).unwrap();
    assert!(beside.lines().any(|l| l.ends_with(&format!("  {name}"))), "{name} not in SHA256SUMS:\n{beside}");
    ok(
        Command::new("sha256sum").args(["--quiet", "--ignore-missing", "-c", "SHA256SUMS"]).current_dir(dir).output().unwrap(),
        "sha256sum -c beside the archive",
    );

    let u = unpack(&archive);
    ok(Command::new("sha256sum").args(["--quiet", "-c", "SHA256SUMS"]).current_dir(&u.top).output().unwrap(), "sha256sum -c in the archive");
    let sums = std::fs::read_to_string(u.top.join("SHA256SUMS")).unwrap();
    let mut listed: Vec<String> = sums.lines().map(|l| l.split_once("  ").expect("HASH  PATH").1.to_string()).collect();
    listed.sort();
    let find = ok(Command::new("find").args([".", "-type", "f", "!", "-name", "SHA256SUMS", "-printf", "%P\\n"]).current_dir(&u.top).output().unwrap(), "find");
    let mut files: Vec<String> = String::from_utf8(find.stdout).unwrap().lines().map(str::to_string).collect();
    files.sort();
    assert_eq!(listed, files, "SHA256SUMS lists exactly the archive's files");
    for needed in [
        "tts",
        "lib/libggml-base.so.0",
        "plugins/libtts_backend_cpu.so",
        "plugins/libtts_backend_vulkan.so",
        "plugins/libtts_model_supertonic.so",
        "profiles/supertonic.toml",
        "THIRD-PARTY-LICENSES.md",
    ] {
        assert!(files.iter().any(|f| f == needed), "{needed} missing from the archive: {files:?}");
    }
}

/// THIRD-PARTY-LICENSES.md: the native libraries of docs/licenses.md, a row
/// per crate with the licence it is used under (symphonia's MPL-2.0 noted,
/// libsoxr-sys's LGPL), nothing under GPL.
#[test]
fn the_licence_inventory_lists_the_crates_and_no_gpl() {
    let Some(archive) = archive() else { return };
    // Only this file: the debug archive unpacks to some 250 MB.
    let dir = tempfile::tempdir().unwrap();
    let name = archive.file_name().unwrap().to_string_lossy().trim_end_matches(".tar.gz").to_string();
    let o = Command::new("tar").arg("-xzf").arg(&archive).arg("-C").arg(dir.path()).arg(format!("{name}/THIRD-PARTY-LICENSES.md")).output().unwrap();
    assert!(o.status.success(), "tar: {}", stderr(&o));
    let text = std::fs::read_to_string(dir.path().join(&name).join("THIRD-PARTY-LICENSES.md")).unwrap();
    assert!(text.contains("\n## Native libraries\n") && text.contains("libsoxr") && text.contains("LAME"));
    let rows: Vec<Vec<&str>> = text
        .split("\n## Rust crates")
        .nth(1)
        .expect("a Rust crates section")
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| crate "))
        .map(|l| l.trim_matches('|').split(" | ").map(str::trim).collect())
        .collect();
    assert!(rows.len() > 100, "{} crates", rows.len());
    let used =
        |name: &str| -> String { rows.iter().find(|r| r[0] == name).unwrap_or_else(|| panic!("{name} is not in the inventory")).last().unwrap().to_string() };
    assert_eq!(used("symphonia-core"), "MPL-2.0");
    assert_eq!(used("libsoxr-sys"), "LGPL-2.0");
    for name in ["clap", "serde", "hound", "abi_stable", "flacenc", "tokenizers"] {
        assert!(!used(name).is_empty());
    }
    for r in &rows {
        assert!(!r.last().unwrap().split(" AND ").any(|id| id.starts_with("GPL-") || id.starts_with("AGPL-")), "{r:?}");
    }
    let mpl = text.split("\n## Crates under the MPL-2.0\n").nth(1).expect("an MPL-2.0 section").split("\n## ").next().unwrap();
    assert!(mpl.lines().any(|l| l.starts_with("- symphonia-core ")), "{mpl}");
    assert!(text.contains("### Mozilla Public License 2.0 (MPL-2.0)"));
}

/// Unpacked anywhere, `tts devices` loads libggml-base and the plugins
/// from the unpacked tree (the dynamic loader's own record, `LD_DEBUG=libs`,
/// shows every library the archive ships loaded from it, libsoxr and LAME
/// among them, and none of the build tree), and a synthesis with the bundled
/// Supertonic profile and the tiny fixture copied beside it gives the same
/// bytes as the build tree's `tts`.
#[test]
fn unpacked_anywhere_it_lists_devices_and_speaks() {
    let Some(archive) = archive() else { return };
    let u = unpack(&archive);
    let top = u.top.display().to_string();
    let build_tree = repo().display().to_string();

    let o = ok(u.tts(&["devices", "--json"]).env("LD_DEBUG", "libs").output().unwrap(), "tts devices");
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(json["ggml_base_loaded"], serde_json::json!([format!("{top}/lib/libggml-base.so.0")]));
    assert_eq!(json["plugin_dirs"], serde_json::json!([format!("{top}/plugins")]));
    for (kind, name) in [("backend", "cpu"), ("model", "supertonic")] {
        let plugin = json["plugins"].as_array().unwrap().iter().find(|p| p["kind"] == kind && p["name"] == name).expect(name);
        assert_eq!(plugin["loaded"], true, "{plugin}");
        assert_eq!(plugin["path"].as_str().unwrap(), format!("{top}/plugins/libtts_{kind}_{name}.so"));
    }
    assert!(!String::from_utf8_lossy(&o.stdout).contains(&build_tree), "the build tree appears in:\n{}", String::from_utf8_lossy(&o.stdout));
    let loader = stderr(&o);
    let loaded: Vec<&str> = loader.lines().filter_map(|l| l.split_once("calling init: ").map(|(_, p)| p.trim())).collect();
    assert!(loaded.iter().any(|p| p.ends_with("/plugins/libtts_model_supertonic.so")), "LD_DEBUG shows no plugin:\n{loader}");
    // Every library the archive ships loads from it, the system's libsoxr
    // and LAME included (the Chatterbox plugin and tts itself need them).
    let mut shipped = dir_names(&u.top.join("lib"));
    shipped.extend(dir_names(&u.top.join("plugins")));
    for name in ["libggml-base.so.0", "libsoxr.so.0", "libmp3lame.so.0", "libtts_model_chatterbox.so"] {
        assert!(loaded.iter().any(|p| p.ends_with(&format!("/{name}"))), "{name} not loaded:\n{loader}");
    }
    for path in &loaded {
        assert!(!path.starts_with(&build_tree), "{path} loaded from the build tree");
        let name = path.rsplit('/').next().unwrap();
        assert!(!shipped.iter().any(|s| s == name) || path.starts_with(&top), "{path}: the archive ships {name}, but it loaded from elsewhere");
    }

    let models = u.dir.path().join("work/models");
    std::fs::create_dir(&models).unwrap();
    std::fs::copy(supertonic_fixture(), models.join("model.gguf")).unwrap();
    let profile = format!("{top}/profiles/supertonic.toml");
    let args = ["--profile", &profile, "--model", "models/model.gguf", "--text", "Hello from an unpacked archive.", "--out", "hello.wav"];
    ok(u.tts(&args).output().unwrap(), "synthesis from the unpacked archive");
    let spoken = std::fs::read(u.dir.path().join("work/hello.wav")).unwrap();
    let (rate, samples) = read_wav(&u.dir.path().join("work/hello.wav"));
    assert!(rate > 0 && samples.len() > 1000 && samples.iter().any(|s| *s != 0.0), "{rate} Hz, {} samples", samples.len());

    // The same synthesis by the build tree's tts, with the bundle's plugins
    // copied beside it and the source tree's copy of the same profile.
    let here = tempfile::tempdir().unwrap();
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let source_profile = repo().join("profiles/supertonic.toml");
    let wav = here.path().join("hello.wav");
    let fixture = supertonic_fixture();
    let args = [
        "--profile",
        source_profile.to_str().unwrap(),
        "--plugin-dir",
        plugins.path().to_str().unwrap(),
        "--model",
        fixture.to_str().unwrap(),
        "--text",
        "Hello from an unpacked archive.",
        "--out",
        wav.to_str().unwrap(),
    ];
    ok(run(&args), "synthesis by the build tree's tts");
    assert!(std::fs::read(&wav).unwrap() == spoken, "the unpacked archive's audio differs from the build tree's");
}
