//! `tracing` output: stderr, filter from `TTS_LOG` (default `warn,ggml=off,symphonia=off`:
//! the audio decoders log what the reader then reports as one error line).
//!
//! Every plugin is its own shared library with its own copy of `tracing`'s
//! global dispatcher, so the host's subscriber never sees a plugin's events.
//! The host and each plugin therefore install the same subscriber in their own
//! copy: the host at start-up, plugins when they are opened or load a model.

use tracing_subscriber::EnvFilter;

/// Installs the stderr subscriber in the calling library's copy of `tracing`
/// (a no-op when one is already installed there).
pub fn init_from_env() {
    let filter = EnvFilter::try_from_env("TTS_LOG").unwrap_or_else(|_| EnvFilter::new("warn,ggml=off,symphonia=off"));
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(filter)
        .with_target(false)
        .try_init();
}
