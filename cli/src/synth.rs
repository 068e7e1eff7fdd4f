//! The default command: text from a flag, a file or stdin; audio to a file or
//! streamed to stdout as the model produces it.

use clap::ValueEnum;
use engine_core::audio::{wav_header, RawFormat};
use engine_core::engine::{EngineError, ModelSession};
use std::io::{IsTerminal, Read, Seek, SeekFrom, Write};
use std::os::fd::AsFd;
use std::path::Path;

/// The most text read from a file or stdin (a whole book is ~1 MB).
const MAX_TEXT_BYTES: u64 = 16 << 20;

/// Audio encodings `--format` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// 16-bit PCM WAV (streamed to stdout with a header of unknown length)
    Wav,
    /// raw 16-bit signed little-endian samples, mono
    Pcm16,
    /// raw 32-bit float little-endian samples, mono
    F32,
    /// 16-bit FLAC (to stdout: written whole when synthesis ends)
    Flac,
}

/// The text to speak: `--text` (`-`: stdin), `--text-file` (`-`: stdin), or
/// stdin when neither is given and it is not a terminal.
pub fn read_text(text: Option<&str>, file: Option<&Path>) -> Result<String, String> {
    let stdin = || -> Result<String, String> { read_limited(std::io::stdin().lock(), "stdin") };
    match (text, file) {
        (Some(_), Some(_)) => Err("give the text once: --text or --text-file".into()),
        (Some("-"), None) => stdin(),
        (Some(t), None) => Ok(t.to_string()),
        (None, Some(p)) if p == Path::new("-") => stdin(),
        (None, Some(p)) => {
            let f = std::fs::File::open(p).map_err(|e| format!("--text-file {}: {e}", p.display()))?;
            read_limited(f, &format!("--text-file {}", p.display()))
        }
        (None, None) if std::io::stdin().is_terminal() => {
            Err("give the text: --text TEXT, --text-file FILE, or pipe it on stdin (`echo hi | tts --out hi.wav`)".into())
        }
        (None, None) => stdin(),
    }
}

fn read_limited(reader: impl Read, what: &str) -> Result<String, String> {
    let mut bytes = Vec::new();
    reader.take(MAX_TEXT_BYTES + 1).read_to_end(&mut bytes).map_err(|e| format!("reading {what}: {e}"))?;
    if bytes.len() as u64 > MAX_TEXT_BYTES {
        return Err(format!("{what} holds more than {} MiB of text", MAX_TEXT_BYTES >> 20));
    }
    String::from_utf8(bytes).map_err(|e| format!("{what} is not UTF-8 text (invalid byte at offset {})", e.utf8_error().valid_up_to()))
}

