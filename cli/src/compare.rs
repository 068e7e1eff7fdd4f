//! `tts compare`: the same text, seed and options under two profiles (other
//! backends, devices, policies or weight files), timed side by side, with how
//! far the outputs agree and which policies each side resolved.

use crate::bench::{median, SessionInfo};
use engine_core::abi::SynthesisOutput;
use engine_core::compare::{max_rel_err, snr_db};
use engine_core::engine::ModelSession;
use indexmap::IndexMap;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What `--expect` demands of the two outputs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Expect {
    /// The same samples, bit for bit (and the same rate).
    Identical,
    /// Same length and rate, max relative error at most this.
    MaxRel(f32),
}

impl Expect {
    pub fn parse(s: &str) -> Result<Self, String> {
        if s == "identical" {
            return Ok(Expect::Identical);
        }
        let bad = || format!("--expect {s:?}: use `identical` or `max-rel=X` with X a number >= 0 (e.g. max-rel=1e-3)");
        let x: f32 = s.strip_prefix("max-rel=").ok_or_else(bad)?.parse().map_err(|_| bad())?;
        if !x.is_finite() || x < 0.0 {
            return Err(bad());
        }
        Ok(Expect::MaxRel(x))
    }
}

/// One profile's run.
#[derive(Serialize)]
pub struct Side {
    pub profile: String,
    #[serde(flatten)]
    pub session: SessionInfo,
    /// The resolved policies (`tts devices` prints the same).
    pub policies: engine_core::policy::Resolution,
    /// Median ms per stage over the timed runs.
    pub stages_ms: IndexMap<String, f64>,
    pub total_ms: f64,
    pub sample_rate: u32,
    pub samples: usize,
    #[serde(skip)]
    pub output: Vec<f32>,
    /// The model's token streams by name, every value (Chatterbox: the
    /// speech tokens and the text ids).
    pub tokens: IndexMap<String, Vec<u32>>,
}

/// Whether one token stream is the same on both sides, and where it parts.
#[derive(Serialize)]
pub struct TokenAgreement {
    pub name: String,
    pub identical: bool,
    pub a_len: usize,
    pub b_len: usize,
    /// Index of the first token that differs (or where the shorter stream ends).
    pub first_difference: Option<usize>,
}

#[derive(Serialize)]
pub struct Agreement {
    pub identical: bool,
    pub same_length: bool,
    /// Over the common length: max |b − a| / max |a|.
    pub max_rel_err: Option<f32>,
    pub snr_db: Option<f64>,
    /// Cosine similarity of the two log-mel spectrograms (80 bands, 1024-point frames, hop 256).
    pub log_mel_cosine: Option<f64>,
    /// Why a figure is missing (non-finite samples, other sample rates).
    pub note: Option<String>,
    /// Token streams both sides report.
    pub tokens: Vec<TokenAgreement>,
}

#[derive(Serialize)]
pub struct CompareReport {
    pub text: String,
    pub runs: usize,
    pub a: Side,
    pub b: Side,
    /// b / a per stage present on both sides.
    pub ratio: IndexMap<String, f64>,
    pub agreement: Agreement,
}

/// Runs one side: one untimed warm-up, then `runs` timed syntheses; the
/// output kept is the last one.
pub fn run_side(profile: &Path, session: &mut ModelSession, text: &str, runs: usize) -> Result<Side, String> {
    let mut per_stage: IndexMap<String, Vec<f64>> = IndexMap::new();
    let mut totals = Vec::new();
    let mut last: Option<SynthesisOutput> = None;
    for i in 0..=runs {
        let start = Instant::now();
        let out = session.synthesize(text).map_err(|e| format!("{}: {e}", profile.display()))?;
        let total = start.elapsed().as_secs_f64() * 1e3;
        if i > 0 {
            totals.push(total);
            let mut this_run: IndexMap<String, f64> = IndexMap::new();
            for t in out.timings.iter() {
                *this_run.entry(t.stage.to_string()).or_default() += t.ms;
            }
            for (stage, ms) in this_run {
                per_stage.entry(stage).or_default().push(ms);
            }
        }
        last = Some(out);
    }
    let out = last.expect("at least the warm-up ran");
    Ok(Side {
        profile: profile.display().to_string(),
        session: SessionInfo::of(session),
        policies: session.resolution.clone(),
        stages_ms: per_stage.into_iter().map(|(k, v)| (k, median(v))).collect(),
        total_ms: median(totals),
        sample_rate: out.sample_rate,
        samples: out.samples.len(),
        output: out.samples.to_vec(),
        tokens: out.tokens.iter().map(|t| (t.name.to_string(), t.tokens.to_vec())).collect(),
    })
}

