//! The axes of the ratio table: per axis ours | oracle | ratio | which is faster in words,
//! from both legs' records and timings, with the gates' verdicts marking what they withhold.
//! render/table.rs draws them.

use serde::{Deserialize, Serialize};

use crate::gates::GateResult;
use crate::legs::{LegName, LegRecord};
use crate::numbers::timing::{median_of, Timings};
use ::stats::median;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    /// A time: the smaller side is faster.
    Lower,
    /// A rate: the larger side is faster.
    Higher,
    /// Memory: the smaller side uses less.
    LessMemory,
    /// A size that should match (KV pool): no side is better.
    Neither,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Axis {
    pub axis: String,
    pub unit: String,
    pub better: Better,
    pub ours: Option<f64>,
    pub oracle: Option<f64>,
    /// ours / oracle.
    pub ratio: Option<f64>,
    pub words: String,
    /// The leg's timings are refused by a gate: shown, never presented as gated.
    pub ours_refused: bool,
    pub oracle_refused: bool,
    /// Why the axis is not like-for-like, when it is not.
    pub note: Option<String>,
}

/// Within this relative difference two figures are called "same".
const SAME: f64 = 0.01;

pub fn words(better: Better, ours: f64, oracle: f64) -> String {
    if ours <= 0.0 || oracle <= 0.0 || !ours.is_finite() || !oracle.is_finite() {
        return "no ratio".into();
    }
    let r = ours / oracle;
    if (r - 1.0).abs() < SAME {
        return "same".into();
    }
    let (ours_wins, f) = match better {
        Better::Lower | Better::LessMemory => (r < 1.0, if r < 1.0 { 1.0 / r } else { r }),
        Better::Higher | Better::Neither => (r > 1.0, if r > 1.0 { r } else { 1.0 / r }),
    };
    let f = fmt_factor(f);
    match (better, ours_wins) {
        (Better::Lower | Better::Higher, true) => format!("ours {f}x faster"),
        (Better::Lower | Better::Higher, false) => format!("oracle {f}x faster"),
        (Better::LessMemory, true) => format!("ours uses {f}x less"),
        (Better::LessMemory, false) => format!("oracle uses {f}x less"),
        (Better::Neither, true) => format!("ours {f}x larger"),
        (Better::Neither, false) => format!("ours {f}x smaller"),
    }
}

fn fmt_factor(f: f64) -> String {
    if f >= 100.0 {
        format!("{f:.0}")
    } else if f >= 10.0 {
        format!("{f:.1}")
    } else {
        format!("{f:.2}")
    }
}

pub(crate) fn axis(
    name: String,
    unit: &str,
    better: Better,
    ours: Option<f64>,
    oracle: Option<f64>,
) -> Axis {
    let (ratio, w) = match (ours, oracle) {
        (Some(a), Some(b)) if b != 0.0 => (Some(a / b), words(better, a, b)),
        (Some(_), None) => (None, "not measured on the oracle leg".into()),
        (None, Some(_)) => (None, "not measured on our leg".into()),
        _ => (None, "not measured on either leg".into()),
    };
    Axis {
        axis: name,
        unit: unit.into(),
        better,
        ours,
        oracle,
        ratio,
        words: w,
        ours_refused: false,
        oracle_refused: false,
        note: None,
    }
}

