//! The container image (`deploy/container/Containerfile`), which
//! `cargo xtask test` builds with podman on a base made with debootstrap and
//! names in `TTS_TEST_IMAGE` (its private store in `TTS_TEST_IMAGE_STORE`).
//! Containers cannot run on these machines (crun and cgroups), so the test
//! exports the image's root filesystem and runs its configuration (entrypoint,
//! command, environment, user, working directory, health check) the way a
//! runtime would: chroot as the image's user, in new network, mount and PID
//! namespaces whose loopback is the only network, with /proc, /dev and a
//! /tmp mounted. Needs root; skipped without the image, unless
//! `TTS_REQUIRE_CONTAINER` is set (CI sets it).

mod common;

use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const KEY: &str = "container-key-1";

/// The image under test: its tag, store and configuration.
struct Image {
    tag: String,
    store: PathBuf,
    inspect: Value,
}

impl Image {
    fn from_env() -> Option<Image> {
        let (Some(tag), Some(store)) = (std::env::var_os("TTS_TEST_IMAGE"), std::env::var_os("TTS_TEST_IMAGE_STORE")) else {
            assert!(std::env::var_os("TTS_REQUIRE_CONTAINER").is_none(), "TTS_REQUIRE_CONTAINER is set but no TTS_TEST_IMAGE: run `cargo xtask test`");
            println!("skipped: no TTS_TEST_IMAGE (`cargo xtask test` builds the image where podman and debootstrap are installed)");
            return None;
        };
        let mut image = Image { tag: tag.into_string().unwrap(), store: PathBuf::from(store), inspect: Value::Null };
        let out = image.podman(&["image", "inspect", &image.tag.clone()]);
        image.inspect = serde_json::from_slice::<Value>(&out).unwrap()[0].clone();
        Some(image)
    }

    fn podman(&self, args: &[&str]) -> Vec<u8> {
        let out = Command::new("podman")
            .arg("--root")
            .arg(self.store.join("root"))
            .arg("--runroot")
            .arg(self.store.join("run"))
            .args(["--storage-driver", "vfs"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "podman {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        out.stdout
    }

    fn config(&self, key: &str) -> &Value {
        &self.inspect["Config"][key]
    }

    fn strings(&self, key: &str) -> Vec<String> {
        self.config(key).as_array().map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect()).unwrap_or_default()
    }

    /// The image's files, as `podman export` writes them, in `dir`.
    fn export_to(&self, dir: &Path) {
        let name = format!("tts-test-{}", std::process::id());
        self.podman(&["create", "--name", &name, &self.tag]);
        let tar = dir.join("rootfs.tar");
        self.podman(&["export", "-o", tar.to_str().unwrap(), &name]);
        self.podman(&["rm", &name]);
        let rootfs = dir.join("rootfs");
        std::fs::create_dir(&rootfs).unwrap();
        let status = Command::new("tar").arg("-C").arg(&rootfs).args(["--numeric-owner", "-xf"]).arg(&tar).status().unwrap();
        assert!(status.success());
        std::fs::remove_file(&tar).unwrap();
    }

    /// (uid, gid) of the image's `USER uid:gid`.
    fn user(&self) -> (u32, u32) {
        let user = self.config("User").as_str().unwrap();
        let (u, g) = user.split_once(':').unwrap_or((user, user));
        (u.parse().expect("USER is numeric"), g.parse().expect("USER's group is numeric"))
    }

    /// `env -i` arguments: the image's environment, and HOME from the
    /// user's passwd entry, as container runtimes set it.
    fn environment(&self, rootfs: &Path, extra: &[(&str, &str)]) -> Vec<String> {
        let (uid, _) = self.user();
        let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
        let home = passwd.lines().map(|l| l.split(':').collect::<Vec<_>>()).find(|f| f.len() > 5 && f[2] == uid.to_string()).map(|f| f[5].to_string()).unwrap();
        let mut env = self.strings("Env");
        env.push(format!("HOME={home}"));
        env.extend(extra.iter().map(|(k, v)| format!("{k}={v}")));
        env
    }
}

/// The entrypoint and command of `image` running in `rootfs` as a runtime
/// would run them, stderr read line by line.
struct Running {
    /// `unshare`, holding the namespaces; the server is its child.
    holder: Option<Child>,
    server_pid: i32,
    stderr: std::sync::mpsc::Receiver<String>,
}

impl Drop for Running {
    fn drop(&mut self) {
        // --kill-child: the server goes with its holder.
        if let Some(mut holder) = self.holder.take() {
            let _ = holder.kill();
            let _ = holder.wait();
        }
    }
}

/// The container's process (`unshare`, then the server as its child) and
/// its stderr, line by line.
fn spawn(image: &Image, rootfs: &Path, env: &[(&str, &str)]) -> (Child, std::sync::mpsc::Receiver<String>) {
    let (uid, gid) = image.user();
    let workdir = image.config("WorkingDir").as_str().unwrap_or("/").to_string();
    let mut argv = image.strings("Entrypoint");
    argv.extend(image.strings("Cmd"));
    // What a runtime gives a container: its own loopback, /proc of its PID
    // namespace, /dev, a /tmp; then the image's root, user, directory and
    // environment.
    let script = r#"set -e; R="$1"; shift
        ip link set lo up
        mount --rbind /dev "$R/dev"
        mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"
        exec "$@""#;
    let mut cmd = Command::new("unshare");
    cmd.args(["--net", "--mount", "--pid", "--fork", "--kill-child"])
        .arg(format!("--mount-proc={}", rootfs.join("proc").display()))
        .args(["sh", "-c", script, "sh"])
        .arg(rootfs)
        .arg("chroot")
        .arg(format!("--userspec={uid}:{gid}"))
        .arg(rootfs)
        .args(["/usr/bin/env", "-i", "-C", &workdir])
        .args(image.environment(rootfs, env))
        .args(&argv)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut holder = cmd.spawn().unwrap();
    let (send, stderr) = std::sync::mpsc::channel();
    let lines = BufReader::new(holder.stderr.take().unwrap()).lines();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            if send.send(line).is_err() {
                break;
            }
        }
    });
    (holder, stderr)
}

