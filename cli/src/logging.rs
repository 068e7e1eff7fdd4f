//! Logging: `tracing` to stderr, filter from `TTS_LOG` (default `warn,ggml=off`).
//! ggml's own log lines are forwarded under the target `ggml` (ggml info → debug);
//! they are off by default because every failure they describe also comes back as
//! an error the engine reports in one line. `TTS_LOG=ggml=debug` shows them.

use std::ffi::{c_char, c_void, CStr};

pub fn init() {
    engine_core::logging::init_from_env();
    ggml_sys::set_log_callback(Some(forward));
}

unsafe extern "C" fn forward(level: ggml_sys::sys::ggml_log_level, text: *const c_char, _user: *mut c_void) {
    if text.is_null() {
        return;
    }
    let msg = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    let msg = msg.trim_end();
    if msg.is_empty() {
        return;
    }
    match level {
        ggml_sys::sys::GGML_LOG_LEVEL_ERROR => tracing::error!(target: "ggml", "{msg}"),
        ggml_sys::sys::GGML_LOG_LEVEL_WARN => tracing::warn!(target: "ggml", "{msg}"),
        ggml_sys::sys::GGML_LOG_LEVEL_INFO => tracing::debug!(target: "ggml", "{msg}"),
        _ => tracing::trace!(target: "ggml", "{msg}"),
    }
}
