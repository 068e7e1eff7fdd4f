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
        (None, Some(p)) => read_text_file(p),
        (None, None) if std::io::stdin().is_terminal() => {
            Err("give the text: --text TEXT, --text-file FILE, or pipe it on stdin (`echo hi | tts --out hi.wav`)".into())
        }
        (None, None) => stdin(),
    }
}

/// `--text-file`: a regular file, or a pipe (`<(cmd)`, a named pipe), read
/// with the text cap; a directory, device or socket is refused by kind.
fn read_text_file(p: &Path) -> Result<String, String> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let what = format!("--text-file {}", p.display());
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOCTTY).open(p).map_err(|e| format!("{what}: {e}"))?;
    let kind = f.metadata().map_err(|e| format!("{what}: {e}"))?.file_type();
    if !(kind.is_file() || kind.is_fifo()) {
        let name = if kind.is_dir() {
            "a directory"
        } else if kind.is_char_device() || kind.is_block_device() {
            "a device"
        } else {
            "a socket"
        };
        return Err(format!("{what} is {name}; text comes from a regular file or a pipe"));
    }
    read_limited(f, &what)
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
/// whole at the end) as `format`. A file is complete only when synthesis ends
/// (never partial, never written through a planted link: `engine_core::output`);
/// WAV and raw audio go into its temporary piece by piece, so memory does not
/// grow with the length of the text.
pub fn synthesize(session: &mut ModelSession, text: &str, out: &Path, format: Format, progress: &Progress) -> Result<Written, String> {
    let to_stdout = out == Path::new("-");
    if to_stdout && format != Format::Flac {
        return stream_to_stdout(session, text, format, progress);
    }
    if format != Format::Flac {
        return stream_to_file(session, text, out, format, progress);
    }
    // FLAC is encoded whole (flacenc takes the whole signal): it holds the
    // audio, 4 bytes a sample plus the encoded stream, until the end.
    let output = session.synthesize(text).map_err(|e| e.0)?;
    let (samples, rate) = (output.samples.as_slice(), output.sample_rate);
    progress.audio(samples.len() as f64 / rate.max(1) as f64);
    let bytes = engine_core::audio::encode_flac(samples, rate)?;
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

/// Options that make a model's streamed pieces join to exactly its one-shot
/// samples, where the model has them: Supertonic's first-chunk cut off
/// (`stream_first_chars = 0`), Chatterbox's pieces per text chunk rather than
/// per speech-token hop (`stream_tokens = 0`). A file gets the one-shot audio.
const ONE_SHOT_PIECES: &[(&str, &str)] = &[("stream_first_chars", "0"), ("stream_tokens", "0")];

/// WAV or raw audio into the output file as the model produces it (through
/// `engine_core::output::write_file_with`: a temporary renamed when complete,
/// or a FIFO or character device in place). A WAV's header is written first
/// with unknown sizes and rewritten with the real ones at the end where the
/// file can seek.
fn stream_to_file(session: &mut ModelSession, text: &str, out: &Path, format: Format, progress: &Progress) -> Result<Written, String> {
    let overrides: Vec<(String, String)> = ONE_SHOT_PIECES
        .iter()
        .filter(|(key, _)| session.option_specs().iter().any(|s| s.key.as_str() == *key))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (mut data_bytes, mut rate) = (0u64, 0u32);
    // A synthesis error is reported as it is, not as an error of the file.
    let mut failure: Option<String> = None;
    let written = engine_core::output::write_file_with(out, |file| {
        use engine_core::output::WriteError;
        let start = file.stream_position().ok();
        let (mut buffer, mut started) = (Vec::new(), false);
        let streamed = session.synthesize_streaming_with(text, &overrides, |piece, piece_rate| {
            buffer.clear();
            if !started && format == Format::Wav {
                buffer.extend_from_slice(&wav_header(piece_rate, None));
            }
            started = true;
            let header = buffer.len();
            raw(format).encode(piece, &mut buffer);
            data_bytes += (buffer.len() - header) as u64;
            progress.audio(data_bytes as f64 / format.bytes_per_sample() / piece_rate as f64);
            file.write_all(&buffer).map_err(|e| EngineError(format!("writing {}: {e}", out.display())))?;
            Ok(true)
        });
        let summary = match streamed {
            Ok(s) => s,
            Err(e) => {
                failure = Some(e.0);
                return Err(WriteError::Other(String::new()));
            }
        };
        for t in summary.timings.iter() {
            tracing::debug!(stage = %t.stage, ms = t.ms, "stage timing");
        }
        rate = summary.sample_rate;
        if format == Format::Wav {
            let Ok(size) = u32::try_from(data_bytes) else {
                return Err(WriteError::Other(format!(
                    "{:.0} s of audio is more than a WAV file holds (4 GiB of samples); use --format flac, pcm16 or f32",
                    data_bytes as f64 / 2.0 / rate.max(1) as f64
                )));
            };
            if !started {
                // No audio at all: still a valid, empty WAV.
                file.write_all(&wav_header(rate, Some(0)))?;
            } else if let Some(start) = start.filter(|_| file.metadata().is_ok_and(|m| m.is_file())) {
                let end = file.stream_position()?;
                file.seek(SeekFrom::Start(start))?;
                file.write_all(&wav_header(rate, Some(size)))?;
                file.seek(SeekFrom::Start(end))?;
            }
        }
        Ok(())
    });
    match (written, failure) {
        (Err(_), Some(e)) => return Err(e),
        (Err(e), None) => return Err(format!("{}: {e}", out.display())),
        (Ok(()), _) => {}
    }
    Ok(Written { seconds: data_bytes as f64 / format.bytes_per_sample() / rate.max(1) as f64, sample_rate: rate, reader_gone: false })
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
