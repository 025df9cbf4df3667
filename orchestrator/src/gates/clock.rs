//! The clock gate: a ratio between two legs means something only if the GPU was in a comparable
//! state during both. From each leg's sampler summary (battery window, legs/sampler/summary.rs):
//! busy enough to be GPU work, SM clock steady, no throttle beyond idle and application clocks,
//! persistence on, the same boot, and both legs at the same median SM clock. Each failed
//! condition is its own [`ClockReason`], naming the leg and the figures, as the reference
//! report's six reasons do. Also standalone: `orchestrator clock compare A B`.

use serde::{Deserialize, Serialize};
use std::fmt;

use super::{Axes, Gate, GateInput, GateResult, Scope};
use crate::legs::sampler::GpuSummary;
use crate::legs::LegName;
use crate::unit::GatesCfg;

/// The gate's thresholds ([gates] clock_* in the unit; defaults from DESIGN.md).
#[derive(Debug, Clone)]
pub struct ClockCfg {
    pub min_busy_pct: f64,
    pub max_spread_pct: f64,
    pub allowed_throttle: Vec<String>,
    pub require_persistence: bool,
    pub require_same_boot: bool,
    pub max_median_offset_pct: f64,
    pub basis: f64,
}

impl From<&GatesCfg> for ClockCfg {
    fn from(g: &GatesCfg) -> ClockCfg {
        ClockCfg {
            min_busy_pct: g.clock_min_busy_pct,
            max_spread_pct: g.clock_max_spread_pct,
            allowed_throttle: g.clock_allowed_throttle.clone(),
            require_persistence: g.clock_require_persistence,
            require_same_boot: g.clock_require_same_boot,
            max_median_offset_pct: g.clock_max_median_offset_pct,
            basis: g.clock_basis,
        }
    }
}

impl Default for ClockCfg {
    fn default() -> Self {
        ClockCfg::from(&GatesCfg::default())
    }
}

/// One leg as the gate sees it.
#[derive(Debug, Clone)]
pub struct ClockSide<'a> {
    pub leg: String,
    pub boot_id: Option<&'a str>,
    pub summary: &'a GpuSummary,
}

/// Every way the clock gate refuses a pair. Display is the whole sentence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum ClockReason {
    /// The window had no utilization or clock samples to judge.
    NoSamples { leg: String, what: String },
    Idle {
        leg: String,
        /// "battery", or "whole series" for a series with no battery mark.
        window: String,
        busy_pct: f64,
        busy_samples: u64,
        samples: u64,
        floor_pct: f64,
        other_leg: String,
        other_busy_pct: Option<f64>,
    },
    Spread {
        leg: String,
        spread_pct: f64,
        p5_mhz: f64,
        median_mhz: f64,
        p95_mhz: f64,
        ceiling_pct: f64,
    },
    Throttled {
        leg: String,
        /// (name, share of polls) for each reason beyond the allowed ones.
        reasons: Vec<(String, f64)>,
    },
    PersistenceOff {
        leg: String,
        off_polls: u64,
        polls: u64,
    },
    BootDiffers {
        a_leg: String,
        a_boot: String,
        b_leg: String,
        b_boot: String,
    },
    MedianOffset {
        a_leg: String,
        a_mhz: f64,
        b_leg: String,
        b_mhz: f64,
        offset_pct: f64,
        tolerance_pct: f64,
    },
}

