//! Fetching a repository's files from the Hugging Face Hub into the cache
//! Python's `huggingface_hub` uses (`HF_HUB_CACHE`, else `HF_HOME/hub`, else
//! `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`:
//! `models--OWNER--NAME/{blobs,snapshots,refs}`), so a cache either one filled
//! serves the other.
//!
//! The `hf-hub` crate downloads (resuming a partial `blobs/ETAG.part` with a
//! Range request, within a run on a dropped connection and across runs) and
//! lays out blobs and snapshot links. Around it, this module adds what it
//! lacks: the model-info request that resolves the revision to a commit and
//! lists the files with their SHA-256s (`?blobs=true`); reuse of files already
//! in the cache; a SHA-256 check of every LFS file (a mismatch is deleted and
//! fetched once more) and a size check of the others; `HF_TOKEN`; and
//! `HF_HUB_OFFLINE`, where only the cache is read.

use hf_hub::api::sync::{Api, ApiBuilder, ApiError};
use hf_hub::{Repo, RepoType};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};

const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// Largest model-info answer read (the real ones are a few kB per file).
const MAX_INFO_BYTES: u64 = 16 << 20;
/// Attempts of one download within a run, each resuming where the last stopped.
const DOWNLOAD_RETRIES: usize = 3;

/// Where and how to reach the Hub, from the environment.
pub struct Hub {
    pub endpoint: String,
    pub cache: PathBuf,
    token: Option<String>,
    pub offline: bool,
    progress: bool,
}

/// A file fetched (or found) in the cache: its repository path and the
/// snapshot path that leads to the verified blob.
pub struct Fetched {
    pub name: String,
    pub path: PathBuf,
    pub bytes: u64,
}

/// What one source resolved to.
pub struct Resolved {
    pub commit: String,
    pub files: Vec<Fetched>,
}

#[derive(Deserialize)]
struct ModelInfo {
    sha: String,
    siblings: Vec<Sibling>,
}

#[derive(Deserialize)]
struct Sibling {
    rfilename: String,
    size: Option<u64>,
    lfs: Option<Lfs>,
}

#[derive(Deserialize)]
struct Lfs {
    sha256: String,
}

