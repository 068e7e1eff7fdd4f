//! Bindings to ggml (`sys`) and a thin safe layer over the parts plugins use:
//! contexts and tensors ([`Context`], [`Tensor`]), graphs ([`Graph`]), devices,
//! backends and buffers ([`Device`], [`Backend`], [`Buffer`]), DL module loading
//! ([`load_backend_module`]) and GGUF reading ([`gguf::GgufFile`]).
//!
//! Every library in a process links the same shared `libggml-base`, so raw
//! `ggml_backend_t` pointers may cross plugin boundaries ([`Backend::from_raw`]).

#![allow(clippy::missing_safety_doc)]

pub mod backend;
pub mod compute;
pub mod context;
pub mod gguf;
pub mod ops;

pub use backend::{load_backend_module, Backend, Buffer, BufferType, Device, DeviceKind, Registry};
pub use compute::{ComputeGraph, GraphIo, GraphSlot};
pub use context::{Context, Graph, Tensor};

#[allow(non_upper_case_globals, non_camel_case_types, non_snake_case, dead_code, clippy::all)]
pub mod sys {
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}

/// ggml's private graph struct, for [`compute::ComputeGraph`]'s identity.
#[allow(non_upper_case_globals, non_camel_case_types, non_snake_case, dead_code, clippy::all)]
mod graph_internals {
    include!(concat!(env!("OUT_DIR"), "/graph_internals.rs"));
}

/// ggml version of the pinned source this crate was built from.
pub const GGML_VERSION: &str = env!("GGML_SYS_VERSION");
/// Registry package (name-version) the ggml source came from.
pub const SOURCE_PACKAGE: &str = env!("GGML_SYS_SOURCE_PACKAGE");
/// SHA-256 over the base sources; backend modules carry the same value in their stamp.
pub const SOURCE_FINGERPRINT: &str = env!("GGML_SYS_SOURCE_FINGERPRINT");

pub use sys::ggml_type as Type;
pub use sys::{
    GGML_TYPE_BF16 as TYPE_BF16, GGML_TYPE_F16 as TYPE_F16, GGML_TYPE_F32 as TYPE_F32, GGML_TYPE_I32 as TYPE_I32, GGML_TYPE_I64 as TYPE_I64,
    GGML_TYPE_Q4_0 as TYPE_Q4_0, GGML_TYPE_Q8_0 as TYPE_Q8_0,
};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Msg(String),
}

pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn err<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::Msg(msg.into()))
}

pub(crate) unsafe fn cstr_to_string(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// The version string the loaded `libggml-base` reports about itself.
pub fn runtime_version() -> String {
    unsafe { cstr_to_string(sys::ggml_version()) }
}

/// Name of a ggml type ("f32", "f16", "q8_0", ...).
pub fn type_name(t: Type) -> String {
    unsafe { cstr_to_string(sys::ggml_type_name(t)) }
}

/// Name of a ggml op ("MUL_MAT", "FLASH_ATTN_EXT", ...).
pub fn op_name(op: sys::ggml_op) -> String {
    unsafe { cstr_to_string(sys::ggml_op_name(op)) }
}

/// Routes ggml's log output into a callback (the host forwards it to `tracing`).
pub fn set_log_callback(cb: sys::ggml_log_callback) {
    unsafe { sys::ggml_log_set(cb, std::ptr::null_mut()) }
}

/// Drops ggml's log output (fuzzing, where every refused input would log).
pub fn silence_log() {
    unsafe extern "C" fn drop_message(_: sys::ggml_log_level, _: *const std::os::raw::c_char, _: *mut std::ffi::c_void) {}
    set_log_callback(Some(drop_message));
}
