//! The shader compiler and Vulkan headers the Vulkan module is built with.
//!
//! ggml-vulkan compiles its tensor-core shader variants (KHR cooperative matrix,
//! NV cooperative matrix 2, integer dot, bf16) only when glslc accepts the GLSL
//! extensions, and enables them at run time only when the Vulkan headers declare
//! the device extensions. Debian 12 has neither (shaderc 2023.2, headers
//! 1.3.239), so both come from pinned packages instead:
//! - glslc is built once from the sources inside the registry package
//!   `shaderc-sys` (shaderc, glslang, SPIRV-Tools, SPIRV-Headers), cached under
//!   `<target>/vulkan-toolchain/`; the first build takes about 5 minutes on
//!   2 cores, later builds reuse it.
//! - the headers are Debian 13's `libvulkan-dev` package (headers only; the
//!   module still links the system's Vulkan loader, which resolves the new
//!   entry points at run time), fetched from the Debian archive, checked
//!   against its SHA-256 and unpacked under the same cache.
//!
//! `TTS_GLSLC` and `TTS_VULKAN_INCLUDE_DIR` name a compiler and headers to use
//! instead (offline packagers, other distributions). `TTS_VULKAN_SHADERS=basic`
//! builds with the system's glslc and headers, without tensor-core variants.

use crate::{cargo_directive, crate_in_registry, run, Result};
use sha2::{Digest, Sha256};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Registry package whose `build/` tree holds shaderc's sources.
pub const SHADERC_CRATE: &str = "shaderc-sys";
/// Exact version pinned in this crate's Cargo.toml.
pub const SHADERC_VERSION: &str = "0.10.1";

/// Debian 13 (trixie) `libvulkan-dev`: the newest headers in a Debian stable
/// release, so the file stays in the archive's pool.
const HEADERS_VERSION: &str = "1.4.309.0-1";
const HEADERS_URL: &str = "https://deb.debian.org/debian/pool/main/v/vulkan-loader/libvulkan-dev_1.4.309.0-1_amd64.deb";
const HEADERS_SHA256: &str = "8d329d465e16168afff58b1bd0dd6db46aac2cc3f56054a481b25a04e90b345a";

pub const GLSLC_ENV: &str = "TTS_GLSLC";
pub const INCLUDE_ENV: &str = "TTS_VULKAN_INCLUDE_DIR";
pub const SHADERS_ENV: &str = "TTS_VULKAN_SHADERS";

/// What the Vulkan module is configured with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VulkanToolchain {
    pub glslc: PathBuf,
    pub include_dir: PathBuf,
}

impl VulkanToolchain {
    /// The CMake cache entries that point ggml's `find_package(Vulkan)` here.
    pub fn cmake_defines(&self) -> Vec<(String, String)> {
        vec![("Vulkan_GLSLC_EXECUTABLE".into(), self.glslc.display().to_string()), ("Vulkan_INCLUDE_DIR".into(), self.include_dir.display().to_string())]
    }
}

/// The toolchain for this build: `None` when `TTS_VULKAN_SHADERS=basic` asks
/// for the system's glslc and headers; otherwise the environment's overrides or
/// the pinned, cached builds under `cache_root`.
pub fn resolve(cache_root: &Path) -> Result<Option<VulkanToolchain>> {
    for var in [GLSLC_ENV, INCLUDE_ENV, SHADERS_ENV] {
        cargo_directive(&format!("rerun-if-env-changed={var}"));
    }
    match std::env::var(SHADERS_ENV).as_deref() {
        Ok("basic") => return Ok(None),
        Ok("") | Ok("matrix-cores") | Err(_) => {}
        Ok(other) => return Err(format!("{SHADERS_ENV}={other}: expected `matrix-cores` (the default) or `basic`")),
    }
    let glslc = match std::env::var_os(GLSLC_ENV) {
        Some(path) => existing_file(PathBuf::from(path), GLSLC_ENV)?,
        None => build_glslc(cache_root)?,
    };
    let include_dir = match std::env::var_os(INCLUDE_ENV) {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if !dir.join("vulkan/vulkan.hpp").is_file() {
                return Err(format!("{INCLUDE_ENV}={}: no vulkan/vulkan.hpp there", dir.display()));
            }
            dir
        }
        None => fetch_headers(cache_root)?,
    };
    Ok(Some(VulkanToolchain { glslc, include_dir }))
}

fn existing_file(path: PathBuf, var: &str) -> Result<PathBuf> {
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("{var}={}: no such file", path.display()))
    }
}

