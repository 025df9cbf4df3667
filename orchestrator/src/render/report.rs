//! BENCHMARKS.md, drawn from the records alone (report.rs reads and writes): per unit the latest
//! run's table with its provenance and every refusal directly under it, then the ratio history
//! across trees and, from three trees on, a chart. No generation time, iteration in sorted
//! order: the same records give the same bytes.

use std::collections::BTreeMap;

use crate::numbers::axes::{per_token_ratio, Axis};
use crate::numbers::noise;
use crate::numbers::split;
use crate::record::archive::{self, RecordView, Rejected, Stored};
use crate::record::class;
use crate::render::chart;
use crate::render::run::{leg_suffix, verdict_tag, Format};
use crate::render::table::{self, esc, ratio_cells, RATIO_HEADER};
use crate::util::fmt::{and_list, fmt_num};

/// The Markdown, and each chart as (file name under the charts directory, SVG).
pub struct Rendered {
    pub markdown: String,
    pub charts: Vec<(String, String)>,
}

/// The charts directory, relative to BENCHMARKS.md.
pub const CHARTS_DIR: &str = "charts";

/// "per output token, warm (median, n=15)" -> "per output token, warm": the history's column
/// must not split when a later run has a different sample count.
fn axis_key(name: &str) -> &str {
    match name.find(" (") {
        Some(i) => &name[..i],
        None => name,
    }
}

fn latest_table(rec: &RecordView) -> String {
    table::markdown(
        RATIO_HEADER,
        rec.axes.iter().map(|a| {
            let ungated = !rec.gated(a, false) && a.ratio.is_some();
            ratio_cells(a, if ungated { " (not gated)" } else { "" })
        }),
    )
}

/// Each refusal as a sentence, led by a sentence naming the rows it concerns.
fn refusals(rec: &RecordView) -> Vec<String> {
    let refused: Vec<_> = rec.gates.iter().filter(|g| g.refused()).collect();
    if refused.is_empty() {
        // A record whose gates list is missing still carries its refusal sentences.
        return rec
            .refusals
            .iter()
            .map(|r| format!("Concerns every number above. {}", esc(r)))
            .collect();
    }
    refused
        .iter()
        .map(|g| {
            let rows: Vec<String> = rec
                .axes
                .iter()
                .filter(|a| {
                    rec.refusals_for(a, false)
                        .iter()
                        .any(|x| std::ptr::eq(*x, *g))
                })
                .map(|a| a.axis.clone())
                .collect();
            let lead = if rows.len() == rec.axes.len() && !rows.is_empty() {
                "Concerns every number above.".to_string()
            } else if rows.is_empty() {
                "Concerns no number above, only the check it names.".to_string()
            } else {
                format!("Concerns the rows {}.", and_list(&rows))
            };
            format!("{lead} {}", esc(&g.sentence))
        })
        .collect()
}

fn gated_speed(rec: &RecordView) -> bool {
    rec.axes
        .iter()
        .any(|a| a.is_speed() && a.ratio.is_some() && rec.gated(a, false))
}

/// The sentence saying which rule refused every speed number.
fn no_speed_number(rec: &RecordView) -> String {
    let mut who = vec![];
    for a in rec.axes.iter().filter(|a| a.is_speed()) {
        for g in rec.refusals_for(a, false) {
            let w = g.who();
            if !who.contains(&w) {
                who.push(w);
            }
        }
    }
    if who.is_empty() {
        // No speed axis to hang a refusal on (a leg failed before measuring any): every
        // refused gate is part of the rule.
        who = rec
            .gates
            .iter()
            .filter(|g| g.refused())
            .map(|g| g.who())
            .collect();
        who.dedup();
    }
    let rule = if who.is_empty() {
        "no speed axis has figures from both legs, so there is no ratio to gate.".to_string()
    } else {
        let whose = if who.len() == 1 {
            "whose refusal is"
        } else {
            "whose refusals are"
        };
        format!("{}, {whose} quoted below in full.", and_list(&who))
    };
    format!("**No speed number, by the unit's own rule.** The rule that refused: {rule}\n")
}

