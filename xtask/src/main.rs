//! `cargo xtask <task>`:
//! - `deps`: install the system packages the ggml build needs (Debian/Ubuntu, as root).
//! - `test`: deps, build every workspace artifact (plugins are cdylibs the tests load), run all tests.
//! - `dist [--release] [--backends cpu,vulkan] [--cpu-variants native|all|baseline] [--out DIR]`: assemble a bundle:
//!   `tts`, `lib/` (the one shared libggml-base + libggml), `plugins/` (chosen backend
//!   and model plugins with their ggml modules and stamps), `profiles/`.
//! - `demo`: deps, dist, then run `tts` from the bundle on the embedded default profile.
//! - `module-kit <backend> --out DIR`: a self-contained kit that builds a backend's ggml
//!   module on another machine (CUDA with nvcc on a GPU host without Rust): the pinned
//!   tree with the plugin's patches applied, a `build.sh`, and the stamp template
//!   the plugin will check.

use std::path::{Path, PathBuf};
use std::process::{exit, Command};

const APT_PACKAGES: &[&str] = &[
    "cmake", "ninja-build", "patch", "libclang-dev", "glslc", "libvulkan-dev", "spirv-headers", "glslang-tools",
    "mesa-vulkan-drivers",
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("deps") => deps(),
        Some("test") => deps().and_then(|_| test(&args[1..])),
        Some("dist") => deps().and_then(|_| dist(&args[1..]).map(|_| ())),
        Some("demo") => deps().and_then(|_| demo()),
        Some("module-kit") => module_kit(&args[1..]).map(|_| ()),
        _ => Err("usage: cargo xtask <deps|test|dist|demo|module-kit> [options]".into()),
    };
    if let Err(e) = result {
        eprintln!("xtask: {e}");
        exit(1);
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn run(cmd: &mut Command) -> Result<(), String> {
    eprintln!("+ {cmd:?}");
    let status = cmd.status().map_err(|e| format!("{cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed ({status})"))
    }
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

fn have_dpkg(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

fn deps() -> Result<(), String> {
    if Command::new("dpkg-query").arg("--version").output().is_err() {
        eprintln!("xtask: not a Debian-based system; install by hand: {}", APT_PACKAGES.join(" "));
    } else {
        let missing: Vec<&str> = APT_PACKAGES.iter().copied().filter(|p| !have_dpkg(p)).collect();
        if !missing.is_empty() {
            let root_user = Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0")).unwrap_or(false);
            let sudo: &[&str] = if root_user { &[] } else { &["sudo"] };
            let apt = |args: &[&str]| {
                let mut all: Vec<&str> = sudo.to_vec();
                all.extend_from_slice(args);
                let mut c = Command::new(all[0]);
                c.args(&all[1..]).env("DEBIAN_FRONTEND", "noninteractive");
                run(&mut c)
            };
            apt(&["apt-get", "update", "-qq"])?;
            let mut install = vec!["apt-get", "install", "-y", "-qq", "--no-install-recommends"];
            install.extend(missing.iter());
            apt(&install)?;
        }
    }
    // The pinned ggml source arrives with the registry package; only `cargo fetch`
    // downloads it (it is never compiled).
    run(cargo().arg("fetch"))
}

/// Every workspace artifact, built with one fixed package and target selection:
/// the same selection everywhere means cargo never re-resolves features and
/// re-runs the ggml build scripts.
fn build_all(release: bool) -> Result<(), String> {
    let mut c = cargo();
    c.args(["build", "--workspace", "--all-targets"]);
    if let Some(v) = std::env::var_os("TTS_CPU_VARIANTS") {
        c.env("TTS_CPU_VARIANTS", v);
    }
    if release {
        c.arg("--release");
    }
    run(&mut c)
}

fn test(extra: &[String]) -> Result<(), String> {
    build_all(false)?;
    check_bundle()?;
    run_tests(extra)
}

/// `cargo test` over the same selection as [`build_all`], echoing its output and
/// ending with one summary line over every test binary.
fn run_tests(extra: &[String]) -> Result<(), String> {
    use std::io::{BufRead, BufReader};
    let mut cmd = cargo();
    cmd.args(["test", "--workspace", "--all-targets"]).args(extra).stdout(std::process::Stdio::piped());
    eprintln!("+ {cmd:?}");
    let mut child = cmd.spawn().map_err(|e| e.to_string())?;
    let (mut passed, mut failed, mut ignored) = (0u64, 0u64, 0u64);
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.map_err(|e| e.to_string())?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            let count = |word: &str| -> u64 {
                rest.split([';', '.']).find_map(|part| part.trim().strip_suffix(word).and_then(|n| n.trim().parse().ok())).unwrap_or(0)
            };
            passed += count(" passed");
            failed += count(" failed");
            ignored += count(" ignored");
        }
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    println!("summary: {passed} passed, {failed} failed, {ignored} skipped");
    if status.success() {
        Ok(())
    } else {
        Err(format!("cargo test failed ({status})"))
    }
}

/// The shipping layout works: one libggml-base in the process, separate plugin
/// files, and removing the Vulkan plugin leaves the rest working.
fn check_bundle() -> Result<(), String> {
    let bundle = dist(&["--out".into(), root().join("target/bundle-check").display().to_string()])?;
    let tts = bundle.join("tts");
    let profile = bundle.join("profiles/ci.toml");
    let devices = |expect: &[&str], reject: &[&str]| -> Result<(), String> {
        let out = bundled(&tts).arg("devices").arg("--json").arg("--profile").arg(&profile).output().map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(format!("bundle: tts devices failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        for e in expect {
            if !text.contains(e) {
                return Err(format!("bundle: `{e}` missing from tts devices output:\n{text}"));
            }
        }
        for r in reject {
            if text.contains(r) {
                return Err(format!("bundle: unexpected `{r}` in tts devices output:\n{text}"));
            }
        }
        Ok(())
    };
    // A backend module built outside cargo from a module kit (the CUDA path) is
    // accepted when its stamp matches; swap the CPU module for one built that way.
    let kit = module_kit(&["cpu".into(), "--out".into(), root().join("target/module-kit/cpu").display().to_string()])?;
    run(Command::new("bash").arg(kit.join("build.sh")))?;
    for f in ["libggml-cpu.so", "libggml-cpu.so.stamp.json"] {
        std::fs::copy(kit.join("out").join(f), bundle.join("plugins").join(f)).map_err(|e| e.to_string())?;
    }
    let base = format!("\"ggml_base_loaded\": [\n    \"{}\"\n  ]", bundle.join("lib/libggml-base.so.0").display());
    let kit_module = format!("\"{}\"", bundle.join("plugins/libggml-cpu.so").display());
    devices(&[&base, &kit_module, "\"kind\": \"cpu\"", "\"kind\": \"software-gpu\""], &["\"policy_error\""])?;
    std::fs::remove_file(bundle.join("plugins/libtts_backend_vulkan.so")).map_err(|e| e.to_string())?;
    devices(&[&base, "no plugin file libtts_backend_vulkan.so", "\"backend\": \"cpu\""], &["software-gpu"])?;
    check_run_paths(&bundle)?;
    check_bundle_profiles(&bundle)?;
    eprintln!("bundle check: ok ({})", bundle.display());
    Ok(())
}

/// Every ELF file of the bundle may search only `$ORIGIN`-relative run paths:
/// no build paths, no empty entries (the dynamic loader reads an empty entry
/// as the working directory, where anyone may plant a library).
fn check_run_paths(bundle: &Path) -> Result<(), String> {
    let mut files = Vec::new();
    let mut dirs = vec![bundle.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
            let path = entry.map_err(|e| e.to_string())?.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    let (mut elf_files, mut bad) = (0, Vec::new());
    for path in files {
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        if !bytes.starts_with(b"\x7fELF") {
            continue;
        }
        elf_files += 1;
        let elf = goblin::elf::Elf::parse(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        for (kind, list) in [("RUNPATH", &elf.runpaths), ("RPATH", &elf.rpaths)] {
            for value in list.iter() {
                for entry in value.split(':') {
                    if !(entry.starts_with("$ORIGIN") || entry.starts_with("${ORIGIN}")) {
                        bad.push(format!("{} {kind} entry {entry:?} (in {value:?})", path.display()));
                    }
                }
            }
        }
    }
    if !bad.is_empty() {
        return Err(format!("bundle: run paths must be $ORIGIN-relative:\n{}", bad.join("\n")));
    }
    eprintln!("bundle check: {elf_files} ELF files, every run path $ORIGIN-relative");
    Ok(())
}

/// The bundle's profiles name no model the bundle lacks: run from the bundle,
/// each says to pass `--model` instead of failing on a missing file.
fn check_bundle_profiles(bundle: &Path) -> Result<(), String> {
    let out = bundle.join("profile-check.wav");
    for entry in std::fs::read_dir(bundle.join("profiles")).map_err(|e| e.to_string())? {
        let profile = entry.map_err(|e| e.to_string())?.path();
        let text = std::fs::read_to_string(&profile).map_err(|e| e.to_string())?;
        if text.contains("tests/fixtures") {
            return Err(format!("bundle: {} names a file of the source tree", profile.display()));
        }
        if !text.contains("[model]") {
            continue;
        }
        let o = bundled(&bundle.join("tts")).arg("--profile").arg(&profile).args(["--text", "Hello.", "--out"]).arg(&out).output().map_err(|e| e.to_string())?;
        let err = String::from_utf8_lossy(&o.stderr);
        if o.status.success() || !err.contains("[model] files is empty") || !err.contains("pass --model FILE") || out.exists() {
            return Err(format!("bundle: {} should ask for --model, got: {err}", profile.display()));
        }
    }
    Ok(())
}

/// A profile as the bundle ships it: model files of the source tree (the test
/// fixtures) are not in a bundle, so `files` is emptied and the user passes
/// `--model` (or fills it in).
fn bundle_profile(text: &str) -> String {
    text.lines()
        .map(|line| {
            if line.trim_start().starts_with("files") && line.contains("tests/fixtures") {
                "files = []   # name your converted model file(s) here, or pass --model FILE".to_string()
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

fn dist(args: &[String]) -> Result<PathBuf, String> {
    let mut release = false;
    let mut backends = vec!["cpu".to_string(), "vulkan".to_string()];
    let mut out = root().join("dist/tts");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--release" => release = true,
            "--backends" => backends = it.next().ok_or("--backends needs a list")?.split(',').map(str::to_string).collect(),
            "--out" => out = PathBuf::from(it.next().ok_or("--out needs a directory")?),
            // native: this machine's ISA; all: every ISA variant, the best picked at
            // run time (bundles for other machines); baseline: ggml's default level.
            "--cpu-variants" => {
                let v = it.next().ok_or("--cpu-variants needs native, all or baseline")?;
                std::env::set_var("TTS_CPU_VARIANTS", v);
            }
            other => return Err(format!("dist: unknown option {other}")),
        }
    }
    build_all(release)?;
    let models: Vec<String> = std::fs::read_dir(root().join("models"))
        .map(|rd| rd.filter_map(|e| e.ok()).filter(|e| e.path().join("Cargo.toml").is_file()).map(|e| e.file_name().to_string_lossy().to_string()).collect())
        .unwrap_or_default();
    let target = root().join("target").join(if release { "release" } else { "debug" });
    if out.exists() {
        std::fs::remove_dir_all(&out).map_err(|e| e.to_string())?;
    }
    let (lib, plugins, profiles) = (out.join("lib"), out.join("plugins"), out.join("profiles"));
    for d in [&lib, &plugins, &profiles] {
        std::fs::create_dir_all(d).map_err(|e| e.to_string())?;
    }
    let copy = |from: PathBuf, to_dir: &Path| -> Result<(), String> {
        let to = to_dir.join(from.file_name().unwrap());
        std::fs::copy(&from, &to).map(|_| ()).map_err(|e| format!("{}: {e}", from.display()))
    };
    copy(target.join("tts"), &out)?;
    // Only the sonames are needed at run time.
    copy(target.join("libggml-base.so.0"), &lib)?;
    copy(target.join("libggml.so.0"), &lib)?;
    for b in &backends {
        copy(target.join(format!("libtts_backend_{b}.so")), &plugins)?;
        // The module, or every ISA variant of it, each with its stamp.
        let module = |name: &str| name.starts_with(&format!("libggml-{b}.so")) || name.starts_with(&format!("libggml-{b}-"));
        for entry in std::fs::read_dir(&target).map_err(|e| e.to_string())? {
            let path = entry.map_err(|e| e.to_string())?.path();
            if path.file_name().is_some_and(|n| module(&n.to_string_lossy())) {
                copy(path, &plugins)?;
            }
        }
    }
    for m in &models {
        copy(target.join(format!("libtts_model_{m}.so")), &plugins)?;
    }
    for entry in std::fs::read_dir(root().join("profiles")).map_err(|e| e.to_string())? {
        let path = entry.map_err(|e| e.to_string())?.path();
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        std::fs::write(profiles.join(path.file_name().unwrap()), bundle_profile(&text)).map_err(|e| e.to_string())?;
    }
    eprintln!("bundle: {}", out.display());
    Ok(out)
}

fn module_kit(args: &[String]) -> Result<PathBuf, String> {
    let backend = args.first().ok_or("module-kit: name a backend (cpu, vulkan, cuda, ...)")?.clone();
    let out = match (args.get(1).map(String::as_str), args.get(2)) {
        (Some("--out"), Some(dir)) => PathBuf::from(dir),
        (None, None) => root().join("target/module-kit").join(&backend),
        _ => return Err("module-kit: usage: cargo xtask module-kit <backend> [--out DIR]".into()),
    };
    let patches_dir = root().join("backends").join(&backend).join("patches");
    if !patches_dir.is_dir() {
        return Err(format!("module-kit: no backend plugin `{backend}` ({} missing)", patches_dir.display()));
    }
    let pristine = ggml_build_support::locate_source(&root().join("target/module-kit/registry"))?;
    let patches = ggml_build_support::patch_series(&patches_dir);
    if out.exists() {
        std::fs::remove_dir_all(&out).map_err(|e| e.to_string())?;
    }
    std::fs::create_dir_all(&out).map_err(|e| e.to_string())?;
    ggml_build_support::prepare_source(&pristine, &out.join("src"), &patches, &format!("src/ggml-{backend}/"))?;
    let module = format!("ggml-{backend}");
    let stamp = ggml_build_support::stamp_template(&pristine, &patches)?.replace("@MODULE_FILE@", &format!("lib{module}.so"));
    std::fs::write(out.join("stamp.json.in"), stamp).map_err(|e| e.to_string())?;
    let options = ggml_build_support::CmakeOptions::default().define(&format!("GGML_{}", backend.to_uppercase()), "ON");
    let defines: Vec<String> = options.defines.iter().map(|(k, v)| format!("-D{k}={v}")).collect();
    let script = format!(
        r#"#!/usr/bin/env bash
# Builds lib{module}.so from the pinned ggml tree in src/ (this plugin's patches
# applied) and stamps it for the tts `{backend}` plugin. Needs cmake, ninja and the
# backend's toolchain; no Rust. Extra CMake arguments pass through, e.g.
#   bash build.sh -DCMAKE_CUDA_ARCHITECTURES=90
# Output: out/lib{module}.so and out/lib{module}.so.stamp.json, to put beside
# libtts_backend_{backend}.so.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cmake -G Ninja -S "$here/src" -B "$here/build" {defines} "$@"
cmake --build "$here/build" --target {module} -j "$(nproc)"
mkdir -p "$here/out"
cp "$here/build/bin/lib{module}.so" "$here/out/"
sha=$(sha256sum "$here/out/lib{module}.so" | cut -d' ' -f1)
sed "s/@MODULE_SHA256@/$sha/" "$here/stamp.json.in" > "$here/out/lib{module}.so.stamp.json"
echo "built $here/out/lib{module}.so"
"#,
        defines = defines.join(" ")
    );
    std::fs::write(out.join("build.sh"), script).map_err(|e| e.to_string())?;
    eprintln!("module kit: {} (run build.sh where the module is to be built)", out.display());
    Ok(out)
}

/// Runs a bundled binary as a user would: without the library path `cargo run`
/// sets, so the bundle's own RUNPATH decides which libggml-base loads.
fn bundled(program: &Path) -> Command {
    let mut c = Command::new(program);
    c.env_remove("LD_LIBRARY_PATH");
    c
}

fn demo() -> Result<(), String> {
    let bundle = dist(&[])?;
    let tts = bundle.join("tts");
    run(bundled(&tts).arg("--version"))?;
    run(bundled(&tts).arg("devices"))?;
    let has_model = std::fs::read_dir(bundle.join("plugins"))
        .map_err(|e| e.to_string())?
        .any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("libtts_model_")));
    if !has_model {
        eprintln!("demo: no model-family plugin is in the bundle yet, so there is nothing to synthesize with");
        return Ok(());
    }
    // No official weights ship with the repository: the demo speaks through the
    // tiny random-weight Supertonic fixture (profiles/supertonic.toml), so the
    // whole pipeline runs; convert an official bundle for real speech.
    let wav = root().join("target/demo.wav");
    let profile = root().join("profiles/supertonic.toml");
    run(bundled(&tts).arg("--profile").arg(&profile).args(["--text", "Hello from tts.", "--out"]).arg(&wav))?;
    run(bundled(&tts).arg("bench").arg("--profile").arg(&profile).args(["--text", "Hello from tts.", "--runs", "3"]))
}
