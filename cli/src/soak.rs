//! `tts soak`: the same synthesis many times in one process, to show that a
//! model and backend neither drift nor leak: every output must be bit-identical
//! to the first, and resident memory must not grow past a limit after warm-up.
//! Each stage's time drift and the device's memory are reported beside it.

use crate::bench::SessionInfo;
use engine_core::engine::ModelSession;
use serde::Serialize;

#[derive(Serialize)]
pub struct SoakReport {
    #[serde(flatten)]
    pub session: SessionInfo,
    pub runs: usize,
    /// Runs before the resident-memory baseline is taken (caches, graphs, pools).
    pub warmup: usize,
    pub samples: usize,
    pub sample_rate: u32,
    /// Every run's samples equal the first run's, bit for bit.
    pub identical: bool,
    /// The first run (1-based) whose output differed.
    pub first_difference: Option<usize>,
    pub rss_after_warmup_mib: f64,
    pub rss_end_mib: f64,
    pub rss_growth_mib: f64,
    pub peak_rss_mib: f64,
    /// Device memory in use after warm-up and at the end (free memory's
    /// change, so other processes on the device show here too).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_used_after_warmup_mib: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_used_end_mib: Option<f64>,
    /// Per stage: median time of the first and last tenth of the runs after
    /// warm-up (at least 3 runs each) and the relative change.
    pub stage_drift: Vec<StageDrift>,
    pub seconds: f64,
}

#[derive(Serialize)]
pub struct StageDrift {
    pub stage: String,
    pub first_ms: f64,
    pub last_ms: f64,
    pub drift_pct: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Each stage's drift over `runs` (each a list of stage timings), first
/// window against last; stages summed where a run reports one several times.
fn stage_drift(runs: &[Vec<(String, f64)>]) -> Vec<StageDrift> {
    let window = (runs.len() / 10).max(3).min(runs.len() / 2);
    if window == 0 {
        return Vec::new();
    }
    let mut stages: Vec<String> = Vec::new();
    for (name, _) in runs.iter().flatten() {
        if !stages.contains(name) {
            stages.push(name.clone());
        }
    }
    let total = |run: &Vec<(String, f64)>, stage: &str| run.iter().filter(|(n, _)| n == stage).map(|(_, ms)| ms).sum::<f64>();
    stages
        .into_iter()
        .map(|stage| {
            let first_ms = median(runs[..window].iter().map(|r| total(r, &stage)).collect());
            let last_ms = median(runs[runs.len() - window..].iter().map(|r| total(r, &stage)).collect());
            let drift_pct = if first_ms > 0.0 { (last_ms / first_ms - 1.0) * 100.0 } else { 0.0 };
            StageDrift { stage, first_ms, last_ms, drift_pct }
        })
        .collect()
}

/// Resident set size of this process now, MiB.
pub fn rss_mib() -> f64 {
    crate::bench::status_mib("VmRSS")
}

pub fn run(session: &mut ModelSession, text: &str, runs: usize, warmup: usize) -> Result<SoakReport, String> {
    if runs < 2 || warmup >= runs {
        return Err(format!("--runs must be at least 2 and more than --warmup ({warmup}), got {runs}"));
    }
    let start = std::time::Instant::now();
    let first = session.synthesize(text).map_err(|e| e.to_string())?;
    let bits: Vec<u32> = first.samples.iter().map(|s| s.to_bits()).collect();
    let mut first_difference = None;
    let device_used = |s: &ModelSession| s.device_memory().map(|(free, total)| (total - free) as f64 / (1024.0 * 1024.0));
    let mut rss_after_warmup = rss_mib();
    let mut device_after_warmup = device_used(session);
    let mut timings = Vec::new();
    for i in 2..=runs {
        let out = session.synthesize(text).map_err(|e| e.to_string())?;
        if first_difference.is_none() && (out.samples.len() != bits.len() || out.samples.iter().zip(&bits).any(|(s, b)| s.to_bits() != *b)) {
            first_difference = Some(i);
        }
        if i == warmup {
            rss_after_warmup = rss_mib();
            device_after_warmup = device_used(session);
        }
        if i > warmup {
            timings.push(out.timings.iter().map(|t| (t.stage.to_string(), t.ms)).collect::<Vec<_>>());
        }
    }
    let rss_end = rss_mib();
    Ok(SoakReport {
        session: SessionInfo::of(session),
        runs,
        warmup,
        samples: bits.len(),
        sample_rate: first.sample_rate,
        identical: first_difference.is_none(),
        first_difference,
        rss_after_warmup_mib: rss_after_warmup,
        rss_end_mib: rss_end,
        rss_growth_mib: rss_end - rss_after_warmup,
        peak_rss_mib: crate::bench::peak_rss_mib(),
        device_used_after_warmup_mib: device_after_warmup,
        device_used_end_mib: device_used(session),
        stage_drift: stage_drift(&timings),
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// `--max-rss-growth-mib` must be a finite number >= 0: a NaN limit compares
/// false with every growth, so `nan` passed any soak; `inf` and a negative
/// limit mean nothing either.
pub fn check_limit(max_growth_mib: f64) -> Result<(), String> {
    if !max_growth_mib.is_finite() || max_growth_mib < 0.0 {
        return Err(format!("--max-rss-growth-mib {max_growth_mib}: give a finite number of MiB >= 0"));
    }
    Ok(())
}

/// The report's verdict against a growth limit: `Err` names what failed.
pub fn verdict(r: &SoakReport, max_growth_mib: f64) -> Result<(), String> {
    check_limit(max_growth_mib)?;
    if let Some(i) = r.first_difference {
        return Err(format!("soak: run {i} of {} differs from run 1 ({} {} on {})", r.runs, r.session.family, r.session.variant, r.session.device));
    }
    if r.rss_growth_mib > max_growth_mib {
        return Err(format!(
            "soak: resident memory grew {:.1} MiB after {} warm-up runs (limit {max_growth_mib} MiB; {} {} on {})",
            r.rss_growth_mib, r.warmup, r.session.family, r.session.variant, r.session.device
        ));
    }
    Ok(())
}

pub fn render(r: &SoakReport) -> String {
    let mut s = format!(
        "{} {} on {} ({}): {} runs in {:.1} s, {} samples each, {}; RSS {:.1} MiB after {} warm-up runs, {:.1} MiB at the end (growth {:+.2} MiB), peak {:.1} MiB\n",
        r.session.family,
        r.session.variant,
        r.session.device,
        r.session.backend,
        r.runs,
        r.seconds,
        r.samples,
        if r.identical { "all bit-identical".to_string() } else { format!("run {} differs", r.first_difference.unwrap_or(0)) },
        r.rss_after_warmup_mib,
        r.warmup,
        r.rss_end_mib,
        r.rss_growth_mib,
        r.peak_rss_mib
    );
    if let (Some(a), Some(b)) = (r.device_used_after_warmup_mib, r.device_used_end_mib) {
        s += &format!("  device memory in use: {a:.1} MiB after warm-up, {b:.1} MiB at the end ({:+.1} MiB)\n", b - a);
    }
    for d in &r.stage_drift {
        s += &format!("  {:<24} {:>9.2} ms first, {:>9.2} ms last ({:+.1} %)\n", d.stage, d.first_ms, d.last_ms, d.drift_pct);
    }
    s
}
