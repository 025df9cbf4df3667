//! A run of one leg (`orchestrator run --legs engine|oracle`): every verdict a gate gives about
//! the absent leg, or about the pair, becomes "not applicable" with the reason, so that no gate
//! passes or refuses on a leg that never ran.

use super::{Gate, GateInput, GateResult};
use crate::legs::LegName;

/// `gate`'s verdicts, with those that concern an absent leg (or the pair, when one is absent)
/// replaced by one "not applicable" each.
pub fn judge_present(gate: &dyn Gate, input: &GateInput) -> Vec<GateResult> {
    let absent: Vec<(LegName, &str)> = [LegName::Engine, LegName::Oracle]
        .into_iter()
        .filter_map(|l| input.leg(l).not_run.as_deref().map(|why| (l, why)))
        .collect();
    let results = gate.judge(input);
    if absent.is_empty() {
        return results;
    }
    let not_run = |l: LegName, why: &str| format!("the {l} leg was not run ({why})");
    let mut out: Vec<GateResult> = vec![];
    for r in results {
        let why = match r.leg {
            Some(l) => absent
                .iter()
                .find(|(a, _)| *a == l)
                .map(|(a, w)| not_run(*a, w)),
            None => {
                let each: Vec<String> = absent.iter().map(|(a, w)| not_run(*a, w)).collect();
                Some(format!(
                    "the gate judges both legs and {}",
                    each.join(" and ")
                ))
            }
        };
        match why {
            None => out.push(r),
            Some(reason) => {
                if !out.iter().any(|x| x.gate == r.gate && x.leg == r.leg) {
                    out.push(GateResult::not_applicable(gate, r.leg, reason));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::gates::testing::{judge_with, record, sampled};

    #[test]
    fn gates_about_the_absent_leg_or_the_pair_are_not_applicable() {
        let engine = sampled("engine", 1980);
        let mut oracle = record("oracle");
        oracle.not_run = Some("orchestrator run --legs engine".into());
        let v = judge_with(&crate::gates::clock::ClockGate, &engine, &oracle);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(
            v[0].sentence,
            "not applicable: the gate judges both legs and the oracle leg was not run (orchestrator run --legs engine)"
        );
        let v = judge_with(&crate::gates::leg::LegGate, &engine, &oracle);
        assert_eq!(v[0].verdict.kind(), "pass", "the engine leg ran: {v:?}");
        assert_eq!(
            v[1].sentence,
            "not applicable: the oracle leg was not run (orchestrator run --legs engine)"
        );
    }
}
