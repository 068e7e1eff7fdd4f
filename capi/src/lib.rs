//! libtts: the engine's C API (docs/c-api.md).
//!
//! The front end for applications in C, C++ or anything with a C FFI: an
//! engine opened from a profile, its model's voices, languages and options,
//! synthesis into an engine-owned or a caller-provided float buffer,
//! streaming through a callback, cancellation from another thread, and the
//! last error of the calling thread as a string. It sits on the same engine
//! API as the `tts` command (`engine_core::engine`).
//!
//! What crosses the boundary is C only: opaque handles, status codes,
//! NUL-terminated UTF-8 strings, float arrays. A handle is a token, never an
//! address: each entry point looks it up in a registry of live handles, so a
//! NULL, freed, forged or other-kind handle is refused with
//! `TTS_STATUS_INVALID_HANDLE` and never dereferenced. Every entry point
//! catches panics (`TTS_STATUS_INTERNAL`); none unwinds into C.
//!
//! The header, include/tts.h, is generated from this file by cbindgen;
//! tests/header.rs fails when the committed header differs from the
//! regenerated one (`TTS_UPDATE_HEADER=1` rewrites it).

use engine_core::engine::{self, Engine, EngineError, ModelSession};
use engine_core::profile::Profile;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
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

/// Receives each piece of streamed audio: `len` mono samples in [-1, 1] at
/// `sample_rate` Hz, valid only during the call, and the caller's
/// `user_data`. Returns 0 to go on, non-zero to cancel the synthesis
/// (`tts_synthesize_stream` then returns `TTS_STATUS_CANCELLED`). Called on
/// the thread that called `tts_synthesize_stream`; it must not unwind (no
/// C++ exception may leave it).
pub type TtsAudioCallback = Option<unsafe extern "C" fn(samples: *const f32, len: usize, sample_rate: u32, user_data: *mut c_void) -> i32>;

/// A failed call: its status and its one-line message.
struct Failure(TtsStatus, String);

impl Failure {
    fn invalid(message: impl Into<String>) -> Failure {
        Failure(TtsStatus::InvalidArgument, message.into())
    }
}

type Outcome<T> = Result<T, Failure>;

