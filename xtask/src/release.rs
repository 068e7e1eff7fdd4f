//! `cargo xtask release`: the archive a user downloads, unpacks anywhere and
//! runs (docs/release.md).
//!
//! On top of the bundle `dist` assembles, the archive carries
//! `THIRD-PARTY-LICENSES.md`, an inventory of every Rust crate linked into
//! the shipped binaries with the licence it is used under, generated from
//! Cargo metadata by cargo-about (pinned, installed into `target/tools`),
//! and `SHA256SUMS` of every file in it; a `SHA256SUMS` beside the archive
//! holds the archive's own checksum. cargo-about refuses a crate that no
//! licence of `xtask/about.toml`'s accepted list covers (GPL is not there),
//! and the release fails then; [`refused_license`] checks the outcome again.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{bundle_files, dist, module_kit, root, run};

/// The licence-inventory tool, installed from crates.io with `--locked`
/// (its own lock file), so every release runs the same build of it.
pub const CARGO_ABOUT_VERSION: &str = "0.9.3";

/// What `cargo xtask release` was asked for.
struct Options {
    /// A release build (the default); `--debug` packs the dev build, as CI does.
    release: bool,
    backends: Vec<String>,
    out: PathBuf,
    /// The CUDA plugin and the module kit that builds its ggml module on a
    /// host with nvcc (no CUDA toolkit here: the module is not prebuilt).
    cuda_kit: bool,
    /// `--no-build`: pack what `target/` already holds.
    build: bool,
    cpu_variants: Option<String>,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        release: true,
        backends: vec!["cpu".into(), "vulkan".into()],
        out: root().join("dist/release"),
        cuda_kit: false,
        build: true,
        cpu_variants: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--debug" => o.release = false,
            "--backends" => o.backends = it.next().ok_or("--backends needs a list")?.split(',').map(str::to_string).collect(),
            "--out" => o.out = PathBuf::from(it.next().ok_or("--out needs a directory")?),
            "--with-cuda-kit" => o.cuda_kit = true,
            "--no-build" => o.build = false,
            "--cpu-variants" => o.cpu_variants = Some(it.next().ok_or("--cpu-variants needs native, all or baseline")?.clone()),
            other => return Err(format!("release: unknown option {other}")),
        }
    }
    if o.cuda_kit && !o.backends.iter().any(|b| b == "cuda") {
        o.backends.push("cuda".into());
    }
    Ok(o)
}

/// `tts-<version>-<os>-<arch>`, `-cuda` added when the CUDA kit comes along,
/// so that both archives can sit side by side on one download page.
pub fn archive_name(version: &str, os: &str, arch: &str, cuda_kit: bool) -> String {
    format!("tts-{version}-{os}-{arch}{}", if cuda_kit { "-cuda" } else { "" })
}

/// Builds the archive and returns its path: `OUT/<name>.tar.gz`, its line
/// in `OUT/SHA256SUMS`. The staging directory is removed afterwards.
pub fn release(args: &[String]) -> Result<PathBuf, String> {
    let o = parse(args)?;
    let name = archive_name(env!("CARGO_PKG_VERSION"), std::env::consts::OS, std::env::consts::ARCH, o.cuda_kit);
    std::fs::create_dir_all(&o.out).map_err(|e| format!("{}: {e}", o.out.display()))?;
    let stage = o.out.join(&name);
    let mut dist_args = vec!["--out".to_string(), stage.display().to_string(), "--backends".into(), o.backends.join(",")];
    if o.release {
        dist_args.push("--release".into());
    }
    if !o.build {
        dist_args.push("--no-build".into());
    }
    // A release archive runs on machines other than the one that built it:
    // every ISA variant of the CPU module, the best picked at run time. A
    // debug archive (CI) keeps the build's own choice, so it rebuilds nothing.
    match (&o.cpu_variants, o.release) {
        (Some(v), _) => dist_args.extend(["--cpu-variants".into(), v.clone()]),
        (None, true) => dist_args.extend(["--cpu-variants".into(), "all".into()]),
        (None, false) => {}
    }
    // Installed first: without the inventory there is no archive, so a
    // missing tool fails before the build rather than after it.
    let cargo_about = install_cargo_about()?;
    dist(&dist_args)?;
    // What `cargo xtask test` checks on its bundle, checked on this one: run
    // paths inside it, every needed library shipped or a platform library.
    crate::check_run_paths(&stage)?;
    crate::check_needed_libraries(&stage)?;
    if o.cuda_kit {
        module_kit(&["cuda".into(), "--out".into(), stage.join("cuda-module-kit").display().to_string()])?;
    }
    let crates = crate_licenses(&cargo_about, &shipped_manifests(&stage)?)?;
    let native = native_libraries_section(&std::fs::read_to_string(root().join("docs/licenses.md")).map_err(|e| format!("docs/licenses.md: {e}"))?)?;
    let inventory = render_inventory(&name, &crates, &native, &license_files(&stage)?);
    std::fs::write(stage.join("THIRD-PARTY-LICENSES.md"), inventory).map_err(|e| e.to_string())?;
    write_sha256sums(&stage)?;
    let archive = o.out.join(format!("{name}.tar.gz"));
    write_archive(&stage, &name, &archive)?;
    record_checksum(&o.out.join("SHA256SUMS"), &archive)?;
    std::fs::remove_dir_all(&stage).map_err(|e| format!("{}: {e}", stage.display()))?;
    let size = std::fs::metadata(&archive).map_err(|e| e.to_string())?.len();
    eprintln!("release: {} ({:.1} MiB), checksum in {}", archive.display(), size as f64 / 1048576.0, o.out.join("SHA256SUMS").display());
    Ok(archive)
}

