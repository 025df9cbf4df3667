//! The build gate: the engine must run on the backend the unit asked for, with nothing degraded.

use super::{Gate, GateInput, GateResult, Refusal, Verdict};
use crate::legs::leg::LegName;
use crate::unit::device_kind;

pub struct BuildGate;

impl Gate for BuildGate {
    fn name(&self) -> &'static str {
        "build"
    }

    fn judge(&self, input: &GateInput) -> Vec<GateResult> {
        let Some(ready) = input.engine.ready.as_ref() else {
            return vec![GateResult::new(
                self.name(),
                Some(LegName::Engine),
                Verdict::NotApplicable {
                    reason: "the engine leg never became ready, so its features are unknown".into(),
                },
            )];
        };
        // The backend that serves a device: "cuda:1" is served by "cuda".
        let requested = device_kind(&input.unit.config.engine.device).to_string();
        let reported = ready.backend().map(str::to_string);
        let degraded = ready.degraded();
        let mut out = vec![];
        if reported.as_deref() != Some(requested.as_str()) {
            out.push(Refusal::BuildBackend {
                requested: requested.clone(),
                reported,
            });
        }
        if !degraded.is_empty() {
            out.push(Refusal::BuildDegraded { degraded });
        }
        if out.is_empty() {
            return vec![GateResult::new(
                self.name(),
                Some(LegName::Engine),
                Verdict::Pass {
                    text: format!(
                        "the engine uses the {requested} backend and reports no degraded feature"
                    ),
                },
            )];
        }
        out.into_iter()
            .map(|r| {
                GateResult::new(
                    self.name(),
                    Some(LegName::Engine),
                    Verdict::Refused { refusal: r },
                )
            })
            .collect()
    }
}
