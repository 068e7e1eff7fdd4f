//! The Python package (python/, docs/python.md): `cargo xtask wheel`, and
//! in `cargo xtask test` its wheel built with maturin (pinned, in `target/py-venv`) in the dev profile
//! inside the workspace's target directory, installed into a fresh venv
//! (`target/py-test-venv`) and tested there with pytest (python/tests/).
//!
//! The wheel carries what the bundle `dist` assembles: `lib/` (libggml-base,
//! libggml and the system libraries the bundle ships), the chosen backends
//! (the CPU's by default) with their ggml modules, the model plugins, and
//! the bundle's `licenses/`, with `THIRD-PARTY-LICENSES.md` made by
//! cargo-about as the release archive's is. They are staged into python/tts/ (ignored by git)
//! and named in pyproject.toml's `include`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{dist, release, root, run};

/// The wheel builder, installed from PyPI.
const MATURIN_PACKAGE: &str = "maturin==1.16.0";
/// What the tests run on besides the wheel (which asks for numpy itself);
/// Ray for deploy/ray/tts_batch.py's test (test_ray_batch.py), which must
/// not skip once it is installed (`TTS_REQUIRE_RAY`).
const TEST_PACKAGES: [&str; 3] = ["pytest==9.2.0", "numpy==2.4.6", "ray==2.60.0"];

/// `cargo xtask wheel [--release] [--backends cpu,vulkan] [--out DIR]`:
/// a bundle (`dist`, default backends: the CPU) in `target/wheel-bundle`,
/// and the wheel built from it into DIR (default `dist/`).
pub fn wheel(args: &[String]) -> Result<PathBuf, String> {
    let (mut release, mut backends, mut out) = (false, "cpu".to_string(), root().join("dist"));
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--release" => release = true,
            "--backends" => backends = it.next().ok_or("--backends needs a list")?.clone(),
            "--out" => out = PathBuf::from(it.next().ok_or("--out needs a directory")?),
            other => return Err(format!("wheel: unknown option {other}")),
        }
    }
    let mut dist_args = vec!["--backends".to_string(), backends.clone(), "--out".into(), root().join("target/wheel-bundle").display().to_string()];
    if release {
        dist_args.push("--release".into());
    }
    let bundle = dist(&dist_args)?;
    let names: Vec<&str> = backends.split(',').collect();
    build_wheel(&bundle, &names, release, &out)
}

/// Builds the wheel from `bundle` (a `dist` bundle) with `backends`,
/// installs it into a fresh venv and runs the package's tests with `tts`
/// (the CLI their parity tests compare with). Without Python, PyPI or
/// crates.io (cargo-about) this reports the tests skipped, unless `TTS_REQUIRE_PYTHON_PACKAGE` is set
/// (CI sets it), where it fails instead; a failing test fails it always.
pub fn test_package(bundle: &Path, backends: &[&str], tts: &Path) -> Result<(), String> {
    let test_venv = root().join("target/py-test-venv");
    let ready = maturin().and_then(|_| release::install_cargo_about()).and_then(|_| {
        if test_venv.exists() {
            std::fs::remove_dir_all(&test_venv).map_err(|e| format!("{}: {e}", test_venv.display()))?;
        }
        run(Command::new("python3").args(["-m", "venv"]).arg(&test_venv))
    });
    if let Err(e) = ready {
        if std::env::var_os("TTS_REQUIRE_PYTHON_PACKAGE").is_some() {
            return Err(format!("setting up the Python package's build and test venvs: {e}"));
        }
        eprintln!("xtask: the Python package cannot be built here ({e}); its tests are skipped");
        return Ok(());
    }
    let wheel = build_wheel(bundle, backends, false, &root().join("target/py-wheel"))?;
    run(Command::new(test_venv.join("bin/pip")).args(["install", "-q", "--disable-pip-version-check"]).arg(&wheel).args(TEST_PACKAGES))?;
    // From the venv's directory, which has no `tts` folder: the installed
    // package is the one imported, and no cache is written into the tree.
    run(Command::new(test_venv.join("bin/python"))
        .current_dir(&test_venv)
        .args(["-m", "pytest", "-p", "no:cacheprovider", "-q"])
        .arg(root().join("python/tests"))
        .env("TTS_CLI", tts)
        .env("TTS_REQUIRE_RAY", "1")
        .env_remove("TTS_PLUGIN_PATH"))
}

/// maturin, pinned, in `target/py-venv` (installed there when it is not).
fn maturin() -> Result<PathBuf, String> {
    let tools = root().join("target/py-venv");
    let maturin = tools.join("bin/maturin");
    let version = MATURIN_PACKAGE.split_once("==").map(|(_, v)| v).unwrap_or_default();
    let ready = || Command::new(&maturin).arg("--version").output().is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains(version));
    if !ready() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&tools))?;
        run(Command::new(tools.join("bin/pip")).args(["install", "-q", "--disable-pip-version-check", MATURIN_PACKAGE]))?;
    }
    Ok(maturin)
}