thread_local! {
    /// The message of the calling thread's last failed call; empty after a
    /// call that succeeded.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    /// Tokens of the engines this thread is synthesizing on (a callback
    /// calling back into its own engine must fail, not deadlock).
    static BUSY: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

fn set_last_error(message: &str) {
    // A message with a NUL in it (from a file name) is cut there rather than lost.
    let bytes: Vec<u8> = message.bytes().take_while(|&b| b != 0).collect();
    let text = CString::new(bytes).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
}

/// Runs one entry point: clears the thread's last error, catches panics,
/// and turns a failure into its status with the message kept.
fn guarded(call: impl FnOnce() -> Outcome<()>) -> TtsStatus {
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

/// NUL-terminated strings that stay put while their owner lives: what the
/// listing calls hand out.
struct StringList {
    strings: Vec<CString>,
    pointers: Vec<*const c_char>,
}

// SAFETY: the pointers point into `strings`, owned alongside and never
// mutated; they are only read.
unsafe impl Send for StringList {}
unsafe impl Sync for StringList {}

impl StringList {
    fn new(items: impl IntoIterator<Item = String>) -> StringList {
        let strings: Vec<CString> = items.into_iter().map(|s| CString::new(s.replace('\0', "")).unwrap_or_default()).collect();
        let pointers = strings.iter().map(|s| s.as_ptr()).collect();
        StringList { strings, pointers }
    }
}

/// A live engine. The registry holds one reference; a call in progress holds
/// another, so `tts_engine_free` from another thread never pulls the engine
/// from under a synthesis.
struct EngineSlot {
    // Dropped before the engine whose backend it computes on.
    session: Mutex<ModelSession>,
    _engine: Engine,
    /// Set by `tts_engine_cancel` and `tts_engine_free`; cleared when a
    /// synthesis starts.
    cancel: AtomicBool,
    model: StringList,
    sample_rate: u32,
    voices: StringList,
    languages: StringList,
    options: StringList,
}

/// Audio made by `tts_synthesize`.
struct Audio {
    samples: Vec<f32>,
    sample_rate: u32,
}

/// Handles are tokens from one counter, never reused, so a freed handle or
/// one of the other kind is never mistaken for a live one.
static NEXT_TOKEN: AtomicUsize = AtomicUsize::new(1);
static ENGINES: LazyLock<Mutex<HashMap<usize, Arc<EngineSlot>>>> = LazyLock::new(Default::default);
static AUDIO: LazyLock<Mutex<HashMap<usize, Audio>>> = LazyLock::new(Default::default);

/// A registry's lock; a registry holds no invariant a panic could break
/// half-way (an insert or a remove), so a poisoned lock is still usable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn new_token() -> usize {
    NEXT_TOKEN.fetch_add(1, Ordering::Relaxed)
}

fn engine_slot(engine: *const TtsEngine) -> Outcome<Arc<EngineSlot>> {
    if engine.is_null() {
        return Err(Failure(TtsStatus::InvalidHandle, "the engine handle is NULL".into()));
    }
    lock(&ENGINES)
        .get(&engine.addr())
        .cloned()
        .ok_or_else(|| Failure(TtsStatus::InvalidHandle, "the engine handle is not a live engine (freed already, or not an engine)".into()))
}

/// A required C string argument as UTF-8.
///
/// # Safety
/// `ptr` is NULL or a NUL-terminated string.
unsafe fn utf8_arg<'a>(ptr: *const c_char, what: &str) -> Outcome<&'a str> {
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
unsafe fn path_arg(ptr: *const c_char, what: &str) -> Outcome<Option<PathBuf>> {
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
unsafe fn options_arg(keys: *const *const c_char, values: *const *const c_char, count: usize) -> Outcome<Vec<(String, String)>> {
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
unsafe fn put<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: non-NULL and writable, as the caller promises.
        unsafe { out.write(value) };
    }
}

fn required<T>(out: *mut T, what: &str) -> Outcome<()> {
    if out.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    Ok(())
}

/// The path of the loaded libtts, from the dynamic loader (dladdr).
fn library_path() -> Option<PathBuf> {
    // SAFETY: Dl_info is plain data, zero is a valid value of each field.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let here = library_path as fn() -> Option<PathBuf> as *const c_void;
    // SAFETY: `here` is an address in this library; dladdr only writes `info`.
    if unsafe { libc::dladdr(here, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr gives a NUL-terminated file name, valid while the library is loaded.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    std::fs::canonicalize(Path::new(OsStr::from_bytes(name.to_bytes()))).ok()
}

fn open_engine(profile: Profile, plugin_dir: Option<PathBuf>) -> Outcome<Arc<EngineSlot>> {
    let opened = |e: EngineError| Failure(TtsStatus::OpenFailed, e.to_string());
    let given: Vec<PathBuf> = plugin_dir.into_iter().collect();
    let dirs = engine::library_plugin_dirs(&profile, library_path().as_deref(), &given).map_err(opened)?;
    let engine = Engine::open(profile, dirs).map_err(opened)?;
    let session = engine.open_model(&[]).map_err(opened)?;
    let catalog = session.catalog();
    let slot = EngineSlot {
        model: StringList::new([session.info.family.to_string(), session.info.variant.to_string()]),
        sample_rate: session.info.sample_rate,
        voices: StringList::new(catalog.voices.iter().map(|v| v.to_string())),
        languages: StringList::new(catalog.languages.iter().map(|l| l.to_string())),
        options: StringList::new(session.option_specs().iter().map(|s| s.key.to_string())),
        session: Mutex::new(session),
        _engine: engine,
        cancel: AtomicBool::new(false),
    };
    Ok(Arc::new(slot))
}

/// Registers `slot` and hands its handle out through `out_engine`.
///
/// # Safety
/// `out_engine` is valid for a write.
unsafe fn hand_out(slot: Arc<EngineSlot>, out_engine: *mut *mut TtsEngine) {
    let token = new_token();
    lock(&ENGINES).insert(token, slot);
    // SAFETY: checked non-NULL by the caller of this function.
    unsafe { out_engine.write(std::ptr::without_provenance_mut(token)) };
}

/// Opens an engine from the profile file at `profile_path` (TOML; see
/// docs/profiles.md): selects the device, loads the profile's model and
/// checks its `[synthesis]` options. Plugins load from `plugin_dir`; when it
/// is NULL, from the directories in `TTS_PLUGIN_PATH`; when that is unset,
/// from `plugins/` beside the directory holding libtts.so (the bundle's
/// `lib/libtts.so` and `plugins/`). A profile's `[plugins] dirs` is refused:
/// a profile is data, not trusted to name code.
///
/// On success `*out_engine` is the new engine; on failure it is NULL.
///
/// # Safety
/// `profile_path` and `plugin_dir` are NULL or NUL-terminated strings;
/// `out_engine` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tts_engine_open(profile_path: *const c_char, plugin_dir: *const c_char, out_engine: *mut *mut TtsEngine) -> TtsStatus {
    guarded(|| {
        required(out_engine, "out_engine")?;
        // SAFETY: checked non-NULL.
        unsafe { out_engine.write(std::ptr::null_mut()) };
        // SAFETY: the caller's strings, NULL or NUL-terminated.
        let path = unsafe { path_arg(profile_path, "profile_path") }?.ok_or_else(|| Failure::invalid("profile_path is NULL"))?;
        let plugin_dir = unsafe { path_arg(plugin_dir, "plugin_dir") }?;
        let profile = Profile::load(&path).map_err(|e| Failure(TtsStatus::OpenFailed, e.to_string()))?;
        let slot = open_engine(profile, plugin_dir)?;
        // SAFETY: checked non-NULL.
        unsafe { hand_out(slot, out_engine) };
        Ok(())
    })
}

/// `tts_engine_open` with the profile given as TOML text rather than a file.
/// Relative paths in it resolve against the working directory.
///
/// # Safety
/// As `tts_engine_open`; `profile_toml` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn tts_engine_open_text(profile_toml: *const c_char, plugin_dir: *const c_char, out_engine: *mut *mut TtsEngine) -> TtsStatus {
    guarded(|| {
        required(out_engine, "out_engine")?;
        // SAFETY: checked non-NULL.
        unsafe { out_engine.write(std::ptr::null_mut()) };
        // SAFETY: the caller's strings, NULL or NUL-terminated.
        let text = unsafe { utf8_arg(profile_toml, "profile_toml") }?;
        let plugin_dir = unsafe { path_arg(plugin_dir, "plugin_dir") }?;
        let profile = Profile::parse(text, "<profile text>", Path::new(".")).map_err(|e| Failure(TtsStatus::OpenFailed, e.to_string()))?;
        let slot = open_engine(profile, plugin_dir)?;
        // SAFETY: checked non-NULL.
        unsafe { hand_out(slot, out_engine) };
        Ok(())
    })
}

/// Frees `engine`. A synthesis running on it in another thread is
/// cancelled, and the engine's memory goes when that call returns. NULL is
/// accepted and does nothing; a handle freed already gives
/// `TTS_STATUS_INVALID_HANDLE`. The strings the engine handed out are
/// invalid afterwards.
#[no_mangle]
pub extern "C" fn tts_engine_free(engine: *mut TtsEngine) -> TtsStatus {
    guarded(|| {
        if engine.is_null() {
            return Ok(());
        }
        // Out of the registry first, then the cancel: a synthesis that starts
        // meanwhile either finds the handle gone or sees the cancel
        // (`run_synthesis` clears the flag before it looks).
        let removed = lock(&ENGINES).remove(&engine.addr());
        let Some(slot) = removed else {
            return Err(Failure(TtsStatus::InvalidHandle, "the engine handle is not a live engine (freed already, or not an engine)".into()));
        };
        slot.cancel.store(true, Ordering::SeqCst);
        Ok(())
    })
}

/// Cancels the synthesis running on `engine` now, if any (from any thread):
/// it stops at the model's next piece or progress report and returns
/// `TTS_STATUS_CANCELLED`. A synthesis started later is not affected.
#[no_mangle]
pub extern "C" fn tts_engine_cancel(engine: *mut TtsEngine) -> TtsStatus {
    guarded(|| {
        engine_slot(engine)?.cancel.store(true, Ordering::SeqCst);
        Ok(())
    })
}

/// The loaded model: its family (`*out_family`, such as "supertonic"), its
/// variant (`*out_variant`) and its sample rate in Hz. Each out pointer may
/// be NULL. The strings live as long as the engine.
///
/// # Safety
/// Each out pointer is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tts_engine_model(
    engine: *const TtsEngine,
    out_family: *mut *const c_char,
    out_variant: *mut *const c_char,
    out_sample_rate: *mut u32,
) -> TtsStatus {
    guarded(|| {
        let slot = engine_slot(engine)?;
        // SAFETY: the caller's out pointers, NULL or writable; the strings
        // live in the slot, which the registry keeps until tts_engine_free.
        unsafe {
            put(out_family, slot.model.pointers[0]);
            put(out_variant, slot.model.pointers[1]);
            put(out_sample_rate, slot.sample_rate);
        }
        Ok(())
    })
}

/// Hands out one of the engine's lists.
///
/// # Safety
/// `out_names` and `out_count` are valid for a write when non-NULL.
unsafe fn list(engine: *const TtsEngine, pick: fn(&EngineSlot) -> &StringList, out_names: *mut *const *const c_char, out_count: *mut usize) -> TtsStatus {
    guarded(|| {
        required(out_names, "out_names")?;
        required(out_count, "out_count")?;
        let slot = engine_slot(engine)?;
        let names = pick(&slot);
        // SAFETY: checked non-NULL; the array lives in the slot until tts_engine_free.
        unsafe {
            out_names.write(names.pointers.as_ptr());
            out_count.write(names.strings.len());
        }
        Ok(())
    })
}

/// The model's built-in voices, by the names the `voice` option takes, the
/// default first: `*out_count` strings at `*out_names`, living as long as
/// the engine. A model that clones voices also takes a voice file's path.
///
/// # Safety
/// `out_names` and `out_count` are valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tts_engine_voices(engine: *const TtsEngine, out_names: *mut *const *const c_char, out_count: *mut usize) -> TtsStatus {
    // SAFETY: passed on as the caller gave them.
    unsafe { list(engine, |s| &s.voices, out_names, out_count) }
}

