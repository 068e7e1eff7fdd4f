//! Writing output files so that nothing planted in the file system can redirect
//! them and no failure leaves a partial file (`docs/reliability.md`, "Output
//! files").
//!
//! - A regular file (or a name that does not exist yet) is written to a
//!   temporary created exclusively, under a random name, in the target's own
//!   directory (`O_CREAT|O_EXCL`: a link planted at that name makes the
//!   creation fail instead of being followed), synced, given the permissions of
//!   the file it replaces (or `0666 & ~umask` for a new one) and renamed over
//!   the target. Concurrent writers each rename a complete file: the target
//!   always holds one whole output.
//! - A symbolic link at the target is replaced, not followed, unless it leads to
//!   a FIFO or a character device (`/dev/stdout`, a pipe).
//! - FIFOs and character devices are written in place, never replaced; block
//!   devices, sockets and directories are refused.
//! - The temporary is removed when writing fails, when the writer panics (it is
//!   deleted on drop) and, once [`remove_temporaries_on_signals`] is installed,
//!   on SIGINT, SIGTERM and SIGHUP.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Temporaries that exist right now (removed by the signal handler).
static LIVE_TEMPORARIES: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Environment switch for the tests of this module's guarantees: `pause:<ms>`
/// holds the finished temporary that long before the rename, `panic` panics
/// there. Not for users; documented in docs/reliability.md.
pub const TEST_FAULT_ENV: &str = "TTS_TEST_OUTPUT_FAULT";

/// What a path names before we write to it.
enum Target {
    /// Nothing, a regular file or a link to replace: write a temporary and rename.
    Replace { existing_mode: Option<u32>, owner: Option<(u32, u32)> },
    /// A FIFO or character device (possibly through a link): write in place.
    InPlace,
}

fn classify(path: &Path) -> Result<Target, String> {
    let shown = path.display();
    let link = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Target::Replace { existing_mode: None, owner: None }),
        Err(e) => return Err(format!("cannot inspect output {shown}: {e}")),
    };
    let kind = link.file_type();
    if kind.is_symlink() {
        // Follow only to a stream the user named through a link (/dev/stdout);
        // any other link is replaced by the new file, never written through.
        return Ok(match fs::metadata(path) {
            Ok(m) if m.file_type().is_fifo() || m.file_type().is_char_device() => Target::InPlace,
            _ => Target::Replace { existing_mode: None, owner: None },
        });
    }
    if kind.is_fifo() || kind.is_char_device() {
        return Ok(Target::InPlace);
    }
    if kind.is_dir() {
        return Err(format!("output {shown} is a directory"));
    }
    if kind.is_block_device() {
        return Err(format!("output {shown} is a block device; audio goes to regular files, FIFOs or character devices"));
    }
    if kind.is_socket() {
        return Err(format!("output {shown} is a socket; audio goes to regular files, FIFOs or character devices"));
    }
    if !writable(path) {
        return Err(format!("output {shown} exists and is not writable (permission denied)"));
    }
    Ok(Target::Replace { existing_mode: Some(link.mode() & 0o777), owner: Some((link.uid(), link.gid())) })
}

/// Whether this process may write `path` (honours write protection for
/// ordinary users; root may write anything, as with any other tool).
fn writable(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

/// The process umask, read without changing it (Linux reports it in
/// /proc/self/status; 022 where it does not).
fn umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Umask:").and_then(|v| u32::from_str_radix(v.trim(), 8).ok())))
        .unwrap_or(0o022)
}

/// Writes `bytes` to `path` as described in the module documentation.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), String> {
    write_file_with(path, |file| file.write_all(bytes).map_err(WriteError::Io))
}

/// Why the content of a [`write_file_with`] could not be written: the file's
/// own error (reported with the output's name) or the producer's, as it is.
#[derive(Debug)]
pub enum WriteError {
    Io(std::io::Error),
    Other(String),
}

impl From<std::io::Error> for WriteError {
    fn from(e: std::io::Error) -> Self {
        WriteError::Io(e)
    }
}

/// [`write_file`] with the content produced by `write` into the open file as
/// it goes (a long synthesis need not hold its whole output in memory). The
/// file is the temporary, or the FIFO or character device itself, positioned
/// where the output starts; when `write` fails the temporary is removed and
/// the target left as it was.
pub fn write_file_with(path: &Path, write: impl FnOnce(&mut File) -> Result<(), WriteError>) -> Result<(), String> {
    let shown = path.display();
    let name = path.file_name().ok_or_else(|| format!("output path {shown} has no file name"))?;
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    match classify(path)? {
        Target::InPlace => write_in_place(path, write),
        Target::Replace { existing_mode, owner } => {
            if !dir.is_dir() {
                return Err(format!("output directory {} does not exist", dir.display()));
            }
            let mode = existing_mode.unwrap_or(0o666 & !umask());
            replace(dir, name, path, write, mode, owner)
        }
    }
}

fn write_in_place(path: &Path, write: impl FnOnce(&mut File) -> Result<(), WriteError>) -> Result<(), String> {
    let mut file = OpenOptions::new().write(true).custom_flags(libc::O_NOCTTY).open(path).map_err(|e| format!("opening output {}: {e}", path.display()))?;
    let failed = |e| match e {
        WriteError::Io(e) => format!("writing output {}: {e}", path.display()),
        WriteError::Other(e) => e,
    };
    write(&mut file).map_err(failed)?;
    file.flush().map_err(|e| failed(WriteError::Io(e)))
}

/// A temporary registered for removal on signals while it lives.
struct Registered(PathBuf);

