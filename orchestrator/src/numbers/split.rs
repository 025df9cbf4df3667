//! Where a batch's time goes: at each batch size above 1, a request's wall on each leg as its
//! prefill plus `max_tokens - 1` decode steps (the table's medians), and the gap between the
//! legs split the same way, so that a reader sees whether a throughput gap is prefill, decode
//! or both without doing the sums.

use crate::numbers::axes::{batch_axis, batch_of, Axis, BATCH_PREFILL, BATCH_STEP};
use crate::util::fmt::fmt_num;

/// The heading the lines go under.
pub const HEADING: &str =
    "Where each batch's time goes (medians: the prefill, then max_tokens - 1 decode steps)";

/// One line per batch size whose prefill and decode step both legs measured; none otherwise.
/// `gated` says whether no refusal withholds an axis (the record's gates decide).
pub fn lines(axes: &[Axis], max_tokens: u32, gated: &dyn Fn(&Axis) -> bool) -> Vec<String> {
    let mut v = vec![];
    if max_tokens < 2 {
        return v;
    }
    let steps = f64::from(max_tokens - 1);
    for prefill in axes.iter() {
        let Some((BATCH_PREFILL, b)) = batch_of(&prefill.axis) else {
            continue;
        };
        let name = batch_axis(BATCH_STEP, b);
        let Some(step) = axes.iter().find(|a| a.axis == name) else {
            continue;
        };
        let (Some(pe), Some(po), Some(se), Some(so)) =
            (prefill.ours, prefill.oracle, step.ours, step.oracle)
        else {
            continue;
        };
        let ms = |s: f64| fmt_num(s * 1e3);
        let (we, wo) = (pe + steps * se, po + steps * so);
        let gap = |d: f64| {
            if d >= 0.0 {
                format!("{} ms slower", ms(d))
            } else {
                format!("{} ms faster", ms(-d))
            }
        };
        let refused = !gated(prefill) || !gated(step);
        v.push(format!(
            "batch {b}: a request takes ours {} ms (prefill {} + {steps} steps x {}) and the oracle {} ms ({} + {steps} x {}): ours {}, of which the prefill {} and the decode steps {}{}",
            ms(we),
            ms(pe),
            ms(se),
            ms(wo),
            ms(po),
            ms(so),
            gap(we - wo),
            gap(pe - po),
            gap(steps * (se - so)),
            if refused { " (not gated: see the refusals)" } else { "" }
        ));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numbers::axes::{axis, Better};

    fn pair(name: &str, ours: f64, oracle: f64) -> Axis {
        axis(name.into(), "s", Better::Lower, Some(ours), Some(oracle))
    }

    #[test]
    fn the_gap_is_split_into_prefill_and_decode_steps_each_with_its_sign() {
        let axes = vec![
            pair("prefill, batch 8", 0.0872, 0.0647),
            pair("decode step, batch 8", 0.005372, 0.005192),
            pair("prefill, batch 32", 0.0622, 0.0480),
            pair("decode step, batch 32", 0.0015, 0.0025),
            // A batch whose step only one leg measured says nothing.
            pair("prefill, batch 4", 0.01, 0.01),
            axis(
                "decode step, batch 4".into(),
                "s",
                Better::Lower,
                Some(0.001),
                None,
            ),
        ];
        let all = |_: &Axis| true;
        let v = lines(&axes, 64, &all);
        assert_eq!(v.len(), 2, "{v:?}");
        assert_eq!(
            v[0],
            "batch 8: a request takes ours 425.6 ms (prefill 87.20 + 63 steps x 5.372) and the oracle 391.8 ms (64.70 + 63 x 5.192): ours 33.84 ms slower, of which the prefill 22.50 ms slower and the decode steps 11.34 ms slower"
        );
        assert!(
            v[1].contains("ours 48.80 ms faster, of which the prefill 14.20 ms slower and the decode steps 63.00 ms faster"),
            "{}",
            v[1]
        );
        let step_refused = |a: &Axis| !a.axis.starts_with("decode step, batch 8");
        assert!(lines(&axes, 64, &step_refused)[0].ends_with(" (not gated: see the refusals)"));
        assert!(!lines(&axes, 64, &step_refused)[1].contains("not gated"));
        assert!(lines(&[], 64, &all).is_empty());
        // A record that does not say how many tokens a request made: no sums to do.
        assert!(lines(&axes, 0, &all).is_empty());
    }
}