/// The language codes the `language` option takes, the default first (none
/// when the model has no such option); as `tts_engine_voices`.
///
/// # Safety
/// `out_names` and `out_count` are valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tts_engine_languages(engine: *const TtsEngine, out_names: *mut *const *const c_char, out_count: *mut usize) -> TtsStatus {
    // SAFETY: passed on as the caller gave them.
    unsafe { list(engine, |s| &s.languages, out_names, out_count) }
}

/// The keys of the options a synthesis takes (`voice`, `speed`, ...; `tts
/// options` describes them); as `tts_engine_voices`.
///
/// # Safety
/// `out_names` and `out_count` are valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tts_engine_options(engine: *const TtsEngine, out_names: *mut *const *const c_char, out_count: *mut usize) -> TtsStatus {
    // SAFETY: passed on as the caller gave them.
    unsafe { list(engine, |s| &s.options, out_names, out_count) }
}

/// Marks the calling thread as synthesizing on `token` while alive.
struct Busy(usize);

impl Busy {
    fn enter(token: usize) -> Outcome<Busy> {
        BUSY.with(|b| {
            let mut busy = b.borrow_mut();
            if busy.contains(&token) {
                return Err(Failure::invalid("the engine is synthesizing on this thread (called from its own audio callback)"));
            }
            busy.push(token);
            Ok(Busy(token))
        })
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        BUSY.with(|b| b.borrow_mut().retain(|&t| t != self.0));
    }
}

