/* The C API's error paths, from C: every bad input gives its status and a
 * one-line message, never a crash. Run by tests/examples.rs, also under
 * valgrind (bad reads, bad frees, leaks on these paths fail it).
 *
 *   errors PROFILE PLUGIN_DIR
 *
 * Prints one line per check ("ok ..." or "FAILED ..."); exits 1 when any failed.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tts.h"

static int failures = 0;

/* Checks that `status` is `want` and that the message holds `part`. */
static void expect(const char *what, TtsStatus status, TtsStatus want, const char *part) {
    const char *message = tts_last_error();
    int ok = status == want && message != NULL && strstr(message, part) != NULL && strchr(message, '\n') == NULL;
    if (want != TTS_STATUS_OK && message[0] == '\0') {
        ok = 0;
    }
    printf("%s %s: status %d (want %d): %s\n", ok ? "ok" : "FAILED", what, (int)status, (int)want, message);
    failures += !ok;
}

static int32_t stop_at_once(const float *samples, size_t len, uint32_t rate, void *user_data) {
    (void)samples, (void)len, (void)rate;
    ++*(int *)user_data;
    return 1;
}

/* Calls back into its own engine from the callback: refused, not a deadlock. */
static int32_t reenter(const float *samples, size_t len, uint32_t rate, void *user_data) {
    (void)samples, (void)len, (void)rate;
    TtsAudio *audio = NULL;
    TtsStatus status = tts_synthesize((TtsEngine *)user_data, "Again.", NULL, NULL, 0, &audio);
    expect("synthesizing from the engine's own callback", status, TTS_STATUS_INVALID_ARGUMENT, "called from its own audio callback");
    return 0;
}

/* A synthesis on another thread whose engine this thread frees meanwhile:
 * its first piece waits until the free is done, then the synthesis stops. */
struct FreedMidway {
    TtsEngine *engine;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int in_piece, freed, pieces;
    TtsStatus status;
    char message[512];
};

static int32_t wait_for_the_free(const float *samples, size_t len, uint32_t rate, void *user_data) {
    (void)samples, (void)len, (void)rate;
    struct FreedMidway *f = user_data;
    pthread_mutex_lock(&f->lock);
    f->pieces++;
    f->in_piece = 1;
    pthread_cond_broadcast(&f->changed);
    while (!f->freed) {
        pthread_cond_wait(&f->changed, &f->lock);
    }
    pthread_mutex_unlock(&f->lock);
    return 0;
}

static void *stream_until_freed(void *arg) {
    struct FreedMidway *f = arg;
    f->status = tts_synthesize_stream(f->engine, "Hello. And a second sentence.", NULL, NULL, 0, wait_for_the_free, f);
    snprintf(f->message, sizeof f->message, "%s", tts_last_error());
    return NULL;
}

