//! `compare`'s output: per unit a table of rows (axis, measure, medians, change with its
//! interval, p, verdict) for the terminal or as Markdown, each row's reason, and the sentence
//! that explains the exit status.

use crate::numbers::regress::{Comparison, Row, UnitComparison, EXIT_OK, EXIT_REGRESSED};
use crate::render::table;
use crate::util::fmt::fmt_num;

const HEADER: [&str; 7] = [
    "axis",
    "measure",
    "base (median)",
    "head (median)",
    "head/base [interval]",
    "p (Mann-Whitney)",
    "verdict",
];

fn cells(r: &Row) -> [String; 7] {
    let opt = |x: Option<f64>| x.map(fmt_num).unwrap_or_else(|| "-".into());
    let change = match (r.change, r.interval) {
        (Some(c), Some([lo, hi])) => format!("{} [{}, {}]", fmt_num(c), fmt_num(lo), fmt_num(hi)),
        _ => "-".into(),
    };
    [
        r.axis.clone(),
        r.measure.clone(),
        format!("{} (n={})", opt(r.base_median), r.n_base),
        format!("{} (n={})", opt(r.head_median), r.n_head),
        change,
        opt(r.p),
        r.verdict.to_string(),
    ]
}

fn exit_sentence(c: &Comparison) -> String {
    match c.exit_status {
        EXIT_OK => "Exit 0: nothing gated regressed.".into(),
        EXIT_REGRESSED => "Exit 1: a gated figure is SLOWER.".into(),
        _ => "Exit 2: at least one unit could not be compared.".into(),
    }
}

fn heading(u: &UnitComparison) -> String {
    let short = |s: &str| s[..s.len().min(8)].to_string();
    format!(
        "{}: base tree {} ({}) vs head tree {} ({}); {}",
        u.unit,
        short(&u.base.tree),
        u.base.record,
        short(&u.head.tree),
        u.head.record,
        u.host
    )
}

/// The comparison for the terminal.
pub fn terminal(c: &Comparison) -> String {
    render(c, false)
}

/// The comparison as Markdown.
pub fn markdown(c: &Comparison) -> String {
    render(c, true)
}

fn render(c: &Comparison, md: bool) -> String {
    let mut s = if md {
        format!("# compare {} -> {}\n\n{}\n", c.base, c.head, c.thresholds)
    } else {
        format!("compare {} -> {}\n{}\n", c.base, c.head, c.thresholds)
    };
    for u in &c.units {
        s.push_str(&if md {
            format!("\n## {}\n\n", heading(u))
        } else {
            format!("\n{}\n", heading(u))
        });
        if let Some(r) = &u.refused {
            s.push_str(&format!("{r}\n"));
            continue;
        }
        let rows = u.rows.iter().map(cells);
        if md {
            s.push_str(&table::markdown(HEADER, rows));
        } else {
            s.push_str(&table::terminal(HEADER, rows, false));
        }
        s.push('\n');
        for n in &u.notes {
            s.push_str(&format!("{n}\n{}", if md { "\n" } else { "" }));
        }
        push_verdicts(&mut s, u);
    }
    push_footer(&mut s, c);
    s
}

/// One line per row: its axis, measure, verdict and why (both formats).
fn push_verdicts(s: &mut String, u: &UnitComparison) {
    for r in &u.rows {
        s.push_str(&format!(
            "- {}, {}: {} {}\n",
            r.axis, r.measure, r.verdict, r.why
        ));
    }
}

/// The records that had no partner, then the sentence that explains the exit status.
fn push_footer(s: &mut String, c: &Comparison) {
    for p in &c.unpaired {
        s.push_str(&format!("\n{p}\n"));
    }
    s.push_str(&format!("\n{}\n", exit_sentence(c)));
}
