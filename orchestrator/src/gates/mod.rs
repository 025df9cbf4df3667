//! Gates: each judges whether a configuration may stand beside its numbers. A verdict is a pass
//! (with what was checked), "not applicable" (with why), or a [`Refusal`] whose Display is the
//! whole sentence a reader needs: the figures and what to do.
//!
//! Post-run gates implement [`Gate`] and are listed in [`post_run_gates`]; the clock and GPU
//! straggler gates read the sampler summaries in the leg records. The idle gate plugs into
//! [`crate::legs::lease::IdleCheck`], which runs before each leg.

pub mod build;
pub mod clock;
pub mod golden_config;
pub mod idle;
pub mod kv;
pub mod leg;
pub mod token;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use crate::legs::leg::{LegFailure, LegName, LegRecord};
use crate::legs::protocol::Kv;
use crate::legs::watchdog::{GpuStraggler, Straggler};
use crate::unit::{Golden, Unit};
use crate::util::fmt::{capitalise_first, fmt_num};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    Pass { text: String },
    NotApplicable { reason: String },
    Refused { refusal: Refusal },
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
}

impl GateResult {
    pub fn new(gate: &str, leg: Option<LegName>, verdict: Verdict) -> GateResult {
        let sentence = match &verdict {
            Verdict::Pass { text } => text.clone(),
            Verdict::NotApplicable { reason } => format!("not applicable: {reason}"),
            Verdict::Refused { refusal } => refusal.to_string(),
        };
        GateResult {
            gate: gate.into(),
            leg,
            verdict,
            sentence,
        }
    }
    pub fn refusal(&self) -> Option<&Refusal> {
        match &self.verdict {
            Verdict::Refused { refusal } => Some(refusal),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Mismatch {
    pub prompt: String,
    /// Which request showed it first: battery pass and batch size.
    pub pass: u32,
    pub batch: u32,
    pub position: usize,
    /// None: the leg stopped before this position.
    pub got: Option<u32>,
    pub want: u32,
    pub margin: Option<f64>,
    /// The golden's best other token there, where the golden records it.
    #[serde(default)]
    pub runner_up: Option<u32>,
    /// The margin is under `near_tie_margin` and the leg took the golden's runner-up (or the
    /// golden does not say which that was): what two correct implementations can differ by.
    pub near_tie: bool,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let got = match self.got {
            Some(t) => format!("got {t}"),
            None => "got nothing (the leg stopped early)".into(),
        };
        write!(
            f,
            "prompt {} first differs at position {} (repeat {}, batch {}): {got}, golden {}",
            self.prompt,
            self.position,
            self.pass + 1,
            self.batch,
            self.want
        )?;
        match (self.margin, self.near_tie, self.runner_up) {
            (Some(m), true, None) => {
                write!(f, ", at a recorded near-tie (golden margin {})", fmt_num(m))
            }
            (Some(m), true, Some(_)) => write!(
                f,
                ", at a recorded near-tie (golden margin {}), on the golden's runner-up",
                fmt_num(m)
            ),
            (Some(m), false, Some(r)) if self.got != Some(r) => write!(
                f,
                ", not a near-tie (golden margin {}; the golden's runner-up there is {r}, not the \
                 token the leg took)",
                fmt_num(m)
            ),
            (Some(m), false, _) => write!(f, ", not a near-tie (golden margin {})", fmt_num(m)),
            (None, _, _) => write!(f, ", no margin recorded there"),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ConfigDiff {
    pub key: String,
    pub oracle: Option<serde_json::Value>,
    pub golden: Option<serde_json::Value>,
}

impl fmt::Display for ConfigDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: &Option<serde_json::Value>| match v {
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

/// Every way a gate can refuse. Display is the whole sentence: figures and a hint.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "refusal", rename_all = "snake_case")]
pub enum Refusal {
    TokenMismatch {
        leg: LegName,
        summary: String,
        golden: PathBuf,
        mismatches: Vec<Mismatch>,
    },
    NoGolden {
        leg: LegName,
        device: String,
        dtype: String,
    },
    GoldenConfigDiffers {
        golden: PathBuf,
        diffs: Vec<ConfigDiff>,
    },
    KvUnmatched {
        engine: Box<Kv>,
        oracle: Box<Kv>,
        tolerance_blocks: u64,
        resized: Option<String>,
    },
    BuildBackend {
        requested: String,
        reported: Option<String>,
    },
    BuildDegraded {
        degraded: Vec<String>,
    },
    LegFailed {
        leg: LegName,
        failure: LegFailure,
        log: PathBuf,
    },
    Stragglers {
        leg: LegName,
        stragglers: Vec<Straggler>,
    },
    GpuStragglers {
        leg: LegName,
        stragglers: Vec<GpuStraggler>,
    },
    /// One failed condition of the clock gate (gates/clock.rs).
    Clock {
        reason: clock::ClockReason,
    },
}

impl Refusal {
    /// The leg whose timings this refusal marks as refused (printed, never netted out).
    pub fn refuses_timings_of(&self) -> Option<LegName> {
        match self {
            Refusal::TokenMismatch { leg, .. }
            | Refusal::NoGolden { leg, .. }
            | Refusal::LegFailed { leg, .. } => Some(*leg),
            Refusal::BuildBackend { .. } | Refusal::BuildDegraded { .. } => Some(LegName::Engine),
            _ => None,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::TokenMismatch {
                leg,
                summary,
                golden,
                mismatches,
            } => {
                write!(
                    f,
                    "The {leg} leg's tokens do not match the golden {}: {summary}; its timings are printed but refused.",
                    golden.display()
                )?;
                for m in mismatches {
                    write!(f, " {}: {m}.", capitalise_first(leg.as_str()))?;
                }
                write!(
                    f,
                    " Hint: a mismatch at a near-tie is reduction-order noise that a golden captured on this device and dtype would absorb; one that is not is a correctness bug to bisect."
                )
            }
            Refusal::NoGolden { leg, device, dtype } => write!(
                f,
                "No [[golden]] in the unit applies to the {leg} leg (device {device}, dtype {dtype}), so its tokens could not be checked and its timings are refused. Hint: capture a golden on this device and dtype and add a [[golden]] entry for it."
            ),
            Refusal::GoldenConfigDiffers { golden, diffs } => {
                let list: Vec<String> = diffs.iter().map(ToString::to_string).collect();
                write!(
                    f,
                    "The oracle ran under a configuration the golden {} was not captured under ({} key(s) differ: {}), so the oracle-vs-golden token check is recorded as not applicable. Hint: set [oracle.options] to the golden's capture config, recapture the golden under this one, or list a key that cannot matter in [gates] golden_config_ignore.",
                    golden.display(),
                    diffs.len(),
                    list.join("; ")
                )
            }
            Refusal::KvUnmatched {
                engine,
                oracle,
                tolerance_blocks,
                resized,
            } => {
                write!(
                    f,
                    "The KV pools could not be matched: engine {} tokens ({} blocks of {}), oracle {} tokens ({} blocks of {}), {} apart against a tolerance of {} block(s)",
                    engine.capacity_tokens,
                    engine.num_blocks,
                    engine.block_size,
                    oracle.capacity_tokens,
                    oracle.num_blocks,
                    oracle.block_size,
                    engine.capacity_tokens.abs_diff(oracle.capacity_tokens),
                    tolerance_blocks
                )?;
                match resized {
                    Some(r) => write!(f, ", even after {r}")?,
                    None => write!(f, " ([gates] kv_match = \"off\", so no resize was tried)")?,
                }
                write!(
                    f,
                    "; the memory and KV axes are reported raw, not like-for-like. Hint: size the pools explicitly (engine num_blocks / kv_cache_memory, oracle num_gpu_blocks_override) to a capacity both block sizes divide."
                )
            }
            Refusal::BuildBackend {
                requested,
                reported,
            } => write!(
                f,
                "The engine build does not use the requested backend: requested {requested}, it reports {}; its timings are refused. Hint: rebuild the engine with the {requested} backend enabled (see its features in the record).",
                reported.as_deref().unwrap_or("none (features.backend missing)")
            ),
            Refusal::BuildDegraded { degraded } => write!(
                f,
                "The engine build is degraded: {} feature(s) fell back ({}); its timings are refused. Hint: fix the build so features.degraded is empty (the engine's stderr log says why each fell back).",
                degraded.len(),
                degraded.join(", ")
            ),
            Refusal::LegFailed { leg, failure, log } => write!(
                f,
                "The {leg} leg failed in phase {}: {failure}. Nothing it measured after that point is reported; its whole stderr is in {}.",
                failure.phase,
                log.display()
            ),
            Refusal::Stragglers { leg, stragglers } => {
                let list: Vec<String> = stragglers
                    .iter()
                    .map(|s| {
                        format!(
                            "pid {} ({}){}",
                            s.pid,
                            s.command,
                            if s.killed { ", killed" } else { ", could not be killed" }
                        )
                    })
                    .collect();
                write!(
                    f,
                    "The {leg} leg left {} process(es) alive after its shutdown: {}. Hint: the leg must stop every process it starts before exiting (docs/PROTOCOL.md, shutdown).",
                    stragglers.len(),
                    list.join("; ")
                )
            }
            Refusal::GpuStragglers { leg, stragglers } => {
                let list: Vec<String> = stragglers
                    .iter()
                    .map(|s| {
                        format!(
                            "pid {} ({}, {}){}",
                            s.pid,
                            s.name,
                            s.mib
                                .map(|m| format!("{m} MiB"))
                                .unwrap_or_else(|| "memory not reported".into()),
                            if s.killed { ", killed" } else { ", could not be killed (gone or not ours)" }
                        )
                    })
                    .collect();
                write!(
                    f,
                    "The {leg} leg left {} process(es) holding GPU memory after its shutdown: {}; the next leg's memory figures would include them. Hint: the leg must stop its GPU workers (e.g. a vLLM EngineCore) before exiting.",
                    stragglers.len(),
                    list.join("; ")
                )
            }
            Refusal::Clock { reason } => write!(f, "{reason}"),
        }
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

/// A gate judged after both legs ran.
pub trait Gate {
    fn name(&self) -> &'static str;
    fn judge(&self, input: &GateInput) -> Vec<GateResult>;
}

/// The gates, in the order their verdicts are printed. The idle gate is not here: it runs
/// before each leg (gates/idle.rs, through `lease::IdleCheck`).
pub fn post_run_gates() -> Vec<Box<dyn Gate>> {
    vec![
        Box::new(leg::LegGate),
        Box::new(token::TokenGate),
        Box::new(golden_config::GoldenConfigGate),
        Box::new(kv::KvGate),
        Box::new(build::BuildGate),
        Box::new(leg::StragglerGate),
        Box::new(leg::GpuStragglerGate),
        Box::new(clock::ClockGate),
    ]
}

pub fn judge_all(input: &GateInput) -> Vec<GateResult> {
    post_run_gates()
        .iter()
        .flat_map(|g| g.judge(input))
        .collect()
}