impl Registered {
    fn new(path: &Path) -> Self {
        LIVE_TEMPORARIES.lock().unwrap_or_else(|p| p.into_inner()).push(path.to_path_buf());
        Registered(path.to_path_buf())
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        LIVE_TEMPORARIES.lock().unwrap_or_else(|p| p.into_inner()).retain(|p| p != &self.0);
    }
}

fn replace(
    dir: &Path,
    name: &std::ffi::OsStr,
    path: &Path,
    write: impl FnOnce(&mut File) -> Result<(), WriteError>,
    mode: u32,
    owner: Option<(u32, u32)>,
) -> Result<(), String> {
    let shown = path.display();
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(name);
    prefix.push(".");
    // Created with O_CREAT|O_EXCL and mode 0600 under a random name.
    let mut temp = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(|e| format!("creating a temporary file in {} for {shown}: {e}", dir.display()))?;
    let registered = Registered::new(temp.path());
    let file: &mut File = temp.as_file_mut();
    write(file).map_err(|e| match e {
        WriteError::Io(e) => format!("writing {shown}: {e}"),
        WriteError::Other(e) => e,
    })?;
    file.set_permissions(fs::Permissions::from_mode(mode)).map_err(|e| format!("setting the permissions of {shown}: {e}"))?;
    if let Some((uid, gid)) = owner {
        // Keeps the owner of a replaced file where the process may (root).
        let _ = std::os::unix::fs::fchown(&*file, Some(uid), Some(gid));
    }
    file.sync_all().map_err(|e| format!("writing {shown}: {e}"))?;
    test_fault();
    temp.persist(path).map_err(|e| format!("writing {shown}: {}", e.error))?;
    drop(registered);
    // The rename is durable once the directory is synced.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn test_fault() {
    let Ok(fault) = std::env::var(TEST_FAULT_ENV) else {
        return;
    };
    if fault == "panic" {
        panic!("{TEST_FAULT_ENV}=panic");
    }
    if let Some(ms) = fault.strip_prefix("pause:").and_then(|v| v.parse::<u64>().ok()) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// Removes every live temporary and ends the process on SIGINT (exit 130),
/// SIGTERM (143) or SIGHUP (129). For programs that write output files; call
/// once at start.
pub fn remove_temporaries_on_signals() -> Result<(), String> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]).map_err(|e| format!("installing signal handlers: {e}"))?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                for p in LIVE_TEMPORARIES.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
                    let _ = fs::remove_file(p);
                }
                std::process::exit(128 + signal);
            }
        })
        .map(|_| ())
        .map_err(|e| format!("starting the signal thread: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
        v.sort();
        v
    }

    #[test]
    fn new_file_gets_umask_permissions_and_no_temporary_remains() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("o.wav");
        write_file(&out, b"abc").unwrap();
        assert_eq!(fs::read(&out).unwrap(), b"abc");
        assert_eq!(fs::metadata(&out).unwrap().mode() & 0o777, 0o666 & !umask());
        assert_eq!(names(dir.path()), vec!["o.wav"]);
    }

    #[test]
    fn replaced_file_keeps_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("o.wav");
        fs::write(&out, b"old").unwrap();
        fs::set_permissions(&out, fs::Permissions::from_mode(0o600)).unwrap();
        write_file(&out, b"new").unwrap();
        assert_eq!(fs::read(&out).unwrap(), b"new");
        assert_eq!(fs::metadata(&out).unwrap().mode() & 0o777, 0o600);
    }

    #[test]
    fn planted_links_redirect_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim.txt");
        fs::write(&victim, b"precious").unwrap();
        // The old fixed temporary name, and the output name itself.
        symlink(&victim, dir.path().join(".o.wav.partial")).unwrap();
        let out = dir.path().join("o.wav");
        write_file(&out, b"audio").unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        let link = dir.path().join("l.wav");
        symlink(&victim, &link).unwrap();
        write_file(&link, b"audio").unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"precious", "the link is replaced, not followed");
        assert!(!fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(fs::read(&link).unwrap(), b"audio");
    }

    #[test]
    fn fifo_is_written_in_place_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || fs::read(&fifo).unwrap())
        };
        write_file(&fifo, b"stream").unwrap();
        assert_eq!(reader.join().unwrap(), b"stream");
        assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO is not replaced");
        // Through a link too.
        let link = dir.path().join("link");
        symlink(&fifo, &link).unwrap();
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || fs::read(&fifo).unwrap())
        };
        write_file(&link, b"again").unwrap();
        assert_eq!(reader.join().unwrap(), b"again");
        assert!(fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    }

    #[test]
    fn content_written_as_it_goes_is_all_or_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("o.wav");
        fs::write(&out, b"old").unwrap();
        let e = write_file_with(&out, |f| {
            f.write_all(b"part")?;
            Err(WriteError::Other("the producer failed".into()))
        })
        .unwrap_err();
        assert_eq!(e, "the producer failed");
        assert_eq!(fs::read(&out).unwrap(), b"old", "the target untouched");
        assert_eq!(names(dir.path()), vec!["o.wav"], "no temporary left");
        write_file_with(&out, |f| {
            for piece in [&b"one "[..], b"two"] {
                f.write_all(piece)?;
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(fs::read(&out).unwrap(), b"one two");
    }

    #[test]
    fn directories_and_missing_parents_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let e = write_file(dir.path(), b"x").unwrap_err();
        assert!(e.ends_with("is a directory"), "{e}");
        let e = write_file(&dir.path().join("no/such/o.wav"), b"x").unwrap_err();
        assert!(e.starts_with("output directory ") && e.ends_with("/no/such does not exist"), "{e}");
    }
}
