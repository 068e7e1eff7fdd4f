//! `tts pull`, `tts models` and `tts --model-name` against a loopback
//! stand-in for the Hugging Face Hub (started by each test on 127.0.0.1:0):
//! the model-info API with file lists and SHA-256s, and
//! `/{repo}/resolve/{revision}/{file}` with ETag, X-Repo-Commit and Range. It
//! serves the committed official-format tiny checkpoints under the catalog's
//! repository names, and can cut a download mid-file, corrupt one, require a
//! token, lack a file or a revision. Every run has a PATH with no Python.

mod common;

use common::*;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The catalog's Turbo pin, which the stand-in answers for.
const TURBO_PIN: &str = "749d1c1a46eb10492095d68fbcf55691ccf137cd";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// One repository the stand-in serves.
#[derive(Clone)]
struct FakeRepo {
    commit: String,
    files: BTreeMap<String, Vec<u8>>,
    /// Answer 401 unless `Authorization: Bearer <this>`.
    token: Option<String>,
}

impl FakeRepo {
    fn new(name: &str) -> Self {
        FakeRepo { commit: sha256(name.as_bytes())[..40].to_string(), files: BTreeMap::new(), token: None }
    }
    /// `dir`'s files (recursively) under their relative paths.
    fn with_dir(mut self, dir: &Path) -> Self {
        fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(root, &p, out);
                } else {
                    out.insert(p.strip_prefix(root).unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap());
                }
            }
        }
        walk(dir, dir, &mut self.files);
        self
    }
    fn with_file(mut self, name: &str, bytes: Vec<u8>) -> Self {
        self.files.insert(name.to_string(), bytes);
        self
    }
}

/// Large binaries live in LFS on the Hub (their ETag is their SHA-256); the
/// small text files are plain git blobs.
fn is_lfs(name: &str) -> bool {
    [".safetensors", ".pt", ".onnx"].iter().any(|e| name.ends_with(e))
}

#[derive(Default)]
struct Faults {
    /// "repo/file" → N: the next N body downloads are cut after half their bytes.
    cuts: BTreeMap<String, usize>,
    /// "repo/file": the next body download has one byte changed.
    corrupt_once: HashSet<String>,
    /// "repo/file": every body download has one byte changed.
    corrupt_always: HashSet<String>,
    /// "repo/file": answered with an ETag that is a path.
    path_etag: HashSet<String>,
}

struct HubState {
    repos: BTreeMap<String, FakeRepo>,
    faults: Mutex<Faults>,
    /// One line per request: "info REPO REV" or "get REPO/FILE RANGE".
    log: Mutex<Vec<String>>,
}

/// The loopback Hub: serves until dropped.
struct FakeHub {
    url: String,
    state: Arc<HubState>,
    stop: Arc<AtomicBool>,
    addr: std::net::SocketAddr,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeHub {
    fn start(repos: Vec<(&str, FakeRepo)>, faults: Faults) -> FakeHub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state =
            Arc::new(HubState { repos: repos.into_iter().map(|(n, r)| (n.to_string(), r)).collect(), faults: Mutex::new(faults), log: Mutex::new(Vec::new()) });
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (state.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            // Bounded: a test makes a few dozen requests at most.
            for stream in listener.incoming().take(10_000) {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let s = s.clone();
                std::thread::spawn(move || serve(stream, &s));
            }
        });
        FakeHub { url: format!("http://{addr}"), state, stop, addr, thread: Some(thread) }
    }
    fn log(&self) -> Vec<String> {
        self.state.log.lock().unwrap().clone()
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn respond(stream: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) {
    let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
    for (k, v) in headers {
        head += &format!("{k}: {v}\r\n");
    }
    head += "\r\n";
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body);
    let _ = stream.flush();
}