impl fmt::Display for ClockReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClockReason::NoSamples { leg, what } => write!(
                f,
                "The {leg} leg's window holds no {what} samples, so its GPU state cannot be judged. Hint: lengthen the battery (repeat, max_tokens) or shorten [sampler] nvml_period_ms."
            ),
            ClockReason::Idle {
                leg,
                window,
                busy_pct,
                busy_samples,
                samples,
                floor_pct,
                other_leg,
                other_busy_pct,
            } => {
                write!(
                    f,
                    "The GPU was busy in only {busy_pct:.2}% of the {leg} leg's {window} window ({busy_samples} of {samples} utilization samples above 0%) against a {floor_pct}% floor"
                )?;
                if let Some(o) = other_busy_pct {
                    write!(f, " (the {other_leg} leg: {o:.2}%)")?;
                }
                write!(
                    f,
                    ", so its time is not GPU time and a clock comparison cannot attribute it. Hint: the leg is host-bound (transfers, host-side layers, Python); find what keeps the GPU idle before reading its ratio as a kernel speed."
                )
            }
            ClockReason::Spread {
                leg,
                spread_pct,
                p5_mhz,
                median_mhz,
                p95_mhz,
                ceiling_pct,
            } => write!(
                f,
                "The {leg} leg's SM clock spread {spread_pct:.2}% (p5 {p5_mhz:.0}, median {median_mhz:.0}, p95 {p95_mhz:.0} MHz) against a {ceiling_pct}% ceiling: the clock moved while it ran. Hint: look for power or thermal limits and a GPU that was idle between requests (clocks drop while idle)."
            ),
            ClockReason::Throttled { leg, reasons } => {
                let list: Vec<String> = reasons
                    .iter()
                    .map(|(n, s)| format!("{n} in {:.1}% of polls", s * 100.0))
                    .collect();
                write!(
                    f,
                    "The {leg} leg's GPU was throttled: {}. Hint: a power cap, thermal or hardware slowdown lowers clocks independently of the engine; rerun on a cool, uncapped GPU (observe only: never change its clocks here).",
                    list.join(", ")
                )
            }
            ClockReason::PersistenceOff {
                leg,
                off_polls,
                polls,
            } => write!(
                f,
                "Persistence mode was Disabled during the {leg} leg ({off_polls} of {polls} polls): the driver may tear down and re-initialize the GPU between processes, which moves load times and clocks. Hint: ask the machine's owner to enable persistence (nvidia-smi -pm 1); this tool only observes."
            ),
            ClockReason::BootDiffers {
                a_leg,
                a_boot,
                b_leg,
                b_boot,
            } => write!(
                f,
                "The legs ran on different boots (the {a_leg} leg on boot {a_boot}, the {b_leg} leg on boot {b_boot}): the machine restarted between them, so driver state and clocks may differ. Hint: run both legs in one `orchestrator run`."
            ),
            ClockReason::MedianOffset {
                a_leg,
                a_mhz,
                b_leg,
                b_mhz,
                offset_pct,
                tolerance_pct,
            } => write!(
                f,
                "The median SM clocks differ by {offset_pct:.2}% (the {a_leg} leg {a_mhz:.0} MHz, the {b_leg} leg {b_mhz:.0} MHz) against a {tolerance_pct}% tolerance: part of the ratio is the clock, not the engine. Hint: the record's clock_explain says how much of the gap the offset could explain."
            ),
        }
    }
}

/// (a - b) / b x 100: how far a's median SM clock is from b's.
pub fn median_offset_pct(a: &GpuSummary, b: &GpuSummary) -> Option<f64> {
    let (a, b) = (a.sm_mhz.as_ref()?.median, b.sm_mhz.as_ref()?.median);
    (b > 0.0).then(|| (a - b) / b * 100.0)
}

fn one_leg(s: &ClockSide, other: &ClockSide, cfg: &ClockCfg, out: &mut Vec<ClockReason>) {
    let sum = s.summary;
    match sum.busy_fraction {
        None => out.push(ClockReason::NoSamples {
            leg: s.leg.clone(),
            what: "utilization".into(),
        }),
        Some(b) if b * 100.0 < cfg.min_busy_pct => out.push(ClockReason::Idle {
            leg: s.leg.clone(),
            window: sum.window.clone(),
            busy_pct: b * 100.0,
            busy_samples: sum.busy_samples,
            samples: sum.util_samples,
            floor_pct: cfg.min_busy_pct,
            other_leg: other.leg.clone(),
            other_busy_pct: other.summary.busy_fraction.map(|x| x * 100.0),
        }),
        Some(_) => {}
    }
    match &sum.sm_mhz {
        None => out.push(ClockReason::NoSamples {
            leg: s.leg.clone(),
            what: "SM clock".into(),
        }),
        Some(c) if c.spread_pct > cfg.max_spread_pct => out.push(ClockReason::Spread {
            leg: s.leg.clone(),
            spread_pct: c.spread_pct,
            p5_mhz: c.p5,
            median_mhz: c.median,
            p95_mhz: c.p95,
            ceiling_pct: cfg.max_spread_pct,
        }),
        Some(_) => {}
    }
    let beyond: Vec<(String, f64)> = sum
        .throttle
        .iter()
        .filter(|t| !cfg.allowed_throttle.contains(&t.name))
        .map(|t| (t.name.clone(), t.share))
        .collect();
    if !beyond.is_empty() {
        out.push(ClockReason::Throttled {
            leg: s.leg.clone(),
            reasons: beyond,
        });
    }
    // Unknown persistence (the query unsupported) is not a pass: it is refused as not shown on.
    if cfg.require_persistence && sum.persistence != Some(true) {
        out.push(ClockReason::PersistenceOff {
            leg: s.leg.clone(),
            off_polls: sum.persistence_off_polls,
            polls: sum.polls,
        });
    }
}

