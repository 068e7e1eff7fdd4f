//! `cargo xtask <task>`:
//! - `deps`: install the system packages the ggml build needs (Debian/Ubuntu, as root).
//! - `test`: deps, build every workspace artifact (plugins are cdylibs the tests load), run all tests
//!   (the Python package's too: its wheel built, installed into a fresh venv and tested with pytest).
//! - `dist [--release] [--backends cpu,vulkan] [--cpu-variants native|all|baseline] [--out DIR]`: assemble a bundle:
//!   `tts`, `lib/` (the one shared libggml-base + libggml), `plugins/` (chosen backend
//!   and model plugins with their ggml modules and stamps), `profiles/`. `--no-build`
//!   assembles what `target/` already holds.
//! - `release [--debug] [--backends cpu,vulkan] [--with-cuda-kit] [--out DIR]`: the
//!   archive `tts-<version>-<os>-<arch>.tar.gz` (a bundle, `THIRD-PARTY-LICENSES.md`
//!   from cargo-about, `SHA256SUMS`) and its checksum beside it (docs/release.md).
//! - `wheel [--release] [--backends cpu,vulkan] [--out DIR]`: the Python package's wheel
//!   (python/, docs/python.md) with a bundle's plugins inside, into DIR (default `dist/`).
//! - `demo`: deps, dist, then run `tts` from the bundle on the embedded default profile.
//! - `fuzz [--seconds N] [--runs N] [TARGET ...]`: build the cargo-fuzz targets
//!   (fuzz/, stable toolchain, no sanitizer) and run each for N seconds or N
//!   executions, whichever ends first, from its seed corpus; reports executions
//!   and fails on any crash, timeout or out-of-memory (docs/reliability.md).
//! - `soak [--runs N]`: release build, then `tts soak` (N syntheses in one
//!   process, default 200: bit-identical outputs, resident-memory growth at
//!   most 10 MiB) for each family's tiny fixture on the CPU and on Vulkan.
//! - `module-kit <backend> --out DIR`: a self-contained kit that builds a backend's ggml
//!   module on another machine (CUDA with nvcc on a GPU host without Rust, Metal on a Mac): the pinned
//!   tree with the plugin's patches applied, a `build.sh`, and the stamp template
//!   the plugin will check.

use std::path::{Path, PathBuf};
use std::process::{exit, Command};

mod image;
mod python;
mod release;

/// The ggml build (CMake, patch, bindgen's libclang), Vulkan (glslc, headers,
/// lavapipe), OpenCL (headers, the ICD loader, pocl; Python 3 embeds the
/// kernels), libsoxr (librosa's resampler, which Chatterbox's cloning links
/// as a shared library; found with pkg-config), and curl for the server tests.
const APT_PACKAGES: &[&str] = &[
    "cmake",
    "ninja-build",
    "patch",
    "libclang-dev",
    "glslc",
    "libvulkan-dev",
    "spirv-headers",
    "glslang-tools",
    "mesa-vulkan-drivers",
    "opencl-headers",
    "ocl-icd-opencl-dev",
    "pocl-opencl-icd",
    "python3",
    "pkg-config",
    "libsoxr-dev",
    // engine-core's MP3 encoder links LAME (LGPL) as the shared library.
    "libmp3lame-dev",
    // The encoder tests' independent decoder of Opus and AAC.
    "ffmpeg",
    "curl",
    // cli/tests/web_page.rs: the server's page in headless Chromium.
    "chromium",
    // cli/tests/openai_conformance.rs: the official Node client (npm comes
    // with the nodejs package of NodeSource's repository, where that is the
    // source; Debian's own `npm` package conflicts with it).
    "nodejs",
    // cli/tests/deploy.rs: three `tts serve` replicas behind HAProxy.
    "haproxy",
    // capi/tests/examples.rs: the C API's error paths under memcheck.
    "valgrind",
    // cli/tests/container.rs: the image built with podman on a base made
    // with debootstrap, its root filesystem run in private namespaces.
    "podman",
    "debootstrap",
    "iproute2",
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("deps") => deps(),
        Some("test") => deps().and_then(|_| test(&args[1..])),
        Some("dist") => deps().and_then(|_| dist(&args[1..]).map(|_| ())),
        Some("release") => deps().and_then(|_| release::release(&args[1..]).map(|_| ())),
        Some("image") => deps().and_then(|_| image::image(&args[1..]).map(|_| ())),
        Some("wheel") => deps().and_then(|_| python::wheel(&args[1..]).map(|_| ())),
        Some("demo") => deps().and_then(|_| demo()),
        Some("module-kit") => module_kit(&args[1..]).map(|_| ()),
        Some("fuzz") => fuzz(&args[1..]),
        Some("soak") => deps().and_then(|_| soak(&args[1..])),
        _ => Err("usage: cargo xtask <deps|test|dist|release|image|wheel|demo|module-kit|fuzz|soak> [options]".into()),
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

/// Whether xtask runs as root (`id -u` is 0).
fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout == b"0\n")
}

