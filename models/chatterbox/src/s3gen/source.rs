//! HiFT's host-side signal processing: the neural-source-filter excitation
//! (SineGen + the merge layer), the source STFT, the output ISTFT and the trim
//! fade. Float32 throughout with the reference's rounding points: the phase
//! is a running sum accumulated in f64 and rounded per sample, as torch's CPU
//! `cumsum` does, then wrapped to [0, 1).

use crate::dsp::{hann_periodic, reflect_index};
use crate::hparams::HiftHparams;
use crate::sampler::Xoshiro256;
use engine_core::model_kit::Result;
use realfft::RealFftPlanner;

/// The source's random draws: a phase per harmonic (the fundamental's is
/// forced to 0) and a standard-normal noise sample per harmonic and sample.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceNoise {
    /// `[harmonics + 1]`, in (−π, π).
    pub phase: Vec<f32>,
    /// `[harmonics + 1][samples]`.
    pub noise: Vec<f32>,
}

impl SourceNoise {
    /// Room for the draws of `harmonics + 1` bands over `samples`.
    pub fn zeroed(harmonics: usize, samples: usize) -> Self {
        SourceNoise { phase: vec![0.0; harmonics + 1], noise: vec![0.0; (harmonics + 1) * samples] }
    }

    /// Overwrites the draws with seeded ones (uniform phases, Box–Muller
    /// normals). Each band's noise comes from its own stream, so the bands
    /// are drawn in parallel and the result does not depend on the thread
    /// count. The buffers belong to
    /// the caller: threads that only fill them leave no memory behind in
    /// their allocator arenas (a soak measured 1 MiB of resident memory a
    /// run when the bands were allocated on worker threads).
    pub fn draw_seeded(&mut self, seed: u64) {
        let bands = self.phase.len();
        let samples = self.noise.len() / bands.max(1);
        let mut rng = Xoshiro256::new(seed);
        self.phase.iter_mut().for_each(|p| *p = (rng.next_f32() * 2.0 - 1.0) * std::f32::consts::PI);
        if let Some(first) = self.phase.first_mut() {
            *first = 0.0;
        }
        in_parallel(self.noise.chunks_mut(samples.max(1)).enumerate(), |(h, band)| Xoshiro256::new(band_seed(seed, h)).fill_gaussians(band));
    }
}

/// Runs `work` on every item, spread over the host's cores; items are
/// independent, so results do not depend on how they were spread.
fn in_parallel<T: Send>(items: impl Iterator<Item = T>, work: impl Fn(T) + Sync) {
    let items: Vec<T> = items.collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(items.len()).max(1);
    if threads == 1 {
        items.into_iter().for_each(work);
        return;
    }
    let per_thread = items.len().div_ceil(threads);
    let mut groups: Vec<Vec<T>> = Vec::new();
    let mut items = items.into_iter().peekable();
    while items.peek().is_some() {
        groups.push(items.by_ref().take(per_thread).collect());
    }
    let work = &work;
    std::thread::scope(|scope| {
        for group in groups {
            scope.spawn(move || group.into_iter().for_each(work));
        }
    });
}

/// Frames per parallel work item of the STFTs (large enough that a thread's
/// start-up is noise beside its work).
const FRAMES_PER_ITEM: usize = 2048;

/// The excitation for `f0` (one value per mel frame, Hz): nearest-upsampled to
/// samples, `harmonics + 1` sines (noise where unvoiced), merged by
/// `tanh(w · sines + b)`. Returns one value per output sample.
pub fn excitation(hp: &HiftHparams, f0: &[f32], merge_weight: &[f32], merge_bias: f32, draws: &SourceNoise) -> Result<Vec<f32>> {
    excitation_from(hp, f0, merge_weight, merge_bias, draws, &mut SourcePhase::default())
}

/// The draws of [`SourceNoise::draw_seeded`] for one utterance, handed out
/// window by window: the windows' noise, laid end to end, is the noise one
/// draw over every sample gives (each band is its own stream, and windows are
/// whole frames, an even number of samples).
pub struct NoiseStreams {
    phase: Vec<f32>,
    bands: Vec<Xoshiro256>,
}

impl NoiseStreams {
    pub fn seeded(harmonics: usize, seed: u64) -> NoiseStreams {
        let mut first = SourceNoise::zeroed(harmonics, 0);
        first.draw_seeded(seed);
        let bands = (0..harmonics + 1).map(|h| Xoshiro256::new(band_seed(seed, h))).collect();
        NoiseStreams { phase: first.phase, bands }
    }

    /// The next `samples` samples' draws.
    pub fn next(&mut self, samples: usize) -> SourceNoise {
        let mut noise = vec![0f32; self.bands.len() * samples];
        for (rng, band) in self.bands.iter_mut().zip(noise.chunks_mut(samples.max(1))) {
            rng.fill_gaussians(band);
        }
        SourceNoise { phase: self.phase.clone(), noise }
    }
}

