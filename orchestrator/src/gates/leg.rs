//! The leg gate: each leg loaded, ran its warm-up and battery, and shut down with status 0 (no
//! crash, watchdog or protocol failure).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;

use super::{each_leg, Gate, GateInput, GateResult, Scope};
use crate::legs::record::LegFailure;
use crate::legs::LegName;

/// Why a leg is refused. Display is the whole sentence.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "refusal", rename_all = "snake_case")]
pub enum LegReason {
    LegFailed {
        leg: LegName,
        failure: LegFailure,
        log: PathBuf,
    },
}

impl fmt::Display for LegReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let LegReason::LegFailed { leg, failure, log } = self;
        write!(
            f,
            "The {leg} leg failed in phase {}: {failure}. Nothing it measured after that point is reported; its whole stderr is in {}.",
            failure.phase,
            log.display()
        )
    }
}

pub struct LegGate;

impl Gate for LegGate {
    fn name(&self) -> &'static str {
        "leg"
    }

    /// A leg that failed measured nothing to stand behind.
    fn scope(&self, leg: Option<LegName>) -> Scope {
        Scope::figures_of(leg)
    }

    fn judge(&self, input: &GateInput) -> Vec<GateResult> {
        each_leg(input, |leg, rec| match &rec.failure {
            Some(f) => {
                let (failure, log) = (f.clone(), rec.log.clone());
                GateResult::refused(self, Some(leg), &LegReason::LegFailed { leg, failure, log })
            }
            None => {
                let text = format!("the {leg} leg loaded, ran its battery and shut down cleanly");
                GateResult::pass(self, Some(leg), text)
            }
        })
    }
}
