//! Milliseconds per synthesis stage, in first-seen order; what `tts bench`
//! prints and `SynthesisOutput::timings` carries.

use crate::abi::StageTiming;
use abi_stable::std_types::RVec;
use std::time::Instant;

#[derive(Debug, Default, Clone)]
pub struct Timings {
    pub entries: Vec<(String, f64)>,
}

impl Timings {
    /// Adds `ms` to `stage` (a stage run once per chunk or step sums).
    pub fn add(&mut self, stage: &str, ms: f64) {
        match self.entries.iter_mut().find(|(s, _)| s == stage) {
            Some((_, v)) => *v += ms,
            None => self.entries.push((stage.to_string(), ms)),
        }
    }

    /// Runs `f`, adding its wall time to `stage`.
    pub fn time<T>(&mut self, stage: &str, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        self.add(stage, start.elapsed().as_secs_f64() * 1e3);
        out
    }

    pub fn get(&self, stage: &str) -> Option<f64> {
        self.entries.iter().find(|(s, _)| s == stage).map(|(_, v)| *v)
    }

    pub fn into_stage_timings(self) -> RVec<StageTiming> {
        self.entries.into_iter().map(|(stage, ms)| StageTiming { stage: stage.into(), ms }).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_stages_sum_in_first_seen_order() {
        let mut t = Timings::default();
        t.add("b", 1.0);
        t.add("a", 2.0);
        t.add("b", 3.0);
        assert_eq!(t.entries, vec![("b".to_string(), 4.0), ("a".to_string(), 2.0)]);
        assert_eq!(t.time("c", || 7), 7);
        assert!(t.get("c").is_some_and(|ms| ms >= 0.0));
    }
}