fn serve(mut stream: TcpStream, state: &HubState) {
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 65536 {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut lines = head.split("\r\n");
    let target = lines.next().unwrap_or("").split(' ').nth(1).unwrap_or("").to_string();
    let header = |name: &str| {
        head.split("\r\n").skip(1).find_map(|l| l.split_once(':').filter(|(k, _)| k.trim().eq_ignore_ascii_case(name)).map(|(_, v)| v.trim().to_string()))
    };
    let path = target.split('?').next().unwrap_or("").to_string();
    let authorization = header("authorization");
    // As the Hub: a gated repository's listing is public, its files are not.
    let find = |owner: &str, name: &str, revision: &str, file: bool| -> Result<(String, FakeRepo), (&'static str, &'static str)> {
        let id = format!("{owner}/{name}");
        let repo = state.repos.get(&id).ok_or(("401 Unauthorized", "RepoNotFound"))?;
        if let Some(token) = repo.token.as_ref().filter(|_| file) {
            if authorization.as_deref() != Some(format!("Bearer {token}").as_str()) {
                return Err(("401 Unauthorized", "GatedRepo"));
            }
        }
        if revision != "main" && revision != repo.commit {
            return Err(("404 Not Found", "RevisionNotFound"));
        }
        Ok((id, repo.clone()))
    };
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if let ["api", "models", owner, name, "revision", revision] = segments.as_slice() {
        state.log.lock().unwrap().push(format!("info {owner}/{name} {revision}"));
        match find(owner, name, revision, false) {
            Err((status, code)) => respond(&mut stream, status, &[("X-Error-Code", code.into())], b"{\"error\":\"refused\"}"),
            Ok((id, repo)) => {
                let siblings: Vec<serde_json::Value> = repo
                    .files
                    .iter()
                    .map(|(f, bytes)| {
                        let mut v = serde_json::json!({"rfilename": f, "size": bytes.len(), "blobId": &sha256(bytes)[..40]});
                        if is_lfs(f) {
                            v["lfs"] = serde_json::json!({"sha256": sha256(bytes), "size": bytes.len(), "pointerSize": 134});
                        }
                        v
                    })
                    .collect();
                let body = serde_json::json!({"id": id, "sha": repo.commit, "siblings": siblings});
                respond(&mut stream, "200 OK", &[("Content-Type", "application/json".into())], body.to_string().as_bytes());
            }
        }
        return;
    }
    if let [owner, name, "resolve", revision, file @ ..] = segments.as_slice() {
        let file = file.join("/");
        let range = header("range");
        state.log.lock().unwrap().push(format!("get {owner}/{name}/{file} {}", range.as_deref().unwrap_or("-")));
        let (id, repo) = match find(owner, name, revision, true) {
            Ok(r) => r,
            Err((status, code)) => return respond(&mut stream, status, &[("X-Error-Code", code.into())], b""),
        };
        let Some(bytes) = repo.files.get(&file) else {
            return respond(&mut stream, "404 Not Found", &[("X-Error-Code", "EntryNotFound".into())], b"");
        };
        let key = format!("{id}/{file}");
        let mut etag = if is_lfs(&file) { sha256(bytes) } else { sha256(bytes)[..40].to_string() };
        if state.faults.lock().unwrap().path_etag.contains(&key) {
            etag = "../../../escaped".into();
        }
        let mut headers = vec![("X-Repo-Commit", repo.commit.clone()), ("ETag", format!("\"{etag}\"")), ("Accept-Ranges", "bytes".into())];
        let total = bytes.len();
        let (start, end) = match range.as_deref().and_then(|r| r.strip_prefix("bytes=")).and_then(|r| r.split_once('-')) {
            Some((a, b)) => (a.parse::<usize>().unwrap_or(0), b.parse::<usize>().map_or(total, |e| (e + 1).min(total))),
            None => (0, total),
        };
        if range.is_some() && start >= total {
            return respond(&mut stream, "416 Range Not Satisfiable", &[("Content-Range", format!("bytes */{total}"))], b"");
        }
        let probe = range.as_deref() == Some("bytes=0-0");
        let mut body = bytes[start.min(total)..end.max(start).min(total)].to_vec();
        let mut cut = None;
        if !probe {
            let mut faults = state.faults.lock().unwrap();
            if let Some(n) = faults.cuts.get_mut(&key).filter(|n| **n > 0) {
                *n -= 1;
                cut = Some(body.len() / 2);
            }
            if (faults.corrupt_once.remove(&key) || faults.corrupt_always.contains(&key)) && !body.is_empty() {
                let i = body.len() / 3;
                body[i] ^= 0x5a;
            }
        }
        if range.is_some() {
            headers.push(("Content-Range", format!("bytes {start}-{}/{total}", end.max(start + 1) - 1)));
        }
        let status = if range.is_some() { "206 Partial Content" } else { "200 OK" };
        match cut {
            // Promises the whole body, sends half, and closes.
            Some(half) => {
                let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
                for (k, v) in &headers {
                    head += &format!("{k}: {v}\r\n");
                }
                head += "\r\n";
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(&body[..half]);
                let _ = stream.flush();
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
            None => respond(&mut stream, status, &headers, &body),
        }
        return;
    }
    respond(&mut stream, "404 Not Found", &[], b"");
}

fn fixture(rel: &str) -> PathBuf {
    repo().join("tests/fixtures").join(rel)
}

fn turbo_repo() -> FakeRepo {
    FakeRepo { commit: TURBO_PIN.into(), ..FakeRepo::new("turbo") }.with_dir(&fixture("chatterbox/turbo-tiny/official"))
}

fn nano_repo() -> FakeRepo {
    let t3 = std::fs::read(fixture("chatterbox/turbo-tiny/official/t3_turbo_v1.safetensors")).unwrap();
    FakeRepo::new("nano").with_file("t3_nano_v1.safetensors", t3)
}

fn mtl_repo() -> FakeRepo {
    // Cangjie5_TC.json: tab-separated "char\tcode" lines, as the official file.
    FakeRepo::new("mtl").with_dir(&fixture("chatterbox/mtl-tiny/official")).with_file("Cangjie5_TC.json", "日\ta\n月\tb\n".as_bytes().to_vec())
}

fn supertonic_repo(version: &str) -> FakeRepo {
    FakeRepo::new(version).with_dir(&fixture(&format!("supertonic/tiny-{version}/official")))
}

/// Every repository of the catalog, as the stand-in serves them.
fn all_repos() -> Vec<(&'static str, FakeRepo)> {
    vec![
        ("ResembleAI/chatterbox-turbo", turbo_repo()),
        ("ResembleAI/chatterbox-nano", nano_repo()),
        ("ResembleAI/chatterbox", mtl_repo()),
        ("Supertone/supertonic", supertonic_repo("v1")),
        ("Supertone/supertonic-2", supertonic_repo("v2")),
        ("Supertone/supertonic-3", supertonic_repo("v3")),
    ]
}

/// A user's machine: a Hugging Face home, a models directory, a PATH with
/// no Python on it, and the plugins.
/// The environment variable naming a bundle (`cargo xtask dist`'s output)
/// to run instead of the build tree's `tts`: `cargo xtask test` sets it to
/// the bundle it checked, so that these tests run `tts pull` as a user of a
/// fresh bundle does, with the bundle's own plugins and no Python on PATH.
const BUNDLE_ENV: &str = "TTS_TEST_BUNDLE";

struct Machine {
    dir: tempfile::TempDir,
    /// `tts` and its plugin directory: the build tree's, or a bundle's.
    tts: PathBuf,
    plugins: PathBuf,
    /// Whether `--plugin-dir` is passed (not for a bundle, which finds its own).
    pass_plugin_dir: bool,
    _plugin_copy: Option<tempfile::TempDir>,
}

impl Machine {
    fn new() -> Machine {
        let dir = tempfile::tempdir().unwrap();
        for d in ["hf", "models", "bin"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        match std::env::var_os(BUNDLE_ENV).map(PathBuf::from) {
            Some(bundle) => Machine { dir, tts: bundle.join("tts"), plugins: bundle.join("plugins"), pass_plugin_dir: false, _plugin_copy: None },
            None => {
                let copy = plugins_with(&["cpu"], &["chatterbox", "supertonic"]);
                Machine { dir, tts: tts(), plugins: copy.path().to_path_buf(), pass_plugin_dir: true, _plugin_copy: Some(copy) }
            }
        }
    }
    /// `--plugin-dir DIR` where the plugins are not a bundle's own.
    fn plugin_args(&self) -> Vec<&str> {
        if self.pass_plugin_dir {
            vec!["--plugin-dir", self.plugins.to_str().unwrap()]
        } else {
            Vec::new()
        }
    }
    fn models(&self) -> PathBuf {
        self.dir.path().join("models")
    }
    fn cache(&self) -> PathBuf {
        self.dir.path().join("hf/hub")
    }
    fn command(&self, hub: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.tts);
        cmd.args(args).env_remove("TTS_LOG").env_remove(engine_core::output::TEST_FAULT_ENV);
        for k in ["HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME", "XDG_DATA_HOME", "TTS_PLUGIN_PATH"] {
            cmd.env_remove(k);
        }
        // ureq reads the proxy variables and has no NO_PROXY: loopback must
        // not go through a proxy of the machine's.
        for k in ["ALL_PROXY", "HTTPS_PROXY", "HTTP_PROXY", "all_proxy", "https_proxy", "http_proxy"] {
            cmd.env_remove(k);
        }
        cmd.env("HF_HOME", self.dir.path().join("hf")).env("HF_ENDPOINT", hub).env("TTS_MODELS_DIR", self.models());
        cmd.env("PATH", self.dir.path().join("bin")).env("HOME", self.dir.path());
        cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        cmd
    }
    fn run(&self, hub: &str, args: &[&str], envs: &[(&str, &str)]) -> Output {
        let mut cmd = self.command(hub, args);
        cmd.envs(envs.iter().copied());
        wait_or_kill(cmd.spawn().unwrap(), Duration::from_secs(300), &format!("tts {}", args.join(" ")))
    }
    fn pull(&self, hub: &str, spec: &str, extra: &[&str], envs: &[(&str, &str)]) -> Output {
        let mut args = vec!["pull", spec];
        args.extend(self.plugin_args());
        args.extend_from_slice(extra);
        self.run(hub, &args, envs)
    }
    /// The models directory holds exactly these entries (no temporary).
    fn assert_models(&self, want: &[&str]) {
        let got = if self.models().exists() { dir_names(&self.models()) } else { Vec::new() };
        assert_eq!(got, want, "models directory");
    }
}

/// The converter options the tiny checkpoints need (their head counts are
/// not the full models').
const TURBO_TINY: &[&str] = &["--set", "t3_heads=2", "--set", "cfm_heads=2"];
const MTL_TINY: &[&str] = &["--set", "t3_heads=4", "--set", "cfm_heads=2", "--set", "aligned_heads=2:3,3:1,1:2"];

fn assert_ok(o: &Output, what: &str) {
    assert!(o.status.success(), "{what}: {}", stderr(o));
}

/// Pulls `name`, checks what was installed, and speaks with `--model-name`.
fn pull_and_speak(name: &str, extra: &[&str], speak_sets: &[&str]) -> (Machine, PathBuf) {
    let hub = FakeHub::start(all_repos(), Faults::default());
    let m = Machine::new();
    let o = m.pull(&hub.url, name, extra, &[]);
    assert_ok(&o, &format!("pull {name}"));
    m.assert_models(&[name]);
    let dir = m.models().join(name);
    // What it says: each GGUF by its final name, then where it went.
    let said = stderr(&o);
    assert!(!said.contains(".pull-"), "the temporary is not shown: {said}");
    assert!(said.lines().last().unwrap().starts_with(&format!("installed {} (speak with: tts --model-name {name} ", dir.display())), "{said}");
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("pulled.json")).unwrap()).unwrap();
    assert_eq!(record["name"], name);
    for f in record["files"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap()).filter(|f| f.ends_with(".gguf")) {
        assert!(said.lines().any(|l| l.starts_with(&format!("{f}: "))), "{f} not reported: {said}");
    }
    for f in record["files"].as_array().unwrap() {
        let file = dir.join(f["name"].as_str().unwrap());
        assert_eq!(std::fs::metadata(&file).unwrap().len(), f["bytes"].as_u64().unwrap(), "{}", file.display());
    }
    let wav = m.dir.path().join("hello.wav");
    let mut args = vec!["--model-name", name];
    args.extend(m.plugin_args());
    args.extend_from_slice(&["--text", "Hello.", "--out", wav.to_str().unwrap()]);
    for s in speak_sets {
        args.extend_from_slice(&["--set", s]);
    }
    let o = m.run(&hub.url, &args, &[]);
    assert_ok(&o, &format!("speak with {name}"));
    let (rate, samples) = read_wav(&wav);
    assert!(rate > 0 && !samples.is_empty(), "{name}: empty audio");
    (m, dir)
}

