//! MP3 through LAME: 96 kbit/s CBR, frames sent as LAME completes them.
//!
//! For an output that can seek back ([`super::Destination::Seekable`]) the
//! stream starts with LAME's Info frame, whose LAME tag states the encoder
//! delay and the last frame's padding (and the frame count, byte count and
//! CRCs): decoders that read it (ffmpeg, mpg123) trim both and give back
//! exactly the samples encoded. LAME writes that frame first as a
//! placeholder and computes it only at the end, so it is the header
//! [`super::StreamEncoder::finish`] returns. A stream cannot go back to it
//! and gets no tag: decoded, it is longer by the delay and the padding.
//!
//! LAME is LGPL, so it is linked as the system's shared `libmp3lame.so.0`
//! (Debian: `libmp3lame-dev` to build, `libmp3lame0` to run), never compiled
//! into the binary: a bundle ships it as the separate library it is, which a
//! user may replace (docs/licenses.md). The eleven functions used are declared
//! here as `lame.h` gives them.

use super::{Codec, Destination};
use std::os::raw::{c_int, c_uchar};

/// LAME's `lame_global_flags`, used only through a pointer.
#[repr(C)]
struct LameFlags {
    _opaque: [u8; 0],
}

#[link(name = "mp3lame")]
extern "C" {
    fn lame_init() -> *mut LameFlags;
    fn lame_set_num_channels(flags: *mut LameFlags, channels: c_int) -> c_int;
    fn lame_set_in_samplerate(flags: *mut LameFlags, rate: c_int) -> c_int;
    fn lame_set_brate(flags: *mut LameFlags, kbps: c_int) -> c_int;
    fn lame_set_quality(flags: *mut LameFlags, quality: c_int) -> c_int;
    fn lame_set_bWriteVbrTag(flags: *mut LameFlags, write: c_int) -> c_int;
    fn lame_init_params(flags: *mut LameFlags) -> c_int;
    fn lame_encode_buffer_ieee_float(flags: *mut LameFlags, left: *const f32, right: *const f32, samples: c_int, mp3: *mut c_uchar, mp3_size: c_int) -> c_int;
    fn lame_encode_flush(flags: *mut LameFlags, mp3: *mut c_uchar, size: c_int) -> c_int;
    fn lame_get_lametag_frame(flags: *const LameFlags, buffer: *mut c_uchar, size: usize) -> usize;
    fn lame_close(flags: *mut LameFlags) -> c_int;
}

const KBPS: c_int = 96;
/// LAME's scale: 0 best and slowest, 9 worst; 5 is its "good" default.
const QUALITY: c_int = 5;
/// The most samples given to LAME in one call (its counts are C ints).
const CALL_SAMPLES: usize = 1 << 16;

pub(super) struct Mp3 {
    flags: *mut LameFlags,
    /// Whether LAME was asked for the Info frame (a seekable destination).
    tagged: bool,
    /// The first four bytes LAME gave out: the placeholder's frame header,
    /// which the final Info frame must repeat to be as long.
    placeholder: Vec<u8>,
}

// SAFETY: the LAME handle is owned by this value alone and used through
// `&mut self`; LAME keeps its state in the handle, not in thread-local or
// global storage, so the handle may move to another thread.
unsafe impl Send for Mp3 {}

impl Mp3 {
    pub(super) fn new(rate: u32, destination: Destination) -> Result<Mp3, String> {
        let bad = |what: &str| format!("MP3 encoder: {what} (model rate {rate} Hz)");
        // SAFETY: lame_init has no preconditions; a null return is checked.
        let flags = unsafe { lame_init() };
        if flags.is_null() {
            return Err(bad("LAME did not start"));
        }
        let tagged = destination == Destination::Seekable;
        let mp3 = Mp3 { flags, tagged, placeholder: Vec::new() };
        let rate = c_int::try_from(rate).map_err(|_| bad("rate out of range"))?;
        // SAFETY: `flags` is a live handle from lame_init, closed only on drop.
        let failed = unsafe {
            // The Info frame only where it can be filled in at the end: a
            // stream would keep LAME's placeholder, an empty frame.
            [
                lame_set_num_channels(flags, 1),
                lame_set_in_samplerate(flags, rate),
                lame_set_brate(flags, KBPS),
                lame_set_quality(flags, QUALITY),
                lame_set_bWriteVbrTag(flags, c_int::from(tagged)),
            ]
            .iter()
            .any(|r| *r < 0)
                || lame_init_params(flags) < 0
        };
        if failed {
            return Err(bad("LAME refused the settings"));
        }
        Ok(mp3)
    }
}

