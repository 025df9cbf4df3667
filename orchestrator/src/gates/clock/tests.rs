//! The clock gate's tests: synthetic series (as the sampler writes them) for each reason.

use super::*;
use crate::gates::testing::{judge as judge_gate, record, sampled};
use crate::gates::Verdict;
use crate::legs::sampler::summary::summarize;
use crate::legs::sampler::Row;

pub const BOOT: &str = "1c2d";

/// A synthetic series: 200 polls 20 ms apart inside a battery window, with the given SM
/// clock per poll, throttle bits, persistence, and utilization samples.
pub fn series(sm: impl Fn(usize) -> u32, throttle: u64, persist: bool, busy: usize) -> Vec<Row> {
    series_by(sm, |_| throttle, persist, busy)
}

/// As [`series`], with the throttle bits per poll.
pub fn series_by(
    sm: impl Fn(usize) -> u32,
    throttle: impl Fn(usize) -> u64,
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
            throttle: Some(throttle(i)),
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

pub fn judge(a: &GpuSummary, b: &GpuSummary, boot_b: &str) -> Vec<ClockReason> {
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
fn a_power_cap_that_lowers_the_clock_is_refused_naming_the_reason() {
    // Capped throughout at 1,880 MHz, 5.05% under the oracle's 1,980: refused on its own
    // account (the median offset is refused as well).
    let capped = summarize(&series(|_| 1880, 0x4, true, 200));
    let r = judge(&capped, &clean(), BOOT);
    let t = r
        .iter()
        .find(|x| matches!(x, ClockReason::Throttled { .. }))
        .unwrap_or_else(|| panic!("{r:?}"));
    assert_eq!(
        t.to_string().split(": ").nth(1).unwrap(),
        "SwPowerCap in 100.0% of polls at an SM clock of 1880 MHz (p5 of those polls) against a ceiling of 1980 MHz (the oracle leg's median). Hint"
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