/// The GGUFs of `dir`'s profile, byte for byte the committed ones the Python
/// converter made from the same official files.
fn assert_same_ggufs(dir: &Path, want: &[(&str, PathBuf)]) {
    let profile: toml::Value = toml::from_str(&std::fs::read_to_string(dir.join("profile.toml")).unwrap()).unwrap();
    let files: Vec<&str> = profile["model"]["files"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(files, want.iter().map(|(n, _)| *n).collect::<Vec<_>>(), "profile files");
    for (name, reference) in want {
        assert!(std::fs::read(dir.join(name)).unwrap() == std::fs::read(reference).unwrap(), "{name} differs from {}", reference.display());
    }
}

#[test]
fn chatterbox_turbo_pulls_converts_and_speaks() {
    let (_m, dir) = pull_and_speak("chatterbox-turbo", TURBO_TINY, &["max_new_tokens=16"]);
    let tiny = fixture("chatterbox/turbo-tiny");
    assert_same_ggufs(&dir, &[("t3-turbo.gguf", tiny.join("t3-turbo.gguf")), ("s3gen-meanflow.gguf", tiny.join("s3gen-meanflow.gguf"))]);
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("pulled.json")).unwrap()).unwrap();
    assert_eq!(record["variant"], "turbo");
    assert_eq!(record["storage"], "f32");
    assert_eq!(record["sources"][0]["commit"], TURBO_PIN);
}