/// Synthesizes `text` on `engine`, handing each piece to `on_piece` (false:
/// stop). `whole`: the pieces join to the model's one-shot samples (a
/// buffer), as the CLI's file output does.
fn run_synthesis(
    engine: *const TtsEngine,
    text: &str,
    options: &[(String, String)],
    whole: bool,
    mut on_piece: impl FnMut(&[f32], u32) -> bool,
) -> Outcome<()> {
    let slot = engine_slot(engine)?;
    let _busy = Busy::enter(engine.addr())?;
    let mut session = slot.session.lock().map_err(|_| Failure(TtsStatus::Internal, "an earlier internal error left this engine unusable; free it".into()))?;
    slot.cancel.store(false, Ordering::SeqCst);
    if !lock(&ENGINES).contains_key(&engine.addr()) {
        return Err(Failure(TtsStatus::InvalidHandle, "the engine was freed before its synthesis started".into()));
    }
    let mut overrides = options.to_vec();
    if whole {
        overrides.extend(session.one_shot_overrides());
    }
    let mut stopped_by_caller = false;
    let cancel = &slot.cancel;
    let summary = session
        .synthesize_observed(
            text,
            &overrides,
            |samples, rate| {
                if cancel.load(Ordering::SeqCst) {
                    return Ok(false);
                }
                let go_on = on_piece(samples, rate);
                stopped_by_caller |= !go_on;
                Ok(go_on)
            },
            |_| !cancel.load(Ordering::SeqCst),
        )
        .map_err(|e| Failure(TtsStatus::SynthesisFailed, e.to_string()))?;
    if summary.cancelled || stopped_by_caller || cancel.load(Ordering::SeqCst) {
        let by = if stopped_by_caller { "by the audio callback" } else { "by tts_engine_cancel or tts_engine_free" };
        return Err(Failure(TtsStatus::Cancelled, format!("the synthesis was cancelled {by}")));
    }
    Ok(())
}