/// Holds an exclusive lock on `<dir>/.lock` while alive, so concurrent build
/// scripts build a cached tool once.
fn lock_dir(dir: &Path) -> Result<fs::File> {
    fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let lock = fs::File::create(dir.join(".lock")).map_err(|e| format!("{}: {e}", dir.display()))?;
    lock.lock().map_err(|e| format!("locking {}: {e}", dir.display()))?;
    Ok(lock)
}

/// CMake options of the glslc build: the compiler only, none of the tests,
/// examples or other executables of the four projects.
const GLSLC_CMAKE: &[(&str, &str)] = &[
    ("CMAKE_BUILD_TYPE", "Release"),
    ("SHADERC_SKIP_TESTS", "ON"),
    ("SHADERC_SKIP_EXAMPLES", "ON"),
    ("SHADERC_SKIP_COPYRIGHT_CHECK", "ON"),
    ("SPIRV_SKIP_TESTS", "ON"),
    ("SPIRV_SKIP_EXECUTABLES", "ON"),
    ("ENABLE_GLSLANG_BINARIES", "OFF"),
    ("SKIP_GLSLANG_INSTALL", "ON"),
];

/// Builds `glslc` from the pinned shaderc sources once; later calls return the
/// cached binary. Only the finished binary is kept (the 160 MB build tree is
/// removed), copied in through a rename so a half-built file is never used.
fn build_glslc(cache_root: &Path) -> Result<PathBuf> {
    let dir = cache_root.join(format!("glslc-{SHADERC_CRATE}-{SHADERC_VERSION}"));
    let glslc = dir.join("glslc");
    let _lock = lock_dir(&dir)?;
    if glslc.is_file() {
        return Ok(glslc);
    }
    let crate_dir = crate_in_registry(SHADERC_CRATE, SHADERC_VERSION, &dir.join("registry"))?;
    let source = crate_dir.join("build");
    if !source.join("CMakeLists.txt").is_file() {
        return Err(format!("{}: not the shaderc source tree of {SHADERC_CRATE}-{SHADERC_VERSION}", source.display()));
    }
    let build = dir.join("build");
    let mut configure = Command::new("cmake");
    configure.arg("-G").arg("Ninja").arg("-S").arg(&source).arg("-B").arg(&build);
    for (k, v) in GLSLC_CMAKE {
        configure.arg(format!("-D{k}={v}"));
    }
    run(&mut configure, "glslc: cmake configure")?;
    let jobs = std::env::var("NUM_JOBS").unwrap_or_else(|_| "2".into());
    run(Command::new("cmake").arg("--build").arg(&build).args(["-j", &jobs, "--target", "glslc_exe"]), "glslc: cmake build")?;
    let built = build.join("shaderc/glslc/glslc");
    let staged = dir.join(".glslc.tmp");
    fs::copy(&built, &staged).map_err(|e| format!("{}: {e}", built.display()))?;
    fs::rename(&staged, &glslc).map_err(|e| e.to_string())?;
    let _ = fs::remove_dir_all(&build);
    let _ = fs::remove_dir_all(dir.join("registry"));
    Ok(glslc)
}

/// Downloads and unpacks the pinned `libvulkan-dev` once; returns its
/// `usr/include`.
fn fetch_headers(cache_root: &Path) -> Result<PathBuf> {
    let dir = cache_root.join(format!("vulkan-headers-{HEADERS_VERSION}"));
    let include = dir.join("usr/include");
    let _lock = lock_dir(&dir)?;
    if include.join("vulkan/vulkan.hpp").is_file() {
        return Ok(include);
    }
    let deb = dir.join("libvulkan-dev.deb");
    let fetched = Command::new("curl")
        .args(["--fail", "--silent", "--show-error", "--location", "--retry", "3", "--output"])
        .arg(&deb)
        .arg(HEADERS_URL)
        .output()
        .map_err(|e| format!("Vulkan headers: cannot run curl: {e}"))?;
    if !fetched.status.success() {
        return Err(format!(
            "Vulkan headers: downloading {HEADERS_URL} failed ({}); set {INCLUDE_ENV} to headers of Vulkan 1.4.309 or newer, \
             or {SHADERS_ENV}=basic to build without tensor-core shaders",
            String::from_utf8_lossy(&fetched.stderr).trim()
        ));
    }
    let bytes = fs::read(&deb).map_err(|e| format!("{}: {e}", deb.display()))?;
    let digest = hex::encode(Sha256::digest(&bytes));
    if digest != HEADERS_SHA256 {
        let _ = fs::remove_file(&deb);
        return Err(format!("Vulkan headers: {HEADERS_URL} has SHA-256 {digest}, expected {HEADERS_SHA256}"));
    }
    let unpack = dir.join("unpack");
    let _ = fs::remove_dir_all(&unpack);
    extract_deb(&bytes, &unpack)?;
    let _ = fs::remove_dir_all(dir.join("usr"));
    fs::rename(unpack.join("usr"), dir.join("usr")).map_err(|e| e.to_string())?;
    let _ = fs::remove_dir_all(&unpack);
    let _ = fs::remove_file(&deb);
    if include.join("vulkan/vulkan.hpp").is_file() {
        Ok(include)
    } else {
        Err(format!("Vulkan headers: {HEADERS_URL} holds no usr/include/vulkan/vulkan.hpp"))
    }
}