fn deps() -> Result<(), String> {
    if Command::new("dpkg-query").arg("--version").output().is_err() {
        eprintln!("xtask: not a Debian-based system; install by hand: {}", APT_PACKAGES.join(" "));
    } else {
        let missing: Vec<&str> = APT_PACKAGES.iter().copied().filter(|p| !have_dpkg(p)).collect();
        if !missing.is_empty() {
            let sudo: &[&str] = if is_root() { &[] } else { &["sudo"] };
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
    check_style()?;
    build_all(false)?;
    build_old_abi_fixtures()?;
    openai_client()?;
    openai_node()?;
    converter_python()?;
    kubernetes_validate()?;
    check_bundle()?;
    release_check()?;
    container_check()?;
    // The wheel carries the bundle check_bundle assembled (CPU only), and is
    // compared with that bundle's `tts`: the same plugins and CPU module (the
    // bundle's is built from the module kit, the build tree's for this
    // machine's ISA), so the same samples bit for bit.
    let bundle = root().join("target/bundle-check");
    python::test_package(&bundle, &["cpu"], &bundle.join("tts"))?;
    run_tests(extra)
}

/// The release archive of the dev build in `target/release-check`, named
/// to `cli/tests/release.rs` (the relocation test) in
/// `TTS_TEST_RELEASE_ARCHIVE`. Without crates.io for cargo-about that test
/// reports itself skipped, unless `TTS_REQUIRE_RELEASE` is set (CI sets
/// it), where this fails instead.
fn release_check() -> Result<(), String> {
    if let Err(e) = release::install_cargo_about() {
        if std::env::var_os("TTS_REQUIRE_RELEASE").is_some() {
            return Err(format!("installing cargo-about {} for the release test: {e}", release::CARGO_ABOUT_VERSION));
        }
        eprintln!("xtask: cargo-about could not be installed ({e}); the release tests will report themselves skipped");
        return Ok(());
    }
    let archive = release::release(&["--debug".into(), "--out".into(), root().join("target/release-check").display().to_string()])?;
    std::env::set_var("TTS_TEST_RELEASE_ARCHIVE", &archive);
    std::env::set_var("TTS_REQUIRE_RELEASE", "1");
    Ok(())
}

/// The container image of the release archive `release_check` packed, on
/// a base made with debootstrap, in a private podman store under
/// `target/container`, named to `cli/tests/container.rs` in
/// `TTS_TEST_IMAGE`. Without root, podman or debootstrap that test reports
/// itself skipped, unless `TTS_REQUIRE_CONTAINER` is set (CI sets it), where
/// this fails instead.
fn container_check() -> Result<(), String> {
    let required = std::env::var_os("TTS_REQUIRE_CONTAINER").is_some();
    let have = |tool: &str| Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success());
    let missing = match std::env::var_os("TTS_TEST_RELEASE_ARCHIVE") {
        None => Some("no release archive".to_string()),
        Some(_) if !is_root() => Some("not root (debootstrap and the namespaces need it)".into()),
        Some(_) => ["podman", "debootstrap"].into_iter().find(|t| !have(t)).map(|t| format!("no {t}")),
    };
    if let Some(why) = missing {
        if required {
            return Err(format!("the container image test: {why}"));
        }
        eprintln!("xtask: {why}; the container image test will report itself skipped");
        return Ok(());
    }
    let archive = std::env::var("TTS_TEST_RELEASE_ARCHIVE").map_err(|e| e.to_string())?;
    let store = root().join("target/container/store");
    let (tag, _) = image::image(&[
        "--archive".into(),
        archive,
        "--debootstrap-base".into(),
        "--store".into(),
        store.display().to_string(),
        "--tag".into(),
        "tts:test".into(),
    ])?;
    std::env::set_var("TTS_TEST_IMAGE", tag);
    std::env::set_var("TTS_TEST_IMAGE_STORE", &store);
    Ok(())
}

/// The official `openai` Python package, pinned, in `target/openai-venv`:
/// `cli/tests/server_openai.rs` drives `tts serve` with it. Without Python
/// or PyPI that test reports itself skipped, unless `TTS_REQUIRE_OPENAI` is
/// set (CI sets it), where this fails instead.
const OPENAI_PACKAGE: &str = "openai==3.57.0";

fn openai_client() -> Result<(), String> {
    let venv = root().join("target/openai-venv");
    let python = venv.join("bin/python");
    let version = OPENAI_PACKAGE.split_once("==").map(|(_, v)| v).unwrap_or_default();
    let ready =
        || Command::new(&python).args(["-c", &format!("import openai, sys; sys.exit(openai.__version__ != '{version}')")]).status().is_ok_and(|s| s.success());
    if !ready() {
        let installed = run(Command::new("python3").args(["-m", "venv"]).arg(&venv))
            .and_then(|()| run(Command::new(venv.join("bin/pip")).args(["install", "-q", "--disable-pip-version-check", OPENAI_PACKAGE])));
        if let Err(e) = installed {
            if std::env::var_os("TTS_REQUIRE_OPENAI").is_some() {
                return Err(format!("installing {OPENAI_PACKAGE} for the server test: {e}"));
            }
            eprintln!("xtask: {OPENAI_PACKAGE} could not be installed ({e}); the openai client test will report itself skipped");
            return Ok(());
        }
    }
    std::env::set_var("TTS_OPENAI_PYTHON", &python);
    Ok(())
}

/// The official `openai` Node package, pinned, in `target/openai-node`:
/// `cli/tests/openai_conformance.rs` drives `tts serve` with it beside the
/// Python one. It runs on Node 20 (its manifest asks for 22, which it does
/// not need for the speech API).
const OPENAI_NODE_PACKAGE: &str = "openai@7.57.0";

fn openai_node() -> Result<(), String> {
    let prefix = root().join("target/openai-node");
    let manifest = prefix.join("node_modules/openai/package.json");
    let version = OPENAI_NODE_PACKAGE.split_once('@').map(|(_, v)| v).unwrap_or_default();
    let ready = || std::fs::read_to_string(&manifest).is_ok_and(|m| m.contains(&format!("\"version\": \"{version}\"")));
    if !ready() {
        let installed = run(Command::new("npm").args(["install", "--silent", "--no-audit", "--no-fund", "--prefix"]).arg(&prefix).arg(OPENAI_NODE_PACKAGE));
        if let Err(e) = installed {
            if std::env::var_os("TTS_REQUIRE_OPENAI").is_some() {
                return Err(format!("installing {OPENAI_NODE_PACKAGE} for the server test: {e}"));
            }
            eprintln!("xtask: {OPENAI_NODE_PACKAGE} could not be installed ({e}); the Node client test will report itself skipped");
            return Ok(());
        }
    }
    std::env::set_var("TTS_OPENAI_NODE_MODULES", prefix.join("node_modules"));
    Ok(())
}

/// The converter's Python tests (`tools/chatterbox/tests`) need `tokenizers`,
/// `gguf` and numpy, pinned as tools/chatterbox/README.md pins them, in
/// `target/converter-venv`; `models/chatterbox/tests/converter.rs` runs them
/// and, once this has installed them, fails rather than skips without them.
const CONVERTER_PACKAGES: [&str; 3] = ["tokenizers==0.22.2", "gguf==0.19.0", "numpy==1.26.4"];

fn converter_python() -> Result<(), String> {
    let venv = root().join("target/converter-venv");
    let python = venv.join("bin/python");
    let ready = || Command::new(&python).args(["-c", "import tokenizers, gguf, numpy"]).status().is_ok_and(|s| s.success());
    if !ready() {
        let installed = run(Command::new("python3").args(["-m", "venv"]).arg(&venv))
            .and_then(|()| run(Command::new(venv.join("bin/pip")).args(["install", "-q", "--disable-pip-version-check"]).args(CONVERTER_PACKAGES)));
        if let Err(e) = installed {
            eprintln!("xtask: the converter's Python packages could not be installed ({e}); its test will report itself skipped");
            return Ok(());
        }
    }
    std::env::set_var("TTS_CHATTERBOX_PYTHON", &python);
    std::env::set_var("TTS_REQUIRE_CONVERTER_PYTHON", "1");
    Ok(())
}

/// `kubernetes-validate` (the Kubernetes API schemas, offline), pinned, in
/// `target/k8s-venv`: `cli/tests/deploy.rs` checks deploy/kubernetes/ with
/// it. Without Python or PyPI that test reports itself skipped, unless
/// `TTS_REQUIRE_KUBERNETES_VALIDATE` is set (CI sets it), where this fails.
const KUBERNETES_VALIDATE_PACKAGE: &str = "kubernetes-validate==1.34.1";

fn kubernetes_validate() -> Result<(), String> {
    let venv = root().join("target/k8s-venv");
    let version = KUBERNETES_VALIDATE_PACKAGE.split_once("==").map(|(_, v)| v).unwrap_or_default();
    let ready = || {
        Command::new(venv.join("bin/kubernetes-validate"))
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains(version))
    };
    if !ready() {
        let installed = run(Command::new("python3").args(["-m", "venv"]).arg(&venv))
            .and_then(|()| run(Command::new(venv.join("bin/pip")).args(["install", "-q", "--disable-pip-version-check", KUBERNETES_VALIDATE_PACKAGE])));
        if let Err(e) = installed {
            if std::env::var_os("TTS_REQUIRE_KUBERNETES_VALIDATE").is_some() {
                return Err(format!("installing {KUBERNETES_VALIDATE_PACKAGE} for the manifest test: {e}"));
            }
            eprintln!("xtask: {KUBERNETES_VALIDATE_PACKAGE} could not be installed ({e}); the manifest test will report itself skipped");
            return Ok(());
        }
    }
    std::env::set_var("TTS_KUBERNETES_VALIDATE_VENV", &venv);
    Ok(())
}

