//! `tts options`: the options report as text tables.

use engine_core::engine::{OptionGroup, OptionsReport};
use std::fmt::Write;

pub fn render(report: &OptionsReport) -> String {
    let mut out = String::new();
    let groups = report.model.iter().chain(&report.backends);
    for (i, g) in groups.enumerate() {
        if i > 0 {
            out.push('\n');
        }
        group(&mut out, g);
    }
    if report.model.is_none() {
        out.push_str("\n(no model file in the profile: give --model FILE to see its [synthesis] options)\n");
    }
    out
}

/// One group's table (`tts convert --list` shows converter options so).
pub fn render_group(g: &OptionGroup) -> String {
    let mut out = String::new();
    group(&mut out, g);
    out
}

fn group(out: &mut String, g: &OptionGroup) {
    let _ = writeln!(out, "[{}] ({})", g.section, g.owner);
    let key_w = g.options.iter().map(|o| o.key.len()).max().unwrap_or(0);
    let default_w = g.options.iter().map(|o| o.default.len()).max().unwrap_or(0);
    for o in &g.options {
        let _ = writeln!(out, "  {:<key_w$}  {:<5}  {:<default_w$}  {}", o.key, o.kind, o.default, o.help);
    }
}
