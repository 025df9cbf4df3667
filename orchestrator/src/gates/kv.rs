//! The kv gate: the two paged pools must hold the same number of tokens (within a tolerance of
//! blocks), or the memory axes compare unlike things. The run resizes one leg first
//! (`[gates] kv_match`, legs/pair.rs); this gate judges the pools as they finally were.

use serde::{Deserialize, Serialize};
use std::fmt;

use super::scope::{AxisNote, KV_POOL, PEAK_GPU_MEMORY, PEAK_HOST_MEMORY};
use super::{Axes, Gate, GateInput, GateResult, Scope};
use crate::legs::protocol::Kv;
use crate::legs::LegName;

/// Why the pools are refused. Display is the whole sentence.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "refusal", rename_all = "snake_case")]
pub enum KvReason {
    KvUnmatched {
        engine: Box<Kv>,
        oracle: Box<Kv>,
        tolerance_blocks: u64,
        resized: Option<String>,
    },
}

impl fmt::Display for KvReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let KvReason::KvUnmatched {
            engine,
            oracle,
            tolerance_blocks,
            resized,
        } = self;
        write!(
            f,
            "The KV pools could not be matched: engine {}, oracle {}, {} tokens apart against a tolerance of {} block(s)",
            engine.describe(),
            oracle.describe(),
            engine.tokens().abs_diff(oracle.tokens()),
            tolerance_blocks
        )?;
        match resized {
            Some(r) => write!(f, ", even after {r}")?,
            None => write!(f, " ([gates] kv_match = \"off\", so no resize was tried)")?,
        }
        write!(
            f,
            "; the memory and KV axes are reported raw, not like-for-like. Hint: size the pools explicitly (engine num_blocks / kv_cache_memory, oracle {}) to a capacity both block sizes divide.",
            oracle.resize_option().unwrap_or("the option that sizes its pool")
        )
    }
}

const RAW: &str = "KV pools not matched: raw, not like-for-like";

pub struct KvGate;

impl Gate for KvGate {
    fn name(&self) -> &'static str {
        "kv"
    }

    /// Unlike pools make the memory axes unlike; the timings stand.
    fn scope(&self, _leg: Option<LegName>) -> Scope {
        let note = |axis: &str, note: &str| AxisNote {
            axis: axis.into(),
            note: note.into(),
        };
        Scope {
            notes: vec![
                note(PEAK_HOST_MEMORY, RAW),
                note(KV_POOL, "could NOT be matched"),
                note(PEAK_GPU_MEMORY, RAW),
            ],
            ..Scope::axes(Axes::Memory)
        }
    }

    fn judge(&self, input: &GateInput) -> Vec<GateResult> {
        let tol = input.unit.config.gates.kv_tolerance_blocks;
        let mut missing = vec![];
        for leg in [LegName::Engine, LegName::Oracle] {
            match input.leg(leg).ready.as_ref() {
                None => missing.push(format!("the {leg} leg never became ready")),
                Some(r) if r.kv.is_none() => missing.push(format!(
                    "the {leg} leg has no paged pool ({})",
                    r.no_kv_reason()
                )),
                _ => {}
            }
        }
        let pool = |leg: LegName| input.leg(leg).ready.as_ref().and_then(|r| r.kv.clone());
        let (Some(e), Some(o)) = (pool(LegName::Engine), pool(LegName::Oracle)) else {
            return vec![GateResult::not_applicable(self, None, missing.join("; "))];
        };
        if e.within(&o, tol) {
            let how = input
                .kv_resize
                .map(|r| format!(", after {r}"))
                .unwrap_or_default();
            return vec![GateResult::pass(
                self,
                None,
                format!(
                    "both pools hold the same tokens within {tol} block(s): engine {}, oracle {}{how}",
                    e.describe(),
                    o.describe()
                ),
            )];
        }
        let reason = KvReason::KvUnmatched {
            engine: Box::new(e),
            oracle: Box::new(o),
            tolerance_blocks: tol,
            resized: input.kv_resize.map(str::to_string),
        };
        vec![GateResult::refused(self, None, &reason)]
    }
}
