//! Helpers shared by the build scripts of `ggml-sys` and of every backend plugin.
//!
//! All of them build from one pinned ggml tree (the `llama.cpp/ggml` subtree of the
//! registry package named below), so every module in a process agrees with the one
//! shared `libggml-base`. A backend plugin may patch only its own backend directory;
//! [`prepare_source`] enforces that, which is what keeps the shared base identical.

use sha2::{Digest, Sha256};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

pub mod vulkan_toolchain;

/// Registry package that carries the pinned ggml tree.
pub const PINNED_CRATE: &str = "llama-cpp-sys-2";
/// Exact version pinned in this crate's Cargo.toml.
pub const PINNED_VERSION: &str = "0.1.161";
/// Environment variable that points at a ggml source directory (offline packagers).
pub const SOURCE_DIR_ENV: &str = "TTS_GGML_SOURCE_DIR";

type Result<T> = std::result::Result<T, String>;

/// Finds the pristine ggml directory: `$TTS_GGML_SOURCE_DIR`, else the unpacked
/// registry package, else its cached `.crate` archive (unpacked into `scratch`),
/// else after running `cargo fetch` on the workspace.
pub fn locate_source(scratch: &Path) -> Result<PathBuf> {
    cargo_directive(&format!("rerun-if-env-changed={SOURCE_DIR_ENV}"));
    if let Ok(dir) = std::env::var(SOURCE_DIR_ENV) {
        let dir = PathBuf::from(dir);
        return if dir.join("CMakeLists.txt").is_file() && dir.join("include/ggml.h").is_file() {
            Ok(dir)
        } else {
            Err(format!("{SOURCE_DIR_ENV}={} is not a ggml source directory", dir.display()))
        };
    }
    crate_in_registry(PINNED_CRATE, PINNED_VERSION, scratch)
        .map(|dir| dir.join("llama.cpp/ggml"))
        .map_err(|e| format!("{e}; set {SOURCE_DIR_ENV} to a ggml source directory"))
}

/// The unpacked source of registry package `name`-`version` (pinned, never
/// compiled, in this crate's `cfg(any())` dependencies): cargo's unpacked copy,
/// else its cached `.crate` archive unpacked into `scratch`, else after running
/// `cargo fetch` on the workspace.
pub fn crate_in_registry(name: &str, version: &str, scratch: &Path) -> Result<PathBuf> {
    let dir_name = format!("{name}-{version}");
    if let Some(dir) = find_in_registry(&dir_name) {
        return Ok(dir);
    }
    if let Some(dir) = unpack_cached_crate(&dir_name, scratch)? {
        return Ok(dir);
    }
    fetch_workspace()?;
    find_in_registry(&dir_name).ok_or_else(|| format!("pinned source {dir_name} not found after `cargo fetch`"))
}

/// Prints a `cargo:` directive when running as a build script (not from xtask).
fn cargo_directive(text: &str) {
    if std::env::var_os("OUT_DIR").is_some() {
        println!("cargo:{text}");
    }
}

fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cargo"))
}

fn find_in_registry(dir_name: &str) -> Option<PathBuf> {
    let src = cargo_home().join("registry/src");
    read_dir_sorted(&src).into_iter().map(|index| index.join(dir_name)).find(|dir| dir.join("Cargo.toml").is_file())
}

fn unpack_cached_crate(dir_name: &str, scratch: &Path) -> Result<Option<PathBuf>> {
    let cache = cargo_home().join("registry/cache");
    for index in read_dir_sorted(&cache) {
        let archive = index.join(format!("{dir_name}.crate"));
        if archive.is_file() {
            let file = fs::File::open(&archive).map_err(|e| format!("{}: {e}", archive.display()))?;
            tar::Archive::new(flate2::read::GzDecoder::new(file)).unpack(scratch).map_err(|e| format!("unpacking {}: {e}", archive.display()))?;
            return Ok(Some(scratch.join(dir_name)));
        }
    }
    Ok(None)
}

