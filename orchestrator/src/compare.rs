//! `orchestrator compare BASE HEAD`: did HEAD make us slower? Per unit and per timing axis, from
//! the per-prompt samples of both records: the ratio of medians head/base with a bootstrap
//! interval, a Mann-Whitney U test, and a verdict. Our absolute figures and the ratio
//! ours/oracle are compared separately: the ratio is the signal that survives a change of
//! machine, the absolute figure the one a user feels. docs/REPORT.md states the rules.

use comfy_table::{presets, ContentArrangement, Table};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::numbers::stats;
use crate::record::archive::{self, AxisView, RecordView, SampleView, Stored, TimingsView};
use crate::render::table::{md_head, md_row};
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

/// Which records a side of the comparison names.
#[derive(Debug, Clone, PartialEq)]
pub enum Spec {
    /// One record file.
    Path(PathBuf),
    /// Per unit, its latest record.
    Latest,
    /// Per unit, the latest record of the tree that ran before the latest record's tree.
    Previous,
    /// Per unit, the latest record of the tree whose hash starts with this.
    Tree(String),
}

impl Spec {
    pub fn parse(s: &str) -> Spec {
        match s {
            "latest" => Spec::Latest,
            "previous" => Spec::Previous,
            _ if !s.is_empty()
                && s.chars().all(|c| c.is_ascii_hexdigit())
                && !Path::new(s).exists() =>
            {
                Spec::Tree(s.to_ascii_lowercase())
            }
            _ => Spec::Path(PathBuf::from(s)),
        }
    }
}

impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Spec::Path(p) => write!(f, "{}", p.display()),
            Spec::Latest => write!(f, "latest"),
            Spec::Previous => write!(f, "previous"),
            Spec::Tree(t) => write!(f, "tree {t}"),
        }
    }
}

/// The records `spec` names, by unit.
pub fn resolve(spec: &Spec, records: &[Stored]) -> Result<BTreeMap<String, Stored>, String> {
    let groups = archive::by_unit(records);
    let mut out = BTreeMap::new();
    match spec {
        Spec::Path(p) => {
            let root = p.parent().unwrap_or(Path::new(""));
            let s = archive::load_file(p, root).map_err(|r| {
                format!(
                    "{} was not read: {}",
                    p.display(),
                    r.why.trim_end_matches('.')
                )
            })?;
            out.insert(s.rec.unit.name.clone(), s);
        }
        Spec::Latest => {
            for (u, rs) in &groups {
                out.insert(
                    u.clone(),
                    (*rs.last().expect("groups are never empty")).clone(),
                );
            }
        }
        Spec::Previous => {
            for (u, rs) in &groups {
                let latest = &rs.last().expect("groups are never empty").rec.project.tree;
                if let Some(r) = rs.iter().rev().find(|r| &r.rec.project.tree != latest) {
                    out.insert(u.clone(), (*r).clone());
                }
            }
        }
        Spec::Tree(prefix) => {
            let trees: std::collections::BTreeSet<&str> = records
                .iter()
                .map(|r| r.rec.project.tree.as_str())
                .filter(|t| t.starts_with(prefix.as_str()))
                .collect();
            if trees.len() > 1 {
                return Err(format!(
                    "the tree prefix {prefix} names {} trees ({}); give more digits.",
                    trees.len(),
                    trees.into_iter().collect::<Vec<_>>().join(", ")
                ));
            }
            for (u, rs) in &groups {
                if let Some(r) = rs
                    .iter()
                    .rev()
                    .find(|r| r.rec.project.tree.starts_with(prefix.as_str()))
                {
                    out.insert(u.clone(), (*r).clone());
                }
            }
        }
    }
    if out.is_empty() {
        return Err(format!("{spec} names no record in the records directory."));
    }
    Ok(out)
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

impl Side {
    fn of(s: &Stored) -> Side {
        Side {
            record: s.name.clone(),
            tree: s.rec.project.tree.clone(),
            commit: s.rec.project.commit.clone(),
            created_utc: s.rec.created_utc.clone(),
        }
    }
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

/// `path.to.key` -> value, for naming the keys in which two unit configurations differ.
fn flatten(prefix: &str, v: &Value, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&p, x, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.clone());
        }
    }
}

