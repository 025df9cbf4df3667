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
        let mut v: Vec<GateResult> = if out.is_empty() {
            vec![GateResult::pass(
                self,
                engine,
                format!("the engine uses the {requested} backend and reports no degraded feature"),
            )]
        } else {
            out.iter()
                .map(|r| GateResult::refused(self, engine, r))
                .collect()
        };
        v[0].notes = planted(ready).into_iter().collect();
        v
    }
}

/// The note a run with planted faults carries (`ready.features.fault`, docs/ENGINE.md): a test
/// of the gates, not a measurement of the engine. Not a refusal: the slowdown fault must come
/// out SLOWER in `compare`, and the others are the token gate's to refuse.
fn planted(ready: &crate::legs::protocol::Ready) -> Option<String> {
    let faults: Vec<&str> = ready
        .features
        .get("fault")?
        .as_array()?
        .iter()
        .filter_map(|f| f.as_str())
        .collect();
    (!faults.is_empty()).then(|| {
        format!(
            "The engine ran with planted fault(s) {} (ENGINE_FAULT, test only): this record is evidence for the gates and compare, not a measurement of the engine; keep it out of reports/records.",
            faults.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gates::testing::{judge, record};

    #[test]
    fn a_planted_fault_is_a_note_not_a_refusal() {
        let mut e = record("engine");
        e.ready = Some(
            serde_json::from_value(serde_json::json!({"load_s": 1.0, "kv": null,
                "features": {"backend": "cpu", "degraded": [], "fault": ["slow_step"]}}))
            .unwrap(),
        );
        let v = judge(&BuildGate, &e, &record("oracle"));
        assert_eq!(v.len(), 1);
        assert!(!v[0].is_refused(), "{:?}", v[0]);
        assert!(
            v[0].notes[0].starts_with("The engine ran with planted fault(s) slow_step"),
            "{:?}",
            v[0].notes
        );
    }
}
