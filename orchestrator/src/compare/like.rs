//! Whether two records are like for like for each measure `compare` judges, and when they are
//! not, which leg moved. Our absolute figures are judged only on the same GPU and driver at the
//! same clock state (the engine's median SM clock within 1%, the same throttle reasons lowering
//! it). The ratio ours/oracle is judged only where the oracle's own figure held between the two
//! records (SAME by the rank test and interval, or a change within its own A/A spread): a
//! host-bound oracle moves with its machine (vLLM's per-token time on the 1B: 1.49-2.36 ms over
//! four H200 machines of one kind), and a ratio over a moved oracle reports our regression or
//! gain that never happened. The host probe beside each leg says whether the host moved too.

use crate::numbers::axes::{batch_of, BATCH_PREFILL, BATCH_STEP, THROUGHPUT};
use crate::numbers::regress::{judge, Subject, Thresholds, Verdict};
use crate::record::archive::{GateView, RecordView, TimingsView};
use crate::util::fmt::fmt_num;

/// The tolerance on the engine leg's median SM clock between two records, in percent.
pub const CLOCK_TOLERANCE_PCT: f64 = 1.0;

/// A host probe that moved by less than this (relative) held.
const PROBE_HELD: f64 = 0.03;

/// The clock-lowering throttle reasons the clock gate refused for the engine leg.
fn lowering(rec: &RecordView) -> Vec<String> {
    let mut v: Vec<String> = rec
        .gates
        .iter()
        .filter(|g| g.gate == "clock" && g.refused())
        .filter_map(|g: &GateView| g.refusal.as_ref()?.get("reason").cloned())
        .filter(|r| r["reason"] == "throttled" && r["leg"] == "engine")
        .flat_map(|r| {
            let names: Vec<String> = r["reasons"]
                .as_array()
                .map(|a| {
                    a.iter()
                        // Before 0.4.0 a reason was [name, share]; since, {name, ...}.
                        .filter_map(|x| x.get("name").or_else(|| x.get(0)))
                        .filter_map(|n| n.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            names
        })
        .collect();
    v.sort();
    v
}

fn engine_clock(rec: &RecordView) -> Option<f64> {
    let s = rec.legs.engine.sampler.summary.as_ref()?;
    s.sm_mhz.as_ref().map(|c| c.median)
}

/// Why our absolute figures in `b` and `h` are not like for like, each a phrase; empty when
/// they are (or when neither record holds the engine's clocks: `clock_note` says so).
pub fn ours_unlike(b: &RecordView, h: &RecordView) -> Vec<String> {
    let mut v = vec![];
    let mut pair = |what: &str, x: String, y: String| {
        if x != y {
            v.push(format!("the {what} differs (base {x}, head {y})"));
        }
    };
    pair("GPU", b.device_name(), h.device_name());
    pair("driver", b.driver(), h.driver());
    match (engine_clock(b), engine_clock(h)) {
        (Some(x), Some(y)) if x > 0.0 && ((y - x) / x * 100.0).abs() > CLOCK_TOLERANCE_PCT => {
            v.push(format!(
                "the engine leg's median SM clock moved from {} to {} MHz ({:+.2}%, beyond {CLOCK_TOLERANCE_PCT}%)",
                fmt_num(x),
                fmt_num(y),
                (y - x) / x * 100.0
            ))
        }
        (Some(_), None) => v.push("the head record holds no SM clock for the engine leg".into()),
        (None, Some(_)) => v.push("the base record holds no SM clock for the engine leg".into()),
        _ => {}
    }
    let (lb, lh) = (lowering(b), lowering(h));
    if lb != lh {
        v.push(format!(
            "the throttle reasons that lowered the engine leg's clock differ (base [{}], head [{}])",
            lb.join(", "),
            lh.join(", ")
        ));
    }
    v
}

/// The note a unit carries when neither record holds the engine's clocks (CPU runs, or
/// records written before the sampler): clock state could not be compared.
pub fn clock_note(b: &RecordView, h: &RecordView) -> Option<String> {
    (engine_clock(b).is_none() && engine_clock(h).is_none()).then(|| {
        "Neither record holds the engine leg's SM clock (no GPU, or written before the sampler), so clock state was not compared; our absolute figures are judged on the same device by name and driver alone.".into()
    })
}

/// One axis's samples of both legs in both records, and the oracle's A/A spreads there.
pub struct AxisSamples<'a> {
    pub axis: &'a str,
    /// `lower` or `higher`: which way is faster.
    pub better: &'a str,
    pub engine: [&'a [f64]; 2],
    pub oracle: [&'a [f64]; 2],
    /// The oracle's A/A spread on this axis in each record, percent (None: fewer than 2 repeats).
    pub oracle_spread_pct: [Option<f64>; 2],
}

/// How much slower `r` (head/base) is as a time: per-token r - 1, throughput 1/r - 1.
fn slower_by(r: f64, better: &str) -> f64 {
    if better == "higher" {
        1.0 / r - 1.0
    } else {
        r - 1.0
    }
}

fn pct(x: f64) -> String {
    format!("{:+.1}%", x * 100.0)
}

/// Why the ratio ours/oracle is not judged on this axis: the oracle leg did not run, or its own
/// figure moved beyond its noise (with which leg moved, by how much, and what the host probe
/// says). None when the oracle held.
pub fn oracle_moved(s: &AxisSamples, recs: [&RecordView; 2], t: &Thresholds) -> Option<String> {
    for (side, r) in ["base", "head"].iter().zip(recs) {
        if let Some(why) = &r.legs.oracle.not_run {
            return Some(format!(
                "the oracle leg was not run in the {side} record ({why})"
            ));
        }
    }
    let [ob, oh] = s.oracle;
    if ob.is_empty() || oh.is_empty() {
        return None;
    }
    let subject = Subject {
        axis: s.axis,
        better: s.better,
        measure: "oracle",
    };
    let own = judge(subject, ob, oh, None, t);
    let r = own.change?;
    let spread = s
        .oracle_spread_pct
        .iter()
        .flatten()
        .copied()
        .reduce(f64::max);
    let within = spread.is_some_and(|sp| (r - 1.0).abs() * 100.0 <= sp);
    if own.verdict == Verdict::Same || within {
        return None;
    }
    let ours = match (::stats::median(s.engine[0]), ::stats::median(s.engine[1])) {
        (Some(x), Some(y)) if x > 0.0 => format!("ours moved {}", pct(y / x - 1.0)),
        _ => "ours has no figure to set beside it".into(),
    };
    Some(format!(
        "the oracle's own figure moved {} (median {} -> {}; {}{}), while {ours}: {}",
        pct(r - 1.0),
        fmt_num(own.base_median.unwrap_or(0.0)),
        fmt_num(own.head_median.unwrap_or(0.0)),
        match own.p {
            Some(p) => format!("p = {}", fmt_num(p)),
            None => "no rank test".into(),
        },
        match spread {
            Some(sp) => format!(", beyond its A/A spread of {sp:.2}%"),
            None => ", and it has no A/A spread (fewer than two repeats)".into(),
        },
        probe_says(slower_by(r, s.better), recs)
    ))
}

/// What the host probe before the oracle leg says of an oracle that moved by `slower` (as a
/// time: positive is slower).
fn probe_says(slower: f64, [b, h]: [&RecordView; 2]) -> String {
    let probe = |r: &RecordView| r.legs.oracle.host_probe.as_ref().map(|p| p.best_ms);
    let bound: Vec<&str> = [("base", b), ("head", h)]
        .iter()
        .filter(|(_, r)| {
            let s = r.legs.oracle.sampler.summary.as_ref();
            s.and_then(|s| s.host_bound) == Some(true)
        })
        .map(|(side, _)| *side)
        .collect();
    let bound = if bound.is_empty() {
        String::new()
    } else {
        format!(
            " (the oracle was host-bound in the {} record: its GPU idled for much of its battery)",
            bound.join(" and ")
        )
    };
    match (probe(b), probe(h)) {
        (Some(pb), Some(ph)) if pb > 0.0 => {
            let moved = ph / pb - 1.0;
            let words = format!(
                "the host probe moved {} ({} -> {} ms)",
                pct(moved),
                fmt_num(pb),
                fmt_num(ph)
            );
            if moved.abs() >= PROBE_HELD && moved.signum() == slower.signum() {
                if moved.abs() >= 0.5 * slower.abs() {
                    format!("{words}: the host, not our code{bound}")
                } else {
                    format!("{words}, part of the oracle's move: the host, at least in part{bound}")
                }
            } else {
                format!("{words}, so the oracle moved on its own, not with the probe's CPU work{bound}: its noise between runs is larger than within one")
            }
        }
        _ => format!("no host probe in both records says whether the host moved (records before orchestrator 0.4.0 hold none){bound}"),
    }
}

/// A leg's A/A spread (percent) on the axis `compare` names `axis`, from its per-repeat figures.
pub fn spread_pct(t: &TimingsView, axis: &str) -> Option<f64> {
    let n = t.noise();
    let s = match axis {
        "per output token" => n.per_token,
        "time to first token" => n.ttft,
        _ => {
            let (name, b) = batch_of(axis)?;
            match name {
                THROUGHPUT => n.throughput.get(&b).cloned(),
                BATCH_PREFILL => n.batch_prefill.get(&b).cloned(),
                BATCH_STEP => n.batch_step.get(&b).cloned(),
                _ => None,
            }
        }
    };
    s.map(|s| s.spread_pct)
}
