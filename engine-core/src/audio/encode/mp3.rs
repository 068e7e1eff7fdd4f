//! MP3 through LAME (`mp3lame-encoder`): 96 kbit/s CBR, frames sent as LAME
//! completes them.

use super::Codec;

pub(super) struct Mp3 {
    encoder: mp3lame_encoder::Encoder,
}

impl Mp3 {
    pub(super) fn new(rate: u32) -> Result<Mp3, String> {
        let bad = |what: String| format!("MP3 encoder: {what} (model rate {rate} Hz)");
        let mut b = mp3lame_encoder::Builder::new().ok_or_else(|| bad("LAME did not start".into()))?;
        b.set_num_channels(1).map_err(|e| bad(format!("{e:?}")))?;
        b.set_sample_rate(rate).map_err(|e| bad(format!("{e:?}")))?;
        b.set_brate(mp3lame_encoder::Bitrate::Kbps96).map_err(|e| bad(format!("{e:?}")))?;
        b.set_quality(mp3lame_encoder::Quality::Good).map_err(|e| bad(format!("{e:?}")))?;
        // No Xing/LAME tag: LAME writes it before the audio and fills it in
        // only at the end, which a stream cannot go back to; decoders would
        // trim the audio by the tag's unfilled fields.
        b.set_to_write_vbr_tag(false).map_err(|e| bad(format!("{e:?}")))?;
        Ok(Mp3 { encoder: b.build().map_err(|e| bad(format!("{e:?}")))? })
    }
}

impl Codec for Mp3 {
    fn push(&mut self, samples: &[f32], _first: bool, out: &mut Vec<u8>) -> Result<(), String> {
        out.reserve(mp3lame_encoder::max_required_buffer_size(samples.len()));
        self.encoder.encode_to_vec(mp3lame_encoder::MonoPcm(samples), out).map_err(|e| format!("MP3 encoding: {e:?}"))?;
        Ok(())
    }

    fn finish(mut self: Box<Self>, _samples: u64, out: &mut Vec<u8>) -> Result<Option<Vec<u8>>, String> {
        // LAME's documented bound for the flush: 7200 bytes.
        out.reserve(7200);
        self.encoder.flush_to_vec::<mp3lame_encoder::FlushGap>(out).map_err(|e| format!("MP3 encoding: {e:?}"))?;
        Ok(None)
    }
}
