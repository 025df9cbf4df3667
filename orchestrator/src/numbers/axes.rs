//! The axes of the ratio table: per axis ours | oracle | ratio | which is faster in words,
//! from both legs' records and timings, with the gates' verdicts marking what they withhold.
//! render/table.rs draws them.

use serde::{Deserialize, Serialize};

use crate::gates::scope::{KV_POOL, PEAK_GPU_MEMORY, PEAK_HOST_MEMORY};
use crate::gates::{GateResult, Scope};
use crate::legs::sampler::summary::HOST_BOUND_BELOW_PCT;
use crate::legs::{LegName, LegRecord};
use crate::numbers::load;
use crate::numbers::timing::{median_of, Timings};
use ::stats::median;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
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
    /// A kind this orchestrator does not know, read from a record (or none given there).
    #[default]
    #[serde(other)]
    Other,
}

impl Better {
    /// As the record spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Better::Lower => "lower",
            Better::Higher => "higher",
            Better::LessMemory => "less_memory",
            Better::Neither => "neither",
            Better::Other => "other",
        }
    }
}

/// One row of the ratio table. Every field but the name has a default, so that the archive
/// reads records of other versions of the same schema (record/archive.rs).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Axis {
    pub axis: String,
    #[serde(default)]
    pub unit: String,
    #[serde(default)]
    pub better: Better,
    #[serde(default)]
    pub ours: Option<f64>,
    #[serde(default)]
    pub oracle: Option<f64>,
    /// ours / oracle.
    #[serde(default)]
    pub ratio: Option<f64>,
    #[serde(default)]
    pub words: String,
    /// The leg's timings are refused by a gate: shown, never presented as gated.
    #[serde(default)]
    pub ours_refused: bool,
    #[serde(default)]
    pub oracle_refused: bool,
    /// Why the axis is not like-for-like, when it is not.
    #[serde(default)]
    pub note: Option<String>,
}

impl Axis {
    /// A speed axis: a time or a rate, where "faster" means something.
    pub fn is_speed(&self) -> bool {
        matches!(self.better, Better::Lower | Better::Higher)
    }
    /// A size: memory or a pool (or named so).
    pub fn is_size(&self) -> bool {
        matches!(self.better, Better::LessMemory | Better::Neither)
            || self.axis.contains("memory")
            || self.axis.contains("KV")
    }
    /// Whether a refusal that withholds `scope` concerns this axis.
    pub fn concerned_by(&self, scope: &Scope) -> bool {
        scope.axes.concern(self.is_speed(), self.is_size())
    }
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
        Better::Higher | Better::Neither | Better::Other => {
            (r > 1.0, if r > 1.0 { r } else { 1.0 / r })
        }
    };
    let f = fmt_factor(f);
    match (better, ours_wins) {
        (Better::Lower | Better::Higher, true) => format!("ours {f}x faster"),
        (Better::Lower | Better::Higher, false) => format!("oracle {f}x faster"),
        (Better::LessMemory, true) => format!("ours uses {f}x less"),
        (Better::LessMemory, false) => format!("oracle uses {f}x less"),
        (Better::Neither | Better::Other, true) => format!("ours {f}x larger"),
        (Better::Neither | Better::Other, false) => format!("ours {f}x smaller"),
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

/// Each leg's mean GPU utilization over its battery.
pub const UTILIZATION: &str = "GPU utilization, mean (battery)";

/// The axis whose ratio the A/A noise and the clock's explainable gap are set against.
pub const PER_TOKEN: &str = "per output token";

/// The per-token ratio ours / oracle, when both legs have one.
pub fn per_token_ratio(axes: &[Axis]) -> Option<f64> {
    axes.iter()
        .find(|x| x.axis.starts_with(PER_TOKEN))
        .and_then(|x| x.ratio)
}

/// The axes a run measures, from both legs' records and timings; the refusals among `gates`
/// mark the figures and note the axes their scopes name.
pub fn axes(
    engine: &LegRecord,
    oracle: &LegRecord,
    te: &Timings,
    to: &Timings,
    gates: &[GateResult],
) -> Vec<Axis> {
    let mut v = timing_axes(te, to);
    v.extend(resource_axes(engine, oracle));
    withhold(&mut v, gates);
    v
}

/// Per output token, output throughput at each batch size, time to first token.
fn timing_axes(te: &Timings, to: &Timings) -> Vec<Axis> {
    let n = te.per_token_s.len().max(to.per_token_s.len());
    let mut v = vec![axis(
        format!("{PER_TOKEN}, warm (median, n={n})"),
        "s",
        Better::Lower,
        median_of(&te.per_token_s),
        median_of(&to.per_token_s),
    )];
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
            batch_axis(THROUGHPUT, b),
            "tok/s",
            Better::Higher,
            te.throughput_tok_s.get(&b).and_then(|x| median(x)),
            to.throughput_tok_s.get(&b).and_then(|x| median(x)),
        ));
    }
    // A batch's prefill and decode step, where either leg split it (batch sizes above 1).
    let split: std::collections::BTreeSet<u32> = te
        .batch_prefill_s
        .keys()
        .chain(to.batch_prefill_s.keys())
        .copied()
        .collect();
    type ByBatch = fn(&Timings) -> &std::collections::BTreeMap<u32, Vec<f64>>;
    for b in split {
        let phases: [(&str, String, ByBatch); 2] = [
            (
                BATCH_PREFILL,
                format!("median wall of max_tokens=1 at batch {b}: every prompt prefilled to its first token"),
                |t| &t.batch_prefill_s,
            ),
            (
                BATCH_STEP,
                format!("median of (wall(max_tokens=N) - wall(max_tokens=1)) / (N - 1) at batch {b}: one step of the whole batch"),
                |t| &t.batch_step_s,
            ),
        ];
        for (name, note, of) in phases {
            let med = |t: &Timings| of(t).get(&b).and_then(|x| median(x));
            let mut a = axis(batch_axis(name, b), "s", Better::Lower, med(te), med(to));
            a.note = Some(note);
            v.push(a);
        }
    }
    v.push(axis(
        "time to first token (median)".into(),
        "s",
        Better::Lower,
        median_of(&te.ttft_s),
        median_of(&to.ttft_s),
    ));
    v
}

