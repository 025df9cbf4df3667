//! What a run shows: its summary on the terminal and its Markdown file beside the record, both
//! drawn from the record. Each holds the ratio table (render/table.rs), the gates' verdicts,
//! what the samplers saw, the clock's explainable gap, where each batch's time goes, each leg's
//! A/A noise, the idle checks and the refusals.

use std::path::Path;

use crate::gates::{GateResult, Scope};
use crate::legs::placement;
use crate::legs::LegRecord;
use crate::numbers::axes::{per_token_ratio, Axis};
use crate::numbers::noise::{self, LegNoise};
use crate::numbers::split;
use crate::record::Record;
use crate::render::table::{ratio_markdown, ratio_terminal};

/// The two outputs of a run.
#[derive(Clone, Copy, PartialEq)]
pub enum Format {
    Terminal,
    Markdown,
}

/// How a verdict (`pass`, `not_applicable`, `refused`, as the record spells it) is tagged in
/// each format; one the orchestrator does not know keeps its own name.
pub fn verdict_tag(verdict: &str, format: Format) -> &str {
    match (verdict, format) {
        ("not_applicable", Format::Terminal) => "n/a ",
        ("not_applicable", Format::Markdown) => "not applicable",
        ("refused", Format::Terminal) => "REFUSED",
        ("refused", Format::Markdown) => "**REFUSED**",
        (v, _) => v,
    }
}

/// " (engine)" for a verdict on one leg, "" for one over the pair.
pub fn leg_suffix<S: std::fmt::Display>(leg: Option<S>) -> String {
    leg.map(|l| format!(" ({l})")).unwrap_or_default()
}

fn gate_line(g: &GateResult, format: Format) -> String {
    let tag = verdict_tag(g.verdict.kind(), format);
    let leg = leg_suffix(g.leg);
    match format {
        Format::Terminal => format!("{tag} {}{leg}: {}", g.gate, g.sentence),
        Format::Markdown => format!(
            "- {tag}, {}{leg}: {}",
            g.gate,
            g.sentence.replace('\n', " ")
        ),
    }
}

/// Each leg's A/A noise (the spread of its repeats), then whether the per-token gap beats it.
pub fn noise_lines(rec: &Record) -> Vec<String> {
    let e = LegNoise::of(&rec.timings.engine);
    let o = LegNoise::of(&rec.timings.oracle);
    noise::lines(&e, &o, per_token_ratio(&rec.axes))
}

/// Where each batch's time goes, an axis marked not gated where a refusal's scope concerns it.
fn batch_split(rec: &Record) -> Vec<String> {
    let scopes: Vec<Scope> = rec.gates.iter().filter_map(GateResult::withholds).collect();
    let gated = |a: &Axis| {
        !a.ours_refused && !a.oracle_refused && !scopes.iter().any(|s| a.concerned_by(s))
    };
    split::lines(&rec.axes, rec.unit.config.battery.max_tokens, &gated)
}

/// One line per leg: its sampler summary, or why there is none, and what sampling cost; the
/// series file as `dir` joins it (the record names it relative to its directory).
fn sampler_line(l: &LegRecord, dir: &Path) -> String {
    let s = &l.sampler;
    let what = match (&s.summary, &s.no_gpu) {
        (Some(sum), _) => sum.to_string(),
        (None, Some(why)) => format!("no GPU data: {why}"),
        (None, None) => "not sampled".into(),
    };
    format!(
        "sampler ({}): {what}; boot {}; peak host memory {} MB; sampler cost {:.3} s CPU over {:.1} s ({:.2}% of one core){}",
        l.leg,
        s.boot_id.as_deref().unwrap_or("unknown"),
        l.host_mem.peak_rss_bytes / 1_000_000,
        s.cpu_s,
        s.wall_s,
        s.cpu_share * 100.0,
        s.series
            .as_ref()
            .map(|p| format!("; series {}", dir.join(p).display()))
            .unwrap_or_default()
    )
}

/// The gates' notes, (gate, sentence) each, in the verdicts' order.
fn notes(rec: &Record) -> Vec<(&str, &str)> {
    rec.gates
        .iter()
        .flat_map(|g| g.notes.iter().map(|n| (g.gate.as_str(), n.as_str())))
        .collect()
}

/// Per leg, what the host probe timed before it, or why the leg was not run.
fn host_lines(rec: &Record) -> Vec<String> {
    let mut v = vec![];
    for l in [&rec.legs.engine, &rec.legs.oracle] {
        if let Some(why) = &l.not_run {
            v.push(format!("the {} leg was not run ({why})", l.leg));
        }
        if let Some(p) = &l.host_probe {
            v.push(format!("before the {} leg: {}", l.leg, p.sentence()));
        }
    }
    v
}

