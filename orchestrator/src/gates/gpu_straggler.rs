//! The GPU straggler gate: after a leg exits and before the host-side reap, each of its
//! processes still holding memory on the leased GPU is named with its MiB, killed
//! (legs/watchdog.rs) and refused here.

use serde::{Deserialize, Serialize};
use std::fmt;

use super::{each_leg, Axes, Gate, GateInput, GateResult, Scope};
use crate::legs::watchdog::GpuStraggler;
use crate::legs::LegName;

/// Why a leg's exit is refused. Display is the whole sentence.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "refusal", rename_all = "snake_case")]
pub enum GpuStragglerReason {
    GpuStragglers {
        leg: LegName,
        stragglers: Vec<GpuStraggler>,
    },
}

impl fmt::Display for GpuStragglerReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let GpuStragglerReason::GpuStragglers { leg, stragglers } = self;
        let list: Vec<String> = stragglers
            .iter()
            .map(|s| {
                format!(
                    "pid {} ({}, {}){}",
                    s.pid,
                    s.name,
                    s.mib
                        .map(|m| format!("{m} MiB"))
                        .unwrap_or_else(|| "memory not reported".into()),
                    if s.killed {
                        ", killed"
                    } else {
                        ", could not be killed (gone or not ours)"
                    }
                )
            })
            .collect();
        write!(
            f,
            "The {leg} leg left {} process(es) holding GPU memory after its shutdown: {}; the next leg's memory figures would include them. Hint: the leg must stop its GPU workers (e.g. a vLLM EngineCore) before exiting.",
            stragglers.len(),
            list.join("; ")
        )
    }
}

pub struct GpuStragglerGate;

impl Gate for GpuStragglerGate {
    fn name(&self) -> &'static str {
        "gpu_straggler"
    }

    /// A process left on the GPU shares it with what runs next: every axis is in question.
    fn scope(&self, _leg: Option<LegName>) -> Scope {
        Scope::axes(Axes::All)
    }

    fn judge(&self, input: &GateInput) -> Vec<GateResult> {
        each_leg(input, |leg, rec| {
            let not_applicable = |why: String| GateResult::not_applicable(self, Some(leg), why);
            if let Some(why) = &rec.sampler.no_gpu {
                return not_applicable(format!("no GPU: {why}"));
            }
            if !rec.gpu_checked {
                return not_applicable(format!(
                    "the GPU's process table was not read after the {leg} leg (it never started, or NVML failed at its shutdown)"
                ));
            }
            // This start's and those of any start stopped for a kv resize.
            let prior = rec.prior_starts.iter().flat_map(|p| &p.gpu_stragglers);
            let stragglers: Vec<GpuStraggler> =
                rec.gpu_stragglers.iter().chain(prior).cloned().collect();
            if stragglers.is_empty() {
                let text = format!("no process of the {leg} leg held GPU memory after it");
                return GateResult::pass(self, Some(leg), text);
            }
            let reason = GpuStragglerReason::GpuStragglers { leg, stragglers };
            GateResult::refused(self, Some(leg), &reason)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gates::testing::{judge, sampled};
    use crate::gates::Verdict;

    #[test]
    fn gpu_stragglers_are_refused_and_an_unread_table_is_not_a_pass() {
        let mut e = sampled("engine", 1980);
        let o = sampled("oracle", 1980);
        e.gpu_stragglers.push(GpuStraggler {
            pid: 40514,
            name: "EngineCore".into(),
            mib: Some(22_986),
            killed: true,
        });
        let v = judge(&GpuStragglerGate, &e, &o);
        assert!(
            v[0].sentence
                .contains("pid 40514 (EngineCore, 22986 MiB), killed"),
            "{}",
            v[0].sentence
        );
        assert!(matches!(v[1].verdict, Verdict::Pass { .. }));
        let mut unread = sampled("oracle", 1980);
        unread.gpu_checked = false;
        let v = judge(&GpuStragglerGate, &e, &unread);
        assert!(
            matches!(v[1].verdict, Verdict::NotApplicable { .. }),
            "{:?}",
            v[1]
        );
    }
}