fn fetch_workspace() -> Result<()> {
    // Outside a build script (xtask) there is no manifest dir; the caller fetched.
    let Ok(manifest_dir) = std::env::var("CARGO_MANIFEST_DIR").map(PathBuf::from) else {
        return Ok(());
    };
    let Some(root) = manifest_dir.ancestors().find(|d| d.join("Cargo.lock").is_file()) else {
        return Ok(());
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status =
        Command::new(cargo).args(["fetch", "--manifest-path"]).arg(root.join("Cargo.toml")).status().map_err(|e| format!("running cargo fetch: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("cargo fetch failed ({status}); run it once by hand"))
    }
}

fn read_dir_sorted(dir: &Path) -> Vec<PathBuf> {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir).map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect()).unwrap_or_default();
    entries.sort();
    entries
}

/// The files that make up `libggml-base` and `libggml` (the registry/loader).
/// Their hash identifies the pinned source a module was built from.
fn base_files(src: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in [src.join("include"), src.join("src")] {
        for path in read_dir_sorted(&dir) {
            let is_source = matches!(path.extension().and_then(|e| e.to_str()), Some("h" | "c" | "cpp"));
            if path.is_file() && is_source {
                files.push(path);
            }
        }
    }
    files
}

/// Hex SHA-256 over the relative names and contents of the base files.
pub fn source_fingerprint(src: &Path) -> Result<String> {
    let mut hasher = Sha256::new();
    for path in base_files(src) {
        let rel = path.strip_prefix(src).unwrap_or(&path);
        hasher.update(rel.to_string_lossy().as_bytes());
        hasher.update([0]);
        hasher.update(fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?);
    }
    Ok(hex::encode(hasher.finalize()))
}

/// Hex SHA-256 over a patch series, in application order.
pub fn patches_fingerprint(patches: &[PathBuf]) -> Result<String> {
    let mut hasher = Sha256::new();
    for patch in patches {
        hasher.update(fs::read(patch).map_err(|e| format!("{}: {e}", patch.display()))?);
    }
    Ok(hex::encode(hasher.finalize()))
}

/// The `*.patch` files of a directory, sorted by name (the series order).
pub fn patch_series(dir: &Path) -> Vec<PathBuf> {
    cargo_directive(&format!("rerun-if-changed={}", dir.display()));
    read_dir_sorted(dir).into_iter().filter(|p| p.extension().is_some_and(|e| e == "patch")).collect()
}

