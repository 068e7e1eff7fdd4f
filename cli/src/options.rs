//! `tts options`: the options report as text tables.

use engine_core::engine::{OptionGroup, OptionRow, OptionsReport};
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
    // Widths in characters, not bytes: a default may hold non-ASCII text.
    let width = |f: fn(&OptionRow) -> &str| g.options.iter().map(|o| f(o).chars().count()).max().unwrap_or(0);
    let (key_w, kind_w, default_w) = (width(|o| &o.key), width(|o| o.kind), width(|o| &o.default));
    for o in &g.options {
        let line = format!("  {:<key_w$}  {:<kind_w$}  {:<default_w$}  {}", o.key, o.kind, o.default, o.help);
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, kind: &'static str, default: &str, help: &str) -> OptionRow {
        OptionRow { key: key.into(), kind, default: default.into(), help: help.into() }
    }

    /// Every column starts at the same character in every row, whatever the
    /// widths of the kinds ("integer" is wider than "float") and of a
    /// non-ASCII default.
    #[test]
    fn columns_line_up_for_every_kind_and_default() {
        let g = OptionGroup {
            section: "[synthesis]".into(),
            owner: "test".into(),
            options: vec![
                row("steps", "integer", "5", "denoising steps"),
                row("speed", "float", "1.05", "speaking rate"),
                row("voice", "string", "\"É1\"", "built-in voice"),
                row("fast", "bool", "false", ""),
            ],
        };
        let text = render_group(&g);
        let rows: Vec<&str> = text.lines().skip(1).collect();
        let help_at = |line: &str, help: &str| line.chars().count() - help.chars().count();
        assert_eq!(help_at(rows[0], "denoising steps"), help_at(rows[1], "speaking rate"), "{text}");
        assert_eq!(help_at(rows[1], "speaking rate"), help_at(rows[2], "built-in voice"), "{text}");
        let default_at = |line: &str, default: &str| line.chars().collect::<String>().find(default).map(|b| line[..b].chars().count());
        assert_eq!(default_at(rows[0], "5 "), default_at(rows[1], "1.05"), "{text}");
        assert!(rows.iter().all(|r| !r.ends_with(' ')), "no trailing blanks: {text:?}");
    }
}