/// What was judged besides the refusals: every other gate verdict (token match, kv, clock,
/// stragglers, ...), the idle checks before each leg, the clock's explainable-gap statement and
/// each leg's A/A noise. Refused verdicts are quoted in full under the table, above it.
fn judged(rec: &RecordView) -> String {
    let mut s = String::from("Gate verdicts:\n\n");
    for g in &rec.gates {
        // A refusal is quoted in full under the table.
        let said = if g.refused() {
            "quoted above".into()
        } else {
            esc(&g.sentence)
        };
        s.push_str(&format!(
            "- {}, {}{}: {said}\n",
            esc(verdict_tag(&g.verdict, Format::Markdown)),
            g.gate,
            leg_suffix(g.leg.as_ref())
        ));
    }
    if rec.gates.is_empty() {
        s.push_str("- none recorded\n");
    }
    for l in &rec.lease.idle_checks {
        s.push_str(&format!("- idle, {}\n", esc(l)));
    }
    if let Some(x) = rec
        .clock_explain
        .as_ref()
        .filter(|x| !x.sentence.is_empty())
    {
        s.push_str(&format!("- clock explains: {}\n", esc(&x.sentence)));
    }
    let max_tokens = rec.unit.config["battery"]["max_tokens"]
        .as_u64()
        .unwrap_or(0);
    let gated = |a: &Axis| rec.gated(a, false);
    let split = split::lines(&rec.axes, u32::try_from(max_tokens).unwrap_or(0), &gated);
    if !split.is_empty() {
        s.push_str(&format!("\n{}:\n\n", split::HEADING));
        split
            .iter()
            .for_each(|l| s.push_str(&format!("- {}\n", esc(l))));
    }
    s.push_str("\nA/A noise (each leg's spread over its repeats of the battery, one load):\n\n");
    let (e, o) = (rec.timings.engine.noise(), rec.timings.oracle.noise());
    for l in noise::lines(&e, &o, per_token_ratio(&rec.axes)) {
        s.push_str(&format!("- {}\n", esc(&l)));
    }
    s.push('\n');
    s
}

/// Per tree, the latest record of that tree, ordered by when that record was written.
fn per_tree<'a>(records: &[&'a Stored]) -> Vec<&'a Stored> {
    let mut m: BTreeMap<&str, &Stored> = BTreeMap::new();
    for r in records {
        // `records` is oldest first, so the last insert per tree is its latest record.
        m.insert(r.rec.project.tree.as_str(), r);
    }
    let mut v: Vec<&Stored> = m.into_values().collect();
    v.sort_by(|a, b| (&a.rec.created_utc, &a.name).cmp(&(&b.rec.created_utc, &b.name)));
    v
}

fn point<'a>(rec: &'a RecordView, key: &str) -> Option<(&'a Axis, f64, bool)> {
    let a = rec.axes.iter().find(|a| axis_key(&a.axis) == key)?;
    Some((a, a.ratio?, rec.gated(a, false)))
}

