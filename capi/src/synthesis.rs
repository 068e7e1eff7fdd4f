//! Synthesis: into audio the engine owns (read and freed through its own
//! handle), into the caller's buffer, or streamed through a callback; all
//! three run one synthesis loop that honours `tts_engine_cancel` and refuses
//! a callback's call back into its own engine.

use crate::args::{options_arg, put, required, utf8_arg};
use crate::registry::{engine_slot, lock, new_token, Audio, TtsAudio, TtsEngine, AUDIO, ENGINES};
use crate::status::{guarded, Failure, Outcome, TtsStatus};
use std::cell::RefCell;
use std::ffi::{c_char, c_void};
use std::sync::atomic::Ordering;

/// Receives each piece of streamed audio: `len` mono samples in [-1, 1] at
/// `sample_rate` Hz, valid only during the call, and the caller's
/// `user_data`. Returns 0 to go on, non-zero to cancel the synthesis
/// (`tts_synthesize_stream` then returns `TTS_STATUS_CANCELLED`). Called on
/// the thread that called `tts_synthesize_stream`; it must not unwind (no
/// C++ exception may leave it).
pub type TtsAudioCallback = Option<unsafe extern "C" fn(samples: *const f32, len: usize, sample_rate: u32, user_data: *mut c_void) -> i32>;

thread_local! {
    /// Tokens of the engines this thread is synthesizing on (a callback
    /// calling back into its own engine must fail, not deadlock).
    static BUSY: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
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