/// Synthesizes `text` (UTF-8) into the whole audio, collected in one piece.
fn synthesize_whole(engine: *const TtsEngine, text: &str, options: &[(String, String)]) -> Outcome<Audio> {
    let mut audio = Audio { samples: Vec::new(), sample_rate: 0 };
    run_synthesis(engine, text, options, true, |samples, rate| {
        audio.samples.extend_from_slice(samples);
        audio.sample_rate = rate;
        true
    })?;
    if audio.sample_rate == 0 {
        return Err(Failure(TtsStatus::SynthesisFailed, "the model made no audio".into()));
    }
    Ok(audio)
}

/// Synthesizes `text` (UTF-8) with `option_count` options (`option_keys[i]`
/// set to `option_values[i]`, as `tts --set key=value`, for this text only)
/// into audio the engine owns: `*out_audio`, read with `tts_audio_data` and
/// freed with `tts_audio_free`. On failure `*out_audio` is NULL. Calls on
/// one engine run one at a time.
///
/// # Safety
/// `text` is NULL or NUL-terminated; with `option_count` > 0 both option
/// arrays hold that many NUL-terminated strings; `out_audio` is NULL or
/// valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tts_synthesize(
    engine: *mut TtsEngine,
    text: *const c_char,
    option_keys: *const *const c_char,
    option_values: *const *const c_char,
    option_count: usize,
    out_audio: *mut *mut TtsAudio,
) -> TtsStatus {
    guarded(|| {
        required(out_audio, "out_audio")?;
        // SAFETY: checked non-NULL.
        unsafe { out_audio.write(std::ptr::null_mut()) };
        // SAFETY: the caller's arguments, as documented.
        let text = unsafe { utf8_arg(text, "text") }?;
        let options = unsafe { options_arg(option_keys, option_values, option_count) }?;
        let audio = synthesize_whole(engine, text, &options)?;
        let token = new_token();
        lock(&AUDIO).insert(token, audio);
        // SAFETY: checked non-NULL.
        unsafe { out_audio.write(std::ptr::without_provenance_mut(token)) };
        Ok(())
    })
}

