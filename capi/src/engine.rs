//! The engine's entry points: opening one from a profile (a file or TOML
//! text), freeing and cancelling it, and describing its model: family,
//! variant, sample rate, voices, languages and option keys.

use crate::args::{path_arg, put, required, utf8_arg};
use crate::registry::{engine_slot, hand_out, lock, EngineSlot, StringList, TtsEngine, ENGINES};
use crate::status::{guarded, Failure, Outcome, TtsStatus};
use engine_core::engine::{self, Engine, EngineError};
use engine_core::profile::Profile;
use std::ffi::{c_char, c_void, CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

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
