//! The default command: text from a flag, a file or stdin; audio to a file or
//! streamed to stdout as the model produces it.

use clap::ValueEnum;
use engine_core::abi::TokenTrace;
use engine_core::audio::encode::{AudioFormat, Destination, StreamEncoder};
use engine_core::engine::{EngineError, ModelSession};
use std::io::{IsTerminal, Read, Seek, SeekFrom, Write};
use std::os::fd::AsFd;
use std::path::Path;

/// The most text read from a file or stdin: the cap every text input shares.
const MAX_TEXT_BYTES: u64 = engine_core::model_kit::files::caps::TEXT;

/// Audio encodings `--format` names (without it, `--out`'s extension decides).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// 16-bit PCM WAV (.wav; streamed to stdout with a header of unknown length)
    Wav,
    /// raw 16-bit signed little-endian samples, mono (.pcm, .raw)
    #[value(alias = "pcm")]
    Pcm16,
    /// raw 32-bit float little-endian samples, mono (.f32)
    F32,
    /// 16-bit FLAC (.flac; streamed too; the sizes and checksum are filled in at the end where the output can seek)
    Flac,
    /// MP3, 96 kbit/s (.mp3)
    Mp3,
    /// Opus in Ogg, 48 kHz (.opus, .ogg)
    Opus,
    /// AAC-LC in ADTS frames (.aac)
    Aac,
}

impl Format {
    /// The encoder layer's format.
    pub fn audio(self) -> AudioFormat {
        match self {
            Format::Wav => AudioFormat::Wav,
            Format::Pcm16 => AudioFormat::Pcm,
            Format::F32 => AudioFormat::F32,
            Format::Flac => AudioFormat::Flac,
            Format::Mp3 => AudioFormat::Mp3,
            Format::Opus => AudioFormat::Opus,
            Format::Aac => AudioFormat::Aac,
        }
    }

    /// The format of `out`: `--format` when given, else what the file's
    /// extension names (WAV for stdout and for a name without one); an
    /// extension of no format is an error listing the formats.
    pub fn for_output(out: &Path, given: Option<Format>) -> Result<Format, String> {
        if let Some(f) = given {
            return Ok(f);
        }
        if out == Path::new("-") {
            return Ok(Format::Wav);
        }
        let audio = AudioFormat::from_extension(out).map_err(|e| format!("--out {e} (or name one with --format)"))?;
        Ok(match audio.unwrap_or(AudioFormat::Wav) {
            AudioFormat::Wav => Format::Wav,
            AudioFormat::Pcm => Format::Pcm16,
            AudioFormat::F32 => Format::F32,
            AudioFormat::Flac => Format::Flac,
            AudioFormat::Mp3 => Format::Mp3,
            AudioFormat::Opus => Format::Opus,
            AudioFormat::Aac => Format::Aac,
        })
    }
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

/// A spinner on stderr with the elapsed time, the pieces of audio the model
/// has delivered (Supertonic: one per text chunk) and their length, and what
/// the model reports of the piece it is making (Chatterbox: the speech tokens
/// T3 has generated), only when stderr is a terminal (and not `-q`): logs and
/// pipes stay clean.
pub struct Progress(Option<indicatif::ProgressBar>, std::cell::RefCell<Shown>);

/// What the spinner says.
#[derive(Default)]
struct Shown {
    pieces: u64,
    seconds: f64,
    /// The model's count for the coming piece: what, and how many.
    work: Option<(String, u64)>,
}

impl Progress {
    pub fn new(quiet: bool) -> Progress {
        if quiet || !std::io::stderr().is_terminal() {
            return Progress(None, Default::default());
        }
        let bar = indicatif::ProgressBar::new_spinner();
        if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {elapsed} {msg}") {
            bar.set_style(style);
        }
        bar.set_message("synthesizing");
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        Progress(Some(bar), Default::default())
    }

    /// One more piece has come; `seconds` of audio so far.
    fn audio(&self, seconds: f64) {
        let mut shown = self.1.borrow_mut();
        shown.pieces += 1;
        shown.seconds = seconds;
        shown.work = None;
        self.show(&shown);
    }

    /// The model reports work on the coming piece.
    fn work(&self, progress: &engine_core::engine::Progress<'_>) {
        let mut shown = self.1.borrow_mut();
        shown.work = Some((progress.unit.to_string(), progress.done));
        self.show(&shown);
    }