/// `target/tools/bin/cargo-about` at [`CARGO_ABOUT_VERSION`], installed
/// from crates.io when it is not there yet.
pub fn install_cargo_about() -> Result<PathBuf, String> {
    let tools = root().join("target/tools");
    let bin = tools.join("bin/cargo-about");
    let ready = || {
        Command::new(&bin)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).split_whitespace().nth(1) == Some(CARGO_ABOUT_VERSION))
    };
    if !ready() {
        // The binary is behind the crate's `cli` feature.
        run(crate::cargo().args(["install", "cargo-about", "--locked", "--features", "cli", "--version", CARGO_ABOUT_VERSION, "--root"]).arg(&tools))?;
    }
    Ok(bin)
}

/// The manifests of the workspace packages whose binaries the bundle at
/// `stage` ships (a `bin` target as a file, a `cdylib` as `lib<name>.so`,
/// at its top, in `lib/` or in `plugins/`): their dependency graphs are
/// what the archive links.
fn shipped_manifests(stage: &Path) -> Result<Vec<PathBuf>, String> {
    let out = crate::cargo().args(["metadata", "--format-version", "1", "--no-deps", "--offline"]).output().map_err(|e| format!("cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("cargo metadata: {e}"))?;
    let shipped = |file: &str| [stage.join(file), stage.join("lib").join(file), stage.join("plugins").join(file)].iter().any(|p| p.is_file());
    let mut manifests = Vec::new();
    for package in meta["packages"].as_array().ok_or("cargo metadata: no packages")? {
        let ships = package["targets"].as_array().into_iter().flatten().any(|t| {
            let name = t["name"].as_str().unwrap_or_default();
            let kinds: Vec<&str> = t["kind"].as_array().into_iter().flatten().filter_map(|k| k.as_str()).collect();
            (kinds.contains(&"bin") && shipped(name)) || (kinds.contains(&"cdylib") && shipped(&format!("lib{}.so", name.replace('-', "_"))))
        });
        if ships {
            manifests.push(PathBuf::from(package["manifest_path"].as_str().ok_or("cargo metadata: a package without manifest_path")?));
        }
    }
    if manifests.is_empty() {
        return Err(format!("release: no workspace package's binary is in {}", stage.display()));
    }
    manifests.sort();
    Ok(manifests)
}

/// `cargo metadata` of the workspace `manifest` belongs to, its
/// dependencies resolved for this platform only.
fn cargo_metadata(manifest: &Path) -> Result<serde_json::Value, String> {
    let platform = crate::host_triple()?;
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["metadata", "--format-version", "1", "--offline", "--locked", "--filter-platform", &platform, "--manifest-path"])
        .arg(manifest)
        .output()
        .map_err(|e| format!("cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("cargo metadata: {e}"))
}

/// The third-party crates the packages of `manifests` link: everything
/// reachable from them through normal dependencies in `meta`'s resolve
/// graph (build scripts' and tests' dependencies are not linked), less
/// this workspace's own packages.
fn linked_crates(meta: &serde_json::Value, manifests: &[PathBuf]) -> Result<BTreeSet<(String, String)>, String> {
    let packages: BTreeMap<&str, &serde_json::Value> =
        meta["packages"].as_array().ok_or("cargo metadata: no packages")?.iter().filter_map(|p| Some((p["id"].as_str()?, p))).collect();
    let nodes: BTreeMap<&str, &serde_json::Value> =
        meta["resolve"]["nodes"].as_array().ok_or("cargo metadata: no resolve graph")?.iter().filter_map(|n| Some((n["id"].as_str()?, n))).collect();
    let mut todo: Vec<&str> = Vec::new();
    for manifest in manifests {
        let id = packages
            .iter()
            .find(|(_, p)| p["manifest_path"].as_str().is_some_and(|m| Path::new(m) == manifest))
            .map(|(id, _)| *id)
            .ok_or_else(|| format!("cargo metadata: no package of {}", manifest.display()))?;
        todo.push(id);
    }
    let mut seen = BTreeSet::new();
    while let Some(id) = todo.pop() {
        if !seen.insert(id) {
            continue;
        }
        for dep in nodes.get(id).and_then(|n| n["deps"].as_array()).into_iter().flatten() {
            let normal = dep["dep_kinds"].as_array().into_iter().flatten().any(|k| k["kind"].is_null());
            if let (true, Some(pkg)) = (normal, dep["pkg"].as_str()) {
                todo.push(pkg);
            }
        }
    }
    Ok(seen
        .iter()
        .filter_map(|id| packages.get(id))
        .filter(|p| !project_crate(p))
        .filter_map(|p| Some((p["name"].as_str()?.to_string(), p["version"].as_str()?.to_string())))
        .collect())
}

/// A package of this workspace (the project's code, not third-party).
fn project_crate(package: &serde_json::Value) -> bool {
    package["manifest_path"].as_str().is_some_and(|p| Path::new(p).starts_with(root()))
}

/// One crate of the inventory.
#[derive(Debug, Default, PartialEq)]
pub struct CrateLicense {
    /// The `license` field of its Cargo.toml, as published.
    pub declared: String,
    /// The licences it is used under: cargo-about's pick from the declared
    /// expression by the priority of `xtask/about.toml`'s accepted list.
    pub used_under: BTreeSet<String>,
}

/// The inventory's crates and licence texts.
#[derive(Debug, Default)]
pub struct Crates {
    /// (name, version) -> its licence.
    pub crates: BTreeMap<(String, String), CrateLicense>,
    /// (licence id, full name, text) -> the crates whose files carry this text.
    pub texts: BTreeMap<(String, String, String), BTreeSet<(String, String)>>,
}

/// The licences of the third-party crates the packages of `manifests`
/// link. cargo-about (`xtask/about.toml`) runs once over their whole
/// workspace, offline and with the lock file as it is (some 350 crates in
/// 30 s; a run per shipped binary took four times as long), and fails when
/// a crate's licence is not covered by the accepted list or cannot be read:
/// no crate of the workspace's graph may be GPL-only, shipped or not. Its
/// report is then narrowed to the crates the packages link
/// ([`linked_crates`], [`keep_linked`]) and checked again ([`check_crates`]).
pub fn crate_licenses(cargo_about: &Path, manifests: &[PathBuf]) -> Result<Crates, String> {
    let first = manifests.first().ok_or("release: no package to list the crates of")?;
    let meta = cargo_metadata(first)?;
    let workspace = Path::new(meta["workspace_root"].as_str().ok_or("cargo metadata: no workspace_root")?).join("Cargo.toml");
    let mut cmd = Command::new(cargo_about);
    cmd.args(["--color", "never", "generate", "--format", "json", "--frozen", "--fail", "--workspace", "--config"])
        .arg(root().join("xtask/about.toml"))
        .arg("--manifest-path")
        .arg(&workspace);
    let out = cmd.output().map_err(|e| format!("{}: {e}", cargo_about.display()))?;
    if !out.status.success() {
        return Err(format!(
            "release: cargo-about refused the licences of {}'s dependencies (xtask/about.toml lists what is accepted; GPL never is):\n{}",
            workspace.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("cargo-about output for {}: {e}", workspace.display()))?;
    let mut all = Crates::default();
    merge_report(&mut all, &report)?;
    keep_linked(&mut all, &linked_crates(&meta, manifests)?);
    check_crates(&all)?;
    Ok(all)
}

/// Narrows `all` to the `linked` crates. `cargo metadata`'s resolve graph
/// is wider than what a build activates (it lists `zlib-rs` under
/// `flate2`, which no feature here enables and `cargo tree` does not
/// show), so a linked crate cargo-about's own resolution left out is not in
/// the inventory; they are named on stderr.
pub fn keep_linked(all: &mut Crates, linked: &BTreeSet<(String, String)>) {
    let unreported: Vec<String> = linked.iter().filter(|k| !all.crates.contains_key(*k)).map(|(n, v)| format!("{n} {v}")).collect();
    if !unreported.is_empty() {
        eprintln!("release: in Cargo's resolve graph but activated by no feature (not in the inventory): {}", unreported.join(", "));
    }
    all.crates.retain(|k, _| linked.contains(k));
    for users in all.texts.values_mut() {
        users.retain(|k| linked.contains(k));
    }
    all.texts.retain(|_, users| !users.is_empty());
}

/// Adds one cargo-about JSON report (`licenses[].used_by[].crate`, and
/// `crates[]`, every crate it looked at) to `all`, leaving out this
/// workspace's own crates (the project's code, not third-party).
fn merge_report(all: &mut Crates, report: &serde_json::Value) -> Result<(), String> {
    let key = |krate: &serde_json::Value| -> Result<(String, String), String> {
        match (krate["name"].as_str(), krate["version"].as_str()) {
            (Some(n), Some(v)) => Ok((n.to_string(), v.to_string())),
            _ => Err(format!("cargo-about output: a crate without name or version: {krate}")),
        }
    };
    for krate in report["crates"].as_array().into_iter().flatten() {
        let package = &krate["package"];
        if project_crate(package) {
            continue;
        }
        let entry = all.crates.entry(key(package)?).or_default();
        entry.declared = package["license"].as_str().unwrap_or("(none declared)").to_string();
    }
    for license in report["licenses"].as_array().ok_or("cargo-about output: no `licenses` list")? {
        let id = license["id"].as_str().ok_or("cargo-about output: a licence without id")?.to_string();
        let name = license["name"].as_str().unwrap_or(&id).to_string();
        let text = license["text"].as_str().unwrap_or_default().to_string();
        for used in license["used_by"].as_array().into_iter().flatten().filter(|u| !project_crate(&u["crate"])) {
            let k = key(&used["crate"])?;
            all.texts.entry((id.clone(), name.clone(), text.clone())).or_default().insert(k.clone());
            let entry = all.crates.entry(k).or_default();
            if entry.declared.is_empty() {
                entry.declared = used["crate"]["license"].as_str().unwrap_or("(none declared)").to_string();
            }
            entry.used_under.insert(id.clone());
        }
    }
    Ok(())
}

/// GPL and AGPL of any version may not be linked into `tts` or a plugin
/// (docs/licenses.md); LGPL may, as a shared library or an unmodified crate.
pub fn refused_license(id: &str) -> bool {
    id.starts_with("GPL-") || id.starts_with("AGPL-")
}

/// Every crate is used under at least one licence and none refused: a
/// second guard behind cargo-about's accepted list, should that list ever
/// gain a GPL entry.
fn check_crates(all: &Crates) -> Result<(), String> {
    let mut bad = Vec::new();
    for ((name, version), license) in &all.crates {
        if license.used_under.is_empty() {
            bad.push(format!("{name} {version} ({}): no licence it is used under was found", license.declared));
        }
        for id in license.used_under.iter().filter(|id| refused_license(id)) {
            bad.push(format!("{name} {version} ({}): used under {id}; GPL code is not linked into tts", license.declared));
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!("release: the licence inventory refuses:\n{}", bad.join("\n")))
    }
}

/// The "Native libraries" section of docs/licenses.md, which says what a
/// bundle ships besides Rust crates and under which terms: the inventory
/// carries it as written, so there is one account of them.
pub fn native_libraries_section(licenses_md: &str) -> Result<String, String> {
    let start = licenses_md.find("\n## Native libraries\n").ok_or("docs/licenses.md: no \"## Native libraries\" section")? + 1;
    let rest = &licenses_md[start..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |i| i + 4);
    Ok(rest[..end].trim_end().to_string() + "\n")
}

/// The files under the bundle's `licenses/` (copyright files and notices of
/// the native libraries it ships).
pub fn license_files(stage: &Path) -> Result<Vec<String>, String> {
    let dir = stage.join("licenses");
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into())
        .collect();
    names.sort();
    Ok(names)
}

/// `THIRD-PARTY-LICENSES.md`: the native libraries, the MPL-2.0 crates
/// (file-level copyleft: the files are used unmodified, their source is the
/// published crate), a table of every crate, then each licence text with
/// the crates it covers.
pub fn render_inventory(name: &str, all: &Crates, native: &str, license_files: &[String]) -> String {
    let mut s = String::new();
    s += &format!("# Third-party licences of {name}\n\n");
    s += "`tts`, its plugins and libraries are the tts project's code (MIT) built on\n";
    s += "the third-party code listed here. The Rust crates and their licence texts are\n";
    s += &format!(
        "generated from Cargo metadata by cargo-about {CARGO_ABOUT_VERSION} (`cargo xtask release`); each crate is\n\
         listed with the licence of its declared expression it is used under. No\n\
         GPL or AGPL code is linked: the release fails if any crate would need it.\n\n"
    );
    s += native;
    if !license_files.is_empty() {
        s += "\nTheir notices, copyright files and sources, in `licenses/`:\n\n";
        for f in license_files {
            s += &format!("- `licenses/{f}`\n");
        }
    }
    let mpl: Vec<String> =
        all.crates.iter().filter(|(_, l)| l.used_under.iter().any(|id| id.starts_with("MPL-"))).map(|((n, v), _)| format!("{n} {v}")).collect();
    if !mpl.is_empty() {
        s += "\n## Crates under the MPL-2.0\n\n";
        s += "The MPL-2.0 is a file-level copyleft: these crates are compiled unmodified\n";
        s += "from their published source (crates.io, the version named), which is where\n";
        s += "their source is available; their licence text is below.\n\n";
        for c in &mpl {
            s += &format!("- {c}\n");
        }
    }
    s += &format!("\n## Rust crates ({})\n\n| crate | version | declared licence | used under |\n|---|---|---|---|\n", all.crates.len());
    for ((n, v), l) in &all.crates {
        let used: Vec<&str> = l.used_under.iter().map(String::as_str).collect();
        s += &format!("| {n} | {v} | {} | {} |\n", l.declared.replace('|', "\\|"), used.join(" AND "));
    }
    s += "\n## Licence texts\n";
    for ((id, full_name, text), users) in &all.texts {
        let users: Vec<String> = users.iter().map(|(n, v)| format!("{n} {v}")).collect();
        // A fence longer than any run of backquotes in the text.
        let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
        let fence = "`".repeat(longest.max(2) + 1);
        s += &format!("\n### {full_name} ({id})\n\nUsed by: {}\n\n{fence}text\n{}\n{fence}\n", users.join(", "), text.trim_end());
    }
    s
}

fn sha256_file(path: &Path) -> Result<String, String> {
    use sha2::Digest;
    let mut file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut hasher = sha2::Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(format!("{:x}", hasher.finalize()))
}

/// The files of `stage`, as sorted `/`-separated paths relative to it.
fn relative_files(stage: &Path) -> Result<Vec<String>, String> {
    let mut files: Vec<String> = bundle_files(stage)?
        .iter()
        .map(|p| p.strip_prefix(stage).map(|r| r.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/")))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    files.sort();
    Ok(files)
}

/// `stage/SHA256SUMS` in `sha256sum`'s format (`HASH  PATH`), one line per
/// file of the archive but itself: `sha256sum -c SHA256SUMS` in the
/// unpacked directory checks it.
pub fn write_sha256sums(stage: &Path) -> Result<(), String> {
    let mut lines = String::new();
    for rel in relative_files(stage)?.into_iter().filter(|r| r != "SHA256SUMS") {
        lines += &format!("{}  {rel}\n", sha256_file(&stage.join(&rel))?);
    }
    std::fs::write(stage.join("SHA256SUMS"), lines).map_err(|e| e.to_string())
}

/// `archive`: a gzipped tar of `stage` under the top directory `name`, the
/// entries in sorted order with fixed owners and times (the tar crate's
/// deterministic headers), so the same files give the same archive.
fn write_archive(stage: &Path, name: &str, archive: &Path) -> Result<(), String> {
    let file = std::fs::File::create(archive).map_err(|e| format!("{}: {e}", archive.display()))?;
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(std::io::BufWriter::new(file), flate2::Compression::default()));
    tar.mode(tar::HeaderMode::Deterministic);
    let mut entries: BTreeSet<String> = BTreeSet::new();
    for rel in relative_files(stage)? {
        // Each file's directories first, so that tar tools create them with
        // the archive's modes.
        let mut dir = String::new();
        for part in rel.split('/').collect::<Vec<_>>().split_last().map(|(_, dirs)| dirs.to_vec()).unwrap_or_default() {
            dir = if dir.is_empty() { part.to_string() } else { format!("{dir}/{part}") };
            entries.insert(format!("{dir}/"));
        }
        entries.insert(rel);
    }
    tar.append_path_with_name(stage, name).map_err(|e| format!("{}: {e}", stage.display()))?;
    for rel in &entries {
        let path = stage.join(rel.trim_end_matches('/'));
        tar.append_path_with_name(&path, format!("{name}/{}", rel.trim_end_matches('/'))).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let gz = tar.into_inner().map_err(|e| format!("{}: {e}", archive.display()))?;
    let mut out = gz.finish().map_err(|e| format!("{}: {e}", archive.display()))?;
    out.flush().map_err(|e| format!("{}: {e}", archive.display()))
}

/// Puts `archive`'s line into the `SHA256SUMS` beside it, keeping the lines
/// of other archives there (a CUDA and a plain archive in one directory).
fn record_checksum(sums: &Path, archive: &Path) -> Result<(), String> {
    let file_name = archive.file_name().ok_or("release: an archive path without a file name")?.to_string_lossy().to_string();
    let old = std::fs::read_to_string(sums).unwrap_or_default();
    let mut lines: Vec<String> = old.lines().filter(|l| !l.is_empty() && !l.ends_with(&format!("  {file_name}"))).map(str::to_string).collect();
    lines.push(format!("{}  {file_name}", sha256_file(archive)?));
    lines.sort_by(|a, b| a.split_once("  ").map(|x| x.1).cmp(&b.split_once("  ").map(|x| x.1)));
    std::fs::write(sums, lines.join("\n") + "\n").map_err(|e| format!("{}: {e}", sums.display()))
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::process::Command;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// A staged tree packed, unpacked by GNU tar and checked by `sha256sum
    /// -c`: every file is listed and matches, the executable bit survives,
    /// the same tree packs to the same bytes, and a changed file is caught.
    #[test]
    fn the_archive_unpacks_and_its_checksums_verify() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let stage = dir.path().join("stage");
        write(&stage.join("tts"), "#!/bin/sh\n");
        std::fs::set_permissions(stage.join("tts"), std::fs::Permissions::from_mode(0o755)).unwrap();
        write(&stage.join("lib/libx.so.0"), "x");
        write(&stage.join("plugins/deep/y.json"), "{}");
        super::write_sha256sums(&stage).unwrap();
        let sums = std::fs::read_to_string(stage.join("SHA256SUMS")).unwrap();
        let listed: Vec<&str> = sums.lines().map(|l| l.split_once("  ").unwrap().1).collect();
        assert_eq!(listed, ["lib/libx.so.0", "plugins/deep/y.json", "tts"]);
        let (a, b) = (dir.path().join("a.tar.gz"), dir.path().join("b.tar.gz"));
        super::write_archive(&stage, "tts-0-test", &a).unwrap();
        super::write_archive(&stage, "tts-0-test", &b).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap(), "the same files give the same archive");
        let unpacked = dir.path().join("unpacked");
        std::fs::create_dir(&unpacked).unwrap();
        assert!(Command::new("tar").arg("-xzf").arg(&a).arg("-C").arg(&unpacked).status().unwrap().success());
        let top = unpacked.join("tts-0-test");
        assert_eq!(std::fs::metadata(top.join("tts")).unwrap().permissions().mode() & 0o777, 0o755);
        assert_eq!(std::fs::metadata(top.join("lib/libx.so.0")).unwrap().permissions().mode() & 0o777, 0o644);
        let check = || Command::new("sha256sum").args(["--quiet", "-c", "SHA256SUMS"]).current_dir(&top).output().unwrap();
        assert!(check().status.success(), "{}", String::from_utf8_lossy(&check().stdout));
        std::fs::write(top.join("lib/libx.so.0"), "y").unwrap();
        let o = check();
        assert!(!o.status.success() && String::from_utf8_lossy(&o.stdout).contains("lib/libx.so.0: FAILED"));
    }

    /// The checksum file beside the archives keeps one line per archive:
    /// a rebuilt archive replaces its own line, another archive's stays.
    #[test]
    fn the_checksum_beside_the_archive_replaces_only_its_own_line() {
        let dir = tempfile::tempdir().unwrap();
        let (plain, cuda, sums) =
            (dir.path().join("tts-1-linux-x86_64.tar.gz"), dir.path().join("tts-1-linux-x86_64-cuda.tar.gz"), dir.path().join("SHA256SUMS"));
        std::fs::write(&plain, "one").unwrap();
        std::fs::write(&cuda, "two").unwrap();
        super::record_checksum(&sums, &plain).unwrap();
        super::record_checksum(&sums, &cuda).unwrap();
        std::fs::write(&plain, "three").unwrap();
        super::record_checksum(&sums, &plain).unwrap();
        let text = std::fs::read_to_string(&sums).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        let o = Command::new("sha256sum").args(["-c", "SHA256SUMS"]).current_dir(dir.path()).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    }

    fn inventory(entries: &[(&str, &str, &[&str])]) -> super::Crates {
        let mut all = super::Crates::default();
        for (name, declared, used) in entries {
            all.crates.insert(
                (name.to_string(), "1.0.0".into()),
                super::CrateLicense { declared: declared.to_string(), used_under: used.iter().map(|s| s.to_string()).collect() },
            );
            for id in *used {
                all.texts.entry((id.to_string(), format!("{id} licence"), format!("{id} text"))).or_default().insert((name.to_string(), "1.0.0".into()));
            }
        }
        all
    }

    /// The second guard: a crate used under GPL or AGPL, or under no licence
    /// at all, fails the inventory by name; LGPL and MPL pass, and the MPL
    /// crates are named in their own section.
    #[test]
    fn the_inventory_refuses_gpl_and_names_the_mpl_crates() {
        let ok = inventory(&[("serde", "MIT OR Apache-2.0", &["MIT"]), ("symphonia", "MPL-2.0", &["MPL-2.0"]), ("libsoxr-sys", "LGPL-2.0", &["LGPL-2.0"])]);
        super::check_crates(&ok).unwrap();
        let text = super::render_inventory("tts-1-linux-x86_64", &ok, "## Native libraries\n\nggml: MIT\n", &["libsoxr.so.0.copyright".into()]);
        let mpl = text.split("## Crates under the MPL-2.0").nth(1).unwrap().split("\n## ").next().unwrap();
        assert!(mpl.contains("- symphonia 1.0.0") && !mpl.contains("serde"), "{mpl}");
        assert!(text.contains("| symphonia | 1.0.0 | MPL-2.0 | MPL-2.0 |"));
        assert!(text.contains("- `licenses/libsoxr.so.0.copyright`") && text.contains("ggml: MIT"));
        assert!(text.contains("### MIT licence (MIT)\n\nUsed by: serde 1.0.0\n\n```text\nMIT text\n```\n"), "{text}");
        for (id, declared) in [("GPL-3.0-only", "GPL-3.0-only"), ("AGPL-3.0-or-later", "AGPL-3.0-or-later"), ("GPL-2.0-or-later", "MIT AND GPL-2.0-or-later")] {
            let bad = inventory(&[("serde", "MIT", &["MIT"]), ("copyleft", declared, &["MIT", id])]);
            let e = super::check_crates(&bad).unwrap_err();
            assert_eq!(e, format!("release: the licence inventory refuses:\ncopyleft 1.0.0 ({declared}): used under {id}; GPL code is not linked into tts"));
        }
        let e = super::check_crates(&inventory(&[("mystery", "(none declared)", &[])])).unwrap_err();
        assert!(e.ends_with("mystery 1.0.0 ((none declared)): no licence it is used under was found"), "{e}");
    }

    /// The report narrowed to the linked crates: the others and the texts
    /// only they used go; a linked crate the report lacks adds nothing.
    #[test]
    fn the_inventory_keeps_only_the_linked_crates() {
        let mut all = inventory(&[("serde", "MIT", &["MIT"]), ("goblin", "MIT", &["MIT"]), ("pyo3", "Apache-2.0", &["Apache-2.0"])]);
        let linked: std::collections::BTreeSet<(String, String)> = [("serde".to_string(), "1.0.0".to_string())].into();
        super::keep_linked(&mut all, &linked);
        assert_eq!(all.crates.keys().cloned().collect::<Vec<_>>(), [("serde".to_string(), "1.0.0".to_string())]);
        assert_eq!(all.texts.len(), 1, "{:?}", all.texts);
        assert_eq!(all.texts.values().next().unwrap().len(), 1);
        let more: std::collections::BTreeSet<(String, String)> =
            [("serde".to_string(), "1.0.0".to_string()), ("tokio".to_string(), "1.2.3".to_string())].into();
        super::keep_linked(&mut all, &more);
        assert_eq!(all.crates.keys().cloned().collect::<Vec<_>>(), [("serde".to_string(), "1.0.0".to_string())]);
    }

    /// The inventory's account of native libraries is docs/licenses.md's
    /// section, whole and alone.
    #[test]
    fn the_native_libraries_come_from_docs_licenses() {
        let md = std::fs::read_to_string(super::root().join("docs/licenses.md")).unwrap();
        let section = super::native_libraries_section(&md).unwrap();
        assert!(section.starts_with("## Native libraries\n"));
        for name in ["ggml", "libsoxr", "LAME", "libopus", "FDK AAC", "Vulkan loader"] {
            assert!(section.contains(name), "{name} missing");
        }
        assert!(!section.contains("## Rust crates"));
        assert!(super::native_libraries_section("# x\n\n## Other\n").is_err());
    }

    /// cargo-about with the project's accepted list, on a small workspace of
    /// local crates (outside this repository, so they count as third-party):
    /// a GPL-only crate in it fails the inventory, one that offers MIT as
    /// well is recorded under MIT.
    /// Skips without the installed tool unless `TTS_REQUIRE_RELEASE` is set
    /// (`cargo xtask test` installs it).
    #[test]
    fn cargo_about_refuses_a_gpl_only_crate() {
        let tool = super::root().join("target/tools/bin/cargo-about");
        if !tool.is_file() {
            assert!(std::env::var_os("TTS_REQUIRE_RELEASE").is_none(), "TTS_REQUIRE_RELEASE is set but {} is missing", tool.display());
            eprintln!("skipped: cargo-about is not installed in target/tools (cargo xtask release installs it)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path();
        let members = |names: &str| write(&ws.join("Cargo.toml"), &format!("[workspace]\nresolver = \"2\"\nmembers = [{names}]\n"));
        members("\"app\", \"either\"");
        let krate = |name: &str, license: &str, deps: &str| {
            write(
                &ws.join(name).join("Cargo.toml"),
                &format!("[package]\nname = \"{name}\"\nversion = \"1.0.0\"\nedition = \"2021\"\nlicense = \"{license}\"\n\n[dependencies]\n{deps}"),
            );
            write(&ws.join(name).join("src/lib.rs"), "");
        };
        krate("copyleft", "GPL-3.0-only", "");
        krate("either", "MIT OR GPL-2.0-or-later", "");
        krate("app", "MIT", "either = { path = \"../either\" }\n");
        assert!(Command::new(env!("CARGO")).args(["generate-lockfile", "--offline"]).current_dir(ws).status().unwrap().success());
        let all = super::crate_licenses(&tool, &[ws.join("app/Cargo.toml")]).unwrap();
        assert_eq!(all.crates[&("either".into(), "1.0.0".into())].used_under.iter().collect::<Vec<_>>(), ["MIT"]);
        members("\"app\", \"either\", \"copyleft\"");
        krate("app", "MIT", "either = { path = \"../either\" }\ncopyleft = { path = \"../copyleft\" }\n");
        assert!(Command::new(env!("CARGO")).args(["generate-lockfile", "--offline"]).current_dir(ws).status().unwrap().success());
        let e = super::crate_licenses(&tool, &[ws.join("app/Cargo.toml")]).unwrap_err();
        assert!(
            e.starts_with("release: cargo-about refused the licences of ")
                && e.contains("failed to satisfy license requirements")
                && e.contains("copyleft/Cargo.toml"),
            "{e}"
        );
    }
}
