//! `tts soak`: the same synthesis many times in one process, to show that a
//! model and backend neither drift nor leak: every output must be bit-identical
//! to the first, and resident memory must not grow past a limit after warm-up.

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
    pub seconds: f64,
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
    let mut rss_after_warmup = rss_mib();
    for i in 2..=runs {
        let out = session.synthesize(text).map_err(|e| e.to_string())?;
        if first_difference.is_none() && (out.samples.len() != bits.len() || out.samples.iter().zip(&bits).any(|(s, b)| s.to_bits() != *b)) {
            first_difference = Some(i);
        }
        if i == warmup {
            rss_after_warmup = rss_mib();
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
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The report's verdict against a growth limit: `Err` names what failed.
pub fn verdict(r: &SoakReport, max_growth_mib: f64) -> Result<(), String> {
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
    format!(
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
    )
}