#[test]
fn chatterbox_nano_takes_files_from_two_repositories() {
    let (_m, dir) = pull_and_speak("chatterbox-nano", TURBO_TINY, &["max_new_tokens=16"]);
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("pulled.json")).unwrap()).unwrap();
    assert_eq!(record["variant"], "nano");
    let repos: Vec<&str> = record["sources"].as_array().unwrap().iter().map(|s| s["repo"].as_str().unwrap()).collect();
    assert_eq!(repos, ["ResembleAI/chatterbox-nano", "ResembleAI/chatterbox-turbo"]);
}

#[test]
fn chatterbox_multilingual_pulls_embeds_cangjie_and_speaks() {
    let (m, dir) = pull_and_speak("chatterbox-multilingual", MTL_TINY, &["max_new_tokens=16"]);
    let tiny = fixture("chatterbox/mtl-tiny");
    let s3gen = std::fs::read(dir.join("s3gen.gguf")).unwrap();
    assert!(s3gen == std::fs::read(tiny.join("s3gen.gguf")).unwrap(), "s3gen.gguf differs from the committed one");
    // T3 carries the Cangjie table (the committed T3 was converted without
    // one): the same file `tts convert` makes of the fixture plus the table.
    let t3 = dir.join("t3-mtl.gguf");
    let file = ggml_sys::gguf::GgufFile::open(&t3).unwrap();
    assert_eq!(file.get_str("chatterbox.cangjie5_tc").unwrap(), "日\ta\n月\tb\n");
    assert!(!dir.join("Cangjie5_TC.json").exists(), "embedded, not kept beside");
    let source = m.dir.path().join("mtl-with-cangjie");
    std::fs::create_dir(&source).unwrap();
    for entry in std::fs::read_dir(tiny.join("official")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, source.join(path.file_name().unwrap())).unwrap();
    }
    std::fs::write(source.join("Cangjie5_TC.json"), "日\ta\n月\tb\n").unwrap();
    let out = m.dir.path().join("converted");
    let mut args = vec!["convert", source.to_str().unwrap(), out.to_str().unwrap()];
    args.extend(m.plugin_args());
    args.extend_from_slice(MTL_TINY);
    assert_ok(&m.run("http://127.0.0.1:9", &args, &[]), "tts convert");
    assert!(std::fs::read(&t3).unwrap() == std::fs::read(out.join("t3-mtl.gguf")).unwrap(), "pulled T3 differs from tts convert's");
}