/// The tone test plugin as built against each older plugin ABI it can take
/// (its `abi-5-N` features), so that the tests load it into this host:
/// - 5.1, the interface and model trait of then (`engine_core::abi::v5_1`),
///   which `cli/tests/streaming.rs` and `voice_save.rs` load;
/// - 5.2, the root module before `load_for_cloning` (`abi::v5_2`), which
///   `cli/tests/voice_save.rs` loads;
/// - 5.3, the root module before the converter (`abi::v5_3`), which
///   `cli/tests/convert.rs` loads;
/// - 5.4, the model before `synthesize_with_progress` (`abi::v5_4`), which
///   `cli/tests/streaming.rs` loads;
/// - 5.5, the root module before `plan_memory` (`abi::v5_5`), which
///   `cli/tests/fit.rs` loads.
///
/// All five build in the one `abi-compat` profile, whose dependencies they
/// share (only the plugin's own features differ), and each result is copied
/// to `target/abi-5-N/`, where the tests look for it; they fail rather than
/// skip when this ran.
fn build_old_abi_fixtures() -> Result<(), String> {
    let target = root().join("target");
    for abi in ["5-1", "5-2", "5-3", "5-4", "5-5"] {
        let mut c = cargo();
        c.args(["build", "-p", "tts-test-plugin-tone", "--features", &format!("abi-{abi}"), "--profile", "abi-compat"]);
        run(&mut c)?;
        let dir = target.join(format!("abi-{abi}"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let built = target.join("abi-compat/libtts_test_tone.so");
        std::fs::copy(&built, dir.join("libtts_test_tone.so")).map_err(|e| format!("{}: {e}", built.display()))?;
        std::env::set_var(format!("TTS_REQUIRE_ABI_{}_FIXTURE", abi.replace('-', "_")), "1");
    }
    Ok(())
}

/// `cargo fmt --check` and `cargo clippy -D warnings` over the workspace: a
/// change that is not formatted or that clippy warns about does not pass.
fn check_style() -> Result<(), String> {
    let run = |args: &[&str]| -> Result<(), String> {
        let mut cmd = cargo();
        cmd.args(args);
        eprintln!("+ {cmd:?}");
        let status = cmd.status().map_err(|e| e.to_string())?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("cargo {} failed ({status})", args[0]))
        }
    };
    run(&["fmt", "--all", "--check"])?;
    run(&["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"])
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
            let count =
                |word: &str| -> u64 { rest.split([';', '.']).find_map(|part| part.trim().strip_suffix(word).and_then(|n| n.trim().parse().ok())).unwrap_or(0) };
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
    check_run_paths(&bundle)?;
    check_needed_libraries(&bundle)?;
    check_bundle_profiles(&bundle)?;
    check_bundle_capi(&bundle)?;
    std::fs::remove_file(bundle.join("plugins/libtts_backend_vulkan.so")).map_err(|e| e.to_string())?;
    devices(&[&base, "no plugin file libtts_backend_vulkan.so", "\"backend\": \"cpu\""], &["software-gpu"])?;
    eprintln!("bundle check: ok ({})", bundle.display());
    // cli/tests/pull.rs then runs `tts pull` and speaks with the pulled
    // models from this bundle, as a user of a fresh one would.
    std::env::set_var("TTS_TEST_BUNDLE", &bundle);
    Ok(())
}

/// What is wrong with the run path `value` of the ELF file at `rel` (its path
/// inside the bundle): each entry must be `$ORIGIN`-relative, not empty (the
/// dynamic loader reads an empty entry as the working directory) and resolve
/// inside the bundle (`$ORIGIN/../lib` of a file at the bundle's top is
/// outside it: a library planted there would load).
fn run_path_problems(rel: &Path, value: &str) -> Vec<String> {
    let depth = rel.parent().map_or(0, |d| d.components().count());
    value
        .split(':')
        .filter_map(|entry| {
            let rest = entry.strip_prefix("${ORIGIN}").or_else(|| entry.strip_prefix("$ORIGIN"));
            let Some(rest) = rest.filter(|r| r.is_empty() || r.starts_with('/')) else {
                return Some(format!("entry {entry:?} is not $ORIGIN-relative"));
            };
            let mut level = depth as isize;
            for part in rest.split('/').filter(|p| !p.is_empty() && *p != ".") {
                level += if part == ".." { -1 } else { 1 };
                if level < 0 {
                    return Some(format!("entry {entry:?} leads outside the bundle"));
                }
            }
            None
        })
        .collect()
}

/// The file offsets and texts of `bytes`' RUNPATH and RPATH strings.
fn run_path_strings(bytes: &[u8]) -> Result<Vec<(&'static str, usize, String)>, String> {
    use goblin::elf::dynamic::{DT_RPATH, DT_RUNPATH};
    let elf = goblin::elf::Elf::parse(bytes).map_err(|e| e.to_string())?;
    let Some(dynamic) = &elf.dynamic else { return Ok(Vec::new()) };
    let dynstr =
        elf.section_headers.iter().find(|s| elf.shdr_strtab.get_at(s.sh_name) == Some(".dynstr")).ok_or("a dynamic ELF file without .dynstr")?.sh_offset
            as usize;
    let mut found = Vec::new();
    for d in &dynamic.dyns {
        let kind = match d.d_tag {
            DT_RUNPATH => "RUNPATH",
            DT_RPATH => "RPATH",
            _ => continue,
        };
        let at = dynstr + d.d_val as usize;
        let end = bytes.get(at..).and_then(|s| s.iter().position(|&b| b == 0)).ok_or("a run path outside the file")?;
        found.push((kind, at, String::from_utf8_lossy(&bytes[at..at + end]).into_owned()));
    }
    Ok(found)
}

