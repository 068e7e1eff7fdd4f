//! `cargo xtask image`: the container image of `deploy/container/Containerfile`,
//! built with podman from a release archive (`cargo xtask release`), and the
//! local `debian:bookworm-slim` base made with debootstrap from Debian's
//! packages where no image registry can be reached. docs/container.md.

use crate::{root, run};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The base image the Containerfile names by default.
pub const REGISTRY_BASE: &str = "docker.io/library/debian:bookworm-slim";
/// Where [`debootstrap_base`] puts its stand-in for [`REGISTRY_BASE`].
pub const LOCAL_BASE: &str = "localhost/debian:bookworm-slim";
/// Debian's release the base is made from, and where its packages come from.
const SUITE: &str = "bookworm";
const MIRROR: &str = "http://deb.debian.org/debian";

struct Options {
    release: bool,
    archive: Option<PathBuf>,
    base: Option<String>,
    debootstrap: bool,
    store: Option<PathBuf>,
    tag: String,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options { release: true, archive: None, base: None, debootstrap: false, store: None, tag: format!("tts:{}", env!("CARGO_PKG_VERSION")) };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--debug" => o.release = false,
            "--archive" => o.archive = Some(PathBuf::from(value()?)),
            "--base" => o.base = Some(value()?),
            "--debootstrap-base" => o.debootstrap = true,
            "--store" => o.store = Some(PathBuf::from(value()?)),
            "--tag" => o.tag = value()?,
            _ => {
                return Err(format!("image: unknown option {a} (options: --debug, --archive FILE, --base IMAGE, --debootstrap-base, --store DIR, --tag NAME)"))
            }
        }
    }
    if o.debootstrap && o.base.is_some() {
        return Err("image: --base and --debootstrap-base both name the base; give one".into());
    }
    Ok(o)
}

/// `podman`, on a private store when `store` names one: its own root and run
/// directories and the vfs driver (no overlay or fuse needed), so a test or
/// CI never touches the machine's images.
pub fn podman(store: Option<&Path>) -> Command {
    let mut c = Command::new("podman");
    if let Some(store) = store {
        c.arg("--root").arg(store.join("root")).arg("--runroot").arg(store.join("run")).args(["--storage-driver", "vfs"]);
    }
    c
}