/// Pulls a Supertonic version; its GGUF must equal what convert.py makes of
/// the same bundle: the committed `model.gguf`, or for v1 (none committed)
/// the SHA-256 of convert.py's output that models/supertonic/tests/convert.rs
/// pins.
fn supertonic_case(version: &str, speak: bool) {
    let name = format!("supertonic-{}", &version[1..]);
    let (_m, dir) = if speak { pull_and_speak(&name, &[], &[]) } else { pull_only(&name) };
    let profile: toml::Value = toml::from_str(&std::fs::read_to_string(dir.join("profile.toml")).unwrap()).unwrap();
    let files = profile["model"]["files"].as_array().unwrap();
    assert_eq!(files.len(), 1);
    let gguf = std::fs::read(dir.join(files[0].as_str().unwrap())).unwrap();
    let reference = fixture(&format!("supertonic/tiny-{version}/model.gguf"));
    if reference.exists() {
        assert!(gguf == std::fs::read(&reference).unwrap(), "{name}: the GGUF differs from {}", reference.display());
    } else {
        assert_eq!(version, "v1");
        assert_eq!(sha256(&gguf), "18be50429117e42146c1b297c55f6637f750b13d6d842991a03aa3f02b346eaf", "{name}: the GGUF differs from convert.py's");
    }
}

/// Pulls `name` without speaking.
fn pull_only(name: &str) -> (Machine, PathBuf) {
    let hub = FakeHub::start(all_repos(), Faults::default());
    let m = Machine::new();
    assert_ok(&m.pull(&hub.url, name, &[], &[]), &format!("pull {name}"));
    m.assert_models(&[name]);
    let dir = m.models().join(name);
    (m, dir)
}

#[test]
fn supertonic_2_pulls_converts_and_speaks() {
    supertonic_case("v2", true);
}

#[test]
fn supertonic_3_pulls_converts_and_speaks() {
    supertonic_case("v3", true);
}

#[test]
fn supertonic_1_pulls_and_converts() {
    supertonic_case("v1", false);
}

#[test]
fn supertonic_1_pulls_converts_and_speaks() {
    supertonic_case("v1", true);
}

/// The download requests of `file` in `hub`'s log, by their Range header
/// (the one-byte probe hf-hub sends for the metadata left out).
fn downloads(hub: &FakeHub, file: &str) -> Vec<String> {
    hub.log().into_iter().filter_map(|l| l.strip_prefix(&format!("get {file} ")).map(str::to_string)).filter(|r| r != "bytes=0-0").collect()
}

#[test]
fn an_interrupted_download_resumes_where_it_stopped() {
    let file = "Supertone/supertonic-2/onnx/vector_estimator.onnx";
    let hub = FakeHub::start(all_repos(), Faults { cuts: [(file.to_string(), 1)].into(), ..Faults::default() });
    let m = Machine::new();
    let o = m.pull(&hub.url, "supertonic-2", &[], &[]);
    let ranges = downloads(&hub, file);
    let size = std::fs::metadata(fixture("supertonic/tiny-v2/official/onnx/vector_estimator.onnx")).unwrap().len();
    assert_eq!(ranges.len(), 2, "one cut download and one resumption: {ranges:?}");
    assert_eq!(ranges[0], "bytes=0-");
    let resumed_at: u64 = ranges[1].strip_prefix("bytes=").and_then(|r| r.strip_suffix('-')).unwrap().parse().unwrap();
    assert!(resumed_at > 0 && resumed_at < size, "resumed at {resumed_at} of {size}");
    assert_ok(&o, "pull");
    m.assert_models(&["supertonic-2"]);
}

#[test]
fn a_download_cut_more_often_than_retried_resumes_in_the_next_pull() {
    let file = "Supertone/supertonic-2/onnx/vector_estimator.onnx";
    // The first download and its three retries are all cut.
    let hub = FakeHub::start(all_repos(), Faults { cuts: [(file.to_string(), 4)].into(), ..Faults::default() });
    let m = Machine::new();
    let o = m.pull(&hub.url, "supertonic-2", &[], &[]);
    assert_one_line_error(&o, "Supertone/supertonic-2/onnx/vector_estimator.onnx: download failed: ");
    assert!(stderr(&o).contains("(run `tts pull` again to resume)"), "{}", stderr(&o));
    m.assert_models(&[]);
    let blobs = dir_names(&m.cache().join("models--Supertone--supertonic-2/blobs"));
    let want = sha256(&std::fs::read(fixture("supertonic/tiny-v2/official/onnx/vector_estimator.onnx")).unwrap());
    assert!(blobs.contains(&format!("{want}.part")), "the partial download is kept: {blobs:?}");
    assert!(blobs.iter().all(|b| !b.ends_with(".lock")), "no lock is left: {blobs:?}");
    let first = downloads(&hub, file);
    assert_eq!(first.len(), 4, "{first:?}");
    let kept: u64 = first[3].strip_prefix("bytes=").and_then(|r| r.strip_suffix('-')).unwrap().parse().unwrap();

    let o = m.pull(&hub.url, "supertonic-2", &[], &[]);
    assert_ok(&o, "the next pull");
    let all = downloads(&hub, file);
    assert_eq!(all.len(), 5, "one more request: {all:?}");
    let resumed_at: u64 = all[4].strip_prefix("bytes=").and_then(|r| r.strip_suffix('-')).unwrap().parse().unwrap();
    assert!(resumed_at > kept, "the next pull starts from the partial file ({resumed_at} > {kept})");
    m.assert_models(&["supertonic-2"]);
}