/// The axes this issue measures, from both legs' records and timings.
pub fn axes(
    engine: &LegRecord,
    oracle: &LegRecord,
    te: &Timings,
    to: &Timings,
    gates: &[GateResult],
) -> Vec<Axis> {
    let refused = |leg: LegName| {
        gates
            .iter()
            .filter_map(GateResult::refusal)
            .any(|r| r.refuses_timings_of() == Some(leg))
    };
    let kv_refused = gates
        .iter()
        .any(|g| g.gate == "kv" && g.refusal().is_some());
    let mut v = vec![];
    let n = te.per_token_s.len().max(to.per_token_s.len());
    v.push(axis(
        format!("per output token, warm (median, n={n})"),
        "s",
        Better::Lower,
        median_of(&te.per_token_s),
        median_of(&to.per_token_s),
    ));
    let mut batches: Vec<u32> = te
        .throughput_tok_s
        .keys()
        .chain(to.throughput_tok_s.keys())
        .copied()
        .collect();
    batches.sort_unstable();
    batches.dedup();
    for b in batches {
        v.push(axis(
            format!("output throughput, batch {b}"),
            "tok/s",
            Better::Higher,
            te.throughput_tok_s.get(&b).and_then(|x| median(x)),
            to.throughput_tok_s.get(&b).and_then(|x| median(x)),
        ));
    }
    v.push(axis(
        "time to first token (median)".into(),
        "s",
        Better::Lower,
        median_of(&te.ttft_s),
        median_of(&to.ttft_s),
    ));
    let load = |l: &LegRecord| l.ready.as_ref().map(|r| r.load_s);
    v.push(axis(
        "load (to ready)".into(),
        "s",
        Better::Lower,
        load(engine),
        load(oracle),
    ));
    let mem =
        |l: &LegRecord| (l.host_mem.samples > 0).then(|| l.host_mem.peak_rss_bytes as f64 / 1e6);
    let mut m = axis(
        "peak host memory".into(),
        "MB",
        Better::LessMemory,
        mem(engine),
        mem(oracle),
    );
    if kv_refused {
        m.note = Some("KV pools not matched: raw, not like-for-like".into());
    }
    v.push(m);
    let kv = |l: &LegRecord| {
        l.ready
            .as_ref()
            .and_then(|r| r.kv.as_ref())
            .map(|k| k.capacity_tokens as f64)
    };
    let mut k = axis(
        "KV pool".into(),
        "tokens",
        Better::Neither,
        kv(engine),
        kv(oracle),
    );
    if kv_refused {
        k.note = Some("could NOT be matched".into());
    }
    v.push(k);
    // GPU axes from the sampler summaries: absent (no GPU) is "not measured", never zero.
    let gsum = |l: &LegRecord| l.sampler.summary.clone();
    let gpu_mem = |l: &LegRecord| {
        gsum(l)
            .and_then(|s| s.peak_gpu_mem_bytes)
            .map(|b| b as f64 / 1e6)
    };
    let mut g = axis(
        "peak GPU memory".into(),
        "MB",
        Better::LessMemory,
        gpu_mem(engine),
        gpu_mem(oracle),
    );
    let by_device: Vec<String> = [engine, oracle]
        .iter()
        .filter(|l| gsum(l).is_some_and(|s| s.peak_gpu_mem_source == "device above its first poll"))
        .map(|l| l.leg.to_string())
        .collect();
    let mut notes = vec![];
    if !by_device.is_empty() {
        notes.push(format!(
            "{}: device memory above the leg's start (the driver named none of its processes)",
            by_device.join(", ")
        ));
    }
    if kv_refused {
        notes.push("KV pools not matched: raw, not like-for-like".into());
    }
    g.note = (!notes.is_empty()).then(|| notes.join("; "));
    v.push(g);
    let busy = |l: &LegRecord| gsum(l).and_then(|s| s.busy_fraction).map(|b| b * 100.0);
    let mut b = axis(
        "GPU busy (battery)".into(),
        "%",
        Better::Neither,
        busy(engine),
        busy(oracle),
    );
    b.note = Some("share of driver utilization samples above 0%".into());
    v.push(b);
    let (re, ro) = (refused(LegName::Engine), refused(LegName::Oracle));
    for a in &mut v {
        a.ours_refused = re;
        a.oracle_refused = ro;
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_say_who_is_faster_and_by_how_much() {
        assert_eq!(words(Better::Lower, 1.0, 1.32), "ours 1.32x faster");
        assert_eq!(words(Better::Lower, 2.0, 1.0), "oracle 2.00x faster");
        assert_eq!(words(Better::Higher, 10.0, 20.0), "oracle 2.00x faster");
        assert_eq!(words(Better::Higher, 1.005, 1.0), "same");
        assert_eq!(
            words(Better::LessMemory, 44616.0, 70974.0),
            "ours uses 1.59x less"
        );
        assert_eq!(
            words(Better::Neither, 8192.0, 644096.0),
            "ours 78.6x smaller"
        );
        assert_eq!(
            words(Better::Lower, 10.3194, 0.014369),
            "oracle 718x faster"
        );
    }
}