/// The history table and, from three trees on, the chart `<file>.svg` titled by `name` (the
/// unit, or the unit on its host class).
fn history(name: &str, file: &str, records: &[&Stored]) -> (String, Option<(String, String)>) {
    let trees = per_tree(records);
    let mut keys: Vec<String> = vec![];
    for t in &trees {
        for a in &t.rec.axes {
            let k = axis_key(&a.axis).to_string();
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
    }
    let mut s = String::from(
        "Ratio ours/oracle per tree, oldest first (each tree's latest record). \"gated\" means no gate refused the point; otherwise the gates that did are named.\n\n",
    );
    s.push_str(&format!(
        "| tree | commit | written | {} |\n|{}\n",
        keys.iter().map(|k| esc(k)).collect::<Vec<_>>().join(" | "),
        " --- |".repeat(keys.len() + 3)
    ));
    for t in &trees {
        let r = &t.rec;
        let cells: Vec<String> = keys
            .iter()
            .map(|k| match point(r, k) {
                None => "-".into(),
                Some((_, ratio, true)) => format!("{}x gated", fmt_num(ratio)),
                Some((a, ratio, false)) => {
                    let mut gates: Vec<String> = r
                        .refusals_for(a, false)
                        .iter()
                        .map(|g| g.gate.clone())
                        .collect();
                    gates.dedup();
                    if gates.is_empty() {
                        format!("{}x refused", fmt_num(ratio))
                    } else {
                        format!("{}x refused by {}", fmt_num(ratio), gates.join(", "))
                    }
                }
            })
            .collect();
        s.push_str(&format!(
            "| `{}`{} | `{}` | {} | {} |\n",
            r.tree8(),
            r.tree_note(true),
            r.commit8(),
            esc(&r.created_utc),
            cells.join(" | ")
        ));
    }
    let mut chart = None;
    if trees.len() >= 3 {
        let names: Vec<String> = trees.iter().map(|t| t.rec.tree8().to_string()).collect();
        let series: Vec<chart::Series> = keys
            .iter()
            .filter(|k| {
                trees
                    .iter()
                    .any(|t| point(&t.rec, k).is_some_and(|(a, _, _)| a.is_speed()))
            })
            .map(|k| chart::Series {
                name: k.clone(),
                points: trees
                    .iter()
                    .map(|t| point(&t.rec, k).map(|(_, r, g)| (r, g)))
                    .collect(),
            })
            .collect();
        if let Some(svg) =
            chart::ratio_history(&format!("{name}: ratio ours/oracle"), &names, &series)
        {
            let file = format!("{file}.svg");
            s.push_str(&format!(
                "\n![{name}: ratio history of the speed axes, hollow points refused]({CHARTS_DIR}/{file})\n"
            ));
            chart = Some((file, svg));
        }
    }
    (s, chart)
}

/// One unit's records of one host class: the latest run and the history (`#` marks the
/// history's heading level), the chart as `<file>.svg` titled by `name`.
fn class_body(
    name: &str,
    file: &str,
    hashes: &str,
    records: &[&Stored],
) -> (String, Option<(String, String)>) {
    let latest = records.last().expect("a unit has at least one record");
    let r = &latest.rec;
    let gpu = r.device_name();
    let mut s = String::new();
    s.push_str(&format!(
        "Latest run: record `{}`, written {}, tree `{}`{}, commit `{}`. Oracle: {}. GPU: {}, driver {}. Host: {}.\n\n",
        latest.name,
        if r.created_utc.is_empty() { "at an unrecorded time" } else { &r.created_utc },
        r.project.tree,
        r.tree_note(false),
        r.project.commit,
        r.oracle_label(),
        gpu,
        r.driver(),
        if r.host.hostname.is_empty() { "unrecorded" } else { &r.host.hostname },
    ));
    s.push_str(&latest_table(r));
    s.push('\n');
    if !gated_speed(r) {
        s.push_str(&no_speed_number(r));
        s.push('\n');
    }
    let refs = refusals(r);
    if refs.is_empty() {
        s.push_str("Every gate passed: every number above is gated.\n");
    } else {
        s.push_str(&format!(
            "Refusals ({}), each travelling with the numbers above:\n\n",
            refs.len()
        ));
        for x in &refs {
            s.push_str(&format!("- {x}\n"));
        }
    }
    s.push('\n');
    s.push_str(&judged(r));
    s.push_str(&format!("{hashes} History\n\n"));
    let (h, chart) = history(name, file, records);
    s.push_str(&h);
    s.push('\n');
    (s, chart)
}

/// A unit's section: its records as one class, or, when they come from several host classes,
/// each class under its own heading with its own latest run, history and chart (`<unit>.<class
/// slug>.svg`), so that no table, history or chart mixes two classes.
fn unit_section(unit: &str, records: &[&Stored]) -> (String, Vec<(String, String)>) {
    let classes = class::by_class(records);
    let mut s = format!("## {unit}\n\n");
    if classes.len() == 1 {
        let (b, c) = class_body(unit, unit, "###", records);
        s.push_str(&b);
        return (s, c.into_iter().collect());
    }
    s.push_str(&format!(
        "The records of {unit} come from {} host classes (GPU, driver, host CPU). Each class has its own latest run, history and chart below; none of them mixes two classes.\n\n",
        classes.len()
    ));
    let mut charts = vec![];
    for (c, rs) in &classes {
        s.push_str(&format!("### {unit} on {}\n\n", esc(&c.to_string())));
        let name = format!("{unit} on {c}");
        let (b, chart) = class_body(&name, &format!("{unit}.{}", c.slug()), "####", rs);
        s.push_str(&b);
        charts.extend(chart);
    }
    (s, charts)
}

/// BENCHMARKS.md and its charts from `records` (as `archive::load_dir` orders them).
pub fn render(records: &[Stored], rejected: &[Rejected]) -> Rendered {
    let groups = archive::by_unit(records);
    let mut md = String::from(
        "# Benchmarks\n\nGenerated by `orchestrator report` from the run records alone; do not edit it by hand, run the report again. Every number stands beside the verdicts of the gates that judged it, in the same run: a refusal is printed directly under the table it concerns, never netted out. `orchestrator compare` says whether a tree made us slower (docs/REPORT.md).\n\n",
    );
    if groups.is_empty() {
        md.push_str("No record was read, so there is no number to report.\n");
    } else {
        md.push_str(&format!(
            "Units: {}.\n\n",
            groups.keys().cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    if groups.values().any(|rs| class::by_class(rs).len() > 1) {
        md.push_str("Records come from more than one host class (GPU, driver, host CPU): a unit whose records do is shown class by class, and no table, history, chart or comparison mixes two classes.\n\n");
    }
    let mut charts = vec![];
    for (unit, rs) in &groups {
        let (s, c) = unit_section(unit, rs);
        md.push_str(&s);
        charts.extend(c);
    }
    if !rejected.is_empty() {
        md.push_str("## Records not read\n\n");
        for r in rejected {
            md.push_str(&format!("- `{}` was not read: {}\n", r.name, esc(&r.why)));
        }
    }
    Rendered {
        markdown: md,
        charts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judged_lists_verdicts_idle_checks_clock_and_noise() {
        let rec: RecordView = serde_json::from_value(serde_json::json!({
            "schema": 1,
            "unit": {"name": "u"},
            "project": {"tree": "t"},
            "axes": [{"axis": "per output token, warm (median, n=4)", "unit": "s",
                      "better": "lower", "ours": 1.0, "oracle": 2.0, "ratio": 0.5,
                      "words": "ours 2.00x faster", "ours_refused": false,
                      "oracle_refused": false, "note": null}],
            "gates": [
                {"gate": "token", "leg": "engine", "verdict": "pass", "sentence": "TOKEN MATCH: 8/8"},
                {"gate": "kv", "leg": null, "verdict": "refused", "refusal": {"refusal": "kv_unmatched"},
                 "sentence": "The KV pools could not be matched"},
                {"gate": "clock", "leg": null, "verdict": "not_applicable", "sentence": "not applicable: no GPU"}
            ],
            "lease": {"idle_checks": ["before the oracle leg: GPU 0 idle (3 MiB in use)"]},
            "clock_explain": {"sentence": "A median SM clock offset of 0.10% ..."},
            "timings": {
                "engine": {"per_token_s": [{"prompt": 0, "pass": 0, "s": 1.0}, {"prompt": 0, "pass": 1, "s": 1.1}],
                           "throughput_tok_s": {"8": [100.0, 100.0]}},
                "oracle": {"per_token_s": [{"prompt": 0, "pass": 0, "s": 2.0}, {"prompt": 0, "pass": 1, "s": 2.0}]}
            }
        }))
        .unwrap();
        let s = judged(&rec);
        for want in [
            "- pass, token (engine): TOKEN MATCH: 8/8\n",
            "- **REFUSED**, kv: quoted above\n",
            "- not applicable, clock: not applicable: no GPU\n",
            "- idle, before the oracle leg: GPU 0 idle (3 MiB in use)\n",
            "- clock explains: A median SM clock offset of 0.10% ...\n",
            "- engine: per output token 1000 / 1100 ms over 2 repeats (spread 9.52%); throughput at batch 8 100.0 / 100.0 tok/s (spread 0.00%)\n",
            "- oracle: per output token 2000 / 2000 ms over 2 repeats (spread 0.00%)\n",
            "- so the per-token gap between the legs (50.00%) is larger than either leg's spread",
        ] {
            assert!(s.contains(want), "missing {want:?} in\n{s}");
        }
    }

    #[test]
    fn axis_keys_drop_the_sample_count() {
        assert_eq!(
            axis_key("per output token, warm (median, n=15)"),
            "per output token, warm"
        );
        assert_eq!(axis_key("KV pool"), "KV pool");
        assert_eq!(
            and_list(&["a".into(), "b".into(), "c".into()]),
            "a, b and c"
        );
    }
}