#[test]
fn a_partial_download_as_long_as_the_file_starts_over() {
    // A run ended between the last byte and the rename: resuming would ask
    // for bytes past the end.
    let file = "Supertone/supertonic-2/onnx/vocoder.onnx";
    let bytes = std::fs::read(fixture("supertonic/tiny-v2/official/onnx/vocoder.onnx")).unwrap();
    let hub = FakeHub::start(all_repos(), Faults::default());
    let m = Machine::new();
    let blobs = m.cache().join("models--Supertone--supertonic-2/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(blobs.join(format!("{}.part", sha256(&bytes))), &bytes).unwrap();
    assert_ok(&m.pull(&hub.url, "supertonic-2", &[], &[]), "pull");
    assert_eq!(downloads(&hub, file), ["bytes=0-"]);
}

#[test]
fn a_file_that_fails_its_sha256_is_fetched_again_and_twice_is_refused() {
    let file = "Supertone/supertonic-2/onnx/vocoder.onnx";
    let hub = FakeHub::start(all_repos(), Faults { corrupt_once: [file.to_string()].into(), ..Faults::default() });
    let m = Machine::new();
    let o = m.pull(&hub.url, "supertonic-2", &[], &[]);
    assert_eq!(downloads(&hub, file).len(), 2, "refused once, fetched again");
    let blob =
        std::fs::canonicalize(m.cache().join(format!("models--Supertone--supertonic-2/snapshots/{}/onnx/vocoder.onnx", FakeRepo::new("v2").commit))).unwrap();
    let want = sha256(&std::fs::read(fixture("supertonic/tiny-v2/official/onnx/vocoder.onnx")).unwrap());
    assert_eq!(blob.file_name().unwrap().to_str().unwrap(), want, "the blob is named by its SHA-256, as huggingface_hub names LFS blobs");
    assert_eq!(sha256(&std::fs::read(&blob).unwrap()), want);
    assert_ok(&o, "pull");

    let hub = FakeHub::start(all_repos(), Faults { corrupt_always: [file.to_string()].into(), ..Faults::default() });
    let m = Machine::new();
    let o = m.pull(&hub.url, "supertonic-2", &[], &[]);
    assert_one_line_error(&o, "onnx/vocoder.onnx: SHA-256 ");
    assert!(stderr(&o).contains(&format!("does not match the Hub's {want} again after a second download")), "{}", stderr(&o));
    m.assert_models(&[]);
    let blobs = m.cache().join("models--Supertone--supertonic-2/blobs");
    assert!(!blobs.join(&want).exists(), "the bad file is not left in the cache");
}

#[test]
fn offline_pulls_from_the_cache_and_names_what_is_missing() {
    let hub = FakeHub::start(all_repos(), Faults::default());
    let m = Machine::new();
    assert_ok(&m.pull(&hub.url, "supertonic-2", &["-q"], &[]), "online pull");
    // huggingface_hub's layout: refs/main holds the commit; snapshots link to
    // blobs; nothing of the download's own is left.
    let repo_dir = m.cache().join("models--Supertone--supertonic-2");
    let commit = std::fs::read_to_string(repo_dir.join("refs/main")).unwrap();
    assert_eq!(commit, FakeRepo::new("v2").commit);
    assert_eq!(dir_names(&repo_dir), ["blobs", "refs", "snapshots"]);
    assert_eq!(dir_names(&repo_dir.join("refs")), ["main"]);
    assert!(dir_names(&repo_dir.join("blobs")).iter().all(|b| !b.contains('.')), "no .part or .lock left: {:?}", dir_names(&repo_dir.join("blobs")));
    assert!(repo_dir.join(format!("snapshots/{commit}/onnx/tts.json")).symlink_metadata().unwrap().file_type().is_symlink());
    let first = std::fs::read(m.models().join("supertonic-2/profile.toml")).unwrap();
    drop(hub);

    // No Hub at all now: the endpoint's port is closed.
    let gone = "http://127.0.0.1:9";
    assert_ok(&m.run(gone, &["models", "rm", "supertonic-2"], &[]), "rm");
    m.assert_models(&[]);
    let o = m.pull(gone, "supertonic-2", &[], &[("HF_HUB_OFFLINE", "1")]);
    assert_ok(&o, "offline pull");
    assert_eq!(std::fs::read(m.models().join("supertonic-2/profile.toml")).unwrap(), first);

    // Without HF_HUB_OFFLINE, a Hub out of reach falls back on the cache too
    // (with a warning), as huggingface_hub does.
    let o = m.pull(gone, "supertonic-2", &[], &[]);
    assert_ok(&o, "pull with the Hub out of reach");
    assert!(stderr(&o).contains("cannot reach the Hub at http://127.0.0.1:9"), "{}", stderr(&o));
    let o = m.pull(gone, "supertonic-3", &[], &[]);
    assert_one_line_error(&o, "cannot reach the Hub at http://127.0.0.1:9");
    assert!(stderr(&o).contains("and the cache does not hold Supertone/supertonic-3@main"), "{}", stderr(&o));

    std::fs::remove_file(repo_dir.join(format!("snapshots/{commit}/onnx/vocoder.onnx"))).unwrap();
    let o = m.pull(gone, "supertonic-2", &[], &[("HF_HUB_OFFLINE", "1")]);
    assert_one_line_error(&o, "HF_HUB_OFFLINE is set and the cache lacks Supertone/supertonic-2@main files: onnx/vocoder.onnx");
    let o = m.pull(gone, "supertonic-3", &[], &[("HF_HUB_OFFLINE", "1")]);
    assert_one_line_error(&o, "HF_HUB_OFFLINE is set and Supertone/supertonic-3@main is not in the cache");
    m.assert_models(&["supertonic-2"]);
}

#[test]
fn a_gated_repository_without_hf_token_gives_the_hint() {
    let mut repos = all_repos();
    repos.iter_mut().find(|(n, _)| *n == "Supertone/supertonic-2").unwrap().1.token = Some("hf_secret".into());
    let hub = FakeHub::start(repos, Faults::default());
    let m = Machine::new();
    let o = m.pull(&hub.url, "supertonic-2", &[], &[]);
    assert_one_line_error(&o, "Supertone/supertonic-2: the Hub refused access (HTTP 401)");
    assert!(stderr(&o).contains("set HF_TOKEN"), "{}", stderr(&o));
    m.assert_models(&[]);
    let o = m.pull(&hub.url, "supertonic-2", &[], &[("HF_TOKEN", "hf_wrong")]);
    assert_one_line_error(&o, "with the token given");
    let o = m.pull(&hub.url, "supertonic-2", &["-q"], &[("HF_TOKEN", "hf_secret")]);
    assert_ok(&o, "pull with the token");
    m.assert_models(&["supertonic-2"]);
}

#[test]
fn an_unknown_name_lists_the_catalog() {
    let m = Machine::new();
    let o = m.pull("http://127.0.0.1:9", "chatterbox-large", &[], &[]);
    assert_one_line_error(
        &o,
        "no model `chatterbox-large` in the catalog; known: supertonic-1, supertonic-2, supertonic-3, chatterbox-turbo, chatterbox-nano, chatterbox-multilingual",
    );
    m.assert_models(&[]);
}

#[test]
fn an_unknown_revision_and_a_missing_file_are_one_line_errors_leaving_nothing() {
    let hub = FakeHub::start(all_repos(), Faults::default());
    let m = Machine::new();
    let o = m.pull(&hub.url, "supertonic-2@v9", &[], &[]);
    assert_one_line_error(&o, "Supertone/supertonic-2 has no revision `v9`");
    m.assert_models(&[]);

    let mut repos = all_repos();
    repos.iter_mut().find(|(n, _)| *n == "ResembleAI/chatterbox-turbo").unwrap().1.files.remove("conds.pt");
    let hub = FakeHub::start(repos, Faults::default());
    let o = m.pull(&hub.url, "chatterbox-turbo", TURBO_TINY, &[]);
    assert_one_line_error(&o, &format!("ResembleAI/chatterbox-turbo@{TURBO_PIN} has no conds.pt"));
    m.assert_models(&[]);
    assert!(downloads(&hub, "ResembleAI/chatterbox-turbo/t3_turbo_v1.safetensors").is_empty(), "nothing downloaded before the file list is checked");
}

/// A file-size limit (RLIMIT_FSIZE, with SIGXFSZ ignored so a write past it
/// fails with EFBIG) stands in for a full disk: no root, no mount.
fn run_with_file_limit(m: &Machine, hub: &str, args: &[&str], limit: u64) -> Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = m.command(hub, args);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let lim = libc::rlimit { rlim_cur: limit, rlim_max: limit };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    wait_or_kill(cmd.spawn().unwrap(), Duration::from_secs(300), "tts pull under a file-size limit")
}