fn token_agreement(a: &Side, b: &Side) -> Vec<TokenAgreement> {
    a.tokens
        .iter()
        .filter_map(|(name, ta)| {
            let tb = b.tokens.get(name)?;
            let first = ta.iter().zip(tb).position(|(x, y)| x != y).or((ta.len() != tb.len()).then(|| ta.len().min(tb.len())));
            Some(TokenAgreement { name: name.clone(), identical: first.is_none(), a_len: ta.len(), b_len: tb.len(), first_difference: first })
        })
        .collect()
}

pub fn agreement(a: &Side, b: &Side) -> Agreement {
    let tokens = token_agreement(a, b);
    let identical =
        a.sample_rate == b.sample_rate && a.output.len() == b.output.len() && a.output.iter().zip(&b.output).all(|(x, y)| x.to_bits() == y.to_bits());
    let same_length = a.output.len() == b.output.len();
    if a.sample_rate != b.sample_rate {
        return Agreement {
            identical,
            same_length,
            max_rel_err: None,
            snr_db: None,
            log_mel_cosine: None,
            note: Some(format!("sample rates differ ({} and {} Hz)", a.sample_rate, b.sample_rate)),
            tokens,
        };
    }
    let n = a.output.len().min(b.output.len());
    let (x, y) = (&a.output[..n], &b.output[..n]);
    let rel = max_rel_err(y, x);
    let note = match (&rel, same_length) {
        (Err(e), _) => Some(e.clone()),
        (Ok(_), false) => Some(format!("lengths differ ({} and {} samples); figures over the first {n}", a.output.len(), b.output.len())),
        _ => None,
    };
    Agreement { identical, same_length, max_rel_err: rel.ok(), snr_db: snr_db(y, x).ok(), log_mel_cosine: log_mel_cosine(x, y, a.sample_rate), note, tokens }
}

/// Cosine similarity of the log-mel spectrograms of `a` and `b` (same length).
fn log_mel_cosine(a: &[f32], b: &[f32], rate: u32) -> Option<f64> {
    let (ma, mb) = (log_mel(a, rate)?, log_mel(b, rate)?);
    let dot: f64 = ma.iter().zip(&mb).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    let denominator = norm(&ma) * norm(&mb);
    (denominator > 0.0).then(|| dot / denominator)
}

const N_FFT: usize = 1024;
const HOP: usize = 256;
const MEL_BANDS: usize = 80;

/// Natural-log mel power spectrogram: Hann-windowed 1024-point frames every
/// 256 samples, 80 triangular bands on the HTK mel scale up to Nyquist.
fn log_mel(x: &[f32], rate: u32) -> Option<Vec<f64>> {
    if x.len() < N_FFT || x.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let mut planner = realfft::RealFftPlanner::<f64>::new();
    let fft = planner.plan_fft_forward(N_FFT);
    let window: Vec<f64> = (0..N_FFT).map(|i| 0.5 - 0.5 * (std::f64::consts::TAU * i as f64 / N_FFT as f64).cos()).collect();
    let bins = N_FFT / 2 + 1;
    let mel = |hz: f64| 2595.0 * (1.0 + hz / 700.0).log10();
    let hz = |m: f64| 700.0 * (10f64.powf(m / 2595.0) - 1.0);
    let top = mel(rate as f64 / 2.0);
    let edges: Vec<f64> = (0..MEL_BANDS + 2).map(|i| hz(top * i as f64 / (MEL_BANDS + 1) as f64)).collect();
    let bin_hz = rate as f64 / N_FFT as f64;
    let mut input = fft.make_input_vec();
    let mut spectrum = fft.make_output_vec();
    let mut out = Vec::new();
    for start in (0..=x.len() - N_FFT).step_by(HOP) {
        for (i, v) in input.iter_mut().enumerate() {
            *v = x[start + i] as f64 * window[i];
        }
        fft.process(&mut input, &mut spectrum).ok()?;
        let power: Vec<f64> = spectrum.iter().map(|c| c.norm_sqr()).collect();
        for m in 0..MEL_BANDS {
            let (lo, mid, hi) = (edges[m], edges[m + 1], edges[m + 2]);
            let mut e = 0.0;
            for (k, p) in power.iter().enumerate().take(bins) {
                let f = k as f64 * bin_hz;
                let w = if f > lo && f <= mid {
                    (f - lo) / (mid - lo)
                } else if f > mid && f < hi {
                    (hi - f) / (hi - mid)
                } else {
                    0.0
                };
                e += w * p;
            }
            out.push((e + 1e-10).ln());
        }
    }
    Some(out)
}

pub fn report(text: &str, runs: usize, a: Side, b: Side) -> CompareReport {
    let ratio = a.stages_ms.iter().filter_map(|(stage, ms_a)| b.stages_ms.get(stage).map(|ms_b| (stage.clone(), ms_b / ms_a.max(1e-9)))).collect();
    let agreement = agreement(&a, &b);
    CompareReport { text: text.to_string(), runs, a, b, ratio, agreement }
}

