//! `orchestrator compare BASE HEAD`: did HEAD make us slower? Per unit and per timing axis, from
//! the per-prompt samples of both records (numbers/regress.rs judges each). Our absolute
//! figures and the ratio ours/oracle are compared separately: the ratio is the signal that
//! survives a change of machine, the absolute figure the one a user feels. docs/REPORT.md
//! states the rules; render/compare.rs draws the result.

use std::path::Path;

use crate::numbers::axes::{Axis, Better};
use crate::numbers::regress::{
    judge, ratios, Comparison, Side, Subject, Thresholds, UnitComparison, Verdict, EXIT_ERROR,
    EXIT_OK, EXIT_REGRESSED,
};
use crate::record::archive::{self, RecordView, Rejected, SampleView, Stored, TimingsView};
use crate::record::select::{differences, resolve, Spec};

fn side(s: &Stored) -> Side {
    Side {
        record: s.name.clone(),
        tree: s.rec.project.tree.clone(),
        commit: s.rec.project.commit.clone(),
        created_utc: s.rec.created_utc.clone(),
    }
}

/// A timing axis with per-prompt (or per-repeat) samples, keyed so that the engine's and the
/// oracle's samples of the same prompt and repeat can be paired into a ratio.
/// Samples keyed by (prompt, repeat); throughput has one figure per repeat, prompt 0.
type Keyed = Vec<((usize, u32), f64)>;

struct Measured {
    /// The axis name as the record's table spells it (its prefix, for "per output token").
    name: String,
    better: Better,
    pick: Box<dyn Fn(&TimingsView) -> Keyed>,
}

fn keyed(v: &[SampleView]) -> Keyed {
    v.iter().map(|s| ((s.prompt, s.pass), s.s)).collect()
}

fn measured_axes(base: &RecordView, head: &RecordView) -> Vec<Measured> {
    let mut v = vec![
        Measured {
            name: "per output token".into(),
            better: Better::Lower,
            pick: Box::new(|t| keyed(&t.per_token_s)),
        },
        Measured {
            name: "time to first token".into(),
            better: Better::Lower,
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
            better: Better::Higher,
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
fn axis_view(rec: &RecordView, m: &Measured) -> Axis {
    rec.axes
        .iter()
        .find(|a| a.axis == m.name || a.axis.starts_with(&format!("{} ", m.name)))
        .cloned()
        .unwrap_or_else(|| Axis {
            axis: m.name.clone(),
            better: m.better,
            ..Axis::default()
        })
}

/// Why `rec` does not gate this axis for this measure, as a phrase; None when it does.
fn ungated_because(rec: &RecordView, axis: &Axis, engine_only: bool) -> Option<String> {
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
        base: side(base),
        head: side(head),
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
        let what = |measure| Subject {
            axis: &m.name,
            better: m.better.as_str(),
            measure,
        };
        out.rows
            .push(judge(what("ours"), &vals(&eb), &vals(&eh), why(true), t));
        out.rows.push(judge(
            what("ours/oracle"),
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

/// `compare BASE HEAD` over the records under `records` (not read when both sides are record
/// files). Also returns the files under `records` that are not readable records, to be named
/// whatever the outcome.
pub fn run(
    base: &str,
    head: &str,
    records: &Path,
    t: &Thresholds,
    allow_different_hosts: bool,
) -> (Vec<Rejected>, Result<Comparison, String>) {
    let (base, head) = (Spec::parse(base), Spec::parse(head));
    let loaded = if matches!((&base, &head), (Spec::Path(_), Spec::Path(_))) {
        Ok((vec![], vec![]))
    } else {
        archive::load_dir(records)
    };
    match loaded {
        Ok((recs, rejected)) => (
            rejected,
            compare(&base, &head, &recs, t, allow_different_hosts),
        ),
        Err(e) => (vec![], Err(e)),
    }
}
