//! `orchestrator compare BASE HEAD`: did HEAD make us slower? Per unit and per timing axis, from
//! the per-prompt samples of both records (numbers/regress.rs judges each). Our absolute
//! figures and the ratio ours/oracle are compared separately: the ratio is the signal that
//! survives a change of machine, the absolute figure the one a user feels. docs/REPORT.md
//! states the rules; render/compare.rs draws the result.

mod like;

use std::collections::BTreeMap;
use std::path::Path;

use crate::numbers::axes::{batch_axis, Axis, Better, BATCH_PREFILL, BATCH_STEP, THROUGHPUT};
use crate::numbers::regress::{
    judge, ratios, Comparison, Row, Side, Subject, Thresholds, UnitComparison, Verdict, EXIT_ERROR,
    EXIT_OK, EXIT_REGRESSED,
};
use crate::record::archive::{self, RecordView, Rejected, SampleView, Stored, TimingsView};
use crate::record::class::HostClass;
use crate::record::select::{differences, resolve, resolve_by_class, Spec};

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
    for &b in &batches {
        v.push(Measured {
            name: batch_axis(THROUGHPUT, b),
            better: Better::Higher,
            pick: Box::new(move |t| per_repeat(t.throughput_tok_s.get(&b.to_string()))),
        });
    }
    // A batch's prefill and decode step: in records from 0.5.0 on, empty (so not judged) before.
    for &b in batches.iter().filter(|&&b| b > 1) {
        v.push(Measured {
            name: batch_axis(BATCH_PREFILL, b),
            better: Better::Lower,
            pick: Box::new(move |t| per_repeat(t.batch_prefill_s.get(&b))),
        });
        v.push(Measured {
            name: batch_axis(BATCH_STEP, b),
            better: Better::Lower,
            pick: Box::new(move |t| per_repeat(t.batch_step_s.get(&b))),
        });
    }
    v
}

/// One figure per repeat, as samples of prompt 0.
fn per_repeat(xs: Option<&Vec<f64>>) -> Keyed {
    xs.map(|xs| {
        xs.iter()
            .enumerate()
            .map(|(i, x)| ((0, i as u32), *x))
            .collect()
    })
    .unwrap_or_default()
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

/// Both records' samples, each divided by the median of its prompt's samples in both records
/// together: prompts of 5 and of 1,000 tokens then speak on one scale, so the test sees how a
/// prompt's time changed and not how long the prompts are (time to first token spans 0.4x to
/// 2x of its median across a battery). Prompts only one record has are left out: they cannot
/// say what changed. Throughput, one prompt per repeat, is only rescaled.
fn per_prompt(base: &Keyed, head: &Keyed) -> (Vec<f64>, Vec<f64>) {
    let mut by: BTreeMap<usize, [Vec<f64>; 2]> = BTreeMap::new();
    for (side, xs) in [base, head].into_iter().enumerate() {
        for ((prompt, _), x) in xs {
            by.entry(*prompt).or_default()[side].push(*x);
        }
    }
    let (mut nb, mut nh) = (vec![], vec![]);
    for [b, h] in by.values() {
        let both: Vec<f64> = b.iter().chain(h).copied().collect();
        match ::stats::median(&both) {
            Some(m) if m > 0.0 && !b.is_empty() && !h.is_empty() => {
                nb.extend(b.iter().map(|x| x / m));
                nh.extend(h.iter().map(|x| x / m));
            }
            _ => {}
        }
    }
    (nb, nh)
}

/// Our absolute figures judged prompt by prompt, each normalised by its prompt's median.
fn ours_row(what: Subject, [eb, eh]: [&Keyed; 2], why: Option<String>, t: &Thresholds) -> Row {
    let (nb, nh) = per_prompt(eb, eh);
    let mut row = judge(what, &nb, &nh, why, t);
    // Shown as measured: a prompt only one side ran (or an axis the base predates) is left out
    // of the test, not out of the figures.
    let vals = |x: &Keyed| x.iter().map(|p| p.1).collect::<Vec<_>>();
    let (b, h) = (vals(eb), vals(eh));
    (row.base_median, row.head_median) = (::stats::median(&b), ::stats::median(&h));
    (row.n_base, row.n_head) = (b.len(), h.len());
    row
}

/// Two reasons not to judge, as one phrase.
fn join(a: Option<String>, b: Option<String>) -> Option<String> {
    match (a, b) {
        (Some(a), Some(b)) => Some(format!("{a}, and {b}")),
        (a, b) => a.or(b),
    }
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
            "The records differ in {}; they are compared because --allow-different-hosts was given: our absolute figures are not judged across a change of GPU or driver, and the ratio ours/oracle only on the axes where the oracle's own figure held.",
            diffs.join("; ")
        ));
    }
    let unlike = like::ours_unlike(b, h);
    out.notes.extend(like::clock_note(b, h));
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
        let ours_why = join(
            why(true),
            (!unlike.is_empty()).then(|| {
                format!(
                    "the records are not like for like for our absolute figures: {}",
                    unlike.join("; ")
                )
            }),
        );
        let (veb, veh, vob, voh) = (vals(&eb), vals(&eh), vals(&ob), vals(&oh));
        let moved = like::oracle_moved(
            &like::AxisSamples {
                axis: &m.name,
                better: m.better.as_str(),
                engine: [&veb, &veh],
                oracle: [&vob, &voh],
                oracle_spread_pct: [
                    like::spread_pct(&b.timings.oracle, &m.name),
                    like::spread_pct(&h.timings.oracle, &m.name),
                ],
            },
            [b, h],
            t,
        );
        out.rows
            .push(ours_row(what("ours"), [&eb, &eh], ours_why, t));
        out.rows.push(judge(
            what("ours/oracle"),
            &ratios(&eb, &ob),
            &ratios(&eh, &oh),
            join(why(false), moved),
            t,
        ));
    }
    out
}