impl Drop for Mp3 {
    fn drop(&mut self) {
        // SAFETY: `flags` came from lame_init and is closed once, here.
        unsafe { lame_close(self.flags) };
    }
}

fn lame_error(code: c_int) -> String {
    format!("MP3 encoding: LAME error {code}")
}

impl Codec for Mp3 {
    fn push(&mut self, samples: &[f32], _first: bool, out: &mut Vec<u8>) -> Result<(), String> {
        for part in samples.chunks(CALL_SAMPLES) {
            // lame.h's bound for one call: 1.25 * samples + 7200 bytes.
            let room = part.len() + part.len() / 4 + 7200;
            let start = out.len();
            out.resize(start + room, 0);
            // SAFETY: `part` holds `part.len()` samples (mono: the right
            // channel is not read), and `out[start..]` has `room` writable bytes.
            let written = unsafe {
                lame_encode_buffer_ieee_float(self.flags, part.as_ptr(), part.as_ptr(), part.len() as c_int, out[start..].as_mut_ptr(), room as c_int)
            };
            if written < 0 {
                out.truncate(start);
                return Err(lame_error(written));
            }
            out.truncate(start + written as usize);
            self.keep_placeholder_header(&out[start..]);
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>, _samples: u64, out: &mut Vec<u8>) -> Result<Option<Vec<u8>>, String> {
        // lame.h: the flush writes at most 7200 bytes.
        let room = 7200;
        let start = out.len();
        out.resize(start + room, 0);
        // SAFETY: `out[start..]` has `room` writable bytes; the handle is live.
        let written = unsafe { lame_encode_flush(self.flags, out[start..].as_mut_ptr(), room as c_int) };
        if written < 0 {
            out.truncate(start);
            return Err(lame_error(written));
        }
        out.truncate(start + written as usize);
        self.keep_placeholder_header(&out[start..]);
        if !self.tagged {
            return Ok(None);
        }
        self.lametag_frame()
    }
}

impl Mp3 {
    /// Keeps the first four bytes LAME gives out, wherever they come.
    fn keep_placeholder_header(&mut self, bytes: &[u8]) {
        let missing = 4 - self.placeholder.len();
        self.placeholder.extend_from_slice(&bytes[..missing.min(bytes.len())]);
    }

    /// LAME's final Info frame, to be written over the placeholder it gave
    /// out first; None where LAME wrote no placeholder (it leaves the tag
    /// out of a frame too small to hold it).
    fn lametag_frame(&self) -> Result<Option<Vec<u8>>, String> {
        // An Info frame is one frame: at most 2881 bytes (MPEG-1 Layer III).
        let mut frame = vec![0u8; 4096];
        // SAFETY: `frame` has `frame.len()` writable bytes; the handle is
        // live and LAME's flush has run.
        let length = unsafe { lame_get_lametag_frame(self.flags, frame.as_mut_ptr(), frame.len()) };
        if length == 0 {
            return Ok(None);
        }
        if length > frame.len() {
            return Err(format!("MP3 encoding: LAME's tag frame needs {length} bytes"));
        }
        frame.truncate(length);
        // The same frame header means the same frame length (bit rate, rate
        // and padding decide it), so the tag fits the placeholder exactly.
        if frame.get(..4) != Some(&self.placeholder[..]) {
            return Err("MP3 encoding: LAME's tag frame does not match the placeholder it wrote".to_string());
        }
        Ok(Some(frame))
    }
}
