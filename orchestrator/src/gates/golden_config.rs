//! The golden config gate: a golden holds only for the oracle configuration it was captured
//! under, so the oracle's `resolved` must equal the golden's `capture.resolved`.

use serde_json::Value;
use std::collections::BTreeSet;

use super::{token, ConfigDiff, Gate, GateInput, GateResult, Refusal, Verdict};
use crate::leg::{LegName, LegRecord};
use crate::unit::Golden;

/// Numbers compare by value (1 equals 1.0); everything else structurally.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

/// Keys whose values differ between the oracle's resolved config and the golden's capture.
pub fn diffs(oracle: &LegRecord, golden: &Golden, ignore: &[String]) -> Vec<ConfigDiff> {
    let Some(ready) = oracle.ready.as_ref() else {
        return vec![];
    };
    let ours = &ready.resolved;
    let theirs = &golden.capture.resolved;
    let keys: BTreeSet<&String> = ours.keys().chain(theirs.keys()).collect();
    keys.into_iter()
        .filter(|k| !ignore.contains(k))
        .filter_map(|k| {
            let (a, b) = (ours.get(k.as_str()), theirs.get(k.as_str()));
            let equal = match (a, b) {
                (Some(a), Some(b)) => same(a, b),
                _ => false,
            };
            (!equal).then(|| ConfigDiff {
                key: k.clone(),
                oracle: a.cloned(),
                golden: b.cloned(),
            })
        })
        .collect()
}

pub struct GoldenConfigGate;

impl Gate for GoldenConfigGate {
    fn name(&self) -> &'static str {
        "golden_config"
    }

    fn judge(&self, input: &GateInput) -> Vec<GateResult> {
        let rec = input.leg(LegName::Oracle);
        let verdict = if rec.ready.is_none() {
            Verdict::NotApplicable {
                reason: "the oracle leg never became ready, so its configuration is unknown".into(),
            }
        } else {
            match token::golden_for(input, rec) {
                Err(r) => Verdict::NotApplicable {
                    reason: format!("no golden applies to the oracle ({r})"),
                },
                Ok((file, golden)) => {
                    let d = diffs(rec, golden, &input.unit.config.gates.golden_config_ignore);
                    if d.is_empty() {
                        Verdict::Pass {
                            text: format!(
                                "the oracle's resolved config equals the capture config of {} ({} key(s))",
                                file.display(),
                                golden.capture.resolved.len()
                            ),
                        }
                    } else {
                        Verdict::Refused {
                            refusal: Refusal::GoldenConfigDiffers {
                                golden: file,
                                diffs: d,
                            },
                        }
                    }
                }
            }
        };
        vec![GateResult::new(self.name(), None, verdict)]
    }
}
