/* libtts: the C API of the tts engine (docs/c-api.md).
 * Generated from capi/src/lib.rs by cbindgen; do not edit. */

#ifndef TTS_H
#define TTS_H

#include <stddef.h>
#include <stdint.h>

/**
 * What a call did. Every call that can fail returns one; on failure,
 * `tts_last_error` says what is wrong in one line.
 */
typedef enum TtsStatus {
  /**
   * It worked.
   */
  TTS_STATUS_OK = 0,
  /**
   * A required pointer was NULL, a string was not UTF-8, or an argument
   * was out of range.
   */
  TTS_STATUS_INVALID_ARGUMENT = 1,
  /**
   * The handle is NULL, already freed, or not a handle of this kind.
   */
  TTS_STATUS_INVALID_HANDLE = 2,
  /**
   * The engine could not be opened: the profile, the plugins, the device
   * or the model.
   */
  TTS_STATUS_OPEN_FAILED = 3,
  /**
   * The synthesis failed: an empty text, an unknown option or a bad
   * value, or the model's own error.
   */
  TTS_STATUS_SYNTHESIS_FAILED = 4,
  /**
   * The synthesis was stopped by `tts_engine_cancel`, by the callback's
   * non-zero return, or by `tts_engine_free` from another thread.
   */
  TTS_STATUS_CANCELLED = 5,
  /**
   * The caller's buffer is too small; the needed length was written.
   */
  TTS_STATUS_BUFFER_TOO_SMALL = 6,
  /**
   * An internal error (a bug): the engine that reported it should be freed.
   */
  TTS_STATUS_INTERNAL = 7,
} TtsStatus;

/**
 * Audio made by `tts_synthesize`: mono float samples in [-1, 1] and their
 * rate. Opaque; read with `tts_audio_data`, freed by `tts_audio_free`.
 */
typedef struct TtsAudio TtsAudio;

/**
 * An engine: a profile's model loaded on the device the profile selects.
 * Opaque; made by `tts_engine_open` or `tts_engine_open_text`, freed by
 * `tts_engine_free`.
 */
typedef struct TtsEngine TtsEngine;

/**
 * Receives each piece of streamed audio: `len` mono samples in [-1, 1] at
 * `sample_rate` Hz, valid only during the call, and the caller's
 * `user_data`. Returns 0 to go on, non-zero to cancel the synthesis
 * (`tts_synthesize_stream` then returns `TTS_STATUS_CANCELLED`). Called on
 * the thread that called `tts_synthesize_stream`; it must not unwind (no
 * C++ exception may leave it).
 */
typedef int32_t (*TtsAudioCallback)(const float *samples,
                                    size_t len,
                                    uint32_t sample_rate,
                                    void *user_data);

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * Opens an engine from the profile file at `profile_path` (TOML; see
 * docs/profiles.md): selects the device, loads the profile's model and
 * checks its `[synthesis]` options. Plugins load from `plugin_dir`; when it
 * is NULL, from the directories in `TTS_PLUGIN_PATH`; when that is unset,
 * from `plugins/` beside the directory holding libtts.so (the bundle's
 * `lib/libtts.so` and `plugins/`). A profile's `[plugins] dirs` is refused:
 * a profile is data, not trusted to name code.
 *
 * On success `*out_engine` is the new engine; on failure it is NULL.
 *
 * # Safety
 * `profile_path` and `plugin_dir` are NULL or NUL-terminated strings;
 * `out_engine` is NULL or valid for a write.
 */
enum TtsStatus tts_engine_open(const char *profile_path,
                               const char *plugin_dir,
                               struct TtsEngine **out_engine);

/**
 * `tts_engine_open` with the profile given as TOML text rather than a file.
 * Relative paths in it resolve against the working directory.
 *
 * # Safety
 * As `tts_engine_open`; `profile_toml` is NULL or a NUL-terminated string.
 */
enum TtsStatus tts_engine_open_text(const char *profile_toml,
                                    const char *plugin_dir,
                                    struct TtsEngine **out_engine);

/**
 * Frees `engine`. A synthesis running on it in another thread is
 * cancelled, and the engine's memory goes when that call returns. NULL is
 * accepted and does nothing; a handle freed already gives
 * `TTS_STATUS_INVALID_HANDLE`. The strings the engine handed out are
 * invalid afterwards.
 */
enum TtsStatus tts_engine_free(struct TtsEngine *engine);

/**
 * Cancels the synthesis running on `engine` now, if any (from any thread):
 * it stops at the model's next piece or progress report and returns
 * `TTS_STATUS_CANCELLED`. A synthesis started later is not affected.
 */
enum TtsStatus tts_engine_cancel(struct TtsEngine *engine);

/**
 * The loaded model: its family (`*out_family`, such as "supertonic"), its
 * variant (`*out_variant`) and its sample rate in Hz. Each out pointer may
 * be NULL. The strings live as long as the engine.
 *
 * # Safety
 * Each out pointer is NULL or valid for a write.
 */
