//! The straggler gate (host side): after a leg exits, every live process of its process group,
//! and every pid it announced in `ready.pids` that is still alive, is a straggler: named,
//! killed (legs/watchdog.rs) and refused here.

use serde::{Deserialize, Serialize};
use std::fmt;

use super::{each_leg, Axes, Gate, GateInput, GateResult, Scope};
use crate::legs::watchdog::Straggler;
use crate::legs::LegName;

/// Why a leg's exit is refused. Display is the whole sentence.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "refusal", rename_all = "snake_case")]
pub enum StragglerReason {
    Stragglers {
        leg: LegName,
        stragglers: Vec<Straggler>,
    },
}

impl fmt::Display for StragglerReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let StragglerReason::Stragglers { leg, stragglers } = self;
        let list: Vec<String> = stragglers
            .iter()
            .map(|s| {
                format!(
                    "pid {} ({}){}",
                    s.pid,
                    s.command,
                    if s.killed {
                        ", killed"
                    } else {
                        ", could not be killed"
                    }
                )
            })
            .collect();
        write!(
            f,
            "The {leg} leg left {} process(es) alive after its shutdown: {}. Hint: the leg must stop every process it starts before exiting (docs/PROTOCOL.md, shutdown).",
            stragglers.len(),
            list.join("; ")
        )
    }
}

pub struct StragglerGate;

impl Gate for StragglerGate {
    fn name(&self) -> &'static str {
        "straggler"
    }

    /// A process left running may have run beside the other leg: every axis is in question.
    fn scope(&self, _leg: Option<LegName>) -> Scope {
        Scope::axes(Axes::All)
    }

    fn judge(&self, input: &GateInput) -> Vec<GateResult> {
        each_leg(input, |leg, rec| {
            // This start's and those of any start stopped for a kv resize.
            let prior = rec.prior_starts.iter().flat_map(|p| &p.stragglers);
            let stragglers: Vec<Straggler> = rec.stragglers.iter().chain(prior).cloned().collect();
            if stragglers.is_empty() {
                let text = format!("no process of the {leg} leg outlived it");
                return GateResult::pass(self, Some(leg), text);
            }
            GateResult::refused(
                self,
                Some(leg),
                &StragglerReason::Stragglers { leg, stragglers },
            )
        })
    }
}
