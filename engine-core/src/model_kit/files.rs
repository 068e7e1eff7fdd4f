//! Input files a user names by path (voices, reference recordings, noise and
//! draws `.npy` files, profiles, text): opened so that a FIFO cannot block the
//! open, checked to be a regular file on the opened descriptor (not a path
//! that may change between a check and the open), and read no further than a
//! cap per input kind (`docs/reliability.md`, "Input files").
//!
//! A FIFO, a device (`/dev/zero`, `/dev/urandom`), a directory or a socket is
//! refused with one line naming the kind: a FIFO would block the reader for
//! ever and a device would be read until memory runs out.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Caps per input kind: each far above what real use needs (the figure in
/// parentheses), so only a hostile or mistaken file reaches it.
pub mod caps {
    /// A Supertonic voice-style JSON (~50 KB).
    pub const VOICE_JSON: u64 = 16 << 20;
    /// A Chatterbox voice file (~200 KB; at most ~1 MB within its bounds).
    pub const VOICE_FILE: u64 = 16 << 20;
    /// A `.npy` of noise or recorded draws (a 120 s Supertonic chunk's noise is ~3 MB).
    pub const NPY: u64 = 256 << 20;
    /// A reference recording: no cap on the file, since it is decoded as a
    /// stream and reading stops after the first 60 s of audio (a two-hour
    /// recording is taken, its first minute used).
    pub const AUDIO: u64 = u64::MAX;
    /// A profile (~2 KB).
    pub const PROFILE: u64 = 1 << 20;
    /// A text file (a whole book is ~1 MB).
    pub const TEXT: u64 = 16 << 20;
    /// A PyTorch checkpoint a converter reads (Chatterbox's `s3gen.pt` is
    /// ~1 GB); its storages are read tensor by tensor, never whole.
    pub const PT: u64 = 16 << 30;
    /// A safetensors checkpoint a converter reads (Chatterbox Multilingual's
    /// T3 is ~2 GB); it is memory-mapped and read tensor by tensor.
    pub const SAFETENSORS: u64 = 64 << 30;
}

/// The kind of a non-regular file, as errors name it.
fn kind_name(kind: std::fs::FileType) -> Option<&'static str> {
    if kind.is_file() {
        None
    } else {
        Some(ggml_sys::gguf::non_regular_kind(kind).unwrap_or("not a regular file"))
    }
}

/// Opens `path` for reading as a regular file of at most `cap` bytes; `what`
/// names the input in errors ("voice file"). The open is non-blocking (a FIFO
/// without a writer returns at once) and the kind and size are those of the
/// opened descriptor.
pub fn open_regular(path: &Path, what: &str, cap: u64) -> Result<File, String> {
    let shown = named(what, path);
    let file =
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(path).map_err(|e| format!("{shown}: {}", io_reason(&e)))?;
    let meta = file.metadata().map_err(|e| format!("{shown}: {e}"))?;
    if let Some(kind) = kind_name(meta.file_type()) {
        return Err(format!("{shown} is {kind}, not a regular file"));
    }
    if meta.len() > cap {
        return Err(format!("{shown} is {} bytes; the most this input may be is {} ({})", meta.len(), cap, mib(cap)));
    }
    // Reads of a regular file never block; clear the flag anyway so later
    // readers see an ordinary descriptor.
    use std::os::fd::AsRawFd;
    unsafe {
        let flags = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    Ok(file)
}

/// [`open_regular`] (`what` may be empty: errors then start with the path),
/// then the whole file, still no more than `cap` bytes (a
/// file that grows while it is read is cut off with an error, not followed).
pub fn read_regular(path: &Path, what: &str, cap: u64) -> Result<Vec<u8>, String> {
    let file = open_regular(path, what, cap)?;
    read_capped(file, &named(what, path), cap)
}

/// "voice file v.json", or the path alone when `what` is empty.
fn named(what: &str, path: &Path) -> String {
    if what.is_empty() {
        path.display().to_string()
    } else {
        format!("{what} {}", path.display())
    }
}

/// Up to `cap` bytes of `reader`; more is an error naming `what`.
pub fn read_capped(reader: impl Read, what: &str, cap: u64) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    reader.take(cap + 1).read_to_end(&mut bytes).map_err(|e| format!("{what}: {e}"))?;
    if bytes.len() as u64 > cap {
        return Err(format!("{what} holds more than {} ({} bytes), the most this input may be", mib(cap), cap));
    }
    Ok(bytes)
}

fn mib(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{} GiB", bytes >> 30)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

/// `e` without the "(os error N)" suffix std adds.
fn io_reason(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    #[test]
    fn regular_files_are_read_within_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("v.json");
        std::fs::write(&p, b"{}").unwrap();
        assert_eq!(read_regular(&p, "voice", 2).unwrap(), b"{}");
        let e = read_regular(&p, "voice", 1).unwrap_err();
        assert!(e.contains("is 2 bytes; the most this input may be is 1"), "{e}");
        let e = read_regular(&dir.path().join("none"), "voice", 1).unwrap_err();
        assert!(e.ends_with("none: No such file or directory"), "{e}");
    }

    #[test]
    fn fifos_directories_and_devices_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        mkfifo(&fifo);
        // No writer: a blocking open would never return.
        let e = read_regular(&fifo, "noise_npy", caps::NPY).unwrap_err();
        assert!(e.ends_with("is a FIFO, not a regular file"), "{e}");
        let e = read_regular(dir.path(), "voice", caps::VOICE_JSON).unwrap_err();
        assert!(e.ends_with("is a directory, not a regular file"), "{e}");
        // A link to a FIFO is the FIFO.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        assert!(read_regular(&link, "voice", 1).unwrap_err().ends_with("is a FIFO, not a regular file"));
    }

    #[test]
    fn endless_streams_stop_at_the_cap() {
        let e = read_capped(std::io::repeat(0), "stdin", 1 << 20).unwrap_err();
        assert!(e.starts_with("stdin holds more than 1 MiB"), "{e}");
    }
}