impl Hub {
    /// `HF_ENDPOINT`, `HF_TOKEN` (else `HF_HOME/token`), the cache directory
    /// and `HF_HUB_OFFLINE` as `huggingface_hub` reads them.
    pub fn from_env(quiet: bool) -> Result<Self, String> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let endpoint = var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_string()).trim_end_matches('/').to_string();
        let home = || std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from);
        let hf_home = match (var("HF_HOME"), var("XDG_CACHE_HOME")) {
            (Some(h), _) => PathBuf::from(h),
            (None, Some(x)) => PathBuf::from(x).join("huggingface"),
            (None, None) => home().ok_or("HOME is not set; set HF_HOME to say where the Hugging Face cache is")?.join(".cache/huggingface"),
        };
        let cache = var("HF_HUB_CACHE").map(PathBuf::from).unwrap_or_else(|| hf_home.join("hub"));
        let token = var("HF_TOKEN").or_else(|| std::fs::read_to_string(hf_home.join("token")).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty()));
        let offline = var("HF_HUB_OFFLINE").is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"));
        Ok(Hub { endpoint, cache, token, offline, progress: !quiet })
    }

    fn repo_dir(&self, repo: &str) -> PathBuf {
        self.cache.join(format!("models--{}", repo.replace('/', "--")))
    }

    /// The files `patterns` select in `repo` at `revision`, each in the cache
    /// and verified.
    pub fn fetch(&self, repo: &str, revision: &str, patterns: &[String]) -> Result<Resolved, String> {
        if self.offline {
            return self.fetch_offline(repo, revision, patterns);
        }
        let info = match self.model_info(repo, revision) {
            Ok(info) => info,
            // As huggingface_hub does: with the Hub out of reach, what the
            // cache holds for the revision is used (it was verified when
            // fetched, and LFS blobs are checked again).
            Err(Failure::Unreachable(e)) => {
                return match self.fetch_offline(repo, revision, patterns) {
                    Ok(resolved) => {
                        tracing::warn!("{e}; using the cached files of {repo}@{revision}");
                        Ok(resolved)
                    }
                    Err(_) => Err(format!("{e}, and the cache does not hold {repo}@{revision}")),
                };
            }
            Err(Failure::Refused(e)) => return Err(e),
        };
        check_commit(&info.sha).map_err(|e| format!("{repo}@{revision}: the Hub answered {e}"))?;
        let names: Vec<String> = info.siblings.iter().map(|s| s.rfilename.clone()).collect();
        let (chosen, missing) = super::catalog::select(patterns, &names);
        if !missing.is_empty() {
            return Err(format!("{repo}@{revision} has no {} (the Hub lists {} files at commit {})", missing.join(", "), names.len(), info.sha));
        }
        let api = self.api()?;
        let mut files = Vec::new();
        for name in chosen {
            let sibling = info.siblings.iter().find(|s| s.rfilename == name).expect("selected from the siblings");
            let expect = Expect { sha256: sibling.lfs.as_ref().map(|l| l.sha256.to_ascii_lowercase()), size: sibling.size };
            let path = self.fetch_file(&api, repo, &info.sha, &name, &expect)?;
            let bytes = std::fs::metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?.len();
            files.push(Fetched { name, path, bytes });
        }
        if revision != info.sha {
            // As huggingface_hub does: refs/<branch or tag> holds the commit,
            // which is what offline runs read.
            let refs = self.repo_dir(repo).join("refs").join(revision);
            std::fs::create_dir_all(refs.parent().unwrap()).and_then(|_| std::fs::write(&refs, &info.sha)).map_err(|e| format!("{}: {e}", refs.display()))?;
        }
        Ok(Resolved { commit: info.sha, files })
    }

    fn api(&self) -> Result<Api, String> {
        ApiBuilder::new()
            .with_endpoint(self.endpoint.clone())
            .with_cache_dir(self.cache.clone())
            .with_token(self.token.clone())
            .with_progress(false)
            .with_retries(0)
            .build()
            .map_err(|e| format!("starting the Hub client: {e}"))
    }

    /// `GET {endpoint}/api/models/{repo}/revision/{revision}?blobs=true`.
    fn model_info(&self, repo: &str, revision: &str) -> Result<ModelInfo, Failure> {
        let url = format!("{}/api/models/{repo}/revision/{revision}", self.endpoint);
        let agent = ureq2::AgentBuilder::new()
            .try_proxy_from_env(true)
            .timeout_connect(std::time::Duration::from_secs(30))
            .timeout_read(std::time::Duration::from_secs(120))
            .build();
        let mut request = agent.get(&url).query("blobs", "true");
        if let Some(token) = &self.token {
            request = request.set("Authorization", &format!("Bearer {token}"));
        }
        let response = match request.call() {
            Ok(r) => r,
            Err(ureq2::Error::Status(code, r)) => return Err(Failure::Refused(self.status_error(repo, revision, code, r.header("x-error-code")))),
            Err(ureq2::Error::Transport(t)) => return Err(Failure::Unreachable(format!("cannot reach the Hub at {}: {t}", self.endpoint))),
        };
        let mut body = Vec::new();
        response.into_reader().take(MAX_INFO_BYTES + 1).read_to_end(&mut body).map_err(|e| Failure::Unreachable(format!("{url}: reading the answer: {e}")))?;
        if body.len() as u64 > MAX_INFO_BYTES {
            return Err(Failure::Refused(format!("{url}: the answer is larger than {} MiB", MAX_INFO_BYTES >> 20)));
        }
        serde_json::from_slice(&body).map_err(|e| Failure::Refused(format!("{url}: not a model-info answer: {e}")))
    }

    fn status_error(&self, repo: &str, revision: &str, code: u16, error_code: Option<&str>) -> String {
        match (code, error_code) {
            // The Hub answers 401 for a repository it does not have, so that
            // private ones cannot be told apart.
            (401 | 404, Some("RepoNotFound")) => format!("no repository {repo} on the Hub at {} (or it is private: set HF_TOKEN)", self.endpoint),
            (401 | 403, _) if self.token.is_some() => {
                format!("{repo}: the Hub refused access (HTTP {code}) with the token given; it may be gated: accept its terms on the Hub with the account the token belongs to")
            }
            (401 | 403, _) => format!("{repo}: the Hub refused access (HTTP {code}); the repository may be gated or private: accept its terms on the Hub and set HF_TOKEN to an access token"),
            (404, Some("RevisionNotFound")) => format!("{repo} has no revision `{revision}`"),
            (404, _) => format!("{repo}@{revision}: not found on the Hub at {} (no such repository or revision)", self.endpoint),
            _ => format!("{repo}@{revision}: the Hub answered HTTP {code}"),
        }
    }

    /// One file at `commit`: the cached snapshot if it verifies, else a
    /// download; a download that fails verification is deleted and fetched
    /// once more.
    fn fetch_file(&self, api: &Api, repo: &str, commit: &str, name: &str, expect: &Expect) -> Result<PathBuf, String> {
        let snapshot = self.repo_dir(repo).join("snapshots").join(commit).join(name);
        if snapshot.exists() {
            match expect.check(&snapshot) {
                Ok(()) => return Ok(snapshot),
                Err(e) => {
                    tracing::info!("{repo}/{name} in the cache: {e}; fetching it again");
                    remove_cached(&snapshot);
                }
            }
        }
        let etag = self.check_etag(repo, commit, name)?;
        // A partial download as long as the file (a run ended between the
        // last byte and the rename) would be resumed past its end, which
        // servers refuse: it starts over.
        let part = self.repo_dir(repo).join("blobs").join(format!("{etag}.part"));
        if let (Ok(meta), Some(size)) = (std::fs::metadata(&part), expect.size) {
            if meta.len() >= size {
                let _ = std::fs::remove_file(&part);
            }
        }
        let handle = api.repo(Repo::with_revision(repo.to_string(), RepoType::Model, commit.to_string()));
        let ref_by_commit = self.repo_dir(repo).join("refs").join(commit);
        let had_ref_by_commit = ref_by_commit.exists();
        let (mut mismatches, mut dropped) = (0, 0);
        loop {
            // The retries are ours, not hf-hub's: its loop reports the last
            // failure even when the final retry succeeded, leaving a whole
            // file as a `.part` no later run could finish.
            let result = handle.download_with_progress(name, Bar::new(self.progress));
            // hf-hub leaves its lock beside the blob and names a ref after the
            // commit; huggingface_hub does neither.
            let _ = std::fs::remove_file(part.with_extension("lock"));
            if !had_ref_by_commit {
                let _ = std::fs::remove_file(&ref_by_commit);
            }
            let path = match result {
                Ok(path) => path,
                Err(e) if dropped < DOWNLOAD_RETRIES && network_failure(&e) => {
                    dropped += 1;
                    tracing::info!("{repo}/{name}: {e}; resuming (retry {dropped} of {DOWNLOAD_RETRIES})");
                    std::thread::sleep(std::time::Duration::from_millis(250 << dropped));
                    continue;
                }
                Err(e) => return Err(self.download_error(repo, name, e)),
            };
            match expect.check(&path) {
                Ok(()) => return Ok(path),
                Err(e) => {
                    remove_cached(&path);
                    mismatches += 1;
                    if mismatches == 2 {
                        return Err(format!("{repo}/{name}: {e} again after a second download; removed from the cache"));
                    }
                    tracing::info!("{repo}/{name}: {e}; removed, fetching it once more");
                }
            }
        }
    }

    /// hf-hub names the cache blob after the ETag the server sends, unchecked;
    /// one that is not a plain token (`../x`) could write outside the cache.
    /// The same first request it makes is made here first, and such an ETag
    /// refused.
    fn check_etag(&self, repo: &str, commit: &str, name: &str) -> Result<String, String> {
        let url = format!("{}/{repo}/resolve/{commit}/{name}", self.endpoint);
        let agent = ureq2::AgentBuilder::new()
            .try_proxy_from_env(true)
            .redirects(0)
            .timeout_connect(std::time::Duration::from_secs(30))
            .timeout_read(std::time::Duration::from_secs(120))
            .build();
        let mut request = agent.get(&url).set("Range", "bytes=0-0");
        if let Some(token) = &self.token {
            request = request.set("Authorization", &format!("Bearer {token}"));
        }
        let response = match request.call() {
            Ok(r) => r,
            Err(ureq2::Error::Status(code, r)) if (300..400).contains(&code) => r,
            Err(ureq2::Error::Status(code @ (401 | 403), r)) => return Err(self.status_error(repo, commit, code, r.header("x-error-code"))),
            Err(ureq2::Error::Status(code, _)) => return Err(format!("{repo}/{name}: the Hub answered HTTP {code} to the download")),
            Err(ureq2::Error::Transport(t)) => return Err(format!("{repo}/{name}: download failed: {t} (run `tts pull` again to resume)")),
        };
        let etag = response.header("x-linked-etag").or(response.header("etag")).unwrap_or("").replace('"', "");
        if etag.is_empty() || etag.len() > 128 || !etag.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return Err(format!("{repo}/{name}: the Hub's ETag `{}` is not a plain hash", etag.escape_debug()));
        }
        Ok(etag)
    }

    fn download_error(&self, repo: &str, name: &str, e: ApiError) -> String {
        match e {
            ApiError::RequestError(e) => match *e {
                ureq2::Error::Status(code @ (401 | 403), r) => self.status_error(repo, "", code, r.header("x-error-code")),
                ureq2::Error::Status(code, _) => format!("{repo}/{name}: the Hub answered HTTP {code} to the download"),
                ureq2::Error::Transport(t) => format!("{repo}/{name}: download failed: {t} (run `tts pull` again to resume)"),
            },
            // The last of the retries says what went wrong.
            ApiError::TooManyRetries(e) => self.download_error(repo, name, *e),
            ApiError::IoError(e) if network_io(&e) => format!("{repo}/{name}: download failed: {e} (run `tts pull` again to resume)"),
            ApiError::IoError(e) => format!("{repo}/{name}: writing the cache under {}: {e}", self.cache.display()),
            ApiError::InvalidResume => {
                format!(
                    "{repo}/{name}: the partial download in {} is longer than the file; delete its blobs/*.part and pull again",
                    self.repo_dir(repo).display()
                )
            }
            e => format!("{repo}/{name}: {e}"),
        }
    }

    /// `HF_HUB_OFFLINE`: the files must all be in the cache at the commit the
    /// revision names (a commit hash, or `refs/<revision>`); the ones missing
    /// are named.
    fn fetch_offline(&self, repo: &str, revision: &str, patterns: &[String]) -> Result<Resolved, String> {
        let dir = self.repo_dir(repo);
        let commit = if check_commit(revision).is_ok() {
            revision.to_string()
        } else {
            let refs = dir.join("refs").join(revision);
            std::fs::read_to_string(&refs).map(|c| c.trim().to_string()).map_err(|_| {
                format!("HF_HUB_OFFLINE is set and {repo}@{revision} is not in the cache {} (no {}); pull it once online", self.cache.display(), refs.display())
            })?
        };
        check_commit(&commit).map_err(|e| format!("{}: {e}", dir.join("refs").join(revision).display()))?;
        let snapshot = dir.join("snapshots").join(&commit);
        let mut available = Vec::new();
        list_files(&snapshot, &snapshot, &mut available, 0);
        let (chosen, missing) = super::catalog::select(patterns, &available);
        if !missing.is_empty() {
            return Err(format!("HF_HUB_OFFLINE is set and the cache lacks {repo}@{revision} files: {} (in {})", missing.join(", "), snapshot.display()));
        }
        let mut files = Vec::new();
        for name in chosen {
            let path = snapshot.join(&name);
            // A blob named by 64 hex digits is an LFS file named by its SHA-256.
            let blob = std::fs::canonicalize(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let digest = blob.file_name().and_then(|n| n.to_str()).filter(|n| n.len() == 64 && n.bytes().all(|b| b.is_ascii_hexdigit()));
            let expect = Expect { sha256: digest.map(str::to_ascii_lowercase), size: None };
            expect.check(&path).map_err(|e| format!("{repo}/{name} in the cache: {e}"))?;
            let bytes = std::fs::metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?.len();
            files.push(Fetched { name, path, bytes });
        }
        Ok(Resolved { commit, files })
    }
}

