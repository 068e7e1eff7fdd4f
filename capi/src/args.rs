//! The caller's arguments: C strings read as UTF-8 text or as paths, the
//! parallel option arrays, and the out-parameters results are written
//! through. Each bad argument becomes `TTS_STATUS_INVALID_ARGUMENT` with a
//! message naming it.

use crate::status::{Failure, Outcome};
use std::ffi::{c_char, CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// A required C string argument as UTF-8.
///
/// # Safety
/// `ptr` is NULL or a NUL-terminated string.
pub(crate) unsafe fn utf8_arg<'a>(ptr: *const c_char, what: &str) -> Outcome<&'a str> {
    if ptr.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL and NUL-terminated, as the caller promises.
    let bytes = unsafe { CStr::from_ptr(ptr) }.to_bytes();
    std::str::from_utf8(bytes).map_err(|e| Failure::invalid(format!("{what} is not UTF-8 text (invalid byte at offset {})", e.valid_up_to())))
}

/// An optional C string argument naming a path (any bytes but NUL).
///
/// # Safety
/// `ptr` is NULL or a NUL-terminated string.
pub(crate) unsafe fn path_arg(ptr: *const c_char, what: &str) -> Outcome<Option<PathBuf>> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL and NUL-terminated, as the caller promises.
    let bytes = unsafe { CStr::from_ptr(ptr) }.to_bytes();
    if bytes.is_empty() {
        return Err(Failure::invalid(format!("{what} is empty (pass NULL for the default)")));
    }
    Ok(Some(PathBuf::from(OsStr::from_bytes(bytes))))
}

/// `count` options from the parallel arrays `keys` and `values`.
///
/// # Safety
/// With `count` > 0, `keys` and `values` point to `count` pointers each,
/// each NULL or a NUL-terminated string.
pub(crate) unsafe fn options_arg(keys: *const *const c_char, values: *const *const c_char, count: usize) -> Outcome<Vec<(String, String)>> {
    if count == 0 {
        return Ok(Vec::new());
    }
    if keys.is_null() || values.is_null() {
        return Err(Failure::invalid(format!("option_count is {count} but option_keys or option_values is NULL")));
    }
    (0..count)
        .map(|i| {
            // SAFETY: both arrays hold `count` entries, as the caller promises.
            let (key, value) = unsafe { (*keys.add(i), *values.add(i)) };
            // SAFETY: each entry is NULL or NUL-terminated.
            let key = unsafe { utf8_arg(key, &format!("option key {i}")) }?;
            let value = unsafe { utf8_arg(value, &format!("the value of option {key}")) }?;
            Ok((key.to_string(), value.to_string()))
        })
        .collect()
}

/// Writes `value` through `out` where the caller passed a place for it.
///
/// # Safety
/// `out` is NULL or valid for a write of `T`.
pub(crate) unsafe fn put<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: non-NULL and writable, as the caller promises.
        unsafe { out.write(value) };
    }
}

pub(crate) fn required<T>(out: *mut T, what: &str) -> Outcome<()> {
    if out.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    Ok(())
}
