//! Gates on how each leg ran: it completed (no crash, watchdog or protocol failure), and it left
//! no process behind, on the host or holding GPU memory.

use super::{Gate, GateInput, GateResult, Refusal, Verdict};
use crate::leg::LegName;

pub struct LegGate;

impl Gate for LegGate {
    fn name(&self) -> &'static str {
        "leg"
    }

    fn judge(&self, input: &GateInput) -> Vec<GateResult> {
        [LegName::Engine, LegName::Oracle]
            .into_iter()
            .map(|leg| {
                let rec = input.leg(leg);
                let verdict = match &rec.failure {
                    Some(f) => Verdict::Refused {
                        refusal: Refusal::LegFailed {
                            leg,
                            failure: f.clone(),
                            log: rec.log.clone(),
                        },
                    },
                    None => Verdict::Pass {
                        text: format!(
                            "the {leg} leg loaded, ran its battery and shut down cleanly"
                        ),
                    },
                };
                GateResult::new(self.name(), Some(leg), verdict)
            })
            .collect()
    }
}

pub struct StragglerGate;

impl Gate for StragglerGate {
    fn name(&self) -> &'static str {
        "straggler"
    }

    fn judge(&self, input: &GateInput) -> Vec<GateResult> {
        [LegName::Engine, LegName::Oracle]
            .into_iter()
            .map(|leg| {
                let rec = input.leg(leg);
                let mut all = rec.stragglers.clone();
                for p in &rec.prior_starts {
                    all.extend(p.stragglers.iter().cloned());
                }
                let verdict = if all.is_empty() {
                    Verdict::Pass {
                        text: format!("no process of the {leg} leg outlived it"),
                    }
                } else {
                    Verdict::Refused {
                        refusal: Refusal::Stragglers {
                            leg,
                            stragglers: all,
                        },
                    }
                };
                GateResult::new(self.name(), Some(leg), verdict)
            })
            .collect()
    }
}

pub struct GpuStragglerGate;

impl Gate for GpuStragglerGate {
    fn name(&self) -> &'static str {
        "gpu_straggler"
    }

    fn judge(&self, input: &GateInput) -> Vec<GateResult> {
        [LegName::Engine, LegName::Oracle]
            .into_iter()
            .map(|leg| {
                let rec = input.leg(leg);
                let verdict = if let Some(why) = &rec.sampler.no_gpu {
                    Verdict::NotApplicable {
                        reason: format!("no GPU: {why}"),
                    }
                } else if all_gpu(rec).is_empty() {
                    Verdict::Pass {
                        text: format!("no process of the {leg} leg held GPU memory after it"),
                    }
                } else {
                    Verdict::Refused {
                        refusal: Refusal::GpuStragglers {
                            leg,
                            stragglers: all_gpu(rec),
                        },
                    }
                };
                GateResult::new(self.name(), Some(leg), verdict)
            })
            .collect()
    }
}

/// This start's GPU stragglers and those of any start stopped for a kv resize.
fn all_gpu(rec: &crate::leg::LegRecord) -> Vec<crate::watchdog::GpuStraggler> {
    let mut all = rec.gpu_stragglers.clone();
    for p in &rec.prior_starts {
        all.extend(p.gpu_stragglers.iter().cloned());
    }
    all
}