/// Every reason the pair is not comparable; empty when it is.
pub fn compare(a: &ClockSide, b: &ClockSide, cfg: &ClockCfg) -> Vec<ClockReason> {
    let mut out = vec![];
    one_leg(a, b, cfg, &mut out);
    one_leg(b, a, cfg, &mut out);
    if cfg.require_same_boot {
        let show = |x: Option<&str>| x.unwrap_or("unknown").to_string();
        if a.boot_id.is_none() || a.boot_id != b.boot_id {
            out.push(ClockReason::BootDiffers {
                a_leg: a.leg.clone(),
                a_boot: show(a.boot_id),
                b_leg: b.leg.clone(),
                b_boot: show(b.boot_id),
            });
        }
    }
    if let Some(off) = median_offset_pct(a.summary, b.summary) {
        if off.abs() > cfg.max_median_offset_pct {
            out.push(ClockReason::MedianOffset {
                a_leg: a.leg.clone(),
                a_mhz: a.summary.sm_mhz.as_ref().map_or(0.0, |c| c.median),
                b_leg: b.leg.clone(),
                b_mhz: b.summary.sm_mhz.as_ref().map_or(0.0, |c| c.median),
                offset_pct: off,
                tolerance_pct: cfg.max_median_offset_pct,
            });
        }
    }
    out
}

pub struct ClockGate;

/// How the record keeps a clock refusal: `{"refusal": "clock", "reason": {...}}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "refusal", rename_all = "snake_case")]
pub enum ClockRefusal {
    Clock { reason: ClockReason },
}

impl fmt::Display for ClockRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ClockRefusal::Clock { reason } = self;
        write!(f, "{reason}")
    }
}

impl Gate for ClockGate {
    fn name(&self) -> &'static str {
        "clock"
    }

    /// The tokens were right: a GPU state that is not comparable concerns the times and rates
    /// (the ratios), not whose figures they are.
    fn scope(&self, _leg: Option<LegName>) -> Scope {
        Scope::axes(Axes::Speed)
    }

    fn judge(&self, input: &GateInput) -> Vec<GateResult> {
        let cfg = ClockCfg::from(&input.unit.config.gates);
        let side = |leg: LegName| {
            let s = &input.leg(leg).sampler;
            match &s.summary {
                Some(sum) => Ok(ClockSide {
                    leg: leg.to_string(),
                    boot_id: s.boot_id.as_deref(),
                    summary: sum,
                }),
                None => Err(match &s.no_gpu {
                    Some(why) => format!("no GPU: {why}"),
                    None => format!("the {leg} leg was not sampled (it never started)"),
                }),
            }
        };
        let (e, o) = match (side(LegName::Engine), side(LegName::Oracle)) {
            (Ok(e), Ok(o)) => (e, o),
            (Err(why), _) | (_, Err(why)) => {
                return vec![GateResult::not_applicable(self, None, why)]
            }
        };
        // A leg that never reached its battery has no window to judge; its failure is the
        // leg gate's refusal, and judging its load instead would only add noise.
        for leg in [LegName::Engine, LegName::Oracle] {
            if !input.leg(leg).measured() {
                return vec![GateResult::not_applicable(
                    self,
                    None,
                    format!("the {leg} leg did not complete its battery"),
                )];
            }
        }
        let reasons = compare(&e, &o, &cfg);
        if reasons.is_empty() {
            return vec![GateResult::pass(self, None, pass_text(&e, &o))];
        }
        reasons
            .into_iter()
            .map(|reason| {
                let leg = reason_leg(&reason);
                GateResult::refused(self, leg, &ClockRefusal::Clock { reason })
            })
            .collect()
    }
}