#[test]
fn a_full_disk_while_downloading_or_converting_leaves_nothing_in_the_models_dir() {
    let hub = FakeHub::start(all_repos(), Faults::default());
    let m = Machine::new();
    let mut args = vec!["pull", "supertonic-2"];
    args.extend(m.plugin_args());
    // Below the largest download (vector_estimator.onnx, ~585 kB).
    let o = run_with_file_limit(&m, &hub.url, &args, 200_000);
    assert_one_line_error(&o, "writing the cache under");
    m.assert_models(&[]);
    // Above every download, below the GGUF (~1.1 MB): conversion fails.
    let o = run_with_file_limit(&m, &hub.url, &args, 800_000);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    m.assert_models(&[]);
    // With room, the resumed cache finishes the job.
    assert_ok(&m.pull(&hub.url, "supertonic-2", &[], &[]), "pull with room");
    m.assert_models(&["supertonic-2"]);
}

#[test]
fn models_lists_and_removes_what_was_pulled() {
    let hub = FakeHub::start(all_repos(), Faults::default());
    let m = Machine::new();
    let o = m.run(&hub.url, &["models"], &[]);
    assert_ok(&o, "models");
    assert!(String::from_utf8_lossy(&o.stdout).contains("`tts pull NAME` installs one of:"));
    // Temporaries of pulls a signal ended: removed by the next pull when
    // their process is gone, kept while it runs.
    let mut dead = Command::new("/bin/sh").args(["-c", "exit 0"]).spawn().unwrap();
    dead.wait().unwrap();
    std::fs::create_dir_all(m.models().join(format!(".pull-{}-abc/model", dead.id()))).unwrap();
    let alive = format!(".pull-{}-def", std::process::id());
    std::fs::create_dir_all(m.models().join(&alive)).unwrap();
    assert_ok(&m.pull(&hub.url, "supertonic-2", &["--weights", "f16"], &[]), "pull");
    assert_eq!(dir_names(&m.models()), [alive.as_str(), "supertonic-2"]);
    std::fs::remove_dir(m.models().join(&alive)).unwrap();
    // Pulling again replaces the model, leaving one directory.
    assert_ok(&m.pull(&hub.url, "supertonic-2", &["--weights", "f16"], &[]), "pull again");
    m.assert_models(&["supertonic-2"]);
    let o = m.run(&hub.url, &["models", "--json"], &[]);
    assert_ok(&o, "models --json");
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let row = &list.as_array().unwrap()[0];
    assert_eq!(row["name"], "supertonic-2");
    assert_eq!(row["family"], "supertonic");
    assert_eq!(row["storage"], "f16");
    assert_eq!(row["path"], m.models().join("supertonic-2").to_str().unwrap());
    assert!(row["bytes"].as_u64().unwrap() > 0);
    let o = m.run(&hub.url, &["models"], &[]);
    let table = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(table.lines().nth(1).unwrap().starts_with("supertonic-2 "), "{table}");
    assert_ok(&m.run(&hub.url, &["models", "rm", "supertonic-2"], &[]), "rm");
    m.assert_models(&[]);
    assert_one_line_error(&m.run(&hub.url, &["models", "rm", "supertonic-2"], &[]), "no pulled model `supertonic-2`");
    assert_one_line_error(&m.run(&hub.url, &["models", "rm", "../x"], &[]), "`../x` is not a model name");
    let wav = m.dir.path().join("x.wav");
    let o = m.run(&hub.url, &["--model-name", "supertonic-2", "--text", "Hi.", "--out", wav.to_str().unwrap()], &[]);
    assert_one_line_error(&o, "model `supertonic-2` is not pulled");
    assert!(stderr(&o).contains("run `tts pull supertonic-2`"));
    assert!(!wav.exists());
}