/// Drops the run-path entries of every ELF file of the bundle that
/// [`run_path_problems`] refuses (the host binary, at the top, is linked with
/// the plugins' `$ORIGIN/../lib`). The shorter string is written over the
/// old one and padded with NULs, as chrpath does.
fn confine_run_paths(bundle: &Path) -> Result<(), String> {
    for path in bundle_files(bundle)? {
        let mut bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        if !bytes.starts_with(b"\x7fELF") {
            continue;
        }
        let rel = path.strip_prefix(bundle).map_err(|e| e.to_string())?.to_path_buf();
        let mut changed = false;
        for (_, at, value) in run_path_strings(&bytes).map_err(|e| format!("{}: {e}", path.display()))? {
            let kept: Vec<&str> = value.split(':').filter(|e| run_path_problems(&rel, e).is_empty()).collect();
            let new = kept.join(":");
            if new != value {
                bytes[at..at + value.len()].fill(0);
                bytes[at..at + new.len()].copy_from_slice(new.as_bytes());
                changed = true;
            }
        }
        if changed {
            std::fs::write(&path, &bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    Ok(())
}

/// Every file under `bundle`, recursively.
fn bundle_files(bundle: &Path) -> Result<Vec<PathBuf>, String> {
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
    Ok(files)
}

/// Every ELF file of the bundle may search only `$ORIGIN`-relative run paths
/// that stay inside the bundle ([`run_path_problems`]): no build paths, no
/// empty entries, no `..` past the bundle's top.
fn check_run_paths(bundle: &Path) -> Result<(), String> {
    let (mut elf_files, mut bad) = (0, Vec::new());
    for path in bundle_files(bundle)? {
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        if !bytes.starts_with(b"\x7fELF") {
            continue;
        }
        elf_files += 1;
        let rel = path.strip_prefix(bundle).map_err(|e| e.to_string())?;
        for (kind, _, value) in run_path_strings(&bytes).map_err(|e| format!("{}: {e}", path.display()))? {
            for problem in run_path_problems(rel, &value) {
                bad.push(format!("{} {kind} {problem} (in {value:?})", path.display()));
            }
        }
    }
    if !bad.is_empty() {
        return Err(format!("bundle: run paths must be $ORIGIN-relative and stay inside the bundle:\n{}", bad.join("\n")));
    }
    eprintln!("bundle check: {elf_files} ELF files, every run path $ORIGIN-relative and inside the bundle");
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
        let o =
            bundled(&bundle.join("tts")).arg("--profile").arg(&profile).args(["--text", "Hello.", "--out"]).arg(&out).output().map_err(|e| e.to_string())?;
        let err = String::from_utf8_lossy(&o.stderr);
        if o.status.success() || !err.contains("[model] files is empty") || !err.contains("pass --model FILE") || out.exists() {
            return Err(format!("bundle: {} should ask for --model, got: {err}", profile.display()));
        }
    }
    Ok(())
}

/// The bundle's C API works from the bundle alone: capi/examples/speak.c,
/// compiled against its include/ and lib/, speaks the tiny Supertonic
/// fixture with the plugins libtts finds beside lib/ (no plugin directory
/// given, no library path). capi/tests/examples.rs then runs the error
/// paths under valgrind with the CPU module the module kit built.
fn check_bundle_capi(bundle: &Path) -> Result<(), String> {
    let work = root().join("target/capi-check");
    if work.exists() {
        std::fs::remove_dir_all(&work).map_err(|e| e.to_string())?;
    }
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let speak = work.join("speak");
    let lib = bundle.join("lib");
    run(Command::new("cc")
        .arg("-std=c11")
        .arg("-I")
        .arg(bundle.join("include"))
        .arg(root().join("capi/examples/speak.c"))
        .arg("-L")
        .arg(&lib)
        .arg("-ltts")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(&speak))?;
    let profile = work.join("profile.toml");
    let model = root().join("tests/fixtures/supertonic/tiny-v2/model.gguf");
    let text = format!("[backend]\nprefer = [\"cpu\"]\nfallback = false\n[backends.cpu]\nthreads = 1\n[model]\nfiles = [\"{}\"]\n", model.display());
    std::fs::write(&profile, text).map_err(|e| e.to_string())?;
    let out = work.join("speech.f32");
    let o = Command::new(&speak)
        .arg(&profile)
        .arg("Hello from the bundle.")
        .arg(&out)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("TTS_PLUGIN_PATH")
        .output()
        .map_err(|e| format!("{}: {e}", speak.display()))?;
    let size = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
    if !o.status.success() || size == 0 {
        return Err(format!("bundle: the C API example failed: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)));
    }
    eprintln!("bundle check: lib/libtts.so and include/tts.h speak ({size} bytes of samples)");
    std::env::set_var("TTS_REQUIRE_VALGRIND", "1");
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
    let mut build = true;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--release" => release = true,
            "--no-build" => build = false,
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
    if build {
        build_all(release)?;
    }
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
    // The C API (docs/c-api.md): libtts beside the ggml libraries it links,
    // and its header.
    copy(target.join("libtts.so"), &lib)?;
    let include = out.join("include");
    std::fs::create_dir_all(&include).map_err(|e| e.to_string())?;
    copy(root().join("capi/include/tts.h"), &include)?;
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
    bundle_shared_dependencies(&out)?;
    bundle_static_codec_notices(&out)?;
    confine_run_paths(&out)?;
    eprintln!("bundle: {}", out.display());
    Ok(out)
}

/// C libraries compiled into `tts` from a crate's bundled source, the file
/// in that source whose notice a binary distribution must carry, and
/// whether the source itself must come along: libopus (BSD-3-Clause) and
/// the Fraunhofer FDK AAC library, whose licence asks that recipients of
/// the binary get its complete source free of charge (docs/licenses.md).
const STATIC_CODEC_NOTICES: &[(&str, &str, &str, bool)] =
    &[("opusic-sys", "opus/COPYING", "libopus.COPYING", false), ("fdk-aac-sys", "aac/NOTICE", "fdk-aac.NOTICE", true)];

/// Copies [`STATIC_CODEC_NOTICES`] into `licenses/`, from the crate
/// versions Cargo.lock names, as Cargo unpacked them under
/// `$CARGO_HOME/registry/src`; a source that must come along is the
/// registry's `.crate` archive of that version (the exact source built),
/// copied as it is.
fn bundle_static_codec_notices(bundle: &Path) -> Result<(), String> {
    let lock_text = std::fs::read_to_string(root().join("Cargo.lock")).map_err(|e| format!("Cargo.lock: {e}"))?;
    let lock: toml::Table = lock_text.parse().map_err(|e| format!("Cargo.lock: {e}"))?;
    let packages = lock.get("package").and_then(|p| p.as_array()).ok_or("Cargo.lock: no packages")?;
    let cargo_home = std::env::var_os("CARGO_HOME").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let sources = cargo_home.ok_or("bundle: neither CARGO_HOME nor HOME is set")?.join("registry/src");
    let licenses = bundle.join("licenses");
    std::fs::create_dir_all(&licenses).map_err(|e| e.to_string())?;
    for (krate, file, shipped_as, with_source) in STATIC_CODEC_NOTICES {
        let version = packages
            .iter()
            .find(|p| p.get("name").and_then(|n| n.as_str()) == Some(krate))
            .and_then(|p| p.get("version")?.as_str())
            .ok_or_else(|| format!("bundle: Cargo.lock has no {krate}"))?;
        let registries = std::fs::read_dir(&sources).map_err(|e| format!("{}: {e}", sources.display()))?;
        let found = registries
            .filter_map(|r| r.ok())
            .map(|r| r.path().join(format!("{krate}-{version}")).join(file))
            .find(|p| p.is_file())
            .ok_or_else(|| format!("bundle: {file} of {krate} {version} not found under {}", sources.display()))?;
        std::fs::copy(&found, licenses.join(shipped_as)).map_err(|e| format!("{}: {e}", found.display()))?;
        eprintln!("bundle: licenses/{shipped_as} from {krate} {version}");
        if *with_source {
            let archive = format!("{krate}-{version}.crate");
            let cache = sources.with_file_name("cache");
            let registries = std::fs::read_dir(&cache).map_err(|e| format!("{}: {e}", cache.display()))?;
            let found = registries
                .filter_map(|r| r.ok())
                .map(|r| r.path().join(&archive))
                .find(|p| p.is_file())
                .ok_or_else(|| format!("bundle: the source archive {archive} not found under {}", cache.display()))?;
            std::fs::copy(&found, licenses.join(format!("{archive}.tar.gz"))).map_err(|e| format!("{}: {e}", found.display()))?;
            eprintln!("bundle: licenses/{archive}.tar.gz, the source of {krate} {version}");
        }
    }
    Ok(())
}

/// Libraries every Linux system a bundle targets provides (the C and C++
/// runtimes, OpenMP from the GCC runtime, the GPU drivers' loaders): a
/// bundle relies on them instead of shipping them.
const PLATFORM_LIBRARIES: &[&str] = &[
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "librt.so.1",
    "libpthread.so.0",
    "ld-linux-x86-64.so.2",
    "ld-linux-aarch64.so.1",
    "libgcc_s.so.1",
    "libstdc++.so.6",
    "libgomp.so.1",
    "libvulkan.so.1",
    "libOpenCL.so.1",
    "libcuda.so.1",
];

/// The sonames an ELF file asks the dynamic loader for (`DT_NEEDED`).
fn needed_libraries(path: &Path) -> Result<Vec<String>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !bytes.starts_with(b"\x7fELF") {
        return Ok(Vec::new());
    }
    let elf = goblin::elf::Elf::parse(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(elf.libraries.iter().map(|l| l.to_string()).collect())
}

/// Where this system's dynamic loader finds `soname` (`ldconfig -p`).
fn system_library(soname: &str) -> Option<PathBuf> {
    let out = Command::new("/sbin/ldconfig").arg("-p").output().ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|line| {
        let (name, path) = line.trim().split_once(" => ")?;
        (name.split_whitespace().next() == Some(soname)).then(|| PathBuf::from(path))
    })
}

/// Every (bundled file, soname) whose library is neither in the bundle
/// (`lib/`, `plugins/`) nor a [`PLATFORM_LIBRARIES`] entry.
fn unshipped_libraries(bundle: &Path) -> Result<Vec<(PathBuf, String)>, String> {
    let mut found = Vec::new();
    for path in bundle_files(bundle)? {
        for soname in needed_libraries(&path)? {
            let shipped = bundle.join("lib").join(&soname).exists() || bundle.join("plugins").join(&soname).exists();
            if !shipped && !PLATFORM_LIBRARIES.contains(&soname.as_str()) {
                found.push((path.clone(), soname));
            }
        }
    }
    Ok(found)
}

/// Copies into `lib/` every shared library a bundled file needs that is
/// neither in the bundle nor a [`PLATFORM_LIBRARIES`] entry (libsoxr for
/// Chatterbox's cloning), with what it needs in turn, and its Debian
/// copyright file into `licenses/` (libsoxr is LGPL-2.1: shipped as the
/// shared library it is, a user may replace it).
fn bundle_shared_dependencies(bundle: &Path) -> Result<(), String> {
    let lib = bundle.join("lib");
    loop {
        let mut missing: Vec<String> = unshipped_libraries(bundle)?.into_iter().map(|(_, soname)| soname).collect();
        missing.sort();
        missing.dedup();
        if missing.is_empty() {
            return Ok(());
        }
        for soname in &missing {
            let found = system_library(soname).ok_or_else(|| format!("bundle: a bundled file needs {soname}, which this system does not have"))?;
            std::fs::copy(&found, lib.join(soname)).map_err(|e| format!("{}: {e}", found.display()))?;
            let real = std::fs::canonicalize(&found).unwrap_or(found);
            let package = Command::new("dpkg-query").arg("-S").arg(&real).output().ok().filter(|o| o.status.success());
            let package = package.and_then(|o| String::from_utf8_lossy(&o.stdout).split(':').next().map(str::to_string));
            let copyright = package.map(|p| PathBuf::from(format!("/usr/share/doc/{p}/copyright"))).filter(|p| p.is_file());
            let copyright = copyright.ok_or_else(|| format!("bundle: no license file found for {soname} ({})", real.display()))?;
            let licenses = bundle.join("licenses");
            std::fs::create_dir_all(&licenses).map_err(|e| e.to_string())?;
            std::fs::copy(&copyright, licenses.join(format!("{soname}.copyright"))).map_err(|e| format!("{}: {e}", copyright.display()))?;
            eprintln!("bundle: shipping {soname} from {} (license: licenses/{soname}.copyright)", real.display());
        }
    }
}

/// Every library a bundled ELF file needs is in the bundle or a platform
/// library: a bundle copied to a bare system loads.
fn check_needed_libraries(bundle: &Path) -> Result<(), String> {
    let bad: Vec<String> = unshipped_libraries(bundle)?
        .into_iter()
        .map(|(path, soname)| format!("{} needs {soname}", path.strip_prefix(bundle).unwrap_or(&path).display()))
        .collect();
    if !bad.is_empty() {
        return Err(format!("bundle: libraries neither shipped nor provided by the platform:\n{}", bad.join("\n")));
    }
    eprintln!("bundle check: every needed library is shipped or a platform library");
    Ok(())
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
    let mut options = ggml_build_support::CmakeOptions::default().define(&format!("GGML_{}", backend.to_uppercase()), "ON");
    let switches = ModuleSwitches::read(&root().join("backends").join(&backend).join("module.toml"))?;
    for (k, v) in &switches.cmake {
        options = options.define(k, v);
    }
    // Single-quoted for the shell: the run paths hold `$ORIGIN` and `;`.
    let quote =
        |defines: &[(String, String)]| -> String { defines.iter().map(|(k, v)| format!("'-D{k}={}'", v.replace('\'', "'\\''"))).collect::<Vec<_>>().join(" ") };
    let defines = quote(&options.defines);
    let cases: String = switches.targets.iter().map(|(name, defs)| format!("  {name}) shift; target=({});;\n", quote(defs))).collect();
    let names: Vec<&str> = switches.targets.iter().map(|(n, _)| n.as_str()).collect();
    let default_target = match switches.targets.first() {
        Some((_, defs)) => format!("  *) target=({});;\n", quote(defs)),
        None => "  *) target=();;\n".into(),
    };
    let toolchain = switches.toolchain.as_deref().unwrap_or("cmake, ninja and the backend's toolchain");
    let host_check = match &switches.host_os {
        Some(os) => format!(
            "if [ \"$(uname -s)\" != {os} ]; then\n  echo \"build.sh: the {backend} module builds on {os} (uname -s), not $(uname -s); needs {toolchain}\" >&2\n  exit 1\nfi\n"
        ),
        None => String::new(),
    };
    let script = format!(
        r#"#!/usr/bin/env bash
# Builds lib{module}.so from the pinned ggml tree in src/ (this plugin's patches
# applied) and stamps it for the tts `{backend}` plugin. Needs {toolchain}; no Rust.
# Usage: bash build.sh [TARGET] [CMAKE ARGS...],
# TARGET one of: {targets} (backends/{backend}/module.toml; default: the first listed).
# Output: out/lib{module}.so and out/lib{module}.so.stamp.json, to put beside
# libtts_backend_{backend}.so.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
{host_check}case "${{1:-}}" in
{cases}{default_target}esac
jobs=$(nproc 2>/dev/null || sysctl -n hw.ncpu)
cmake -G Ninja -S "$here/src" -B "$here/build" {defines} ${{target[@]+"${{target[@]}}"}} "$@"
cmake --build "$here/build" --target {module} -j "$jobs"
mkdir -p "$here/out"
cp "$here/build/bin/lib{module}.so" "$here/out/"
sha=$( (sha256sum "$here/out/lib{module}.so" 2>/dev/null || shasum -a 256 "$here/out/lib{module}.so") | cut -d' ' -f1)
sed "s/@MODULE_SHA256@/$sha/" "$here/stamp.json.in" > "$here/out/lib{module}.so.stamp.json"
echo "built $here/out/lib{module}.so"
"#,
        targets = if names.is_empty() { "none".to_string() } else { names.join(", ") },
    );
    std::fs::write(out.join("build.sh"), script).map_err(|e| e.to_string())?;
    eprintln!("module kit: {} (run build.sh where the module is to be built)", out.display());
    Ok(out)
}

/// A backend's module build switches (`backends/<name>/module.toml`): CMake
/// defines for every build, and named targets that add their own, the
/// `default_target` first.
#[derive(Default)]
struct ModuleSwitches {
    cmake: Vec<(String, String)>,
    targets: Vec<(String, Vec<(String, String)>)>,
    /// `uname -s` of the only host the module builds on (Metal: Darwin).
    host_os: Option<String>,
    /// What the build needs, for the script's header and its host check.
    toolchain: Option<String>,
}

impl ModuleSwitches {
    fn read(path: &Path) -> Result<Self, String> {
        let Ok(text) = std::fs::read_to_string(path) else {
            return Ok(Self::default());
        };
        let doc: toml::Table = text.parse().map_err(|e| format!("{}: {e}", path.display()))?;
        let defines = |v: &toml::Value, what: &str| -> Result<Vec<(String, String)>, String> {
            let table = v.as_table().ok_or_else(|| format!("{}: `{what}` must be a table", path.display()))?;
            table
                .iter()
                .map(|(k, v)| match v.as_str() {
                    Some(s) if k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') => Ok((k.clone(), s.to_string())),
                    _ => Err(format!("{}: `{what}.{k}` must be a CMake variable name with a string value", path.display())),
                })
                .collect()
        };
        let mut switches = Self::default();
        for (key, value) in &doc {
            match key.as_str() {
                "cmake" => switches.cmake = defines(value, "cmake")?,
                "targets" => {
                    let targets = value.as_table().ok_or_else(|| format!("{}: `targets` must be a table", path.display()))?;
                    for (name, defs) in targets {
                        if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                            return Err(format!("{}: target name `{name}` must be letters, digits, - or _", path.display()));
                        }
                        switches.targets.push((name.clone(), defines(defs, &format!("targets.{name}"))?));
                    }
                }
                "default_target" => {}
                "host_os" | "toolchain" => {
                    let text = value.as_str().ok_or_else(|| format!("{}: `{key}` must be a string", path.display()))?;
                    if key == "host_os" && !text.chars().all(|c| c.is_ascii_alphanumeric()) {
                        return Err(format!("{}: `host_os` must be a `uname -s` name (letters and digits)", path.display()));
                    }
                    if text.contains(['"', '`', '$', '\\', '\n']) {
                        return Err(format!("{}: `{key}` may not hold quotes, backquotes, $, backslashes or newlines", path.display()));
                    }
                    let slot = if key == "host_os" { &mut switches.host_os } else { &mut switches.toolchain };
                    *slot = Some(text.to_string());
                }
                other => return Err(format!("{}: unknown key `{other}` (expected default_target, cmake, targets, host_os, toolchain)", path.display())),
            }
        }
        if let Some(default) = doc.get("default_target") {
            let name = default.as_str().ok_or_else(|| format!("{}: `default_target` must be a string", path.display()))?;
            let i = switches
                .targets
                .iter()
                .position(|(n, _)| n == name)
                .ok_or_else(|| format!("{}: default_target `{name}` is not under [targets]", path.display()))?;
            let first = switches.targets.remove(i);
            switches.targets.insert(0, first);
        }
        Ok(switches)
    }
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

/// Fuzz targets and extra seeds (files of the repository) for each.
const FUZZ_TARGETS: &[(&str, &[&str])] = &[
    ("gguf", &["tests/fixtures/chatterbox/turbo-tiny/bad/s3gen-standard-meta.gguf", "tests/fixtures/chatterbox/mtl-tiny/bad/t3-mtl-turbo-tokenizer.gguf"]),
    ("supertonic_model", &["tests/fixtures/supertonic/tiny-v2/model.gguf", "tests/fixtures/supertonic/tiny-v3/model.gguf"]),
    (
        "chatterbox_model",
        &[
            "tests/fixtures/chatterbox/turbo-tiny/t3-turbo.gguf",
            "tests/fixtures/chatterbox/turbo-tiny/s3gen-meanflow.gguf",
            "tests/fixtures/chatterbox/mtl-tiny/t3-mtl.gguf",
            "tests/fixtures/chatterbox/mtl-tiny/s3gen.gguf",
        ],
    ),
    ("profile", &["profiles/ci.toml", "profiles/default.toml", "profiles/mtl.toml", "profiles/supertonic.toml", "profiles/turbo.toml"]),
    ("supertonic_text", &[]),
    ("chatterbox_text", &[]),
    ("audio_input", &[]),
    ("voice_file", &[]),
    ("supertonic_style", &[]),
    ("server_request", &[]),
];

fn host_triple() -> Result<String, String> {
    let out = Command::new("rustc").arg("-vV").output().map_err(|e| format!("rustc -vV: {e}"))?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| l.strip_prefix("host: ").map(str::to_string)).ok_or_else(|| "rustc -vV names no host".into())
}

fn fuzz(args: &[String]) -> Result<(), String> {
    let (mut seconds, mut runs, mut targets) = (60u64, 0u64, Vec::new());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut number = |what: &str| -> Result<u64, String> { it.next().and_then(|v| v.parse().ok()).ok_or(format!("{what} needs a number")) };
        match a.as_str() {
            "--seconds" => seconds = number("--seconds")?,
            "--runs" => runs = number("--runs")?,
            t if FUZZ_TARGETS.iter().any(|(n, _)| *n == t) => targets.push(t.to_string()),
            other => {
                return Err(format!(
                    "fuzz: unknown target or option {other} (targets: {})",
                    FUZZ_TARGETS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                ))
            }
        }
    }
    if targets.is_empty() {
        targets = FUZZ_TARGETS.iter().map(|(n, _)| n.to_string()).collect();
    }
    if cargo().args(["fuzz", "--version"]).output().map(|o| !o.status.success()).unwrap_or(true) {
        run(cargo().args(["install", "cargo-fuzz", "--version", "0.13.2", "--locked"]))?;
    }
    // Stable toolchain: coverage instrumentation without a sanitizer.
    run(cargo().args(["fuzz", "build", "--sanitizer", "none", "--release"]))?;
    let bin_dir = root().join("fuzz/target").join(host_triple()?).join("release");
    let work = root().join("target/fuzz");
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for target in &targets {
        let extra = FUZZ_TARGETS.iter().find(|(n, _)| n == target).map(|(_, e)| *e).unwrap_or(&[]);
        let corpus = work.join("corpus").join(target);
        let artifacts = work.join("artifacts").join(target);
        std::fs::create_dir_all(&corpus).map_err(|e| e.to_string())?;
        let _ = std::fs::remove_dir_all(&artifacts);
        std::fs::create_dir_all(&artifacts).map_err(|e| e.to_string())?;
        let seeds = root().join("fuzz/seeds").join(target);
        let mut seed_files: Vec<PathBuf> = std::fs::read_dir(&seeds).map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect()).unwrap_or_default();
        seed_files.extend(extra.iter().map(|p| root().join(p)));
        let mut max_len = 4096u64;
        for seed in &seed_files {
            let name = seed.file_name().ok_or("seed without a name")?;
            std::fs::copy(seed, corpus.join(name)).map_err(|e| format!("{}: {e}", seed.display()))?;
            max_len = max_len.max(std::fs::metadata(seed).map(|m| m.len()).unwrap_or(0) + 4096);
        }
        let mut cmd = Command::new(bin_dir.join(target));
        cmd.arg(&corpus)
            .arg(format!("-max_total_time={seconds}"))
            .arg(format!("-max_len={max_len}"))
            .arg("-rss_limit_mb=2048")
            .arg("-timeout=10")
            .arg("-print_final_stats=1")
            .arg(format!("-artifact_prefix={}/", artifacts.display()))
            .env("LD_LIBRARY_PATH", &bin_dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        if runs > 0 {
            cmd.arg(format!("-runs={runs}"));
        }
        eprintln!("+ fuzz {target}: {seconds} s{} from {} seeds", if runs > 0 { format!(" or {runs} runs") } else { String::new() }, seed_files.len());
        let started = std::time::Instant::now();
        let out = cmd.output().map_err(|e| format!("{}: {e}", bin_dir.join(target).display()))?;
        let time = started.elapsed().as_secs();
        let log = String::from_utf8_lossy(&out.stderr);
        let stat = |key: &str| log.lines().find_map(|l| l.strip_prefix(key).and_then(|v| v.trim().parse::<u64>().ok())).unwrap_or(0);
        let execs = stat("stat::number_of_executed_units:");
        let found: Vec<String> = std::fs::read_dir(&artifacts)
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().to_string())).collect())
            .unwrap_or_default();
        let corpus_size = std::fs::read_dir(&corpus).map(|rd| rd.count()).unwrap_or(0);
        rows.push(format!(
            "{target:18} {execs:>12} executions {time:>6} s {:>8} exec/s  corpus {corpus_size:>6}  peak RSS {} MiB  findings {}",
            execs / time.max(1),
            stat("stat::peak_rss_mb:"),
            found.len()
        ));
        if !out.status.success() || !found.is_empty() {
            let tail: Vec<&str> = log.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect();
            eprintln!("{}", tail.join("\n"));
            failed.push(format!("{target}: {} (in {})", if found.is_empty() { format!("exit {}", out.status) } else { found.join(", ") }, artifacts.display()));
        }
    }
    println!("fuzz summary ({}):", bin_dir.display());
    for r in &rows {
        println!("  {r}");
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("fuzzing found problems: {}", failed.join("; ")))
    }
}

