// stream: streams a synthesis from libtts in C++, then shows both ways to
// stop one: the callback's non-zero return, and tts_engine_cancel from
// another thread.
//
//   stream PROFILE TEXT OUT.f32 [PLUGIN_DIR]
//
// OUT.f32 receives the streamed pieces as raw 32-bit floats, in order.
//
// Build (from a bundle: include/, lib/):
//   c++ -std=c++17 stream.cpp -Iinclude -Llib -ltts -Wl,-rpath,'$ORIGIN/lib' -pthread -o stream
#include <cstdio>
#include <fstream>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tts.h"

namespace {

// The engine freed when it goes out of scope.
struct EngineFree {
    void operator()(TtsEngine *e) const { tts_engine_free(e); }
};
using Engine = std::unique_ptr<TtsEngine, EngineFree>;

// A failed call as an exception, with libtts's message.
void check(TtsStatus status, const std::string &what) {
    if (status != TTS_STATUS_OK) {
        throw std::runtime_error(what + ": " + tts_last_error());
    }
}

// Collects the pieces. The callback is C: no exception may leave it.
struct Collector {
    std::vector<float> samples;
    std::vector<size_t> pieces;
    uint32_t rate = 0;
    // Non-zero: stop after this many pieces.
    size_t stop_after = 0;
    // Set: wait on it in the first piece (another thread cancels meanwhile).
    std::promise<void> *in_first_piece = nullptr;
    std::shared_future<void> cancelled;

    static int32_t receive(const float *samples, size_t len, uint32_t rate, void *user_data) noexcept {
        auto *self = static_cast<Collector *>(user_data);
        try {
            self->samples.insert(self->samples.end(), samples, samples + len);
            self->pieces.push_back(len);
            self->rate = rate;
            if (self->in_first_piece != nullptr) {
                self->in_first_piece->set_value();
                self->in_first_piece = nullptr;
                self->cancelled.wait();
            }
            return self->stop_after != 0 && self->pieces.size() >= self->stop_after ? 1 : 0;
        } catch (...) {
            return 1;  // out of memory: stop
        }
    }
};

}  // namespace

int main(int argc, char **argv) {
    if (argc < 4 || argc > 5) {
        std::fprintf(stderr, "usage: stream PROFILE TEXT OUT.f32 [PLUGIN_DIR]\n");
        return 2;
    }
    const char *text = argv[2];
    try {
        TtsEngine *opened = nullptr;
        check(tts_engine_open(argv[1], argc == 5 ? argv[4] : nullptr, &opened), "opening the engine");
        Engine engine(opened);

        // The whole text, streamed.
        Collector all;
        check(tts_synthesize_stream(engine.get(), text, nullptr, nullptr, 0, &Collector::receive, &all), "streaming");
        std::ofstream out(argv[3], std::ios::binary);
        out.write(reinterpret_cast<const char *>(all.samples.data()), static_cast<std::streamsize>(all.samples.size() * sizeof(float)));
        out.close();
        if (!out) {
            throw std::runtime_error(std::string("cannot write ") + argv[3]);
        }
        std::printf("streamed %zu pieces, %zu samples at %u Hz to %s\n", all.pieces.size(), all.samples.size(), (unsigned)all.rate, argv[3]);

        // Stopped by the callback after its first piece.
        Collector first;
        first.stop_after = 1;
        TtsStatus status = tts_synthesize_stream(engine.get(), text, nullptr, nullptr, 0, &Collector::receive, &first);
        std::printf("callback stop: status %d after %zu piece(s): %s\n", (int)status, first.pieces.size(), tts_last_error());
        if (status != TTS_STATUS_CANCELLED || first.pieces.size() != 1) {
            return 1;
        }

        // Cancelled from this thread while another synthesizes.
        Collector waiting;
        std::promise<void> in_first_piece, cancel_sent;
        waiting.in_first_piece = &in_first_piece;
        waiting.cancelled = cancel_sent.get_future().share();
        auto started = in_first_piece.get_future();
        TtsEngine *shared = engine.get();
        auto synthesis = std::async(std::launch::async, [&] {
            TtsStatus s = tts_synthesize_stream(shared, text, nullptr, nullptr, 0, &Collector::receive, &waiting);
            // The message belongs to the thread that made the call.
            return std::make_pair(s, std::string(tts_last_error()));
        });
        started.wait();
        check(tts_engine_cancel(engine.get()), "cancelling");
        cancel_sent.set_value();
        auto [cancel_status, message] = synthesis.get();
        std::printf("cancel from another thread: status %d: %s\n", (int)cancel_status, message.c_str());
        if (cancel_status != TTS_STATUS_CANCELLED) {
            return 1;
        }
    } catch (const std::exception &e) {
        std::fprintf(stderr, "stream: %s\n", e.what());
        return 1;
    }
    return 0;
}