/// How far each band's sine has run over the samples excited so far.
/// Streaming vocodes an utterance window by window, and each window's source
/// goes on from where the last one stopped.
#[derive(Debug, Clone, Default)]
pub struct SourcePhase {
    /// Cycles per band (empty: at the utterance's start).
    cycles: Vec<f64>,
}

/// [`excitation`] of the frames after those `phase` has covered, leaving
/// `phase` at the end of them: `draws.noise` holds these samples' noise and
/// `draws.phase` the utterance's initial phases. Windows excited in turn
/// give the samples one call over all their frames gives.
pub fn excitation_from(hp: &HiftHparams, f0: &[f32], merge_weight: &[f32], merge_bias: f32, draws: &SourceNoise, phase: &mut SourcePhase) -> Result<Vec<f32>> {
    let per_frame = hp.samples_per_frame();
    let samples = f0.len() * per_frame;
    let bands = hp.harmonics + 1;
    if draws.phase.len() != bands || draws.noise.len() != bands * samples {
        return Err(format!(
            "source noise has {} phases and {} samples; {bands} harmonics over {samples} samples need {bands} and {}",
            draws.phase.len(),
            draws.noise.len(),
            bands * samples
        )
        .into());
    }
    if merge_weight.len() != bands {
        return Err(format!("the source merge layer has {} weights for {bands} harmonics", merge_weight.len()).into());
    }
    let sr = hp.sample_rate as f32;
    let two_pi = std::f64::consts::TAU as f32;
    let noise_unvoiced = hp.nsf_alpha / 3.0;
    // Each band's weighted contribution on its own thread (its phase is a
    // running sum), then the bands summed in order as one loop would.
    let mut bands_out = vec![0f32; bands * samples];
    phase.cycles.resize(bands, 0.0);
    in_parallel(bands_out.chunks_mut(samples.max(1)).zip(phase.cycles.iter_mut()).enumerate(), |(h, (out, cycles))| {
        let (mult, weight) = ((h + 1) as f32, merge_weight[h]);
        let mut cum = *cycles;
        for (n, out) in out.iter_mut().enumerate() {
            let f = f0[n / per_frame];
            cum += ((f * mult) / sr) as f64;
            let wrapped = {
                let c = cum as f32;
                c - c.floor()
            };
            let sine = hp.nsf_alpha * (two_pi * wrapped + draws.phase[h]).sin();
            let voiced = f > hp.voiced_threshold;
            let amp = if voiced { hp.nsf_sigma } else { noise_unvoiced };
            let value = if voiced { sine } else { 0.0 } + amp * draws.noise[h * samples + n];
            *out = weight * value;
        }
        *cycles = cum;
    });
    let mut merged = vec![merge_bias; samples];
    for band in bands_out.chunks(samples.max(1)) {
        merged.iter_mut().zip(band).for_each(|(m, v)| *m += v);
    }
    merged.iter_mut().for_each(|v| *v = v.tanh());
    Ok(merged)
}