/// Unpacks a Debian package's `data.tar.*` into `dest`. A `.deb` is an `ar`
/// archive of three members; the data member is read here and handed to tar
/// (which knows its xz or zstd compression).
fn extract_deb(deb: &[u8], dest: &Path) -> Result<()> {
    let (name, data) =
        ar_members(deb)?.into_iter().find(|(name, _)| name.starts_with("data.tar")).ok_or("Vulkan headers: the package has no data.tar member")?;
    fs::create_dir_all(dest).map_err(|e| e.to_string())?;
    let archive = dest.join(&name);
    fs::write(&archive, data).map_err(|e| e.to_string())?;
    run(Command::new("tar").arg("-xf").arg(&archive).arg("-C").arg(dest), "Vulkan headers: tar")?;
    fs::remove_file(&archive).map_err(|e| e.to_string())
}

/// The members of a System V `ar` archive (`!<arch>\n`, then per member a
/// 60-byte header with the name and decimal size, the data, padding to even).
fn ar_members(bytes: &[u8]) -> Result<Vec<(String, &[u8])>> {
    let body = bytes.strip_prefix(b"!<arch>\n").ok_or("Vulkan headers: not an ar archive")?;
    let mut members = Vec::new();
    let mut pos = 0;
    while pos + 60 <= body.len() {
        let header = &body[pos..pos + 60];
        let name = String::from_utf8_lossy(&header[..16]).trim_end().trim_end_matches('/').to_string();
        let size: usize = std::str::from_utf8(&header[48..58])
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| format!("Vulkan headers: bad ar member size for {name}"))?;
        let start = pos + 60;
        let end = start.checked_add(size).filter(|&e| e <= body.len()).ok_or_else(|| format!("Vulkan headers: ar member {name} runs past the end"))?;
        members.push((name, &body[start..end]));
        pos = end + (size & 1);
    }
    Ok(members)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ar(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = b"!<arch>\n".to_vec();
        for (name, data) in members {
            out.extend(format!("{:<16}{:<12}{:<6}{:<6}{:<8}{:<10}`\n", format!("{name}/"), 0, 0, 0, 100644, data.len()).as_bytes());
            out.extend_from_slice(data);
            if data.len() % 2 == 1 {
                out.push(b'\n');
            }
        }
        out
    }

    #[test]
    fn ar_members_reads_names_sizes_and_odd_padding() {
        let bytes = ar(&[("debian-binary", b"2.0\n"), ("control.tar.xz", b"abc"), ("data.tar.xz", b"hello")]);
        let members = ar_members(&bytes).unwrap();
        let names: Vec<&str> = members.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["debian-binary", "control.tar.xz", "data.tar.xz"]);
        assert_eq!(members[1].1, b"abc");
        assert_eq!(members[2].1, b"hello");
    }

    #[test]
    fn ar_members_rejects_truncated_and_foreign_input() {
        let mut bytes = ar(&[("data.tar.xz", b"hello")]);
        bytes.truncate(bytes.len() - 2);
        assert_eq!(ar_members(&bytes).unwrap_err(), "Vulkan headers: ar member data.tar.xz runs past the end");
        assert_eq!(ar_members(b"PK\x03\x04").unwrap_err(), "Vulkan headers: not an ar archive");
    }

    #[test]
    fn unknown_shader_mode_is_refused() {
        std::env::set_var(SHADERS_ENV, "tensor");
        let err = resolve(Path::new("/nonexistent")).unwrap_err();
        std::env::remove_var(SHADERS_ENV);
        assert_eq!(err, "TTS_VULKAN_SHADERS=tensor: expected `matrix-cores` (the default) or `basic`");
    }
}
