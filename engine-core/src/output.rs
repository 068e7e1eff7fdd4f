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
//!   a FIFO or a character device (a pipe, `/dev/null`) or passes through
//!   `/dev` or `/proc` (`/dev/stdout`).
//! - One of this process's own descriptors named by path (`/dev/stdout`,
//!   `/dev/fd/N`, `/proc/self/fd/N`, or a link to one) is written through that
//!   descriptor: at its offset, so `> x.wav` gets the whole output from byte 0
//!   (the file is then cut at its end) and `>> x.wav` gets it appended
//!   (through a new open of the same file, the caller's flags left alone).
//! - FIFOs and character devices, and anything in a system tree (the file
//!   system mounted at `/dev`, procfs, sysfs and the kernel's other file
//!   systems; not separate mounts below `/dev` such as `/dev/shm`), are
//!   written in place (a regular file truncated first), never replaced, and no
//!   file is created there; block devices, sockets and directories are refused.
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
    /// A FIFO or character device (possibly through a link), or an entry of
    /// `/dev` or `/proc`: open the path and write in place.
    InPlace,
    /// One of this process's descriptors (`/dev/stdout`, `/proc/self/fd/N`).
    Descriptor(i32),
}

/// Trees of the system's own nodes, where nothing is ever renamed over or
/// created, decided for the directory that holds `path`: a file system of the
/// kernel's own (procfs, sysfs, devpts, cgroup, debugfs, ...) wherever it is
/// mounted, and the file system mounted at `/dev`. That one is known by being
/// `/dev` and not by its type, since devtmpfs reports itself as tmpfs (and a
/// container's /dev is a plain tmpfs): a directory under `/dev` on the same
/// device as `/dev` is in it, a separate mount below it (the tmpfs at
/// `/dev/shm`) is an ordinary file system. Everything under `/proc` and
/// `/sys` is a system tree by name as well, whatever is mounted there (the
/// magic numbers above do not list every kernel file system, e.g.
/// binfmt_misc under /proc/sys/fs). Where the directory does not exist, the
/// names decide (`/dev`, `/proc`, `/sys`).
fn in_system_tree(path: &Path) -> bool {
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let Ok(dir) = fs::canonicalize(parent) else {
        return ["/dev", "/proc", "/sys"].iter().any(|t| path.starts_with(t));
    };
    let device = |p: &Path| fs::metadata(p).map(|m| m.dev()).ok();
    ["/proc", "/sys"].iter().any(|t| dir.starts_with(t))
        || kernel_file_system(&dir)
        || (dir.starts_with("/dev") && device(&dir).is_some_and(|d| Some(d) == device(Path::new("/dev"))))
}

/// Whether `dir` is on a file system whose entries are the kernel's objects.
fn kernel_file_system(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `st` a writable statfs.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return false;
    }
    // The magic numbers are 32-bit; libc's types for them differ by target.
    let magic = st.f_type as u32;
    [
        libc::PROC_SUPER_MAGIC as u32,
        libc::SYSFS_MAGIC as u32,
        libc::DEVPTS_SUPER_MAGIC as u32,
        libc::CGROUP_SUPER_MAGIC as u32,
        libc::CGROUP2_SUPER_MAGIC as u32,
        libc::DEBUGFS_MAGIC as u32,
        libc::TRACEFS_MAGIC as u32,
        libc::SECURITYFS_MAGIC as u32,
        libc::BPF_FS_MAGIC as u32,
    ]
    .contains(&magic)
}

/// The descriptor of this process that `path` names (`/proc/<own pid>/fd/N`,
/// `/proc/self/fd/N`, `/dev/fd/N`, the thread's own `task/<tid>/fd/N`).
fn own_descriptor(path: &Path) -> Option<i32> {
    let fd: i32 = path.file_name()?.to_str()?.parse().ok()?;
    let parent = fs::canonicalize(path.parent()?).ok()?;
    let own = PathBuf::from(format!("/proc/{}", std::process::id()));
    let rest = parent.strip_prefix(&own).ok()?;
    let mut parts = rest.components().map(|c| c.as_os_str().to_str().unwrap_or(""));
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("fd"), None, None, None) => Some(fd),
        (Some("task"), Some(_), Some("fd"), None) => Some(fd),
        _ => None,
    }
}