/// The axis of the throughput at a batch size.
pub const THROUGHPUT: &str = "output throughput";

/// The axis of a batch's prefill (its max_tokens=1 request), by batch size.
pub const BATCH_PREFILL: &str = "prefill";

/// The axis of a batch's decode step, by batch size.
pub const BATCH_STEP: &str = "decode step";

/// The name of axis `name` at batch size `b`, as the table, `compare` and the split name it.
pub fn batch_axis(name: &str, b: u32) -> String {
    format!("{name}, batch {b}")
}

/// The axis name and batch size of a [`batch_axis`] name.
pub fn batch_of(axis: &str) -> Option<(&str, u32)> {
    let (name, b) = axis.rsplit_once(", batch ")?;
    Some((name, b.parse().ok()?))
}

/// Load time, peak host memory, the KV pool, and from the GPU sampler peak GPU memory and how
/// busy the GPU was (absent without a GPU: "not measured", never zero).
fn resource_axes(engine: &LegRecord, oracle: &LegRecord) -> Vec<Axis> {
    let both = |f: &dyn Fn(&LegRecord) -> Option<f64>| (f(engine), f(oracle));
    let (e, o) = both(&|l| load::first_start(l).map(|r| r.load_s));
    let mut load = axis(load::LOAD.into(), "s", Better::Lower, e, o);
    load.note = load::note(engine, oracle);
    let (e, o) =
        both(&|l| (l.host_mem.samples > 0).then(|| l.host_mem.peak_rss_bytes as f64 / 1e6));
    let host = axis(PEAK_HOST_MEMORY.into(), "MB", Better::LessMemory, e, o);
    let (e, o) = both(&|l| {
        let kv = l.ready.as_ref().and_then(|r| r.kv.as_ref());
        kv.map(|k| k.tokens() as f64)
    });
    let pool = axis(KV_POOL.into(), "tokens", Better::Neither, e, o);
    let summary = |l: &LegRecord| l.sampler.summary.clone();
    let (e, o) = both(&|l| {
        let bytes = summary(l).and_then(|s| s.peak_gpu_mem_bytes);
        bytes.map(|b| b as f64 / 1e6)
    });
    let mut gpu = axis(PEAK_GPU_MEMORY.into(), "MB", Better::LessMemory, e, o);
    let by_device: Vec<String> = [engine, oracle]
        .iter()
        .filter(|l| {
            summary(l).is_some_and(|s| s.peak_gpu_mem_source == "device above its first poll")
        })
        .map(|l| l.leg.to_string())
        .collect();
    gpu.note = (!by_device.is_empty()).then(|| {
        format!(
            "{}: device memory above the leg's start (the driver named none of its processes)",
            by_device.join(", ")
        )
    });
    let (e, o) = both(&|l| summary(l).and_then(|s| s.busy_fraction).map(|b| b * 100.0));
    let mut busy = axis("GPU busy (battery)".into(), "%", Better::Neither, e, o);
    busy.note = Some("share of driver utilization samples above 0%".into());
    vec![load, host, pool, gpu, busy, utilization(engine, oracle)]
}