    fn show(&self, shown: &Shown) {
        if let Some(bar) = &self.0 {
            bar.set_message(progress_message(shown));
        }
    }
}

fn progress_message(shown: &Shown) -> String {
    let audio = match shown.pieces {
        0 => "synthesizing".to_string(),
        1 => format!("1 piece, {:.1} s of audio", shown.seconds),
        n => format!("{n} pieces, {:.1} s of audio", shown.seconds),
    };
    match &shown.work {
        Some((unit, done)) => format!("{audio}; {done} {unit}"),
        None => audio,
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
    /// The rate of the audio written (Opus: 48 kHz whatever the model's).
    pub sample_rate: u32,
    /// stdout's reader went away before the end; the synthesis stopped there.
    pub reader_gone: bool,
    /// The model's token streams (Chatterbox: speech tokens and text ids).
    pub tokens: Vec<TokenTrace>,
}

/// `--print-tokens`: one line per token stream, `text ids (12): 101 2 ...`
/// (the stream's name with spaces for underscores), or one line saying that
/// `family` reports none.
pub fn token_lines(family: &str, tokens: &[TokenTrace]) -> String {
    if tokens.is_empty() {
        return format!("{family} has no token streams\n");
    }
    let mut s = String::new();
    for t in tokens {
        let values: Vec<String> = t.tokens.iter().map(u32::to_string).collect();
        s += &format!("{} ({}): {}\n", t.name.replace('_', " "), values.len(), values.join(" "));
    }
    s
}

/// Synthesizes `text` into `out` (`-`: stdout) as `format`, piece by piece as
/// the model produces them, so memory does not grow with the length of the
/// text. A file is complete only when synthesis ends (a temporary renamed
/// over it: never partial, never written through a planted link;
/// `engine_core::output`), and gets the one-shot audio; stdout gets the
/// streaming pieces (FLAC: the one-shot audio too).
pub fn synthesize(session: &mut ModelSession, text: &str, out: &Path, format: Format, progress: &Progress) -> Result<Written, String> {
    let one_shot = session.one_shot_overrides();
    if out == Path::new("-") {
        let mut stdout = std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned().map_err(|e| format!("stdout: {e}"))?);
        let overrides = if format == Format::Flac { &one_shot[..] } else { &[] };
        let target = Target { what: "stdout", reader_may_go: true, sizes_must_fit: false };
        return stream_into(&mut stdout, session, text, overrides, format, progress, &target).map_err(|e| e.message);
    }
    let what = out.display().to_string();
    let mut written = None;
    // A synthesis error is reported as it is, not as an error of the file.
    let mut failure = None;
    let result = engine_core::output::write_file_with(out, |file| {
        let target = Target { what: &what, reader_may_go: false, sizes_must_fit: true };
        match stream_into(file, session, text, &one_shot, format, progress, &target) {
            Ok(w) => {
                written = Some(w);
                Ok(())
            }
            Err(e) => {
                failure = Some(e.message);
                Err(engine_core::output::WriteError::Other(String::new()))
            }
        }
    });
    match (result, failure, written) {
        (Err(_), Some(e), _) => Err(e),
        (Err(e), None, _) => Err(format!("{}: {e}", out.display())),
        (Ok(()), _, Some(w)) => Ok(w),
        (Ok(()), _, None) => Err(format!("{}: nothing was written", out.display())),
    }
}

/// Where [`stream_into`] writes.
struct Target<'a> {
    /// For messages: `stdout` or the output's name.
    what: &'a str,
    /// A reader that goes away (a broken pipe) stops the synthesis quietly.
    reader_may_go: bool,
    /// A WAV longer than its 32-bit sizes can say is an error (a file), not
    /// a stream of unknown length (stdout).
    sizes_must_fit: bool,
}

struct StreamError {
    message: String,
}

