//! The golden config gate: a golden holds only for the oracle configuration it was captured
//! under, so the oracle's `resolved` must equal the golden's `capture.resolved`.

use serde_json::Value;
use std::collections::BTreeSet;

use super::{token, ConfigDiff, Gate, GateInput, GateResult, Refusal, Verdict};
use crate::legs::leg::{LegName, LegRecord};
use crate::unit::Golden;

/// Numbers compare by value (1 equals 1.0); everything else structurally.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

/// Members of object-valued keys that are never compared: which GPU the lease made visible
/// decides where the oracle runs, not what it computes (the orchestrator sets it for a run; a
/// capture by hand usually leaves it unset).
const ALWAYS_IGNORED: &[&str] = &["env.CUDA_VISIBLE_DEVICES"];

/// `value` without the members of `key` that `ignore` names as `key.member`.
fn without_ignored(key: &str, value: Option<&Value>, ignore: &[&str]) -> Option<Value> {
    let mut v = value.cloned()?;
    if let Value::Object(map) = &mut v {
        for member in ignore
            .iter()
            .filter_map(|i| i.strip_prefix(key).and_then(|rest| rest.strip_prefix('.')))
        {
            map.remove(member);
        }
    }
    Some(v)
}

/// Keys whose values differ between the oracle's resolved config and the golden's capture.
/// `ignore` holds top-level keys, or `key.member` for one member of an object-valued key.
pub fn diffs(oracle: &LegRecord, golden: &Golden, ignore: &[String]) -> Vec<ConfigDiff> {
    let Some(ready) = oracle.ready.as_ref() else {
        return vec![];
    };
    let ignore: Vec<&str> = ignore
        .iter()
        .map(String::as_str)
        .chain(ALWAYS_IGNORED.iter().copied())
        .collect();
    let ours = &ready.resolved;
    let theirs = &golden.capture.resolved;
    let keys: BTreeSet<&String> = ours.keys().chain(theirs.keys()).collect();
    keys.into_iter()
        .filter(|k| !ignore.contains(&k.as_str()))
        .filter_map(|k| {
            let a = without_ignored(k, ours.get(k.as_str()), &ignore);
            let b = without_ignored(k, theirs.get(k.as_str()), &ignore);
            let equal = match (&a, &b) {
                (Some(a), Some(b)) => same(a, b),
                _ => false,
            };
            (!equal).then(|| ConfigDiff {
                key: k.clone(),
                oracle: a,
                golden: b,
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