/// Copies the pristine tree to `dest` (fresh), adds the `ggml.pc.in` the registry
/// package omits, and applies `patches` in order. Each patch may touch only paths
/// under `allowed_dir` (e.g. `src/ggml-vulkan/`).
pub fn prepare_source(pristine: &Path, dest: &Path, patches: &[PathBuf], allowed_dir: &str) -> Result<()> {
    if dest.exists() {
        fs::remove_dir_all(dest).map_err(|e| format!("{}: {e}", dest.display()))?;
    }
    copy_tree(pristine, dest).map_err(|e| format!("copying ggml source to {}: {e}", dest.display()))?;
    let pc_in = dest.join("ggml.pc.in");
    if !pc_in.exists() {
        fs::write(&pc_in, "").map_err(|e| e.to_string())?;
    }
    for patch in patches {
        let text = fs::read_to_string(patch).map_err(|e| format!("{}: {e}", patch.display()))?;
        for line in text.lines().filter(|l| l.starts_with("+++ ") || l.starts_with("--- ")) {
            let path = line[4..].split('\t').next().unwrap_or("").trim();
            let rel = path.strip_prefix("a/").or_else(|| path.strip_prefix("b/")).unwrap_or(path);
            if rel != "/dev/null" && !rel.starts_with(allowed_dir) {
                return Err(format!(
                    "{}: touches {rel}; a backend patch may only change {allowed_dir} \
                     (the shared libggml-base must stay identical across plugins)",
                    patch.display()
                ));
            }
        }
        let out = Command::new("patch")
            .args(["-p1", "--batch", "--forward", "--silent", "-i"])
            .arg(patch)
            .current_dir(dest)
            .output()
            .map_err(|e| format!("running patch (install the `patch` package): {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{} does not apply to {PINNED_CRATE}-{PINNED_VERSION}: {}{}",
                patch.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    fs::create_dir_all(to)?;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// CMake cache options for one ggml build (configured and built with Ninja).
#[derive(Clone, Debug)]
pub struct CmakeOptions {
    pub defines: Vec<(String, String)>,
}

impl Default for CmakeOptions {
    /// The options every build in this project shares: shared libs, DL backends,
    /// no backend unless asked for, no tests or examples.
    fn default() -> Self {
        let defines = [
            ("CMAKE_BUILD_TYPE", "Release"),
            ("BUILD_SHARED_LIBS", "ON"),
            ("GGML_BACKEND_DL", "ON"),
            ("GGML_CPU", "OFF"),
            // ggml refuses GGML_NATIVE with DL modules; ISA switches are explicit.
            ("GGML_NATIVE", "OFF"),
            // ggml stamps itself with `git rev-parse HEAD` of whatever repository
            // encloses the source copy (ours, under target/): a no-op "git" keeps the
            // build independent of this project's commits ("ggml commit: unknown").
            ("GIT_EXE", "true"),
            ("GGML_BUILD_TESTS", "OFF"),
            ("GGML_BUILD_EXAMPLES", "OFF"),
            ("GGML_CCACHE", "OFF"),
            // Run paths relative to the library itself, never the build tree:
            // beside it (a development tree) or in ../lib (a bundle's plugins/).
            // A build path, or an empty entry (read as the working directory),
            // would let a library planted there be loaded.
            ("CMAKE_BUILD_WITH_INSTALL_RPATH", "ON"),
            ("CMAKE_INSTALL_RPATH", "$ORIGIN;$ORIGIN/../lib"),
        ];
        CmakeOptions { defines: defines.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() }
    }
}

impl CmakeOptions {
    pub fn define(mut self, key: &str, value: &str) -> Self {
        self.defines.retain(|(k, _)| k != key);
        self.defines.push((key.to_string(), value.to_string()));
        self
    }

    fn configure_and_build(&self, source: &Path, build_dir: &Path, targets: &[&str]) -> Result<()> {
        fs::create_dir_all(build_dir).map_err(|e| e.to_string())?;
        let mut configure = Command::new("cmake");
        configure.arg("-G").arg("Ninja").arg("-S").arg(source).arg("-B").arg(build_dir);
        for (k, v) in &self.defines {
            configure.arg(format!("-D{k}={v}"));
        }
        run(&mut configure, "cmake configure")?;
        let jobs = std::env::var("NUM_JOBS").unwrap_or_else(|_| "2".into());
        let mut build = Command::new("cmake");
        build.arg("--build").arg(build_dir).args(["-j", &jobs]);
        for t in targets {
            build.args(["--target", t]);
        }
        run(&mut build, "cmake build")
    }
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd.output().map_err(|e| format!("{what}: cannot run cmake (install cmake and ninja-build): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let tail: String = stdout.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
        Err(format!("{what} failed:\n{tail}\n{stderr}"))
    }
}

/// `target/<profile>` for the crate being built, where cargo puts cdylibs and binaries.
/// Build outputs that must sit next to them (shared libs, backend modules) go there too.
pub fn artifact_dir() -> Result<PathBuf> {
    let out = PathBuf::from(std::env::var("OUT_DIR").map_err(|e| e.to_string())?);
    // OUT_DIR = <target>/<profile>/build/<pkg>-<hash>/out
    out.ancestors().nth(3).map(Path::to_path_buf).ok_or_else(|| format!("unexpected OUT_DIR layout: {}", out.display()))
}

/// Copies `file` into `dir` under its own name (see [`copy_as`]).
pub fn copy_into(file: &Path, dir: &Path) -> Result<PathBuf> {
    let dest = dir.join(file.file_name().ok_or("no file name")?);
    copy_as(file, &dest)?;
    Ok(dest)
}

/// Copies `from` to `to` through a temporary sibling and a rename, so a process
/// that loads `to` (a test, a running `tts`) never sees a half-written library.
/// The copy keeps `from`'s modification time, so a build script that watches
/// the files it placed (`rerun-if-changed`) sees its own copy as unchanged and
/// another build's copy over it as a change.
pub fn copy_as(from: &Path, to: &Path) -> Result<()> {
    let dir = to.parent().ok_or("no parent directory")?;
    fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let tmp = dir.join(format!(".{}.tmp", to.file_name().ok_or("no file name")?.to_string_lossy()));
    fs::copy(from, &tmp).map_err(|e| format!("copy {}: {e}", from.display()))?;
    let modified = fs::metadata(from).and_then(|m| m.modified()).map_err(|e| format!("{}: {e}", from.display()))?;
    fs::File::options().write(true).open(&tmp).and_then(|f| f.set_modified(modified)).map_err(|e| format!("{}: {e}", tmp.display()))?;
    fs::rename(&tmp, to).map_err(|e| e.to_string())
}

/// What a backend module was built from. Written beside the module as
/// `<module>.stamp.json`; a backend plugin refuses a module whose stamp differs
/// from what the plugin itself was built against.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ModuleStamp {
    pub ggml_version: String,
    pub source_package: String,
    pub source_fingerprint: String,
    pub patches_fingerprint: String,
    pub module_file: String,
    pub module_sha256: String,
}

pub fn file_sha256(path: &Path) -> Result<String> {
    let bytes = fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(hex::encode(Sha256::digest(bytes)))
}

/// Reads `GGML_VERSION_{MAJOR,MINOR,PATCH}` from the tree's CMakeLists.txt.
pub fn ggml_version(src: &Path) -> Result<String> {
    let text = fs::read_to_string(src.join("CMakeLists.txt")).map_err(|e| e.to_string())?;
    let part = |name: &str| -> Result<String> {
        let key = format!("set(GGML_VERSION_{name} ");
        text.lines()
            .find_map(|l| l.trim().strip_prefix(&key).map(|v| v.trim_end_matches(')').trim().to_string()))
            .ok_or_else(|| format!("GGML_VERSION_{name} not found in CMakeLists.txt"))
    };
    Ok(format!("{}.{}.{}", part("MAJOR")?, part("MINOR")?, part("PATCH")?))
}

/// A configured and built ggml tree, shared by every build-script run that asks
/// for the same source, patches, CMake options and targets.
pub struct CachedBuild {
    pub src: PathBuf,
    pub build: PathBuf,
}

/// Prepares (copy + patch) and builds a ggml tree under
/// `<target>/ggml-cache/<key>`, where the key hashes everything that affects the
/// result. Cargo re-runs build scripts whenever a dependency's features shift
/// between invocations; with this cache such a re-run costs a no-op ninja call
/// instead of a full ggml (or 4-minute Vulkan shader) rebuild. A file lock keeps
/// concurrent build scripts from building the same tree twice.
pub fn cached_build(pristine: &Path, patches: &[PathBuf], allowed_dir: &str, cmake: CmakeOptions, targets: &[&str]) -> Result<CachedBuild> {
    let mut key = Sha256::new();
    key.update(source_fingerprint(pristine)?);
    key.update(patches_fingerprint(patches)?);
    key.update(allowed_dir);
    for (k, v) in &cmake.defines {
        key.update(format!("{k}={v};"));
    }
    for t in targets {
        key.update(format!("target={t};"));
    }
    let key = hex::encode(key.finalize());
    let root = target_dir()?.join("ggml-cache").join(&key[..16]);
    fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
    let lock = fs::File::create(root.join(".lock")).map_err(|e| e.to_string())?;
    lock.lock().map_err(|e| format!("locking {}: {e}", root.display()))?;

    let src = root.join("src");
    let prepared = root.join(".prepared");
    if !prepared.is_file() {
        prepare_source(pristine, &src, patches, allowed_dir)?;
        fs::write(&prepared, "").map_err(|e| e.to_string())?;
    }
    let build = root.join("build");
    cmake.configure_and_build(&src, &build, targets)?;
    Ok(CachedBuild { src, build })
}

/// Where build tools made once for every profile are kept (`<target>/vulkan-toolchain`).
pub fn tool_cache() -> Result<PathBuf> {
    Ok(target_dir()?.join("vulkan-toolchain"))
}

/// Cargo's target directory (`<target>/<profile>/build/<pkg>-<hash>/out` → `<target>`).
fn target_dir() -> Result<PathBuf> {
    let out = PathBuf::from(std::env::var("OUT_DIR").map_err(|e| e.to_string())?);
    out.ancestors().nth(4).map(Path::to_path_buf).ok_or_else(|| format!("unexpected OUT_DIR layout: {}", out.display()))
}

/// Everything a backend plugin's build script does: patch, build the module(s),
/// stamp each, place them next to the plugin (removing stale ones of the same
/// family), and export to the plugin's code the stamp (`TTS_MODULE_STAMP`, JSON)
/// and the module family stem (`TTS_MODULE_STEM`, e.g. `libggml-cpu`): the plugin
/// loads `<stem>.so` or, for a multi-variant build, the best-scoring `<stem>-*.so`.
/// `targets` empty builds everything configured (e.g. all CPU variants).
pub fn build_backend_module(backend_dir: &str, targets: &[&str], extra_defines: &[(&str, &str)]) -> Result<Vec<PathBuf>> {
    let out = PathBuf::from(std::env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let pristine = locate_source(&out.join("registry"))?;
    let patches = patch_series(&manifest.join("patches"));
    let mut cmake = CmakeOptions::default();
    for (k, v) in extra_defines {
        cmake = cmake.define(k, v);
    }
    let built = cached_build(&pristine, &patches, &format!("src/{backend_dir}/"), cmake, targets)?;
    let stem = format!("lib{backend_dir}");
    let is_module = |name: &str| name == format!("{stem}.so") || (name.starts_with(&format!("{stem}-")) && name.ends_with(".so"));
    let modules: Vec<PathBuf> =
        read_dir_sorted(&built.build.join("bin")).into_iter().filter(|p| p.file_name().is_some_and(|n| is_module(&n.to_string_lossy()))).collect();
    if modules.is_empty() {
        return Err(format!("cmake produced no {stem}*.so in {}", built.build.join("bin").display()));
    }
    let artifacts = artifact_dir()?;
    // A module of this family left from a different build (native vs variants)
    // would compete for selection at run time.
    for stale in read_dir_sorted(&artifacts) {
        let name = stale.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
        let module_name = name.strip_suffix(".stamp.json").unwrap_or(&name);
        if is_module(module_name) && !modules.iter().any(|m| m.file_name().is_some_and(|f| f.to_string_lossy() == module_name)) {
            let _ = fs::remove_file(&stale);
        }
    }
    let template = stamp_template(&pristine, &patches)?;
    let mut placed = Vec::new();
    for module in &modules {
        let name = module.file_name().unwrap().to_string_lossy().to_string();
        let stamp = template.replace("@MODULE_FILE@", &name).replace("@MODULE_SHA256@", &file_sha256(module)?);
        let copy = copy_into(module, &artifacts)?;
        // Builds with other options (`TTS_VULKAN_SHADERS=basic`, say) place
        // their module at the same path; cargo keeps each build's script
        // output apart and would otherwise not run this script again when
        // switching back, leaving the other build's module beside this plugin.
        cargo_directive(&format!("rerun-if-changed={}", copy.display()));
        placed.push(copy);
        fs::write(artifacts.join(format!("{name}.stamp.json")), stamp).map_err(|e| e.to_string())?;
    }
    println!("cargo:rustc-env=TTS_MODULE_STAMP={template}");
    println!("cargo:rustc-env=TTS_MODULE_STEM={stem}");
    Ok(placed)
}

/// For a plugin whose module is built outside cargo (`cargo xtask module-kit`,
/// on a machine with the backend's toolchain): compiles in the stamp that
/// module must carry, from the same pinned source and this plugin's patches,
/// and builds nothing. A module from another source or patch series is then
/// refused at load with a reason.
pub fn declare_external_module(backend_dir: &str) -> Result<()> {
    let out = PathBuf::from(std::env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let pristine = locate_source(&out.join("registry"))?;
    let patches_dir = manifest.join("patches");
    println!("cargo:rerun-if-changed={}", patches_dir.display());
    let template = stamp_template(&pristine, &patch_series(&patches_dir))?;
    println!("cargo:rustc-env=TTS_MODULE_STAMP={template}");
    println!("cargo:rustc-env=TTS_MODULE_STEM=lib{backend_dir}");
    Ok(())
}

/// The stamp a module built from `pristine` + `patches` must carry, with the
/// module's own file name and hash left as `@MODULE_FILE@` / `@MODULE_SHA256@`
/// for a build script outside cargo to fill in.
pub fn stamp_template(pristine: &Path, patches: &[PathBuf]) -> Result<String> {
    let stamp = ModuleStamp {
        ggml_version: ggml_version(pristine)?,
        source_package: format!("{PINNED_CRATE}-{PINNED_VERSION}"),
        source_fingerprint: source_fingerprint(pristine)?,
        patches_fingerprint: patches_fingerprint(patches)?,
        module_file: "@MODULE_FILE@".into(),
        module_sha256: "@MODULE_SHA256@".into(),
    };
    serde_json::to_string(&stamp).map_err(|e| e.to_string())
}
