//! The live handles. A handle is a token from one counter, never an
//! address: each entry point looks it up in the registry of its kind, so a
//! NULL, freed, forged or other-kind handle is refused and never
//! dereferenced. An engine's entry holds what its calls need: the model
//! session, the cancel flag, and the strings the listing calls hand out.

use crate::status::{Failure, Outcome, TtsStatus};
use engine_core::engine::{Engine, ModelSession};
use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

/// An engine: a profile's model loaded on the device the profile selects.
/// Opaque; made by `tts_engine_open` or `tts_engine_open_text`, freed by
/// `tts_engine_free`.
pub struct TtsEngine {
    _opaque: [u8; 0],
}

/// Audio made by `tts_synthesize`: mono float samples in [-1, 1] and their
/// rate. Opaque; read with `tts_audio_data`, freed by `tts_audio_free`.
pub struct TtsAudio {
    _opaque: [u8; 0],
}

/// NUL-terminated strings that stay put while their owner lives: what the
/// listing calls hand out.
pub(crate) struct StringList {
    pub(crate) strings: Vec<CString>,
    pub(crate) pointers: Vec<*const c_char>,
}

// SAFETY: the pointers point into `strings`, owned alongside and never
// mutated; they are only read.
unsafe impl Send for StringList {}
unsafe impl Sync for StringList {}

impl StringList {
    pub(crate) fn new(items: impl IntoIterator<Item = String>) -> StringList {
        let strings: Vec<CString> = items.into_iter().map(|s| CString::new(s.replace('\0', "")).unwrap_or_default()).collect();
        let pointers = strings.iter().map(|s| s.as_ptr()).collect();
        StringList { strings, pointers }
    }
}

/// A live engine. The registry holds one reference; a call in progress holds
/// another, so `tts_engine_free` from another thread never pulls the engine
/// from under a synthesis.
pub(crate) struct EngineSlot {
    // Dropped before the engine whose backend it computes on.
    pub(crate) session: Mutex<ModelSession>,
    pub(crate) _engine: Engine,
    /// Set by `tts_engine_cancel` and `tts_engine_free`; cleared when a
    /// synthesis starts.
    pub(crate) cancel: AtomicBool,
    pub(crate) model: StringList,
    pub(crate) sample_rate: u32,
    pub(crate) voices: StringList,
    pub(crate) languages: StringList,
    pub(crate) options: StringList,
}

/// Audio made by `tts_synthesize`.
pub(crate) struct Audio {
    pub(crate) samples: Vec<f32>,
    pub(crate) sample_rate: u32,
}

/// Handles are tokens from one counter, never reused, so a freed handle or
/// one of the other kind is never mistaken for a live one.
static NEXT_TOKEN: AtomicUsize = AtomicUsize::new(1);
pub(crate) static ENGINES: LazyLock<Mutex<HashMap<usize, Arc<EngineSlot>>>> = LazyLock::new(Default::default);
pub(crate) static AUDIO: LazyLock<Mutex<HashMap<usize, Audio>>> = LazyLock::new(Default::default);

/// A registry's lock; a registry holds no invariant a panic could break
/// half-way (an insert or a remove), so a poisoned lock is still usable.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(crate) fn new_token() -> usize {
    NEXT_TOKEN.fetch_add(1, Ordering::Relaxed)
}

pub(crate) fn engine_slot(engine: *const TtsEngine) -> Outcome<Arc<EngineSlot>> {
    if engine.is_null() {
        return Err(Failure(TtsStatus::InvalidHandle, "the engine handle is NULL".into()));
    }
    lock(&ENGINES)
        .get(&engine.addr())
        .cloned()
        .ok_or_else(|| Failure(TtsStatus::InvalidHandle, "the engine handle is not a live engine (freed already, or not an engine)".into()))
}

/// Registers `slot` and hands its handle out through `out_engine`.
///
/// # Safety
/// `out_engine` is valid for a write.
pub(crate) unsafe fn hand_out(slot: Arc<EngineSlot>, out_engine: *mut *mut TtsEngine) {
    let token = new_token();
    lock(&ENGINES).insert(token, slot);
    // SAFETY: checked non-NULL by the caller of this function.
    unsafe { out_engine.write(std::ptr::without_provenance_mut(token)) };
}