/// Synthesizes `text` (with `overrides`) into `file` as `format`, each piece
/// written as it arrives. Where `file` can seek back ([`header_start`]), the
/// header is rewritten at the end with the real totals and an MP3 starts
/// with its Info frame; a pipe keeps the streaming bytes.
fn stream_into(
    file: &mut std::fs::File,
    session: &mut ModelSession,
    text: &str,
    overrides: &[(String, String)],
    format: Format,
    progress: &Progress,
    target: &Target<'_>,
) -> Result<Written, StreamError> {
    let what = target.what;
    let fail = |message: String| StreamError { message };
    let io = |e: std::io::Error| fail(format!("writing {what}: {e}"));
    let start = header_start(file);
    let destination = if start.is_some() { Destination::Seekable } else { Destination::Stream };
    // Started by the first piece, which brings the model's rate.
    let (mut samples, mut reader_gone, mut encoder) = (0u64, false, None::<StreamEncoder>);
    let mut buffer = Vec::new();
    let on_progress = |p: &engine_core::engine::Progress<'_>| {
        progress.work(p);
        true
    };
    let summary = session
        .synthesize_observed(
            text,
            overrides,
            |piece, rate| {
                buffer.clear();
                if encoder.is_none() {
                    encoder = Some(StreamEncoder::to(format.audio(), rate, destination).map_err(EngineError)?);
                }
                encoder.as_mut().expect("set above").push(piece, &mut buffer).map_err(EngineError)?;
                samples += piece.len() as u64;
                progress.audio(samples as f64 / rate as f64);
                match file.write_all(&buffer) {
                    Ok(()) => Ok(true),
                    Err(e) if target.reader_may_go && e.kind() == std::io::ErrorKind::BrokenPipe => {
                        reader_gone = true;
                        Ok(false)
                    }
                    Err(e) => Err(EngineError(format!("writing {what}: {e}"))),
                }
            },
            on_progress,
        )
        .map_err(|e| fail(e.0))?;
    for t in summary.timings.iter() {
        tracing::debug!(stage = %t.stage, ms = t.ms, "stage timing");
    }
    let rate = summary.sample_rate;
    let tokens = summary.tokens.to_vec();
    let written = Written { seconds: samples as f64 / rate.max(1) as f64, sample_rate: format.audio().output_rate(rate), reader_gone, tokens };
    if reader_gone {
        return Ok(written);
    }
    buffer.clear();
    let encoder = match encoder {
        Some(e) => e,
        None => StreamEncoder::to(format.audio(), rate, destination).map_err(fail)?,
    };
    let header = encoder.finish(&mut buffer).map_err(fail)?;
    match file.write_all(&buffer) {
        Err(e) if target.reader_may_go && e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(Written { reader_gone: true, ..written }),
        other => other.map_err(io)?,
    }
    if format == Format::Wav && samples > 0 && header.is_none() && target.sizes_must_fit {
        return Err(fail(format!("{:.0} s of audio is more than a WAV file holds (4 GiB of samples); use --format flac, pcm16 or f32", written.seconds)));
    }
    if let (Some(header), Some(start)) = (header, start) {
        let end = file.stream_position().map_err(io)?;
        file.seek(SeekFrom::Start(start)).map_err(io)?;
        file.write_all(&header).map_err(io)?;
        file.seek(SeekFrom::Start(end)).map_err(io)?;
    }
    Ok(written)
}

/// Where the output starts in `file` when the header can be written back
/// there at the end (WAV's sizes, FLAC's totals, MP3's Info frame): a
/// regular file not open for appending, since Linux appends every write on
/// an `O_APPEND` descriptor (`--out - >> x.wav`) wherever the offset is.
/// None for those, pipes and terminals: they get a stream's bytes.
fn header_start(file: &mut std::fs::File) -> Option<u64> {
    use std::os::fd::AsRawFd;
    // SAFETY: F_GETFL only reads the flags of a descriptor `file` holds open.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    let appending = flags < 0 || flags & libc::O_APPEND != 0;
    if appending || !file.metadata().is_ok_and(|m| m.is_file()) {
        return None;
    }
    file.stream_position().ok()
}

#[cfg(test)]
mod progress_tests {
    use super::{progress_message, Shown};

    #[test]
    fn the_spinner_counts_pieces_seconds_and_the_models_work() {
        let shown = |pieces, seconds, work: Option<(&str, u64)>| Shown { pieces, seconds, work: work.map(|(u, n)| (u.to_string(), n)) };
        assert_eq!(progress_message(&shown(0, 0.0, None)), "synthesizing");
        assert_eq!(progress_message(&shown(0, 0.0, Some(("speech tokens", 17)))), "synthesizing; 17 speech tokens");
        assert_eq!(progress_message(&shown(1, 0.42, None)), "1 piece, 0.4 s of audio");
        assert_eq!(progress_message(&shown(3, 4.25, Some(("speech tokens", 5)))), "3 pieces, 4.2 s of audio; 5 speech tokens");
    }
}