static void free_during_a_synthesis(const char *profile, const char *plugins) {
    struct FreedMidway f = {.engine = NULL, .in_piece = 0, .freed = 0, .pieces = 0};
    pthread_mutex_init(&f.lock, NULL);
    pthread_cond_init(&f.changed, NULL);
    expect("opening an engine to free midway", tts_engine_open(profile, plugins, &f.engine), TTS_STATUS_OK, "");
    pthread_t thread;
    pthread_create(&thread, NULL, stream_until_freed, &f);
    pthread_mutex_lock(&f.lock);
    while (!f.in_piece) {
        pthread_cond_wait(&f.changed, &f.lock);
    }
    pthread_mutex_unlock(&f.lock);
    expect("freeing an engine while another thread synthesizes", tts_engine_free(f.engine), TTS_STATUS_OK, "");
    pthread_mutex_lock(&f.lock);
    f.freed = 1;
    pthread_cond_broadcast(&f.changed);
    pthread_mutex_unlock(&f.lock);
    pthread_join(thread, NULL);
    printf("%s the synthesis on the freed engine: status %d after %d piece(s): %s\n",
           f.status == TTS_STATUS_CANCELLED && f.pieces == 1 && strstr(f.message, "tts_engine_free") ? "ok" : "FAILED", (int)f.status, f.pieces,
           f.message);
    failures += !(f.status == TTS_STATUS_CANCELLED && f.pieces == 1 && strstr(f.message, "tts_engine_free"));
    expect("the freed engine is gone", tts_engine_cancel(f.engine), TTS_STATUS_INVALID_HANDLE, "freed already");
    pthread_cond_destroy(&f.changed);
    pthread_mutex_destroy(&f.lock);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: errors PROFILE PLUGIN_DIR\n");
        return 2;
    }
    const char *profile = argv[1], *plugins = argv[2];
    TtsEngine *engine = (TtsEngine *)&failures; /* must be set to NULL on failure */

    /* Opening. */
    expect("no profile path", tts_engine_open(NULL, plugins, &engine), TTS_STATUS_INVALID_ARGUMENT, "profile_path is NULL");
    expect("the out pointer cleared", engine == NULL ? TTS_STATUS_OK : TTS_STATUS_INTERNAL, TTS_STATUS_OK, "");
    expect("no out pointer", tts_engine_open(profile, plugins, NULL), TTS_STATUS_INVALID_ARGUMENT, "out_engine is NULL");
    expect("an empty plugin dir", tts_engine_open(profile, "", &engine), TTS_STATUS_INVALID_ARGUMENT, "plugin_dir is empty");
    expect("a missing profile", tts_engine_open("/nonexistent/profile.toml", plugins, &engine), TTS_STATUS_OPEN_FAILED, "cannot read profile");
    expect("a profile that fails to parse", tts_engine_open_text("[backend]\nprefer = 3\n", plugins, &engine), TTS_STATUS_OPEN_FAILED,
           "<profile text>:2");
    expect("a profile naming plugin code", tts_engine_open_text("[plugins]\ndirs = [\"/tmp\"]\n[backend]\nprefer = [\"cpu\"]\n", plugins, &engine),
           TTS_STATUS_OPEN_FAILED, "not trusted to name code");
    expect("a profile without a model", tts_engine_open_text("[backend]\nprefer = [\"cpu\"]\n", plugins, &engine), TTS_STATUS_OPEN_FAILED,
           "[model] files is empty");
    expect("a profile whose model is missing",
           tts_engine_open_text("[backend]\nprefer = [\"cpu\"]\n[model]\nfiles = [\"/nonexistent/model.gguf\"]\n", plugins, &engine),
           TTS_STATUS_OPEN_FAILED, "/nonexistent/model.gguf");
    expect("profile text not UTF-8", tts_engine_open_text("\xff\xfe", plugins, &engine), TTS_STATUS_INVALID_ARGUMENT, "not UTF-8");
    expect("a plugin dir without plugins", tts_engine_open(profile, "/nonexistent", &engine), TTS_STATUS_OPEN_FAILED, "no plugin file");

    expect("opening the engine", tts_engine_open(profile, plugins, &engine), TTS_STATUS_OK, "");
    if (engine == NULL) {
        printf("FAILED: no engine; the rest cannot run\n");
        return 1;
    }

    /* Synthesis. */
    TtsAudio *audio = (TtsAudio *)&failures;
    const char *keys[] = {"no_such_option"}, *values[] = {"1"};
    expect("an empty text", tts_synthesize(engine, " \n", NULL, NULL, 0, &audio), TTS_STATUS_SYNTHESIS_FAILED, "text is empty");
    expect("the audio out pointer cleared", audio == NULL ? TTS_STATUS_OK : TTS_STATUS_INTERNAL, TTS_STATUS_OK, "");
    expect("no text", tts_synthesize(engine, NULL, NULL, NULL, 0, &audio), TTS_STATUS_INVALID_ARGUMENT, "text is NULL");
    expect("a text not UTF-8", tts_synthesize(engine, "Hello \xc3(", NULL, NULL, 0, &audio), TTS_STATUS_INVALID_ARGUMENT,
           "text is not UTF-8 text (invalid byte at offset 6)");
    expect("an unknown option", tts_synthesize(engine, "Hello.", keys, values, 1, &audio), TTS_STATUS_SYNTHESIS_FAILED, "no_such_option");
    const char *speed[] = {"speed"}, *fast[] = {"fast"};
    expect("a bad option value", tts_synthesize(engine, "Hello.", speed, fast, 1, &audio), TTS_STATUS_SYNTHESIS_FAILED, "speed");
    expect("options counted but not given", tts_synthesize(engine, "Hello.", NULL, NULL, 1, &audio), TTS_STATUS_INVALID_ARGUMENT,
           "option_count is 1 but option_keys or option_values is NULL");
    const char *null_value[] = {NULL};
    expect("an option without a value", tts_synthesize(engine, "Hello.", speed, null_value, 1, &audio), TTS_STATUS_INVALID_ARGUMENT,
           "the value of option speed is NULL");
    expect("no audio out pointer", tts_synthesize(engine, "Hello.", NULL, NULL, 0, NULL), TTS_STATUS_INVALID_ARGUMENT, "out_audio is NULL");

    float buffer[4] = {7.0f, 7.0f, 7.0f, 7.0f};
    size_t needed = 0;
    expect("a buffer too small", tts_synthesize_into(engine, "Hello.", NULL, NULL, 0, buffer, 4, &needed, NULL), TTS_STATUS_BUFFER_TOO_SMALL,
           "the buffer holds 4");
    expect("the needed length given", needed > 4 ? TTS_STATUS_OK : TTS_STATUS_INTERNAL, TTS_STATUS_OK, "");
    expect("nothing written to a small buffer", buffer[0] == 7.0f && buffer[3] == 7.0f ? TTS_STATUS_OK : TTS_STATUS_INTERNAL, TTS_STATUS_OK, "");
    expect("a NULL buffer with a capacity", tts_synthesize_into(engine, "Hello.", NULL, NULL, 0, NULL, 5, &needed, NULL), TTS_STATUS_INVALID_ARGUMENT,
           "buffer is NULL but capacity is 5");
    expect("no length out pointer", tts_synthesize_into(engine, "Hello.", NULL, NULL, 0, buffer, 4, NULL, NULL), TTS_STATUS_INVALID_ARGUMENT,
           "out_len is NULL");

    /* Streaming. */
    int pieces = 0;
    expect("no callback", tts_synthesize_stream(engine, "Hello.", NULL, NULL, 0, NULL, NULL), TTS_STATUS_INVALID_ARGUMENT, "callback is NULL");
    expect("a stream the callback stops", tts_synthesize_stream(engine, "Hello.", NULL, NULL, 0, stop_at_once, &pieces), TTS_STATUS_CANCELLED,
           "cancelled by the audio callback");
    expect("no piece after the stop", pieces == 1 ? TTS_STATUS_OK : TTS_STATUS_INTERNAL, TTS_STATUS_OK, "");
    expect("a stream whose callback re-enters", tts_synthesize_stream(engine, "Hello.", NULL, NULL, 0, reenter, engine), TTS_STATUS_OK, "");
    expect("a cancel before a synthesis", tts_engine_cancel(engine), TTS_STATUS_OK, "");
    expect("a synthesis after that cancel", tts_synthesize(engine, "Hello.", NULL, NULL, 0, &audio), TTS_STATUS_OK, "");
    expect("no error after a success", tts_last_error()[0] == '\0' ? TTS_STATUS_OK : TTS_STATUS_INTERNAL, TTS_STATUS_OK, "");

    /* Handles: NULL, the other kind, forged, freed. */
    const char *const *names;
    size_t count;
    expect("a NULL engine", tts_engine_voices(NULL, &names, &count), TTS_STATUS_INVALID_HANDLE, "the engine handle is NULL");
    expect("audio as an engine", tts_engine_voices((TtsEngine *)audio, &names, &count), TTS_STATUS_INVALID_HANDLE, "not a live engine");
    expect("an engine as audio", tts_audio_data((TtsAudio *)engine, NULL, NULL, NULL), TTS_STATUS_INVALID_HANDLE, "not live audio");
    expect("a forged engine", tts_engine_cancel((TtsEngine *)(uintptr_t)0xdeadbeef0), TTS_STATUS_INVALID_HANDLE, "not a live engine");
    expect("no voice out pointer", tts_engine_voices(engine, NULL, &count), TTS_STATUS_INVALID_ARGUMENT, "out_names is NULL");
    expect("freeing audio", tts_audio_free(audio), TTS_STATUS_OK, "");
    expect("freeing audio twice", tts_audio_free(audio), TTS_STATUS_INVALID_HANDLE, "freed already");
    expect("reading freed audio", tts_audio_data(audio, NULL, NULL, NULL), TTS_STATUS_INVALID_HANDLE, "freed already");
    expect("freeing the engine", tts_engine_free(engine), TTS_STATUS_OK, "");
    expect("freeing the engine twice", tts_engine_free(engine), TTS_STATUS_INVALID_HANDLE, "freed already");
    expect("synthesizing on a freed engine", tts_synthesize(engine, "Hello.", NULL, NULL, 0, &audio), TTS_STATUS_INVALID_HANDLE, "freed already");
    expect("streaming on a freed engine", tts_synthesize_stream(engine, "Hello.", NULL, NULL, 0, stop_at_once, &pieces), TTS_STATUS_INVALID_HANDLE,
           "freed already");
    expect("cancelling a freed engine", tts_engine_cancel(engine), TTS_STATUS_INVALID_HANDLE, "freed already");
    expect("the model of a freed engine", tts_engine_model(engine, NULL, NULL, NULL), TTS_STATUS_INVALID_HANDLE, "freed already");
    expect("freeing NULL engine", tts_engine_free(NULL), TTS_STATUS_OK, "");
    expect("freeing NULL audio", tts_audio_free(NULL), TTS_STATUS_OK, "");

    free_during_a_synthesis(profile, plugins);

    printf("%d failed\n", failures);
    return failures == 0 ? 0 : 1;
}