/// Each leg's mean driver utilization over its battery, naming a host-bound leg (mean below
/// `HOST_BOUND_BELOW_PCT`): "GPU busy" counts any sample above 0%, so a leg whose GPU idles
/// half of every step reads 100% busy there and about 50% here.
fn utilization(engine: &LegRecord, oracle: &LegRecord) -> Axis {
    let mean = |l: &LegRecord| l.sampler.summary.as_ref().and_then(|s| s.util_mean_pct);
    let mut a = axis(
        UTILIZATION.into(),
        "%",
        Better::Neither,
        mean(engine),
        mean(oracle),
    );
    let bound: Vec<String> = [engine, oracle]
        .iter()
        .filter(|l| l.sampler.summary.as_ref().and_then(|s| s.host_bound) == Some(true))
        .map(|l| l.leg.to_string())
        .collect();
    a.note = Some(match bound.as_slice() {
        [] => format!("mean of driver utilization samples; below {HOST_BOUND_BELOW_PCT}% a leg is host-bound"),
        b => format!(
            "HOST-BOUND: {} (mean below {HOST_BOUND_BELOW_PCT}%: the GPU idled for a large share of the battery, so the time moves with the host)",
            b.join(", ")
        ),
    });
    a
}

/// Marks the figures of each leg a refusal's scope names as refused (on every axis: shown,
/// never presented as gated) and adds the notes the scopes write on named axes.
fn withhold(axes: &mut [Axis], gates: &[GateResult]) {
    let scopes: Vec<Scope> = gates.iter().filter_map(GateResult::withholds).collect();
    let refused = |leg: LegName| scopes.iter().any(|s| s.timings_of.contains(&leg));
    let (re, ro) = (refused(LegName::Engine), refused(LegName::Oracle));
    for a in axes {
        let mut notes: Vec<String> = a.note.take().into_iter().collect();
        for s in &scopes {
            notes.extend(s.notes_on(&a.axis).map(str::to_string));
        }
        a.note = (!notes.is_empty()).then(|| notes.join("; "));
        a.ours_refused = re;
        a.oracle_refused = ro;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gates::kv::{KvGate, KvReason};
    use crate::gates::testing::sampled;
    use crate::gates::token::{TokenGate, TokenReason};
    use crate::legs::protocol::Kv;

    #[test]
    fn refusals_mark_the_figures_and_note_the_axes_their_scopes_name() {
        let (e, o) = (sampled("engine", 1980), sampled("oracle", 1980));
        let kv = |n: u64| {
            Box::new(Kv {
                block_size: 16,
                num_blocks: n,
                capacity_tokens: 16 * n,
                bytes: None,
                extra: Default::default(),
            })
        };
        let refused = [
            GateResult::refused(
                &KvGate,
                None,
                &KvReason::KvUnmatched {
                    engine: kv(64),
                    oracle: kv(32),
                    tolerance_blocks: 1,
                    resized: None,
                },
            ),
            GateResult::refused(
                &TokenGate,
                Some(LegName::Engine),
                &TokenReason::NoGolden {
                    leg: LegName::Engine,
                    device: "cpu".into(),
                    dtype: "float32".into(),
                },
            ),
        ];
        let t = Timings::default();
        let v = axes(&e, &o, &t, &t, &refused);
        let note = |name: &str| {
            v.iter()
                .find(|a| a.axis == name)
                .and_then(|a| a.note.clone())
        };
        let raw = "KV pools not matched: raw, not like-for-like";
        assert_eq!(note("peak host memory").as_deref(), Some(raw));
        assert_eq!(note("KV pool").as_deref(), Some("could NOT be matched"));
        assert_eq!(note("peak GPU memory").as_deref(), Some(raw));
        assert_eq!(
            note("GPU busy (battery)").as_deref(),
            Some("share of driver utilization samples above 0%")
        );
        assert_eq!(note("load (to ready)"), None);
        // The token gate's refusal of the engine marks our figures on every axis, not theirs.
        assert!(v.iter().all(|a| a.ours_refused && !a.oracle_refused));
    }

    #[test]
    fn each_batch_above_1_gets_its_prefill_and_decode_step_beside_its_throughput() {
        let (e, o) = (sampled("engine", 1980), sampled("oracle", 1980));
        let mut te = Timings::default();
        te.batch_prefill_s.insert(8, vec![0.09, 0.08, 0.10]);
        te.batch_step_s.insert(8, vec![0.0055, 0.0050, 0.0060]);
        let mut to = Timings::default();
        to.batch_prefill_s.insert(8, vec![0.06, 0.06]);
        to.batch_step_s.insert(8, vec![0.005, 0.005]);
        let v = axes(&e, &o, &te, &to, &[]);
        let row = |name: &str| v.iter().find(|a| a.axis == name).cloned().unwrap();
        let prefill = row("prefill, batch 8");
        assert_eq!((prefill.ours, prefill.oracle), (Some(0.09), Some(0.06)));
        assert_eq!(prefill.words, "oracle 1.50x faster");
        let step = row("decode step, batch 8");
        assert_eq!((step.ours, step.oracle), (Some(0.0055), Some(0.005)));
        assert_eq!(step.words, "oracle 1.10x faster");
        assert!(step.is_speed() && step.note.unwrap().contains("one step of the whole batch"));
        // Batch 1 has neither: its split is the per-token recipe's.
        assert!(!v.iter().any(|a| a.axis.ends_with(", batch 1")));
    }

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