/// The comparisons of one unit, and the sentences for its records that found no partner. Within
/// each host class that both sides have, that class's base against its head; where no class has
/// both, the unit's records as resolved over every class, which `compare_unit` refuses when
/// their classes differ (unless allowed), as it refuses any other difference.
struct Paired {
    units: Vec<UnitComparison>,
    base_only: Vec<String>,
    head_only: Vec<String>,
}

type ByClass = BTreeMap<(String, HostClass), Stored>;

fn pair_unit(
    u: &str,
    sides: [(&BTreeMap<String, Stored>, &ByClass, bool); 2],
    t: &Thresholds,
    allow_different_hosts: bool,
) -> Paired {
    let [(base, bc, base_one), (head, hc, head_one)] = sides;
    let mut p = Paired {
        units: vec![],
        base_only: vec![],
        head_only: vec![],
    };
    let of = |m: &ByClass| -> BTreeMap<HostClass, Stored> {
        m.iter()
            .filter(|((x, _), _)| x == u)
            .map(|((_, c), s)| (c.clone(), s.clone()))
            .collect()
    };
    let (b, h) = (of(bc), of(hc));
    let shared: Vec<&HostClass> = b.keys().filter(|c| h.contains_key(*c)).collect();
    if shared.is_empty() {
        match (base.get(u), head.get(u)) {
            (Some(b), Some(h)) => p.units.push(compare_unit(b, h, t, allow_different_hosts)),
            (Some(b), None) if !head_one => p.base_only.push(format!(
                "Unit {u} has a record in BASE ({}) and none in HEAD, so it is not compared.",
                b.name
            )),
            (None, Some(h)) if !base_one => p.head_only.push(format!(
                "Unit {u} has a record in HEAD ({}) and none in BASE, so it is not compared.",
                h.name
            )),
            _ => {}
        }
        return p;
    }
    let classes: std::collections::BTreeSet<&HostClass> = b.keys().chain(h.keys()).collect();
    for c in &shared {
        let mut uc = compare_unit(&b[*c], &h[*c], t, allow_different_hosts);
        if classes.len() > 1 {
            uc.host = format!("{}, host {}", uc.host, c.host);
            uc.notes.push(format!(
                "Unit {u} has records from {} host classes; this is its comparison on {c}, and no verdict mixes two classes.",
                classes.len()
            ));
        }
        p.units.push(uc);
    }
    let alone = |c: &HostClass, with: &str, without: &str, s: &Stored| {
        format!(
            "Unit {u} on {c} has a record in {with} ({}) and none on that host class in {without}, so it is not compared there.",
            s.name
        )
    };
    if !head_one {
        for (c, s) in b.iter().filter(|(c, _)| !h.contains_key(*c)) {
            p.base_only.push(alone(c, "BASE", "HEAD", s));
        }
    }
    if !base_one {
        for (c, s) in h.iter().filter(|(c, _)| !b.contains_key(*c)) {
            p.head_only.push(alone(c, "HEAD", "BASE", s));
        }
    }
    p
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
    let (bc, hc) = (
        resolve_by_class(base_spec, records, &base),
        resolve_by_class(head_spec, records, &head),
    );
    // A record file names one unit on purpose: the other side's other units are not news.
    let (base_one, head_one) = (
        matches!(base_spec, Spec::Path(_)),
        matches!(head_spec, Spec::Path(_)),
    );
    let names: std::collections::BTreeSet<&String> = base.keys().chain(head.keys()).collect();
    let (mut units, mut base_only, mut head_only) = (vec![], vec![], vec![]);
    for u in names {
        let p = pair_unit(
            u,
            [(&base, &bc, base_one), (&head, &hc, head_one)],
            t,
            allow_different_hosts,
        );
        units.extend(p.units);
        base_only.extend(p.base_only);
        head_only.extend(p.head_only);
    }
    let unpaired: Vec<String> = base_only.into_iter().chain(head_only).collect();
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
