//! What a clock offset could explain of the per-token ratio: a kernel-bound leg's time moves
//! by `basis` points per point of SM clock, so the clock gate's median offset sets a bound on
//! how much of the gap between the legs is the clock. The record keeps it as `clock_explain`.

use serde::{Deserialize, Serialize};

use crate::gates::clock::median_offset_pct;
use crate::legs::LegRecord;
use crate::numbers::axes::{per_token_ratio, Axis};
use crate::unit::GatesCfg;

/// How much of the observed per-token gap a clock offset could explain: a kernel-bound leg's
/// time moves by `basis` points per point of clock, so an offset of o% explains at most
/// |o| x basis % of the gap. The reference report: basis 0.7548, offset 0.0%, gap 718x.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClockExplain {
    pub median_offset_pct: f64,
    pub basis: f64,
    /// |offset| x basis, in percent of per-token time.
    pub explainable_pct: f64,
    /// ours / oracle, per output token (warm, median).
    pub per_token_ratio: Option<f64>,
    /// |ratio - 1| x 100.
    pub observed_gap_pct: Option<f64>,
    /// The observed gap is larger than the clock could explain.
    pub outside: Option<bool>,
    pub sentence: String,
}

pub fn explain(offset_pct: f64, basis: f64, per_token_ratio: Option<f64>) -> ClockExplain {
    let explainable_pct = offset_pct.abs() * basis;
    let gap = per_token_ratio.map(|r| (r - 1.0).abs() * 100.0);
    let outside = gap.map(|g| g > explainable_pct);
    let sentence = match (per_token_ratio, gap) {
        (Some(r), Some(g)) => format!(
            "A median SM clock offset of {offset_pct:.2}% at a basis of {basis} point(s) of per-token time per point of clock could explain {explainable_pct:.2}% of per-token time; the observed per-token ratio is {r:.4} (a {g:.2}% gap), {} what the clock could explain.",
            if g > explainable_pct { "outside" } else { "within" }
        ),
        _ => format!(
            "A median SM clock offset of {offset_pct:.2}% at a basis of {basis} could explain {explainable_pct:.2}% of per-token time; there is no per-token ratio to set it against."
        ),
    };
    ClockExplain {
        median_offset_pct: offset_pct,
        basis,
        explainable_pct,
        per_token_ratio,
        observed_gap_pct: gap,
        outside,
        sentence,
    }
}

/// What a clock offset could explain of the per-token ratio, when both legs have clocks.
pub fn clock_explain(
    engine: &LegRecord,
    oracle: &LegRecord,
    axes: &[Axis],
    gates: &GatesCfg,
) -> Option<ClockExplain> {
    let (a, b) = (
        engine.sampler.summary.as_ref()?,
        oracle.sampler.summary.as_ref()?,
    );
    let off = median_offset_pct(a, b)?;
    Some(explain(off, gates.clock_basis, per_token_ratio(axes)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gates::clock::tests::{clean, series};
    use crate::legs::sampler::summary::summarize;

    #[test]
    fn a_median_clock_offset_explains_little_of_a_large_gap() {
        let slow = summarize(&series(|_| 1940, 0, true, 200));
        let off = median_offset_pct(&slow, &clean()).unwrap();
        let x = explain(off, 1.0, Some(718.2));
        assert_eq!(x.outside, Some(true));
        assert!((x.explainable_pct - 2.0202).abs() < 1e-3, "{x:?}");
        // A 1% gap is within a 2% offset's reach.
        assert_eq!(explain(off, 1.0, Some(1.01)).outside, Some(false));
    }
}
