//! The run record: one JSON file per run, with a schema version, written atomically and never
//! rewritten. docs/RECORD.md documents every field.

pub mod archive;
pub mod claim;
pub mod class;
pub mod legstate;
mod provenance;
pub mod select;
pub mod write;

pub use write::write_new_atomic;

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use crate::gates::GateResult;
use crate::legs::pair::Pair;
use crate::legs::LegRecord;
use crate::numbers::axes::Axis;
use crate::numbers::explain::ClockExplain;
use crate::numbers::timing::Timings;
use crate::unit::preflight::Checked;
use crate::unit::UnitFile;
use crate::util::time::utc_now_iso;
use write::{beside_record, relative};

pub const SCHEMA: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub schema: u32,
    pub created_utc: String,
    pub orchestrator_version: String,
    /// The orchestrator's own argv.
    pub command: Vec<String>,
    pub unit: UnitInfo,
    pub project: ProjectInfo,
    pub engine_binary: BinaryInfo,
    pub host: HostInfo,
    /// The lease held during the run, and what the idle check said before each leg.
    pub lease: LeaseInfo,
    pub legs: Legs,
    pub timings: LegTimings,
    pub gates: Vec<GateResult>,
    /// The kv gate's resize, in words, when one was done.
    pub kv_resize: Option<String>,
    pub axes: Vec<Axis>,
    /// Each refusal's sentence, as printed under the table.
    pub refusals: Vec<String>,
    /// How much of the per-token ratio a median SM clock offset could explain (both legs
    /// sampled on a GPU), else null.
    #[serde(default)]
    pub clock_explain: Option<ClockExplain>,
    /// The timeline picture (SVG) beside the record.
    #[serde(default)]
    pub timeline: Option<PathBuf>,
    /// The exit status the run ends with (0 all gates passed, 1 refusals, 2 nothing measured
    /// or interrupted).
    pub exit_status: i32,
    /// The run was interrupted (SIGINT, SIGTERM, SIGHUP) after something was measured: when,
    /// and what it cost, in words. Absent for a run that was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UnitInfo {
    pub name: String,
    pub path: PathBuf,
    pub config: UnitFile,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProjectInfo {
    pub root: PathBuf,
    /// The git tree of the project's files as they were when the run started (tracked files
    /// and untracked ones git does not ignore, less `reports/`, which holds results): what was
    /// built, independent of commit metadata. `HEAD^{tree}` when nothing is uncommitted.
    pub tree: String,
    pub commit: String,
    /// The files differ from `commit`: `tree` is theirs, not the commit's (records written
    /// before this field's meaning was widened, orchestrator 0.2.0, have `HEAD^{tree}` there and
    /// `dirty` for modified tracked files only: their tree then does not describe the binary).
    pub dirty: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BinaryInfo {
    pub path: PathBuf,
    pub sha256: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostInfo {
    pub hostname: String,
    pub os: String,
    pub kernel: String,
    pub cpu_model: String,
    pub cores: usize,
    pub memory_bytes: u64,
    pub boot_id: Option<String>,
    /// The leased GPU (index, name, uuid, driver, CUDA, memory) as NVML reports it; null
    /// without one.
    pub gpu: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaseInfo {
    pub target: String,
    pub path: PathBuf,
    pub idle_checks: Vec<String>,
    /// The host's other GPUs, watched while the lease was held: which were busy beside this run
    /// (their lease held, or a compute process on them). Absent where the host had no other GPU.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub neighbours: Vec<crate::legs::placement::Neighbour>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Legs {
    pub engine: LegRecord,
    pub oracle: LegRecord,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LegTimings {
    pub engine: Timings,
    pub oracle: Timings,
}

/// What the gates and the numbers made of a run's legs.
pub struct Findings {
    pub gates: Vec<GateResult>,
    pub timings: LegTimings,
    pub axes: Vec<Axis>,
    pub clock_explain: Option<ClockExplain>,
    pub exit_status: i32,
}

impl Record {
    /// The record of a run whose files lie in `dir`. Records are committed and read on other
    /// machines: the files beside the record are named relative to `dir`, the unit and the
    /// engine binary relative to the project root. The timeline is named once it is drawn.
    pub fn assemble(
        checked: &Checked,
        project: ProjectInfo,
        pair: &Pair,
        dir: &Path,
        found: Findings,
    ) -> Record {
        let (unit, root) = (&checked.unit, &checked.project_root);
        let mut host = HostInfo::read();
        host.gpu = [&pair.engine, &pair.oracle]
            .iter()
            .find_map(|l| l.sampler.gpu.as_ref())
            .and_then(|g| serde_json::to_value(g).ok());
        Record {
            schema: SCHEMA,
            created_utc: utc_now_iso(),
            orchestrator_version: env!("CARGO_PKG_VERSION").into(),
            command: std::env::args().collect(),
            unit: UnitInfo {
                name: unit.config.name.clone(),
                path: relative(&unit.path, root),
                config: unit.config.clone(),
            },
            project,
            engine_binary: BinaryInfo {
                path: relative(&checked.engine_binary, root),
                sha256: provenance::sha256_file(&checked.engine_binary),
            },
            host,
            lease: LeaseInfo {
                target: pair.lease.name(),
                path: pair.lease_path.clone(),
                idle_checks: pair.idle_checks.clone(),
                neighbours: pair.neighbours.clone(),
            },
            legs: Legs {
                engine: beside_record(&pair.engine, dir),
                oracle: beside_record(&pair.oracle, dir),
            },
            timings: found.timings,
            refusals: found
                .gates
                .iter()
                .filter_map(|g| g.refusal().map(str::to_string))
                .collect(),
            gates: found.gates,
            kv_resize: pair.kv_resize.clone(),
            axes: found.axes,
            clock_explain: found.clock_explain,
            timeline: None,
            exit_status: found.exit_status,
            interrupted: pair.interrupted.map(|sig| {
                format!(
                    "by {sig} during the legs: the running leg was stopped and no other started"
                )
            }),
        }
    }
}