/// Runs the container until it ends (a hang guard of a minute): its exit
/// status and what it said.
fn run_to_end(image: &Image, rootfs: &Path, env: &[(&str, &str)]) -> (std::process::ExitStatus, String) {
    let (holder, stderr) = spawn(image, rootfs, env);
    let out = wait_or_kill(holder, Duration::from_secs(60), "the container");
    (out.status, stderr.iter().collect::<Vec<_>>().join("\n"))
}

/// Starts the container and waits for its server process.
fn start(image: &Image, rootfs: &Path, env: &[(&str, &str)]) -> Running {
    let (mut holder, stderr) = spawn(image, rootfs, env);
    // The server: the holder's child once the chain of execs reaches `tts`.
    let started = Instant::now();
    let server_pid = loop {
        let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", holder.id())).unwrap_or_default();
        if let Some(pid) = children.split_whitespace().next().and_then(|p| p.parse::<i32>().ok()) {
            if std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "tts") {
                break pid;
            }
        }
        if let Some(status) = holder.try_wait().unwrap() {
            let said: Vec<String> = stderr.try_iter().collect();
            panic!("the container's process ended ({status}) before `tts` started: {}", said.join("\n"));
        }
        assert!(started.elapsed() < Duration::from_secs(60), "no `tts` process (hang guard)");
        std::thread::sleep(Duration::from_millis(20));
    };
    Running { holder: Some(holder), server_pid, stderr }
}

impl Running {
    /// Waits for the container to end (a hang guard of a minute); its exit
    /// status and what it said that was not read yet.
    fn finish(mut self) -> (std::process::ExitStatus, String) {
        let out = wait_or_kill(self.holder.take().unwrap(), Duration::from_secs(60), "the container");
        // The reader ends with the pipe, closed once the process is gone.
        let said: Vec<String> = self.stderr.iter().collect();
        (out.status, said.join("\n"))
    }

    /// Runs `f` on a thread inside the container's network namespace, where
    /// 127.0.0.1 is the container's loopback.
    fn in_network<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let ns = std::fs::File::open(format!("/proc/{}/ns/net", self.server_pid)).unwrap();
        std::thread::spawn(move || {
            // SAFETY: setns on this thread only, with a namespace file we hold open.
            assert_eq!(unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) }, 0, "setns: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .unwrap()
    }

    /// The image's HEALTHCHECK command, run as a runtime runs it: in the
    /// container's namespaces, root and directory, as its user.
    fn health_check(&self, image: &Image, rootfs: &Path) -> std::process::Output {
        let test = image.inspect["Healthcheck"]["Test"].as_array().expect("the image has a HEALTHCHECK");
        assert_eq!(test[0], "CMD", "exec form");
        let argv: Vec<&str> = test[1..].iter().map(|v| v.as_str().unwrap()).collect();
        let (uid, gid) = image.user();
        let pid = self.server_pid.to_string();
        let child = Command::new("nsenter")
            .args(["--target", &pid, "--net", "--mount", "--pid", "--root", "--wd"])
            .args(["--setuid", &uid.to_string(), "--setgid", &gid.to_string()])
            .args(["/usr/bin/env", "-i"])
            .args(image.environment(rootfs, &[]))
            .args(&argv)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_or_kill(child, Duration::from_secs(60), "the health check")
    }

    fn wait_for_line(&self, prefix: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(_) => {}
                Err(e) => panic!("no line starting `{prefix}` from the container ({e})"),
            }
        }
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(120))).build().into()
}

