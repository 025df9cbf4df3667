//! The golden config gate: a golden holds only for the oracle configuration it was captured
//! under, so the oracle's `resolved` must equal the golden's `capture.resolved`.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;

use super::{token, Axes, Gate, GateInput, GateResult, Scope};
use crate::legs::{LegName, LegRecord};
use crate::unit::Golden;

/// One key on which the oracle's configuration and the golden's capture differ.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ConfigDiff {
    pub key: String,
    pub oracle: Option<Value>,
    pub golden: Option<Value>,
}

impl fmt::Display for ConfigDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: &Option<Value>| match v {
            Some(v) => v.to_string(),
            None => "absent".into(),
        };
        write!(
            f,
            "{} (oracle {}, golden {})",
            self.key,
            show(&self.oracle),
            show(&self.golden)
        )
    }
}

/// Why the oracle's configuration is refused. Display is the whole sentence.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "refusal", rename_all = "snake_case")]
pub enum GoldenConfigReason {
    GoldenConfigDiffers {
        golden: PathBuf,
        diffs: Vec<ConfigDiff>,
    },
}

impl fmt::Display for GoldenConfigReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let GoldenConfigReason::GoldenConfigDiffers { golden, diffs } = self;
        let list: Vec<String> = diffs.iter().map(ToString::to_string).collect();
        write!(
            f,
            "The oracle ran under a configuration the golden {} was not captured under ({} key(s) differ: {}), so the oracle-vs-golden token check is recorded as not applicable. Hint: set [oracle.options] to the golden's capture config, recapture the golden under this one, or list a key that cannot matter in [gates] golden_config_ignore.",
            golden.display(),
            diffs.len(),
            list.join("; ")
        )
    }
}

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

    /// It only recasts the oracle's token check, which no figure depends on.
    fn scope(&self, _leg: Option<LegName>) -> Scope {
        Scope::axes(Axes::None)
    }

    fn judge(&self, input: &GateInput) -> Vec<GateResult> {
        let rec = input.leg(LegName::Oracle);
        if rec.ready.is_none() {
            return vec![GateResult::not_applicable(
                self,
                None,
                "the oracle leg never became ready, so its configuration is unknown".into(),
            )];
        }
        let (file, golden) = match token::golden_for(input, rec) {
            Ok(g) => g,
            Err(r) => {
                return vec![GateResult::not_applicable(
                    self,
                    None,
                    format!("no golden applies to the oracle ({r})"),
                )]
            }
        };
        let d = diffs(rec, golden, &input.unit.config.gates.golden_config_ignore);
        if d.is_empty() {
            return vec![GateResult::pass(
                self,
                None,
                format!(
                    "the oracle's resolved config equals the capture config of {} ({} key(s))",
                    file.display(),
                    golden.capture.resolved.len()
                ),
            )];
        }
        let reason = GoldenConfigReason::GoldenConfigDiffers {
            golden: file,
            diffs: d,
        };
        vec![GateResult::refused(self, None, &reason)]
    }
}