fn soak(args: &[String]) -> Result<(), String> {
    let runs = match args {
        [] => 200,
        [flag, n] if flag == "--runs" => n.parse::<usize>().map_err(|_| format!("--runs {n}: not a number"))?,
        _ => return Err("usage: cargo xtask soak [--runs N]".into()),
    };
    build_all(true)?;
    let tts = root().join("target/release/tts");
    let work = root().join("target/soak");
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let fixtures = root().join("tests/fixtures");
    let families: [(&str, Vec<PathBuf>, &str, &[&str]); 2] = [
        ("supertonic", vec![fixtures.join("supertonic/tiny-v2/model.gguf")], "The quick brown fox jumps over the lazy dog.", &[]),
        (
            "chatterbox",
            vec![fixtures.join("chatterbox/turbo-tiny/t3-turbo.gguf"), fixtures.join("chatterbox/turbo-tiny/s3gen-meanflow.gguf")],
            "Hello there. How are you today?",
            &["max_new_tokens=40"],
        ),
    ];
    let mut failures = Vec::new();
    for (family, files, text, sets) in &families {
        for backend in ["cpu", "vulkan"] {
            let files: Vec<String> = files.iter().map(|f| format!("\"{}\"", f.display())).collect();
            let profile = work.join(format!("{family}-{backend}.toml"));
            let body = format!(
                "[backend]\nprefer = [\"{backend}\"]\nfallback = false\n[backends.cpu]\nthreads = 1\n[backends.vulkan]\nallow_software = true\npipeline_cache_dir = \"{}\"\n[model]\nfiles = [{}]\n",
                work.join("vulkan-cache").display(),
                files.join(", ")
            );
            std::fs::write(&profile, body).map_err(|e| e.to_string())?;
            let mut cmd = bundled(&tts);
            cmd.arg("soak").arg("--profile").arg(&profile).args(["--text", text, "--runs", &runs.to_string()]);
            for s in *sets {
                cmd.args(["--set", s]);
            }
            eprintln!("+ tts soak: {family} on {backend}, {runs} runs");
            let out = cmd.output().map_err(|e| e.to_string())?;
            print!("{}", String::from_utf8_lossy(&out.stdout));
            if !out.status.success() {
                failures.push(format!("{family} on {backend}: {}", String::from_utf8_lossy(&out.stderr).trim()));
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// The notices of the codecs compiled into `tts` are found for the
    /// versions Cargo.lock pins, and are the licences docs/licenses.md names.
    #[test]
    fn static_codec_notices_are_bundled() {
        let bundle = tempfile::tempdir().unwrap();
        super::bundle_static_codec_notices(bundle.path()).unwrap();
        let read = |name: &str| std::fs::read_to_string(bundle.path().join("licenses").join(name)).unwrap();
        assert!(read("libopus.COPYING").contains("Redistribution and use in source and binary forms"));
        assert!(read("fdk-aac.NOTICE").starts_with("Software License for The Fraunhofer FDK AAC Codec Library"));
        let sources: Vec<String> =
            std::fs::read_dir(bundle.path().join("licenses")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
        let fdk = sources.iter().find(|n| n.starts_with("fdk-aac-sys-") && n.ends_with(".crate.tar.gz")).expect("FDK AAC's source comes along");
        let archive = std::fs::read(bundle.path().join("licenses").join(fdk)).unwrap();
        assert_eq!(&archive[..2], &[0x1f, 0x8b], "a gzip archive");
    }

    /// The run-path rule on synthetic cases: the host at the bundle's top may
    /// not reach `../lib` (the probe planted a libgcc_s.so.1 there), a plugin
    /// one directory down may; nothing may be empty or absolute.
    #[test]
    fn run_paths_must_stay_inside_the_bundle() {
        let problems = |rel: &str, value: &str| super::run_path_problems(Path::new(rel), value);
        assert!(problems("tts", "$ORIGIN:$ORIGIN/lib").is_empty());
        assert_eq!(problems("tts", "$ORIGIN:$ORIGIN/lib:$ORIGIN/../lib"), ["entry \"$ORIGIN/../lib\" leads outside the bundle"]);
        assert!(problems("plugins/libtts_backend_cpu.so", "$ORIGIN:$ORIGIN/lib:$ORIGIN/../lib").is_empty());
        assert!(problems("lib/libggml.so.0", "${ORIGIN}:${ORIGIN}/../lib").is_empty());
        assert_eq!(problems("plugins/x.so", "$ORIGIN/../../lib").len(), 1);
        assert_eq!(problems("plugins/x.so", "$ORIGIN/./lib/../../..").len(), 1);
        assert_eq!(problems("tts", "$ORIGIN/lib/../lib").len(), 0);
        assert_eq!(problems("tts", ":$ORIGIN"), ["entry \"\" is not $ORIGIN-relative"]);
        assert_eq!(problems("tts", "/usr/lib:$ORIGINAL"), ["entry \"/usr/lib\" is not $ORIGIN-relative", "entry \"$ORIGINAL\" is not $ORIGIN-relative"]);
    }

    /// The dist step rewrites an escaping run path in place, and the check
    /// then passes; on the unrewritten copy the check fails. The ELF file is
    /// this test's own executable, linked with the workspace's run path.
    #[test]
    fn dist_confines_the_host_binary_and_the_check_sees_it() {
        let exe = std::env::current_exe().unwrap();
        let bytes = std::fs::read(&exe).unwrap();
        let strings = super::run_path_strings(&bytes).unwrap();
        assert!(strings.iter().any(|(_, _, v)| v.contains("$ORIGIN/../lib")), "{strings:?}");
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(&exe, dir.path().join("tts")).unwrap();
        let e = super::check_run_paths(dir.path()).unwrap_err();
        assert!(e.contains("entry \"$ORIGIN/../lib\" leads outside the bundle"), "{e}");
        super::confine_run_paths(dir.path()).unwrap();
        super::check_run_paths(dir.path()).unwrap();
        let after = super::run_path_strings(&std::fs::read(dir.path().join("tts")).unwrap()).unwrap();
        assert_eq!(after.iter().map(|(_, _, v)| v.as_str()).collect::<Vec<_>>(), ["$ORIGIN:$ORIGIN/lib"]);
        // One directory down the same file keeps its ../lib.
        std::fs::create_dir(dir.path().join("plugins")).unwrap();
        std::fs::copy(&exe, dir.path().join("plugins/x")).unwrap();
        super::confine_run_paths(dir.path()).unwrap();
        let kept = super::run_path_strings(&std::fs::read(dir.path().join("plugins/x")).unwrap()).unwrap();
        assert!(kept.iter().any(|(_, _, v)| v == "$ORIGIN:$ORIGIN/lib:$ORIGIN/../lib"), "{kept:?}");
    }
    /// The Metal kit: its patches applied to the pinned tree, a build.sh that
    /// names the macOS steps and, run anywhere else, stops at once saying so.
    #[test]
    fn the_metal_kit_builds_on_a_mac_from_the_patched_tree() {
        let dir = tempfile::tempdir().unwrap();
        let kit = super::module_kit(&["metal".into(), "--out".into(), dir.path().join("kit").display().to_string()]).unwrap();
        let script = std::fs::read_to_string(kit.join("build.sh")).unwrap();
        for needed in [
            "Needs macOS 13 or later with the Xcode command-line tools (xcode-select --install), CMake and Ninja (brew install cmake ninja)",
            "if [ \"$(uname -s)\" != Darwin ]; then",
            "'-DGGML_METAL=ON'",
            "'-DGGML_METAL_EMBED_LIBRARY=ON'",
            "'-DCMAKE_OSX_DEPLOYMENT_TARGET=13.0'",
            "--target ggml-metal",
        ] {
            assert!(script.contains(needed), "build.sh lacks {needed:?}:\n{script}");
        }
        let mul_mv = std::fs::read_to_string(kit.join("src/src/ggml-metal/kernels/mul_mv.metal")).unwrap();
        assert!(mul_mv.contains("kernel_mul_mv_f32_f16_short"), "patch 0001 applied");
        assert!(std::fs::read_to_string(kit.join("stamp.json.in")).unwrap().contains("libggml-metal.so"));
        if !cfg!(target_os = "macos") {
            let o = std::process::Command::new("bash").arg(kit.join("build.sh")).output().unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(!o.status.success() && err.starts_with("build.sh: the metal module builds on Darwin (uname -s), not "), "{err}");
            assert_eq!(err.lines().count(), 1, "{err}");
        }
    }
}
