//! `tts bench`: repeated synthesis of one text (or cloning of one reference
//! recording) on one loaded model; per-stage medians as the model plugin
//! reports them, time to first audio (synthesis streams), real-time factor
//! and peak RSS.

use engine_core::engine::ModelSession;
use indexmap::IndexMap;
use serde::Serialize;
use std::path::Path;
use std::time::Instant;

/// What each run does.
pub enum Work<'a> {
    /// One-shot synthesis of a text (what the model's `synthesize` does).
    Synthesize(&'a str),
    /// Streaming synthesis: also the time to the first piece of audio.
    Stream(&'a str),
    /// Clone the voice of a recording (the voice is not written).
    CloneVoice(&'a Path),
}

/// What a report is about: the loaded model and the device it runs on.
#[derive(Serialize)]
pub struct SessionInfo {
    pub backend: String,
    pub device: String,
    pub family: String,
    pub variant: String,
}

impl SessionInfo {
    pub fn of(session: &ModelSession) -> Self {
        SessionInfo {
            backend: session.backend.clone(),
            device: session.device.clone(),
            family: session.info.family.to_string(),
            variant: session.info.variant.to_string(),
        }
    }
}

#[derive(Serialize)]
pub struct BenchReport {
    #[serde(flatten)]
    pub session: SessionInfo,
    pub runs: usize,
    pub warmup: usize,
    /// `synthesize` or `clone_voice`.
    pub work: &'static str,
    /// Audio produced per run (0 when cloning).
    pub audio_seconds: f64,
    /// Median ms per stage (stages repeated within one run, e.g. per chunk, are summed).
    pub stages_ms: IndexMap<String, f64>,
    pub total_ms: f64,
    /// Median ms from the request to the first streamed piece of audio (synthesis only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_audio_ms: Option<f64>,
    /// Pieces the audio arrived in (synthesis only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pieces: Option<u32>,
    /// total / audio duration (below 1 is faster than real time).
    pub rtf: f64,
    pub load_ms: f64,
    pub peak_rss_mib: f64,
}

/// Median of `v` (mean of the middle two for an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A memory figure of this process from Linux's `/proc/self/status` (`VmHWM`,
/// `VmRSS`, ...), MiB; 0 where there is none.
pub fn status_mib(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':')?.split_whitespace().next()?.parse::<f64>().ok()))
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Peak resident set size of this process, MiB.
pub fn peak_rss_mib() -> f64 {
    status_mib("VmHWM")
}

pub fn run(session: &mut ModelSession, work: Work, runs: usize, warmup: usize, load_ms: f64) -> Result<BenchReport, String> {
    if runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    let mut per_stage: IndexMap<String, Vec<f64>> = IndexMap::new();
    let mut totals = Vec::new();
    let (mut first_audio, mut pieces) = (Vec::new(), None);
    let mut audio_seconds = 0.0;
    for i in 0..warmup + runs {
        let start = Instant::now();
        let timings = match work {
            Work::Synthesize(text) => {
                let output = session.synthesize(text).map_err(|e| e.to_string())?;
                audio_seconds = output.samples.len() as f64 / output.sample_rate.max(1) as f64;
                output.timings
            }
            Work::Stream(text) => {
                let mut first = None;
                let summary = session
                    .synthesize_streaming(text, |_, _| {
                        first.get_or_insert_with(|| start.elapsed().as_secs_f64() * 1e3);
                        Ok(true)
                    })
                    .map_err(|e| e.to_string())?;
                audio_seconds = summary.samples as f64 / summary.sample_rate.max(1) as f64;
                if i >= warmup {
                    first_audio.extend(first);
                }
                pieces = Some(summary.pieces);
                summary.timings
            }
            Work::CloneVoice(reference) => session.clone_voice(reference).map_err(|e| e.to_string())?.timings,
        };
        let total = start.elapsed().as_secs_f64() * 1e3;
        if i < warmup {
            continue;
        }
        let mut this_run: IndexMap<String, f64> = IndexMap::new();
        for t in timings.iter() {
            *this_run.entry(t.stage.to_string()).or_default() += t.ms;
        }
        for (stage, ms) in this_run {
            per_stage.entry(stage).or_default().push(ms);
        }
        totals.push(total);
    }
    let total_ms = median(totals);
    Ok(BenchReport {
        session: SessionInfo::of(session),
        runs,
        warmup,
        work: match work {
            Work::Synthesize(_) => "synthesize",
            Work::Stream(_) => "stream",
            Work::CloneVoice(_) => "clone_voice",
        },
        audio_seconds,
        stages_ms: per_stage.into_iter().map(|(k, v)| (k, median(v))).collect(),
        total_ms,
        first_audio_ms: (!first_audio.is_empty()).then(|| median(first_audio)),
        pieces,
        rtf: if audio_seconds > 0.0 { total_ms / 1e3 / audio_seconds } else { 0.0 },
        load_ms,
        peak_rss_mib: peak_rss_mib(),
    })
}

pub fn render(r: &BenchReport) -> String {
    let mut s =
        format!("{} {} on {} ({}), {} runs after {} warm-up\n", r.session.family, r.session.variant, r.session.device, r.session.backend, r.runs, r.warmup);
    for (stage, ms) in &r.stages_ms {
        s += &format!("  {stage:<28} {ms:>10.2} ms\n");
    }
    s += &format!("  {:<28} {:>10.2} ms\n", "total", r.total_ms);
    if let (Some(ms), Some(pieces)) = (r.first_audio_ms, r.pieces) {
        s += &format!("  {:<28} {:>10.2} ms ({pieces} pieces)\n", "first audio", ms);
    }
    if r.work == "clone_voice" {
        s += &format!("  voice cloning, load {:.0} ms, peak RSS {:.1} MiB\n", r.load_ms, r.peak_rss_mib);
    } else {
        s += &format!("  audio {:.2} s, RTF {:.4}, load {:.0} ms, peak RSS {:.1} MiB\n", r.audio_seconds, r.rtf, r.load_ms, r.peak_rss_mib);
    }
    s
}