/// The stream of band `h`'s noise under `seed`.
fn band_seed(seed: u64, h: usize) -> u64 {
    seed ^ (h as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Periodic Hann window of length `n`, in f32.
fn hann(n: usize) -> Vec<f32> {
    hann_periodic(n).into_iter().map(|w| w as f32).collect()
}

/// `torch.stft(x, n_fft, hop, window=hann, center=True, pad_mode="reflect")`
/// (the host reference of the HiFT graph's own STFT):
/// `[2·(n_fft/2+1)][frames]` flattened, real parts then imaginary parts.
pub fn stft(x: &[f32], n_fft: usize, hop: usize) -> Result<Vec<f32>> {
    let pad = n_fft / 2;
    if x.len() <= pad {
        return Err(format!("the source has {} samples, the STFT needs more than {pad}", x.len()).into());
    }
    let reflect = |i: isize| x[reflect_index(i, x.len())];
    let frames = x.len() / hop + 1;
    let bins = n_fft / 2 + 1;
    let window = hann(n_fft);
    let fft = RealFftPlanner::<f32>::new().plan_fft_forward(n_fft);
    // Frame-major spectra, computed in parallel, then laid out bin-major.
    let mut spectra = vec![realfft::num_complex::Complex::<f32>::default(); frames * bins];
    in_parallel(spectra.chunks_mut(FRAMES_PER_ITEM * bins).enumerate(), |(item, out)| {
        let (mut buf, mut scratch) = (fft.make_input_vec(), fft.make_scratch_vec());
        for (i, spec) in out.chunks_mut(bins).enumerate() {
            let f = item * FRAMES_PER_ITEM + i;
            for (k, b) in buf.iter_mut().enumerate() {
                *b = reflect((f * hop + k) as isize - pad as isize) * window[k];
            }
            fft.process_with_scratch(&mut buf, spec, &mut scratch).expect("buffer lengths come from the plan");
        }
    });
    let mut out = vec![0f32; 2 * bins * frames];
    for (f, spec) in spectra.chunks(bins).enumerate() {
        for (k, c) in spec.iter().enumerate() {
            out[k * frames + f] = c.re;
            out[(bins + k) * frames + f] = c.im;
        }
    }
    Ok(out)
}

/// The head: `conv_post` `[2·bins][frames]` (log-magnitudes, then phases
/// before `sin`) → `torch.istft(mag·e^{i·sin(phase)}, center=True)` with the
/// magnitude clipped at 100 → clamp to ±`audio_limit`.
pub fn istft_head(hp: &HiftHparams, conv_post: &[f32]) -> Result<Vec<f32>> {
    let bins = hp.n_fft / 2 + 1;
    if conv_post.is_empty() || !conv_post.len().is_multiple_of(2 * bins) {
        return Err(format!("conv_post has {} values, not a multiple of {}", conv_post.len(), 2 * bins).into());
    }
    let frames = conv_post.len() / (2 * bins);
    let mut spec = vec![0f32; conv_post.len()];
    let (re, im) = spec.split_at_mut(bins * frames);
    in_parallel(re.chunks_mut(frames).zip(im.chunks_mut(frames)).enumerate(), |(k, (re, im))| {
        for f in 0..frames {
            let mag = conv_post[k * frames + f].exp().min(100.0);
            let phase = conv_post[(bins + k) * frames + f].sin();
            re[f] = mag * phase.cos();
            im[f] = mag * phase.sin();
        }
    });
    let mut wav = istft(&spec, hp.n_fft, hp.hop)?;
    wav.iter_mut().for_each(|v| *v = v.clamp(-hp.audio_limit, hp.audio_limit));
    Ok(wav)
}

/// `torch.istft(spec, n_fft, hop, window=hann, center=True)` of a spectrum laid
/// out as [`stft`] returns it; `hop · (frames − 1)` samples.
pub fn istft(spec: &[f32], n_fft: usize, hop: usize) -> Result<Vec<f32>> {
    let bins = n_fft / 2 + 1;
    let frames = spec.len() / (2 * bins);
    if frames < 2 || spec.len() != 2 * bins * frames {
        return Err(format!("an ISTFT spectrum of {} values does not hold 2 or more frames of {bins} bins", spec.len()).into());
    }
    let window = hann(n_fft);
    let ifft = RealFftPlanner::<f32>::new().plan_fft_inverse(n_fft);
    // Every frame's windowed inverse in parallel; the overlap-add after, in
    // frame order, sums as one sequential loop would.
    let mut frame_out = vec![0f32; frames * n_fft];
    in_parallel(frame_out.chunks_mut(FRAMES_PER_ITEM * n_fft).enumerate(), |(item, out)| {
        let (mut bins_buf, mut scratch) = (ifft.make_input_vec(), ifft.make_scratch_vec());
        for (i, buf) in out.chunks_mut(n_fft).enumerate() {
            let f = item * FRAMES_PER_ITEM + i;
            for (k, c) in bins_buf.iter_mut().enumerate() {
                *c = realfft::num_complex::Complex::new(spec[k * frames + f], spec[(bins + k) * frames + f]);
            }
            // A real signal's DC and Nyquist bins are real; the inverse ignores their imaginary parts.
            bins_buf[0].im = 0.0;
            bins_buf[bins - 1].im = 0.0;
            ifft.process_with_scratch(&mut bins_buf, buf, &mut scratch).expect("buffer lengths come from the plan");
        }
    });
    let total = n_fft + hop * (frames - 1);
    let mut acc = vec![0f32; total];
    let mut envelope = vec![0f32; total];
    for (f, buf) in frame_out.chunks(n_fft).enumerate() {
        for k in 0..n_fft {
            acc[f * hop + k] += buf[k] / n_fft as f32 * window[k];
            envelope[f * hop + k] += window[k] * window[k];
        }
    }
    let pad = n_fft / 2;
    Ok((pad..total - pad).map(|i| if envelope[i] > 1e-11 { acc[i] / envelope[i] } else { acc[i] }).collect())
}

/// Silences the first `n` samples and fades the next `n` in with a raised
/// cosine (S3Gen's trim fade against the vocoder's start-up transient).
pub fn apply_trim_fade(wav: &mut [f32], n: usize) {
    let step = (0.0 - std::f32::consts::PI) / (n as f32 - 1.0);
    for (i, s) in wav.iter_mut().take(2 * n).enumerate() {
        let fade = if i < n {
            0.0
        } else {
            let k = i - n;
            let x = if k < n / 2 { std::f32::consts::PI + step * k as f32 } else { 0.0 - step * (n - 1 - k) as f32 };
            (x.cos() + 1.0) / 2.0
        };
        *s *= fade;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_streams_hand_out_one_draw_in_windows() {
        let mut whole = SourceNoise::zeroed(3, 40);
        whole.draw_seeded(11);
        let mut streams = NoiseStreams::seeded(3, 11);
        let (a, b) = (streams.next(16), streams.next(24));
        assert_eq!(a.phase, whole.phase);
        for h in 0..4 {
            assert_eq!(&a.noise[h * 16..(h + 1) * 16], &whole.noise[h * 40..h * 40 + 16]);
            assert_eq!(&b.noise[h * 24..(h + 1) * 24], &whole.noise[h * 40 + 16..(h + 1) * 40]);
        }
    }

    #[test]
    fn windows_excited_in_turn_give_the_whole_source() {
        // What the source reads; the decoder's fields do not matter here.
        let hp = crate::hparams::HiftHparams {
            sample_rate: 24_000,
            base_channels: 8,
            conv_pre_kernel: 7,
            conv_post_kernel: 7,
            upsample_rates: vec![2, 3],
            upsample_kernels: vec![4, 6],
            resblock_kernels: vec![3],
            source_resblock_kernels: vec![7, 11],
            resblock_dilations: vec![1, 3, 5],
            n_fft: 16,
            hop: 4,
            harmonics: 8,
            nsf_alpha: 0.1,
            nsf_sigma: 0.003,
            voiced_threshold: 10.0,
            lrelu_slope: 0.1,
            audio_limit: 0.99,
            f0_layers: 5,
            f0_kernel: 3,
            trim_fade_samples: 0,
        };
        let per_frame = hp.samples_per_frame();
        let bands = hp.harmonics + 1;
        let frames = 9;
        // Voiced and unvoiced frames, so both branches run.
        let f0: Vec<f32> = (0..frames).map(|i| if i % 4 == 3 { 0.0 } else { 110.0 + 37.0 * i as f32 }).collect();
        let weight: Vec<f32> = (0..bands).map(|h| 0.3 - 0.05 * h as f32).collect();
        let mut whole = SourceNoise::zeroed(hp.harmonics, frames * per_frame);
        whole.draw_seeded(7);
        let want = excitation(&hp, &f0, &weight, 0.01, &whole).unwrap();
        let mut phase = SourcePhase::default();
        let mut got = Vec::new();
        for (a, b) in [(0, 2), (2, 7), (7, 9)] {
            let samples = (b - a) * per_frame;
            let noise: Vec<f32> = (0..bands).flat_map(|h| whole.noise[h * frames * per_frame + a * per_frame..][..samples].to_vec()).collect();
            let window = SourceNoise { phase: whole.phase.clone(), noise };
            got.extend(excitation_from(&hp, &f0[a..b], &weight, 0.01, &window, &mut phase).unwrap());
        }
        assert_eq!(got, want);
    }

    #[test]
    fn istft_inverts_stft() {
        let x: Vec<f32> = (0..400).map(|i| 0.5 * (i as f32 * 0.07).sin() + 0.2 * (i as f32 * 0.31).cos()).collect();
        let y = istft(&stft(&x, 16, 4).unwrap(), 16, 4).unwrap();
        assert_eq!(y.len(), x.len());
        let err = x.iter().zip(&y).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(err < 1e-5, "round trip error {err}");
    }

    #[test]
    fn stft_of_a_bin_centred_sine_peaks_in_that_bin() {
        let x: Vec<f32> = (0..256).map(|i| (std::f32::consts::TAU * 3.0 * i as f32 / 16.0).cos()).collect();
        let spec = stft(&x, 16, 4).unwrap();
        let frames = 65;
        let f = 30; // away from the reflected edges
        let mag: Vec<f32> = (0..9).map(|k| spec[k * frames + f].hypot(spec[(9 + k) * frames + f])).collect();
        let peak = mag.iter().enumerate().fold(0, |b, (i, &m)| if m > mag[b] { i } else { b });
        assert_eq!(peak, 3, "magnitudes {mag:?}");
    }

    #[test]
    fn trim_fade_silences_then_rises_to_one() {
        let mut w = vec![1f32; 2000];
        apply_trim_fade(&mut w, 480);
        assert!(w[..480].iter().all(|&v| v == 0.0));
        assert!(w[480] < 1e-6 && (w[959] - 1.0).abs() < 1e-6);
        assert!(w[480..960].windows(2).all(|p| p[1] >= p[0]));
        assert!(w[960..].iter().all(|&v| v == 1.0));
    }
}