/// A model in the image's models volume as `tts pull` leaves one: its GGUF
/// and profile under the name the image's command serves.
fn mount_models(image: &Image, rootfs: &Path) {
    let cmd = image.strings("Cmd");
    let name = cmd.iter().position(|a| a == "--model-name").map(|i| cmd[i + 1].clone()).expect("the command names a model");
    let env = image.strings("Env");
    let models = env.iter().find_map(|e| e.strip_prefix("TTS_MODELS_DIR=")).expect("TTS_MODELS_DIR is set");
    let dir = rootfs.join(models.trim_start_matches('/')).join(&name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(supertonic_fixture(), dir.join("model.gguf")).unwrap();
    std::fs::write(dir.join("profile.toml"), "[backend]\nprefer = [\"vulkan\", \"cpu\"]\n[backends.cpu]\nthreads = 1\n[model]\nfiles = [\"model.gguf\"]\n")
        .unwrap();
    let (uid, gid) = image.user();
    for p in [dir.clone(), dir.join("model.gguf"), dir.join("profile.toml")] {
        std::os::unix::fs::chown(&p, Some(uid), Some(gid)).unwrap();
    }
}

#[test]
fn the_image_serves_speech_from_its_extracted_root_filesystem() {
    let Some(image) = Image::from_env() else { return };
    // What the Containerfile promises, in the image's configuration.
    assert_ne!(image.user().0, 0, "runs as a non-root user");
    let entrypoint = image.strings("Entrypoint");
    assert_eq!(&entrypoint[..2], ["tts", "serve"]);
    assert!(entrypoint.windows(2).any(|w| w == ["--host", "0.0.0.0"]) && entrypoint.iter().any(|a| a == "--require-api-key"), "{entrypoint:?}");
    assert!(image.config("ExposedPorts")["8880/tcp"].is_object());
    assert!(image.config("Volumes")["/models"].is_object());

    let dir = tempfile::tempdir().unwrap();
    image.export_to(dir.path());
    let rootfs = dir.path().join("rootfs");
    // The bundle only: every file as its SHA256SUMS lists it, owned by root
    // (the server's user cannot change its own code), and no build tools.
    let bundle = rootfs.join("opt/tts");
    let sums = std::fs::read_to_string(bundle.join("SHA256SUMS")).unwrap();
    let check = Command::new("sha256sum").args(["--quiet", "--strict", "-c", "SHA256SUMS"]).current_dir(&bundle).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stdout));
    assert!(sums.lines().any(|l| l.ends_with("  tts")) && sums.lines().any(|l| l.contains("plugins/libtts_backend_vulkan.so")), "cpu + vulkan");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(bundle.join("tts")).unwrap().uid(), 0);
    for tool in ["usr/bin/cc", "usr/bin/gcc", "usr/bin/cargo", "usr/bin/cmake", "usr/bin/curl"] {
        assert!(!rootfs.join(tool).exists(), "{tool} is in the runtime image");
    }
    assert!(
        rootfs.join("usr/lib/x86_64-linux-gnu/libvulkan.so.1").exists() || rootfs.join("usr/lib/aarch64-linux-gnu/libvulkan.so.1").exists(),
        "the Vulkan loader"
    );
    mount_models(&image, &rootfs);

    // No key in the environment: refused, in one line, before listening.
    let (status, said) = run_to_end(&image, &rootfs, &[]);
    assert_eq!(status.code(), Some(1), "{said}");
    assert_eq!(said, "error: no API key, and --require-api-key is given: set TTS_API_KEY (or --api-key)");

    let server = start(&image, &rootfs, &[("TTS_API_KEY", KEY)]);
    assert_eq!(server.wait_for_line("listening on "), "listening on http://0.0.0.0:8880 (loading 1 model(s))");
    server.wait_for_line("ready: ");
    let health = server.health_check(&image, &rootfs);
    assert!(health.status.success(), "HEALTHCHECK: {}", String::from_utf8_lossy(&health.stderr));
    let (models_without_key, speech) = server.in_network(|| {
        let agent = agent();
        let unauthorized = agent.get("http://127.0.0.1:8880/v1/models").call().unwrap().status().as_u16();
        let body = serde_json::json!({"model": "supertonic-2", "voice": "F1", "input": "Hello from the container.", "response_format": "pcm"});
        let mut r = agent.post("http://127.0.0.1:8880/v1/audio/speech").header("Authorization", format!("Bearer {KEY}")).send_json(&body).unwrap();
        (unauthorized, (r.status().as_u16(), r.body_mut().with_config().limit(64 << 20).read_to_vec().unwrap()))
    });
    assert_eq!(models_without_key, 401);
    assert_eq!(speech.0, 200, "{}", String::from_utf8_lossy(&speech.1));
    // 16-bit little-endian samples.
    let samples: Vec<i16> = speech.1.chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]])).collect();
    assert!(speech.1.len() % 2 == 0 && samples.len() > 1000 && samples.iter().any(|s| s.unsigned_abs() > 3), "{} samples", samples.len());

    // SIGTERM (the image's STOPSIGNAL) to the server, PID 1 of its
    // namespace: it drains and exits 0.
    assert_eq!(image.config("StopSignal"), "SIGTERM");
    unsafe { libc::kill(server.server_pid, libc::SIGTERM) };
    let (status, said) = server.finish();
    assert!(status.success(), "{status:?}: {said}");
}
