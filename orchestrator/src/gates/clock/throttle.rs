//! Throttle reasons judged by the clocks: a clock event reason (outside the allowed ones) is
//! refused only when, in the polls that carry it (without GpuIdle), the SM clock fell below the
//! leg's ceiling by more than the spread tolerance; the ceiling is the highest SM clock the leg
//! held, or the other leg's median when that is higher. A reason at an unchanged clock (the
//! H200's SwPowerCap in 16-31% of polls at a steady 1,980 MHz) is a note with its share of
//! polls: recorded and shown, not refused.

use serde::{Deserialize, Serialize};
use std::fmt;

use super::{ClockCfg, ClockSide};
use crate::util::fmt::fmt_num;

/// A reason that lowered the clock: its share of polls, the clock in those polls, the ceiling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lowered {
    pub name: String,
    pub share: f64,
    /// The p5 SM clock over its polls without GpuIdle; None where the summary predates it.
    pub low_mhz: Option<f64>,
    pub ceiling_mhz: f64,
    /// "the highest it held" or "the oracle leg's median".
    pub ceiling_from: String,
}

impl fmt::Display for Lowered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} in {:.1}% of polls", self.name, self.share * 100.0)?;
        match self.low_mhz {
            Some(low) => write!(
                f,
                " at an SM clock of {} MHz (p5 of those polls) against a ceiling of {} MHz ({})",
                fmt_num(low),
                fmt_num(self.ceiling_mhz),
                self.ceiling_from
            ),
            None => write!(f, " (the clock in those polls was not recorded)"),
        }
    }
}

/// The leg's ceiling and what it is: the higher of the highest SM clock it held and the other
/// leg's median (None: no clock at all).
fn ceiling(s: &ClockSide, other: &ClockSide) -> Option<(f64, String)> {
    let own = s
        .summary
        .sm_mhz_max
        .or_else(|| s.summary.sm_mhz.as_ref().map(|c| c.p95));
    let theirs = other.summary.sm_mhz.as_ref().map(|c| c.median);
    match (own, theirs) {
        (Some(a), Some(b)) if b > a => Some((b, format!("the {} leg's median", other.leg))),
        (Some(a), _) => Some((a, "the highest it held".into())),
        (None, Some(b)) => Some((b, format!("the {} leg's median", other.leg))),
        (None, None) => None,
    }
}

/// The leg's throttle reasons beyond the allowed ones: those that lowered its clock (refused),
/// and a note for each that did not.
pub fn judge(s: &ClockSide, other: &ClockSide, cfg: &ClockCfg) -> (Vec<Lowered>, Vec<String>) {
    let (mut lowered, mut notes) = (vec![], vec![]);
    let ceil = ceiling(s, other);
    for t in s
        .summary
        .throttle
        .iter()
        .filter(|t| !cfg.allowed_throttle.contains(&t.name))
    {
        let (ceiling_mhz, ceiling_from) = ceil.clone().unwrap_or((0.0, "unknown".into()));
        let floor = ceiling_mhz * (1.0 - cfg.max_spread_pct / 100.0);
        let item = Lowered {
            name: t.name.clone(),
            share: t.share,
            low_mhz: t.sm_mhz_p5,
            ceiling_mhz,
            ceiling_from,
        };
        match t.sm_mhz_p5 {
            // Only while idle: the idle explains its clock.
            None if t.samples > 0 && t.busy_polls == 0 && s.summary.sm_mhz.is_some() => {
                notes.push(format!(
                    "The {} leg's GPU reported {} in {:.1}% of polls, each while idle (GpuIdle), so it lowered no clock that timed work ran at: recorded, not refused.",
                    s.leg,
                    t.name,
                    t.share * 100.0
                ));
            }
            Some(low) if ceil.is_some() && low >= floor => notes.push(format!(
                "The {} leg's GPU reported {} in {:.1}% of polls at an unchanged SM clock ({} MHz, p5 of those polls, against a ceiling of {} MHz, {}; within the {}% tolerance): recorded, not refused.",
                s.leg,
                t.name,
                t.share * 100.0,
                fmt_num(low),
                fmt_num(item.ceiling_mhz),
                item.ceiling_from,
                cfg.max_spread_pct
            )),
            // Lowered, or no clock to show it was not.
            _ => lowered.push(item),
        }
    }
    (lowered, notes)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{clean, judge, series, series_by, BOOT};
    use super::super::{notes, ClockReason};
    use super::*;
    use crate::legs::sampler::summary::summarize;

    fn side<'a>(leg: &str, summary: &'a crate::legs::sampler::GpuSummary) -> ClockSide<'a> {
        ClockSide {
            leg: leg.into(),
            boot_id: Some(BOOT),
            summary,
        }
    }

    #[test]
    fn a_power_cap_at_an_unchanged_clock_is_a_note_not_a_refusal() {
        // The H200's 8B run: SwPowerCap in 30% of polls, the SM clock at 1,980 MHz throughout.
        let capped = summarize(&series_by(
            |_| 1980,
            |i| if i % 10 < 3 { 0x4 } else { 0 },
            true,
            200,
        ));
        assert_eq!(judge(&capped, &clean(), BOOT), vec![]);
        let n = notes(
            &side("engine", &capped),
            &side("oracle", &clean()),
            &ClockCfg::default(),
        );
        assert_eq!(
            n,
            vec!["The engine leg's GPU reported SwPowerCap in 30.0% of polls at an unchanged SM clock (1980 MHz, p5 of those polls, against a ceiling of 1980 MHz, the highest it held; within the 5% tolerance): recorded, not refused."]
        );
    }

    #[test]
    fn a_power_cap_that_lowers_the_clock_in_its_polls_is_refused() {
        // 30% of polls capped at 1,700 MHz, the rest at 1,980: the cap lowered the clock.
        let sm = |i: usize| if i % 10 < 3 { 1700 } else { 1980 };
        let capped = summarize(&series_by(
            sm,
            |i| if i % 10 < 3 { 0x4 } else { 0 },
            true,
            200,
        ));
        let r = judge(&capped, &clean(), BOOT);
        let t = r
            .iter()
            .find(|x| matches!(x, ClockReason::Throttled { .. }))
            .unwrap_or_else(|| panic!("{r:?}"));
        assert!(
            t.to_string().contains("SwPowerCap in 30.0% of polls at an SM clock of 1700 MHz (p5 of those polls) against a ceiling of 1980 MHz (the highest it held)"),
            "{t}"
        );
    }

    #[test]
    fn a_reason_seen_only_while_idle_is_a_note() {
        let idle_capped = summarize(&series(|_| 1980, 0x1 | 0x4, true, 200));
        let (lowered, n) = judge_leg(&idle_capped);
        assert!(lowered.is_empty(), "{lowered:?}");
        assert!(n[0].contains("each while idle (GpuIdle)"), "{n:?}");
    }

    fn judge_leg(s: &crate::legs::sampler::GpuSummary) -> (Vec<Lowered>, Vec<String>) {
        let c = clean();
        super::judge(
            &side("engine", s),
            &side("oracle", &c),
            &ClockCfg::default(),
        )
    }
}