fn reason_leg(r: &ClockReason) -> Option<LegName> {
    let leg = match r {
        ClockReason::NoSamples { leg, .. }
        | ClockReason::Idle { leg, .. }
        | ClockReason::Spread { leg, .. }
        | ClockReason::Throttled { leg, .. }
        | ClockReason::PersistenceOff { leg, .. } => leg,
        _ => return None,
    };
    match leg.as_str() {
        "engine" => Some(LegName::Engine),
        "oracle" => Some(LegName::Oracle),
        _ => None,
    }
}

/// What a comparable pair looked like, in words.
pub fn pass_text(a: &ClockSide, b: &ClockSide) -> String {
    let one = |s: &ClockSide| {
        format!(
            "{} busy {:.1}%, SM median {:.0} MHz spread {:.2}%",
            s.leg,
            s.summary.busy_fraction.unwrap_or(0.0) * 100.0,
            s.summary.sm_mhz.as_ref().map_or(0.0, |c| c.median),
            s.summary.sm_mhz.as_ref().map_or(0.0, |c| c.spread_pct)
        )
    };
    format!(
        "comparable GPU state: {}; {}; no throttle beyond idle/application clocks, persistence on, same boot, median offset {:.2}%",
        one(a),
        one(b),
        median_offset_pct(a.summary, b.summary).unwrap_or(0.0)
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::gates::testing::{judge as judge_gate, record, sampled};
    use crate::gates::Verdict;
    use crate::legs::sampler::summary::summarize;
    use crate::legs::sampler::Row;

    pub const BOOT: &str = "1c2d";

    /// A synthetic series: 200 polls 20 ms apart inside a battery window, with the given SM
    /// clock per poll, throttle bits, persistence, and utilization samples.
    pub fn series(
        sm: impl Fn(usize) -> u32,
        throttle: u64,
        persist: bool,
        busy: usize,
    ) -> Vec<Row> {
        let t0 = 1_000_000u64;
        let mut rows = vec![Row::Phase {
            t_us: t0,
            phase: "battery".into(),
        }];
        for i in 0..200 {
            let t_us = t0 + 1 + i as u64 * 20_000;
            rows.push(Row::Gpu {
                t_us,
                phase: "battery".into(),
                sm_mhz: Some(sm(i)),
                mem_mhz: Some(3201),
                power_mw: Some(300_000),
                temp_c: Some(50),
                throttle: Some(throttle),
                persistence: Some(persist),
                used_bytes: Some(1 << 30),
                procs: None,
            });
            rows.push(Row::Util {
                t_us,
                phase: "battery".into(),
                pct: if i < busy { 90 } else { 0 },
                source: "buffer".into(),
            });
        }
        rows.push(Row::Phase {
            t_us: t0 + 200 * 20_000,
            phase: "shutdown".into(),
        });
        rows
    }

    pub fn clean() -> GpuSummary {
        summarize(&series(|_| 1980, 0, true, 200))
    }

    fn judge(a: &GpuSummary, b: &GpuSummary, boot_b: &str) -> Vec<ClockReason> {
        compare(
            &ClockSide {
                leg: "engine".into(),
                boot_id: Some(BOOT),
                summary: a,
            },
            &ClockSide {
                leg: "oracle".into(),
                boot_id: Some(boot_b),
                summary: b,
            },
            &ClockCfg::default(),
        )
    }

    #[test]
    fn a_clean_pair_is_comparable() {
        assert_eq!(judge(&clean(), &clean(), BOOT), vec![]);
        // Idle and application-clock reasons are allowed.
        let allowed = summarize(&series(|_| 1980, 0x1 | 0x2, true, 200));
        assert_eq!(judge(&allowed, &clean(), BOOT), vec![]);
    }

    #[test]
    fn an_idle_leg_is_refused_with_both_busy_fractions() {
        // 12 of 200 samples busy: 6%.
        let idle = summarize(&series(|_| 1980, 0, true, 12));
        let r = judge(&idle, &clean(), BOOT);
        assert_eq!(r.len(), 1, "{r:?}");
        let s = r[0].to_string();
        assert!(matches!(r[0], ClockReason::Idle { .. }));
        assert!(s.contains("6.00%") && s.contains("12 of 200"), "{s}");
        assert!(
            s.contains("50% floor") && s.contains("oracle leg: 100.00%"),
            "{s}"
        );
    }

    #[test]
    fn a_wandering_clock_is_refused_with_its_spread() {
        // Alternating 1900/2010 MHz: spread (2010 - 1900) / 1955 = 5.6%.
        let wander = summarize(&series(
            |i| if i % 2 == 0 { 1900 } else { 2010 },
            0,
            true,
            200,
        ));
        let r = judge(&clean(), &wander, BOOT);
        assert!(
            r.iter()
                .any(|x| matches!(x, ClockReason::Spread { leg, .. } if leg == "oracle")),
            "{r:?}"
        );
        let s = r
            .iter()
            .find(|x| matches!(x, ClockReason::Spread { .. }))
            .unwrap();
        assert!(s.to_string().contains("5.63%"), "{s}");
        assert!(s.to_string().contains("5% ceiling"), "{s}");
    }

    #[test]
    fn a_power_capped_leg_is_refused_naming_the_reason() {
        let capped = summarize(&series(|_| 1980, 0x4, true, 200));
        let r = judge(&capped, &clean(), BOOT);
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(
            r[0].to_string().split(':').nth(1).unwrap().trim(),
            "SwPowerCap in 100.0% of polls. Hint"
        );
    }

    #[test]
    fn persistence_off_is_refused() {
        let off = summarize(&series(|_| 1980, 0, false, 200));
        let r = judge(&clean(), &off, BOOT);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(r[0]
            .to_string()
            .contains("Disabled during the oracle leg (200 of 200 polls)"));
    }

    #[test]
    fn different_boots_are_refused() {
        let r = judge(&clean(), &clean(), "other");
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(r[0].to_string().contains("boot 1c2d") && r[0].to_string().contains("boot other"));
    }

    #[test]
    fn a_median_clock_offset_is_refused() {
        // numbers/explain.rs: how little of a large gap the same offset explains.
        let slow = summarize(&series(|_| 1940, 0, true, 200));
        let r = judge(&slow, &clean(), BOOT);
        assert_eq!(r.len(), 1, "{r:?}");
        let s = r[0].to_string();
        assert!(
            s.contains("-2.02%") && s.contains("1940") && s.contains("1980"),
            "{s}"
        );
    }

    #[test]
    fn a_series_without_samples_is_refused_not_passed() {
        let empty = summarize(&[Row::Phase {
            t_us: 1,
            phase: "battery".into(),
        }]);
        let r = judge(&empty, &clean(), BOOT);
        assert!(
            r.iter().any(|x| matches!(x, ClockReason::NoSamples { .. })),
            "{r:?}"
        );
    }

    #[test]
    fn the_clock_gate_passes_a_clean_pair_refuses_an_offset_and_is_not_applicable_without_a_gpu() {
        let (e, o) = (sampled("engine", 1980), sampled("oracle", 1980));
        let v = judge_gate(&ClockGate, &e, &o);
        assert_eq!(v.len(), 1);
        assert!(matches!(v[0].verdict, Verdict::Pass { .. }), "{:?}", v[0]);
        let v = judge_gate(&ClockGate, &sampled("engine", 1900), &o);
        assert_eq!(v.len(), 1);
        assert!(
            v[0].refusal()
                .is_some_and(|r| r.to_string().contains("-4.04%")),
            "{:?}",
            v[0]
        );
        let mut cpu = record("engine");
        cpu.sampler.no_gpu = Some("no GPU leased (the run holds the cpu lease)".into());
        let v = judge_gate(&ClockGate, &cpu, &o);
        assert_eq!(
            v[0].sentence,
            "not applicable: no GPU: no GPU leased (the run holds the cpu lease)"
        );
    }
}