/// Whether a download failed on the way (worth resuming) rather than at
/// either end.
fn network_failure(e: &ApiError) -> bool {
    match e {
        ApiError::RequestError(e) => matches!(**e, ureq2::Error::Transport(_)),
        ApiError::IoError(e) => network_io(e),
        _ => false,
    }
}

/// hf-hub copies the response into the file, so an I/O error is either
/// side's: the OS errors of sockets are the network's, as is ureq's own (no
/// OS error: a body cut short); any other OS error is the file's (a full
/// disk, no permission).
fn network_io(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        None | Some(libc::ECONNRESET | libc::ECONNABORTED | libc::ETIMEDOUT | libc::EPIPE | libc::ENETDOWN | libc::ENETUNREACH | libc::EHOSTUNREACH)
    )
}

/// Why the model-info request failed: the Hub could not be reached (the
/// cache may stand in), or it answered with a refusal.
enum Failure {
    Unreachable(String),
    Refused(String),
}

/// A commit hash as the Hub writes it: 40 lowercase hex digits.
fn check_commit(commit: &str) -> Result<(), String> {
    if commit.len() == 40 && commit.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(())
    } else {
        Err(format!("`{commit}` as the commit, which is not a 40-digit hash"))
    }
}

/// Repository-relative paths of the files under `dir` (at most a few levels:
/// repositories here have one).
fn list_files(root: &Path, dir: &Path, out: &mut Vec<String>, depth: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten().take(10_000) {
        let path = entry.path();
        if path.is_dir() && depth < 8 {
            list_files(root, &path, out, depth + 1);
        } else if path.is_file() {
            if let Ok(rel) = path.strip_prefix(root) {
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
}

/// What a file must be: its SHA-256 (LFS files) and size, as the Hub lists them.
struct Expect {
    sha256: Option<String>,
    size: Option<u64>,
}

impl Expect {
    fn check(&self, path: &Path) -> Result<(), String> {
        let len = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?.len();
        if let Some(size) = self.size.filter(|&s| s != len) {
            return Err(format!("{len} bytes where the Hub lists {size}"));
        }
        if let Some(want) = &self.sha256 {
            let got = sha256_file(path)?;
            if &got != want {
                return Err(format!("SHA-256 {got} does not match the Hub's {want}"));
            }
        }
        Ok(())
    }
}

pub fn sha256_file(path: &Path) -> Result<String, String> {
    let mut file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| format!("{}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Removes a snapshot link and the blob it leads to.
fn remove_cached(snapshot: &Path) {
    if let Ok(blob) = std::fs::canonicalize(snapshot) {
        let _ = std::fs::remove_file(blob);
    }
    let _ = std::fs::remove_file(snapshot);
}

/// A download's progress bar on stderr (indicatif hides it when stderr is not
/// a terminal, and `-q` hides it always).
struct Bar(indicatif::ProgressBar);

impl Bar {
    fn new(show: bool) -> Self {
        Bar(if show { indicatif::ProgressBar::new(0) } else { indicatif::ProgressBar::hidden() })
    }
}

impl hf_hub::api::Progress for Bar {
    fn init(&mut self, size: usize, filename: &str) {
        let style =
            indicatif::ProgressStyle::with_template("{msg:30!} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}").map(|s| s.progress_chars("=> "));
        if let Ok(style) = style {
            self.0.set_style(style);
        }
        self.0.set_length(size as u64);
        self.0.set_position(0);
        self.0.set_message(filename.to_string());
    }
    fn update(&mut self, size: usize) {
        self.0.inc(size as u64);
    }
    fn finish(&mut self) {
        self.0.finish_and_clear();
    }
}
