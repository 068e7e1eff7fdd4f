//! What a call reports back: its status, the calling thread's last error as
//! a string, and the runner every entry point goes through, which turns a
//! failure or a panic into a status so that nothing unwinds into C. The
//! library's version is here too: like the last error, a string libtts
//! hands out that no handle owns.

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};

/// What a call did. Every call that can fail returns one; on failure,
/// `tts_last_error` says what is wrong in one line.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TtsStatus {
    /// It worked.
    Ok = 0,
    /// A required pointer was NULL, a string was not UTF-8, or an argument
    /// was out of range.
    InvalidArgument = 1,
    /// The handle is NULL, already freed, or not a handle of this kind.
    InvalidHandle = 2,
    /// The engine could not be opened: the profile, the plugins, the device
    /// or the model.
    OpenFailed = 3,
    /// The synthesis failed: an empty text, an unknown option or a bad
    /// value, or the model's own error.
    SynthesisFailed = 4,
    /// The synthesis was stopped by `tts_engine_cancel`, by the callback's
    /// non-zero return, or by `tts_engine_free` from another thread.
    Cancelled = 5,
    /// The caller's buffer is too small; the needed length was written.
    BufferTooSmall = 6,
    /// An internal error (a bug): the engine that reported it should be freed.
    Internal = 7,
}

/// A failed call: its status and its one-line message.
pub(crate) struct Failure(pub(crate) TtsStatus, pub(crate) String);

impl Failure {
    pub(crate) fn invalid(message: impl Into<String>) -> Failure {
        Failure(TtsStatus::InvalidArgument, message.into())
    }
}

pub(crate) type Outcome<T> = Result<T, Failure>;

thread_local! {
    /// The message of the calling thread's last failed call; empty after a
    /// call that succeeded.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    // A message with a NUL in it (from a file name) is cut there rather than lost.
    let bytes: Vec<u8> = message.bytes().take_while(|&b| b != 0).collect();
    let text = CString::new(bytes).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
}

/// Runs one entry point: clears the thread's last error, catches panics,
/// and turns a failure into its status with the message kept.
pub(crate) fn guarded(call: impl FnOnce() -> Outcome<()>) -> TtsStatus {
    set_last_error("");
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)).unwrap_or_else(|panic| {
        let what = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_default();
        Err(Failure(TtsStatus::Internal, format!("internal error: {what}")))
    });
    match outcome {
        Ok(()) => {
            // A callback may have made calls that failed meanwhile.
            set_last_error("");
            TtsStatus::Ok
        }
        Err(Failure(status, message)) => {
            set_last_error(&message);
            status
        }
    }
}

/// The one-line message of the calling thread's last failed call, or ""
/// when its last call succeeded. Never NULL; valid until the thread's next
/// call into libtts.
#[no_mangle]
pub extern "C" fn tts_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// The library's version ("0.1.0"), a static string.
#[no_mangle]
pub extern "C" fn tts_version() -> *const c_char {
    static VERSION: &CStr = match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => panic!("the version has a NUL"),
    };
    VERSION.as_ptr()
}
