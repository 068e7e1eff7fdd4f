//! Builds the shared `libggml-base` and `libggml` (registry + DL loader) from the
//! pinned source, with no backend compiled in; backends are separate modules that
//! each backend plugin builds. Generates bindings for the public headers.

use ggml_build_support as gb;
use std::path::{Path, PathBuf};

fn main() {
    if let Err(e) = build() {
        panic!("ggml-sys: {e}");
    }
}

fn build() -> Result<(), String> {
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let pristine = gb::locate_source(&out.join("registry"))?;
    // No patches: the shared base is always the pristine pinned source.
    let built = gb::cached_build(&pristine, &[], "-", gb::CmakeOptions::default(), &["ggml-base", "ggml"])?;
    let (src, build_dir) = (built.src, built.build);

    let lib_dir = out.join("lib");
    let artifacts = gb::artifact_dir()?;
    for entry in std::fs::read_dir(build_dir.join("src")).map_err(|e| e.to_string())? {
        let path = entry.map_err(|e| e.to_string())?.path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("libggml") && name.contains(".so") {
            let real = std::fs::canonicalize(&path).map_err(|e| e.to_string())?;
            gb::copy_as(&real, &lib_dir.join(&name))?;
            gb::copy_as(&real, &artifacts.join(&name))?;
        }
    }
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=ggml-base");
    println!("cargo:rustc-link-lib=dylib=ggml");
    println!("cargo:lib_dir={}", lib_dir.display());
    println!("cargo:include={}", src.join("include").display());

    let version = gb::ggml_version(&pristine)?;
    let fingerprint = gb::source_fingerprint(&pristine)?;
    println!("cargo:rustc-env=GGML_SYS_VERSION={version}");
    println!("cargo:rustc-env=GGML_SYS_SOURCE_FINGERPRINT={fingerprint}");
    println!("cargo:rustc-env=GGML_SYS_SOURCE_PACKAGE={}-{}", gb::PINNED_CRATE, gb::PINNED_VERSION);
    generate_bindings(&src.join("include"), &out.join("bindings.rs"))?;
    generate_graph_internals(&src, &out.join("graph_internals.rs"))
}

/// The layout of `struct ggml_cgraph` (private to ggml: `src/ggml-impl.h`)
/// and `ggml_graph_next_uid`, which libggml-base exports: a graph built once
/// and computed many times is given an identity, so a backend that caches
/// per graph (CUDA's graph replay) knows it unchanged without comparing it
/// node by node on every run.
fn generate_graph_internals(src: &Path, out: &Path) -> Result<(), String> {
    bindgen::Builder::default()
        .clang_arg(format!("-I{}", src.join("include").display()))
        .header(src.join("src/ggml-impl.h").to_string_lossy())
        .allowlist_type("ggml_cgraph")
        .allowlist_function("ggml_graph_next_uid")
        .prepend_enum_name(false)
        .layout_tests(false)
        .generate()
        .map_err(|e| format!("bindgen (ggml-impl.h): {e}"))?
        .write_to_file(out)
        .map_err(|e| e.to_string())
}

fn generate_bindings(include: &Path, out: &Path) -> Result<(), String> {
    let headers = ["ggml.h", "ggml-alloc.h", "ggml-backend.h", "ggml-cpu.h", "gguf.h"];
    let mut builder = bindgen::Builder::default()
        .clang_arg(format!("-I{}", include.display()))
        .allowlist_function("ggml_.*|gguf_.*")
        .allowlist_type("ggml_.*|gguf_.*")
        .allowlist_var("GGML_.*|GGUF_.*")
        // CPU-backend entry points live in the DL module, not in libggml-base:
        // they are reached through ggml_backend_reg_get_proc_address instead.
        .blocklist_function(
            "ggml_backend_cpu_.*|ggml_cpu_.*|ggml_graph_compute.*|ggml_graph_plan|ggml_backend_reg_cpu|ggml_backend_init_cpu|ggml_backend_is_cpu",
        )
        .prepend_enum_name(false)
        .layout_tests(false)
        .derive_default(true);
    for h in headers {
        builder = builder.header(include.join(h).to_string_lossy());
    }
    builder.generate().map_err(|e| format!("bindgen: {e}"))?.write_to_file(out).map_err(|e| e.to_string())
}