/// `Ok` when the outputs meet `expect`; else one line saying how they differ.
pub fn verdict(r: &CompareReport, expect: Option<Expect>) -> Result<(), String> {
    let g = &r.agreement;
    match expect {
        None => Ok(()),
        Some(Expect::Identical) if g.identical => Ok(()),
        Some(Expect::Identical) => Err(format!(
            "outputs are not identical: {}",
            g.note.clone().unwrap_or_else(|| format!("max rel err {:.3e}, SNR {:.1} dB", g.max_rel_err.unwrap_or(f32::NAN), g.snr_db.unwrap_or(f64::NAN)))
        )),
        Some(Expect::MaxRel(x)) => match (g.same_length, g.max_rel_err) {
            (true, Some(e)) if e <= x => Ok(()),
            (true, Some(e)) => Err(format!("max rel err {e:.3e} exceeds --expect max-rel={x}")),
            _ => Err(format!("outputs cannot meet --expect max-rel={x}: {}", g.note.clone().unwrap_or_default())),
        },
    }
}

fn enabled(side: &Side) -> String {
    let on: Vec<&str> = side.policies.decisions.iter().filter(|d| d.enabled).map(|d| d.feature.as_str()).collect();
    let mut s =
        format!("kv {}, weights {}, on: {}", side.policies.kv_type, side.policies.matmul_weights, if on.is_empty() { "none".into() } else { on.join(" ") });
    if !side.policies.denied_ops.is_empty() {
        s.push_str(&format!(", denied: {}", side.policies.denied_ops.join(" ")));
    }
    s
}

pub fn render(r: &CompareReport) -> String {
    let mut out = String::new();
    let side = |tag: &str, s: &Side| {
        format!(
            "{tag}: {} — {} {} on {} ({})\n   policies: {}\n",
            s.profile,
            s.session.family,
            s.session.variant,
            s.session.device,
            s.session.backend,
            enabled(s)
        )
    };
    out.push_str(&side("A", &r.a));
    out.push_str(&side("B", &r.b));
    out.push_str(&format!("median of {} runs after 1 warm-up, ms\n", r.runs));
    out.push_str(&format!("  {:<28} {:>10} {:>10} {:>8}\n", "stage", "A", "B", "B / A"));
    for (stage, a) in &r.a.stages_ms {
        let b = r.b.stages_ms.get(stage).map_or("-".to_string(), |v| format!("{v:.2}"));
        let ratio = r.ratio.get(stage).map_or("-".to_string(), |v| format!("{v:.2}x"));
        out.push_str(&format!("  {stage:<28} {a:>10.2} {b:>10} {ratio:>8}\n"));
    }
    for (stage, b) in r.b.stages_ms.iter().filter(|(s, _)| !r.a.stages_ms.contains_key(*s)) {
        out.push_str(&format!("  {stage:<28} {:>10} {b:>10.2} {:>8}\n", "-", "-"));
    }
    out.push_str(&format!("  {:<28} {:>10.2} {:>10.2} {:>7.2}x\n", "total", r.a.total_ms, r.b.total_ms, r.b.total_ms / r.a.total_ms.max(1e-9)));
    let g = &r.agreement;
    let fmt_opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    out.push_str(&format!(
        "agreement: {}; samples {} / {}; max rel err {}; SNR {}; log-mel cosine {}\n",
        if g.identical { "identical" } else { "different" },
        r.a.samples,
        r.b.samples,
        fmt_opt(g.max_rel_err.map(|e| format!("{e:.3e}"))),
        fmt_opt(g.snr_db.map(|d| if d.is_infinite() { "inf dB".to_string() } else { format!("{d:.1} dB") })),
        fmt_opt(g.log_mel_cosine.map(|c| format!("{c:.6}"))),
    ));
    for t in &g.tokens {
        let at = |side: &Side, i: usize| side.tokens.get(&t.name).and_then(|v| v.get(i)).map_or("end".to_string(), |v| v.to_string());
        out.push_str(&match t.first_difference {
            None => format!("  {}: identical ({} tokens)\n", t.name, t.a_len),
            Some(i) => format!("  {}: differ from token {i} (A {}, B {}; {} / {} tokens)\n", t.name, at(&r.a, i), at(&r.b, i), t.a_len, t.b_len),
        });
    }
    if let Some(note) = &g.note {
        out.push_str(&format!("  note: {note}\n"));
    }
    out
}

/// Refuses an output path whose directory does not exist (checked before any
/// synthesis runs, so a typo costs nothing).
pub fn check_output_dir(flag: &str, path: &Path) -> Result<(), String> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if dir.is_dir() {
        Ok(())
    } else {
        Err(format!("{flag} {}: directory {} does not exist", path.display(), dir.display()))
    }
}

