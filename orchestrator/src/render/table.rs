//! Tables, for the terminal (comfy-table) or as Markdown: one code for the ratio table of a run
//! (its terminal summary and its Markdown file), the latest table of BENCHMARKS.md and
//! `compare`'s tables.

use comfy_table::{presets, ContentArrangement, Table};

use crate::numbers::axes::Axis;
use crate::record::archive::AxisView;
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

/// One row of the ratio table, from a run's axis or an archived record's.
pub struct RatioRow<'a> {
    pub axis: &'a str,
    pub unit: &'a str,
    pub ours: Option<f64>,
    pub oracle: Option<f64>,
    pub ratio: Option<f64>,
    /// The words, with the axis's note after a semicolon.
    pub words: String,
    pub ours_refused: bool,
    pub oracle_refused: bool,
}

fn with_note(words: &str, note: Option<&String>) -> String {
    match note {
        Some(n) => format!("{words}; {n}"),
        None => words.to_string(),
    }
}

impl<'a> From<&'a Axis> for RatioRow<'a> {
    fn from(a: &'a Axis) -> Self {
        RatioRow {
            axis: &a.axis,
            unit: &a.unit,
            ours: a.ours,
            oracle: a.oracle,
            ratio: a.ratio,
            words: with_note(&a.words, a.note.as_ref()),
            ours_refused: a.ours_refused,
            oracle_refused: a.oracle_refused,
        }
    }
}

impl<'a> From<&'a AxisView> for RatioRow<'a> {
    fn from(a: &'a AxisView) -> Self {
        RatioRow {
            axis: &a.axis,
            unit: &a.unit,
            ours: a.ours,
            oracle: a.oracle,
            ratio: a.ratio,
            words: with_note(&a.words, a.note.as_ref()),
            ours_refused: a.ours_refused,
            oracle_refused: a.oracle_refused,
        }
    }
}

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

impl RatioRow<'_> {
    pub fn cells(&self) -> [String; 5] {
        [
            self.axis.to_string(),
            cell(self.ours, self.unit, self.ours_refused),
            cell(self.oracle, self.unit, self.oracle_refused),
            self.ratio
                .map(|r| format!("{}x", fmt_num(r)))
                .unwrap_or_else(|| "-".into()),
            self.words.clone(),
        ]
    }
}

/// A run's ratio table for the terminal.
pub fn ratio_terminal(axes: &[Axis]) -> String {
    terminal(
        RATIO_HEADER,
        axes.iter().map(|a| RatioRow::from(a).cells()),
        true,
    )
}

/// A run's ratio table as Markdown.
pub fn ratio_markdown(axes: &[Axis]) -> String {
    markdown(RATIO_HEADER, axes.iter().map(|a| RatioRow::from(a).cells()))
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