fn podman_output(store: Option<&Path>, args: &[&str]) -> Result<String, String> {
    let o = podman(store).args(args).output().map_err(|e| format!("podman: {e}"))?;
    if !o.status.success() {
        return Err(format!("podman {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// Builds the image; returns its tag and size in bytes.
pub fn image(args: &[String]) -> Result<(String, u64), String> {
    let o = parse(args)?;
    let store = o.store.as_deref();
    let archive = match &o.archive {
        Some(a) => a.clone(),
        None => {
            let mut release_args = vec!["--out".to_string(), root().join("dist/release").display().to_string()];
            if !o.release {
                release_args.push("--debug".into());
            }
            crate::release::release(&release_args)?
        }
    };
    let base = match (&o.base, o.debootstrap) {
        (Some(b), _) => b.clone(),
        (None, true) => debootstrap_base(store)?,
        (None, false) => REGISTRY_BASE.to_string(),
    };
    let context = build_context(&archive)?;
    let archive_name = archive.file_name().and_then(|n| n.to_str()).ok_or_else(|| format!("{}: not a file name", archive.display()))?;
    // `--layers=false` commits each stage once instead of once per
    // instruction: under the vfs driver every commit is a full copy of the
    // file system, so per-instruction layers took 5.6 GB of disk at their
    // peak for a 355 MB image, and this takes 1.1 GB (and half the time).
    let built = run(podman(store)
        .args(["build", "--format", "docker", "--isolation", "chroot", "--pull=missing", "--layers=false", "-f"])
        .arg(root().join("deploy/container/Containerfile"))
        .args(["--build-arg", &format!("BASE={base}"), "--build-arg", &format!("ARCHIVE={archive_name}"), "-t", &o.tag])
        .arg(&context));
    let _ = std::fs::remove_dir_all(&context);
    built?;
    // The intermediate stage (the unpacked archive) is not part of the
    // image; in a private store nothing else is, so it is pruned there. A
    // user's own store is left as it is (pruning would take their dangling
    // images too).
    if store.is_some() {
        let _ = podman(store).args(["image", "prune", "-f"]).output();
    }
    let size: u64 = podman_output(store, &["image", "inspect", "--format", "{{.Size}}", &o.tag])?.parse().map_err(|e| format!("image size: {e}"))?;
    eprintln!("image: {} ({:.1} MB, {:.1} MiB; base {base})", o.tag, size as f64 / 1e6, size as f64 / 1048576.0);
    Ok((o.tag, size))
}

/// A directory holding only the archive and its line of the `SHA256SUMS`
/// beside it: podman reads the whole context, and the release directory may
/// hold other archives.
fn build_context(archive: &Path) -> Result<PathBuf, String> {
    let name = archive.file_name().and_then(|n| n.to_str()).ok_or_else(|| format!("{}: not a file name", archive.display()))?;
    let sums_path = archive.with_file_name("SHA256SUMS");
    let sums = std::fs::read_to_string(&sums_path).map_err(|e| format!("{}: {e} (written by `cargo xtask release`)", sums_path.display()))?;
    let line = sums
        .lines()
        .find(|l| l.split_once("  ").is_some_and(|(_, file)| file == name))
        .ok_or_else(|| format!("{} has no line for {name}", sums_path.display()))?;
    let context = root().join(format!("target/container/context-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&context);
    std::fs::create_dir_all(&context).map_err(|e| format!("{}: {e}", context.display()))?;
    if std::fs::hard_link(archive, context.join(name)).is_err() {
        std::fs::copy(archive, context.join(name)).map_err(|e| format!("{}: {e}", archive.display()))?;
    }
    std::fs::write(context.join("SHA256SUMS"), format!("{line}\n")).map_err(|e| e.to_string())?;
    Ok(context)
}

/// [`LOCAL_BASE`] in `store`, made once: a minimal Debian from its packages
/// (debootstrap, as root), trimmed as Debian's slim images are (no manuals,
/// documentation but copyright files, translations, package lists or
/// downloaded packages) and imported as an image.
pub fn debootstrap_base(store: Option<&Path>) -> Result<String, String> {
    if podman(store).args(["image", "exists", LOCAL_BASE]).status().is_ok_and(|s| s.success()) {
        return Ok(LOCAL_BASE.to_string());
    }
    let work = root().join(format!("target/container/debootstrap-{}", std::process::id()));
    let rootfs = work.join("rootfs");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let made = (|| {
        run(Command::new("debootstrap").args(["--variant=minbase", SUITE]).arg(&rootfs).arg(MIRROR))?;
        slim(&rootfs)?;
        let mut import = podman(store);
        import.args(["import", "--change", "CMD [\"bash\"]", "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]);
        // podman import reads a tarball; tar writes it from the tree, owners kept.
        let tar = work.join("rootfs.tar");
        run(Command::new("tar").arg("-C").arg(&rootfs).args(["--numeric-owner", "-cf"]).arg(&tar).arg("."))?;
        run(import.arg(&tar).arg(LOCAL_BASE))
    })();
    let _ = std::fs::remove_dir_all(&work);
    made.map(|_| LOCAL_BASE.to_string())
}

/// What Debian's slim images leave out, removed, and dpkg and apt told to
/// keep it out of later package installs.
fn slim(rootfs: &Path) -> Result<(), String> {
    let write = |rel: &str, text: &str| std::fs::write(rootfs.join(rel), text).map_err(|e| format!("{rel}: {e}"));
    write(
        "etc/dpkg/dpkg.cfg.d/slim",
        "path-exclude /usr/share/doc/*\npath-include /usr/share/doc/*/copyright\npath-exclude /usr/share/man/*\n\
         path-exclude /usr/share/groff/*\npath-exclude /usr/share/info/*\npath-exclude /usr/share/lintian/*\n\
         path-exclude /usr/share/linda/*\npath-exclude /usr/share/locale/*\n",
    )?;
    write(
        "etc/apt/apt.conf.d/slim",
        "DPkg::Post-Invoke { \"rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true\"; };\n\
         APT::Update::Post-Invoke { \"rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true\"; };\n\
         Dir::Cache::pkgcache \"\";\nDir::Cache::srcpkgcache \"\";\nAcquire::GzipIndexes \"true\";\nAcquire::Languages \"none\";\n",
    )?;
    let script = "set -e; cd \"$1\"; \
        find usr/share/doc -mindepth 1 ! -name copyright ! -type d -delete; find usr/share/doc -mindepth 1 -type d -empty -delete; \
        rm -rf usr/share/man/* usr/share/groff/* usr/share/info/* usr/share/lintian/* usr/share/linda/* usr/share/locale/*; \
        rm -rf var/lib/apt/lists/* var/cache/apt/archives/*.deb var/cache/apt/*.bin var/log/*.log var/log/apt/* tmp/*";
    run(Command::new("sh").args(["-c", script, "sh"]).arg(rootfs))
}
