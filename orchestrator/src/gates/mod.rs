//! Gates: each judges whether a configuration may stand beside its numbers. A verdict is a pass
//! (with what was checked), "not applicable" (with why), or a refusal: the gate's own reason, an
//! enum whose Display is the whole sentence a reader needs (the figures and what to do), kept
//! in the record as JSON tagged `refusal`, with the gate's [`Scope`] (what it withholds).
//!
//! Post-run gates implement [`Gate`] and are listed in [`registry`]; adding one is a file here
//! and a line there (docs/GATES.md). The idle gate plugs into
//! [`crate::legs::lease::IdleCheck`], which runs before each leg.

pub mod build;
pub mod clock;
pub mod golden_config;
pub mod gpu_straggler;
pub mod idle;
pub mod kv;
pub mod leg;
pub mod scope;
pub mod straggler;
#[cfg(test)]
pub(crate) mod testing;
pub mod token;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use crate::legs::{LegName, LegRecord};
use crate::unit::{Golden, Unit};
pub use scope::{Axes, AxisNote, Scope};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    Pass {
        text: String,
    },
    NotApplicable {
        reason: String,
    },
    /// The gate's reason as the record keeps it: its own enum, tagged by `refusal`.
    Refused {
        refusal: serde_json::Value,
    },
}

impl Verdict {
    /// `pass`, `not_applicable` or `refused`, as the record spells it.
    pub fn kind(&self) -> &'static str {
        match self {
            Verdict::Pass { .. } => "pass",
            Verdict::NotApplicable { .. } => "not_applicable",
            Verdict::Refused { .. } => "refused",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GateResult {
    pub gate: String,
    /// The leg judged, or none for a gate over the pair.
    pub leg: Option<LegName>,
    #[serde(flatten)]
    pub verdict: Verdict,
    /// The sentence as printed (so a record reader needs no code to render it).
    pub sentence: String,
    /// What a refusal withholds; none for a pass or "not applicable", and in records written
    /// before scopes were stored ([`stored_scope`] derives it there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
}

impl GateResult {
    pub fn pass(gate: &dyn Gate, leg: Option<LegName>, text: String) -> GateResult {
        GateResult {
            gate: gate.name().into(),
            leg,
            sentence: text.clone(),
            verdict: Verdict::Pass { text },
            scope: None,
        }
    }

    pub fn not_applicable(gate: &dyn Gate, leg: Option<LegName>, reason: String) -> GateResult {
        GateResult {
            gate: gate.name().into(),
            leg,
            sentence: format!("not applicable: {reason}"),
            verdict: Verdict::NotApplicable { reason },
            scope: None,
        }
    }

    /// A refusal for `reason`, one of the gate's own: its sentence is the reason's Display.
    pub fn refused<R: fmt::Display + Serialize>(
        gate: &dyn Gate,
        leg: Option<LegName>,
        reason: &R,
    ) -> GateResult {
        GateResult {
            gate: gate.name().into(),
            leg,
            sentence: reason.to_string(),
            verdict: Verdict::Refused {
                refusal: serde_json::to_value(reason).expect("a gate's reason serializes"),
            },
            scope: Some(gate.scope(leg)),
        }
    }

    pub fn is_refused(&self) -> bool {
        matches!(self.verdict, Verdict::Refused { .. })
    }

    /// What this verdict withholds: its refusal's scope (as stored, or derived from the gate's
    /// name for a record written before scopes were), none when it is not a refusal.
    pub fn withholds(&self) -> Option<Scope> {
        self.is_refused().then(|| {
            self.scope
                .clone()
                .unwrap_or_else(|| stored_scope(&self.gate, self.leg))
        })
    }

    /// The refusal's sentence, when this verdict is one.
    pub fn refusal(&self) -> Option<&str> {
        self.is_refused().then_some(self.sentence.as_str())
    }
}

/// Everything a post-run gate may read.
pub struct GateInput<'a> {
    pub unit: &'a Unit,
    /// Loaded goldens by their `[[golden]].file` as written in the unit.
    pub goldens: &'a BTreeMap<PathBuf, Golden>,
    /// The battery's prompt ids, in the order they were sent.
    pub prompt_ids: &'a [String],
    pub engine: &'a LegRecord,
    pub oracle: &'a LegRecord,
    /// What the kv gate's resize did, in words ("restarting the engine with --num-blocks 40").
    pub kv_resize: Option<&'a str>,
}

impl GateInput<'_> {
    pub fn leg(&self, leg: LegName) -> &LegRecord {
        match leg {
            LegName::Engine => self.engine,
            LegName::Oracle => self.oracle,
        }
    }
}

/// The verdicts of a gate that judges each leg on its own: `judge` on the engine, then the oracle.
pub fn each_leg(
    input: &GateInput,
    judge: impl Fn(LegName, &LegRecord) -> GateResult,
) -> Vec<GateResult> {
    [LegName::Engine, LegName::Oracle]
        .into_iter()
        .map(|leg| judge(leg, input.leg(leg)))
        .collect()
}

/// A gate judged after both legs ran.
pub trait Gate {
    fn name(&self) -> &'static str;
    fn judge(&self, input: &GateInput) -> Vec<GateResult>;
    /// What a refusal by this gate of `leg` (none: of the pair) withholds. Also what a record
    /// written before scopes were stored is read as meaning.
    fn scope(&self, leg: Option<LegName>) -> Scope;
}

/// The post-run gates, in the order their verdicts are printed. The idle gate is not here: it
/// runs before each leg (gates/idle.rs, through `legs::lease::IdleCheck`).
pub fn registry() -> Vec<Box<dyn Gate>> {
    vec![
        Box::new(leg::LegGate),
        Box::new(token::TokenGate),
        Box::new(golden_config::GoldenConfigGate),
        Box::new(kv::KvGate),
        Box::new(build::BuildGate),
        Box::new(straggler::StragglerGate),
        Box::new(gpu_straggler::GpuStragglerGate),
        Box::new(clock::ClockGate),
    ]
}

pub fn judge_all(input: &GateInput) -> Vec<GateResult> {
    registry().iter().flat_map(|g| g.judge(input)).collect()
}

/// The scope of a refusal that a record states without one (written before scopes were
/// stored): what the named gate's refusal withholds; a gate this orchestrator does not know
/// concerns every axis and marks no leg.
pub fn stored_scope(gate: &str, leg: Option<LegName>) -> Scope {
    registry()
        .iter()
        .find(|g| g.name() == gate)
        .map(|g| g.scope(leg))
        .unwrap_or_else(|| Scope::axes(Axes::All))
}
