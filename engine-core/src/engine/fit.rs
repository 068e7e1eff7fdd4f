//! Memory fit: what a model plans to use on the selected device (its plugin's
//! memory plan, ABI 5.6) beside what the device has free, checked before
//! every load so that a model that cannot fit is refused with one line
//! instead of failing mid-synthesis. `tts fit` prints the whole report.

use crate::abi::MemoryPlan;

/// The memory plan of one model on one device, and the budget it is held to.
#[derive(Debug, Clone)]
pub struct FitReport {
    pub family: String,
    pub backend: String,
    pub device: String,
    /// The device's free and total memory now (the host's, for the CPU).
    pub free: u64,
    pub total: u64,
    /// `[backend] memory_budget` (or `--memory-budget`), where set.
    pub configured_budget: Option<u64>,
    /// `None` where the family sizes nothing (or its plugin predates ABI 5.6),
    /// or where sizing failed.
    pub plan: Option<MemoryPlan>,
    /// Why sizing failed (a file the load refuses too).
    pub plan_error: Option<String>,
}

impl FitReport {
    /// The bytes a plan may use: the free memory, or the configured budget
    /// when that is smaller.
    pub fn budget(&self) -> u64 {
        self.configured_budget.map_or(self.free, |b| b.min(self.free))
    }

    /// Whether the plan fits the budget; `None` without a plan.
    pub fn fits(&self) -> Option<bool> {
        self.plan.as_ref().map(|p| p.total() <= self.budget())
    }

    fn budget_words(&self) -> String {
        match self.configured_budget {
            Some(b) if b < self.free => format!("the budget is {} (memory_budget; {} free)", bytes(b), bytes(self.free)),
            _ => format!("{} is free", bytes(self.free)),
        }
    }

    /// One line: the need, its largest items, and the budget.
    pub fn summary(&self) -> String {
        let Some(plan) = &self.plan else {
            return format!("the {} plugin does not size its memory; {} on {}", self.family, self.budget_words(), self.device);
        };
        let mut items: Vec<_> = plan.items.iter().collect();
        items.sort_by_key(|i| std::cmp::Reverse(i.bytes));
        let largest: Vec<String> = items.iter().take(3).map(|i| format!("{} {}", i.what, bytes(i.bytes))).collect();
        let verdict = if self.fits() == Some(true) { "fits" } else { "does not fit" };
        format!(
            "the {} model needs {} on {} ({}), and {}: it {verdict}",
            self.family,
            bytes(plan.total()),
            self.device,
            largest.join(", "),
            self.budget_words()
        )
    }

    /// The refusal a load that does not fit gets, or `None`.
    pub fn refusal(&self) -> Option<String> {
        (self.fits() == Some(false)).then(|| format!("{}; lower the lengths (`--set`), choose another device, or see `tts fit`", self.summary()))
    }

    /// The report as lines for people (`tts fit`).
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!("{} on {} ({}): {} free of {}", self.family, self.device, self.backend, bytes(self.free), bytes(self.total))];
        if let Some(b) = self.configured_budget {
            out.push(format!("memory_budget: {}", bytes(b)));
        }
        match &self.plan {
            None => out.push(format!("the {} plugin does not size its memory (no plan); loads are not checked", self.family)),
            Some(plan) => {
                if !plan.sized_for.is_empty() {
                    out.push(format!("sized for {}", plan.sized_for));
                }
                for item in plan.items.iter() {
                    out.push(format!("  {:<24} {:>12}", item.what.as_str(), bytes(item.bytes)));
                }
                out.push(format!("  {:<24} {:>12}", "total", bytes(plan.total())));
                out.push(self.summary());
            }
        }
        out
    }
}

/// A size for people: bytes below 1 KiB, else KiB, MiB or GiB with one decimal.
pub fn bytes(n: u64) -> String {
    const UNITS: [(&str, f64); 3] = [("GiB", 1073741824.0), ("MiB", 1048576.0), ("KiB", 1024.0)];
    UNITS.iter().find(|(_, scale)| n as f64 >= *scale).map_or(format!("{n} B"), |(unit, scale)| format!("{:.1} {unit}", n as f64 / scale))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::MemoryItem;

    fn report(budget: Option<u64>, items: &[(&str, u64)]) -> FitReport {
        FitReport {
            family: "supertonic".into(),
            backend: "cpu".into(),
            device: "CPU".into(),
            free: 8 << 30,
            total: 16 << 30,
            configured_budget: budget,
            plan: Some(MemoryPlan { items: items.iter().map(|(w, b)| MemoryItem { what: (*w).into(), bytes: *b }).collect(), sized_for: "test".into() }),
            plan_error: None,
        }
    }

    #[test]
    fn a_plan_within_the_free_memory_fits() {
        let r = report(None, &[("weights", 300 << 20), ("vocoder", 1 << 30)]);
        assert_eq!(r.fits(), Some(true));
        assert_eq!(r.refusal(), None);
        assert_eq!(r.summary(), "the supertonic model needs 1.3 GiB on CPU (vocoder 1.0 GiB, weights 300.0 MiB), and 8.0 GiB is free: it fits");
    }

    #[test]
    fn the_smaller_of_budget_and_free_memory_decides() {
        let r = report(Some(1 << 30), &[("weights", 300 << 20), ("vocoder", 1 << 30)]);
        assert_eq!(r.budget(), 1 << 30);
        assert_eq!(
            r.refusal().unwrap(),
            "the supertonic model needs 1.3 GiB on CPU (vocoder 1.0 GiB, weights 300.0 MiB), and the budget is 1.0 GiB (memory_budget; 8.0 GiB free): \
             it does not fit; lower the lengths (`--set`), choose another device, or see `tts fit`"
        );
        // A budget above the free memory does not raise it.
        assert_eq!(report(Some(64 << 30), &[]).budget(), 8 << 30);
    }

    #[test]
    fn no_plan_is_never_refused() {
        let mut r = report(Some(1), &[]);
        r.plan = None;
        assert_eq!(r.fits(), None);
        assert_eq!(r.refusal(), None);
        assert_eq!(r.summary(), "the supertonic plugin does not size its memory; the budget is 1 B (memory_budget; 8.0 GiB free) on CPU");
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
    }
}