/// Stages `bundle` into python/tts/ ([`stage`]) and builds the wheel into
/// `out` (emptied first); returns its path.
fn build_wheel(bundle: &Path, backends: &[&str], release: bool, out: &Path) -> Result<PathBuf, String> {
    let maturin = maturin()?;
    stage(bundle, backends)?;
    write_inventory(backends)?;
    if out.exists() {
        for old in std::fs::read_dir(out).map_err(|e| format!("{}: {e}", out.display()))?.filter_map(|e| e.ok().map(|e| e.path())) {
            if old.extension().is_some_and(|x| x == "whl") {
                std::fs::remove_file(&old).map_err(|e| format!("{}: {e}", old.display()))?;
            }
        }
    }
    // The stable ABI needs no particular interpreter; maturin's own names
    // one. The wheel is for Linux machines like this one (its libraries
    // come from it), so no manylinux audit.
    let python = maturin.with_file_name("python");
    let profile = if release { "release" } else { "dev" };
    run(Command::new(&maturin)
        .current_dir(root())
        .args(["build", "--profile", profile, "--auditwheel", "skip", "--compatibility", "linux", "-m", "python/Cargo.toml", "--interpreter"])
        .arg(&python)
        .arg("--out")
        .arg(out))?;
    let wheel = std::fs::read_dir(out)
        .map_err(|e| format!("{}: {e}", out.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| format!("maturin left no wheel in {}", out.display()))?;
    let size = std::fs::metadata(&wheel).map(|m| m.len()).unwrap_or(0);
    eprintln!("python: {} ({:.1} MB)", wheel.display(), size as f64 / 1e6);
    Ok(wheel)
}

/// `tts/THIRD-PARTY-LICENSES.md`: the crates linked into the extension
/// module and the staged plugins, by cargo-about as `cargo xtask release`
/// makes the archive's ([`release::crate_licenses`]: GPL refused), the
/// native libraries of docs/licenses.md, and the staged `licenses/`.
fn write_inventory(backends: &[&str]) -> Result<(), String> {
    let cargo_about = release::install_cargo_about()?;
    let mut manifests = vec![root().join("python/Cargo.toml")];
    manifests.extend(backends.iter().map(|b| root().join("backends").join(b).join("Cargo.toml")));
    for entry in std::fs::read_dir(root().join("models")).map_err(|e| format!("models: {e}"))? {
        let manifest = entry.map_err(|e| e.to_string())?.path().join("Cargo.toml");
        if manifest.is_file() {
            manifests.push(manifest);
        }
    }
    manifests.sort();
    let crates = release::crate_licenses(&cargo_about, &manifests)?;
    let licenses_md = std::fs::read_to_string(root().join("docs/licenses.md")).map_err(|e| format!("docs/licenses.md: {e}"))?;
    let native = release::native_libraries_section(&licenses_md)?;
    let package = root().join("python/tts");
    let name = format!("the Python package tts {}", env!("CARGO_PKG_VERSION"));
    // The inventory's words are the archive's; this one is made by the wheel task.
    let inventory = release::render_inventory(&name, &crates, &native, &release::license_files(&package)?)
        .replace("(`cargo xtask release`)", "(`cargo xtask wheel`)")
        .replace("the release fails", "the wheel task fails");
    let path = package.join("THIRD-PARTY-LICENSES.md");
    std::fs::write(&path, inventory).map_err(|e| format!("{}: {e}", path.display()))
}

/// Copies the bundle's libraries, `backends` (each plugin with its ggml
/// module), model plugins and licences into python/tts/, replacing what an
/// earlier run staged there.
fn stage(bundle: &Path, backends: &[&str]) -> Result<(), String> {
    let package = root().join("python/tts");
    let shipped = |dir: &str, name: &str| match dir {
        "plugins" => {
            name.starts_with("libtts_model_")
                || backends.iter().any(|b| {
                    name == format!("libtts_backend_{b}.so") || name.starts_with(&format!("libggml-{b}.")) || name.starts_with(&format!("libggml-{b}-"))
                })
        }
        // The C API's library is of no use to the Python module.
        "lib" => name != "libtts.so",
        _ => true,
    };
    for dir in ["lib", "plugins", "licenses"] {
        let to = package.join(dir);
        if to.exists() {
            std::fs::remove_dir_all(&to).map_err(|e| format!("{}: {e}", to.display()))?;
        }
        std::fs::create_dir_all(&to).map_err(|e| format!("{}: {e}", to.display()))?;
        let from = bundle.join(dir);
        for entry in std::fs::read_dir(&from).map_err(|e| format!("{}: {e}", from.display()))? {
            let path = entry.map_err(|e| e.to_string())?.path();
            let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
            if path.is_file() && shipped(dir, &name) {
                std::fs::copy(&path, to.join(&name)).map_err(|e| format!("{}: {e}", path.display()))?;
            }
        }
    }
    Ok(())
}
