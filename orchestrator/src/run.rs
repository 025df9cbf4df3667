//! `orchestrator run`: one run, stage by stage (docs/LAYOUT.md). Preflight (unit/), both legs
//! under the lease (legs/), the gates (gates/), the figures (numbers/), the record and the files
//! beside it (record/, render/). Printing is the caller's: the outcome carries the summary.

mod files;

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::gates::{self, GateInput, GateResult};
use crate::legs::lease::IdleCheck;
use crate::legs::pair::{self, LeaseOptions, LegOptions, Pair};
use crate::legs::placement;
use crate::legs::LegRecord;
use crate::numbers::axes::axes;
use crate::numbers::explain::clock_explain;
use crate::numbers::timing::Timings;
use crate::record::claim::Claim;
use crate::record::{Findings, LegTimings, ProjectInfo, Record};
use crate::unit::preflight::{self, Checked};
use crate::unit::LegChoice;
use crate::util::interrupt;
use crate::util::time::utc_stamp;

#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Default: <project root>/reports/records.
    pub records_dir: Option<PathBuf>,
    /// Default: [lease] lock_dir.
    pub lock_dir: Option<PathBuf>,
    pub no_wait: bool,
    pub python: Option<String>,
    pub quiet: bool,
    /// Which legs run (`--legs`; default both).
    pub legs: LegChoice,
    /// Overrides of `[battery] repeat` and `warmup` (`--repeat`, `--warmup`): the record's unit
    /// configuration holds the values that ran.
    pub repeat: Option<u32>,
    pub warmup: Option<u32>,
    /// Puts a GPU unit on this GPU of the host (legs/placement.rs).
    pub gpu: Option<u32>,
}

pub const EXIT_PASS: i32 = 0;
pub const EXIT_REFUSED: i32 = 1;
pub const EXIT_ERROR: i32 = 2;

/// What a run that wrote a record ends with.
#[derive(Debug)]
pub struct Outcome {
    /// 0 every gate passed, 1 a record with refusals, 2 nothing measured.
    pub exit_status: i32,
    /// What `orchestrator run` prints on stdout (render/run.rs).
    pub summary: String,
    /// What went wrong without stopping the run (a timeline that could not be drawn).
    pub warnings: Vec<String>,
    pub record: PathBuf,
}

/// Preflight, then the run. Err: nothing was recorded, and why (exit 2).
pub fn run(unit_path: &Path, opts: &RunOptions) -> Result<Outcome, String> {
    let (report, checked) =
        preflight::preflight_legs(unit_path, opts.python.as_deref(), !opts.quiet, opts.legs);
    if let Some(f) = report.failures.iter().find(|f| f.check == "interrupted") {
        return Err(format!("interrupted during preflight: {}", f.message));
    }
    let Some(mut checked) = checked else {
        let lines: Vec<String> = report.failures.iter().map(|f| format!("  {f}")).collect();
        return Err(format!(
            "preflight failed, nothing was run:\n{}",
            lines.join("\n")
        ));
    };
    let battery = &mut checked.unit.config.battery;
    if opts.repeat == Some(0) {
        return Err("--repeat 0 measures nothing; give 1 or more".into());
    }
    battery.repeat = opts.repeat.unwrap_or(battery.repeat);
    battery.warmup = opts.warmup.unwrap_or(battery.warmup);
    if let Some(n) = opts.gpu {
        placement::place_on_gpu(&mut checked.unit.config, n).map_err(|e| e.to_string())?;
    }
    let idle = gates::idle::GpuIdleCheck::nvml(checked.unit.config.lease.idle_max_used_mib);
    run_checked(&checked, opts, &idle)
}

/// The run after preflight; Err means nothing was recorded.
pub fn run_checked(
    checked: &Checked,
    opts: &RunOptions,
    idle: &dyn IdleCheck,
) -> Result<Outcome, String> {
    let cfg = &checked.unit.config;
    let project = ProjectInfo::read(&checked.project_root);
    let records_root = opts
        .records_dir
        .clone()
        .unwrap_or_else(|| checked.project_root.join("reports/records"));
    let dir = records_root.join(&cfg.name);
    std::fs::create_dir_all(&dir).map_err(|e| {
        format!(
            "cannot create the records directory {} ({e}); pass --records-dir a writable directory",
            dir.display()
        )
    })?;
    let lock_dir = opts.lock_dir.as_ref().unwrap_or(&cfg.lease.lock_dir);
    let lease = LeaseOptions {
        lock_dir,
        wait: !opts.no_wait,
    };
    // The stem is claimed under the lease, and the lease is held until the record is on disk.
    let held = pair::take_lease(checked, &lease, opts.quiet)?;
    let stamp = utc_stamp(SystemTime::now());
    let (claim, _) = Claim::take(&dir, &stamp, &project.tree, opts.quiet).map_err(|e| {
        format!(
            "cannot claim a record name in {} ({e}); pass --records-dir a writable directory",
            dir.display()
        )
    })?;
    // Each leg teacher-forces the golden at the batch sizes the token gate judges that way.
    let verify = |rec: &LegRecord| {
        gates::token::rule::verify_plan(&checked.unit, &checked.goldens, &checked.prompts, rec)
    };
    let leg_opts = LegOptions {
        legs: opts.legs,
        verify: &verify,
    };
    let stem = claim.stem();
    let legs = match pair::run(checked, &stem, &held, lock_dir, &leg_opts, opts.quiet, idle) {
        Ok(legs) => legs,
        Err(e) => return Err(files::unrecorded(claim, e)),
    };
    if let (Some(sig), false) = (legs.interrupted, legs.measured()) {
        let why = format!(
            "interrupted by {sig}: the running leg was stopped before anything was measured"
        );
        return Err(files::unrecorded(claim, why));
    }
    let mut rec = Record::assemble(checked, project, &legs, &dir, findings(checked, &legs));
    if let (None, Some(sig)) = (&rec.interrupted, interrupt::pending()) {
        rec.interrupted = Some(format!(
            "by {sig} after the legs, while the gates judged them"
        ));
    }
    let interrupted = rec.interrupted.clone();
    if interrupted.is_some() {
        rec.exit_status = EXIT_ERROR;
    }
    let out = files::write(rec, claim, &dir, &stamp)?;
    drop(held);
    Ok(files::said_interrupted(out, interrupted))
}

/// The gates' verdicts on the pair, the timings, the axes and the clock's explainable gap.
fn findings(checked: &Checked, legs: &Pair) -> Findings {
    let ids: Vec<String> = checked.prompts.iter().map(|p| p.id.clone()).collect();
    let verdicts = gates::judge_all(&GateInput {
        unit: &checked.unit,
        goldens: &checked.goldens,
        prompt_ids: &ids,
        engine: &legs.engine,
        oracle: &legs.oracle,
        kv_resize: legs.kv_resize.as_deref(),
    });
    let timings = LegTimings {
        engine: Timings::from_leg(&legs.engine),
        oracle: Timings::from_leg(&legs.oracle),
    };
    let axes = axes(
        &legs.engine,
        &legs.oracle,
        &timings.engine,
        &timings.oracle,
        &verdicts,
    );
    let measured = legs.engine.measured() || legs.oracle.measured();
    let exit_status = if !measured {
        EXIT_ERROR
    } else if verdicts.iter().any(GateResult::is_refused) {
        EXIT_REFUSED
    } else {
        EXIT_PASS
    };
    Findings {
        clock_explain: clock_explain(
            &legs.engine,
            &legs.oracle,
            &axes,
            &checked.unit.config.gates,
        ),
        gates: verdicts,
        timings,
        axes,
        exit_status,
    }
}