/// `path` and every link it leads through, in order (at most 40 hops, the
/// kernel's own limit); the last entry is not a link or does not exist.
fn link_chain(path: &Path) -> Vec<PathBuf> {
    let mut hops = vec![path.to_path_buf()];
    while hops.len() <= 40 {
        let current = hops.last().expect("one hop");
        let Ok(target) = fs::read_link(current) else {
            break;
        };
        let next = if target.is_absolute() { target } else { current.parent().unwrap_or(Path::new("/")).join(target) };
        hops.push(next);
    }
    hops
}

fn classify(path: &Path) -> Result<Target, String> {
    let shown = path.display();
    let link = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && in_system_tree(path) => {
            return Err(format!("output {shown} does not exist, and tts creates no files under /dev or /proc"))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Target::Replace { existing_mode: None, owner: None }),
        Err(e) => return Err(format!("cannot inspect output {shown}: {e}")),
    };
    let kind = link.file_type();
    if kind.is_symlink() {
        // A link is followed only to what the user named through it: one of
        // our descriptors (/dev/stdout), a stream (a FIFO, /dev/null) or a
        // system node. Any other link is replaced by the new file, never
        // written through.
        let hops = link_chain(path);
        if let Some(fd) = hops.iter().find_map(|h| own_descriptor(h)) {
            return Ok(Target::Descriptor(fd));
        }
        let system = hops.iter().any(|h| in_system_tree(h));
        return Ok(match fs::metadata(path) {
            Ok(m) if m.file_type().is_fifo() || m.file_type().is_char_device() => Target::InPlace,
            Ok(m) if system && m.is_dir() => return Err(format!("output {shown} leads to a directory")),
            Ok(m) if system && !m.is_file() => return Err(format!("output {shown} leads to a block device or socket under /dev or /proc")),
            Ok(_) if system => Target::InPlace,
            Err(_) if system => return Err(format!("output {shown} leads to a missing entry, and tts creates no files under /dev or /proc")),
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
    if in_system_tree(path) {
        return Ok(Target::InPlace);
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

impl WriteError {
    /// The one-line message: a file error through `io` (which names the
    /// output), the producer's as it is.
    fn into_message(self, io: impl FnOnce(std::io::Error) -> String) -> String {
        match self {
            WriteError::Io(e) => io(e),
            WriteError::Other(e) => e,
        }
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
        Target::Descriptor(fd) => write_descriptor(fd, path, write),
        Target::Replace { existing_mode, owner } => {
            if !dir.is_dir() {
                return Err(format!("output directory {} does not exist", dir.display()));
            }
            let mode = existing_mode.unwrap_or(0o666 & !umask());
            replace(dir, name, path, write, mode, owner)
        }
    }
}

/// Opens `path` (never creating it) and writes from its start: a regular
/// file reached this way (under /proc or /dev) is truncated first.
fn write_in_place(path: &Path, write: impl FnOnce(&mut File) -> Result<(), WriteError>) -> Result<(), String> {
    let shown = path.display();
    let mut file = OpenOptions::new().write(true).custom_flags(libc::O_NOCTTY).open(path).map_err(|e| format!("opening output {shown}: {e}"))?;
    let kind = file.metadata().map_err(|e| format!("opening output {shown}: {e}"))?.file_type();
    if kind.is_block_device() || kind.is_socket() || kind.is_dir() {
        return Err(format!("output {shown} is a block device, socket or directory; audio goes to regular files, FIFOs or character devices"));
    }
    if kind.is_file() {
        file.set_len(0).map_err(|e| format!("truncating output {shown}: {e}"))?;
    }
    let failed = |e: WriteError| e.into_message(|e| format!("writing output {}: {e}", path.display()));
    write(&mut file).map_err(failed)?;
    file.flush().map_err(|e| failed(WriteError::Io(e)))
}

/// Writes through this process's descriptor `fd` (named by `path`) where a
/// shell redirection meant: `> x.wav` from its offset, 0, the file cut after
/// the output so no older bytes trail it; `>> x.wav` at its end. A regular
/// file stays seekable for `write` (a WAV header rewritten at the end). An
/// appending descriptor's open file description is the caller's (the shell's,
/// shared with every process that inherited it), so its flags are left alone:
/// the file is opened again through `/proc/self/fd/N`, which gives a new
/// description without `O_APPEND`, and written from the end it had when the
/// run began (`pwrite` would not do: Linux appends on an `O_APPEND`
/// descriptor whatever the offset).
fn write_descriptor(fd: i32, path: &Path, write: impl FnOnce(&mut File) -> Result<(), WriteError>) -> Result<(), String> {
    use std::io::{Seek, SeekFrom};
    let failed = |e: String| format!("writing output {} (descriptor {fd}): {e}", path.display());
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(failed("the descriptor is not open".into()));
    }
    if flags & libc::O_ACCMODE == libc::O_RDONLY {
        return Err(failed("the descriptor is open only for reading".into()));
    }
    // SAFETY: fcntl just showed `fd` open; it is only borrowed to be duplicated.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let mut file = File::from(borrowed.try_clone_to_owned().map_err(|e| failed(e.to_string()))?);
    let kind = file.metadata().map_err(|e| failed(e.to_string()))?.file_type();
    if kind.is_dir() || kind.is_block_device() {
        return Err(failed("it is a directory or block device".into()));
    }
    let appending = kind.is_file() && flags & libc::O_APPEND != 0;
    if appending {
        // Neither created nor truncated: the same file, a description of our own.
        file = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open(format!("/proc/self/fd/{fd}"))
            .map_err(|e| failed(format!("opening the appended file again without O_APPEND: {e}")))?;
        file.seek(SeekFrom::End(0)).map_err(|e| failed(e.to_string()))?;
    }
    write(&mut file).and_then(|()| file.flush().map_err(WriteError::Io)).map_err(|e| e.into_message(|e| failed(e.to_string())))?;
    if kind.is_file() && !appending {
        let end = file.stream_position().map_err(|e| failed(e.to_string()))?;
        file.set_len(end).map_err(|e| failed(e.to_string()))?;
    }
    Ok(())
}

/// Refuses an output that is one of the run's inputs (the same device and
/// inode, whatever the names or links): writing it would destroy the input
/// before, or while, it is read. `inputs` are (what, path) pairs; a
/// directory among them (recorded draws) stands for the files directly in it.
pub fn refuse_input_as_output(out: &Path, inputs: &[(String, PathBuf)]) -> Result<(), String> {
    let Ok(target) = fs::metadata(out) else {
        return Ok(());
    };
    let same = |m: &fs::Metadata| m.dev() == target.dev() && m.ino() == target.ino();
    for (what, path) in inputs {
        let Ok(m) = fs::metadata(path) else { continue };
        let hit = if m.is_dir() {
            // Bounded: a draws directory holds a handful of files.
            fs::read_dir(path).into_iter().flatten().take(10_000).flatten().any(|e| e.metadata().is_ok_and(|m| same(&m)))
        } else {
            same(&m)
        };
        if hit {
            return Err(format!("output {} is the {what} {}; writing it would destroy that input", out.display(), path.display()));
        }
    }
    Ok(())
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
    write(file).map_err(|e| e.into_message(|e| format!("writing {shown}: {e}")))?;
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

    /// A link to `/proc/self/fd/N` (what `/dev/stdout` is) writes through the
    /// descriptor into the file it holds: the link is kept, nothing under
    /// /proc is replaced. The descriptor here is one the test opened on its
    /// own temporary file, never the test's stdout.
    #[test]
    fn links_to_own_descriptors_are_written_through_the_descriptor() {
        use std::io::{Seek, SeekFrom};
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("x.wav");
        // As `> x.wav` leaves it: open for writing at offset 0, stale bytes beyond.
        fs::write(&target, b"stale bytes that must not trail the output").unwrap();
        let held = OpenOptions::new().write(true).open(&target).unwrap();
        let link = dir.path().join("out.wav");
        symlink(format!("/proc/self/fd/{}", held.as_raw_fd()), &link).unwrap();
        write_file(&link, b"audio").unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"audio", "written at the descriptor's offset, cut after");
        assert!(fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link is kept");
        // `/dev/fd/N` names the same descriptor.
        let mut held = held;
        held.seek(SeekFrom::Start(0)).unwrap();
        write_file(Path::new(&format!("/dev/fd/{}", held.as_raw_fd())), b"again").unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"again");
        // `>> x.wav`: appended, the header rewrite included (the append flag
        // would move it to the end).
        let appending = OpenOptions::new().append(true).open(&target).unwrap();
        let flags = |fd: i32| unsafe { libc::fcntl(fd, libc::F_GETFL) };
        let before = flags(appending.as_raw_fd());
        assert_ne!(before & libc::O_APPEND, 0);
        let link2 = dir.path().join("append.wav");
        symlink(format!("/proc/self/fd/{}", appending.as_raw_fd()), &link2).unwrap();
        write_file_with(&link2, |f| {
            use std::io::Seek;
            // The caller's description keeps O_APPEND while the output is
            // written (another writer sharing it still appends).
            assert_eq!(flags(appending.as_raw_fd()), before, "the caller's flags are left alone");
            let start = f.stream_position()?;
            f.write_all(b"HDR?data")?;
            f.seek(SeekFrom::Start(start))?;
            f.write_all(b"HDR!")?;
            f.seek(SeekFrom::End(0))?;
            Ok(())
        })
        .unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"againHDR!data");
        assert_eq!(flags(appending.as_raw_fd()), before, "and afterwards");
        // The caller's appends still go to the end.
        (&appending).write_all(b"+").unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"againHDR!data+");
        assert_eq!(names(dir.path()), vec!["append.wav", "out.wav", "x.wav"]);
    }

    #[test]
    fn nothing_is_created_under_proc_or_dev() {
        let e = write_file(Path::new("/proc/self/tts-no-such-output.wav"), b"x").unwrap_err();
        assert!(e.ends_with("does not exist, and tts creates no files under /dev or /proc"), "{e}");
        // A link to a missing name there is refused the same way, and kept.
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("l.wav");
        symlink("/proc/self/tts-no-such-output.wav", &link).unwrap();
        let e = write_file(&link, b"x").unwrap_err();
        assert!(e.contains("tts creates no files under /dev or /proc"), "{e}");
        assert!(fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    }

    /// `/dev` itself and the kernel's file systems are system trees; the
    /// separate tmpfs at `/dev/shm` is not, so a new file can be written there.
    /// Nothing is written under /dev except one uniquely named file in
    /// /dev/shm, removed at the end.
    #[test]
    fn dev_shm_takes_new_files_but_dev_does_not() {
        assert!(in_system_tree(Path::new("/dev/tts-no-such-output.wav")));
        assert!(classify(Path::new("/dev/tts-no-such-output.wav")).is_err(), "decided without creating anything");
        assert!(in_system_tree(Path::new("/proc/self/tts-no-such-output.wav")));
        for kernel in ["/sys/kernel", "/dev/pts", "/proc/sys/fs/binfmt_misc"] {
            if Path::new(kernel).is_dir() {
                assert!(in_system_tree(&Path::new(kernel).join("tts-no-such-output.wav")), "{kernel}");
            }
        }
        let dir = tempfile::tempdir().unwrap();
        assert!(!in_system_tree(&dir.path().join("o.wav")));
        let shm = Path::new("/dev/shm");
        let separate = fs::metadata(shm).ok().map(|m| m.dev()) != fs::metadata("/dev").ok().map(|m| m.dev());
        if !shm.is_dir() || !separate || !writable(shm) {
            eprintln!("skipped: /dev/shm is absent, not a separate mount or not writable here; the /dev/shm half of this test did not run");
            return;
        }
        let name = tempfile::Builder::new().prefix(".tts-output-test-").suffix(".wav").tempfile_in(shm).unwrap().into_temp_path();
        fs::remove_file(&name).unwrap();
        write_file(&name, b"audio").unwrap();
        assert_eq!(fs::read(&name).unwrap(), b"audio");
        // `name` is removed as it drops.
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
