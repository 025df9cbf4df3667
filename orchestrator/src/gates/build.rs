//! The build gate: the engine must run on the backend the unit asked for, with nothing degraded.

use serde::{Deserialize, Serialize};
use std::fmt;

use super::{Gate, GateInput, GateResult, Scope};
use crate::legs::LegName;
use crate::unit::device_kind;

/// Why the engine's build is refused. Display is the whole sentence.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "refusal", rename_all = "snake_case")]
pub enum BuildReason {
    BuildBackend {
        requested: String,
        reported: Option<String>,
    },
    BuildDegraded {
        degraded: Vec<String>,
    },
}

impl fmt::Display for BuildReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildReason::BuildBackend {
                requested,
                reported,
            } => write!(
                f,
                "The engine build does not use the requested backend: requested {requested}, it reports {}; its timings are refused. Hint: rebuild the engine with the {requested} backend enabled (see its features in the record).",
                reported.as_deref().unwrap_or("none (features.backend missing)")
            ),
            BuildReason::BuildDegraded { degraded } => write!(
                f,
                "The engine build is degraded: {} feature(s) fell back ({}); its timings are refused. Hint: fix the build so features.degraded is empty (the engine's stderr log says why each fell back).",
                degraded.len(),
                degraded.join(", ")
            ),
        }
    }
}

pub struct BuildGate;

impl Gate for BuildGate {
    fn name(&self) -> &'static str {
        "build"
    }

    /// A build that is not the one asked for: the engine's figures are not the engine's.
    fn scope(&self, leg: Option<LegName>) -> Scope {
        Scope::figures_of(leg)
    }

    fn judge(&self, input: &GateInput) -> Vec<GateResult> {
        let engine = Some(LegName::Engine);
        let Some(ready) = input.engine.ready.as_ref() else {
            return vec![GateResult::not_applicable(
                self,
                engine,
                "the engine leg never became ready, so its features are unknown".into(),
            )];
        };
        // The backend that serves a device: "cuda:1" is served by "cuda".
        let requested = device_kind(&input.unit.config.engine.device).to_string();
        let reported = ready.backend().map(str::to_string);
        let degraded = ready.degraded();
        let mut out = vec![];
        if reported.as_deref() != Some(requested.as_str()) {
            out.push(BuildReason::BuildBackend {
                requested: requested.clone(),
                reported,
            });
        }
        if !degraded.is_empty() {
            out.push(BuildReason::BuildDegraded { degraded });
        }
        if out.is_empty() {
            return vec![GateResult::pass(
                self,
                engine,
                format!("the engine uses the {requested} backend and reports no degraded feature"),
            )];
        }
        out.iter()
            .map(|r| GateResult::refused(self, engine, r))
            .collect()
    }
}