#[test]
fn an_etag_that_is_a_path_is_refused_before_anything_is_written() {
    let file = "Supertone/supertonic-2/onnx/tts.json";
    let hub = FakeHub::start(all_repos(), Faults { path_etag: [file.to_string()].into(), ..Faults::default() });
    let m = Machine::new();
    let o = m.pull(&hub.url, "supertonic-2", &[], &[]);
    assert_one_line_error(&o, "Supertone/supertonic-2/onnx/tts.json: the Hub's ETag `../../../escaped` is not a plain hash");
    assert!(!m.dir.path().join("hf/escaped").exists() && !m.dir.path().join("escaped").exists());
    m.assert_models(&[]);
}

/// `tts serve --model-name NAME --pull`, as the container image starts: the
/// missing model is pulled, then served under its name, with the key from
/// the environment; a second start finds it installed and needs no hub.
#[test]
fn serve_pulls_a_missing_model_then_serves_it_by_name() {
    let hub = FakeHub::start(all_repos(), Faults::default());
    let m = Machine::new();
    let start = |hub: &str, extra: &[&str]| -> Serving {
        let mut args = vec!["serve", "--port", "0", "--require-api-key", "--model-name", "supertonic-2"];
        args.extend(m.plugin_args());
        args.extend_from_slice(extra);
        let mut cmd = m.command(hub, &args);
        cmd.env("TTS_API_KEY", "k-123");
        serve_from(cmd)
    };
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let serve_and_speak = |mut server: Serving| {
        let base = server.base.clone();
        let mut models = agent.get(format!("{base}/v1/models")).header("Authorization", "Bearer k-123").call().unwrap();
        let models: serde_json::Value = models.body_mut().read_json().unwrap();
        assert_eq!(models["data"][0]["id"], "supertonic-2", "{models}");
        let request = serde_json::json!({"model": "supertonic-2", "voice": "F1", "input": "Hello.", "response_format": "wav"});
        let mut answer = agent.post(format!("{base}/v1/audio/speech")).header("Authorization", "Bearer k-123").send_json(&request).unwrap();
        assert_eq!(answer.status().as_u16(), 200);
        assert!(answer.body_mut().read_to_vec().unwrap().starts_with(b"RIFF"));
        let status = server.stop();
        assert!(status.success(), "{status:?}");
    };
    serve_and_speak(start(&hub.url, &["--pull"]));
    m.assert_models(&["supertonic-2"]);
    // Installed now: served without --pull, with a hub that answers nothing.
    serve_and_speak(start("http://127.0.0.1:9", &[]));
    // Not installed and no --pull: the hint, before anything listens.
    let mut args = vec!["serve", "--port", "0", "--model-name", "supertonic-3"];
    args.extend(m.plugin_args());
    let o = m.run(&hub.url, &args, &[]);
    assert!(!o.status.success());
    let said = stderr(&o);
    assert!(said.contains("model `supertonic-3` is not pulled") && said.contains("run `tts pull supertonic-3`"), "{said}");
    assert_eq!(said.trim_end().lines().count(), 1, "{said}");
}
