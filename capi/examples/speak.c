/* speak: synthesizes a text with libtts and writes the samples to a file.
 *
 *   speak PROFILE TEXT OUT.f32 [PLUGIN_DIR]
 *
 * OUT.f32 receives raw 32-bit float samples (the machine's byte order, mono;
 * `tts --format f32` writes the same). It shows the two ways to get a whole
 * synthesis: audio the engine owns (tts_synthesize, freed with
 * tts_audio_free) and the caller's own buffer (tts_synthesize_into, asked
 * for its length first); both give the same samples.
 *
 * Build (from a bundle: include/, lib/):
 *   cc -std=c11 speak.c -Iinclude -Llib -ltts -Wl,-rpath,'$ORIGIN/lib' -o speak
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tts.h"

static int fail(const char *what) {
    fprintf(stderr, "speak: %s: %s\n", what, tts_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 5) {
        fprintf(stderr, "usage: speak PROFILE TEXT OUT.f32 [PLUGIN_DIR]\n");
        return 2;
    }
    const char *profile = argv[1], *text = argv[2], *out_path = argv[3];
    const char *plugin_dir = argc == 5 ? argv[4] : NULL; /* NULL: TTS_PLUGIN_PATH, else beside libtts */

    TtsEngine *engine = NULL;
    if (tts_engine_open(profile, plugin_dir, &engine) != TTS_STATUS_OK) {
        return fail("opening the engine");
    }

    const char *family, *variant;
    uint32_t rate;
    const char *const *voices;
    size_t voice_count;
    if (tts_engine_model(engine, &family, &variant, &rate) != TTS_STATUS_OK ||
        tts_engine_voices(engine, &voices, &voice_count) != TTS_STATUS_OK) {
        int code = fail("describing the model");
        tts_engine_free(engine);
        return code;
    }
    printf("model: %s %s at %u Hz\n", family, variant, (unsigned)rate);
    printf("voices:");
    for (size_t i = 0; i < voice_count; i++) {
        printf(" %s", voices[i]);
    }
    printf("\n");

    /* Audio the engine owns. */
    TtsAudio *audio = NULL;
    if (tts_synthesize(engine, text, NULL, NULL, 0, &audio) != TTS_STATUS_OK) {
        int code = fail("synthesizing");
        tts_engine_free(engine);
        return code;
    }
    const float *samples;
    size_t len;
    tts_audio_data(audio, &samples, &len, &rate);

    /* The caller's buffer: ask for the length, then fill it. */
    size_t needed = 0;
    TtsStatus status = tts_synthesize_into(engine, text, NULL, NULL, 0, NULL, 0, &needed, NULL);
    if (status != TTS_STATUS_BUFFER_TOO_SMALL) {
        int code = fail("asking for the length");
        tts_audio_free(audio);
        tts_engine_free(engine);
        return code;
    }
    float *buffer = malloc(needed * sizeof(float));
    size_t written = 0;
    if (buffer == NULL || tts_synthesize_into(engine, text, NULL, NULL, 0, buffer, needed, &written, NULL) != TTS_STATUS_OK) {
        int code = buffer == NULL ? (fprintf(stderr, "speak: out of memory\n"), 1) : fail("synthesizing into a buffer");
        free(buffer);
        tts_audio_free(audio);
        tts_engine_free(engine);
        return code;
    }
    int same = written == len && memcmp(buffer, samples, len * sizeof(float)) == 0;
    free(buffer);

    FILE *out = fopen(out_path, "wb");
    int ok = out != NULL && fwrite(samples, sizeof(float), len, out) == len;
    ok = (out != NULL && fclose(out) == 0) && ok;
    if (ok) {
        printf("wrote %zu samples at %u Hz to %s (%s)\n", len, (unsigned)rate, out_path,
               same ? "the caller's buffer holds the same" : "the caller's buffer DIFFERS");
    } else {
        fprintf(stderr, "speak: cannot write %s\n", out_path);
    }
    tts_audio_free(audio);
    tts_engine_free(engine);
    return ok && same ? 0 : 1;
}