/// The summary `orchestrator run` prints: the ratio table, every verdict, the samplers, the
/// noise, the idle checks, the refusals, and where the record and its files are (`json_path`
/// and `md_path` as the run named them, `dir` the record's directory).
pub fn terminal(rec: &Record, dir: &Path, json_path: &Path, md_path: &Path) -> String {
    let (p, cfg) = (&rec.project, &rec.unit.config);
    let mut s = format!(
        "{} on tree {}{}: engine vs {} oracle\n",
        cfg.name,
        &p.tree[..p.tree.len().min(12)],
        if p.dirty { " (uncommitted files)" } else { "" },
        cfg.oracle.backend.as_str()
    );
    let mut line = |l: String| {
        s.push_str(&l);
        s.push('\n');
    };
    line(ratio_terminal(&rec.axes));
    rec.gates
        .iter()
        .for_each(|g| line(gate_line(g, Format::Terminal)));
    for (gate, n) in notes(rec) {
        line(format!("note ({gate}): {n}"));
    }
    for l in [&rec.legs.engine, &rec.legs.oracle] {
        line(sampler_line(l, dir));
    }
    host_lines(rec)
        .into_iter()
        .for_each(|l| line(format!("host: {l}")));
    if let Some(x) = &rec.clock_explain {
        line(format!("clock: {}", x.sentence));
    }
    for l in batch_split(rec) {
        line(format!("batch split: {l}"));
    }
    noise_lines(rec)
        .into_iter()
        .for_each(|l| line(format!("A/A noise: {l}")));
    for l in &rec.lease.idle_checks {
        line(format!("idle: {l}"));
    }
    if let Some(o) = placement::summary(&rec.lease.neighbours) {
        line(format!("other GPUs: {o}"));
    }
    if let Some(how) = &rec.interrupted {
        line(format!("\nINTERRUPTED {how}"));
    }
    if !rec.refusals.is_empty() {
        line(format!("\nRefusals ({}):", rec.refusals.len()));
        rec.refusals.iter().for_each(|r| line(format!("- {r}")));
    }
    line(format!(
        "\nrecord: {}\ntable:  {}",
        json_path.display(),
        md_path.display()
    ));
    if let Some(t) = &rec.timeline {
        line(format!("timeline: {}", dir.join(t).display()));
    }
    s
}

/// `<stem>.md` beside the record (`json_path`).
pub fn markdown(rec: &Record, json_path: &Path) -> String {
    let mut s = format!(
        "# {}: engine vs {} oracle\n\nTree `{}`{}, commit `{}`, host {} ({}, {} cores). Record: `{}`.\n\n",
        rec.unit.name,
        rec.unit.config.oracle.backend.as_str(),
        rec.project.tree,
        if rec.project.dirty { " (uncommitted files: the tree is theirs)" } else { "" },
        rec.project.commit,
        rec.host.hostname,
        rec.host.cpu_model,
        rec.host.cores,
        json_path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    );
    s.push_str(&ratio_markdown(&rec.axes));
    if let Some(t) = &rec.timeline {
        let name = t
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        s.push_str(&format!(
            "\n![timeline: SM clock and utilization of both legs]({name})\n"
        ));
    }
    let item = |s: &mut String, l: &str| s.push_str(&format!("- {l}\n"));
    let split = batch_split(rec);
    if !split.is_empty() {
        s.push_str(&format!("\n## {}\n\n", split::HEADING));
        split.iter().for_each(|l| item(&mut s, l));
    }
    s.push_str("\n## GPU and host sampling\n\n");
    for l in [&rec.legs.engine, &rec.legs.oracle] {
        item(&mut s, &sampler_line(l, Path::new("")));
    }
    host_lines(rec).iter().for_each(|l| item(&mut s, l));
    if let Some(x) = &rec.clock_explain {
        item(&mut s, &format!("clock: {}", x.sentence));
    }
    s.push_str("\n## A/A noise (each leg's spread over its repeats)\n\n");
    noise_lines(rec).iter().for_each(|l| item(&mut s, l));
    s.push_str("\n## Idle checks (before each leg)\n\n");
    if rec.lease.idle_checks.is_empty() {
        item(&mut s, "none recorded");
    }
    for l in &rec.lease.idle_checks {
        item(&mut s, &l.replace('\n', " "));
    }
    if let Some(o) = placement::summary(&rec.lease.neighbours) {
        item(
            &mut s,
            &format!("other GPUs of the host during the run: {o}"),
        );
    }
    s.push_str("\n## Gates\n\n");
    for g in &rec.gates {
        s.push_str(&gate_line(g, Format::Markdown));
        s.push('\n');
    }
    let notes = notes(rec);
    if !notes.is_empty() {
        s.push_str("\n## Notes (recorded, not refusals)\n\n");
        for (gate, n) in notes {
            item(&mut s, &format!("{gate}: {n}"));
        }
    }
    if let Some(how) = &rec.interrupted {
        s.push_str(&format!("\n**Interrupted** {how}.\n"));
    }
    s.push_str(&closing(rec));
    s
}

/// What the Markdown ends with: every refusal, or why there is none to list.
fn closing(rec: &Record) -> String {
    let not_applicable = rec
        .gates
        .iter()
        .filter(|g| g.verdict.kind() == "not_applicable")
        .count();
    if rec.refusals.is_empty() && not_applicable > 0 {
        // Not applicable is not a pass: say what was not checked rather than "every gate passed".
        return format!(
            "\nNo gate refused; {not_applicable} verdict(s) above are not applicable, so what they check was not checked.\n"
        );
    }
    if rec.refusals.is_empty() {
        return "\nEvery gate passed: every number above is gated.\n".into();
    }
    let mut s = format!("\n## Refusals ({})\n\n", rec.refusals.len());
    for r in &rec.refusals {
        s.push_str(&format!("- {}\n", r.replace('\n', " ")));
    }
    s
}
