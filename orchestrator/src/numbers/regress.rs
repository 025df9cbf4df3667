//! Did HEAD make us slower than BASE? The verdict on one axis and measure, from the samples of
//! both records: the ratio of medians head/base with a bootstrap interval and a Mann-Whitney U
//! test, against the thresholds; and the comparison `compare` builds from such rows
//! (render/compare.rs draws it). docs/REPORT.md states the rules.

use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;

use crate::numbers::stats;
use crate::util::fmt::fmt_num;

pub const EXIT_OK: i32 = 0;
pub const EXIT_REGRESSED: i32 = 1;
pub const EXIT_ERROR: i32 = 2;

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Thresholds {
    /// The smallest relative change of a median called FASTER or SLOWER (0.03 = 3%).
    pub min_effect: f64,
    /// The Mann-Whitney p-value below which a change is called significant.
    pub alpha: f64,
    /// The bootstrap interval's coverage.
    pub level: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            min_effect: 0.03,
            alpha: 0.05,
            level: 0.95,
        }
    }
}

/// 0.03 -> "3%", 0.015 -> "1.5%": thresholds as a reader states them.
fn pct(x: f64) -> String {
    let s = format!("{:.2}", x * 100.0);
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}%")
}

/// A signed change: 1.1 -> "+10.0%".
fn change_pct(r: f64) -> String {
    format!("{:+.1}%", (r - 1.0) * 100.0)
}

impl fmt::Display for Thresholds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Thresholds: FASTER or SLOWER needs the median to move by at least {} with a Mann-Whitney p below {}; SAME needs the whole {} bootstrap interval of head/base ({} resamples, fixed seed) within {} of no change; anything else is AMBIGUOUS.",
            pct(self.min_effect),
            self.alpha,
            pct(self.level),
            stats::BOOTSTRAP_RESAMPLES,
            pct(self.min_effect)
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Verdict {
    Faster,
    Slower,
    Same,
    Ambiguous,
    /// A gate refused this axis in one of the records: shown, never called faster or slower.
    Ungated,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Faster => "FASTER",
            Verdict::Slower => "SLOWER",
            Verdict::Same => "SAME",
            Verdict::Ambiguous => "AMBIGUOUS",
            Verdict::Ungated => "UNGATED",
        })
    }
}

/// One compared figure of one axis: our absolute samples, or the ratio ours/oracle.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub axis: String,
    /// "ours" or "ours/oracle".
    pub measure: String,
    /// "lower" or "higher": which way is faster.
    pub better: String,
    pub n_base: usize,
    pub n_head: usize,
    pub base_median: Option<f64>,
    pub head_median: Option<f64>,
    /// median(head) / median(base).
    pub change: Option<f64>,
    pub interval: Option<[f64; 2]>,
    pub u: Option<f64>,
    pub p: Option<f64>,
    pub verdict: Verdict,
    /// Why this verdict, as a sentence.
    pub why: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Side {
    pub record: String,
    pub tree: String,
    pub commit: String,
    pub created_utc: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct UnitComparison {
    pub unit: String,
    /// Where the head ran: GPU, driver, oracle (the base's too, unless they differ).
    pub host: String,
    pub base: Side,
    pub head: Side,
    /// What differs between the records' hosts, oracles or unit configurations.
    pub differences: Vec<String>,
    /// Set when the comparison was refused: the sentence naming the differences.
    pub refused: Option<String>,
    /// Notes that travel with the rows (e.g. compared despite different hosts).
    pub notes: Vec<String>,
    pub rows: Vec<Row>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub base: String,
    pub head: String,
    pub thresholds: Thresholds,
    pub units: Vec<UnitComparison>,
    /// Units that only one side has a record for, as sentences.
    pub unpaired: Vec<String>,
    pub exit_status: i32,
}

/// What one row compares: an axis, which way is faster (`lower` or `higher`), and the measure
/// ("ours" or "ours/oracle").
pub struct Subject<'a> {
    pub axis: &'a str,
    pub better: &'a str,
    pub measure: &'a str,
}

/// The row for `what`: judged from the samples, or, when `ungated` says why a gate refused the
/// axis in either record, shown and never called faster or slower.
pub fn judge(
    what: Subject,
    base: &[f64],
    head: &[f64],
    ungated: Option<String>,
    t: &Thresholds,
) -> Row {
    let est = stats::ratio_of_medians(base, head, t.level);
    let mw = stats::mann_whitney(head, base);
    let (verdict, why) = match (ungated, est, mw) {
        (Some(u), _, _) => (
            Verdict::Ungated,
            format!(
                "Not judged, because {u}; the figures are shown, never called faster or slower."
            ),
        ),
        (None, Some((r, lo, hi)), Some(mw)) => decide(r, [lo, hi], mw.p, what.better == "lower", t),
        (None, _, _) => (
            Verdict::Ambiguous,
            format!(
                "There is nothing to compare: base has {} sample(s) and head {}.",
                base.len(),
                head.len()
            ),
        ),
    };
    Row {
        axis: what.axis.into(),
        measure: what.measure.into(),
        better: what.better.into(),
        n_base: base.len(),
        n_head: head.len(),
        base_median: ::stats::median(base),
        head_median: ::stats::median(head),
        change: est.map(|e| e.0),
        interval: est.map(|e| [e.1, e.2]),
        u: mw.map(|m| m.u),
        p: mw.map(|m| m.p),
        verdict,
        why,
    }
}

/// The verdict on a change `r` (head/base) with its interval and p-value, and why.
fn decide(
    r: f64,
    [lo, hi]: [f64; 2],
    p: f64,
    lower_is_faster: bool,
    t: &Thresholds,
) -> (Verdict, String) {
    let big = (r - 1.0).abs() >= t.min_effect;
    let faster = if lower_is_faster { r < 1.0 } else { r > 1.0 };
    if big && p < t.alpha {
        let v = if faster {
            Verdict::Faster
        } else {
            Verdict::Slower
        };
        let why = format!(
            "The median moved by {} (at least {}) and p = {} is below {}.",
            change_pct(r),
            pct(t.min_effect),
            fmt_num(p),
            t.alpha
        );
        return (v, why);
    }
    if lo >= 1.0 - t.min_effect && hi <= 1.0 + t.min_effect {
        let why = format!(
            "The whole interval [{}, {}] lies within {} of no change.",
            fmt_num(lo),
            fmt_num(hi),
            pct(t.min_effect)
        );
        return (Verdict::Same, why);
    }
    let why = if big {
        format!(
            "The median moved by {} but p = {} is not below {}: more samples (a larger battery or more repeats) would decide it.",
            change_pct(r),
            fmt_num(p),
            t.alpha
        )
    } else {
        format!(
            "The median moved by {}, less than {}, but the interval [{}, {}] reaches beyond it, so a change of that size is not ruled out.",
            change_pct(r),
            pct(t.min_effect),
            fmt_num(lo),
            fmt_num(hi)
        )
    };
    (Verdict::Ambiguous, why)
}

/// The engine's samples divided by the oracle's of the same prompt and repeat.
pub fn ratios(engine: &[((usize, u32), f64)], oracle: &[((usize, u32), f64)]) -> Vec<f64> {
    let o: BTreeMap<(usize, u32), f64> = oracle.iter().copied().collect();
    engine
        .iter()
        .filter_map(|(k, e)| o.get(k).filter(|x| **x > 0.0).map(|x| e / x))
        .collect()
}
