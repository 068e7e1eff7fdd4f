//! WAV output. Files are written to a temporary sibling and renamed into place,
//! so a failed synthesis never leaves a partial output file.

use std::path::Path;

pub fn write_wav_atomic(path: &Path, samples: &[f32], sample_rate: u32) -> Result<(), String> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(format!("output directory {} does not exist", dir.display()));
    }
    let name = path.file_name().ok_or_else(|| format!("output path {} has no file name", path.display()))?;
    let tmp = dir.join(format!(".{}.partial", name.to_string_lossy()));
    let spec = hound::WavSpec { channels: 1, sample_rate, bits_per_sample: 16, sample_format: hound::SampleFormat::Int };
    let write = || -> Result<(), hound::Error> {
        let mut w = hound::WavWriter::create(&tmp, spec)?;
        for s in samples {
            w.write_sample((s.clamp(-1.0, 1.0) * i16::MAX as f32).round() as i16)?;
        }
        w.finalize()
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!("writing {}: {e}", path.display()));
    }
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("writing {}: {e}", path.display())
    })
}