/// The PNG: both waveforms, their difference, and the stage times side by side.
pub fn plot(r: &CompareReport, path: &Path) -> Result<(), String> {
    use plotters::prelude::*;
    static FONT: std::sync::Once = std::sync::Once::new();
    FONT.call_once(|| {
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular());
    });
    let (w, h) = (1400u32, 1000u32);
    let mut rgb = vec![0u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
        let e = |e: DrawingAreaErrorKind<_>| format!("--plot: {e}");
        root.fill(&WHITE).map_err(e)?;
        let panels = root.split_evenly((3, 1));
        let rate = r.a.sample_rate.max(1) as f64;
        let n = r.a.output.len().max(r.b.output.len()).max(1);
        let envelope = |v: &[f32]| -> Vec<(f64, f64, f64)> {
            let buckets = 1200.min(v.len().max(1));
            let per = v.len().div_ceil(buckets).max(1);
            v.chunks(per)
                .enumerate()
                .map(|(i, c)| {
                    let lo = c.iter().copied().fold(f32::INFINITY, f32::min) as f64;
                    let hi = c.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
                    ((i * per) as f64 / rate, lo, hi)
                })
                .collect()
        };
        let peak = r.a.output.iter().chain(&r.b.output).fold(1e-6f32, |m, v| if v.is_finite() { m.max(v.abs()) } else { m }) as f64;
        let mut chart = ChartBuilder::on(&panels[0])
            .caption("waveforms: A (blue), B (red)", ("sans-serif", 22))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..n as f64 / rate, -peak..peak)
            .map_err(e)?;
        chart.configure_mesh().x_desc("s").draw().map_err(e)?;
        for (series, color) in [(&r.a.output, BLUE.mix(0.6)), (&r.b.output, RED.mix(0.6))] {
            let env = envelope(series);
            chart.draw_series(env.iter().map(|&(t, lo, hi)| PathElement::new(vec![(t, lo), (t, hi)], color))).map_err(e)?;
        }
        let common = r.a.output.len().min(r.b.output.len());
        let diff: Vec<f32> = r.b.output[..common].iter().zip(&r.a.output[..common]).map(|(b, a)| b - a).collect();
        let dpeak = diff.iter().fold(1e-12f32, |m, v| if v.is_finite() { m.max(v.abs()) } else { m }) as f64;
        let mut chart = ChartBuilder::on(&panels[1])
            .caption(format!("difference B - A (peak {dpeak:.3e})"), ("sans-serif", 22))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..n as f64 / rate, -dpeak..dpeak)
            .map_err(e)?;
        chart.configure_mesh().x_desc("s").y_label_formatter(&|v| format!("{v:.1e}")).draw().map_err(e)?;
        let env = envelope(&diff);
        chart.draw_series(env.iter().map(|&(t, lo, hi)| PathElement::new(vec![(t, lo), (t, hi)], BLACK))).map_err(e)?;
        let stages: Vec<&String> = r.a.stages_ms.keys().chain(r.b.stages_ms.keys().filter(|k| !r.a.stages_ms.contains_key(*k))).collect();
        let top = r.a.stages_ms.values().chain(r.b.stages_ms.values()).fold(1e-6f64, |m, v| m.max(*v)) * 1.1;
        let mut chart = ChartBuilder::on(&panels[2])
            .caption("median stage time, ms: A (blue), B (red)", ("sans-serif", 22))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(-0.5..stages.len().max(1) as f64 - 0.5, 0.0..top)
            .map_err(e)?;
        // Stage i's bars straddle x = i, where its tick and name sit.
        let names: Vec<String> = stages.iter().map(|s| s.to_string()).collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(stages.len().max(1))
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() < 1e-6 && i >= 0.0 {
                    names.get(i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_desc("ms")
            .draw()
            .map_err(e)?;
        for (i, stage) in stages.iter().enumerate() {
            let x = i as f64;
            if let Some(v) = r.a.stages_ms.get(*stage) {
                chart.draw_series(std::iter::once(Rectangle::new([(x - 0.4, 0.0), (x, *v)], BLUE.mix(0.7).filled()))).map_err(e)?;
            }
            if let Some(v) = r.b.stages_ms.get(*stage) {
                chart.draw_series(std::iter::once(Rectangle::new([(x, 0.0), (x + 0.4, *v)], RED.mix(0.7).filled()))).map_err(e)?;
            }
        }
        root.present().map_err(e)?;
    }
    let mut png = Vec::new();
    image::codecs::png::PngEncoder::new(&mut png).write_image(&rgb, w, h, image::ExtendedColorType::Rgb8).map_err(|e| format!("--plot: encoding PNG: {e}"))?;
    engine_core::output::write_file(path, &png).map_err(|e| format!("--plot {}: {e}", path.display()))
}

use image::ImageEncoder;