/// A spinner on stderr with the elapsed time and the audio produced so far,
/// only when stderr is a terminal (and not `-q`): logs and pipes stay clean.
pub struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    pub fn new(quiet: bool) -> Progress {
        if quiet || !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let bar = indicatif::ProgressBar::new_spinner();
        if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {elapsed} {msg}") {
            bar.set_style(style);
        }
        bar.set_message("synthesizing");
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        Progress(Some(bar))
    }

    fn audio(&self, seconds: f64) {
        if let Some(bar) = &self.0 {
            bar.set_message(format!("{seconds:.1} s of audio"));
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

/// What one synthesis wrote.
pub struct Written {
    pub seconds: f64,
    pub sample_rate: u32,
    /// stdout's reader went away before the end; the synthesis stopped there.
    pub reader_gone: bool,
}

/// Synthesizes `text` into `out` (`-`: stdout, streamed piece by piece; FLAC
/// whole at the end) as `format`. A file is written whole when synthesis ends
/// (never partially, never through a planted link: `engine_core::output`).
pub fn synthesize(session: &mut ModelSession, text: &str, out: &Path, format: Format, progress: &Progress) -> Result<Written, String> {
    let to_stdout = out == Path::new("-");
    if to_stdout && format != Format::Flac {
        return stream_to_stdout(session, text, format, progress);
    }
    // Written whole: one-shot synthesis (a model may stream at some cost in
    // quality, e.g. Chatterbox's speech-token hops).
    let output = session.synthesize(text).map_err(|e| e.0)?;
    let (samples, rate) = (output.samples.as_slice(), output.sample_rate);
    progress.audio(samples.len() as f64 / rate.max(1) as f64);
    let bytes = match format {
        Format::Wav => engine_core::audio::encode_wav(samples, rate)?,
        Format::Flac => engine_core::audio::encode_flac(samples, rate)?,
        Format::Pcm16 | Format::F32 => {
            let mut b = Vec::with_capacity(samples.len() * 4);
            raw(format).encode(samples, &mut b);
            b
        }
    };
    let mut reader_gone = false;
    if to_stdout {
        match std::io::stdout().lock().write_all(&bytes) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => reader_gone = true,
            other => other.map_err(|e| format!("writing to stdout: {e}"))?,
        }
    } else {
        engine_core::output::write_file(out, &bytes).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    Ok(Written { seconds: samples.len() as f64 / rate.max(1) as f64, sample_rate: rate, reader_gone })
}

impl Format {
    /// Bytes per sample of the audio data (WAV and FLAC hold 16-bit PCM).
    fn bytes_per_sample(self) -> f64 {
        if self == Format::F32 {
            4.0
        } else {
            2.0
        }
    }
}

fn raw(format: Format) -> RawFormat {
    match format {
        Format::F32 => RawFormat::F32,
        _ => RawFormat::Pcm16,
    }
}

/// Each piece to stdout as it arrives (the WAV header first). When stdout is
/// a regular file (`> a.wav`) the header is rewritten at the end with the
/// real sizes; a pipe keeps the streaming header. A reader that goes away
/// stops the synthesis quietly.
fn stream_to_stdout(session: &mut ModelSession, text: &str, format: Format, progress: &Progress) -> Result<Written, String> {
    let mut stdout = std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned().map_err(|e| format!("stdout: {e}"))?);
    let (mut data_bytes, mut reader_gone, mut started) = (0u64, false, false);
    let mut buffer = Vec::new();
    let summary = session
        .synthesize_streaming(text, |piece, rate| {
            buffer.clear();
            if !started && format == Format::Wav {
                buffer.extend_from_slice(&wav_header(rate, None));
            }
            started = true;
            let header = buffer.len();
            raw(format).encode(piece, &mut buffer);
            data_bytes += (buffer.len() - header) as u64;
            progress.audio(data_bytes as f64 / format.bytes_per_sample() / rate as f64);
            match stdout.write_all(&buffer) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                    reader_gone = true;
                    Ok(false)
                }
                Err(e) => Err(EngineError(format!("writing to stdout: {e}"))),
            }
        })
        .map_err(|e| e.0)?;
    if format == Format::Wav && !reader_gone {
        if !started {
            // No audio at all: still a valid, empty WAV.
            stdout.write_all(&wav_header(summary.sample_rate, Some(0))).map_err(|e| format!("writing to stdout: {e}"))?;
        } else if stdout.metadata().is_ok_and(|m| m.is_file()) {
            if let Ok(size) = u32::try_from(data_bytes) {
                let end = stdout.stream_position().map_err(|e| format!("stdout: {e}"))?;
                stdout.seek(SeekFrom::Start(end - data_bytes - 44)).map_err(|e| format!("stdout: {e}"))?;
                stdout.write_all(&wav_header(summary.sample_rate, Some(size))).map_err(|e| format!("writing to stdout: {e}"))?;
                stdout.seek(SeekFrom::Start(end)).map_err(|e| format!("stdout: {e}"))?;
            }
        }
    }
    Ok(Written { seconds: data_bytes as f64 / format.bytes_per_sample() / summary.sample_rate.max(1) as f64, sample_rate: summary.sample_rate, reader_gone })
}