/// Unit keys that cannot change what is measured: where the lock lives, how long a phase may
/// run before the watchdog, the free-text description.
const CONFIG_KEYS_IGNORED: [&str; 3] = ["lease", "watchdog", "description"];

fn show(v: Option<&Value>) -> String {
    match v {
        None => "absent".into(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    }
}

/// Everything that makes two records not like-for-like, one phrase each.
pub fn differences(base: &RecordView, head: &RecordView) -> Vec<String> {
    let mut d = vec![];
    let mut pair = |what: &str, b: String, h: String| {
        if b != h {
            d.push(format!("{what} (base {b}, head {h})"));
        }
    };
    pair("GPU", base.device_name(), head.device_name());
    pair("driver", base.driver(), head.driver());
    pair("oracle", base.oracle_name(), head.oracle_name());
    let (vb, vh) = (base.oracle_versions(), head.oracle_versions());
    let keys: std::collections::BTreeSet<&String> = vb.keys().chain(vh.keys()).collect();
    for k in keys {
        let s = |m: &BTreeMap<String, String>| m.get(k).cloned().unwrap_or_else(|| "absent".into());
        pair(&format!("oracle version of {k}"), s(&vb), s(&vh));
    }
    let (mut cb, mut ch) = (BTreeMap::new(), BTreeMap::new());
    flatten("", &base.unit.config, &mut cb);
    flatten("", &head.unit.config, &mut ch);
    let keys: std::collections::BTreeSet<&String> = cb.keys().chain(ch.keys()).collect();
    for k in keys {
        if CONFIG_KEYS_IGNORED
            .iter()
            .any(|i| k == i || k.starts_with(&format!("{i}.")))
        {
            continue;
        }
        if cb.get(k) != ch.get(k) {
            d.push(format!(
                "unit configuration key {k} (base {}, head {})",
                show(cb.get(k)),
                show(ch.get(k))
            ));
        }
    }
    d
}

/// A timing axis with per-prompt (or per-repeat) samples, keyed so that the engine's and the
/// oracle's samples of the same prompt and repeat can be paired into a ratio.
/// Samples keyed by (prompt, repeat); throughput has one figure per repeat, prompt 0.
type Keyed = Vec<((usize, u32), f64)>;

struct Measured {
    /// The axis name as the record's table spells it (its prefix, for "per output token").
    name: String,
    better: &'static str,
    pick: Box<dyn Fn(&TimingsView) -> Keyed>,
}

fn keyed(v: &[SampleView]) -> Keyed {
    v.iter().map(|s| ((s.prompt, s.pass), s.s)).collect()
}

fn measured_axes(base: &RecordView, head: &RecordView) -> Vec<Measured> {
    let mut v = vec![
        Measured {
            name: "per output token".into(),
            better: "lower",
            pick: Box::new(|t| keyed(&t.per_token_s)),
        },
        Measured {
            name: "time to first token".into(),
            better: "lower",
            pick: Box::new(|t| keyed(&t.ttft_s)),
        },
    ];
    let mut batches: Vec<u32> = [base, head]
        .iter()
        .flat_map(|r| [&r.timings.engine, &r.timings.oracle])
        .flat_map(|t| t.throughput_tok_s.keys())
        .filter_map(|k| k.parse().ok())
        .collect();
    batches.sort_unstable();
    batches.dedup();
    for b in batches {
        v.push(Measured {
            name: format!("output throughput, batch {b}"),
            better: "higher",
            pick: Box::new(move |t| {
                t.throughput_tok_s
                    .get(&b.to_string())
                    .map(|xs| {
                        xs.iter()
                            .enumerate()
                            .map(|(i, x)| ((0, i as u32), *x))
                            .collect()
                    })
                    .unwrap_or_default()
            }),
        });
    }
    v
}

/// The record's own table entry for this axis, or a stand-in with the axis's kind when the
/// record has none (so that the gates can still be asked about it).
fn axis_view(rec: &RecordView, m: &Measured) -> AxisView {
    rec.axes
        .iter()
        .find(|a| a.axis == m.name || a.axis.starts_with(&format!("{} ", m.name)))
        .cloned()
        .unwrap_or_else(|| AxisView {
            axis: m.name.clone(),
            unit: String::new(),
            better: m.better.into(),
            ours: None,
            oracle: None,
            ratio: None,
            words: String::new(),
            ours_refused: false,
            oracle_refused: false,
            note: None,
        })
}

/// Why `rec` does not gate this axis for this measure, as a phrase; None when it does.
fn ungated_because(rec: &RecordView, axis: &AxisView, engine_only: bool) -> Option<String> {
    if rec.gated(axis, engine_only) {
        return None;
    }
    let who: Vec<String> = rec
        .refusals_for(axis, engine_only)
        .iter()
        .map(|g| g.who())
        .collect();
    Some(if who.is_empty() {
        "its table marks these figures refused".into()
    } else {
        format!("{} refused", who.join(" and "))
    })
}

fn judge(
    m: &Measured,
    measure: &str,
    base: &[f64],
    head: &[f64],
    ungated: Option<String>,
    t: &Thresholds,
) -> Row {
    let est = stats::ratio_of_medians(base, head, t.level);
    let mw = stats::mann_whitney(head, base);
    let (verdict, why) = if let Some(u) = ungated {
        (
            Verdict::Ungated,
            format!(
                "Not judged, because {u}; the figures are shown, never called faster or slower."
            ),
        )
    } else {
        match (est, mw) {
            (Some((r, lo, hi)), Some(mw)) => {
                let big = (r - 1.0).abs() >= t.min_effect;
                let better = if m.better == "lower" {
                    r < 1.0
                } else {
                    r > 1.0
                };
                if big && mw.p < t.alpha {
                    let v = if better {
                        Verdict::Faster
                    } else {
                        Verdict::Slower
                    };
                    (
                        v,
                        format!(
                            "The median moved by {} (at least {}) and p = {} is below {}.",
                            change_pct(r),
                            pct(t.min_effect),
                            fmt_num(mw.p),
                            t.alpha
                        ),
                    )
                } else if lo >= 1.0 - t.min_effect && hi <= 1.0 + t.min_effect {
                    (
                        Verdict::Same,
                        format!(
                            "The whole interval [{}, {}] lies within {} of no change.",
                            fmt_num(lo),
                            fmt_num(hi),
                            pct(t.min_effect)
                        ),
                    )
                } else if big {
                    (
                        Verdict::Ambiguous,
                        format!(
                            "The median moved by {} but p = {} is not below {}: more samples (a larger battery or more repeats) would decide it.",
                            change_pct(r),
                            fmt_num(mw.p),
                            t.alpha
                        ),
                    )
                } else {
                    (
                        Verdict::Ambiguous,
                        format!(
                            "The median moved by {}, less than {}, but the interval [{}, {}] reaches beyond it, so a change of that size is not ruled out.",
                            change_pct(r),
                            pct(t.min_effect),
                            fmt_num(lo),
                            fmt_num(hi)
                        ),
                    )
                }
            }
            _ => (
                Verdict::Ambiguous,
                format!(
                    "There is nothing to compare: base has {} sample(s) and head {}.",
                    base.len(),
                    head.len()
                ),
            ),
        }
    };
    Row {
        axis: m.name.clone(),
        measure: measure.into(),
        better: m.better.into(),
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

/// The engine's samples divided by the oracle's of the same prompt and repeat.
fn ratios(engine: &[((usize, u32), f64)], oracle: &[((usize, u32), f64)]) -> Vec<f64> {
    let o: BTreeMap<(usize, u32), f64> = oracle.iter().copied().collect();
    engine
        .iter()
        .filter_map(|(k, e)| o.get(k).filter(|x| **x > 0.0).map(|x| e / x))
        .collect()
}

pub fn compare_unit(
    base: &Stored,
    head: &Stored,
    t: &Thresholds,
    allow_different_hosts: bool,
) -> UnitComparison {
    let (b, h) = (&base.rec, &head.rec);
    let diffs = differences(b, h);
    let mut out = UnitComparison {
        unit: b.unit.name.clone(),
        host: format!(
            "GPU {}, driver {}, oracle {}",
            h.device_name(),
            h.driver(),
            h.oracle_label()
        ),
        base: Side::of(base),
        head: Side::of(head),
        differences: diffs.clone(),
        refused: None,
        notes: vec![],
        rows: vec![],
    };
    if !diffs.is_empty() {
        if !allow_different_hosts {
            out.refused = Some(format!(
                "Unit {} was not compared, because its records are not like-for-like: they differ in {}. Pass --allow-different-hosts to compare them anyway.",
                out.unit,
                diffs.join("; ")
            ));
            return out;
        }
        out.notes.push(format!(
            "The records differ in {}; they are compared because --allow-different-hosts was given, so read the ours/oracle rows first: the ratio is the signal that survives a change of machine.",
            diffs.join("; ")
        ));
    }
    for m in measured_axes(b, h) {
        let (ab, ah) = (axis_view(b, &m), axis_view(h, &m));
        let (eb, eh) = ((m.pick)(&b.timings.engine), (m.pick)(&h.timings.engine));
        let (ob, oh) = ((m.pick)(&b.timings.oracle), (m.pick)(&h.timings.oracle));
        if eb.is_empty() && eh.is_empty() {
            continue;
        }
        let why = |engine_only: bool| {
            let parts: Vec<String> = [("the base record", b, &ab), ("the head record", h, &ah)]
                .iter()
                .filter_map(|(side, r, a)| {
                    ungated_because(r, a, engine_only).map(|w| format!("in {side} {w}"))
                })
                .collect();
            (!parts.is_empty()).then(|| parts.join(", and "))
        };
        let vals = |x: &[((usize, u32), f64)]| x.iter().map(|p| p.1).collect::<Vec<_>>();
        out.rows
            .push(judge(&m, "ours", &vals(&eb), &vals(&eh), why(true), t));
        out.rows.push(judge(
            &m,
            "ours/oracle",
            &ratios(&eb, &ob),
            &ratios(&eh, &oh),
            why(false),
            t,
        ));
    }
    out
}

pub fn compare(
    base_spec: &Spec,
    head_spec: &Spec,
    records: &[Stored],
    t: &Thresholds,
    allow_different_hosts: bool,
) -> Result<Comparison, String> {
    let base = resolve(base_spec, records).map_err(|e| format!("BASE: {e}"))?;
    let head = resolve(head_spec, records).map_err(|e| format!("HEAD: {e}"))?;
    let mut units = vec![];
    let mut unpaired = vec![];
    // A record file names one unit on purpose: the other side's other units are not news.
    let (base_one, head_one) = (
        matches!(base_spec, Spec::Path(_)),
        matches!(head_spec, Spec::Path(_)),
    );
    for (u, b) in &base {
        match head.get(u) {
            Some(h) => units.push(compare_unit(b, h, t, allow_different_hosts)),
            None if head_one => {}
            None => unpaired.push(format!(
                "Unit {u} has a record in BASE ({}) and none in HEAD, so it is not compared.",
                b.name
            )),
        }
    }
    for (u, h) in &head {
        if !base_one && !base.contains_key(u) {
            unpaired.push(format!(
                "Unit {u} has a record in HEAD ({}) and none in BASE, so it is not compared.",
                h.name
            ));
        }
    }
    if units.is_empty() {
        return Err(format!(
            "BASE ({base_spec}) and HEAD ({head_spec}) share no unit, so there is nothing to compare."
        ));
    }
    let regressed = units
        .iter()
        .flat_map(|u| &u.rows)
        .any(|r| r.verdict == Verdict::Slower);
    // A refused pair leaves the question unanswered for that unit: an error, not a pass.
    let exit_status = if units.iter().any(|u| u.refused.is_some()) {
        EXIT_ERROR
    } else if regressed {
        EXIT_REGRESSED
    } else {
        EXIT_OK
    };
    Ok(Comparison {
        base: base_spec.to_string(),
        head: head_spec.to_string(),
        thresholds: *t,
        units,
        unpaired,
        exit_status,
    })
}

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

pub fn render_terminal(c: &Comparison) -> String {
    let mut s = format!("compare {} -> {}\n{}\n", c.base, c.head, c.thresholds);
    for u in &c.units {
        s.push_str(&format!("\n{}\n", heading(u)));
        if let Some(r) = &u.refused {
            s.push_str(&format!("{r}\n"));
            continue;
        }
        let mut t = Table::new();
        t.load_preset(presets::UTF8_FULL_CONDENSED)
            .set_content_arrangement(ContentArrangement::Disabled)
            .set_header(HEADER);
        for r in &u.rows {
            t.add_row(cells(r));
        }
        s.push_str(&format!("{t}\n"));
        for n in &u.notes {
            s.push_str(&format!("{n}\n"));
        }
        push_verdicts(&mut s, u);
    }
    push_footer(&mut s, c);
    s
}

pub fn render_markdown(c: &Comparison) -> String {
    let mut s = format!("# compare {} -> {}\n\n{}\n", c.base, c.head, c.thresholds);
    for u in &c.units {
        s.push_str(&format!("\n## {}\n\n", heading(u)));
        if let Some(r) = &u.refused {
            s.push_str(&format!("{r}\n"));
            continue;
        }
        s.push_str(&md_head(&HEADER));
        for r in &u.rows {
            s.push_str(&md_row(&cells(r)));
        }
        s.push('\n');
        for n in &u.notes {
            s.push_str(&format!("{n}\n\n"));
        }
        push_verdicts(&mut s, u);
    }
    push_footer(&mut s, c);
    s
}

/// One line per row: its axis, measure, verdict and why (both renderers).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_keywords_tree_prefixes_or_paths() {
        assert_eq!(Spec::parse("latest"), Spec::Latest);
        assert_eq!(Spec::parse("previous"), Spec::Previous);
        assert_eq!(Spec::parse("5325B7b9"), Spec::Tree("5325b7b9".into()));
        assert_eq!(
            Spec::parse("reports/records/u/x.json"),
            Spec::Path("reports/records/u/x.json".into())
        );
    }

    fn stored(unit: &str, tree: &str, created: &str) -> Stored {
        let text = format!(
            r#"{{"schema": 1, "created_utc": "{created}", "unit": {{"name": "{unit}"}}, "project": {{"tree": "{tree}"}}, "axes": []}}"#
        );
        Stored {
            path: PathBuf::from(format!("{unit}/{created}.json")),
            name: format!("{unit}/{created}.json"),
            rec: archive::parse(&text).unwrap(),
        }
    }

    #[test]
    fn a_tree_prefix_names_one_tree_and_latest_previous_are_per_unit() {
        let rs = vec![
            stored("u", "ab01", "1"),
            stored("u", "ab02", "2"),
            stored("u", "ab02", "3"),
            stored("v", "ab01", "4"),
        ];
        let e = resolve(&Spec::Tree("ab".into()), &rs).unwrap_err();
        assert!(e.contains("names 2 trees (ab01, ab02)"), "{e}");
        let m = resolve(&Spec::Tree("ab01".into()), &rs).unwrap();
        assert_eq!(m.len(), 2, "both units ran tree ab01");
        let m = resolve(&Spec::Latest, &rs).unwrap();
        assert_eq!(m["u"].rec.created_utc, "3");
        let m = resolve(&Spec::Previous, &rs).unwrap();
        assert_eq!(m["u"].rec.project.tree, "ab01");
        assert!(
            !m.contains_key("v"),
            "v ran one tree only: it has no previous"
        );
        assert!(resolve(&Spec::Tree("ff".into()), &rs)
            .unwrap_err()
            .contains("names no record"));
    }

    #[test]
    fn configuration_differences_name_the_key_and_skip_the_watchdog() {
        let mut a: RecordView = archive::parse(
            r#"{"schema": 1, "unit": {"name": "u", "config": {"battery": {"repeat": 3}, "watchdog": {"load_s": 9}}},
                "project": {"tree": "t"}, "axes": []}"#,
        )
        .unwrap();
        let mut b = a.clone();
        b.unit.config["battery"]["repeat"] = 5.into();
        b.unit.config["watchdog"]["load_s"] = 1.into();
        assert_eq!(
            differences(&a, &b),
            vec!["unit configuration key battery.repeat (base 3, head 5)".to_string()]
        );
        a.host.gpu = serde_json::json!({"name": "H200", "driver": "580"});
        b.unit.config = a.unit.config.clone();
        assert_eq!(
            differences(&a, &b),
            vec![
                "GPU (base H200, head no GPU (CPU: ))".to_string(),
                "driver (base 580, head none)".to_string()
            ]
        );
    }
}