/// `tts_synthesize` into the caller's `buffer` of `capacity` floats.
/// `*out_len` is the number of samples of the audio; when it is more than
/// `capacity`, nothing is written to `buffer` and the call returns
/// `TTS_STATUS_BUFFER_TOO_SMALL` (call again with a buffer that large: the
/// text is synthesized again). `buffer` may be NULL when `capacity` is 0,
/// to ask for the length. `out_sample_rate` may be NULL.
///
/// # Safety
/// As `tts_synthesize`; `buffer` is valid for `capacity` floats;
/// `out_len` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tts_synthesize_into(
    engine: *mut TtsEngine,
    text: *const c_char,
    option_keys: *const *const c_char,
    option_values: *const *const c_char,
    option_count: usize,
    buffer: *mut f32,
    capacity: usize,
    out_len: *mut usize,
    out_sample_rate: *mut u32,
) -> TtsStatus {
    guarded(|| {
        required(out_len, "out_len")?;
        if buffer.is_null() && capacity > 0 {
            return Err(Failure::invalid(format!("buffer is NULL but capacity is {capacity}")));
        }
        // SAFETY: the caller's arguments, as documented.
        let text = unsafe { utf8_arg(text, "text") }?;
        let options = unsafe { options_arg(option_keys, option_values, option_count) }?;
        let audio = synthesize_whole(engine, text, &options)?;
        let len = audio.samples.len();
        // SAFETY: `out_len` checked non-NULL; `out_sample_rate` NULL or writable.
        unsafe {
            out_len.write(len);
            put(out_sample_rate, audio.sample_rate);
        }
        if len > capacity {
            return Err(Failure(TtsStatus::BufferTooSmall, format!("the audio has {len} samples; the buffer holds {capacity}")));
        }
        // SAFETY: `buffer` holds `capacity` >= `len` floats; a fresh Vec cannot overlap it.
        unsafe { std::ptr::copy_nonoverlapping(audio.samples.as_ptr(), buffer, len) };
        Ok(())
    })
}

/// `tts_synthesize`, streamed: `callback` gets each piece of audio as the
/// model makes it, with `user_data`. A non-zero return from the callback, or
/// `tts_engine_cancel` from another thread, stops the synthesis: the call
/// returns `TTS_STATUS_CANCELLED`. The callback must not call synthesis
/// functions on the same engine (they fail with
/// `TTS_STATUS_INVALID_ARGUMENT`).
///
/// # Safety
/// As `tts_synthesize`; `callback` is safe to call with `user_data`.
#[no_mangle]
pub unsafe extern "C" fn tts_synthesize_stream(
    engine: *mut TtsEngine,
    text: *const c_char,
    option_keys: *const *const c_char,
    option_values: *const *const c_char,
    option_count: usize,
    callback: TtsAudioCallback,
    user_data: *mut c_void,
) -> TtsStatus {
    guarded(|| {
        let Some(callback) = callback else {
            return Err(Failure::invalid("callback is NULL"));
        };
        // SAFETY: the caller's arguments, as documented.
        let text = unsafe { utf8_arg(text, "text") }?;
        let options = unsafe { options_arg(option_keys, option_values, option_count) }?;
        run_synthesis(engine, text, &options, false, |samples, rate| {
            // SAFETY: the samples live for the call; the callback and its
            // data are the caller's, who promises they go together.
            unsafe { callback(samples.as_ptr(), samples.len(), rate, user_data) == 0 }
        })
    })
}

/// The samples of `audio` (`*out_len` floats at `*out_samples`, valid until
/// `tts_audio_free`) and their rate. Any out pointer may be NULL.
///
/// # Safety
/// Each out pointer is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tts_audio_data(audio: *const TtsAudio, out_samples: *mut *const f32, out_len: *mut usize, out_sample_rate: *mut u32) -> TtsStatus {
    guarded(|| {
        if audio.is_null() {
            return Err(Failure(TtsStatus::InvalidHandle, "the audio handle is NULL".into()));
        }
        let registry = lock(&AUDIO);
        let Some(found) = registry.get(&audio.addr()) else {
            return Err(Failure(TtsStatus::InvalidHandle, "the audio handle is not live audio (freed already, or not audio)".into()));
        };
        // SAFETY: the caller's out pointers, NULL or writable; the samples'
        // heap buffer stays put until tts_audio_free removes the entry.
        unsafe {
            put(out_samples, found.samples.as_ptr());
            put(out_len, found.samples.len());
            put(out_sample_rate, found.sample_rate);
        }
        Ok(())
    })
}

/// Frees `audio`. NULL is accepted and does nothing; a handle freed already
/// gives `TTS_STATUS_INVALID_HANDLE`.
#[no_mangle]
pub extern "C" fn tts_audio_free(audio: *mut TtsAudio) -> TtsStatus {
    guarded(|| {
        if audio.is_null() {
            return Ok(());
        }
        match lock(&AUDIO).remove(&audio.addr()) {
            Some(_) => Ok(()),
            None => Err(Failure(TtsStatus::InvalidHandle, "the audio handle is not live audio (freed already, or not audio)".into())),
        }
    })
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