enum TtsStatus tts_engine_model(const struct TtsEngine *engine,
                                const char **out_family,
                                const char **out_variant,
                                uint32_t *out_sample_rate);

/**
 * The model's built-in voices, by the names the `voice` option takes, the
 * default first: `*out_count` strings at `*out_names`, living as long as
 * the engine. A model that clones voices also takes a voice file's path.
 *
 * # Safety
 * `out_names` and `out_count` are valid for a write.
 */
enum TtsStatus tts_engine_voices(const struct TtsEngine *engine,
                                 const char *const **out_names,
                                 size_t *out_count);

/**
 * The language codes the `language` option takes, the default first (none
 * when the model has no such option); as `tts_engine_voices`.
 *
 * # Safety
 * `out_names` and `out_count` are valid for a write.
 */
enum TtsStatus tts_engine_languages(const struct TtsEngine *engine,
                                    const char *const **out_names,
                                    size_t *out_count);

/**
 * The keys of the options a synthesis takes (`voice`, `speed`, ...; `tts
 * options` describes them); as `tts_engine_voices`.
 *
 * # Safety
 * `out_names` and `out_count` are valid for a write.
 */
enum TtsStatus tts_engine_options(const struct TtsEngine *engine,
                                  const char *const **out_names,
                                  size_t *out_count);

/**
 * Synthesizes `text` (UTF-8) with `option_count` options (`option_keys[i]`
 * set to `option_values[i]`, as `tts --set key=value`, for this text only)
 * into audio the engine owns: `*out_audio`, read with `tts_audio_data` and
 * freed with `tts_audio_free`. On failure `*out_audio` is NULL. Calls on
 * one engine run one at a time.
 *
 * # Safety
 * `text` is NULL or NUL-terminated; with `option_count` > 0 both option
 * arrays hold that many NUL-terminated strings; `out_audio` is NULL or
 * valid for a write.
 */
enum TtsStatus tts_synthesize(struct TtsEngine *engine,
                              const char *text,
                              const char *const *option_keys,
                              const char *const *option_values,
                              size_t option_count,
                              struct TtsAudio **out_audio);

/**
 * `tts_synthesize` into the caller's `buffer` of `capacity` floats.
 * `*out_len` is the number of samples of the audio; when it is more than
 * `capacity`, nothing is written to `buffer` and the call returns
 * `TTS_STATUS_BUFFER_TOO_SMALL` (call again with a buffer that large: the
 * text is synthesized again). `buffer` may be NULL when `capacity` is 0,
 * to ask for the length. `out_sample_rate` may be NULL.
 *
 * # Safety
 * As `tts_synthesize`; `buffer` is valid for `capacity` floats;
 * `out_len` is NULL or valid for a write.
 */
enum TtsStatus tts_synthesize_into(struct TtsEngine *engine,
                                   const char *text,
                                   const char *const *option_keys,
                                   const char *const *option_values,
                                   size_t option_count,
                                   float *buffer,
                                   size_t capacity,
                                   size_t *out_len,
                                   uint32_t *out_sample_rate);

/**
 * `tts_synthesize`, streamed: `callback` gets each piece of audio as the
 * model makes it, with `user_data`. A non-zero return from the callback, or
 * `tts_engine_cancel` from another thread, stops the synthesis: the call
 * returns `TTS_STATUS_CANCELLED`. The callback must not call synthesis
 * functions on the same engine (they fail with
 * `TTS_STATUS_INVALID_ARGUMENT`).
 *
 * # Safety
 * As `tts_synthesize`; `callback` is safe to call with `user_data`.
 */
enum TtsStatus tts_synthesize_stream(struct TtsEngine *engine,
                                     const char *text,
                                     const char *const *option_keys,
                                     const char *const *option_values,
                                     size_t option_count,
                                     TtsAudioCallback callback,
                                     void *user_data);

/**
 * The samples of `audio` (`*out_len` floats at `*out_samples`, valid until
 * `tts_audio_free`) and their rate. Any out pointer may be NULL.
 *
 * # Safety
 * Each out pointer is NULL or valid for a write.
 */
enum TtsStatus tts_audio_data(const struct TtsAudio *audio,
                              const float **out_samples,
                              size_t *out_len,
                              uint32_t *out_sample_rate);

/**
 * Frees `audio`. NULL is accepted and does nothing; a handle freed already
 * gives `TTS_STATUS_INVALID_HANDLE`.
 */
enum TtsStatus tts_audio_free(struct TtsAudio *audio);

/**
 * The one-line message of the calling thread's last failed call, or ""
 * when its last call succeeded. Never NULL; valid until the thread's next
 * call into libtts.
 */
const char *tts_last_error(void);

/**
 * The library's version ("0.1.0"), a static string.
 */
const char *tts_version(void);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* TTS_H */
