//! Tables, for the terminal (comfy-table) or as Markdown: one code for the ratio table of a run
//! (its terminal summary and its Markdown file) and of BENCHMARKS.md, and `compare`'s tables.

use comfy_table::{presets, ContentArrangement, Table};

use crate::numbers::axes::Axis;
use crate::util::fmt::fmt_num;

/// Text for a Markdown table cell or list item: `|` escaped, a line break made a space.
pub fn esc(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// A Markdown table's header and rule lines.
pub fn md_head(header: &[&str]) -> String {
    format!(
        "| {} |\n|{}\n",
        header.join(" | "),
        " --- |".repeat(header.len())
    )
}

/// One Markdown table row, each cell through [`esc`].
pub fn md_row<S: AsRef<str>>(cells: &[S]) -> String {
    let cells: Vec<String> = cells.iter().map(|c| esc(c.as_ref())).collect();
    format!("| {} |\n", cells.join(" | "))
}

/// A whole Markdown table.
pub fn markdown<const N: usize>(
    header: [&str; N],
    rows: impl IntoIterator<Item = [String; N]>,
) -> String {
    let mut out = md_head(&header);
    for r in rows {
        out.push_str(&md_row(&r));
    }
    out
}

/// A whole terminal table; `fit` wraps it to the terminal's width (comfy-table's dynamic
/// arrangement), else every cell stays on one line.
pub fn terminal<const N: usize>(
    header: [&str; N],
    rows: impl IntoIterator<Item = [String; N]>,
    fit: bool,
) -> String {
    let mut t = Table::new();
    t.load_preset(presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(if fit {
            ContentArrangement::Dynamic
        } else {
            ContentArrangement::Disabled
        })
        .set_header(header);
    for r in rows {
        t.add_row(r);
    }
    t.to_string()
}

pub const RATIO_HEADER: [&str; 5] = ["axis", "ours", "oracle", "ratio (ours/oracle)", "in words"];

/// A figure with its unit, "(refused)" when a gate withholds it, "-" when there is none.
pub fn cell(x: Option<f64>, unit: &str, refused: bool) -> String {
    match x {
        Some(x) => format!(
            "{} {unit}{}",
            fmt_num(x),
            if refused { " (refused)" } else { "" }
        ),
        None => "-".into(),
    }
}

/// One row of the ratio table: the figures, the ratio, and the words with the axis's note and
/// `suffix` after them.
pub fn ratio_cells(a: &Axis, suffix: &str) -> [String; 5] {
    let note = a
        .note
        .as_ref()
        .map(|n| format!("; {n}"))
        .unwrap_or_default();
    [
        a.axis.clone(),
        cell(a.ours, &a.unit, a.ours_refused),
        cell(a.oracle, &a.unit, a.oracle_refused),
        a.ratio
            .map(|r| format!("{}x", fmt_num(r)))
            .unwrap_or_else(|| "-".into()),
        format!("{}{note}{suffix}", a.words),
    ]
}

/// A run's ratio table for the terminal.
pub fn ratio_terminal(axes: &[Axis]) -> String {
    terminal(RATIO_HEADER, axes.iter().map(|a| ratio_cells(a, "")), true)
}

/// A run's ratio table as Markdown.
pub fn ratio_markdown(axes: &[Axis]) -> String {
    markdown(RATIO_HEADER, axes.iter().map(|a| ratio_cells(a, "")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numbers::axes::{axis, Better};

    #[test]
    fn markdown_marks_refused_cells() {
        let mut a = axis("x".into(), "s", Better::Lower, Some(1.0), Some(2.0));
        a.ours_refused = true;
        let md = ratio_markdown(&[a]);
        assert!(
            md.contains("| x | 1.000 s (refused) | 2.000 s | 0.5000x | ours 2.00x faster |"),
            "{md}"
        );
    }
}
