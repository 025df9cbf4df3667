//! Gates on how each leg ran: it completed (no crash, watchdog or protocol failure), and it left
//! no process behind, on the host or holding GPU memory.

use super::{Gate, GateInput, GateResult, Refusal, Verdict};
use crate::legs::leg::LegName;

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
                } else if !rec.gpu_checked {
                    Verdict::NotApplicable {
                        reason: format!(
                            "the GPU's process table was not read after the {leg} leg (it never started, or NVML failed at its shutdown)"
                        ),
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
fn all_gpu(rec: &crate::legs::leg::LegRecord) -> Vec<crate::legs::watchdog::GpuStraggler> {
    let mut all = rec.gpu_stragglers.clone();
    for p in &rec.prior_starts {
        all.extend(p.gpu_stragglers.iter().cloned());
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gates::clock::ClockGate;
    use crate::gates::Gate;
    use crate::legs::leg::LegRecord;
    use crate::legs::sampler::summary::summarize;
    use crate::legs::sampler::Row;
    use crate::legs::watchdog::GpuStraggler;
    use crate::unit::Unit;
    use std::collections::BTreeMap;
    use std::path::Path;

    fn record(leg: &str) -> LegRecord {
        serde_json::from_value(serde_json::json!({
            "leg": leg, "argv": [], "log": "/x.log", "ready": null,
            "phases": [{"phase": "battery", "elapsed_s": 1.0, "ok": true}],
            "requests": [], "watchdog": null, "stragglers": [], "exit_status": 0,
            "failure": null, "host_mem": {"peak_rss_bytes": 0, "samples": 0, "period_ms": 100}
        }))
        .unwrap()
    }

    /// A GPU-sampled leg: `sm` MHz and busy throughout its battery, on boot "b".
    fn sampled(leg: &str, sm: u32) -> LegRecord {
        let mut rows = vec![Row::Phase {
            t_us: 0,
            phase: "battery".into(),
        }];
        for i in 1..50u64 {
            rows.push(Row::Gpu {
                t_us: i * 20_000,
                phase: "battery".into(),
                sm_mhz: Some(sm),
                mem_mhz: None,
                power_mw: None,
                temp_c: None,
                throttle: Some(0),
                persistence: Some(true),
                used_bytes: None,
                procs: None,
            });
            rows.push(Row::Util {
                t_us: i * 20_000,
                phase: "battery".into(),
                pct: 70,
                source: "buffer".into(),
            });
        }
        let mut r = record(leg);
        r.sampler.summary = Some(summarize(&rows));
        r.sampler.boot_id = Some("b".into());
        r.gpu_checked = true;
        r
    }

    fn judge(gate: &dyn Gate, engine: &LegRecord, oracle: &LegRecord) -> Vec<GateResult> {
        let unit = Unit::parse(
            Path::new("/x/unit.toml"),
            "name = \"t\"\nmodel = \"m\"\n[battery]\nprompts = \"p.json\"\n[[golden]]\nfile = \"g.json\"\n[oracle]\nbackend = \"transformers\"\n",
        )
        .unwrap();
        let goldens = BTreeMap::new();
        gate.judge(&GateInput {
            unit: &unit,
            goldens: &goldens,
            prompt_ids: &[],
            engine,
            oracle,
            kv_resize: None,
        })
    }

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

    #[test]
    fn the_clock_gate_passes_a_clean_pair_refuses_an_offset_and_is_not_applicable_without_a_gpu() {
        let (e, o) = (sampled("engine", 1980), sampled("oracle", 1980));
        let v = judge(&ClockGate, &e, &o);
        assert_eq!(v.len(), 1);
        assert!(matches!(v[0].verdict, Verdict::Pass { .. }), "{:?}", v[0]);
        let v = judge(&ClockGate, &sampled("engine", 1900), &o);
        assert_eq!(v.len(), 1);
        assert!(
            v[0].refusal()
                .is_some_and(|r| r.to_string().contains("-4.04%")),
            "{:?}",
            v[0]
        );
        let mut cpu = record("engine");
        cpu.sampler.no_gpu = Some("no GPU leased (the run holds the cpu lease)".into());
        let v = judge(&ClockGate, &cpu, &o);
        assert_eq!(
            v[0].sentence,
            "not applicable: no GPU: no GPU leased (the run holds the cpu lease)"
        );
    }
}
