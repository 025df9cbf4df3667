//! What a leg did, as the record keeps it: its argument vector, `ready`, phases, every request
//! with its results, the watchdog's action, stragglers, exit status, failure, and what the
//! samplers saw.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

use crate::legs::host_probe::HostProbe;
use crate::legs::protocol::{PromptResult, Ready};
use crate::legs::sampler::{HostMemSummary, SamplerReport};
use crate::legs::spec::LegSpec;
use crate::legs::verified::VerifyRecord;
use crate::legs::watchdog::{GpuStraggler, Phase, Straggler, WatchdogKill};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum LegName {
    Engine,
    Oracle,
}

impl LegName {
    pub fn as_str(self) -> &'static str {
        match self {
            LegName::Engine => "engine",
            LegName::Oracle => "oracle",
        }
    }
}

impl std::fmt::Display for LegName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestKind {
    /// max_tokens = 1 at batch 1: the recipe's subtrahend and the time to first token.
    FirstToken,
    /// max_tokens = N at batch 1.
    Decode,
    /// max_tokens = N at batch > 1: throughput.
    Batch,
    /// max_tokens = 1 at batch > 1: the batch's prefill, every prompt to its first token; the
    /// subtrahend of that batch's decode step.
    BatchFirstToken,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RequestRecord {
    pub id: String,
    pub phase: Phase,
    /// 0-based pass number within its phase.
    pub pass: u32,
    pub kind: RequestKind,
    pub batch: u32,
    pub max_tokens: u32,
    pub wall_s: f64,
    /// One per prompt, in prompt order.
    pub results: Vec<PromptResult>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LegFailure {
    pub phase: Phase,
    /// A stable name: spawn_failed, exited, watchdog, malformed_line, error_event, protocol.
    pub kind: String,
    /// The whole explanation, quoting the offending line or event.
    pub message: String,
    /// The last lines of the leg's stderr log.
    pub stderr_tail: Vec<String>,
}

impl std::fmt::Display for LegFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.message)?;
        if !self.stderr_tail.is_empty() {
            write!(f, "; the last lines of its stderr:")?;
            for l in &self.stderr_tail {
                write!(f, "\n    | {l}")?;
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PhaseTime {
    pub phase: Phase,
    pub elapsed_s: f64,
    pub ok: bool,
}

/// An earlier start of this leg, stopped after `ready` so the kv gate could resize the pool.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PriorStart {
    pub argv: Vec<String>,
    pub log: PathBuf,
    pub ready: Option<Ready>,
    pub reason: String,
    pub stragglers: Vec<Straggler>,
    pub exit_status: Option<i32>,
    #[serde(default)]
    pub gpu_stragglers: Vec<GpuStraggler>,
    #[serde(default)]
    pub sampler: SamplerReport,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LegRecord {
    pub leg: LegName,
    pub argv: Vec<String>,
    pub log: PathBuf,
    pub ready: Option<Ready>,
    pub phases: Vec<PhaseTime>,
    pub requests: Vec<RequestRecord>,
    pub watchdog: Option<WatchdogKill>,
    pub stragglers: Vec<Straggler>,
    /// Exit code, or 128 + signal number when killed by a signal.
    pub exit_status: Option<i32>,
    pub failure: Option<LegFailure>,
    pub host_mem: HostMemSummary,
    /// The GPU and host samplers' summary, series file and own cost.
    #[serde(default)]
    pub sampler: SamplerReport,
    /// Its processes still holding GPU memory after its shutdown (named, killed).
    #[serde(default)]
    pub gpu_stragglers: Vec<GpuStraggler>,
    /// The GPU's process table was read after its shutdown: without it, an empty
    /// `gpu_stragglers` means "not checked", never "none".
    #[serde(default)]
    pub gpu_checked: bool,
    /// Starts before this one (a kv resize restarts the leg).
    #[serde(default)]
    pub prior_starts: Vec<PriorStart>,
    /// The token gate's teacher-forced requests, after the battery (none where every batch size
    /// is held to exact match, and in records written before it existed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verify: Vec<VerifyRecord>,
    /// The host probe timed just before the leg started (legs/host_probe.rs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_probe: Option<HostProbe>,
    /// Why the leg was not run at all (`run --legs`), when it was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_run: Option<String>,
}

impl LegRecord {
    /// The battery completed: there are numbers to report.
    pub fn measured(&self) -> bool {
        self.phases
            .iter()
            .any(|p| p.phase == Phase::Battery && p.ok)
    }

    pub fn battery_requests(&self) -> impl Iterator<Item = &RequestRecord> {
        self.requests.iter().filter(|r| r.phase == Phase::Battery)
    }
}

impl LegRecord {
    /// The record of a leg that has not started yet.
    pub fn new(spec: &LegSpec) -> Self {
        LegRecord {
            leg: spec.leg,
            argv: spec.argv.clone(),
            log: spec.log_path.clone(),
            ready: None,
            phases: vec![],
            requests: vec![],
            watchdog: None,
            stragglers: vec![],
            exit_status: None,
            failure: None,
            host_mem: HostMemSummary::default(),
            sampler: SamplerReport::default(),
            gpu_stragglers: vec![],
            gpu_checked: false,
            prior_starts: vec![],
            verify: vec![],
            host_probe: None,
            not_run: None,
        }
    }
}
